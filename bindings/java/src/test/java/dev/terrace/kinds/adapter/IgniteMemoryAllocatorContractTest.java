package dev.terrace.kinds.adapter;

import static dev.terrace.kinds.adapter.RawMemory.at;
import static dev.terrace.kinds.adapter.RawMemory.firstNot;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.terrace.kinds.Kind;
import dev.terrace.kinds.KindFixture;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/** Apache Ignite MemoryAllocator's contract, on every kind source. */
class IgniteMemoryAllocatorContractTest {
    @ParameterizedTest
    @EnumSource(KindFixture.Source.class)
    void allocateMemoryServesEverySize(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            IgniteMemoryAllocator allocator = new TerraceIgniteAllocator(f.kind);
            for (long size : RawMemory.SIZES) {
                long p = allocator.allocateMemory(size);
                assertNotEquals(0, p, "size " + size);
                assertTrue(Kind.usableSize(p) >= size);
                at(p, size).fill((byte) 0x42);
                assertEquals(-1, firstNot(p, 0, size, (byte) 0x42));
                allocator.freeMemory(p);
            }
            assertEquals(0, allocator.allocateMemory(0), "size 0 gives 0, as a failure");
        }
    }

    @ParameterizedTest
    @EnumSource(value = KindFixture.Source.class, names = {"DRAM", "FILE", "UNIFIED_ROUND_ROBIN"})
    void freeMemoryNeedsOnlyTheAddress(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            IgniteMemoryAllocator allocator = new TerraceIgniteAllocator(f.kind);
            long before = f.kind.stats().allocated();
            long p = allocator.allocateMemory(4 << 20);
            assertTrue(f.kind.stats().allocated() >= before + (4 << 20));
            allocator.freeMemory(p);
            assertTrue(f.kind.stats().allocated() < before + (4 << 20), f.kind.stats().toString());
        }
    }

    @ParameterizedTest
    @EnumSource(value = KindFixture.Source.class, names = {"FILE", "UNIFIED_ROUND_ROBIN"})
    void aFullFileKindGivesZero(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            IgniteMemoryAllocator allocator = new TerraceIgniteAllocator(f.kind);
            List<Long> pages = new ArrayList<>();
            long p;
            while ((p = allocator.allocateMemory(4 << 20)) != 0) {
                pages.add(p);
                assertTrue(pages.size() < 1000, "a bounded file kind never filled");
            }
            long expectedMiB = source == KindFixture.Source.FILE
                    ? KindFixture.FILE_KIND_SIZE >> 20 : 2 * (KindFixture.FILE_KIND_SIZE >> 20);
            assertTrue(pages.size() * 4L >= expectedMiB / 2,
                    "only " + pages.size() * 4 + " MiB of " + expectedMiB + " fitted");
            pages.forEach(allocator::freeMemory);
        }
    }

    @ParameterizedTest
    @EnumSource(KindFixture.Source.class)
    void twoThreadsAllocateAndFreeConcurrently(KindFixture.Source source) throws Exception {
        try (KindFixture f = KindFixture.of(source)) {
            IgniteMemoryAllocator allocator = new TerraceIgniteAllocator(f.kind);
            RawMemory.churnOnTwoThreads(size -> {
                long p = allocator.allocateMemory(size);
                assertNotEquals(0, p);
                return p;
            }, p -> {
                allocator.freeMemory(p);
                return null;
            });
        }
    }
}

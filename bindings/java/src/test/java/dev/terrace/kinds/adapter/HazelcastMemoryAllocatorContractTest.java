package dev.terrace.kinds.adapter;

import static dev.terrace.kinds.adapter.RawMemory.at;
import static dev.terrace.kinds.adapter.RawMemory.firstNot;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.terrace.kinds.Kind;
import dev.terrace.kinds.KindFixture;
import dev.terrace.kinds.KindOutOfMemoryError;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/** Hazelcast OSS MemoryAllocator's contract, on every kind source. */
class HazelcastMemoryAllocatorContractTest {
    @ParameterizedTest
    @EnumSource(KindFixture.Source.class)
    void allocateReturnsZeroedMemoryAtEverySize(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            HazelcastMemoryAllocator allocator = new TerraceHazelcastAllocator(f.kind);
            for (long size : RawMemory.SIZES) {
                RawMemory.dirty(f.kind, size);
                long p = allocator.allocate(size);
                assertEquals(-1, firstNot(p, 0, size, (byte) 0), "not zeroed at size " + size);
                at(p, size).fill((byte) 0x5A);
                assertTrue(Kind.usableSize(p) >= size);
                allocator.free(p, size);
            }
        }
    }

    @ParameterizedTest
    @EnumSource(KindFixture.Source.class)
    void reallocateKeepsDataAndZeroExtends(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            HazelcastMemoryAllocator allocator = new TerraceHazelcastAllocator(f.kind);
            long p = allocator.allocate(100);
            at(p, 100).fill((byte) 0x11);
            p = allocator.reallocate(p, 100, 10_000);
            assertEquals(-1, firstNot(p, 0, 100, (byte) 0x11), "data lost growing");
            assertEquals(-1, firstNot(p, 100, 10_000, (byte) 0), "tail not zeroed");
            p = allocator.reallocate(p, 10_000, 3 << 20);
            assertEquals(-1, firstNot(p, 0, 100, (byte) 0x11));
            assertEquals(-1, firstNot(p, 100, 3 << 20, (byte) 0));
            allocator.free(p, 3 << 20);
        }
    }

    @ParameterizedTest
    @EnumSource(KindFixture.Source.class)
    void shrinkThenGrowZeroesWhatTheShrinkCutOff(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            HazelcastMemoryAllocator allocator = new TerraceHazelcastAllocator(f.kind);
            long p = allocator.allocate(10_000);
            at(p, 10_000).fill((byte) 0xCD);
            p = allocator.reallocate(p, 10_000, 50);
            assertEquals(-1, firstNot(p, 0, 50, (byte) 0xCD));
            p = allocator.reallocate(p, 50, 5_000);
            assertEquals(-1, firstNot(p, 0, 50, (byte) 0xCD), "kept bytes changed");
            assertEquals(-1, firstNot(p, 50, 5_000, (byte) 0),
                    "old bytes past the shrunk size came back");
            allocator.free(p, 5_000);
        }
    }

    @ParameterizedTest
    @EnumSource(value = KindFixture.Source.class, names = {"DRAM", "FILE", "UNIFIED_ROUND_ROBIN"})
    void freeNeedsOnlyTheAddress(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            HazelcastMemoryAllocator allocator = new TerraceHazelcastAllocator(f.kind);
            long before = f.kind.stats().allocated();
            long p = allocator.allocate(1 << 20);
            assertTrue(f.kind.stats().allocated() >= before + (1 << 20));
            allocator.free(p, 12345);
            assertTrue(f.kind.stats().allocated() < before + (1 << 20),
                    "free with a wrong size freed nothing: " + f.kind.stats());
        }
    }

    @ParameterizedTest
    @EnumSource(value = KindFixture.Source.class, names = {"FILE", "UNIFIED_ROUND_ROBIN"})
    void aFullFileKindThrowsAnOutOfMemoryError(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            HazelcastMemoryAllocator allocator = new TerraceHazelcastAllocator(f.kind);
            List<Long> blocks = new ArrayList<>();
            OutOfMemoryError error = assertThrows(OutOfMemoryError.class, () -> {
                for (int i = 0; i < 1000; i++) {
                    blocks.add(allocator.allocate(1 << 20));
                }
            });
            assertTrue(error instanceof KindOutOfMemoryError, error.toString());
            long expected = source == KindFixture.Source.FILE ? 1 : 2;
            assertTrue(blocks.size() >= expected * (KindFixture.FILE_KIND_SIZE >> 20) / 2,
                    "only " + blocks.size() + " MiB fitted");
            assertFalse(blocks.contains(HazelcastMemoryAllocator.NULL_ADDRESS));
            blocks.forEach(b -> allocator.free(b, 1 << 20));
        }
    }

    @Test
    void sizeZeroIsRefused() {
        HazelcastMemoryAllocator allocator = new TerraceHazelcastAllocator(Kind.defaultKind());
        assertThrows(IllegalArgumentException.class, () -> allocator.allocate(0));
    }

    @Test
    void disposeClosesAnOwnedKindOnly() {
        Kind borrowed = Kind.dram();
        new TerraceHazelcastAllocator(borrowed).dispose();
        assertFalse(borrowed.isClosed());
        new TerraceHazelcastAllocator(borrowed, true).dispose();
        assertTrue(borrowed.isClosed());
    }

    @ParameterizedTest
    @EnumSource(KindFixture.Source.class)
    void twoThreadsAllocateAndFreeConcurrently(KindFixture.Source source) throws Exception {
        try (KindFixture f = KindFixture.of(source)) {
            HazelcastMemoryAllocator allocator = new TerraceHazelcastAllocator(f.kind);
            RawMemory.churnOnTwoThreads(allocator::allocate, p -> {
                allocator.free(p, 0);
                return null;
            });
        }
    }
}

package dev.terrace.kinds.adapter;

import static dev.terrace.kinds.adapter.RawMemory.at;
import static dev.terrace.kinds.adapter.RawMemory.firstNot;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.terrace.kinds.Kind;
import dev.terrace.kinds.KindFixture;
import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/** Hazelcast EE LibMalloc's contract, on every kind source. */
class LibMallocContractTest {
    @ParameterizedTest
    @EnumSource(KindFixture.Source.class)
    void mallocServesEverySizeAndFreeTakesTheAddress(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            LibMalloc malloc = new TerraceLibMalloc(f.kind);
            for (long size : RawMemory.SIZES) {
                long p = malloc.malloc(size);
                assertTrue(p != LibMalloc.NULL_ADDRESS && Kind.usableSize(p) >= size);
                at(p, size).fill((byte) 0x3C);
                assertEquals(-1, firstNot(p, 0, size, (byte) 0x3C));
                malloc.free(p);
            }
        }
    }

    @ParameterizedTest
    @EnumSource(KindFixture.Source.class)
    void reallocKeepsDataThroughAShrinkAndAGrow(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            LibMalloc malloc = new TerraceLibMalloc(f.kind);
            long p = malloc.malloc(10_000);
            at(p, 10_000).fill((byte) 0x77);
            p = malloc.realloc(p, 40);
            assertEquals(-1, firstNot(p, 0, 40, (byte) 0x77));
            p = malloc.realloc(p, 2 << 20);
            assertEquals(-1, firstNot(p, 0, 40, (byte) 0x77), "data lost growing");
            malloc.free(p);
        }
    }

    @ParameterizedTest
    @EnumSource(value = KindFixture.Source.class, names = {"FILE", "UNIFIED_ROUND_ROBIN"})
    void aFullFileKindGivesNullAddressAndRecovers(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            LibMalloc malloc = new TerraceLibMalloc(f.kind);
            List<Long> blocks = new ArrayList<>();
            long p;
            while ((p = malloc.malloc(1 << 20)) != LibMalloc.NULL_ADDRESS) {
                blocks.add(p);
                assertTrue(blocks.size() < 1000, "a bounded file kind never filled");
            }
            assertTrue(blocks.size() >= KindFixture.FILE_KIND_SIZE >> 21);
            long block = blocks.getFirst();
            assertEquals(LibMalloc.NULL_ADDRESS, malloc.realloc(block, 64L << 20),
                    "realloc past the capacity");
            at(block, 1 << 20).fill((byte) 1);
            blocks.forEach(malloc::free);
            long again = malloc.malloc(1 << 20);
            assertTrue(again != LibMalloc.NULL_ADDRESS, "freed space is usable again");
            malloc.free(again);
        }
    }

    @Test
    void disposeClosesAnOwnedKindOnly() {
        Kind kind = Kind.dram();
        new TerraceLibMalloc(kind).dispose();
        assertFalse(kind.isClosed());
        new TerraceLibMalloc(kind, true).dispose();
        assertTrue(kind.isClosed());
    }

    @ParameterizedTest
    @EnumSource(KindFixture.Source.class)
    void twoThreadsAllocateAndFreeConcurrently(KindFixture.Source source) throws Exception {
        try (KindFixture f = KindFixture.of(source)) {
            LibMalloc malloc = new TerraceLibMalloc(f.kind);
            RawMemory.churnOnTwoThreads(size -> {
                long p = malloc.malloc(size);
                assertTrue(p != LibMalloc.NULL_ADDRESS);
                return p;
            }, p -> {
                malloc.free(p);
                return null;
            });
        }
    }
}

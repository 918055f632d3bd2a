package dev.terrace.kinds;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.terrace.TerraceException;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.EnumSet;
import java.util.List;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.EnumSource;

/** The kinds API: factories, raw addresses, segments, stats, detection. */
class KindTest {
    private static MemorySegment at(long address, long size) {
        return MemorySegment.ofAddress(address).reinterpret(size);
    }

    @ParameterizedTest
    @EnumSource(KindFixture.Source.class)
    void rawMallocReallocFreeKeepData(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            long p = f.kind.malloc(100);
            assertTrue(Kind.usableSize(p) >= 100);
            at(p, 100).fill((byte) 7);
            long q = f.kind.realloc(p, 100_000);
            assertEquals(7, at(q, 100_000).get(ValueLayout.JAVA_BYTE, 99));
            assertTrue(Kind.usableSize(q) >= 100_000);
            assertEquals(0, f.kind.realloc(q, 0), "realloc to 0 frees and returns 0");
            long z = f.kind.calloc(10, 1000);
            assertEquals(-1, at(z, 10_000).mismatch(MemorySegment.ofArray(new byte[10_000])));
            Kind.free(z);
        }
    }

    @ParameterizedTest
    @EnumSource(value = KindFixture.Source.class, names = {"DRAM", "FILE"})
    void detectFindsTheKindThatAllocated(KindFixture.Source source) {
        try (KindFixture f = KindFixture.of(source)) {
            long p = f.kind.malloc(64);
            assertSame(f.kind, Kind.detect(p).orElseThrow());
            Kind.free(p);
        }
    }

    @Test
    void detectOfTheDefaultKindAndOfForeignMemory() {
        long p = Kind.defaultKind().malloc(64);
        assertSame(Kind.defaultKind(), Kind.detect(p).orElseThrow());
        Kind.free(p);
        try (var arena = java.lang.foreign.Arena.ofConfined()) {
            long foreign = arena.allocate(64).address();
            assertTrue(Kind.detect(foreign).isEmpty());
            assertEquals(0, Kind.usableSize(foreign));
        }
    }

    @Test
    void unifiedAllocationsComeFromItsMembers() {
        try (KindFixture f = KindFixture.of(KindFixture.Source.UNIFIED_ROUND_ROBIN)) {
            long a = f.kind.malloc(4096);
            long b = f.kind.malloc(4096);
            Kind ka = Kind.detect(a).orElseThrow();
            Kind kb = Kind.detect(b).orElseThrow();
            assertTrue(ka.toString().startsWith("file kind in"), ka.toString());
            assertTrue(kb.toString().startsWith("file kind in"), kb.toString());
            assertNotEquals(ka, kb, "round-robin takes the members in turn");
            Kind.free(a);
            Kind.free(b);
        }
    }

    @Test
    void statsCountAllocationsAndCapacity() {
        try (KindFixture f = KindFixture.fileKind(32L << 20)) {
            KindStats before = f.kind.stats();
            assertEquals(32L << 20, before.capacity());
            long p = f.kind.malloc(1 << 20);
            KindStats during = f.kind.stats();
            assertTrue(during.allocated() >= before.allocated() + (1 << 20),
                    () -> before + " -> " + during);
            assertTrue(during.reserved() > 0, "a file kind reserves blocks: " + during);
            Kind.free(p);
        }
    }

    @Test
    void fileKindWithKeepCreatesAndKeepsTheFile() throws Exception {
        Path dir = KindFixture.tempDir();
        try {
            Path file = dir.resolve("heap.kind");
            try (Kind kind = Kind.file(file, 16L << 20,
                    EnumSet.of(Kind.FileFlag.KEEP, Kind.FileFlag.NO_RESERVE_AHEAD))) {
                long p = kind.malloc(1000);
                Kind.free(p);
            }
            assertTrue(Files.isRegularFile(file), "KEEP leaves the file behind");
        } finally {
            KindFixture.deleteTree(dir);
        }
    }

    @Test
    void fileKindBelowTheMinimumSizeIsRefusedWithTheLibrarysMessage() {
        Path dir = KindFixture.tempDir();
        try {
            TerraceException e = assertThrows(TerraceException.class,
                    () -> Kind.file(dir, Kind.FILE_KIND_MIN_SIZE - 1));
            assertEquals(22, e.errno());
            assertTrue(e.getMessage().contains("terrace_kind_create_file"), e.getMessage());
        } finally {
            KindFixture.deleteTree(dir);
        }
    }

    @Test
    void numaKindOnNodeZeroAllocates() {
        try (Kind kind = Kind.numa(0)) {
            long p = kind.malloc(4096);
            at(p, 4096).fill((byte) 1);
            Kind.free(p);
        }
    }

    @Test
    void dramHugePagesAllocates() {
        try (Kind kind = Kind.dramHugePages()) {
            long p = kind.malloc(4 << 20);
            at(p, 4 << 20).fill((byte) 1);
            Kind.free(p);
        }
    }

    @Test
    void segmentAllocatorSegmentsLiveUntilTheKindCloses() {
        Kind kind = Kind.dram();
        MemorySegment s = kind.allocateFrom(ValueLayout.JAVA_LONG, 1, 2, 3);
        MemorySegment aligned = kind.allocate(100, 4096);
        assertEquals(0, aligned.address() % 4096);
        assertEquals(100, aligned.byteSize());
        assertEquals(3, s.getAtIndex(ValueLayout.JAVA_LONG, 2));
        kind.close();
        assertThrows(IllegalStateException.class, () -> s.getAtIndex(ValueLayout.JAVA_LONG, 0));
    }

    @Test
    void arenaSegmentsCopyAndAlign() {
        try (KindFixture f = KindFixture.of(KindFixture.Source.FILE);
                KindArena arena = KindArena.ofConfined(f.kind)) {
            MemorySegment text = arena.allocateFrom("terrace");
            assertEquals("terrace", text.getString(0));
            MemorySegment bytes = arena.allocateFrom(ValueLayout.JAVA_BYTE, new byte[] {1, 2, 3});
            assertArrayEquals(new byte[] {1, 2, 3}, bytes.toArray(ValueLayout.JAVA_BYTE));
            MemorySegment page = arena.allocate(8192, 4096);
            assertEquals(0, page.address() % 4096);
            assertSame(f.kind, Kind.detect(page.address()).orElseThrow());
            assertEquals(0, arena.allocate(0).byteSize());
        }
    }

    @Test
    void sharedArenaAndOwnedSegmentWorkAcrossThreads() throws Exception {
        try (Kind kind = Kind.dram()) {
            KindArena arena = KindArena.ofShared(kind);
            OwnedSegment owned = kind.allocateOwnedShared(64);
            MemorySegment s = arena.allocate(ValueLayout.JAVA_LONG);
            Thread t = new Thread(() -> {
                s.set(ValueLayout.JAVA_LONG, 0, 42);
                owned.segment().set(ValueLayout.JAVA_LONG, 0, 43);
                arena.close();
                owned.close();
            });
            t.start();
            t.join();
            assertFalse(arena.scope().isAlive());
            assertFalse(owned.isOpen());
        }
    }

    @Test
    void unifiedKindKeepsItsMembersOpen() {
        Path dir = KindFixture.tempDir();
        try (Kind a = Kind.file(dir, 16L << 20); Kind b = Kind.dram()) {
            Kind unified = Kind.unified(List.of(a, b), Kind.Strategy.ORDERED);
            IllegalStateException e = assertThrows(IllegalStateException.class, a::close);
            assertTrue(e.getMessage().contains("still open"), e.getMessage());
            unified.close();
        } finally {
            KindFixture.deleteTree(dir);
        }
    }

    @Test
    void unifiedReallocOverflowsToTheNextMemberKeepingData() {
        Path dir = KindFixture.tempDir();
        try (Kind small = Kind.file(dir, Kind.FILE_KIND_MIN_SIZE); Kind dram = Kind.dram()) {
            try (Kind unified = Kind.unified(List.of(small, dram), Kind.Strategy.ORDERED)) {
                long p = unified.malloc(1 << 20);
                assertSame(small, Kind.detect(p).orElseThrow(), "ORDERED starts at the first");
                at(p, 1 << 20).fill((byte) 0x6B);
                long q = unified.realloc(p, 32L << 20);
                assertSame(dram, Kind.detect(q).orElseThrow(),
                        "32 MiB cannot fit the 16 MiB member");
                for (long i = 0; i < 1 << 20; i += 4096) {
                    assertEquals(0x6B, at(q, 1 << 20).get(ValueLayout.JAVA_BYTE, i));
                }
                Kind.free(q);
            }
        } finally {
            KindFixture.deleteTree(dir);
        }
    }

    @Test
    void defaultKindIsNotClosable() {
        Kind kind = Kind.defaultKind();
        assertFalse(kind.isClosable());
        kind.close();
        Kind.free(kind.malloc(8));
        assertFalse(kind.isClosed());
    }
}

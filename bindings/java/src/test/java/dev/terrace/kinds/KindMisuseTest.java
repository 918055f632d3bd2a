package dev.terrace.kinds;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.terrace.TerraceException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/**
 * Misuse through the safe API throws a Java exception instead of touching freed or foreign
 * memory; misuse the C ABI cannot detect is shown to be harmless where its docs say so.
 */
class KindMisuseTest {
    /**
     * A close racing with allocations and statistics of the same kind on another thread: each
     * call either completes or throws IllegalStateException, and the kind is destroyed only
     * after the calls in flight have left it (the C ABI forbids destroying a kind in use: a
     * jemalloc arena or a unified kind's member table freed under a call).
     */
    @Test
    void aCloseRacingWithCallsNeverDestroysTheKindUnderThem() throws Exception {
        for (int attempt = 0; attempt < 200; attempt++) {
            Kind first = Kind.dram();
            Kind second = Kind.dram();
            Kind kind = Kind.unified(List.of(first, second), Kind.Strategy.ROUND_ROBIN);
            AtomicReference<Throwable> failure = new AtomicReference<>();
            Thread user = new Thread(() -> {
                try {
                    for (long i = 0; ; i++) {
                        MemorySegment s = kind.allocate(64, 8);
                        s.set(ValueLayout.JAVA_LONG, 0, i);
                        if ((i & 15) == 0) {
                            kind.stats();
                        }
                    }
                } catch (IllegalStateException closed) {
                    // the kind closed under the loop: expected
                } catch (Throwable t) {
                    failure.set(t);
                }
            });
            user.start();
            Thread.sleep(0, 50_000);
            kind.close();
            user.join();
            second.close();
            first.close();
            assertEquals(null, failure.get(), "attempt " + attempt);
        }
    }

    @Test
    void useAfterArenaCloseThrows() {
        try (Kind kind = Kind.dram()) {
            MemorySegment s;
            try (KindArena arena = KindArena.ofConfined(kind)) {
                s = arena.allocate(ValueLayout.JAVA_LONG);
                s.set(ValueLayout.JAVA_LONG, 0, 1);
            }
            assertThrows(IllegalStateException.class, () -> s.get(ValueLayout.JAVA_LONG, 0));
            assertThrows(IllegalStateException.class, () -> s.set(ValueLayout.JAVA_LONG, 0, 2));
            assertThrows(IllegalStateException.class, () -> s.asSlice(0, 4).fill((byte) 0));
        }
    }

    @Test
    void useAfterOwnedSegmentCloseThrows() {
        try (Kind kind = Kind.dram()) {
            OwnedSegment owned = kind.allocateOwned(64);
            MemorySegment s = owned.segment();
            MemorySegment slice = s.asSlice(8, 8);
            owned.close();
            assertThrows(IllegalStateException.class, () -> s.get(ValueLayout.JAVA_BYTE, 0));
            assertThrows(IllegalStateException.class, () -> slice.get(ValueLayout.JAVA_LONG, 0));
        }
    }

    @Test
    void allocatingFromAClosedArenaThrows() {
        try (Kind kind = Kind.dram()) {
            KindArena arena = KindArena.ofConfined(kind);
            arena.close();
            assertThrows(IllegalStateException.class, () -> arena.allocate(8));
        }
    }

    @Test
    void outOfBoundsAccessThrows() {
        try (Kind kind = Kind.dram(); KindArena arena = KindArena.ofConfined(kind);
                OwnedSegment owned = kind.allocateOwned(16)) {
            MemorySegment s = arena.allocate(16);
            assertThrows(IndexOutOfBoundsException.class, () -> s.get(ValueLayout.JAVA_BYTE, 16));
            assertThrows(IndexOutOfBoundsException.class,
                    () -> s.get(ValueLayout.JAVA_LONG_UNALIGNED, 9));
            assertThrows(IndexOutOfBoundsException.class, () -> s.asSlice(8, 9));
            assertThrows(IndexOutOfBoundsException.class,
                    () -> owned.segment().set(ValueLayout.JAVA_INT_UNALIGNED, 13, 1));
            assertThrows(IndexOutOfBoundsException.class,
                    () -> kind.allocate(8).get(ValueLayout.JAVA_BYTE, -1));
        }
    }

    @Test
    void aClosedKindRefusesEveryAllocation() {
        Kind kind = Kind.dram();
        kind.close();
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> kind.malloc(8));
        assertTrue(e.getMessage().contains("closed"), e.getMessage());
        assertThrows(IllegalStateException.class, () -> kind.calloc(8));
        assertThrows(IllegalStateException.class, () -> kind.realloc(0, 8));
        assertThrows(IllegalStateException.class, () -> kind.allocate(8));
        assertThrows(IllegalStateException.class, () -> kind.allocateOwned(8));
        assertThrows(IllegalStateException.class, () -> KindArena.ofConfined(kind));
        assertThrows(IllegalStateException.class, kind::stats);
    }

    @Test
    void doubleCloseIsHarmless() {
        Kind kind = Kind.dram();
        KindArena arena = KindArena.ofConfined(kind);
        OwnedSegment owned = kind.allocateOwned(8);
        arena.close();
        arena.close();
        owned.close();
        owned.close();
        kind.close();
        assertDoesNotThrow(kind::close);
        assertTrue(kind.isClosed());
    }

    @Test
    void aKindWithOpenArenasOrOwnedSegmentsRefusesToClose() {
        Kind kind = Kind.dram();
        KindArena arena = KindArena.ofConfined(kind);
        MemorySegment s = arena.allocate(8);
        OwnedSegment owned = kind.allocateOwned(8);
        IllegalStateException e = assertThrows(IllegalStateException.class, kind::close);
        assertTrue(e.getMessage().contains("2 arena(s)"), e.getMessage());
        s.set(ValueLayout.JAVA_LONG, 0, 5);
        assertEquals(5, s.get(ValueLayout.JAVA_LONG, 0), "the refused close freed nothing");
        arena.close();
        owned.close();
        kind.close();
        assertTrue(kind.isClosed());
    }

    @Test
    void freeOfForeignMemoryThroughTheRawApiDoesNothing() {
        // terrace.h: "Freeing a pointer that no kind owns (NULL, foreign memory, memory of a
        // destroyed kind) does nothing." There is no error to report, so none is thrown, and
        // the foreign memory stays intact.
        try (Arena jdk = Arena.ofConfined()) {
            MemorySegment foreign = jdk.allocate(64);
            foreign.fill((byte) 9);
            assertDoesNotThrow(() -> Kind.free(foreign.address()));
            assertDoesNotThrow(() -> Kind.free(0));
            assertEquals(9, foreign.get(ValueLayout.JAVA_BYTE, 63));
        }
        Kind kind = Kind.dram();
        long p = kind.malloc(64);
        kind.close();
        assertDoesNotThrow(() -> Kind.free(p), "memory of a destroyed kind");
    }

    @Test
    void mallocOfZeroIsATypedErrorWithTheLibrarysText() {
        try (Kind kind = Kind.dram()) {
            TerraceException e = assertThrows(TerraceException.class, () -> kind.malloc(0));
            assertEquals(22, e.errno());
            assertTrue(e.getMessage().startsWith("malloc(0) from DRAM kind failed (errno 22): "),
                    e.getMessage());
        }
    }

    @Test
    void aFullFileKindThrowsKindOutOfMemoryErrorAndRecovers() {
        try (KindFixture f = KindFixture.fileKind(Kind.FILE_KIND_MIN_SIZE)) {
            List<Long> blocks = new ArrayList<>();
            KindOutOfMemoryError full = null;
            for (int i = 0; i < 64 && full == null; i++) {
                try {
                    blocks.add(f.kind.malloc(1 << 20));
                } catch (KindOutOfMemoryError e) {
                    full = e;
                }
            }
            KindOutOfMemoryError error = full;
            assertTrue(error != null, "a 16 MiB file kind held 64 MiB");
            assertTrue(error.errno() == 12 || error.errno() == 28, error.getMessage());
            assertTrue(error.getMessage().contains("file kind in"), error.getMessage());
            assertTrue(blocks.size() >= 8, "only " + blocks.size() + " MiB fitted in 16 MiB");
            blocks.forEach(Kind::free);
            Kind.free(f.kind.malloc(1 << 20));
        }
    }

    @Test
    void safeApiOnAFullKindThrowsAndLeaksNothing() {
        try (KindFixture f = KindFixture.fileKind(Kind.FILE_KIND_MIN_SIZE)) {
            KindArena arena = KindArena.ofConfined(f.kind);
            assertThrows(KindOutOfMemoryError.class, () -> {
                for (int i = 0; i < 64; i++) {
                    arena.allocate(1 << 20);
                }
            });
            assertThrows(KindOutOfMemoryError.class, () -> f.kind.allocateOwned(64L << 20));
            arena.close();
            assertEquals(0, f.kind.stats().allocated() / (1 << 20),
                    "the arena freed its megabytes: " + f.kind.stats());
        }
    }
}

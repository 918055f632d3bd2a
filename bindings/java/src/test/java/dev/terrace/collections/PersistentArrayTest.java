package dev.terrace.collections;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * PersistentArray against a byte[] model: single elements and runs, longs, reopening by
 * name, wrong arguments and kinds, closed use, destroy, readers beside a writer, and a heap
 * closed while threads call.
 */
class PersistentArrayTest {
    private final MapFixture files = new MapFixture();

    @BeforeAll
    static void supported() {
        assumeTrue(PersistentArray.isSupported(),
                "the loaded libterrace.so has no terrace_array_* symbols (native side not built)");
    }

    @AfterEach
    void deleteFiles() {
        files.close();
    }

    @ParameterizedTest
    @ValueSource(strings = {"raw", "persistent", "transactional"})
    void elementsAndRunsMatchAModelAcrossReopening(String flavour) {
        int length = 300;
        int element = 12;
        byte[] model = new byte[length * element];
        String path = files.newPath();
        Random random = new Random(11);
        try (AnyHeap heap = MapFixture.create(flavour, path);
                PersistentArray a = new PersistentArray(heap, "a", length, element)) {
            assertEquals(length, a.length());
            assertEquals(element, a.elementSize());
            assertEquals("a", a.name());
            byte[] all = new byte[length * element];
            a.get(0, all);
            assertArrayEquals(model, all, "created zeroed");
            for (int n = 0; n < 2000; n++) {
                int first = random.nextInt(length);
                int count = random.nextInt(3) == 0 ? 1 + random.nextInt(Math.min(6,
                        length - first)) : 1;
                byte[] data = new byte[count * element];
                random.nextBytes(data);
                a.set(first, data);
                System.arraycopy(data, 0, model, first * element, data.length);
                if (n % 100 == 0) {
                    int i = random.nextInt(length);
                    assertArrayEquals(Arrays.copyOfRange(model, i * element, (i + 1) * element),
                            a.get(i), "element " + i);
                }
            }
            a.get(0, all);
            assertArrayEquals(model, all);
        }
        try (AnyHeap heap = MapFixture.open(flavour, path);
                PersistentArray a = PersistentArray.open(heap, "a")) {
            assertEquals(length, a.length());
            assertEquals(element, a.elementSize());
            byte[] all = new byte[length * element];
            a.get(0, all);
            assertArrayEquals(model, all, "after reopening");
            byte[] mid = new byte[5 * element];
            a.get(100, mid);
            assertArrayEquals(Arrays.copyOfRange(model, 100 * element, 105 * element), mid);
        }
    }

    @Test
    void longsInEightByteElements() {
        try (AnyHeap heap = MapFixture.create("raw", files.newPath());
                PersistentArray words = new PersistentArray(heap, "w", 1000, 8);
                PersistentArray bytes = new PersistentArray(heap, "b", 10, 12)) {
            for (int i = 0; i < 1000; i++) {
                words.setLong(i, i * 0x9E3779B97F4A7C15L);
            }
            for (int i = 0; i < 1000; i++) {
                assertEquals(i * 0x9E3779B97F4A7C15L, words.getLong(i));
            }
            byte[] raw = words.get(1);
            assertEquals(0x9E3779B97F4A7C15L, java.nio.ByteBuffer.wrap(raw)
                    .order(java.nio.ByteOrder.LITTLE_ENDIAN).getLong(), "little-endian");
            assertThrows(UnsupportedOperationException.class, () -> bytes.getLong(0));
            assertThrows(UnsupportedOperationException.class, () -> bytes.setLong(0, 1));
        }
    }

    @Test
    void wrongArgumentsKindsAndClosedUseThrow() {
        AnyHeap heap = MapFixture.create("raw", files.newPath());
        try {
            assertThrows(IllegalArgumentException.class, () -> new PersistentArray(heap, "x", 0,
                    8));
            assertThrows(IllegalArgumentException.class, () -> new PersistentArray(heap, "x", 4,
                    0));
            assertThrows(IllegalArgumentException.class, () -> new PersistentArray(heap, "x", 4,
                    PersistentArray.MAX_ELEMENT_SIZE + 1));
            assertThrows(IllegalArgumentException.class, () -> new PersistentArray(heap, "",
                    4, 8));
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentArray(heap, "huge", 1L << 40, 8), "larger than the heap");
            HeapException unbound = assertThrows(HeapException.class,
                    () -> PersistentArray.open(heap, "x"));
            assertEquals(2, unbound.errno());

            PersistentArray a = new PersistentArray(heap, "a", 10, 4);
            HeapException twice = assertThrows(HeapException.class,
                    () -> PersistentArray.open(heap, "a"));
            assertEquals(16, twice.errno());
            assertThrows(IndexOutOfBoundsException.class, () -> a.get(10));
            assertThrows(IndexOutOfBoundsException.class, () -> a.get(-1));
            assertThrows(IndexOutOfBoundsException.class, () -> a.set(9, new byte[8]));
            assertThrows(IllegalArgumentException.class, () -> a.set(0, new byte[3]));
            assertThrows(IllegalArgumentException.class, () -> a.get(0, new byte[6]));
            assertThrows(IllegalArgumentException.class, () -> a.set(0, new byte[0]));
            assertThrows(NullPointerException.class, () -> a.set(0, null));
            byte[] zeros = new byte[40];
            a.get(0, zeros);
            assertArrayEquals(new byte[40], zeros, "refused writes changed nothing");

            try (PersistentArray big = new PersistentArray(heap, "big", 10_000, 8)) {
                assertThrows(IllegalArgumentException.class,
                        () -> big.set(0, new byte[PersistentArray.MAX_SET_BYTES + 8]));
            }
            try (ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "index", 8)) {
                index.put(new byte[] {1}, 1);
                HeapException kind = assertThrows(HeapException.class,
                        () -> new PersistentArray(heap, "index", 10, 4));
                assertEquals(17, kind.errno());
                HeapException notMap = assertThrows(HeapException.class,
                        () -> ConcurrentLongIndex.open(heap, "a"));
                assertEquals(17, notMap.errno());
                HeapException notArray = assertThrows(HeapException.class,
                        () -> PersistentArray.destroy(heap, "index"));
                assertEquals(17, notArray.errno());
            }

            HeapException busy = assertThrows(HeapException.class,
                    () -> PersistentArray.destroy(heap, "a"));
            assertEquals(16, busy.errno());
            a.close();
            assertTrue(a.isClosed());
            a.close(); // twice: nothing
            assertThrows(IllegalStateException.class, () -> a.get(0));
            assertThrows(IllegalStateException.class, () -> a.set(0, new byte[4]));
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentArray(heap, "a", 11, 4), "another length");
            PersistentArray.destroy(heap, "a");
            assertEquals(2, assertThrows(HeapException.class,
                    () -> PersistentArray.open(heap, "a")).errno());

            PersistentArray last = new PersistentArray(heap, "last", 4, 8);
            heap.close();
            assertTrue(last.isClosed(), "the heap's close closes its arrays");
            assertThrows(IllegalStateException.class, () -> last.getLong(0));
        } finally {
            heap.close();
        }
    }

    /** Each 24-byte element is one byte repeated: a reader seeing two values tore it. */
    @Test
    void readersNeverSeeATornElementAndAHeapCloseWaitsForCalls() throws Exception {
        AnyHeap heap = MapFixture.create("raw", files.newPath());
        PersistentArray a = new PersistentArray(heap, "r", 64, 24);
        AtomicReference<Throwable> wrong = new AtomicReference<>();
        AtomicBoolean started = new AtomicBoolean();
        List<Thread> readers = new ArrayList<>();
        for (int t = 0; t < 2; t++) {
            int seed = t;
            readers.add(Thread.ofPlatform().start(() -> {
                Random random = new Random(seed);
                try {
                    while (true) {
                        byte[] e = a.get(random.nextInt(64));
                        started.set(true);
                        for (byte b : e) {
                            if (b != e[0]) {
                                throw new AssertionError("torn: " + Arrays.toString(e));
                            }
                        }
                    }
                } catch (IllegalStateException closed) {
                    // the end: the heap closed
                } catch (Throwable other) {
                    wrong.compareAndSet(null, other);
                }
            }));
        }
        Random random = new Random(5);
        for (int n = 0; n < 20_000 || !started.get(); n++) {
            byte[] value = new byte[24];
            Arrays.fill(value, (byte) n);
            a.set(random.nextInt(64), value);
        }
        heap.close();
        for (Thread r : readers) {
            r.join(TimeUnit.SECONDS.toMillis(30));
            assertFalse(r.isAlive(), "a reader did not stop after the close");
        }
        if (wrong.get() != null) {
            fail("a reader failed otherwise than as closed", wrong.get());
        }
    }
}

package dev.terrace.collections;

import static dev.terrace.collections.MapFixture.hex;
import static dev.terrace.collections.MapFixture.randomKey;
import static dev.terrace.collections.MapFixture.valueOf;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import dev.terrace.pool.Transaction;
import dev.terrace.pool.TransactionalHeap;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.NavigableMap;
import java.util.NoSuchElementException;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * ConcurrentLongIndex against a java.util.TreeMap model: point operations, ordered and
 * reverse ranges with every inclusivity, reopening, wrong arguments, closed use, and readers
 * running beside a writer.
 */
class ConcurrentLongIndexTest {
    private static final int MAX_KEY = 24;
    private final MapFixture files = new MapFixture();

    @BeforeAll
    static void supported() {
        MapFixture.assumeSupported();
    }

    @AfterEach
    void deleteFiles() {
        files.close();
    }

    @ParameterizedTest
    @ValueSource(strings = {"raw", "persistent", "transactional"})
    void putGetRemoveAndSizeOnEveryFlavour(String flavour) {
        try (AnyHeap heap = MapFixture.create(flavour, files.newPath());
                ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "idx", MAX_KEY)) {
            assertEquals(0, index.size());
            assertEquals(0, index.get(new byte[] {1}));
            assertFalse(index.containsKey(new byte[] {1}));
            index.put(new byte[] {1}, 10);
            index.put(new byte[] {1, 2}, 12);
            index.put(new byte[] {(byte) 0xff}, -1);
            index.put(new byte[] {0}, 0);
            assertEquals(4, index.size());
            assertEquals(10, index.get(new byte[] {1}));
            assertEquals(12, index.get(new byte[] {1, 2}));
            assertEquals(-1, index.get(new byte[] {(byte) 0xff}));
            assertEquals(0, index.get(new byte[] {0}));
            assertTrue(index.containsKey(new byte[] {0}), "a stored 0 is told from absent");
            index.put(new byte[] {1}, 11);
            assertEquals(4, index.size(), "a put of a present key replaces");
            assertEquals(11, index.get(new byte[] {1}));
            assertArrayEquals(new byte[] {0}, index.firstKey());
            assertArrayEquals(new byte[] {(byte) 0xff}, index.lastKey());
            List<Long> cleaned = new ArrayList<>();
            assertEquals(11, index.remove(new byte[] {1}, cleaned::add));
            assertEquals(List.of(11L), cleaned);
            assertEquals(0, index.remove(new byte[] {1}, cleaned::add));
            assertEquals(List.of(11L), cleaned, "no cleaner call for an absent key");
            assertEquals(12, index.remove(new byte[] {1, 2}));
            assertEquals(2, index.size());
            assertEquals(0, index.get(new byte[] {1, 2}));
            assertEquals(MAX_KEY, index.maxKeyLength());
            assertEquals("idx", index.name());
        }
    }

    @Test
    void randomKeysMatchATreeMapInEveryRangeAndDirection() {
        Random random = new Random(42);
        NavigableMap<byte[], Long> model = new TreeMap<>(Arrays::compareUnsigned);
        try (AnyHeap heap = MapFixture.create("raw", files.newPath());
                ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "model", MAX_KEY)) {
            for (int i = 0; i < 4000; i++) {
                byte[] key = randomKey(random, MAX_KEY);
                long value = random.nextLong();
                index.put(key, value);
                model.put(key, value);
            }
            List<byte[]> keys = new ArrayList<>(model.keySet());
            for (int i = 0; i < 600; i++) {
                byte[] key = keys.get(random.nextInt(keys.size()));
                Long expected = model.remove(key);
                assertEquals(expected == null ? 0 : expected, index.remove(key));
            }
            assertEquals(model.size(), index.size());
            for (byte[] key : keys) {
                Long expected = model.get(key);
                assertEquals(expected == null ? 0 : expected, index.get(key), hex(key));
            }
            assertSame(model, index.getEntryIterator(), "full, ascending");
            assertSame(model.descendingMap(), index.getReverseEntryIterator(), "full, descending");
            for (int i = 0; i < 300; i++) {
                byte[] a = random.nextBoolean() ? keys.get(random.nextInt(keys.size()))
                        : randomKey(random, MAX_KEY);
                byte[] b = random.nextInt(10) == 0 ? a : random.nextBoolean()
                        ? keys.get(random.nextInt(keys.size())) : randomKey(random, MAX_KEY);
                byte[] lo = Arrays.compareUnsigned(a, b) <= 0 ? a : b;
                byte[] hi = lo == a ? b : a;
                for (int flags = 0; flags < 4; flags++) {
                    boolean loIn = (flags & 1) != 0;
                    boolean hiIn = (flags & 2) != 0;
                    String what = hex(lo) + (loIn ? "[" : "(") + " .. " + hex(hi)
                            + (hiIn ? "]" : ")");
                    NavigableMap<byte[], Long> sub = Arrays.equals(lo, hi) && !(loIn && hiIn)
                            ? new TreeMap<>(Arrays::compareUnsigned)
                            : model.subMap(lo, loIn, hi, hiIn);
                    assertSame(sub, index.getEntryIterator(lo, loIn, hi, hiIn), what);
                    assertSame(sub.descendingMap(),
                            index.getReverseEntryIterator(lo, loIn, hi, hiIn), "reverse " + what);
                }
                assertSame(model.tailMap(lo, true), index.getTailEntryIterator(lo, true), "tail");
                assertSame(model.tailMap(lo, false), index.getTailEntryIterator(lo, false),
                        "tail exclusive");
                assertSame(model.headMap(hi, false), index.getHeadEntryIterator(hi, false),
                        "head");
                assertSame(model.headMap(hi, true), index.getHeadEntryIterator(hi, true),
                        "head inclusive");
                assertSame(model.tailMap(lo, true), index.getEntryIterator(lo, true, null, false),
                        "open high end");
                assertSame(model.headMap(hi, true).descendingMap(),
                        index.getReverseEntryIterator(null, false, hi, true), "open low end");
            }
        }
    }

    /** Walks it to the end, comparing with expected, and checks it is then exhausted. */
    private static void assertSame(Map<byte[], Long> expected,
            AutoCloseableIterator<ConcurrentLongIndex.Entry> it, String what) {
        try (it) {
            int n = 0;
            for (Map.Entry<byte[], Long> e : expected.entrySet()) {
                assertTrue(it.hasNext(), what + ": ends after " + n + " of " + expected.size());
                ConcurrentLongIndex.Entry got = it.next();
                assertArrayEquals(e.getKey(), got.getKey(), what + ": key " + n);
                assertEquals(e.getValue(), got.getValue(), what + ": value " + n);
                n++;
            }
            assertFalse(it.hasNext(), what + ": more than " + expected.size());
            assertThrows(NoSuchElementException.class, it::next);
        }
    }

    @ParameterizedTest
    @ValueSource(strings = {"raw", "persistent", "transactional"})
    void aReopenedHeapHoldsTheSameEntries(String flavour) {
        String path = files.newPath();
        Random random = new Random(7);
        NavigableMap<byte[], Long> model = new TreeMap<>(Arrays::compareUnsigned);
        try (AnyHeap heap = MapFixture.create(flavour, path)) {
            ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "kept", 16);
            for (int i = 0; i < 2000; i++) {
                byte[] key = randomKey(random, 16);
                index.put(key, valueOf(key));
                model.put(key, valueOf(key));
            }
            // not closed here: the heap's close closes it
        }
        try (AnyHeap heap = MapFixture.open(flavour, path)) {
            try (ConcurrentLongIndex index = ConcurrentLongIndex.open(heap, "kept")) {
                assertEquals(model.size(), index.size());
                assertSame(model, index.getEntryIterator(), "after reopen");
                byte[] extra = {9, 9, 9};
                index.put(extra, 99);
                model.put(extra, 99L);
            }
            try (ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "kept", 16)) {
                assertEquals(99, index.get(new byte[] {9, 9, 9}));
                assertSame(model, index.getEntryIterator(), "opened again, same sizes");
            }
            assertThrows(IllegalArgumentException.class,
                    () -> new ConcurrentLongIndex(heap, "kept", 17), "another max key length");
            HeapException e = assertThrows(HeapException.class,
                    () -> ConcurrentLongIndex.open(heap, "unknown"));
            assertEquals(2, e.errno(), e.getMessage());
        }
    }

    @Test
    void wrongArgumentsThrowClearly() {
        try (AnyHeap heap = MapFixture.create("raw", files.newPath());
                ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "args", 8)) {
            IllegalArgumentException tooLong = assertThrows(IllegalArgumentException.class,
                    () -> index.put(new byte[9], 1));
            assertTrue(tooLong.getMessage().contains("9 bytes"), tooLong.getMessage());
            assertThrows(IllegalArgumentException.class, () -> index.put(null, 1));
            assertThrows(IllegalArgumentException.class, () -> index.get(null));
            assertThrows(IllegalArgumentException.class, () -> index.put(new byte[0], 1));
            assertThrows(IllegalArgumentException.class, () -> index.get(new byte[9]));
            assertThrows(IllegalArgumentException.class, () -> index.remove(null));
            assertThrows(IllegalArgumentException.class,
                    () -> index.getEntryIterator(new byte[] {2}, true, new byte[] {1}, true),
                    "low bound above the high one");
            assertThrows(IllegalArgumentException.class,
                    () -> index.getTailEntryIterator(null, true));
            assertThrows(NullPointerException.class, () -> index.remove(new byte[] {1}, null));
            assertThrows(IllegalArgumentException.class,
                    () -> new ConcurrentLongIndex(heap, "big", 256));
            assertThrows(IllegalArgumentException.class,
                    () -> new ConcurrentLongIndex(heap, "zero", 0));
            assertThrows(IllegalArgumentException.class,
                    () -> new ConcurrentLongIndex(heap, "", 8));
            assertThrows(IllegalArgumentException.class,
                    () -> new ConcurrentLongIndex(heap, "x".repeat(65), 8));
            assertThrows(IllegalArgumentException.class,
                    () -> new ConcurrentLongIndex(heap, null, 8));
            HeapException twice = assertThrows(HeapException.class,
                    () -> new ConcurrentLongIndex(heap, "args", 8), "open twice");
            assertEquals(16, twice.errno(), twice.getMessage());
            assertThrows(NoSuchElementException.class, index::firstKey);
            assertEquals(0, index.size(), "nothing was stored by the refused calls");
        }
    }

    /**
     * Closing the heap while threads are inside gets, puts and iterations waits for their
     * native calls (the heap's close unmaps the pool: a call left running would fault); every
     * call after that throws IllegalStateException, and nothing else is thrown.
     */
    @Test
    void closingTheHeapWaitsForCallsInsideIt() throws Exception {
        for (int round = 0; round < 5; round++) {
            AnyHeap heap = MapFixture.create("raw", files.newPath());
            ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "busy", 8);
            for (int i = 0; i < 2_000; i++) {
                index.put(keyOf(i), i);
            }
            List<Thread> threads = new ArrayList<>();
            AtomicReference<Throwable> wrong = new AtomicReference<>();
            CountDownLatch running = new CountDownLatch(3);
            for (int t = 0; t < 3; t++) {
                int kind = t;
                threads.add(Thread.ofPlatform().start(() -> {
                    Random random = new Random(kind);
                    running.countDown();
                    try {
                        for (long n = 0; ; n++) {
                            byte[] key = keyOf(random.nextInt(2_000));
                            switch (kind) {
                                case 0 -> index.get(key);
                                case 1 -> index.put(key, n);
                                default -> {
                                    try (var it = index.getTailEntryIterator(key, true)) {
                                        for (int k = 0; k < 10 && it.hasNext(); k++) {
                                            it.next();
                                        }
                                    }
                                }
                            }
                        }
                    } catch (IllegalStateException closed) {
                        // the end this test waits for
                    } catch (Throwable t2) {
                        wrong.compareAndSet(null, t2);
                    }
                }));
            }
            running.await();
            Thread.sleep(20);
            heap.close();
            for (Thread t : threads) {
                t.join(TimeUnit.SECONDS.toMillis(30));
                assertFalse(t.isAlive(), "a caller did not stop after the close");
            }
            if (wrong.get() != null) {
                fail("a call failed otherwise than as closed", wrong.get());
            }
            assertTrue(index.isClosed());
        }
    }

    /** Key i: its eight big-endian bytes. */
    private static byte[] keyOf(long i) {
        return java.nio.ByteBuffer.allocate(8).putLong(i).array();
    }

    @Test
    void aClosedIndexAndItsIteratorsThrow() {
        AnyHeap heap = MapFixture.create("raw", files.newPath());
        try {
            ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "closing", 8);
            for (int i = 0; i < 10; i++) {
                index.put(new byte[] {(byte) i}, i + 1);
            }
            AutoCloseableIterator<ConcurrentLongIndex.Entry> open = index.getEntryIterator();
            assertEquals(1, open.next().getValue());
            index.close();
            assertTrue(index.isClosed());
            index.close(); // twice: nothing
            assertThrows(IllegalStateException.class, () -> index.get(new byte[] {1}));
            assertThrows(IllegalStateException.class, () -> index.put(new byte[] {1}, 1));
            assertThrows(IllegalStateException.class, () -> index.remove(new byte[] {1}));
            assertThrows(IllegalStateException.class, index::size);
            assertThrows(IllegalStateException.class, index::getEntryIterator);
            // the iterator holds one entry ahead at most; then it throws
            assertThrows(IllegalStateException.class, () -> {
                while (open.hasNext()) {
                    open.next();
                }
            });
            open.close();
            // the name can be opened again once closed
            try (ConcurrentLongIndex again = ConcurrentLongIndex.open(heap, "closing")) {
                assertEquals(10, again.size());
            }
            ConcurrentLongIndex last = ConcurrentLongIndex.open(heap, "closing");
            heap.close();
            assertTrue(last.isClosed(), "the heap's close closes its maps");
            assertThrows(IllegalStateException.class, () -> last.get(new byte[] {1}));
            assertThrows(IllegalStateException.class,
                    () -> new ConcurrentLongIndex(heap, "closing", 8));
        } finally {
            heap.close();
        }
    }

    @Test
    void destroyUnbindsTheName() {
        try (AnyHeap heap = MapFixture.create("persistent", files.newPath())) {
            ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "gone", 8);
            index.put(new byte[] {1}, 1);
            HeapException open = assertThrows(HeapException.class,
                    () -> ConcurrentLongIndex.destroy(heap, "gone"));
            assertEquals(16, open.errno(), "destroying an open map: " + open.getMessage());
            index.close();
            ConcurrentLongIndex.destroy(heap, "gone");
            HeapException unbound = assertThrows(HeapException.class,
                    () -> ConcurrentLongIndex.open(heap, "gone"));
            assertEquals(2, unbound.errno());
            assertEquals(2, assertThrows(HeapException.class,
                    () -> ConcurrentLongIndex.destroy(heap, "gone")).errno());
            try (ConcurrentLongIndex again = new ConcurrentLongIndex(heap, "gone", 8)) {
                assertEquals(0, again.size(), "a new, empty map under the name");
            }
        }
    }

    @Test
    void operationsAreNotPartOfATransaction() {
        try (TransactionalHeap heap = TransactionalHeap.createHeap(files.newPath(),
                MapFixture.HEAP_SIZE); ConcurrentLongIndex index =
                        new ConcurrentLongIndex(heap, "tx", 8)) {
            assertThrows(ArithmeticException.class, () -> Transaction.create(heap, () -> {
                index.put(new byte[] {1}, 5);
                throw new ArithmeticException();
            }));
            assertEquals(5, index.get(new byte[] {1}), "a put is atomic on its own");
        }
    }

    @Test
    void readersRunBesideOneWriter() throws Exception {
        int keyCount = 2000;
        Random random = new Random(3);
        byte[][] keys = new byte[keyCount][];
        for (int i = 0; i < keyCount; i++) {
            keys[i] = randomKey(random, 12);
        }
        try (AnyHeap heap = MapFixture.create("raw", files.newPath());
                ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "shared", 12)) {
            for (int i = 0; i < keyCount; i += 2) {
                index.put(keys[i], valueOf(keys[i]));
            }
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(1500);
            AtomicReference<Throwable> failure = new AtomicReference<>();
            CountDownLatch done = new CountDownLatch(4);
            Thread writer = Thread.ofPlatform().start(() -> {
                try {
                    Random r = new Random(5);
                    while (System.nanoTime() < deadline && failure.get() == null) {
                        byte[] key = keys[r.nextInt(keyCount)];
                        if (r.nextBoolean()) {
                            index.put(key, valueOf(key));
                        } else {
                            index.remove(key);
                        }
                    }
                } catch (Throwable t) {
                    failure.compareAndSet(null, t);
                } finally {
                    done.countDown();
                }
            });
            List<Thread> readers = new ArrayList<>();
            for (int t = 0; t < 3; t++) {
                int seed = t;
                readers.add(Thread.ofPlatform().start(() -> {
                    try {
                        Random r = new Random(100 + seed);
                        while (System.nanoTime() < deadline && failure.get() == null) {
                            byte[] key = keys[r.nextInt(keyCount)];
                            long v = index.get(key);
                            if (v != 0 && v != valueOf(key)) {
                                fail("torn value for " + hex(key) + ": " + v);
                            }
                            byte[] from = keys[r.nextInt(keyCount)];
                            byte[] previous = null;
                            try (var it = index.getTailEntryIterator(from, true)) {
                                for (int n = 0; n < 50 && it.hasNext(); n++) {
                                    ConcurrentLongIndex.Entry e = it.next();
                                    assertEquals(valueOf(e.getKey()), e.getValue());
                                    assertTrue(Arrays.compareUnsigned(from, e.getKey()) <= 0);
                                    if (previous != null) {
                                        assertTrue(Arrays.compareUnsigned(previous,
                                                e.getKey()) < 0, "ascending");
                                    }
                                    previous = e.getKey();
                                }
                            }
                        }
                    } catch (Throwable t2) {
                        failure.compareAndSet(null, t2);
                    } finally {
                        done.countDown();
                    }
                }));
            }
            assertTrue(done.await(60, TimeUnit.SECONDS), "threads did not finish");
            writer.join();
            for (Thread t : readers) {
                t.join();
            }
            if (failure.get() != null) {
                throw new AssertionError("a thread failed", failure.get());
            }
            long count = 0;
            try (var it = index.getEntryIterator()) {
                while (it.hasNext()) {
                    ConcurrentLongIndex.Entry e = it.next();
                    assertEquals(valueOf(e.getKey()), e.getValue());
                    count++;
                }
            }
            assertEquals(index.size(), count);
            assertNull(failure.get());
        }
    }
}

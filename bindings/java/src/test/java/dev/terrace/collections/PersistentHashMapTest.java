package dev.terrace.collections;

import static dev.terrace.collections.MapFixture.hex;
import static dev.terrace.collections.MapFixture.randomKey;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Random;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * PersistentHashMap against a java.util.HashMap model: values inline and out of line,
 * iteration in no order, reopening, wrong arguments, names of another kind, closed use,
 * destroy, and threads.
 */
class PersistentHashMapTest {
    private static final int MAX_KEY = 24;
    private static final int INLINE = 16;
    private final MapFixture files = new MapFixture();

    @BeforeAll
    static void supported() {
        assumeTrue(PersistentHashMap.isSupported(),
                "the loaded libterrace.so has no terrace_hmap_* symbols (native side not built)");
    }

    @AfterEach
    void deleteFiles() {
        files.close();
    }

    /** The model's key: a byte[] compared by content. */
    private static ByteBuffer k(byte[] key) {
        return ByteBuffer.wrap(key.clone());
    }

    private static byte[] randomValue(Random random) {
        // mostly within the 16 inline bytes, some beyond (kept out of line), a few large
        int len = switch (random.nextInt(8)) {
            case 0 -> 0;
            case 1, 2 -> INLINE + 1 + random.nextInt(300);
            case 3 -> 2000 + random.nextInt(6000);
            default -> random.nextInt(INLINE + 1);
        };
        byte[] v = new byte[len];
        random.nextBytes(v);
        return v;
    }

    private static void assertSameAs(Map<ByteBuffer, byte[]> model, PersistentHashMap map,
            String what) {
        assertEquals(model.size(), map.size(), what + ": size");
        for (Map.Entry<ByteBuffer, byte[]> e : model.entrySet()) {
            byte[] key = e.getKey().array();
            assertArrayEquals(e.getValue(), map.get(key), what + ": get " + hex(key));
            assertTrue(map.containsKey(key), what + ": containsKey " + hex(key));
        }
        assertIterationIs(model, map, what);
    }

    /** entries() yields each model entry exactly once (no writer runs meanwhile). */
    private static void assertIterationIs(Map<ByteBuffer, byte[]> model, PersistentHashMap map,
            String what) {
        Map<ByteBuffer, byte[]> seen = new HashMap<>();
        try (AutoCloseableIterator<Map.Entry<byte[], byte[]>> it = map.entries()) {
            while (it.hasNext()) {
                Map.Entry<byte[], byte[]> e = it.next();
                byte[] previous = seen.put(ByteBuffer.wrap(e.getKey()), e.getValue());
                assertNull(previous, what + ": " + hex(e.getKey()) + " seen twice");
            }
            assertFalse(it.hasNext());
            assertThrows(NoSuchElementException.class, it::next);
        }
        assertEquals(model.keySet(), seen.keySet(), what + ": iterated keys");
        for (Map.Entry<ByteBuffer, byte[]> e : model.entrySet()) {
            assertArrayEquals(e.getValue(), seen.get(e.getKey()),
                    what + ": iterated value of " + hex(e.getKey().array()));
        }
    }

    @ParameterizedTest
    @ValueSource(strings = {"raw", "persistent", "transactional"})
    void randomKeysMatchAHashMapAndSurviveAReopen(String flavour) {
        String path = files.newPath();
        Random random = new Random(23);
        Map<ByteBuffer, byte[]> model = new HashMap<>();
        try (AnyHeap heap = MapFixture.create(flavour, path);
                PersistentHashMap map = new PersistentHashMap(heap, "blobs", MAX_KEY, INLINE)) {
            assertTrue(map.isEmpty());
            assertEquals("blobs", map.name());
            assertEquals(MAX_KEY, map.maxKeyLength());
            assertIterationIs(model, map, "empty");
            for (int i = 0; i < 4000; i++) {
                byte[] key = randomKey(random, MAX_KEY);
                byte[] value = randomValue(random);
                map.put(key, value);
                model.put(k(key), value);
                if (i % 7 == 0) {
                    // a miss: a key that is not in the model
                    byte[] other = randomKey(random, MAX_KEY);
                    if (!model.containsKey(k(other))) {
                        assertNull(map.get(other), hex(other));
                        assertFalse(map.containsKey(other), hex(other));
                        assertFalse(map.remove(other), hex(other));
                    }
                }
            }
            assertTrue(model.size() > 2000, "enough distinct keys: " + model.size());
            for (ByteBuffer key : new ArrayList<>(model.keySet())) {
                if (random.nextInt(4) == 0) {
                    assertTrue(map.remove(key.array()));
                    assertFalse(map.remove(key.array()));
                    model.remove(key);
                    assertNull(map.get(key.array()));
                }
            }
            // replacing values across the inline boundary, both ways
            int n = 0;
            for (Map.Entry<ByteBuffer, byte[]> e : model.entrySet()) {
                if (n++ % 10 == 0) {
                    byte[] value = e.getValue().length > INLINE ? new byte[] {7}
                            : new byte[INLINE + 40];
                    map.put(e.getKey().array(), value);
                    e.setValue(value);
                }
            }
            byte[] big = new byte[(1 << 20) + 10];
            random.nextBytes(big);
            map.put(new byte[] {1, 2, 3}, big);
            model.put(k(new byte[] {1, 2, 3}), big);
            assertArrayEquals(big, map.get(new byte[] {1, 2, 3}), "a value over 1 MiB");
            assertSameAs(model, map, flavour);
        }
        try (AnyHeap heap = MapFixture.open(flavour, path);
                PersistentHashMap map = PersistentHashMap.open(heap, "blobs")) {
            assertEquals(MapNative.MAX_KEY, map.maxKeyLength(), "opened with the stored sizes");
            assertSameAs(model, map, flavour + " after reopen");
            assertThrows(IllegalArgumentException.class, () -> map.put(new byte[MAX_KEY + 1],
                    new byte[1]), "the stored max key is checked by the library");
        }
        try (AnyHeap heap = MapFixture.open(flavour, path);
                PersistentHashMap map = new PersistentHashMap(heap, "blobs", MAX_KEY, INLINE)) {
            assertEquals(model.size(), map.size(), "reopened with the same sizes");
        }
    }

    @Test
    void wrongArgumentsAndClosedUseThrow() {
        try (AnyHeap heap = MapFixture.create("transactional", files.newPath())) {
            PersistentHashMap map = new PersistentHashMap(heap, "args", 4, 8);
            assertThrows(IllegalArgumentException.class, () -> map.put(new byte[5], new byte[1]));
            assertThrows(IllegalArgumentException.class, () -> map.put(new byte[0], new byte[1]));
            assertThrows(IllegalArgumentException.class, () -> map.put(null, new byte[1]));
            assertThrows(IllegalArgumentException.class, () -> map.put(new byte[] {1}, null));
            assertThrows(IllegalArgumentException.class, () -> map.get(null));
            assertThrows(IllegalArgumentException.class, () -> map.get(new byte[5]));
            assertThrows(IllegalArgumentException.class, () -> map.remove(new byte[0]));
            assertThrows(IllegalArgumentException.class, () -> map.containsKey(null));
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentHashMap(heap, "inline", 4, 255));
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentHashMap(heap, "keys", 256));
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentHashMap(heap, "keys", 0));
            assertThrows(IllegalArgumentException.class, () -> new PersistentHashMap(heap, "", 4));
            assertThrows(IllegalArgumentException.class, () -> new PersistentHashMap(heap, null, 4));
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentHashMap(heap, "n".repeat(65), 4));
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentHashMap(heap, "a\0b", 4));
            try (PersistentHashMap longest = new PersistentHashMap(heap, "é".repeat(32), 4)) {
                assertEquals("é".repeat(32), longest.name(), "64 bytes of UTF-8");
            }
            HeapException twice = assertThrows(HeapException.class,
                    () -> new PersistentHashMap(heap, "args", 4, 8));
            assertEquals(16, twice.errno(), twice.getMessage());
            map.put(new byte[] {1}, new byte[0]);
            assertArrayEquals(new byte[0], map.get(new byte[] {1}), "an empty value");
            map.put(new byte[] {2}, new byte[100]);
            AutoCloseableIterator<Map.Entry<byte[], byte[]>> open = map.entries();
            assertTrue(open.hasNext());
            open.next();
            map.close();
            assertTrue(map.isClosed());
            map.close(); // twice: nothing
            assertThrows(IllegalStateException.class, () -> map.get(new byte[] {1}));
            assertThrows(IllegalStateException.class, () -> map.put(new byte[] {1}, new byte[1]));
            assertThrows(IllegalStateException.class, () -> map.remove(new byte[] {1}));
            assertThrows(IllegalStateException.class, map::size);
            assertThrows(IllegalStateException.class, map::entries);
            assertThrows(IllegalStateException.class, open::next,
                    "an iterator the map's close closed");
            open.close();
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentHashMap(heap, "args", 4, 9), "other inline size");
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentHashMap(heap, "args", 5, 8), "other max key");
            HeapException unbound = assertThrows(HeapException.class,
                    () -> PersistentHashMap.open(heap, "never"));
            assertEquals(2, unbound.errno(), unbound.getMessage());
            try (PersistentHashMap again = new PersistentHashMap(heap, "args", 4, 8)) {
                assertEquals(2, again.size());
            }
        }
    }

    @Test
    void aNameOfAnotherKindIsRefused() {
        try (AnyHeap heap = MapFixture.create("persistent", files.newPath())) {
            try (PersistentSortedMap sorted = new PersistentSortedMap(heap, "sorted", 8);
                    PersistentHashMap hashed = new PersistentHashMap(heap, "hashed", 8)) {
                sorted.put(new byte[] {1}, new byte[] {10});
                hashed.put(new byte[] {2}, new byte[] {20});
            }
            long block = heap.allocateMemory(16);
            new ObjectDirectory(heap).bind("block", block);
            for (String name : List.of("sorted", "block")) {
                HeapException e = assertThrows(HeapException.class,
                        () -> new PersistentHashMap(heap, name, 8), name);
                assertEquals(17, e.errno(), e.getMessage());
                assertEquals(17, assertThrows(HeapException.class,
                        () -> PersistentHashMap.open(heap, name)).errno(), name);
                assertEquals(17, assertThrows(HeapException.class,
                        () -> PersistentHashMap.destroy(heap, name)).errno(), name);
            }
            for (String name : List.of("hashed", "block")) {
                assertEquals(17, assertThrows(HeapException.class,
                        () -> new PersistentSortedMap(heap, name, 8)).errno(), name);
                assertEquals(17, assertThrows(HeapException.class,
                        () -> new ConcurrentLongIndex(heap, name, 8)).errno(), name);
                assertEquals(17, assertThrows(HeapException.class,
                        () -> PersistentSortedMap.destroy(heap, name)).errno(), name);
            }
            // the refused destroys left every map whole
            try (PersistentSortedMap sorted = PersistentSortedMap.open(heap, "sorted");
                    PersistentHashMap hashed = PersistentHashMap.open(heap, "hashed")) {
                assertArrayEquals(new byte[] {10}, sorted.get(new byte[] {1}));
                assertArrayEquals(new byte[] {20}, hashed.get(new byte[] {2}));
            }
            assertEquals(block, new ObjectDirectory(heap).lookup("block"));
        }
    }

    @Test
    void destroyUnbindsTheNameAndFreesTheEntries() {
        try (AnyHeap heap = MapFixture.create("raw", files.newPath())) {
            long before = heap.stats().allocatedBytes();
            PersistentHashMap map = new PersistentHashMap(heap, "gone", 16);
            for (int i = 0; i < 2000; i++) {
                map.put(("key" + i).getBytes(), new byte[i % 3 == 0 ? 200 : 8]);
            }
            HeapException open = assertThrows(HeapException.class,
                    () -> PersistentHashMap.destroy(heap, "gone"));
            assertEquals(16, open.errno(), "destroying an open map: " + open.getMessage());
            map.close();
            long full = heap.stats().allocatedBytes();
            PersistentHashMap.destroy(heap, "gone");
            long after = heap.stats().allocatedBytes();
            assertTrue(after < full && after <= before + (full - before) / 10,
                    "destroy frees the entries: " + before + " -> " + full + " -> " + after);
            assertEquals(2, assertThrows(HeapException.class,
                    () -> PersistentHashMap.open(heap, "gone")).errno());
            assertEquals(2, assertThrows(HeapException.class,
                    () -> PersistentHashMap.destroy(heap, "gone")).errno());
            try (PersistentHashMap reused = new PersistentHashMap(heap, "gone", 16)) {
                assertTrue(reused.isEmpty(), "the name is free for a new map");
                assertNull(reused.get("key1".getBytes()));
            }
            // the name may now hold another kind
            PersistentHashMap.destroy(heap, "gone");
            try (PersistentSortedMap sorted = new PersistentSortedMap(heap, "gone", 16)) {
                assertTrue(sorted.isEmpty());
            }
        }
    }

    @Test
    void theHeapsCloseClosesTheMapAndAnEarlyClosedIteratorFreesItsCursor() {
        AnyHeap heap = MapFixture.create("persistent", files.newPath());
        PersistentHashMap map = new PersistentHashMap(heap, "m", 8);
        for (int i = 0; i < 100; i++) {
            map.put(new byte[] {(byte) i}, new byte[] {(byte) i});
        }
        for (int round = 0; round < 3; round++) {
            try (AutoCloseableIterator<Map.Entry<byte[], byte[]>> it = map.entries()) {
                assertNotNull(it.next());
            }
        }
        AutoCloseableIterator<Map.Entry<byte[], byte[]>> left = map.entries();
        heap.close();
        assertTrue(map.isClosed(), "the heap closed its map");
        assertThrows(IllegalStateException.class, () -> map.get(new byte[] {1}));
        assertThrows(IllegalStateException.class, left::next);
        left.close();
        assertThrows(IllegalStateException.class, () -> new PersistentHashMap(heap, "m", 8));
        assertThrows(IllegalStateException.class, () -> PersistentHashMap.destroy(heap, "m"));
    }

    @Test
    void threadsPutAndReadTheirOwnKeys() throws Exception {
        int threads = 4;
        int perThread = 1500;
        try (AnyHeap heap = MapFixture.create("persistent", files.newPath());
                PersistentHashMap map = new PersistentHashMap(heap, "shared", 16)) {
            ExecutorService pool = Executors.newFixedThreadPool(threads);
            try {
                List<Future<?>> done = new ArrayList<>();
                for (int t = 0; t < threads; t++) {
                    int id = t;
                    done.add(pool.submit(() -> {
                        for (int i = 0; i < perThread; i++) {
                            byte[] key = ("t" + id + "k" + i).getBytes();
                            byte[] value = new byte[(i % 5) * 20];
                            Arrays.fill(value, (byte) (id * 31 + i));
                            map.put(key, value);
                            assertArrayEquals(value, map.get(key));
                        }
                        return null;
                    }));
                }
                for (Future<?> f : done) {
                    f.get();
                }
            } finally {
                pool.shutdown();
            }
            assertEquals(threads * perThread, map.size());
            int n = 0;
            try (AutoCloseableIterator<Map.Entry<byte[], byte[]>> it = map.entries()) {
                while (it.hasNext()) {
                    it.next();
                    n++;
                }
            }
            assertEquals(threads * perThread, n);
        }
    }
}

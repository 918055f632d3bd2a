package dev.terrace.collections;

import static dev.terrace.collections.MapFixture.hex;
import static dev.terrace.collections.MapFixture.randomKey;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.terrace.pool.AnyHeap;
import java.util.Arrays;
import java.util.Map;
import java.util.NavigableMap;
import java.util.Random;
import java.util.TreeMap;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * PersistentSortedMap against a TreeMap model: values inline and out of line, ranges in both
 * directions, reopening, wrong arguments and closed use.
 */
class PersistentSortedMapTest {
    private static final int MAX_KEY = 20;
    private final MapFixture files = new MapFixture();

    @BeforeAll
    static void supported() {
        MapFixture.assumeSupported();
    }

    @AfterEach
    void deleteFiles() {
        files.close();
    }

    private static byte[] randomValue(Random random) {
        // mostly within the 32 inline bytes, some well beyond (kept out of line)
        int len = switch (random.nextInt(8)) {
            case 0 -> 0;
            case 1 -> 33 + random.nextInt(300);
            case 2 -> 5000 + random.nextInt(3000);
            default -> random.nextInt(33);
        };
        byte[] v = new byte[len];
        random.nextBytes(v);
        return v;
    }

    @Test
    void valuesOfEveryLengthMatchATreeMapAndSurviveAReopen() {
        String path = files.newPath();
        Random random = new Random(11);
        NavigableMap<byte[], byte[]> model = new TreeMap<>(Arrays::compareUnsigned);
        try (AnyHeap heap = MapFixture.create("persistent", path);
                PersistentSortedMap map = new PersistentSortedMap(heap, "blobs", MAX_KEY)) {
            assertTrue(map.isEmpty());
            for (int i = 0; i < 3000; i++) {
                byte[] key = randomKey(random, MAX_KEY);
                byte[] value = randomValue(random);
                map.put(key, value);
                model.put(key, value);
            }
            for (byte[] key : model.keySet().toArray(new byte[0][])) {
                if (random.nextInt(5) == 0) {
                    assertTrue(map.remove(key));
                    assertFalse(map.remove(key));
                    model.remove(key);
                    assertNull(map.get(key));
                    assertFalse(map.containsKey(key));
                }
            }
            assertEquals(model.size(), map.size());
            for (Map.Entry<byte[], byte[]> e : model.entrySet()) {
                assertArrayEquals(e.getValue(), map.get(e.getKey()), hex(e.getKey()));
            }
            byte[] big = new byte[(1 << 20) + 10];
            random.nextBytes(big);
            map.put(new byte[] {1, 2, 3}, big);
            model.put(new byte[] {1, 2, 3}, big);
            assertArrayEquals(big, map.get(new byte[] {1, 2, 3}), "a value over 1 MiB");
            assertSameEntries(model, map.entries(), "ascending");
            assertSameEntries(model.descendingMap(), map.descendingEntries(), "descending");
            Object[] keys = model.keySet().toArray();
            for (int i = 0; i < 100; i++) {
                byte[] a = (byte[]) keys[random.nextInt(keys.length)];
                byte[] b = randomKey(random, MAX_KEY);
                byte[] lo = Arrays.compareUnsigned(a, b) <= 0 ? a : b;
                byte[] hi = lo == a ? b : a;
                if (Arrays.equals(lo, hi)) {
                    continue;
                }
                boolean loIn = random.nextBoolean();
                boolean hiIn = random.nextBoolean();
                assertSameEntries(model.subMap(lo, loIn, hi, hiIn),
                        map.entries(lo, loIn, hi, hiIn), "range");
                assertSameEntries(model.subMap(lo, loIn, hi, hiIn).descendingMap(),
                        map.descendingEntries(lo, loIn, hi, hiIn), "reverse range");
            }
            assertArrayEquals(model.firstKey(), map.firstKey());
            assertArrayEquals(model.lastKey(), map.lastKey());
        }
        try (AnyHeap heap = MapFixture.open("persistent", path);
                PersistentSortedMap map = PersistentSortedMap.open(heap, "blobs")) {
            assertEquals(model.size(), map.size());
            assertSameEntries(model, map.entries(), "after reopen");
        }
    }

    private static void assertSameEntries(Map<byte[], byte[]> expected,
            AutoCloseableIterator<Map.Entry<byte[], byte[]>> it, String what) {
        try (it) {
            int n = 0;
            for (Map.Entry<byte[], byte[]> e : expected.entrySet()) {
                assertTrue(it.hasNext(), what + ": ends after " + n + " of " + expected.size());
                Map.Entry<byte[], byte[]> got = it.next();
                assertArrayEquals(e.getKey(), got.getKey(), what + ": key " + n);
                assertArrayEquals(e.getValue(), got.getValue(), what + ": value " + n);
                n++;
            }
            assertFalse(it.hasNext(), what + ": more than " + expected.size());
        }
    }

    @Test
    void wrongArgumentsAndClosedUseThrow() {
        try (AnyHeap heap = MapFixture.create("transactional", files.newPath())) {
            PersistentSortedMap map = new PersistentSortedMap(heap, "args", 4, 8);
            assertThrows(IllegalArgumentException.class, () -> map.put(new byte[5], new byte[1]));
            assertThrows(IllegalArgumentException.class, () -> map.put(null, new byte[1]));
            assertThrows(IllegalArgumentException.class, () -> map.put(new byte[] {1}, null));
            assertThrows(IllegalArgumentException.class, () -> map.get(null));
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentSortedMap(heap, "inline", 4, 256));
            map.put(new byte[] {1}, new byte[0]);
            assertArrayEquals(new byte[0], map.get(new byte[] {1}), "an empty value");
            map.close();
            assertThrows(IllegalStateException.class, () -> map.get(new byte[] {1}));
            assertThrows(IllegalStateException.class, map::entries);
            assertThrows(IllegalArgumentException.class,
                    () -> new PersistentSortedMap(heap, "args", 4, 9), "other inline size");
            try (PersistentSortedMap again = new PersistentSortedMap(heap, "args", 4, 8)) {
                assertEquals(1, again.size());
            }
        }
    }
}

package dev.terrace.cache;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.terrace.TerraceException;
import dev.terrace.kinds.KindFixture;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.Arrays;
import java.util.OptionalLong;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** Every operation of TerraceCache on a DRAM + file cache, one fresh cache per test. */
class TerraceCacheTest {
    static final String TIERS = "dram:16MiB,file:32MiB";

    private Path dir;
    private TerraceCache cache;

    static byte[] bytes(String s) {
        return s.getBytes(UTF_8);
    }

    @BeforeEach
    void open() {
        dir = KindFixture.tempDir();
        cache = TerraceCache.open(TIERS, dir, 0);
    }

    @AfterEach
    void close() {
        cache.close();
        KindFixture.deleteTree(dir);
    }

    @Test
    void setGetDelete() {
        long cas = cache.set(bytes("k"), bytes("value"), 0, 42);
        assertNotEquals(0, cas);
        assertArrayEquals(bytes("value"), cache.get(bytes("k")));
        CacheItem item = cache.getItem(bytes("k"));
        assertEquals(42, item.flags());
        assertEquals(cas, item.cas());
        assertTrue(cache.delete(bytes("k")));
        assertNull(cache.get(bytes("k")));
        assertFalse(cache.delete(bytes("k")));
        cache.set(bytes("empty"), new byte[0], 0);
        assertArrayEquals(new byte[0], cache.get(bytes("empty")));
    }

    @Test
    void addOnlyWhenAbsentReplaceOnlyWhenPresent() {
        assertFalse(cache.replace(bytes("k"), bytes("1"), 0));
        assertNull(cache.get(bytes("k")));
        assertTrue(cache.add(bytes("k"), bytes("2"), 0));
        assertFalse(cache.add(bytes("k"), bytes("3"), 0));
        assertArrayEquals(bytes("2"), cache.get(bytes("k")));
        assertTrue(cache.replace(bytes("k"), bytes("4"), 0, 7));
        assertEquals(7, cache.getItem(bytes("k")).flags());
        assertArrayEquals(bytes("4"), cache.get(bytes("k")));
    }

    @Test
    void casStoresOnlyOverTheCasItWasGiven() {
        assertEquals(CasOutcome.NOT_FOUND, cache.cas(bytes("k"), bytes("x"), 0, 0, 1));
        long first = cache.set(bytes("k"), bytes("a"), 0);
        long second = cache.set(bytes("k"), bytes("b"), 0);
        assertEquals(CasOutcome.EXISTS, cache.cas(bytes("k"), bytes("c"), 0, 0, first));
        assertEquals(CasOutcome.STORED, cache.cas(bytes("k"), bytes("d"), 0, 0, second));
        assertArrayEquals(bytes("d"), cache.get(bytes("k")));
    }

    @Test
    void touchKeepsTheCas() {
        assertFalse(cache.touch(bytes("k"), 100));
        long cas = cache.set(bytes("k"), bytes("v"), 0);
        assertTrue(cache.touch(bytes("k"), 100));
        assertEquals(cas, cache.getItem(bytes("k")).cas());
    }

    @Test
    void incrAndDecrWorkOnDecimalValues() {
        assertEquals(OptionalLong.empty(), cache.incr(bytes("n"), 1));
        cache.set(bytes("n"), bytes("10"), 0);
        assertEquals(OptionalLong.of(15), cache.incr(bytes("n"), 5));
        assertArrayEquals(bytes("15"), cache.get(bytes("n")));
        assertEquals(OptionalLong.of(0), cache.decr(bytes("n"), 20), "decr stops at 0");
        cache.set(bytes("max"), bytes("18446744073709551615"), 0);
        assertEquals(OptionalLong.of(0), cache.incr(bytes("max"), 1), "incr wraps at 2^64");
        cache.set(bytes("text"), bytes("abc"), 0);
        TerraceException e = assertThrows(TerraceException.class,
                () -> cache.incr(bytes("text"), 1));
        assertEquals(22, e.errno());
    }

    @Test
    void largeValuesGrowThePerThreadBuffer() {
        byte[] big = new byte[1 << 20];
        Arrays.fill(big, (byte) 0x5E);
        big[big.length - 1] = 1;
        cache.set(bytes("big"), big, 0);
        assertArrayEquals(big, cache.get(bytes("big")));
        cache.set(bytes("small"), bytes("s"), 0);
        assertArrayEquals(bytes("s"), cache.get(bytes("small")));
        TerraceException e = assertThrows(TerraceException.class,
                () -> cache.set(bytes("huge"), new byte[(1 << 20) + 1], 0));
        assertEquals(7, e.errno(), "E2BIG: " + e.getMessage());
    }

    /**
     * Array stores go through one reused per-thread native buffer (key then value): keys and
     * values of changing lengths, growth past its first 4 KiB by add, replace and cas, and a
     * call past the library's limits (passed as heap memory) all store exactly their bytes.
     */
    @Test
    void arrayStoresThroughTheReusedBufferKeepEachKeyAndValueApart() {
        byte[] longKey = new byte[250];
        Arrays.fill(longKey, (byte) 'K');
        byte[] value = new byte[10_000];
        Arrays.fill(value, (byte) 3);
        assertTrue(cache.add(longKey, value, 0));
        cache.set(bytes("a"), bytes("xy"), 0);
        assertArrayEquals(value, cache.get(longKey));
        assertArrayEquals(bytes("xy"), cache.get(bytes("a")));
        byte[] other = new byte[20_000];
        Arrays.fill(other, (byte) 9);
        assertTrue(cache.replace(bytes("a"), other, 0, 5));
        CacheItem item = cache.getItem(bytes("a"));
        assertArrayEquals(other, item.value());
        assertEquals(5, item.flags());
        assertEquals(CasOutcome.STORED, cache.cas(longKey, bytes("z"), 0, 1,
                cache.getItem(longKey).cas()));
        assertArrayEquals(bytes("z"), cache.get(longKey));
        assertArrayEquals(other, cache.get(bytes("a")));
        byte[] tooLongKey = new byte[251];
        TerraceException e = assertThrows(TerraceException.class,
                () -> cache.set(tooLongKey, new byte[1 << 20], 0));
        assertEquals(22, e.errno(), e.getMessage());
        assertThrows(TerraceException.class,
                () -> cache.cas(tooLongKey, new byte[1 << 20], 0, 0, 1));
    }

    @Test
    void badKeysAreEinvalWithTheLibrarysMessage() {
        TerraceException empty = assertThrows(TerraceException.class,
                () -> cache.set(new byte[0], bytes("v"), 0));
        assertEquals(22, empty.errno());
        assertTrue(empty.getMessage().contains("terrace_cache_set"), empty.getMessage());
        assertThrows(TerraceException.class, () -> cache.get(new byte[251]));
        assertThrows(IllegalArgumentException.class, () -> cache.set(bytes("k"), bytes("v"), -1));
    }

    @Test
    void getIntoASegmentCopiesOnlyWhenItFits() {
        byte[] value = bytes("0123456789");
        cache.set(bytes("k"), value, 0);
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment key = arena.allocateFrom(ValueLayout.JAVA_BYTE, bytes("k"));
            MemorySegment into = arena.allocate(64);
            assertEquals(10, cache.get(key, into));
            assertArrayEquals(value, into.asSlice(0, 10).toArray(ValueLayout.JAVA_BYTE));
            MemorySegment small = arena.allocate(4);
            assertEquals(10, cache.get(key, small), "the length to retry with");
            assertArrayEquals(new byte[4], small.toArray(ValueLayout.JAVA_BYTE));
            MemorySegment missing = arena.allocateFrom(ValueLayout.JAVA_BYTE, bytes("nope"));
            assertEquals(-1, cache.get(missing, into));
            byte[] heap = new byte[10];
            assertEquals(10, cache.get(MemorySegment.ofArray(bytes("k")),
                    MemorySegment.ofArray(heap)));
            assertArrayEquals(value, heap);
        }
    }

    @Test
    void pinReadsInPlaceAndIsInvalidAfterClose() {
        long cas = cache.set(bytes("k"), bytes("pinned"), 0, 3);
        MemorySegment view;
        try (PinnedValue pin = cache.pin(bytes("k"))) {
            view = pin.value();
            assertArrayEquals(bytes("pinned"), pin.toByteArray());
            assertEquals(3, pin.flags());
            assertEquals(cas, pin.cas());
            assertTrue(view.isReadOnly());
            assertThrows(IndexOutOfBoundsException.class, () -> view.get(ValueLayout.JAVA_BYTE, 6));
            cache.set(bytes("k"), bytes("changed"), 0);
            assertArrayEquals(bytes("pinned"), view.toArray(ValueLayout.JAVA_BYTE),
                    "a pinned value does not change under an overwrite");
        }
        assertThrows(IllegalStateException.class, () -> view.get(ValueLayout.JAVA_BYTE, 0));
        assertNull(cache.pin(bytes("absent")));
    }

    @Test
    void pinThenCloseCacheIsRefusedClearly() {
        cache.set(bytes("k"), bytes("v"), 0);
        PinnedValue pin = cache.pin(bytes("k"));
        IllegalStateException e = assertThrows(IllegalStateException.class, cache::close);
        assertTrue(e.getMessage().contains("1 pinned value(s)"), e.getMessage());
        assertFalse(cache.isClosed());
        assertArrayEquals(bytes("v"), pin.toByteArray(), "the refused close freed nothing");
        assertArrayEquals(bytes("v"), cache.get(bytes("k")));
        pin.close();
        pin.close();
        cache.close();
        assertTrue(cache.isClosed());
        assertThrows(IllegalStateException.class, () -> pin.value().get(ValueLayout.JAVA_BYTE, 0));
        IllegalStateException closed = assertThrows(IllegalStateException.class,
                () -> cache.get(bytes("k")));
        assertTrue(closed.getMessage().contains("closed"), closed.getMessage());
        assertThrows(IllegalStateException.class, () -> cache.set(bytes("k"), bytes("v"), 0));
        cache.close();
    }

    @Test
    void flushAllRemovesEverything() {
        for (int i = 0; i < 100; i++) {
            cache.set(bytes("k" + i), bytes("v" + i), 0);
        }
        cache.flushAll();
        for (int i = 0; i < 100; i++) {
            assertNull(cache.get(bytes("k" + i)));
        }
    }

    @Test
    void statsCountHitsMissesAndTiers() {
        cache.set(bytes("k"), bytes("v"), 0);
        cache.get(bytes("k"));
        cache.get(bytes("absent"));
        CacheStats stats = cache.stats();
        assertEquals(1, stats.items());
        assertEquals(1, stats.hits());
        assertEquals(1, stats.misses());
        assertEquals(1, stats.sets());
        assertEquals(2, stats.tierCount());
        assertEquals(2, stats.tiers().size());
        assertTrue(stats.tiers().get(0).segments() >= 8, stats.toString());
    }

    @Test
    void anItemExpiresAfterItsTtl() throws InterruptedException {
        // The cache's clock counts whole seconds: start just after a tick so a 1 s TTL is
        // still live when read back, then poll for at most 2 s.
        Thread.sleep(1000 - System.currentTimeMillis() % 1000 + 20);
        cache.set(bytes("short"), bytes("v"), 1);
        cache.set(bytes("long"), bytes("v"), 100);
        assertArrayEquals(bytes("v"), cache.get(bytes("short")));
        long deadline = System.nanoTime() + 2_000_000_000L;
        while (cache.get(bytes("short")) != null && System.nanoTime() < deadline) {
            Thread.sleep(50);
        }
        assertNull(cache.get(bytes("short")), "a 1 s TTL still served after 2 s");
        assertArrayEquals(bytes("v"), cache.get(bytes("long")));
    }

    @Test
    void aBadTierSpecIsRefused() {
        TerraceException e = assertThrows(TerraceException.class,
                () -> TerraceCache.open("dram:1KiB", null, 0));
        assertEquals(22, e.errno());
        assertTrue(e.getMessage().contains("terrace_cache_open"), e.getMessage());
    }
}

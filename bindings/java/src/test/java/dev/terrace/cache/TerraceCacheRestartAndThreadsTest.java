package dev.terrace.cache;

import static java.nio.charset.StandardCharsets.UTF_8;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.terrace.kinds.KindFixture;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.Test;

/** A warm restart brings the items back; two threads share one cache. */
class TerraceCacheRestartAndThreadsTest {
    static byte[] valueOf(int i) {
        byte[] value = new byte[100 + i % 900];
        Arrays.fill(value, (byte) i);
        byte[] tag = Integer.toString(i).getBytes(UTF_8);
        System.arraycopy(tag, 0, value, 0, tag.length);
        return value;
    }

    static byte[] key(int i) {
        return ("key-" + i).getBytes(UTF_8);
    }

    @Test
    void closeAndReopenTheSameDirectoryBringsTheItemsBack() {
        Path dir = KindFixture.tempDir();
        try {
            try (TerraceCache cache = TerraceCache.open(TerraceCacheTest.TIERS, dir, 0)) {
                for (int i = 0; i < 2000; i++) {
                    cache.set(key(i), valueOf(i), 0, i);
                }
                cache.delete(key(7));
            }
            try (TerraceCache cache = TerraceCache.open(TerraceCacheTest.TIERS, dir, 0)) {
                for (int i = 0; i < 2000; i++) {
                    if (i == 7) {
                        assertEquals(null, cache.get(key(i)), "a deleted item came back");
                        continue;
                    }
                    CacheItem item = cache.getItem(key(i));
                    assertTrue(item != null, "item " + i + " lost in the restart");
                    assertArrayEquals(valueOf(i), item.value());
                    assertEquals(i, item.flags());
                }
                assertEquals(1999, cache.stats().items());
            }
        } finally {
            KindFixture.deleteTree(dir);
        }
    }

    @Test
    void twoThreadsGetAndSetConcurrently() throws InterruptedException {
        Path dir = KindFixture.tempDir();
        try (TerraceCache cache = TerraceCache.open(TerraceCacheTest.TIERS, dir, 0)) {
            AtomicReference<Throwable> failure = new AtomicReference<>();
            CountDownLatch start = new CountDownLatch(1);
            List<Thread> threads = new ArrayList<>();
            for (int t = 0; t < 2; t++) {
                Thread thread = new Thread(() -> {
                    try {
                        start.await();
                        ThreadLocalRandom random = ThreadLocalRandom.current();
                        for (int n = 0; n < 50_000; n++) {
                            int i = random.nextInt(5_000);
                            if (random.nextInt(10) == 0) {
                                cache.set(key(i), valueOf(i), 0);
                            } else {
                                byte[] got = cache.get(key(i));
                                if (got != null && !Arrays.equals(valueOf(i), got)) {
                                    throw new AssertionError("key " + i + " read a wrong value");
                                }
                            }
                        }
                    } catch (Throwable e) {
                        failure.compareAndSet(null, e);
                    }
                });
                thread.start();
                threads.add(thread);
            }
            start.countDown();
            for (Thread thread : threads) {
                thread.join();
            }
            if (failure.get() != null) {
                throw new AssertionError("a thread failed", failure.get());
            }
            CacheStats stats = cache.stats();
            assertTrue(stats.hits() > 0 && stats.sets() > 0, stats.toString());
        } finally {
            KindFixture.deleteTree(dir);
        }
    }
}

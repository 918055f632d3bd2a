package dev.terrace.bench;

import dev.terrace.cache.TerraceCache;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;

/**
 * Terrace's cache through dev.terrace.cache.TerraceCache, one DRAM tier of the capacity the
 * other engines get. Keys are the long's 8 bytes in a per-thread native segment; a get copies
 * the value into a per-thread native buffer (TerraceCache.get(MemorySegment, MemorySegment)),
 * so no value byte reaches the Java heap; a set passes the caller's byte[] as a heap segment.
 */
final class TerraceCacheEngine implements CacheEngine {
    private static final class Scratch {
        final MemorySegment key;
        final MemorySegment value;

        Scratch(Arena arena) {
            key = arena.allocate(8, 8);
            value = arena.allocate(4096, 8);
        }
    }

    private final TerraceCache cache;
    private final ThreadLocal<Scratch> scratch = ThreadLocal.withInitial(
            () -> new Scratch(Arena.ofAuto()));

    private TerraceCacheEngine(long capacityBytes) {
        cache = TerraceCache.open("dram:" + (capacityBytes >> 20) + "MiB");
    }

    static CacheEngine create(long capacityBytes, int keys, int valueSize) {
        return new TerraceCacheEngine(capacityBytes);
    }

    @Override
    public void put(long key, byte[] value) {
        Scratch s = scratch.get();
        s.key.set(ValueLayout.JAVA_LONG, 0, key);
        cache.set(s.key, MemorySegment.ofArray(value), 0, 0);
    }

    @Override
    public int get(long key) {
        Scratch s = scratch.get();
        s.key.set(ValueLayout.JAVA_LONG, 0, key);
        long n = cache.get(s.key, s.value);
        return n < 0 ? -1 : (int) n + (s.value.get(ValueLayout.JAVA_BYTE, 0) & 0xff);
    }

    @Override
    public void close() {
        cache.close();
    }
}

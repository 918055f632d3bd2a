package dev.terrace.bench;

/** Terrace's cache through dev.terrace.cache.TerraceCache (not in the binding yet). */
final class TerraceCacheEngine {
    private TerraceCacheEngine() {}

    static CacheEngine create(long capacityBytes, int keys, int valueSize) {
        throw new UnsupportedOperationException(
                "dev.terrace.cache.TerraceCache is not in dev.terrace:terrace:0.1.0 yet");
    }
}

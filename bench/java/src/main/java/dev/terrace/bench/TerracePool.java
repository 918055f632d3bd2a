package dev.terrace.bench;

/**
 * Terrace's side of suite B, over dev.terrace.pool: one class so PoolBench and OneShot read
 * the same for both libraries. (Filled in against the binding's pool API as it lands.)
 */
final class TerracePool implements AutoCloseable {
    private TerracePool() {}

    static TerracePool transactional(String path, long size) {
        throw missing();
    }

    static TerracePool persistent(String path, long size) {
        throw missing();
    }

    static TerracePool raw(String path, long size) {
        throw missing();
    }

    /** One transaction: allocate a block of data.length bytes and copy data into it. */
    long txAllocWrite(byte[] data) {
        throw missing();
    }

    long allocate(long size) {
        throw missing();
    }

    long allocateWithLong(long size, long value) {
        throw missing();
    }

    void durableSetLong(long block, long off, long value) {
        throw missing();
    }

    void setLongFlush(long block, long off, long value) {
        throw missing();
    }

    long readLong(long handle) {
        throw missing();
    }

    /** Allocates objects of size bytes until one fails; returns how many were allocated. */
    long fillToFailure(long size) {
        throw missing();
    }

    void free(long handle) {
        throw missing();
    }

    @Override
    public void close() {}

    static UnsupportedOperationException missing() {
        return new UnsupportedOperationException(
                "dev.terrace.pool is not in dev.terrace:terrace:0.1.0 yet");
    }
}

package dev.terrace.pool;

/**
 * A snapshot of a heap's space accounting ({@code struct terrace_pool_stats}).
 *
 * @param poolSize bytes of the pool file
 * @param heapBytes bytes of heap pages
 * @param freeBytes bytes in free pages
 * @param allocatedBytes bytes handed out to objects (block headers and the root included)
 * @param runSlackBytes bytes of runs not holding objects
 * @param runs runs (pages of small objects)
 * @param extents extents (large objects)
 */
public record PoolStats(long poolSize, long heapBytes, long freeBytes, long allocatedBytes,
        long runSlackBytes, long runs, long extents) {}

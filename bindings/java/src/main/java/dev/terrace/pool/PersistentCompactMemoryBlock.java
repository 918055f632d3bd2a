package dev.terrace.pool;

/**
 * A compact (headerless) block of a {@link PersistentHeap}: every store is persisted before it
 * returns; {@link #size()} is the usable size.
 */
public final class PersistentCompactMemoryBlock extends AnyMemoryBlock {
    PersistentCompactMemoryBlock(PersistentHeap heap, long handle, long size) {
        super(heap, handle, size, true);
    }

    PersistentCompactMemoryBlock(PersistentHeap heap, long handle) {
        super(heap, handle, true);
    }

    @Override
    public PersistentHeap heap() {
        return (PersistentHeap) heap;
    }

    /**
     * Frees the block, transactionally (in the thread's transaction or an implicit one) or
     * atomically; this view becomes invalid.
     */
    public void free(boolean transactional) {
        freeBlock(transactional);
    }

    /** Frees the block atomically ({@code free(false)}). */
    public void freeMemory() {
        freeBlock(false);
    }
}

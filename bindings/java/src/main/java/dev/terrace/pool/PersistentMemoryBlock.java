package dev.terrace.pool;

/**
 * A regular block of a {@link PersistentHeap}: every store is persisted before it returns (not
 * atomic across stores: use a {@link Transaction} with a transactional heap for that).
 */
public final class PersistentMemoryBlock extends AnyMemoryBlock {
    PersistentMemoryBlock(PersistentHeap heap, long handle, long size) {
        super(heap, handle, size, false);
    }

    PersistentMemoryBlock(PersistentHeap heap, long handle) {
        super(heap, handle, false);
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

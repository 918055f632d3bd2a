package dev.terrace.pool;

/**
 * An accessor of a {@link PersistentHeap}'s regular blocks (stores as {@link
 * PersistentMemoryBlock}).
 */
public final class PersistentAccessor extends AnyAccessor {
    PersistentAccessor(PersistentHeap heap) {
        super(heap);
    }

    @Override
    public PersistentHeap heap() {
        return (PersistentHeap) heap;
    }

    /** Frees the current block (transactionally or atomically); the accessor is reset. */
    public void freeMemory(boolean transactional) {
        freeBlock(transactional);
    }

    /** Frees the current block atomically; the accessor is reset. */
    public void freeMemory() {
        freeBlock(false);
    }
}

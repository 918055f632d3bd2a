package dev.terrace.pool;

/**
 * A regular block of a {@link TransactionalHeap}: every store is undo-logged in the thread's
 * transaction, or runs in an implicit transaction of its own, so after a crash it is wholly
 * done or not at all.
 */
public final class TransactionalMemoryBlock extends AnyMemoryBlock {
    TransactionalMemoryBlock(TransactionalHeap heap, long handle, long size) {
        super(heap, handle, size, false);
    }

    TransactionalMemoryBlock(TransactionalHeap heap, long handle) {
        super(heap, handle, false);
    }

    @Override
    public TransactionalHeap heap() {
        return (TransactionalHeap) heap;
    }

    /**
     * Frees the block in the thread's transaction (or an implicit one); this view becomes
     * invalid.
     */
    public void free() {
        freeBlock(true);
    }

    /** Same as {@link #free()}. */
    public void freeMemory() {
        freeBlock(true);
    }
}

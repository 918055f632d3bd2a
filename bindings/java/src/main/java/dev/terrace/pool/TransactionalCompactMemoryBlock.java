package dev.terrace.pool;

/**
 * A compact (headerless) block of a {@link TransactionalHeap}: stores as {@link
 * TransactionalMemoryBlock}; {@link #size()} is the usable size.
 */
public final class TransactionalCompactMemoryBlock extends AnyMemoryBlock {
    TransactionalCompactMemoryBlock(TransactionalHeap heap, long handle, long size) {
        super(heap, handle, size, true);
    }

    TransactionalCompactMemoryBlock(TransactionalHeap heap, long handle) {
        super(heap, handle, true);
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

package dev.terrace.pool;

/**
 * An accessor of a {@link TransactionalHeap}'s regular blocks (stores as {@link
 * TransactionalMemoryBlock}).
 */
public final class TransactionalAccessor extends AnyAccessor {
    TransactionalAccessor(TransactionalHeap heap) {
        super(heap);
    }

    @Override
    public TransactionalHeap heap() {
        return (TransactionalHeap) heap;
    }

    /**
     * Frees the current block in the thread's transaction (or an implicit one); the accessor is
     * reset.
     */
    public void freeMemory() {
        freeBlock(true);
    }
}

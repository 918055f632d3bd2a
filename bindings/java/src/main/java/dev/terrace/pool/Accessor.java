package dev.terrace.pool;

/**
 * An accessor of a raw {@link Heap}'s regular blocks (stores as {@link MemoryBlock}).
 */
public final class Accessor extends AnyAccessor {
    Accessor(Heap heap) {
        super(heap);
    }

    @Override
    public Heap heap() {
        return (Heap) heap;
    }

    /** Makes [offset, offset+length) of the current block durable. */
    public void flush(long offset, long length) {
        flushRange(offset, length);
    }

    /** Makes the whole current block durable. */
    public void flush() {
        flushRange(0, size());
    }

    /**
     * Snapshots [offset, offset+length) of the current block into the thread's transaction.
     *
     * @throws TransactionException if no transaction of this thread is on the heap
     */
    public void addToTransaction(long offset, long length) {
        addRangeToTransaction(offset, length);
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

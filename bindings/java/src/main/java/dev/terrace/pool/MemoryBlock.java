package dev.terrace.pool;

/**
 * A regular block of a raw {@link Heap}: stores are plain until {@link #flush} (or logged by
 * {@link #addToTransaction} inside a transaction); it keeps its exact size.
 */
public final class MemoryBlock extends AnyMemoryBlock {
    MemoryBlock(Heap heap, long handle, long size) {
        super(heap, handle, size, false);
    }

    MemoryBlock(Heap heap, long handle) {
        super(heap, handle, false);
    }

    @Override
    public Heap heap() {
        return (Heap) heap;
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

    /** Makes [offset, offset+length) durable (stores on a raw heap are plain). */
    public void flush(long offset, long length) {
        flushRange(offset, length);
    }

    /**
     * Snapshots [offset, offset+length) into the thread's transaction on this heap, so an
     * abort restores it.
     *
     * @throws TransactionException if no transaction of this thread is on the heap
     */
    public void addToTransaction(long offset, long length) {
        addRangeToTransaction(offset, length);
    }

    /** Makes the whole block durable. */
    public void flush() {
        flushRange(0, size());
    }

    /** Snapshots the whole block into the thread's transaction on this heap. */
    public void addToTransaction() {
        addRangeToTransaction(0, size());
    }
}

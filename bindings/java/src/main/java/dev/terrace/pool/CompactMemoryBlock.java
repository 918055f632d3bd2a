package dev.terrace.pool;

/**
 * A compact (headerless) block of a raw {@link Heap}: as {@link MemoryBlock} without the 8-byte
 * size, so {@link #size()} is the usable size.
 */
public final class CompactMemoryBlock extends AnyMemoryBlock {
    CompactMemoryBlock(Heap heap, long handle, long size) {
        super(heap, handle, size, true);
    }

    CompactMemoryBlock(Heap heap, long handle) {
        super(heap, handle, true);
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
}

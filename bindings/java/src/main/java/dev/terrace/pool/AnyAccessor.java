package dev.terrace.pool;

/**
 * A reusable view of regular blocks, re-pointed with {@link #handle(long)}: reading many
 * blocks by handle allocates no Java object per block. The three LLPL accessor classes share
 * it. Until pointed (and after {@link #resetHandle()} or a free through it) every access
 * throws {@link IllegalStateException}.
 */
public abstract sealed class AnyAccessor extends MemoryAccessor
        permits Accessor, PersistentAccessor, TransactionalAccessor {
    AnyAccessor(AnyHeap heap) {
        super(heap, false);
    }

    /**
     * Points the accessor at the live regular block handle.
     *
     * @throws IllegalArgumentException if handle is not a live regular block of the heap
     */
    public void handle(long handle) {
        point(handle);
    }

    /** Points the accessor at nothing. */
    public void resetHandle() {
        invalidate();
    }
}

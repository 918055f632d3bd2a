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
     * Points the accessor at the live regular block handle, checked as
     * {@code memoryBlockFromHandle} checks it (in Java by default; see {@link AnyHeap}).
     *
     * @throws IllegalArgumentException if handle is outside the pool, misaligned, or its size
     *     header does not fit in the pool; with validation, if it is not a live regular block
     *     of the heap
     */
    public void handle(long handle) {
        point(handle);
    }

    /** Points the accessor at nothing. */
    public void resetHandle() {
        invalidate();
    }
}

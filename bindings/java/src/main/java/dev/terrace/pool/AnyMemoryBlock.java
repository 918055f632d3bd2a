package dev.terrace.pool;

/**
 * One block of a heap, fixed to its handle for life: the common type of the six LLPL block
 * classes (regular and compact, for each heap flavour). Equal when heap and handle are.
 */
public abstract sealed class AnyMemoryBlock extends MemoryAccessor
        permits MemoryBlock, CompactMemoryBlock, PersistentMemoryBlock,
        PersistentCompactMemoryBlock, TransactionalMemoryBlock, TransactionalCompactMemoryBlock {
    private final long fixedHandle;

    /** A view of a block just allocated with size payload bytes. */
    AnyMemoryBlock(AnyHeap heap, long handle, long size, boolean compact) {
        super(heap, compact);
        this.fixedHandle = handle;
        pointAtNew(handle, size);
    }

    /** A view of an existing block, validated. */
    AnyMemoryBlock(AnyHeap heap, long handle, boolean compact) {
        super(heap, compact);
        this.fixedHandle = handle;
        point(handle);
    }

    /** Copies length bytes of src at srcOffset into this block at dstOffset. */
    public void copyFromMemoryBlock(AnyMemoryBlock src, long srcOffset, long dstOffset,
            long length) {
        copyFrom(src, srcOffset, dstOffset, length);
    }

    @Override
    public boolean equals(Object other) {
        return other instanceof AnyMemoryBlock block && block.heap == heap
                && block.fixedHandle == fixedHandle;
    }

    @Override
    public int hashCode() {
        return Long.hashCode(fixedHandle) * 31 + System.identityHashCode(heap);
    }
}

package dev.terrace.pool;

import java.lang.foreign.MemorySegment;

/**
 * LLPL's raw heap: stores into its blocks are plain CPU stores, made durable only by
 * {@code flush} (or logged by {@code addToTransaction} inside a {@link Transaction}). The
 * root long and new blocks' size headers are persisted. Allocation and free are atomic by
 * default (after a crash a block is allocated or not; a block allocated but not yet reachable
 * from the root leaks, as in LLPL), or transactional when asked.
 */
public final class Heap extends AtomicHeap<MemoryBlock, CompactMemoryBlock, Accessor> {
    static final String LAYOUT = "terrace-llpl-heap";

    private Heap(String path, MemorySegment pool) {
        super(path, pool);
    }

    /**
     * Creates a heap file of at least size bytes (rounded up to 2 MiB).
     *
     * @throws HeapException if the file exists or cannot be created
     */
    public static Heap createHeap(String path, long size) {
        return new Heap(path, openPool(path, size, LAYOUT, true));
    }

    /**
     * Opens a heap file created by {@link #createHeap}, recovering it if needed.
     *
     * @throws HeapException if it is missing or is not a raw heap
     */
    public static Heap openHeap(String path) {
        return new Heap(path, openPool(path, 0, LAYOUT, false));
    }

    /** LLPL 1.0's name: opens the heap at path if it exists, else creates it. */
    public static Heap getHeap(String path, long size) {
        return exists(path) ? openHeap(path) : createHeap(path, size);
    }

    /** LLPL 1.0's name for {@link #openHeap}. */
    public static Heap getHeap(String path) {
        return openHeap(path);
    }

    @Override
    void afterWrite(long off, long len, boolean implicit) {}

    @Override
    MemoryBlock regularBlock(long handle, long size) {
        return new MemoryBlock(this, handle, size);
    }

    @Override
    CompactMemoryBlock compactBlock(long handle, long size) {
        return new CompactMemoryBlock(this, handle, size);
    }

    @Override
    MemoryBlock regularView(long handle) {
        return new MemoryBlock(this, handle);
    }

    @Override
    CompactMemoryBlock compactView(long handle) {
        return new CompactMemoryBlock(this, handle);
    }

    @Override
    Accessor accessor() {
        return new Accessor(this);
    }
}

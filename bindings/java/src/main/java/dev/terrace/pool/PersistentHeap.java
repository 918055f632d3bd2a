package dev.terrace.pool;

import java.lang.foreign.MemorySegment;

/**
 * LLPL's persistent heap: every store into its blocks is persisted
 * ({@code terrace_pool_persist}) before it returns, so a completed store survives a crash; a
 * multi-store update is not atomic (a {@link TransactionalHeap} is). {@code withRange} stores
 * plainly and persists the window once. Allocation and free are atomic by default (a block
 * allocated but not yet reachable from the root leaks after a crash, as in LLPL), or
 * transactional when asked.
 */
public final class PersistentHeap extends AtomicHeap<
        PersistentMemoryBlock, PersistentCompactMemoryBlock, PersistentAccessor> {
    static final String LAYOUT = "terrace-llpl-persistent-heap";

    private PersistentHeap(String path, MemorySegment pool) {
        super(path, pool);
    }

    /**
     * Creates a heap file of at least size bytes (rounded up to 2 MiB).
     *
     * @throws HeapException if the file exists or cannot be created
     */
    public static PersistentHeap createHeap(String path, long size) {
        return new PersistentHeap(path, openPool(path, size, LAYOUT, true));
    }

    /**
     * Opens a heap file created by {@link #createHeap}, recovering it if needed.
     *
     * @throws HeapException if it is missing or is not a persistent heap
     */
    public static PersistentHeap openHeap(String path) {
        return new PersistentHeap(path, openPool(path, 0, LAYOUT, false));
    }

    /** LLPL 1.0's name: opens the heap at path if it exists, else creates it. */
    public static PersistentHeap getHeap(String path, long size) {
        return exists(path) ? openHeap(path) : createHeap(path, size);
    }

    /** LLPL 1.0's name for {@link #openHeap}. */
    public static PersistentHeap getHeap(String path) {
        return openHeap(path);
    }

    @Override
    void afterWrite(long off, long len, boolean implicit) {
        persist(off, len);
    }

    @Override
    PersistentMemoryBlock regularBlock(long handle, long size) {
        return new PersistentMemoryBlock(this, handle, size);
    }

    @Override
    PersistentCompactMemoryBlock compactBlock(long handle, long size) {
        return new PersistentCompactMemoryBlock(this, handle, size);
    }

    @Override
    PersistentMemoryBlock regularView(long handle) {
        return new PersistentMemoryBlock(this, handle);
    }

    @Override
    PersistentCompactMemoryBlock compactView(long handle) {
        return new PersistentCompactMemoryBlock(this, handle);
    }

    @Override
    PersistentAccessor accessor() {
        return new PersistentAccessor(this);
    }
}

package dev.terrace.pool;

import java.lang.foreign.MemorySegment;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * LLPL's persistent heap: every store into its blocks is persisted
 * ({@code terrace_pool_persist}) before it returns, so a completed store survives a crash; a
 * multi-store update is not atomic (a {@link TransactionalHeap} is). {@code withRange} stores
 * plainly and persists the window once. Allocation and free are atomic by default (a block
 * allocated but not yet reachable from the root leaks after a crash, as in LLPL), or
 * transactional when asked.
 */
public final class PersistentHeap extends AnyHeap {
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
    boolean beforeWrite(long off, long len) {
        return false;
    }

    @Override
    void afterWrite(long off, long len, boolean implicit) {
        persist(off, len);
    }

    private PersistentMemoryBlock allocateRegular(long size, boolean transactional,
            Consumer<Range> initializer) {
        return transactional
                ? allocateInTransaction(size, false,
                        h -> new PersistentMemoryBlock(this, h, size), initializer)
                : allocateAtomically(size, false,
                        h -> new PersistentMemoryBlock(this, h, size), initializer);
    }

    private PersistentCompactMemoryBlock allocateCompact(long size, boolean transactional,
            Consumer<Range> initializer) {
        return transactional
                ? allocateInTransaction(size, true,
                        h -> new PersistentCompactMemoryBlock(this, h, size), initializer)
                : allocateAtomically(size, true,
                        h -> new PersistentCompactMemoryBlock(this, h, size), initializer);
    }

    public PersistentMemoryBlock allocateMemoryBlock(long size) {
        return allocateRegular(size, false, null);
    }

    public PersistentMemoryBlock allocateMemoryBlock(long size, boolean transactional) {
        return allocateRegular(size, transactional, null);
    }

    /** Allocates, runs initializer on the whole block, and persists the block once. */
    public PersistentMemoryBlock allocateMemoryBlock(long size, Consumer<Range> initializer) {
        return allocateRegular(size, false, initializer);
    }

    public PersistentMemoryBlock allocateMemoryBlock(long size, boolean transactional,
            Consumer<Range> initializer) {
        return allocateRegular(size, transactional, initializer);
    }

    public PersistentCompactMemoryBlock allocateCompactMemoryBlock(long size) {
        return allocateCompact(size, false, null);
    }

    public PersistentCompactMemoryBlock allocateCompactMemoryBlock(long size,
            boolean transactional) {
        return allocateCompact(size, transactional, null);
    }

    public PersistentCompactMemoryBlock allocateCompactMemoryBlock(long size,
            Consumer<Range> initializer) {
        return allocateCompact(size, false, initializer);
    }

    public PersistentCompactMemoryBlock allocateCompactMemoryBlock(long size, boolean transactional,
            Consumer<Range> initializer) {
        return allocateCompact(size, transactional, initializer);
    }

    @Override
    public long allocateMemory(long size) {
        return allocateRegular(size, false, null).handle();
    }

    public long allocateMemory(long size, boolean transactional) {
        return allocateRegular(size, transactional, null).handle();
    }

    @Override
    public long allocateCompactMemory(long size) {
        return allocateCompact(size, false, null).handle();
    }

    public long allocateCompactMemory(long size, boolean transactional) {
        return allocateCompact(size, transactional, null).handle();
    }

    /**
     * A view of the live regular block handle, checked in Java by default (see
     * {@link AnyHeap}: a freed or foreign in-pool handle gives a view of wrong bytes inside the
     * pool) or against the pool's object table with {@value #VALIDATE_HANDLES_PROPERTY}.
     *
     * @throws IllegalArgumentException if handle is outside the pool, misaligned, or its size
     *     header does not fit in the pool; with validation, if it is not a live regular block
     */
    public PersistentMemoryBlock memoryBlockFromHandle(long handle) {
        return new PersistentMemoryBlock(this, handle);
    }

    /**
     * A view of the live compact block handle, always validated against the pool's object
     * table (a compact block's size is kept only there).
     *
     * @throws IllegalArgumentException if handle is not one
     */
    public PersistentCompactMemoryBlock compactMemoryBlockFromHandle(long handle) {
        return new PersistentCompactMemoryBlock(this, handle);
    }

    public PersistentAccessor createAccessor() {
        return new PersistentAccessor(this);
    }

    /** Runs body (each store is durable on its own). */
    @Override
    public void execute(Runnable body) {
        body.run();
    }

    /** Runs body (each store is durable on its own). */
    @Override
    public <T> T execute(Supplier<T> body) {
        return body.get();
    }
}

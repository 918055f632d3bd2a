package dev.terrace.pool;

import java.lang.foreign.MemorySegment;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * LLPL's raw heap: stores into its blocks are plain CPU stores, made durable only by
 * {@code flush} (or logged by {@code addToTransaction} inside a {@link Transaction}). The
 * root long and new blocks' size headers are persisted. Allocation and free are atomic by
 * default (after a crash a block is allocated or not; a block allocated but not yet reachable
 * from the root leaks, as in LLPL), or transactional when asked.
 */
public final class Heap extends AnyHeap {
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
    boolean beforeWrite(long off, long len) {
        return false;
    }

    @Override
    void afterWrite(long off, long len, boolean implicit) {}

    private MemoryBlock allocateRegular(long size, boolean transactional,
            Consumer<Range> initializer) {
        return transactional
                ? allocateInTransaction(size, false,
                        h -> new MemoryBlock(this, h, size), initializer)
                : allocateAtomically(size, false,
                        h -> new MemoryBlock(this, h, size), initializer);
    }

    private CompactMemoryBlock allocateCompact(long size, boolean transactional,
            Consumer<Range> initializer) {
        return transactional
                ? allocateInTransaction(size, true,
                        h -> new CompactMemoryBlock(this, h, size), initializer)
                : allocateAtomically(size, true,
                        h -> new CompactMemoryBlock(this, h, size), initializer);
    }

    public MemoryBlock allocateMemoryBlock(long size) {
        return allocateRegular(size, false, null);
    }

    public MemoryBlock allocateMemoryBlock(long size, boolean transactional) {
        return allocateRegular(size, transactional, null);
    }

    /** Allocates, runs initializer on the whole block, and persists the block once. */
    public MemoryBlock allocateMemoryBlock(long size, Consumer<Range> initializer) {
        return allocateRegular(size, false, initializer);
    }

    public MemoryBlock allocateMemoryBlock(long size, boolean transactional,
            Consumer<Range> initializer) {
        return allocateRegular(size, transactional, initializer);
    }

    public CompactMemoryBlock allocateCompactMemoryBlock(long size) {
        return allocateCompact(size, false, null);
    }

    public CompactMemoryBlock allocateCompactMemoryBlock(long size, boolean transactional) {
        return allocateCompact(size, transactional, null);
    }

    public CompactMemoryBlock allocateCompactMemoryBlock(long size, Consumer<Range> initializer) {
        return allocateCompact(size, false, initializer);
    }

    public CompactMemoryBlock allocateCompactMemoryBlock(long size, boolean transactional,
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
    public MemoryBlock memoryBlockFromHandle(long handle) {
        return new MemoryBlock(this, handle);
    }

    /**
     * A view of the live compact block handle, always validated against the pool's object
     * table (a compact block's size is kept only there).
     *
     * @throws IllegalArgumentException if handle is not one
     */
    public CompactMemoryBlock compactMemoryBlockFromHandle(long handle) {
        return new CompactMemoryBlock(this, handle);
    }

    public Accessor createAccessor() {
        return new Accessor(this);
    }

    /** Runs body (a raw heap's stores need no transaction). */
    @Override
    public void execute(Runnable body) {
        body.run();
    }

    /** Runs body (a raw heap's stores need no transaction). */
    @Override
    public <T> T execute(Supplier<T> body) {
        return body.get();
    }
}

package dev.terrace.pool;

import java.lang.foreign.MemorySegment;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * What the raw {@link Heap} and the {@link PersistentHeap} share: LLPL's allocation calls for
 * a heap whose stores need no transaction, so that an allocation is atomic by default (after a
 * crash a block is allocated or not; one allocated but not yet reachable from the root leaks,
 * as in LLPL) and transactional when asked, and the views of handles and accessors, all typed
 * as the flavour's own blocks. A flavour supplies only its constructors and what a store does
 * ({@link AnyHeap#afterWrite}: nothing more, or a persist).
 *
 * @param <R> the flavour's regular block
 * @param <C> the flavour's compact block
 * @param <A> the flavour's accessor
 */
public abstract sealed class AtomicHeap<R extends MemoryAccessor, C extends MemoryAccessor, A>
        extends AnyHeap permits Heap, PersistentHeap {
    AtomicHeap(String path, MemorySegment pool) {
        super(path, pool);
    }

    /** A new regular block's view (size bytes, header written by the allocation). */
    abstract R regularBlock(long handle, long size);

    /** A new compact block's view. */
    abstract C compactBlock(long handle, long size);

    /** The view of an existing regular block, checked as {@link #memoryBlockFromHandle} says. */
    abstract R regularView(long handle);

    /** The view of an existing compact block, validated against the pool. */
    abstract C compactView(long handle);

    /** A new accessor of this heap. */
    abstract A accessor();

    @Override
    final boolean beforeWrite(MemoryAccessor block, long off, long len) {
        return false;
    }

    private R allocateRegular(long size, boolean transactional, Consumer<Range> initializer) {
        return transactional
                ? allocateInTransaction(size, false, h -> regularBlock(h, size), initializer)
                : allocateAtomically(size, false, h -> regularBlock(h, size), initializer);
    }

    private C allocateCompact(long size, boolean transactional, Consumer<Range> initializer) {
        return transactional
                ? allocateInTransaction(size, true, h -> compactBlock(h, size), initializer)
                : allocateAtomically(size, true, h -> compactBlock(h, size), initializer);
    }

    public R allocateMemoryBlock(long size) {
        return allocateRegular(size, false, null);
    }

    public R allocateMemoryBlock(long size, boolean transactional) {
        return allocateRegular(size, transactional, null);
    }

    /** Allocates, runs initializer on the whole block, and persists the block once. */
    public R allocateMemoryBlock(long size, Consumer<Range> initializer) {
        return allocateRegular(size, false, initializer);
    }

    public R allocateMemoryBlock(long size, boolean transactional, Consumer<Range> initializer) {
        return allocateRegular(size, transactional, initializer);
    }

    public C allocateCompactMemoryBlock(long size) {
        return allocateCompact(size, false, null);
    }

    public C allocateCompactMemoryBlock(long size, boolean transactional) {
        return allocateCompact(size, transactional, null);
    }

    public C allocateCompactMemoryBlock(long size, Consumer<Range> initializer) {
        return allocateCompact(size, false, initializer);
    }

    public C allocateCompactMemoryBlock(long size, boolean transactional,
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
    public R memoryBlockFromHandle(long handle) {
        return regularView(handle);
    }

    /**
     * A view of the live compact block handle, always validated against the pool's object
     * table (a compact block's size is kept only there).
     *
     * @throws IllegalArgumentException if handle is not one
     */
    public C compactMemoryBlockFromHandle(long handle) {
        return compactView(handle);
    }

    public A createAccessor() {
        return accessor();
    }

    /** Runs body: this flavour's stores need no transaction. */
    @Override
    public void execute(Runnable body) {
        body.run();
    }

    /** Runs body: this flavour's stores need no transaction. */
    @Override
    public <T> T execute(Supplier<T> body) {
        return body.get();
    }
}

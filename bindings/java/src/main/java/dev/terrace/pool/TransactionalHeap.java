package dev.terrace.pool;

import java.lang.foreign.MemorySegment;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * LLPL's transactional heap: every store, allocation and free is part of a transaction, so
 * after a crash the heap holds each transaction wholly or not at all.
 *
 * <p>A store snapshots its bytes into the undo log ({@code terrace_pool_tx_add_range}) and
 * then writes them in place. Inside the thread's {@link Transaction} on this heap it joins
 * that transaction; outside any transaction it runs in an implicit transaction of its own
 * (begin, snapshot, store, commit), as LLPL does. Crash argument of the implicit transaction:
 * until its commit the undo log holds the old bytes, so recovery restores them; after the
 * commit the store is durable; a torn store is never visible. A store inside a transaction on
 * another heap throws {@link TransactionException} (one heap per transaction) before anything
 * is written.
 */
public final class TransactionalHeap extends AnyHeap {
    static final String LAYOUT = "terrace-llpl-transactional-heap";

    private TransactionalHeap(String path, MemorySegment pool) {
        super(path, pool);
    }

    /**
     * Creates a heap file of at least size bytes (rounded up to 2 MiB).
     *
     * @throws HeapException if the file exists or cannot be created
     */
    public static TransactionalHeap createHeap(String path, long size) {
        return new TransactionalHeap(path, openPool(path, size, LAYOUT, true));
    }

    /**
     * Opens a heap file created by {@link #createHeap}, recovering it (rolling back any
     * transaction a crash interrupted).
     *
     * @throws HeapException if it is missing or is not a transactional heap
     */
    public static TransactionalHeap openHeap(String path) {
        return new TransactionalHeap(path, openPool(path, 0, LAYOUT, false));
    }

    /** LLPL 1.0's name: opens the heap at path if it exists, else creates it. */
    public static TransactionalHeap getHeap(String path, long size) {
        return exists(path) ? openHeap(path) : createHeap(path, size);
    }

    /** LLPL 1.0's name for {@link #openHeap}. */
    public static TransactionalHeap getHeap(String path) {
        return openHeap(path);
    }

    @Override
    boolean beforeWrite(MemoryAccessor block, long off, long len) {
        ThreadTransaction tx = ThreadTransaction.current();
        boolean implicit = tx.heap != this;
        if (implicit) {
            enterTransaction(); // throws if the thread's transaction is on another heap
        } else if (block != null && block.isFreshIn(tx)) {
            // allocated by this very transaction: an abort frees it, so nothing to snapshot
            return false;
        }
        try {
            addRange(tx, off, len);
        } catch (RuntimeException e) {
            if (implicit) {
                abortLevel(tx);
            }
            throw e;
        }
        return implicit;
    }

    @Override
    void afterWrite(long off, long len, boolean implicit) {
        if (implicit) {
            commitOrThrow(ThreadTransaction.current());
        }
    }

    public TransactionalMemoryBlock allocateMemoryBlock(long size) {
        return allocateMemoryBlock(size, null);
    }

    /**
     * Allocates a zeroed block and runs initializer on it, in the thread's transaction (or an
     * implicit one): after a crash, or if initializer throws, the block does not exist.
     */
    public TransactionalMemoryBlock allocateMemoryBlock(long size, Consumer<Range> initializer) {
        return allocateInTransaction(size, false, h -> new TransactionalMemoryBlock(this, h, size),
                initializer);
    }

    public TransactionalCompactMemoryBlock allocateCompactMemoryBlock(long size) {
        return allocateCompactMemoryBlock(size, null);
    }

    public TransactionalCompactMemoryBlock allocateCompactMemoryBlock(long size,
            Consumer<Range> initializer) {
        return allocateInTransaction(size, true,
                h -> new TransactionalCompactMemoryBlock(this, h, size), initializer);
    }

    @Override
    public long allocateMemory(long size) {
        return allocateMemoryBlock(size).handle();
    }

    @Override
    public long allocateCompactMemory(long size) {
        return allocateCompactMemoryBlock(size).handle();
    }

    /**
     * A view of the live regular block handle, checked in Java by default (see
     * {@link AnyHeap}: a freed or foreign in-pool handle gives a view of wrong bytes inside the
     * pool) or against the pool's object table with {@value #VALIDATE_HANDLES_PROPERTY}.
     *
     * @throws IllegalArgumentException if handle is outside the pool, misaligned, or its size
     *     header does not fit in the pool; with validation, if it is not a live regular block
     */
    public TransactionalMemoryBlock memoryBlockFromHandle(long handle) {
        return new TransactionalMemoryBlock(this, handle);
    }

    /**
     * A view of the live compact block handle, always validated against the pool's object
     * table (a compact block's size is kept only there).
     *
     * @throws IllegalArgumentException if handle is not one
     */
    public TransactionalCompactMemoryBlock compactMemoryBlockFromHandle(long handle) {
        return new TransactionalCompactMemoryBlock(this, handle);
    }

    public TransactionalAccessor createAccessor() {
        return new TransactionalAccessor(this);
    }

    /** Runs body in a transaction on this heap ({@link Transaction#create(AnyHeap, Runnable)}). */
    @Override
    public void execute(Runnable body) {
        Transaction.create(this, body);
    }

    /** Runs body in a transaction on this heap and returns its result. */
    @Override
    public <T> T execute(Supplier<T> body) {
        return Transaction.create(this, body);
    }
}

package dev.terrace.pool;

import java.util.function.Supplier;

/**
 * A transaction on one heap, run by the calling thread: everything its body does to the heap
 * (transactional stores, {@code addToTransaction} ranges, transactional allocations and
 * frees) becomes durable together at the outermost commit, or is rolled back together.
 *
 * <p>Invariants: a thread has at most one transaction, on one heap; {@link #run} inside
 * another transaction of the same heap nests into it (flattened: only the outermost commit
 * makes the work durable, and an abort anywhere aborts the whole). If the body throws, the
 * whole transaction is aborted ({@code terrace_pool_tx_abort}: stores restored, allocations
 * freed, frees undone, block views of undone allocations invalidated) and the exception is
 * rethrown unchanged. A transaction is run once; afterwards {@link #isValid()} is false.
 */
public final class Transaction {
    private enum State { NEW, ACTIVE, COMMITTED, ABORTED }

    private final AnyHeap heap;
    private State state = State.NEW;

    private Transaction(AnyHeap heap) {
        this.heap = heap;
    }

    /** A transaction on heap, not yet begun: {@link #run} begins, runs and commits it. */
    public static Transaction create(AnyHeap heap) {
        return new Transaction(heap);
    }

    /** Runs body in a new transaction on heap. */
    public static void create(AnyHeap heap, Runnable body) {
        new Transaction(heap).run(body);
    }

    /** Runs body in a new transaction on heap and returns its result. */
    public static <T> T create(AnyHeap heap, Supplier<T> body) {
        return new Transaction(heap).run(body);
    }

    /** LLPL 1.0's name for {@link #create(AnyHeap, Runnable)}. */
    public static void run(AnyHeap heap, Runnable body) {
        create(heap, body);
    }

    /** LLPL 1.0's name for {@link #create(AnyHeap, Supplier)}. */
    public static <T> T run(AnyHeap heap, Supplier<T> body) {
        return create(heap, body);
    }

    /** Whether this transaction has not yet committed nor aborted. */
    public boolean isValid() {
        return state == State.NEW || state == State.ACTIVE;
    }

    /** Runs body in this transaction. */
    public void run(Runnable body) {
        run(() -> {
            body.run();
            return null;
        });
    }

    /**
     * Begins the transaction (nesting into the thread's transaction on the same heap), runs
     * body, and commits.
     *
     * @throws TransactionException if the thread's transaction is on another heap, if the
     *     transaction is no longer valid, or if the commit finds the work was aborted (e.g. a
     *     nested body threw and the exception was caught)
     */
    public <T> T run(Supplier<T> body) {
        if (!isValid()) {
            throw new TransactionException("transaction already " + state.name().toLowerCase(
                    java.util.Locale.ROOT), 22);
        }
        ThreadTransaction tx = heap.enterTransaction();
        state = State.ACTIVE;
        T result;
        try {
            result = body.get();
        } catch (Throwable t) {
            state = State.ABORTED;
            try {
                heap.abortLevel(tx);
            } catch (RuntimeException abortFailure) {
                t.addSuppressed(abortFailure);
            }
            throw t;
        }
        try {
            heap.commitOrThrow(tx);
        } catch (RuntimeException e) {
            state = State.ABORTED;
            throw e;
        }
        state = State.COMMITTED;
        return result;
    }
}

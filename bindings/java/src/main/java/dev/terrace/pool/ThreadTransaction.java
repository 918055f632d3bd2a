package dev.terrace.pool;

import java.util.ArrayList;

/**
 * The calling thread's transaction: which heap it is on, how deeply it is nested, its native
 * transaction, and the block views allocated inside it.
 *
 * <p>Invariants: {@code heap} is non-null exactly while {@code depth > 0}. Levels are counted
 * here only: the native transaction ({@code terrace_pool_txn_*}, a handle, not bound to the
 * OS thread, so a virtual thread may move between carriers inside it) is begun by the
 * outermost level and ended by the outermost commit, or earlier by an abort or a failed
 * operation at any level, which rolls it back at once: then {@code txn} is 0 and
 * {@code errnum} says why, every later operation of the transaction fails, and every view in
 * {@code allocated} is invalidated, so a block whose allocation was undone cannot be used.
 * {@code epoch} changes with every outermost begin, so a view can tell whether it was
 * allocated by the transaction running now ({@link MemoryAccessor#isFreshIn}). Only
 * {@link AnyHeap#enterTransaction}, {@link AnyHeap#commitLevel}, {@link AnyHeap#abortLevel}
 * and the heap's failed operations change these fields.
 */
final class ThreadTransaction {
    static final ThreadLocal<ThreadTransaction> CURRENT =
            ThreadLocal.withInitial(ThreadTransaction::new);

    AnyHeap heap;
    int depth;
    /** The native transaction (terrace_pool_txn *); 0 once rolled back. */
    long txn;
    /** errno of what rolled the transaction back (0 while it may still commit). */
    int errnum;
    long epoch;
    final ArrayList<MemoryAccessor> allocated = new ArrayList<>();

    private ThreadTransaction() {}

    static ThreadTransaction current() {
        return CURRENT.get();
    }
}

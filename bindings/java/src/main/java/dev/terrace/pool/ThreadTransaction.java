package dev.terrace.pool;

import java.util.ArrayList;

/**
 * The Java side of the calling thread's transaction: which heap it is on, how deeply it is
 * nested, and the block views allocated inside it.
 *
 * <p>Invariants: {@code heap} is non-null exactly while {@code depth > 0}, and mirrors the
 * native transaction of this thread (terrace_pool_tx_begin/commit/abort are only called
 * through {@link AnyHeap#enterTransaction}, {@link AnyHeap#commitLevel} and
 * {@link AnyHeap#abortLevel}, which keep both in step). A rollback invalidates every view in
 * {@code allocated}, so a block whose allocation was undone cannot be used.
 */
final class ThreadTransaction {
    static final ThreadLocal<ThreadTransaction> CURRENT =
            ThreadLocal.withInitial(ThreadTransaction::new);

    AnyHeap heap;
    int depth;
    final ArrayList<MemoryAccessor> allocated = new ArrayList<>();

    private ThreadTransaction() {}

    static ThreadTransaction current() {
        return CURRENT.get();
    }
}

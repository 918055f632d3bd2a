package dev.terrace.pool;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.NativeLibrary;
import java.lang.foreign.FunctionDescriptor;
import java.lang.invoke.MethodHandle;

/**
 * The downcall handles of {@code include/terrace_pool.h} that the pool binding uses, built
 * once.
 *
 * <p>Invariant: the pool argument is always the heap's zero-length pool segment, which belongs
 * to the heap's shared arena: a call on a closed heap throws {@link IllegalStateException}
 * before reaching native code, and closing the heap while a call is in flight fails instead of
 * freeing the pool under it. Short calls that never block (direct, persist, add-range, size
 * and type queries) are critical; calls that may wait on a lock or the file system are plain.
 * Handles marked "errno" take {@link NativeLibrary#callState()} first.
 */
final class PoolNative {
    private PoolNative() {}

    /** errno */
    static final MethodHandle CREATE = NativeLibrary.capturingErrno("terrace_pool_create",
            FunctionDescriptor.of(ADDRESS, ADDRESS, JAVA_LONG, ADDRESS));
    /** errno */
    static final MethodHandle OPEN = NativeLibrary.capturingErrno("terrace_pool_open",
            FunctionDescriptor.of(ADDRESS, ADDRESS, ADDRESS));
    static final MethodHandle CLOSE = NativeLibrary.downcall("terrace_pool_close",
            FunctionDescriptor.of(JAVA_INT, ADDRESS));
    /** errno */
    static final MethodHandle ROOT = NativeLibrary.capturingErrno("terrace_pool_root",
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, JAVA_LONG));
    static final MethodHandle DIRECT = NativeLibrary.critical("terrace_pool_direct",
            FunctionDescriptor.of(ADDRESS, ADDRESS, JAVA_LONG));

    /** errno */
    static final MethodHandle ZALLOC = NativeLibrary.capturingErrno("terrace_pool_zalloc",
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, JAVA_LONG, JAVA_LONG, ADDRESS));
    /** errno */
    static final MethodHandle ALLOC_IN_CLASS = NativeLibrary.capturingErrno(
            "terrace_pool_alloc_in_class",
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, JAVA_BYTE, JAVA_LONG, JAVA_LONG, ADDRESS));
    static final MethodHandle FREE_OFF = NativeLibrary.downcall("terrace_pool_free_off",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG));
    static final MethodHandle USABLE_SIZE = NativeLibrary.critical("terrace_pool_usable_size",
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, JAVA_LONG));
    static final MethodHandle TYPE_NUM = NativeLibrary.critical("terrace_pool_type_num",
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, JAVA_LONG));

    static final MethodHandle FIRST = NativeLibrary.downcall("terrace_pool_first",
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, JAVA_LONG));
    static final MethodHandle NEXT = NativeLibrary.downcall("terrace_pool_next",
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, JAVA_LONG));

    static final MethodHandle PERSIST = NativeLibrary.critical("terrace_pool_persist",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS, JAVA_LONG));
    static final MethodHandle STATS = NativeLibrary.downcall("terrace_pool_stats",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS));
    static final MethodHandle REGISTER_CLASS = NativeLibrary.downcall(
            "terrace_pool_register_class",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT, ADDRESS));

    static final MethodHandle PERSIST_MODE = NativeLibrary.downcall("terrace_pool_persist_mode",
            FunctionDescriptor.of(JAVA_INT, ADDRESS));

    // Transactions by handle (terrace_pool_txn_*). The pool and transaction arguments are
    // raw addresses (JAVA_LONG): the heap's transaction gate (AnyHeap.activeTransactions)
    // keeps the pool open while its thread holds a transaction, which spares each call the
    // shared arena's acquire and release. Critical variants are for pools whose persist
    // points never wait for the file system (terrace_pool_persist_mode below MSYNC); a
    // critical begin must not wait for a lane, since the lane's holder may be a Java thread
    // waiting for a safepoint, so begins pass TXN_NOWAIT and the caller retries.

    /** terrace_pool_txn_begin flag. */
    static final int TXN_NOWAIT = 1;
    /** terrace_pool_txn_alloc flag. */
    static final int TXN_ZERO = 1;
    /** terrace_pool_persist_mode's value for msync. */
    static final int PERSIST_MSYNC = 2;

    private static final FunctionDescriptor TXN_BEGIN_DESC =
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_INT);
    private static final FunctionDescriptor TXN_ALLOC_DESC =
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_INT);
    private static final FunctionDescriptor TXN_OFF_DESC =
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, JAVA_LONG);
    private static final FunctionDescriptor TXN_END_DESC =
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG);

    /** errno */
    static final MethodHandle TXN_BEGIN =
            NativeLibrary.capturingErrno("terrace_pool_txn_begin", TXN_BEGIN_DESC);
    /** errno */
    static final MethodHandle TXN_BEGIN_CRITICAL =
            NativeLibrary.criticalCapturingErrno("terrace_pool_txn_begin", TXN_BEGIN_DESC);
    private static final FunctionDescriptor TXN_RANGE_DESC =
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, JAVA_LONG, JAVA_LONG);
    static final MethodHandle TXN_ADD_RANGE =
            NativeLibrary.downcall("terrace_pool_txn_add_range", TXN_RANGE_DESC);
    static final MethodHandle TXN_ADD_RANGE_CRITICAL =
            NativeLibrary.critical("terrace_pool_txn_add_range", TXN_RANGE_DESC);
    /** errno */
    static final MethodHandle TXN_ALLOC =
            NativeLibrary.capturingErrno("terrace_pool_txn_alloc", TXN_ALLOC_DESC);
    /** errno */
    static final MethodHandle TXN_ALLOC_CRITICAL =
            NativeLibrary.criticalCapturingErrno("terrace_pool_txn_alloc", TXN_ALLOC_DESC);
    static final MethodHandle TXN_FREE =
            NativeLibrary.downcall("terrace_pool_txn_free", TXN_OFF_DESC);
    static final MethodHandle TXN_FREE_CRITICAL =
            NativeLibrary.critical("terrace_pool_txn_free", TXN_OFF_DESC);
    static final MethodHandle TXN_COMMIT =
            NativeLibrary.downcall("terrace_pool_txn_commit", TXN_END_DESC);
    static final MethodHandle TXN_COMMIT_CRITICAL =
            NativeLibrary.critical("terrace_pool_txn_commit", TXN_END_DESC);
    static final MethodHandle TXN_ABORT =
            NativeLibrary.downcall("terrace_pool_txn_abort", TXN_END_DESC);
}

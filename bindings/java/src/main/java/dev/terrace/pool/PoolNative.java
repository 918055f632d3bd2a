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

    static final MethodHandle TX_BEGIN = NativeLibrary.downcall("terrace_pool_tx_begin",
            FunctionDescriptor.of(JAVA_INT, ADDRESS));
    static final MethodHandle TX_ADD_RANGE = NativeLibrary.critical("terrace_pool_tx_add_range",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_LONG));
    /** errno */
    static final MethodHandle TX_ZALLOC = NativeLibrary.capturingErrno("terrace_pool_tx_zalloc",
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, JAVA_LONG, JAVA_LONG));
    static final MethodHandle TX_FREE = NativeLibrary.downcall("terrace_pool_tx_free",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG));
    static final MethodHandle TX_COMMIT = NativeLibrary.downcall("terrace_pool_tx_commit",
            FunctionDescriptor.of(JAVA_INT, ADDRESS));
    static final MethodHandle TX_ABORT = NativeLibrary.downcall("terrace_pool_tx_abort",
            FunctionDescriptor.of(JAVA_INT, ADDRESS));
}

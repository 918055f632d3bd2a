package dev.terrace.kinds;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.NativeLibrary;
import java.lang.foreign.FunctionDescriptor;
import java.lang.invoke.MethodHandle;

/**
 * The downcall handles of {@code include/terrace.h}, one per function, built once.
 *
 * <p>Invariant: kind handles, pointers and {@code size_t} are passed as {@code JAVA_LONG}
 * (the same register class as a pointer on the 64-bit Linux ABIs this library ships for), so
 * the hot calls box nothing. malloc, calloc, realloc, free and usable_size are critical
 * downcalls; the allocating ones also capture errno (their first argument is
 * {@link NativeLibrary#callState()}).
 */
final class KindNative {
    private KindNative() {}

    static final MethodHandle KIND_DEFAULT =
            NativeLibrary.downcall("terrace_kind_default", FunctionDescriptor.of(JAVA_LONG));
    static final MethodHandle CREATE_FILE = NativeLibrary.downcall("terrace_kind_create_file",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT, ADDRESS));
    static final MethodHandle CREATE_DRAM = NativeLibrary.downcall("terrace_kind_create_dram",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS));
    static final MethodHandle CREATE_NUMA = NativeLibrary.downcall("terrace_kind_create_numa",
            FunctionDescriptor.of(JAVA_INT, JAVA_INT, ADDRESS));
    static final MethodHandle CREATE_UNIFIED = NativeLibrary.downcall(
            "terrace_kind_create_unified",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, JAVA_LONG, JAVA_INT, ADDRESS));
    static final MethodHandle DESTROY = NativeLibrary.downcall("terrace_kind_destroy",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
    static final MethodHandle STATS = NativeLibrary.downcall("terrace_kind_stats",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS));

    static final MethodHandle MALLOC = NativeLibrary.criticalCapturingErrno("terrace_malloc",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG));
    static final MethodHandle CALLOC = NativeLibrary.criticalCapturingErrno("terrace_calloc",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG));
    static final MethodHandle REALLOC = NativeLibrary.criticalCapturingErrno("terrace_realloc",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG));
    static final MethodHandle POSIX_MEMALIGN = NativeLibrary.critical("terrace_posix_memalign",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG, JAVA_LONG));
    static final MethodHandle FREE = NativeLibrary.critical("terrace_free",
            FunctionDescriptor.ofVoid(JAVA_LONG));
    static final MethodHandle USABLE_SIZE = NativeLibrary.critical("terrace_usable_size",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG));
    static final MethodHandle DETECT_KIND = NativeLibrary.critical("terrace_detect_kind",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG));
}

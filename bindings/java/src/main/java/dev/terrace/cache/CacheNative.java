package dev.terrace.cache;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.NativeLibrary;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.StructLayout;
import java.lang.invoke.MethodHandle;

/**
 * The downcall handles of {@code include/terrace_cache.h}, one per function, and the layout
 * of {@code struct terrace_cache_stats}.
 *
 * <p>Invariants: the cache and guard handles are passed as {@code JAVA_LONG} (pointer-sized
 * on the 64-bit Linux ABIs this library ships for). Every request (get, pin, set, add,
 * replace, cas, delete, touch, incr, decr) is a critical downcall that accepts heap
 * segments, so a {@code byte[]} key or value goes to the library without a copy; set, add,
 * replace and cas also have a native-only handle ({@code *_NATIVE}), for arguments in native
 * memory (about 140 ns cheaper per call than the heap-accepting handle, measured even with
 * native segments); open, close, flush_all and
 * stats may take long and are plain downcalls.
 */
final class CacheNative {
    private CacheNative() {}

    static final int ENOENT = 2;
    static final int EEXIST = 17;
    static final int EBUSY = 16;
    static final int ENOSPC = 28;
    static final int MAX_TIERS = 8;

    static final StructLayout TIER_STATS = MemoryLayout.structLayout(
            JAVA_LONG.withName("items"), JAVA_LONG.withName("live_bytes"),
            JAVA_LONG.withName("dead_bytes"), JAVA_LONG.withName("segments"),
            JAVA_LONG.withName("free_segments"), JAVA_LONG.withName("hits"),
            JAVA_LONG.withName("items_evicted"));
    static final StructLayout STATS = MemoryLayout.structLayout(
            JAVA_LONG.withName("items"), JAVA_LONG.withName("bytes"),
            JAVA_LONG.withName("hits"), JAVA_LONG.withName("misses"),
            JAVA_LONG.withName("sets"), JAVA_LONG.withName("deletes"),
            JAVA_LONG.withName("expired"), JAVA_LONG.withName("evictions"),
            JAVA_LONG.withName("demotions"), JAVA_LONG.withName("promotions"),
            JAVA_INT.withName("tier_count"), MemoryLayout.paddingLayout(4),
            MemoryLayout.sequenceLayout(MAX_TIERS, TIER_STATS).withName("tiers"));
    static final long TIER_COUNT_OFFSET =
            STATS.byteOffset(MemoryLayout.PathElement.groupElement("tier_count"));
    static final long TIERS_OFFSET =
            STATS.byteOffset(MemoryLayout.PathElement.groupElement("tiers"));

    static final MethodHandle OPEN = NativeLibrary.capturingErrno("terrace_cache_open",
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, ADDRESS, JAVA_LONG));
    static final MethodHandle CLOSE = NativeLibrary.downcall("terrace_cache_close",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
    static final MethodHandle FLUSH_ALL = NativeLibrary.downcall("terrace_cache_flush_all",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
    static final MethodHandle STATS_CALL = NativeLibrary.downcall("terrace_cache_stats",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS));

    /** get(c, key, klen, buf, cap, *value_len, *flags, *cas). */
    static final MethodHandle GET = NativeLibrary.criticalHeap("terrace_cache_get",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG,
                    ADDRESS, ADDRESS, ADDRESS));
    static final MethodHandle PIN = NativeLibrary.criticalHeap("terrace_cache_pin",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS));
    static final MethodHandle GUARD_VALUE = NativeLibrary.critical("terrace_cache_guard_value",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, ADDRESS));
    static final MethodHandle GUARD_FLAGS = NativeLibrary.critical("terrace_cache_guard_flags",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
    static final MethodHandle GUARD_CAS = NativeLibrary.critical("terrace_cache_guard_cas",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG));
    static final MethodHandle RELEASE = NativeLibrary.critical("terrace_cache_release",
            FunctionDescriptor.ofVoid(JAVA_LONG));

    private static final FunctionDescriptor STORE = FunctionDescriptor.of(JAVA_INT, JAVA_LONG,
            ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG, JAVA_INT, JAVA_INT, ADDRESS);
    static final MethodHandle SET = NativeLibrary.criticalHeap("terrace_cache_set", STORE);
    static final MethodHandle ADD = NativeLibrary.criticalHeap("terrace_cache_add", STORE);
    static final MethodHandle REPLACE = NativeLibrary.criticalHeap("terrace_cache_replace", STORE);
    static final MethodHandle CAS = NativeLibrary.criticalHeap("terrace_cache_cas",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG,
                    JAVA_INT, JAVA_INT, JAVA_LONG, ADDRESS));
    static final MethodHandle SET_NATIVE = NativeLibrary.critical("terrace_cache_set", STORE);
    static final MethodHandle ADD_NATIVE = NativeLibrary.critical("terrace_cache_add", STORE);
    static final MethodHandle REPLACE_NATIVE =
            NativeLibrary.critical("terrace_cache_replace", STORE);
    static final MethodHandle CAS_NATIVE = NativeLibrary.critical("terrace_cache_cas",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG,
                    JAVA_INT, JAVA_INT, JAVA_LONG, ADDRESS));
    static final MethodHandle DELETE = NativeLibrary.criticalHeap("terrace_cache_delete",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG));
    static final MethodHandle TOUCH = NativeLibrary.criticalHeap("terrace_cache_touch",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG, JAVA_INT));
    private static final FunctionDescriptor ARITH = FunctionDescriptor.of(JAVA_INT, JAVA_LONG,
            ADDRESS, JAVA_LONG, JAVA_LONG, ADDRESS);
    static final MethodHandle INCR = NativeLibrary.criticalHeap("terrace_cache_incr", ARITH);
    static final MethodHandle DECR = NativeLibrary.criticalHeap("terrace_cache_decr", ARITH);
}

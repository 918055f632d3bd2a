package dev.terrace.collections;

import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.NativeLibrary;
import java.lang.foreign.FunctionDescriptor;
import java.lang.invoke.MethodHandle;

/**
 * The downcall handles of the hash map of {@code include/terrace_collections.h}
 * ({@code terrace_hmap_*}: the ordered map's calls and signatures, iteration in no order),
 * built when this class is first used (the map checks first that the loaded library has them:
 * {@link NativeHashMap#available()}). Bound as {@link MapNative} says (reads critical with
 * {@value MapNative#CRITICAL_PROPERTY}{@code =true}).
 */
final class HmapNative {
    private HmapNative() {}

    /** put(map, key, key_len, value, value_len) → 0 or errno. */
    static final MethodHandle PUT = NativeLibrary.downcall("terrace_hmap_put", MapNative.PUT);
    /** errno: get(map, key, key_len, buf, cap) → full value length, or -1. */
    static final MethodHandle FIND = MapNative.find("terrace_hmap_find");
    /** remove(map, key, key_len) → 0, ENOENT or another errno. */
    static final MethodHandle REMOVE =
            NativeLibrary.downcall("terrace_hmap_remove", MapNative.REMOVE);
    /** errno: len(map) → entries, or UINT64_MAX (-1 here). */
    static final MethodHandle LEN = MapNative.read("terrace_hmap_len", MapNative.LEN);
    /** errno: iter_open(map) → iterator or 0. */
    static final MethodHandle ITER_OPEN = NativeLibrary.capturingErrno("terrace_hmap_iter_open",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG));
    /** errno: iter_next(it, key, key_cap, *key_len, value, value_cap, *value_len) → 1, 0, -1. */
    static final MethodHandle ITER_NEXT = MapNative.read("terrace_hmap_iter_next", MapNative.NEXT);
    /** open, close, iterator close, destroy. */
    static final NativeMap.Kind KIND = MapNative.kind("hash map", "a", "terrace_hmap", "iter");
}

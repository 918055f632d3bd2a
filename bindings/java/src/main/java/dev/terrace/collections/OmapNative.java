package dev.terrace.collections;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.NativeLibrary;
import java.lang.foreign.FunctionDescriptor;
import java.lang.invoke.MethodHandle;

/**
 * The downcall handles of the ordered map of {@code include/terrace_collections.h}
 * ({@code terrace_omap_*}), built when this class is first used (the maps check first that the
 * loaded library has them: {@link NativeOrderedMap#available()}). What the map kinds share
 * (limits, errno, signatures, how reads are bound) is {@link MapNative}.
 */
final class OmapNative {
    private OmapNative() {}

    static final int REVERSE = 1;
    static final int LO_EXCLUSIVE = 2;
    static final int HI_INCLUSIVE = 4;

    /** put(map, key, key_len, value, value_len) → 0 or errno. */
    static final MethodHandle PUT = NativeLibrary.downcall("terrace_omap_put", MapNative.PUT);
    /** find(map, key, key_len, buf, cap) → full value length, or a negative errno. */
    static final MethodHandle FIND = MapNative.find("terrace_omap_find");
    /** remove(map, key, key_len) → 0, ENOENT or another errno. */
    static final MethodHandle REMOVE =
            NativeLibrary.downcall("terrace_omap_remove", MapNative.REMOVE);
    /** errno: len(map) → entries, or UINT64_MAX (-1 here). */
    static final MethodHandle LEN = MapNative.read("terrace_omap_len", MapNative.LEN);
    /** errno: cursor_open(map, lo, lo_len, hi, hi_len, flags) → cursor or 0. */
    static final MethodHandle CURSOR_OPEN = NativeLibrary.capturingErrno(
            "terrace_omap_cursor_open", FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, ADDRESS,
                    JAVA_LONG, ADDRESS, JAVA_LONG, JAVA_INT));
    /** errno: cursor_next(c, key, key_cap, *key_len, value, value_cap, *value_len) → 1, 0, -1. */
    static final MethodHandle CURSOR_NEXT =
            MapNative.read("terrace_omap_cursor_next", MapNative.NEXT);
    /** open, close, cursor close, destroy. */
    static final NativeMap.Kind KIND =
            MapNative.kind("ordered map", "an", "terrace_omap", "cursor");
}

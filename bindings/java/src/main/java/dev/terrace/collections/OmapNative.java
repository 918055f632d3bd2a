package dev.terrace.collections;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.NativeLibrary;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.VarHandle;

/**
 * The downcall handles of {@code include/terrace_collections.h} (the ordered map,
 * {@code terrace_omap_*}), built when this class is first used (the maps check first that the
 * loaded library has them: {@link NativeOrderedMap#available()}).
 *
 * <p>Invariants: map and cursor pointers are passed as {@code JAVA_LONG} (pointer-sized on the
 * 64-bit Linux ABIs this library ships for); the pool is the heap's arena-bound segment, so an
 * open races with a heap close safely. Calls that fail through errno (open, get, cursor open
 * and next) capture it into the calling thread's own state segment ({@link #STATE}), read with
 * {@link #errno}. By default every call is a plain downcall. Puts and removes always are: a
 * writer may wait for the map's writer lock and for a pool lane, and a lane can be held by a
 * Java thread between calls (a {@code Transaction} by handle), which a critical downcall
 * waiting for it would keep from ever reaching a safepoint. {@value #CRITICAL_PROPERTY}
 * {@code =true} makes the reads (get, len, cursor next) critical downcalls (native memory
 * only): for a library whose readers take no lock (the ordered map's readers validate
 * sequence counters and retry). Against a stand-in library the two measured the same.
 */
final class OmapNative {
    private OmapNative() {}

    /** System property: bind the reads (get, len, cursor next) as critical downcalls. */
    static final String CRITICAL_PROPERTY = "terrace.omap.critical";
    static final boolean CRITICAL = Boolean.getBoolean(CRITICAL_PROPERTY);

    static final int CREATE = 1;
    static final int REVERSE = 1;
    static final int LO_EXCLUSIVE = 2;
    static final int HI_INCLUSIVE = 4;
    /** Longest key the C ABI accepts. */
    static final int MAX_KEY = 255;
    /** Largest inline value size the C ABI accepts (it raises sizes below 8 to 8). */
    static final int MAX_INLINE_VALUE = 254;
    /** Longest name, in bytes of UTF-8. */
    static final int MAX_NAME = 64;

    static final int ENOENT = 2;
    static final int ENOMEM = 12;
    static final int EBUSY = 16;
    static final int EEXIST = 17;
    static final int EINVAL = 22;

    static final StructLayout STATE = Linker.Option.captureStateLayout();
    private static final VarHandle ERRNO =
            STATE.varHandle(MemoryLayout.PathElement.groupElement("errno"));

    /** The errno a capturing call stored in state. */
    static int errno(MemorySegment state) {
        return (int) ERRNO.get(state, 0L);
    }

    private static MethodHandle quickErrno(String name, FunctionDescriptor d) {
        return CRITICAL ? NativeLibrary.criticalCapturingErrno(name, d)
                : NativeLibrary.capturingErrno(name, d);
    }

    /** errno: open(pool, name, max_key, inline_value, flags) → map or 0. */
    static final MethodHandle OPEN = NativeLibrary.capturingErrno("terrace_omap_open",
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, ADDRESS, JAVA_INT, JAVA_INT, JAVA_INT));
    static final MethodHandle CLOSE = NativeLibrary.downcall("terrace_omap_close",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
    /** put(map, key, key_len, value, value_len) → 0 or errno. */
    static final MethodHandle PUT = NativeLibrary.downcall("terrace_omap_put",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG));
    /** errno: get(map, key, key_len, buf, cap) → full value length, or -1. */
    static final MethodHandle GET = quickErrno("terrace_omap_get",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG));
    /** remove(map, key, key_len) → 0, ENOENT or another errno. */
    static final MethodHandle REMOVE = NativeLibrary.downcall("terrace_omap_remove",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG));
    /** errno: len(map) → entries, or UINT64_MAX (-1 here). */
    static final MethodHandle LEN = quickErrno("terrace_omap_len",
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG));
    /** errno: cursor_open(map, lo, lo_len, hi, hi_len, flags) → cursor or 0. */
    static final MethodHandle CURSOR_OPEN = NativeLibrary.capturingErrno(
            "terrace_omap_cursor_open", FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, ADDRESS,
                    JAVA_LONG, ADDRESS, JAVA_LONG, JAVA_INT));
    /** errno: cursor_next(c, key, key_cap, *key_len, value, value_cap, *value_len) → 1, 0, -1. */
    static final MethodHandle CURSOR_NEXT = quickErrno("terrace_omap_cursor_next",
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS, ADDRESS,
                    JAVA_LONG, ADDRESS));
    static final MethodHandle CURSOR_CLOSE = NativeLibrary.downcall("terrace_omap_cursor_close",
            FunctionDescriptor.ofVoid(JAVA_LONG));
    /** destroy(pool, name) → 0 or errno. */
    static final MethodHandle DESTROY = NativeLibrary.downcall("terrace_omap_destroy",
            FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS));
}

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
 * What the map kinds of {@code include/terrace_collections.h} share: its limits and errno
 * values, the captured-errno state, the signatures of the calls (the ordered map's
 * {@code terrace_omap_*} and the hash map's {@code terrace_hmap_*} have the same ones), and
 * how a read is bound. The handles themselves are in {@link OmapNative} and {@link HmapNative},
 * each built when its class is first used (after the map class checked that the loaded library
 * has them).
 *
 * <p>Invariants: map and cursor pointers are passed as {@code JAVA_LONG} (pointer-sized on the
 * 64-bit Linux ABIs this library ships for); the pool is the heap's arena-bound segment, so an
 * open races with a heap close safely. A get is the C ABI's find, which returns a negative
 * errno instead of setting errno (nothing to capture on the hottest call); the calls that fail
 * through errno (open, len, cursor open and next) capture it into the calling thread's own
 * state segment ({@link #STATE}), read with {@link #errno}. By default every call is a plain downcall. Puts and removes always are:
 * a writer may wait for the map's writer lock and for a pool lane, and a lane can be held by a
 * Java thread between calls (a {@code Transaction} by handle), which a critical downcall
 * waiting for it would keep from ever reaching a safepoint. {@value #CRITICAL_PROPERTY}
 * {@code =true} makes the reads (get, len, cursor next, of both kinds) critical downcalls
 * (native memory only): for a library whose readers take no lock (the maps' readers validate
 * sequence counters and retry). Against a stand-in library the two measured the same.
 */
final class MapNative {
    private MapNative() {}

    /** System property: bind the reads (get, len, cursor next) as critical downcalls. */
    static final String CRITICAL_PROPERTY = "terrace.omap.critical";
    static final boolean CRITICAL = Boolean.getBoolean(CRITICAL_PROPERTY);

    /** open flag: create (and name) the map when the name is unbound. */
    static final int CREATE = 1;
    /** Longest key the C ABI accepts. */
    static final int MAX_KEY = 255;
    /** Largest inline value size the C ABI accepts (it raises sizes below 8 to 8). */
    static final int MAX_INLINE_VALUE = 254;
    /** Longest name in the pool's directory, in bytes of UTF-8. */
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

    /** errno: open(pool, name, max_key, inline_value, flags) → map or 0. */
    static final FunctionDescriptor OPEN =
            FunctionDescriptor.of(JAVA_LONG, ADDRESS, ADDRESS, JAVA_INT, JAVA_INT, JAVA_INT);
    /** close(map) → 0 or errno. */
    static final FunctionDescriptor CLOSE = FunctionDescriptor.of(JAVA_INT, JAVA_LONG);
    /** put(map, key, key_len, value, value_len) → 0 or errno. */
    static final FunctionDescriptor PUT =
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG);
    /** find(map, key, key_len, buf, cap) → full value length, or a negative errno. */
    static final FunctionDescriptor FIND =
            FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, ADDRESS, JAVA_LONG, ADDRESS, JAVA_LONG);
    /** remove(map, key, key_len) → 0, ENOENT or another errno. */
    static final FunctionDescriptor REMOVE =
            FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS, JAVA_LONG);
    /** errno: len(map) → entries, or UINT64_MAX (-1 here). */
    static final FunctionDescriptor LEN = FunctionDescriptor.of(JAVA_LONG, JAVA_LONG);
    /** errno: next(cursor, key, key_cap, *key_len, value, value_cap, *value_len) → 1, 0, -1. */
    static final FunctionDescriptor NEXT = FunctionDescriptor.of(JAVA_INT, JAVA_LONG, ADDRESS,
            JAVA_LONG, ADDRESS, ADDRESS, JAVA_LONG, ADDRESS);
    /** cursor_close(cursor). */
    static final FunctionDescriptor CURSOR_CLOSE = FunctionDescriptor.ofVoid(JAVA_LONG);
    /** destroy(pool, name) → 0 or errno. */
    static final FunctionDescriptor DESTROY = FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS);

    /** A find (errno is its negative result, nothing captured): critical as a read. */
    static MethodHandle find(String name) {
        return CRITICAL ? NativeLibrary.critical(name, FIND) : NativeLibrary.downcall(name, FIND);
    }

    /** A read that captures errno: critical when {@value #CRITICAL_PROPERTY} is set. */
    static MethodHandle read(String name, FunctionDescriptor d) {
        return CRITICAL ? NativeLibrary.criticalCapturingErrno(name, d)
                : NativeLibrary.capturingErrno(name, d);
    }

    /**
     * The calls of one map kind made once per map or cursor (see {@link NativeMap.Kind}):
     * prefix_open, prefix_close, prefix_cursor_close and prefix_destroy, where cursor is what
     * the kind calls its cursor ("cursor", "iter").
     */
    static NativeMap.Kind kind(String noun, String article, String prefix, String cursor) {
        return new NativeMap.Kind(noun, article,
                NativeLibrary.capturingErrno(prefix + "_open", OPEN),
                NativeLibrary.downcall(prefix + "_close", CLOSE),
                NativeLibrary.downcall(prefix + "_" + cursor + "_close", CURSOR_CLOSE),
                NativeLibrary.downcall(prefix + "_destroy", DESTROY));
    }
}

package dev.terrace.collections;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.NativeLibrary;
import dev.terrace.pool.AnyHeap;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.NoSuchElementException;
import java.util.function.LongConsumer;

/**
 * One open ordered map of a heap ({@code terrace_omap *}): what {@link ConcurrentLongIndex}
 * and {@link PersistentSortedMap} share. Keys are 1 to {@code max_key} bytes (at most 255),
 * ordered as {@link Arrays#compareUnsigned(byte[], byte[])} orders them. Lifetime, buffers and
 * errors are {@link NativeMap}'s; this adds long values (8 little-endian bytes) and range
 * cursors.
 */
final class NativeOrderedMap extends NativeMap {
    static final ValueLayout.OfLong LONG_LE =
            ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);

    /** Whether the loaded libterrace.so exports the ordered map ({@code terrace_omap_*}). */
    static boolean available() {
        return Availability.AVAILABLE;
    }

    private static final class Availability {
        static final boolean AVAILABLE = NativeLibrary.hasSymbol("terrace_omap_open")
                && NativeLibrary.hasSymbol("terrace_omap_cursor_next")
                && NativeLibrary.hasSymbol("terrace_omap_find")
                && NativeLibrary.hasSymbol("terrace_omap_destroy");
    }

    private NativeOrderedMap(AnyHeap heap, String name, int maxKey, long map) {
        super(OmapNative.KIND, heap, name, maxKey, map);
    }

    /**
     * Opens (create: creates when unbound) the ordered map bound to name. maxKey and
     * inlineValue: the sizes to create with or check against; 0 when opening takes the stored
     * ones.
     */
    static NativeOrderedMap open(AnyHeap heap, String name, int maxKey, int inlineValue,
            boolean create) {
        requireAvailable(available(), "ordered map", "terrace_omap_*");
        return openMap(OmapNative.KIND, heap, name, maxKey, inlineValue, create,
                NativeOrderedMap::new);
    }

    /** Unbinds the ordered map bound to name in heap and frees its entries: see destroyMap. */
    static void destroy(AnyHeap heap, String name) {
        requireAvailable(available(), "ordered map", "terrace_omap_*");
        destroyMap(OmapNative.KIND, heap, name);
    }

    // ------------------------------------------------------------------ the kind's calls

    @Override
    int nativePut(long m, MemorySegment key, long keyLen, MemorySegment value, long valueLen)
            throws Throwable {
        return (int) OmapNative.PUT.invokeExact(m, key, keyLen, value, valueLen);
    }

    @Override
    long nativeFind(long m, MemorySegment key, long keyLen, MemorySegment buf, long cap)
            throws Throwable {
        return (long) OmapNative.FIND.invokeExact(m, key, keyLen, buf, cap);
    }

    @Override
    int nativeRemove(long m, MemorySegment key, long keyLen) throws Throwable {
        return (int) OmapNative.REMOVE.invokeExact(m, key, keyLen);
    }

    @Override
    long nativeLen(MemorySegment state, long m) throws Throwable {
        return (long) OmapNative.LEN.invokeExact(state, m);
    }

    @Override
    int nativeNext(MemorySegment state, long cursor, MemorySegment key, long keyCap,
            MemorySegment keyLen, MemorySegment value, long valueCap, MemorySegment valueLen)
            throws Throwable {
        return (int) OmapNative.CURSOR_NEXT.invokeExact(state, cursor, key, keyCap, keyLen,
                value, valueCap, valueLen);
    }

    /** A range bound, checked: null (open end) or 1 to 255 bytes. */
    private static void checkBound(byte[] bound, String which) {
        if (bound != null && (bound.length == 0 || bound.length > MapNative.MAX_KEY)) {
            throw new IllegalArgumentException(which + " bound of " + bound.length
                    + " bytes: bounds are 1 to " + MapNative.MAX_KEY + " bytes (null: no bound)");
        }
    }

    private IllegalStateException notALong(long length) {
        return new IllegalStateException(description + " holds a value of " + length
                + " bytes where a long (8 bytes) was expected: it was not written as a "
                + "ConcurrentLongIndex");
    }

    // ------------------------------------------------------------------ long values

    /** Puts key → value as 8 little-endian bytes. */
    void putLong(byte[] key, long value) {
        int n = checkKey(key);
        Scratch s = enter();
        try {
            MemorySegment word = s.word;
            word.set(LONG_LE, 0, value);
            int rc = (int) OmapNative.PUT.invokeExact(map, s.key(key), (long) n, word, 8L);
            if (rc != 0) {
                throw failure("put", rc);
            }
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /** key's long value, or absent when key is not in the map. */
    long getLong(byte[] key, long absent) {
        int n = checkKey(key);
        Scratch s = enter();
        try {
            MemorySegment word = s.word;
            long length = (long) OmapNative.FIND.invokeExact(map, s.key(key), (long) n, word,
                    8L);
            if (length == 8) {
                return word.get(LONG_LE, 0);
            }
            if (length < 0) {
                int code = (int) -length;
                if (code == MapNative.ENOENT) {
                    return absent;
                }
                throw failure("get", code);
            }
            throw notALong(length);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /**
     * Removes key and returns the long value it had (read just before, in a separate call),
     * or absent when it was not in the map; removed (if not null) gets the value, after the
     * call, when key was removed.
     */
    long removeLong(byte[] key, long absent, LongConsumer removed) {
        int n = checkKey(key);
        long old;
        Scratch s = enter();
        try {
            MemorySegment k = s.key(key);
            long length = (long) OmapNative.FIND.invokeExact(map, k, (long) n, s.word, 8L);
            if (length < 0) {
                int code = (int) -length;
                if (code == MapNative.ENOENT) {
                    return absent;
                }
                throw failure("get", code);
            }
            long oldValue = s.word.get(LONG_LE, 0);
            int rc = (int) OmapNative.REMOVE.invokeExact(map, k, (long) n);
            if (rc == MapNative.ENOENT) {
                return absent;
            }
            if (rc != 0) {
                throw failure("remove", rc);
            }
            if (length != 8) {
                throw notALong(length);
            }
            old = oldValue;
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
        if (removed != null) {
            removed.accept(old);
        }
        return old;
    }

    // ------------------------------------------------------------------ cursors

    /**
     * A cursor over the keys between lo and hi (null: that end open), ascending or (reverse)
     * descending. Throws IllegalArgumentException when both bounds are given and lo > hi, as
     * LLPL's iterators do; lo == hi is the one key when both bounds are inclusive, else none.
     */
    Cursor openCursor(byte[] lo, boolean loInclusive, byte[] hi, boolean hiInclusive,
            boolean reverse) {
        checkBound(lo, "low");
        checkBound(hi, "high");
        if (lo != null && hi != null) {
            int c = Arrays.compareUnsigned(lo, hi);
            if (c > 0) {
                throw new IllegalArgumentException("the low bound is above the high bound");
            }
        }
        int flags = (reverse ? OmapNative.REVERSE : 0)
                | (lo != null && !loInclusive ? OmapNative.LO_EXCLUSIVE : 0)
                | (hi != null && hiInclusive ? OmapNative.HI_INCLUSIVE : 0);
        Scratch s = enter();
        try {
            // the bounds go through the thread's key buffers: the library copies them at
            // open (its cursor owns its bounds), so they need not outlive this call
            MemorySegment loSeg = MemorySegment.NULL;
            MemorySegment hiSeg = MemorySegment.NULL;
            if (lo != null) {
                loSeg = s.key(lo);
            }
            if (hi != null) {
                MemorySegment.copy(hi, 0, s.hi, JAVA_BYTE, 0, hi.length);
                hiSeg = s.hi;
            }
            long c = (long) OmapNative.CURSOR_OPEN.invokeExact(s.state, map, loSeg,
                    lo == null ? 0L : (long) lo.length, hiSeg, hi == null ? 0L : (long) hi.length,
                    flags);
            if (c == 0) {
                throw failure("opening a cursor", MapNative.errno(s.state));
            }
            return register(c);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /** The first (or, last, the last) key; NoSuchElementException when the map is empty. */
    byte[] endKey(boolean last) {
        Cursor c = openCursor(null, true, null, false, last);
        try {
            Scratch s = scratch();
            if (!c.next(s, s.word.asSlice(0, 0))) {
                throw new NoSuchElementException(description + " is empty");
            }
            byte[] key = new byte[Math.toIntExact(s.keyLen.get(JAVA_LONG, 0))];
            MemorySegment.copy(s.key, JAVA_BYTE, 0, key, 0, key.length);
            return key;
        } finally {
            c.close();
        }
    }

}

package dev.terrace.collections;

import dev.terrace.internal.NativeLibrary;
import dev.terrace.pool.AnyHeap;
import java.lang.foreign.MemorySegment;

/**
 * One open hash map of a heap ({@code terrace_hmap *}): what {@link PersistentHashMap} is
 * over. Keys are 1 to {@code max_key} bytes (at most 255); iteration is in no order, one bucket
 * at a time. Lifetime, buffers and errors are {@link NativeMap}'s.
 */
final class NativeHashMap extends NativeMap {
    /** Whether the loaded libterrace.so exports the hash map ({@code terrace_hmap_*}). */
    static boolean available() {
        return Availability.AVAILABLE;
    }

    private static final class Availability {
        static final boolean AVAILABLE = NativeLibrary.hasSymbol("terrace_hmap_open")
                && NativeLibrary.hasSymbol("terrace_hmap_iter_next")
                && NativeLibrary.hasSymbol("terrace_hmap_find")
                && NativeLibrary.hasSymbol("terrace_hmap_destroy");
    }

    private NativeHashMap(AnyHeap heap, String name, int maxKey, long map) {
        super(HmapNative.KIND, heap, name, maxKey, map);
    }

    /**
     * Opens (create: creates when unbound) the hash map bound to name. maxKey and inlineValue:
     * the sizes to create with or check against; 0 when opening takes the stored ones.
     */
    static NativeHashMap open(AnyHeap heap, String name, int maxKey, int inlineValue,
            boolean create) {
        requireAvailable(available(), "hash map", "terrace_hmap_*");
        return openMap(HmapNative.KIND, heap, name, maxKey, inlineValue, create,
                NativeHashMap::new);
    }

    /** Unbinds the hash map bound to name in heap and frees its entries: see destroyMap. */
    static void destroy(AnyHeap heap, String name) {
        requireAvailable(available(), "hash map", "terrace_hmap_*");
        destroyMap(HmapNative.KIND, heap, name);
    }

    @Override
    int nativePut(long m, MemorySegment key, long keyLen, MemorySegment value, long valueLen)
            throws Throwable {
        return (int) HmapNative.PUT.invokeExact(m, key, keyLen, value, valueLen);
    }

    @Override
    long nativeFind(long m, MemorySegment key, long keyLen, MemorySegment buf, long cap)
            throws Throwable {
        return (long) HmapNative.FIND.invokeExact(m, key, keyLen, buf, cap);
    }

    @Override
    int nativeRemove(long m, MemorySegment key, long keyLen) throws Throwable {
        return (int) HmapNative.REMOVE.invokeExact(m, key, keyLen);
    }

    @Override
    long nativeLen(MemorySegment state, long m) throws Throwable {
        return (long) HmapNative.LEN.invokeExact(state, m);
    }

    @Override
    int nativeNext(MemorySegment state, long cursor, MemorySegment key, long keyCap,
            MemorySegment keyLen, MemorySegment value, long valueCap, MemorySegment valueLen)
            throws Throwable {
        return (int) HmapNative.ITER_NEXT.invokeExact(state, cursor, key, keyCap, keyLen, value,
                valueCap, valueLen);
    }

    /** A cursor over every entry, bucket by bucket (terrace_hmap_iter_open). */
    Cursor openIterator() {
        Scratch s = enter();
        try {
            MemorySegment state = s.state;
            long it = (long) HmapNative.ITER_OPEN.invokeExact(state, map);
            if (it == 0) {
                throw failure("opening an iterator", MapNative.errno(state));
            }
            return register(it);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }
}

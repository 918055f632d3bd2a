package dev.terrace.collections;

import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import java.util.Map;

/**
 * A persistent sorted map from {@code byte[]} keys to {@code byte[]} values in a heap, in the
 * spirit of PCJ's {@code PersistentSortedMap} but thin: the same Terrace ordered map
 * ({@code terrace_omap}) as {@link ConcurrentLongIndex}, with values of any length. Values of
 * up to the map's inline size (fixed when it is created, {@value #DEFAULT_INLINE_VALUE} bytes
 * by default) live in the entry; the library keeps longer ones in an object of their own.
 *
 * <p>Keys are 1 to {@link #maxKeyLength()} bytes, ordered as
 * {@link java.util.Arrays#compareUnsigned(byte[], byte[])} orders them. Every put and remove is
 * crash-atomic on its own, on a heap of any flavour, and is not part of a {@code Transaction}.
 * Reads return copies: {@link #get} a new array, iterators a new key and value per entry. An
 * iterator's value is copied with the entry when it fits the thread's value buffer; a longer
 * one is read again by key right after, so a concurrent writer of that key may be seen there
 * (an entry removed in between is skipped).
 *
 * <p>Every method is thread-safe. After {@link #close()} (or the heap's), every call and every
 * open iterator throws {@link IllegalStateException}. Failures: {@link IllegalArgumentException}
 * for a null, empty or too long key (or bound) or a null value, {@link HeapException} with the
 * errno for what the library reports (12, ENOMEM: the heap is full).
 */
public final class PersistentSortedMap extends BytesMap {
    /** Value bytes kept in the entry unless another size is given at creation. */
    public static final int DEFAULT_INLINE_VALUE = 32;
    /** The longest key any map takes (the C ABI's limit). */
    public static final int MAX_KEY_LENGTH = MapNative.MAX_KEY;
    /** The largest inline value size (the C ABI's limit). */
    public static final int MAX_INLINE_VALUE = MapNative.MAX_INLINE_VALUE;

    /** The map, as the ordered map it is (for the cursors). */
    private final NativeOrderedMap ordered;

    /**
     * Opens the map bound to name in heap, creating it with {@value #DEFAULT_INLINE_VALUE}
     * inline value bytes when the name is unbound (an existing map must have that size).
     */
    public PersistentSortedMap(AnyHeap heap, String name, int maxKeyLength) {
        this(heap, name, maxKeyLength, DEFAULT_INLINE_VALUE);
    }

    /**
     * Opens the map bound to name in heap, creating it when the name is unbound.
     *
     * @param name 1 to 64 bytes of UTF-8
     * @param maxKeyLength the longest key, 1 to {@value #MAX_KEY_LENGTH}
     * @param inlineValueBytes value bytes kept in the entry, 0 to {@value #MAX_INLINE_VALUE}
     *     (the library raises sizes below 8 to 8)
     * @throws IllegalArgumentException for bad sizes or sizes that differ from the existing
     *     map's
     * @throws HeapException if the name is bound to something else (errno 17), the map is open
     *     already in this process (16), or the heap is full (12)
     */
    public PersistentSortedMap(AnyHeap heap, String name, int maxKeyLength,
            int inlineValueBytes) {
        this(NativeOrderedMap.open(heap, name, maxKeyLength, inlineValueBytes, true));
    }

    private PersistentSortedMap(NativeOrderedMap map) {
        super(map);
        this.ordered = map;
    }

    /**
     * Opens the existing map bound to name, with the sizes it was created with.
     *
     * @throws HeapException errno 2 (ENOENT) when no map has that name
     */
    public static PersistentSortedMap open(AnyHeap heap, String name) {
        return new PersistentSortedMap(NativeOrderedMap.open(heap, name, 0, 0, false));
    }

    /**
     * Unbinds the map bound to name and frees its entries and values (it must not be open in
     * this process: errno 16; errno 2 when unbound, 17 when the name is not an ordered map).
     */
    public static void destroy(AnyHeap heap, String name) {
        NativeOrderedMap.destroy(heap, name);
    }

    /** The lowest key; NoSuchElementException when the map is empty. */
    public byte[] firstKey() {
        return ordered.endKey(false);
    }

    /** The highest key; NoSuchElementException when the map is empty. */
    public byte[] lastKey() {
        return ordered.endKey(true);
    }

    /** Every entry, ascending. */
    public AutoCloseableIterator<Map.Entry<byte[], byte[]>> entries() {
        return iterator(null, true, null, false, false);
    }

    /**
     * Entries with keys from from to to, ascending (a null bound: that end is open); from
     * above to throws IllegalArgumentException.
     */
    public AutoCloseableIterator<Map.Entry<byte[], byte[]>> entries(byte[] from,
            boolean fromInclusive, byte[] to, boolean toInclusive) {
        return iterator(from, fromInclusive, to, toInclusive, false);
    }

    /** Every entry, descending. */
    public AutoCloseableIterator<Map.Entry<byte[], byte[]>> descendingEntries() {
        return iterator(null, true, null, false, true);
    }

    /** Entries with keys from to down to from (from is the low bound), descending. */
    public AutoCloseableIterator<Map.Entry<byte[], byte[]>> descendingEntries(byte[] from,
            boolean fromInclusive, byte[] to, boolean toInclusive) {
        return iterator(from, fromInclusive, to, toInclusive, true);
    }

    private AutoCloseableIterator<Map.Entry<byte[], byte[]>> iterator(byte[] lo,
            boolean loInclusive, byte[] hi, boolean hiInclusive, boolean reverse) {
        return new NativeMap.BytesIterator(ordered, ordered.openCursor(lo, loInclusive, hi,
                hiInclusive, reverse));
    }
}

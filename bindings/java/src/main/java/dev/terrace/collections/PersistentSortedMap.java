package dev.terrace.collections;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;

import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import java.lang.foreign.MemorySegment;
import java.util.AbstractMap;
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
public final class PersistentSortedMap implements AutoCloseable {
    /** Value bytes kept in the entry unless another size is given at creation. */
    public static final int DEFAULT_INLINE_VALUE = 32;
    /** The longest key any map takes (the C ABI's limit). */
    public static final int MAX_KEY_LENGTH = OmapNative.MAX_KEY;
    /** The largest inline value size (the C ABI's limit). */
    public static final int MAX_INLINE_VALUE = OmapNative.MAX_INLINE_VALUE;

    private final NativeOrderedMap map;

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
        this.map = map;
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

    /** The name the map is bound to in its heap. */
    public String name() {
        return map.name;
    }

    /**
     * The longest key: as given when opened, or {@value #MAX_KEY_LENGTH} after
     * {@link #open(AnyHeap, String)} (then the library checks the map's own).
     */
    public int maxKeyLength() {
        return map.maxKey;
    }

    /** The value of key as a new array, or null when key is not in the map. */
    public byte[] get(byte[] key) {
        return map.getBytes(key);
    }

    /** Maps key to a copy of value (any length, empty included), replacing any value. */
    public void put(byte[] key, byte[] value) {
        map.putBytes(key, value);
    }

    /** Removes key; false when it was not in the map. */
    public boolean remove(byte[] key) {
        return map.remove(key);
    }

    /** Whether key is in the map. */
    public boolean containsKey(byte[] key) {
        return map.contains(key);
    }

    /** Entries in the map. */
    public long size() {
        return map.size();
    }

    /** Whether the map has no entry. */
    public boolean isEmpty() {
        return map.size() == 0;
    }

    /** The lowest key; NoSuchElementException when the map is empty. */
    public byte[] firstKey() {
        return map.endKey(false);
    }

    /** The highest key; NoSuchElementException when the map is empty. */
    public byte[] lastKey() {
        return map.endKey(true);
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
        return new BytesIterator(map, map.openCursor(lo, loInclusive, hi, hiInclusive,
                reverse));
    }

    private static final class BytesIterator
            extends NativeOrderedMap.EntryIterator<Map.Entry<byte[], byte[]>> {
        private final NativeOrderedMap map;

        BytesIterator(NativeOrderedMap map, NativeOrderedMap.Cursor cursor) {
            super(cursor);
            this.map = map;
            start();
        }

        @Override
        MemorySegment valueBuffer(NativeOrderedMap.Scratch s) {
            return s.value;
        }

        @Override
        Map.Entry<byte[], byte[]> decode(NativeOrderedMap.Scratch s, byte[] key,
                long valueLen, MemorySegment buf) {
            byte[] value;
            if (valueLen <= buf.byteSize()) {
                value = new byte[Math.toIntExact(valueLen)];
                MemorySegment.copy(buf, JAVA_BYTE, 0, value, 0, value.length);
            } else {
                if (valueLen <= NativeOrderedMap.MAX_BUFFERED) {
                    s.valueBuffer(valueLen);
                }
                value = map.reread(key);
                if (value == null) {
                    return null;
                }
            }
            return new AbstractMap.SimpleImmutableEntry<>(key, value);
        }
    }

    /** Closes the map (its open iterators too); closing twice does nothing. */
    @Override
    public void close() {
        map.close();
    }

    /** Whether the map (or its heap) has been closed. */
    public boolean isClosed() {
        return map.isClosed();
    }

    @Override
    public String toString() {
        return "PersistentSortedMap[" + map + "]";
    }
}

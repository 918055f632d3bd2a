package dev.terrace.collections;

import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import java.lang.foreign.MemorySegment;
import java.util.function.Consumer;

/**
 * A persistent ordered index from {@code byte[]} keys to {@code long} values in a heap, shaped
 * as LLPL 1.2's {@code com.intel.pmem.llpl.util.ConcurrentLongART}: {@code put}, {@code get}
 * (0 when absent), {@code remove} (the old value or 0), {@code size}, {@code firstKey},
 * {@code lastKey}, and ascending, descending, head and tail iterators that must be closed
 * unless walked to the end.
 *
 * <p>It is a Terrace ordered map ({@code terrace_omap}) bound to a name in the heap's
 * named-root directory, on a heap of any flavour ({@code Heap}, {@code PersistentHeap},
 * {@code TransactionalHeap}): every put and remove is crash-atomic on its own, whatever the
 * flavour, and is not part of a {@code Transaction} (an abort does not undo it). Values are
 * kept inline in the entry, as 8 little-endian bytes. Keys are 1 to {@link #maxKeyLength()}
 * bytes, ordered as {@link java.util.Arrays#compareUnsigned(byte[], byte[])} orders them.
 *
 * <p>Differences from LLPL: found again by name, not by handle (open the same name after a
 * restart: {@code new ConcurrentLongIndex(heap, name, maxKeyLength)} or
 * {@link #open(AnyHeap, String)}); {@link #put} returns nothing (the C ABI's put does not
 * report the old value; {@link #get} first if it is needed); {@link #remove} reads the old value
 * in a call of its own just before removing, so with a concurrent writer of the same key it
 * may return a value that was replaced in between; a map has to be closed ({@link #close()},
 * or the heap's close, which closes it) and one process opens a name once at a time.
 *
 * <p>Every method is thread-safe. After {@link #close()} (or the heap's), every call and every
 * open iterator throws {@link IllegalStateException}. Failures: {@link IllegalArgumentException}
 * for a null, empty or too long key (or bound), {@link HeapException} with the errno for what
 * the library reports (12, ENOMEM: the heap is full).
 */
public final class ConcurrentLongIndex implements AutoCloseable {
    /** The longest key any map takes (the C ABI's limit). */
    public static final int MAX_KEY_LENGTH = MapNative.MAX_KEY;
    private static final int VALUE_BYTES = Long.BYTES;

    private final NativeOrderedMap map;

    /**
     * Opens the index bound to name in heap, creating it (empty) when the name is unbound.
     *
     * @param name 1 to 64 bytes of UTF-8
     * @param maxKeyLength the longest key, 1 to {@value #MAX_KEY_LENGTH}; fixed when the index
     *     is created, and checked when it is opened
     * @throws IllegalArgumentException for a bad name or length, or a length that differs from
     *     the existing index's
     * @throws HeapException if the name is bound to something else (errno 17), the index is
     *     open already in this process (16), or the heap is full (12)
     * @throws IllegalStateException if the heap is closed
     */
    public ConcurrentLongIndex(AnyHeap heap, String name, int maxKeyLength) {
        this(NativeOrderedMap.open(heap, name, maxKeyLength, VALUE_BYTES, true));
    }

    private ConcurrentLongIndex(NativeOrderedMap map) {
        this.map = map;
    }

    /**
     * Opens the existing index bound to name, with the key length it was created with.
     *
     * @throws HeapException errno 2 (ENOENT) when no index has that name
     */
    public static ConcurrentLongIndex open(AnyHeap heap, String name) {
        return new ConcurrentLongIndex(NativeOrderedMap.open(heap, name, 0, VALUE_BYTES, false));
    }

    /**
     * Unbinds the index bound to name and frees its entries (it must not be open in this
     * process: errno 16; errno 2 when unbound, 17 when the name is not an ordered map).
     */
    public static void destroy(AnyHeap heap, String name) {
        NativeOrderedMap.destroy(heap, name);
    }

    /** Whether the loaded libterrace.so has ordered maps (older builds do not). */
    public static boolean isSupported() {
        return NativeOrderedMap.available();
    }

    /** The name the index is bound to in its heap. */
    public String name() {
        return map.name;
    }

    /**
     * The longest key: as given when opened, or {@value #MAX_KEY_LENGTH} after
     * {@link #open(AnyHeap, String)} (then the library checks the index's own).
     */
    public int maxKeyLength() {
        return map.maxKey;
    }

    /** Maps key to value, replacing any value it had; crash-atomic. */
    public void put(byte[] key, long value) {
        map.putLong(key, value);
    }

    /** The value of key, or 0 when key is not in the index (as LLPL). */
    public long get(byte[] key) {
        return map.getLong(key, 0);
    }

    /** Whether key is in the index (which tells a stored 0 from an absent key). */
    public boolean containsKey(byte[] key) {
        return map.contains(key);
    }

    /** Removes key; returns the value it had, or 0 when it was not in the index. */
    public long remove(byte[] key) {
        return map.removeLong(key, 0, null);
    }

    /**
     * Removes key, as LLPL's {@code remove(key, cleanerFunction)}: cleaner gets the removed
     * value (not called when key was absent). Returns the value, or 0.
     */
    public long remove(byte[] key, Consumer<Long> cleaner) {
        if (cleaner == null) {
            throw new NullPointerException("cleaner function cannot be null");
        }
        return map.removeLong(key, 0, cleaner::accept);
    }

    /** Entries in the index. */
    public long size() {
        return map.size();
    }

    /** The lowest key; NoSuchElementException when the index is empty. */
    public byte[] firstKey() {
        return map.endKey(false);
    }

    /** The highest key; NoSuchElementException when the index is empty. */
    public byte[] lastKey() {
        return map.endKey(true);
    }

    /** Every entry, ascending. */
    public AutoCloseableIterator<Entry> getEntryIterator() {
        return iterator(null, true, null, false, false);
    }

    /**
     * Entries from firstKey to lastKey, ascending; a null bound leaves that end open (LLPL
     * requires both). firstKey above lastKey throws IllegalArgumentException, as LLPL.
     */
    public AutoCloseableIterator<Entry> getEntryIterator(byte[] firstKey, boolean firstInclusive,
            byte[] lastKey, boolean lastInclusive) {
        return iterator(firstKey, firstInclusive, lastKey, lastInclusive, false);
    }

    /** Every entry, descending. */
    public AutoCloseableIterator<Entry> getReverseEntryIterator() {
        return iterator(null, true, null, false, true);
    }

    /**
     * Entries from lastKey down to firstKey (firstKey is the low bound, as in LLPL), descending.
     */
    public AutoCloseableIterator<Entry> getReverseEntryIterator(byte[] firstKey,
            boolean firstInclusive, byte[] lastKey, boolean lastInclusive) {
        return iterator(firstKey, firstInclusive, lastKey, lastInclusive, true);
    }

    /** Entries below (or up to) lastKey, ascending. */
    public AutoCloseableIterator<Entry> getHeadEntryIterator(byte[] lastKey,
            boolean lastInclusive) {
        requireBound(lastKey);
        return iterator(null, true, lastKey, lastInclusive, false);
    }

    /** Entries from (or above) firstKey, ascending. */
    public AutoCloseableIterator<Entry> getTailEntryIterator(byte[] firstKey,
            boolean firstInclusive) {
        requireBound(firstKey);
        return iterator(firstKey, firstInclusive, null, false, false);
    }

    private static void requireBound(byte[] bound) {
        if (bound == null || bound.length == 0) {
            throw new IllegalArgumentException("the bound is null or empty");
        }
    }

    private AutoCloseableIterator<Entry> iterator(byte[] lo, boolean loInclusive, byte[] hi,
            boolean hiInclusive, boolean reverse) {
        return new LongIterator(map, map.openCursor(lo, loInclusive, hi, hiInclusive, reverse));
    }

    private static final class LongIterator extends NativeMap.EntryIterator<Entry> {
        private final NativeOrderedMap map;

        LongIterator(NativeOrderedMap map, NativeMap.Cursor cursor) {
            super(cursor);
            this.map = map;
            start();
        }

        @Override
        MemorySegment valueBuffer(NativeMap.Scratch s) {
            return s.word;
        }

        @Override
        Entry decode(NativeMap.Scratch s, byte[] key, long valueLen, MemorySegment buf) {
            if (valueLen != VALUE_BYTES) {
                throw new IllegalStateException(map + " holds a value of " + valueLen
                        + " bytes where a long was expected");
            }
            return new Entry(key, buf.get(NativeOrderedMap.LONG_LE, 0));
        }
    }

    /** Closes the index (its open iterators too); closing twice does nothing. */
    @Override
    public void close() {
        map.close();
    }

    /** Whether the index (or its heap) has been closed. */
    public boolean isClosed() {
        return map.isClosed();
    }

    @Override
    public String toString() {
        return "ConcurrentLongIndex[" + map + "]";
    }

    /** An entry: a key and its value, as LLPL's {@code LongART.Entry}. */
    public static final class Entry {
        private final byte[] key;
        private final long value;

        Entry(byte[] key, long value) {
            this.key = key;
            this.value = value;
        }

        /** The key (the iterator's own copy). */
        public byte[] getKey() {
            return key;
        }

        /** The value. */
        public long getValue() {
            return value;
        }

        @Override
        public String toString() {
            return java.util.HexFormat.of().formatHex(key) + "=" + value;
        }
    }
}

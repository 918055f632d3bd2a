package dev.terrace.collections;

import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import java.util.Map;

/**
 * A persistent hash map from {@code byte[]} keys to {@code byte[]} values in a heap, in the
 * spirit of PCJ's {@code PersistentHashMap} but thin: a Terrace hash map
 * ({@code terrace_hmap}: linear hashing, grown one bucket split at a time, so no operation
 * rehashes the whole map) bound to a name in the heap's named-root directory. Use it for point
 * lookups; {@link PersistentSortedMap} when order or ranges matter. Values of up to the map's
 * inline size (fixed when it is created, {@value #DEFAULT_INLINE_VALUE} bytes by default) live
 * in the entry; the library keeps longer ones in an object of their own.
 *
 * <p>Keys are 1 to {@link #maxKeyLength()} bytes, compared as bytes. Every put and remove is
 * crash-atomic on its own, on a heap of any flavour, and is not part of a {@code Transaction}
 * (an abort does not undo it). Reads return copies: {@link #get} a new array, iterators a new
 * key and value per entry. {@link #entries()} walks the map bucket by bucket, in no order;
 * with writers running meanwhile an entry changed during the walk may or may not be seen, and
 * one moved by a bucket split may be seen twice. An iterator's value is copied with the entry
 * when it fits the thread's value buffer; a longer one is read again by key right after, so a
 * concurrent writer of that key may be seen there (an entry removed in between is skipped).
 *
 * <p>Found again by name after a restart ({@code new PersistentHashMap(heap, name, maxKey)} or
 * {@link #open(AnyHeap, String)}); one process opens a name once at a time, and a map has to
 * be closed ({@link #close()}, or the heap's close, which closes it).
 *
 * <p>Every method is thread-safe. After {@link #close()} (or the heap's), every call and every
 * open iterator throws {@link IllegalStateException}. Failures: {@link IllegalArgumentException}
 * for a null, empty or too long key or a null value, {@link HeapException} with the errno for
 * what the library reports (12, ENOMEM: the heap is full).
 */
public final class PersistentHashMap extends BytesMap {
    /** Value bytes kept in the entry unless another size is given at creation. */
    public static final int DEFAULT_INLINE_VALUE = 32;
    /** The longest key any map takes (the C ABI's limit). */
    public static final int MAX_KEY_LENGTH = MapNative.MAX_KEY;
    /** The largest inline value size (the C ABI's limit). */
    public static final int MAX_INLINE_VALUE = MapNative.MAX_INLINE_VALUE;

    /** The map, as the hash map it is (for its iterator). */
    private final NativeHashMap hashed;

    /**
     * Opens the hash map bound to name in heap, creating it with
     * {@value #DEFAULT_INLINE_VALUE} inline value bytes when the name is unbound (an existing
     * map must have that size).
     */
    public PersistentHashMap(AnyHeap heap, String name, int maxKeyLength) {
        this(heap, name, maxKeyLength, DEFAULT_INLINE_VALUE);
    }

    /**
     * Opens the hash map bound to name in heap, creating it when the name is unbound.
     *
     * @param name 1 to 64 bytes of UTF-8
     * @param maxKeyLength the longest key, 1 to {@value #MAX_KEY_LENGTH}
     * @param inlineValueBytes value bytes kept in the entry, 0 to {@value #MAX_INLINE_VALUE}
     *     (the library raises sizes below 8 to 8)
     * @throws IllegalArgumentException for a bad name, bad sizes, or sizes that differ from
     *     the existing map's
     * @throws HeapException if the name is bound to something else (errno 17: an ordered map
     *     or an object), the map is open already in this process (16), or the heap is full (12)
     * @throws IllegalStateException if the heap is closed
     * @throws UnsupportedOperationException if the loaded libterrace.so has no hash map
     */
    public PersistentHashMap(AnyHeap heap, String name, int maxKeyLength,
            int inlineValueBytes) {
        this(NativeHashMap.open(heap, name, maxKeyLength, inlineValueBytes, true));
    }

    private PersistentHashMap(NativeHashMap map) {
        super(map);
        this.hashed = map;
    }

    /**
     * Opens the existing hash map bound to name, with the sizes it was created with.
     *
     * @throws HeapException errno 2 (ENOENT) when no map has that name, 17 when the name is
     *     bound to something that is not a hash map
     */
    public static PersistentHashMap open(AnyHeap heap, String name) {
        return new PersistentHashMap(NativeHashMap.open(heap, name, 0, 0, false));
    }

    /**
     * Unbinds the hash map bound to name and frees its entries and values (it must not be open
     * in this process: errno 16; errno 2 when unbound, 17 when the name is not a hash map). A
     * crash midway leaves objects no name reaches, which {@code terrace pool check --sweep}
     * frees.
     */
    public static void destroy(AnyHeap heap, String name) {
        NativeHashMap.destroy(heap, name);
    }

    /** Whether the loaded libterrace.so has hash maps (older builds do not). */
    public static boolean isSupported() {
        return NativeHashMap.available();
    }

    /**
     * Every entry, in no order (see the class comment). Close the iterator unless it is walked
     * to the end.
     */
    public AutoCloseableIterator<Map.Entry<byte[], byte[]>> entries() {
        return new NativeMap.BytesIterator(hashed, hashed.openIterator());
    }
}

package dev.terrace.collections;

import dev.terrace.pool.HeapException;

/**
 * What {@link PersistentSortedMap} and {@link PersistentHashMap} share: a named map from
 * {@code byte[]} keys to {@code byte[]} values in a heap, its point operations and its
 * lifetime. The public methods are the subclasses' (this class is not part of the API).
 *
 * <p>Every method is thread-safe. After {@link #close()} (or the heap's), every call and every
 * open iterator throws {@link IllegalStateException}. Failures: {@link IllegalArgumentException}
 * for a null, empty or too long key or a null value, {@link HeapException} with the errno for
 * what the library reports (12, ENOMEM: the heap is full).
 */
abstract sealed class BytesMap implements AutoCloseable
        permits PersistentSortedMap, PersistentHashMap {
    final NativeMap map;

    BytesMap(NativeMap map) {
        this.map = map;
    }

    /** The name the map is bound to in its heap. */
    public String name() {
        return map.name;
    }

    /**
     * The longest key: as given when opened, or 255 after {@code open(heap, name)} (then the
     * library checks the map's own).
     */
    public int maxKeyLength() {
        return map.maxKey;
    }

    /** The value of key as a new array, or null when key is not in the map. */
    public byte[] get(byte[] key) {
        return map.getBytes(key);
    }

    /**
     * Maps key to a copy of value (any length, empty included), replacing any value;
     * crash-atomic, and not part of a {@code Transaction}.
     */
    public void put(byte[] key, byte[] value) {
        map.putBytes(key, value);
    }

    /** Removes key (crash-atomic); false when it was not in the map. */
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
        return getClass().getSimpleName() + "[" + map + "]";
    }
}

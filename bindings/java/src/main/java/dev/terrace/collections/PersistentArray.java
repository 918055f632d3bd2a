package dev.terrace.collections;

import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;

/**
 * A persistent array in a heap: a fixed number of fixed-size elements, bound to a name in the
 * heap's named-root directory, in the spirit of PCJ's {@code PersistentArray} and
 * {@code PersistentLongArray}. The elements are bytes ({@link #get(long)}, {@link #set}) or,
 * in an array of 8-byte elements, longs ({@link #getLong}, {@link #setLong}, little-endian).
 * The array is created zeroed and never changes size.
 *
 * <p>Every set is crash-atomic on its own, on a heap of any flavour, and is not part of a
 * {@code Transaction} (an abort does not undo it): one 8-byte element is one atomic store; a
 * run of elements ({@code set} with several elements' bytes, at most
 * {@value #MAX_SET_BYTES} bytes) is one library transaction, so after a crash all of the run
 * holds the new bytes or none does. Reads are lock-free and never return a torn element, and
 * a read of a run sees each concurrent run write whole or not at all.
 *
 * <p>Found again by name after a restart ({@code new PersistentArray(heap, name, length,
 * elementSize)} or {@link #open(AnyHeap, String)}); one process opens a name once at a time,
 * and an array has to be closed ({@link #close()}, or the heap's close, which closes it).
 *
 * <p>Every method is thread-safe. After {@link #close()} (or the heap's), every call throws
 * {@link IllegalStateException}. Failures: {@link IndexOutOfBoundsException} for an index or
 * run outside the array, {@link IllegalArgumentException} for a buffer that is not whole
 * elements, {@link UnsupportedOperationException} for the long calls on other element sizes,
 * {@link HeapException} with the errno for what the library reports.
 */
public final class PersistentArray implements AutoCloseable {
    /** The largest element, in bytes. */
    public static final int MAX_ELEMENT_SIZE = NativeArray.MAX_ELEMENT;
    /** Most bytes one {@link #set} writes. */
    public static final int MAX_SET_BYTES = NativeArray.MAX_RANGE_BYTES;

    private final NativeArray array;

    /**
     * Opens the array bound to name in heap, creating it (zeroed) when the name is unbound.
     *
     * @param name 1 to 64 bytes of UTF-8
     * @param length elements, at least 1; fixed at creation and checked when opened
     * @param elementSize bytes per element, 1 to {@value #MAX_ELEMENT_SIZE}; likewise
     * @throws IllegalArgumentException for a bad name or sizes, or sizes that differ from the
     *     existing array's or do not fit the heap
     * @throws HeapException if the name is bound to something else (errno 17), the array is
     *     open already in this process (16), or the heap is full (12)
     * @throws IllegalStateException if the heap is closed
     * @throws UnsupportedOperationException if the loaded libterrace.so has no arrays
     */
    public PersistentArray(AnyHeap heap, String name, long length, int elementSize) {
        this(NativeArray.open(heap, name, length, elementSize, true));
    }

    private PersistentArray(NativeArray array) {
        this.array = array;
    }

    /**
     * Opens the existing array bound to name, with the sizes it was created with.
     *
     * @throws HeapException errno 2 (ENOENT) when no array has that name, 17 when the name is
     *     bound to something that is not an array
     */
    public static PersistentArray open(AnyHeap heap, String name) {
        return new PersistentArray(NativeArray.open(heap, name, 0, 0, false));
    }

    /**
     * Unbinds the array bound to name and frees it (it must not be open in this process:
     * errno 16; errno 2 when unbound, 17 when the name is not an array).
     */
    public static void destroy(AnyHeap heap, String name) {
        NativeArray.destroy(heap, name);
    }

    /** Whether the loaded libterrace.so has arrays (older builds do not). */
    public static boolean isSupported() {
        return NativeArray.available();
    }

    /** The name the array is bound to in its heap. */
    public String name() {
        return array.name;
    }

    /** Elements in the array. */
    public long length() {
        return array.length;
    }

    /** Bytes per element. */
    public int elementSize() {
        return array.elementSize;
    }

    /** Element i, as a new array of {@link #elementSize()} bytes. */
    public byte[] get(long i) {
        byte[] out = new byte[array.elementSize];
        array.get(i, out);
        return out;
    }

    /** Copies the elements from first on into dst, whose length is whole elements. */
    public void get(long first, byte[] dst) {
        array.get(first, dst);
    }

    /**
     * Writes value (one element's bytes, or several elements' for a run, at most
     * {@value #MAX_SET_BYTES}) from element first on; crash-atomic.
     */
    public void set(long first, byte[] value) {
        array.set(first, value);
    }

    /** Element i of an array of 8-byte elements, as a little-endian long. */
    public long getLong(long i) {
        return array.getLong(i);
    }

    /** Sets element i of an array of 8-byte elements: one atomic store. */
    public void setLong(long i, long value) {
        array.setLong(i, value);
    }

    /** Closes the array; closing twice does nothing. */
    @Override
    public void close() {
        array.close();
    }

    /** Whether the array (or its heap) has been closed. */
    public boolean isClosed() {
        return array.isClosed();
    }

    @Override
    public String toString() {
        return "PersistentArray[" + array + "]";
    }
}

package dev.terrace.collections;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.HeapAccess;
import dev.terrace.internal.NativeLibrary;
import dev.terrace.pool.AnyHeap;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.nio.ByteOrder;
import java.util.Objects;

/**
 * One open array of a heap ({@code terrace_array *} of {@code include/terrace_collections.h}):
 * what {@link PersistentArray} runs on. Opened under the heap's lock and registered with it,
 * so the heap's close closes it first; calls in flight are waited for as for every
 * {@link NativeCollection}. Elements travel through the thread's value buffers (up to
 * {@value NativeCollection#MAX_BUFFERED} bytes; a longer run gets an arena of its own). get and
 * set return an errno directly: nothing is captured.
 */
final class NativeArray extends NativeCollection {
    /** Largest element (the C ABI's limit). */
    static final int MAX_ELEMENT = 4096;
    /** Most bytes one set writes (one transaction; the C ABI's limit). */
    static final int MAX_RANGE_BYTES = 16 << 10;
    static final ValueLayout.OfLong LONG_LE =
            JAVA_LONG.withOrder(ByteOrder.LITTLE_ENDIAN).withByteAlignment(1);
    private static final int CREATE = 1;

    /** Whether the loaded library has arrays. */
    static boolean available() {
        return Availability.AVAILABLE;
    }

    private static final class Availability {
        static final boolean AVAILABLE = NativeLibrary.hasSymbol("terrace_array_open")
                && NativeLibrary.hasSymbol("terrace_array_destroy");
    }

    /** The calls, bound when first used (after the availability check). */
    private static final class Calls {
        /** errno: open(pool, name, length, element_size, flags) → array or 0. */
        static final MethodHandle OPEN = NativeLibrary.capturingErrno("terrace_array_open",
                FunctionDescriptor.of(JAVA_LONG, ADDRESS, ADDRESS, JAVA_LONG, JAVA_INT,
                        JAVA_INT));
        /** close(array) → 0 or errno. */
        static final MethodHandle CLOSE = NativeLibrary.downcall("terrace_array_close",
                FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
        /** len(array) → elements. */
        static final MethodHandle LEN = NativeLibrary.downcall("terrace_array_len",
                FunctionDescriptor.of(JAVA_LONG, JAVA_LONG));
        /** element_size(array) → bytes. */
        static final MethodHandle ELEMENT = NativeLibrary.downcall(
                "terrace_array_element_size", FunctionDescriptor.of(JAVA_INT, JAVA_LONG));
        /** get(array, index, buf, len) → 0 or errno. */
        static final MethodHandle GET = NativeLibrary.downcall("terrace_array_get",
                FunctionDescriptor.of(JAVA_INT, JAVA_LONG, JAVA_LONG, ADDRESS, JAVA_LONG));
        /** set(array, index, data, len) → 0 or errno. */
        static final MethodHandle SET = NativeLibrary.downcall("terrace_array_set",
                FunctionDescriptor.of(JAVA_INT, JAVA_LONG, JAVA_LONG, ADDRESS, JAVA_LONG));
        /** destroy(pool, name) → 0 or errno. */
        static final MethodHandle DESTROY = NativeLibrary.downcall("terrace_array_destroy",
                FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS));
    }

    /** The native array. */
    private final long array;
    final long length;
    final int elementSize;

    private NativeArray(AnyHeap heap, String name, long array, long length, int elementSize) {
        super(heap, name, "array '" + name + "' of heap " + heap.path());
        this.array = array;
        this.length = length;
        this.elementSize = elementSize;
    }

    static void requireAvailable() {
        NativeMap.requireAvailable(available(), "arrays", "terrace_array_*");
    }

    /**
     * Opens the array bound to name; creates it (zeroed) when unbound and create. length and
     * elementSize: 0 accepts an existing array's.
     */
    static NativeArray open(AnyHeap heap, String name, long length, int elementSize,
            boolean create) {
        Objects.requireNonNull(heap, "heap");
        requireAvailable();
        NativeMap.checkName(name, "array");
        long minLength = create ? 1 : 0;
        if (length < minLength) {
            throw new IllegalArgumentException("length " + length + " is below " + minLength);
        }
        if (elementSize < minLength || elementSize > MAX_ELEMENT) {
            throw new IllegalArgumentException("element size " + elementSize + " is not in "
                    + minLength + ".." + MAX_ELEMENT);
        }
        HeapAccess.Bridge bridge = HeapAccess.bridge();
        return bridge.attach(heap, () -> {
            String what = "opening array '" + name + "' of heap " + heap.path() + " ("
                    + length + " elements of " + elementSize + " bytes"
                    + (create ? ", create" : "") + ")";
            int code;
            long a;
            long len;
            int element;
            try (Arena args = Arena.ofConfined()) {
                MemorySegment state = args.allocate(MapNative.STATE);
                a = (long) Calls.OPEN.invokeExact(state, bridge.pool(heap),
                        args.allocateFrom(name), length, elementSize, create ? CREATE : 0);
                code = a == 0 ? MapNative.errno(state) : 0;
                len = a == 0 ? 0 : (long) Calls.LEN.invokeExact(a);
                element = a == 0 ? 0 : (int) Calls.ELEMENT.invokeExact(a);
            } catch (Throwable t) {
                throw NativeLibrary.rethrow(t);
            }
            if (a == 0) {
                String why = switch (code) {
                    case MapNative.ENOENT -> "no array has that name (give sizes to create it)";
                    case MapNative.EEXIST -> "the name is bound to something that is not an "
                            + "array";
                    case MapNative.EBUSY -> "this process has it open already: use that "
                            + "instance, or close it first";
                    case MapNative.EINVAL -> "the library refused the sizes (other than the "
                            + "existing array's, or too large for the heap?)";
                    default -> null;
                };
                throw NativeMap.failure(what, code, why);
            }
            return new NativeArray(heap, name, a, len, element);
        });
    }

    /** Unbinds the array bound to name and frees it (not open in this process). */
    static void destroy(AnyHeap heap, String name) {
        Objects.requireNonNull(heap, "heap");
        requireAvailable();
        NativeMap.checkName(name, "array");
        String what = "destroying array '" + name + "' of heap " + heap.path();
        HeapAccess.Bridge bridge = HeapAccess.bridge();
        AutoCloseable done = bridge.attach(heap, () -> {
            int rc;
            try (Arena args = Arena.ofConfined()) {
                rc = (int) Calls.DESTROY.invokeExact(bridge.pool(heap), args.allocateFrom(name));
            } catch (Throwable t) {
                throw NativeLibrary.rethrow(t);
            }
            if (rc != 0) {
                String why = switch (rc) {
                    case MapNative.ENOENT -> "no array has that name";
                    case MapNative.EEXIST -> "the name is bound to something that is not an "
                            + "array";
                    case MapNative.EBUSY -> "the array is open in this process: close it first";
                    default -> null;
                };
                throw NativeMap.failure(what, rc, why);
            }
            return () -> { };
        });
        bridge.detach(heap, done);
    }

    @Override
    int nativeClose() throws Throwable {
        return (int) Calls.CLOSE.invokeExact(array);
    }

    /** Throws IndexOutOfBoundsException unless elements first..first+count exist. */
    private void checkRange(long first, long count) {
        if (first < 0 || count < 0 || first >= length || count > length - first) {
            throw new IndexOutOfBoundsException("elements " + first + ".." + (first + count)
                    + " are outside 0.." + length + " of " + description);
        }
    }

    /** The whole elements in bytes, checked: a positive multiple of the element size. */
    private long wholeElements(int bytes) {
        if (bytes == 0 || bytes % elementSize != 0) {
            throw new IllegalArgumentException(bytes + " bytes is not a whole number of "
                    + elementSize + "-byte elements (" + description + ")");
        }
        return bytes / elementSize;
    }

    /** Copies the elements from first on into dst (whole elements). */
    void get(long first, byte[] dst) {
        Objects.requireNonNull(dst, "dst");
        checkRange(first, wholeElements(dst.length));
        Scratch s = enter();
        try {
            MemorySegment buf = dst.length <= MAX_BUFFERED ? s.valueBuffer(dst.length)
                    : Arena.ofAuto().allocate(dst.length, 8);
            check("get", (int) Calls.GET.invokeExact(array, first, buf, (long) dst.length));
            MemorySegment.copy(buf, JAVA_BYTE, 0, dst, 0, dst.length);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /** Element i of 8 bytes, little-endian. */
    long getLong(long i) {
        requireWords();
        checkRange(i, 1);
        Scratch s = enter();
        try {
            check("get", (int) Calls.GET.invokeExact(array, i, s.word, 8L));
            return s.word.get(LONG_LE, 0);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /** Writes data (whole elements, at most MAX_RANGE_BYTES) from element first on. */
    void set(long first, byte[] data) {
        Objects.requireNonNull(data, "data");
        checkRange(first, wholeElements(data.length));
        if (data.length > MAX_RANGE_BYTES) {
            throw new IllegalArgumentException(data.length + " bytes in one set: at most "
                    + MAX_RANGE_BYTES + " (" + description + ")");
        }
        Scratch s = enter();
        try {
            check("set", (int) Calls.SET.invokeExact(array, first, s.input(data),
                    (long) data.length));
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /** Sets element i of 8 bytes to value (little-endian): one atomic store. */
    void setLong(long i, long value) {
        requireWords();
        checkRange(i, 1);
        Scratch s = enter();
        try {
            s.word.set(LONG_LE, 0, value);
            check("set", (int) Calls.SET.invokeExact(array, i, s.word, 8L));
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    private void requireWords() {
        if (elementSize != 8) {
            throw new UnsupportedOperationException(description + " has " + elementSize
                    + "-byte elements: getLong and setLong need 8");
        }
    }

    private void check(String op, int rc) {
        if (rc != 0) {
            throw NativeMap.failure(op + " on " + description, rc,
                    rc == MapNative.ENOMEM ? "the heap is full" : null);
        }
    }

    @Override
    public String toString() {
        return description + (isClosed() ? " (closed)" : "");
    }
}

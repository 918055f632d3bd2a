package dev.terrace.collections;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.HeapAccess;
import dev.terrace.internal.NativeLibrary;
import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.NoSuchElementException;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.LongConsumer;

/**
 * One open ordered map of a heap ({@code terrace_omap *}): what {@link ConcurrentLongIndex}
 * and {@link PersistentSortedMap} share. Keys are 1 to {@code max_key} bytes (at most 255),
 * ordered as {@link Arrays#compareUnsigned(byte[], byte[])} orders them.
 *
 * <p>Lifetime: opened under the heap's lock and registered with it, so the heap's
 * {@code close()} closes the map first. Calls in flight are counted; {@link #close()} marks the
 * map closed, waits for them, closes every cursor still open (their iterators then throw
 * {@link IllegalStateException}) and then the native map, so no call overlaps the native close
 * (which the C ABI forbids) and no cursor outlives its map. Every call after that throws
 * {@link IllegalStateException}.
 *
 * <p>Arguments travel through per-thread native buffers (two key buffers of 256 bytes, an
 * 8-byte word for a long value, value buffers that grow to the largest value the thread
 * handled, up to {@value #MAX_BUFFERED} bytes; larger values use an arena of their own), so a
 * get or put is one downcall and allocates nothing native. The buffers are in automatic
 * arenas: the GC frees them with their thread.
 *
 * <p>Errors: a key or bound the binding can check (null, empty, longer than the map's maximum)
 * throws {@link IllegalArgumentException} before any native call, as does EINVAL from the
 * library (arguments it refused: sizes that do not match an existing map's); every other errno
 * is a {@link HeapException} carrying it and {@code terrace_last_error()}'s text (ENOMEM: the
 * pool is full; ENOENT from an open without create; EEXIST: the name is bound to something
 * else; EBUSY: this process has the map open already).
 */
final class NativeOrderedMap implements AutoCloseable {
    static final ValueLayout.OfLong LONG_LE =
            ValueLayout.JAVA_LONG_UNALIGNED.withOrder(ByteOrder.LITTLE_ENDIAN);
    private static final long INITIAL_VALUE_BUFFER = 256;
    /** Largest value kept in a thread's buffers; larger ones get an arena of their own. */
    static final long MAX_BUFFERED = 1L << 20;
    private static final int SPINS_BEFORE_YIELD = 1 << 10;
    /** Bytes of a key buffer: the longest key the C ABI takes, and one. */
    private static final int KEY_BUFFER = OmapNative.MAX_KEY + 1;

    private static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);

    /** Whether the loaded libterrace.so exports the ordered map ({@code terrace_omap_*}). */
    static boolean available() {
        return Availability.AVAILABLE;
    }

    private static final class Availability {
        static final boolean AVAILABLE = NativeLibrary.hasSymbol("terrace_omap_open")
                && NativeLibrary.hasSymbol("terrace_omap_cursor_next")
                && NativeLibrary.hasSymbol("terrace_omap_destroy");
    }

    /** One thread's native buffers; see the class comment. */
    static final class Scratch {
        final MemorySegment state;
        final MemorySegment key;
        /** A second key buffer: a cursor's high bound. */
        final MemorySegment hi;
        final MemorySegment keyLen;
        final MemorySegment valueLen;
        final MemorySegment word;
        MemorySegment value;
        private MemorySegment in;

        Scratch() {
            Arena arena = Arena.ofAuto();
            MemorySegment fixed = arena.allocate(2 * KEY_BUFFER + 24, 16);
            key = fixed.asSlice(0, KEY_BUFFER);
            hi = fixed.asSlice(KEY_BUFFER, KEY_BUFFER);
            keyLen = fixed.asSlice(2 * KEY_BUFFER, 8);
            valueLen = fixed.asSlice(2 * KEY_BUFFER + 8, 8);
            word = fixed.asSlice(2 * KEY_BUFFER + 16, 8);
            state = arena.allocate(OmapNative.STATE);
            value = arena.allocate(INITIAL_VALUE_BUFFER, 8);
            in = value;
        }

        /** The key buffer holding key. */
        MemorySegment key(byte[] k) {
            MemorySegment.copy(k, 0, key, JAVA_BYTE, 0, k.length);
            return key;
        }

        /** The value output buffer, grown to at least needed bytes. */
        MemorySegment valueBuffer(long needed) {
            if (value.byteSize() < needed) {
                value = Arena.ofAuto().allocate(Math.max(needed, value.byteSize() * 2), 8);
            }
            return value;
        }

        /** A buffer holding v (at most MAX_BUFFERED bytes). */
        MemorySegment input(byte[] v) {
            if (in.byteSize() < v.length) {
                in = Arena.ofAuto().allocate(Math.max(v.length, in.byteSize() * 2), 8);
            }
            MemorySegment.copy(v, 0, in, JAVA_BYTE, 0, v.length);
            return in;
        }
    }

    static Scratch scratch() {
        return SCRATCH.get();
    }

    final AnyHeap heap;
    final String name;
    /** Longest key: as given at open, or {@value OmapNative#MAX_KEY} when opened with 0. */
    final int maxKey;
    private final long map;
    private final String description;
    private final LongAdder inFlight = new LongAdder();
    private final Set<Cursor> cursors = ConcurrentHashMap.newKeySet();
    private volatile boolean closed;

    private NativeOrderedMap(AnyHeap heap, String name, int maxKey, long map) {
        this.heap = heap;
        this.name = name;
        this.maxKey = maxKey != 0 ? maxKey : OmapNative.MAX_KEY;
        this.map = map;
        this.description = "ordered map '" + name + "' of heap " + heap.path();
    }

    // ------------------------------------------------------------------ open, close

    /**
     * Opens (create: creates when unbound) the map bound to name. maxKey and inlineValue: the
     * sizes to create with or check against; 0 when opening takes the stored ones.
     */
    static NativeOrderedMap open(AnyHeap heap, String name, int maxKey, int inlineValue,
            boolean create) {
        Objects.requireNonNull(heap, "heap");
        checkName(name);
        int minKey = create ? 1 : 0;
        if (maxKey < minKey || maxKey > OmapNative.MAX_KEY) {
            throw new IllegalArgumentException("max key length " + maxKey + " is not in "
                    + minKey + ".." + OmapNative.MAX_KEY);
        }
        if (inlineValue < 0 || inlineValue > OmapNative.MAX_INLINE_VALUE) {
            throw new IllegalArgumentException("inline value size " + inlineValue
                    + " is not in 0.." + OmapNative.MAX_INLINE_VALUE);
        }
        requireAvailable();
        HeapAccess.Bridge bridge = HeapAccess.bridge();
        return bridge.attach(heap, () -> {
            int code;
            long m;
            try (Arena args = Arena.ofConfined()) {
                MemorySegment cName = args.allocateFrom(name);
                MemorySegment state = args.allocate(OmapNative.STATE);
                m = (long) OmapNative.OPEN.invokeExact(state, bridge.pool(heap), cName, maxKey,
                        inlineValue, create ? OmapNative.CREATE : 0);
                code = m == 0 ? OmapNative.errno(state) : 0;
            } catch (Throwable t) {
                throw NativeLibrary.rethrow(t);
            }
            if (m == 0) {
                String what = "opening ordered map '" + name + "' of heap " + heap.path()
                        + " (max key " + maxKey + ", inline value " + inlineValue
                        + (create ? ", create" : "") + ")";
                String why = switch (code) {
                    case OmapNative.ENOENT -> "no map has that name (open it with sizes to "
                            + "create it)";
                    case OmapNative.EEXIST -> "the name is bound to something that is not an "
                            + "ordered map";
                    case OmapNative.EBUSY -> "this process has it open already: use that "
                            + "instance, or close it first";
                    case OmapNative.EINVAL -> "the library refused the arguments (sizes that "
                            + "differ from the existing map's?)";
                    default -> null;
                };
                throw failure(what, code, why);
            }
            return new NativeOrderedMap(heap, name, maxKey, m);
        });
    }

    private static void checkName(String name) {
        if (name == null) {
            throw new IllegalArgumentException("map name is null");
        }
        int nameBytes = name.getBytes(StandardCharsets.UTF_8).length;
        if (nameBytes == 0 || nameBytes > OmapNative.MAX_NAME || name.indexOf('\0') >= 0) {
            throw new IllegalArgumentException("map name \"" + name + "\" is " + nameBytes
                    + " bytes of UTF-8" + (name.indexOf('\0') >= 0 ? " with a NUL" : "")
                    + ": names are 1 to " + OmapNative.MAX_NAME + " bytes, no NUL");
        }
    }

    private static void requireAvailable() {
        if (!available()) {
            throw new UnsupportedOperationException("the loaded libterrace.so has no ordered "
                    + "map (no terrace_omap_* symbols): it was built before "
                    + "include/terrace_collections.h");
        }
    }

    /**
     * Unbinds the map bound to name in heap and frees its entries (terrace_omap_destroy); a
     * crash midway leaves unreachable objects that {@code terrace pool check --sweep} frees.
     */
    static void destroy(AnyHeap heap, String name) {
        Objects.requireNonNull(heap, "heap");
        checkName(name);
        requireAvailable();
        HeapAccess.Bridge bridge = HeapAccess.bridge();
        int rc;
        try (Arena args = Arena.ofConfined()) {
            rc = (int) OmapNative.DESTROY.invokeExact(bridge.pool(heap), args.allocateFrom(name));
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (rc != 0) {
            String why = switch (rc) {
                case OmapNative.ENOENT -> "no map has that name";
                case OmapNative.EEXIST -> "the name is bound to something that is not an "
                        + "ordered map";
                case OmapNative.EBUSY -> "the map is open in this process: close it first";
                default -> null;
            };
            throw failure("destroying ordered map '" + name + "' of heap " + heap.path(), rc,
                    why);
        }
    }

    /**
     * Closes the map: waits for calls in flight, closes open cursors, then the native map.
     * Closing twice does nothing.
     */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        for (int spins = 0; inFlight.sum() != 0; spins++) {
            if (spins < SPINS_BEFORE_YIELD) {
                Thread.onSpinWait();
            } else {
                Thread.yield();
            }
        }
        for (Cursor c : new ArrayList<>(cursors)) {
            c.closeNative();
        }
        int rc;
        try {
            rc = (int) OmapNative.CLOSE.invokeExact(map);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            HeapAccess.bridge().detach(heap, this);
        }
        if (rc != 0) {
            throw failure("closing " + description + " (closed anyway)", rc, null);
        }
    }

    boolean isClosed() {
        return closed;
    }

    void enter() {
        inFlight.increment();
        if (closed) {
            inFlight.decrement();
            throw new IllegalStateException(description + " is closed");
        }
    }

    void exit() {
        inFlight.decrement();
    }

    // ------------------------------------------------------------------ checks and errors

    /** The length of key, checked: not null, 1 to maxKey bytes. */
    int checkKey(byte[] key) {
        if (key == null) {
            throw new IllegalArgumentException("key is null (" + description + ")");
        }
        int n = key.length;
        if (n == 0 || n > maxKey) {
            throw new IllegalArgumentException("key of " + n + " bytes: " + description
                    + " takes keys of 1 to " + maxKey + " bytes");
        }
        return n;
    }

    /** A range bound, checked: null (open end) or 1 to 255 bytes. */
    private static void checkBound(byte[] bound, String which) {
        if (bound != null && (bound.length == 0 || bound.length > OmapNative.MAX_KEY)) {
            throw new IllegalArgumentException(which + " bound of " + bound.length
                    + " bytes: bounds are 1 to " + OmapNative.MAX_KEY + " bytes (null: no bound)");
        }
    }

    /** What a failed call throws: IllegalArgumentException for EINVAL, else HeapException. */
    static RuntimeException failure(String what, int code, String why) {
        String message = NativeLibrary.lastError();
        String text = what + " failed (errno " + code + ")" + (why == null ? "" : ": " + why)
                + (message.isEmpty() ? "" : " [" + message + "]");
        if (code == OmapNative.EINVAL) {
            return new IllegalArgumentException(text);
        }
        return new HeapException(text, code);
    }

    private RuntimeException failure(String op, int code) {
        String why = code == OmapNative.ENOMEM ? "the heap is full" : null;
        return failure(op + " on " + description, code, why);
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
        enter();
        try {
            Scratch s = SCRATCH.get();
            MemorySegment word = s.word;
            word.set(LONG_LE, 0, value);
            int rc = (int) OmapNative.PUT.invokeExact(map, s.key(key), (long) n, word, 8L);
            if (rc != 0) {
                throw failure("put", rc);
            }
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** key's long value, or absent when key is not in the map. */
    long getLong(byte[] key, long absent) {
        int n = checkKey(key);
        enter();
        try {
            Scratch s = SCRATCH.get();
            MemorySegment word = s.word;
            long length = (long) OmapNative.GET.invokeExact(s.state, map, s.key(key), (long) n,
                    word, 8L);
            if (length == 8) {
                return word.get(LONG_LE, 0);
            }
            if (length < 0) {
                int code = OmapNative.errno(s.state);
                if (code == OmapNative.ENOENT) {
                    return absent;
                }
                throw failure("get", code);
            }
            throw notALong(length);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
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
        enter();
        try {
            Scratch s = SCRATCH.get();
            MemorySegment k = s.key(key);
            long length = (long) OmapNative.GET.invokeExact(s.state, map, k, (long) n, s.word,
                    8L);
            if (length < 0) {
                int code = OmapNative.errno(s.state);
                if (code == OmapNative.ENOENT) {
                    return absent;
                }
                throw failure("get", code);
            }
            long oldValue = s.word.get(LONG_LE, 0);
            int rc = (int) OmapNative.REMOVE.invokeExact(map, k, (long) n);
            if (rc == OmapNative.ENOENT) {
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
            exit();
        }
        if (removed != null) {
            removed.accept(old);
        }
        return old;
    }

    // ------------------------------------------------------------------ byte[] values

    /** Puts key → value (any length; the library keeps values over the inline size apart). */
    void putBytes(byte[] key, byte[] value) {
        int n = checkKey(key);
        if (value == null) {
            throw new IllegalArgumentException("value is null (" + description + ")");
        }
        enter();
        try {
            Scratch s = SCRATCH.get();
            MemorySegment k = s.key(key);
            int rc;
            if (value.length <= MAX_BUFFERED) {
                rc = (int) OmapNative.PUT.invokeExact(map, k, (long) n, s.input(value),
                        (long) value.length);
            } else {
                try (Arena arena = Arena.ofConfined()) {
                    MemorySegment v = arena.allocate(value.length, 8);
                    MemorySegment.copy(value, 0, v, JAVA_BYTE, 0, value.length);
                    rc = (int) OmapNative.PUT.invokeExact(map, k, (long) n, v,
                            (long) value.length);
                }
            }
            if (rc != 0) {
                throw failure("put", rc);
            }
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** key's value as a new array, or null when key is not in the map. */
    byte[] getBytes(byte[] key) {
        int n = checkKey(key);
        enter();
        try {
            Scratch s = SCRATCH.get();
            MemorySegment k = s.key(key);
            return readValue(s, k, n);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** The value of the key in k (n bytes), read into a new array; null when absent. */
    private byte[] readValue(Scratch s, MemorySegment k, long n) throws Throwable {
        MemorySegment buf = s.value;
        while (true) {
            long length = (long) OmapNative.GET.invokeExact(s.state, map, k, n, buf,
                    buf.byteSize());
            if (length < 0) {
                int code = OmapNative.errno(s.state);
                if (code == OmapNative.ENOENT) {
                    return null;
                }
                throw failure("get", code);
            }
            if (length <= buf.byteSize()) {
                byte[] value = new byte[Math.toIntExact(length)];
                MemorySegment.copy(buf, JAVA_BYTE, 0, value, 0, value.length);
                return value;
            }
            // it did not fit: a buffer of its size, then again (it may have changed)
            if (length <= MAX_BUFFERED) {
                buf = s.valueBuffer(length);
            } else {
                buf = Arena.ofAuto().allocate(length, 8);
            }
        }
    }

    /** Whether key is in the map (no value copied). */
    boolean contains(byte[] key) {
        int n = checkKey(key);
        enter();
        try {
            Scratch s = SCRATCH.get();
            long length = (long) OmapNative.GET.invokeExact(s.state, map, s.key(key), (long) n,
                    MemorySegment.NULL, 0L);
            if (length >= 0) {
                return true;
            }
            int code = OmapNative.errno(s.state);
            if (code == OmapNative.ENOENT) {
                return false;
            }
            throw failure("get", code);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** Removes key; false when it was not in the map. */
    boolean remove(byte[] key) {
        int n = checkKey(key);
        enter();
        try {
            Scratch s = SCRATCH.get();
            int rc = (int) OmapNative.REMOVE.invokeExact(map, s.key(key), (long) n);
            if (rc == 0) {
                return true;
            }
            if (rc == OmapNative.ENOENT) {
                return false;
            }
            throw failure("remove", rc);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** Entries in the map. */
    long size() {
        enter();
        try {
            Scratch s = SCRATCH.get();
            long n = (long) OmapNative.LEN.invokeExact(s.state, map);
            if (n == -1L) { // UINT64_MAX: an error
                throw failure("len", OmapNative.errno(s.state));
            }
            return n;
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
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
        enter();
        try {
            // the bounds go through the thread's key buffers: the library copies them at
            // open (its cursor owns its bounds), so they need not outlive this call
            Scratch s = SCRATCH.get();
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
                throw failure("opening a cursor", OmapNative.errno(s.state));
            }
            Cursor cursor = new Cursor(c);
            cursors.add(cursor);
            return cursor;
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** One native cursor of this map; used by one thread (and closed by the map's close). */
    final class Cursor {
        private final AtomicLong handle;

        private Cursor(long handle) {
            this.handle = new AtomicLong(handle);
        }

        /**
         * The next entry into the thread's buffers (key in s.key, lengths in s.keyLen and
         * s.valueLen, value in valueBuf up to its size); false at the end, where the cursor
         * closes itself.
         */
        boolean next(Scratch s, MemorySegment valueBuf) {
            enter();
            try {
                long c = handle.get();
                if (c == 0) {
                    return false;
                }
                int rc = (int) OmapNative.CURSOR_NEXT.invokeExact(s.state, c, s.key,
                        (long) OmapNative.MAX_KEY + 1, s.keyLen, valueBuf, valueBuf.byteSize(),
                        s.valueLen);
                if (rc == 1) {
                    return true;
                }
                if (rc == 0) {
                    closeNative();
                    return false;
                }
                throw failure("cursor next", OmapNative.errno(s.state));
            } catch (Throwable t) {
                throw NativeLibrary.rethrow(t);
            } finally {
                exit();
            }
        }

        /** Closes the native cursor (once). */
        void closeNative() {
            long c = handle.getAndSet(0);
            if (c == 0) {
                return;
            }
            cursors.remove(this);
            try {
                OmapNative.CURSOR_CLOSE.invokeExact(c);
            } catch (Throwable t) {
                throw NativeLibrary.rethrow(t);
            }
        }

        /** Closes the cursor from its iterator (nothing to do once the map closed it). */
        void close() {
            if (handle.get() == 0) {
                return;
            }
            inFlight.increment();
            try {
                if (!closed) {
                    closeNative();
                }
            } finally {
                inFlight.decrement();
            }
        }
    }

    /**
     * An iterator over a cursor, one entry ahead (as LLPL's): subclasses turn the entry in
     * the thread's buffers into E.
     */
    abstract static class EntryIterator<E> implements AutoCloseableIterator<E> {
        private final Cursor cursor;
        private E next;

        EntryIterator(Cursor cursor) {
            this.cursor = cursor;
        }

        /** Call at the end of the subclass's constructor. */
        final void start() {
            next = fetch();
        }

        /** The value buffer for the next entry. */
        abstract MemorySegment valueBuffer(Scratch s);

        /** The entry in s (key of keyLen bytes; value of valueLen, its first bytes in buf). */
        abstract E decode(Scratch s, byte[] key, long valueLen, MemorySegment buf);

        private E fetch() {
            Scratch s = SCRATCH.get();
            while (true) {
                MemorySegment buf = valueBuffer(s);
                if (!cursor.next(s, buf)) {
                    return null;
                }
                long keyLen = s.keyLen.get(JAVA_LONG, 0);
                byte[] key = new byte[Math.toIntExact(keyLen)];
                MemorySegment.copy(s.key, JAVA_BYTE, 0, key, 0, key.length);
                E e = decode(s, key, s.valueLen.get(JAVA_LONG, 0), buf);
                if (e != null) {
                    return e;
                }
            }
        }

        @Override
        public final boolean hasNext() {
            return next != null;
        }

        @Override
        public final E next() {
            E e = next;
            if (e == null) {
                throw new NoSuchElementException();
            }
            next = fetch();
            return e;
        }

        @Override
        public final void close() {
            next = null;
            cursor.close();
        }
    }

    /** The value of key, read again into a new array because the cursor's copy was cut. */
    byte[] reread(byte[] key) {
        enter();
        try {
            Scratch s = SCRATCH.get();
            return readValue(s, s.key(key), key.length);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** The first (or, last, the last) key; NoSuchElementException when the map is empty. */
    byte[] endKey(boolean last) {
        Cursor c = openCursor(null, true, null, false, last);
        try {
            Scratch s = SCRATCH.get();
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

    @Override
    public String toString() {
        return description + (closed ? " (closed)" : "");
    }
}

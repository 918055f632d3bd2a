package dev.terrace.collections;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.HeapAccess;
import dev.terrace.internal.NativeLibrary;
import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.nio.charset.StandardCharsets;
import java.util.AbstractMap;
import java.util.ArrayList;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Objects;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;

/**
 * One open map of a heap, of either kind of {@code include/terrace_collections.h}: what
 * {@link NativeOrderedMap} ({@code terrace_omap *}) and {@link NativeHashMap}
 * ({@code terrace_hmap *}) share. The two kinds have the same calls and conventions; a subclass
 * binds the per-entry calls (put, get, remove, len, cursor next) to its own static handles, so
 * each call site is a plain, inlinable downcall, and gives the calls made once per map or
 * cursor as a {@link Kind}.
 *
 * <p>Lifetime: opened under the heap's lock and registered with it, so the heap's
 * {@code close()} closes the map first. {@link #close()} waits for the calls in flight (see
 * {@link NativeCollection}), closes every cursor still open (their iterators then throw
 * {@link IllegalStateException}) and then the native map, so no cursor outlives its map.
 * Every call after that throws {@link IllegalStateException}.
 *
 * <p>Arguments travel through per-thread native buffers (two key buffers of 256 bytes, an
 * 8-byte word for a long value, value buffers that grow to the largest value the thread
 * handled, up to {@value NativeCollection#MAX_BUFFERED} bytes; larger values use an arena of
 * their own), so a get or put is one downcall and allocates nothing native. The buffers are
 * in automatic arenas: the GC frees them with their thread. Both kinds share them.
 *
 * <p>Errors: a key the binding can check (null, empty, longer than the map's maximum) throws
 * {@link IllegalArgumentException} before any native call, as does EINVAL from the library
 * (arguments it refused: sizes that do not match an existing map's); every other errno is a
 * {@link HeapException} carrying it and {@code terrace_last_error()}'s text (ENOMEM: the pool
 * is full; ENOENT from an open without create; EEXIST: the name is bound to something else;
 * EBUSY: this process has the map open already).
 */
abstract class NativeMap extends NativeCollection {


    /**
     * A kind of map: its noun in messages ("ordered map", with its article) and its calls made
     * once per map or cursor (open with errno, close, cursor close, destroy).
     */
    record Kind(String noun, String article, MethodHandle open, MethodHandle close,
            MethodHandle cursorClose, MethodHandle destroy) {}

    /** Makes the map object once the native map is open. */
    @FunctionalInterface
    interface Factory<M extends NativeMap> {
        M make(AnyHeap heap, String name, int maxKey, long map);
    }


    final Kind kind;
    /** Longest key: as given at open, or {@value MapNative#MAX_KEY} when opened with 0. */
    final int maxKey;
    /** The native map. */
    final long map;
    private final Set<Cursor> cursors = ConcurrentHashMap.newKeySet();

    NativeMap(Kind kind, AnyHeap heap, String name, int maxKey, long map) {
        super(heap, name, kind.noun() + " '" + name + "' of heap " + heap.path());
        this.kind = kind;
        this.maxKey = maxKey != 0 ? maxKey : MapNative.MAX_KEY;
        this.map = map;
    }

    // ------------------------------------------------------------------ the kind's calls

    /** put(map, key, key_len, value, value_len) → 0 or errno. */
    abstract int nativePut(long m, MemorySegment key, long keyLen, MemorySegment value,
            long valueLen) throws Throwable;

    /** find(map, key, key_len, buf, cap) → the value's length, or a negative errno. */
    abstract long nativeFind(long m, MemorySegment key, long keyLen, MemorySegment buf,
            long cap) throws Throwable;

    /** remove(map, key, key_len) → 0, ENOENT or another errno. */
    abstract int nativeRemove(long m, MemorySegment key, long keyLen) throws Throwable;

    /** len(map) → entries, or -1 with errno in state. */
    abstract long nativeLen(MemorySegment state, long m) throws Throwable;

    /** The cursor's next entry → 1, 0 at the end, -1 with errno in state. */
    abstract int nativeNext(MemorySegment state, long cursor, MemorySegment key, long keyCap,
            MemorySegment keyLen, MemorySegment value, long valueCap, MemorySegment valueLen)
            throws Throwable;

    // ------------------------------------------------------------------ open, close, destroy

    /**
     * Opens (create: creates when unbound) the map of the kind bound to name. maxKey and
     * inlineValue: the sizes to create with or check against; 0 when opening takes the stored
     * ones. The caller has checked that the library has the kind.
     */
    static <M extends NativeMap> M openMap(Kind kind, AnyHeap heap, String name, int maxKey,
            int inlineValue, boolean create, Factory<M> factory) {
        Objects.requireNonNull(heap, "heap");
        checkName(name, "map");
        int minKey = create ? 1 : 0;
        if (maxKey < minKey || maxKey > MapNative.MAX_KEY) {
            throw new IllegalArgumentException("max key length " + maxKey + " is not in "
                    + minKey + ".." + MapNative.MAX_KEY);
        }
        if (inlineValue < 0 || inlineValue > MapNative.MAX_INLINE_VALUE) {
            throw new IllegalArgumentException("inline value size " + inlineValue
                    + " is not in 0.." + MapNative.MAX_INLINE_VALUE);
        }
        HeapAccess.Bridge bridge = HeapAccess.bridge();
        return bridge.attach(heap, () -> {
            String what = "opening " + kind.noun() + " '" + name + "' of heap " + heap.path()
                    + " (max key " + maxKey + ", inline value " + inlineValue
                    + (create ? ", create" : "") + ")";
            long m = nativeOpen(kind, bridge.pool(heap), name, maxKey, inlineValue, create,
                    what, "no map has that name (open it with sizes to create it)");
            return factory.make(heap, name, maxKey, m);
        });
    }

    /** The kind's open: the native map, or the failure thrown (unbound: why enoent). */
    private static long nativeOpen(Kind kind, MemorySegment pool, String name, int maxKey,
            int inlineValue, boolean create, String what, String enoent) {
        int code;
        long m;
        try (Arena args = Arena.ofConfined()) {
            MemorySegment state = args.allocate(MapNative.STATE);
            m = (long) kind.open().invokeExact(state, pool, args.allocateFrom(name), maxKey,
                    inlineValue, create ? MapNative.CREATE : 0);
            code = m == 0 ? MapNative.errno(state) : 0;
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (m == 0) {
            String why = switch (code) {
                case MapNative.ENOENT -> enoent;
                case MapNative.EEXIST -> notThisKind(kind);
                case MapNative.EBUSY -> "this process has it open already: use that "
                        + "instance, or close it first";
                case MapNative.EINVAL -> "the library refused the arguments (sizes that "
                        + "differ from the existing map's?)";
                default -> null;
            };
            throw failure(what, code, why);
        }
        return m;
    }

    private static String notThisKind(Kind kind) {
        return "the name is bound to something that is not " + kind.article() + " "
                + kind.noun();
    }

    /** Throws IllegalArgumentException unless name is 1 to 64 bytes of UTF-8 with no NUL. */
    static void checkName(String name, String what) {
        if (name == null) {
            throw new IllegalArgumentException(what + " name is null");
        }
        int nameBytes = name.getBytes(StandardCharsets.UTF_8).length;
        if (nameBytes == 0 || nameBytes > MapNative.MAX_NAME || name.indexOf('\0') >= 0) {
            throw new IllegalArgumentException(what + " name \"" + name + "\" is " + nameBytes
                    + " bytes of UTF-8" + (name.indexOf('\0') >= 0 ? " with a NUL" : "")
                    + ": names are 1 to " + MapNative.MAX_NAME + " bytes, no NUL");
        }
    }

    /** Throws UnsupportedOperationException unless the library has the kind's calls. */
    static void requireAvailable(boolean available, String noun, String symbols) {
        if (!available) {
            throw new UnsupportedOperationException("the loaded libterrace.so has no " + noun
                    + " (no " + symbols + " symbols): it was built before "
                    + "include/terrace_collections.h had it");
        }
    }

    /**
     * Unbinds the map of the kind bound to name in heap and frees its entries (destroy); a
     * crash midway leaves unreachable objects that {@code terrace pool check --sweep} frees.
     * The library's destroy takes a map of either kind, so the map is opened (and closed)
     * first as this kind: a name bound to anything else is refused (EEXIST), as open refuses
     * it, and one open in this process too (EBUSY). Runs under the heap's lock.
     */
    static void destroyMap(Kind kind, AnyHeap heap, String name) {
        Objects.requireNonNull(heap, "heap");
        checkName(name, "map");
        String what = "destroying " + kind.noun() + " '" + name + "' of heap " + heap.path();
        HeapAccess.Bridge bridge = HeapAccess.bridge();
        AutoCloseable done = bridge.attach(heap, () -> {
            MemorySegment pool = bridge.pool(heap);
            long m = nativeOpen(kind, pool, name, 0, 0, false, what, "no map has that name");
            int rc;
            try (Arena args = Arena.ofConfined()) {
                rc = (int) kind.close().invokeExact(m);
                if (rc == 0) {
                    rc = (int) kind.destroy().invokeExact(pool, args.allocateFrom(name));
                }
            } catch (Throwable t) {
                throw NativeLibrary.rethrow(t);
            }
            if (rc != 0) {
                String why = switch (rc) {
                    case MapNative.ENOENT -> "no map has that name";
                    case MapNative.EEXIST -> notThisKind(kind);
                    case MapNative.EBUSY -> "the map is open in this process: close it first";
                    default -> null;
                };
                throw failure(what, rc, why);
            }
            return () -> { };
        });
        bridge.detach(heap, done);
    }

    /** Closes the cursors still open: the native map's close refuses while one is. */
    @Override
    void beforeNativeClose() {
        for (Cursor c : new ArrayList<>(cursors)) {
            c.closeNative();
        }
    }

    @Override
    int nativeClose() throws Throwable {
        return (int) kind.close().invokeExact(map);
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

    /** What a failed call throws: IllegalArgumentException for EINVAL, else HeapException. */
    static RuntimeException failure(String what, int code, String why) {
        String message = NativeLibrary.lastError();
        String text = what + " failed (errno " + code + ")" + (why == null ? "" : ": " + why)
                + (message.isEmpty() ? "" : " [" + message + "]");
        if (code == MapNative.EINVAL) {
            return new IllegalArgumentException(text);
        }
        return new HeapException(text, code);
    }

    RuntimeException failure(String op, int code) {
        String why = code == MapNative.ENOMEM ? "the heap is full" : null;
        return failure(op + " on " + description, code, why);
    }

    // ------------------------------------------------------------------ byte[] values

    /** Puts key → value (any length; the library keeps values over the inline size apart). */
    void putBytes(byte[] key, byte[] value) {
        int n = checkKey(key);
        if (value == null) {
            throw new IllegalArgumentException("value is null (" + description + ")");
        }
        Scratch s = enter();
        try {
            MemorySegment k = s.key(key);
            int rc;
            if (value.length <= MAX_BUFFERED) {
                rc = nativePut(map, k, n, s.input(value), value.length);
            } else {
                try (Arena arena = Arena.ofConfined()) {
                    MemorySegment v = arena.allocate(value.length, 8);
                    MemorySegment.copy(value, 0, v, JAVA_BYTE, 0, value.length);
                    rc = nativePut(map, k, n, v, value.length);
                }
            }
            if (rc != 0) {
                throw failure("put", rc);
            }
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /** key's value as a new array, or null when key is not in the map. */
    byte[] getBytes(byte[] key) {
        int n = checkKey(key);
        Scratch s = enter();
        try {
            return readValue(s, s.key(key), n);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /** The value of the key in k (n bytes), read into a new array; null when absent. */
    private byte[] readValue(Scratch s, MemorySegment k, long n) throws Throwable {
        MemorySegment buf = s.value;
        while (true) {
            long length = nativeFind(map, k, n, buf, buf.byteSize());
            if (length < 0) {
                int code = (int) -length;
                if (code == MapNative.ENOENT) {
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
        Scratch s = enter();
        try {
            long length = nativeFind(map, s.key(key), n, MemorySegment.NULL, 0L);
            if (length >= 0) {
                return true;
            }
            int code = (int) -length;
            if (code == MapNative.ENOENT) {
                return false;
            }
            throw failure("get", code);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /** Removes key; false when it was not in the map. */
    boolean remove(byte[] key) {
        int n = checkKey(key);
        Scratch s = enter();
        try {
            int rc = nativeRemove(map, s.key(key), n);
            if (rc == 0) {
                return true;
            }
            if (rc == MapNative.ENOENT) {
                return false;
            }
            throw failure("remove", rc);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /** Entries in the map. */
    long size() {
        Scratch s = enter();
        try {
            long n = nativeLen(s.state, map);
            if (n == -1L) { // UINT64_MAX: an error
                throw failure("len", MapNative.errno(s.state));
            }
            return n;
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    /** The value of key, read again into a new array because the cursor's copy was cut. */
    byte[] reread(byte[] key) {
        Scratch s = enter();
        try {
            return readValue(s, s.key(key), key.length);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit(s);
        }
    }

    // ------------------------------------------------------------------ cursors

    /**
     * Registers a native cursor the subclass opened (inside {@link #enter()}), so that
     * {@link #close()} closes it if its iterator has not.
     */
    Cursor register(long cursor) {
        Cursor c = new Cursor(cursor);
        cursors.add(c);
        return c;
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
            Scratch entered = enter(); // the thread's own: s
            try {
                long c = handle.get();
                if (c == 0) {
                    return false;
                }
                int rc = nativeNext(s.state, c, s.key, KEY_BUFFER, s.keyLen, valueBuf,
                        valueBuf.byteSize(), s.valueLen);
                if (rc == 1) {
                    return true;
                }
                if (rc == 0) {
                    closeNative();
                    return false;
                }
                throw failure("cursor next", MapNative.errno(s.state));
            } catch (Throwable t) {
                throw NativeLibrary.rethrow(t);
            } finally {
                exit(entered);
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
                kind.cursorClose().invokeExact(c);
            } catch (Throwable t) {
                throw NativeLibrary.rethrow(t);
            }
        }

        /** Closes the cursor from its iterator (nothing to do once the map closed it). */
        void close() {
            if (handle.get() == 0) {
                return;
            }
            Scratch s = tryEnter();
            if (s == null) {
                return; // the map's close closed it
            }
            try {
                closeNative();
            } finally {
                exit(s);
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

        /**
         * The entry in s (key of keyLen bytes; value of valueLen, its first bytes in buf), or
         * null to skip it.
         */
        abstract E decode(Scratch s, byte[] key, long valueLen, MemorySegment buf);

        private E fetch() {
            Scratch s = scratch();
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

    /**
     * Entries as {@code Map.Entry<byte[], byte[]>} of new arrays. A value that did not fit the
     * thread's value buffer is read again by key right after (the buffer grows for the next
     * ones), so a concurrent writer of that key may be seen there; an entry removed in between
     * is skipped.
     */
    static final class BytesIterator extends EntryIterator<Map.Entry<byte[], byte[]>> {
        private final NativeMap map;

        BytesIterator(NativeMap map, Cursor cursor) {
            super(cursor);
            this.map = map;
            start();
        }

        @Override
        MemorySegment valueBuffer(Scratch s) {
            return s.value;
        }

        @Override
        Map.Entry<byte[], byte[]> decode(Scratch s, byte[] key, long valueLen,
                MemorySegment buf) {
            byte[] value;
            if (valueLen <= buf.byteSize()) {
                value = new byte[Math.toIntExact(valueLen)];
                MemorySegment.copy(buf, JAVA_BYTE, 0, value, 0, value.length);
            } else {
                if (valueLen <= MAX_BUFFERED) {
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

    @Override
    public String toString() {
        return description + (isClosed() ? " (closed)" : "");
    }
}

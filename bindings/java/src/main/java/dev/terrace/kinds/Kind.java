package dev.terrace.kinds;

import dev.terrace.TerraceException;
import dev.terrace.internal.NativeLibrary;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SegmentAllocator;
import java.lang.foreign.ValueLayout;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;

/**
 * A Terrace kind: a heap on one medium (DRAM, a file on a DAX/tmpfs/disk file system, a NUMA
 * node) or a unified heap over several kinds. Owns one {@code terrace_kind_t} and destroys it
 * (with everything allocated from it) on {@link #close()}.
 *
 * <p>Three ways to allocate:
 * <ul>
 *   <li>Raw addresses ({@link #malloc}, {@link #calloc}, {@link #realloc}, {@link #free},
 *       {@link #usableSize}, {@link #detect}): for adapters to allocator interfaces that
 *       speak in {@code long} addresses. Nothing checks a raw address: using one after it is
 *       freed, or after its kind is closed, is undefined, as in C.</li>
 *   <li>{@link SegmentAllocator}: {@link #allocate(long, long)} returns a native segment
 *       that lives as long as this kind (it is freed when the kind is closed, and is then
 *       inaccessible). For the default kind that is forever.</li>
 *   <li>Freed early and checked: {@link KindArena} (many segments, freed together) and
 *       {@link #allocateOwned} (one segment). Their segments throw
 *       {@link IllegalStateException} once freed, instead of touching freed memory.</li>
 * </ul>
 *
 * <p>Invariants: a kind with open {@link KindArena}s, live {@link OwnedSegment}s or unified
 * kinds over it cannot be closed (close throws {@link IllegalStateException} naming the
 * count), so no checked segment can outlive the memory under it. Calls on the kind are
 * counted while in flight, and {@link #close()} waits for them before destroying it (the C
 * ABI forbids destroying a kind in use), so a call racing with a close either completes or
 * throws {@link IllegalStateException}. Closing twice does nothing.
 * The default kind, and kinds found by {@link #detect} that this binding did not create,
 * are not closable: their {@link #close()} does nothing.
 *
 * <p>Errors: an allocation the medium cannot satisfy throws {@link KindOutOfMemoryError}
 * (ENOMEM, ENOSPC); any other failure a {@link TerraceException} with the library's
 * {@code terrace_last_error()} text; any use of a closed kind an
 * {@link IllegalStateException}. Every method is thread-safe.
 */
public final class Kind implements SegmentAllocator, AutoCloseable {
    /** How a unified kind picks the member each allocation comes from. */
    public enum Strategy {
        /** Members in turn; a full member overflows to the next. */
        ROUND_ROBIN(0),
        /** The first member until it is full, then the next. */
        ORDERED(1),
        /** The member on the calling thread's NUMA node first. */
        NUMA_LOCAL(2);

        final int code;

        Strategy(int code) {
            this.code = code;
        }
    }

    /** Options of {@link #file(Path, long, Set)} ({@code TERRACE_FILE_*}). */
    public enum FileFlag {
        /** The path is a file to create and keep, not a directory for an unlinked file. */
        KEEP(1),
        /** Give freed memory back to the file system (punch holes). */
        HOLE_PUNCH(2),
        /** Reserve file blocks only on demand, never ahead. */
        NO_RESERVE_AHEAD(4);

        final int bit;

        FileFlag(int bit) {
            this.bit = bit;
        }
    }

    /** Smallest {@code maxSize} of a file kind ({@code TERRACE_FILE_KIND_MIN_SIZE}, 16 MiB). */
    public static final long FILE_KIND_MIN_SIZE = 16L << 20;

    /** {@link #state}'s value once closed; otherwise the state is the count of dependents. */
    private static final long CLOSED = Long.MIN_VALUE;
    private static final int ENOMEM = 12;
    private static final int ENOSPC = 28;
    /** jemalloc's smallest alignment: any malloc result is aligned to this. */
    private static final long MALLOC_ALIGNMENT = 8;

    /** Kinds this binding created or found, by handle, for {@link #detect}. */
    private static final Map<Long, Kind> BY_HANDLE = new ConcurrentHashMap<>();
    private static final Kind DEFAULT = defaultKindOnce();

    private final long handle;
    private final String description;
    private final boolean closable;
    private final List<Kind> members;
    /** Dependents (arenas, owned segments, unified kinds over this one), or CLOSED. */
    private final AtomicLong state = new AtomicLong();
    /** Calls on the native kind in flight ({@link #enter}/{@link #exit}). */
    private final LongAdder inFlight = new LongAdder();
    /** The scope of {@link #allocate(long, long)}'s segments; created on first use. */
    private volatile Arena lifetime;

    private Kind(long handle, String description, boolean closable, List<Kind> members) {
        this.handle = handle;
        this.description = description;
        this.closable = closable;
        this.members = members;
    }

    private static Kind defaultKindOnce() {
        long handle;
        try {
            handle = (long) KindNative.KIND_DEFAULT.invokeExact();
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (handle == 0) {
            throw NativeLibrary.failure("terrace_kind_default", 0);
        }
        Kind kind = new Kind(handle, "default kind", false, List.of());
        kind.lifetime = Arena.global();
        BY_HANDLE.put(handle, kind);
        return kind;
    }

    private static Kind register(long handle, String description, List<Kind> members) {
        Kind kind = new Kind(handle, description, true, members);
        BY_HANDLE.put(handle, kind);
        return kind;
    }

    // ---------------------------------------------------------------- factories

    /** The process-wide default DRAM kind (not closable). */
    public static Kind defaultKind() {
        return DEFAULT;
    }

    /** A DRAM kind of its own, on base pages. */
    public static Kind dram() {
        return createDram(false);
    }

    /** A DRAM kind of its own, on transparent huge pages. */
    public static Kind dramHugePages() {
        return createDram(true);
    }

    private static Kind createDram(boolean hugePages) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment out = arena.allocate(ValueLayout.JAVA_LONG);
            int code = (int) KindNative.CREATE_DRAM.invokeExact(hugePages ? 1 : 0, out);
            NativeLibrary.check("terrace_kind_create_dram", code);
            return register(out.get(ValueLayout.JAVA_LONG, 0),
                    hugePages ? "DRAM kind (huge pages)" : "DRAM kind", List.of());
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    /**
     * A file kind of at most {@code maxSize} bytes (at least {@link #FILE_KIND_MIN_SIZE}) in an
     * unlinked temporary file in directory {@code dir}: a file system on DAX, tmpfs or disk.
     * File blocks are reserved ahead of use, so a full file system is a
     * {@link KindOutOfMemoryError}, never a SIGBUS.
     */
    public static Kind file(Path dir, long maxSize) {
        return file(dir, maxSize, EnumSet.noneOf(FileFlag.class));
    }

    /**
     * A file kind with options: with {@link FileFlag#KEEP}, {@code path} is a file to create
     * and keep rather than a directory.
     */
    public static Kind file(Path path, long maxSize, Set<FileFlag> flags) {
        int bits = 0;
        for (FileFlag flag : flags) {
            bits |= flag.bit;
        }
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment out = arena.allocate(ValueLayout.JAVA_LONG);
            MemorySegment cPath = arena.allocateFrom(path.toString());
            int code = (int) KindNative.CREATE_FILE.invokeExact(cPath, maxSize, bits, out);
            NativeLibrary.check("terrace_kind_create_file(" + path + ", " + maxSize + ")", code);
            return register(out.get(ValueLayout.JAVA_LONG, 0),
                    "file kind in " + path + " (max " + maxSize + " bytes)", List.of());
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    /** A kind on NUMA node {@code node} (e.g. a CXL memory expander seen as a node). */
    public static Kind numa(int node) {
        if (node < 0) {
            throw new IllegalArgumentException("NUMA node must be >= 0, got " + node);
        }
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment out = arena.allocate(ValueLayout.JAVA_LONG);
            int code = (int) KindNative.CREATE_NUMA.invokeExact(node, out);
            NativeLibrary.check("terrace_kind_create_numa(" + node + ")", code);
            return register(out.get(ValueLayout.JAVA_LONG, 0), "NUMA kind on node " + node,
                    List.of());
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    /**
     * A unified kind over {@code members}, overflowing from one to the next before failing.
     * The members stay open at least as long as the unified kind: closing a member first
     * throws {@link IllegalStateException}.
     */
    public static Kind unified(List<Kind> members, Strategy strategy) {
        if (members.isEmpty()) {
            throw new IllegalArgumentException("a unified kind needs at least one member");
        }
        List<Kind> retained = new ArrayList<>(members.size());
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment handles = arena.allocate(ValueLayout.JAVA_LONG, members.size());
            for (int i = 0; i < members.size(); i++) {
                Kind member = members.get(i);
                member.retain();
                retained.add(member);
                handles.setAtIndex(ValueLayout.JAVA_LONG, i, member.handle);
            }
            MemorySegment out = arena.allocate(ValueLayout.JAVA_LONG);
            int code = (int) KindNative.CREATE_UNIFIED.invokeExact(handles,
                    (long) members.size(), strategy.code, out);
            NativeLibrary.check("terrace_kind_create_unified", code);
            return register(out.get(ValueLayout.JAVA_LONG, 0),
                    "unified kind (" + strategy + ") over " + members, List.copyOf(members));
        } catch (Throwable t) {
            retained.forEach(Kind::release);
            throw NativeLibrary.rethrow(t);
        }
    }

    // ---------------------------------------------------------------- raw addresses

    /**
     * Allocates {@code size} bytes (not zeroed) and returns the address.
     *
     * @throws KindOutOfMemoryError if the kind is full
     * @throws TerraceException on any other failure (e.g. size 0: EINVAL)
     * @throws IllegalStateException if this kind is closed
     */
    public long malloc(long size) {
        enter();
        long address;
        try {
            address = (long) KindNative.MALLOC.invokeExact(NativeLibrary.callState(), handle,
                    size);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
        if (address == 0) {
            throw allocationFailure("malloc(" + size + ")");
        }
        return address;
    }

    /** Allocates {@code size} zeroed bytes; failures as for {@link #malloc}. */
    public long calloc(long size) {
        return calloc(1, size);
    }

    /** Allocates {@code count * size} zeroed bytes; failures as for {@link #malloc}. */
    public long calloc(long count, long size) {
        enter();
        long address;
        try {
            address = (long) KindNative.CALLOC.invokeExact(NativeLibrary.callState(), handle,
                    count, size);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
        if (address == 0) {
            throw allocationFailure("calloc(" + count + ", " + size + ")");
        }
        return address;
    }

    /**
     * Resizes the allocation at {@code address} (0: allocates) to {@code newSize} bytes in
     * this kind, keeping its bytes up to the smaller size; the new tail is not zeroed. Size 0
     * frees it and returns 0. On failure the old allocation is untouched and this throws as
     * {@link #malloc} does.
     */
    public long realloc(long address, long newSize) {
        enter();
        long moved;
        try {
            moved = (long) KindNative.REALLOC.invokeExact(NativeLibrary.callState(), handle,
                    address, newSize);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
        if (moved == 0 && newSize != 0) {
            throw allocationFailure("realloc(0x" + Long.toHexString(address) + ", " + newSize
                    + ")");
        }
        return moved;
    }

    /**
     * Frees the allocation at {@code address} into whichever kind owns it. Does nothing for
     * 0, for an address no kind owns (foreign memory) and for memory of a destroyed kind: the
     * C ABI cannot report those, so they are silent. Freeing twice is undefined, as in C.
     */
    public static void free(long address) {
        try {
            KindNative.FREE.invokeExact(address);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    /** Usable bytes of the allocation at {@code address}; 0 if no kind owns it. */
    public static long usableSize(long address) {
        try {
            return (long) KindNative.USABLE_SIZE.invokeExact(address);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    /**
     * The kind owning {@code address}, if any. For an allocation of a unified kind this may be
     * the member it came from. A kind this binding did not create (e.g. one of memkind's
     * static kinds) comes back as a non-closable {@code Kind}.
     */
    public static Optional<Kind> detect(long address) {
        long found;
        try {
            found = (long) KindNative.DETECT_KIND.invokeExact(address);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (found == 0) {
            return Optional.empty();
        }
        return Optional.of(BY_HANDLE.computeIfAbsent(found,
                h -> new Kind(h, "kind 0x" + Long.toHexString(h), false, List.of())));
    }

    // ---------------------------------------------------------------- segments

    /**
     * Allocates a native segment that lives as long as this kind (see the class comment):
     * the {@link SegmentAllocator} view, for APIs that take one.
     */
    @Override
    public MemorySegment allocate(long byteSize, long byteAlignment) {
        checkSizeAndAlignment(byteSize, byteAlignment);
        Arena scope = lifetimeArena();
        // in flight until the segment is in the lifetime arena (or freed): close waits
        enter();
        try {
            long address = mallocAligned(byteSize, byteAlignment);
            try {
                return MemorySegment.ofAddress(address).reinterpret(byteSize, scope, null);
            } catch (RuntimeException | Error e) {
                free(address);
                throw e;
            }
        } finally {
            exit();
        }
    }

    /**
     * One allocation of {@code size} bytes (not zeroed), confined to the calling thread, freed
     * by {@link OwnedSegment#close()}; its segment is inaccessible after that.
     */
    public OwnedSegment allocateOwned(long size) {
        return OwnedSegment.allocate(this, Arena.ofConfined(), size);
    }

    /** As {@link #allocateOwned}, but any thread may use and close the segment. */
    public OwnedSegment allocateOwnedShared(long size) {
        return OwnedSegment.allocate(this, Arena.ofShared(), size);
    }

    /** Malloc with an alignment (posix_memalign where malloc's 8 bytes are not enough). */
    long mallocAligned(long byteSize, long byteAlignment) {
        long size = Math.max(byteSize, 1);
        if (byteAlignment <= MALLOC_ALIGNMENT) {
            return malloc(size);
        }
        enter();
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment out = arena.allocate(ValueLayout.JAVA_LONG);
            int code = (int) KindNative.POSIX_MEMALIGN.invokeExact(handle, out, byteAlignment,
                    size);
            if (code != 0) {
                throw failure("posix_memalign(" + byteAlignment + ", " + size + ")", code);
            }
            return out.get(ValueLayout.JAVA_LONG, 0);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    static void checkSizeAndAlignment(long byteSize, long byteAlignment) {
        if (byteSize < 0) {
            throw new IllegalArgumentException("negative size " + byteSize);
        }
        if (byteAlignment <= 0 || Long.bitCount(byteAlignment) != 1) {
            throw new IllegalArgumentException("alignment must be a power of two, got "
                    + byteAlignment);
        }
    }

    private Arena lifetimeArena() {
        Arena arena = lifetime;
        if (arena != null) {
            return arena;
        }
        synchronized (this) {
            ensureOpen();
            if (lifetime == null) {
                lifetime = Arena.ofShared();
            }
            return lifetime;
        }
    }

    // ---------------------------------------------------------------- stats, lifecycle

    /** The kind's statistics now. */
    public KindStats stats() {
        enter();
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment out = arena.allocate(ValueLayout.JAVA_LONG, 5);
            int code = (int) KindNative.STATS.invokeExact(handle, out);
            NativeLibrary.check("terrace_kind_stats", code);
            return new KindStats(out.getAtIndex(ValueLayout.JAVA_LONG, 0),
                    out.getAtIndex(ValueLayout.JAVA_LONG, 1),
                    out.getAtIndex(ValueLayout.JAVA_LONG, 2),
                    out.getAtIndex(ValueLayout.JAVA_LONG, 3),
                    out.getAtIndex(ValueLayout.JAVA_LONG, 4));
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** The {@code terrace_kind_t} value (for other native code; never dereference it). */
    public long handle() {
        return handle;
    }

    /** Whether {@link #close()} destroys this kind (false for the default kind). */
    public boolean isClosable() {
        return closable;
    }

    /** Whether this kind has been closed. */
    public boolean isClosed() {
        return state.get() == CLOSED;
    }

    /**
     * Destroys the kind and frees everything allocated from it; segments from
     * {@link #allocate(long, long)} become inaccessible. Does nothing if already closed or
     * not closable.
     *
     * @throws IllegalStateException if arenas, owned segments or unified kinds over this
     *         kind are still open (close them first), or if a segment of
     *         {@link #allocate(long, long)} is in use by a native call right now
     */
    @Override
    public void close() {
        if (!closable) {
            return;
        }
        while (true) {
            long dependents = state.get();
            if (dependents == CLOSED) {
                return;
            }
            if (dependents > 0) {
                throw new IllegalStateException("cannot close " + description + ": "
                        + dependents + " arena(s), owned segment(s) or unified kind(s) over it"
                        + " are still open; close them first");
            }
            if (state.compareAndSet(0, CLOSED)) {
                break;
            }
        }
        // calls that entered before the CAS finish on the live kind; later ones see CLOSED
        while (inFlight.sum() != 0) {
            Thread.onSpinWait();
        }
        synchronized (this) {
            if (lifetime != null) {
                try {
                    lifetime.close();
                } catch (RuntimeException e) {
                    state.set(0);
                    throw e;
                }
            }
        }
        BY_HANDLE.remove(handle);
        int code;
        try {
            code = (int) KindNative.DESTROY.invokeExact(handle);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            members.forEach(Kind::release);
        }
        NativeLibrary.check("terrace_kind_destroy(" + description + ")", code);
    }

    /** Counts one more dependent that keeps this kind open; fails if it is closed. */
    void retain() {
        while (true) {
            long dependents = state.get();
            if (dependents == CLOSED) {
                throw closedError();
            }
            if (state.compareAndSet(dependents, dependents + 1)) {
                return;
            }
        }
    }

    /** Counts one dependent fewer. */
    void release() {
        state.decrementAndGet();
    }

    private void ensureOpen() {
        if (state.get() == CLOSED) {
            throw closedError();
        }
    }

    /**
     * Counts a call on the native kind, then checks the kind is open (in this order: with
     * close's CAS-then-wait, either close waits for the call or the call sees CLOSED).
     */
    private void enter() {
        inFlight.increment();
        if (state.get() == CLOSED) {
            inFlight.decrement();
            throw closedError();
        }
    }

    private void exit() {
        inFlight.decrement();
    }

    private IllegalStateException closedError() {
        return new IllegalStateException(description + " is closed");
    }

    private RuntimeException allocationFailure(String what) {
        return failure(what, NativeLibrary.errno());
    }

    /**
     * The exception for a failed call: a full kind is thrown here as a
     * {@link KindOutOfMemoryError} (an Error, so it cannot be returned as a
     * RuntimeException); anything else is returned for the caller to throw.
     */
    private RuntimeException failure(String what, int errno) {
        String message = what + " from " + description + " failed (errno " + errno + ")";
        String detail = NativeLibrary.lastError();
        if (!detail.isEmpty()) {
            message += ": " + detail;
        }
        if (errno == ENOMEM || errno == ENOSPC) {
            throw new KindOutOfMemoryError(message, errno);
        }
        if (state.get() == CLOSED) {
            return new IllegalStateException(description + " is closed (" + message + ")");
        }
        return new TerraceException(message, errno);
    }

    @Override
    public String toString() {
        return description;
    }
}

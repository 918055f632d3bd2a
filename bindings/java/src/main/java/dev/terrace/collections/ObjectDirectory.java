package dev.terrace.collections;

import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.HeapAccess;
import dev.terrace.internal.NativeLibrary;
import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.util.Objects;

/**
 * Named roots for a heap's own blocks: the pool's named-root directory (the one the maps are
 * bound in, {@code terrace_pool_bind/lookup/unbind}), as PCJ's {@code ObjectDirectory} and
 * LLPL's root handle. Where LLPL gives one root long per heap, a heap here can name any number
 * of its blocks, and find them again by name after a restart:
 *
 * <pre>{@code
 * ObjectDirectory roots = new ObjectDirectory(heap);
 * long h = roots.lookup("config");         // 0 when unbound, as LLPL's getRoot
 * if (h == 0) {
 *     h = heap.allocateMemory(64);         // ... fill it in, then:
 *     roots.bind("config", h);
 * }
 * }</pre>
 *
 * <p>A handle is a block's handle ({@code AnyMemoryBlock.handle()}, {@code allocateMemory}'s
 * result: the object's offset in the pool), regular or compact. Names are 1 to
 * {@value #MAX_NAME_BYTES} bytes of UTF-8, no NUL, and share one namespace with the maps of
 * {@link PersistentSortedMap}, {@link PersistentHashMap} and {@link ConcurrentLongIndex}.
 *
 * <p>Every bind and unbind is crash-atomic on its own and is not part of a {@code Transaction}
 * (an abort does not undo it): bind a block after the transaction that made it has committed.
 * A binding does not keep its block from being freed: unbind a block before freeing it, or
 * its name keeps a stale handle (which {@code terrace pool check} reports as damage; its
 * {@code --sweep} frees only the collections' own objects, never a program's blocks, bound or
 * not). Thread-safe; no native state of its own (an instance is a view of the heap's
 * directory, nothing to close). After the heap is closed every call throws
 * {@link IllegalStateException}.
 *
 * <p>Failures: {@link IllegalArgumentException} for a bad name or a handle that is not a live
 * block of the heap (a freed one included); {@link HeapException} with the errno for what the
 * library reports (17, EEXIST: the name is bound already, or, for lookup and unbind, bound to
 * a map; 12, ENOMEM: the heap is full).
 */
public final class ObjectDirectory {
    /** The longest name, in bytes of UTF-8. */
    public static final int MAX_NAME_BYTES = MapNative.MAX_NAME;
    /** Pool type numbers of the collections' own objects (terrace_collections.h): high 48 bits. */
    private static final long COLLECTION_TYPES = 0x5452434f0000L;

    private final AnyHeap heap;

    /** The directory of heap's pool (nothing is opened: a view). */
    public ObjectDirectory(AnyHeap heap) {
        this.heap = Objects.requireNonNull(heap, "heap");
    }

    /** Whether the loaded libterrace.so has named objects (older builds do not). */
    public static boolean isSupported() {
        return Availability.AVAILABLE;
    }

    private static final class Availability {
        static final boolean AVAILABLE = NativeLibrary.hasSymbol("terrace_pool_bind")
                && NativeLibrary.hasSymbol("terrace_pool_lookup")
                && NativeLibrary.hasSymbol("terrace_pool_unbind");
    }

    /** The calls, bound when first used (after the availability check). */
    private static final class Calls {
        /** bind(pool, name, off) → 0 or errno. */
        static final MethodHandle BIND = NativeLibrary.downcall("terrace_pool_bind",
                FunctionDescriptor.of(JAVA_INT, ADDRESS, ADDRESS, JAVA_LONG));
        /** errno: lookup(pool, name) → offset, or 0. */
        static final MethodHandle LOOKUP = NativeLibrary.capturingErrno("terrace_pool_lookup",
                FunctionDescriptor.of(JAVA_LONG, ADDRESS, ADDRESS));
        /** errno: unbind(pool, name) → the object's offset, or 0. */
        static final MethodHandle UNBIND = NativeLibrary.capturingErrno("terrace_pool_unbind",
                FunctionDescriptor.of(JAVA_LONG, ADDRESS, ADDRESS));
        /** type_num(pool, off) → the object's type number, UINT64_MAX on error. */
        static final MethodHandle TYPE_NUM = NativeLibrary.downcall("terrace_pool_type_num",
                FunctionDescriptor.of(JAVA_LONG, ADDRESS, JAVA_LONG));
    }

    /** The heap whose directory this is. */
    public AnyHeap heap() {
        return heap;
    }

    /**
     * Binds name to the block with this handle, crash-atomically.
     *
     * @throws IllegalArgumentException for a bad name, or a handle that is not a live block of
     *     the heap (freed, or never one)
     * @throws HeapException errno 17 (EEXIST) when name is bound already (to a block or a
     *     map): unbind it first; 12 when the heap is full
     */
    public void bind(String name, long handle) {
        NativeMap.checkName(name, "directory");
        if (!heap.isLiveHandle(handle)) {
            throw new IllegalArgumentException("handle " + handle + " is not a live block of "
                    + "heap " + heap.path() + " (freed, or never one): cannot bind \"" + name
                    + "\"");
        }
        int rc;
        try (Arena args = Arena.ofConfined()) {
            rc = (int) Calls.BIND.invokeExact(pool(), args.allocateFrom(name), handle);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (rc != 0) {
            String why = switch (rc) {
                case MapNative.EEXIST -> "the name is bound already: unbind it first";
                case MapNative.EINVAL -> "the library refused the handle (not a live object,"
                        + " or a collection's)";
                case MapNative.ENOMEM -> "the heap is full";
                default -> null;
            };
            throw NativeMap.failure(what("binding", name) + " to " + handle, rc, why);
        }
    }

    /**
     * The handle bound to name, or 0 when the name is unbound (no block has handle 0).
     *
     * @throws IllegalArgumentException for a bad name
     * @throws HeapException errno 17 (EEXIST) when name is bound to a map (open it with its
     *     class instead)
     */
    public long lookup(String name) {
        return call(false, name);
    }

    /**
     * Removes name's binding, crash-atomically, and returns the handle it was bound to (the
     * block itself is untouched: the program owns it again), or 0 when the name was unbound.
     *
     * @throws IllegalArgumentException for a bad name
     * @throws HeapException errno 17 (EEXIST) when name is bound to a map (destroy it with its
     *     class's {@code destroy} instead)
     */
    public long unbind(String name) {
        return call(true, name);
    }

    /** lookup (or unbind): the offset, 0 when unbound, or the failure thrown. */
    private long call(boolean unbind, String name) {
        NativeMap.checkName(name, "directory");
        String verb = unbind ? "unbinding" : "looking up";
        MemorySegment pool = pool();
        long off;
        int code;
        long type = 0;
        try (Arena args = Arena.ofConfined()) {
            MemorySegment state = args.allocate(MapNative.STATE);
            MemorySegment cName = args.allocateFrom(name);
            off = unbind ? (long) Calls.UNBIND.invokeExact(state, pool, cName)
                    : (long) Calls.LOOKUP.invokeExact(state, pool, cName);
            code = off == 0 ? MapNative.errno(state) : 0;
            if (off != 0 && !unbind) {
                type = (long) Calls.TYPE_NUM.invokeExact(pool, off);
            }
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (off == 0) {
            if (code == MapNative.ENOENT) {
                return 0;
            }
            throw NativeMap.failure(what(verb, name), code, code == MapNative.EEXIST
                    ? "the name is bound to a map, not a block: use the map's class" : null);
        }
        if (type != -1L && (type >>> 16) == COLLECTION_TYPES) {
            // lookup gives a map's header for a map's name: not a handle to hand out
            throw new HeapException(what(verb, name) + " failed (errno " + MapNative.EEXIST
                    + "): the name is bound to a map, not a block: use the map's class",
                    MapNative.EEXIST);
        }
        return off;
    }

    private MemorySegment pool() {
        NativeMap.requireAvailable(isSupported(), "named objects",
                "terrace_pool_bind/lookup/unbind");
        return HeapAccess.bridge().pool(heap);
    }

    private String what(String verb, String name) {
        return verb + " \"" + name + "\" in the directory of heap " + heap.path();
    }

    @Override
    public String toString() {
        return "ObjectDirectory[" + heap.path() + "]";
    }
}

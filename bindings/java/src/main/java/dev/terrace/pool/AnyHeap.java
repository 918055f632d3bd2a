package dev.terrace.pool;

import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.internal.HeapAccess;
import dev.terrace.internal.NativeLibrary;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;
import java.util.function.Consumer;
import java.util.function.LongConsumer;
import java.util.function.LongFunction;
import java.util.function.Supplier;

/**
 * A heap of memory blocks in one open Terrace pool file: what the three LLPL heap flavours
 * share (allocation, handles, the root long, transactions, closing).
 *
 * <p>Owns the native pool and a shared {@link Arena}. The pool argument of every downcall and
 * every block's memory are segments of that arena, so closing the heap (which closes the
 * arena first) makes every later use of the heap or of any block or accessor of it throw
 * {@link IllegalStateException}, and a close while a call or an access is in flight fails
 * instead of unmapping memory under it. The pool file is unmapped only after that.
 *
 * <p>Layout in the pool: the root object is 8 bytes holding the user's root long. A regular
 * block is an object of type {@value #TYPE_REGULAR} whose first 8 bytes hold its requested
 * size (as LLPL); a compact block is a bare object of type {@value #TYPE_COMPACT}. A handle is
 * the object's pool offset. Each flavour opens files of its own layout name only.
 *
 * <p>Handles from the caller ({@code memoryBlockFromHandle}, an accessor's {@code handle(h)}) are
 * checked in Java by default, as LLPL does: the handle must be positive, 8-byte aligned (as every
 * object is) and inside the pool segment, and a regular block's size is read from its own size
 * header and must be positive and fit in the pool after it. A freed regular block's header reads
 * {@link #FREED_SIZE} (stamped by {@link #freeObject}), so its stale handle throws until the
 * memory is reused. No downcall, so a handle into another object or into reused memory is not
 * detected: its view reads and writes wrong bytes of this pool, but every access stays inside the
 * pool segment, so it never crashes the JVM (a store through such a handle can corrupt the pool's
 * contents, as in LLPL). A compact block has no size header, so its size comes from the pool's
 * object table: {@code compactMemoryBlockFromHandle} always validates natively. With the system
 * property {@value #VALIDATE_HANDLES_PROPERTY}{@code =true} when the heap is created or opened,
 * every handle is validated against the pool's object table (live object, block kind asked for:
 * two short downcalls) and a bad one throws {@link IllegalArgumentException}; {@link
 * #isLiveHandle} asks the same question on demand. {@link #freeMemory} always validates natively.
 *
 * <p>How a flavour makes a store durable is {@link #beforeWrite}/{@link #afterWrite}: nothing
 * (raw), a persist after the store (persistent), or an undo-log snapshot before it inside the
 * thread's transaction or an implicit one (transactional).
 */
public abstract sealed class AnyHeap implements AutoCloseable
        permits AtomicHeap, TransactionalHeap {
    static final long TYPE_REGULAR = 1;
    static final long TYPE_COMPACT = 2;
    static final long SIZE_HEADER = Long.BYTES;
    /** What a freed regular block's size header says (no block has a negative size). */
    static final long FREED_SIZE = Long.MIN_VALUE;
    /** Pool sizes are rounded up to a multiple of this (the pool's alignment). */
    static final long SIZE_ALIGN = 2L << 20;
    private static final long MIN_CLASS_UNIT = 16;
    private static final int EINVAL = 22;
    private static final int EAGAIN = 11;
    /** Waiting for a lane: this many yields, then parks of 2 us doubling up to the maximum. */
    private static final int LANE_WAIT_YIELDS = 8;
    private static final long LANE_WAIT_MAX_NANOS = 1_000_000L;
    private static final long ANY_TYPE = -1L;
    /** Objects (and so handles) are aligned to this. */
    private static final long HANDLE_ALIGN = 8;
    /** The system property that makes every handle validated natively (read at open). */
    public static final String VALIDATE_HANDLES_PROPERTY = "terrace.pool.validateHandles";

    private final String path;
    private final MemorySegment rawPool;
    /** The native pool's address, for the transaction calls (see {@link PoolNative}). */
    private final long poolAddress;
    /** Whether a persist point waits for the file system: no critical transaction calls. */
    private final boolean persistBlocks;
    private final Arena arena;
    /** The pool handle as a segment of the arena (zero length). */
    final MemorySegment pool;
    /** The whole pool file, offset 0 at the pool's base, in the arena. */
    final MemorySegment memory;
    private final long rootOffset;
    /** Whether handles are validated against the pool's object table (fixed at open). */
    private final boolean validateHandles;
    private final Map<Long, Byte> classes = new ConcurrentHashMap<>();
    /**
     * Objects whose native state lives in this pool (the collections' ordered maps), opened
     * under this heap's lock by {@link #attach}: {@link #close()} closes them first.
     */
    private final Set<AutoCloseable> dependents = ConcurrentHashMap.newKeySet();

    static {
        HeapAccess.install(new HeapAccess.Bridge() {
            @Override
            public MemorySegment pool(AnyHeap heap) {
                heap.checkOpen();
                return heap.pool;
            }

            @Override
            public <T extends AutoCloseable> T attach(AnyHeap heap, Supplier<T> opener) {
                return heap.attach(opener);
            }

            @Override
            public void detach(AnyHeap heap, AutoCloseable dependent) {
                heap.dependents.remove(dependent);
            }
        });
    }
    /**
     * Threads with a transaction on this heap, counted before the native begin: with
     * {@link #closing} (Dekker-style, both volatile) a close either sees the count or the
     * beginning thread sees the close, so the pool is never closed inside a transaction.
     */
    private final AtomicInteger activeTransactions = new AtomicInteger();
    /** Set by {@link #close()} while it decides; refuses outermost transaction begins. */
    private volatile boolean closing;
    private volatile boolean closed;

    AnyHeap(String path, MemorySegment rawPool) {
        this.path = path;
        this.rawPool = rawPool;
        this.arena = Arena.ofShared();
        this.pool = rawPool.reinterpret(arena, null);
        this.validateHandles = Boolean.getBoolean(VALIDATE_HANDLES_PROPERTY);
        this.poolAddress = rawPool.address();
        try {
            int persistMode = (int) PoolNative.PERSIST_MODE.invokeExact(pool);
            this.persistBlocks = persistMode < 0 || persistMode >= PoolNative.PERSIST_MSYNC;
            this.rootOffset = callRoot();
            long poolSize = stats().poolSize();
            MemorySegment rootAddress =
                    (MemorySegment) PoolNative.DIRECT.invokeExact(pool, rootOffset);
            long base = rootAddress.address() - rootOffset;
            this.memory = MemorySegment.ofAddress(base).reinterpret(poolSize, arena, null);
        } catch (Throwable t) {
            arena.close();
            try {
                int ignored = (int) PoolNative.CLOSE.invokeExact(rawPool);
            } catch (Throwable suppressed) {
                t.addSuppressed(suppressed);
            }
            throw NativeLibrary.rethrow(t);
        }
    }

    private long callRoot() throws Throwable {
        long root =
                (long) PoolNative.ROOT.invokeExact(NativeLibrary.callState(), pool, SIZE_HEADER);
        if (root == 0) {
            throw heapFailure("terrace_pool_root", NativeLibrary.errno());
        }
        return root;
    }

    // ---- opening ----

    /** Creates (create) or opens the pool file at path with the flavour's layout name. */
    static MemorySegment openPool(String path, long size, String layout, boolean create) {
        try (Arena args = Arena.ofConfined()) {
            MemorySegment cPath = args.allocateFrom(path);
            MemorySegment cLayout = args.allocateFrom(layout);
            MemorySegment pool;
            if (create) {
                if (size <= 0) {
                    throw new IllegalArgumentException("heap size must be positive: " + size);
                }
                long rounded = (size + SIZE_ALIGN - 1) / SIZE_ALIGN * SIZE_ALIGN;
                pool = (MemorySegment) PoolNative.CREATE.invokeExact(NativeLibrary.callState(),
                        cPath, rounded, cLayout);
            } else {
                pool = (MemorySegment) PoolNative.OPEN.invokeExact(NativeLibrary.callState(),
                        cPath, cLayout);
            }
            if (pool.equals(MemorySegment.NULL)) {
                throw heapFailure((create ? "creating heap " : "opening heap ") + path
                        + " (layout " + layout + ")", NativeLibrary.errno());
            }
            return pool;
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    static HeapException heapFailure(String what, int errno) {
        String message = NativeLibrary.lastError();
        return new HeapException(what + " failed (errno " + errno + ")"
                + (message.isEmpty() ? "" : ": " + message), errno);
    }

    /** Whether a heap file exists at path (any flavour; it is not opened). */
    public static boolean exists(String path) {
        return Files.isRegularFile(Path.of(path));
    }

    /** The path this heap was created or opened at. */
    public String path() {
        return path;
    }

    /** The size of the pool file in bytes (the requested size rounded up to 2 MiB). */
    public long size() {
        return memory.byteSize();
    }

    /** Whether the heap is open. */
    public boolean isOpen() {
        return !closed;
    }

    // ---- root ----

    /** The user long kept in the heap's root (0 in a new heap). */
    public long getRoot() {
        return memory.get(JAVA_LONG, rootOffset);
    }

    /** Stores the user long kept in the heap's root, durably. */
    public void setRoot(long value) {
        boolean implicit = beforeWrite(null, rootOffset, Long.BYTES);
        try {
            memory.set(JAVA_LONG, rootOffset, value);
        } catch (RuntimeException e) {
            failedWrite(implicit);
            throw e;
        }
        afterWrite(rootOffset, Long.BYTES, implicit);
        if (this instanceof Heap) {
            persist(rootOffset, Long.BYTES);
        }
    }

    // ---- allocation ----

    /**
     * Registers an allocation class for blocks of exactly size bytes (compact: bare objects;
     * else size plus the 8-byte size header), so they are packed with no rounding beyond the
     * pool's 8-byte unit granularity. The class is
     * recorded in the pool, but this heap object's choice to use it is not: register again
     * after reopening. Used by atomic (non-transactional) allocations; the C ABI has no
     * transactional allocation in a class. Returns false when the pool refuses (full table).
     */
    public boolean registerAllocationSize(long size, boolean compact) {
        if (size <= 0) {
            throw new IllegalArgumentException("allocation size must be positive: " + size);
        }
        long objectSize = compact ? size : size + SIZE_HEADER;
        if (classes.containsKey(objectSize)) {
            return true;
        }
        // the pool's custom units are multiples of 8 bytes, at least 16
        long unit = Math.max(MIN_CLASS_UNIT, (objectSize + 7) & ~7L);
        try (Arena args = Arena.ofConfined()) {
            MemorySegment id = args.allocate(ValueLayout.JAVA_BYTE);
            int rc = (int) PoolNative.REGISTER_CLASS.invokeExact(pool, unit, 0, id);
            if (rc != 0) {
                return false;
            }
            classes.put(objectSize, id.get(ValueLayout.JAVA_BYTE, 0));
            return true;
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    /**
     * Allocates a zeroed object for a block of size bytes and returns its handle: inside tx
     * (the thread's transaction, on this heap) when it is not null, else atomically. A regular
     * block's size header is written (and persisted) here.
     */
    final long allocateObject(long size, boolean compact, ThreadTransaction tx) {
        if (size <= 0) {
            throw new IllegalArgumentException("block size must be positive: " + size);
        }
        long objectSize = compact ? size : Math.addExact(size, SIZE_HEADER);
        long type = compact ? TYPE_COMPACT : TYPE_REGULAR;
        long handle;
        // terrace_pool_alloc_in_class does not zero (only zalloc does): such an object is
        // zeroed here, over its whole usable size (a compact block spans it)
        boolean zeroed = true;
        try {
            if (tx != null) {
                long txn = liveTxn(tx);
                handle = persistBlocks
                        ? (long) PoolNative.TXN_ALLOC.invokeExact(NativeLibrary.callState(), txn,
                                objectSize, type, PoolNative.TXN_ZERO)
                        : (long) PoolNative.TXN_ALLOC_CRITICAL.invokeExact(
                                NativeLibrary.callState(), txn, objectSize, type,
                                PoolNative.TXN_ZERO);
            } else {
                Byte classId = classes.get(objectSize);
                if (classId != null) {
                    handle = (long) PoolNative.ALLOC_IN_CLASS.invokeExact(NativeLibrary.callState(),
                            pool, (byte) classId, objectSize, type, MemorySegment.NULL);
                    zeroed = false;
                } else {
                    handle = (long) PoolNative.ZALLOC.invokeExact(NativeLibrary.callState(), pool,
                            objectSize, type, MemorySegment.NULL);
                }
            }
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (handle == 0) {
            int code = NativeLibrary.errno();
            RuntimeException failure = heapFailure("allocating a block of " + size + " bytes", code);
            if (tx != null) {
                rollBackNow(tx, code);
            }
            throw failure;
        }
        long dirty = 0;
        if (!zeroed) {
            dirty = usableSize(handle);
            memory.asSlice(handle, dirty).fill((byte) 0);
        }
        if (!compact) {
            memory.set(JAVA_LONG, handle, size);
            dirty = Math.max(dirty, SIZE_HEADER);
        }
        if (tx == null && dirty > 0) {
            persist(handle, dirty);
        }
        return handle;
    }

    /**
     * Allocates a block inside a transaction (the thread's, or an implicit one), runs the
     * initializer on a window over the whole block, and returns the view. The new object needs
     * no undo log (an abort frees it), so the initializer's stores are plain.
     */
    final <B extends MemoryAccessor> B allocateInTransaction(long size, boolean compact,
            LongFunction<B> view, Consumer<Range> initializer) {
        ThreadTransaction tx = ThreadTransaction.current();
        boolean implicit = tx.heap != this;
        if (implicit) {
            enterTransaction();
        }
        B block;
        try {
            block = view.apply(allocateObject(size, compact, tx));
            tx.allocated.add(block);
            block.markFresh(tx);
            if (initializer != null) {
                block.initialize(initializer);
            }
        } catch (Throwable t) {
            if (implicit) {
                abortLevel(tx);
            }
            throw t;
        }
        if (implicit) {
            commitOrThrow(tx);
        }
        return block;
    }

    /**
     * Allocates atomically, initializes, and persists the whole new block once. If the
     * initializer throws, the block is freed again (the caller never saw its handle, so it
     * would leak) and the exception is rethrown.
     */
    final <B extends MemoryAccessor> B allocateAtomically(long size, boolean compact,
            LongFunction<B> view, Consumer<Range> initializer) {
        long handle = allocateObject(size, compact, null);
        B block = view.apply(handle);
        if (initializer != null) {
            try {
                block.initialize(initializer);
            } catch (Throwable t) {
                block.invalidate();
                try {
                    freeObject(handle, false, !compact);
                } catch (RuntimeException freeFailure) {
                    t.addSuppressed(freeFailure);
                }
                throw t;
            }
            persist(block.payloadOffset(), block.segment().byteSize());
        }
        return block;
    }

    /** The handle of a new regular block of size bytes (zeroed). */
    public abstract long allocateMemory(long size);

    /** The handle of a new compact block of size bytes (zeroed). */
    public abstract long allocateCompactMemory(long size);

    /**
     * Frees the block with this handle: transactionally on a {@link TransactionalHeap} (in the
     * thread's transaction, or an implicit one), atomically otherwise.
     *
     * @throws IllegalArgumentException if handle is not a live block of this heap
     */
    public void freeMemory(long handle) {
        objectSize(handle);
        freeObject(handle, this instanceof TransactionalHeap, typeOf(handle) == TYPE_REGULAR);
    }

    /**
     * Frees the object at handle. A regular block's size header is first set to
     * {@link #FREED_SIZE} in the same transaction (or persisted before an atomic free), so a
     * view made later from the stale handle throws, as long as the memory is not reused; a
     * crash between the stamp and an atomic free leaves the block allocated with the stamp
     * (it was being freed: its views throw, it leaks as LLPL's would).
     */
    final void freeObject(long handle, boolean transactional, boolean regular) {
        if (transactional) {
            ThreadTransaction tx = ThreadTransaction.current();
            boolean implicit = tx.heap != this;
            if (implicit) {
                enterTransaction();
            }
            try {
                if (regular) {
                    addRange(tx, handle, SIZE_HEADER);
                    memory.set(JAVA_LONG, handle, FREED_SIZE);
                }
                long txn = liveTxn(tx);
                int rc = persistBlocks
                        ? (int) PoolNative.TXN_FREE.invokeExact(txn, handle)
                        : (int) PoolNative.TXN_FREE_CRITICAL.invokeExact(txn, handle);
                if (rc != 0) {
                    throw failedOperation(tx, "terrace_pool_txn_free", rc);
                }
            } catch (Throwable t) {
                if (implicit) {
                    abortLevel(tx);
                }
                throw NativeLibrary.rethrow(t);
            }
            if (implicit) {
                commitOrThrow(tx);
            }
        } else {
            long size = regular ? memory.get(JAVA_LONG, handle) : 0;
            if (regular) {
                memory.set(JAVA_LONG, handle, FREED_SIZE);
                persist(handle, SIZE_HEADER);
            }
            int rc;
            try {
                rc = (int) PoolNative.FREE_OFF.invokeExact(pool, handle);
            } catch (Throwable t) {
                throw NativeLibrary.rethrow(t);
            }
            if (rc != 0) {
                if (regular) {
                    memory.set(JAVA_LONG, handle, size);
                    persist(handle, SIZE_HEADER);
                }
                throw heapFailure("freeing block " + handle, rc);
            }
        }
    }

    /**
     * The usable size of the live block at handle.
     *
     * @throws IllegalArgumentException if handle is not a live block of this heap
     */
    final long objectSize(long handle) {
        long usable = usableSize(handle);
        long type = typeOf(handle);
        if (type != TYPE_REGULAR && type != TYPE_COMPACT) {
            throw notABlock(handle);
        }
        return usable;
    }

    private long usableSize(long handle) {
        long usable = usableSizeOrZero(handle);
        if (usable == 0) {
            throw notABlock(handle);
        }
        return usable;
    }

    /** The pool's usable size of the object at handle, 0 if it is not a live object. */
    private long usableSizeOrZero(long handle) {
        try {
            return (long) PoolNative.USABLE_SIZE.invokeExact(pool, handle);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    private long typeOf(long handle) {
        try {
            return (long) PoolNative.TYPE_NUM.invokeExact(pool, handle);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    private IllegalArgumentException notABlock(long handle) {
        return new IllegalArgumentException("handle " + handle + " is not a live block of heap "
                + path);
    }

    /**
     * Whether handle is a live block (regular or compact) of this heap, asked of the pool's
     * object table (two short downcalls), whatever {@value #VALIDATE_HANDLES_PROPERTY} says.
     *
     * @throws IllegalStateException if the heap is closed
     */
    public boolean isLiveHandle(long handle) {
        if (handle <= 0 || handle >= memory.byteSize() || (handle & (HANDLE_ALIGN - 1)) != 0) {
            checkOpen();
            return false;
        }
        if (usableSizeOrZero(handle) == 0) {
            return false;
        }
        long type = typeOf(handle);
        return type == TYPE_REGULAR || type == TYPE_COMPACT;
    }

    /** Whether this heap validates every handle natively ({@value #VALIDATE_HANDLES_PROPERTY}). */
    public boolean validatesHandles() {
        return validateHandles;
    }

    private void checkOpen() {
        if (closed) {
            throw new IllegalStateException("heap " + path + " is closed");
        }
    }

    /** See {@link HeapAccess.Bridge#attach}. */
    private synchronized <T extends AutoCloseable> T attach(Supplier<T> opener) {
        if (closed || closing) {
            throw new IllegalStateException("heap " + path + " is closing or closed");
        }
        T dependent = opener.get();
        dependents.add(dependent);
        return dependent;
    }

    /**
     * Closes the dependents (ordered maps of dev.terrace.collections) before the heap: each
     * waits for its calls in flight. The first failure is rethrown after trying them all.
     */
    private void closeDependents() {
        List<AutoCloseable> open = new ArrayList<>(dependents);
        RuntimeException failure = null;
        for (AutoCloseable dependent : open) {
            try {
                dependent.close();
                dependents.remove(dependent);
            } catch (Exception e) {
                RuntimeException r = e instanceof RuntimeException re ? re
                        : new IllegalStateException("closing " + dependent + " failed", e);
                if (failure == null) {
                    failure = r;
                } else {
                    failure.addSuppressed(r);
                }
            }
        }
        if (failure != null) {
            throw failure;
        }
    }

    /**
     * The payload of the block at handle. Regular blocks, by default: checked in Java only
     * (handle positive, aligned, in the pool; size header positive and fitting in the pool
     * after it), no downcall. Compact blocks, and every block when the heap validates
     * handles: checked against the pool's object table (the object exists, has the block
     * type asked for, and, regular, its size header fits in it), two short critical
     * downcalls. No per-access cost afterwards: accesses are bounded by the returned slice.
     */
    final MemorySegment blockPayload(long handle, boolean compact) {
        if (!compact && !validateHandles) {
            return regularPayloadUnchecked(handle);
        }
        long usable = usableSize(handle);
        long type = typeOf(handle);
        if (compact) {
            if (type != TYPE_COMPACT) {
                throw type == TYPE_REGULAR
                        ? new IllegalArgumentException("handle " + handle
                                + " is a regular block: use memoryBlockFromHandle")
                        : notABlock(handle);
            }
            return memory.asSlice(handle, usable);
        }
        if (type != TYPE_REGULAR) {
            throw type == TYPE_COMPACT
                    ? new IllegalArgumentException("handle " + handle
                            + " is a compact block: use compactMemoryBlockFromHandle")
                    : notABlock(handle);
        }
        long size = memory.get(JAVA_LONG, handle);
        if (size < 0 || size > usable - SIZE_HEADER) {
            throw new IllegalArgumentException("handle " + handle + " has a corrupt size header ("
                    + size + " bytes in an object of " + usable + ")");
        }
        return memory.asSlice(handle + SIZE_HEADER, size);
    }

    /**
     * A regular block's payload from its handle and its own size header, without asking the
     * pool: every byte of the returned slice lies in the pool segment, whatever handle is.
     */
    private MemorySegment regularPayloadUnchecked(long handle) {
        MemorySegment m = memory;
        long poolSize = m.byteSize();
        if (handle <= 0 || handle > poolSize - SIZE_HEADER || (handle & (HANDLE_ALIGN - 1)) != 0) {
            throw new IllegalArgumentException("handle " + handle + " is not a block of heap "
                    + path + " (outside the pool or misaligned)");
        }
        // aligned by the check above: the unaligned layout only spares the JIT a second check
        long size = m.get(ValueLayout.JAVA_LONG_UNALIGNED, handle);
        long payload = handle + SIZE_HEADER;
        if (size <= 0 || size > poolSize - payload) {
            if (size == FREED_SIZE) {
                throw new IllegalArgumentException("handle " + handle + " of heap " + path
                        + " is a freed block");
            }
            throw new IllegalArgumentException("handle " + handle + " is not a regular block of"
                    + " heap " + path + " (its size header reads " + size + ")");
        }
        return m.asSlice(payload, size);
    }

    // ---- durability hooks of the flavours ----

    /**
     * Called before a store of len bytes at pool offset off of block (null: the root word),
     * bounds already checked. Returns true when it began an implicit transaction that
     * {@link #afterWrite} must commit.
     */
    abstract boolean beforeWrite(MemoryAccessor block, long off, long len);

    /** Called after the store: persist, or commit the implicit transaction. */
    abstract void afterWrite(long off, long len, boolean implicit);

    /** Called when the store itself threw: abort the implicit transaction, if any. */
    final void failedWrite(boolean implicit) {
        if (implicit) {
            abortLevel(ThreadTransaction.current());
        }
    }

    /** Makes [off, off+len) of the pool durable. */
    final void persist(long off, long len) {
        int rc;
        try {
            rc = (int) PoolNative.PERSIST.invokeExact(pool, memory.asSlice(off, len), len);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (rc != 0) {
            throw NativeLibrary.failure("terrace_pool_persist", rc);
        }
    }

    /** Snapshots [off, off+len) into tx, the thread's transaction (which is on this heap). */
    final void addRange(ThreadTransaction tx, long off, long len) {
        int rc;
        try {
            long txn = liveTxn(tx);
            rc = persistBlocks
                    ? (int) PoolNative.TXN_ADD_RANGE.invokeExact(txn, off, len)
                    : (int) PoolNative.TXN_ADD_RANGE_CRITICAL.invokeExact(txn, off, len);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (rc != 0) {
            throw failedOperation(tx, "terrace_pool_txn_add_range", rc);
        }
    }

    /** Throws unless the calling thread's transaction is on this heap. */
    final ThreadTransaction requireTransaction() {
        ThreadTransaction tx = ThreadTransaction.current();
        if (tx.heap != this) {
            throw new TransactionException("no transaction of this thread is on heap " + path
                    + " (use Transaction.create)", EINVAL);
        }
        return tx;
    }

    // ---- transactions (Java bookkeeping in step with the native ones) ----

    /**
     * Begins (or nests) the thread's transaction on this heap: the outermost level passes the
     * close gate and begins the native transaction; inner levels are counted only.
     */
    final ThreadTransaction enterTransaction() {
        ThreadTransaction tx = ThreadTransaction.current();
        if (tx.depth > 0) {
            if (tx.heap != this) {
                throw new TransactionException("this thread's transaction is on heap "
                        + tx.heap.path + ", not " + path + ": one heap per transaction", EINVAL);
            }
            tx.depth++;
            return tx;
        }
        activeTransactions.incrementAndGet();
        if (closing) {
            activeTransactions.decrementAndGet();
            throw new IllegalStateException("heap " + path + " is closing or closed");
        }
        long txn;
        try {
            txn = beginNative();
        } catch (Throwable t) {
            activeTransactions.decrementAndGet();
            throw NativeLibrary.rethrow(t);
        }
        tx.heap = this;
        tx.txn = txn;
        tx.errnum = 0;
        tx.epoch++;
        tx.depth = 1;
        return tx;
    }

    /**
     * A new native transaction. The native call never waits for a lane: while every lane is
     * busy this thread yields, then parks for a growing while (up to a millisecond), and
     * retries, so a virtual thread gives its carrier back to the (possibly unmounted) virtual
     * threads whose transactions hold the lanes, instead of pinning it in a native wait that
     * could starve them. (Yielding alone is not enough: a yielded virtual thread may be run
     * again before a woken one, so busy waiters could keep every carrier.)
     */
    private long beginNative() throws Throwable {
        MemorySegment state = NativeLibrary.callState();
        for (int attempt = 1;; attempt++) {
            long txn = persistBlocks
                    ? (long) PoolNative.TXN_BEGIN.invokeExact(state, poolAddress,
                            PoolNative.TXN_NOWAIT)
                    : (long) PoolNative.TXN_BEGIN_CRITICAL.invokeExact(state, poolAddress,
                            PoolNative.TXN_NOWAIT);
            if (txn != 0) {
                return txn;
            }
            int code = NativeLibrary.errno();
            if (code != EAGAIN) {
                throw new TransactionException(
                        NativeLibrary.failure("terrace_pool_txn_begin", code).getMessage(), code);
            }
            if (attempt <= LANE_WAIT_YIELDS) {
                Thread.yield();
            } else {
                LockSupport.parkNanos(Math.min(LANE_WAIT_MAX_NANOS,
                        1_000L << Math.min(attempt - LANE_WAIT_YIELDS, 10)));
            }
        }
    }

    /**
     * The native transaction of tx, or a {@link TransactionException} if it was rolled back
     * (an abort or a failed operation): the rest of the transaction's work fails.
     */
    private static long liveTxn(ThreadTransaction tx) {
        if (tx.txn == 0) {
            throw new TransactionException("the transaction was rolled back (errno " + tx.errnum
                    + "): its remaining work cannot run", TransactionException.ECANCELED);
        }
        return tx.txn;
    }

    /** Rolls tx's native transaction back now (a failed operation or an abort): see above. */
    final void rollBackNow(ThreadTransaction tx, int code) {
        if (tx.errnum == 0) {
            tx.errnum = code;
        }
        long txn = tx.txn;
        if (txn == 0) {
            return;
        }
        tx.txn = 0;
        for (MemoryAccessor block : tx.allocated) {
            block.invalidate();
        }
        tx.allocated.clear();
        try {
            int ignored = (int) PoolNative.TXN_ABORT.invokeExact(txn);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    /** What a failed transactional operation throws, after rolling the transaction back. */
    private TransactionException failedOperation(ThreadTransaction tx, String what, int code) {
        TransactionException e = new TransactionException(
                NativeLibrary.failure(what, code).getMessage(), code);
        rollBackNow(tx, code);
        return e;
    }

    /**
     * Commits the innermost level (the outermost commits the native transaction); returns 0
     * or the errno of what rolled the transaction back.
     */
    final int commitLevel(ThreadTransaction tx) {
        if (tx.depth > 1) {
            tx.depth--;
            return tx.errnum;
        }
        int rc = tx.errnum;
        long txn = tx.txn;
        if (txn != 0) {
            tx.txn = 0;
            try {
                rc = persistBlocks
                        ? (int) PoolNative.TXN_COMMIT.invokeExact(txn)
                        : (int) PoolNative.TXN_COMMIT_CRITICAL.invokeExact(txn);
            } catch (Throwable t) {
                leaveOutermost(tx, true);
                throw NativeLibrary.rethrow(t);
            }
        }
        leaveOutermost(tx, rc != 0);
        return rc;
    }

    final void commitOrThrow(ThreadTransaction tx) {
        int rc = commitLevel(tx);
        if (rc != 0) {
            throw new TransactionException("transaction on heap " + path
                    + " was rolled back (errno " + rc + ")", rc);
        }
    }

    /** Rolls back the whole transaction and ends the innermost level. */
    final void abortLevel(ThreadTransaction tx) {
        try {
            rollBackNow(tx, TransactionException.ECANCELED);
        } finally {
            if (tx.depth > 1) {
                tx.depth--;
            } else {
                leaveOutermost(tx, true);
            }
        }
    }

    private void leaveOutermost(ThreadTransaction tx, boolean rolledBack) {
        if (rolledBack) {
            for (MemoryAccessor block : tx.allocated) {
                block.invalidate();
            }
        }
        tx.allocated.clear();
        tx.depth = 0;
        tx.heap = null;
        tx.txn = 0;
        activeTransactions.decrementAndGet();
    }

    /** Runs body in a transaction on this heap ({@link TransactionalHeap}) or directly. */
    public abstract void execute(Runnable body);

    /** Runs body in a transaction on this heap ({@link TransactionalHeap}) or directly. */
    public abstract <T> T execute(Supplier<T> body);

    // ---- introspection ----

    /** The pool's space accounting now. */
    public PoolStats stats() {
        try (Arena out = Arena.ofConfined()) {
            MemorySegment s = out.allocate(JAVA_LONG, 7);
            int rc = (int) PoolNative.STATS.invokeExact(pool, s);
            NativeLibrary.check("terrace_pool_stats", rc);
            return new PoolStats(s.getAtIndex(JAVA_LONG, 0), s.getAtIndex(JAVA_LONG, 1),
                    s.getAtIndex(JAVA_LONG, 2), s.getAtIndex(JAVA_LONG, 3),
                    s.getAtIndex(JAVA_LONG, 4), s.getAtIndex(JAVA_LONG, 5),
                    s.getAtIndex(JAVA_LONG, 6));
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    /**
     * Calls action with the handle of every live block (regular and compact; not the root), in
     * handle order: a leak check compares these with the blocks reachable from the root.
     */
    public synchronized void forEachHandle(LongConsumer action) {
        try {
            for (long h = (long) PoolNative.FIRST.invokeExact(pool, ANY_TYPE); h != 0;
                    h = (long) PoolNative.NEXT.invokeExact(pool, h)) {
                action.accept(h);
            }
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    // ---- closing ----

    /**
     * Closes the heap: every block, accessor and range of it becomes unusable (their use throws
     * {@link IllegalStateException}), then the pool file is unmapped. Ordered maps of
     * {@code dev.terrace.collections} open on this heap are closed first (their iterators
     * with them). Closing twice does nothing.
     *
     * @throws IllegalStateException while a transaction is active on this heap, or while
     *     another thread is inside a call on it (the heap stays open; a transaction that
     *     began racing with the refused close may have seen it closing)
     */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closing = true;
        if (activeTransactions.get() != 0) {
            closing = false;
            throw new IllegalStateException("heap " + path + " has an active transaction");
        }
        try {
            closeDependents();
        } catch (RuntimeException e) {
            closing = false;
            throw e;
        }
        try {
            arena.close();
        } catch (RuntimeException e) {
            closing = false;
            throw e;
        }
        closed = true;
        int rc;
        try {
            rc = (int) PoolNative.CLOSE.invokeExact(rawPool);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (rc != 0) {
            throw heapFailure("closing heap " + path, rc);
        }
    }

    @Override
    public String toString() {
        return getClass().getSimpleName() + "[" + path + (closed ? ", closed]" : "]");
    }
}

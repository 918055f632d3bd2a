package dev.terrace.pool;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_SHORT_UNALIGNED;

import java.lang.foreign.MemorySegment;
import java.util.Objects;
import java.util.function.Consumer;
import java.util.function.Function;

/**
 * Reads and writes one block's payload: what memory blocks and accessors share.
 *
 * <p>Owns a view: the block's handle and a segment over exactly its payload (a slice of the
 * heap's pool segment, so it dies with the heap, and never reaches outside the pool even when
 * the handle came unvalidated from the caller). Loads and stores are plain Java on that
 * segment, with no downcall: an offset outside the payload throws
 * {@link IndexOutOfBoundsException}, a use after the heap closed throws
 * {@link IllegalStateException}, and so does a use after this view freed the block or after
 * the transaction that allocated it was rolled back. Stores go through the heap's
 * {@link AnyHeap#beforeWrite}/{@link AnyHeap#afterWrite}, and their bounds are checked before
 * anything is logged or persisted. Offsets are payload offsets (a regular block's size header
 * is not addressable), unaligned access is allowed.
 */
public abstract sealed class MemoryAccessor permits AnyMemoryBlock, AnyAccessor {
    final AnyHeap heap;
    final boolean compact;
    private long handle;
    private MemorySegment segment;
    /** Pool offset of payload byte 0. */
    private long payloadOffset;
    private boolean valid;
    /** The transaction that allocated the block, while {@link #freshEpoch} is its epoch. */
    private ThreadTransaction freshTx;
    private long freshEpoch;

    MemoryAccessor(AnyHeap heap, boolean compact) {
        this.heap = heap;
        this.compact = compact;
    }

    /**
     * Points this view at the block handle, checked by {@link AnyHeap#blockPayload}: the
     * segment lies inside the pool segment whatever handle is.
     */
    final void point(long newHandle) {
        MemorySegment payload = heap.blockPayload(newHandle, compact);
        this.handle = newHandle;
        this.segment = payload;
        this.payloadOffset = compact ? newHandle : newHandle + AnyHeap.SIZE_HEADER;
        this.valid = true;
    }

    /**
     * Points this view at a block this heap just allocated with size payload bytes (a compact
     * block spans its usable size, as it does when viewed from its handle later).
     */
    final void pointAtNew(long newHandle, long size) {
        this.handle = newHandle;
        this.payloadOffset = compact ? newHandle : newHandle + AnyHeap.SIZE_HEADER;
        this.segment = heap.memory.asSlice(payloadOffset,
                compact ? heap.objectSize(newHandle) : size);
        this.valid = true;
    }

    /** Records that tx, the calling thread's transaction, allocated the block. */
    final void markFresh(ThreadTransaction tx) {
        freshTx = tx;
        freshEpoch = tx.epoch;
    }

    /**
     * Whether tx (the calling thread's transaction) is running and allocated this block: its
     * stores need no snapshot, since an abort frees the block.
     */
    final boolean isFreshIn(ThreadTransaction tx) {
        return freshTx == tx && freshEpoch == tx.epoch && tx.depth > 0;
    }

    final void invalidate() {
        valid = false;
        segment = null;
    }

    /** The heap this view belongs to. */
    public abstract AnyHeap heap();

    /** The block's handle: its pool offset, stable across reopening (0 when not pointed). */
    public long handle() {
        checkValid();
        return handle;
    }

    /** Whether the view points at a block it may use (not freed through it, heap open). */
    public boolean isValid() {
        return valid && heap.isOpen();
    }

    /**
     * The payload size: a regular block's requested size, or a compact block's usable size
     * (its requested size rounded up to its allocation class).
     */
    public long size() {
        return segment().byteSize();
    }

    final MemorySegment segment() {
        if (!valid) {
            throw new IllegalStateException(handle == 0
                    ? "this accessor points at no block (call handle(long))"
                    : "block " + handle + " was freed (or its allocation rolled back)");
        }
        return segment;
    }

    final long payloadOffset() {
        return payloadOffset;
    }

    void checkValid() {
        segment();
    }

    // ---- loads ----

    public byte getByte(long offset) {
        return segment().get(JAVA_BYTE, offset);
    }

    public short getShort(long offset) {
        return segment().get(JAVA_SHORT_UNALIGNED, offset);
    }

    public int getInt(long offset) {
        return segment().get(JAVA_INT_UNALIGNED, offset);
    }

    public long getLong(long offset) {
        return segment().get(JAVA_LONG_UNALIGNED, offset);
    }

    /** Copies length bytes from the block at srcOffset into dst[dstIndex..]. */
    public void copyToArray(long srcOffset, byte[] dst, int dstIndex, int length) {
        MemorySegment.copy(segment(), JAVA_BYTE, srcOffset, dst, dstIndex, length);
    }

    // ---- stores ----

    /** The segment, after checking [offset, offset+length) lies in the payload. */
    final MemorySegment writable(long offset, long length) {
        MemorySegment s = segment();
        Objects.checkFromIndexSize(offset, length, s.byteSize());
        return s;
    }

    /** A store into the payload segment, at offsets the caller checked. */
    @FunctionalInterface
    private interface Store {
        void into(MemorySegment payload);
    }

    /**
     * The one store protocol: bounds of [offset, offset+length) checked, then the heap's
     * {@link AnyHeap#beforeWrite} (snapshot, or an implicit transaction), the store, and
     * {@link AnyHeap#afterWrite} (persist, or commit); a store that throws ends an implicit
     * transaction with {@link AnyHeap#failedWrite}.
     */
    private void store(long offset, long length, Store store) {
        MemorySegment s = writable(offset, length);
        long at = payloadOffset + offset;
        boolean implicit = heap.beforeWrite(this, at, length);
        try {
            store.into(s);
        } catch (RuntimeException e) {
            heap.failedWrite(implicit);
            throw e;
        }
        heap.afterWrite(at, length, implicit);
    }

    public void setByte(long offset, byte value) {
        store(offset, Byte.BYTES, s -> s.set(JAVA_BYTE, offset, value));
    }

    public void setShort(long offset, short value) {
        store(offset, Short.BYTES, s -> s.set(JAVA_SHORT_UNALIGNED, offset, value));
    }

    public void setInt(long offset, int value) {
        store(offset, Integer.BYTES, s -> s.set(JAVA_INT_UNALIGNED, offset, value));
    }

    public void setLong(long offset, long value) {
        store(offset, Long.BYTES, s -> s.set(JAVA_LONG_UNALIGNED, offset, value));
    }

    /** Copies length bytes of src[srcIndex..] into the block at dstOffset. */
    public void copyFromArray(byte[] src, int srcIndex, long dstOffset, int length) {
        Objects.checkFromIndexSize(srcIndex, length, src.length);
        store(dstOffset, length, s -> MemorySegment.copy(src, srcIndex, s, JAVA_BYTE, dstOffset,
                length));
    }

    /** Copies length bytes of another block or accessor (of any heap) at srcOffset here. */
    public void copyFrom(MemoryAccessor src, long srcOffset, long dstOffset, long length) {
        MemorySegment from = src.segment();
        Objects.checkFromIndexSize(srcOffset, length, from.byteSize());
        store(dstOffset, length, s -> MemorySegment.copy(from, srcOffset, s, dstOffset, length));
    }

    /** Sets length bytes at offset to value. */
    public void setMemory(byte value, long offset, long length) {
        MemorySegment s = writable(offset, length);
        long at = payloadOffset + offset;
        boolean implicit = heap.beforeWrite(this, at, length);
        try {
            s.asSlice(offset, length).fill(value);
        } catch (RuntimeException e) {
            heap.failedWrite(implicit);
            throw e;
        }
        heap.afterWrite(at, length, implicit);
    }

    // ---- ranges ----

    /**
     * Runs op on a {@link Range} over [offset, offset+length) whose stores are plain: the
     * flavour pays once for the window (one undo-log snapshot on a transactional heap, one
     * persist at the end on a persistent heap, nothing on a raw heap). The range is invalid
     * after op returns.
     */
    // Both shapes are LLPL's: a lambda with a void body picks this one, a value-returning one
    // the Function overload.
    @SuppressWarnings("overloads")
    public void withRange(long offset, long length, Consumer<Range> op) {
        withRange(offset, length, (Function<Range, Void>) range -> {
            op.accept(range);
            return null;
        });
    }

    /** As {@link #withRange(long, long, Consumer)}, returning what op returns. */
    @SuppressWarnings("overloads")
    public <T> T withRange(long offset, long length, Function<Range, T> op) {
        writable(offset, length);
        long at = payloadOffset + offset;
        boolean implicit = heap.beforeWrite(this, at, length);
        Range range = new Range(this, offset, length);
        T result;
        try {
            result = op.apply(range);
        } catch (Throwable t) {
            range.invalidate();
            heap.failedWrite(implicit);
            throw t;
        }
        range.invalidate();
        heap.afterWrite(at, length, implicit);
        return result;
    }

    /** {@link #withRange(long, long, Consumer)} over the whole payload. */
    public void withRange(Consumer<Range> op) {
        withRange(0, size(), op);
    }

    /** Runs an allocation's initializer on a range over the whole new block (plain stores). */
    final void initialize(Consumer<Range> initializer) {
        Range range = new Range(this, 0, size());
        try {
            initializer.accept(range);
        } finally {
            range.invalidate();
        }
    }

    // ---- raw-heap extras (public on the raw flavour's classes) ----

    final void flushRange(long offset, long length) {
        writable(offset, length);
        heap.persist(payloadOffset + offset, length);
    }

    final void addRangeToTransaction(long offset, long length) {
        writable(offset, length);
        heap.addRange(heap.requireTransaction(), payloadOffset + offset, length);
    }

    /** Frees the block this view points at; the view becomes invalid. */
    final void freeBlock(boolean transactional) {
        checkValid();
        heap.freeObject(handle, transactional, !compact);
        invalidate();
    }

    @Override
    public String toString() {
        return getClass().getSimpleName() + "[handle " + handle + (valid ? "" : ", invalid") + "]";
    }
}

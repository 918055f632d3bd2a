package dev.terrace.kinds;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * One allocation from a {@link Kind}, owned by this object: {@link #close()} frees it, after
 * which {@link #segment()} (and every slice of it) throws {@link IllegalStateException} on
 * access instead of touching freed memory. Out-of-bounds access throws
 * {@link IndexOutOfBoundsException}.
 *
 * <p>Invariant: while this is open its kind stays open (the kind refuses to close). A
 * confined one ({@link Kind#allocateOwned}) may be used and closed only by the thread that
 * allocated it; a shared one ({@link Kind#allocateOwnedShared}) by any thread. Closing twice
 * does nothing.
 */
public final class OwnedSegment implements AutoCloseable {
    private final Kind kind;
    private final Arena arena;
    private final MemorySegment segment;

    private OwnedSegment(Kind kind, Arena arena, MemorySegment segment) {
        this.kind = kind;
        this.arena = arena;
        this.segment = segment;
    }

    static OwnedSegment allocate(Kind kind, Arena arena, long size) {
        Kind.checkSizeAndAlignment(size, 1);
        kind.retain();
        long address;
        try {
            address = kind.malloc(Math.max(size, 1));
        } catch (RuntimeException | Error e) {
            kind.release();
            arena.close();
            throw e;
        }
        MemorySegment segment = MemorySegment.ofAddress(address)
                .reinterpret(size, arena, ignored -> Kind.free(address));
        return new OwnedSegment(kind, arena, segment);
    }

    /** The allocation; inaccessible after {@link #close()}. */
    public MemorySegment segment() {
        return segment;
    }

    /** The kind it came from. */
    public Kind kind() {
        return kind;
    }

    /** Whether it has not been freed yet. */
    public boolean isOpen() {
        return arena.scope().isAlive();
    }

    /** Frees the allocation; does nothing if already freed. */
    @Override
    public void close() {
        if (!arena.scope().isAlive()) {
            return;
        }
        arena.close();
        kind.release();
    }
}

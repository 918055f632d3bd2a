package dev.terrace.kinds;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * An {@link Arena} whose segments come from a {@link Kind}: {@link #close()} frees every
 * segment it allocated, and from then on those segments throw {@link IllegalStateException}
 * on access (use after free cannot reach freed memory). Out-of-bounds access throws
 * {@link IndexOutOfBoundsException}, as for any segment.
 *
 * <p>Invariants: while open, it keeps its kind open (the kind refuses to close). A confined
 * arena ({@link #ofConfined}) is used and closed by its owner thread only; a shared one
 * ({@link #ofShared}) by any thread. Unlike the {@link Arena} contract, closing twice does
 * nothing instead of throwing.
 */
public final class KindArena implements Arena {
    private final Kind kind;
    private final Arena scope;

    private KindArena(Kind kind, Arena scope) {
        this.kind = kind;
        this.scope = scope;
    }

    /** An arena over {@code kind} confined to the calling thread. */
    public static KindArena ofConfined(Kind kind) {
        kind.retain();
        return new KindArena(kind, Arena.ofConfined());
    }

    /** An arena over {@code kind} that any thread may use and close. */
    public static KindArena ofShared(Kind kind) {
        kind.retain();
        return new KindArena(kind, Arena.ofShared());
    }

    /** The kind its segments come from. */
    public Kind kind() {
        return kind;
    }

    /**
     * A segment of {@code byteSize} bytes (not zeroed; use {@link #allocate(long, long)} then
     * {@code fill}, or the {@code allocateFrom} methods, which copy) aligned to
     * {@code byteAlignment}, freed when this arena closes.
     *
     * @throws KindOutOfMemoryError if the kind is full
     * @throws IllegalStateException if this arena is closed
     */
    @Override
    public MemorySegment allocate(long byteSize, long byteAlignment) {
        Kind.checkSizeAndAlignment(byteSize, byteAlignment);
        if (!scope.scope().isAlive()) {
            throw new IllegalStateException("this KindArena over " + kind + " is closed");
        }
        long address = kind.mallocAligned(byteSize, byteAlignment);
        try {
            return MemorySegment.ofAddress(address)
                    .reinterpret(byteSize, scope, ignored -> Kind.free(address));
        } catch (RuntimeException | Error e) {
            Kind.free(address);
            throw e;
        }
    }

    @Override
    public MemorySegment.Scope scope() {
        return scope.scope();
    }

    /** Frees every segment of this arena; does nothing if already closed. */
    @Override
    public void close() {
        if (!scope.scope().isAlive()) {
            return;
        }
        scope.close();
        kind.release();
    }
}

package dev.terrace.kinds.adapter;

import dev.terrace.kinds.Kind;
import dev.terrace.kinds.KindOutOfMemoryError;
import java.lang.foreign.MemorySegment;

/**
 * {@link HazelcastMemoryAllocator} over a {@link Kind}: {@code allocate} is
 * {@code terrace_calloc}, {@code reallocate} is {@code terrace_realloc} plus zeroing of the
 * grown tail, {@code free} is {@code terrace_free} (by address; the size is not needed, the
 * owning kind is found in O(1)).
 *
 * <p>Failures throw {@link KindOutOfMemoryError} (an {@link OutOfMemoryError}, as Hazelcast's
 * {@code NativeOutOfMemoryError} is) when the kind is full, and leave a reallocated block
 * untouched. Size 0 and negative sizes are {@link IllegalArgumentException}s. Thread-safe.
 * {@link #dispose()} closes the kind only if this allocator was made to own it.
 */
public final class TerraceHazelcastAllocator implements HazelcastMemoryAllocator {
    private final Kind kind;
    private final boolean ownsKind;

    /** An allocator over {@code kind}; {@code dispose} leaves the kind open. */
    public TerraceHazelcastAllocator(Kind kind) {
        this(kind, false);
    }

    /** An allocator over {@code kind}; with {@code ownsKind}, {@code dispose} closes it. */
    public TerraceHazelcastAllocator(Kind kind, boolean ownsKind) {
        this.kind = kind;
        this.ownsKind = ownsKind;
    }

    @Override
    public long allocate(long size) {
        if (size <= 0) {
            throw new IllegalArgumentException("size must be > 0, got " + size);
        }
        return kind.calloc(size);
    }

    @Override
    public long reallocate(long address, long currentSize, long newSize) {
        if (newSize <= 0 || currentSize < 0) {
            throw new IllegalArgumentException("sizes must be > 0, got current " + currentSize
                    + ", new " + newSize);
        }
        if (address == NULL_ADDRESS) {
            return allocate(newSize);
        }
        long moved = kind.realloc(address, newSize);
        if (newSize > currentSize) {
            MemorySegment.ofAddress(moved).reinterpret(newSize).asSlice(currentSize).fill((byte) 0);
        }
        return moved;
    }

    @Override
    public void free(long address, long size) {
        Kind.free(address);
    }

    @Override
    public void dispose() {
        if (ownsKind) {
            kind.close();
        }
    }
}

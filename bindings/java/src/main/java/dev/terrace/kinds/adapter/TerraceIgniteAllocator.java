package dev.terrace.kinds.adapter;

import dev.terrace.kinds.Kind;
import dev.terrace.kinds.KindOutOfMemoryError;

/**
 * {@link IgniteMemoryAllocator} over a {@link Kind}: {@code allocateMemory} is
 * {@code terrace_malloc} and returns 0 when the kind is full (Ignite's contract);
 * {@code freeMemory} is {@code terrace_free}. Other failures (a closed kind) throw.
 * Thread-safe; the kind stays the caller's to close.
 */
public final class TerraceIgniteAllocator implements IgniteMemoryAllocator {
    private final Kind kind;

    public TerraceIgniteAllocator(Kind kind) {
        this.kind = kind;
    }

    @Override
    public long allocateMemory(long size) {
        if (size <= 0) {
            return 0;
        }
        try {
            return kind.malloc(size);
        } catch (KindOutOfMemoryError e) {
            return 0;
        }
    }

    @Override
    public void freeMemory(long addr) {
        Kind.free(addr);
    }
}

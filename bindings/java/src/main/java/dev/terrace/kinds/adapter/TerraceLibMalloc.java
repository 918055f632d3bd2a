package dev.terrace.kinds.adapter;

import dev.terrace.kinds.Kind;
import dev.terrace.kinds.KindOutOfMemoryError;

/**
 * {@link LibMalloc} over a {@link Kind}: {@code terrace_malloc}, {@code terrace_realloc},
 * {@code terrace_free}. A full kind gives {@link #NULL_ADDRESS}, as memkind's NULL does in
 * Hazelcast's {@code MemkindMalloc}; other failures (a closed kind, size 0) throw. A unified
 * round-robin kind stands in for {@code MemkindPmemMalloc}'s several heaps. Thread-safe.
 * {@link #dispose()} closes the kind only if this object was made to own it.
 */
public final class TerraceLibMalloc implements LibMalloc {
    private final Kind kind;
    private final boolean ownsKind;

    /** A LibMalloc over {@code kind}; {@code dispose} leaves the kind open. */
    public TerraceLibMalloc(Kind kind) {
        this(kind, false);
    }

    /** A LibMalloc over {@code kind}; with {@code ownsKind}, {@code dispose} closes it. */
    public TerraceLibMalloc(Kind kind, boolean ownsKind) {
        this.kind = kind;
        this.ownsKind = ownsKind;
    }

    @Override
    public long malloc(long size) {
        try {
            return kind.malloc(size);
        } catch (KindOutOfMemoryError e) {
            return NULL_ADDRESS;
        }
    }

    @Override
    public long realloc(long address, long size) {
        try {
            return kind.realloc(address, size);
        } catch (KindOutOfMemoryError e) {
            return NULL_ADDRESS;
        }
    }

    @Override
    public void free(long address) {
        Kind.free(address);
    }

    @Override
    public void dispose() {
        if (ownsKind) {
            kind.close();
        }
    }
}

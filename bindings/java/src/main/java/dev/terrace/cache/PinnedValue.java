package dev.terrace.cache;

import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;

/**
 * A zero-copy hit: the value read in place in the cache's segment, which stays valid and
 * unchanged until {@link #close()} releases the pin ({@code terrace_cache_release}).
 *
 * <p>Invariants: {@link #value()} is read-only, bounded (reading past it throws
 * {@link IndexOutOfBoundsException}) and confined to the thread that pinned it; after
 * {@link #close()} any access to it throws {@link IllegalStateException}. While a pin is open
 * its cache refuses to close. A pin delays the reuse of one segment: close it soon. Closing
 * twice does nothing.
 */
public final class PinnedValue implements AutoCloseable {
    private final TerraceCache cache;
    private final Arena arena;
    private final MemorySegment value;
    private final int flags;
    private final long cas;

    PinnedValue(TerraceCache cache, Arena arena, MemorySegment value, int flags, long cas) {
        this.cache = cache;
        this.arena = arena;
        this.value = value;
        this.flags = flags;
        this.cas = cas;
    }

    /** The value in place (read-only); invalid after {@link #close()}. */
    public MemorySegment value() {
        return value;
    }

    /** The value copied to a new array. */
    public byte[] toByteArray() {
        return value.toArray(java.lang.foreign.ValueLayout.JAVA_BYTE);
    }

    /** The client flags stored with the item. */
    public int flags() {
        return flags;
    }

    /** The item's CAS. */
    public long cas() {
        return cas;
    }

    /** Whether the pin is still held. */
    public boolean isOpen() {
        return arena.scope().isAlive();
    }

    /** Releases the pin; the value is inaccessible afterwards. Does nothing if released. */
    @Override
    public void close() {
        if (!arena.scope().isAlive()) {
            return;
        }
        arena.close();
        cache.unpinned();
    }
}

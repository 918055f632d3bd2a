package dev.terrace.kinds.adapter;

/**
 * The shape of Hazelcast Enterprise's {@code com.hazelcast.internal.memory.impl.LibMalloc}
 * (the interface its {@code MemkindMalloc} and {@code MemkindPmemMalloc} implement), so that
 * code written against it can run on {@link TerraceLibMalloc}.
 *
 * <p>Contract: {@link #malloc} and {@link #realloc} return {@link #NULL_ADDRESS} when memory
 * runs out (the caller, Hazelcast's memory manager, turns that into its own error);
 * {@link #realloc} keeps the data but does not zero the new tail, like C's realloc.
 */
public interface LibMalloc {
    /** The NULL pointer. */
    long NULL_ADDRESS = 0L;

    /** Allocates {@code size} bytes (not zeroed), or returns {@link #NULL_ADDRESS}. */
    long malloc(long size);

    /** Resizes a block keeping its data, or returns {@link #NULL_ADDRESS} (block untouched). */
    long realloc(long address, long size);

    /** Frees a block by its address. */
    void free(long address);

    /** Releases the allocator's resources (Hazelcast's {@code Disposable}). */
    void dispose();
}

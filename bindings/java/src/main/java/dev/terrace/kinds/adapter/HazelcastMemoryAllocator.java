package dev.terrace.kinds.adapter;

/**
 * The shape of Hazelcast OSS's {@code com.hazelcast.internal.memory.MemoryAllocator}, method for
 * method, so a Hazelcast fork or shim can delegate to {@link TerraceHazelcastAllocator} without
 * this library depending on Hazelcast's jars.
 *
 * <p>Contract (Hazelcast's): {@link #allocate} returns zeroed memory and throws an
 * {@link OutOfMemoryError} (Hazelcast: {@code NativeOutOfMemoryError}) when it cannot;
 * {@link #reallocate} keeps the first {@code min(currentSize, newSize)} bytes and zeroes
 * {@code [currentSize, newSize)}; {@link #free} releases a block by its address.
 */
public interface HazelcastMemoryAllocator {
    /** The NULL pointer. */
    long NULL_ADDRESS = 0L;

    /** Allocates {@code size} zeroed bytes; throws an {@link OutOfMemoryError} on failure. */
    long allocate(long size);

    /** Resizes a block, keeping its data and zero-extending the new tail. */
    long reallocate(long address, long currentSize, long newSize);

    /** Frees a block ({@code size} is its allocated size, informative only). */
    void free(long address, long size);

    /** Releases the allocator's resources; it must not be used afterwards. */
    void dispose();
}

package dev.terrace.kinds.adapter;

/**
 * The shape of Apache Ignite's {@code org.apache.ignite.mem.MemoryAllocator} (the allocator of
 * a data region), so an Ignite node can place a data region on a Terrace kind through
 * {@link TerraceIgniteAllocator} without this library depending on Ignite's jars.
 *
 * <p>Contract: {@link #allocateMemory} returns 0 when it cannot allocate (Ignite then reports
 * the region as out of memory); {@link #freeMemory} frees by address.
 */
public interface IgniteMemoryAllocator {
    /** Allocates {@code size} bytes, or returns 0. */
    long allocateMemory(long size);

    /** Frees memory returned by {@link #allocateMemory}. */
    void freeMemory(long addr);
}

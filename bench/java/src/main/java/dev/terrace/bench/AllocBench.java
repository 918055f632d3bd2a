package dev.terrace.bench;

import java.lang.foreign.Arena;
import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;

/**
 * Suite A, pairs: one allocation and its free, ns per pair. Nothing is written into the
 * block (Unsafe and the kinds do not touch it), but Arena.allocate zeroes it (that is its
 * contract), so the arena row includes a memset. A pair reuses the block just freed, so at
 * large sizes it measures the allocators' caches; AllocBatchBench measures fresh memory.
 * Engines: see {@link Allocator}, plus arena (Arena.ofConfined, allocate, close).
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
public class AllocBench {
    @Param({"terrace-dram", "terrace-file", "memkind-dram", "memkind-pmem", "memkind-pmem-hog",
            "unsafe", "arena"})
    public String engine;

    @Param({"64", "512", "4096", "65536", "1048576", "4194304"})
    public long size;

    private Allocator allocator;

    @Setup
    public void setup() {
        if (!engine.equals("arena")) {
            allocator = new Allocator(engine);
        }
    }

    @TearDown
    public void tearDown() {
        if (allocator != null) {
            allocator.close();
        }
    }

    @Benchmark
    public long allocFree() {
        if (allocator == null) {
            try (Arena arena = Arena.ofConfined()) {
                return arena.allocate(size).address();
            }
        }
        long a = allocator.malloc(size);
        allocator.free(a);
        return a;
    }
}

package dev.terrace.bench;

import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OperationsPerInvocation;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;

/**
 * Suite A, batches, as memkind's own anchor (memkind_speed.c) measures: one shot of BATCH
 * allocations followed by their BATCH frees; ns per allocation + free. Memory is never the
 * block just freed, so the cost of getting file space shows.
 * state=cold: a kind created fresh for each iteration (outside the timing, for every
 * engine): every block is new file space (memkind's pmem kind maps and faults new extents;
 * Terrace's file kind reserves and faults its file blocks). state=warm: one kind per fork,
 * so every shot after the first reuses what earlier shots freed (memkind's pmem kind punches
 * holes on free unless MEMKIND_HOG_MEMORY=1). memkind_speed.c measures each size after
 * the smaller ones on one kind, which is warm for Terrace's kind and cold for memkind's pmem
 * kind. memkind-dram is MEMKIND_DEFAULT, which cannot be created fresh: always warm. Each fork
 * first runs 20,000 64 B pairs on a throw-away kind so that the shots run compiled code.
 */
@State(Scope.Thread)
@BenchmarkMode(Mode.SingleShotTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
public class AllocBatchBench {
    static final int BATCH = 256;

    @Param({"terrace-dram", "terrace-file", "memkind-dram", "memkind-pmem", "memkind-pmem-hog"})
    public String engine;

    @Param({"65536", "1048576"})
    public long size;

    @Param({"cold", "warm"})
    public String state;

    private Allocator allocator;
    private final long[] addresses = new long[BATCH];

    /** Compiles the malloc and free paths first, on a throw-away kind of the same engine. */
    @Setup(Level.Trial)
    public void warmJit() {
        try (Allocator warm = new Allocator(engine)) {
            for (int i = 0; i < 20000; i++) {
                warm.free(warm.malloc(64));
            }
        }
    }

    @Setup(Level.Iteration)
    public void setup() {
        if (allocator == null) {
            allocator = new Allocator(engine);
        }
    }

    @TearDown(Level.Iteration)
    public void tearDown() {
        if (state.equals("cold")) {
            allocator.close();
            allocator = null;
        }
    }

    @TearDown(Level.Trial)
    public void close() {
        if (allocator != null) {
            allocator.close();
        }
    }

    @Benchmark
    @OperationsPerInvocation(BATCH)
    public long allocThenFree() {
        long[] a = addresses;
        for (int i = 0; i < BATCH; i++) {
            a[i] = allocator.malloc(size);
        }
        for (int i = 0; i < BATCH; i++) {
            allocator.free(a[i]);
        }
        return a[0];
    }
}

package dev.terrace.bench;

import com.intel.pmem.llpl.Heap;
import com.intel.pmem.llpl.MemoryBlock;
import com.intel.pmem.llpl.PersistentHeap;
import com.intel.pmem.llpl.PersistentMemoryBlock;
import com.intel.pmem.llpl.Transaction;
import com.intel.pmem.llpl.TransactionalHeap;
import com.intel.pmem.llpl.TransactionalMemoryBlock;
import java.io.File;
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
 * Suite B: Terrace's LLPL-shaped heaps (dev.terrace.pool) against LLPL 1.2.0 (libpmemobj
 * 1.12 with PMEM_IS_PMEM_FORCE=1), heaps of 256 MiB in DIR (/dev/shm). Both sides are the
 * same code with the other library's classes (the binding keeps LLPL's names).
 *
 * txAlloc: BATCH transactions, each allocating a 100 B memory block and copying 100 B into
 * it; the blocks are freed after each invocation, outside the timing, for both.
 * durableSet: a durable setLong on a persistent heap's block (LLPL's PersistentMemoryBlock
 * flushes each set itself), over 64 cache lines in turn. setFlush: a raw heap's setLong
 * followed by flush(offset, 8). handleRead: memoryBlockFromHandle + getLong(0) over 1024
 * blocks of a transactional heap.
 */
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
public class PoolBench {
    static final String DIR = System.getProperty("bench.dir", "/dev/shm");
    static final long HEAP_BYTES = 256L << 20;
    static final int BATCH = 256;

    static String heapPath(String what) {
        String p = DIR + "/bench-" + what + "-" + ProcessHandle.current().pid() + "-"
                + System.nanoTime() + ".heap";
        new File(p).delete();
        return p;
    }

    static void delete(String path) {
        new File(path).delete();
    }

    /** One transactional heap of the engine's, created per trial and deleted after it. */
    @State(Scope.Thread)
    public abstract static class TransactionalHeapState {
        @Param({"terrace", "llpl"})
        public String engine;
        String path;
        TransactionalHeap llpl;
        dev.terrace.pool.TransactionalHeap terrace;

        /** Creates the heap, then lets the state fill it. */
        @Setup(Level.Trial)
        public void createHeap() {
            path = heapPath(getClass().getSimpleName());
            if (engine.equals("llpl")) {
                llpl = TransactionalHeap.createHeap(path, HEAP_BYTES);
            } else {
                terrace = dev.terrace.pool.TransactionalHeap.createHeap(path, HEAP_BYTES);
            }
            fill();
        }

        void fill() {}

        @TearDown(Level.Trial)
        public void deleteHeap() {
            if (terrace != null) {
                terrace.close();
            }
            delete(path);
        }
    }

    @State(Scope.Thread)
    public static class TxAlloc extends TransactionalHeapState {
        final long[] handles = new long[BATCH];
        final byte[] data = new byte[100];

        @TearDown(Level.Invocation)
        public void freeBatch() {
            for (long h : handles) {
                if (llpl != null) {
                    llpl.memoryBlockFromHandle(h).free();
                } else {
                    terrace.memoryBlockFromHandle(h).free();
                }
            }
        }
    }

    @Benchmark
    @OperationsPerInvocation(BATCH)
    public long txAlloc(TxAlloc s) {
        long sum = 0;
        if (s.llpl != null) {
            TransactionalHeap heap = s.llpl;
            byte[] data = s.data;
            for (int i = 0; i < BATCH; i++) {
                long h = Transaction.create(heap, () -> {
                    TransactionalMemoryBlock b = heap.allocateMemoryBlock(100);
                    b.copyFromArray(data, 0, 0, 100);
                    return b.handle();
                });
                s.handles[i] = h;
                sum += h;
            }
        } else {
            dev.terrace.pool.TransactionalHeap heap = s.terrace;
            byte[] data = s.data;
            for (int i = 0; i < BATCH; i++) {
                long h = dev.terrace.pool.Transaction.create(heap, () -> {
                    dev.terrace.pool.TransactionalMemoryBlock b = heap.allocateMemoryBlock(100);
                    b.copyFromArray(data, 0, 0, 100);
                    return b.handle();
                });
                s.handles[i] = h;
                sum += h;
            }
        }
        return sum;
    }

    @State(Scope.Thread)
    public static class Durable {
        @Param({"terrace", "llpl"})
        public String engine;
        String persistentPath, rawPath;
        PersistentMemoryBlock llplDurable;
        MemoryBlock llplRaw;
        dev.terrace.pool.PersistentHeap terraceDurableHeap;
        dev.terrace.pool.Heap terraceRawHeap;
        dev.terrace.pool.PersistentMemoryBlock terraceDurable;
        dev.terrace.pool.MemoryBlock terraceRaw;
        int i;

        @Setup(Level.Trial)
        public void setup() {
            persistentPath = heapPath("durable");
            rawPath = heapPath("raw");
            if (engine.equals("llpl")) {
                llplDurable = PersistentHeap.createHeap(persistentPath, HEAP_BYTES)
                        .allocateMemoryBlock(4096);
                llplRaw = Heap.createHeap(rawPath, HEAP_BYTES).allocateMemoryBlock(4096);
            } else {
                terraceDurableHeap = dev.terrace.pool.PersistentHeap.createHeap(persistentPath,
                        HEAP_BYTES);
                terraceDurable = terraceDurableHeap.allocateMemoryBlock(4096);
                terraceRawHeap = dev.terrace.pool.Heap.createHeap(rawPath, HEAP_BYTES);
                terraceRaw = terraceRawHeap.allocateMemoryBlock(4096);
            }
        }

        @TearDown(Level.Trial)
        public void tearDown() {
            if (terraceDurableHeap != null) {
                terraceDurableHeap.close();
                terraceRawHeap.close();
            }
            delete(persistentPath);
            delete(rawPath);
        }
    }

    @Benchmark
    public void durableSet(Durable s) {
        long off = (long) (s.i++ & 63) * 64;
        if (s.llplDurable != null) {
            s.llplDurable.setLong(off, off);
        } else {
            s.terraceDurable.setLong(off, off);
        }
    }

    @Benchmark
    public void setFlush(Durable s) {
        long off = (long) (s.i++ & 63) * 64;
        if (s.llplRaw != null) {
            s.llplRaw.setLong(off, off);
            s.llplRaw.flush(off, 8);
        } else {
            s.terraceRaw.setLong(off, off);
            s.terraceRaw.flush(off, 8);
        }
    }

    @State(Scope.Thread)
    public static class Read extends TransactionalHeapState {
        final long[] handles = new long[1024];
        int i;

        @Override
        void fill() {
            if (llpl != null) {
                for (int k = 0; k < handles.length; k++) {
                    TransactionalMemoryBlock b = llpl.allocateMemoryBlock(100);
                    b.setLong(0, k);
                    handles[k] = b.handle();
                }
            } else {
                for (int k = 0; k < handles.length; k++) {
                    dev.terrace.pool.TransactionalMemoryBlock b = terrace.allocateMemoryBlock(100);
                    b.setLong(0, k);
                    handles[k] = b.handle();
                }
            }
        }
    }

    @Benchmark
    public long handleRead(Read s) {
        long h = s.handles[s.i++ & 1023];
        if (s.llpl != null) {
            return s.llpl.memoryBlockFromHandle(h).getLong(0);
        }
        return s.terrace.memoryBlockFromHandle(h).getLong(0);
    }
}

package dev.terrace.bench;

import java.util.concurrent.TimeUnit;
import org.openjdk.jmh.annotations.Benchmark;
import org.openjdk.jmh.annotations.BenchmarkMode;
import org.openjdk.jmh.annotations.Level;
import org.openjdk.jmh.annotations.Mode;
import org.openjdk.jmh.annotations.OutputTimeUnit;
import org.openjdk.jmh.annotations.Param;
import org.openjdk.jmh.annotations.Scope;
import org.openjdk.jmh.annotations.Setup;
import org.openjdk.jmh.annotations.State;
import org.openjdk.jmh.annotations.TearDown;

/**
 * Suite D: Terrace's persistent ordered map (dev.terrace.collections.ConcurrentLongIndex over
 * terrace_omap) against LLPL 1.2.0's ConcurrentLongART (libpmemobj 1.12, PMEM_IS_PMEM_FORCE=1),
 * a ConcurrentSkipListMap on the Java heap and MapDB 3.1.0's file-backed (mmap) treeMap, in
 * the same run with the same code for each (OrderedEngine). Heaps of HEAP_MIB in DIR
 * (/dev/shm); keys are random 16 bytes, values 8-byte longs.
 *
 * Each trial pre-fills KEYS entries (outside the timing). put: a new random key (a counter
 * through splitmix64, so no key repeats) into that map; the keys one iteration put are removed
 * after it, outside the timing, so every iteration starts from KEYS entries. get: a random
 * present key taken from the array of pre-filled keys (a random array slot and a random key
 * object: two cache misses that every engine pays). getMade: the same random key made from
 * its number (a 16-byte allocation and some arithmetic, no memory read), which leaves each
 * engine's own misses. scan100: 100 entries ascending from a random present key (inclusive),
 * summing their values, through each engine's iterator (closed after).
 */
@BenchmarkMode(Mode.AverageTime)
@OutputTimeUnit(TimeUnit.NANOSECONDS)
public class MapBench {
    static final int SCAN = 100;

    @State(Scope.Thread)
    public static class Maps {
        @Param({"terrace", "llpl", "skiplist", "mapdb"})
        public String engine;
        /** Entries pre-filled. */
        @Param({"200000"})
        public int keys;
        /** Where the heap and MapDB files go. */
        @Param({"/dev/shm"})
        public String dir;
        /** Size of the terrace and LLPL heaps (sparse until used on tmpfs). */
        @Param({"2048"})
        public int heapMiB;

        OrderedEngine map;
        String path;
        /** The pre-filled keys, made once: get and scan100 time no key making. */
        byte[][] present;
        /** The next key number put; keys [0, keys) are the pre-filled ones. */
        long next;
        long iterationStart;
        long rng = 0x9E3779B97F4A7C15L;

        @Setup(Level.Trial)
        public void fill() {
            path = dir + "/bench-map-" + engine + "-" + ProcessHandle.current().pid() + "-"
                    + System.nanoTime() + (engine.equals("mapdb") ? ".db" : ".heap");
            map = OrderedEngine.create(engine, path, (long) heapMiB << 20);
            present = new byte[keys][];
            for (int i = 0; i < keys; i++) {
                present[i] = OrderedEngine.key(i);
                map.put(present[i], OrderedEngine.value(i));
            }
            next = keys;
        }

        @Setup(Level.Iteration)
        public void mark() {
            iterationStart = next;
        }

        /** Removes what the iteration's puts added (nothing for get and scan100). */
        @TearDown(Level.Iteration)
        public void unput() {
            for (long i = iterationStart; i < next; i++) {
                map.remove(OrderedEngine.key(i));
            }
            next = iterationStart;
        }

        @TearDown(Level.Trial)
        public void close() {
            map.close();
        }

        /** A random pre-filled key number (xorshift). */
        int randomPresent() {
            long x = rng;
            x ^= x << 13;
            x ^= x >>> 7;
            x ^= x << 17;
            rng = x;
            return (int) ((x >>> 1) % keys);
        }
    }

    @Benchmark
    public void put(Maps s) {
        long i = s.next++;
        s.map.put(OrderedEngine.key(i), OrderedEngine.value(i));
    }

    @Benchmark
    public long get(Maps s) {
        return s.map.get(s.present[s.randomPresent()]);
    }

    @Benchmark
    public long getMade(Maps s) {
        return s.map.get(OrderedEngine.key(s.randomPresent()));
    }

    @Benchmark
    public long scan100(Maps s) {
        return s.map.scan(s.present[s.randomPresent()], SCAN);
    }
}

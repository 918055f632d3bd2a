package dev.terrace.bench;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
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
 * Suite C: one off-heap cache or map shared by the benchmark's threads (-t 1, -t 2), every
 * key written once before measuring (values of valueSize bytes), then keys drawn Zipf 0.99
 * from one table replayed by every engine. {@code mixed}: 9 gets then 1 set, ops/s.
 * {@code get}: gets only, sampled latency (p99 in the JSON's scorePercentiles). Equal bytes:
 * OHC, Caffeine and Terrace get capacityMiB; Chronicle Map is sized for every key and MapDB
 * is unbounded, so with the defaults (200k keys of 108 B in 64 MiB) every key fits in
 * every engine and hits are 100%.
 */
@State(Scope.Benchmark)
@OutputTimeUnit(TimeUnit.SECONDS)
public class CacheBench {
    @Param({"terrace", "ohc", "chronicle", "mapdb", "caffeine"})
    public String engine;

    @Param({"200000"})
    public int keys;

    @Param({"100"})
    public int valueSize;

    @Param({"64"})
    public int capacityMiB;

    static final int TABLE = 1 << 20;

    CacheEngine cache;
    int[] zipf;
    final AtomicInteger threadSeq = new AtomicInteger();

    @Setup(Level.Trial)
    public void setup() {
        cache = CacheEngine.create(engine, (long) capacityMiB << 20, keys, valueSize);
        byte[] v = new byte[valueSize];
        for (int i = 0; i < keys; i++) {
            v[0] = (byte) (i | 1);
            cache.put(i, v);
        }
        zipf = Zipf.table(keys, 0.99, TABLE, 42);
    }

    @TearDown(Level.Trial)
    public void tearDown() {
        cache.close();
    }

    @State(Scope.Thread)
    public static class Cursor {
        int pos;
        int n;
        byte[] value;

        @Setup(Level.Trial)
        public void setup(CacheBench b) {
            // each thread starts at its own place in the shared table
            pos = b.threadSeq.getAndIncrement() * (TABLE / 8);
            value = new byte[b.valueSize];
            value[0] = 7;
        }
    }

    @Benchmark
    @BenchmarkMode(Mode.Throughput)
    public int mixed(Cursor c) {
        int key = zipf[c.pos++ & (TABLE - 1)];
        if (++c.n == 10) {
            c.n = 0;
            cache.put(key, c.value);
            return 0;
        }
        return cache.get(key);
    }

    @Benchmark
    @BenchmarkMode(Mode.SampleTime)
    @OutputTimeUnit(TimeUnit.NANOSECONDS)
    public int get(Cursor c) {
        return cache.get(zipf[c.pos++ & (TABLE - 1)]);
    }
}

package dev.terrace.bench;

import com.intel.pmem.llpl.Heap;
import com.intel.pmem.llpl.HeapException;
import java.io.File;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryMXBean;

/**
 * One-shot measurements, printed as one JSON object per line:
 *
 * util: a raw Heap of POOL bytes (a file in DIR) filled with compact blocks (no 8-byte size
 * header) of one size, allocateCompactMemory until it throws, the same code for Terrace's
 * dev.terrace.pool and LLPL; utilization = objects * size / the pool file's size (for
 * Terrace also / its heap bytes, the pool less its header and metadata). Sizes 64 B, 256 B,
 * 4 KiB, 64 KiB, 1 MiB.
 *
 * heap: the Java heap that each cache engine's filled contents hold: used heap after a full
 * GC, with every key written once, minus used heap before creating the engine.
 *
 *   java ... dev.terrace.bench.OneShot util|heap [engines...]
 */
public final class OneShot {
    static final String DIR = System.getProperty("bench.dir", "/dev/shm");
    static final long POOL = Long.getLong("bench.pool", 256L << 20);
    static final long[] SIZES = {64, 256, 4096, 65536, 1 << 20};

    public static void main(String[] args) throws Exception {
        String what = args.length > 0 ? args[0] : "util";
        if (what.equals("util")) {
            for (String engine : args.length > 1 ? java.util.Arrays.copyOfRange(args, 1,
                    args.length) : new String[] {"terrace", "llpl"}) {
                for (long size : SIZES) {
                    util(engine, size);
                }
            }
        } else {
            int keys = Integer.getInteger("bench.keys", 200000);
            int valueSize = Integer.getInteger("bench.valueSize", 100);
            long cap = Long.getLong("bench.capacityMiB", 64) << 20;
            for (String engine : args.length > 1 ? java.util.Arrays.copyOfRange(args, 1,
                    args.length) : new String[] {"terrace", "ohc", "chronicle", "mapdb",
                        "caffeine"}) {
                heap(engine, keys, valueSize, cap);
            }
        }
    }

    static void util(String engine, long size) {
        // a path of its own each time: LLPL remembers every heap path it opened in-process
        String path = DIR + "/bench-util-" + engine + "-" + size + "-"
                + ProcessHandle.current().pid() + ".heap";
        new File(path).delete();
        long count = 0;
        String error = null;
        dev.terrace.pool.PoolStats stats = null;
        long fileBytes;
        try {
            if (engine.equals("llpl")) {
                Heap heap = Heap.createHeap(path, POOL);
                try {
                    while (true) {
                        heap.allocateCompactMemory(size);
                        count++;
                    }
                } catch (HeapException | OutOfMemoryError e) {
                    // full
                }
            } else {
                try (dev.terrace.pool.Heap heap = dev.terrace.pool.Heap.createHeap(path, POOL)) {
                    try {
                        while (true) {
                            heap.allocateCompactMemory(size);
                            count++;
                        }
                    } catch (dev.terrace.pool.HeapException | OutOfMemoryError e) {
                        // full
                    }
                    stats = heap.stats();
                }
            }
        } catch (RuntimeException e) {
            error = e.toString();
        }
        fileBytes = new File(path).length();
        new File(path).delete();
        double util = fileBytes == 0 ? 0 : (double) (count * size) / fileBytes;
        System.out.printf("{\"kind\":\"util\",\"engine\":\"%s\",\"size\":%d,\"objects\":%d,"
                + "\"pool_bytes\":%d,\"utilization\":%.4f%s%s}%n", engine, size, count, fileBytes,
                util, stats == null ? "" : String.format(",\"heap_bytes\":%d,"
                        + "\"vs_heap_bytes\":%.4f", stats.heapBytes(),
                        (double) (count * size) / stats.heapBytes()),
                error == null ? "" : ",\"error\":\"" + error.replace('"', '\'') + "\"");
    }

    static long usedAfterGc(MemoryMXBean m) throws InterruptedException {
        for (int i = 0; i < 3; i++) {
            System.gc();
            Thread.sleep(100);
        }
        return m.getHeapMemoryUsage().getUsed();
    }

    static void heap(String engine, int keys, int valueSize, long cap) throws Exception {
        MemoryMXBean m = ManagementFactory.getMemoryMXBean();
        long before = usedAfterGc(m);
        String error = null;
        long after = before;
        CacheEngine cache = null;
        try {
            cache = CacheEngine.create(engine, cap, keys, valueSize);
            byte[] v = new byte[valueSize];
            for (int i = 0; i < keys; i++) {
                v[0] = (byte) (i | 1);
                cache.put(i, v);
            }
            after = usedAfterGc(m);
            int hits = 0;
            for (int i = 0; i < keys; i++) {
                hits += cache.get(i) >= 0 ? 1 : 0;
            }
            System.out.printf("{\"kind\":\"heap\",\"engine\":\"%s\",\"keys\":%d,\"value_size\":%d,"
                    + "\"capacity\":%d,\"heap_delta_bytes\":%d,\"hits_after_fill\":%d}%n", engine,
                    keys, valueSize, cap, after - before, hits);
        } catch (RuntimeException | LinkageError e) {
            error = e.toString();
            System.out.printf("{\"kind\":\"heap\",\"engine\":\"%s\",\"error\":\"%s\"}%n", engine,
                    error.replace('"', '\''));
        } finally {
            if (cache != null) {
                cache.close();
            }
        }
    }
}

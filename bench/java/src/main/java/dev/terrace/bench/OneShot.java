package dev.terrace.bench;

import com.intel.pmem.llpl.Heap;
import com.intel.pmem.llpl.HeapException;
import com.intel.pmem.llpl.TransactionalHeap;
import com.intel.pmem.llpl.util.ConcurrentLongART;
import dev.terrace.collections.ConcurrentLongIndex;
import java.io.BufferedReader;
import java.io.File;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.lang.management.MemoryMXBean;
import java.util.ArrayList;
import java.util.List;

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
 * reopen (suite D): an ordered map of REOPEN_KEYS (bench.reopenKeys, 1M) random 16-byte keys
 * and 8-byte values is filled in a child JVM (terrace: ConcurrentLongIndex on a
 * TransactionalHeap; llpl: ConcurrentLongART on an LLPL TransactionalHeap, its handle in the
 * root), which exits; a second child JVM, after loading its engine's library on a small heap
 * of its own, times openHeap + opening the map + the first get until it returns. The terrace
 * fill also prints the pool's bytes per entry: what the map added to the pool's allocated
 * bytes (objects handed out) and to its used bytes (heap pages not free), over the entries.
 * Both heaps are bench.reopenHeapMiB (each of a comma-separated list: "512,2048") in turn:
 * opening a Terrace pool takes longer the larger the pool (12-20 ms for 2 GiB, 2-4 ms for
 * 256 MiB, measured here), LLPL's much less so.
 *
 *   java ... dev.terrace.bench.OneShot util|heap|reopen [engines...]
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
        } else if (what.equals("reopen")) {
            for (String mib : System.getProperty("bench.reopenHeapMiB", "512,2048").split(",")) {
                for (String engine : args.length > 1 ? java.util.Arrays.copyOfRange(args, 1,
                        args.length) : new String[] {"terrace", "llpl"}) {
                    reopen(engine, Long.parseLong(mib.trim()));
                }
            }
        } else if (what.equals("reopen-fill")) {
            reopenFill(args[1], args[2], Long.parseLong(args[3]));
        } else if (what.equals("reopen-open")) {
            reopenOpen(args[1], args[2], Long.parseLong(args[3]));
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

    // ---- reopen (suite D) ----

    static final int REOPEN_KEYS = Integer.getInteger("bench.reopenKeys", 1_000_000);
    static final String MAP_NAME = "reopen";

    static void reopen(String engine, long heapMiB) throws Exception {
        String path = DIR + "/bench-reopen-" + engine + "-" + ProcessHandle.current().pid()
                + ".heap";
        new File(path).delete();
        try {
            String mib = Long.toString(heapMiB);
            if (child("reopen-fill", engine, path, mib) == 0) {
                child("reopen-open", engine, path, mib);
            }
        } finally {
            new File(path).delete();
            new File(path + ".warm").delete();
        }
    }

    /** Runs OneShot in a child JVM with this JVM's flags, its stdout copied to ours. */
    static int child(String... args) throws Exception {
        List<String> cmd = new ArrayList<>();
        cmd.add(ProcessHandle.current().info().command().orElse("java"));
        cmd.addAll(ManagementFactory.getRuntimeMXBean().getInputArguments());
        cmd.add("-cp");
        cmd.add(System.getProperty("java.class.path"));
        cmd.add(OneShot.class.getName());
        cmd.addAll(List.of(args));
        Process p = new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.INHERIT).start();
        try (BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream()))) {
            for (String line; (line = out.readLine()) != null;) {
                System.out.println(line);
            }
        }
        int rc = p.waitFor();
        if (rc != 0) {
            System.out.printf("{\"kind\":\"reopen\",\"engine\":\"%s\",\"size\":%s,\"error\":"
                    + "\"%s exited with %d\"}%n", args[1], args[3], args[0], rc);
        }
        return rc;
    }

    static void reopenFill(String engine, String path, long heapMiB) {
        long heapBytes = heapMiB << 20;
        long t0 = System.nanoTime();
        if (engine.equals("terrace")) {
            try (dev.terrace.pool.TransactionalHeap heap =
                    dev.terrace.pool.TransactionalHeap.createHeap(path, heapBytes)) {
                dev.terrace.pool.PoolStats before = heap.stats();
                ConcurrentLongIndex index = new ConcurrentLongIndex(heap, MAP_NAME,
                        OrderedEngine.MAX_KEY);
                for (int i = 0; i < REOPEN_KEYS; i++) {
                    index.put(OrderedEngine.key(i), OrderedEngine.value(i));
                }
                long entries = index.size();
                dev.terrace.pool.PoolStats after = heap.stats();
                long allocated = after.allocatedBytes() - before.allocatedBytes();
                long used = (after.heapBytes() - after.freeBytes())
                        - (before.heapBytes() - before.freeBytes());
                System.out.printf("{\"kind\":\"bytes\",\"engine\":\"terrace\",\"size\":%d,"
                        + "\"keys\":%d,\"key_size\":16,\"value_size\":8,"
                        + "\"allocated_per_entry\":%.2f,\"used_per_entry\":%.2f,"
                        + "\"pool_allocated_bytes\":%d}%n", heapMiB, entries,
                        (double) allocated / entries, (double) used / entries,
                        after.allocatedBytes());
            } // closes the index, then the heap
        } else {
            TransactionalHeap heap = TransactionalHeap.createHeap(path, heapBytes);
            ConcurrentLongART art = new ConcurrentLongART(heap, OrderedEngine.LLPL_CONCURRENCY);
            heap.setRoot(art.handle());
            for (int i = 0; i < REOPEN_KEYS; i++) {
                art.put(OrderedEngine.key(i), OrderedEngine.value(i));
            }
            // LLPL 1.2 heaps have no close: every put is durable, the process exits
        }
        System.out.printf("{\"kind\":\"fill\",\"engine\":\"%s\",\"size\":%d,\"keys\":%d,"
                + "\"ms\":%.1f}%n", engine, heapMiB, REOPEN_KEYS, (System.nanoTime() - t0) / 1e6);
    }

    static void reopenOpen(String engine, String path, long heapMiB) {
        // load the engine's native library and classes first, on a small heap of its own
        String warm = path + ".warm";
        new File(warm).delete();
        byte[] k0 = OrderedEngine.key(0);
        if (engine.equals("terrace")) {
            try (dev.terrace.pool.TransactionalHeap heap =
                    dev.terrace.pool.TransactionalHeap.createHeap(warm, 16L << 20);
                    ConcurrentLongIndex index = new ConcurrentLongIndex(heap, MAP_NAME, 16)) {
                index.put(k0, 1);
                index.get(k0);
            }
        } else {
            TransactionalHeap heap = TransactionalHeap.createHeap(warm, 16L << 20);
            ConcurrentLongART art = new ConcurrentLongART(heap, OrderedEngine.LLPL_CONCURRENCY);
            heap.setRoot(art.handle());
            art.put(k0, 1);
            ConcurrentLongART.fromHandle(heap, heap.getRoot()).get(k0);
        }
        new File(warm).delete();

        long t0 = System.nanoTime();
        long v;
        long entries;
        double ms;
        if (engine.equals("terrace")) {
            dev.terrace.pool.TransactionalHeap heap =
                    dev.terrace.pool.TransactionalHeap.openHeap(path);
            ConcurrentLongIndex index = ConcurrentLongIndex.open(heap, MAP_NAME);
            v = index.get(k0);
            ms = (System.nanoTime() - t0) / 1e6;
            entries = index.size();
            heap.close();
        } else {
            TransactionalHeap heap = TransactionalHeap.openHeap(path);
            ConcurrentLongART art = ConcurrentLongART.fromHandle(heap, heap.getRoot());
            v = art.get(k0);
            ms = (System.nanoTime() - t0) / 1e6;
            entries = art.size();
        }
        System.out.printf("{\"kind\":\"reopen\",\"engine\":\"%s\",\"size\":%d,\"keys\":%d,"
                + "\"ms\":%.3f,\"first_get_ok\":%b,\"entries\":%d}%n", engine, heapMiB,
                REOPEN_KEYS, ms, v == OrderedEngine.value(0), entries);
    }
}

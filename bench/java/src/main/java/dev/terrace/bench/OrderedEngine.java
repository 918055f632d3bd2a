package dev.terrace.bench;

import com.intel.pmem.llpl.TransactionalHeap;
import com.intel.pmem.llpl.util.AutoCloseableIterator;
import com.intel.pmem.llpl.util.ConcurrentLongART;
import com.intel.pmem.llpl.util.LongART;
import dev.terrace.collections.ConcurrentLongIndex;
import java.io.File;
import java.util.Arrays;
import java.util.Iterator;
import java.util.Map;
import java.util.concurrent.ConcurrentNavigableMap;
import java.util.concurrent.ConcurrentSkipListMap;
import org.mapdb.DB;
import org.mapdb.DBMaker;
import org.mapdb.Serializer;

/**
 * One ordered byte[] → long map of suite D (MapBench, OneShot reopen), the same calls for every
 * engine: terrace (ConcurrentLongIndex on a dev.terrace.pool TransactionalHeap file), llpl
 * (ConcurrentLongART on an LLPL TransactionalHeap: libpmemobj, PMEM_IS_PMEM_FORCE=1 from the
 * script), skiplist (ConcurrentSkipListMap with Arrays::compareUnsigned, Java heap) and mapdb
 * (MapDB 3.1.0 treeMap, BYTE_ARRAY keys and LONG values, a file DB with mmap). Values are
 * never 0 (LLPL's get returns 0 for an absent key).
 */
interface OrderedEngine extends AutoCloseable {
    /** Max key length of the persistent maps (bench keys are 16 bytes). */
    int MAX_KEY = 16;
    /** LLPL's concurrencyLevel (a sizing hint of its dynamic sharder): single-threaded runs. */
    int LLPL_CONCURRENCY = 1;

    void put(byte[] key, long value);

    long get(byte[] key);

    void remove(byte[] key);

    /** The sum of the values of n entries ascending from key (inclusive). */
    long scan(byte[] from, int n);

    @Override
    void close();

    /** A new, empty map of the engine, its files (if any) at path. */
    static OrderedEngine create(String engine, String path, long heapBytes) {
        return switch (engine) {
            case "terrace" -> new Terrace(path, heapBytes);
            case "llpl" -> new Llpl(path, heapBytes);
            case "skiplist" -> new SkipList();
            case "mapdb" -> MapDb.open(path);
            default -> throw new IllegalArgumentException("unknown engine " + engine);
        };
    }

    final class Terrace implements OrderedEngine {
        final String path;
        final dev.terrace.pool.TransactionalHeap heap;
        final ConcurrentLongIndex index;

        Terrace(String path, long heapBytes) {
            this.path = path;
            new File(path).delete();
            heap = dev.terrace.pool.TransactionalHeap.createHeap(path, heapBytes);
            try {
                index = new ConcurrentLongIndex(heap, "bench", MAX_KEY);
            } catch (RuntimeException | Error e) {
                heap.close();
                new File(path).delete();
                throw e;
            }
        }

        @Override
        public void put(byte[] key, long value) {
            index.put(key, value);
        }

        @Override
        public long get(byte[] key) {
            return index.get(key);
        }

        @Override
        public void remove(byte[] key) {
            index.remove(key);
        }

        @Override
        public long scan(byte[] from, int n) {
            long sum = 0;
            try (var it = index.getTailEntryIterator(from, true)) {
                for (int i = 0; i < n && it.hasNext(); i++) {
                    sum += it.next().getValue();
                }
            }
            return sum;
        }

        @Override
        public void close() {
            heap.close(); // closes the index first
            new File(path).delete();
        }
    }

    final class Llpl implements OrderedEngine {
        final String path;
        final TransactionalHeap heap;
        final ConcurrentLongART art;

        Llpl(String path, long heapBytes) {
            this.path = path;
            new File(path).delete();
            heap = TransactionalHeap.createHeap(path, heapBytes);
            art = new ConcurrentLongART(heap, LLPL_CONCURRENCY);
            heap.setRoot(art.handle());
        }

        @Override
        public void put(byte[] key, long value) {
            art.put(key, value);
        }

        @Override
        public long get(byte[] key) {
            return art.get(key);
        }

        @Override
        public void remove(byte[] key) {
            art.remove(key, v -> {});
        }

        @Override
        public long scan(byte[] from, int n) {
            long sum = 0;
            try (AutoCloseableIterator<LongART.Entry> it = art.getTailEntryIterator(from, true)) {
                for (int i = 0; i < n && it.hasNext(); i++) {
                    sum += it.next().getValue();
                }
            } catch (Exception e) {
                throw new IllegalStateException(e);
            }
            return sum;
        }

        @Override
        public void close() {
            // LLPL 1.2 heaps have no close: the file goes, the mapping stays until exit
            new File(path).delete();
        }
    }

    /** An engine over a ConcurrentNavigableMap: the skip list and MapDB's tree differ in how
     * they are made and closed only. */
    abstract class Navigable implements OrderedEngine {
        final ConcurrentNavigableMap<byte[], Long> map;

        Navigable(ConcurrentNavigableMap<byte[], Long> map) {
            this.map = map;
        }

        @Override
        public void put(byte[] key, long value) {
            map.put(key, value);
        }

        @Override
        public long get(byte[] key) {
            Long v = map.get(key);
            return v == null ? 0 : v;
        }

        @Override
        public void remove(byte[] key) {
            map.remove(key);
        }

        @Override
        public long scan(byte[] from, int n) {
            return sum(map.tailMap(from, true), n);
        }
    }

    final class SkipList extends Navigable {
        SkipList() {
            super(new ConcurrentSkipListMap<>(Arrays::compareUnsigned));
        }

        @Override
        public void close() {
            map.clear();
        }
    }

    final class MapDb extends Navigable {
        final String path;
        final DB db;

        MapDb(String path, DB db) {
            super(db.treeMap("bench", Serializer.BYTE_ARRAY, Serializer.LONG).createOrOpen());
            this.path = path;
            this.db = db;
        }

        static MapDb open(String path) {
            new File(path).delete();
            return new MapDb(path, DBMaker.fileDB(path).fileMmapEnable().cleanerHackEnable()
                    .fileLockDisable().make());
        }

        @Override
        public void close() {
            db.close();
            new File(path).delete();
        }
    }

    private static long sum(Map<byte[], Long> tail, int n) {
        long sum = 0;
        Iterator<Map.Entry<byte[], Long>> it = tail.entrySet().iterator();
        for (int i = 0; i < n && it.hasNext(); i++) {
            sum += it.next().getValue();
        }
        return sum;
    }

    /** splitmix64: the bench's keys are two of these per index, so any index is a key. */
    static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xbf58476d1ce4e5b9L;
        z = (z ^ (z >>> 27)) * 0x94d049bb133111ebL;
        return z ^ (z >>> 31);
    }

    /** The 16-byte key number i (random-looking, distinct for distinct i). */
    static byte[] key(long i) {
        byte[] k = new byte[16];
        long a = mix(i * 0x9E3779B97F4A7C15L + 0x1234567L);
        long b = mix(a ^ i);
        for (int j = 0; j < 8; j++) {
            k[j] = (byte) (a >>> (56 - 8 * j));
            k[8 + j] = (byte) (b >>> (56 - 8 * j));
        }
        return k;
    }

    /** The value stored for key number i (never 0). */
    static long value(long i) {
        return i + 1;
    }
}

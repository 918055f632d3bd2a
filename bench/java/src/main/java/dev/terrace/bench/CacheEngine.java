package dev.terrace.bench;

import com.github.benmanes.caffeine.cache.Cache;
import com.github.benmanes.caffeine.cache.Caffeine;
import java.nio.ByteBuffer;
import java.util.concurrent.ConcurrentMap;
import net.openhft.chronicle.map.ChronicleMap;
import org.caffinitas.ohc.CacheSerializer;
import org.caffinitas.ohc.OHCache;
import org.caffinitas.ohc.OHCacheBuilder;
import org.mapdb.DB;
import org.mapdb.DBMaker;
import org.mapdb.Serializer;

/**
 * One off-heap map or cache behind the three calls the cache suite makes: long keys, values
 * of the given byte[] (100 B). get returns the value's length (-1: miss) after reading its
 * bytes; where the engine's API returns a fresh byte[] (OHC, Chronicle Map, MapDB) that copy
 * is on the Java heap, which is part of what is measured.
 */
interface CacheEngine extends AutoCloseable {
    void put(long key, byte[] value);

    int get(long key);

    @Override
    void close();

    static CacheEngine create(String name, long capacityBytes, int keys, int valueSize) {
        return switch (name) {
            case "terrace" -> TerraceCacheEngine.create(capacityBytes, keys, valueSize);
            case "ohc" -> new Ohc(capacityBytes);
            case "chronicle" -> new Chronicle(keys, valueSize);
            case "mapdb" -> new MapDb();
            case "caffeine" -> new CaffeineEngine(capacityBytes);
            default -> throw new IllegalArgumentException(name);
        };
    }

    static int consume(byte[] v) {
        return v == null ? -1 : v.length + (v[0] & 0xff);
    }

    /** OHC 0.7.4, linked implementation (its default), capacity in bytes. */
    final class Ohc implements CacheEngine {
        private static final CacheSerializer<Long> KEYS = new CacheSerializer<>() {
            public void serialize(Long k, ByteBuffer buf) {
                buf.putLong(k);
            }

            public Long deserialize(ByteBuffer buf) {
                return buf.getLong();
            }

            public int serializedSize(Long k) {
                return 8;
            }
        };
        private static final CacheSerializer<byte[]> VALUES = new CacheSerializer<>() {
            public void serialize(byte[] v, ByteBuffer buf) {
                buf.putInt(v.length);
                buf.put(v);
            }

            public byte[] deserialize(ByteBuffer buf) {
                byte[] v = new byte[buf.getInt()];
                buf.get(v);
                return v;
            }

            public int serializedSize(byte[] v) {
                return 4 + v.length;
            }
        };
        private final OHCache<Long, byte[]> cache;

        Ohc(long capacity) {
            cache = OHCacheBuilder.<Long, byte[]>newBuilder().keySerializer(KEYS)
                    .valueSerializer(VALUES).capacity(capacity).build();
        }

        public void put(long key, byte[] value) {
            cache.put(key, value);
        }

        public int get(long key) {
            return consume(cache.get(key));
        }

        public void close() {
            try {
                cache.close();
            } catch (java.io.IOException e) {
                throw new IllegalStateException(e);
            }
        }
    }

    /** Chronicle Map, in memory, sized for every key (it does not evict). */
    final class Chronicle implements CacheEngine {
        private final ChronicleMap<Long, byte[]> map;

        Chronicle(int keys, int valueSize) {
            map = ChronicleMap.of(Long.class, byte[].class).name("bench")
                    .entries(keys).averageValueSize(valueSize).create();
        }

        public void put(long key, byte[] value) {
            map.put(key, value);
        }

        public int get(long key) {
            return consume(map.get(key));
        }

        public void close() {
            map.close();
        }
    }

    /** MapDB 3.1.0 memoryDirectDB hashMap (off-heap direct buffers; no eviction). */
    final class MapDb implements CacheEngine {
        private final DB db;
        private final ConcurrentMap<Long, byte[]> map;

        MapDb() {
            db = DBMaker.memoryDirectDB().make();
            map = db.hashMap("bench", Serializer.LONG, Serializer.BYTE_ARRAY).createOrOpen();
        }

        public void put(long key, byte[] value) {
            map.put(key, value);
        }

        public int get(long key) {
            return consume(map.get(key));
        }

        public void close() {
            db.close();
        }
    }

    /** Caffeine 3.3.1 on the heap, weighed in key + value bytes; a put stores a copy. */
    final class CaffeineEngine implements CacheEngine {
        private final Cache<Long, byte[]> cache;

        CaffeineEngine(long capacity) {
            cache = Caffeine.newBuilder().maximumWeight(capacity)
                    .weigher((Long k, byte[] v) -> 8 + v.length).build();
        }

        public void put(long key, byte[] value) {
            cache.put(key, value.clone());
        }

        public int get(long key) {
            return consume(cache.getIfPresent(key));
        }

        public void close() {
            cache.invalidateAll();
        }
    }
}

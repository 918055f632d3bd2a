package dev.terrace.bench;

import dev.terrace.kinds.Kind;
import java.lang.reflect.Field;
import java.nio.file.Path;

/**
 * Suite A's engines behind one malloc/free pair (raw addresses, as Hazelcast's and Ignite's
 * allocator interfaces speak):
 * terrace-dram (Kind.dram(), its own arena), terrace-file (Kind.file on DIR, 1 GiB max),
 * memkind-dram (MEMKIND_DEFAULT), memkind-pmem (memkind_create_pmem on DIR, 1 GiB max,
 * memkind's defaults), memkind-pmem-hog (the same with MEMKIND_HOG_MEMORY=1, which Hazelcast's
 * MemkindHeap sets), unsafe (sun.misc.Unsafe.allocateMemory/freeMemory).
 * Frees: Kind.free(address) and memkind_free(NULL, address) both find the owner themselves.
 */
final class Allocator implements AutoCloseable {
    static final long MAX = 1L << 30;
    static final String DIR = System.getProperty("bench.dir", "/dev/shm");

    private final int which;
    private Kind kind;
    private long memkind;
    private boolean memkindOwned;
    private sun.misc.Unsafe unsafe;

    Allocator(String engine) {
        which = switch (engine) {
            case "terrace-dram", "terrace-file" -> 0;
            case "memkind-dram", "memkind-pmem", "memkind-pmem-hog" -> 1;
            case "unsafe" -> 2;
            default -> throw new IllegalArgumentException(engine);
        };
        switch (engine) {
            case "terrace-dram" -> kind = Kind.dram();
            case "terrace-file" -> kind = Kind.file(Path.of(DIR), MAX);
            case "memkind-dram" -> {
                Memkind.load(false);
                memkind = Memkind.defaultKind();
            }
            case "memkind-pmem" -> {
                Memkind.load(false);
                memkind = Memkind.createPmem(DIR, MAX);
                memkindOwned = true;
            }
            case "memkind-pmem-hog" -> {
                Memkind.load(true);
                memkind = Memkind.createPmem(DIR, MAX);
                memkindOwned = true;
            }
            default -> {
                try {
                    Field f = sun.misc.Unsafe.class.getDeclaredField("theUnsafe");
                    f.setAccessible(true);
                    unsafe = (sun.misc.Unsafe) f.get(null);
                } catch (ReflectiveOperationException e) {
                    throw new IllegalStateException(e);
                }
            }
        }
    }

    long malloc(long size) {
        switch (which) {
            case 0 -> {
                return kind.malloc(size);
            }
            case 1 -> {
                long a = Memkind.malloc(memkind, size);
                if (a == 0) {
                    throw new OutOfMemoryError("memkind_malloc(" + size + ")");
                }
                return a;
            }
            default -> {
                return unsafe.allocateMemory(size);
            }
        }
    }

    void free(long address) {
        switch (which) {
            case 0 -> Kind.free(address);
            case 1 -> Memkind.free(address);
            default -> unsafe.freeMemory(address);
        }
    }

    @Override
    public void close() {
        if (kind != null) {
            kind.close();
        }
        if (memkindOwned) {
            Memkind.destroy(memkind);
        }
    }
}

package dev.terrace.collections;

import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.Heap;
import dev.terrace.pool.PersistentHeap;
import dev.terrace.pool.TransactionalHeap;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.UUID;

/**
 * Heap files for one test (on /dev/shm where it exists), deleted by {@link #close()}, and
 * helpers shared by the collection tests.
 */
final class MapFixture implements AutoCloseable {
    static final long HEAP_SIZE = 64L << 20;

    /** Skips the calling test class when the loaded library predates the ordered map. */
    static void assumeSupported() {
        assumeTrue(ConcurrentLongIndex.isSupported(),
                "the loaded libterrace.so has no terrace_omap_* symbols (native side not built)");
    }

    private final List<Path> paths = new ArrayList<>();

    String newPath() {
        Path dir = Files.isDirectory(Path.of("/dev/shm")) ? Path.of("/dev/shm")
                : Path.of(System.getProperty("java.io.tmpdir"));
        Path path = dir.resolve("terrace-map-test-" + UUID.randomUUID() + ".heap");
        paths.add(path);
        return path.toString();
    }

    /** A new heap of the flavour: "raw", "persistent" or "transactional". */
    static AnyHeap create(String flavour, String path) {
        return switch (flavour) {
            case "raw" -> Heap.createHeap(path, HEAP_SIZE);
            case "persistent" -> PersistentHeap.createHeap(path, HEAP_SIZE);
            case "transactional" -> TransactionalHeap.createHeap(path, HEAP_SIZE);
            default -> throw new IllegalArgumentException(flavour);
        };
    }

    static AnyHeap open(String flavour, String path) {
        return switch (flavour) {
            case "raw" -> Heap.openHeap(path);
            case "persistent" -> PersistentHeap.openHeap(path);
            case "transactional" -> TransactionalHeap.openHeap(path);
            default -> throw new IllegalArgumentException(flavour);
        };
    }

    /** A random key of 1 to maxLen bytes: short ones make prefixes of longer ones. */
    static byte[] randomKey(Random random, int maxLen) {
        int len = 1 + (random.nextInt(4) == 0 ? random.nextInt(3) : random.nextInt(maxLen));
        byte[] key = new byte[len];
        for (int i = 0; i < len; i++) {
            // a small alphabet around 0x00, 0x7f/0x80 and 0xff: shared prefixes, signedness
            int pick = random.nextInt(6);
            key[i] = (byte) switch (pick) {
                case 0 -> 0x00;
                case 1 -> 0xff;
                case 2 -> 0x7f;
                case 3 -> 0x80;
                default -> random.nextInt(256);
            };
        }
        return key;
    }

    static String hex(byte[] b) {
        return java.util.HexFormat.of().formatHex(b);
    }

    /** The value the tests store for key: never 0. */
    static long valueOf(byte[] key) {
        return (Arrays.hashCode(key) * 0x9E3779B97F4A7C15L) | 1;
    }

    @Override
    public void close() {
        for (Path path : paths) {
            try {
                Files.deleteIfExists(path);
            } catch (IOException e) {
                throw new UncheckedIOException(e);
            }
        }
    }
}

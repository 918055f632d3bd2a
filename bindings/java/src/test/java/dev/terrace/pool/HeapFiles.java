package dev.terrace.pool;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.UUID;

/**
 * Heap file paths for one test, on /dev/shm where it exists (else the temporary directory),
 * not yet created; {@link #close()} deletes every one handed out.
 */
final class HeapFiles implements AutoCloseable {
    private final List<Path> paths = new ArrayList<>();

    /** A fresh path no file has. */
    String newPath() {
        Path dir = Files.isDirectory(Path.of("/dev/shm")) ? Path.of("/dev/shm")
                : Path.of(System.getProperty("java.io.tmpdir"));
        Path path = dir.resolve("terrace-pool-test-" + UUID.randomUUID() + ".heap");
        paths.add(path);
        return path.toString();
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

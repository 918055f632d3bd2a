package dev.terrace.kinds;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.stream.Stream;

/**
 * A kind for one test, of one of the sources the contract tests run over, and the temporary
 * directory (on /dev/shm where it exists) its files live in; {@link #close()} closes the
 * kind, its members, and deletes the directory.
 */
public final class KindFixture implements AutoCloseable {
    /** The kinds every adapter contract is checked against. */
    public enum Source {
        DEFAULT, DRAM, FILE, UNIFIED_ROUND_ROBIN
    }

    public static final long FILE_KIND_SIZE = 64L << 20;

    public final Kind kind;
    private final List<Kind> members = new ArrayList<>();
    private final Path dir;

    private KindFixture(Source source) {
        dir = tempDir();
        kind = switch (source) {
            case DEFAULT -> Kind.defaultKind();
            case DRAM -> Kind.dram();
            case FILE -> Kind.file(dir, FILE_KIND_SIZE);
            case UNIFIED_ROUND_ROBIN -> {
                members.add(Kind.file(dir, FILE_KIND_SIZE));
                members.add(Kind.file(dir, FILE_KIND_SIZE));
                yield Kind.unified(members, Kind.Strategy.ROUND_ROBIN);
            }
        };
    }

    public static KindFixture of(Source source) {
        return new KindFixture(source);
    }

    /** A fixture with a file kind of {@code maxSize} bytes. */
    public static KindFixture fileKind(long maxSize) {
        Path dir = tempDir();
        return new KindFixture(dir, Kind.file(dir, maxSize));
    }

    private KindFixture(Path dir, Kind kind) {
        this.dir = dir;
        this.kind = kind;
    }

    /** The temporary directory of this fixture (file kinds' files live there). */
    public Path dir() {
        return dir;
    }

    /** A fresh temporary directory, on /dev/shm where it exists. */
    public static Path tempDir() {
        try {
            Path shm = Path.of("/dev/shm");
            return Files.isDirectory(shm) && Files.isWritable(shm)
                    ? Files.createTempDirectory(shm, "terrace-java-")
                    : Files.createTempDirectory("terrace-java-");
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    /** Deletes {@code dir} and everything under it. */
    public static void deleteTree(Path dir) {
        if (!Files.exists(dir)) {
            return;
        }
        try (Stream<Path> paths = Files.walk(dir)) {
            for (Path p : paths.sorted(Comparator.reverseOrder()).toList()) {
                Files.deleteIfExists(p);
            }
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    @Override
    public void close() {
        kind.close();
        members.forEach(Kind::close);
        deleteTree(dir);
    }
}

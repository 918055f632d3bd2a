package dev.terrace.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import dev.terrace.internal.NativeLibrary;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.net.URISyntaxException;
import java.net.URL;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Crash consistency from Java: a child JVM ({@link KillChild}) runs random transactions on a
 * transactional heap and is SIGKILLed at a random moment; the heap is then reopened here and
 * must hold the list's invariant (count, sum and fills agree with the nodes) with no leak
 * (the live objects are exactly the root block and the reachable nodes) and no lost commit
 * counter. Rounds accumulate on one heap. {@value #DEFAULT_ROUNDS} rounds by default;
 * {@code -Dterrace.killRounds=N} runs N.
 */
class KillTest {
    static final int DEFAULT_ROUNDS = 30;
    private static final long READY_TIMEOUT_S = 60;

    private final HeapFiles files = new HeapFiles();

    @AfterEach
    void deleteFiles() {
        files.close();
    }

    @Test
    void sigkilledTransactionsLeaveAConsistentHeapWithNoLeak() throws Exception {
        int rounds = Integer.getInteger("terrace.killRounds", DEFAULT_ROUNDS);
        String path = files.newPath();
        try (TransactionalHeap heap = TransactionalHeap.createHeap(path, 16L << 20)) {
            heap.setRoot(heap.allocateMemoryBlock(KillChild.ROOT_SIZE).handle());
        }
        Random random = new Random();
        long seed = random.nextLong();
        random.setSeed(seed);
        long commits = 0;
        List<String> log = new ArrayList<>();
        for (int round = 1; round <= rounds; round++) {
            long delayMs = random.nextInt(300);
            runChildAndKill(path, random.nextLong(), delayMs);
            String where = "round " + round + " of " + rounds + " (seed " + seed + ", killed "
                    + delayMs + " ms after READY)";
            long newCommits = verify(path, where);
            assertTrue(newCommits > commits, where + ": no transaction committed");
            log.add(round + ":" + (newCommits - commits));
            commits = newCommits;
        }
        System.out.println("KillTest: " + rounds + " rounds consistent, no leak; "
                + commits + " transactions committed in all (round:commits " + log + ")");
    }

    private static void runChildAndKill(String path, long seed, long delayMs) throws Exception {
        List<String> command = new ArrayList<>();
        command.add(ProcessHandle.current().info().command().orElseThrow());
        command.add("--enable-native-access=ALL-UNNAMED");
        String library = libraryFile();
        if (library != null) {
            // the child loads the same file rather than extracting its own copy, which a
            // SIGKILL would leave behind
            command.add("-D" + NativeLibrary.PATH_PROPERTY + "=" + library);
        }
        command.add("-cp");
        command.add(System.getProperty("java.class.path"));
        command.add(KillChild.class.getName());
        command.add(path);
        command.add(Long.toString(seed));
        Process child = new ProcessBuilder(command).redirectErrorStream(true).start();
        List<String> output = new ArrayList<>();
        CompletableFuture<Boolean> ready = CompletableFuture.supplyAsync(() -> {
            try (BufferedReader reader = new BufferedReader(
                    new InputStreamReader(child.getInputStream(), StandardCharsets.UTF_8))) {
                for (String line; (line = reader.readLine()) != null; ) {
                    if (line.equals("READY")) {
                        return true;
                    }
                    synchronized (output) {
                        output.add(line);
                    }
                }
                return false;
            } catch (IOException e) {
                return false;
            }
        });
        try {
            if (!ready.get(READY_TIMEOUT_S, TimeUnit.SECONDS)) {
                child.waitFor(5, TimeUnit.SECONDS);
                synchronized (output) {
                    fail("child exited (" + (child.isAlive() ? "alive" : child.exitValue())
                            + ") before READY:\n" + String.join("\n", output));
                }
            }
            Thread.sleep(delayMs);
            assertTrue(child.isAlive(), "the child stopped on its own");
        } catch (TimeoutException e) {
            fail("no READY from the child in " + READY_TIMEOUT_S + " s");
        } finally {
            child.destroyForcibly(); // SIGKILL on Linux
            child.waitFor();
            child.getInputStream().close();
        }
        assertEquals(137, child.exitValue(), "the child must die of SIGKILL");
    }

    /** Checks the list after a crash; returns the committed-transaction counter. */
    private static long verify(String path, String where) {
        try (TransactionalHeap heap = TransactionalHeap.openHeap(path)) {
            TransactionalMemoryBlock root = heap.memoryBlockFromHandle(heap.getRoot());
            Set<Long> reachable = new HashSet<>();
            reachable.add(root.handle());
            long count = 0;
            long sum = 0;
            for (long h = root.getLong(KillChild.ROOT_HEAD); h != 0; ) {
                assertTrue(reachable.add(h), where + ": the list has a cycle at " + h);
                TransactionalMemoryBlock node = heap.memoryBlockFromHandle(h); // live, or throws
                long value = node.getLong(KillChild.NODE_VALUE);
                for (long i = KillChild.NODE_FILL; i < node.size(); i++) {
                    if (node.getByte(i) != (byte) value) {
                        fail(where + ": node " + h + " byte " + i + " is torn");
                    }
                }
                count++;
                sum += value;
                h = node.getLong(KillChild.NODE_NEXT);
            }
            assertEquals(root.getLong(KillChild.ROOT_COUNT), count, where + ": node count");
            assertEquals(root.getLong(KillChild.ROOT_SUM), sum, where + ": sum of values");
            Set<Long> live = new HashSet<>();
            heap.forEachHandle(live::add);
            Set<Long> leaked = new HashSet<>(live);
            leaked.removeAll(reachable);
            Set<Long> unallocated = new HashSet<>(reachable);
            unallocated.removeAll(live);
            assertTrue(leaked.isEmpty() && unallocated.isEmpty(), where + ": " + leaked.size()
                    + " live objects unreachable (leaked) " + first(leaked) + ", "
                    + unallocated.size() + " reachable but not live " + first(unallocated));
            return root.getLong(KillChild.ROOT_COMMITS);
        }
    }

    private static List<Long> first(Set<Long> handles) {
        return handles.stream().sorted().limit(10).toList();
    }

    /** The library file this JVM's class path carries, when it is a plain file. */
    private static String libraryFile() {
        String property = System.getProperty(NativeLibrary.PATH_PROPERTY);
        if (property != null && !property.isEmpty()) {
            return property;
        }
        URL url = NativeLibrary.class.getResource(NativeLibrary.RESOURCE);
        if (url == null || !url.getProtocol().equals("file")) {
            return null;
        }
        try {
            return Path.of(url.toURI()).toString();
        } catch (URISyntaxException e) {
            return null;
        }
    }
}

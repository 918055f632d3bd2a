package dev.terrace;

import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.terrace.kinds.Kind;
import dev.terrace.kinds.KindOutOfMemoryError;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import org.junit.jupiter.api.Test;

/**
 * The errno captured by a call belongs to the calling thread, on platform and virtual threads
 * alike: many short-lived threads each see their own failure's code.
 */
class CallStateTest {
    @Test
    void eachThreadSeesItsOwnErrno() throws Exception {
        try (ExecutorService threads = Executors.newVirtualThreadPerTaskExecutor()) {
            List<Future<Integer>> codes = new ArrayList<>();
            for (int i = 0; i < 2_000; i++) {
                codes.add(threads.submit(() -> {
                    try {
                        // More than any machine has: fails with ENOMEM, captured per thread.
                        Kind.defaultKind().malloc(Long.MAX_VALUE / 2);
                        return 0;
                    } catch (KindOutOfMemoryError e) {
                        return e.errno();
                    }
                }));
            }
            for (Future<Integer> code : codes) {
                assertEquals(12, (int) code.get(), "ENOMEM from this thread's own call");
            }
        }
    }
}

package dev.terrace.kinds.adapter;

import static org.junit.jupiter.api.Assertions.assertEquals;

import dev.terrace.kinds.Kind;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.LongFunction;
import java.util.function.LongUnaryOperator;

/** Helpers of the adapter contract tests: raw memory views, patterns, a 2-thread churn. */
final class RawMemory {
    private RawMemory() {}

    /** Sizes from 1 byte to 4 MiB, across jemalloc's small, large and huge classes. */
    static final long[] SIZES = {1, 2, 7, 8, 15, 16, 17, 100, 255, 4095, 4096, 4097, 65_536,
        100_000, 1 << 20, (3 << 20) + 5, 4 << 20};

    static MemorySegment at(long address, long size) {
        return MemorySegment.ofAddress(address).reinterpret(size);
    }

    /** Index of the first byte in {@code [from, to)} that is not {@code value}, or -1. */
    static long firstNot(long address, long from, long to, byte value) {
        MemorySegment s = at(address, to);
        for (long i = from; i < to; i++) {
            if (s.get(ValueLayout.JAVA_BYTE, i) != value) {
                return i;
            }
        }
        return -1;
    }

    /**
     * Leaves garbage where the next allocations of {@code size} bytes will land: allocates
     * some blocks from {@code kind}, fills them with 0xAB and frees them.
     */
    static void dirty(Kind kind, long size) {
        List<Long> blocks = new ArrayList<>();
        for (int i = 0; i < 4; i++) {
            long p = kind.malloc(size);
            at(p, size).fill((byte) 0xAB);
            blocks.add(p);
        }
        blocks.forEach(Kind::free);
    }

    /**
     * Two threads allocate, write a pattern, check it and free, many times, each keeping up to
     * 64 blocks live; rethrows the first failure.
     */
    static void churnOnTwoThreads(LongUnaryOperator allocate, LongFunction<Void> free)
            throws InterruptedException {
        AtomicReference<Throwable> failure = new AtomicReference<>();
        CountDownLatch start = new CountDownLatch(1);
        List<Thread> threads = new ArrayList<>();
        for (int t = 0; t < 2; t++) {
            byte mark = (byte) (t + 1);
            Thread thread = new Thread(() -> {
                try {
                    start.await();
                    ThreadLocalRandom random = ThreadLocalRandom.current();
                    List<long[]> live = new ArrayList<>();
                    for (int i = 0; i < 20_000; i++) {
                        long size = 1 + random.nextInt(i % 100 == 0 ? 200_000 : 2_000);
                        long p = allocate.applyAsLong(size);
                        at(p, size).fill(mark);
                        live.add(new long[] {p, size});
                        if (live.size() > 64 || random.nextBoolean()) {
                            long[] victim = live.remove(random.nextInt(live.size()));
                            assertEquals(-1, firstNot(victim[0], 0, victim[1], mark),
                                    "another thread wrote into this block");
                            free.apply(victim[0]);
                        }
                    }
                    for (long[] block : live) {
                        assertEquals(-1, firstNot(block[0], 0, block[1], mark));
                        free.apply(block[0]);
                    }
                } catch (Throwable e) {
                    failure.compareAndSet(null, e);
                }
            });
            thread.start();
            threads.add(thread);
        }
        start.countDown();
        for (Thread thread : threads) {
            thread.join();
        }
        if (failure.get() != null) {
            throw new AssertionError("a churn thread failed", failure.get());
        }
    }
}

package dev.terrace.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/** Transactions: commit, rollback of values and allocations, nesting, threads. */
class TransactionTest {
    private final HeapFiles files = new HeapFiles();
    private TransactionalHeap heap;

    @BeforeEach
    void createHeap() {
        heap = TransactionalHeap.createHeap(files.newPath(), 16L << 20);
    }

    @AfterEach
    void closeHeap() {
        heap.close();
        files.close();
    }

    @Test
    void anExceptionRollsBackValuesAndAllocationsAndIsRethrown() {
        TransactionalMemoryBlock block = heap.allocateMemoryBlock(64);
        block.setLong(0, 1);
        block.setInt(8, 2);
        heap.setRoot(block.handle());
        long allocatedBefore = heap.stats().allocatedBytes();
        List<TransactionalMemoryBlock> made = new ArrayList<>();
        IllegalStateException boom = new IllegalStateException("boom");

        IllegalStateException thrown = assertThrows(IllegalStateException.class,
                () -> Transaction.create(heap, () -> {
                    block.setLong(0, 100);
                    block.setInt(8, 200);
                    block.setMemory((byte) 7, 16, 48);
                    heap.setRoot(0);
                    for (int i = 0; i < 50; i++) {
                        made.add(heap.allocateMemoryBlock(100 + i));
                    }
                    made.add(heap.allocateMemoryBlock(1 << 20)); // a large extent too
                    throw boom;
                }));

        assertSame(boom, thrown);
        assertEquals(1, block.getLong(0));
        assertEquals(2, block.getInt(8));
        assertEquals(0, block.getByte(16));
        assertEquals(block.handle(), heap.getRoot());
        assertEquals(allocatedBefore, heap.stats().allocatedBytes(), "undone allocations leaked");
        for (TransactionalMemoryBlock undone : made) {
            assertFalse(undone.isValid());
            assertThrows(IllegalStateException.class, () -> undone.getLong(0));
        }
    }

    @Test
    void anUndoneFreeKeepsTheBlock() {
        TransactionalMemoryBlock block = heap.allocateMemoryBlock(32);
        block.setLong(0, 42);
        long handle = block.handle();
        assertThrows(ArithmeticException.class, () -> Transaction.create(heap, () -> {
            heap.freeMemory(handle);
            throw new ArithmeticException();
        }));
        assertEquals(42, heap.memoryBlockFromHandle(handle).getLong(0));
    }

    @Test
    void nestingIsFlattenedAndAnInnerAbortAbortsTheWhole() {
        TransactionalMemoryBlock block = heap.allocateMemoryBlock(16);
        Transaction outer = Transaction.create(heap);
        assertTrue(outer.isValid());
        outer.run(() -> {
            block.setLong(0, 1);
            Transaction.create(heap, () -> block.setLong(8, 2));
        });
        assertFalse(outer.isValid());
        assertEquals(1, block.getLong(0));
        assertEquals(2, block.getLong(8));

        // the inner body throws, the outer catches it and goes on: the commit reports the abort
        TransactionException aborted = assertThrows(TransactionException.class,
                () -> Transaction.create(heap, () -> {
                    block.setLong(0, 10);
                    try {
                        Transaction.create(heap, () -> {
                            block.setLong(8, 20);
                            throw new IllegalArgumentException("inner");
                        });
                    } catch (IllegalArgumentException expected) {
                        // swallowed on purpose
                    }
                }));
        assertEquals(125, aborted.errno(), aborted.getMessage()); // ECANCELED
        assertEquals(1, block.getLong(0));
        assertEquals(2, block.getLong(8));
        assertThrows(TransactionException.class, () -> outer.run(() -> {}));
    }

    @Test
    void supplierResultsAndExecuteReturnValues() {
        long handle = Transaction.create(heap, () -> heap.allocateMemoryBlock(8).handle());
        assertEquals(8, heap.memoryBlockFromHandle(handle).size());
        assertEquals(7, heap.execute(() -> 7));
    }

    @Test
    void twoThreadsRunTransactionsOnOneHeap() throws Exception {
        int perThread = 300;
        TransactionalMemoryBlock counters = heap.allocateMemoryBlock(16);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        Thread[] threads = new Thread[2];
        for (int t = 0; t < 2; t++) {
            long slot = t * 8L;
            threads[t] = new Thread(() -> {
                try {
                    for (int i = 0; i < perThread; i++) {
                        Transaction.create(heap, () -> {
                            TransactionalMemoryBlock node = heap.allocateMemoryBlock(24);
                            node.setLong(0, counters.getLong(slot));
                            counters.setLong(slot, counters.getLong(slot) + 1);
                            node.free();
                        });
                        if (i % 10 == 0) {
                            try {
                                Transaction.create(heap, () -> {
                                    counters.setLong(slot, -1);
                                    throw new IllegalStateException("rolled back");
                                });
                            } catch (IllegalStateException expected) {
                                // the -1 must not stick
                            }
                        }
                    }
                } catch (Throwable e) {
                    failure.set(e);
                }
            });
            threads[t].start();
        }
        for (Thread thread : threads) {
            thread.join();
        }
        if (failure.get() != null) {
            throw new AssertionError("a thread failed", failure.get());
        }
        assertEquals(perThread, counters.getLong(0));
        assertEquals(perThread, counters.getLong(8));
        long[] live = {0};
        heap.forEachHandle(h -> live[0]++);
        assertEquals(1, live[0], "only the counters block is live");
    }

    /**
     * A virtual thread that parks inside a transaction may resume on another carrier thread:
     * the transaction is the thread's (not the carrier's), so it goes on and commits there.
     * Many such threads on few carriers make most transactions move.
     */
    @Test
    void virtualThreadsCarryTheirTransactionsAcrossCarriers() throws Exception {
        int threads = 64;
        int rounds = 20;
        TransactionalMemoryBlock sums = heap.allocateMemoryBlock(8L * threads);
        List<Thread> started = new ArrayList<>();
        AtomicReference<Throwable> failure = new AtomicReference<>();
        for (int t = 0; t < threads; t++) {
            int slot = t;
            started.add(Thread.ofVirtual().start(() -> {
                try {
                    for (int r = 0; r < rounds; r++) {
                        long handle = Transaction.create(heap, () -> {
                            TransactionalMemoryBlock b = heap.allocateMemoryBlock(32);
                            b.setLong(0, slot);
                            sleepBriefly(); // unmounts: may come back on another carrier
                            sums.setLong(8L * slot, sums.getLong(8L * slot) + 1);
                            b.setLong(8, slot + 1);
                            return b.handle();
                        });
                        TransactionalMemoryBlock b = heap.memoryBlockFromHandle(handle);
                        if (b.getLong(0) != slot || b.getLong(8) != slot + 1) {
                            throw new AssertionError("block " + handle + " of thread " + slot);
                        }
                        b.free();
                    }
                } catch (Throwable e) {
                    failure.compareAndSet(null, e);
                }
            }));
        }
        for (Thread t : started) {
            t.join();
        }
        if (failure.get() != null) {
            throw new AssertionError("a virtual thread failed", failure.get());
        }
        for (int t = 0; t < threads; t++) {
            assertEquals(rounds, sums.getLong(8L * t), "thread " + t);
        }
        long[] live = {0};
        heap.forEachHandle(h -> live[0]++);
        assertEquals(1, live[0], "only the sums block is live");
    }

    private static void sleepBriefly() {
        try {
            Thread.sleep(1);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IllegalStateException(e);
        }
    }
}

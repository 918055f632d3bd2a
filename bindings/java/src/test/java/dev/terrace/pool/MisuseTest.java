package dev.terrace.pool;

import static org.junit.jupiter.api.Assertions.assertDoesNotThrow;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.atomic.AtomicReference;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Misuse throws a Java exception and never crashes the JVM: freed blocks, out-of-bounds
 * offsets, closed heaps (blocks held across the close included), handles that are not live
 * blocks (rejected with {@value AnyHeap#VALIDATE_HANDLES_PROPERTY}; without it, kept inside
 * the pool), a second heap inside a transaction, ranges kept past their call.
 */
class MisuseTest {
    private final HeapFiles files = new HeapFiles();

    @AfterEach
    void deleteFiles() {
        files.close();
    }

    /**
     * A close racing with another thread's implicit transactions either refuses (the heap
     * stays open) or closes cleanly: never with the native pool still in that thread's
     * transaction, which would leave the pool mapped, the close failing with EBUSY after the
     * heap was already unusable, and the thread unable to begin a transaction on any heap.
     */
    @Test
    void aCloseRacingWithTransactionsRefusesOrClosesCleanly() throws Exception {
        try (TransactionalHeap other = TransactionalHeap.createHeap(files.newPath(), 8L << 20)) {
            for (int attempt = 0; attempt < 100; attempt++) {
                TransactionalHeap heap = TransactionalHeap.createHeap(files.newPath(), 8L << 20);
                AtomicReference<Throwable> failure = new AtomicReference<>();
                Thread writer = new Thread(() -> {
                    try {
                        for (long i = 0; ; i++) {
                            heap.setRoot(i);
                        }
                    } catch (IllegalStateException closed) {
                        // the heap closed under the loop: expected
                    } catch (Throwable t) {
                        failure.set(t);
                        return;
                    }
                    try {
                        other.setRoot(1); // the thread is in no transaction any more
                    } catch (Throwable t) {
                        failure.set(t);
                    }
                });
                writer.start();
                while (true) {
                    try {
                        heap.close();
                        break;
                    } catch (IllegalStateException busy) {
                        Thread.onSpinWait(); // a transaction was active: the heap stays open
                    }
                }
                writer.join();
                assertEquals(null, failure.get(), "attempt " + attempt);
            }
        }
    }

    @Test
    void aFreedBlockThrowsOnEveryUse() {
        try (PersistentHeap heap = PersistentHeap.createHeap(files.newPath(), 8L << 20)) {
            PersistentMemoryBlock block = heap.allocateMemoryBlock(32);
            block.free(false);
            assertFalse(block.isValid());
            assertThrows(IllegalStateException.class, () -> block.getLong(0));
            assertThrows(IllegalStateException.class, () -> block.setLong(0, 1));
            assertThrows(IllegalStateException.class, block::handle);
            assertThrows(IllegalStateException.class, () -> block.free(false));
            assertThrows(IllegalStateException.class, () -> block.withRange(0, 8, (Range r) -> {}));
        }
    }

    @Test
    void accessPastTheBlockThrowsIndexOutOfBounds() {
        try (TransactionalHeap heap = TransactionalHeap.createHeap(files.newPath(), 8L << 20)) {
            TransactionalMemoryBlock block = heap.allocateMemoryBlock(20);
            long allocated = heap.stats().allocatedBytes();
            assertThrows(IndexOutOfBoundsException.class, () -> block.getLong(13));
            assertThrows(IndexOutOfBoundsException.class, () -> block.getByte(-1));
            assertThrows(IndexOutOfBoundsException.class, () -> block.setLong(16, 1));
            assertThrows(IndexOutOfBoundsException.class, () -> block.setInt(20, 1));
            assertThrows(IndexOutOfBoundsException.class,
                    () -> block.copyFromArray(new byte[8], 0, 15, 8));
            assertThrows(IndexOutOfBoundsException.class,
                    () -> block.copyFromArray(new byte[8], 4, 0, 8));
            assertThrows(IndexOutOfBoundsException.class,
                    () -> block.copyToArray(0, new byte[30], 0, 21));
            assertThrows(IndexOutOfBoundsException.class, () -> block.setMemory((byte) 1, 10, 11));
            assertThrows(IndexOutOfBoundsException.class,
                    () -> block.withRange(8, 13, (Range r) -> {}));
            assertThrows(IndexOutOfBoundsException.class,
                    () -> block.withRange(0, 8, (Range r) -> r.setLong(4, 1))); // past the window
            assertDoesNotThrow(() -> block.setInt(16, 1));
            // a compact block's bound is its usable size, still inside its own object
            TransactionalCompactMemoryBlock compact = heap.allocateCompactMemoryBlock(20);
            assertThrows(IndexOutOfBoundsException.class, () -> compact.getByte(compact.size()));
            assertFalse(heap.stats().allocatedBytes() < allocated);
        }
    }

    @Test
    void aClosedHeapAndEveryBlockHeldAcrossTheCloseThrowIllegalState() {
        TransactionalHeap heap = TransactionalHeap.createHeap(files.newPath(), 8L << 20);
        TransactionalMemoryBlock block = heap.allocateMemoryBlock(64);
        TransactionalAccessor accessor = heap.createAccessor();
        accessor.handle(block.handle());
        long handle = block.handle();
        heap.close();
        assertFalse(block.isValid());
        assertThrows(IllegalStateException.class, () -> block.getLong(0));
        assertThrows(IllegalStateException.class, () -> block.setLong(0, 1));
        assertThrows(IllegalStateException.class, () -> block.copyToArray(0, new byte[8], 0, 8));
        assertThrows(IllegalStateException.class, () -> accessor.getLong(0));
        assertThrows(IllegalStateException.class, heap::getRoot);
        assertThrows(IllegalStateException.class, () -> heap.setRoot(1));
        assertThrows(IllegalStateException.class, () -> heap.allocateMemoryBlock(8));
        assertThrows(IllegalStateException.class, () -> heap.memoryBlockFromHandle(handle));
        assertThrows(IllegalStateException.class, heap::stats);
        assertThrows(IllegalStateException.class, () -> Transaction.create(heap, () -> {}));
        assertDoesNotThrow(heap::close); // a second close does nothing
    }

    /** Creates a heap with {@value AnyHeap#VALIDATE_HANDLES_PROPERTY} set while it opens. */
    private Heap validatingHeap() {
        String before = System.setProperty(AnyHeap.VALIDATE_HANDLES_PROPERTY, "true");
        try {
            return Heap.createHeap(files.newPath(), 8L << 20);
        } finally {
            if (before == null) {
                System.clearProperty(AnyHeap.VALIDATE_HANDLES_PROPERTY);
            } else {
                System.setProperty(AnyHeap.VALIDATE_HANDLES_PROPERTY, before);
            }
        }
    }

    @Test
    void withValidationAHandleThatIsNotALiveBlockIsRejected() {
        try (Heap heap = validatingHeap()) {
            assertTrue(heap.validatesHandles());
            MemoryBlock block = heap.allocateMemoryBlock(64);
            CompactMemoryBlock compact = heap.allocateCompactMemoryBlock(64);
            assertThrows(IllegalArgumentException.class, () -> heap.memoryBlockFromHandle(0));
            assertThrows(IllegalArgumentException.class,
                    () -> heap.memoryBlockFromHandle(block.handle() + 8)); // inside an object
            assertThrows(IllegalArgumentException.class,
                    () -> heap.memoryBlockFromHandle(123_456_789L)); // outside the pool
            assertThrows(IllegalArgumentException.class, () -> heap.memoryBlockFromHandle(-8));
            assertThrows(IllegalArgumentException.class,
                    () -> heap.memoryBlockFromHandle(compact.handle())); // wrong block kind
            assertThrows(IllegalArgumentException.class,
                    () -> heap.compactMemoryBlockFromHandle(block.handle()));
            assertThrows(IllegalArgumentException.class,
                    () -> heap.createAccessor().handle(compact.handle()));
            assertEquals(64, heap.memoryBlockFromHandle(block.handle()).size());
            long freed = block.handle();
            block.freeMemory();
            assertThrows(IllegalArgumentException.class, () -> heap.memoryBlockFromHandle(freed));
            assertThrows(IllegalArgumentException.class,
                    () -> heap.createAccessor().handle(freed));
            assertThrows(IllegalArgumentException.class,
                    () -> heap.freeMemory(freed)); // double free
        }
    }

    @Test
    void isLiveHandleAsksThePoolWithoutValidation() {
        Heap heap = Heap.createHeap(files.newPath(), 8L << 20);
        try {
            assertFalse(heap.validatesHandles());
            MemoryBlock block = heap.allocateMemoryBlock(64);
            CompactMemoryBlock compact = heap.allocateCompactMemoryBlock(64);
            assertTrue(heap.isLiveHandle(block.handle()));
            assertTrue(heap.isLiveHandle(compact.handle()));
            assertFalse(heap.isLiveHandle(block.handle() + 8));
            assertFalse(heap.isLiveHandle(block.handle() + 3));
            assertFalse(heap.isLiveHandle(0));
            assertFalse(heap.isLiveHandle(-8));
            assertFalse(heap.isLiveHandle(heap.size()));
            long freed = block.handle();
            block.freeMemory();
            assertFalse(heap.isLiveHandle(freed));
            // freeing stays validated natively: a double free throws
            assertThrows(IllegalArgumentException.class, () -> heap.freeMemory(freed));
            heap.close();
            assertThrows(IllegalStateException.class, () -> heap.isLiveHandle(compact.handle()));
            assertThrows(IllegalStateException.class, () -> heap.isLiveHandle(3));
        } finally {
            heap.close();
        }
    }

    /**
     * Without validation a handle is checked in Java only: outside the pool, misaligned, or
     * with a size header that does not fit in the pool throws; any other in-pool handle gives
     * a view of wrong bytes that stays inside the pool and never crashes the JVM.
     */
    @Test
    void withoutValidationABogusInPoolHandleStaysInsideThePool() {
        try (Heap heap = Heap.createHeap(files.newPath(), 8L << 20)) {
            MemoryBlock block = heap.allocateMemoryBlock(64);
            long h = block.handle();
            assertThrows(IllegalArgumentException.class, () -> heap.memoryBlockFromHandle(0));
            assertThrows(IllegalArgumentException.class, () -> heap.memoryBlockFromHandle(-8));
            assertThrows(IllegalArgumentException.class,
                    () -> heap.memoryBlockFromHandle(123_456_789L)); // outside the pool
            assertThrows(IllegalArgumentException.class,
                    () -> heap.memoryBlockFromHandle(heap.size()));
            assertThrows(IllegalArgumentException.class,
                    () -> heap.memoryBlockFromHandle(heap.size() - 4)); // header past the end
            assertThrows(IllegalArgumentException.class,
                    () -> heap.memoryBlockFromHandle(h + 3)); // misaligned
            assertThrows(IllegalArgumentException.class,
                    () -> heap.createAccessor().handle(h + 4));
            // a fake size header inside the payload: 0 and negative sizes are refused
            long fake = h + 8 + 16; // payload offset 16, 8-byte aligned
            block.setLong(16, 0);
            assertThrows(IllegalArgumentException.class, () -> heap.memoryBlockFromHandle(fake));
            block.setLong(16, -1);
            assertThrows(IllegalArgumentException.class, () -> heap.memoryBlockFromHandle(fake));
            // a size reaching one byte past the pool is refused; up to its end, accepted
            long room = heap.size() - (fake + 8);
            block.setLong(16, room + 1);
            assertThrows(IllegalArgumentException.class, () -> heap.memoryBlockFromHandle(fake));
            assertThrows(IllegalArgumentException.class,
                    () -> heap.createAccessor().handle(fake));
            block.setLong(16, Long.MAX_VALUE);
            assertThrows(IllegalArgumentException.class, () -> heap.memoryBlockFromHandle(fake));
            block.setLong(16, room);
            MemoryBlock bogus = heap.memoryBlockFromHandle(fake);
            assertEquals(room, bogus.size());
            assertDoesNotThrow(() -> bogus.getByte(room - 1)); // the pool's last byte
            assertThrows(IndexOutOfBoundsException.class, () -> bogus.getByte(room));
            assertThrows(IndexOutOfBoundsException.class, () -> bogus.getLong(room - 7));
            // a view of wrong bytes: the block's own payload, read through the fake handle
            block.setLong(16, 16);
            block.setLong(24, 0x1234_5678L);
            Accessor accessor = heap.createAccessor();
            accessor.handle(fake);
            assertEquals(16, accessor.size());
            assertEquals(0x1234_5678L, accessor.getLong(0));
            assertThrows(IndexOutOfBoundsException.class, () -> accessor.setLong(9, 1));
            // a freed block's handle: its size header was stamped freed, so a view throws
            long freed = h;
            block.freeMemory();
            IllegalArgumentException error = assertThrows(IllegalArgumentException.class,
                    () -> heap.memoryBlockFromHandle(freed));
            assertTrue(error.getMessage().contains("freed"), error.getMessage());
            assertThrows(IllegalArgumentException.class,
                    () -> heap.createAccessor().handle(freed));
            assertFalse(heap.isLiveHandle(freed));
        }
    }

    @Test
    void aStaleHandleOfAFreedBlockThrowsWithoutNativeValidationOnEveryFlavour() {
        assertFalse(Boolean.getBoolean(AnyHeap.VALIDATE_HANDLES_PROPERTY));
        try (Heap raw = Heap.createHeap(files.newPath(), 8L << 20);
                PersistentHeap durable = PersistentHeap.createHeap(files.newPath(), 8L << 20);
                TransactionalHeap tx = TransactionalHeap.createHeap(files.newPath(), 8L << 20)) {
            long a = raw.allocateMemory(40);
            raw.freeMemory(a);
            assertThrows(IllegalArgumentException.class, () -> raw.memoryBlockFromHandle(a));
            long b = durable.allocateMemoryBlock(40).handle();
            durable.memoryBlockFromHandle(b).freeMemory();
            assertThrows(IllegalArgumentException.class, () -> durable.memoryBlockFromHandle(b));
            long c = tx.allocateMemory(40);
            tx.freeMemory(c);
            assertThrows(IllegalArgumentException.class, () -> tx.memoryBlockFromHandle(c));
            // a free rolled back with its transaction leaves the block whole, size and all
            TransactionalMemoryBlock kept = tx.allocateMemoryBlock(40);
            kept.setLong(0, 77);
            long d = kept.handle();
            Runnable freeThenFail = () -> {
                tx.freeMemory(d);
                throw new IllegalStateException("roll back");
            };
            assertThrows(IllegalStateException.class, () -> Transaction.create(tx, freeThenFail));
            TransactionalMemoryBlock again = tx.memoryBlockFromHandle(d);
            assertEquals(40, again.size());
            assertEquals(77, again.getLong(0));
            // compact blocks are validated natively, stamp or not
            long e = tx.allocateCompactMemory(32);
            tx.freeMemory(e);
            assertThrows(IllegalArgumentException.class, () -> tx.compactMemoryBlockFromHandle(e));
        }
    }

    @Test
    void aWriteInsideAnotherHeapsTransactionThrowsAndChangesNothing() {
        try (TransactionalHeap first = TransactionalHeap.createHeap(files.newPath(), 8L << 20);
                TransactionalHeap second =
                        TransactionalHeap.createHeap(files.newPath(), 8L << 20)) {
            TransactionalMemoryBlock block = second.allocateMemoryBlock(16);
            block.setLong(0, 5);
            assertThrows(TransactionException.class, () -> Transaction.create(first, () -> {
                block.setLong(0, 6);
            }));
            assertEquals(5, block.getLong(0));
            assertThrows(TransactionException.class, () -> Transaction.create(first, () -> {
                second.allocateMemoryBlock(8);
            }));
            assertThrows(TransactionException.class, () -> Transaction.create(first, () -> {
                Transaction.create(second, () -> {});
            }));
            assertThrows(TransactionException.class, () -> Transaction.create(first, () -> {
                block.withRange(0, 8, (Range r) -> r.setLong(0, 7));
            }));
            assertEquals(5, block.getLong(0));
            // both heaps are usable again afterwards
            Transaction.create(second, () -> block.setLong(0, 8));
            assertEquals(8, block.getLong(0));
        }
    }

    @Test
    void closingWithAnActiveTransactionIsRefused() {
        TransactionalHeap heap = TransactionalHeap.createHeap(files.newPath(), 8L << 20);
        Transaction.create(heap, () -> {
            assertThrows(IllegalStateException.class, heap::close);
        });
        heap.close();
    }

    @Test
    void aRangeUsedAfterItsCallThrows() {
        try (TransactionalHeap heap = TransactionalHeap.createHeap(files.newPath(), 8L << 20)) {
            TransactionalMemoryBlock block = heap.allocateMemoryBlock(16);
            Range[] kept = new Range[1];
            block.withRange(0, 16, (Range range) -> {
                kept[0] = range;
            });
            assertFalse(kept[0].isValid());
            assertThrows(IllegalStateException.class, () -> kept[0].setLong(0, 1));
        }
    }

    @Test
    void addToTransactionOutsideATransactionThrows() {
        try (Heap heap = Heap.createHeap(files.newPath(), 8L << 20)) {
            MemoryBlock block = heap.allocateMemoryBlock(16);
            assertThrows(TransactionException.class, () -> block.addToTransaction(0, 8));
        }
    }

    @Test
    void openingAHeapOfAnotherFlavourOrAMissingFileThrows() {
        String path = files.newPath();
        assertThrows(HeapException.class, () -> Heap.openHeap(path));
        Heap.createHeap(path, 8L << 20).close();
        HeapException wrongFlavour =
                assertThrows(HeapException.class, () -> TransactionalHeap.openHeap(path));
        assertEquals(22, wrongFlavour.errno(), wrongFlavour.getMessage());
        HeapException exists =
                assertThrows(HeapException.class, () -> Heap.createHeap(path, 8L << 20));
        assertEquals(17, exists.errno(), exists.getMessage()); // EEXIST
    }
}

package dev.terrace.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.ArrayList;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The raw and persistent flavours, accessors, copies, allocation classes and space use.
 */
class HeapFlavoursTest {
    private final HeapFiles files = new HeapFiles();

    @AfterEach
    void deleteFiles() {
        files.close();
    }

    @Test
    void rawHeapBlocksFlushAndJoinTransactionsOnRequest() {
        String path = files.newPath();
        try (Heap heap = Heap.createHeap(path, 8L << 20)) {
            MemoryBlock block = heap.allocateMemoryBlock(32);
            block.setLong(0, 11);
            block.flush(0, 8);
            block.setLong(8, 22);
            block.flush();
            heap.setRoot(block.handle());
            assertThrows(ArithmeticException.class, () -> Transaction.create(heap, () -> {
                block.addToTransaction(0, 16);
                block.setLong(0, 99);
                block.setLong(8, 98);
                throw new ArithmeticException();
            }));
            assertEquals(11, block.getLong(0));
            assertEquals(22, block.getLong(8));
        }
        try (Heap heap = Heap.openHeap(path)) {
            MemoryBlock block = heap.memoryBlockFromHandle(heap.getRoot());
            assertEquals(11, block.getLong(0));
            assertEquals(22, block.getLong(8));
        }
    }

    @Test
    void persistentHeapStoresSurviveAReopen() {
        String path = files.newPath();
        try (PersistentHeap heap = PersistentHeap.createHeap(path, 8L << 20)) {
            PersistentMemoryBlock block =
                    heap.allocateMemoryBlock(64, range -> range.setLong(0, 1));
            block.setShort(8, (short) -2);
            block.setByte(10, (byte) 3);
            block.copyFromArray(new byte[] {4, 5, 6}, 0, 11, 3);
            block.withRange(16, 16, (Range range) -> {
                range.setLong(16, 7);
                range.setLong(24, range.getLong(16) + 1);
            });
            PersistentCompactMemoryBlock compact = heap.allocateCompactMemoryBlock(16);
            compact.copyFromMemoryBlock(block, 16, 0, 16);
            block.setLong(32, compact.handle());
            heap.setRoot(block.handle());
        }
        try (PersistentHeap heap = PersistentHeap.openHeap(path)) {
            PersistentMemoryBlock block = heap.memoryBlockFromHandle(heap.getRoot());
            assertEquals(64, block.size());
            assertEquals(1, block.getLong(0));
            assertEquals(-2, block.getShort(8));
            assertEquals(3, block.getByte(10));
            assertEquals(6, block.getByte(13));
            PersistentCompactMemoryBlock compact =
                    heap.compactMemoryBlockFromHandle(block.getLong(32));
            assertTrue(compact.size() >= 16);
            assertEquals(7, compact.getLong(0));
            assertEquals(8, compact.getLong(8));
        }
    }

    @Test
    void anAccessorReadsManyBlocksByHandle() {
        try (TransactionalHeap heap = TransactionalHeap.createHeap(files.newPath(), 8L << 20)) {
            long[] handles = new long[10];
            for (int i = 0; i < handles.length; i++) {
                int value = i;
                handles[i] =
                        heap.allocateMemoryBlock(8 + i, r -> r.setLong(0, value * 3L)).handle();
            }
            TransactionalAccessor accessor = heap.createAccessor();
            assertThrows(IllegalStateException.class, () -> accessor.getLong(0));
            for (int i = 0; i < handles.length; i++) {
                accessor.handle(handles[i]);
                assertEquals(8 + i, accessor.size());
                assertEquals(i * 3L, accessor.getLong(0));
            }
            accessor.setLong(0, 1);
            assertEquals(1, heap.memoryBlockFromHandle(handles[9]).getLong(0));
            accessor.freeMemory();
            assertThrows(IllegalStateException.class, () -> accessor.getLong(0));
            assertFalse(heap.isLiveHandle(handles[9])); // freed, by the pool's object table
            assertTrue(heap.isLiveHandle(handles[8]));
        }
    }

    @Test
    void allocationClassesPackBlocksOfTheRegisteredSizeExactly() {
        try (Heap heap = Heap.createHeap(files.newPath(), 16L << 20)) {
            assertTrue(heap.registerAllocationSize(40, false));
            assertTrue(heap.registerAllocationSize(100, true)); // a 104-byte unit (8-byte steps)
            long before = heap.stats().allocatedBytes();
            for (int i = 0; i < 1000; i++) {
                heap.allocateMemoryBlock(40);
                heap.allocateCompactMemoryBlock(100);
            }
            assertEquals(1000L * (48 + 104), heap.stats().allocatedBytes() - before);
            CompactMemoryBlock compact = heap.allocateCompactMemoryBlock(100);
            assertEquals(104, compact.size());
            // without a class, a 100-byte request is rounded to a built-in class (112 B)
            assertEquals(112, heap.allocateCompactMemoryBlock(99).size());
        }
    }

    @Test
    void blocksOfARegisteredClassAreZeroedLikeAnyOther() {
        try (PersistentHeap heap = PersistentHeap.createHeap(files.newPath(), 8L << 20)) {
            assertTrue(heap.registerAllocationSize(40, false));
            assertTrue(heap.registerAllocationSize(100, true));
            // dirty blocks of both classes, free them, and allocate their units again
            for (int round = 0; round < 2; round++) {
                List<AnyMemoryBlock> blocks = new ArrayList<>();
                for (int i = 0; i < 64; i++) {
                    PersistentMemoryBlock regular = heap.allocateMemoryBlock(40);
                    PersistentCompactMemoryBlock compact = heap.allocateCompactMemoryBlock(100);
                    for (MemoryAccessor b : List.of(regular, compact)) {
                        for (long at = 0; at < b.size(); at++) {
                            assertEquals(0, b.getByte(at), "round " + round + ": block "
                                    + b.handle() + " byte " + at + " of a new block");
                        }
                        b.setMemory((byte) 0x5A, 0, b.size());
                    }
                    blocks.add(regular);
                    blocks.add(compact);
                }
                assertEquals(40, blocks.get(0).size());
                blocks.forEach(b -> heap.freeMemory(b.handle()));
            }
        }
    }

    @Test
    void aThrowingInitializerLeavesNoBlockBehind() {
        try (PersistentHeap heap = PersistentHeap.createHeap(files.newPath(), 8L << 20)) {
            heap.setRoot(heap.allocateMemory(8));
            List<Long> before = new ArrayList<>();
            heap.forEachHandle(before::add);
            assertThrows(ArithmeticException.class, () -> heap.allocateMemoryBlock(64, range -> {
                range.setLong(0, 1);
                throw new ArithmeticException();
            }));
            assertThrows(ArithmeticException.class,
                    () -> heap.allocateCompactMemoryBlock(64, range -> {
                        throw new ArithmeticException();
                    }));
            List<Long> after = new ArrayList<>();
            heap.forEachHandle(after::add);
            assertEquals(before, after, "the blocks of failed initializers were freed");
        }
        try (Heap heap = Heap.createHeap(files.newPath(), 8L << 20)) {
            assertThrows(ArithmeticException.class, () -> heap.allocateMemoryBlock(64, range -> {
                throw new ArithmeticException();
            }));
            List<Long> after = new ArrayList<>();
            heap.forEachHandle(after::add);
            assertEquals(List.of(), after);
        }
    }

    @Test
    void fillingWithSmallBlocksUsesMostOfThePool() {
        try (PersistentHeap heap = PersistentHeap.createHeap(files.newPath(), 8L << 20)) {
            List<Long> handles = new ArrayList<>();
            HeapException full = assertThrows(HeapException.class, () -> {
                while (true) {
                    handles.add(heap.allocateCompactMemory(64));
                }
            });
            assertEquals(12, full.errno(), full.getMessage()); // ENOMEM
            PoolStats stats = heap.stats();
            double utilization = (double) handles.size() * 64 / stats.poolSize();
            assertTrue(utilization > 0.90, "utilization " + utilization + " with " + stats);
            for (long handle : handles) {
                heap.freeMemory(handle);
            }
            assertTrue(heap.allocateMemoryBlock(5L << 20).size() == 5L << 20,
                    "a freed 8 MiB pool takes a 5 MiB block (LLPL #7)");
        }
    }

    @Test
    void anEightMebibyteHeapAllocatesAFiveMebibyteBlock() {
        try (TransactionalHeap heap = TransactionalHeap.createHeap(files.newPath(), 8L << 20)) {
            TransactionalMemoryBlock big = heap.allocateMemoryBlock(5L << 20);
            big.setLong((5L << 20) - 8, 1);
            assertEquals(1, big.getLong((5L << 20) - 8));
        }
    }
}

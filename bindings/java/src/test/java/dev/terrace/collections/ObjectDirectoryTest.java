package dev.terrace.collections;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import dev.terrace.pool.AnyHeap;
import dev.terrace.pool.HeapException;
import dev.terrace.pool.PersistentHeap;
import dev.terrace.pool.PersistentMemoryBlock;
import dev.terrace.pool.Transaction;
import dev.terrace.pool.TransactionalHeap;
import java.util.HashMap;
import java.util.Map;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;

/**
 * ObjectDirectory: bind, lookup and unbind of blocks on every flavour, refusals (a bound name,
 * a freed or foreign handle, bad names, a map's name), reopening, a closed heap.
 */
class ObjectDirectoryTest {
    private final MapFixture files = new MapFixture();

    @BeforeAll
    static void supported() {
        assumeTrue(ObjectDirectory.isSupported(),
                "the loaded libterrace.so has no terrace_pool_bind (native side not built)");
    }

    @AfterEach
    void deleteFiles() {
        files.close();
    }

    @ParameterizedTest
    @ValueSource(strings = {"raw", "persistent", "transactional"})
    void bindLookupAndUnbindBlocks(String flavour) {
        try (AnyHeap heap = MapFixture.create(flavour, files.newPath())) {
            ObjectDirectory dir = new ObjectDirectory(heap);
            assertEquals(0, dir.lookup("regular"), "unbound: 0, as LLPL's getRoot");
            long regular = heap.allocateMemory(100);
            long compact = heap.allocateCompactMemory(48);
            dir.bind("regular", regular);
            dir.bind("compact", compact);
            assertEquals(regular, dir.lookup("regular"));
            assertEquals(compact, dir.lookup("compact"));
            assertEquals(regular, new ObjectDirectory(heap).lookup("regular"),
                    "another view of the same directory");

            HeapException again = assertThrows(HeapException.class,
                    () -> dir.bind("regular", compact), "rebinding a bound name");
            assertEquals(17, again.errno(), again.getMessage());
            assertEquals(regular, dir.lookup("regular"), "the first binding stays");
            dir.bind("alias", regular); // one block under two names is allowed

            assertEquals(regular, dir.unbind("regular"));
            assertEquals(0, dir.lookup("regular"));
            assertEquals(0, dir.unbind("regular"), "unbinding an unbound name: 0");
            assertTrue(heap.isLiveHandle(regular), "unbinding leaves the block alone");
            assertEquals(regular, dir.lookup("alias"));
            dir.bind("regular", compact); // the name is free again
            assertEquals(compact, dir.lookup("regular"));
            assertEquals(compact, dir.unbind("regular"));
            assertEquals(compact, dir.unbind("compact"));
            assertEquals(regular, dir.unbind("alias"));
            heap.freeMemory(regular);
            heap.freeMemory(compact);
        }
    }

    @Test
    void freedAndForeignHandlesAreRefused() {
        try (AnyHeap heap = MapFixture.create("transactional", files.newPath())) {
            ObjectDirectory dir = new ObjectDirectory(heap);
            long freed = heap.allocateMemory(64);
            heap.freeMemory(freed);
            IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                    () -> dir.bind("freed", freed));
            assertTrue(e.getMessage().contains("not a live block"), e.getMessage());
            long freedCompact = heap.allocateCompactMemory(64);
            heap.freeMemory(freedCompact);
            assertThrows(IllegalArgumentException.class, () -> dir.bind("freed", freedCompact));
            long live = heap.allocateMemory(64);
            for (long bad : new long[] {0, -8, live + 8, live + 1, heap.size() + 4096}) {
                assertThrows(IllegalArgumentException.class, () -> dir.bind("bad", bad),
                        "handle " + bad);
            }
            assertEquals(0, dir.lookup("freed"), "nothing was bound");
            assertEquals(0, dir.lookup("bad"), "nothing was bound");
        }
    }

    @Test
    void namesAreCheckedAndSharedWithTheMaps() {
        try (AnyHeap heap = MapFixture.create("persistent", files.newPath())) {
            ObjectDirectory dir = new ObjectDirectory(heap);
            long block = heap.allocateMemory(8);
            for (String bad : new String[] {null, "", "n".repeat(65), "é".repeat(33), "a\0b"}) {
                assertThrows(IllegalArgumentException.class, () -> dir.bind(bad, block));
                assertThrows(IllegalArgumentException.class, () -> dir.lookup(bad));
                assertThrows(IllegalArgumentException.class, () -> dir.unbind(bad));
            }
            String longest = "é".repeat(32); // 64 bytes of UTF-8
            dir.bind(longest, block);
            assertEquals(block, dir.lookup(longest));

            try (PersistentHashMap map = new PersistentHashMap(heap, "map", 8)) {
                map.put(new byte[] {1}, new byte[] {2});
            }
            try (ConcurrentLongIndex index = new ConcurrentLongIndex(heap, "index", 8)) {
                index.put(new byte[] {1}, 2);
            }
            for (String map : new String[] {"map", "index"}) {
                assertEquals(17, assertThrows(HeapException.class,
                        () -> dir.bind(map, block)).errno(), map);
                assertEquals(17, assertThrows(HeapException.class,
                        () -> dir.lookup(map)).errno(), "a map's name is not a block's: " + map);
                assertEquals(17, assertThrows(HeapException.class,
                        () -> dir.unbind(map)).errno(), map);
            }
            try (PersistentHashMap map = PersistentHashMap.open(heap, "map")) {
                assertEquals(1, map.size(), "the refused unbind left the map bound");
            }
        }
    }

    @Test
    void bindingsSurviveAReopen() {
        String path = files.newPath();
        Map<String, Long> bound = new HashMap<>();
        try (PersistentHeap heap = PersistentHeap.createHeap(path, MapFixture.HEAP_SIZE)) {
            ObjectDirectory dir = new ObjectDirectory(heap);
            for (int i = 0; i < 200; i++) {
                PersistentMemoryBlock block = heap.allocateMemoryBlock(16);
                block.setLong(0, i * 1000L);
                block.setLong(8, ~i);
                dir.bind("block-" + i, block.handle());
                bound.put("block-" + i, block.handle());
            }
            assertEquals(bound.get("block-7"), dir.unbind("block-7"));
            bound.remove("block-7");
        }
        try (PersistentHeap heap = PersistentHeap.openHeap(path)) {
            ObjectDirectory dir = new ObjectDirectory(heap);
            for (int i = 0; i < 200; i++) {
                String name = "block-" + i;
                long handle = dir.lookup(name);
                if (i == 7) {
                    assertEquals(0, handle, "unbound before the close");
                    continue;
                }
                assertEquals(bound.get(name), handle, name);
                PersistentMemoryBlock block = heap.memoryBlockFromHandle(handle);
                assertEquals(i * 1000L, block.getLong(0), name);
                assertEquals(~i, block.getLong(8), name);
            }
        }
    }

    @Test
    void bindingIsNotPartOfATransactionAndAClosedHeapThrows() {
        TransactionalHeap heap = TransactionalHeap.createHeap(files.newPath(),
                MapFixture.HEAP_SIZE);
        ObjectDirectory dir = new ObjectDirectory(heap);
        long block = heap.allocateMemory(32);
        assertThrows(ArithmeticException.class, () -> Transaction.create(heap, () -> {
            dir.bind("outside", block);
            throw new ArithmeticException();
        }));
        assertEquals(block, dir.lookup("outside"), "an abort does not undo a bind");
        heap.close();
        assertThrows(IllegalStateException.class, () -> dir.lookup("outside"));
        assertThrows(IllegalStateException.class, () -> dir.bind("other", block));
        assertThrows(IllegalStateException.class, () -> dir.unbind("outside"));
    }
}

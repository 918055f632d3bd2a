package dev.terrace.pool;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * Every LLPL call the Cassandra LLPL memtable makes (bindings research §1.1 "Cass"), in the
 * shape it makes them: open-or-create a TransactionalHeap, keep a table block's handle in the
 * root, write rows of fixed fields plus key bytes inside transactions, read them back after a
 * reopen by handle, and free rows.
 */
class CassandraCallSetTest {
    private static final long ROW_NEXT = 0;      // long: next row handle
    private static final long ROW_TOKEN = 8;     // long
    private static final long ROW_FLAGS = 16;    // int
    private static final long ROW_KIND = 20;     // short
    private static final long ROW_DELETED = 22;  // byte
    private static final long ROW_KEY_LEN = 23;  // int
    private static final long ROW_KEY = 27;      // key bytes

    private final HeapFiles files = new HeapFiles();

    @AfterEach
    void deleteFiles() {
        files.close();
    }

    private static TransactionalHeap openOrCreate(String path) {
        return TransactionalHeap.exists(path) ? TransactionalHeap.openHeap(path)
                : TransactionalHeap.createHeap(path, 16L << 20);
    }

    private static long insertRow(TransactionalHeap heap, TransactionalMemoryBlock table,
            long token, String key) {
        byte[] keyBytes = key.getBytes(StandardCharsets.UTF_8);
        long[] handle = new long[1];
        Transaction.create(heap).run(() -> {
            TransactionalMemoryBlock row = heap.allocateMemoryBlock(ROW_KEY + keyBytes.length);
            row.setLong(ROW_NEXT, table.getLong(0));
            row.setLong(ROW_TOKEN, token);
            row.setInt(ROW_FLAGS, 0x5a5a);
            row.setShort(ROW_KIND, (short) 3);
            row.setByte(ROW_DELETED, (byte) 0);
            row.setInt(ROW_KEY_LEN, keyBytes.length);
            row.copyFromArray(keyBytes, 0, ROW_KEY, keyBytes.length);
            table.setLong(0, row.handle());
            table.setLong(8, table.getLong(8) + 1);
            handle[0] = row.handle();
        });
        return handle[0];
    }

    @Test
    void memtableCallSetRoundTripsThroughAReopen() {
        String path = files.newPath();
        assertFalse(TransactionalHeap.exists(path));
        TransactionalHeap heap = openOrCreate(path);
        assertTrue(TransactionalHeap.exists(path));
        assertTrue(heap.size() >= 16L << 20);
        assertEquals(0, heap.getRoot());

        TransactionalMemoryBlock table = heap.allocateMemoryBlock(16);
        assertEquals(16, table.size());
        heap.setRoot(table.handle());
        long first = insertRow(heap, table, 101, "alpha");
        long second = insertRow(heap, table, 202, "beta-key");
        assertNotEquals(first, second);
        heap.close();

        heap = openOrCreate(path);
        table = heap.memoryBlockFromHandle(heap.getRoot());
        assertEquals(2, table.getLong(8));
        TransactionalMemoryBlock row = heap.memoryBlockFromHandle(table.getLong(0));
        assertEquals(second, row.handle());
        assertEquals(202, row.getLong(ROW_TOKEN));
        assertEquals(0x5a5a, row.getInt(ROW_FLAGS));
        assertEquals(3, row.getShort(ROW_KIND));
        assertEquals(0, row.getByte(ROW_DELETED));
        byte[] key = new byte[row.getInt(ROW_KEY_LEN)];
        row.copyToArray(ROW_KEY, key, 0, key.length);
        assertArrayEquals("beta-key".getBytes(StandardCharsets.UTF_8), key);
        assertEquals(ROW_KEY + key.length, row.size());
        TransactionalMemoryBlock older = heap.memoryBlockFromHandle(row.getLong(ROW_NEXT));
        assertEquals(101, older.getLong(ROW_TOKEN));

        // delete the newest row: unlink it and free it in one transaction
        PoolStats before = heap.stats();
        TransactionalMemoryBlock table2 = table;
        TransactionalMemoryBlock doomed = row;
        Transaction.create(heap, () -> {
            table2.setLong(0, doomed.getLong(ROW_NEXT));
            table2.setLong(8, table2.getLong(8) - 1);
            doomed.free();
        });
        assertFalse(doomed.isValid());
        assertTrue(heap.stats().allocatedBytes() < before.allocatedBytes());
        long freedHandle = second;
        TransactionalHeap reopened = heap;
        assertFalse(reopened.isLiveHandle(freedHandle)); // the pool's object table says so
        assertTrue(reopened.isLiveHandle(first));
        assertEquals(first, table.getLong(0));
        heap.close();
    }
}

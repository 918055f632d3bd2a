package dev.terrace.pool;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The LLPL primer's employee example (the slides "LLPL sample code", "(continued)" and "Range
 * optimization"), as written for LLPL: only the imports differ (dev.terrace.pool instead of
 * com.intel.pmem.llpl), plus a close before the "restart" since both halves share one JVM.
 */
class PrimerExamplesTest {
    private final HeapFiles files = new HeapFiles();

    @AfterEach
    void deleteFiles() {
        files.close();
    }

    @Test
    void employeeExampleSurvivesARestartIntoAnotherHeapObject() {
        String path = files.newPath();
        TransactionalHeap heap = TransactionalHeap.getHeap(path, 10000000L);

        long ID_OFFSET = 0;
        long NAME_OFFSET = 8;
        long EMPLOYEE_SIZE = Long.BYTES + Integer.BYTES + 20;

        // allocate and initialize an employee block
        TransactionalMemoryBlock employee = Transaction.run(heap, () -> {
            TransactionalMemoryBlock block = heap.allocateMemoryBlock(EMPLOYEE_SIZE);
            long id = 12345;
            byte[] nameBytes = "John Doe".getBytes();
            block.setLong(ID_OFFSET, id);
            block.setInt(NAME_OFFSET, nameBytes.length);
            block.copyFromArray(nameBytes, 0, NAME_OFFSET + Integer.BYTES, nameBytes.length);
            return block;
        });

        // allocate block to hold array of employee handles
        TransactionalMemoryBlock employees = heap.allocateMemoryBlock(10 * Long.BYTES);

        // store handle to this root data structure in the heap's root location
        heap.setRoot(employees.handle());

        // add employee to employee array
        employees.setLong(0, employee.handle());

        heap.close();
        assertEquals("id = 12345, name = 'John Doe'", restart(path));
    }

    @Test
    void rangeOptimizationWritesTheSameEmployee() {
        String path = files.newPath();
        TransactionalHeap heap = TransactionalHeap.getHeap(path, 10000000L);

        long ID_OFFSET = 0;
        long NAME_OFFSET = 8;
        long EMPLOYEE_SIZE = Long.BYTES + Integer.BYTES + 20;

        // allocate and initialize an employee block
        TransactionalMemoryBlock employee = Transaction.run(heap, () -> {
            TransactionalMemoryBlock block = heap.allocateMemoryBlock(EMPLOYEE_SIZE);
            long id = 12345;
            byte[] nameBytes = "John Doe".getBytes();
            block.withRange(0, EMPLOYEE_SIZE, (Range range) -> {
                range.setLong(ID_OFFSET, id);
                range.setInt(NAME_OFFSET, nameBytes.length);
                range.copyFromArray(nameBytes, 0, NAME_OFFSET + Integer.BYTES, nameBytes.length);
            });
            return block;
        });

        TransactionalMemoryBlock employees = heap.allocateMemoryBlock(10 * Long.BYTES);
        heap.setRoot(employees.handle());
        employees.setLong(0, employee.handle());

        heap.close();
        assertEquals("id = 12345, name = 'John Doe'", restart(path));
    }

    @Test
    void employeeExampleWithTheLlpl12NamesAndAnInitializer() {
        String path = files.newPath();
        long ID_OFFSET = 0;
        long NAME_OFFSET = 8;
        long EMPLOYEE_SIZE = Long.BYTES + Integer.BYTES + 20;
        byte[] nameBytes = "John Doe".getBytes();

        TransactionalHeap heap = TransactionalHeap.exists(path)
                ? TransactionalHeap.openHeap(path)
                : TransactionalHeap.createHeap(path, 10_000_000L);
        TransactionalMemoryBlock employee = heap.allocateMemoryBlock(EMPLOYEE_SIZE, range -> {
            range.setLong(ID_OFFSET, 12345);
            range.setInt(NAME_OFFSET, nameBytes.length);
            range.copyFromArray(nameBytes, 0, NAME_OFFSET + Integer.BYTES, nameBytes.length);
        });
        Transaction.create(heap, () -> {
            TransactionalMemoryBlock employees = heap.allocateMemoryBlock(10 * Long.BYTES);
            employees.setLong(0, employee.handle());
            heap.setRoot(employees.handle());
        });
        heap.close();
        assertEquals("id = 12345, name = 'John Doe'", restart(path));
    }

    /** The "(continued)" slide: open the heap again and read the employee back. */
    private static String restart(String path) {
        long ID_OFFSET = 0;
        long NAME_OFFSET = 8;

        // open heap
        TransactionalHeap heap = TransactionalHeap.getHeap(path);

        // retrieve handles to employee array and first employee
        TransactionalMemoryBlock employees = heap.memoryBlockFromHandle(heap.getRoot());
        TransactionalMemoryBlock employee = heap.memoryBlockFromHandle(employees.getLong(0));

        // read employee data
        byte[] nameBytes = new byte[employee.getInt(NAME_OFFSET)];
        employee.copyToArray(NAME_OFFSET + Integer.BYTES, nameBytes, 0, nameBytes.length);
        String name = new String(nameBytes);

        String line = String.format("id = %d, name = '%s'", employee.getLong(ID_OFFSET), name);
        heap.close();
        return line;
    }
}

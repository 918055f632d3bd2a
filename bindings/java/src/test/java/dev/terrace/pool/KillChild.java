package dev.terrace.pool;

import java.util.Random;

/**
 * The child JVM of {@link KillTest}: opens a transactional heap holding a linked list and runs
 * random transactions on it until it is killed.
 *
 * <p>The list's invariant, which every transaction keeps: the root block holds the head
 * handle, the node count, the sum of the node values and a count of committed transactions;
 * each node holds the next handle, its value, and fills the rest of its payload with the low
 * byte of its value. Transactions insert nodes (allocated with an initializer), unlink and
 * free nodes, and rewrite values, 1 to 4 of these each; one in twenty throws at the end and is
 * rolled back. Prints READY once 20 transactions ran.
 *
 * <p>Arguments: heap path, random seed.
 */
public final class KillChild {
    static final long ROOT_HEAD = 0;
    static final long ROOT_COUNT = 8;
    static final long ROOT_SUM = 16;
    static final long ROOT_COMMITS = 24;
    static final long ROOT_SIZE = 32;
    static final long NODE_NEXT = 0;
    static final long NODE_VALUE = 8;
    static final long NODE_FILL = 16;
    static final int MAX_NODES = 200;

    private KillChild() {}

    /** The deliberate failure that rolls a transaction back. */
    private static final class Rollback extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Rollback() {
            super("deliberate rollback", null, false, false);
        }
    }

    public static void main(String[] args) {
        TransactionalHeap heap = TransactionalHeap.openHeap(args[0]);
        Random random = new Random(Long.parseLong(args[1]));
        TransactionalMemoryBlock root = heap.memoryBlockFromHandle(heap.getRoot());
        for (long transactions = 1; ; transactions++) {
            try {
                Transaction.create(heap, () -> {
                    int operations = 1 + random.nextInt(4);
                    for (int i = 0; i < operations; i++) {
                        step(heap, root, random);
                    }
                    root.setLong(ROOT_COMMITS, root.getLong(ROOT_COMMITS) + 1);
                    if (random.nextInt(20) == 0) {
                        throw new Rollback();
                    }
                });
            } catch (Rollback expected) {
                // rolled back on purpose
            }
            if (transactions == 20) {
                System.out.println("READY");
                System.out.flush();
            }
        }
    }

    private static void step(TransactionalHeap heap, TransactionalMemoryBlock root,
            Random random) {
        long count = root.getLong(ROOT_COUNT);
        int choice = random.nextInt(100);
        if (count == 0 || (count < MAX_NODES && choice < 50)) {
            long value = random.nextLong();
            long size = NODE_FILL + random.nextInt(300);
            long head = root.getLong(ROOT_HEAD);
            TransactionalMemoryBlock node = heap.allocateMemoryBlock(size, range -> {
                range.setLong(NODE_NEXT, head);
                range.setLong(NODE_VALUE, value);
                range.setMemory((byte) value, NODE_FILL, size - NODE_FILL);
            });
            root.setLong(ROOT_HEAD, node.handle());
            root.setLong(ROOT_COUNT, count + 1);
            root.setLong(ROOT_SUM, root.getLong(ROOT_SUM) + value);
        } else if (choice < 80) {
            // unlink and free the node at a random position
            long position = random.nextLong(count);
            TransactionalMemoryBlock previous = null;
            TransactionalMemoryBlock node = heap.memoryBlockFromHandle(root.getLong(ROOT_HEAD));
            for (long i = 0; i < position; i++) {
                previous = node;
                node = heap.memoryBlockFromHandle(node.getLong(NODE_NEXT));
            }
            long next = node.getLong(NODE_NEXT);
            if (previous == null) {
                root.setLong(ROOT_HEAD, next);
            } else {
                previous.setLong(NODE_NEXT, next);
            }
            root.setLong(ROOT_COUNT, count - 1);
            root.setLong(ROOT_SUM, root.getLong(ROOT_SUM) - node.getLong(NODE_VALUE));
            node.free();
        } else {
            // rewrite the value of the head node (and its fill)
            TransactionalMemoryBlock node = heap.memoryBlockFromHandle(root.getLong(ROOT_HEAD));
            long value = random.nextLong();
            long old = node.getLong(NODE_VALUE);
            node.withRange(NODE_VALUE, node.size() - NODE_VALUE, (Range range) -> {
                range.setLong(NODE_VALUE, value);
                range.setMemory((byte) value, NODE_FILL, node.size() - NODE_FILL);
            });
            root.setLong(ROOT_SUM, root.getLong(ROOT_SUM) - old + value);
        }
    }
}

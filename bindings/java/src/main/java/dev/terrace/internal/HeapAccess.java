package dev.terrace.internal;

import dev.terrace.pool.AnyHeap;
import java.lang.foreign.MemorySegment;
import java.util.function.Supplier;

/**
 * What other packages of this jar (the persistent collections) need of a heap that its public
 * API does not give: the native pool to pass to another part of the C ABI, and a way to tie
 * an object's native lifetime to the heap's. {@link AnyHeap} installs the one {@link Bridge}
 * when its class is initialized, so any caller holding a heap finds it installed. Not an API
 * for applications.
 */
public final class HeapAccess {
    /** The heap's side. */
    public interface Bridge {
        /**
         * The heap's {@code terrace_pool *}, as a zero-length segment of the heap's arena: a
         * downcall given it keeps the heap from closing while it runs, and throws
         * {@link IllegalStateException} once the heap is closed.
         */
        MemorySegment pool(AnyHeap heap);

        /**
         * Runs opener with the heap's lock held, refusing (IllegalStateException) when the
         * heap is closed or closing, and registers what it returns as a dependent: the heap's
         * {@code close()} closes every registered dependent first, and stays open if one of
         * them refuses (throws).
         */
        <T extends AutoCloseable> T attach(AnyHeap heap, Supplier<T> opener);

        /** Unregisters a dependent that closed itself (no lock: callable from its close). */
        void detach(AnyHeap heap, AutoCloseable dependent);
    }

    private static volatile Bridge bridge;

    private HeapAccess() {}

    /** Installs the bridge; only the first call (AnyHeap's class initializer) counts. */
    public static synchronized void install(Bridge b) {
        if (bridge == null) {
            bridge = b;
        }
    }

    /** The bridge (AnyHeap is initialized by then: the caller holds a heap). */
    public static Bridge bridge() {
        Bridge b = bridge;
        if (b == null) {
            try {
                Class.forName(AnyHeap.class.getName(), true, AnyHeap.class.getClassLoader());
            } catch (ClassNotFoundException e) {
                throw new AssertionError(e);
            }
            b = bridge;
        }
        return b;
    }
}

package dev.terrace.collections;

import java.util.Iterator;

/**
 * An iterator holding a native cursor: close it when done early (a fully walked iterator has
 * closed itself). As LLPL's {@code com.intel.pmem.llpl.util.AutoCloseableIterator}, with a
 * {@link #close()} that throws no checked exception. Meant for the thread that opened it.
 */
public interface AutoCloseableIterator<E> extends Iterator<E>, AutoCloseable {
    /** Releases the cursor; later calls return no more entries. Closing twice does nothing. */
    @Override
    void close();
}

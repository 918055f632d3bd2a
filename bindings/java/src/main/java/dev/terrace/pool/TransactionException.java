package dev.terrace.pool;

import dev.terrace.TerraceException;

/**
 * A transaction could not begin, log a range or commit, or was used wrongly: a second heap
 * inside one thread's transaction, a transactional write outside any transaction where one is
 * required, or a commit of work that had been aborted (errno 125, ECANCELED). When thrown
 * from {@link Transaction#run}, everything the transaction did has been rolled back.
 */
public class TransactionException extends TerraceException {
    private static final long serialVersionUID = 1L;
    /** errno of work rolled back by an abort. */
    static final int ECANCELED = 125;

    public TransactionException(String message, int errno) {
        super(message, errno);
    }
}

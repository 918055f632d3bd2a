package dev.terrace.pool;

import dev.terrace.TerraceException;

/**
 * A heap operation failed: the pool file could not be created or opened, an allocation found
 * no space (errno 12, ENOMEM), or a handle named no live block. Carries the errno of the C
 * ABI (0 where the binding itself detected the problem).
 */
public class HeapException extends TerraceException {
    private static final long serialVersionUID = 1L;

    public HeapException(String message, int errno) {
        super(message, errno);
    }
}

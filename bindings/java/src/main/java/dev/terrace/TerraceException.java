package dev.terrace;

/**
 * A Terrace call failed: carries the errno-style code the C ABI returned or set, and the
 * message of {@code terrace_last_error()} read on the same thread right after the call.
 */
public class TerraceException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** The errno value (e.g. 12 for ENOMEM, 22 for EINVAL); 0 when none was reported. */
    private final int errno;

    public TerraceException(String message, int errno) {
        super(message);
        this.errno = errno;
    }

    /** The errno value of the failure (0 when the library reported none). */
    public int errno() {
        return errno;
    }
}

package dev.terrace.kinds;

/**
 * A kind could not satisfy an allocation: its medium is full (a file kind at its
 * {@code maxSize} or a full file system: errno ENOSPC) or the system is out of memory
 * (ENOMEM). It is an {@link OutOfMemoryError}, as {@link java.lang.foreign.Arena#allocate}
 * and Hazelcast's {@code NativeOutOfMemoryError} are, so code written against those catches
 * it unchanged; the JVM heap is not involved and stays usable.
 */
public final class KindOutOfMemoryError extends OutOfMemoryError {
    private static final long serialVersionUID = 1L;

    /** The errno the library reported (ENOMEM 12 or ENOSPC 28). */
    private final int errno;

    public KindOutOfMemoryError(String message, int errno) {
        super(message);
        this.errno = errno;
    }

    /** The errno the library reported (ENOMEM 12 or ENOSPC 28). */
    public int errno() {
        return errno;
    }
}

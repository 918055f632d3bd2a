package dev.terrace.internal;

import dev.terrace.TerraceException;

import java.io.IOException;
import java.io.InputStream;
import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemoryLayout;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.StructLayout;
import java.lang.foreign.SymbolLookup;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import java.lang.invoke.VarHandle;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;

/**
 * Owns the one loaded copy of libterrace.so and builds downcall handles into it.
 *
 * <p>Where the library comes from, in order: the system property {@value #PATH_PROPERTY}
 * (a path to a libterrace.so), else the copy inside the jar at {@value #RESOURCE}, extracted
 * once per JVM to a temporary file that is deleted at exit. It is loaded into the global
 * arena, so it stays loaded for the life of the JVM and every handle stays valid.
 *
 * <p>Errors: functions that return an errno-style int are checked with {@link #check}; functions
 * that return NULL or 0 on failure and set errno are bound with {@link #capturingErrno}, which
 * takes the errno from the call itself (a later JVM-internal call could overwrite the thread's
 * errno otherwise). The message is {@code terrace_last_error()}, which is per OS thread: it is
 * read right after the failing call on the same thread.
 */
public final class NativeLibrary {
    /** System property naming a libterrace.so to load instead of the jar's copy. */
    public static final String PATH_PROPERTY = "terrace.library.path";
    /** Where the jar carries the library. */
    public static final String RESOURCE = "/META-INF/native/linux-x86_64/libterrace.so";

    private static final Linker LINKER = Linker.nativeLinker();
    private static final SymbolLookup LOOKUP = SymbolLookup.libraryLookup(locate(), Arena.global());
    private static final StructLayout CALL_STATE = Linker.Option.captureStateLayout();
    private static final VarHandle ERRNO =
            CALL_STATE.varHandle(MemoryLayout.PathElement.groupElement("errno"));
    /**
     * Each thread's captured-state buffer, in an automatic arena: freed by the GC once its
     * thread (a virtual thread too) is gone and the thread-local with it, so short-lived
     * threads do not leak native memory.
     */
    private static final ThreadLocal<MemorySegment> CALL_STATE_BUFFER =
            ThreadLocal.withInitial(() -> Arena.ofAuto().allocate(CALL_STATE));
    private static final MethodHandle LAST_ERROR =
            downcall("terrace_last_error", FunctionDescriptor.of(ValueLayout.ADDRESS));

    private NativeLibrary() {}

    /** The path of the library file that was (or will be) loaded. */
    private static Path locate() {
        String override = System.getProperty(PATH_PROPERTY);
        if (override != null && !override.isEmpty()) {
            Path path = Path.of(override);
            if (!Files.isRegularFile(path)) {
                throw new UnsatisfiedLinkError(
                        "-D" + PATH_PROPERTY + "=" + override + " names no file");
            }
            return path;
        }
        try (InputStream in = NativeLibrary.class.getResourceAsStream(RESOURCE)) {
            if (in == null) {
                throw new UnsatisfiedLinkError("libterrace.so is not in the class path at "
                        + RESOURCE + " (the jar was built without it): set -D" + PATH_PROPERTY
                        + "=/path/to/libterrace.so");
            }
            Path extracted = Files.createTempFile("libterrace", ".so");
            extracted.toFile().deleteOnExit();
            Files.copy(in, extracted, StandardCopyOption.REPLACE_EXISTING);
            return extracted;
        } catch (IOException e) {
            UnsatisfiedLinkError error =
                    new UnsatisfiedLinkError("cannot extract libterrace.so: " + e.getMessage());
            error.initCause(e);
            throw error;
        }
    }

    private static MemorySegment symbol(String name) {
        return LOOKUP.find(name).orElseThrow(
                () -> new UnsatisfiedLinkError("libterrace.so has no symbol " + name));
    }

    /**
     * Whether the loaded library exports a symbol: a binding for functions newer than some
     * builds of the library checks this before binding them, to fail with a clear message.
     */
    public static boolean hasSymbol(String name) {
        return LOOKUP.find(name).isPresent();
    }

    /** A plain downcall handle (may block, may be slow: pool open, tx commit, cache open). */
    public static MethodHandle downcall(String name, FunctionDescriptor descriptor) {
        return LINKER.downcallHandle(symbol(name), descriptor);
    }

    /**
     * A critical downcall handle: for short calls that never block nor call back into Java
     * (malloc, free, persist, add-range, a cache get into a buffer). Heap segments are not
     * passed (allowHeapAccess false), so arguments must be native segments.
     */
    public static MethodHandle critical(String name, FunctionDescriptor descriptor) {
        return LINKER.downcallHandle(symbol(name), descriptor, Linker.Option.critical(false));
    }

    /**
     * A critical downcall handle that accepts heap segments (e.g. {@code MemorySegment.ofArray}
     * of a {@code byte[]} key) without copying: only for calls that do not keep the pointer.
     */
    public static MethodHandle criticalHeap(String name, FunctionDescriptor descriptor) {
        return LINKER.downcallHandle(symbol(name), descriptor, Linker.Option.critical(true));
    }

    /**
     * A downcall handle that captures errno: it takes one extra first argument, the segment of
     * {@link #callState()}, from which {@link #errno()} reads the call's errno.
     */
    public static MethodHandle capturingErrno(String name, FunctionDescriptor descriptor) {
        return LINKER.downcallHandle(symbol(name), descriptor,
                Linker.Option.captureCallState("errno"));
    }

    /**
     * A critical downcall handle that also captures errno (as {@link #capturingErrno}): for
     * short calls whose failure needs its errno (malloc, calloc, realloc).
     */
    public static MethodHandle criticalCapturingErrno(String name, FunctionDescriptor descriptor) {
        return LINKER.downcallHandle(symbol(name), descriptor, Linker.Option.critical(false),
                Linker.Option.captureCallState("errno"));
    }

    /** This thread's buffer for captured call state (pass it to a capturing handle). */
    public static MemorySegment callState() {
        return CALL_STATE_BUFFER.get();
    }

    /** The errno captured by this thread's last capturing call. */
    public static int errno() {
        return (int) ERRNO.get(CALL_STATE_BUFFER.get(), 0L);
    }

    /** The library's last error message on this OS thread ("" if none). */
    public static String lastError() {
        try {
            MemorySegment message = (MemorySegment) LAST_ERROR.invokeExact();
            if (message.equals(MemorySegment.NULL)) {
                return "";
            }
            return message.reinterpret(Long.MAX_VALUE).getString(0);
        } catch (Throwable t) {
            throw new AssertionError("terrace_last_error failed", t);
        }
    }

    /** A {@link TerraceException} for errno code, with what the library said about it. */
    public static TerraceException failure(String what, int code) {
        String message = lastError();
        return new TerraceException(
                what + " failed (errno " + code + ")" + (message.isEmpty() ? "" : ": " + message),
                code);
    }

    /** Throws unless an errno-style result is 0. */
    public static void check(String what, int result) {
        if (result != 0) {
            throw failure(what, result);
        }
    }

    /** Rethrows what a downcall threw: only errors (e.g. out of memory) reach here. */
    public static RuntimeException rethrow(Throwable t) {
        if (t instanceof RuntimeException r) {
            return r;
        }
        if (t instanceof Error e) {
            throw e;
        }
        return new IllegalStateException("unexpected checked exception from a downcall", t);
    }
}

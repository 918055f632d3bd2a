package dev.terrace.bench;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;

/**
 * memkind 1.14 (Debian's libmemkind.so.0) through FFM, the calls Hazelcast's MemkindHeap makes
 * through its JNI shim: memkind_create_pmem(dir, max, &kind), memkind_malloc, memkind_free
 * with a NULL kind (memkind detects the owner, as Terrace's free does), and MEMKIND_DEFAULT,
 * a global pointer variable, as the DRAM kind. The hot calls are critical downcalls, as the
 * binding's malloc and free are.
 */
final class Memkind {
    private static final Linker LINKER = Linker.nativeLinker();
    private static SymbolLookup lookup;
    private static MethodHandle create_pmem, destroy, malloc, free;

    private Memkind() {}

    /** Loads the library; hog=true first sets MEMKIND_HOG_MEMORY=1, as Hazelcast does. */
    static synchronized void load(boolean hog) {
        if (lookup != null) {
            return;
        }
        if (hog) {
            setenv("MEMKIND_HOG_MEMORY", "1");
        }
        lookup = SymbolLookup.libraryLookup("libmemkind.so.0", Arena.global());
        create_pmem = LINKER.downcallHandle(lookup.find("memkind_create_pmem").orElseThrow(),
                FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.ADDRESS,
                        ValueLayout.JAVA_LONG, ValueLayout.ADDRESS));
        destroy = LINKER.downcallHandle(lookup.find("memkind_destroy_kind").orElseThrow(),
                FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.JAVA_LONG));
        malloc = LINKER.downcallHandle(lookup.find("memkind_malloc").orElseThrow(),
                FunctionDescriptor.of(ValueLayout.JAVA_LONG, ValueLayout.JAVA_LONG,
                        ValueLayout.JAVA_LONG), Linker.Option.critical(false));
        free = LINKER.downcallHandle(lookup.find("memkind_free").orElseThrow(),
                FunctionDescriptor.ofVoid(ValueLayout.JAVA_LONG, ValueLayout.JAVA_LONG),
                Linker.Option.critical(false));
    }

    private static void setenv(String name, String value) {
        MethodHandle h = LINKER.downcallHandle(LINKER.defaultLookup().find("setenv").orElseThrow(),
                FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.ADDRESS,
                        ValueLayout.ADDRESS, ValueLayout.JAVA_INT));
        try (Arena a = Arena.ofConfined()) {
            int rc = (int) h.invokeExact(a.allocateFrom(name), a.allocateFrom(value), 1);
            if (rc != 0) {
                throw new IllegalStateException("setenv " + name);
            }
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    /** MEMKIND_DEFAULT's value (the kind pointer the variable holds). */
    static long defaultKind() {
        MemorySegment var = lookup.find("MEMKIND_DEFAULT").orElseThrow();
        return var.reinterpret(8).get(ValueLayout.JAVA_LONG, 0);
    }

    static long createPmem(String dir, long max) {
        try (Arena a = Arena.ofConfined()) {
            MemorySegment out = a.allocate(ValueLayout.JAVA_LONG);
            int rc = (int) create_pmem.invokeExact(a.allocateFrom(dir), max, out);
            if (rc != 0) {
                throw new IllegalStateException("memkind_create_pmem(" + dir + ") = " + rc);
            }
            return out.get(ValueLayout.JAVA_LONG, 0);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    static void destroy(long kind) {
        try {
            int rc = (int) destroy.invokeExact(kind);
            if (rc != 0) {
                throw new IllegalStateException("memkind_destroy_kind = " + rc);
            }
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    static long malloc(long kind, long size) {
        try {
            return (long) malloc.invokeExact(kind, size);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    static void free(long address) {
        try {
            free.invokeExact(0L, address);
        } catch (Throwable t) {
            throw rethrow(t);
        }
    }

    static RuntimeException rethrow(Throwable t) {
        if (t instanceof RuntimeException r) {
            throw r;
        }
        if (t instanceof Error e) {
            throw e;
        }
        throw new IllegalStateException(t);
    }
}

package dev.terrace;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import dev.terrace.internal.NativeLibrary;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.ValueLayout;
import java.lang.invoke.MethodHandle;
import org.junit.jupiter.api.Test;

/** The library loads (from the jar's copy or the property) and reports errors. */
class NativeLibraryTest {
    @Test
    void loadsAndReportsAnErrorMessage() throws Throwable {
        MethodHandle destroy = NativeLibrary.downcall("terrace_kind_destroy",
                FunctionDescriptor.of(ValueLayout.JAVA_INT, ValueLayout.ADDRESS));
        int code = (int) destroy.invokeExact(MemorySegment.NULL);
        assertEquals(22, code, "destroying a NULL kind is EINVAL");
        assertNotNull(NativeLibrary.lastError());
    }
}

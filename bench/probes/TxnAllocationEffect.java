import static java.lang.foreign.ValueLayout.ADDRESS;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import java.lang.foreign.Arena;
import java.lang.foreign.FunctionDescriptor;
import java.lang.foreign.Linker;
import java.lang.foreign.MemorySegment;
import java.lang.foreign.SymbolLookup;
import java.lang.invoke.MethodHandle;

/**
 * What one Java allocation per transaction does to the native transaction's cost: raw FFM
 * critical downcalls of terrace_pool_txn_begin/alloc/commit (no binding code), each loop
 * with and without one {@code new long[4]} per transaction. See docs/results.md,
 * "Transactions by handle". A source-file program:
 *
 *   java --enable-native-access=ALL-UNNAMED bench/probes/TxnAllocationEffect.java \
 *       target/release/libterrace.so [DIR]
 *
 * Add -XX:-UseTLAB (before the file name) to see the effect shrink.
 */
public class TxnAllocationEffect {
    static Object sink;

    public static void main(String[] args) throws Throwable {
        Linker linker = Linker.nativeLinker();
        SymbolLookup lib = SymbolLookup.libraryLookup(args[0], Arena.global());
        Linker.Option critical = Linker.Option.critical(false);
        MethodHandle create = linker.downcallHandle(lib.find("terrace_pool_create").get(),
                FunctionDescriptor.of(ADDRESS, ADDRESS, JAVA_LONG, ADDRESS));
        MethodHandle close = linker.downcallHandle(lib.find("terrace_pool_close").get(),
                FunctionDescriptor.of(JAVA_INT, ADDRESS));
        MethodHandle begin = linker.downcallHandle(lib.find("terrace_pool_txn_begin").get(),
                FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_INT), critical);
        MethodHandle alloc = linker.downcallHandle(lib.find("terrace_pool_txn_alloc").get(),
                FunctionDescriptor.of(JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_LONG, JAVA_INT),
                critical);
        MethodHandle commit = linker.downcallHandle(lib.find("terrace_pool_txn_commit").get(),
                FunctionDescriptor.of(JAVA_INT, JAVA_LONG), critical);
        MethodHandle free = linker.downcallHandle(lib.find("terrace_pool_free_off").get(),
                FunctionDescriptor.of(JAVA_INT, JAVA_LONG, JAVA_LONG));
        String path = (args.length > 1 ? args[1] : "/dev/shm") + "/txn-allocation-effect.pool";
        new java.io.File(path).delete();
        MemorySegment pool;
        try (Arena strings = Arena.ofConfined()) {
            pool = (MemorySegment) create.invokeExact(strings.allocateFrom(path), 256L << 20,
                    strings.allocateFrom("probe"));
        }
        long raw = pool.address();
        long[] handles = new long[256];
        for (int round = 0; round < 4; round++) {
            long[] t = new long[4];
            int n = 0;
            while (n < 1_000_000) {
                long t0 = System.nanoTime();
                for (int i = 0; i < 256; i++) {
                    int rc = (int) commit.invokeExact((long) begin.invokeExact(raw, 0));
                }
                long t1 = System.nanoTime();
                for (int i = 0; i < 256; i++) {
                    int rc = (int) commit.invokeExact((long) begin.invokeExact(raw, 0));
                    sink = new long[4];
                }
                long t2 = System.nanoTime();
                for (int i = 0; i < 256; i++) {
                    long txn = (long) begin.invokeExact(raw, 0);
                    handles[i] = (long) alloc.invokeExact(txn, 108L, 1L, 1);
                    int rc = (int) commit.invokeExact(txn);
                }
                long t3 = System.nanoTime();
                for (long h : handles) {
                    int rc = (int) free.invokeExact(raw, h);
                }
                long t4 = System.nanoTime();
                for (int i = 0; i < 256; i++) {
                    long txn = (long) begin.invokeExact(raw, 0);
                    handles[i] = (long) alloc.invokeExact(txn, 108L, 1L, 1);
                    int rc = (int) commit.invokeExact(txn);
                    sink = new long[4];
                }
                long t5 = System.nanoTime();
                for (long h : handles) {
                    int rc = (int) free.invokeExact(raw, h);
                }
                t[0] += t1 - t0;
                t[1] += t2 - t1;
                t[2] += t3 - t2;
                t[3] += t5 - t4;
                n += 256;
            }
            System.out.printf("empty %.1f ns, with one Java allocation %.1f ns | alloc %.1f ns,"
                    + " with one Java allocation %.1f ns%n", (double) t[0] / n,
                    (double) t[1] / n, (double) t[2] / n, (double) t[3] / n);
        }
        int rc = (int) close.invokeExact(pool);
        new java.io.File(path).delete();
    }
}

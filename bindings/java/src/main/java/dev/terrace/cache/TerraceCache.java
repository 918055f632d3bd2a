package dev.terrace.cache;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT;
import static java.lang.foreign.ValueLayout.JAVA_LONG;

import dev.terrace.TerraceException;
import dev.terrace.internal.NativeLibrary;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandle;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.OptionalLong;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;

/**
 * An open Terrace tiered cache ({@code terrace_cache *}): key/value items with memcached's
 * semantics (client flags, TTLs in seconds, CAS, incr/decr) over DRAM, file and NUMA tiers,
 * with a warm restart from a file tier's directory. Owns the native cache and closes it in
 * {@link #close()}, which saves the index and the DRAM tiers for the next {@link #open}.
 *
 * <p>Values stay off the Java heap: {@link #get(byte[])} copies a hit through a per-thread
 * native buffer (grown when a value does not fit, and freed with its thread) into the one
 * array it returns; {@link #get(MemorySegment, MemorySegment)} copies straight into the
 * caller's segment; {@link #pin} reads the value in place, with no copy at all. Keys and
 * values given as {@code byte[]} to set, add, replace and cas are copied into a second
 * per-thread native buffer (grown as needed, up to the largest key and value the library
 * accepts) and passed with native-only critical downcalls: the heap-accepting critical
 * downcall cost about 140 ns more per set than the copy (even given native segments, so
 * {@link #set(MemorySegment, MemorySegment, int, int)} given two native segments uses the
 * native-only one too). Larger arguments, which the library refuses, and every other
 * {@code byte[]} or heap-segment argument are passed without a copy (critical downcalls
 * accepting heap memory): copying a get's key measured 5-10 ns slower, not faster.
 *
 * <p>Invariants: every method is thread-safe. Calls in flight are counted, and
 * {@link #close()} waits for them to finish, so no call overlaps the native close (which the
 * C ABI forbids); afterwards every call throws {@link IllegalStateException}. While a
 * {@link PinnedValue} is open the cache refuses to close ({@link IllegalStateException},
 * the cache stays open), so a pinned value never outlives its memory. Closing twice does
 * nothing.
 *
 * <p>Errors: misses and unmet conditions are return values ({@code null}, {@code false},
 * {@code -1}, {@link CasOutcome}, an empty {@link OptionalLong}); failures throw
 * {@link TerraceException} with the library's message and errno: EINVAL (an empty key, a key
 * over 250 bytes, incr of a value that is not a number), E2BIG (a value over 1 MiB), ENOSPC
 * (no free segment: every one pinned).
 */
public final class TerraceCache implements AutoCloseable {
    /** Smallest per-thread value buffer; it grows to the largest value read by the thread. */
    private static final long INITIAL_BUFFER = 4096;
    /**
     * Most key plus value bytes copied into a thread's input buffer: a 250-byte key and a
     * 1 MiB value, the library's limits. Larger calls fail in the library anyway, so they go
     * as heap segments rather than growing the buffer.
     */
    private static final long MAX_COPIED = (1L << 20) + 250;
    private static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);

    private final long handle;
    private final String description;
    private final LongAdder inFlight = new LongAdder();
    private final AtomicLong pins = new AtomicLong();
    private volatile boolean closed;

    /**
     * One thread's native out-parameters, value buffer (gets) and input buffer (the key and
     * value of a store, copied from arrays), allocated in automatic arenas: the GC frees them
     * with the thread (or when a buffer is replaced by a larger one).
     */
    private static final class Scratch {
        final MemorySegment valueLength;
        final MemorySegment flags;
        final MemorySegment cas;
        final MemorySegment out;
        MemorySegment value;
        private MemorySegment in;

        Scratch() {
            MemorySegment slots = Arena.ofAuto().allocate(32, 8);
            valueLength = slots.asSlice(0, 8);
            cas = slots.asSlice(8, 8);
            out = slots.asSlice(16, 8);
            flags = slots.asSlice(24, 4);
            value = Arena.ofAuto().allocate(INITIAL_BUFFER, 8);
            in = Arena.ofAuto().allocate(INITIAL_BUFFER, 8);
        }

        /** The input buffer, grown to at least needed bytes. */
        MemorySegment input(long needed) {
            if (in.byteSize() < needed) {
                in = Arena.ofAuto().allocate(Math.max(needed, in.byteSize() * 2), 8);
            }
            return in;
        }

        void growTo(long needed) {
            long size = Math.max(needed, value.byteSize() * 2);
            value = Arena.ofAuto().allocate(size, 8);
        }
    }

    private TerraceCache(long handle, String description) {
        this.handle = handle;
        this.description = description;
    }

    // ------------------------------------------------------------------ open, close

    /**
     * Opens a cache. {@code tiers} is as {@code terrace serve --tiers}, fastest first:
     * {@code "dram:64MiB,file:256MiB"}, {@code "dram:1,file:3"} (ratios of {@code capacity},
     * which must then be non-zero) or {@code "dram:4GiB,numa:2:64GiB"}; each tier needs at
     * least 16 MiB. {@code dir} holds the file tiers (created if missing; may be null without
     * a file tier). Opening the directory of a cleanly closed cache with the same tiers is a
     * warm restart: its items are back.
     *
     * @throws TerraceException EINVAL for a bad spec or sizes, ENOENT/EACCES for the
     *         directory, ENOSPC/ENOMEM when there is no room
     */
    public static TerraceCache open(String tiers, Path dir, long capacity) {
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment cTiers = arena.allocateFrom(tiers);
            MemorySegment cDir = dir == null ? MemorySegment.NULL : arena.allocateFrom(dir.toString());
            long handle = (long) CacheNative.OPEN.invokeExact(NativeLibrary.callState(), cTiers,
                    cDir, capacity);
            if (handle == 0) {
                throw NativeLibrary.failure("terrace_cache_open(\"" + tiers + "\", " + dir + ", "
                        + capacity + ")", NativeLibrary.errno());
            }
            return new TerraceCache(handle,
                    "cache " + tiers + (dir == null ? "" : " in " + dir));
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    /** Opens a cache with no file tier (see {@link #open(String, Path, long)}). */
    public static TerraceCache open(String tiers) {
        return open(tiers, null, 0);
    }

    /**
     * Closes the cache, saving its index and DRAM tiers beside the first file tier for a warm
     * restart. Waits for calls in flight; does nothing if already closed.
     *
     * @throws IllegalStateException if pinned values are still open (the cache stays open;
     *         calls racing with the refused close may have seen it closed)
     * @throws TerraceException if saving failed (the cache is closed anyway)
     */
    @Override
    public synchronized void close() {
        if (closed) {
            return;
        }
        closed = true;
        while (inFlight.sum() != 0) {
            Thread.onSpinWait();
        }
        long open = pins.get();
        if (open > 0) {
            closed = false;
            throw stillPinned(open);
        }
        int code;
        try {
            code = (int) CacheNative.CLOSE.invokeExact(handle);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
        if (code == CacheNative.EBUSY) {
            closed = false;
            throw stillPinned(pins.get());
        }
        if (code != 0) {
            throw failure("close", code);
        }
    }

    private IllegalStateException stillPinned(long open) {
        return new IllegalStateException("cannot close " + description + ": " + open
                + " pinned value(s) are still open; close them first");
    }

    /** Whether {@link #close()} has closed this cache. */
    public boolean isClosed() {
        return closed;
    }

    // ------------------------------------------------------------------ reads

    /** The value of {@code key} as a new array, or null on a miss. */
    public byte[] get(byte[] key) {
        CacheItem item = getItem(key);
        return item == null ? null : item.value();
    }

    /** The value of {@code key} with its flags and CAS, or null on a miss. */
    public CacheItem getItem(byte[] key) {
        MemorySegment k = MemorySegment.ofArray(key);
        enter();
        try {
            Scratch s = SCRATCH.get();
            while (true) {
                int code = (int) CacheNative.GET.invokeExact(handle, k, (long) key.length,
                        s.value, s.value.byteSize(), s.valueLength, s.flags, s.cas);
                long length = s.valueLength.get(JAVA_LONG, 0);
                if (code == 0) {
                    byte[] value = new byte[Math.toIntExact(length)];
                    MemorySegment.copy(s.value, JAVA_BYTE, 0, value, 0, value.length);
                    return new CacheItem(value, s.flags.get(JAVA_INT, 0),
                            s.cas.get(JAVA_LONG, 0));
                }
                if (code == CacheNative.ENOENT) {
                    return null;
                }
                if (code == CacheNative.ENOSPC && length > s.value.byteSize()) {
                    s.growTo(length);
                    continue;
                }
                throw failure("get", code);
            }
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /**
     * Copies the value of {@code key} into {@code into} (native or heap) and returns its
     * length; -1 on a miss. A return greater than {@code into.byteSize()} means the value did
     * not fit and nothing was copied: retry with a segment of at least that size.
     */
    public long get(MemorySegment key, MemorySegment into) {
        if (into.isReadOnly()) {
            throw new IllegalArgumentException("the segment to copy into is read-only");
        }
        enter();
        try {
            Scratch s = SCRATCH.get();
            int code = (int) CacheNative.GET.invokeExact(handle, key, key.byteSize(), into,
                    into.byteSize(), s.valueLength, MemorySegment.NULL, MemorySegment.NULL);
            if (code == 0 || code == CacheNative.ENOSPC) {
                long length = s.valueLength.get(JAVA_LONG, 0);
                if (code == 0 || length > into.byteSize()) {
                    return length;
                }
            }
            if (code == CacheNative.ENOENT) {
                return -1;
            }
            throw failure("get", code);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** Pins the item of {@code key} for a zero-copy read, or returns null on a miss. */
    public PinnedValue pin(byte[] key) {
        return pin(MemorySegment.ofArray(key));
    }

    /**
     * Pins the item of {@code key} (native or heap) for a zero-copy read, or returns null on a
     * miss. Close the {@link PinnedValue} soon, on the thread that pinned it.
     */
    public PinnedValue pin(MemorySegment key) {
        enter();
        try {
            Scratch s = SCRATCH.get();
            int code = (int) CacheNative.PIN.invokeExact(handle, key, key.byteSize(), s.out);
            if (code == CacheNative.ENOENT) {
                return null;
            }
            if (code != 0) {
                throw failure("pin", code);
            }
            long guard = s.out.get(JAVA_LONG, 0);
            pins.incrementAndGet();
            try {
                long address = (long) CacheNative.GUARD_VALUE.invokeExact(guard, s.valueLength);
                long length = s.valueLength.get(JAVA_LONG, 0);
                int flags = (int) CacheNative.GUARD_FLAGS.invokeExact(guard);
                long cas = (long) CacheNative.GUARD_CAS.invokeExact(guard);
                Arena arena = Arena.ofConfined();
                MemorySegment value = MemorySegment.ofAddress(address)
                        .reinterpret(length, arena, ignored -> release(guard))
                        .asReadOnly();
                return new PinnedValue(this, arena, value, flags, cas);
            } catch (Throwable t) {
                release(guard);
                pins.decrementAndGet();
                throw t;
            }
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    private static void release(long guard) {
        try {
            CacheNative.RELEASE.invokeExact(guard);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        }
    }

    /** A pinned value was closed (its guard released). */
    void unpinned() {
        pins.decrementAndGet();
    }

    // ------------------------------------------------------------------ writes

    /** Stores {@code key -> value} with no client flags; returns the new item's CAS. */
    public long set(byte[] key, byte[] value, int ttlSeconds) {
        return set(key, value, ttlSeconds, 0);
    }

    /** Stores {@code key -> value}; returns the new item's CAS. TTL 0: never expires. */
    public long set(byte[] key, byte[] value, int ttlSeconds, int flags) {
        int code = storeArrays(CacheNative.SET_NATIVE, CacheNative.SET, key, value, ttlSeconds,
                flags);
        if (code != 0) {
            throw failure("set", code);
        }
        return SCRATCH.get().out.get(JAVA_LONG, 0);
    }

    /**
     * Stores {@code key -> value} (native or heap segments); returns the new item's CAS. Two
     * native segments go through the native-only downcall (the heap-accepting one cost about
     * 140 ns more per set, even given native segments).
     */
    public long set(MemorySegment key, MemorySegment value, int ttlSeconds, int flags) {
        int code = store(key.isNative() && value.isNative() ? CacheNative.SET_NATIVE
                : CacheNative.SET, key, value, ttlSeconds, flags);
        if (code != 0) {
            throw failure("set", code);
        }
        return SCRATCH.get().out.get(JAVA_LONG, 0);
    }

    /** Stores only if {@code key} is absent; false if it is present. */
    public boolean add(byte[] key, byte[] value, int ttlSeconds) {
        return add(key, value, ttlSeconds, 0);
    }

    /** Stores only if {@code key} is absent; false if it is present. */
    public boolean add(byte[] key, byte[] value, int ttlSeconds, int flags) {
        int code = storeArrays(CacheNative.ADD_NATIVE, CacheNative.ADD, key, value, ttlSeconds,
                flags);
        return conditional("add", code, CacheNative.EEXIST);
    }

    /** Stores only if {@code key} is present; false if it is absent. */
    public boolean replace(byte[] key, byte[] value, int ttlSeconds) {
        return replace(key, value, ttlSeconds, 0);
    }

    /** Stores only if {@code key} is present; false if it is absent. */
    public boolean replace(byte[] key, byte[] value, int ttlSeconds, int flags) {
        int code = storeArrays(CacheNative.REPLACE_NATIVE, CacheNative.REPLACE, key, value,
                ttlSeconds, flags);
        return conditional("replace", code, CacheNative.ENOENT);
    }

    /**
     * Stores only if {@code key}'s CAS is {@code expectedCas} (from {@link #getItem},
     * {@link #set} or {@link PinnedValue#cas()}).
     */
    public CasOutcome cas(byte[] key, byte[] value, int ttlSeconds, int flags, long expectedCas) {
        checkTtl(ttlSeconds);
        enter();
        try {
            Scratch s = SCRATCH.get();
            long total = (long) key.length + value.length;
            int code;
            if (total <= MAX_COPIED) {
                MemorySegment in = copyIn(s, key, value, total);
                code = (int) CacheNative.CAS_NATIVE.invokeExact(handle, in, (long) key.length,
                        in.asSlice(key.length), (long) value.length, flags, ttlSeconds,
                        expectedCas, s.out);
            } else {
                code = (int) CacheNative.CAS.invokeExact(handle, MemorySegment.ofArray(key),
                        (long) key.length, MemorySegment.ofArray(value), (long) value.length,
                        flags, ttlSeconds, expectedCas, s.out);
            }
            return switch (code) {
                case 0 -> CasOutcome.STORED;
                case CacheNative.EEXIST -> CasOutcome.EXISTS;
                case CacheNative.ENOENT -> CasOutcome.NOT_FOUND;
                default -> throw failure("cas", code);
            };
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** Deletes {@code key}; false if it was absent. */
    public boolean delete(byte[] key) {
        enter();
        try {
            int code = (int) CacheNative.DELETE.invokeExact(handle, MemorySegment.ofArray(key),
                    (long) key.length);
            return conditional("delete", code, CacheNative.ENOENT);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** Gives {@code key} a new TTL (its CAS kept); false if it is absent. */
    public boolean touch(byte[] key, int ttlSeconds) {
        checkTtl(ttlSeconds);
        enter();
        try {
            int code = (int) CacheNative.TOUCH.invokeExact(handle, MemorySegment.ofArray(key),
                    (long) key.length, ttlSeconds);
            return conditional("touch", code, CacheNative.ENOENT);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /**
     * Adds {@code delta} (unsigned) to the decimal number stored at {@code key}, wrapping at
     * 2^64; the new value (unsigned), or empty if the key is absent.
     *
     * @throws TerraceException EINVAL if the value is not a decimal number below 2^64
     */
    public OptionalLong incr(byte[] key, long delta) {
        return arith(CacheNative.INCR, "incr", key, delta);
    }

    /** As {@link #incr}, subtracting and stopping at 0. */
    public OptionalLong decr(byte[] key, long delta) {
        return arith(CacheNative.DECR, "decr", key, delta);
    }

    /** Removes every item. */
    public void flushAll() {
        enter();
        try {
            int code = (int) CacheNative.FLUSH_ALL.invokeExact(handle);
            if (code != 0) {
                throw failure("flush_all", code);
            }
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** The cache's counters now (it walks the index: not for every request). */
    public CacheStats stats() {
        enter();
        try (Arena arena = Arena.ofConfined()) {
            MemorySegment out = arena.allocate(CacheNative.STATS);
            int code = (int) CacheNative.STATS_CALL.invokeExact(handle, out);
            if (code != 0) {
                throw failure("stats", code);
            }
            int tierCount = out.get(JAVA_INT, CacheNative.TIER_COUNT_OFFSET);
            List<CacheStats.Tier> tiers = new ArrayList<>();
            for (int i = 0; i < Math.min(tierCount, CacheNative.MAX_TIERS); i++) {
                long base = CacheNative.TIERS_OFFSET + i * CacheNative.TIER_STATS.byteSize();
                tiers.add(new CacheStats.Tier(out.get(JAVA_LONG, base),
                        out.get(JAVA_LONG, base + 8), out.get(JAVA_LONG, base + 16),
                        out.get(JAVA_LONG, base + 24), out.get(JAVA_LONG, base + 32),
                        out.get(JAVA_LONG, base + 40), out.get(JAVA_LONG, base + 48)));
            }
            return new CacheStats(out.getAtIndex(JAVA_LONG, 0), out.getAtIndex(JAVA_LONG, 1),
                    out.getAtIndex(JAVA_LONG, 2), out.getAtIndex(JAVA_LONG, 3),
                    out.getAtIndex(JAVA_LONG, 4), out.getAtIndex(JAVA_LONG, 5),
                    out.getAtIndex(JAVA_LONG, 6), out.getAtIndex(JAVA_LONG, 7),
                    out.getAtIndex(JAVA_LONG, 8), out.getAtIndex(JAVA_LONG, 9), tierCount,
                    List.copyOf(tiers));
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    @Override
    public String toString() {
        return description;
    }

    // ------------------------------------------------------------------ helpers

    private int store(MethodHandle op, MemorySegment key, MemorySegment value, int ttlSeconds,
            int flags) {
        checkTtl(ttlSeconds);
        enter();
        try {
            return (int) op.invokeExact(handle, key, key.byteSize(), value, value.byteSize(),
                    flags, ttlSeconds, SCRATCH.get().out);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /**
     * A store of arrays: copied into the thread's input buffer and passed with nativeOp (no
     * heap access in the downcall), or, past {@link #MAX_COPIED}, passed as heap segments
     * with heapOp (the library refuses them).
     */
    private int storeArrays(MethodHandle nativeOp, MethodHandle heapOp, byte[] key,
            byte[] value, int ttlSeconds, int flags) {
        long total = (long) key.length + value.length;
        if (total > MAX_COPIED) {
            return store(heapOp, MemorySegment.ofArray(key), MemorySegment.ofArray(value),
                    ttlSeconds, flags);
        }
        checkTtl(ttlSeconds);
        enter();
        try {
            Scratch s = SCRATCH.get();
            MemorySegment in = copyIn(s, key, value, total);
            return (int) nativeOp.invokeExact(handle, in, (long) key.length,
                    in.asSlice(key.length), (long) value.length, flags, ttlSeconds, s.out);
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** Copies key then value into the thread's input buffer (grown to total bytes). */
    private static MemorySegment copyIn(Scratch s, byte[] key, byte[] value, long total) {
        MemorySegment in = s.input(total);
        MemorySegment.copy(key, 0, in, JAVA_BYTE, 0, key.length);
        MemorySegment.copy(value, 0, in, JAVA_BYTE, key.length, value.length);
        return in;
    }

    private OptionalLong arith(MethodHandle op, String what, byte[] key, long delta) {
        enter();
        try {
            Scratch s = SCRATCH.get();
            int code = (int) op.invokeExact(handle, MemorySegment.ofArray(key),
                    (long) key.length, delta, s.out);
            if (code == CacheNative.ENOENT) {
                return OptionalLong.empty();
            }
            if (code != 0) {
                throw failure(what, code);
            }
            return OptionalLong.of(s.out.get(JAVA_LONG, 0));
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            exit();
        }
    }

    /** True for 0, false for the errno that means "condition not met", else throws. */
    private boolean conditional(String what, int code, int unmet) {
        if (code == 0) {
            return true;
        }
        if (code == unmet) {
            return false;
        }
        throw failure(what, code);
    }

    private static void checkTtl(int ttlSeconds) {
        if (ttlSeconds < 0) {
            throw new IllegalArgumentException("TTL must be >= 0 seconds, got " + ttlSeconds);
        }
    }

    private void enter() {
        inFlight.increment();
        if (closed) {
            inFlight.decrement();
            throw new IllegalStateException(description + " is closed");
        }
    }

    private void exit() {
        inFlight.decrement();
    }

    private TerraceException failure(String what, int code) {
        return NativeLibrary.failure("terrace_cache_" + what + " on " + description, code);
    }
}

package dev.terrace.collections;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;

import dev.terrace.internal.HeapAccess;
import dev.terrace.internal.NativeLibrary;
import dev.terrace.pool.AnyHeap;
import java.lang.foreign.Arena;
import java.lang.foreign.MemorySegment;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.lang.ref.ReferenceQueue;
import java.lang.ref.WeakReference;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;

/**
 * What every open collection of a heap (a map of {@link NativeMap}, a {@link PersistentArray})
 * shares: its name and description, and the rule that keeps its native handle alive while
 * calls run. A thread inside a call marks itself in its own {@link Scratch} (one volatile
 * store per call, not a shared counter that every thread's calls would contend on);
 * {@link #closeAndAwaitCalls()} marks the collection closed and waits for every thread marked
 * as inside a call on it, so the subclass's native close never overlaps a call (which the C
 * ABI forbids). Calls after that throw {@link IllegalStateException}.
 *
 * <p>The thread's native buffers (arguments and results of the calls: keys, values, a word,
 * the captured errno) are in automatic arenas, which the GC frees with their thread.
 */
abstract class NativeCollection implements AutoCloseable {
    private static final long INITIAL_VALUE_BUFFER = 256;
    /** Largest value kept in a thread's buffers; larger ones get an arena of their own. */
    static final long MAX_BUFFERED = 1L << 20;
    private static final int SPINS_BEFORE_YIELD = 1 << 10;
    /** Bytes of a key buffer: the longest key the C ABI takes, and one. */
    static final int KEY_BUFFER = MapNative.MAX_KEY + 1;

    private static final ThreadLocal<Scratch> SCRATCH = ThreadLocal.withInitial(Scratch::new);
    private static final VarHandle IN_CALL;

    static {
        try {
            IN_CALL = MethodHandles.lookup().findVarHandle(Scratch.class, "inCall",
                    NativeCollection.class);
        } catch (ReflectiveOperationException e) {
            throw new ExceptionInInitializerError(e);
        }
    }

    /**
     * One thread's native buffers and its in-call marker. Every thread's scratch is in
     * {@link #ALL} (weakly: it goes with its thread), so that a closing collection can wait
     * for the threads inside a call on it.
     */
    static final class Scratch {
        static final Set<WeakReference<Scratch>> ALL = ConcurrentHashMap.newKeySet();
        private static final ReferenceQueue<Scratch> GONE = new ReferenceQueue<>();

        /**
         * The collection this thread is inside a call on, or null: written by this thread
         * only (see {@link NativeCollection#tryEnter()}), read by closing collections.
         */
        volatile NativeCollection inCall;
        final MemorySegment state;
        final MemorySegment key;
        /** A second key buffer: a cursor's high bound. */
        final MemorySegment hi;
        final MemorySegment keyLen;
        final MemorySegment valueLen;
        final MemorySegment word;
        MemorySegment value;
        private MemorySegment in;

        Scratch() {
            Arena arena = Arena.ofAuto();
            MemorySegment fixed = arena.allocate(2 * KEY_BUFFER + 24, 16);
            key = fixed.asSlice(0, KEY_BUFFER);
            hi = fixed.asSlice(KEY_BUFFER, KEY_BUFFER);
            keyLen = fixed.asSlice(2 * KEY_BUFFER, 8);
            valueLen = fixed.asSlice(2 * KEY_BUFFER + 8, 8);
            word = fixed.asSlice(2 * KEY_BUFFER + 16, 8);
            state = arena.allocate(MapNative.STATE);
            value = arena.allocate(INITIAL_VALUE_BUFFER, 8);
            in = value;
            for (var gone = GONE.poll(); gone != null; gone = GONE.poll()) {
                ALL.remove(gone);
            }
            ALL.add(new WeakReference<>(this, GONE));
        }

        /** The key buffer holding key. */
        MemorySegment key(byte[] k) {
            MemorySegment.copy(k, 0, key, JAVA_BYTE, 0, k.length);
            return key;
        }

        /** The value output buffer, grown to at least needed bytes. */
        MemorySegment valueBuffer(long needed) {
            if (value.byteSize() < needed) {
                value = Arena.ofAuto().allocate(Math.max(needed, value.byteSize() * 2), 8);
            }
            return value;
        }

        /** A buffer holding v (at most MAX_BUFFERED bytes). */
        MemorySegment input(byte[] v) {
            if (in.byteSize() < v.length) {
                in = Arena.ofAuto().allocate(Math.max(v.length, in.byteSize() * 2), 8);
            }
            MemorySegment.copy(v, 0, in, JAVA_BYTE, 0, v.length);
            return in;
        }
    }

    static Scratch scratch() {
        return SCRATCH.get();
    }

    final AnyHeap heap;
    final String name;
    /** "ordered map 'name' of heap path", for messages. */
    final String description;
    private volatile boolean closed;

    NativeCollection(AnyHeap heap, String name, String description) {
        this.heap = heap;
        this.name = name;
        this.description = description;
    }

    /**
     * Closes the collection: waits for the calls in flight, runs
     * {@link #beforeNativeClose()}, then closes the native handle and unregisters from the
     * heap. Closing twice does nothing.
     */
    @Override
    public final synchronized void close() {
        if (!closeAndAwaitCalls()) {
            return;
        }
        beforeNativeClose();
        int rc;
        try {
            rc = nativeClose();
        } catch (Throwable t) {
            throw NativeLibrary.rethrow(t);
        } finally {
            HeapAccess.bridge().detach(heap, this);
        }
        if (rc != 0) {
            throw NativeMap.failure("closing " + description + " (closed anyway)", rc, null);
        }
    }

    /** What has to close before the native handle (nothing by default). */
    void beforeNativeClose() {}

    /** Closes the native handle: 0 or an errno. Called once, with no call in flight. */
    abstract int nativeClose() throws Throwable;

    /**
     * Marks the collection closed and waits until no thread is inside a call on it; false
     * (and nothing done) when it was closed already. Runs under close's lock, so that two
     * closes do not race.
     */
    private boolean closeAndAwaitCalls() {
        if (closed) {
            return false;
        }
        closed = true;
        for (WeakReference<Scratch> ref : Scratch.ALL) {
            Scratch s = ref.get();
            for (int spins = 0; s != null && s.inCall == this; spins++) {
                if (spins < SPINS_BEFORE_YIELD) {
                    Thread.onSpinWait();
                } else {
                    Thread.yield();
                }
            }
        }
        return true;
    }

    boolean isClosed() {
        return closed;
    }

    /**
     * Marks the calling thread as calling into this collection (its {@link Scratch#inCall}) and
     * returns its buffers; throws IllegalStateException when it is closed. Every
     * native call on it runs between this and {@link #exit(Scratch)}; such calls do not
     * nest (a thread is inside one collection call at a time).
     */
    Scratch enter() {
        Scratch s = tryEnter();
        if (s == null) {
            throw new IllegalStateException(description + " is closed");
        }
        return s;
    }

    /**
     * {@link #enter()}, or null when the collection is closed. The volatile store of the
     * marker and the read of {@code closed} after it pair with
     * {@link #closeAndAwaitCalls()}'s store of {@code closed} and its read of every marker
     * after it: one of the two sides sees the other's store, so either this call sees the
     * collection closed or the close waits for it.
     */
    Scratch tryEnter() {
        Scratch s = SCRATCH.get();
        s.inCall = this;
        if (closed) {
            IN_CALL.setRelease(s, null);
            return null;
        }
        return s;
    }

    /** Ends the call {@link #enter()} began (its native calls are done). */
    static void exit(Scratch s) {
        IN_CALL.setRelease(s, null);
    }
}

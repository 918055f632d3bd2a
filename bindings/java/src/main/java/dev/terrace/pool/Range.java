package dev.terrace.pool;

import static java.lang.foreign.ValueLayout.JAVA_BYTE;
import static java.lang.foreign.ValueLayout.JAVA_INT_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_LONG_UNALIGNED;
import static java.lang.foreign.ValueLayout.JAVA_SHORT_UNALIGNED;

import java.lang.foreign.MemorySegment;
import java.util.Objects;

/**
 * A window [startOffset, startOffset+rangeLength) of one block, handed to the op of
 * {@code withRange} or to an allocation's initializer.
 *
 * <p>Invariant: its stores are plain, because whoever made the range already paid for the
 * whole window (logged it, or will persist it, or the block is new in the transaction).
 * Offsets are block offsets, as in LLPL, and must fall inside the window
 * ({@link IndexOutOfBoundsException} otherwise). The range is valid only during the call that
 * received it ({@link IllegalStateException} after).
 */
public final class Range {
    private final MemoryAccessor block;
    private final long start;
    private final long length;
    private boolean valid = true;

    Range(MemoryAccessor block, long start, long length) {
        this.block = block;
        this.start = start;
        this.length = length;
    }

    void invalidate() {
        valid = false;
    }

    public boolean isValid() {
        return valid;
    }

    public long startOffset() {
        return start;
    }

    public long rangeLength() {
        return length;
    }

    private MemorySegment window(long offset, long size) {
        if (!valid) {
            throw new IllegalStateException("range used after its withRange call returned");
        }
        Objects.checkFromIndexSize(offset - start, size, length);
        return block.segment();
    }

    public byte getByte(long offset) {
        return window(offset, Byte.BYTES).get(JAVA_BYTE, offset);
    }

    public short getShort(long offset) {
        return window(offset, Short.BYTES).get(JAVA_SHORT_UNALIGNED, offset);
    }

    public int getInt(long offset) {
        return window(offset, Integer.BYTES).get(JAVA_INT_UNALIGNED, offset);
    }

    public long getLong(long offset) {
        return window(offset, Long.BYTES).get(JAVA_LONG_UNALIGNED, offset);
    }

    public void setByte(long offset, byte value) {
        window(offset, Byte.BYTES).set(JAVA_BYTE, offset, value);
    }

    public void setShort(long offset, short value) {
        window(offset, Short.BYTES).set(JAVA_SHORT_UNALIGNED, offset, value);
    }

    public void setInt(long offset, int value) {
        window(offset, Integer.BYTES).set(JAVA_INT_UNALIGNED, offset, value);
    }

    public void setLong(long offset, long value) {
        window(offset, Long.BYTES).set(JAVA_LONG_UNALIGNED, offset, value);
    }

    public void copyFromArray(byte[] src, int srcIndex, long dstOffset, int length) {
        MemorySegment.copy(src, srcIndex, window(dstOffset, length), JAVA_BYTE, dstOffset, length);
    }

    public void copyFrom(MemoryAccessor src, long srcOffset, long dstOffset, long length) {
        MemorySegment.copy(src.segment(), srcOffset, window(dstOffset, length), dstOffset, length);
    }

    public void copyFromMemoryBlock(AnyMemoryBlock src, long srcOffset, long dstOffset,
            long length) {
        copyFrom(src, srcOffset, dstOffset, length);
    }

    public void setMemory(byte value, long offset, long length) {
        window(offset, length).asSlice(offset, length).fill(value);
    }
}

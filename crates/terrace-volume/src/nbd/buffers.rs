//! [`BufferPool`]: the page-aligned buffers one NBD connection reads WRITE payloads into
//! and builds READ replies in, kept between requests.
//!
//! Why: a backend opened with `O_DIRECT` takes a page-aligned buffer as it is, where a
//! `Vec<u8>` costs it a bounce buffer (allocated, zeroed and copied per request); and a
//! kept buffer is zeroed once, when first allocated, not per request. At 64 KiB writes
//! those two were a fifth of the server's CPU.
//!
//! Invariants:
//! - A [`Buffer`]'s data (`data`, `data_mut`) starts on a [`BLOCK`] boundary; the room
//!   before it (`head`, up to one block) holds a reply header, so header and data leave
//!   in one write (`framed`).
//! - The pool keeps at most [`POOL_MAX_BYTES`], only buffers of its size classes (powers
//!   of two from one block) up to [`POOL_MAX_BUFFER`]; larger ones are freed when given
//!   back. A buffer's bytes are whatever its last request left there: callers fill all
//!   of `data` before reading it.

use parking_lot::Mutex;
use terrace_media::error::MediaError;
use terrace_media::flash::{AlignedBuf, BLOCK};

/// Bytes of free buffers one pool keeps.
pub const POOL_MAX_BYTES: usize = 16 << 20;
/// The largest buffer a pool keeps.
pub const POOL_MAX_BUFFER: usize = 4 << 20;

/// A request buffer: `head` bytes of room, then `len` bytes of block-aligned data.
pub struct Buffer {
    buf: AlignedBuf,
    head: usize,
    len: usize,
}

impl Buffer {
    /// Where the data starts in `buf`: one block in when there is a head, else 0.
    fn data_start(&self) -> usize {
        if self.head > 0 {
            BLOCK
        } else {
            0
        }
    }

    pub fn data(&self) -> &[u8] {
        let start = self.data_start();
        &self.buf[start..start + self.len]
    }

    pub fn data_mut(&mut self) -> &mut [u8] {
        let start = self.data_start();
        &mut self.buf[start..start + self.len]
    }

    /// The head and the data after it.
    pub fn framed(&self) -> &[u8] {
        let start = self.data_start();
        &self.buf[start - self.head..start + self.len]
    }

    pub fn framed_mut(&mut self) -> &mut [u8] {
        let start = self.data_start();
        &mut self.buf[start - self.head..start + self.len]
    }
}

/// Free buffers of one connection.
#[derive(Default)]
pub struct BufferPool {
    free: Mutex<Vec<AlignedBuf>>,
}

/// The size class of a buffer holding `bytes`: the next power of two, at least a block.
fn class_of(bytes: usize) -> usize {
    bytes.max(BLOCK).next_power_of_two()
}

impl BufferPool {
    /// A buffer with `head` bytes of room (at most one block) before `len` bytes of
    /// data: a kept one of the right class, or a new one.
    pub fn take(&self, head: usize, len: usize) -> Result<Buffer, MediaError> {
        assert!(head <= BLOCK, "a reply header fits in one block");
        let room = if head > 0 { BLOCK } else { 0 };
        let class = class_of(room + len);
        let kept = {
            let mut free = self.free.lock();
            free.iter()
                .position(|buf| buf.len() == class)
                .map(|at| free.swap_remove(at))
        };
        let buf = match kept {
            Some(buf) => buf,
            None => AlignedBuf::new(class)?,
        };
        Ok(Buffer { buf, head, len })
    }

    /// Keeps `buffer` for a later request, or frees it (too large, or the pool is full:
    /// then the oldest kept buffer makes room, so the pool follows the sizes in use).
    pub fn give(&self, buffer: Buffer) {
        let buf = buffer.buf;
        if buf.len() > POOL_MAX_BUFFER {
            return;
        }
        let mut free = self.free.lock();
        let mut kept: usize = free.iter().map(|b| b.len()).sum();
        while kept + buf.len() > POOL_MAX_BYTES && !free.is_empty() {
            kept -= free.remove(0).len();
        }
        free.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_is_block_aligned_with_or_without_a_head() {
        let pool = BufferPool::default();
        for (head, len) in [(0, 1), (0, 4096), (0, 65536), (16, 512), (28, 65536)] {
            let mut buffer = pool.take(head, len).unwrap();
            assert_eq!(buffer.data().len(), len);
            assert_eq!(buffer.framed().len(), head + len);
            assert!((buffer.data().as_ptr() as usize).is_multiple_of(BLOCK));
            buffer.framed_mut()[..head].fill(0xAB);
            buffer.data_mut().fill(0xCD);
            assert!(buffer.framed()[..head].iter().all(|&b| b == 0xAB));
            assert!(buffer.framed()[head..].iter().all(|&b| b == 0xCD));
            pool.give(buffer);
        }
    }

    #[test]
    fn a_buffer_given_back_is_taken_again() {
        let pool = BufferPool::default();
        let buffer = pool.take(0, 65536).unwrap();
        let address = buffer.data().as_ptr();
        pool.give(buffer);
        // A smaller request of the same class reuses it.
        assert_eq!(pool.take(0, 40000).unwrap().data().as_ptr(), address);
    }

    #[test]
    fn the_pool_keeps_at_most_its_bytes() {
        let pool = BufferPool::default();
        let buffers: Vec<Buffer> = (0..8)
            .map(|_| pool.take(0, POOL_MAX_BUFFER).unwrap())
            .collect();
        for buffer in buffers {
            pool.give(buffer);
        }
        let kept: usize = pool.free.lock().iter().map(|b| b.len()).sum();
        assert_eq!(kept, POOL_MAX_BYTES);
        pool.give(pool.take(0, 2 * POOL_MAX_BUFFER).unwrap());
        assert!(pool.free.lock().iter().all(|b| b.len() <= POOL_MAX_BUFFER));
    }
}

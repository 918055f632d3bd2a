//! Bounds-checked access to mapped pool memory by offset: every dereference of pool
//! memory in the crate is here (the one other `unsafe` block, in `backend`, calls
//! [`Mapped::new`]).
//!
//! A [`Mapped`] is a view of `len` bytes at `base` that someone else keeps mapped (the
//! [`RegionBackend`](crate::backend::RegionBackend) owns the region and this view
//! together). Every access checks `offset + len <= self.len` first, so no caller can reach
//! outside the mapping. Word accesses are 8-byte aligned atomics, which is what makes the
//! pool's metadata words (bitmap words, log headers, published offsets) safe to update
//! from several threads and failure-atomic on the medium (8-byte stores never tear).
//!
//! Byte copies ([`Mapped::read`], [`Mapped::write`]) of object contents are not
//! synchronised here: as in libpmemobj, two threads writing the same object bytes must
//! synchronise themselves. The pool itself only copies bytes it owns exclusively (log
//! areas of a lane it holds, objects it reserved and has not published yet).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{PoolError, Result};

#[cold]
fn misaligned(offset: u64) -> PoolError {
    PoolError::InvalidArgument {
        what: "word offset",
        detail: format!("{offset:#x} is not 8-byte aligned"),
    }
}

/// A bounds-checked view of mapped memory. See the module docs.
#[derive(Debug)]
pub(crate) struct Mapped {
    base: NonNull<u8>,
    len: u64,
}

// SAFETY: `Mapped` is an address range in shared memory; all accesses go through the
// methods below, which are bounds-checked and use atomics for words. Concurrent access to
// object bytes is the caller's contract, as documented above.
unsafe impl Send for Mapped {}
// SAFETY: as above.
unsafe impl Sync for Mapped {}

impl Mapped {
    /// # Safety
    /// `base..base+len` must stay mapped readable and writable for the life of the
    /// returned value, and must not be unmapped or moved by anyone while it lives.
    pub(crate) unsafe fn new(base: NonNull<u8>, len: u64) -> Mapped {
        Mapped { base, len }
    }

    #[inline]
    fn check(&self, offset: u64, len: u64) -> Result<usize> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(offset as usize),
            _ => Err(PoolError::OutOfBounds {
                offset,
                len,
                what: "the pool",
                limit: self.len,
            }),
        }
    }

    /// The `n` pool words from `offset` (8-byte aligned), after one bounds check.
    #[inline]
    fn words(&self, offset: u64, n: usize) -> Result<&[AtomicU64]> {
        if !offset.is_multiple_of(8) {
            return Err(misaligned(offset));
        }
        let at = self.check(offset, 8 * n as u64)?;
        // SAFETY: in the mapping (checked), 8-byte aligned (page-aligned base, offset
        // checked), outliving `self`; pool words are only ever accessed atomically.
        Ok(unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(at).cast(), n) })
    }

    #[inline]
    fn word(&self, offset: u64) -> Result<&AtomicU64> {
        Ok(&self.words(offset, 1)?[0])
    }

    #[inline]
    pub(crate) fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let at = self.check(offset, buf.len() as u64)?;
        // SAFETY: the source range is inside the live mapping (checked) and cannot overlap
        // `buf`, which is ordinary Rust memory.
        unsafe {
            std::ptr::copy_nonoverlapping(self.base.as_ptr().add(at), buf.as_mut_ptr(), buf.len())
        };
        Ok(())
    }

    #[inline]
    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.check(offset, data.len() as u64)?;
        // SAFETY: the destination range is inside the live, writable mapping (checked) and
        // cannot overlap `data`, which is ordinary Rust memory.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.base.as_ptr().add(at), data.len())
        };
        Ok(())
    }

    pub(crate) fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<()> {
        let at = self.check(offset, len)?;
        // SAFETY: the range is inside the live, writable mapping (checked).
        unsafe { std::ptr::write_bytes(self.base.as_ptr().add(at), byte, len as usize) };
        Ok(())
    }

    #[inline]
    pub(crate) fn load_u64(&self, offset: u64) -> Result<u64> {
        Ok(u64::from_le(self.word(offset)?.load(Ordering::Acquire)))
    }

    /// Loads `out.len()` consecutive words from `offset` (8-byte aligned), each an atomic
    /// acquire load as [`Mapped::load_u64`], after one bounds check for them all.
    #[inline]
    pub(crate) fn load_words(&self, offset: u64, out: &mut [u64]) -> Result<()> {
        for (w, o) in self.words(offset, out.len())?.iter().zip(out.iter_mut()) {
            *o = u64::from_le(w.load(Ordering::Acquire));
        }
        Ok(())
    }

    #[inline]
    pub(crate) fn store_u64(&self, offset: u64, value: u64) -> Result<()> {
        self.word(offset)?.store(value.to_le(), Ordering::Release);
        Ok(())
    }

    #[inline]
    pub(crate) fn fetch_or_u64(&self, offset: u64, mask: u64) -> Result<u64> {
        Ok(u64::from_le(
            self.word(offset)?.fetch_or(mask.to_le(), Ordering::AcqRel),
        ))
    }

    #[inline]
    pub(crate) fn fetch_and_u64(&self, offset: u64, mask: u64) -> Result<u64> {
        Ok(u64::from_le(
            self.word(offset)?.fetch_and(mask.to_le(), Ordering::AcqRel),
        ))
    }

    /// The address of `offset` (for a C ABI's `pmemobj_direct`), bounds-checked.
    #[inline]
    pub(crate) fn address(&self, offset: u64) -> Result<NonNull<u8>> {
        let at = self.check(offset, 0)?;
        // SAFETY: `at <= len`, so the result is inside or one past the mapping, and
        // derived from a non-null base.
        Ok(unsafe { NonNull::new_unchecked(self.base.as_ptr().add(at)) })
    }

    /// Starts loading the cache line holding `offset` into the caches; an offset outside
    /// the mapping is ignored (a prefetch never faults, but the address is only formed
    /// for offsets inside).
    #[inline]
    pub(crate) fn prefetch(&self, offset: u64) {
        if offset >= self.len {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: `offset < len`, so the address is inside the mapping; a prefetch
            // reads nothing architecturally and cannot fault.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(self.base.as_ptr().add(offset as usize).cast::<i8>())
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_are_bounds_checked_and_words_little_endian() {
        let mut backing = vec![0u64; 16];
        let base = NonNull::new(backing.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `backing` outlives `mem` and is not touched directly while it lives.
        let mem = unsafe { Mapped::new(base, 128) };
        mem.store_u64(8, 0x0102_0304_0506_0708).unwrap();
        let mut b = [0u8; 2];
        mem.read(8, &mut b).unwrap();
        assert_eq!(b, [0x08, 0x07]);
        assert_eq!(mem.fetch_or_u64(8, 0xF000).unwrap(), 0x0102_0304_0506_0708);
        assert_eq!(mem.fetch_and_u64(8, !0xFF).unwrap(), 0x0102_0304_0506_F708);
        assert_eq!(mem.load_u64(8).unwrap(), 0x0102_0304_0506_F700);
        assert!(mem.write(120, &[0; 9]).is_err());
        assert!(mem.read(u64::MAX, &mut b).is_err());
        assert!(mem.load_u64(4).is_err());
        assert!(mem.load_u64(128).is_err());
        mem.fill(0, 128, 0xFF).unwrap();
        assert!(mem.address(128).is_ok() && mem.address(129).is_err());
        let _ = mem;
        assert!(backing.iter().all(|&w| w == u64::MAX));
    }
}

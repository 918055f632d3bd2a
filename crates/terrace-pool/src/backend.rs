//! The persistence seam: [`Backend`] is everything the pool asks of the bytes it lives
//! in, by offset. [`RegionBackend`] is the real one (a file region from terrace-media);
//! [`RecordingBackend`](crate::recording::RecordingBackend) keeps the durable image apart
//! from the volatile one so that tests can crash at every persist point.
//!
//! Contract (what the pool relies on, what every implementation guarantees):
//! - offsets are bytes from the start of the pool; every access is bounds-checked and an
//!   out-of-range access is `Err(OutOfBounds)`, never a panic or a wild access;
//! - word operations take 8-byte aligned offsets, are atomic with respect to each other
//!   across threads, and are failure-atomic: a crash leaves a word old or new, never torn;
//! - a store is durable only after a [`Backend::persist`] covering it has returned; before
//!   that, any subset of the dirty cache lines may or may not have reached the medium (a
//!   cache line, 64 bytes, is the unit the medium writes back);
//! - `persist` orders: everything persisted by one call is durable before any store made
//!   after the call returns can become durable (flush + fence on DAX, `msync` elsewhere).

use std::ptr::NonNull;

use terrace_media::{Durability, Region};

use crate::error::Result;
use crate::mem::Mapped;

/// Bytes by offset plus durability. See the module docs for the contract.
pub trait Backend: Send + Sync {
    /// Length of the pool in bytes.
    fn len(&self) -> u64;
    /// Never true for a usable backend; present for symmetry with `len`.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `buf.len()` bytes at `offset` into `buf`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Stores `data` at `offset` (not durable until persisted).
    fn write(&self, offset: u64, data: &[u8]) -> Result<()>;
    /// Stores `len` copies of `byte` at `offset`.
    fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<()>;
    /// Atomic little-endian word load.
    fn load_u64(&self, offset: u64) -> Result<u64>;
    /// Atomic little-endian word loads of `out.len()` consecutive words from `offset`,
    /// each as [`Backend::load_u64`] would (one bounds check for all of them where the
    /// backend can).
    fn load_words(&self, offset: u64, out: &mut [u64]) -> Result<()> {
        for (i, w) in out.iter_mut().enumerate() {
            *w = self.load_u64(offset + 8 * i as u64)?;
        }
        Ok(())
    }
    /// Atomic little-endian word store.
    fn store_u64(&self, offset: u64, value: u64) -> Result<()>;
    /// Atomic `|=`; returns the old value.
    fn fetch_or_u64(&self, offset: u64, mask: u64) -> Result<u64>;
    /// Atomic `&=`; returns the old value.
    fn fetch_and_u64(&self, offset: u64, mask: u64) -> Result<u64>;
    /// Makes `[offset, offset+len)` durable (see the contract).
    fn persist(&self, offset: u64, len: u64) -> Result<()>;
    /// What a persisted store survives.
    fn durability(&self) -> Durability;
    /// The address of `offset` when the backend is directly addressable (mapped memory),
    /// for `pmemobj_direct`-style access; `None` for simulated backends.
    fn address(&self, offset: u64) -> Option<NonNull<u8>> {
        let _ = offset;
        None
    }
    /// A hint that the cache line holding `offset` is about to be read: mapped backends
    /// start loading it (so several independent misses overlap); others ignore it. Never
    /// fails, whatever the offset.
    fn prefetch(&self, offset: u64) {
        let _ = offset;
    }
}

/// A pool file mapped through terrace-media.
///
/// Persistence is [`Region::persist`], which follows the region's [`Durability`]:
/// cache-line flush + `sfence` on DAX, `msync` on disk-backed files, and only a fence on
/// tmpfs, whose pages *are* the medium (a stored byte already survives a process crash; it
/// never survives a power loss, and [`Backend::durability`] says so).
#[derive(Debug)]
pub struct RegionBackend {
    // Declared before `region` so the view is dropped before the mapping it points into.
    mem: Mapped,
    region: Region,
    len: u64,
    /// The region is only process-durable (tmpfs): a persist point is a compiler fence
    /// (see `Region::persist`), decided once here rather than on every call.
    fence_only: bool,
}

impl RegionBackend {
    /// Wraps a region; the pool uses its first `len` bytes (`len <= region.len()`).
    pub fn new(region: Region, len: u64) -> Result<RegionBackend> {
        if len > region.len() as u64 {
            return Err(crate::error::PoolError::InvalidArgument {
                what: "backend length",
                detail: format!("{len} exceeds the region's {} bytes", region.len()),
            });
        }
        // SAFETY: the region stays mapped for as long as `RegionBackend` lives (it owns
        // the region, which is dropped after `mem`), and `len <= region.len()`.
        let mem = unsafe { Mapped::new(region.base(), len) };
        let fence_only = region.durability() == Durability::Process;
        Ok(RegionBackend {
            mem,
            region,
            len,
            fence_only,
        })
    }

    pub fn region(&self) -> &Region {
        &self.region
    }
}

impl Backend for RegionBackend {
    #[inline]
    fn len(&self) -> u64 {
        self.len
    }
    #[inline]
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.mem.read(offset, buf)
    }
    #[inline]
    fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.mem.write(offset, data)
    }
    fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<()> {
        self.mem.fill(offset, len, byte)
    }
    #[inline]
    fn load_u64(&self, offset: u64) -> Result<u64> {
        self.mem.load_u64(offset)
    }
    #[inline]
    fn load_words(&self, offset: u64, out: &mut [u64]) -> Result<()> {
        self.mem.load_words(offset, out)
    }
    #[inline]
    fn store_u64(&self, offset: u64, value: u64) -> Result<()> {
        self.mem.store_u64(offset, value)
    }
    #[inline]
    fn fetch_or_u64(&self, offset: u64, mask: u64) -> Result<u64> {
        self.mem.fetch_or_u64(offset, mask)
    }
    #[inline]
    fn fetch_and_u64(&self, offset: u64, mask: u64) -> Result<u64> {
        self.mem.fetch_and_u64(offset, mask)
    }
    #[inline]
    fn persist(&self, offset: u64, len: u64) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(crate::error::PoolError::OutOfBounds {
                offset,
                len,
                what: "the pool",
                limit: self.len,
            });
        }
        if self.fence_only {
            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
            return Ok(());
        }
        Ok(self.region.persist(offset as usize, len as usize)?)
    }
    fn durability(&self) -> Durability {
        self.region.durability()
    }
    #[inline]
    fn address(&self, offset: u64) -> Option<NonNull<u8>> {
        self.mem.address(offset).ok()
    }
    #[inline]
    fn prefetch(&self, offset: u64) {
        self.mem.prefetch(offset)
    }
}

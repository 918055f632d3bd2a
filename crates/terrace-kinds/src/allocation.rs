//! `Allocation`: an owned block from a kind, freed when dropped — the safe way to hold
//! kind memory in Rust (the raw `malloc`/`free` pair is for code managing lifetimes
//! itself, like the C ABI).
//!
//! Invariant: `ptr` is a live allocation of at least `len` bytes owned by this value.

use std::ptr::NonNull;

use crate::error::Result;
use crate::kind::{free, Kind};

/// An owned block of kind memory; see the module docs.
#[derive(Debug)]
pub struct Allocation {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: an Allocation exclusively owns its block, and any thread may free kind memory.
unsafe impl Send for Allocation {}
// SAFETY: shared references only expose the address and length.
unsafe impl Sync for Allocation {}

impl Allocation {
    /// `len` bytes from `kind` (contents unspecified).
    pub fn new(kind: Kind, len: usize) -> Result<Allocation> {
        Ok(Allocation {
            ptr: kind.malloc(len)?,
            len,
        })
    }

    /// `len` zeroed bytes from `kind`.
    pub fn zeroed(kind: Kind, len: usize) -> Result<Allocation> {
        Ok(Allocation {
            ptr: kind.calloc(1, len)?,
            len,
        })
    }

    /// Start of the block.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Requested length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: zero-byte allocations are refused.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Fills the block with `byte`.
    pub fn fill(&mut self, byte: u8) {
        // SAFETY: the block is live and `len` bytes long (module invariant), and &mut self
        // gives exclusive access.
        unsafe { self.ptr.as_ptr().write_bytes(byte, self.len) }
    }

    /// The block's bytes, once written (e.g. after `fill` or `zeroed`).
    ///
    /// # Safety
    /// Every byte must have been initialised.
    pub unsafe fn bytes(&self) -> &[u8] {
        // SAFETY: live block of `len` bytes; initialisation is the caller's promise.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Gives up ownership: the caller must free the pointer with [`crate::free`].
    pub fn into_raw(self) -> NonNull<u8> {
        let ptr = self.ptr;
        std::mem::forget(self);
        ptr
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // SAFETY: the block is live and owned by this value (module invariant).
        unsafe { free(self.ptr.as_ptr()) };
    }
}

//! The process-wide region registry: "which region owns this address?" in O(1) for any
//! number of regions — two dependent loads, no lock, no search.
//!
//! The user address space (47 bits on x86-64) is cut into granules of [`GRANULE`] bytes. A
//! two-level radix table maps each granule to a non-zero `u32` tag chosen by the owner (the
//! kinds layer uses its kind slot). Leaves (8192 granules = 16 GiB of address space each)
//! are allocated on first registration and never freed, so a lookup racing with a
//! registration never sees freed memory.
//!
//! Invariants:
//! - only whole granules are registered: regions are created aligned to `GRANULE` and
//!   sized in multiples of it ([`crate::Region`] guarantees this);
//! - a granule has at most one owner: [`register`] fails with `Overlap` otherwise;
//! - a lookup of an address outside every registered range returns `None`.

use std::num::NonZeroU32;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};
use std::sync::Mutex;

use crate::error::{MediaError, Result};

/// log2 of the registry granule.
pub const GRANULE_SHIFT: u32 = 21;
/// Registry granule: every region starts and ends on a multiple of it (2 MiB).
pub const GRANULE: usize = 1 << GRANULE_SHIFT;

const ADDRESS_BITS: u32 = 47;
const LEAF_BITS: u32 = 13;
const ROOT_BITS: u32 = ADDRESS_BITS - GRANULE_SHIFT - LEAF_BITS;
const LEAF_LEN: usize = 1 << LEAF_BITS;
const ROOT_LEN: usize = 1 << ROOT_BITS;

struct Leaf {
    tags: [AtomicU32; LEAF_LEN],
}

static ROOT: [AtomicPtr<Leaf>; ROOT_LEN] = [const { AtomicPtr::new(ptr::null_mut()) }; ROOT_LEN];
/// Serialises registrations so that the overlap check and the writes are one step.
static WRITERS: Mutex<()> = Mutex::new(());

fn split(granule: usize) -> (usize, usize) {
    (granule >> LEAF_BITS, granule & (LEAF_LEN - 1))
}

/// The tag of the region owning `addr`, if any.
#[inline]
pub fn lookup(addr: usize) -> Option<NonZeroU32> {
    let granule = addr >> GRANULE_SHIFT;
    let (root, slot) = split(granule);
    let leaf = ROOT.get(root)?.load(Ordering::Acquire);
    if leaf.is_null() {
        return None;
    }
    // SAFETY: leaves are never freed once published, and `slot < LEAF_LEN`.
    let tag = unsafe { (*leaf).tags[slot].load(Ordering::Acquire) };
    NonZeroU32::new(tag)
}

fn leaf_for(root: usize) -> &'static Leaf {
    let current = ROOT[root].load(Ordering::Acquire);
    if !current.is_null() {
        // SAFETY: published leaves live for the rest of the process.
        return unsafe { &*current };
    }
    let fresh = Box::into_raw(Box::new(Leaf {
        tags: [const { AtomicU32::new(0) }; LEAF_LEN],
    }));
    // Registrations are serialised by WRITERS, so no other writer can race here.
    ROOT[root].store(fresh, Ordering::Release);
    // SAFETY: just published; never freed.
    unsafe { &*fresh }
}

fn granules(base: usize, len: usize) -> Result<std::ops::Range<usize>> {
    if !base.is_multiple_of(GRANULE) || !len.is_multiple_of(GRANULE) || len == 0 {
        return Err(MediaError::InvalidSize {
            size: len,
            why: "registered ranges are whole, aligned registry granules",
        });
    }
    let end = base
        .checked_add(len)
        .ok_or(MediaError::Overlap { base, len })?;
    if end > 1usize << ADDRESS_BITS {
        return Err(MediaError::InvalidSize {
            size: len,
            why: "range lies above the 47-bit user address space",
        });
    }
    Ok(base >> GRANULE_SHIFT..end >> GRANULE_SHIFT)
}

/// Records `tag` as the owner of `[base, base+len)`.
pub fn register(base: usize, len: usize, tag: NonZeroU32) -> Result<()> {
    let range = granules(base, len)?;
    let _writers = WRITERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if range.clone().any(|g| {
        let (root, slot) = split(g);
        let leaf = ROOT[root].load(Ordering::Acquire);
        // SAFETY: published leaves are never freed.
        !leaf.is_null() && unsafe { (*leaf).tags[slot].load(Ordering::Relaxed) } != 0
    }) {
        return Err(MediaError::Overlap { base, len });
    }
    for g in range {
        let (root, slot) = split(g);
        leaf_for(root).tags[slot].store(tag.get(), Ordering::Release);
    }
    Ok(())
}

/// Forgets the owner of `[base, base+len)` (only granules owned by `tag` are cleared).
pub fn unregister(base: usize, len: usize, tag: NonZeroU32) {
    let Ok(range) = granules(base, len) else {
        return;
    };
    let _writers = WRITERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    for g in range {
        let (root, slot) = split(g);
        let leaf = ROOT[root].load(Ordering::Acquire);
        if !leaf.is_null() {
            // SAFETY: published leaves are never freed.
            let _ = unsafe { &(*leaf).tags[slot] }.compare_exchange(
                tag.get(),
                0,
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(n: u32) -> NonZeroU32 {
        NonZeroU32::new(n).unwrap()
    }

    #[test]
    fn lookup_register_unregister() {
        // An address range nothing else in the test process uses: high in the space.
        let base = 0x6000_0000_0000usize;
        assert_eq!(lookup(base), None);
        register(base, 4 * GRANULE, tag(42)).unwrap();
        assert_eq!(lookup(base), Some(tag(42)));
        assert_eq!(lookup(base + 4 * GRANULE - 1), Some(tag(42)));
        assert_eq!(lookup(base + 4 * GRANULE), None);
        assert_eq!(lookup(base - 1), None);
        assert!(matches!(
            register(base + GRANULE, GRANULE, tag(7)),
            Err(MediaError::Overlap { .. })
        ));
        unregister(base, 4 * GRANULE, tag(42));
        assert_eq!(lookup(base + GRANULE), None);
    }

    #[test]
    fn rejects_unaligned_and_out_of_space() {
        assert!(register(0x7000_0000_1000, GRANULE, tag(1)).is_err());
        assert!(register(0x7000_0000_0000, 100, tag(1)).is_err());
        assert!(register((1usize << 47) - GRANULE, 2 * GRANULE, tag(1)).is_err());
        assert_eq!(lookup(usize::MAX), None);
        assert_eq!(lookup(0), None);
    }

    #[test]
    fn spans_leaf_boundaries() {
        let leaf_span = GRANULE * LEAF_LEN;
        let base = 0x5000_0000_0000usize + leaf_span - GRANULE;
        register(base, 2 * GRANULE, tag(9)).unwrap();
        assert_eq!(lookup(base), Some(tag(9)));
        assert_eq!(lookup(base + GRANULE), Some(tag(9)));
        unregister(base, 2 * GRANULE, tag(9));
        assert_eq!(lookup(base + GRANULE), None);
    }
}

//! Kind handles across the C boundary.
//!
//! A handle is a pointer-sized value, never dereferenced: `generation << 32 | (slot + 1)`
//! for a kind, or a *selection* (`generation == 0`, slot = `SELECTION_BASE + n`) naming
//! one of memkind's static kinds (`MEMKIND_REGULAR`, …) that is created on first use.
//! Null is never a valid handle.

use std::ffi::c_void;

use terrace_kinds::{Kind, KindError, Result, Selection};

const SELECTION_BASE: u64 = 0xFFFF_FF00;

/// A kind handle as C sees it (`terrace_kind_t`, `memkind_t`).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle(pub *mut c_void);

// SAFETY: a handle is an integer in pointer clothing; it is never dereferenced.
unsafe impl Sync for Handle {}
// SAFETY: as above.
unsafe impl Send for Handle {}

impl Handle {
    pub const NULL: Handle = Handle(std::ptr::null_mut());

    /// The handle of `kind`.
    pub const fn of(kind: Kind) -> Handle {
        Handle(
            ((kind.generation() as u64) << 32 | (kind.index() as u64 + 1)) as usize as *mut c_void,
        )
    }

    /// The handle of the kind owning an object: a selection's handle when the kind serves a
    /// selection (memkind returns `MEMKIND_REGULAR` for its objects), else the kind's own.
    pub fn owner_of(kind: Kind) -> Handle {
        match terrace_kinds::selection_of(kind) {
            Some(which) => Handle::selection(which),
            None => Handle::of(kind),
        }
    }

    /// The handle naming a static selection.
    pub const fn selection(which: Selection) -> Handle {
        Handle((SELECTION_BASE + which as u64) as usize as *mut c_void)
    }

    /// The kind a handle names, creating a selection's kind on first use.
    pub fn kind(self) -> Result<Kind> {
        let raw = self.0 as usize as u64;
        let (generation, low) = ((raw >> 32) as u32, raw as u32 as u64);
        if raw == 0 || low == 0 {
            return Err(KindError::NoSuchKind);
        }
        if generation == 0 {
            return match low.checked_sub(SELECTION_BASE) {
                Some(0) => Kind::selected(Selection::LowestLatencyLocal),
                Some(1) => Kind::selected(Selection::HighestCapacity),
                Some(2) => Kind::selected(Selection::CpuLessMemory),
                Some(3) => Kind::selected(Selection::Regular),
                _ => Err(KindError::NoSuchKind),
            };
        }
        Ok(Kind::from_parts((low - 1) as u32, generation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_garbage_is_refused() {
        let default = Handle::of(Kind::DEFAULT);
        assert_eq!(default.kind().unwrap(), Kind::DEFAULT);
        assert!(Handle::NULL.kind().is_err());
        assert!(Handle(0x1234_0000_0000usize as *mut c_void).kind().is_err());
        assert!(Handle((SELECTION_BASE + 77) as usize as *mut c_void)
            .kind()
            .is_err());
        assert!(Handle::selection(Selection::Regular)
            .kind()
            .unwrap()
            .is_live());
    }
}

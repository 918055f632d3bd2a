//! The kind table: a static array of slots, one per live kind, indexed by the kind's
//! number. A [`Kind`](crate::Kind) handle is `(slot, generation)`.
//!
//! Invariants:
//! - a slot is live iff its generation is odd; creating a kind in a slot makes the
//!   generation odd, destroying it makes it even, so a stale handle never matches again;
//! - the registry tag of a kind's regions is `slot + 1` (tags are non-zero);
//! - a slot's hooks are its first field and never move (the array is a static), so
//!   jemalloc can hold a pointer to them for the life of the process;
//! - slot state that changes only at creation or destruction (`space`, `unified`, `name`,
//!   `tcaches`) is behind mutexes; the fast path reads only atomics.
//!
//! Lock order: `docs/concurrency.md`, "terrace-kinds".

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicU32, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard};

use tikv_jemalloc_sys as je;

use crate::engine;
use crate::space::Space;
use crate::unified::Unified;

/// How many kinds can exist at once. jemalloc allows 4,095 arenas; a few are its own
/// automatic arenas, and unified kinds use a slot but no arena.
pub const MAX_KINDS: usize = 4096;

/// What a slot currently holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum SlotKind {
    Empty = 0,
    Arena = 1,
    Unified = 2,
}

struct HooksCell(UnsafeCell<je::extent_hooks_t>);
// SAFETY: the hooks are written once (const) and only read afterwards, by jemalloc.
unsafe impl Sync for HooksCell {}

#[repr(C)]
pub(crate) struct Slot {
    /// Must stay the first field: jemalloc's hooks pointer is a pointer to the slot.
    hooks: HooksCell,
    pub(crate) generation: AtomicU32,
    pub(crate) what: AtomicU8,
    /// `MALLOCX_ARENA(arena)` for arena kinds.
    pub(crate) arena_flags: AtomicI32,
    pub(crate) arena: AtomicU32,
    pub(crate) unified: AtomicPtr<Unified>,
    pub(crate) space: Mutex<Option<Space>>,
    /// Explicit jemalloc caches created for this kind by any thread.
    pub(crate) tcaches: Mutex<Vec<u32>>,
    pub(crate) name: Mutex<String>,
}

impl Slot {
    const fn new() -> Slot {
        Slot {
            hooks: HooksCell(UnsafeCell::new(engine::HOOKS)),
            generation: AtomicU32::new(0),
            what: AtomicU8::new(SlotKind::Empty as u8),
            arena_flags: AtomicI32::new(0),
            arena: AtomicU32::new(0),
            unified: AtomicPtr::new(std::ptr::null_mut()),
            space: Mutex::new(None),
            tcaches: Mutex::new(Vec::new()),
            name: Mutex::new(String::new()),
        }
    }

    pub(crate) fn hooks_ptr(&'static self) -> *mut je::extent_hooks_t {
        self.hooks.0.get()
    }

    /// # Safety
    /// `hooks` must come from [`Slot::hooks_ptr`].
    pub(crate) unsafe fn from_hooks(hooks: *mut je::extent_hooks_t) -> &'static Slot {
        // SAFETY: hooks is the first field of a repr(C) static Slot (contract).
        unsafe { &*(hooks as *const Slot) }
    }

    pub(crate) fn lock_space(&self) -> MutexGuard<'_, Option<Space>> {
        self.space.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lock_tcaches(&self) -> MutexGuard<'_, Vec<u32>> {
        self.tcaches.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn what(&self) -> SlotKind {
        match self.what.load(Ordering::Acquire) {
            1 => SlotKind::Arena,
            2 => SlotKind::Unified,
            _ => SlotKind::Empty,
        }
    }

    pub(crate) fn name(&self) -> String {
        self.name.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn flags(&self) -> c_int {
        self.arena_flags.load(Ordering::Relaxed)
    }
}

static SLOTS: [Slot; MAX_KINDS] = [const { Slot::new() }; MAX_KINDS];

/// Which slot indices are free: those never used (from `next_unused`) and those released.
struct SlotIds {
    next_unused: usize,
    free: Vec<u32>,
}

/// Serialises kind creation and destruction (order: `docs/concurrency.md`).
static CREATE: Mutex<SlotIds> = Mutex::new(SlotIds {
    next_unused: 0,
    free: Vec::new(),
});

pub(crate) fn slot(index: u32) -> Option<&'static Slot> {
    SLOTS.get(index as usize)
}

/// Registry tag of a slot.
pub(crate) fn tag_of(index: u32) -> NonZeroU32 {
    NonZeroU32::MIN.saturating_add(index)
}

/// Slot index of a registry tag.
pub(crate) fn index_of(tag: NonZeroU32) -> u32 {
    tag.get() - 1
}

/// Runs `make` with a free slot index under the creation lock; on success the slot is
/// published live and `(index, generation)` returned.
pub(crate) fn create_with<E>(
    fixed: Option<u32>,
    make: impl FnOnce(u32, &'static Slot) -> Result<(), E>,
    no_room: impl FnOnce() -> E,
) -> Result<(u32, u32), E> {
    let mut alloc = CREATE.lock().unwrap_or_else(|p| p.into_inner());
    let index = match fixed {
        Some(index) => index,
        None => match alloc.free.pop() {
            Some(index) => index,
            None => {
                // Slot 0 is the default DRAM kind, created on first use.
                let index = alloc.next_unused.max(1);
                if index >= MAX_KINDS {
                    return Err(no_room());
                }
                alloc.next_unused = index + 1;
                index as u32
            }
        },
    };
    let slot = &SLOTS[index as usize];
    if slot.generation.load(Ordering::Acquire) % 2 == 1 {
        // Only the default slot can be asked for twice (two racing first uses).
        return Ok((index, slot.generation.load(Ordering::Acquire)));
    }
    if let Err(e) = make(index, slot) {
        if fixed.is_none() {
            alloc.free.push(index);
        }
        return Err(e);
    }
    let generation = slot.generation.fetch_add(1, Ordering::AcqRel) + 1;
    Ok((index, generation))
}

/// Marks a slot dead and hands it back; `teardown` runs under the creation lock after the
/// generation moved on, so no new thread cache can be created for the old kind.
pub(crate) fn destroy_with(
    index: u32,
    generation: u32,
    teardown: impl FnOnce(&'static Slot),
) -> bool {
    let mut alloc = CREATE.lock().unwrap_or_else(|p| p.into_inner());
    let slot = &SLOTS[index as usize];
    {
        let _caches = slot.lock_tcaches();
        if slot
            .generation
            .compare_exchange(
                generation,
                generation + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return false;
        }
    }
    teardown(slot);
    slot.what.store(SlotKind::Empty as u8, Ordering::Release);
    alloc.free.push(index);
    true
}

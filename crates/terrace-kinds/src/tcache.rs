//! Per-thread explicit jemalloc caches, one per (thread, kind) — see [`crate::engine`] for
//! why caches cannot be shared between kinds.
//!
//! Each thread keeps a small table indexed by kind slot: `generation << 32 | cache + 1`
//! (0 = none yet). It is reached through a destructor-free thread-local pointer, so the
//! hot path is one thread-local read, a bounds check and a compare. An entry whose generation differs from the slot's belongs to a
//! destroyed kind, whose caches the destroyer already flushed: it is ignored and replaced.
//! At thread exit every entry still current is flushed and destroyed, under the slot's
//! cache lock so it cannot race a kind being destroyed.
//!
//! When jemalloc has no explicit caches left (about 4,000 per process), the thread uses
//! that kind uncached (`MALLOCX_TCACHE_NONE`): slower, still correct.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::atomic::Ordering;

use tikv_jemalloc_sys as je;

use crate::engine;
use crate::slots::{self, Slot};

const NO_CACHE: u32 = u32::MAX;

thread_local! {
    /// This thread's table: a leaked boxed slice `(pointer, length)`, indexed by kind slot.
    /// No destructor, so the hot path is a plain thread-local read (a `thread_local!` with
    /// a destructor checks its state on every access, a visible share of a small malloc).
    static TABLE: Cell<(*mut u64, usize)> = const { Cell::new((std::ptr::null_mut(), 0)) };
    /// Touched when the thread creates its first cache; its destructor releases the
    /// thread's caches and the table at thread exit.
    static GUARD: TableGuard = const { TableGuard };
}

struct TableGuard;

impl Drop for TableGuard {
    fn drop(&mut self) {
        let Ok((ptr, len)) = TABLE.try_with(|t| t.replace((std::ptr::null_mut(), 0))) else {
            return;
        };
        if ptr.is_null() {
            return;
        }
        // SAFETY: the table was leaked from a Box<[u64]> of this length by `store` and is
        // no longer reachable from TABLE.
        let entries = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) };
        for (index, &entry) in entries.iter().enumerate() {
            let (generation, cache) = ((entry >> 32) as u32, (entry as u32).wrapping_sub(1));
            if entry == 0 || cache == NO_CACHE {
                continue;
            }
            let Some(slot) = slots::slot(index as u32) else {
                continue;
            };
            let mut caches = slot.lock_tcaches();
            if slot.generation.load(Ordering::Acquire) == generation {
                if let Some(at) = caches.iter().position(|&c| c == cache) {
                    caches.swap_remove(at);
                    engine::tcache_destroy(cache);
                }
            }
        }
    }
}

/// The `MALLOCX_TCACHE` flag this thread uses for kind slot `index` at `generation`.
#[inline]
pub(crate) fn flags(index: u32, slot: &'static Slot, generation: u32) -> c_int {
    let entry = TABLE
        .try_with(|t| {
            let (ptr, len) = t.get();
            if (index as usize) < len {
                // SAFETY: ptr points to `len` entries owned by this thread (see `store`).
                unsafe { *ptr.add(index as usize) }
            } else {
                0
            }
        })
        .unwrap_or(0);
    if entry != 0 && entry >> 32 == generation as u64 {
        return to_flags((entry as u32).wrapping_sub(1));
    }
    flags_slow(index, slot, generation)
}

#[cold]
fn flags_slow(index: u32, slot: &'static Slot, generation: u32) -> c_int {
    // Registering the guard fails only while the thread is exiting: use the kind uncached.
    if GUARD.try_with(|_| ()).is_err() {
        return je::MALLOCX_TCACHE_NONE;
    }
    let cache = create(slot, generation);
    store(
        index,
        (generation as u64) << 32 | cache.wrapping_add(1) as u64,
    );
    to_flags(cache)
}

/// Writes one entry of this thread's table, growing it as needed.
fn store(index: u32, entry: u64) {
    let _ = TABLE.try_with(|t| {
        let (ptr, len) = t.get();
        let index = index as usize;
        if index < len {
            // SAFETY: as in `flags`.
            unsafe { *ptr.add(index) = entry };
            return;
        }
        let mut grown = vec![0u64; (index + 1).next_power_of_two().max(16)].into_boxed_slice();
        if !ptr.is_null() {
            // SAFETY: the old table is a leaked Box<[u64]> of `len` entries (this function
            // made it); it is reclaimed here and replaced.
            let old = unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr, len)) };
            grown[..len].copy_from_slice(&old);
        }
        grown[index] = entry;
        let new_len = grown.len();
        t.set((Box::into_raw(grown).cast::<u64>(), new_len));
    });
}

#[inline]
fn to_flags(cache: u32) -> c_int {
    if cache == NO_CACHE {
        je::MALLOCX_TCACHE_NONE
    } else {
        je::MALLOCX_TCACHE(cache as usize)
    }
}

#[cold]
fn create(slot: &'static Slot, generation: u32) -> u32 {
    let mut caches = slot.lock_tcaches();
    if slot.generation.load(Ordering::Acquire) != generation {
        return NO_CACHE;
    }
    match engine::tcache_create() {
        Some(cache) => {
            caches.push(cache);
            cache
        }
        None => NO_CACHE,
    }
}

/// Returns every object cached by the calling thread, in every kind, to its kind (so the
/// kinds' statistics count them as free).
pub(crate) fn flush_thread() {
    let _ = TABLE.try_with(|t| {
        let (ptr, len) = t.get();
        for index in 0..len {
            // SAFETY: as in `flags`.
            let entry = unsafe { *ptr.add(index) };
            let cache = (entry as u32).wrapping_sub(1);
            let Some(slot) = slots::slot(index as u32) else {
                continue;
            };
            if entry != 0
                && cache != NO_CACHE
                && slot.generation.load(Ordering::Acquire) == (entry >> 32) as u32
            {
                engine::tcache_flush(cache);
            }
        }
    });
}

/// Flushes and destroys every cache of a kind being destroyed (called by the destroyer
/// after the slot's generation moved on).
pub(crate) fn destroy_all(slot: &Slot) {
    let mut caches = slot.lock_tcaches();
    for cache in caches.drain(..) {
        engine::tcache_destroy(cache);
    }
}

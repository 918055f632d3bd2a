//! Per-thread explicit jemalloc caches, one per (thread, kind) — see [`crate::engine`] for
//! why caches cannot be shared between kinds.
//!
//! Each thread keeps a small table indexed by kind slot: `generation << 32 | cache + 1`
//! (0 = none yet). An entry whose generation differs from the slot's belongs to a
//! destroyed kind, whose caches the destroyer already flushed: it is ignored and replaced.
//! At thread exit every entry still current is flushed and destroyed, under the slot's
//! cache lock so it cannot race a kind being destroyed.
//!
//! When jemalloc has no explicit caches left (about 4,000 per process), the thread uses
//! that kind uncached (`MALLOCX_TCACHE_NONE`): slower, still correct.

use std::cell::UnsafeCell;
use std::ffi::c_int;
use std::sync::atomic::Ordering;

use tikv_jemalloc_sys as je;

use crate::engine;
use crate::slots::{self, Slot};

const NO_CACHE: u32 = u32::MAX;

struct ThreadCaches {
    entries: UnsafeCell<Vec<u64>>,
}

impl Drop for ThreadCaches {
    fn drop(&mut self) {
        let entries = std::mem::take(self.entries.get_mut());
        for (index, entry) in entries.into_iter().enumerate() {
            if entry == 0 {
                continue;
            }
            let (generation, cache) = ((entry >> 32) as u32, (entry as u32).wrapping_sub(1));
            if cache == NO_CACHE {
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

thread_local! {
    static CACHES: ThreadCaches = const { ThreadCaches { entries: UnsafeCell::new(Vec::new()) } };
}

/// The `MALLOCX_TCACHE` flag this thread uses for kind slot `index` at `generation`.
#[inline]
pub(crate) fn flags(index: u32, slot: &'static Slot, generation: u32) -> c_int {
    CACHES
        .try_with(|caches| {
            // SAFETY: the table is only touched by this thread, and nothing called while the
            // reference lives re-enters this module (jemalloc's mallctl and the system
            // allocator do not call back into kinds code).
            let entries = unsafe { &mut *caches.entries.get() };
            if let Some(&entry) = entries.get(index as usize) {
                if entry >> 32 == generation as u64 && entry != 0 {
                    return to_flags((entry as u32).wrapping_sub(1));
                }
            }
            let cache = create(slot, generation);
            if entries.len() <= index as usize {
                entries.resize(index as usize + 1, 0);
            }
            entries[index as usize] = (generation as u64) << 32 | cache.wrapping_add(1) as u64;
            to_flags(cache)
        })
        // During thread teardown the table is gone: use the kind uncached.
        .unwrap_or(je::MALLOCX_TCACHE_NONE)
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

/// Flushes and destroys every cache of a kind being destroyed (called by the destroyer
/// after the slot's generation moved on).
pub(crate) fn destroy_all(slot: &Slot) {
    let mut caches = slot.lock_tcaches();
    for cache in caches.drain(..) {
        engine::tcache_destroy(cache);
    }
}

//! Eviction and the movers: allocating a free segment in a tier (from the free list, the
//! reclaim list, or by evicting the oldest sealed segment), the eviction walk with its
//! demotions to the next tier, and [`Cache::maintain`] / [`Cache::start_movers`], which
//! do the same work ahead of need, off the request path.
//!
//! Invariants: a segment is taken out of its tier's FIFO by exactly one evictor, which
//! sets it `Evicting` before walking it (E3) and puts it on the reclaim list only after
//! every entry into it is gone (E1); it becomes `Free` only when no pin holds it. An
//! eviction counts as inline unless the thread is running [`Cache::maintain`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::Cache;
use crate::error::CacheError;
use crate::index::Location;
use crate::item::{ItemRef, ItemSpec, ItemState};
use crate::mem::{Appender, Pin, SegState};
use crate::segment::HEADER_LEN;

thread_local! {
    /// Set while this thread runs [`Cache::maintain`]: its evictions are background ones.
    static IN_MOVER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The handle of a mover thread ([`Cache::start_movers`]); stops and joins it on drop.
#[derive(Debug)]
pub struct Movers {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Movers {
    /// Whether the thread could be started.
    pub fn is_running(&self) -> bool {
        self.handle.is_some()
    }
}

impl Drop for Movers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

impl Cache {
    /// A free slot of `tier`: from the free list, from segments whose eviction finished
    /// and whose pins drained, or by evicting the oldest sealed segment inline.
    pub(super) fn allocate(&self, tier: usize) -> Result<u32, CacheError> {
        let t = &self.tiers[tier];
        for attempt in 0..10_000u32 {
            let victim = {
                let mut lists = t.lists.lock();
                if let Some(slot) = lists.free.pop() {
                    return Ok(slot);
                }
                if let Some(i) = lists.reclaim.iter().position(|&s| t.area.try_free(s)) {
                    return Ok(lists.reclaim.swap_remove(i));
                }
                lists.fifo.pop_front()
            };
            match victim {
                Some(slot) => {
                    self.evict(tier, slot)?;
                    let counter = if IN_MOVER.with(|m| m.get()) {
                        &t.counters.background_evictions
                    } else {
                        &t.counters.inline_evictions
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    t.lists.lock().reclaim.push(slot);
                }
                None if attempt > 100 => std::thread::sleep(std::time::Duration::from_micros(50)),
                None => std::thread::yield_now(),
            }
        }
        Err(CacheError::NoSpace { tier })
    }

    /// Evicts one sealed segment: on a durable tier retire it first (E2), then walk its
    /// items; those with hits move to the next tier (copy, then repoint under the bucket
    /// lock if the entry still points here), the rest lose their entries.
    ///
    /// On an error (a failed persist) the segment stays `Evicting` and out of every list:
    /// lost to the cache until restart, but never freed while entries may point into it.
    pub(super) fn evict(&self, tier: usize, slot: u32) -> Result<(), CacheError> {
        let t = &self.tiers[tier];
        if !t.area.begin_evict(slot) {
            return Ok(());
        }
        let Some(pin) = t.area.pin(slot) else {
            return Ok(());
        };
        let id = t.base + slot;
        let mut end = pin.committed_end();
        if t.durable {
            end = pin.retire()?.unwrap_or(end);
        }
        let now = self.now();
        let expired = self.expired(id, now);
        let src_expires = self.meta[id as usize].expires_at.load(Ordering::Acquire);
        let src_bucket = self.meta[id as usize].ttl_bucket.load(Ordering::Acquire) as u16;
        let next = tier + 1;
        let mut walked = HEADER_LEN as u32;
        for item in pin.items(end) {
            walked = item.end();
            if item.state == ItemState::Dead {
                continue;
            }
            let hash = self.index.hash_key(item.key);
            let loc = Location {
                segment: id,
                offset: item.offset,
            };
            let hot = self
                .index
                .lookup(hash)
                .find(|h| h.location() == loc)
                .is_some_and(|h| h.frequency() > 0);
            let copy = if hot && !expired && next < self.tiers.len() {
                let cas = self.cas_of(id, &item);
                self.demote_copy(next, &item, cas, now, src_expires, src_bucket)?
            } else {
                None
            };
            let mut g = self.index.lock(hash);
            let present = g.candidates().any(|l| l == loc);
            let live = pin.item_state(item.offset) == Some(ItemState::Live);
            match copy {
                Some((dpin, dloc))
                    if present
                        && live
                        && matches!(dpin.state(), SegState::Open | SegState::Sealed) =>
                {
                    dpin.set_state(dloc.offset, ItemState::Live)?;
                    g.replace(loc, dloc);
                    pin.set_state(item.offset, ItemState::Dead)?;
                    self.counters.demotions.fetch_add(1, Ordering::Relaxed);
                    self.tiers[next]
                        .counters
                        .demotions_in
                        .fetch_add(1, Ordering::Relaxed);
                }
                copy => {
                    if let Some((dpin, dloc)) = copy {
                        dpin.set_state(dloc.offset, ItemState::Dead)?;
                    }
                    if present && g.remove(loc) {
                        t.counters.items_evicted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }
        if walked < end {
            // An item did not decode (the file was damaged under the running cache): the
            // walk could not see every entry into this segment, so sweep the whole index
            // for them before the segment may be freed (E1).
            self.index.sweep(0..self.index.bucket_count(), |l, _| {
                if l.segment == id {
                    crate::index::Sweep::Remove
                } else {
                    crate::index::Sweep::Keep
                }
            });
        }
        if !t.durable {
            pin.retire()?;
        }
        t.counters.segments_evicted.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Copies `item` (keeping its CAS) into tier `tier`'s demotion segment for the source
    /// segment's TTL bucket; returns the copy pinned, PENDING. A demotion segment never
    /// expires later than any item in it: it takes the expiry of the first source segment
    /// it serves and accepts items only from sources that expire no earlier (sources are
    /// evicted roughly in opening order, so this rarely opens a new one).
    pub(super) fn demote_copy(
        &self,
        tier: usize,
        item: &ItemRef<'_>,
        cas: u64,
        now: u32,
        src_expires: u32,
        src_bucket: u16,
    ) -> Result<Option<(Pin<'_>, Location)>, CacheError> {
        let spec = ItemSpec {
            origin_cas: Some(cas),
            ..item.spec()
        };
        let t = &self.tiers[tier];
        let mut movers = t.mover.lock();
        let fits = |a: &Appender| {
            let dest = a.header().expires_at;
            a.remaining() >= spec.encoded_len()
                && (dest == 0) == (src_expires == 0)
                && dest <= src_expires
        };
        if !movers.get(&src_bucket).is_some_and(fits) {
            if let Some(old) = movers.remove(&src_bucket) {
                self.seal(tier, old);
            }
            let app = self.open_segment(tier, src_expires, src_bucket, now)?;
            movers.insert(src_bucket, app);
        }
        let Some(app) = movers.get_mut(&src_bucket) else {
            return Ok(None);
        };
        let offset = match app.append(&t.area, &spec, item.key, &[item.value]) {
            Ok(o) => o,
            Err(crate::mem::AppendError::Encode(_)) => return Ok(None),
            Err(crate::mem::AppendError::Media(e)) => return Err(e.into()),
        };
        let slot = app.seg();
        Ok(t.area.pin(slot).map(|p| {
            (
                p,
                Location {
                    segment: t.base + slot,
                    offset,
                },
            )
        }))
    }

    /// Free segments [`maintain`](Self::maintain) keeps ready in a tier: 1/16 of it, at
    /// least 2.
    pub(super) fn free_target(&self, tier: usize) -> usize {
        (self.tiers[tier].area.count() as usize / 16).max(2)
    }

    /// One round of the movers' work: in every tier, frees segments whose eviction has
    /// drained and evicts the oldest sealed segments (demoting as an inline eviction
    /// would) until the tier has its target of free segments, so that writes find free
    /// segments instead of evicting on their own critical path. Returns the segments
    /// evicted. Safe to call from any thread, concurrently with everything else;
    /// [`start_movers`](Self::start_movers) calls it in a loop.
    pub fn maintain(&self) -> Result<usize, CacheError> {
        struct Flag;
        impl Drop for Flag {
            fn drop(&mut self) {
                IN_MOVER.with(|m| m.set(false));
            }
        }
        IN_MOVER.with(|m| m.set(true));
        let _flag = Flag;
        let mut evicted = 0;
        for (i, t) in self.tiers.iter().enumerate() {
            let target = self.free_target(i);
            loop {
                let victim = {
                    let mut lists = t.lists.lock();
                    let mut j = 0;
                    while j < lists.reclaim.len() {
                        if t.area.try_free(lists.reclaim[j]) {
                            let slot = lists.reclaim.swap_remove(j);
                            lists.free.push(slot);
                        } else {
                            j += 1;
                        }
                    }
                    if lists.free.len() + lists.reclaim.len() >= target {
                        break;
                    }
                    lists.fifo.pop_front()
                };
                let Some(slot) = victim else {
                    break;
                };
                self.evict(i, slot)?;
                t.counters
                    .background_evictions
                    .fetch_add(1, Ordering::Relaxed);
                t.lists.lock().reclaim.push(slot);
                evicted += 1;
            }
        }
        Ok(evicted)
    }

    /// Starts a background mover thread calling [`maintain`](Self::maintain) every
    /// `interval` until the returned handle is dropped. Errors are counted in
    /// [`Stats::mover_errors`](super::Stats::mover_errors).
    pub fn start_movers(cache: &Arc<Cache>, interval: Duration) -> Movers {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let cache = Arc::clone(cache);
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("terrace-mover".into())
                .spawn(move || {
                    while !stop.load(Ordering::Acquire) {
                        if cache.maintain().is_err() {
                            cache.counters.mover_errors.fetch_add(1, Ordering::Relaxed);
                        }
                        std::thread::park_timeout(interval);
                    }
                })
        };
        Movers {
            stop,
            handle: handle.ok(),
        }
    }
}

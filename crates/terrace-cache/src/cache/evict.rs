//! Eviction and cleaning: allocating a free segment in a tier (from the free list, the
//! reclaim list, or by evicting a sealed segment), the choice of that segment, the
//! eviction walk with its demotions and reinsertions, and the cleaning of dead-heavy
//! segments. The movers (`cache/movers.rs`) do this work ahead of need, off the request
//! path; writers do it when the movers fall behind.
//!
//! # Policy
//! What becomes of each item of a walked segment — dropped, demoted, reinserted, kept in
//! tier 0, sent back to its flash replica — is `cache/policy.rs`'s pure decision, with
//! its rules and its no-livelock argument; this module walks, copies and publishes. In
//! short: every tier but the last is a FIFO whose kept items (those with hits, and small
//! ones out of probation) are demoted to the next tier — except that tier 0 keeps those
//! read at least [`STAY_HITS`](policy::STAY_HITS) times (the hottest items stay in the
//! fastest tier). The last tier keeps what it is given by *reinsertion*: evicting one of
//! its segments copies its kept items into the tier's reinsertion segment, their
//! frequency lowered by one (a CLOCK with a two-bit counter, at segment granularity).
//! Which segment is evicted is this module's: the last tier's sealed segments are in two
//! queues (`tier::Lists`):
//!
//! - `main`: the segments it keeps items in — reinsertions, and demotions from the tier
//!   above; evicted strictly oldest first, however dead a younger segment is: evicting
//!   the deadest first would cut short the lives of the young, hot items of a dead-heavy
//!   segment, dropping those not yet read, and FIFO order is worth more than the space
//!   (`docs/experiments.md`); cleaning, below, frees that space without dropping any
//!   item;
//! - `fifo`: in a single-tier cache, the segments of new writes: a small queue of
//!   [`SMALL_QUEUE_SHARE`] of the tier (S3-FIFO's probation queue; with more tiers, tier 0
//!   plays that part). It is evicted first while it is longer than that: its kept items
//!   are promoted into `main` with their frequency kept, the others dropped.
//!
//! What a probation stage (the small queue, or tier 0 of several) drops is remembered in
//! the cache's ghost filter (`crate::ghost`). A key that comes back soon after is marked
//! ([`crate::index::RECALLED`]): its probation stage keeps it as if it had been read once,
//! and passes it on with no hit (S3-FIFO inserts such a key straight into its main queue
//! with a frequency of 0), so that it must be read to survive the main queue's tail (a
//! hit it never had would buy it a second pass of the main queue unread). An
//! overwrite counts as an access: the new item inherits the old one's frequency plus one
//! (`cache.rs`).
//!
//! # Cleaning
//! Overwrites and deletes leave dead copies behind, and a FIFO log frees them only when
//! their segment reaches the tail. Each round of the movers, and each inline eviction of
//! a writer in that tier, therefore also cleans one segment of the last tier's main
//! queue whose dead bytes are at least
//! [`CLEAN_DEAD_SHARE`] of it ([`Cache::clean_one`]): every live item is copied into the
//! reinsertion segment with its frequency — read or not, and no hit is spent — and the
//! segment is freed. The oldest [`CLEAN_SKIP_OLDEST`] of the queue is left to the tail,
//! which frees its dead bytes soon anyway. A round cleans nothing while the free list is
//! down to [`REINSERT_RESERVE`]: the copies could then need a segment freed by an
//! eviction without reinsertion, which drops the items with hits of the oldest segment.
//! A writer's eviction has just put a segment on the reclaim list, which the copies may
//! take ([`CleanRoom`]); the writer then takes the cleaned one. Cleaning on the writers'
//! path costs a slow write a second walk, but without it dead bytes would pile up for as
//! long as the movers stay behind (measured with a slowed mover: `docs/results.md`).
//! (Should no segment take a copy all the same, that item is dropped, as at an eviction.)
//! A cleaning is neither an eviction nor a reinsertion in the stats (`segments_cleaned`,
//! `items_cleaned`).
//!
//! # Invariants
//! A segment is taken out of its tier's queues by exactly one evictor or cleaner, which
//! sets it `Evicting` before walking it (E3) and puts it on the reclaim list only after
//! every entry into it is gone (E1); it becomes `Free` only when no pin holds it. A copy
//! (demotion, reinsertion or cleaning) is published like a mover's: written PENDING, then
//! under the key's bucket lock, only if the entry still points at the source and the
//! source is still LIVE, made LIVE, the entry swapped by compare-and-swap, the source
//! killed — else the copy is killed. On a durable tier the source segment is retired
//! before the walk, so a crash anywhere leaves at most one LIVE item of the key, and never
//! one that was overwritten or deleted (E2). A writer racing with the walk still reads the
//! source through its entry (`Pin::indexed_item`, past the zeroed commit word), so it
//! replaces or deletes that entry — and the evictor then kills its copy — instead of
//! publishing a second entry beside it (the tests below race a delete and an overwrite
//! with a reinsertion, and with a cleaning, at exactly that point, and restart). An
//! eviction counts as inline unless the thread is running [`Cache::maintain`].
//!
//! Reinsertion cannot livelock: each one out of the main queue, and each stay in tier 0,
//! spends one recorded hit (an item nobody reads survives at most three more evictions of
//! its segments; a cleaning moves it without spending one, but frees the dead bytes it
//! chose the segment for), and an item leaves probation once per write; one eviction
//! copies at most [`REINSERT_BUDGET`](policy::REINSERT_BUDGET) of a segment, so it frees
//! at least the rest whatever the readers do; a cleaning runs at most once per round of
//! the movers or per inline eviction, and only with a segment to copy into
//! ([`CleanRoom`]); and the reinsertion segment is opened only from a free segment or by
//! evicting another one *without* reinsertion (nor stays), never by waiting. Lock order:
//! `docs/concurrency.md`.

use std::sync::atomic::Ordering;

use super::policy::{self, Fate};
use super::{Cache, Placement};
use crate::error::CacheError;
use crate::index::{BucketGuard, Freq, Location};
use crate::item::{ItemRef, ItemSpec, ItemState};
use crate::mem::{Pin, SegState};
use crate::segment::HEADER_LEN;
use crate::tier::Lists;

/// A single tier's small (probation) queue, as a fraction of its segments (S3-FIFO's 10%).
pub(super) const SMALL_QUEUE_SHARE: (usize, usize) = (1, 10);

/// The dead share (numerator, denominator) of its item space at which a main-queue
/// segment is worth cleaning ([`Cache::clean_one`]): the movers copy its live items to the
/// head of the queue and free it. Dead bytes are the copies that overwrites and deletes
/// leave behind, and a FIFO log frees them only when their segment reaches the tail, so
/// with many overwrites they would hold a sizeable share of the tier. A lower threshold
/// copies more for space that then holds rarely read items; a higher one leaves more dead
/// (thresholds compared in `docs/experiments.md`).
pub(super) const CLEAN_DEAD_SHARE: (usize, usize) = (15, 100);

/// The oldest share of the main queue never cleaned: its segments reach the tail soon,
/// where an eviction frees their dead bytes anyway and keeps only what was read.
pub(super) const CLEAN_SKIP_OLDEST: (usize, usize) = (1, 4);

/// How many main-queue segments, after the skipped oldest ones, a cleaning pass compares:
/// dead bytes grow with a segment's age, so the deadest is nearly always among the oldest
/// that may be cleaned, and the pass stays short under the tier's lists lock however
/// large the tier is.
pub(super) const CLEAN_WINDOW: usize = 32;

/// Free segments that writers (and demotions) leave to the last tier's reinsertion
/// segment: when that segment fills and no free one is left, the reinsertion segment is
/// opened by evicting a segment *without* reinsertion (see [`Cache::reinsert_slot`]),
/// which drops that segment's hot items. One segment is enough to make that rare, at the
/// price of a few more (still rare) inline evictions (`docs/experiments.md`).
pub(super) const REINSERT_RESERVE: usize = 1;

/// Free segments kept ready in every tier, at least (see [`Cache::free_target`]), unless
/// that is more than [`MAX_FREE_SHARE`] of the tier.
pub(super) const MIN_FREE: usize = 4;

/// The largest share of a tier kept free: a small tier (a few segments, as a small pool
/// or a small DRAM tier has) keeps fewer free segments rather than evicting everything
/// it holds to reach [`MIN_FREE`]: the smallest tier allowed, 8 segments
/// (`super::MIN_TIER_SEGMENTS`), keeps 2.
pub(super) const MAX_FREE_SHARE: (usize, usize) = (1, 4);

/// [`Cache::free_target`] of a tier of `segments` segments.
pub(super) fn free_target_of(segments: u32) -> usize {
    let segments = segments as usize;
    (segments / 64)
        .max(MIN_FREE)
        .min(segments * MAX_FREE_SHARE.0 / MAX_FREE_SHARE.1)
}

/// The position in a main queue (oldest first) of the segment to clean, if any: among the
/// [`CLEAN_WINDOW`] segments that follow the oldest [`CLEAN_SKIP_OLDEST`] of the queue, the
/// one with the most `dead` bytes, if they are at least `enough`.
fn clean_candidate(
    main: &std::collections::VecDeque<u32>,
    dead: impl Fn(u32) -> u64,
    enough: u64,
) -> Option<usize> {
    let skip = main.len() * CLEAN_SKIP_OLDEST.0 / CLEAN_SKIP_OLDEST.1;
    let (most, at) = main
        .iter()
        .enumerate()
        .skip(skip)
        .take(CLEAN_WINDOW)
        .map(|(at, &slot)| (dead(slot), at))
        .max()?;
    (most >= enough).then_some(at)
}

/// Where a cleaning's copies may find a segment ([`Cache::clean_one`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum CleanRoom {
    /// Free segments beyond [`REINSERT_RESERVE`] (a mover's round).
    Free,
    /// Any free segment, or one just evicted and waiting on the reclaim list (a writer's
    /// inline eviction, which has just put one there): the copies need one segment at
    /// most (the candidate is at least [`CLEAN_DEAD_SHARE`] dead), and the writer then
    /// takes the cleaned one.
    FreeOrEvicted,
}

/// Which queue a sealed segment goes to (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Queue {
    Fifo,
    Main,
}

/// A segment chosen for eviction or cleaning.
#[derive(Clone, Copy, Debug)]
pub(super) struct Victim {
    pub slot: u32,
    pub walk: Walk,
}

/// What walking a segment's items does with them ([`Cache::evict`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Walk {
    /// An eviction out of a main queue, or a tier above the last: items with hits get
    /// another life, the others are dropped.
    Evict,
    /// An eviction out of a probation stage (the single tier's small queue, or tier 0 of
    /// several): small items are kept too, promotions keep frequencies, and what is
    /// dropped is remembered as a ghost.
    Probation,
    /// Cleaning a main-queue segment that is dead enough ([`CLEAN_DEAD_SHARE`]): every
    /// live item is copied, frequency kept; only the dead bytes go (and an item no segment
    /// could take a copy of, as at an eviction).
    Clean,
}

/// Whether an eviction may copy kept items within its own tier (the last tier's
/// reinsertions, tier 0's stays). Barred where the caller already holds that tier's
/// `reinsert` lock (it is opening the reinsertion segment itself) or where nothing
/// could be worth copying (an expired segment).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reinsertion {
    Allowed,
    Barred,
}

/// Where [`Cache::copy_item`] copies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Dest {
    /// The tier's segment for items moved in from another tier (`Tier::mover`):
    /// demotions from the tier above, promotions into tier 0 (`promote.rs`).
    Moved,
    /// The same tier's reinsertion segment (`Tier::reinsert`).
    Reinsert,
}

/// What becomes of the source of a copy [`Cache::publish_copy`] publishes.
#[derive(Clone, Copy)]
pub(super) enum Source<'p, 'c> {
    /// In a memory tier: killed in place.
    Memory(&'p Pin<'c>),
    /// On flash: killed (a kill record).
    Flash,
    /// On flash, stored in the segment of `write_seq`: kept as the key's replica
    /// (`cache/replica.rs`).
    KeptOnFlash { hash: u64, write_seq: u64 },
}

impl Cache {
    /// A free slot of `tier`: from the free list (less, in the last tier, the
    /// [`REINSERT_RESERVE`]), which segments whose eviction finished and whose pins
    /// drained join first, or by evicting sealed segments inline until the free list is
    /// past the reserve (the last tier's inline evictions then clean too). Wakes the
    /// movers when the free list runs below its target.
    pub(super) fn allocate(&self, tier: usize) -> Result<u32, CacheError> {
        let t = &self.tiers[tier];
        let reserve = if tier + 1 == self.levels() {
            REINSERT_RESERVE
        } else {
            0
        };
        for attempt in 0..10_000u32 {
            let victim = {
                let mut lists = self.lock_timed(&t.lists);
                // Drained segments join the free list first, so that the reserve is
                // kept from them too: a writer evicting inline restores it before it
                // takes a segment, instead of leaving the reinsertions nothing but an
                // eviction without reinsertion.
                lists.free_drained(&t.area);
                let past_reserve = lists.free.len() > reserve;
                if let Some(slot) = past_reserve.then(|| lists.free.pop()).flatten() {
                    t.counters
                        .free_low_water
                        .fetch_min(lists.free.len(), Ordering::Relaxed);
                    let low = lists.free.len() < self.free_target(tier);
                    drop(lists);
                    if low {
                        self.wake_movers();
                    }
                    return Ok(slot);
                }
                t.counters.free_low_water.store(0, Ordering::Relaxed);
                match self.pop_victim(tier, &mut lists) {
                    // Nothing to evict: the reserve too, rather than fail the write.
                    None => {
                        if let Some(slot) = lists.free.pop() {
                            return Ok(slot);
                        }
                        None
                    }
                    victim => victim,
                }
            };
            match victim {
                Some(v) => {
                    self.evict_counted(tier, v, Reinsertion::Allowed)?;
                    // The movers are behind: this writer does their cleaning too, or
                    // dead bytes would pile up for as long as they stay behind.
                    if tier + 1 == self.levels() && !super::movers::in_mover() {
                        self.clean_one(tier, CleanRoom::FreeOrEvicted)?;
                    }
                }
                None if attempt > 100 => std::thread::sleep(std::time::Duration::from_micros(50)),
                None => std::thread::yield_now(),
            }
        }
        Err(CacheError::NoSpace { tier })
    }

    /// Evicts `victim` (taken out of its queue by the caller), counts it as inline or
    /// background, and puts it on the reclaim list.
    pub(super) fn evict_counted(
        &self,
        tier: usize,
        victim: Victim,
        reinsert: Reinsertion,
    ) -> Result<(), CacheError> {
        let t = &self.tiers[tier];
        self.evict(tier, victim, reinsert)?;
        let counter = if super::movers::in_mover() {
            &t.counters.background_evictions
        } else {
            &t.counters.inline_evictions
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.lock_timed(&t.lists).reclaim.push(victim.slot);
        Ok(())
    }

    /// The queue `tier`'s copies (demotions or promotions into it, reinsertions, stays
    /// and cleanings within it) are sealed into: the last tier keeps them in its main
    /// queue, a tier above the last in its FIFO.
    fn copies_queue(&self, tier: usize) -> Queue {
        if tier + 1 == self.levels() {
            Queue::Main
        } else {
            Queue::Fifo
        }
    }

    /// Takes the sealed segments of `tier` whose expiry has passed — every item in them
    /// has expired (`super::segment_outlives`) — out of its queues, wherever they are, and
    /// reclaims them: Segcache's proactive expiration, so that space held by expired
    /// items returns to the free list without waiting for the FIFO to reach it. At most
    /// once a second of the cache's clock per tier (a scan of the tier's queues under
    /// its lists lock). The segments reclaimed count in the tier's `segments_evicted`,
    /// not as inline or background evictions; their items count as expired, not evicted.
    pub(super) fn reclaim_expired(&self, tier: usize) -> Result<(), CacheError> {
        let t = &self.tiers[tier];
        let now = self.now();
        if t.expiry_swept.swap(now, Ordering::Relaxed) == now {
            return Ok(());
        }
        // Open segments whose expiry has passed take no more items (`super::place`):
        // seal them, so that the scan below finds them too — new writes into the FIFO,
        // copies where `copy_item` seals them.
        let copies = self.copies_queue(tier);
        let writers = if tier == 0 { &self.stripes[..] } else { &[] };
        let lanes = t.mover.iter().chain(t.reinsert.iter());
        let open_sets = writers
            .iter()
            .map(|stripe| (stripe, Queue::Fifo))
            .chain(lanes.map(|lane| (lane, copies)));
        for (set, queue) in open_sets {
            // Never wait here: a writer evicting inline holds its stripe for that long,
            // when the movers are needed most. A busy set is swept a second later.
            let Some(mut open) = set.try_lock() else {
                self.skipped_contended();
                continue;
            };
            let done: Vec<u16> = open
                .iter()
                .filter(|(_, app)| super::past(app.header().expires_at, now))
                .map(|(&bucket, _)| bucket)
                .collect();
            for bucket in done {
                if let Some(app) = open.remove(&bucket) {
                    self.seal(tier, app, queue);
                }
            }
        }
        // Each with the queue it came from, to go back to on an error.
        let mut expired: Vec<(Victim, Queue)> = Vec::new();
        {
            let mut lists = self.lock_timed(&t.lists);
            let mut take = |queue: &mut std::collections::VecDeque<u32>, from: Queue| {
                queue.retain(|&slot| {
                    let gone = self.expired(t.base + slot, now);
                    if gone {
                        // Nothing in it is kept or remembered: not a probation stage's
                        // eviction, whichever queue it was in.
                        let victim = Victim {
                            slot,
                            walk: Walk::Evict,
                        };
                        expired.push((victim, from));
                    }
                    !gone
                });
            };
            take(&mut lists.fifo, Queue::Fifo);
            take(&mut lists.main, Queue::Main);
        }
        let mut reclaimed = 0;
        while reclaimed < expired.len() {
            let (victim, _) = expired[reclaimed];
            if let Err(e) = self.evict(tier, victim, Reinsertion::Barred) {
                // The failed one stays out of every list (see `evict`); the others go
                // back to the front of their queues, to be reclaimed or evicted later.
                let mut lists = self.lock_timed(&t.lists);
                for &(v, from) in expired[reclaimed + 1..].iter().rev() {
                    match from {
                        Queue::Fifo => lists.fifo.push_front(v.slot),
                        Queue::Main => lists.main.push_front(v.slot),
                    }
                }
                return Err(e);
            }
            self.lock_timed(&t.lists).reclaim.push(victim.slot);
            reclaimed += 1;
        }
        Ok(())
    }

    /// A free slot of `tier` for its reinsertion segment (the last tier's reinsertions and
    /// cleanings, tier 0's stays), never waiting: from the free list or the drained
    /// reclaim list, else by evicting the next victim *without* reinsertion (nor stays;
    /// so this never needs a reinsertion segment itself and cannot recurse). `None` when
    /// nothing could be freed now: the caller drops the item instead (a stay is demoted).
    fn reinsert_slot(&self, tier: usize) -> Result<Option<u32>, CacheError> {
        let t = &self.tiers[tier];
        for round in 0..3 {
            let victim = {
                let mut lists = self.lock_timed(&t.lists);
                if let Some(slot) = lists.free.pop() {
                    t.counters
                        .free_low_water
                        .fetch_min(lists.free.len(), Ordering::Relaxed);
                    return Ok(Some(slot));
                }
                if let Some(i) = lists.reclaim.iter().position(|&s| t.area.try_free(s)) {
                    return Ok(Some(lists.reclaim.swap_remove(i)));
                }
                if round == 2 {
                    return Ok(None);
                }
                self.pop_victim(tier, &mut lists)
            };
            let Some(victim) = victim else {
                return Ok(None);
            };
            self.evict_counted(tier, victim, Reinsertion::Barred)?;
            t.counters.barred_evictions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(None)
    }

    /// Evicts (or cleans) one sealed segment: on a durable tier retire it first (E2), then
    /// walk its items, each to the fate `cache/policy.rs` gives it: copies (demotions,
    /// stays, reinsertions, cleanings) are published as the module docs say, a return to a
    /// flash replica repoints the entry, and everything else loses its entry (and, from
    /// probation, becomes a ghost). Copies within the tier take at most
    /// [`REINSERT_BUDGET`](policy::REINSERT_BUDGET) of a segment per eviction, none where
    /// `reinsert` bars them; a stay that no segment could take is demoted instead.
    ///
    /// On an error (a failed persist) the segment stays `Evicting` and out of every list:
    /// lost to the cache until restart, but never freed while entries may point into it.
    pub(super) fn evict(
        &self,
        tier: usize,
        victim: Victim,
        reinsert: Reinsertion,
    ) -> Result<(), CacheError> {
        let t = &self.tiers[tier];
        let slot = victim.slot;
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
        let next = tier + 1;
        let last = next == self.levels();
        // The tier below is flash: kept items are demoted into its write buffers.
        let to_flash = next == self.tiers.len() && !last;
        let allowed = reinsert == Reinsertion::Allowed;
        let place = policy::Place {
            last,
            to_flash,
            // A flash tier with room to spare takes every live item, hit or not (see
            // `cache/flash.rs`, "Policy").
            flash_has_room: to_flash && self.flash_has_room(),
            stays: allowed && !last && tier == 0 && victim.walk == Walk::Probation,
        };
        let mut budget = policy::copy_budget((1usize << self.shift) - HEADER_LEN, place, allowed);
        let mut walked = HEADER_LEN as u32;
        let mean_len = t.probation_mean_len.load(Ordering::Relaxed) as usize;
        let (mut live_items, mut live_bytes) = (0u64, 0u64);
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
            let expires_at = self.item_expiry(id, &item);
            let expired = super::past(expires_at, now);
            if !expired {
                live_items += 1;
                live_bytes += u64::from(item.len);
            }
            // (frequency, reads): what the policy counts where the item stands, and the
            // hits it carries when it moves (a recall counts in the first only).
            let hits = if expired {
                None
            } else {
                self.entry_hits(hash, loc)
            };
            let len = item.len as usize;
            let mut fate = policy::fate(
                place,
                policy::ItemFacts {
                    walk: victim.walk,
                    expired,
                    hits,
                    len,
                    mean_len,
                    // Looked up only where the policy may use it.
                    has_replica: to_flash
                        && !expired
                        && victim.walk != Walk::Clean
                        && self.has_replica(hash),
                    budget,
                },
            );
            budget -= fate.budget_used(len);
            let cas = || self.cas_of(id, &item);
            let mut flash_copy = None;
            let demote = |flash_copy: &mut Option<_>| -> Result<_, CacheError> {
                if !to_flash {
                    return self.copy_item(next, Dest::Moved, &item, cas(), now, expires_at);
                }
                *flash_copy = self.copy_to_flash(&item, cas(), now, expires_at, false)?;
                Ok(None)
            };
            let within = |dest| self.copy_item(tier, dest, &item, cas(), now, expires_at);
            let copy = match fate {
                Fate::Drop | Fate::ToReplica => None,
                Fate::Reinsert | Fate::CleanCopy => within(Dest::Reinsert)?,
                Fate::Stay => match within(Dest::Reinsert)? {
                    Some(copy) => Some(copy),
                    // No segment could take it now: demoted, as it would have been.
                    None => {
                        fate = Fate::Demote;
                        demote(&mut flash_copy)?
                    }
                },
                Fate::Demote => demote(&mut flash_copy)?,
            };
            #[cfg(test)]
            if copy.is_some() || flash_copy.is_some() {
                tests::before_publish(item.key);
            }
            let mut g = self.index.lock(hash);
            let frequency = if fate.spends_hit(victim.walk) {
                Freq::Spend
            } else {
                Freq::Keep
            };
            let moved = match (copy, &flash_copy) {
                (Some(copy), _) => {
                    self.publish_copy(&mut g, Source::Memory(&pin), loc, copy, frequency)?
                }
                (None, Some((buf, dloc))) => {
                    self.publish_flash_copy(&mut g, Some(&pin), loc, (buf, *dloc), frequency)?
                }
                (None, None) if fate == Fate::ToReplica => {
                    self.demote_to_replica(&mut g, hash, &pin, loc, frequency)?
                }
                (None, None) => false,
            };
            if moved && victim.walk == Walk::Clean {
                t.counters.items_cleaned.fetch_add(1, Ordering::Relaxed);
            } else if moved && (last || fate == Fate::Stay) {
                t.counters.reinserted.fetch_add(1, Ordering::Relaxed);
            } else if moved {
                self.counters.demotions.fetch_add(1, Ordering::Relaxed);
                let below = match (self.tiers.get(next), &self.flash) {
                    (Some(t), _) => Some(&t.counters),
                    (None, Some(f)) => Some(&f.stats),
                    (None, None) => None,
                };
                if let Some(below) = below {
                    below.demotions_in.fetch_add(1, Ordering::Relaxed);
                }
            } else if g.remove(loc) {
                if expired {
                    t.counters.items_expired.fetch_add(1, Ordering::Relaxed);
                } else {
                    t.counters.items_evicted.fetch_add(1, Ordering::Relaxed);
                    if victim.walk == Walk::Probation {
                        self.ghost.remember(hash);
                    }
                }
            }
        }
        if victim.walk == Walk::Probation && live_items > 0 {
            t.probation_mean_len
                .store((live_bytes / live_items) as u32, Ordering::Relaxed);
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
        let walked_segments = match victim.walk {
            Walk::Clean => &t.counters.segments_cleaned,
            Walk::Evict | Walk::Probation => &t.counters.segments_evicted,
        };
        walked_segments.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// What the index entry of `hash` at `loc` records, if there is one: (frequency,
    /// reads).
    pub(super) fn entry_hits(&self, hash: u64, loc: Location) -> Option<(u8, u8)> {
        self.index
            .lookup(hash)
            .find(|h| h.location() == loc)
            .map(|h| (h.frequency(), h.reads()))
    }

    /// Cleans one segment of the last tier `tier`'s main queue, if one is dead enough
    /// ([`clean_candidate`]): its live items are copied into the reinsertion segment (a
    /// [`Walk::Clean`]), so its dead bytes are freed a long time before FIFO order would
    /// reach them. Returns whether it cleaned one.
    pub(super) fn clean_one(&self, tier: usize, room: CleanRoom) -> Result<bool, CacheError> {
        let t = &self.tiers[tier];
        let enough = (((1usize << self.shift) - HEADER_LEN) / CLEAN_DEAD_SHARE.1
            * CLEAN_DEAD_SHARE.0) as u64;
        let victim = {
            let mut lists = self.lock_timed(&t.lists);
            let short = match room {
                CleanRoom::Free => lists.free.len() <= REINSERT_RESERVE,
                CleanRoom::FreeOrEvicted => lists.free.is_empty() && lists.reclaim.is_empty(),
            };
            if short {
                // The copies might need a segment that only an eviction without
                // reinsertion could free (`reinsert_slot`): not worth the hot items it
                // would drop. Cleaned at a later round.
                return Ok(false);
            }
            let dead = |slot: u32| {
                u64::from(
                    self.meta[(t.base + slot) as usize]
                        .dead_bytes
                        .load(Ordering::Relaxed),
                )
            };
            clean_candidate(&lists.main, dead, enough)
                .and_then(|at| lists.main.remove(at))
                .map(|slot| Victim {
                    slot,
                    walk: Walk::Clean,
                })
        };
        let Some(victim) = victim else {
            return Ok(false);
        };
        self.evict(tier, victim, Reinsertion::Allowed)?;
        self.lock_timed(&t.lists).reclaim.push(victim.slot);
        Ok(true)
    }

    /// Publishes `copy` of the item at `loc` (in `src`, or on flash if `None`) in its place, under the key's
    /// bucket lock `g` — the one protocol of every move (demotion, reinsertion,
    /// promotion), E4: only if the entry still points at the source, the source is still
    /// LIVE and the copy's segment is not being evicted, the copy is made LIVE, then the
    /// entry repointed (its frequency as `frequency` says), then the source killed
    /// (persisted on a durable tier). A crash anywhere in between leaves at most two LIVE
    /// items of the same value, which restart keeps neither of; on a durable tier whose
    /// source segment was retired first (E2), at most one. Otherwise the copy is killed.
    /// Returns whether it was published. (Tests hook a racing writer in just before the
    /// caller takes `g`: see `tests::before_publish`.)
    pub(super) fn publish_copy(
        &self,
        g: &mut BucketGuard<'_>,
        src: Source<'_, '_>,
        loc: Location,
        (dpin, dloc): (Pin<'_>, Location),
        frequency: Freq,
    ) -> Result<bool, CacheError> {
        let present = g.candidates().any(|l| l == loc);
        // A flash source is LIVE exactly while its entry is there; one kept as a replica
        // must also still be stored in the segment it was read from.
        let live = match src {
            Source::Memory(p) => p.item_state(loc.offset) == Some(ItemState::Live),
            Source::Flash => true,
            Source::KeptOnFlash { write_seq, .. } => self.replica_seq(loc) == Some(write_seq),
        };
        if !(present && live && matches!(dpin.state(), SegState::Open | SegState::Sealed)) {
            self.kill(&dpin, dloc)?;
            return Ok(false);
        }
        dpin.set_state(dloc.offset, ItemState::Live)?;
        g.repoint(loc, dloc, frequency);
        match src {
            Source::Memory(p) => self.kill(p, loc)?,
            Source::Flash => self.kill_at(loc)?,
            Source::KeptOnFlash { hash, write_seq } => self.keep_replica(hash, loc, write_seq),
        }
        Ok(true)
    }

    /// Copies `item` (keeping its CAS and its expiry `expires_at`, which the copy carries
    /// itself even where the source left it to its segment) into tier `tier`'s demotion
    /// or reinsertion segments, placed by its remaining lifetime as a write is
    /// (`super::place`); returns the copy pinned, PENDING, or `None` when no segment could
    /// take it.
    pub(super) fn copy_item(
        &self,
        tier: usize,
        dest: Dest,
        item: &ItemRef<'_>,
        cas: u64,
        now: u32,
        expires_at: u32,
    ) -> Result<Option<(Pin<'_>, Location)>, CacheError> {
        let spec = ItemSpec {
            origin_cas: Some(cas),
            expires_at,
            ..item.spec()
        };
        let t = &self.tiers[tier];
        let lanes = match dest {
            Dest::Moved => &t.mover,
            Dest::Reinsert => &t.reinsert,
        };
        let lane = self.copy_lane();
        let mut movers = lanes
            .try_from(lane)
            .unwrap_or_else(|| self.lock_timed(lanes.lane(lane)));
        // Tier 0 of several has writers too, and two sets of copies (promotions in, its
        // stays): those share the movers' quarter, lane by lane, so that open segments
        // never take more than three quarters of it (`super::MIN_TIER_SEGMENTS`).
        let copy_sets = if tier == 0 && self.levels() > 1 { 2 } else { 1 };
        let cap = super::open_segments_cap(
            t.area.count(),
            super::MOVER_OPEN_SHARE,
            copy_sets * lanes.len(),
        );
        let bucket = match super::place(&movers, spec.encoded_len(), expires_at, now, cap) {
            Placement::Append(bucket) => bucket,
            Placement::Open {
                bucket,
                expires_at: seg_expiry,
            } => {
                let opened = self.replace_open(
                    tier,
                    &mut movers,
                    bucket,
                    cap,
                    self.copies_queue(tier),
                    || match dest {
                        Dest::Moved => self.open_segment(tier, seg_expiry, bucket, now).map(Some),
                        Dest::Reinsert => {
                            self.open_segment_with(tier, seg_expiry, bucket, now, || {
                                self.reinsert_slot(tier)
                            })
                        }
                    },
                )?;
                if !opened {
                    return Ok(None);
                }
                bucket
            }
        };
        let Some(app) = movers.get_mut(&bucket) else {
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

    /// The length of `tier`'s small (probation) queue of new writes, if it has one: only
    /// the tier of a single-tier cache does (with more tiers, tier 0 is the probation
    /// stage).
    fn small_queue(&self, tier: usize) -> Option<usize> {
        (tier == 0 && self.levels() == 1).then(|| {
            (self.tiers[0].area.count() as usize * SMALL_QUEUE_SHARE.0 / SMALL_QUEUE_SHARE.1).max(1)
        })
    }

    /// Takes the next segment of `tier` to evict out of its queues (see the module docs):
    /// in a tier above the last, the oldest; in the last tier, the oldest of the small
    /// queue while it is longer than its length, else the oldest of the main queue.
    pub(super) fn pop_victim(&self, tier: usize, lists: &mut Lists) -> Option<Victim> {
        let from_fifo = |lists: &mut Lists| {
            lists.fifo.pop_front().map(|slot| Victim {
                slot,
                walk: if tier == 0 {
                    Walk::Probation
                } else {
                    Walk::Evict
                },
            })
        };
        let from_main = |lists: &mut Lists| {
            lists.main.pop_front().map(|slot| Victim {
                slot,
                walk: Walk::Evict,
            })
        };
        if tier + 1 < self.levels() || lists.main.is_empty() {
            return from_fifo(lists);
        }
        match self.small_queue(tier) {
            Some(small) if lists.fifo.len() > small => from_fifo(lists),
            // Below other tiers nothing is sealed into the FIFO but an empty segment
            // whose header could not be persisted: out of the way first.
            None if !lists.fifo.is_empty() => from_fifo(lists),
            _ => from_main(lists),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::RefCell;
    use std::path::Path;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::cache::policy::STAY_HITS;
    use crate::item::ItemLimits;
    use crate::tier::{TierConfig, TierSize};
    use crate::CacheConfig;

    type Hook = Box<dyn FnMut(&[u8])>;

    thread_local! {
        /// Runs in [`Cache::evict`] between copying an item and taking its bucket lock to
        /// publish the copy: where a writer racing with the mover gets in.
        static BEFORE_PUBLISH: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    pub(in crate::cache) fn before_publish(key: &[u8]) {
        // Taken out while it runs: what it calls may evict (and get here) again.
        if let Some(mut hook) = BEFORE_PUBLISH.with(|h| h.borrow_mut().take()) {
            hook(key);
            BEFORE_PUBLISH.with(|h| {
                h.borrow_mut().get_or_insert(hook);
            });
        }
    }

    fn config(tiers: Vec<TierConfig>) -> CacheConfig {
        CacheConfig {
            segment_shift: Some(15),
            limits: ItemLimits {
                max_key_len: 250,
                max_value_len: 8 << 10,
            },
            stripes: 1,
            ..CacheConfig::new(tiers)
        }
    }

    /// One file tier of 1 MiB, its index sized for four times the small items these
    /// tests write: a restart rebuilds the index in another order than the writes
    /// filled it, and a full index then drops a few items (a miss, allowed, but not what
    /// the race tests check).
    fn file_only(dir: &Path) -> CacheConfig {
        CacheConfig {
            expected_items: Some(16_384),
            ..config(vec![TierConfig::file(dir, TierSize::Bytes(1 << 20))])
        }
    }

    fn value(k: u32, version: u32) -> Vec<u8> {
        format!("{k}:{version}:").repeat(60).into_bytes()
    }

    fn tier_dir() -> tempfile::TempDir {
        match Path::new("/dev/shm").is_dir() {
            true => tempfile::tempdir_in("/dev/shm").unwrap(),
            false => tempfile::tempdir().unwrap(),
        }
    }

    /// DRAM tiers are whole 2 MiB granules: 64 segments of 32 KiB.
    const TIER: u64 = 2 << 20;

    #[test]
    fn the_last_tier_reinserts_items_with_hits_and_drops_the_rest() {
        let (c, _) = Cache::open(config(vec![TierConfig::dram(TierSize::Bytes(TIER))])).unwrap();
        for k in 0..50 {
            c.set(format!("hot{k}").as_bytes(), &value(k, 0), 0, 0)
                .unwrap();
        }
        // About eight laps of the tier in cold writes (~420 bytes each); the hot keys are
        // read every fifth of a lap. In plain FIFO order they would be gone after the
        // first lap, however often they were read.
        let cold = 40_000u32;
        for k in 0..cold {
            c.set(format!("cold{k}").as_bytes(), &value(k, 0), 0, 0)
                .unwrap();
            if k % 1000 == 0 {
                for h in 0..50 {
                    assert!(
                        c.get(format!("hot{h}").as_bytes()).unwrap().is_some(),
                        "hot{h}"
                    );
                }
            }
        }
        for h in 0..50 {
            let g = c.get(format!("hot{h}").as_bytes()).unwrap().unwrap();
            assert_eq!(g.value(), &value(h, 0)[..]);
        }
        let s = c.stats();
        assert!(s.reinsertions >= 50, "{s:?}");
        // Cold keys nobody read are dropped at their first eviction: the first laps' are
        // gone, but for the few the ghost filter falsely recalled as dropped before (its
        // 8-bit fingerprints match by chance about once in 255 inserts).
        let old = (0..cold / 2)
            .filter(|k| c.get(format!("cold{k}").as_bytes()).unwrap().is_some())
            .count();
        assert!(
            old * 100 < cold as usize / 2,
            "{old} old cold keys survived"
        );
    }

    #[test]
    fn writers_evicting_inline_keep_the_reinsertion_reserve_and_clean() {
        // No movers: every eviction is a writer's, as when the movers fall behind.
        let (c, _) = Cache::open(config(vec![TierConfig::dram(TierSize::Bytes(TIER))])).unwrap();
        // Keys read every round, which live in the main queue by reinsertion; a
        // twentieth of them overwritten each round, which leaves dead bytes there (the
        // new copy is read too, and joins the main queue in turn); and keys written once
        // and never read, which push the FIFO round.
        let hot = 2_500;
        for round in 0..40 {
            for k in 0..hot {
                if round == 0 || k % 20 == round % 20 {
                    c.set(format!("hot{k}").as_bytes(), &value(k, round), 0, 0)
                        .unwrap();
                }
                c.get(format!("hot{k}").as_bytes()).unwrap();
            }
            for k in 0..1_000 {
                c.set(format!("cold{round}:{k}").as_bytes(), &value(k, 0), 0, 0)
                    .unwrap();
            }
        }
        let t = &c.stats().tiers[0];
        assert!(t.inline_evictions > 100, "{t:?}");
        assert_eq!(t.background_evictions, 0);
        // Each writer's eviction left the reinsertions their reserve: none had to open
        // a segment by dropping another's items with hits.
        assert_eq!(t.barred_evictions, 0, "{t:?}");
        // And did the cleaning the movers would have done.
        assert!(t.segments_cleaned > 0, "{t:?}");
        assert_eq!(t.free_low_water, 0, "writers found no free segment");
        let kept = present(&c, "hot", 0..hot);
        assert!(
            kept * 4 >= hot as usize * 3,
            "{kept} of {hot} hot keys kept"
        );
    }

    /// Item pairs (one big, one tiny) in about 1.75 times what tier 0 holds.
    fn pairs(c: &Cache) -> u32 {
        (c.tiers[0].area.count() << c.shift) / 500 * 2
    }

    /// Writes [`pairs`] of unread items, big (250 to 430 bytes) and tiny (about 12), so
    /// that the first third of them has surely been evicted from tier 0 (a probation
    /// stage); asserts that the tiny keys of that third are still there and the big ones
    /// gone, and returns how many tiny ones are there. The first twelfth is not checked:
    /// the first segments evicted from tier 0 are measured against no mean, or one of the
    /// short values the first keys have.
    fn probation_keeps_the_tiny_items(c: &Cache) -> usize {
        let pairs = pairs(c);
        for k in 0..pairs {
            c.set(format!("big{k}").as_bytes(), &value(k, 0), 0, 0)
                .unwrap();
            c.set(format!("tiny{k}").as_bytes(), b"t", 0, 0).unwrap();
            if k % 64 == 0 {
                c.maintain().unwrap();
            }
        }
        let checked = pairs / 12..pairs / 3;
        let (tiny, big) = (
            present(c, "tiny", checked.clone()),
            present(c, "big", checked.clone()),
        );
        let checked = checked.len();
        assert!(
            tiny * 10 >= checked * 9,
            "{tiny} of {checked} tiny items kept: {:?}",
            c.stats()
        );
        assert!(big * 20 <= checked, "{big} of {checked} big items kept");
        tiny
    }

    /// How many of the keys `prefix{k}`, `k` in `keys`, are there (not counted as gets).
    fn present(c: &Cache, prefix: &str, keys: std::ops::Range<u32>) -> usize {
        keys.filter(|k| c.peek(format!("{prefix}{k}").as_bytes()).unwrap().is_some())
            .count()
    }

    #[test]
    fn a_probation_stage_keeps_small_items_without_hits_and_drops_big_ones() {
        // The index is sized for the items, tiny ones too: a full one would drop some.
        let config = |tiers| CacheConfig {
            expected_items: Some(32_768),
            ..config(tiers)
        };
        // A single tier: its small queue promotes the tiny items into the main queue,
        // which they do not fill.
        let (c, _) = Cache::open(config(vec![TierConfig::dram(TierSize::Bytes(TIER))])).unwrap();
        probation_keeps_the_tiny_items(&c);
        // Out of the main queue, small is not enough: two more laps of the tier in big
        // items read once each (promoted into the main queue, which then turns over),
        // and the tiny ones nobody read are gone.
        let pairs = pairs(&c);
        for k in 0..pairs * 2 {
            let key = format!("later{k}");
            c.set(key.as_bytes(), &value(k, 0), 0, 0).unwrap();
            assert!(c.get(key.as_bytes()).unwrap().is_some());
            if k % 64 == 0 {
                c.maintain().unwrap();
            }
        }
        let tiny = present(&c, "tiny", 0..pairs);
        assert!(
            tiny * 100 <= pairs as usize,
            "{tiny} tiny items outlived the main queue"
        );
        // Tier 0 of two is the probation stage: it demotes the tiny items to tier 1.
        let tiers = vec![
            TierConfig::dram(TierSize::Bytes(TIER)),
            TierConfig::dram(TierSize::Bytes(4 * TIER)),
        ];
        let (c, _) = Cache::open(config(tiers)).unwrap();
        let tiny = probation_keeps_the_tiny_items(&c);
        assert!(c.stats().demotions as usize >= tiny, "{:?}", c.stats());
    }

    #[test]
    fn the_main_queue_is_evicted_oldest_first_however_dead_a_younger_segment_is() {
        let (c, _) = Cache::open(config(vec![TierConfig::dram(TierSize::Bytes(TIER))])).unwrap();
        let small = c.small_queue(0).unwrap();
        // Most of the main queue is dead, one younger segment almost entirely, the oldest
        // not at all: the oldest still goes first (evicting dead-heavy segments first
        // would drop their unread items: see the module docs; cleaning them, which drops
        // nothing, is another pass).
        for slot in 20..50 {
            c.meta[slot].dead_bytes.store(20_000, Ordering::Relaxed);
        }
        c.meta[30].dead_bytes.store(30_000, Ordering::Relaxed);
        let mut lists = Lists {
            free: Vec::new(),
            fifo: (1..1 + small as u32).collect(),
            main: [19].into_iter().chain(20..50).collect(),
            reclaim: Vec::new(),
        };
        let victim = c.pop_victim(0, &mut lists).unwrap();
        assert_eq!((victim.slot, victim.walk), (19, Walk::Evict));
        // The small queue goes first only while it is longer than its share.
        lists.fifo.push_back(60);
        let victim = c.pop_victim(0, &mut lists).unwrap();
        assert_eq!((victim.slot, victim.walk), (1, Walk::Probation));
        assert_eq!(lists.main.front(), Some(&20));
        assert_eq!(lists.main.len(), 30);
    }

    #[test]
    fn writers_leave_the_last_free_segment_to_the_reinsertion_segment() {
        let (c, _) = Cache::open(config(vec![TierConfig::dram(TierSize::Bytes(TIER))])).unwrap();
        for k in 0..400 {
            c.set(format!("k{k}").as_bytes(), &value(k, 0), 0, 0)
                .unwrap();
        }
        let free = c.tiers[0].lists.lock().free.len();
        assert!(free > REINSERT_RESERVE, "{free} free segments");
        // Down to the reserve: a writer's segment now comes from an inline eviction.
        let taken: Vec<u32> = (REINSERT_RESERVE..free)
            .map(|_| c.allocate(0).unwrap())
            .collect();
        assert_eq!(c.stats().inline_evictions, 0);
        let slot = c.allocate(0).unwrap();
        assert!(!taken.contains(&slot));
        assert_eq!(c.stats().inline_evictions, 1);
        assert_eq!(c.tiers[0].lists.lock().free.len(), REINSERT_RESERVE);
        // The reinsertion segment may take it.
        assert!(c.reinsert_slot(0).unwrap().is_some());
        assert_eq!(c.stats().inline_evictions, 1);
    }

    #[test]
    fn reinsertion_cannot_livelock_when_every_item_is_hot() {
        let (c, _) = Cache::open(config(vec![TierConfig::dram(TierSize::Bytes(TIER))])).unwrap();
        // Every item is read three times (frequency saturated) and keeps being read: the
        // evictor reinserts what its budget allows, spends hits, and still frees space.
        let n = 20_000u32;
        for k in 0..n {
            c.set(format!("k{k}").as_bytes(), &value(k, 0), 0, 0)
                .unwrap();
            for back in 0..8u32.min(k + 1) {
                for _ in 0..3 {
                    c.get(format!("k{}", k - back).as_bytes()).unwrap();
                }
            }
            if k % 64 == 0 {
                c.maintain().unwrap();
            }
        }
        let s = c.stats();
        assert!(s.reinsertions > 0, "{s:?}");
        assert!(s.tiers[0].segments_evicted > 64, "{s:?}");
        // The newest keys are there; the tier holds what fits and no more.
        for k in n - 8..n {
            assert!(c.get(format!("k{k}").as_bytes()).unwrap().is_some(), "k{k}");
        }
        assert!(s.items as u64 <= TIER / 400, "{s:?}");
    }

    /// Writes unread items `{prefix}0`, `{prefix}1`, … (about 430 bytes each) until
    /// `done()`, running [`Cache::maintain`] every eighth write as the mover thread
    /// does: with no lock held, so that a [`before_publish`] hook's write can get in (an
    /// inline eviction holds its writer's stripe lock, and the hook would wait for
    /// itself). Panics, naming `what`, after 100,000 writes.
    fn write_until(c: &Cache, prefix: &str, what: &str, mut done: impl FnMut() -> bool) {
        let mut k = 0;
        while !done() {
            c.set(format!("{prefix}{k}").as_bytes(), &value(k, 0), 0, 0)
                .unwrap();
            if k % 8 == 0 {
                c.maintain().unwrap();
            }
            k += 1;
            assert!(k < 100_000, "{what} never happened");
        }
    }

    /// What the writer racing a move does to `victim`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Racer {
        /// Deletes it.
        Delete,
        /// Overwrites it with `value(0, 2)`.
        Overwrite,
    }

    /// Installs the [`before_publish`] hook: the first time a copy of `victim` is about
    /// to be published, the key is overwritten or deleted, as `racer` says. Returns how
    /// many times it fired.
    fn race_a_writer_before_publishing(
        c: &std::sync::Arc<Cache>,
        racer: Racer,
    ) -> std::sync::Arc<AtomicUsize> {
        let fired = std::sync::Arc::new(AtomicUsize::new(0));
        let c = std::sync::Arc::clone(c);
        let count = std::sync::Arc::clone(&fired);
        BEFORE_PUBLISH.with(|h| {
            *h.borrow_mut() = Some(Box::new(move |key: &[u8]| {
                if key != b"victim" || count.load(Ordering::Relaxed) > 0 {
                    return;
                }
                count.fetch_add(1, Ordering::Relaxed);
                match racer {
                    Racer::Overwrite => {
                        c.set(b"victim", &value(0, 2), 0, 0).unwrap();
                    }
                    Racer::Delete => assert!(c.delete(b"victim").unwrap()),
                }
            }))
        });
        fired
    }

    /// Removes the [`before_publish`] hook, then checks that `victim` holds what the
    /// racing writer left — `value(0, 2)` after an overwrite, nothing after a delete — in
    /// the running cache and after a restart with `config` ([`crash_and_check`]).
    fn check_the_writer_won(c: std::sync::Arc<Cache>, config: CacheConfig, racer: Racer) {
        BEFORE_PUBLISH.with(|h| h.borrow_mut().take());
        let expect = (racer == Racer::Overwrite).then(|| value(0, 2));
        let now = c.get(b"victim").unwrap().map(|g| g.value().to_vec());
        assert_eq!(now, expect, "running cache");
        crash_and_check(c, config, expect);
    }

    /// Drops the cache without a clean shutdown, reopens its files with `config` (a
    /// scan) and checks that `victim` holds `expect` and no key has two LIVE items.
    fn crash_and_check(c: std::sync::Arc<Cache>, config: CacheConfig, expect: Option<Vec<u8>>) {
        let Ok(c) = std::sync::Arc::try_unwrap(c) else {
            panic!("the hook let go of the cache");
        };
        drop(c);
        let (c, report) = Cache::open(config).unwrap();
        assert_eq!(report.conflicts, 0, "{report:?}");
        assert_eq!(report.index_full, 0, "{report:?}");
        let after = c.get(b"victim").unwrap().map(|g| g.value().to_vec());
        assert_eq!(after, expect, "after a restart");
    }

    /// A reinsertion in a durable (file) tier races with a delete or an overwrite of the
    /// same key, between copying the item and publishing the copy. The copy must die:
    /// neither the running cache nor a restart may bring the old value back (the
    /// evictor publishes only if the entry still points at the source, which is still
    /// LIVE; else it kills its copy).
    fn reinsertion_racing_a_writer(racer: Racer) {
        let dir = tier_dir();
        let (c, _) = Cache::open(file_only(dir.path())).unwrap();
        let c = std::sync::Arc::new(c);
        c.set(b"victim", &value(0, 1), 0, 0).unwrap();
        assert!(
            c.get(b"victim").unwrap().is_some(),
            "a hit: it will be reinserted"
        );
        let fired = race_a_writer_before_publishing(&c, racer);
        write_until(&c, "k", "the victim's eviction", || {
            fired.load(Ordering::Relaxed) > 0
        });
        assert_eq!(c.stats().inline_evictions, 0);
        check_the_writer_won(c, file_only(dir.path()), racer);
    }

    #[test]
    fn a_reinsertion_racing_a_delete_never_brings_the_value_back() {
        reinsertion_racing_a_writer(Racer::Delete);
    }

    #[test]
    fn a_reinsertion_racing_an_overwrite_never_brings_the_old_value_back() {
        reinsertion_racing_a_writer(Racer::Overwrite);
    }

    /// Two file tiers, promotion on.
    fn promoting_files(dir: &Path) -> CacheConfig {
        let (upper, lower) = (dir.join("upper"), dir.join("lower"));
        for d in [&upper, &lower] {
            std::fs::create_dir_all(d).unwrap();
        }
        CacheConfig {
            promote: true,
            ..config(vec![
                TierConfig::file(&upper, TierSize::Bytes(1 << 20)),
                TierConfig::file(&lower, TierSize::Bytes(1 << 20)),
            ])
        }
    }

    /// A writer replaces or deletes the key between the promotion's copy and its
    /// publication: the copy must die, durably, or a restart would bring the old value
    /// back from tier 0.
    fn promotion_racing_a_writer(racer: Racer) {
        let dir = tier_dir();
        let (c, _) = Cache::open(promoting_files(dir.path())).unwrap();
        let c = std::sync::Arc::new(c);
        c.set(b"victim", &value(0, 1), 0, 0).unwrap();
        assert!(c.get(b"victim").unwrap().is_some());
        // Cold writes push it down to tier 1 (one hit: demoted, not kept in tier 0 nor
        // asked to promote; peeks, which record no hit, watch for it).
        write_until(&c, "k", "the victim's demotion", || {
            c.peek(b"victim").unwrap().unwrap().tier() != 0
        });
        // Its second hit, in tier 1, records the second hit; the third asks for the
        // promotion.
        assert_eq!(c.get(b"victim").unwrap().unwrap().tier(), 1);
        assert_eq!(c.get(b"victim").unwrap().unwrap().tier(), 1);
        let fired = race_a_writer_before_publishing(&c, racer);
        c.maintain().unwrap();
        assert_eq!(fired.load(Ordering::Relaxed), 1, "the promotion never ran");
        assert_eq!(c.stats().promotions, 0);
        check_the_writer_won(c, promoting_files(dir.path()), racer);
    }

    #[test]
    fn a_promotion_racing_a_delete_never_brings_the_value_back() {
        promotion_racing_a_writer(Racer::Delete);
    }

    #[test]
    fn a_promotion_racing_an_overwrite_never_brings_the_old_value_back() {
        promotion_racing_a_writer(Racer::Overwrite);
    }

    #[test]
    fn the_segment_cleaned_is_the_deadest_past_the_oldest_quarter_within_the_window() {
        let enough = 100;
        let main: std::collections::VecDeque<u32> = (0..100).collect();
        // Dead bytes growing with the slot number: the deadest in the window is its
        // youngest.
        let growing = |slot: u32| u64::from(slot) * 10;
        assert_eq!(
            clean_candidate(&main, growing, enough),
            Some(25 + CLEAN_WINDOW - 1)
        );
        // The oldest quarter is never cleaned, however dead.
        let dead = |slot: u32| {
            if slot < 25 {
                10_000
            } else {
                150 - u64::from(slot)
            }
        };
        assert_eq!(clean_candidate(&main, dead, enough), Some(25));
        // Nothing in the window dead enough: nothing to clean (slot 90, past it, is).
        let dead = |slot: u32| if slot == 90 { 10_000 } else { 99 };
        assert_eq!(clean_candidate(&main, dead, enough), None);
        assert_eq!(
            clean_candidate(&main, |_| enough, enough),
            Some(25 + CLEAN_WINDOW - 1)
        );
        // A short queue: a quarter of three segments is none of them.
        let short: std::collections::VecDeque<u32> = [7, 8, 9].into_iter().collect();
        let dead = |slot: u32| if slot == 7 { 500 } else { 0 };
        assert_eq!(clean_candidate(&short, dead, enough), Some(0));
        assert_eq!(
            clean_candidate(&std::collections::VecDeque::new(), u64::from, 0),
            None
        );
    }

    /// The slot of `key`'s segment if it is in tier 0's main queue (sealed).
    fn main_slot(c: &Cache, key: &[u8]) -> Option<u32> {
        let slot = c.peek(key).unwrap()?.segment - c.tiers[0].base;
        c.tiers[0].lists.lock().main.contains(&slot).then_some(slot)
    }

    /// Writes `victim` and `m0..m{keys}` (about 430 bytes each, more than a segment's
    /// worth), reads each once, and pushes them through the single tier's small queue with
    /// unread writes until `victim` is in a sealed segment of the main queue. Returns
    /// that segment's slot and the `m` keys in it (of those promoted: a promotion copies
    /// at most three quarters of a segment, so some are dropped).
    fn victim_in_main(c: &Cache, keys: u32) -> (u32, Vec<u32>) {
        c.set(b"victim", &value(0, 1), 0, 0).unwrap();
        for k in 0..keys {
            c.set(format!("m{k}").as_bytes(), &value(k, 0), 0, 0)
                .unwrap();
            // Tiny ones too, never read: promoted as small items (against a mean set
            // here, so that the first segments out of the small queue keep them too).
            c.set(format!("t{k}").as_bytes(), b"t", 0, 0).unwrap();
        }
        c.tiers[0].probation_mean_len.store(430, Ordering::Relaxed);
        assert!(c.get(b"victim").unwrap().is_some());
        for k in 0..keys {
            assert!(c.get(format!("m{k}").as_bytes()).unwrap().is_some());
        }
        write_until(c, "cold", "the victim's promotion", || {
            main_slot(c, b"victim").is_some()
        });
        let slot = main_slot(c, b"victim").unwrap();
        let same = (0..keys)
            .filter(|k| main_slot(c, format!("m{k}").as_bytes()) == Some(slot))
            .collect();
        (slot, same)
    }

    /// Overwrites the odd ones of `keys` (`m{k}`, with `value(k, 1)`): their copies in
    /// the victim's segment die.
    fn overwrite_odd(c: &Cache, keys: &[u32]) {
        for k in keys.iter().filter(|k| *k % 2 == 1) {
            c.set(format!("m{k}").as_bytes(), &value(*k, 1), 0, 0)
                .unwrap();
        }
    }

    #[test]
    fn cleaning_frees_a_dead_main_segment_and_keeps_its_live_items_and_their_hits() {
        let (c, _) = Cache::open(config(vec![TierConfig::dram(TierSize::Bytes(TIER))])).unwrap();
        let (slot, same) = victim_in_main(&c, 150);
        assert!(
            same.len() >= 20,
            "{} keys share the victim's segment",
            same.len()
        );
        let tiny: Vec<u32> = (0..150)
            .filter(|k| main_slot(&c, format!("t{k}").as_bytes()) == Some(slot))
            .collect();
        assert!(tiny.len() >= 20, "{} unread keys share it", tiny.len());
        assert!(
            !c.clean_one(0, CleanRoom::Free).unwrap(),
            "nothing is dead enough yet"
        );
        overwrite_odd(&c, &same);
        let before = c.stats().tiers[0].clone();
        assert!(c.clean_one(0, CleanRoom::Free).unwrap());
        let after = c.stats().tiers[0].clone();
        assert_eq!(after.segments_cleaned, 1);
        // The victim, the even keys and the unread ones, copied; nothing dropped, nothing
        // counted evicted.
        let live = 1 + same.iter().filter(|k| *k % 2 == 0).count() as u64 + tiny.len() as u64;
        assert_eq!(after.items_cleaned, live);
        assert_eq!(
            (after.segments_evicted, after.items_evicted),
            (before.segments_evicted, before.items_evicted)
        );
        assert!(c.tiers[0].lists.lock().reclaim.contains(&slot));
        assert!(!c.tiers[0].lists.lock().main.contains(&slot));
        assert_eq!(
            c.peek(b"victim").unwrap().unwrap().value(),
            &value(0, 1)[..]
        );
        for &k in &same {
            let g = c.peek(format!("m{k}").as_bytes()).unwrap().unwrap();
            assert_eq!(g.value(), &value(k, k % 2)[..], "m{k}");
        }
        for &k in &tiny {
            assert!(
                c.peek(format!("t{k}").as_bytes()).unwrap().is_some(),
                "t{k}"
            );
        }
        // A cleaned item keeps the hit it had: one more pass of the main queue.
        let hash = c.index.hash_key(b"victim");
        let hits: Vec<u8> = c.index.lookup(hash).map(|h| h.frequency()).collect();
        assert_eq!(hits, vec![1]);
    }

    /// A cleaning in a durable (file) tier races with a delete or an overwrite of the
    /// key, between copying the item and publishing the copy: the copy must die, in the
    /// running cache and after a restart (the copy is published as every move is).
    fn cleaning_racing_a_writer(racer: Racer) {
        let dir = tier_dir();
        let (c, _) = Cache::open(file_only(dir.path())).unwrap();
        let (_, same) = victim_in_main(&c, 150);
        overwrite_odd(&c, &same);
        let c = std::sync::Arc::new(c);
        let fired = race_a_writer_before_publishing(&c, racer);
        assert!(c.clean_one(0, CleanRoom::Free).unwrap());
        assert_eq!(
            fired.load(Ordering::Relaxed),
            1,
            "the cleaning never copied the victim"
        );
        check_the_writer_won(c, file_only(dir.path()), racer);
    }

    #[test]
    fn a_cleaning_racing_a_delete_never_brings_the_value_back() {
        cleaning_racing_a_writer(Racer::Delete);
    }

    #[test]
    fn a_cleaning_racing_an_overwrite_never_brings_the_old_value_back() {
        cleaning_racing_a_writer(Racer::Overwrite);
    }

    #[test]
    fn tier_0_of_two_keeps_the_items_read_most_and_demotes_the_others() {
        let dram = || TierConfig::dram(TierSize::Bytes(TIER));
        let (c, _) = Cache::open(config(vec![dram(), dram()])).unwrap();
        for key in [&b"hot"[..], b"warm"] {
            c.set(key, &value(1, 0), 0, 0).unwrap();
        }
        for _ in 0..STAY_HITS {
            assert!(c.get(b"hot").unwrap().is_some());
        }
        assert!(c.get(b"warm").unwrap().is_some());
        // Unread writes until the warm key is demoted (peeks record no hits).
        let seg = |key: &[u8]| c.peek(key).unwrap().map(|g| (g.tier(), g.segment));
        let (hot_tier, hot_slot) = seg(b"hot").unwrap();
        assert_eq!(seg(b"warm"), Some((hot_tier, hot_slot)), "one segment");
        write_until(&c, "f", "the warm key's demotion", || {
            seg(b"warm").is_some_and(|(tier, _)| tier == 1)
        });
        // The hot key stayed in tier 0, copied out of its evicted segment, one hit spent.
        let (tier, slot) = seg(b"hot").unwrap();
        assert_eq!(tier, 0);
        assert_ne!(slot, hot_slot);
        let hash = c.index.hash_key(b"hot");
        let hits: Vec<u8> = c.index.lookup(hash).map(|h| h.frequency()).collect();
        assert_eq!(hits, vec![STAY_HITS - 1]);
        assert_eq!(c.stats().tiers[0].reinserted, 1);
        assert_eq!(c.peek(b"hot").unwrap().unwrap().value(), &value(1, 0)[..]);
    }

    /// A stay in a durable tier 0 races with a delete or an overwrite of the key, between
    /// copying the item and publishing the copy: the copy must die, in the running cache
    /// and after a restart.
    fn stay_racing_a_writer(racer: Racer) {
        let dir = tier_dir();
        let files = |dir: &Path| CacheConfig {
            promote: false,
            ..promoting_files(dir)
        };
        let (c, _) = Cache::open(files(dir.path())).unwrap();
        let c = std::sync::Arc::new(c);
        c.set(b"victim", &value(0, 1), 0, 0).unwrap();
        for _ in 0..STAY_HITS {
            assert!(c.get(b"victim").unwrap().is_some());
        }
        let fired = race_a_writer_before_publishing(&c, racer);
        write_until(&c, "k", "the victim's eviction", || {
            fired.load(Ordering::Relaxed) > 0
        });
        // The copy raced was a stay: the only item read twice is the victim, and tier 0's
        // reinsertion segment was opened for it (a demotion would have gone to tier 1).
        assert!(
            c.tiers[0].reinsert.iter().any(|l| !l.lock().is_empty()),
            "no stay was copied"
        );
        assert_eq!(c.stats().tiers[0].reinserted, 0, "the stay was published");
        check_the_writer_won(c, files(dir.path()), racer);
    }

    #[test]
    fn a_stay_racing_a_delete_never_brings_the_value_back() {
        stay_racing_a_writer(Racer::Delete);
    }

    #[test]
    fn a_stay_racing_an_overwrite_never_brings_the_old_value_back() {
        stay_racing_a_writer(Racer::Overwrite);
    }

    #[test]
    fn a_key_the_ghost_recalls_is_passed_on_by_its_probation_stage_with_no_hit() {
        let (c, _) = Cache::open(config(vec![TierConfig::dram(TierSize::Bytes(TIER))])).unwrap();
        // Unread, it is dropped by the small queue, and remembered.
        c.set(b"back", &value(1, 0), 0, 0).unwrap();
        write_until(&c, "f", "the drop", || c.peek(b"back").unwrap().is_none());
        // Stored again, it is marked: it counts as one hit in the small queue...
        c.set(b"back", &value(1, 0), 0, 0).unwrap();
        let hash = c.index.hash_key(b"back");
        let entry = || {
            c.index
                .lookup(hash)
                .map(|h| (h.recalled_without_hit(), h.frequency()))
        };
        assert_eq!(entry().collect::<Vec<_>>(), vec![(true, 1)]);
        // ...which passes it on to the main queue, where it has none: S3-FIFO's ghost
        // hit, inserted into the main queue with a frequency of 0.
        let slot = c.peek(b"back").unwrap().unwrap().segment;
        write_until(&c, "g", "the promotion", || {
            c.peek(b"back").unwrap().is_none_or(|g| g.segment != slot)
        });
        assert!(c.peek(b"back").unwrap().is_some(), "promoted, not dropped");
        assert_eq!(entry().collect::<Vec<_>>(), vec![(false, 0)]);
    }
}

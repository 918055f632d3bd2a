//! The engine's side of the flash tier (`crate::flash` owns its I/O): demotion from the
//! last memory tier into flash write buffers, reads of flash items, kills, the flash
//! tier's own eviction with reinsertion, promotion out of flash, and its restart.
//!
//! # Policy
//! The flash tier is always the last. What the tier above keeps at an eviction (items
//! with hits, small items out of probation: `evict.rs`) is demoted into flash, and while
//! flash has room to spare ([`Cache::flash_has_room`]) every other live item too: empty
//! flash holds nothing, and an item without a hit in DRAM may still be read in the far
//! longer time flash keeps it. Once flash is full (its free segments down to what the
//! movers keep ready) it takes only what survived DRAM probation or had a hit, and the
//! FIFO below makes room. Its segments are evicted in FIFO order, except that one whose
//! items have all expired goes first (the movers free such segments as soon as they
//! expire, as a memory tier's TTL buckets: nothing in them is reinserted), then one
//! whose items are at least [`DEAD_FIRST`] dead (evicting it frees space at no loss);
//! an evicted segment's items with hits are reinserted — within
//! [`FLASH_REINSERT_BUDGET`] of a segment, one hit spent — and the others dropped. There
//! is no copy-cleaning on flash: it would cost flash writes.
//!
//! # Invariants
//! A copy into flash is published as every move is (`evict.rs`, E4): appended PENDING
//! to a buffer, then under the key's bucket lock, only if the entry still points at the
//! source and the source is still LIVE, made LIVE in the buffer, the entry repointed,
//! the source killed — else made DEAD. A buffer is not written while a copy in it is
//! pending (`crate::flash`), so every item on flash is LIVE or DEAD as published. An
//! item on flash that loses its entry (overwrite, delete, promotion, index eviction) is
//! killed through the kill log before the operation returns (E2 for flash). An evicted
//! flash segment is read into DRAM and retired on flash before its walk, so a crash
//! during the walk leaves no item of it to come back; reinsertions from it live in a
//! buffer until written (a crash loses them: a miss, never a stale value).
//!
//! Lock order: a key's bucket lock is never held across a flash write, only across a
//! read (a writer finding the key's current item on flash) and a kill-log record.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::recover::{DropReason, Found, RestartReport};
use super::saved::{Saved, SavedSegment};
use super::{Cache, SegMeta};
use crate::error::CacheError;
use crate::flash::{
    expiry_bound, Buffer, FlashRead, FlashTier, OwnedItem, RestoredSlot, NEVER, SMALL_LOG_BUCKET,
};
use crate::index::{Freq, Index, Location, Sweep};
use crate::item::{ItemRef, ItemSpec, ItemState};
use crate::mem::Pin;
use crate::segment::{SegmentReader, HEADER_LEN};

/// The dead share of its items at which a flash segment is evicted ahead of FIFO order.
pub(super) const DEAD_FIRST: (u32, u32) = (4, 5);

/// How far into the FIFO the search for a dead-heavy segment looks.
const DEAD_FIRST_WINDOW: usize = 64;

/// The most an eviction of a flash segment reinserts, as a share of a segment's bytes:
/// reinsertions cost flash writes, so fewer than in a memory tier.
pub(super) const FLASH_REINSERT_BUDGET: (usize, usize) = (1, 4);

/// Free flash segments demotions leave to the reinsertion buffer.
const FLASH_REINSERT_RESERVE: usize = 1;

/// Segments of DRAM a flash tier's buffers take at most (a demotion buffer, a
/// reinsertion buffer, a segment read back for its eviction), deducted from the first
/// DRAM tier.
pub(super) const FLASH_BUFFER_SEGMENTS: u32 = 3;

/// Segments of the small-item log beyond its cap that demotions wait for the movers to
/// move into sets before they move one themselves.
const SMALL_LOG_SLACK: usize = 2;

/// Free flash segments the movers keep ready (demotions write whole segments, so few).
pub(super) const FLASH_FREE_TARGET: usize = 3;

/// The share of flash segments that, free beyond [`FLASH_FREE_TARGET`], counts as room to
/// spare: demotions then take items without hits too.
const FLASH_SPARE_SHARE: u32 = 32;

/// The flash reads a lookup of one key would wait for ([`Cache::flash_fetch`]): run it
/// ([`Cache::run_flash_fetch`]) on a thread that may block, and the lookup made after it
/// finds the item in DRAM. Holds only locations, so it is cheap to send.
#[derive(Debug, Clone)]
pub struct FlashFetch {
    locations: Vec<Location>,
    /// The flash set whose page the lookup would read (the key has no index entry).
    set: Option<u32>,
}

impl Cache {
    /// The flash tier's slot of segment id `id`, if `id` is on flash.
    pub(super) fn flash_slot(&self, id: u32) -> Option<(&FlashTier, u32)> {
        let f = self.flash.as_ref()?;
        f.slot_of(id).map(|s| (f, s))
    }

    /// The flash reads a lookup of `key` would wait on the device for now, if any: the
    /// key's index entries (a tag may match other keys too) that point into stored flash
    /// segments and whose items are not staged yet. `None` without a flash tier. A
    /// server's worker asks before a get, hands the fetch to a thread that may block, and
    /// gets once it ran: so a flash hit never blocks the worker's loop (a segment stored
    /// between the two, or a staged item dropped for room, is read inline, rarely).
    ///
    /// With flash sets, a key without any index entry whose set may hold it needs its
    /// set's page: that read is in the fetch too (a key with an entry, the key's or a
    /// tag's namesake, reads no page here; the rare namesake reads it inline).
    pub fn flash_fetch(&self, key: &[u8]) -> Option<FlashFetch> {
        let f = self.flash.as_ref()?;
        let hash = self.index.hash_key(key);
        let candidates: Vec<Location> = self.index.lookup(hash).map(|hit| hit.location()).collect();
        let set = if candidates.is_empty() {
            self.set_to_read(hash)
        } else {
            None
        };
        let locations: Vec<Location> = candidates
            .into_iter()
            .filter(|l| {
                f.slot_of(l.segment)
                    .is_some_and(|slot| f.needs_read(slot, l.offset))
            })
            .collect();
        (!locations.is_empty() || set.is_some()).then_some(FlashFetch { locations, set })
    }

    /// Reads the items of `fetch` from flash into DRAM, for the next lookup of their key
    /// (see [`flash_fetch`](Self::flash_fetch)); may wait on the device.
    pub fn run_flash_fetch(&self, fetch: &FlashFetch) {
        for loc in &fetch.locations {
            if let Some((f, slot)) = self.flash_slot(loc.segment) {
                f.stage(slot, loc.offset);
            }
        }
        if let (Some(set), Some(f)) = (fetch.set, &self.flash) {
            f.stage_page(set);
        }
    }

    /// The reads of `fetch` as [`FlashRead`]s for the caller's own I/O engine to run
    /// instead of [`run_flash_fetch`](Self::run_flash_fetch) (an io_uring worker); each
    /// result goes to [`finish_flash_read`](Self::finish_flash_read). Items staged or
    /// moved since the fetch was made need no read.
    pub fn flash_reads(&self, fetch: &FlashFetch) -> Vec<FlashRead> {
        let page = fetch
            .set
            .and_then(|set| self.flash.as_ref()?.plan_page_read(set));
        fetch
            .locations
            .iter()
            .filter_map(|loc| {
                let (f, slot) = self.flash_slot(loc.segment)?;
                f.plan_read(slot, loc.offset)
            })
            .chain(page)
            .collect()
    }

    /// Stages the item a [`FlashRead`] read (`result`: the bytes read, or the error), or
    /// returns the read still needed for it (an item longer than the first read).
    pub fn finish_flash_read(
        &self,
        read: FlashRead,
        result: std::io::Result<usize>,
    ) -> Option<FlashRead> {
        self.flash.as_ref()?.finish_read(read, result)
    }

    /// Whether the flash tier has room to spare: more free segments than the movers keep
    /// ready, by at least a [`FLASH_SPARE_SHARE`]th of the tier.
    pub(super) fn flash_has_room(&self) -> bool {
        self.flash.as_ref().is_some_and(|f| {
            let spare = (f.count / FLASH_SPARE_SHARE).max(2) as usize;
            f.segment_counts().0 > FLASH_FREE_TARGET + spare
        })
    }

    /// Whether the last tier is flash.
    pub fn has_flash(&self) -> bool {
        self.flash.is_some()
    }

    /// Tiers, the flash tier included.
    pub(super) fn levels(&self) -> usize {
        self.tiers.len() + usize::from(self.flash.is_some())
    }

    /// The flash item at `loc`, copied out; `None` when it is not there any more.
    pub(super) fn read_flash(&self, loc: Location) -> Option<OwnedItem> {
        let (f, slot) = self.flash_slot(loc.segment)?;
        f.read(slot, loc.offset)
    }

    /// Kills the item at `loc`, whose entry the caller removed or repointed, wherever it
    /// is: DEAD in place in memory, a kill record on flash.
    pub(super) fn kill_at(&self, loc: Location) -> Result<(), CacheError> {
        if loc.segment == super::sets::SET_SEGMENT {
            // A set copy: killed by its key's hash (`Cache::kill_set_copy`).
            return Ok(());
        }
        if let Some((f, slot)) = self.flash_slot(loc.segment) {
            f.kill(slot, loc.offset)?;
            return Ok(());
        }
        if let Some((_, pin)) = self.pin(loc.segment) {
            self.kill(&pin, loc)?;
        }
        Ok(())
    }

    /// Kills the flash copies of the key of `hash` that no entry points at: its set copy
    /// and its replica. The caller holds the key's bucket lock and has just written,
    /// touched or deleted the key.
    pub(super) fn kill_flash_copies(&self, hash: u64) -> Result<(), CacheError> {
        self.kill_set_copy(hash)?;
        self.kill_replica_of(hash)
    }

    /// A free flash slot, evicting a segment if none is free.
    fn flash_slot_for_buffer(&self, reinsertion: bool) -> Result<Option<u32>, CacheError> {
        let Some(f) = &self.flash else {
            return Ok(None);
        };
        // Demotions leave the last free slots to reinsertions, which cannot evict.
        let reserve = if reinsertion {
            0
        } else {
            FLASH_REINSERT_RESERVE
        };
        for _ in 0..3 {
            {
                let mut lists = f.lists.lock();
                if lists.free.len() > reserve {
                    return Ok(lists.free.pop());
                }
            }
            // A reinsertion buffer is opened inside an eviction: never evict again from
            // there (it could recurse); the item is dropped instead.
            if reinsertion || !self.evict_flash_one(true)? {
                break;
            }
        }
        Ok(f.lists.lock().free.pop())
    }

    /// Appends a copy of `item` to the flash tier's demotion (or reinsertion) buffer,
    /// writing the full buffer to flash and opening a new one when it has no room.
    /// Returns the copy, PENDING, or `None` when the write budget refused it or no buffer
    /// could take it (either counted in the tier's stats).
    pub(super) fn copy_to_flash(
        &self,
        item: &ItemRef<'_>,
        cas: u64,
        now: u32,
        expires_at: u32,
        reinsertion: bool,
    ) -> Result<Option<(Arc<Buffer>, Location)>, CacheError> {
        let Some(f) = &self.flash else {
            return Ok(None);
        };
        let spec = ItemSpec {
            origin_cas: Some(cas),
            expires_at,
            ..item.spec()
        };
        if !f.admit(spec.encoded_len()) {
            return Ok(None);
        }
        // Small items go to the small-item log (with sets). The movers keep it below its
        // cap; past the slack (movers behind) the demotion moves its oldest segment into
        // the sets itself, before the buffer is locked.
        let small = self.goes_to_sets(spec.encoded_len());
        if small && !reinsertion {
            while f.lists.lock().small_fifo.len() >= f.small_log_cap + SMALL_LOG_SLACK {
                if !self.evict_small_one()? {
                    break;
                }
            }
        }
        // Reinsertions of small items go with the large ones: the reinsertion buffer is
        // the one buffer never held across an eviction (which may move small-log items
        // and reinsert them), so no eviction waits on a buffer its own thread holds.
        let set = match (small, reinsertion) {
            (_, true) => &f.reinsert,
            (true, false) => &f.small,
            (false, false) => &f.demote,
        };
        let mut open = set.lock();
        for _ in 0..2 {
            if let Some(buf) = open.as_ref() {
                if let Some(offset) = f.append(buf, &spec, item.key, item.value)? {
                    let loc = Location {
                        segment: f.base + buf.slot,
                        offset,
                    };
                    return Ok(Some((Arc::clone(buf), loc)));
                }
            }
            if let Some(full) = open.take() {
                self.write_flash_buffer(&full);
            }
            let Some(slot) = self.flash_slot_for_buffer(reinsertion)? else {
                break;
            };
            // Segments expire never: the items carry their own expiry. The TTL bucket
            // field marks the small-item log.
            let bucket = if small && !reinsertion {
                SMALL_LOG_BUCKET
            } else {
                0
            };
            let header = self.next_header(f.tier, slot, 0, bucket, now)?;
            let m = &self.meta[(f.base + slot) as usize];
            m.write_seq.store(header.write_seq, Ordering::Release);
            m.expires_at.store(0, Ordering::Release);
            m.dead_bytes.store(0, Ordering::Relaxed);
            *open = Some(f.open_buffer(header)?);
        }
        f.counters.refused_no_room.fetch_add(1, Ordering::Relaxed);
        Ok(None)
    }

    /// Writes a full (or, at shutdown, partial) buffer to flash; if the write fails its
    /// items lose their entries (evicted, counted) and its slot is retired and freed.
    pub(super) fn write_flash_buffer(&self, buf: &Arc<Buffer>) {
        let Some(f) = &self.flash else {
            return;
        };
        if f.write_buffer(buf).is_ok() {
            return;
        }
        let id = f.base + buf.slot;
        let dropped = self.drop_entries_into(id, buf);
        f.stats.items_evicted.fetch_add(dropped, Ordering::Relaxed);
        f.abandon(buf.slot);
    }

    /// Removes every entry into segment `id` whose item is in `buf` (its bytes); returns
    /// how many.
    fn drop_entries_into(&self, id: u32, buf: &Buffer) -> u64 {
        let offsets: Vec<(u64, u32)> = buf.with_bytes(|bytes| {
            let Ok(reader) = SegmentReader::open(bytes) else {
                return Vec::new();
            };
            reader
                .items()
                .filter(|i| i.state == ItemState::Live)
                .map(|i| (self.index.hash_key(i.key), i.offset))
                .collect()
        });
        let mut dropped = 0;
        for (hash, offset) in offsets {
            if self.index.remove(
                hash,
                Location {
                    segment: id,
                    offset,
                },
            ) {
                dropped += 1;
            }
        }
        dropped
    }

    /// Publishes a flash copy in place of the item at `loc` (see the module docs); `src`
    /// is the source's pin when it is in a memory tier (killed once the entry moved).
    pub(super) fn publish_flash_copy(
        &self,
        g: &mut crate::index::BucketGuard<'_>,
        src: Option<&Pin<'_>>,
        loc: Location,
        (buf, dloc): (&Buffer, Location),
        frequency: Freq,
    ) -> Result<bool, CacheError> {
        let Some(f) = &self.flash else {
            return Ok(false);
        };
        let present = g.candidates().any(|l| l == loc);
        let live = src.is_none_or(|p| p.item_state(loc.offset) == Some(ItemState::Live));
        if !(present && live) {
            f.finish_copy(buf, dloc.offset, false);
            return Ok(false);
        }
        if !f.finish_copy(buf, dloc.offset, true) {
            return Ok(false);
        }
        g.repoint(loc, dloc, frequency);
        if let Some(p) = src {
            self.kill(p, loc)?;
        }
        Ok(true)
    }

    /// Evicts one flash segment (a dead-heavy one first, else the oldest): reads it back,
    /// retires it, reinserts its items with hits (if `reinsert`) and drops the rest.
    /// Returns whether there was one to evict.
    pub(super) fn evict_flash_one(&self, reinsert: bool) -> Result<bool, CacheError> {
        let Some(f) = &self.flash else {
            return Ok(false);
        };
        let now = self.now();
        let victim = {
            let mut lists = f.lists.lock();
            let expired = f.expired_in(&mut lists, now);
            let dead_heavy = || {
                lists.fifo.iter().take(DEAD_FIRST_WINDOW).position(|&slot| {
                    let (items, dead) = f.occupancy(slot);
                    items > 0 && dead * DEAD_FIRST.1 >= items * DEAD_FIRST.0
                })
            };
            match expired.or_else(dead_heavy) {
                Some(at) => lists.fifo.remove(at),
                None => lists.fifo.pop_front(),
            }
            // No large segment stored: the small-item log's oldest goes.
            .or_else(|| lists.small_fifo.pop_front())
        };
        let Some(slot) = victim else {
            return Ok(false);
        };
        self.evict_flash_slot(slot, reinsert)
    }

    /// Evicts the oldest segment of the small-item log into the sets; whether there was
    /// one.
    fn evict_small_one(&self) -> Result<bool, CacheError> {
        let Some(f) = &self.flash else {
            return Ok(false);
        };
        let Some(slot) = f.lists.lock().small_fifo.pop_front() else {
            return Ok(false);
        };
        self.evict_flash_slot(slot, true)
    }

    /// Evicts the stored segment of `slot`, taken off its queue: reads it back, retires
    /// it, then moves its items into sets (a segment of the small-item log) or reinserts
    /// those with hits (if `reinsert`) and drops the rest.
    fn evict_flash_slot(&self, slot: u32, reinsert: bool) -> Result<bool, CacheError> {
        let Some(f) = &self.flash else {
            return Ok(false);
        };
        let small = f.is_small_log(slot);
        let now = self.now();
        let id = f.base + slot;
        let data = match f.begin_evict(slot) {
            Ok(Some(d)) => d,
            Ok(None) => return Ok(true),
            Err(e) => {
                // Not retired: its items may still be read from flash; it is put back.
                let mut lists = f.lists.lock();
                if small {
                    lists.small_fifo.push_front(slot);
                } else {
                    lists.fifo.push_front(slot);
                }
                return Err(e.into());
            }
        };
        if small {
            self.move_into_sets(id, &data, reinsert)?;
            self.sweep_unwalked(id, &data);
            f.stats.segments_evicted.fetch_add(1, Ordering::Relaxed);
            f.free(slot);
            return Ok(true);
        }
        let counters = &f.stats;
        let mut budget = if reinsert {
            ((1usize << self.shift) - HEADER_LEN) / FLASH_REINSERT_BUDGET.1
                * FLASH_REINSERT_BUDGET.0
        } else {
            0
        };
        // The live items, and whether the walk reached the committed end.
        let (items, whole) = data.with_bytes(|bytes| match SegmentReader::open(bytes) {
            Ok(reader) => {
                let mut walked = HEADER_LEN as u64;
                let live = reader
                    .items()
                    .inspect(|i| walked = u64::from(i.end()))
                    .filter(|i| i.state == ItemState::Live)
                    .map(|i| OwnedItem::from_ref(&i))
                    .collect::<Vec<_>>();
                (live, walked >= reader.committed_end())
            }
            Err(_) => (Vec::new(), false),
        });
        for owned in &items {
            let item = owned.item();
            let hash = self.index.hash_key(item.key);
            let loc = Location {
                segment: id,
                offset: item.offset,
            };
            let expires_at = self.item_expiry(id, &item);
            let expired = super::past(expires_at, now);
            let hits = if expired {
                None
            } else {
                self.entry_hits(hash, loc)
            };
            if hits.is_none() {
                // Unindexed: perhaps a promoted item's replica, which goes with its segment.
                self.forget_replica_at(hash, loc);
            }
            let copy = match hits {
                Some((freq, _)) if freq > 0 && budget >= item.len as usize => {
                    budget -= item.len as usize;
                    let cas = self.cas_of(id, &item);
                    self.copy_to_flash(&item, cas, now, expires_at, true)?
                }
                _ => None,
            };
            let mut g = self.index.lock(hash);
            let moved = match &copy {
                Some((buf, dloc)) => {
                    self.publish_flash_copy(&mut g, None, loc, (buf, *dloc), Freq::Spend)?
                }
                None => false,
            };
            if moved {
                counters.reinserted.fetch_add(1, Ordering::Relaxed);
            } else if g.remove(loc) {
                if expired {
                    counters.items_expired.fetch_add(1, Ordering::Relaxed);
                } else {
                    counters.items_evicted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if !whole {
            self.sweep_segment(id);
        }
        counters.segments_evicted.fetch_add(1, Ordering::Relaxed);
        f.free(slot);
        Ok(true)
    }

    /// Removes every entry into segment `id` if its bytes (`data`) do not walk whole to
    /// their committed end.
    fn sweep_unwalked(&self, id: u32, data: &Buffer) {
        let whole = data.with_bytes(|bytes| {
            SegmentReader::open(bytes).is_ok_and(|reader| {
                let walked = reader
                    .items()
                    .last()
                    .map_or(HEADER_LEN as u64, |i| u64::from(i.end()));
                walked >= reader.committed_end()
            })
        });
        if !whole {
            self.sweep_segment(id);
        }
    }

    /// Removes every entry into segment `id`: unreadable or damaged, the walk of its
    /// eviction could not see every entry into it (E1).
    fn sweep_segment(&self, id: u32) {
        self.index.sweep(0..self.index.bucket_count(), |l, _| {
            if l.segment == id {
                Sweep::Remove
            } else {
                Sweep::Keep
            }
        });
    }

    /// The movers' flash work: free the segments whose items have all expired, keep
    /// [`FLASH_FREE_TARGET`] segments free, and the small-item log below its cap.
    pub(super) fn maintain_flash(&self) -> Result<usize, CacheError> {
        let Some(f) = &self.flash else {
            return Ok(0);
        };
        let mut evicted = 0;
        let now = self.now();
        let expired = |f: &FlashTier| f.expired_in(&mut f.lists.lock(), now).is_some();
        while f.lists.lock().free.len() < FLASH_FREE_TARGET || expired(f) {
            if !self.evict_flash_one(true)? {
                break;
            }
            f.stats.background_evictions.fetch_add(1, Ordering::Relaxed);
            evicted += 1;
        }
        // Moving a small-log segment into sets takes a read per log peer and a page read
        // and write per set: here, off the writers' path.
        while f.lists.lock().small_fifo.len() >= f.small_log_cap {
            if !self.evict_small_one()? {
                break;
            }
            f.stats.background_evictions.fetch_add(1, Ordering::Relaxed);
            evicted += 1;
        }
        Ok(evicted)
    }

    /// Writes the open flash buffers (a clean shutdown, or a test that wants every
    /// demoted item on flash).
    pub fn flush_flash(&self) {
        let Some(f) = &self.flash else {
            return;
        };
        for set in [&f.demote, &f.reinsert, &f.small] {
            let buf = set.lock().take();
            if let Some(buf) = buf {
                self.write_flash_buffer(&buf);
            }
        }
    }

    /// The flash tier's stats, with `items` indexed items on it.
    pub(super) fn flash_tier_stats(&self, items: u64) -> crate::tier::TierStats {
        let Some(f) = &self.flash else {
            return crate::tier::TierStats::default();
        };
        let c = &f.stats;
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let (free, stored) = f.segment_counts();
        let (live_bytes, dead_bytes) = f.item_bytes();
        crate::tier::TierStats {
            segments: f.count,
            free_segments: free,
            sealed_segments: stored,
            items: items + f.sets().map_or(0, |s| s.items()),
            live_bytes,
            dead_bytes,
            hits: l(&c.hits),
            segments_evicted: l(&c.segments_evicted),
            items_evicted: l(&c.items_evicted),
            items_expired: l(&c.items_expired),
            demotions_in: l(&c.demotions_in),
            promotions_in: 0,
            reinserted: l(&c.reinserted),
            inline_evictions: l(&c.inline_evictions),
            background_evictions: l(&c.background_evictions),
            // Segments and the kill log reach the disk by a clean stop's sync (a tier
            // after an unclean stop and a reboot is retired, `bootmark`); on tmpfs, only
            // a process crash is survived.
            durability: Some(if f.is_emulated() {
                terrace_media::Durability::Process
            } else {
                terrace_media::Durability::Power
            }),
            flushed_at_shutdown: !f.is_emulated(),
            flash: Some(crate::tier::FlashStats {
                replicas: self.replicas.len() as u64,
                ..f.flash_stats()
            }),
            ..crate::tier::TierStats::default()
        }
    }

    /// After a restart: each stored flash segment's item count is its indexed items plus
    /// its dead ones (what the choice of dead-heavy segments compares).
    pub(super) fn count_flash_items(&self, f: &FlashTier) {
        let mut live = vec![0u32; f.count as usize];
        self.index.for_each_location(|loc| {
            if let Some(slot) = f.slot_of(loc.segment) {
                live[slot as usize] += 1;
            }
        });
        for (slot, n) in live.into_iter().enumerate() {
            f.set_live(slot as u32, n);
        }
    }
}

/// Slot headers a restart reads at once (4 KiB each).
const HEADER_BATCH: u32 = 256;

/// The restart of a flash tier: what [`scan_flash`] takes from the rest of `Cache::open`.
pub(super) struct FlashScan<'a> {
    pub index: &'a Index,
    pub meta: &'a [SegMeta],
    pub saved: Option<&'a Saved>,
    pub found: &'a mut Vec<Found>,
    pub from_saved: &'a mut [bool],
    pub max_seq: &'a mut u64,
    pub report: &'a mut RestartReport,
    pub now: u32,
}

/// Restart of a reopened flash file: every slot's header is read; a segment the saved
/// index of a clean shutdown recorded as this incarnation is taken as it is (its entries
/// are in the index); any other whole, checksummed segment is read and its LIVE items
/// that no kill record names are collected in `found`. Segments are queued oldest write
/// sequence first. With `untrusted` (a system restart since an unclean stop: the kill
/// log may have lost records that reached the disk later than the segments they name)
/// every segment is retired instead.
pub(super) fn scan_flash(
    f: &FlashTier,
    scan: FlashScan<'_>,
    untrusted: bool,
) -> Result<(), CacheError> {
    let kills = f.kills()?;
    // Oldest write sequence first (the FIFO's order).
    let mut kept: Vec<(RestoredSlot, u32)> = Vec::new();
    let mut heads = std::collections::VecDeque::new();
    for slot in 0..f.count {
        let id = f.base + slot;
        if heads.is_empty() {
            let batch = slot..slot.saturating_add(HEADER_BATCH).min(f.count);
            heads.extend(f.read_headers(batch)?);
        }
        let Some(head) = heads.pop_front() else {
            break;
        };
        let Ok(reader) = SegmentReader::open(&head) else {
            continue;
        };
        let header = *reader.header();
        *scan.max_seq = (*scan.max_seq).max(header.write_seq);
        if untrusted {
            f.retire_found(slot)?;
            scan.report.untrusted_after_reboot += 1;
            continue;
        }
        if header.slot != slot || header.tier as usize != f.tier || header.size_shift != f.shift {
            scan.report.dropped.push((
                f.tier,
                slot,
                DropReason::Misplaced {
                    slot: header.slot,
                    tier: header.tier,
                    size_shift: header.size_shift,
                },
            ));
            f.retire_found(slot)?;
            continue;
        }
        if reader.is_retired() || reader.commit().committed == 0 {
            continue;
        }
        let end = reader.committed_end() as u32;
        let saved = scan.saved.and_then(|s| s.segment(id, header.write_seq));
        if let Some(SavedSegment::Indexed { dead_bytes }) = saved {
            scan.from_saved[id as usize] = true;
            scan.report.from_saved_index += 1;
            // For flash segments the saved record's dead count is of items. Its items
            // are not read, so their expiry is not known.
            kept.push((
                RestoredSlot {
                    write_seq: header.write_seq,
                    end,
                    items: 0,
                    dead: dead_bytes,
                    latest_expiry: NEVER,
                    small: header.ttl_bucket == SMALL_LOG_BUCKET,
                },
                slot,
            ));
            continue;
        }
        let Some(bytes) = f.read_segment(slot)? else {
            continue;
        };
        let Ok(reader) = SegmentReader::open(&bytes) else {
            continue;
        };
        let scan_end = reader.verify();
        if !scan_end.is_complete() {
            scan.report
                .dropped
                .push((f.tier, slot, DropReason::Scan(scan_end)));
            f.retire_found(slot)?;
            continue;
        }
        let (mut items, mut dead, mut latest_expiry) = (0u32, 0u32, 0u32);
        let listed: Option<Vec<u32>> = match saved {
            Some(SavedSegment::Items(offsets)) => Some(offsets.iter().map(|&(o, _)| o).collect()),
            _ => None,
        };
        for item in reader.items() {
            items += 1;
            let killed = kills.contains(&(slot, item.offset, header.write_seq));
            let expired = item.expires_at != 0 && super::past(item.expires_at, scan.now);
            let unlisted = listed.as_ref().is_some_and(|l| !l.contains(&item.offset));
            if item.state != ItemState::Live || killed || expired || unlisted {
                dead += 1;
                continue;
            }
            latest_expiry = latest_expiry.max(expiry_bound(item.expires_at));
            scan.found.push(Found {
                hash: scan.index.hash_key(item.key),
                loc: Location {
                    segment: id,
                    offset: item.offset,
                },
                frequency: 0,
            });
        }
        scan.from_saved[id as usize] = listed.is_some();
        scan.report.scanned += 1;
        kept.push((
            RestoredSlot {
                write_seq: header.write_seq,
                end,
                items,
                dead,
                latest_expiry,
                small: header.ttl_bucket == SMALL_LOG_BUCKET,
            },
            slot,
        ));
    }
    kept.sort_unstable();
    for (stored, slot) in kept {
        let m = &scan.meta[(f.base + slot) as usize];
        m.write_seq.store(stored.write_seq, Ordering::Relaxed);
        m.expires_at.store(0, Ordering::Relaxed);
        m.dead_bytes.store(stored.dead, Ordering::Relaxed);
        f.restore(slot, stored);
        scan.report.segments += 1;
    }
    Ok(())
}

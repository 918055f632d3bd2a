//! The restart scan: reopened file tiers are walked segment by segment (single-threaded,
//! before the cache is shared), their LIVE items collected and indexed. What it trusts
//! and drops is argued in `docs/cache-format.md` ("What a crash can leave"); in short, only
//! segments whose header validates, that belong at their slot, scan clean up to their
//! commit word and have not expired contribute items, and a key with two LIVE items gets
//! neither.
//!
//! Invariant on return: every indexed item is the only LIVE item of its key on any file
//! tier, in a `Sealed` segment listed in its tier's queue — the main queue in the last
//! tier, the FIFO in others — oldest write sequence first, with its dead bytes counted;
//! every other slot is `Free` and in the free list.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::saved::Saved;
use super::{Cache, SegMeta};
use crate::error::{CacheError, HeaderError};
use crate::index::Location;
use crate::item::{self, ItemState};
use crate::mem::{SegState, SegmentArea};
use crate::segment::{self, SegmentHeader, SegmentReader};

/// Why a segment found at restart was not trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DropReason {
    Header(HeaderError),
    /// The header names another slot, tier or segment size.
    Misplaced {
        slot: u32,
        tier: u8,
        size_shift: u8,
    },
    Scan(segment::ScanEnd),
}

/// What [`Cache::open`] found in the tiers it reopened: what it kept (from the saved
/// index or by scanning), what it dropped and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestartReport {
    /// Segments whose items were kept.
    pub segments: usize,
    /// Items indexed.
    pub items: usize,
    /// Segments skipped because every item in them had expired.
    pub expired_segments: usize,
    /// Segments dropped, as (tier, slot, why).
    pub dropped: Vec<(usize, u32, DropReason)>,
    /// Keys with more than one LIVE item (never produced by the protocol): all dropped.
    pub conflicts: usize,
    /// LIVE items not indexed because both buckets were full.
    pub index_full: usize,
    /// Segments restored from the saved index of a clean shutdown (not scanned).
    pub from_saved_index: usize,
    /// Segments of page-cache tiers left unscanned and wiped because the system restarted
    /// since they were written without a clean shutdown (`crate::bootmark`).
    pub untrusted_after_reboot: usize,
}

/// The longest chain of moves a restart tries to free a slot for an item (see
/// `Cache::make_room_before_sharing`).
const ROOM_SEARCH_DEPTH: usize = 4;
/// The most entries that search looks at for one item.
const ROOM_SEARCH_VISITS: usize = 4096;
/// The entries all of a restart's searches may look at together, per item recovered: an
/// index smaller than the one that placed the items (a smaller configuration) cannot
/// hold them all, and searching for each one that does not fit would make the restart
/// take hours instead of dropping them.
const ROOM_SEARCH_VISITS_PER_ITEM: usize = 16;

impl Cache {
    /// Zeroes the header of every written segment of a reopened tier (so no later scan
    /// can find their items) and flushes the tier; returns how many there were.
    pub(super) fn wipe_tier(area: &mut SegmentArea) -> Result<usize, CacheError> {
        let mut wiped = 0;
        for slot in 0..area.count() {
            if area.clear_header(slot) {
                wiped += 1;
            }
        }
        area.region().sync()?;
        Ok(wiped)
    }

    /// Scans one reopened file tier (single-threaded, `&mut` area): validates headers,
    /// collects the LIVE items of segments that scan clean and have not expired.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scan_tier(
        t: usize,
        area: &mut SegmentArea,
        base: u32,
        shift: u8,
        now: u32,
        meta: &[SegMeta],
        live: &mut HashMap<Vec<u8>, Vec<(Location, u8)>>,
        kept: &mut Vec<(u64, u32)>,
        max_seq: &mut u64,
        report: &mut RestartReport,
        saved: Option<&Saved>,
    ) -> Result<(), CacheError> {
        for slot in 0..area.count() {
            let Some(bytes) = area.exclusive(slot) else {
                continue;
            };
            let reader = match SegmentReader::open(bytes) {
                Ok(r) => r,
                Err(HeaderError::Unwritten) => continue,
                Err(e) => {
                    report.dropped.push((t, slot, DropReason::Header(e)));
                    continue;
                }
            };
            let header = *reader.header();
            if header.slot != slot || header.tier as usize != t || header.size_shift != shift {
                report.dropped.push((
                    t,
                    slot,
                    DropReason::Misplaced {
                        slot: header.slot,
                        tier: header.tier,
                        size_shift: header.size_shift,
                    },
                ));
                continue;
            }
            *max_seq = (*max_seq).max(header.write_seq);
            if reader.is_retired() || reader.commit().committed == 0 {
                continue;
            }
            if super::past(header.expires_at, now) {
                report.expired_segments += 1;
                continue;
            }
            let id = base + slot;
            if let Some(offsets) = saved.and_then(|s| s.offsets_for(id, header.write_seq)) {
                // Clean shutdown: the saved items only, no checksum pass (see `saved`).
                let end = reader.committed_end() as usize;
                let mut live_bytes = 0u32;
                for &(offset, frequency) in offsets
                    .iter()
                    .filter(|&&(o, _)| o as usize >= segment::HEADER_LEN)
                {
                    match item::decode(bytes, offset, end) {
                        Ok(i) if i.state == ItemState::Live => {
                            live_bytes = live_bytes.saturating_add(i.len);
                            let loc = Location {
                                segment: id,
                                offset,
                            };
                            live.entry(i.key.to_vec())
                                .or_default()
                                .push((loc, frequency));
                        }
                        _ => {}
                    }
                }
                report.from_saved_index += 1;
                let dead = reader.commit().committed.saturating_sub(live_bytes);
                Self::keep_segment(area, slot, &header, &meta[id as usize], dead, kept, report);
                continue;
            }
            let end = reader.verify();
            if !end.is_complete() {
                report.dropped.push((t, slot, DropReason::Scan(end)));
                if segment::retire(bytes) {
                    area.persist_exclusive(slot, segment::COMMIT_WORD_OFFSET, 8)?;
                }
                continue;
            }
            let mut dead = 0u32;
            for item in reader.items() {
                if item.state != ItemState::Live {
                    dead = dead.saturating_add(item.len);
                    continue;
                }
                let loc = Location {
                    segment: id,
                    offset: item.offset,
                };
                live.entry(item.key.to_vec()).or_default().push((loc, 0));
            }
            Self::keep_segment(area, slot, &header, &meta[id as usize], dead, kept, report);
        }
        Ok(())
    }

    /// Records a segment whose items are kept: `Sealed`, queued by write sequence,
    /// with `dead` bytes of items that are not LIVE.
    fn keep_segment(
        area: &mut SegmentArea,
        slot: u32,
        header: &SegmentHeader,
        m: &SegMeta,
        dead: u32,
        kept: &mut Vec<(u64, u32)>,
        report: &mut RestartReport,
    ) {
        m.write_seq.store(header.write_seq, Ordering::Relaxed);
        m.expires_at.store(header.expires_at, Ordering::Relaxed);
        m.dead_bytes.store(dead, Ordering::Relaxed);
        area.set_state_exclusive(slot, SegState::Sealed);
        kept.push((header.write_seq, slot));
        report.segments += 1;
    }

    /// Indexes the items the scan found (single-threaded: no reader exists yet).
    /// Both of `hash`'s buckets are full: frees a slot in one of them by moving entries
    /// to their other buckets along the shortest chain (at most [`ROOM_SEARCH_DEPTH`]
    /// moves, cuckoo hashing's breadth-first search) that ends in a bucket with room. The
    /// running cache had placed every item, in another order; the rebuild's order can
    /// fill a pair of buckets that it did not. Returns whether a slot was freed.
    /// `budget` is what all searches may still look at; each look spends one.
    fn make_room_before_sharing(&mut self, hash: u64, budget: &mut usize) -> bool {
        let (b1, b2) = self.index.buckets_of(hash);
        let mut queue: std::collections::VecDeque<(usize, Vec<(u64, Location)>)> =
            [(b1, Vec::new()), (b2, Vec::new())].into();
        // A bucket is searched once (the first, shortest, chain to it is the one kept).
        let mut seen: std::collections::HashSet<usize> = [b1, b2].into();
        let mut visits = 0;
        while let Some((bucket, path)) = queue.pop_front() {
            for loc in self.index.bucket_locations(bucket) {
                visits += 1;
                if visits > ROOM_SEARCH_VISITS || *budget == 0 {
                    return false;
                }
                *budget -= 1;
                let Some(its_hash) = self.key_hash_at(loc) else {
                    continue;
                };
                let (a, b) = self.index.buckets_of(its_hash);
                let other = if a == bucket { b } else { a };
                if other == bucket {
                    continue;
                }
                let mut chain = path.clone();
                chain.push((its_hash, loc));
                if self.index.bucket_has_room(other) {
                    // Last move first: each frees the slot the one before it moves into.
                    return chain
                        .iter()
                        .rev()
                        .all(|&(h, l)| self.index.relocate_before_sharing(h, l));
                }
                if chain.len() < ROOM_SEARCH_DEPTH && seen.insert(other) {
                    queue.push_back((other, chain));
                }
            }
        }
        false
    }

    /// The index hash of the key of the item at `loc` (a restart: segments are sealed).
    fn key_hash_at(&self, loc: Location) -> Option<u64> {
        let (t, slot) = self.locate(loc.segment)?;
        let pin = self.tiers[t].area.pin(slot)?;
        let item = pin.indexed_item(loc.offset).ok()?;
        Some(self.index.hash_key(item.key))
    }

    pub(super) fn index_recovered(
        &mut self,
        live: HashMap<Vec<u8>, Vec<(Location, u8)>>,
        report: &mut RestartReport,
    ) -> Result<(), CacheError> {
        let mut budget = live
            .len()
            .saturating_mul(ROOM_SEARCH_VISITS_PER_ITEM)
            .max(ROOM_SEARCH_VISITS);
        for (key, locs) in live {
            let keep = match locs.as_slice() {
                &[(one, frequency)] => {
                    let hash = self.index.hash_key(&key);
                    let inserted = self.index.lock(hash).insert(one).is_ok()
                        || (self.make_room_before_sharing(hash, &mut budget)
                            && self.index.lock(hash).insert(one).is_ok());
                    if inserted {
                        // The hits it had before a clean shutdown (saved with the index).
                        if frequency > 0 {
                            self.index.lock(hash).set_frequency(one, frequency);
                        }
                        report.items += 1;
                        continue;
                    }
                    report.index_full += 1;
                    vec![one]
                }
                many => {
                    report.conflicts += 1;
                    many.iter().map(|&(loc, _)| loc).collect()
                }
            };
            for loc in keep {
                let Some((t, slot)) = self.locate(loc.segment) else {
                    continue;
                };
                if let Some(pin) = self.tiers[t].area.pin(slot) {
                    self.kill(&pin, loc)?;
                }
            }
        }
        Ok(())
    }
}

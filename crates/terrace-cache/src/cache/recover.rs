//! The restart scan: reopened tiers are walked segment by segment, on all cores, before
//! the cache is shared. After a clean shutdown the saved index already sits in the DRAM
//! index (`cache/saved.rs`) and only segment headers are read; otherwise every segment is
//! checked and its LIVE items collected and indexed. What it trusts and drops is argued
//! in `docs/cache-format.md` ("What a crash can leave"); in short, only segments whose
//! header validates, that belong at their slot, scan clean up to their commit word (or
//! were saved by a clean shutdown as this incarnation) and have not expired contribute
//! items, and a key with two LIVE items gets neither.
//!
//! Invariant on return: every indexed item is the only LIVE item of its key on any file
//! tier, in a `Sealed` segment listed in its tier's queue — the main queue in the last
//! tier, the FIFO in others — oldest write sequence first, with its dead bytes counted;
//! every other slot is `Free` and in the free list.

use std::sync::atomic::Ordering;

use super::saved::{Saved, SavedSegment};
use super::{Cache, SegMeta};
use crate::error::{CacheError, HeaderError};
use crate::index::{Index, Location, Sweep};
use crate::item::{self, ItemState};
use crate::mem::{SegState, SegmentArea};
use crate::parallel;
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
    /// Segments checked and walked item by item (no saved index covered them).
    pub scanned: usize,
    /// Items the saved index put back as it lay (part of `items`).
    pub loaded_from_saved_index: usize,
    /// How long [`Cache::open`] took, from its call until the index was complete.
    pub duration: std::time::Duration,
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

/// A LIVE item a scan found, to be indexed.
#[derive(Clone, Copy, Debug)]
pub(super) struct Found {
    pub hash: u64,
    pub loc: Location,
    /// Hits recorded for it before a clean shutdown.
    pub frequency: u8,
}

/// What the scan made of one slot.
enum Outcome {
    /// Nothing was ever written there, or nothing of it is kept (retired, empty).
    Nothing {
        write_seq: Option<u64>,
    },
    Dropped {
        reason: DropReason,
        retire: bool,
    },
    Expired {
        write_seq: u64,
    },
    Kept {
        header: SegmentHeader,
        dead: u32,
        items: Vec<Found>,
        from_saved: bool,
    },
}

/// Where an insertion of a found item ended.
enum Placed {
    Inserted,
    /// Another LIVE item of the same key is indexed.
    Conflict,
    /// Both buckets are full.
    Full,
}

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

    /// Scans one reopened tier on all cores (`&mut` area: nothing else reads it): validates
    /// headers; takes the segments a trusted saved index recorded as they are (their
    /// entries already loaded, or listed), marking them in `from_saved` (by segment id);
    /// checks the others up to their commit word and collects their LIVE items into
    /// `found`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn scan_tier(
        t: usize,
        area: &mut SegmentArea,
        base: u32,
        shift: u8,
        now: u32,
        meta: &[SegMeta],
        index: &Index,
        found: &mut Vec<Found>,
        kept: &mut Vec<(u64, u32)>,
        from_saved: &mut [bool],
        max_seq: &mut u64,
        report: &mut RestartReport,
        saved: Option<&Saved>,
    ) -> Result<(), CacheError> {
        // Which segments to read. After a clean shutdown whose table was loaded, the saved
        // ones only: the saved entries are every LIVE item (E2 at shutdown, and nothing
        // ran since), so the others hold none — the same trust that reads no item of a
        // saved segment. Otherwise, segments wholly in holes of a tier file were never
        // written (or were given back) and read as zero: not read either (each would
        // fault in a page of a large, mostly empty tier).
        let written: Vec<bool> = match saved.filter(|s| s.is_loaded()) {
            Some(s) => (0..area.count())
                .map(|slot| s.is_saved(base + slot))
                .collect(),
            None => Self::possibly_written(area),
        };
        // On a disk, every header read would wait for its own page: ask for them all at
        // once, so the kernel reads them with a deep queue.
        let page_cached = area.region().is_page_cached();
        for slot in (0..area.count()).filter(|&s| written[s as usize]) {
            area.will_need(slot, 0, segment::HEADER_LEN);
        }
        let slots: Vec<(u32, &mut [u8])> = area
            .all_exclusive()
            .into_iter()
            .enumerate()
            .filter(|&(slot, _)| written[slot])
            .map(|(slot, bytes)| (slot as u32, bytes))
            .collect();
        // Without a saved index every written segment is read whole: each thread asks for
        // its next segment while it checks this one.
        let read_ahead = saved.is_none() && page_cached;
        let outcomes = parallel::map_parts_on(parallel::fault_workers(), slots, |part| {
            let mut outcomes = Vec::with_capacity(part.len());
            let mut part = part.into_iter().peekable();
            while let Some((slot, bytes)) = part.next() {
                if let Some((_, next)) = part.peek().filter(|_| read_ahead) {
                    terrace_media::os::will_need(next.as_ptr(), next.len());
                }
                let outcome =
                    Self::scan_segment(t, slot, base + slot, bytes, shift, now, index, saved);
                outcomes.push((slot, outcome));
            }
            outcomes
        });
        let mut outcomes: Vec<(u32, Outcome)> = outcomes.into_iter().flatten().collect();
        outcomes.sort_unstable_by_key(|&(slot, _)| slot);
        for (slot, outcome) in outcomes {
            let id = base + slot;
            let seq = match &outcome {
                Outcome::Nothing { write_seq } => *write_seq,
                Outcome::Expired { write_seq } => Some(*write_seq),
                Outcome::Kept { header, .. } => Some(header.write_seq),
                Outcome::Dropped { .. } => None,
            };
            if let Some(seq) = seq {
                *max_seq = (*max_seq).max(seq);
            }
            match outcome {
                Outcome::Nothing { .. } => {}
                Outcome::Expired { .. } => report.expired_segments += 1,
                Outcome::Dropped { reason, retire } => {
                    report.dropped.push((t, slot, reason));
                    if retire {
                        area.persist_exclusive(slot, segment::COMMIT_WORD_OFFSET, 8)?;
                    }
                }
                Outcome::Kept {
                    header,
                    dead,
                    items,
                    from_saved: saved_one,
                } => {
                    report.from_saved_index += usize::from(saved_one);
                    report.scanned += usize::from(!saved_one);
                    from_saved[id as usize] = saved_one;
                    found.extend(items);
                    let m = &meta[id as usize];
                    m.write_seq.store(header.write_seq, Ordering::Relaxed);
                    m.expires_at.store(header.expires_at, Ordering::Relaxed);
                    m.dead_bytes.store(dead, Ordering::Relaxed);
                    area.set_state_exclusive(slot, SegState::Sealed);
                    kept.push((header.write_seq, slot));
                    report.segments += 1;
                }
            }
        }
        Ok(())
    }

    /// Per slot of `area`: whether its segment may hold anything (not wholly inside a
    /// hole of the tier's file; every slot of memory that is not a file).
    fn possibly_written(area: &SegmentArea) -> Vec<bool> {
        let count = area.count() as usize;
        let Some(ranges) = area.region().data_ranges() else {
            return vec![true; count];
        };
        let size = area.segment_size();
        let mut written = vec![false; count];
        for r in ranges {
            let first = (r.start / size).min(count);
            let end = r.end.div_ceil(size).min(count);
            written[first..end].fill(true);
        }
        written
    }

    /// What one segment holds (one thread of the scan).
    #[allow(clippy::too_many_arguments)]
    fn scan_segment(
        t: usize,
        slot: u32,
        id: u32,
        bytes: &mut [u8],
        shift: u8,
        now: u32,
        index: &Index,
        saved: Option<&Saved>,
    ) -> Outcome {
        let reader = match SegmentReader::open(bytes) {
            Ok(r) => r,
            Err(HeaderError::Unwritten) => return Outcome::Nothing { write_seq: None },
            Err(e) => {
                return Outcome::Dropped {
                    reason: DropReason::Header(e),
                    retire: false,
                }
            }
        };
        let header = *reader.header();
        if header.slot != slot || header.tier as usize != t || header.size_shift != shift {
            return Outcome::Dropped {
                reason: DropReason::Misplaced {
                    slot: header.slot,
                    tier: header.tier,
                    size_shift: header.size_shift,
                },
                retire: false,
            };
        }
        let write_seq = header.write_seq;
        if reader.is_retired() || reader.commit().committed == 0 {
            return Outcome::Nothing {
                write_seq: Some(write_seq),
            };
        }
        if super::past(header.expires_at, now) {
            return Outcome::Expired { write_seq };
        }
        let committed = reader.commit().committed;
        match saved.and_then(|s| s.segment(id, write_seq)) {
            Some(SavedSegment::Indexed { dead_bytes }) => {
                // Clean shutdown, table loaded: the header is all there is to read.
                return Outcome::Kept {
                    header,
                    dead: dead_bytes.min(committed),
                    items: Vec::new(),
                    from_saved: true,
                };
            }
            Some(SavedSegment::Items(offsets)) => {
                // Clean shutdown, another geometry: the saved items only, no checksum pass.
                let end = reader.committed_end() as usize;
                let mut live_bytes = 0u32;
                let mut items = Vec::with_capacity(offsets.len());
                for &(offset, frequency) in offsets
                    .iter()
                    .filter(|&&(o, _)| o as usize >= segment::HEADER_LEN)
                {
                    if let Ok(i) = item::decode(bytes, offset, end) {
                        if i.state == ItemState::Live {
                            live_bytes = live_bytes.saturating_add(i.len);
                            items.push(Found {
                                hash: index.hash_key(i.key),
                                loc: Location {
                                    segment: id,
                                    offset,
                                },
                                frequency,
                            });
                        }
                    }
                }
                return Outcome::Kept {
                    header,
                    dead: committed.saturating_sub(live_bytes),
                    items,
                    from_saved: true,
                };
            }
            None => {}
        }
        let end = reader.verify();
        if !end.is_complete() {
            return Outcome::Dropped {
                reason: DropReason::Scan(end),
                retire: segment::retire(bytes),
            };
        }
        let mut dead = 0u32;
        let mut items = Vec::new();
        for item in reader.items() {
            if item.state != ItemState::Live {
                dead = dead.saturating_add(item.len);
                continue;
            }
            items.push(Found {
                hash: index.hash_key(item.key),
                loc: Location {
                    segment: id,
                    offset: item.offset,
                },
                frequency: 0,
            });
        }
        Outcome::Kept {
            header,
            dead,
            items,
            from_saved: false,
        }
    }

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

    /// The key of the item at `loc` (a restart: segments are sealed), handed to `f`.
    fn with_key_at<R>(&self, loc: Location, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let (_, held) = self.hold(loc)?;
        Some(f(held.item_at(loc.offset)?.key))
    }

    /// The index hash of the key of the item at `loc` (a restart: segments are sealed).
    fn key_hash_at(&self, loc: Location) -> Option<u64> {
        self.with_key_at(loc, |key| self.index.hash_key(key))
    }

    /// Whether the items at `a` and `b` have the same key (false if either cannot be read).
    fn same_key(&self, a: Location, b: Location) -> bool {
        self.with_key_at(a, |key| self.with_key_at(b, |k| k == key))
            .flatten()
            .unwrap_or(false)
    }

    /// Indexes `f` unless another item of its key is indexed (compared by key at every
    /// candidate whose tag matches) or both its buckets are full.
    fn place_found(&self, f: &Found) -> Placed {
        let mut guard = self.index.lock(f.hash);
        if guard.candidates().any(|other| self.same_key(f.loc, other)) {
            return Placed::Conflict;
        }
        if guard.insert(f.loc).is_err() {
            return Placed::Full;
        }
        // The hits it had before a clean shutdown (saved with the index).
        if f.frequency > 0 {
            guard.set_frequency(f.loc, f.frequency);
        }
        Placed::Inserted
    }

    /// Kills the item at `loc` (a LIVE item the restart does not index).
    fn kill_found(&self, loc: Location) -> Result<(), CacheError> {
        self.kill_at(loc)
    }

    /// Removes the loaded entries of every segment the scan did not take from the saved
    /// index (`from_saved`, by segment id): a tier not reopened, a snapshot refused, a
    /// segment that failed its header checks or expired.
    pub(super) fn forget_unrestored(
        &mut self,
        saved: &Saved,
        from_saved: &[bool],
        report: &mut RestartReport,
    ) {
        let lost =
            |id: u32| saved.is_saved(id) && !from_saved.get(id as usize).copied().unwrap_or(false);
        if !saved.is_loaded() || !(0..from_saved.len() as u32).any(lost) {
            return;
        }
        let mut removed = 0;
        self.index.sweep(0..self.index.bucket_count(), |loc, _| {
            if lost(loc.segment) {
                removed += 1;
                Sweep::Remove
            } else {
                Sweep::Keep
            }
        });
        report.items = report.items.saturating_sub(removed);
        report.loaded_from_saved_index = report.loaded_from_saved_index.saturating_sub(removed);
    }

    /// Indexes the items the scan found, on all cores (no reader exists yet): first each
    /// where it fits; then, one at a time, those whose buckets were full; last, every key
    /// found twice loses all its items — only then, so that no copy inserted after the
    /// conflict was seen survives.
    pub(super) fn index_found(
        &mut self,
        found: Vec<Found>,
        report: &mut RestartReport,
    ) -> Result<(), CacheError> {
        let mut budget = found
            .len()
            .saturating_mul(ROOM_SEARCH_VISITS_PER_ITEM)
            .max(ROOM_SEARCH_VISITS);
        let this = &*self;
        let placed = parallel::map_parts(found, |part| {
            let mut left = (0usize, Vec::new(), Vec::new());
            // The buckets are scattered: fetch a few items ahead.
            const AHEAD: usize = 8;
            for (i, f) in part.iter().enumerate() {
                if let Some(next) = part.get(i + AHEAD) {
                    this.index.prefetch(next.hash);
                }
                match this.place_found(f) {
                    Placed::Inserted => left.0 += 1,
                    Placed::Conflict => left.1.push(*f),
                    Placed::Full => left.2.push(*f),
                }
            }
            left
        });
        let mut conflicts = Vec::new();
        let mut full = Vec::new();
        for (inserted, c, f) in placed {
            report.items += inserted;
            conflicts.extend(c);
            full.extend(f);
        }
        for f in full {
            let mut placed = self.place_found(&f);
            if matches!(placed, Placed::Full) && self.make_room_before_sharing(f.hash, &mut budget)
            {
                placed = self.place_found(&f);
            }
            match placed {
                Placed::Inserted => report.items += 1,
                Placed::Conflict => conflicts.push(f),
                Placed::Full => {
                    report.index_full += 1;
                    self.kill_found(f.loc)?;
                }
            }
        }
        for f in conflicts {
            let indexed: Vec<Location> = {
                let guard = self.index.lock(f.hash);
                guard
                    .candidates()
                    .filter(|&other| self.same_key(f.loc, other))
                    .collect()
            };
            for other in indexed {
                if self.index.remove(f.hash, other) {
                    report.items = report.items.saturating_sub(1);
                    report.conflicts += 1;
                }
                self.kill_found(other)?;
            }
            self.kill_found(f.loc)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::item::ItemState;
    use crate::{Cache, CacheConfig, TierConfig, TierSize};

    #[test]
    fn a_key_found_live_twice_after_a_crash_keeps_neither() {
        // A crash between a new item's LIVE flip and the old one's DEAD flip leaves two
        // LIVE items of a key; which is newer cannot be told, so neither may come back.
        let dir = tempfile::tempdir().unwrap();
        let config = || CacheConfig {
            segment_shift: Some(15),
            limits: crate::item::ItemLimits {
                max_key_len: 250,
                max_value_len: 8 << 10,
            },
            stripes: 1,
            ..CacheConfig::new(vec![TierConfig::file(dir.path(), TierSize::Bytes(1 << 20))])
        };
        {
            let (c, _) = Cache::open(config()).unwrap();
            c.set(b"a", b"one", 0, 0).unwrap();
            let hash = c.index.hash_key(b"a");
            let first = c.index.lookup(hash).next().unwrap().location();
            c.set(b"a", b"two", 0, 0).unwrap();
            c.set(b"b", b"other", 0, 0).unwrap();
            let (_, pin) = c.pin(first.segment).unwrap();
            assert!(pin.set_state(first.offset, ItemState::Live).unwrap());
        } // Dropped without a shutdown: a crash.
        let (c, report) = Cache::open(config()).unwrap();
        assert_eq!((report.conflicts, report.items), (1, 1), "{report:?}");
        assert!(c.get(b"a").unwrap().is_none());
        assert_eq!(c.get(b"b").unwrap().unwrap().value(), b"other");
        drop(c);
        // Both copies were killed on the media: they stay gone.
        let (c, report) = Cache::open(config()).unwrap();
        assert_eq!((report.conflicts, report.items), (0, 1), "{report:?}");
        assert!(c.get(b"a").unwrap().is_none());
    }
}

//! The engine's side of the flash tier's sets (`crate::flash::sets` owns the pages):
//! which small items reach them, how a key is found in its set, and how writes kill set
//! copies.
//!
//! # Policy (Kangaroo's)
//! With sets, a demoted item of at most [`FlashSetsConfig::max_item`] encoded bytes goes
//! to the small-item log: flash segments of their own, indexed as every flash item, at
//! most [`SMALL_LOG_SHARE`] of the tier. When the log is full its oldest segment is
//! evicted and its live items move into their sets — each together with the other log
//! items of its set, which the index finds in one bucket (`SetGeometry`): a set's page is
//! rewritten only when at least [`MOVE_THRESHOLD`] items go into it, so each 4 KiB write
//! carries several. An item that meets no other of its set is dropped, or reinserted
//! with the large items if it had a hit. A page keeps its newest items; older ones fall
//! off the end.
//!
//! A lookup that misses the index asks its set's filter, and on a "maybe" reads the page
//! (4 KiB). A hit is promoted into the first tier, leaving the set copy in place (the
//! same version). Every write or delete of a key whose set may hold it kills the set
//! copy (a kill-log record, `flash/sets.rs`), so a set never serves a version older
//! than the key's last write.
//!
//! # Crash safety, case by case
//! - A set copy is written before the log copy's entry is removed: a crash in between
//!   leaves both, of one version; the index's (recovered from the log) is read first.
//! - A log item moved into a set had its log copy killed (a record) before its entry went,
//!   unless its segment was the one evicted (retired before the move).
//! - A write that lands after a set copy was made kills it: through the filter, raised
//!   before the page write; or, when the write came before the filter was raised, the
//!   move finds the entry moved on and kills the copy itself.
//! - A page torn by a crash fails its checksum and holds nothing (misses).
//!
//! Lock order: a key's bucket lock, then a set stripe (never the reverse: a move reads
//! and rewrites a page under the stripe, then takes bucket locks with the stripe let
//! go).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use super::{past, Cache, Current, FoundEntry};
use crate::error::CacheError;
use crate::flash::{kill_hash, Buffer, FlashTier, OwnedItem, SetStore};
use crate::index::Location;
use crate::item::ItemState;
use crate::segment::SegmentReader;

/// How a cache puts small items into sets on its flash tier.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlashSetsConfig {
    /// The share of the flash tier's bytes the sets take (the rest is segments: the
    /// large items and the small-item log). Between 0.05 and 0.95.
    pub share: f64,
    /// The largest item (encoded: header, key and value) that goes to the sets.
    pub max_item: usize,
}

impl FlashSetsConfig {
    /// Sets taking `share` of flash, for items up to [`DEFAULT_SET_ITEM_MAX`].
    pub fn new(share: f64) -> FlashSetsConfig {
        FlashSetsConfig {
            share,
            max_item: DEFAULT_SET_ITEM_MAX,
        }
    }
}

/// The default [`FlashSetsConfig::max_item`]: a page of 4 KiB then holds at least a dozen.
pub const DEFAULT_SET_ITEM_MAX: usize = 320;

/// The share of the flash tier's bytes the small-item log may hold (Kangaroo's KLog: 5%).
pub(super) const SMALL_LOG_SHARE: (u64, u64) = (1, 20);

/// Items of one set that must move together for its page to be rewritten.
const MOVE_THRESHOLD: usize = 2;

/// Log items to move from one other small-log segment at which it is read whole rather
/// than item by item (each item read is a device round trip of two blocks).
const WHOLE_READ_PEERS: usize = 16;

/// The segment id of a set item's [`Location`] (its offset is the set). Never in the
/// index: a write that finds it inserts a new entry, a kill of it is the set kill every
/// write makes.
pub(super) const SET_SEGMENT: u32 = u32::MAX;

/// An item on its way into a set: its key's hash, where its log copy is, the copy.
struct Moving {
    hash: u64,
    loc: Location,
    item: OwnedItem,
}

impl Cache {
    /// The flash tier, its sets and the set of `hash`, if the cache has sets.
    fn set_of_hash(&self, hash: u64) -> Option<(&FlashTier, &SetStore, u32)> {
        let f = self.flash.as_ref()?;
        let s = f.sets()?;
        let (home, _) = self.index.buckets_of(hash);
        let set = s
            .geometry
            .set_of(home, self.index.layout().tag_of_hash(hash));
        Some((f, s, set))
    }

    /// Whether an item of `encoded_len` bytes goes to the small-item log (a cache has
    /// `sets_config` only with sets on its flash tier: `Cache::open`).
    pub(super) fn goes_to_sets(&self, encoded_len: usize) -> bool {
        self.sets_config.is_some_and(|c| encoded_len <= c.max_item)
    }

    /// The key's live, unexpired copy in its set: (set, copy). One page read when the
    /// set's filter may hold the key.
    pub(super) fn set_item(&self, key: &[u8], hash: u64, now: u32) -> Option<(u32, OwnedItem)> {
        let (f, s, set) = self.set_of_hash(hash)?;
        if !s.may_hold(set, hash) {
            return None;
        }
        // A page rewritten between the read and the check is read again.
        for _ in 0..4 {
            let page = f.staged_page(set).or_else(|| f.read_page(set))?;
            match s.killed(set, page.generation, hash) {
                None => continue,
                Some(true) => {
                    s.counters.page_misses.fetch_add(1, Ordering::Relaxed);
                    return None;
                }
                Some(false) => {}
            }
            let found = page.items.into_iter().find(|i| i.item().key == key);
            return match found {
                Some(i) if !past(i.item().expires_at, now) => Some((set, i)),
                _ => {
                    s.counters.page_misses.fetch_add(1, Ordering::Relaxed);
                    None
                }
            };
        }
        None
    }

    /// The set whose page a lookup of the key of `hash` (which has no index entry) would
    /// read from the device: its filter may hold the key and no page of it is staged.
    pub(super) fn set_to_read(&self, hash: u64) -> Option<u32> {
        let (f, s, set) = self.set_of_hash(hash)?;
        (s.may_hold(set, hash) && !f.page_staged(set)).then_some(set)
    }

    /// The key's set copy as the live item a write under its bucket lock finds.
    pub(super) fn set_entry(&self, key: &[u8], hash: u64, now: u32) -> FoundEntry {
        match self.set_item(key, hash, now) {
            Some((set, copy)) => {
                let i = copy.item();
                FoundEntry::Live(Current {
                    loc: Location {
                        segment: SET_SEGMENT,
                        offset: set,
                    },
                    cas: i.origin_cas.unwrap_or(0),
                    client_flags: i.client_flags,
                    expires_at: i.expires_at,
                })
            }
            None => FoundEntry::None,
        }
    }

    /// Kills the set copy of the key of `hash` if its set may hold one (the caller holds
    /// the key's bucket lock and has just written or deleted the key).
    pub(super) fn kill_set_copy(&self, hash: u64) -> Result<(), CacheError> {
        let Some((f, s, set)) = self.set_of_hash(hash) else {
            return Ok(());
        };
        if !s.may_hold(set, hash) {
            return Ok(());
        }
        let mut lock = s.lock(set);
        f.kill_in_set(&mut lock, hash)?;
        Ok(())
    }

    /// Moves the live items of the evicted small-log segment `id` (its bytes in `data`,
    /// retired on flash) into their sets, each with the other log items of its set; an
    /// item below the threshold is reinserted (with the large items) if it had a hit (with
    /// `reinsert`) and dropped otherwise.
    pub(super) fn move_into_sets(
        &self,
        id: u32,
        data: &Buffer,
        reinsert: bool,
    ) -> Result<(), CacheError> {
        let Some(f) = &self.flash else {
            return Ok(());
        };
        let Some(s) = f.sets() else {
            return Ok(());
        };
        let now = self.now();
        let own: Vec<OwnedItem> = data.with_bytes(|bytes| match SegmentReader::open(bytes) {
            Ok(reader) => reader
                .items()
                .filter(|i| i.state == ItemState::Live)
                .map(|i| OwnedItem::from_ref(&i))
                .collect(),
            Err(_) => Vec::new(),
        });
        let mut groups: HashMap<u32, Vec<Moving>> = HashMap::new();
        for item in own {
            let i = item.item();
            let hash = self.index.hash_key(i.key);
            let loc = Location {
                segment: id,
                offset: i.offset,
            };
            if self.entry_hits(hash, loc).is_none() {
                // Unindexed: perhaps a promoted item's replica, which goes with its segment.
                self.forget_replica_at(hash, loc);
                continue;
            }
            if past(i.expires_at, now) {
                if self.index.remove(hash, loc) {
                    f.stats.items_expired.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            if let Some((_, _, set)) = self.set_of_hash(hash) {
                groups
                    .entry(set)
                    .or_default()
                    .push(Moving { hash, loc, item });
            }
        }
        self.add_log_peers(f, id, now, &mut groups);
        for (set, group) in groups {
            if group.len() < MOVE_THRESHOLD {
                s.counters
                    .below_threshold
                    .fetch_add(group.len() as u64, Ordering::Relaxed);
                for m in group.iter().filter(|m| m.loc.segment == id) {
                    self.drop_or_reinsert(m, reinsert, now)?;
                }
                continue;
            }
            let moved = self.rewrite_set(f, s, set, &group, now)?;
            for (i, m) in group.iter().enumerate() {
                // Items past `moved` found no room in the page (or it could not be
                // written): evicted.
                let in_page = i < moved;
                let mut g = self.index.lock(m.hash);
                if g.remove(m.loc) {
                    if m.loc.segment != id {
                        self.kill_at(m.loc)?;
                    }
                    let counter = match in_page {
                        true => &s.counters.items_moved,
                        false => &f.stats.items_evicted,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                } else if in_page {
                    // Written or deleted since its copy was taken, perhaps before the
                    // filter knew the key: the set copy is stale.
                    self.kill_set_copy(m.hash)?;
                }
            }
        }
        Ok(())
    }

    /// Adds to `groups` (items of segment `id` by set) the other log items of their sets.
    /// Their entries are found in the sets' buckets (a matching tag, pointing into a
    /// stored small-log segment); each is read and checked to be of its set. A segment
    /// holding at least [`WHOLE_READ_PEERS`] of them is read whole, once (one sequential
    /// read instead of one per item).
    fn add_log_peers(
        &self,
        f: &FlashTier,
        id: u32,
        now: u32,
        groups: &mut HashMap<u32, Vec<Moving>>,
    ) {
        let Some(s) = f.sets() else {
            return;
        };
        // Candidates by segment: (offset, set).
        let mut by_segment: HashMap<u32, Vec<(u32, u32)>> = HashMap::new();
        for &set in groups.keys() {
            for bucket in s.geometry.buckets_of_set(set) {
                for (loc, tag) in self.index.bucket_entries(bucket) {
                    let small_log = f
                        .slot_of(loc.segment)
                        .is_some_and(|slot| f.is_small_log(slot));
                    if loc.segment != id && small_log && s.geometry.tag_may_match(set, tag) {
                        by_segment
                            .entry(loc.segment)
                            .or_default()
                            .push((loc.offset, set));
                    }
                }
            }
        }
        for (segment, candidates) in by_segment {
            let Some(slot) = f.slot_of(segment) else {
                continue;
            };
            let whole = (candidates.len() >= WHOLE_READ_PEERS)
                .then(|| f.read_stored_segment(slot))
                .flatten();
            for (offset, set) in candidates {
                let item = match &whole {
                    Some(segment_bytes) => segment_bytes.item(offset),
                    None => f.read(slot, offset),
                };
                let Some(item) = item else {
                    continue;
                };
                let i = item.item();
                if i.state != ItemState::Live || past(i.expires_at, now) {
                    continue;
                }
                let hash = self.index.hash_key(i.key);
                let same_set = self.set_of_hash(hash).is_some_and(|(_, _, s)| s == set);
                let Some(group) = groups.get_mut(&set) else {
                    continue;
                };
                if !same_set || group.iter().any(|m| m.item.item().key == i.key) {
                    continue;
                }
                let loc = Location { segment, offset };
                group.push(Moving { hash, loc, item });
            }
        }
    }

    /// Rewrites `set`'s page with `group` in front of what it holds (killed, expired and
    /// superseded items left out); returns how many of `group` it took (0 when the page
    /// could not be read or written: counted).
    fn rewrite_set(
        &self,
        f: &FlashTier,
        s: &SetStore,
        set: u32,
        group: &[Moving],
        now: u32,
    ) -> Result<usize, CacheError> {
        let mut lock = s.lock(set);
        let Some(page) = f.read_page(set) else {
            return Ok(0);
        };
        // The new items first, then the page's live ones they do not supersede; a page
        // of another generation than the set's (torn, or written by a crashed run the
        // kills no longer describe) is not merged.
        let mut items: Vec<OwnedItem> = group.iter().map(|m| m.item.clone()).collect();
        if page.generation == lock.generation() {
            let keep = |old: &OwnedItem| {
                let i = old.item();
                !past(i.expires_at, now)
                    && !s.killed_locked(&lock, kill_hash(self.index.hash_key(i.key)))
                    && !group.iter().any(|m| m.item.item().key == i.key)
            };
            items.extend(page.items.into_iter().filter(keep));
        }
        match f.rewrite_page(&mut lock, &items, |k| self.index.hash_key(k)) {
            Ok(n) => Ok(n.min(group.len())),
            Err(_) => Ok(0),
        }
    }

    /// An item of an evicted small-log segment that moves nowhere: reinserted into the
    /// log if it had a hit (and `reinsert`), else its entry removed.
    fn drop_or_reinsert(&self, m: &Moving, reinsert: bool, now: u32) -> Result<(), CacheError> {
        let Some(f) = &self.flash else {
            return Ok(());
        };
        let item = m.item.item();
        let hits = self.entry_hits(m.hash, m.loc).map_or(0, |(freq, _)| freq);
        let copy = if reinsert && hits > 0 {
            let cas = item.origin_cas.unwrap_or(0);
            self.copy_to_flash(&item, cas, now, item.expires_at, true)?
        } else {
            None
        };
        let mut g = self.index.lock(m.hash);
        let moved = match &copy {
            Some((buf, dloc)) => self.publish_flash_copy(
                &mut g,
                None,
                m.loc,
                (buf, *dloc),
                crate::index::Freq::Spend,
            )?,
            None => false,
        };
        if moved {
            f.stats.reinserted.fetch_add(1, Ordering::Relaxed);
        } else if g.remove(m.loc) {
            f.stats.items_evicted.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}

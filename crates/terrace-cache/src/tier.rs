//! Tiers: one medium (DRAM, a file in a directory, a NUMA node) holding a segment area
//! (`mem::SegmentArea`), its free list, its queues of sealed segments (`fifo`, `main`),
//! its reclaim list and its counters.
//! Sizes are bytes or a ratio of a total (CacheLib's `ratio`), resolved by
//! [`resolve_sizes`].
//!
//! Invariants, under the tier's `lists` lock: every slot of the area is in exactly one of
//! `free` (state `Free`), `fifo` or `main` (`Sealed`, each oldest first; which one a
//! sealed segment goes to is the eviction policy's, `cache/evict.rs`), `reclaim`
//! (`Evicting`, entries removed, waiting for readers' pins to drain) — or owned by
//! exactly one thread: an appender (`Open`), an opener (`Opening`) or an evictor
//! (`Evicting`, taken out of `fifo` or `main`).

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, MutexGuard};
use terrace_media::{Durability, FileLocation, FileOptions, Region};

use crate::error::CacheError;
use crate::mem::{Appender, SegmentArea};

/// Where a tier lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Medium {
    /// Anonymous memory, optionally advised to use transparent huge pages.
    Dram { huge_pages: bool },
    /// A file `tier<i>.terrace` in this directory (a DAX mount, tmpfs, or any file
    /// system). Reopened and scanned at the next [`Cache::open`](crate::Cache::open).
    File { dir: PathBuf },
    /// Anonymous memory bound to a NUMA node (a CXL or PMem node in system-RAM mode).
    Numa { node: u32 },
    /// Flash: a file `flash<i>.terrace` in this directory, or `path` (a file or a raw
    /// block device) with the tier's other files (its kill log) in the directory; read
    /// and written with block I/O (`O_DIRECT` where the file system allows), never
    /// mapped; always the last tier (`crate::flash`).
    Flash { dir: PathBuf, path: Option<PathBuf> },
}

/// How big a tier is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierSize {
    Bytes(u64),
    /// A share of `CacheConfig::total_bytes`: tier *i* gets `total * r_i / sum(r)`.
    Ratio(u32),
}

/// One tier of a cache configuration, fastest first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierConfig {
    pub medium: Medium,
    pub size: TierSize,
}

impl TierConfig {
    pub fn dram(size: TierSize) -> TierConfig {
        TierConfig {
            medium: Medium::Dram { huge_pages: false },
            size,
        }
    }

    pub fn file(dir: impl Into<PathBuf>, size: TierSize) -> TierConfig {
        TierConfig {
            medium: Medium::File { dir: dir.into() },
            size,
        }
    }

    pub fn flash(dir: impl Into<PathBuf>, size: TierSize) -> TierConfig {
        TierConfig {
            medium: Medium::Flash {
                dir: dir.into(),
                path: None,
            },
            size,
        }
    }

    /// A flash tier in `path` (a file or a raw block device) of its own, its kill log in
    /// `dir`.
    pub fn flash_at(
        dir: impl Into<PathBuf>,
        path: impl Into<PathBuf>,
        size: TierSize,
    ) -> TierConfig {
        TierConfig {
            medium: Medium::Flash {
                dir: dir.into(),
                path: Some(path.into()),
            },
            size,
        }
    }

    pub fn numa(node: u32, size: TierSize) -> TierConfig {
        TierConfig {
            medium: Medium::Numa { node },
            size,
        }
    }
}

/// Bytes of each tier: explicit sizes as given, ratios as shares of `total`.
pub fn resolve_sizes(tiers: &[TierConfig], total: Option<u64>) -> Result<Vec<u64>, CacheError> {
    let ratio_sum: u64 = tiers
        .iter()
        .map(|t| match t.size {
            TierSize::Ratio(r) => u64::from(r),
            TierSize::Bytes(_) => 0,
        })
        .sum();
    let has_ratio = tiers.iter().any(|t| matches!(t.size, TierSize::Ratio(_)));
    if has_ratio && ratio_sum == 0 {
        return Err(CacheError::Config {
            why: "tier ratios sum to zero",
        });
    }
    let total = match (has_ratio, total) {
        (true, None) => {
            return Err(CacheError::Config {
                why: "a tier size is a ratio but total_bytes is not set",
            })
        }
        (_, t) => t.unwrap_or(0),
    };
    tiers
        .iter()
        .map(|t| {
            let bytes = match t.size {
                TierSize::Bytes(b) => b,
                TierSize::Ratio(r) => {
                    (u128::from(total) * u128::from(r) / u128::from(ratio_sum)) as u64
                }
            };
            if bytes == 0 {
                Err(CacheError::Config {
                    why: "a tier has zero capacity",
                })
            } else {
                Ok(bytes)
            }
        })
        .collect()
}

/// The bytes a tier of `bytes` maps: regions are whole granules.
pub(crate) fn mapped_len(bytes: u64) -> u64 {
    bytes
        .checked_next_multiple_of(terrace_media::registry::GRANULE as u64)
        .unwrap_or(u64::MAX)
}

/// The file a file tier lives in.
pub fn tier_path(dir: &Path, tier: usize) -> PathBuf {
    dir.join(format!("tier{tier}.terrace"))
}

/// Maps a tier's region. Returns it and whether it was an existing file to scan.
pub(crate) fn map_tier(
    config: &TierConfig,
    tier: usize,
    bytes: u64,
) -> Result<(Region, bool), CacheError> {
    let size = usize::try_from(bytes).map_err(|_| CacheError::Config {
        why: "tier larger than the address space",
    })?;
    match &config.medium {
        Medium::Dram { huge_pages } => {
            let pages = if *huge_pages {
                terrace_media::PageSize::Huge
            } else {
                terrace_media::PageSize::Base
            };
            Ok((Region::dram(size, pages)?, false))
        }
        Medium::Numa { node } => Ok((Region::numa(*node, size)?, false)),
        Medium::Flash { .. } => Err(CacheError::Config {
            why: "a flash tier is not mapped",
        }),
        Medium::File { dir } => {
            if !dir.is_dir() {
                return Err(CacheError::TierDir { dir: dir.clone() });
            }
            let path = tier_path(dir, tier);
            let existing = path.exists();
            let region = if existing {
                let region = Region::file(&FileOptions {
                    location: FileLocation::Existing(path.clone()),
                    size: 0,
                    hole_punching: false,
                })?;
                let expected = mapped_len(bytes);
                if region.len() as u64 != expected {
                    return Err(CacheError::TierFileSize {
                        path,
                        found: region.len() as u64,
                        expected,
                    });
                }
                region
            } else {
                Region::file(&FileOptions::at_path(path, size))?
            };
            // Blocks for the whole tier now: a full file system is an error here, never a
            // SIGBUS at first touch.
            region.reserve(0, region.len())?;
            // On a disk, a synchronous msync per persist point would make every write and
            // demotion wait for the disk; a cache only needs what a process crash keeps
            // (see `crate::bootmark` for the rest).
            let mut region = region;
            region.persist_through_page_cache();
            Ok((region, existing))
        }
    }
}

/// Per-tier counters.
#[derive(Debug, Default)]
pub struct TierCounters {
    /// Gets served from this tier.
    pub hits: AtomicU64,
    pub segments_evicted: AtomicU64,
    pub items_evicted: AtomicU64,
    /// Items dropped by an eviction because they had expired (not counted as evicted).
    pub items_expired: AtomicU64,
    /// Items copied into this tier from the tier above.
    pub demotions_in: AtomicU64,
    /// Items copied into this tier (tier 0) from a lower tier because they were read
    /// often there.
    pub promotions_in: AtomicU64,
    /// Items kept (see `cache/evict.rs`) copied within this tier when their segment was
    /// evicted: reinsertions in the last tier, stays in tier 0 of several.
    pub reinserted: AtomicU64,
    /// Evictions done on a request's critical path.
    pub inline_evictions: AtomicU64,
    /// Evictions done by the movers ([`Cache::maintain`](crate::Cache::maintain)).
    pub background_evictions: AtomicU64,
    /// Main-queue segments the movers cleaned: their live items copied, their dead bytes
    /// freed (`cache/evict.rs`, `CLEAN_DEAD_SHARE`). Not counted as evicted.
    pub segments_cleaned: AtomicU64,
    /// Items those cleanings copied.
    pub items_cleaned: AtomicU64,
    /// Evictions without reinsertion (nor stays) done to open a reinsertion segment when
    /// none was free: the items with hits of those segments were dropped.
    pub barred_evictions: AtomicU64,
    /// The fewest free segments an allocation left (0: one found none and evicted
    /// inline, or a writer took the last tier's reinsertion reserve); the tier's segment
    /// count until the first allocation.
    pub free_low_water: AtomicUsize,
}

/// A snapshot of one tier's state and counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TierStats {
    pub segments: u32,
    pub free_segments: usize,
    pub sealed_segments: usize,
    /// Indexed items whose copy is in this tier.
    pub items: u64,
    /// Bytes of the items in this tier's open and sealed segments that are not dead
    /// (live items, and copies still being written). On flash, split from the segments'
    /// bytes by their live and dead item counts (a kill record names no length).
    pub live_bytes: u64,
    pub hits: u64,
    pub segments_evicted: u64,
    pub items_evicted: u64,
    /// Items whose space an eviction reclaimed after they had expired.
    pub items_expired: u64,
    pub demotions_in: u64,
    pub promotions_in: u64,
    pub reinserted: u64,
    /// Bytes of DEAD items (overwritten, deleted, or moved) in the tier's open and sealed
    /// segments: space that holds nothing until those segments are evicted.
    pub dead_bytes: u64,
    pub inline_evictions: u64,
    pub background_evictions: u64,
    /// Segments cleaned (their live items copied, their dead bytes freed), apart from
    /// `segments_evicted`.
    pub segments_cleaned: u64,
    /// Items copied by those cleanings.
    pub items_cleaned: u64,
    /// Evictions without reinsertion (nor stays) done to open a reinsertion segment when
    /// none was free (in `segments_evicted` too): their items with hits were dropped.
    pub barred_evictions: u64,
    /// The fewest free segments an allocation left since the tier opened (summed over
    /// pools by `Stats::combined`): 0 means writers found none and evicted inline.
    pub free_low_water: usize,
    pub durability: Option<Durability>,
    /// Written through the page cache and flushed to the medium at a clean shutdown: it
    /// survives a process crash, and a power loss or OS crash only after a clean stop
    /// (after an unclean one, the next boot starts it empty).
    pub flushed_at_shutdown: bool,
    /// What a flash tier adds (`None` for memory tiers).
    pub flash: Option<FlashStats>,
}

/// A flash tier's own state and counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlashStats {
    /// The file bypasses the page cache (`O_DIRECT`).
    pub direct: bool,
    /// The file is in RAM (tmpfs, ramfs): flash emulated, as fast as memory.
    pub emulated: bool,
    /// DRAM held by write buffers, segments being evicted and items staged.
    pub buffer_bytes: u64,
    pub bytes_written: u64,
    /// Bytes read from the device: items, and segments read back to be evicted.
    pub bytes_read: u64,
    /// `pread`s of items (one or two per flash hit read from the file).
    pub reads: u64,
    pub segments_written: u64,
    pub write_errors: u64,
    pub read_errors: u64,
    /// Kills of items on flash recorded in the kill log.
    pub kills_logged: u64,
    /// Evicted segments whose blocks could not be punched (their header was zeroed).
    pub punch_fallbacks: u64,
    /// Reads made ahead of a request whose thread may not wait on the device (a server's
    /// worker, its reads on its ring or a blocking pool), and how many a request then used.
    pub staged: u64,
    pub staged_used: u64,
    /// Items kept at an eviction above (or reinserted here) that found no room: no
    /// buffer or free segment could take them. Dropped.
    pub refused_no_room: u64,
    /// Items refused by the write budget. Dropped.
    pub refused_budget: u64,
    /// The write budget, bytes per second (`None`: none).
    pub write_rate: Option<u64>,
    /// Promoted items whose flash copy is kept as a replica now, and demotions that
    /// repointed to a replica instead of writing the item again (`cache/replica.rs`).
    pub replicas: u64,
    pub replica_demotions: u64,
    /// The small items in sets (`None`: the tier has none).
    pub sets: Option<SetStats>,
}

/// The flash tier's sets (`cache/sets.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetStats {
    /// Sets (one 4 KiB page each) and the items their pages held when last written.
    pub sets: u64,
    pub items: u64,
    /// DRAM of the sets' filters, generations and counts.
    pub memory_bytes: u64,
    /// Segments of the small-item log on flash, and the most it may hold.
    pub log_segments: u64,
    pub log_cap: u64,
    pub pages_written: u64,
    pub page_reads: u64,
    /// Page reads that found nothing for their key (filter false positives, kills).
    pub page_misses: u64,
    pub hits: u64,
    /// Log items moved into sets; items below the move threshold (dropped, or
    /// reinserted into the log with a hit); older items a full page let go.
    pub items_moved: u64,
    pub below_threshold: u64,
    pub items_trimmed: u64,
    pub kills: u64,
    /// Lookups that found their page read ahead (a server's).
    pub staged_used: u64,
}

impl SetStats {
    fn add(&mut self, o: &SetStats) {
        self.sets += o.sets;
        self.items += o.items;
        self.memory_bytes += o.memory_bytes;
        self.log_segments += o.log_segments;
        self.log_cap += o.log_cap;
        self.pages_written += o.pages_written;
        self.page_reads += o.page_reads;
        self.page_misses += o.page_misses;
        self.hits += o.hits;
        self.items_moved += o.items_moved;
        self.below_threshold += o.below_threshold;
        self.items_trimmed += o.items_trimmed;
        self.kills += o.kills;
        self.staged_used += o.staged_used;
    }
}

impl FlashStats {
    fn add(&mut self, o: &FlashStats) {
        self.direct |= o.direct;
        self.emulated |= o.emulated;
        self.buffer_bytes += o.buffer_bytes;
        self.bytes_written += o.bytes_written;
        self.bytes_read += o.bytes_read;
        self.reads += o.reads;
        self.segments_written += o.segments_written;
        self.write_errors += o.write_errors;
        self.read_errors += o.read_errors;
        self.kills_logged += o.kills_logged;
        self.punch_fallbacks += o.punch_fallbacks;
        self.staged += o.staged;
        self.staged_used += o.staged_used;
        self.refused_no_room += o.refused_no_room;
        self.refused_budget += o.refused_budget;
        self.replicas += o.replicas;
        self.replica_demotions += o.replica_demotions;
        self.write_rate = match (self.write_rate, o.write_rate) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        match (&mut self.sets, &o.sets) {
            (Some(a), Some(b)) => a.add(b),
            (a @ None, Some(b)) => *a = Some(b.clone()),
            _ => {}
        }
    }
}

impl TierStats {
    /// Adds `other`'s segments, items, bytes and counters to these (the same tier of
    /// another pool); the durability stays this one's, or `other`'s if this has none.
    pub fn add(&mut self, other: &TierStats) {
        self.segments += other.segments;
        self.free_segments += other.free_segments;
        self.sealed_segments += other.sealed_segments;
        self.items += other.items;
        self.live_bytes += other.live_bytes;
        self.hits += other.hits;
        self.segments_evicted += other.segments_evicted;
        self.items_evicted += other.items_evicted;
        self.items_expired += other.items_expired;
        self.demotions_in += other.demotions_in;
        self.promotions_in += other.promotions_in;
        self.reinserted += other.reinserted;
        self.dead_bytes += other.dead_bytes;
        self.inline_evictions += other.inline_evictions;
        self.background_evictions += other.background_evictions;
        self.segments_cleaned += other.segments_cleaned;
        self.items_cleaned += other.items_cleaned;
        self.free_low_water += other.free_low_water;
        self.barred_evictions += other.barred_evictions;
        self.durability = self.durability.or(other.durability);
        self.flushed_at_shutdown |= other.flushed_at_shutdown;
        match (&mut self.flash, &other.flash) {
            (Some(mine), Some(theirs)) => mine.add(theirs),
            (None, Some(theirs)) => self.flash = Some(theirs.clone()),
            _ => {}
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Lists {
    pub free: Vec<u32>,
    /// Sealed segments of new writes (tier 0) or of demotions into a middle tier, oldest
    /// first. In a single-tier cache, its small (probation) queue.
    pub fifo: VecDeque<u32>,
    /// The last tier's main queue: sealed segments of the copies it keeps (reinsertions,
    /// and demotions from the tier above), oldest first. Empty in other tiers.
    pub main: VecDeque<u32>,
    pub reclaim: Vec<u32>,
}

impl Lists {
    /// Moves the segments of the reclaim list whose eviction finished and whose pins
    /// drained ([`SegmentArea::try_free`]) to the free list.
    pub fn free_drained(&mut self, area: &SegmentArea) {
        let mut j = 0;
        while j < self.reclaim.len() {
            if area.try_free(self.reclaim[j]) {
                let slot = self.reclaim.swap_remove(j);
                self.free.push(slot);
            } else {
                j += 1;
            }
        }
    }
}

/// One tier's open segments for one kind of copy ([`Tier::mover`], [`Tier::reinsert`]),
/// in lanes: each lane a set of open segments per TTL bucket under its own lock, so that
/// several movers (and writers evicting inline) copy at once instead of queueing for
/// one lock, each holding a lane for one append. A thread takes the first free lane
/// round the ring from its own ([`CopyLanes::try_from`]) and waits for its own only
/// when all are busy; no thread holds two lanes of one set (see `docs/concurrency.md`).
/// Every lane's open segments are capped at its part of the copies' share of the tier.
#[derive(Debug)]
pub(crate) struct CopyLanes {
    lanes: Box<[Mutex<HashMap<u16, Appender>>]>,
}

impl CopyLanes {
    pub fn new(lanes: usize) -> CopyLanes {
        CopyLanes {
            lanes: (0..lanes.max(1))
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }
    }

    pub fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Lane `lane` (modulo their number): the one a thread waits for when all are busy.
    pub fn lane(&self, lane: usize) -> &Mutex<HashMap<u16, Appender>> {
        &self.lanes[lane % self.lanes.len()]
    }

    /// The first lane not locked by another thread, round the ring from `lane`.
    pub fn try_from(&self, lane: usize) -> Option<MutexGuard<'_, HashMap<u16, Appender>>> {
        let n = self.lanes.len();
        (0..n).find_map(|i| self.lanes[(lane + i) % n].try_lock())
    }

    pub fn iter(&self) -> impl Iterator<Item = &Mutex<HashMap<u16, Appender>>> {
        self.lanes.iter()
    }
}

/// One tier. See the module docs.
#[derive(Debug)]
pub(crate) struct Tier {
    pub area: SegmentArea,
    /// Global id of slot 0 (ids are unique across tiers; the index stores them).
    pub base: u32,
    /// Survives a process crash (a file tier): evictions retire segments first.
    pub durable: bool,
    /// Written through the page cache of a disk-backed file: flushed at a clean shutdown,
    /// trusted after an unclean stop only within the same boot (`crate::bootmark`).
    pub page_cache: bool,
    pub lists: Mutex<Lists>,
    /// The open segments demotions from the tier above (and promotions into tier 0)
    /// append to, per TTL bucket.
    pub mover: CopyLanes,
    /// The open segments copies within this tier append to, per TTL bucket: the last
    /// tier's reinsertions and cleanings, tier 0's stays (apart from `mover` because an
    /// eviction that reinserts may run inside a demotion that holds `mover`).
    pub reinsert: CopyLanes,
    pub counters: TierCounters,
    /// The cache-clock second of the movers' last sweep for expired segments.
    pub expiry_swept: AtomicU32,
    /// Mean length of the live items of the last segment evicted from this tier's
    /// probation stage (0 until one is): what `SMALL_ITEM_SHARE` in `cache/evict.rs`
    /// measures items against.
    pub probation_mean_len: AtomicU32,
}

impl Tier {
    /// A tier over `area` whose copy sets have `copy_lanes` lanes each.
    pub fn new(area: SegmentArea, base: u32, copy_lanes: usize) -> Tier {
        let durable = area.region().durability() != Durability::None;
        let page_cache = area.region().is_page_cached();
        let segments = area.count() as usize;
        Tier {
            lists: Mutex::new(Lists {
                free: (0..area.count()).rev().collect(),
                ..Lists::default()
            }),
            area,
            base,
            durable,
            page_cache,
            mover: CopyLanes::new(copy_lanes),
            reinsert: CopyLanes::new(copy_lanes),
            counters: TierCounters {
                free_low_water: AtomicUsize::new(segments),
                ..TierCounters::default()
            },
            expiry_swept: AtomicU32::new(0),
            probation_mean_len: AtomicU32::new(0),
        }
    }

    pub fn stats(&self) -> TierStats {
        let lists = self.lists.lock();
        TierStats {
            segments: self.area.count(),
            free_segments: lists.free.len(),
            sealed_segments: lists.fifo.len() + lists.main.len(),
            items: 0,
            live_bytes: 0,
            hits: self.counters.hits.load(Ordering::Relaxed),
            segments_evicted: self.counters.segments_evicted.load(Ordering::Relaxed),
            items_evicted: self.counters.items_evicted.load(Ordering::Relaxed),
            items_expired: self.counters.items_expired.load(Ordering::Relaxed),
            demotions_in: self.counters.demotions_in.load(Ordering::Relaxed),
            promotions_in: self.counters.promotions_in.load(Ordering::Relaxed),
            reinserted: self.counters.reinserted.load(Ordering::Relaxed),
            dead_bytes: 0,
            inline_evictions: self.counters.inline_evictions.load(Ordering::Relaxed),
            background_evictions: self.counters.background_evictions.load(Ordering::Relaxed),
            segments_cleaned: self.counters.segments_cleaned.load(Ordering::Relaxed),
            items_cleaned: self.counters.items_cleaned.load(Ordering::Relaxed),
            free_low_water: self.counters.free_low_water.load(Ordering::Relaxed),
            barred_evictions: self.counters.barred_evictions.load(Ordering::Relaxed),
            durability: Some(self.area.region().durability()),
            flushed_at_shutdown: self.page_cache,
            flash: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_and_bytes() {
        let t = |size| TierConfig::dram(size);
        assert_eq!(
            resolve_sizes(&[t(TierSize::Ratio(1)), t(TierSize::Ratio(3))], Some(400)).unwrap(),
            vec![100, 300]
        );
        assert_eq!(
            resolve_sizes(&[t(TierSize::Bytes(7)), t(TierSize::Ratio(1))], Some(10)).unwrap(),
            vec![7, 10]
        );
        assert!(resolve_sizes(&[t(TierSize::Ratio(1))], None).is_err());
        assert!(resolve_sizes(&[t(TierSize::Bytes(0))], None).is_err());
        assert!(resolve_sizes(&[t(TierSize::Ratio(0))], Some(5)).is_err());
    }
}

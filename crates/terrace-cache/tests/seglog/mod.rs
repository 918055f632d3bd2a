//! [`SegmentLog`]: a single-tier, single-threaded cache over in-memory segments that puts
//! the codec and the index together — set, get, delete, FIFO segment eviction, and recovery
//! from a crash image of the segments — following the commit protocol of
//! `docs/cache-format.md` step by step. It is the executable argument for that protocol
//! (its tests recover from the image at every persist point) and the skeleton the
//! concurrent, tiered engine grows from; it is not that engine (no tiers, TTLs, movers or
//! threads). It lives with the tests: the engine's own persist points are checked by
//! `tests/engine_crash_images.rs`.
//!
//! Invariants (between calls):
//! - every LIVE item in the committed range of a non-retired segment is the item the
//!   index maps its key to, and every index entry points at such an item;
//! - `fifo` lists the sealed segments oldest first, `free` the unused ones, `open` the one
//!   being appended to; together they are every segment exactly once;
//! - write sequences only grow: `next_seq` is above every header's.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use terrace_cache::error::{EncodeError, HeaderError, IndexError};
use terrace_cache::index::{Freq, Index, IndexConfig, Location};
use terrace_cache::item::{self, ItemLimits, ItemSpec, ItemState};
use terrace_cache::segment::{self, Cursor, ScanEnd, SegmentHeader, SegmentReader, SegmentWriter};

/// How to build a [`SegmentLog`].
#[derive(Clone, Copy, Debug)]
pub struct LogConfig {
    /// Segments are `1 << segment_shift` bytes.
    pub segment_shift: u8,
    /// Number of segments (at least 2: one open, one to evict).
    pub segments: u32,
    pub limits: ItemLimits,
    /// Items the index is sized for.
    pub expected_items: usize,
    /// Maintain the running data checksum (needed to trust segments after a crash).
    pub checksummed: bool,
    /// Key hash seed.
    pub seed: u64,
}

/// Why a log operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The configuration cannot work.
    #[error("invalid log configuration: {why}")]
    Config { why: &'static str },
    /// The item is larger than a segment can ever hold.
    #[error("item of {need} bytes cannot fit in a segment of {capacity} item bytes")]
    TooLarge { need: usize, capacity: u32 },
}

/// Why [`SegmentLog::recover`] dropped a segment buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogDropReason {
    /// The buffer is not the configured segment size.
    WrongSize { len: usize },
    /// The header was rejected.
    Header(HeaderError),
    /// The header belongs to another slot or segment size (a shifted or foreign file).
    Misplaced { slot: u32, size_shift: u8 },
    /// The items did not scan clean.
    Scan(ScanEnd),
}

/// What [`SegmentLog::recover`]'s scan of the segment buffers kept and dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogScanReport {
    /// Segments whose items were kept.
    pub segments: usize,
    /// Items indexed.
    pub items: usize,
    /// Segments dropped, with why.
    pub dropped: Vec<(u32, LogDropReason)>,
    /// Keys with more than one LIVE item (never produced by the protocol): all dropped.
    pub conflicts: usize,
    /// LIVE items not indexed because both buckets were full.
    pub index_full: usize,
}

/// Counters. Hits and misses are atomics so that `get` takes `&self`.
#[derive(Debug, Default)]
pub struct LogStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub sets: u64,
    pub deletes: u64,
    pub segments_evicted: u64,
    pub items_evicted: u64,
    /// Entries evicted because both index buckets of a new key were full.
    pub index_evictions: u64,
}

/// A value found by [`SegmentLog::get`], borrowing the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found<'a> {
    pub value: &'a [u8],
    pub client_flags: u32,
    pub cas: u64,
}

/// Called with every segment at each persist point (tests record crash images with it).
pub type PersistProbe = Box<dyn FnMut(&[Box<[u8]>])>;

/// A single-tier log-structured cache. See the module docs.
pub struct SegmentLog {
    config: LogConfig,
    segments: Vec<Box<[u8]>>,
    /// DRAM copies of the headers of written segments (for CAS without re-validating).
    headers: Vec<Option<SegmentHeader>>,
    index: Index,
    fifo: VecDeque<u32>,
    free: Vec<u32>,
    open: Option<(u32, Cursor)>,
    next_seq: u64,
    stats: LogStats,
    probe: Option<PersistProbe>,
}

impl std::fmt::Debug for SegmentLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentLog")
            .field("config", &self.config)
            .field("fifo", &self.fifo)
            .field("free", &self.free)
            .field("open", &self.open.map(|(id, _)| id))
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

fn persist_point(probe: &mut Option<PersistProbe>, segments: &[Box<[u8]>]) {
    if let Some(p) = probe.as_mut() {
        p(segments);
    }
}

/// The key of the item at `loc`, if it decodes.
fn key_at(segments: &[Box<[u8]>], loc: Location) -> Option<&[u8]> {
    let buf = segments.get(loc.segment as usize)?;
    item::decode(buf, loc.offset, buf.len()).ok().map(|i| i.key)
}

fn flip(segments: &mut [Box<[u8]>], loc: Location, state: ItemState) {
    if let Some(buf) = segments.get_mut(loc.segment as usize) {
        item::set_state(buf, loc.offset, state);
    }
}

impl SegmentLog {
    fn validate(config: &LogConfig) -> Result<(), LogError> {
        config.limits.validate()?;
        if config.segments < 2 {
            return Err(LogError::Config {
                why: "at least two segments",
            });
        }
        if !(segment::MIN_SHIFT..=segment::MAX_SHIFT).contains(&config.segment_shift) {
            return Err(EncodeError::BadShift {
                shift: config.segment_shift,
                min: segment::MIN_SHIFT,
                max: segment::MAX_SHIFT,
            }
            .into());
        }
        Ok(())
    }

    fn empty(config: LogConfig, segments: Vec<Box<[u8]>>) -> Result<SegmentLog, LogError> {
        let index = Index::new(&IndexConfig {
            seed: config.seed,
            ..IndexConfig::new(config.expected_items, config.segments, config.segment_shift)
        })?;
        Ok(SegmentLog {
            headers: vec![None; segments.len()],
            free: (0..config.segments).rev().collect(),
            segments,
            index,
            fifo: VecDeque::new(),
            open: None,
            next_seq: 1,
            stats: LogStats::default(),
            probe: None,
            config,
        })
    }

    /// A log of zeroed segments.
    pub fn new(config: LogConfig) -> Result<SegmentLog, LogError> {
        Self::validate(&config)?;
        let size = 1usize << config.segment_shift;
        let segments = (0..config.segments)
            .map(|_| vec![0u8; size].into_boxed_slice())
            .collect();
        Self::empty(config, segments)
    }

    /// Installs a probe called at every persist point.
    pub fn set_persist_probe(&mut self, probe: Option<PersistProbe>) {
        self.probe = probe;
    }

    pub fn stats(&self) -> &LogStats {
        &self.stats
    }

    /// Hands the segments back (a clean shutdown; [`recover`](Self::recover) reopens them).
    pub fn into_segments(self) -> Vec<Box<[u8]>> {
        self.segments
    }

    /// Looks `key` up: index candidates, then a key compare in the segment. A hit raises
    /// the entry's frequency.
    pub fn get(&self, key: &[u8]) -> Option<Found<'_>> {
        let hash = self.index.hash_key(key);
        for hit in self.index.lookup(hash) {
            let loc = hit.location();
            let Some(buf) = self.segments.get(loc.segment as usize) else {
                continue;
            };
            let Ok(found) = item::decode(buf, loc.offset, buf.len()) else {
                continue;
            };
            if found.key != key {
                continue;
            }
            let Some(header) = self.headers[loc.segment as usize] else {
                continue;
            };
            hit.touch();
            self.stats.hits.fetch_add(1, Ordering::Relaxed);
            return Some(Found {
                value: found.value,
                client_flags: found.client_flags,
                cas: header.cas_of(&found),
            });
        }
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Stores `key` → `value`; returns the new CAS.
    pub fn set(&mut self, key: &[u8], value: &[u8], client_flags: u32) -> Result<u64, LogError> {
        self.config.limits.check(key.len(), value.len())?;
        let spec = ItemSpec {
            client_flags,
            ..ItemSpec::new(key, value.len())
        };
        let capacity = (1u32 << self.config.segment_shift) - segment::HEADER_LEN as u32;
        if spec.encoded_len() > capacity as usize {
            return Err(LogError::TooLarge {
                need: spec.encoded_len(),
                capacity,
            });
        }
        // Steps 1-2: append the PENDING item and commit it.
        let new = self.append(&spec, key, value)?;
        let cas = self.headers[new.segment as usize]
            .map(|h| h.cas_at(new.offset))
            .unwrap_or(0);
        // Steps 3-5 under the key's bucket lock.
        let hash = self.index.hash_key(key);
        let mut guard = self.index.lock(hash);
        let old = guard
            .candidates()
            .find(|&l| key_at(&self.segments, l) == Some(key));
        if let Some(old) = old {
            flip(&mut self.segments, old, ItemState::Dead);
            persist_point(&mut self.probe, &self.segments);
        }
        flip(&mut self.segments, new, ItemState::Live);
        persist_point(&mut self.probe, &self.segments);
        let published = match old {
            Some(old) => guard.repoint(old, new, Freq::Reset),
            None => match guard.insert(new) {
                Ok(()) => true,
                Err(_) => {
                    // Both buckets full: evict the least-hit occupant (as a delete), retry.
                    let victim = guard.occupants().min_by_key(|&(l, f)| (f, l.segment));
                    match victim {
                        Some((victim, _)) => {
                            flip(&mut self.segments, victim, ItemState::Dead);
                            persist_point(&mut self.probe, &self.segments);
                            guard.remove_occupant(victim);
                            self.stats.index_evictions += 1;
                            guard.insert(new).is_ok()
                        }
                        None => false,
                    }
                }
            },
        };
        if !published {
            // Keep the invariant: nothing LIVE that the index does not point at.
            flip(&mut self.segments, new, ItemState::Dead);
            persist_point(&mut self.probe, &self.segments);
        }
        drop(guard);
        self.stats.sets += 1;
        Ok(cas)
    }

    /// Deletes `key`; returns whether it was there.
    pub fn delete(&mut self, key: &[u8]) -> bool {
        let hash = self.index.hash_key(key);
        let mut guard = self.index.lock(hash);
        let Some(old) = guard
            .candidates()
            .find(|&l| key_at(&self.segments, l) == Some(key))
        else {
            return false;
        };
        flip(&mut self.segments, old, ItemState::Dead);
        persist_point(&mut self.probe, &self.segments);
        guard.remove(old);
        drop(guard);
        self.stats.deletes += 1;
        true
    }

    /// Appends a committed PENDING item to the open segment, opening (and if need be
    /// evicting) segments until it fits.
    fn append(&mut self, spec: &ItemSpec, key: &[u8], value: &[u8]) -> Result<Location, LogError> {
        loop {
            if let Some((id, cursor)) = self.open {
                if cursor.remaining() >= spec.encoded_len() {
                    let mut w = SegmentWriter::attach(&mut self.segments[id as usize], cursor)?;
                    let offset = w.append(spec, key, value)?;
                    self.open = Some((id, w.cursor()));
                    persist_point(&mut self.probe, &self.segments);
                    return Ok(Location {
                        segment: id,
                        offset,
                    });
                }
                self.fifo.push_back(id);
                self.open = None;
            }
            let id = match self.free.pop() {
                Some(id) => id,
                None => self.evict_oldest().ok_or(LogError::Config {
                    why: "no segment to evict",
                })?,
            };
            let header = SegmentHeader {
                tier: 0,
                size_shift: self.config.segment_shift,
                checksummed: self.config.checksummed,
                write_seq: self.next_seq,
                slot: id,
                created_at: 0,
                expires_at: 0,
                ttl_bucket: 0,
            };
            self.next_seq += 1;
            let w =
                SegmentWriter::create(&mut self.segments[id as usize], header, self.config.limits)?;
            self.open = Some((id, w.cursor()));
            self.headers[id as usize] = Some(header);
            persist_point(&mut self.probe, &self.segments);
        }
    }

    /// Evicts the oldest sealed segment: retire it (one store), then drop its items'
    /// index entries. Returns the freed segment.
    fn evict_oldest(&mut self) -> Option<u32> {
        let id = self.fifo.pop_front()?;
        let live: Vec<(u64, Location)> = match SegmentReader::open(&self.segments[id as usize]) {
            Ok(reader) => reader
                .items()
                .filter(|i| i.state == ItemState::Live)
                .map(|i| {
                    (
                        self.index.hash_key(i.key),
                        Location {
                            segment: id,
                            offset: i.offset,
                        },
                    )
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        segment::retire(&mut self.segments[id as usize]);
        persist_point(&mut self.probe, &self.segments);
        for (hash, loc) in live {
            if self.index.remove(hash, loc) {
                self.stats.items_evicted += 1;
            }
        }
        self.headers[id as usize] = None;
        self.stats.segments_evicted += 1;
        Some(id)
    }

    /// Rebuilds a log from segment buffers as a crash (or a clean shutdown) left them:
    /// validates every header, scans every segment, indexes the LIVE items, drops what
    /// cannot be trusted and says why. New writes go to fresh segments.
    pub fn recover(
        config: LogConfig,
        mut segments: Vec<Box<[u8]>>,
    ) -> Result<(SegmentLog, LogScanReport), LogError> {
        Self::validate(&config)?;
        if segments.len() != config.segments as usize {
            return Err(LogError::Config {
                why: "segment count differs from the configuration",
            });
        }
        let size = 1usize << config.segment_shift;
        let mut report = LogScanReport::default();
        let mut kept: Vec<(u64, u32)> = Vec::new();
        let mut headers = vec![None; segments.len()];
        let mut live: HashMap<Vec<u8>, Vec<Location>> = HashMap::new();
        let mut max_seq = 0;
        for (id, buf) in segments.iter_mut().enumerate() {
            let id = id as u32;
            if buf.len() != size {
                report
                    .dropped
                    .push((id, LogDropReason::WrongSize { len: buf.len() }));
                *buf = vec![0u8; size].into_boxed_slice();
                continue;
            }
            let reader = match SegmentReader::open(buf) {
                Ok(r) => r,
                Err(HeaderError::Unwritten) => continue,
                Err(e) => {
                    report.dropped.push((id, LogDropReason::Header(e)));
                    continue;
                }
            };
            let header = *reader.header();
            max_seq = max_seq.max(header.write_seq);
            if header.slot != id || header.size_shift != config.segment_shift {
                report.dropped.push((
                    id,
                    LogDropReason::Misplaced {
                        slot: header.slot,
                        size_shift: header.size_shift,
                    },
                ));
                continue;
            }
            let end = reader.verify();
            if !end.is_complete() {
                report.dropped.push((id, LogDropReason::Scan(end)));
                continue;
            }
            if reader.commit().committed == 0 {
                continue;
            }
            for i in reader.items().filter(|i| i.state == ItemState::Live) {
                live.entry(i.key.to_vec()).or_default().push(Location {
                    segment: id,
                    offset: i.offset,
                });
            }
            headers[id as usize] = Some(header);
            kept.push((header.write_seq, id));
        }
        // Dropped segments are reused; retire them so nothing in them is ever scanned.
        for (id, _) in &report.dropped {
            segment::retire(&mut segments[*id as usize]);
        }
        let mut log = Self::empty(config, segments)?;
        kept.sort_unstable();
        log.fifo = kept.iter().map(|&(_, id)| id).collect();
        log.free = (0..config.segments)
            .rev()
            .filter(|id| headers[*id as usize].is_none())
            .collect();
        log.headers = headers;
        log.next_seq = max_seq + 1;
        report.segments = kept.len();
        for (key, locs) in live {
            if locs.len() > 1 {
                report.conflicts += 1;
                for loc in locs {
                    flip(&mut log.segments, loc, ItemState::Dead);
                }
                continue;
            }
            let loc = locs[0];
            if log.index.lock(log.index.hash_key(&key)).insert(loc).is_ok() {
                report.items += 1;
            } else {
                report.index_full += 1;
                flip(&mut log.segments, loc, ItemState::Dead);
            }
        }
        Ok((log, report))
    }
}

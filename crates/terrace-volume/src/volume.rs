//! [`Volume`]: one cached block volume — the modes, the dirty-block map, clean blocks in
//! the cache engine, the write log and the write-back thread. It is an [`Export`], so the
//! NBD front end serves it as it is.
//!
//! # Where a block's newest data is
//! 1. *Dirty*: in the write log, named by the block's entry in the dirty map (or zeroes).
//! 2. *Clean and cached*: in the [`Cache`] under the key `volume id | block number`.
//! 3. Otherwise in the backend.
//!
//! # Invariants
//! - V1: every operation on a block holds the lock of the block's shard (the shard also
//!   holds its blocks' dirty entries); a request locks all its shards in ascending order
//!   (the lock order, `docs/concurrency.md`), and no thread waits for log space or for the
//!   write-back while holding a shard lock — reservations come first.
//! - V2: a cached block equals the backend's block, or the block is dirty. So a
//!   write-through write deletes the cached copy before writing the backend and stores
//!   the new one after (unless the write is large); the write-back stores a block in the
//!   cache (drops it, for a large run) after writing it to the backend and before the log
//!   releases its record.
//! - V3: a dirty entry names the newest record of its block (the higher sequence number
//!   wins when two writers race), and recovery rebuilds the same map from the log.
//! - V4: a write to a dirty block goes through the log whatever the mode, so the
//!   write-back never writes older data over a newer write-through write.
//! - V5 (the backend's consistency): the write-back writes one batch (a prefix of the
//!   log, crate docs) at a time — the newest data of each block within it, then a
//!   backend flush, then the head moves past it — so the backend always holds every
//!   write of the batches before and some of the current one's. A large write-back write
//!   may bypass the log while it is congested, but only while no barrier is pending: it
//!   reorders only among writes that no flush has ordered yet.
//! - V6 (storage mode): the write-back runs only for a drain; past the high watermark the
//!   log compacts instead (`compact_one_batch`): live blocks of the oldest batch are
//!   appended again, made durable, then the batch is released. Client appends leave an
//!   eighth of the log (at most a batch) free for those copies, so compaction can always
//!   proceed while live data fits the log; when it does not, writes wait, then fail with
//!   ENOSPC.
//! - V7 (snapshots): while a snapshot copies the backend (`snapshotting`), nothing writes
//!   it: every write goes to the log whatever the mode (no write-through, no bypass) and
//!   the write-back waits. Before that, with every write held, the log was drained and
//!   the backend flushed, so the copy is the volume as of the snapshot; a log that fills
//!   meanwhile makes writes wait, then fail with ENOSPC, as in storage mode.
//! - V8 (reads see only what stays): with writes acknowledged once durable, a read that
//!   returns a record's data waits until that record is durable (on the copies the ack
//!   level names, for a replicated log) — a value read is never taken back by a crash
//!   or a failover.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};
use rustc_hash::FxHashMap;
use terrace_cache::Cache;
use terrace_media::flash::AlignedBuf;

use crate::backend::{Backend, BLOCK_SIZE};
use crate::cached::CachedBlocks;
use crate::error::{BlockError, VolumeError};
use crate::export::Export;
use crate::log::{
    FileLogStore, LogStats, LogStore, Payload, RecordKind, RecordMeta, Wait, WriteLog,
};
use crate::replication::replica::record_led;
use crate::replication::{
    read_replica_state, ReplicaState, ReplicatedStore, Replication, ReplicationConfig,
    ReplicationStatus,
};

const BS: u64 = BLOCK_SIZE as u64;
/// Shards of the dirty map and of the block locks.
const SHARDS: usize = 1024;
/// Consecutive blocks that share a shard (64 KiB): a 64 KiB write takes one or two shard
/// locks, not sixteen — with sixteen, concurrent large writes met on a shard (and waited
/// for each other's backend write) a quarter of the time.
const SHARD_STRIPE: u64 = 16;
/// The longest a snapshot holds writes while it writes back what came during its first
/// drain.
pub const SNAPSHOT_HOLD: Duration = Duration::from_secs(30);
/// The most log bytes the write-back writes back, flushes and releases at once: a full
/// log drains (and frees space for writes) in steps of this.
const WRITE_BACK_BATCH: u64 = 64 << 20;
/// The longest run of blocks the write-back hands the backend in one write (1 MiB).
const RUN_BLOCKS: u64 = 256;
/// Storage mode compacts only while live data is under this share of the log's used
/// bytes (above it, copying would free almost nothing).
const COMPACT_MAX_LIVE: f64 = 0.9;
/// How long storage mode waits after a compaction pass that could not free space.
const COMPACT_RETRY: Duration = Duration::from_millis(200);

/// How writes travel. See the crate docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    WriteThrough = 0,
    WriteBack = 1,
    WriteAround = 2,
    ReadOnly = 3,
    /// Write-back whose write-back runs only when asked (`terrace volume flush`, a
    /// drain): the volume lives in the log, which compacts itself instead (see
    /// `compact_one_batch`).
    Storage = 4,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::WriteThrough => "write-through",
            Mode::WriteBack => "write-back",
            Mode::WriteAround => "write-around",
            Mode::ReadOnly => "read-only",
            Mode::Storage => "storage",
        }
    }

    fn from_u8(v: u8) -> Mode {
        match v {
            1 => Mode::WriteBack,
            2 => Mode::WriteAround,
            3 => Mode::ReadOnly,
            4 => Mode::Storage,
            _ => Mode::WriteThrough,
        }
    }

    /// Whether writes go through the log whatever their blocks (write-back, storage).
    pub fn logs_writes(self) -> bool {
        matches!(self, Mode::WriteBack | Mode::Storage)
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        Ok(match s {
            "write-through" | "writethrough" | "wt" => Mode::WriteThrough,
            "write-back" | "writeback" | "wb" => Mode::WriteBack,
            "write-around" | "writearound" | "wa" => Mode::WriteAround,
            "read-only" | "readonly" | "ro" => Mode::ReadOnly,
            "storage" => Mode::Storage,
            _ => {
                return Err(format!(
                    "unknown mode {s:?}: write-through, write-back, write-around, read-only \
                     or storage"
                ))
            }
        })
    }
}

/// When a write-back write is acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckDurability {
    /// Once durable in the log (the default): no acknowledged write is ever lost.
    OnWrite,
    /// Once written to the log with every record before it, not synced: it survives a
    /// process crash, and a power loss only after the client's next FLUSH or with FUA
    /// (NBD's own semantics, like a disk's volatile write cache).
    OnFlush,
}

impl std::str::FromStr for AckDurability {
    type Err = String;
    fn from_str(s: &str) -> Result<AckDurability, String> {
        match s {
            "on-write" | "write" => Ok(AckDurability::OnWrite),
            "on-flush" | "flush" => Ok(AckDurability::OnFlush),
            _ => Err(format!("unknown durability {s:?}: on-write or on-flush")),
        }
    }
}

/// How to open a volume.
#[derive(Clone, Debug)]
pub struct VolumeConfig {
    /// The export name.
    pub name: String,
    /// The cache key prefix; unique among the volumes sharing a cache.
    pub id: u32,
    pub mode: Mode,
    pub ack: AckDurability,
    /// The write log's file (on the persistent tier) and its size when created.
    pub log_path: PathBuf,
    pub log_bytes: u64,
    /// Backend writes the write-back keeps in flight.
    pub writeback_threads: usize,
    /// The write-back starts when the log is this full (share of its capacity)…
    pub high_watermark: f64,
    /// …and goes on until it is this empty.
    pub low_watermark: f64,
    /// With no request for this long, the write-back writes everything back.
    pub idle_writeback: Duration,
    /// How long a write waits for log space before failing with ENOSPC.
    pub full_wait: Duration,
    /// A read stream longer than this (bytes, consecutive requests) is not cached; 0 = off.
    pub sequential_cutoff: u64,
    /// A write of at least this many bytes is *large* (0 = none is): it is not kept in
    /// the cache (a write-back run this long is dropped from it, not stored), and in
    /// write-back it goes straight to the backend while the log is congested (past the
    /// high watermark, the write-back cleaning down to the low one, or writers waiting
    /// for space) and holds no barrier — bcache's congested bypass.
    pub large_write: u64,
    /// A block read from the backend is cached on its N-th miss (promotion by hits,
    /// Open CAS's "nhit"); 1 caches every miss. Misses are counted in a bounded table
    /// that forgets when full.
    pub promote_after: u32,
    /// Replicate the write log to secondaries ([`crate::replication`]); `None` runs
    /// unreplicated.
    pub replication: Option<ReplicationConfig>,
}

impl VolumeConfig {
    /// Defaults: write-through, acknowledged on write, a 1 GiB log, 64 write-back
    /// writes in flight, watermarks 50% / 40% (dm-writecache's 50 / 45, a little lower
    /// so a burst has room), idle write-back after 1 s, a 30 s wait for a full log, a
    /// 4 MiB sequential cutoff, large writes from 64 KiB.
    pub fn new(name: &str, id: u32, log_path: impl Into<PathBuf>) -> VolumeConfig {
        VolumeConfig {
            name: name.to_string(),
            id,
            mode: Mode::WriteThrough,
            ack: AckDurability::OnWrite,
            log_path: log_path.into(),
            log_bytes: 1 << 30,
            writeback_threads: 64,
            high_watermark: 0.5,
            low_watermark: 0.4,
            idle_writeback: Duration::from_secs(1),
            full_wait: Duration::from_secs(30),
            sequential_cutoff: 4 << 20,
            large_write: 64 << 10,
            promote_after: 1,
            replication: None,
        }
    }
}

/// The volumes a service serves now (a coordinated node's change as it takes volumes
/// over and gives them up); the control socket and the metrics endpoint read it.
#[derive(Clone, Default)]
pub struct VolumeList(Arc<RwLock<Vec<Arc<Volume>>>>);

impl VolumeList {
    pub fn new(volumes: Vec<Arc<Volume>>) -> VolumeList {
        VolumeList(Arc::new(RwLock::new(volumes)))
    }

    pub fn snapshot(&self) -> Vec<Arc<Volume>> {
        self.0.read().clone()
    }

    pub fn push(&self, v: Arc<Volume>) {
        self.0.write().push(v);
    }

    /// Takes the volume named `name` out of the list.
    pub fn remove(&self, name: &str) -> Option<Arc<Volume>> {
        let mut list = self.0.write();
        let at = list.iter().position(|v| v.name() == name)?;
        Some(list.remove(at))
    }
}

/// A log that was a secondary's copy (a `.replica` state beside it, see
/// [`crate::replication::replica`]) is taken over only whole — never one left
/// mid-resync, nor one whose file is gone (R5) — and by a primary whose epoch is at
/// least the one the copy recorded. Returns the copy's state, if it is one.
fn check_taken_over_copy(config: &VolumeConfig) -> Result<Option<ReplicaState>, VolumeError> {
    let state_path = config.log_path.with_extension("replica");
    let Some(state) = read_replica_state(&state_path)? else {
        return Ok(None);
    };
    if let Some(why) = state.take_over_refusal(&config.log_path) {
        return Err(VolumeError::Config(format!(
            "volume {}: {} is a secondary's copy that cannot be taken over ({why}); take \
             the volume over on a node whose copy is in sync",
            config.name,
            config.log_path.display()
        )));
    }
    match &config.replication {
        Some(rc) if rc.epoch < state.epoch => Err(VolumeError::Config(format!(
            "volume {}: epoch {} is older than the {} its copy has seen",
            config.name, rc.epoch, state.epoch
        ))),
        _ => Ok(Some(state)),
    }
}

/// A dirty block: where its newest data is.
#[derive(Clone, Copy, Debug)]
struct Dirty {
    seq: u64,
    /// The record's position; `u64::MAX` for zeroes.
    pos: u64,
    /// The block's index within the record.
    within: u32,
}

impl Dirty {
    fn is_zero(&self) -> bool {
        self.pos == u64::MAX
    }
}

type Shard = FxHashMap<u64, Dirty>;

/// The shard locks one request holds, ascending (V1).
struct Locked<'a> {
    guards: Vec<(usize, MutexGuard<'a, Shard>)>,
}

impl Locked<'_> {
    /// Whether a block in `range` is dirty (its shards must be the ones held).
    fn any_dirty_in(&self, range: std::ops::RangeInclusive<u64>) -> bool {
        self.guards
            .iter()
            .any(|(_, shard)| shard.keys().any(|b| range.contains(b)))
    }

    fn shard(&mut self, block: u64) -> &mut Shard {
        let index = shard_of(block);
        let at = self
            .guards
            .binary_search_by_key(&index, |(i, _)| *i)
            .expect("the request locked this block's shard");
        &mut self.guards[at].1
    }
}

fn shard_of(block: u64) -> usize {
    ((block / SHARD_STRIPE).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 54) as usize % SHARDS
}

/// What recovery found when the volume opened.
#[derive(Debug, Clone)]
pub struct RecoveryReport {
    pub log_created: bool,
    pub records: usize,
    pub dirty_blocks: usize,
    pub scan_end: String,
    pub elapsed: Duration,
}

/// A snapshot of a volume's state and counters (`terrace volume status`, Prometheus).
#[derive(Debug, Clone)]
pub struct VolumeStatus {
    pub name: String,
    pub mode: Mode,
    pub ack: AckDurability,
    pub size: u64,
    pub backend: String,
    pub dirty_bytes: u64,
    /// Bytes of clean blocks with a copy in the cache.
    pub clean_bytes: u64,
    pub log: LogStats,
    pub read_hit_blocks: u64,
    pub read_miss_blocks: u64,
    pub read_dirty_blocks: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub written_back_bytes: u64,
    pub batches_written_back: u64,
    pub backend_errors: u64,
    pub cache_errors: u64,
    /// Logged writes whose log space a newer write to the same blocks overtook (the
    /// space padded and taken again).
    pub overtaken_writes: u64,
    /// Write-back writes that went straight to the backend (congested bypass).
    pub bypassed_writes: u64,
    pub bypassed_bytes: u64,
    /// Storage mode: batches of the log compacted (live blocks copied, batch released).
    pub batches_compacted: u64,
    pub last_error: Option<String>,
    /// While a flush (`terrace volume flush`, a snapshot) is writing back, how far it is.
    pub flush: Option<FlushProgress>,
    /// A replicated volume's replication.
    pub replication: Option<ReplicationStatus>,
}

/// How far a flush is: it began with `dirty_at_start` dirty bytes and has written back
/// `written_back` bytes since (more than it began with when writes came meanwhile).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushProgress {
    pub dirty_at_start: u64,
    pub written_back: u64,
}

impl VolumeStatus {
    /// Bytes of the volume the tiers hold: clean copies and dirty blocks.
    pub fn present_bytes(&self) -> u64 {
        self.clean_bytes + self.dirty_bytes
    }

    /// Tier bytes the volume takes: its clean copies and the write log in use (dirty
    /// blocks, older copies of them not yet released, record headers).
    pub fn allocated_bytes(&self) -> u64 {
        self.clean_bytes + self.log.used
    }

    /// The status as Prometheus text lines, labelled with the volume's name.
    pub fn prometheus(&self) -> String {
        let l = format!("volume=\"{}\"", self.name);
        let mut out = String::new();
        let mut line = |name: &str, help: &str, value: u64| {
            out.push_str(&format!(
                "# HELP terrace_volume_{name} {help}\n# TYPE terrace_volume_{name} gauge\n\
                 terrace_volume_{name}{{{l}}} {value}\n"
            ));
        };
        line("size_bytes", "Volume size.", self.size);
        line(
            "flush_in_progress",
            "1 while a flush or snapshot is writing back.",
            u64::from(self.flush.is_some()),
        );
        line(
            "flush_start_dirty_bytes",
            "Dirty bytes when the flush in progress began (0 when none is).",
            self.flush.map_or(0, |f| f.dirty_at_start),
        );
        line(
            "flush_written_back_bytes",
            "Bytes the flush in progress has written back (0 when none is).",
            self.flush.map_or(0, |f| f.written_back),
        );
        line(
            "dirty_bytes",
            "Bytes in the write log not yet in the backend.",
            self.dirty_bytes,
        );
        line(
            "clean_bytes",
            "Bytes of clean blocks with a copy in the cache.",
            self.clean_bytes,
        );
        line(
            "present_bytes",
            "Bytes of the volume the tiers hold (clean and dirty).",
            self.present_bytes(),
        );
        line(
            "allocated_bytes",
            "Tier bytes the volume takes: clean copies and the write log in use.",
            self.allocated_bytes(),
        );
        line(
            "log_used_bytes",
            "Write log bytes between head and tail.",
            self.log.used,
        );
        line(
            "log_capacity_bytes",
            "Write log record area.",
            self.log.capacity,
        );
        line(
            "read_hit_blocks",
            "Blocks read from the cache.",
            self.read_hit_blocks,
        );
        line(
            "read_miss_blocks",
            "Blocks read from the backend.",
            self.read_miss_blocks,
        );
        line(
            "read_dirty_blocks",
            "Blocks read from the write log.",
            self.read_dirty_blocks,
        );
        line("read_bytes", "Bytes read by clients.", self.bytes_read);
        line(
            "written_bytes",
            "Bytes written by clients.",
            self.bytes_written,
        );
        line(
            "written_back_bytes",
            "Bytes the write-back wrote to the backend.",
            self.written_back_bytes,
        );
        line(
            "batches_written_back",
            "Batches of the log written back and released.",
            self.batches_written_back,
        );
        line(
            "backend_errors",
            "Backend operations that failed.",
            self.backend_errors,
        );
        line(
            "cache_errors",
            "Cache operations that failed (clean data dropped).",
            self.cache_errors,
        );
        line(
            "overtaken_writes",
            "Logged writes overtaken by a newer one to the same blocks and retried.",
            self.overtaken_writes,
        );
        line(
            "bypassed_writes",
            "Write-back writes sent straight to the backend while the log was congested.",
            self.bypassed_writes,
        );
        line(
            "bypassed_bytes",
            "Bytes of those writes.",
            self.bypassed_bytes,
        );
        line(
            "batches_compacted",
            "Storage mode: log batches compacted (live blocks copied, the batch released).",
            self.batches_compacted,
        );
        line(
            "log_full_waits",
            "Writes that waited for log space.",
            self.log.full_waits,
        );
        if let Some(r) = &self.replication {
            out.push_str(&r.prometheus(&self.name));
        }
        out
    }
}

#[derive(Default)]
struct Counters {
    read_hit_blocks: AtomicU64,
    read_miss_blocks: AtomicU64,
    read_dirty_blocks: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    written_back_bytes: AtomicU64,
    batches_written_back: AtomicU64,
    backend_errors: AtomicU64,
    cache_errors: AtomicU64,
    /// Logged changes whose reservation a newer record overtook (taken again).
    overtaken: AtomicU64,
    bypassed_writes: AtomicU64,
    bypassed_bytes: AtomicU64,
    batches_compacted: AtomicU64,
}

/// The write-back thread's instructions.
struct Control {
    shutdown: bool,
    /// Drain requests made and served: a drain waits until `served >= its request`.
    drain_requested: u64,
    drain_served: u64,
    /// Dirty bytes, and bytes written back so far, when the drains now waiting began
    /// (flush progress).
    drain_started_dirty: u64,
    drain_started_written_back: u64,
    last_error: Option<String>,
    /// Set while usage is between the watermarks after passing the high one.
    cleaning: bool,
}

/// A cached block volume. See the module docs.
pub struct Volume {
    config: VolumeConfig,
    /// Bytes; only grows ([`Volume::grow`]).
    size: AtomicU64,
    /// Blocks that may have a copy in the cache (see `cached`).
    cached: CachedBlocks,
    /// Held by a grow or a snapshot from start to end: one at a time.
    growing: Mutex<()>,
    /// Every change holds it shared; a snapshot holds it alone while it drains the last
    /// dirty blocks and turns `snapshotting` on.
    writes_gate: RwLock<()>,
    /// While a snapshot copies the backend: every write goes to the log, whatever the
    /// mode, and the write-back waits — so the backend holds still (V7).
    snapshotting: AtomicBool,
    backend: Arc<dyn Backend>,
    cache: Arc<Cache>,
    log: WriteLog,
    mode: AtomicU8,
    shards: Box<[Mutex<Shard>]>,
    dirty_blocks: AtomicU64,
    /// When the volume opened, and the last request since then (ms), for idle write-back.
    opened: Instant,
    last_request_ms: AtomicU64,
    /// A write-through write reached the backend since its last flush.
    backend_unflushed: AtomicBool,
    /// Serializes write-through flushes (a leaf but for the backend's own locks).
    backend_flush: Mutex<()>,
    /// Bypassing writes that reached the backend, and how many of them the last group
    /// flush covered (written under `backend_flush`).
    bypass_writes_done: AtomicU64,
    bypass_flushed_through: AtomicU64,
    /// Set by close(): requests fail from then on.
    closed: AtomicBool,
    /// `Control::cleaning`, readable without the lock (for the large-write bypass).
    cleaning: AtomicBool,
    /// Where the last read ended and how long its stream is, for the cutoff.
    read_stream: Mutex<(u64, u64)>,
    control: Mutex<Control>,
    wake: Condvar,
    drained: Condvar,
    counters: Counters,
    writeback: Mutex<Option<JoinHandle<()>>>,
    /// Misses counted towards promotion.
    promotion: Promotion,
    /// Buffers the write-back workers copy runs into, kept between batches so their pages
    /// are not faulted in afresh for every batch (a leaf lock).
    /// Block-aligned, so an `O_DIRECT` backend writes them without a bounce buffer.
    writeback_buffers: Mutex<Vec<AlignedBuf>>,
    /// The write log's replication, when the volume is replicated (its store writes
    /// through it; the volume asks it whether writes are taken).
    replication: Option<Arc<Replication>>,
}

impl Volume {
    /// Opens a volume over `backend` with clean blocks in `cache`, creating its write log
    /// or recovering it (the dirty map is rebuilt from the records after the head), and
    /// starts its write-back thread.
    pub fn open(
        config: VolumeConfig,
        backend: Arc<dyn Backend>,
        cache: Arc<Cache>,
    ) -> Result<(Arc<Volume>, RecoveryReport), VolumeError> {
        let copy = check_taken_over_copy(&config)?;
        let store = FileLogStore::open(&config.log_path, config.log_bytes)?;
        if let Some(state) = copy {
            // R7: written to from now on, the copy follows no primary's stream.
            let epoch = config.replication.as_ref().map_or(0, |rc| rc.epoch);
            let state_path = config.log_path.with_extension("replica");
            record_led(&state_path, state, epoch).map_err(|source| VolumeError::Io {
                path: state_path.clone(),
                source,
            })?;
        }
        Volume::open_with_store(config, backend, cache, Box::new(store))
    }

    /// [`Volume::open`] with a log store of the caller's (tests record crash images).
    pub fn open_with_store(
        config: VolumeConfig,
        backend: Arc<dyn Backend>,
        cache: Arc<Cache>,
        store: Box<dyn LogStore>,
    ) -> Result<(Arc<Volume>, RecoveryReport), VolumeError> {
        let started = Instant::now();
        let size = backend.size();
        if size == 0 || !size.is_multiple_of(BS) {
            return Err(VolumeError::Config(format!(
                "volume {}: the backend's {size} bytes is not a positive multiple of {BS}",
                config.name
            )));
        }
        if !(0.0..=1.0).contains(&config.low_watermark)
            || !(config.low_watermark..=1.0).contains(&config.high_watermark)
        {
            return Err(VolumeError::Config(format!(
                "volume {}: watermarks must satisfy 0 <= low <= high <= 1",
                config.name
            )));
        }
        let (store, replication) = match &config.replication {
            Some(rc) => {
                let r = Replication::start(&config.name, rc.clone(), store)?;
                let replicated: Box<dyn LogStore> = Box::new(ReplicatedStore::new(Arc::clone(&r)));
                (replicated, Some(r))
            }
            None => (store, None),
        };
        let (log, recovery) = WriteLog::open(store, size)?;
        // A grow the last run began and may not have finished (L5 in the log).
        let size = match recovery.grow_to {
            Some(target) => {
                let bad = |what: String| VolumeError::BadLog {
                    path: config.log_path.clone(),
                    what,
                };
                if backend.size() < target {
                    backend
                        .grow(target)
                        .map_err(|e| bad(format!("finishing the grow to {target} bytes: {e}")))?;
                }
                log.finish_grow().map_err(|e| bad(e.to_string()))?;
                tracing::info!(volume = %config.name, to = target, "unfinished grow finished");
                target
            }
            None => size,
        };
        let shards: Box<[Mutex<Shard>]> =
            (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect();
        let mut dirty = 0u64;
        for r in &recovery.records {
            let zero = match r.kind {
                RecordKind::Write => false,
                RecordKind::Zero => true,
                RecordKind::Barrier | RecordKind::Wrap | RecordKind::Pad => continue,
            };
            for i in 0..r.len / BS {
                let block = r.offset / BS + i;
                let entry = Dirty {
                    seq: r.seq,
                    pos: if zero { u64::MAX } else { r.pos },
                    within: i as u32,
                };
                if shards[shard_of(block)]
                    .lock()
                    .insert(block, entry)
                    .is_none()
                {
                    dirty += 1;
                }
            }
        }
        let report = RecoveryReport {
            log_created: recovery.created,
            records: recovery.records.len(),
            dirty_blocks: dirty as usize,
            scan_end: recovery.end,
            elapsed: started.elapsed(),
        };
        let promotion = Promotion::new(config.promote_after);
        // A cache that restarted warm may hold this volume's blocks from the last run:
        // every bit set (C1) until a count clears those it does not.
        let cache_may_hold_ours = cache.stats().tiers.iter().any(|t| t.items > 0);
        let volume = Arc::new(Volume {
            mode: AtomicU8::new(config.mode as u8),
            config,
            size: AtomicU64::new(size),
            growing: Mutex::new(()),
            writes_gate: RwLock::new(()),
            snapshotting: AtomicBool::new(false),
            cached: CachedBlocks::new(size / BS, cache_may_hold_ours),
            backend,
            cache,
            log,
            shards,
            dirty_blocks: AtomicU64::new(dirty),
            opened: Instant::now(),
            last_request_ms: AtomicU64::new(0),
            backend_unflushed: AtomicBool::new(false),
            backend_flush: Mutex::new(()),
            bypass_writes_done: AtomicU64::new(0),
            bypass_flushed_through: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            cleaning: AtomicBool::new(false),
            read_stream: Mutex::new((u64::MAX, 0)),
            control: Mutex::new(Control {
                shutdown: false,
                drain_requested: 0,
                drain_served: 0,
                drain_started_dirty: 0,
                drain_started_written_back: 0,
                last_error: None,
                cleaning: false,
            }),
            wake: Condvar::new(),
            drained: Condvar::new(),
            counters: Counters::default(),
            writeback: Mutex::new(None),
            writeback_buffers: Mutex::new(Vec::new()),
            promotion,
            replication,
        });
        if let Some(r) = &volume.replication {
            r.opened();
        }
        if volume.mode() == Mode::Storage {
            volume.log.keep_room(volume.compaction_room());
        }
        let worker = Arc::clone(&volume);
        let handle = std::thread::Builder::new()
            .name(format!("writeback-{}", volume.config.name))
            .spawn(move || worker.writeback_loop())
            .map_err(|source| VolumeError::Io {
                path: volume.config.log_path.clone(),
                source,
            })?;
        *volume.writeback.lock() = Some(handle);
        tracing::info!(
            volume = %volume.config.name,
            backend = %volume.backend.describe(),
            mode = volume.mode().name(),
            records = report.records,
            dirty_blocks = report.dirty_blocks,
            "volume opened"
        );
        Ok((volume, report))
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn mode(&self) -> Mode {
        Mode::from_u8(self.mode.load(Ordering::Acquire))
    }

    /// Switches the mode while running. Leaving write-back drains the log in the
    /// background; until then writes to dirty blocks still go through the log (V4).
    pub fn set_mode(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::Release);
        self.log.keep_room(if mode == Mode::Storage {
            self.compaction_room()
        } else {
            0
        });
        self.wake.notify_all();
        tracing::info!(volume = %self.config.name, mode = mode.name(), "mode changed");
    }

    /// The volume's size in bytes.
    pub fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Grows the volume to `new_size` bytes (a multiple of 4 KiB) while it runs
    /// (`terrace volume resize`): the log records the grow, the backend grows, the log
    /// ends the grow (L5 in the log), and only then do requests reach the new bytes, which
    /// read as zeroes. NBD clients already connected keep the size they were told; new
    /// connections get the new one. Shrinking is refused: a file system on the volume
    /// would lose whatever lies past the new end.
    pub fn grow(&self, new_size: u64) -> Result<(), VolumeError> {
        let _one_at_a_time = self.growing.lock();
        let size = self.size();
        let refuse = |why: String| {
            Err(VolumeError::Config(format!(
                "volume {}: {why}",
                self.config.name
            )))
        };
        if new_size == size {
            return Ok(());
        }
        if new_size < size {
            return refuse(format!(
                "shrinking from {size} to {new_size} bytes is not supported"
            ));
        }
        if !new_size.is_multiple_of(BS) {
            return refuse(format!("{new_size} bytes is not a multiple of {BS}"));
        }
        self.log
            .begin_grow(new_size)
            .map_err(|e| VolumeError::Config(format!("volume {}: {e}", self.config.name)))?;
        if let Err(e) = self.backend.grow(new_size) {
            let undone = self.log.cancel_grow();
            return refuse(format!(
                "the backend did not grow: {e}{}",
                undone
                    .err()
                    .map(|u| format!(" (and {u}: the grow finishes at the next open)"))
                    .unwrap_or_default()
            ));
        }
        self.log
            .finish_grow()
            .map_err(|e| VolumeError::Config(format!("volume {}: {e}", self.config.name)))?;
        self.cached.grow(new_size / BS);
        self.size.store(new_size, Ordering::Release);
        tracing::info!(volume = %self.config.name, from = size, to = new_size, "volume grown");
        Ok(())
    }

    /// Takes a snapshot named `tag` (`terrace volume snapshot`): writes every dirty block
    /// back; then, with writes held, writes back what came meanwhile, flushes the backend
    /// and turns `snapshotting` on; then, writes going on into the log, has the backend
    /// copy itself ([`Backend::snapshot`]) and turns it off, so the write-back catches
    /// up. The snapshot holds every write acknowledged before the call, in any mode (a
    /// storage volume's backend is written only here and at `flush`), and nothing after
    /// it. The first drain waits at most `timeout`, the one with writes held at most
    /// [`SNAPSHOT_HOLD`]. Returns where the snapshot is.
    pub fn snapshot(&self, tag: &str, timeout: Duration) -> Result<String, VolumeError> {
        let refuse =
            |why: String| VolumeError::Config(format!("volume {}: {why}", self.config.name));
        let valid = (1..=64).contains(&tag.len())
            && !tag.starts_with('.')
            && tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid {
            return Err(refuse(format!(
                "snapshot tag {tag:?}: 1 to 64 of A-Z a-z 0-9 - _ . (not first)"
            )));
        }
        let _one_at_a_time = self.growing.lock();
        let drain = |when: &str, timeout: Duration| {
            self.drain(timeout)
                .map_err(|e| refuse(format!("snapshot {tag}: writing back {when}: {e}")))
        };
        drain("the dirty blocks", timeout)?;
        {
            let _writes_held = self.writes_gate.write();
            drain("the last dirty blocks", timeout.min(SNAPSHOT_HOLD))?;
            self.backend
                .flush()
                .map_err(|e| refuse(format!("snapshot {tag}: flushing the backend: {e}")))?;
            self.backend_unflushed.store(false, Ordering::Release);
            self.snapshotting.store(true, Ordering::Release);
        }
        let taken = self.backend.snapshot(tag);
        self.snapshotting.store(false, Ordering::Release);
        self.wake.notify_all();
        let taken = taken.map_err(|e| refuse(format!("snapshot {tag}: {e}")))?;
        tracing::info!(volume = %self.config.name, tag, at = %taken, "snapshot taken");
        Ok(taken)
    }

    /// Writes every dirty block back (`terrace volume flush`), waiting at most `timeout`.
    pub fn drain(&self, timeout: Duration) -> Result<(), BlockError> {
        let deadline = Instant::now() + timeout;
        let mut c = self.control.lock();
        if c.drain_requested == c.drain_served {
            c.drain_started_dirty = self.dirty_blocks.load(Ordering::Relaxed) * BS;
            c.drain_started_written_back = self.counters.written_back_bytes.load(Ordering::Relaxed);
        }
        c.drain_requested += 1;
        let ticket = c.drain_requested;
        self.wake.notify_all();
        while c.drain_served < ticket {
            if c.shutdown {
                return Err(BlockError::ShuttingDown);
            }
            if self.drained.wait_until(&mut c, deadline).timed_out() {
                let why = c
                    .last_error
                    .clone()
                    .unwrap_or_else(|| "still writing back".into());
                return Err(BlockError::Backend {
                    what: format!("drain did not finish in {timeout:?}"),
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, why),
                });
            }
        }
        Ok(())
    }

    /// Stops the write-back thread (dirty blocks stay in the log for the next open) and
    /// syncs the log. Requests after this fail.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // A sync waiting for peers (below min_replicas) would hold the write-back.
        if let Some(r) = &self.replication {
            r.stop();
        }
        self.control.lock().shutdown = true;
        self.wake.notify_all();
        self.drained.notify_all();
        if let Some(handle) = self.writeback.lock().take() {
            let _ = handle.join();
        }
        if let Err(e) = self.log.sync() {
            tracing::warn!(volume = %self.config.name, error = %e, "syncing the write log at close");
        }
        self.log.unlock();
    }

    pub fn status(&self) -> VolumeStatus {
        let c = &self.counters;
        // Taken and dropped first: `control` nests under no shard and no shard under it.
        let (last_error, flush) = {
            let control = self.control.lock();
            let flushing = control.drain_requested > control.drain_served;
            let done = c
                .written_back_bytes
                .load(Ordering::Relaxed)
                .saturating_sub(control.drain_started_written_back);
            (
                control.last_error.clone(),
                flushing.then_some(FlushProgress {
                    dirty_at_start: control.drain_started_dirty,
                    written_back: done,
                }),
            )
        };
        VolumeStatus {
            name: self.config.name.clone(),
            mode: self.mode(),
            ack: self.config.ack,
            size: self.size(),
            backend: self.backend.describe(),
            dirty_bytes: self.dirty_blocks.load(Ordering::Relaxed) * BS,
            clean_bytes: self.clean_cached_blocks() * BS,
            log: self.log.stats(),
            read_hit_blocks: c.read_hit_blocks.load(Ordering::Relaxed),
            read_miss_blocks: c.read_miss_blocks.load(Ordering::Relaxed),
            read_dirty_blocks: c.read_dirty_blocks.load(Ordering::Relaxed),
            bytes_read: c.bytes_read.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            written_back_bytes: c.written_back_bytes.load(Ordering::Relaxed),
            batches_written_back: c.batches_written_back.load(Ordering::Relaxed),
            backend_errors: c.backend_errors.load(Ordering::Relaxed),
            cache_errors: c.cache_errors.load(Ordering::Relaxed),
            overtaken_writes: c.overtaken.load(Ordering::Relaxed),
            bypassed_writes: c.bypassed_writes.load(Ordering::Relaxed),
            bypassed_bytes: c.bypassed_bytes.load(Ordering::Relaxed),
            batches_compacted: c.batches_compacted.load(Ordering::Relaxed),
            last_error,
            flush,
            replication: self.replication.as_ref().map(|r| r.status()),
        }
    }

    /// Puts a clean copy of `block` in the cache, its bit set first (C1 in `cached`). The
    /// caller holds the block's shard lock.
    fn cache_put(&self, block: u64, value: &[u8]) -> Result<(), terrace_cache::CacheError> {
        self.cached.mark(block);
        self.cache.set(&self.key(block), value, 0, 0).map(|_| ())
    }

    /// Drops `block`'s cached copy — a lookup only if its bit says it may have one. The
    /// caller holds the block's shard lock.
    fn cache_drop(&self, block: u64) -> Result<(), terrace_cache::CacheError> {
        if !self.cached.may_hold(block) {
            return Ok(());
        }
        self.cache.delete(&self.key(block))?;
        self.cached.unmark(block);
        Ok(())
    }

    /// Blocks with a clean copy in the cache: the marked ones whose copy is still there
    /// and that are not dirty, each looked up under its shard lock (C2), the bits of those
    /// the cache evicted cleared on the way.
    fn clean_cached_blocks(&self) -> u64 {
        let mut clean = 0;
        for block in self.cached.marked() {
            let shard = self.shards[shard_of(block)].lock();
            let dirty = shard.contains_key(&block);
            match self.cache.peek(&self.key(block)) {
                Ok(Some(_)) => clean += u64::from(!dirty),
                Ok(None) => self.cached.unmark(block),
                Err(_) => {}
            }
        }
        clean
    }

    fn key(&self, block: u64) -> [u8; 12] {
        let mut key = [0u8; 12];
        key[..4].copy_from_slice(&self.config.id.to_le_bytes());
        key[4..].copy_from_slice(&block.to_le_bytes());
        key
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(BlockError::ShuttingDown);
        }
        match offset.checked_add(len) {
            Some(end) if len > 0 && end <= self.size() => Ok(()),
            _ => Err(BlockError::OutOfRange {
                offset,
                len,
                size: self.size(),
            }),
        }
    }

    fn touch(&self) {
        let now = self.opened.elapsed().as_millis() as u64;
        self.last_request_ms.store(now, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        let last = self.last_request_ms.load(Ordering::Relaxed);
        Duration::from_millis((self.opened.elapsed().as_millis() as u64).saturating_sub(last))
    }

    fn lock_blocks(&self, first: u64, last: u64) -> Locked<'_> {
        let mut indexes: Vec<usize> = if last - first + 1 >= SHARDS as u64 * SHARD_STRIPE {
            (0..SHARDS).collect()
        } else {
            (first / SHARD_STRIPE..=last / SHARD_STRIPE)
                .map(|stripe| shard_of(stripe * SHARD_STRIPE))
                .collect()
        };
        indexes.sort_unstable();
        indexes.dedup();
        Locked {
            guards: indexes
                .into_iter()
                .map(|i| (i, self.shards[i].lock()))
                .collect(),
        }
    }

    fn backend_error(&self, what: String, source: std::io::Error) -> BlockError {
        self.counters.backend_errors.fetch_add(1, Ordering::Relaxed);
        BlockError::Backend { what, source }
    }

    fn cache_failed(&self, what: &str, e: terrace_cache::CacheError) {
        self.counters.cache_errors.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(volume = %self.config.name, error = %e, "cache {what} failed");
    }

    /// Whether a read starting at `offset` continues a stream past the cutoff.
    fn sequential(&self, offset: u64, len: u64) -> bool {
        let cutoff = self.config.sequential_cutoff;
        let mut s = self.read_stream.lock();
        s.1 = if s.0 == offset { s.1 + len } else { len };
        s.0 = offset + len;
        cutoff > 0 && s.1 > cutoff
    }

    /// Reads whole blocks `[first, first + out.len() / BS)` into `out`, all locked.
    fn read_blocks_locked(
        &self,
        locked: &mut Locked<'_>,
        first: u64,
        out: &mut [u8],
        misses: Misses,
    ) -> Result<bool, BlockError> {
        let count = out.len() as u64 / BS;
        let mut missing: Vec<u64> = Vec::new();
        let (mut hit_blocks, mut dirty_blocks) = (0, 0);
        for i in 0..count {
            let block = first + i;
            let dest = &mut out[(i * BS) as usize..((i + 1) * BS) as usize];
            if let Some(d) = locked.shard(block).get(&block).copied() {
                dirty_blocks += 1;
                if d.is_zero() {
                    dest.fill(0);
                } else {
                    self.log
                        .read_payload(d.pos, u64::from(d.within) * BS, dest)
                        .map_err(|e| BlockError::Log(format!("reading block {block}: {e}")))?;
                }
                continue;
            }
            match self.cache.get(&self.key(block)) {
                Ok(Some(hit)) if hit.value().len() == BLOCK_SIZE => {
                    dest.copy_from_slice(hit.value());
                    hit_blocks += 1;
                }
                Ok(_) if misses == Misses::Refuse => return Ok(false),
                Ok(_) => missing.push(i),
                Err(e) => {
                    self.cache_failed("get", e);
                    if misses == Misses::Refuse {
                        return Ok(false);
                    }
                    missing.push(i);
                }
            }
        }
        let c = &self.counters;
        c.read_hit_blocks.fetch_add(hit_blocks, Ordering::Relaxed);
        c.read_dirty_blocks
            .fetch_add(dirty_blocks, Ordering::Relaxed);
        // Misses, one backend read per run of consecutive blocks.
        let mut at = 0;
        while at < missing.len() {
            let mut end = at + 1;
            while end < missing.len() && missing[end] == missing[end - 1] + 1 {
                end += 1;
            }
            let (lo, hi) = (missing[at], missing[end - 1] + 1);
            let bytes = &mut out[(lo * BS) as usize..(hi * BS) as usize];
            let offset = (first + lo) * BS;
            self.backend
                .read_at(offset, bytes)
                .map_err(|e| self.backend_error(format!("read at {offset}"), e))?;
            self.counters
                .read_miss_blocks
                .fetch_add(hi - lo, Ordering::Relaxed);
            if misses == Misses::ReadAndCache {
                for i in lo..hi {
                    if !self.promotion.promotes(first + i) {
                        continue;
                    }
                    let value = &out[(i * BS) as usize..((i + 1) * BS) as usize];
                    if let Err(e) = self.cache_put(first + i, value) {
                        self.cache_failed("set", e);
                    }
                }
            }
            at = end;
        }
        Ok(true)
    }

    /// The pieces of a change, as (kind, offset, length): one WRITE of the blocks it
    /// touches, or for zeroes a WRITE per partial edge block and a ZERO of the whole
    /// blocks between. The log records a logged change reserves (before any shard is
    /// locked, V1), and the steps of a write-through zeroing.
    fn plan(&self, offset: u64, len: u64, zero: bool) -> Vec<(RecordKind, u64, u64)> {
        let first = offset / BS;
        let end_block = (offset + len).div_ceil(BS);
        if !zero {
            return vec![(RecordKind::Write, first * BS, (end_block - first) * BS)];
        }
        let mut parts = Vec::new();
        let head_partial = !offset.is_multiple_of(BS);
        let tail_partial = !(offset + len).is_multiple_of(BS);
        let mut mid_first = first;
        let mut mid_end = end_block;
        if head_partial {
            parts.push((RecordKind::Write, first * BS, BS));
            mid_first += 1;
        }
        if tail_partial && end_block > mid_first {
            parts.push((RecordKind::Write, (end_block - 1) * BS, BS));
            mid_end -= 1;
        }
        if mid_end > mid_first {
            parts.push((RecordKind::Zero, mid_first * BS, (mid_end - mid_first) * BS));
        }
        parts
    }

    /// The bytes of blocks `[first, first + n)` after applying `change` at `offset`.
    fn merged(
        &self,
        locked: &mut Locked<'_>,
        first: u64,
        n: u64,
        offset: u64,
        change: Change<'_>,
    ) -> Result<Vec<u8>, BlockError> {
        let mut buf = vec![0u8; (n * BS) as usize];
        let start = first * BS;
        let (lo, hi) = (
            offset.max(start),
            (offset + change.len()).min(start + n * BS),
        );
        let whole = lo == start && hi == start + n * BS;
        if !whole {
            // Only the edge blocks need their current bytes.
            let edges = if n == 1 { vec![0] } else { vec![0, n - 1] };
            for e in edges {
                let range = (e * BS) as usize..((e + 1) * BS) as usize;
                self.read_blocks_locked(locked, first + e, &mut buf[range], Misses::Read)?;
            }
        }
        let dest = &mut buf[(lo - start) as usize..(hi - start) as usize];
        match change {
            Change::Data(d) => {
                dest.copy_from_slice(&d[(lo - offset) as usize..(hi - offset) as usize])
            }
            Change::Zeroes(_) => dest.fill(0),
        }
        Ok(buf)
    }

    /// A change through the write log (write-back, or any write to a dirty block).
    fn change_logged(&self, offset: u64, change: Change<'_>, fua: bool) -> Result<(), BlockError> {
        self.change_logged_within(offset, change, fua, self.config.full_wait)
            .map(|_| ())
    }

    /// [`change_logged`](Self::change_logged) waiting at most `full_wait` for log space;
    /// Ok(false), with nothing written, if a zero wait found the log full.
    fn change_logged_within(
        &self,
        offset: u64,
        change: Change<'_>,
        fua: bool,
        full_wait: Duration,
    ) -> Result<bool, BlockError> {
        let len = change.len();
        let plan = self.plan(offset, len, matches!(change, Change::Zeroes(_)));
        let first = offset / BS;
        let last = (offset + len - 1) / BS;
        // V3: a record must be newer than every record already applied to its blocks —
        // else a partial write would merge bytes that a record it precedes in the log
        // will hide (and recovery replay in the other order). Reservations come before
        // the locks (V1), so one overtaken meanwhile is padded and taken again.
        let (reserved, mut locked) = loop {
            let reserved = match self.log.reserve_all(&plan, full_wait) {
                Ok(reserved) => reserved,
                Err(BlockError::LogFull { .. }) if full_wait.is_zero() => return Ok(false),
                Err(e) => return Err(e),
            };
            let mut locked = self.lock_blocks(first, last);
            let oldest = reserved.iter().map(|m| m.seq).min().unwrap_or(0);
            let overtaken =
                (first..=last).any(|b| locked.shard(b).get(&b).is_some_and(|d| d.seq > oldest));
            if !overtaken {
                break (reserved, locked);
            }
            drop(locked);
            for unused in &reserved {
                self.log.abandon(unused)?;
            }
            self.counters.overtaken.fetch_add(1, Ordering::Relaxed);
        };
        let mut newest = 0;
        for (n, meta) in reserved.iter().enumerate() {
            let blocks = meta.len / BS;
            let mb = meta.offset / BS;
            let aligned = offset == meta.offset && len == meta.len;
            let written = match (meta.kind, change) {
                (RecordKind::Write, Change::Data(d)) if aligned => self.log.write_record(meta, d),
                (RecordKind::Write, _) => self
                    .merged(&mut locked, mb, blocks, offset, change)
                    .and_then(|bytes| self.log.write_record(meta, &bytes)),
                _ => self.log.write_record(meta, &[]),
            };
            if let Err(e) = written {
                // This record and the rest of the request's are padded, so the log reads
                // on past them; the records before stay (a failed write may leave part
                // of its range changed, as a disk's may).
                for unused in &reserved[n..] {
                    if let Err(pad) = self.log.abandon(unused) {
                        tracing::warn!(volume = %self.config.name, error = %pad, "padding a record");
                    }
                }
                return Err(e);
            }
            for i in 0..blocks {
                let block = mb + i;
                let entry = Dirty {
                    seq: meta.seq,
                    pos: if meta.kind == RecordKind::Zero {
                        u64::MAX
                    } else {
                        meta.pos
                    },
                    within: i as u32,
                };
                let shard = locked.shard(block);
                match shard.get(&block) {
                    Some(old) if old.seq > meta.seq => {}
                    Some(_) => {
                        shard.insert(block, entry);
                    }
                    None => {
                        shard.insert(block, entry);
                        self.dirty_blocks.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            newest = newest.max(meta.seq);
        }
        drop(locked);
        if fua || self.config.ack == AckDurability::OnWrite {
            self.log.wait_durable(newest)?;
        } else {
            // On-flush: not synced, but every record before it written, so a process
            // crash (the page cache keeps written bytes) loses nothing acknowledged.
            self.log.wait_written(newest)?;
        }
        Ok(true)
    }

    /// A change straight to the backend (write-through, write-around, a bypassing
    /// write-back write) — unless a block it touches is dirty, which sends it through the
    /// log (V4). True if it went to the backend.
    fn change_direct(
        &self,
        offset: u64,
        change: Change<'_>,
        fua: bool,
        keep_cached: bool,
    ) -> Result<bool, BlockError> {
        let len = change.len();
        let first = offset / BS;
        let last = (offset + len - 1) / BS;
        let mut locked = self.lock_blocks(first, last);
        // Over a range wider than the dirty map, look through the map instead.
        let dirty = if last - first + 1 > self.dirty_blocks.load(Ordering::Relaxed) {
            locked.any_dirty_in(first..=last)
        } else {
            (first..=last).any(|b| locked.shard(b).contains_key(&b))
        };
        if dirty {
            drop(locked);
            return self.change_logged(offset, change, fua).map(|()| false);
        }
        let n = last - first + 1;
        // V2: no cached copy while the backend changes.
        for b in first..=last {
            if let Err(e) = self.cache_drop(b) {
                let source = std::io::Error::other(e.to_string());
                self.cache_failed("delete", e);
                return Err(BlockError::Backend {
                    what: format!("dropping the cached copy of block {b}"),
                    source,
                });
            }
        }
        let aligned = offset == first * BS && len == n * BS;
        let bytes: Vec<u8>;
        let data: &[u8] = match change {
            Change::Data(d) if aligned => d,
            Change::Data(_) => {
                bytes = self.merged(&mut locked, first, n, offset, change)?;
                &bytes
            }
            Change::Zeroes(_) => {
                // The partial edge blocks are written (read-modify-write), the whole
                // blocks between them trimmed: never a buffer the size of the range.
                for (kind, at, count) in self.plan(offset, len, true) {
                    let block = at / BS;
                    let result = if kind == RecordKind::Write {
                        let edge = self.merged(&mut locked, block, 1, offset, change)?;
                        self.backend.write_at(at, &edge)
                    } else {
                        self.backend.trim(at, count)
                    };
                    result.map_err(|e| self.backend_error(format!("zeroing at {at}"), e))?;
                }
                &[]
            }
        };
        if !data.is_empty() {
            self.backend
                .write_at(first * BS, data)
                .map_err(|e| self.backend_error(format!("write at {}", first * BS), e))?;
        }
        if fua {
            self.backend
                .flush()
                .map_err(|e| self.backend_error("flush".into(), e))?;
        } else {
            self.backend_unflushed.store(true, Ordering::Release);
        }
        if keep_cached && !data.is_empty() {
            for i in 0..n {
                let value = &data[(i * BS) as usize..((i + 1) * BS) as usize];
                if let Err(e) = self.cache_put(first + i, value) {
                    self.cache_failed("set", e);
                }
            }
        }
        Ok(true)
    }

    /// Whether a write (or a write-back run) of `len` bytes is large: not cached.
    fn is_large(&self, len: u64) -> bool {
        self.config.large_write > 0 && len >= self.config.large_write
    }

    /// Whether a write-back write of `len` bytes should bypass the log: it is large, the
    /// log is congested (the write-back is the bottleneck, so the backend has time the
    /// log does not), and no barrier is pending — so landing it before the log's records
    /// reorders it only among writes no flush has ordered, and the backend stays a
    /// crash-consistent image (V5).
    ///
    /// Large zeroings (trims, write-zeroes) bypass whenever no barrier is pending: a
    /// backend zeroes a range at the cost of a metadata update, where the log would keep
    /// a dirty entry per block (a discard of a whole 1 TiB volume, as mkfs sends, would
    /// be 268 M of them).
    fn bypasses(&self, change: &Change<'_>) -> bool {
        if !self.is_large(change.len()) {
            return false;
        }
        if matches!(change, Change::Zeroes(_)) {
            return !self.log.has_barriers();
        }
        // Congested: the write-back is cleaning (from the high watermark down to the low
        // one), or the log is past the high watermark already, or writers wait for space.
        let congested = self.cleaning.load(Ordering::Relaxed) || self.log.space_waiters() > 0 || {
            let usage = self.log.stats();
            usage.used as f64 >= self.config.high_watermark * usage.capacity as f64
        };
        congested && !self.log.has_barriers()
    }

    /// A write-back write that bypasses the log (see [`bypasses`](Self::bypasses)): a
    /// write-around write, made durable before its acknowledgement when writes are
    /// acknowledged on write. If the backend fails it, the write goes through the log
    /// after all: a write-back volume keeps acknowledging while its backend is down.
    fn change_bypassing(
        &self,
        offset: u64,
        change: Change<'_>,
        fua: bool,
    ) -> Result<(), BlockError> {
        let direct = self
            .change_direct(offset, change, fua, false)
            .and_then(|direct| {
                if direct && !fua && self.config.ack == AckDurability::OnWrite {
                    self.sync_bypassed_writes()?;
                }
                Ok(direct)
            });
        match direct {
            Ok(false) => Ok(()), // a dirty block sent it through the log
            Ok(true) => {
                self.counters
                    .bypassed_writes
                    .fetch_add(1, Ordering::Relaxed);
                self.counters
                    .bypassed_bytes
                    .fetch_add(change.len(), Ordering::Relaxed);
                Ok(())
            }
            Err(e @ BlockError::Backend { .. }) => {
                tracing::debug!(volume = %self.config.name, error = %e, "bypass failed; logging");
                self.change_logged(offset, change, fua)
            }
            Err(e) => Err(e),
        }
    }

    /// Makes every bypassing write that reached the backend before this call durable,
    /// one backend flush for all the writers waiting at once (group commit): a write
    /// takes a ticket once written; a flush covers every ticket taken before it starts.
    fn sync_bypassed_writes(&self) -> Result<(), BlockError> {
        let ticket = self.bypass_writes_done.fetch_add(1, Ordering::AcqRel) + 1;
        let _one_at_a_time = self.backend_flush.lock();
        if self.bypass_flushed_through.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let through = self.bypass_writes_done.load(Ordering::Acquire);
        self.backend
            .flush()
            .map_err(|e| self.backend_error("flush after bypassing writes".into(), e))?;
        self.bypass_flushed_through
            .store(through, Ordering::Release);
        Ok(())
    }

    fn change(&self, offset: u64, change: Change<'_>, fua: bool) -> Result<(), BlockError> {
        self.check(offset, change.len())?;
        let _gate = self.writes_gate.read();
        self.touch();
        let result = match self.mode() {
            Mode::ReadOnly => Err(BlockError::ReadOnly),
            // Too few copies in sync, or fenced: writes stop, reads go on.
            _ if self
                .replication
                .as_ref()
                .is_some_and(|r| !r.accepts_writes()) =>
            {
                Err(BlockError::ReadOnly)
            }
            // V7: the backend holds still while a snapshot copies it.
            _ if self.snapshotting.load(Ordering::Acquire) => {
                self.change_logged(offset, change, fua)
            }
            Mode::WriteBack if self.bypasses(&change) => self.change_bypassing(offset, change, fua),
            Mode::WriteBack | Mode::Storage => self.change_logged(offset, change, fua),
            Mode::WriteThrough => {
                let keep = !self.is_large(change.len());
                self.change_direct(offset, change, fua, keep).map(|_| ())
            }
            Mode::WriteAround => self.change_direct(offset, change, fua, false).map(|_| ()),
        };
        if result.is_ok() {
            self.counters
                .bytes_written
                .fetch_add(change.len(), Ordering::Relaxed);
        }
        result
    }

    /// A checked read with its blocks locked; false if `misses` refused a block.
    fn read_locked(&self, offset: u64, buf: &mut [u8], misses: Misses) -> Result<bool, BlockError> {
        let len = buf.len() as u64;
        self.touch();
        let first = offset / BS;
        let last = (offset + len - 1) / BS;
        let mut locked = self.lock_blocks(first, last);
        let done = if offset.is_multiple_of(BS) && len.is_multiple_of(BS) {
            self.read_blocks_locked(&mut locked, first, buf, misses)?
        } else {
            let mut whole = vec![0u8; ((last - first + 1) * BS) as usize];
            let done = self.read_blocks_locked(&mut locked, first, &mut whole, misses)?;
            let from = (offset - first * BS) as usize;
            buf.copy_from_slice(&whole[from..from + buf.len()]);
            done
        };
        // V8: a read of a record not yet durable waits for it, as its writer does.
        let newest = (self.config.ack == AckDurability::OnWrite)
            .then(|| {
                (first..=last)
                    .filter_map(|b| locked.shard(b).get(&b).map(|d| d.seq))
                    .max()
            })
            .flatten();
        drop(locked);
        if let (true, Some(seq)) = (done, newest) {
            self.log.wait_durable(seq)?;
        }
        if done {
            self.counters.bytes_read.fetch_add(len, Ordering::Relaxed);
        }
        Ok(done)
    }

    // ---- the write-back thread ----

    fn writeback_loop(&self) {
        let mut backoff = Duration::from_millis(50);
        // In storage mode: no compaction before this (the last pass could not free).
        let mut compact_after: Option<Instant> = None;
        loop {
            {
                let mut c = self.control.lock();
                loop {
                    if c.shutdown {
                        return;
                    }
                    let has_data = self.log.has_data_records();
                    let usage = self.log.stats();
                    let share = usage.used as f64 / usage.capacity as f64;
                    // Writers waiting for space start it too, whatever the watermark.
                    if share >= self.config.high_watermark || self.log.space_waiters() > 0 {
                        c.cleaning = true;
                        self.cleaning.store(true, Ordering::Relaxed);
                    } else if share <= self.config.low_watermark {
                        c.cleaning = false;
                        self.cleaning.store(false, Ordering::Relaxed);
                    }
                    let drain = c.drain_requested > c.drain_served;
                    if !has_data {
                        if drain {
                            c.drain_served = c.drain_requested;
                            self.drained.notify_all();
                        }
                        // Release what only barriers and wraps hold.
                        if usage.used > 0 {
                            break;
                        }
                        self.wake.wait_for(&mut c, Duration::from_millis(200));
                        continue;
                    }
                    if self.snapshotting.load(Ordering::Acquire) {
                        // The backend is being copied: nothing reaches it meanwhile
                        // (writes wait in the log, drains for the snapshot's end).
                        self.wake.wait_for(&mut c, Duration::from_millis(100));
                        continue;
                    }
                    let mode = self.mode();
                    let idle = self.idle_for() >= self.config.idle_writeback;
                    if mode == Mode::Storage && !drain {
                        if c.cleaning && compact_after.is_none_or(|t| Instant::now() >= t) {
                            break;
                        }
                    } else if drain || c.cleaning || idle || !mode.logs_writes() {
                        break;
                    }
                    self.wake.wait_for(&mut c, Duration::from_millis(100));
                }
            }
            let storage = self.mode() == Mode::Storage;
            if storage && !self.drain_pending() {
                match self.compact_one_batch() {
                    Ok(true) => compact_after = None,
                    Ok(false) => compact_after = Some(Instant::now() + COMPACT_RETRY),
                    Err(e) => {
                        tracing::warn!(volume = %self.config.name, error = %e, "compaction failed");
                        self.control.lock().last_error = Some(e.to_string());
                        compact_after = Some(Instant::now() + COMPACT_RETRY);
                    }
                }
                continue;
            }
            match self.write_back_one_batch() {
                Ok(true) => backoff = Duration::from_millis(50),
                Ok(false) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => {
                    tracing::warn!(volume = %self.config.name, error = %e, "write-back failed; retrying");
                    self.control.lock().last_error = Some(e.to_string());
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// A replicated primary whose lease ran out writes nothing more to the backend:
    /// another node may lead the volume and write newer data there. Checked before each
    /// batch and right before each run's backend write. A pause between that check and
    /// the write (the fault soak once caught a primary SIGSTOPped inside a run write
    /// older data over newer) is covered, under a coordinator, by the backend's writer
    /// lock ([`crate::fence`]): the next primary writes nothing back until this one's
    /// volume has closed. NBD and S3 backends have no such lock.
    fn check_may_write_back(&self) -> Result<(), BlockError> {
        match &self.replication {
            Some(r) if !r.lease_holds() => Err(BlockError::Log(
                "the primary's lease ran out: no more write-back from this node".into(),
            )),
            _ => Ok(()),
        }
    }

    /// Writes the oldest batch back and releases it (V5).
    /// Ok(false) if there was nothing to take yet (the oldest record is still being
    /// written).
    fn write_back_one_batch(&self) -> Result<bool, BlockError> {
        self.check_may_write_back()?;
        let Some(batch) = self.log.oldest_batch(WRITE_BACK_BATCH) else {
            return Ok(false);
        };
        let newest = newest_in(&batch);
        let runs = runs_of(newest.keys().copied().collect(), &newest);
        let next = AtomicU64::new(0);
        let failure: Mutex<Option<BlockError>> = Mutex::new(None);
        let workers = self
            .config
            .writeback_threads
            .clamp(1, 64)
            .min(runs.len().max(1));
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| {
                    let kept = self.writeback_buffers.lock().pop();
                    let mut buffer = match kept.map_or_else(|| run_buffer(RUN_BLOCKS), Ok) {
                        Ok(buffer) => buffer,
                        Err(e) => {
                            *failure.lock() = Some(e);
                            return;
                        }
                    };
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                        if i >= runs.len() || failure.lock().is_some() {
                            break;
                        }
                        if let Err(e) = self.write_back_run(runs[i], &newest, &mut buffer) {
                            *failure.lock() = Some(e);
                            break;
                        }
                    }
                    self.writeback_buffers.lock().push(buffer);
                });
            }
        });
        if let Some(e) = failure.into_inner() {
            return Err(e);
        }
        self.backend
            .flush()
            .map_err(|e| self.backend_error("flush after a batch".into(), e))?;
        let last = *batch.last().expect("a batch is never empty");
        // The head moves durably first, with no shard held: that may wait long (a
        // replicated log's sync waits for a copy in sync, indefinitely while the volume
        // is read-only) and reads must go on meanwhile. The batch's dirty entries stay
        // until after it, so a write to one of its blocks still goes through the log
        // (V4). Its space is reused, and the entries removed, with every shard held: no
        // read may follow a dirty entry into space being written over (V3).
        self.log.persist_release(&last)?;
        let mut all: Vec<MutexGuard<'_, Shard>> = self.shards.iter().map(|m| m.lock()).collect();
        self.log.reuse_through(&last);
        for (&block, d) in &newest {
            let shard = &mut all[shard_of(block)];
            if shard.get(&block).is_some_and(|now| now.seq == d.seq) {
                shard.remove(&block);
                self.dirty_blocks.fetch_sub(1, Ordering::Relaxed);
            }
        }
        drop(all);
        self.counters
            .batches_written_back
            .fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// The log space storage mode keeps free for compaction's copies: an eighth of the
    /// log, at most a batch.
    fn compaction_room(&self) -> u64 {
        (self.log.capacity() / 8).min(WRITE_BACK_BATCH)
    }

    fn drain_pending(&self) -> bool {
        let c = self.control.lock();
        c.drain_requested > c.drain_served
    }

    /// Storage mode's cleaning: frees the oldest batch without touching the backend, by
    /// appending its *live* blocks (those whose newest record is in it) to the log again
    /// and then releasing it — a log-structured store's cleaner. Ok(false) if it could
    /// not free space: nothing to take, most of the log live (copying would free almost
    /// nothing), or no room for the copies.
    ///
    /// A copy is appended only if its block's entry still names the batch's record once
    /// the copy's shard is locked; a client write reserved before the copy is overtaken
    /// by it and retried (as for any logged write, V3), one reserved after it is newer.
    /// The batch is released only once every record appended so far is durable (the
    /// copies, and the newer records that made its other blocks dead), as the write-back
    /// releases: the head moves with no shard held, the space is reused under every
    /// shard (no entry names the batch by then: each live one moved to its copy).
    ///
    /// Copies land after records that were written later, past barriers: the backend's
    /// point-in-time property (V5) holds again once a full drain has written it all.
    fn compact_one_batch(&self) -> Result<bool, BlockError> {
        let usage = self.log.stats();
        let live_bytes = self.dirty_blocks.load(Ordering::Relaxed) * BS;
        if live_bytes as f64 >= COMPACT_MAX_LIVE * usage.used as f64 {
            return Ok(false);
        }
        // At most the kept room's worth: its copies then always fit.
        let Some(batch) = self.log.oldest_batch(self.compaction_room()) else {
            return Ok(false);
        };
        let newest = newest_in(&batch);
        let live: Vec<u64> = newest
            .iter()
            .filter(|(b, d)| {
                let shard = self.shards[shard_of(**b)].lock();
                shard.get(b).is_some_and(|now| now.seq == d.seq)
            })
            .map(|(b, _)| *b)
            .collect();
        let mut buffer = Vec::new();
        for run in runs_of(live, &newest) {
            if self.copy_run(run, &newest, &mut buffer)?.is_none() {
                return Ok(false); // no room: release nothing
            }
        }
        // Every record appended so far durable: the copies, and the records that made
        // the batch's other blocks dead — one whose write failed after it was applied
        // may never become durable, and releasing the block's older record would lose
        // that block's last acknowledged write (the fail-Nth-write test found this).
        self.log.wait_durable(self.log.last_seq())?;
        let last = *batch.last().expect("a batch is never empty");
        // As in the write-back: the durable move with no shard held, the space's reuse
        // once no read can still be in the batch (V3).
        self.log.persist_release(&last)?;
        let all: Vec<MutexGuard<'_, Shard>> = self.shards.iter().map(|m| m.lock()).collect();
        self.log.reuse_through(&last);
        drop(all);
        self.counters
            .batches_compacted
            .fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }

    /// Appends one run of live blocks again (storage mode's compaction); the sequence
    /// number of its newest copy (0 if none was needed), or None if the log had no room.
    fn copy_run(
        &self,
        (first, n, zero): (u64, u64, bool),
        newest: &FxHashMap<u64, Dirty>,
        buffer: &mut Vec<u8>,
    ) -> Result<Option<u64>, BlockError> {
        let kind = if zero {
            RecordKind::Zero
        } else {
            RecordKind::Write
        };
        if !zero {
            buffer.resize((n * BS) as usize, 0);
            for i in 0..n {
                let d = newest[&(first + i)];
                let dest = &mut buffer[(i * BS) as usize..((i + 1) * BS) as usize];
                self.log
                    .read_payload(d.pos, u64::from(d.within) * BS, dest)
                    .map_err(|e| {
                        BlockError::Log(format!("reading block {} to compact: {e}", first + i))
                    })?;
            }
        }
        let reserved = match self.log.reserve_in_kept_room(&[(kind, first * BS, n * BS)]) {
            Ok(reserved) => reserved,
            Err(BlockError::LogFull { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = reserved[0];
        let mut locked = self.lock_blocks(first, first + n - 1);
        let still_live = (first..first + n).all(|b| {
            locked
                .shard(b)
                .get(&b)
                .is_some_and(|d| d.seq == newest[&b].seq)
        });
        if !still_live {
            // A client write took some of them meanwhile: copy the rest one by one.
            drop(locked);
            self.log.abandon(&meta)?;
            if n == 1 {
                return Ok(Some(0));
            }
            let mut newest_copy = 0;
            for b in first..first + n {
                match self.copy_run((b, 1, zero), newest, buffer)? {
                    Some(seq) => newest_copy = newest_copy.max(seq),
                    None => return Ok(None),
                }
            }
            return Ok(Some(newest_copy));
        }
        let payload: &[u8] = if zero {
            &[]
        } else {
            &buffer[..(n * BS) as usize]
        };
        if let Err(e) = self.log.write_record(&meta, payload) {
            drop(locked);
            if let Err(pad) = self.log.abandon(&meta) {
                tracing::warn!(volume = %self.config.name, error = %pad, "padding a record");
            }
            return Err(e);
        }
        for i in 0..n {
            let entry = Dirty {
                seq: meta.seq,
                pos: if zero { u64::MAX } else { meta.pos },
                within: i as u32,
            };
            locked.shard(first + i).insert(first + i, entry);
        }
        Ok(Some(meta.seq))
    }

    /// Writes one run of a batch to the backend, then stores each block whose dirty
    /// entry is still this batch's in the cache (V2); the entries go after the release.
    fn write_back_run(
        &self,
        (first, n, zero): (u64, u64, bool),
        newest: &FxHashMap<u64, Dirty>,
        buffer: &mut AlignedBuf,
    ) -> Result<(), BlockError> {
        self.check_may_write_back()?;
        let offset = first * BS;
        let data: &[u8] = if zero {
            self.backend
                .trim(offset, n * BS)
                .map_err(|e| self.backend_error(format!("write-back trim at {offset}"), e))?;
            &[]
        } else {
            if buffer.len() < (n * BS) as usize {
                *buffer = run_buffer(n)?;
            }
            // One read per stretch of blocks that lie one after another in one record.
            let mut i = 0;
            while i < n {
                let d = newest[&(first + i)];
                let mut stretch = 1;
                while i + stretch < n {
                    let next = newest[&(first + i + stretch)];
                    if next.pos != d.pos || u64::from(next.within) != u64::from(d.within) + stretch
                    {
                        break;
                    }
                    stretch += 1;
                }
                let dest = &mut buffer[(i * BS) as usize..((i + stretch) * BS) as usize];
                self.log
                    .read_payload(d.pos, u64::from(d.within) * BS, dest)
                    .map_err(|e| {
                        BlockError::Log(format!("reading block {} for write-back: {e}", first + i))
                    })?;
                i += stretch;
            }
            let data = &buffer[..(n * BS) as usize];
            // Again just before the write: reading the run from the log takes a while.
            self.check_may_write_back()?;
            self.backend
                .write_at(offset, data)
                .map_err(|e| self.backend_error(format!("write-back at {offset}"), e))?;
            data
        };
        self.counters
            .written_back_bytes
            .fetch_add(n * BS, Ordering::Relaxed);
        let large = self.is_large(n * BS);
        let mut locked = self.lock_blocks(first, first + n - 1);
        for i in 0..n {
            let block = first + i;
            let ours = newest[&block].seq;
            if locked
                .shard(block)
                .get(&block)
                .is_none_or(|d| d.seq != ours)
            {
                continue; // a newer record holds the block; its batch updates the cache
            }
            let stored = if zero || large {
                self.cache_drop(block)
            } else {
                let value = &data[(i * BS) as usize..((i + 1) * BS) as usize];
                self.cache_put(block, value)
            };
            if let Err(e) = stored {
                self.cache_failed("update after write-back", e);
                // V2 once the block is clean: no cached copy rather than an old one.
                if let Err(e) = self.cache_drop(block) {
                    let source = std::io::Error::other(e.to_string());
                    self.cache_failed("delete after write-back", e);
                    return Err(BlockError::Backend {
                        what: format!("dropping the cached copy of block {block}"),
                        source,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Promotion by hits: which blocks read from the backend go into the cache. A block is
/// promoted on its `after`-th miss; counts live in striped tables of at most
/// `PROMOTION_ENTRIES` blocks in all, a stripe forgetting everything when it fills (so a
/// block must miss `after` times within roughly the last `PROMOTION_ENTRIES` distinct
/// misses). Each stripe's lock is a leaf.
struct Promotion {
    after: u32,
    stripes: Box<[Mutex<FxHashMap<u64, u32>>]>,
}

const PROMOTION_STRIPES: usize = 64;
const PROMOTION_ENTRIES: usize = 1 << 20;

impl Promotion {
    fn new(after: u32) -> Promotion {
        Promotion {
            after: after.max(1),
            stripes: (0..PROMOTION_STRIPES)
                .map(|_| Mutex::new(FxHashMap::default()))
                .collect(),
        }
    }

    /// Counts a miss of `block`; whether it is to be cached now.
    fn promotes(&self, block: u64) -> bool {
        if self.after <= 1 {
            return true;
        }
        let mut stripe = self.stripes[shard_of(block) % PROMOTION_STRIPES].lock();
        let count = stripe.entry(block).or_insert(0);
        *count += 1;
        if *count >= self.after {
            stripe.remove(&block);
            return true;
        }
        if stripe.len() > PROMOTION_ENTRIES / PROMOTION_STRIPES {
            stripe.clear();
        }
        false
    }
}

/// The newest data of each block within `batch`.
/// A write-back buffer for a run of `blocks` blocks.
fn run_buffer(blocks: u64) -> Result<AlignedBuf, BlockError> {
    AlignedBuf::new((blocks * BS) as usize).map_err(|e| BlockError::Backend {
        what: "allocating a write-back buffer".into(),
        source: std::io::Error::other(e),
    })
}

fn newest_in(batch: &[RecordMeta]) -> FxHashMap<u64, Dirty> {
    let mut newest: FxHashMap<u64, Dirty> = FxHashMap::default();
    for r in batch {
        let zero = match r.kind {
            RecordKind::Write => false,
            RecordKind::Zero => true,
            _ => continue,
        };
        for i in 0..r.len / BS {
            newest.insert(
                r.offset / BS + i,
                Dirty {
                    seq: r.seq,
                    pos: if zero { u64::MAX } else { r.pos },
                    within: i as u32,
                },
            );
        }
    }
    newest
}

/// `blocks` as runs `(first block, count, zeroes)` of consecutive blocks that are all
/// zeroes or all data in `newest`, at most `RUN_BLOCKS` long.
fn runs_of(mut blocks: Vec<u64>, newest: &FxHashMap<u64, Dirty>) -> Vec<(u64, u64, bool)> {
    blocks.sort_unstable();
    let mut runs: Vec<(u64, u64, bool)> = Vec::new();
    for b in blocks {
        let zero = newest[&b].is_zero();
        match runs.last_mut() {
            Some((first, n, z)) if *first + *n == b && *z == zero && *n < RUN_BLOCKS => *n += 1,
            _ => runs.push((b, 1, zero)),
        }
    }
    runs
}

/// What a read does with a block that is neither dirty nor cached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Misses {
    /// Reads it from the backend and stores it in the cache.
    ReadAndCache,
    /// Reads it from the backend only (a sequential stream, a read-modify-write).
    Read,
    /// Gives up: the read is to be served by a thread that may wait.
    Refuse,
}

/// What a change writes.
#[derive(Clone, Copy)]
enum Change<'a> {
    Data(&'a [u8]),
    Zeroes(u64),
}

impl Change<'_> {
    fn len(&self) -> u64 {
        match self {
            Change::Data(d) => d.len() as u64,
            Change::Zeroes(n) => *n,
        }
    }
}

impl Export for Volume {
    fn size(&self) -> u64 {
        Volume::size(self)
    }

    fn is_read_only(&self) -> bool {
        self.mode() == Mode::ReadOnly
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let len = buf.len() as u64;
        self.check(offset, len)?;
        let misses = if self.sequential(offset, len) {
            Misses::Read
        } else {
            Misses::ReadAndCache
        };
        self.read_locked(offset, buf, misses)?;
        Ok(())
    }

    fn read_cached(&self, offset: u64, buf: &mut [u8]) -> Option<Result<(), BlockError>> {
        if let Err(e) = self.check(offset, buf.len() as u64) {
            return Some(Err(e));
        }
        match self.read_locked(offset, buf, Misses::Refuse) {
            Ok(true) => Some(Ok(())),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), BlockError> {
        self.change(offset, Change::Data(data), fua)
    }

    fn write_at_once(&self, offset: u64, data: &[u8], fua: bool) -> Option<Result<(), BlockError>> {
        let len = data.len() as u64;
        // In memory only: write-back into a log whose sync is free, whole blocks (a
        // partial one may read the backend), and space in the log now.
        let whole = offset.is_multiple_of(BS) && len.is_multiple_of(BS);
        if !self.mode().logs_writes() || !self.log.sync_is_free() || !whole {
            return None;
        }
        if self.bypasses(&Change::Data(data)) {
            return None; // to a worker: it writes the backend
        }
        if let Err(e) = self.check(offset, len) {
            return Some(Err(e));
        }
        // A snapshot holds writes: to a worker, which waits for it.
        let _gate = self.writes_gate.try_read()?;
        self.touch();
        match self.change_logged_within(offset, Change::Data(data), fua, Duration::ZERO) {
            Ok(true) => {
                self.counters
                    .bytes_written
                    .fetch_add(len, Ordering::Relaxed);
                Some(Ok(()))
            }
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        }
    }

    fn flush(&self) -> Result<(), BlockError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(BlockError::ShuttingDown);
        }
        self.touch();
        if self.log.has_data_records() || !self.log.ends_in_barrier() {
            if !self.log.ends_in_barrier() {
                self.log.append(
                    RecordKind::Barrier,
                    0,
                    Payload::Length(0),
                    Wait::Written,
                    self.config.full_wait,
                )?;
            }
            self.log.wait_durable(self.log.last_seq())?;
        }
        // Held across the backend's flush: a flush that finds nothing unflushed because
        // another one took the flag must not answer before that one's flush is done.
        let _one_at_a_time = self.backend_flush.lock();
        if self.backend_unflushed.swap(false, Ordering::AcqRel) {
            if let Err(e) = self.backend.flush() {
                self.backend_unflushed.store(true, Ordering::Release);
                return Err(self.backend_error("flush".into(), e));
            }
        }
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), BlockError> {
        self.change(offset, Change::Zeroes(len), fua)
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), BlockError> {
        self.change(offset, Change::Zeroes(len), fua)
    }
}

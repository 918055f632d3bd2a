//! The flash tier's mechanics: one file (`flash<i>.terrace`) cut into segments of the
//! cache's segment size, read and written with block I/O through
//! `terrace_media::flash::FlashFile` (`O_DIRECT` where the file system allows), never
//! mapped; the DRAM write buffers segments are filled in; and the kill log
//! (`flash<i>.kills`) that makes deletes and overwrites of flash items survive a crash.
//! The engine's side — demotion into flash, reads, eviction, restart — is
//! `cache/flash.rs`.
//!
//! A segment on flash has the format of every other segment (`segment.rs`): header,
//! packed items, commit word with a running checksum. It is filled in a DRAM `Buffer`
//! and written once, whole, when full (or at a clean shutdown); until that write
//! completes it is read from the buffer.
//!
//! # Why a kill log
//! A memory tier marks a deleted or overwritten item DEAD in place. On flash that would
//! be a read-modify-write of a block per delete, so a flash copy stays LIVE on the media
//! after its key moved on. Each such kill of an item already written to flash appends a
//! 16-byte record (slot, offset, the segment's write sequence) to the kill log with one
//! `pwrite` before the operation returns: in the kernel, it survives the process being
//! killed. The restart scan after a crash skips every item a record names in the
//! incarnation it names. Records of incarnations that are gone are dropped when the log
//! is compacted. A kill of an item still in its buffer flips its state byte there
//! instead, unless the buffer's write has begun.
//!
//! # Invariants
//! - A slot is `Free`, `Open` (its buffer takes appends and may be being written),
//!   `Stored` (on flash, read with `pread`) or `Evicting` (its bytes copied into DRAM,
//!   then retired on flash). Its generation counter changes on every change of
//!   incarnation (open, eviction start, free), so a reader that loaded it before a
//!   `pread` and finds it unchanged after read the incarnation it meant.
//! - A buffer is written only when no copy appended to it is waiting to be published
//!   (`pending` is 0): every item in it is then LIVE or DEAD, never PENDING, and a kill
//!   after that point is a kill-log record.
//! - A segment being evicted is retired on flash (its blocks punched, else its header
//!   zeroed) before its slot is reused, and kills are recorded until it is retired, so
//!   no crash can bring back an item its eviction dropped after it was overwritten.
//!
//! Lock order (with `docs/concurrency.md`): a buffer set (`demote`, `reinsert`) before a
//! slot's state, before a buffer's bytes, before the kill log; `lists` alone.

mod sets;

pub(crate) use sets::{kill_hash, SetGeometry, SetStore, PAGE as SET_PAGE};

use std::collections::{HashSet, VecDeque};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Mutex, RwLock};
use terrace_media::flash::{AlignedBuf, FlashFile, BLOCK};
use terrace_media::MediaError;

use crate::error::{CacheError, EncodeError};
use crate::item::{self, ItemLimits, ItemRef, ItemSpec, ItemState};
use crate::segment::{Cursor, SegmentHeader, SegmentReader, SegmentWriter, HEADER_LEN};
use crate::write_budget::WriteBudget;

/// Bytes of one kill-log record.
const KILL_RECORD: usize = 16;

/// The kill log is compacted when it grows past this many records per flash segment
/// (at least [`MIN_KILL_LOG_RECORDS`]): it then holds only the records of segments still
/// on flash.
const KILL_RECORDS_PER_SEGMENT: u64 = 256;
const MIN_KILL_LOG_RECORDS: u64 = 64 << 10;

/// Records appended to the kill log between two write-outs that drop its pages from the
/// page cache: the log is read only at a restart or a compaction, and its pages would
/// otherwise hold DRAM (up to 16 B per dead flash item, several MiB at scale) for nothing.
const KILL_LOG_DROP_RECORDS: u64 = 4096;

/// The file a flash tier lives in.
pub fn flash_path(dir: &Path, tier: usize) -> PathBuf {
    dir.join(format!("flash{tier}.terrace"))
}

/// The flash tier's kill log.
pub fn kills_path(dir: &Path, tier: usize) -> PathBuf {
    dir.join(format!("flash{tier}.kills"))
}

/// A stored segment found at a restart ([`FlashTier::restore`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RestoredSlot {
    pub write_seq: u64,
    /// The end of its committed items.
    pub end: u32,
    pub items: u32,
    pub dead: u32,
    /// See [`SlotCell::latest_expiry`].
    pub latest_expiry: u32,
    /// A segment of the small-item log (see [`SMALL_LOG_BUCKET`]).
    pub small: bool,
}

/// The `ttl_bucket` of a flash segment's header that marks a segment of the small-item
/// log: its items move into sets when it is evicted (`cache/sets.rs`).
pub(crate) const SMALL_LOG_BUCKET: u16 = 1;

/// How a flash tier's file is cut: `segments` segment slots, then one page per set of
/// `sets` (none without sets); the small-item log may hold `small_log_segments` of the
/// slots.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlashShape {
    pub segments: u32,
    pub sets: Option<SetGeometry>,
    pub small_log_segments: usize,
}

/// Where a flash tier lives: its file (`path`, else `flash<tier>.terrace` in `dir`) and
/// its kill log (in `dir`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct FlashAt<'a> {
    pub dir: &'a Path,
    pub path: Option<&'a Path>,
    pub tier: usize,
}

/// A segment being filled in DRAM, or one read back from flash to be evicted.
pub(crate) struct Buffer {
    pub slot: u32,
    pub write_seq: u64,
    data: RwLock<BufferData>,
    /// Copies appended and not yet made LIVE or DEAD.
    pending: AtomicU32,
}

struct BufferData {
    bytes: AlignedBuf,
    /// Where appends continue; `None` once the buffer takes no more (written or being
    /// written, or read back for an eviction).
    cursor: Option<Cursor>,
    /// End of the committed items.
    end: u32,
    /// The write to flash has begun: kills go to the kill log.
    writing: bool,
}

impl Buffer {
    /// Runs `f` over the segment's bytes up to the committed end.
    pub fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        let d = self.data.read();
        f(&d.bytes[..d.end as usize])
    }
}

#[derive(Clone)]
enum Slot {
    Free,
    Open(Arc<Buffer>),
    Stored { end: u32 },
    Evicting { data: Arc<Buffer>, retired: bool },
}

struct SlotCell {
    generation: AtomicU64,
    state: Mutex<Slot>,
    /// Items written into the segment, and how many of them died since (for the choice
    /// of segments to evict first).
    items: AtomicU32,
    dead: AtomicU32,
    /// The write sequence of the segment stored there (0: none).
    stored_seq: AtomicU64,
    /// The latest expiry of the items written into the segment ([`NEVER`]: one of them
    /// never expires, or it is not known): once past, every item in it has expired and
    /// the segment is freed first, without reinserting anything.
    latest_expiry: AtomicU32,
    /// The segment there is of the small-item log.
    small: AtomicBool,
}

/// [`SlotCell::latest_expiry`] of a segment that may hold an item that never expires.
pub(crate) const NEVER: u32 = u32::MAX;

/// Threads that read slot headers at a restart ([`FlashTier::read_headers`]).
const HEADER_READERS: usize = 8;

/// Blocks the first read of a flash item takes (its length is unknown until its header
/// is read): two, so that an item of up to a block that crosses a block boundary — half
/// of them, at random offsets — costs one read, not two.
const FIRST_READ_BLOCKS: usize = 2;

/// Bytes of items read ahead ([`FlashTier::stage`]) that may wait for their reader; the
/// oldest go beyond it.
const STAGED_MAX_BYTES: usize = 16 << 20;

/// Items read from flash ahead of the request that wants them (a server's I/O thread
/// reads, its connection's worker then finds the item here without waiting on the
/// device). Keyed by slot and offset, each with the slot's generation at the read: an
/// entry of an older incarnation of the slot is never served. A read takes its entry.
#[derive(Default)]
struct Staged {
    items: std::collections::HashMap<(u32, u32), (u64, OwnedItem)>,
    /// Insertion order, for dropping the oldest (may name entries already taken).
    order: VecDeque<(u32, u32)>,
    bytes: usize,
}

impl Staged {
    fn holds(&self, slot: u32, offset: u32, generation: u64) -> bool {
        self.items
            .get(&(slot, offset))
            .is_some_and(|&(g, _)| g == generation)
    }

    fn take(&mut self, slot: u32, offset: u32, generation: u64) -> Option<OwnedItem> {
        let (g, item) = self.items.remove(&(slot, offset))?;
        self.bytes -= item.bytes.len();
        (g == generation).then_some(item)
    }

    fn put(&mut self, slot: u32, offset: u32, generation: u64, item: OwnedItem) {
        self.bytes += item.bytes.len();
        if let Some((_, old)) = self.items.insert((slot, offset), (generation, item)) {
            self.bytes -= old.bytes.len();
        } else {
            self.order.push_back((slot, offset));
        }
        while self.bytes > STAGED_MAX_BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some((_, item)) = self.items.remove(&oldest) {
                self.bytes -= item.bytes.len();
            }
        }
        if self.items.is_empty() {
            self.order.clear();
        }
    }
}

/// The first read of the item at `offset` of a segment committed up to `end`: its
/// block-aligned start in the segment and length. The item's length is in its header,
/// unknown until read, so the read takes [`FIRST_READ_BLOCKS`] (within the committed
/// end): an item that crosses a block boundary still costs one read unless it is larger
/// than that. `None` for an offset outside the items.
fn first_read(offset: u32, end: u32) -> Option<(usize, usize)> {
    if offset >= end || (offset as usize) < HEADER_LEN {
        return None;
    }
    let start = (offset as usize) & !(BLOCK - 1);
    let committed = (end as usize).next_multiple_of(BLOCK);
    let len = (FIRST_READ_BLOCKS * BLOCK)
        .min(committed - start)
        .max(BLOCK);
    Some((start, len))
}

/// What the blocks read from `start` of a segment hold of the item at `offset`.
enum Decoded {
    Item(OwnedItem),
    /// The item goes on past the bytes read: the blocks up to `read_end` are needed.
    Short {
        read_end: usize,
    },
    /// No item there within the committed end (the entry moved on).
    Bad,
}

fn decode_read(offset: u32, end: u32, start: usize, bytes: &[u8]) -> Decoded {
    let rel = offset as usize - start;
    let Some(Ok(header)) = bytes.get(rel..).map(item::decode_header) else {
        return Decoded::Bad;
    };
    let item_end = u64::from(offset) + header.total_len();
    if item_end > u64::from(end) {
        return Decoded::Bad;
    }
    let read_end = (item_end as usize).next_multiple_of(BLOCK);
    if read_end - start > bytes.len() {
        return Decoded::Short { read_end };
    }
    match item::decode(bytes, rel as u32, bytes.len()) {
        Ok(i) => Decoded::Item(OwnedItem::from_ref(&ItemRef { offset, ..i })),
        Err(_) => Decoded::Bad,
    }
}

/// A read of one flash item (or a flash set's page) that the caller's own I/O engine runs (a server's io_uring
/// worker, whose loop must not wait on the device): read [`len`](Self::len) bytes at
/// [`file_offset`](Self::file_offset) of [`fd`](Self::fd) into
/// [`buffer`](Self::buffer) (block-aligned, heap-allocated: its address does not change
/// when the `FlashRead` moves), then hand the result to the cache, which stages the item
/// for the lookup that follows. The descriptor is valid while the cache is open.
pub struct FlashRead {
    /// The slot, or [`sets::SET_SLOT`] for a set's page (`offset` is then the set).
    slot: u32,
    offset: u32,
    /// The slot's generation when planned: an item read from a later incarnation is not
    /// staged.
    generation: u64,
    end: u32,
    start: usize,
    file_offset: u64,
    buf: AlignedBuf,
    fd: std::os::fd::RawFd,
}

impl FlashRead {
    pub fn fd(&self) -> std::os::fd::RawFd {
        self.fd
    }

    pub fn file_offset(&self) -> u64 {
        self.file_offset
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Where the bytes go.
    pub fn buffer(&mut self) -> &mut [u8] {
        &mut self.buf
    }
}

impl std::fmt::Debug for FlashRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlashRead")
            .field("slot", &self.slot)
            .field("offset", &self.offset)
            .field("file_offset", &self.file_offset)
            .field("len", &self.buf.len())
            .finish()
    }
}

/// A stored segment's committed bytes ([`FlashTier::read_stored_segment`]).
pub(crate) struct StoredSegment {
    bytes: AlignedBuf,
    end: u32,
}

impl StoredSegment {
    /// The item at `offset`, copied out; `None` when none decodes there.
    pub fn item(&self, offset: u32) -> Option<OwnedItem> {
        item::decode(&self.bytes, offset, self.end as usize)
            .ok()
            .map(|i| OwnedItem::from_ref(&i))
    }
}

/// A copy of one item read from flash (or from a buffer).
#[derive(Clone)]
pub struct OwnedItem {
    bytes: Vec<u8>,
    offset: u32,
    header: item::ItemHeader,
}

impl OwnedItem {
    pub fn from_ref(item: &ItemRef<'_>) -> OwnedItem {
        let mut bytes = Vec::with_capacity(item.key.len() + item.value.len());
        bytes.extend_from_slice(item.key);
        bytes.extend_from_slice(item.value);
        OwnedItem {
            bytes,
            offset: item.offset,
            header: item::ItemHeader {
                state: item.state,
                client_flags: item.client_flags,
                expires_at: item.expires_at,
                origin_cas: item.origin_cas,
                header_len: 0,
                key_len: item.key.len() as u32,
                value_len: item.value.len() as u32,
            },
        }
    }

    /// The item, as the memory tiers hand it out (its offset is the one in its segment).
    pub fn item(&self) -> ItemRef<'_> {
        let k = self.header.key_len as usize;
        ItemRef {
            offset: self.offset,
            len: self.header.total_len() as u32,
            state: self.header.state,
            client_flags: self.header.client_flags,
            expires_at: self.header.expires_at,
            origin_cas: self.header.origin_cas,
            key: &self.bytes[..k],
            value: &self.bytes[k..],
        }
    }
}

/// Counters of a flash tier.
#[derive(Debug, Default)]
pub(crate) struct FlashCounters {
    pub bytes_written: AtomicU64,
    pub bytes_read: AtomicU64,
    pub reads: AtomicU64,
    pub segments_written: AtomicU64,
    pub write_errors: AtomicU64,
    pub read_errors: AtomicU64,
    pub kills_logged: AtomicU64,
    pub punch_fallbacks: AtomicU64,
    /// Reads made ahead of their request ([`FlashTier::stage`]), and how many of them a
    /// request then found.
    pub staged: AtomicU64,
    pub staged_used: AtomicU64,
    /// Items not admitted: no buffer or free segment could take them.
    pub refused_no_room: AtomicU64,
    /// Items not admitted: over the write budget.
    pub refused_budget: AtomicU64,
    /// Demotions that repointed an entry to the item's replica instead of writing it
    /// (`cache/replica.rs`).
    pub replica_demotions: AtomicU64,
}

/// The queues of a flash tier: free slots, and stored segments oldest first.
#[derive(Debug, Default)]
pub(crate) struct FlashLists {
    pub free: Vec<u32>,
    pub fifo: VecDeque<u32>,
    /// Stored segments of the small-item log, oldest first.
    pub small_fifo: VecDeque<u32>,
    /// No stored segment has all its items expire before this (`None`: none ever
    /// does), so that looking for one ([`FlashTier::expired_in`]) costs nothing until
    /// then. Lowered as segments are stored, raised by the search that finds none.
    earliest_expiry: Option<u32>,
}

impl FlashLists {
    /// Queues a stored segment whose items all expire by `latest_expiry`.
    fn push_stored(&mut self, slot: u32, latest_expiry: u32) {
        self.fifo.push_back(slot);
        if latest_expiry != NEVER && latest_expiry != 0 {
            let earliest = self
                .earliest_expiry
                .map_or(latest_expiry, |e| e.min(latest_expiry));
            self.earliest_expiry = Some(earliest);
        }
    }
}

/// A segment's bound on its items' expiry for an item expiring at `expires_at` (0:
/// never): what [`SlotCell::latest_expiry`] takes the maximum of.
pub(crate) fn expiry_bound(expires_at: u32) -> u32 {
    match expires_at {
        0 => NEVER,
        at => at,
    }
}

/// The flash tier. See the module docs.
pub(crate) struct FlashTier {
    file: FlashFile,
    kill_log: Mutex<KillLog>,
    pub shift: u8,
    pub count: u32,
    /// Global id of slot 0.
    pub base: u32,
    /// The tier's position in the configuration (the last).
    pub tier: usize,
    slots: Box<[SlotCell]>,
    pub lists: Mutex<FlashLists>,
    /// The open buffer of demotions from the tier above, of reinsertions, and of the
    /// small-item log (with sets only).
    pub demote: Mutex<Option<Arc<Buffer>>>,
    pub reinsert: Mutex<Option<Arc<Buffer>>>,
    pub small: Mutex<Option<Arc<Buffer>>>,
    /// Small items on flash without index entries, after the segment slots.
    sets: Option<SetStore>,
    /// Stored segments the small-item log may hold before its oldest moves into sets.
    pub small_log_cap: usize,
    pub counters: FlashCounters,
    /// The counters every tier has (hits, evictions, demotions in, reinsertions).
    pub stats: crate::tier::TierCounters,
    limits: ItemLimits,
    /// The write budget, if one is set (`crate::write_budget`).
    budget: Option<WriteBudget>,
    staged: Mutex<Staged>,
}

struct KillLog {
    file: std::fs::File,
    path: PathBuf,
    records: u64,
    limit: u64,
    /// Records before this one are written out and dropped from the page cache.
    dropped_to: u64,
}

impl KillLog {
    /// Writes out the records appended since the last call and drops their pages from
    /// the page cache ([`KILL_LOG_DROP_RECORDS`]). Best effort: a failure only leaves
    /// them cached.
    fn drop_cached(&mut self) {
        use std::os::fd::AsFd;
        let from = self.dropped_to * KILL_RECORD as u64;
        let to = self.records * KILL_RECORD as u64;
        if to > from {
            let _ = terrace_media::os::write_out_and_drop(self.file.as_fd(), from, to - from);
        }
        self.dropped_to = self.records;
    }
}

impl std::fmt::Debug for FlashTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlashTier")
            .field("path", &self.file.path())
            .field("segments", &self.count)
            .field("direct", &self.file.is_direct())
            .finish()
    }
}

fn io_error(op: &'static str, path: &Path, source: std::io::Error) -> MediaError {
    MediaError::Io {
        op,
        path: path.into(),
        source,
    }
}

impl FlashTier {
    /// Opens (or creates) the flash file of tier `tier` in `dir`: whole segments of
    /// `2^shift` bytes, then the pages of `shape.sets` if any. An existing file of
    /// another size is an error. Returns the tier and whether the file existed (to be
    /// scanned).
    pub fn open(
        at: FlashAt<'_>,
        shape: FlashShape,
        shift: u8,
        base: u32,
        limits: ItemLimits,
    ) -> Result<(FlashTier, bool), CacheError> {
        let FlashAt { dir, path, tier } = at;
        if !dir.is_dir() {
            return Err(CacheError::TierDir { dir: dir.into() });
        }
        let count = shape.segments;
        let set_base = u64::from(count) << shift;
        let size = set_base
            + shape
                .sets
                .map_or(0, |g| u64::from(g.sets) * SET_PAGE as u64);
        let path = path.map_or_else(|| flash_path(dir, tier), Path::to_path_buf);
        // A block device always holds something: its slot headers say what (a device
        // never written by the tier has none that validate).
        let existing = if terrace_media::flash::is_block_device(&path) {
            Some(size)
        } else {
            FlashFile::existing_size(&path)?
        };
        if let Some(found) = existing.filter(|&f| f != size) {
            return Err(CacheError::TierFileSize {
                path,
                found,
                expected: size,
            });
        }
        let file = FlashFile::open(&path, size)?;
        let kpath = kills_path(dir, tier);
        let kfile = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&kpath)
            .map_err(|e| MediaError::Open {
                path: kpath.clone(),
                source: e,
            })?;
        let len = kfile
            .metadata()
            .map_err(|e| io_error("stat", &kpath, e))?
            .len();
        let flash = FlashTier {
            file,
            kill_log: Mutex::new(KillLog {
                file: kfile,
                path: kpath,
                records: len / KILL_RECORD as u64,
                limit: (u64::from(count) * KILL_RECORDS_PER_SEGMENT).max(MIN_KILL_LOG_RECORDS),
                dropped_to: 0,
            }),
            shift,
            count,
            base,
            tier,
            slots: (0..count)
                .map(|_| SlotCell {
                    generation: AtomicU64::new(0),
                    state: Mutex::new(Slot::Free),
                    items: AtomicU32::new(0),
                    dead: AtomicU32::new(0),
                    stored_seq: AtomicU64::new(0),
                    latest_expiry: AtomicU32::new(NEVER),
                    small: AtomicBool::new(false),
                })
                .collect(),
            lists: Mutex::new(FlashLists {
                earliest_expiry: None,
                free: (0..count).rev().collect(),
                fifo: VecDeque::new(),
                small_fifo: VecDeque::new(),
            }),
            demote: Mutex::new(None),
            reinsert: Mutex::new(None),
            small: Mutex::new(None),
            sets: shape.sets.map(|g| SetStore::new(g, set_base)),
            small_log_cap: shape.small_log_segments,
            counters: FlashCounters::default(),
            stats: crate::tier::TierCounters::default(),
            limits,
            budget: None,
            staged: Mutex::new(Staged::default()),
        };
        Ok((flash, existing.is_some()))
    }

    /// Caps the bytes per second admitted to the tier (`None`: no cap).
    pub fn with_write_rate(mut self, rate: Option<u64>) -> FlashTier {
        let max_item = 1usize << self.shift;
        self.budget = rate.map(|r| WriteBudget::new(r, max_item, Instant::now()));
        self
    }

    /// Whether the write budget admits an item of `bytes` now (always, without one);
    /// counts a refusal.
    pub fn admit(&self, bytes: usize) -> bool {
        let Some(b) = &self.budget else {
            return true;
        };
        if b.try_spend(bytes, Instant::now()) {
            return true;
        }
        self.counters.refused_budget.fetch_add(1, Ordering::Relaxed);
        false
    }

    pub fn is_direct(&self) -> bool {
        self.file.is_direct()
    }

    pub fn is_emulated(&self) -> bool {
        self.file.is_emulated()
    }

    fn seg_size(&self) -> usize {
        1 << self.shift
    }

    fn seg_offset(&self, slot: u32) -> u64 {
        u64::from(slot) << self.shift
    }

    /// Whether global segment id `id` is in this tier; its slot if so.
    pub fn slot_of(&self, id: u32) -> Option<u32> {
        id.checked_sub(self.base).filter(|&s| s < self.count)
    }

    /// (items written, items dead) of a slot's current incarnation.
    pub fn occupancy(&self, slot: u32) -> (u32, u32) {
        let c = &self.slots[slot as usize];
        (
            c.items.load(Ordering::Relaxed),
            c.dead.load(Ordering::Relaxed),
        )
    }

    /// Item bytes in stored and open segments, (live, dead). Flash keeps dead counts of
    /// items, not bytes (a kill record names no length), so a segment's bytes are split
    /// in the ratio of its live and dead items: exact when its items are of one size.
    pub fn item_bytes(&self) -> (u64, u64) {
        let (mut live, mut dead) = (0u64, 0u64);
        for (slot, c) in self.slots.iter().enumerate() {
            let end = match &*c.state.lock() {
                Slot::Stored { end } => u64::from(*end),
                Slot::Open(buf) => u64::from(buf.data.read().end),
                Slot::Free | Slot::Evicting { .. } => continue,
            };
            let bytes = end.saturating_sub(HEADER_LEN as u64);
            let (items, gone) = self.occupancy(slot as u32);
            let items = u64::from(items.max(gone).max(1));
            let gone = u64::from(gone).min(items);
            let dead_bytes = bytes * gone / items;
            live += bytes - dead_bytes;
            dead += dead_bytes;
        }
        (live, dead)
    }

    /// Bytes held in DRAM by open buffers, segments being evicted and staged items.
    pub fn buffer_bytes(&self) -> u64 {
        let open = self
            .slots
            .iter()
            .filter(|c| matches!(&*c.state.lock(), Slot::Open(_) | Slot::Evicting { .. }));
        let staged = self.staged.lock().bytes as u64;
        open.count() as u64 * self.seg_size() as u64 + staged
    }

    /// Opens a fresh buffer for `header` (whose slot the caller took from the free list).
    pub fn open_buffer(&self, header: SegmentHeader) -> Result<Arc<Buffer>, CacheError> {
        let mut bytes = AlignedBuf::new(self.seg_size())?;
        let cursor = SegmentWriter::create(&mut bytes[..], header, self.limits)?.cursor();
        let small = header.ttl_bucket == SMALL_LOG_BUCKET;
        let buf = Arc::new(Buffer {
            slot: header.slot,
            write_seq: header.write_seq,
            data: RwLock::new(BufferData {
                bytes,
                cursor: Some(cursor),
                end: HEADER_LEN as u32,
                writing: false,
            }),
            pending: AtomicU32::new(0),
        });
        let cell = &self.slots[header.slot as usize];
        let mut state = cell.state.lock();
        cell.items.store(0, Ordering::Relaxed);
        cell.dead.store(0, Ordering::Relaxed);
        cell.latest_expiry.store(0, Ordering::Relaxed);
        cell.small.store(small, Ordering::Relaxed);
        cell.generation.fetch_add(1, Ordering::AcqRel);
        *state = Slot::Open(Arc::clone(&buf));
        Ok(buf)
    }

    /// Appends `item` (as `spec`) PENDING to `buf`; its offset, or `None` when the buffer
    /// has no room (or takes no more). The caller must [`finish_copy`](Self::finish_copy)
    /// it.
    pub fn append(
        &self,
        buf: &Buffer,
        spec: &ItemSpec,
        key: &[u8],
        value: &[u8],
    ) -> Result<Option<u32>, EncodeError> {
        let mut d = buf.data.write();
        let Some(cursor) = d.cursor else {
            return Ok(None);
        };
        if spec.encoded_len() > cursor.remaining() {
            return Ok(None);
        }
        let mut w = SegmentWriter::attach(&mut d.bytes[..], cursor)?;
        let offset = w.append(spec, key, value)?;
        let (cursor, end) = (w.cursor(), HEADER_LEN as u32 + w.committed());
        d.cursor = Some(cursor);
        d.end = end;
        buf.pending.fetch_add(1, Ordering::AcqRel);
        let cell = &self.slots[buf.slot as usize];
        cell.items.fetch_add(1, Ordering::Relaxed);
        cell.latest_expiry
            .fetch_max(expiry_bound(spec.expires_at), Ordering::Relaxed);
        Ok(Some(offset))
    }

    /// Makes a copy appended by [`append`](Self::append) LIVE (published) or DEAD (not);
    /// under the key's bucket lock for LIVE. Returns false when it could not be made
    /// LIVE (never happens while it is pending: the buffer is not written before).
    pub fn finish_copy(&self, buf: &Buffer, offset: u32, live: bool) -> bool {
        let mut d = buf.data.write();
        let state = if live {
            ItemState::Live
        } else {
            ItemState::Dead
        };
        let done = !d.writing && item::set_state(&mut d.bytes[..], offset, state);
        drop(d);
        if !live {
            self.slots[buf.slot as usize]
                .dead
                .fetch_add(1, Ordering::Relaxed);
        }
        buf.pending.fetch_sub(1, Ordering::AcqRel);
        done
    }

    /// Takes the buffer out of appends and writes it to its slot (the committed part,
    /// whole blocks), once every pending copy in it is settled. On success the slot is
    /// `Stored` and goes to the end of the FIFO; on an error the caller must drop the
    /// entries into it and [`abandon`](Self::abandon) the slot.
    pub fn write_buffer(&self, buf: &Arc<Buffer>) -> Result<(), MediaError> {
        {
            let mut d = buf.data.write();
            d.cursor = None;
        }
        // Pending copies are settled by their evictors without waiting for anything a
        // writer holds (see `cache/flash.rs`), so this wait ends.
        let mut spins = 0u32;
        while buf.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
        buf.data.write().writing = true;
        let d = buf.data.read();
        let len = (d.end as usize).next_multiple_of(BLOCK).min(d.bytes.len());
        let r = self
            .file
            .write_at(self.seg_offset(buf.slot), &d.bytes[..len]);
        let end = d.end;
        drop(d);
        match r {
            Ok(()) => {
                self.counters
                    .bytes_written
                    .fetch_add(len as u64, Ordering::Relaxed);
                self.counters
                    .segments_written
                    .fetch_add(1, Ordering::Relaxed);
                let cell = &self.slots[buf.slot as usize];
                cell.stored_seq.store(buf.write_seq, Ordering::Release);
                *cell.state.lock() = Slot::Stored { end };
                let latest = cell.latest_expiry.load(Ordering::Relaxed);
                let mut lists = self.lists.lock();
                if cell.small.load(Ordering::Relaxed) {
                    lists.small_fifo.push_back(buf.slot);
                } else {
                    lists.push_stored(buf.slot, latest);
                }
                Ok(())
            }
            Err(e) => {
                self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Gives up a slot whose write failed or whose buffer is dropped: retired on flash
    /// (so a partial write is never scanned) and freed. The caller has removed every
    /// entry into it.
    pub fn abandon(&self, slot: u32) {
        let _ = self.retire(slot);
        self.free(slot);
    }

    /// Makes `slot` `Free` and puts it on the free list.
    pub fn free(&self, slot: u32) {
        let cell = &self.slots[slot as usize];
        {
            let mut state = cell.state.lock();
            cell.generation.fetch_add(1, Ordering::AcqRel);
            *state = Slot::Free;
        }
        self.lists.lock().free.push(slot);
    }

    /// Gives a slot's blocks back (a hole reads as zeros); where the file system cannot,
    /// zeroes its first block so its header no longer validates.
    fn retire(&self, slot: u32) -> Result<(), MediaError> {
        let at = self.seg_offset(slot);
        if self.file.punch(at, self.seg_size() as u64).is_ok() {
            return Ok(());
        }
        self.counters
            .punch_fallbacks
            .fetch_add(1, Ordering::Relaxed);
        let zero = AlignedBuf::new(BLOCK)?;
        self.file.write_at(at, &zero)
    }

    /// Starts the eviction of a stored segment: reads it into DRAM (where readers find
    /// it from now on), then retires it on flash. Returns its bytes to walk, or `None`
    /// when the slot holds no stored segment.
    pub fn begin_evict(&self, slot: u32) -> Result<Option<Arc<Buffer>>, MediaError> {
        let cell = &self.slots[slot as usize];
        let end = match &*cell.state.lock() {
            Slot::Stored { end } => *end,
            _ => return Ok(None),
        };
        let mut bytes = AlignedBuf::new(self.seg_size())?;
        let len = (end as usize).next_multiple_of(BLOCK).min(bytes.len());
        let read = self.file.read_at(self.seg_offset(slot), &mut bytes[..len]);
        match read {
            Ok(()) => self
                .counters
                .bytes_read
                .fetch_add(len as u64, Ordering::Relaxed),
            Err(_) => self.counters.read_errors.fetch_add(1, Ordering::Relaxed),
        };
        let write_seq = SegmentHeader::decode(&bytes[..])
            .map(|(h, _)| h.write_seq)
            .unwrap_or(0);
        let data = Arc::new(Buffer {
            slot,
            write_seq,
            data: RwLock::new(BufferData {
                bytes,
                cursor: None,
                // An unreadable segment walks as empty: its entries are swept by the
                // caller.
                end: if read.is_ok() { end } else { HEADER_LEN as u32 },
                writing: true,
            }),
            pending: AtomicU32::new(0),
        });
        {
            let mut state = cell.state.lock();
            cell.generation.fetch_add(1, Ordering::AcqRel);
            *state = Slot::Evicting {
                data: Arc::clone(&data),
                retired: false,
            };
        }
        self.retire(slot)?;
        if let Slot::Evicting { retired, .. } = &mut *cell.state.lock() {
            *retired = true;
        }
        Ok(Some(data))
    }

    /// The item at `offset` of `slot`, copied out: from its buffer, or read from flash
    /// (one `pread` for an item within a block, two otherwise). `None` when the slot no
    /// longer holds the incarnation the caller's entry meant, or the bytes there do not
    /// decode (the caller's entry moved on; it looks again).
    pub fn read(&self, slot: u32, offset: u32) -> Option<OwnedItem> {
        let cell = self.slots.get(slot as usize)?;
        let generation = cell.generation.load(Ordering::Acquire);
        let state = cell.state.lock().clone();
        let end = match state {
            Slot::Free => return None,
            Slot::Open(buf) | Slot::Evicting { data: buf, .. } => {
                let d = buf.data.read();
                return item::decode(&d.bytes[..], offset, d.end as usize)
                    .ok()
                    .map(|i| OwnedItem::from_ref(&i));
            }
            Slot::Stored { end } => end,
        };
        if let Some(item) = self.staged.lock().take(slot, offset, generation) {
            // As around a pread: the state seen is of incarnation `generation` only if
            // the slot was not reused meanwhile (then the entry was of the old one).
            if cell.generation.load(Ordering::Acquire) != generation {
                return None;
            }
            self.counters.staged_used.fetch_add(1, Ordering::Relaxed);
            return Some(item);
        }
        let item = self.read_stored(slot, offset, end);
        if cell.generation.load(Ordering::Acquire) != generation {
            return None;
        }
        item
    }

    /// Whether a [`read`](Self::read) of the item at `offset` of `slot` would wait on the
    /// device now: the segment is stored (not in a buffer or being evicted) and the item
    /// not staged.
    pub fn needs_read(&self, slot: u32, offset: u32) -> bool {
        self.unstaged(slot, offset).is_some()
    }

    /// The slot's generation and committed end when it holds a stored segment whose
    /// item at `offset` is not staged (a read of it would wait on the device). The
    /// generation is loaded first: a read planned from it is of that incarnation only if
    /// the generation is unchanged after.
    fn unstaged(&self, slot: u32, offset: u32) -> Option<(u64, u32)> {
        let cell = self.slots.get(slot as usize)?;
        let generation = cell.generation.load(Ordering::Acquire);
        let Slot::Stored { end } = *cell.state.lock() else {
            return None;
        };
        let staged = self.staged.lock().holds(slot, offset, generation);
        (!staged).then_some((generation, end))
    }

    /// Reads the item at `offset` of `slot` into DRAM for the next [`read`](Self::read)
    /// of it (on a thread that may wait on the device, for one that may not). Nothing
    /// happens if it is not on flash any more.
    pub fn stage(&self, slot: u32, offset: u32) {
        let Some(cell) = self.slots.get(slot as usize) else {
            return;
        };
        let generation = cell.generation.load(Ordering::Acquire);
        let Slot::Stored { end } = *cell.state.lock() else {
            return;
        };
        if let Some(item) = self.read_stored(slot, offset, end) {
            self.put_staged(slot, offset, generation, item);
        }
    }

    /// Stages an item read from `slot` in incarnation `generation`, unless the slot was
    /// reused during the read (the bytes may then be of either incarnation).
    fn put_staged(&self, slot: u32, offset: u32, generation: u64, item: OwnedItem) {
        let Some(cell) = self.slots.get(slot as usize) else {
            return;
        };
        if cell.generation.load(Ordering::Acquire) != generation {
            return;
        }
        self.counters.staged.fetch_add(1, Ordering::Relaxed);
        self.staged.lock().put(slot, offset, generation, item);
    }

    /// A read of the item at `offset` of `slot` for the caller's own I/O engine to run
    /// (see [`FlashRead`]), if a [`read`](Self::read) would wait on the device for it now.
    pub fn plan_read(&self, slot: u32, offset: u32) -> Option<FlashRead> {
        let (generation, end) = self.unstaged(slot, offset)?;
        let (start, len) = first_read(offset, end)?;
        Some(FlashRead {
            slot,
            offset,
            generation,
            end,
            start,
            file_offset: self.seg_offset(slot) + start as u64,
            buf: AlignedBuf::new(len).ok()?,
            fd: self.file.raw_fd(),
        })
    }

    /// Takes the result of a [`FlashRead`] the caller ran (the bytes read, or the error):
    /// stages the item for the next [`read`](Self::read) of it, or returns the read that
    /// is still needed (an item longer than the first read took). A failed or short read
    /// is counted and stages nothing (the lookup then reads inline, and fails alike).
    pub fn finish_read(
        &self,
        read: FlashRead,
        result: std::io::Result<usize>,
    ) -> Option<FlashRead> {
        if read.slot == sets::SET_SLOT {
            self.finish_page_read(read, result);
            return None;
        }
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        match result {
            Ok(n) if n == read.buf.len() => {}
            _ => {
                self.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
        self.counters
            .bytes_read
            .fetch_add(read.buf.len() as u64, Ordering::Relaxed);
        match decode_read(read.offset, read.end, read.start, &read.buf) {
            Decoded::Item(item) => {
                self.put_staged(read.slot, read.offset, read.generation, item);
                None
            }
            // The whole item again, from the same start (the first blocks are read twice:
            // simpler than joining two buffers, and rare).
            Decoded::Short { read_end } => Some(FlashRead {
                buf: AlignedBuf::new(read_end - read.start).ok()?,
                ..read
            }),
            Decoded::Bad => None,
        }
    }

    fn read_stored(&self, slot: u32, offset: u32, end: u32) -> Option<OwnedItem> {
        let (start, first_len) = first_read(offset, end)?;
        let seg = self.seg_offset(slot);
        let mut first = AlignedBuf::new(first_len).ok()?;
        self.read_blocks(seg + start as u64, &mut first)?;
        match decode_read(offset, end, start, &first) {
            Decoded::Item(item) => Some(item),
            Decoded::Bad => None,
            Decoded::Short { read_end } => {
                let mut all = AlignedBuf::new(read_end - start).ok()?;
                all[..first_len].copy_from_slice(&first);
                self.read_blocks(seg + (start + first_len) as u64, &mut all[first_len..])?;
                match decode_read(offset, end, start, &all) {
                    Decoded::Item(item) => Some(item),
                    _ => None,
                }
            }
        }
    }

    /// The committed bytes of the segment stored in `slot`, read whole (one `pread`,
    /// counted) to take many of its items at once; `None` when the slot holds no stored
    /// segment, the read fails, or the slot changed incarnation during it.
    pub fn read_stored_segment(&self, slot: u32) -> Option<StoredSegment> {
        let cell = self.slots.get(slot as usize)?;
        let generation = cell.generation.load(Ordering::Acquire);
        let Slot::Stored { end } = *cell.state.lock() else {
            return None;
        };
        let len = (end as usize).next_multiple_of(BLOCK).min(self.seg_size());
        let mut bytes = AlignedBuf::new(len).ok()?;
        self.read_blocks(self.seg_offset(slot), &mut bytes)?;
        (cell.generation.load(Ordering::Acquire) == generation)
            .then_some(StoredSegment { bytes, end })
    }

    /// One `pread` of whole blocks, counted.
    fn read_blocks(&self, at: u64, buf: &mut [u8]) -> Option<()> {
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        if self.file.read_at(at, buf).is_err() {
            self.counters.read_errors.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        self.counters
            .bytes_read
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        Some(())
    }

    /// Kills the item at `offset` of `slot`, which no index entry points at any more:
    /// flips it DEAD in its buffer if the buffer's write has not begun, else records it
    /// in the kill log (one `pwrite`, before this returns). Nothing to do for a segment
    /// already retired.
    pub fn kill(&self, slot: u32, offset: u32) -> Result<(), MediaError> {
        self.kill_of(slot, offset, None)
    }

    /// Kills the item at `offset` of `slot` as [`kill`](Self::kill) does, if the segment
    /// there (stored, or evicted and not yet retired) is still the one of write sequence
    /// `write_seq` — a replica whose segment went is gone with it, and the slot may hold
    /// another segment since.
    pub fn kill_replica(&self, slot: u32, offset: u32, write_seq: u64) -> Result<(), MediaError> {
        self.kill_of(slot, offset, Some(write_seq))
    }

    /// The write sequence of the segment stored in `slot`, if one is stored there (not in
    /// a buffer, not being evicted): where a promotion may leave a replica.
    pub fn stored_write_seq(&self, slot: u32) -> Option<u64> {
        let cell = self.slots.get(slot as usize)?;
        let state = cell.state.lock();
        match &*state {
            Slot::Stored { .. } => self.stored_seq(slot),
            _ => None,
        }
    }

    fn kill_of(&self, slot: u32, offset: u32, want_seq: Option<u64>) -> Result<(), MediaError> {
        let Some(cell) = self.slots.get(slot as usize) else {
            return Ok(());
        };
        let state = cell.state.lock();
        let write_seq = match &*state {
            Slot::Free => return Ok(()),
            Slot::Evicting { retired: true, .. } => return Ok(()),
            Slot::Evicting { data, .. } => data.write_seq,
            Slot::Open(_) if want_seq.is_some() => return Ok(()),
            Slot::Open(buf) => {
                let mut d = buf.data.write();
                if !d.writing {
                    item::set_state(&mut d.bytes[..], offset, ItemState::Dead);
                    cell.dead.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                buf.write_seq
            }
            Slot::Stored { .. } => match self.stored_seq(slot) {
                Some(s) => s,
                None => return Ok(()),
            },
        };
        if want_seq.is_some_and(|want| want != write_seq) {
            return Ok(());
        }
        cell.dead.fetch_add(1, Ordering::Relaxed);
        // Written while the slot's state is held: its eviction cannot mark it retired in
        // between, so no kill of an item still on flash goes unrecorded.
        let due = self.log_kill(slot, offset, write_seq)?;
        drop(state);
        if due {
            self.compact_kill_log()?;
        }
        Ok(())
    }

    /// The write sequence of the segment stored in `slot`.
    fn stored_seq(&self, slot: u32) -> Option<u64> {
        let s = self.slots[slot as usize].stored_seq.load(Ordering::Acquire);
        (s != 0).then_some(s)
    }

    /// Appends one record; returns whether the log is due for compaction (which the
    /// caller runs after letting go of the slot's state: compaction takes slot states).
    fn log_kill(&self, slot: u32, offset: u32, write_seq: u64) -> Result<bool, MediaError> {
        let mut log = self.kill_log.lock();
        let at = log.records * KILL_RECORD as u64;
        log.file
            .write_all_at(&encode_record(slot, offset, write_seq), at)
            .map_err(|e| io_error("pwrite", &log.path, e))?;
        log.records += 1;
        if log.records - log.dropped_to >= KILL_LOG_DROP_RECORDS {
            log.drop_cached();
        }
        self.counters.kills_logged.fetch_add(1, Ordering::Relaxed);
        Ok(log.records >= log.limit)
    }

    /// Rewrites the kill log with only the records of segments still on flash (stored or
    /// not yet retired) and those appended while it ran, through a temporary file renamed
    /// over it. Slot states are read with the log's lock let go (the lock order puts
    /// slot states first), so kills go on meanwhile; what they append is kept.
    fn compact_kill_log(&self) -> Result<(), MediaError> {
        let (records, seen) = {
            let log = self.kill_log.lock();
            let r = read_records(&log.file, log.records)
                .map_err(|e| io_error("pread", &log.path, e))?;
            (r, log.records)
        };
        let mut kept: Vec<[u8; KILL_RECORD]> = records
            .into_iter()
            .filter(|&(slot, offset, seq)| self.holds_incarnation(slot, offset, seq))
            .map(|(slot, offset, seq)| encode_record(slot, offset, seq))
            .collect();
        let mut log = self.kill_log.lock();
        if log.records > seen {
            let mut tail = vec![0u8; ((log.records - seen) as usize) * KILL_RECORD];
            log.file
                .read_exact_at(&mut tail, seen * KILL_RECORD as u64)
                .map_err(|e| io_error("pread", &log.path, e))?;
            kept.extend(
                tail.chunks_exact(KILL_RECORD)
                    .filter_map(|c| <[u8; KILL_RECORD]>::try_from(c).ok()),
            );
        }
        let tmp = log.path.with_extension("kills.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(|e| io_error("create", &tmp, e))?;
        f.write_all(kept.as_flattened())
            .map_err(|e| io_error("write", &tmp, e))?;
        std::fs::rename(&tmp, &log.path).map_err(|e| io_error("rename", &log.path, e))?;
        log.file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&log.path)
            .map_err(|e| io_error("open", &log.path, e))?;
        log.records = kept.len() as u64;
        log.dropped_to = 0;
        log.drop_cached();
        // Still full of live records: room to grow, the eviction of dead-heavy segments
        // takes them away.
        log.limit = log.limit.max(log.records * 2);
        Ok(())
    }

    fn holds_incarnation(&self, slot: u32, offset: u32, seq: u64) -> bool {
        if slot == sets::SET_SLOT {
            return sets::set_record_current(self.sets.as_ref(), offset, seq);
        }
        let Some(cell) = self.slots.get(slot as usize) else {
            return false;
        };
        let state = cell.state.lock();
        match &*state {
            Slot::Stored { .. } => cell.stored_seq.load(Ordering::Acquire) == seq,
            Slot::Open(b) => b.write_seq == seq,
            Slot::Evicting { data, retired } => !retired && data.write_seq == seq,
            Slot::Free => false,
        }
    }

    /// The kill log's records: (slot, offset, write sequence).
    pub fn kills(&self) -> Result<HashSet<(u32, u32, u64)>, MediaError> {
        let log = self.kill_log.lock();
        let records =
            read_records(&log.file, log.records).map_err(|e| io_error("pread", &log.path, e))?;
        Ok(records.into_iter().collect())
    }

    /// Restart: reads the segment at `slot` as found on flash. `None` when nothing
    /// there validates as a header (never written, retired).
    pub fn read_segment(&self, slot: u32) -> Result<Option<AlignedBuf>, MediaError> {
        let mut head = AlignedBuf::new(BLOCK)?;
        self.file.read_at(self.seg_offset(slot), &mut head)?;
        let Ok(reader) = SegmentReader::open(&head) else {
            return Ok(None);
        };
        let end = reader.committed_end() as usize;
        if end > self.seg_size() {
            return Ok(None);
        }
        let mut bytes = AlignedBuf::new(self.seg_size())?;
        let len = end.next_multiple_of(BLOCK).min(bytes.len());
        self.file
            .read_at(self.seg_offset(slot), &mut bytes[..len])?;
        Ok(Some(bytes))
    }

    /// Restart: reads just the header block of `slot`.
    pub fn read_header(&self, slot: u32) -> Result<AlignedBuf, MediaError> {
        let mut head = AlignedBuf::new(BLOCK)?;
        self.file.read_at(self.seg_offset(slot), &mut head)?;
        Ok(head)
    }

    /// The header blocks of `slots`, in order, read by up to [`HEADER_READERS`] threads
    /// at once: a restart reads one per slot, and one at a time that is a device round
    /// trip each (20 ms for 2,048 slots here).
    pub fn read_headers(&self, slots: std::ops::Range<u32>) -> Result<Vec<AlignedBuf>, MediaError> {
        let slots: Vec<u32> = slots.collect();
        if slots.is_empty() {
            return Ok(Vec::new());
        }
        let chunk = slots.len().div_ceil(HEADER_READERS);
        std::thread::scope(|s| {
            let readers: Vec<_> = slots
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        part.iter()
                            .map(|&slot| self.read_header(slot))
                            .collect::<Result<Vec<_>, _>>()
                    })
                })
                .collect();
            let mut heads = Vec::with_capacity(slots.len());
            for r in readers {
                heads.extend(r.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?);
            }
            Ok(heads)
        })
    }

    /// Restart: takes `slot` (found on flash, `end` its committed end, `items` and
    /// `dead` its counts) as stored, and queues it; call in write-sequence order.
    pub fn restore(&self, slot: u32, stored: RestoredSlot) {
        let RestoredSlot {
            write_seq,
            end,
            items,
            dead,
            latest_expiry,
            small,
        } = stored;
        let cell = &self.slots[slot as usize];
        *cell.state.lock() = Slot::Stored { end };
        cell.small.store(small, Ordering::Relaxed);
        cell.latest_expiry.store(latest_expiry, Ordering::Relaxed);
        cell.stored_seq.store(write_seq, Ordering::Release);
        cell.items.store(items, Ordering::Relaxed);
        cell.dead.store(dead, Ordering::Relaxed);
        let mut lists = self.lists.lock();
        lists.free.retain(|&s| s != slot);
        if small {
            lists.small_fifo.push_back(slot);
        } else {
            lists.push_stored(slot, latest_expiry);
        }
    }

    /// The FIFO position of a stored segment whose items have all expired by `now`, if
    /// any: a search of the FIFO only once the earliest such expiry has come, which
    /// records the next one when it finds none.
    pub fn expired_in(&self, lists: &mut FlashLists, now: u32) -> Option<usize> {
        let earliest = lists.earliest_expiry?;
        if !crate::cache::past(earliest, now) {
            return None;
        }
        let latest = |slot: u32| {
            self.slots
                .get(slot as usize)
                .map_or(NEVER, |c| c.latest_expiry.load(Ordering::Relaxed))
        };
        // NEVER is never past.
        let found = lists
            .fifo
            .iter()
            .position(|&slot| crate::cache::past(latest(slot), now));
        if found.is_none() {
            lists.earliest_expiry = lists
                .fifo
                .iter()
                .map(|&slot| latest(slot))
                .filter(|&e| e != NEVER && e != 0)
                .min();
        }
        found
    }

    /// Restart: the item count of a stored slot is `live` indexed items plus its dead.
    pub fn set_live(&self, slot: u32, live: u32) {
        let c = &self.slots[slot as usize];
        c.items
            .store(live + c.dead.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Restart: retires a slot whose contents were not taken.
    pub fn retire_found(&self, slot: u32) -> Result<(), MediaError> {
        self.retire(slot)
    }

    /// Compacts the kill log now (after a restart placed every segment).
    pub fn compact_kills(&self) -> Result<(), MediaError> {
        self.compact_kill_log()
    }

    /// Makes the kill log durable (a clean shutdown).
    pub fn sync(&self) -> Result<(), MediaError> {
        let log = self.kill_log.lock();
        log.file
            .sync_data()
            .map_err(|e| io_error("fdatasync", &log.path, e))?;
        self.file.sync()
    }

    /// Whether `slot` holds a segment on flash (stored).
    pub fn is_stored(&self, slot: u32) -> bool {
        matches!(
            &*self.slots[slot as usize].state.lock(),
            Slot::Stored { .. }
        )
    }
}

fn encode_record(slot: u32, offset: u32, write_seq: u64) -> [u8; KILL_RECORD] {
    let mut rec = [0u8; KILL_RECORD];
    rec[0..4].copy_from_slice(&slot.to_le_bytes());
    rec[4..8].copy_from_slice(&offset.to_le_bytes());
    rec[8..16].copy_from_slice(&write_seq.to_le_bytes());
    rec
}

fn read_records(file: &std::fs::File, records: u64) -> std::io::Result<Vec<(u32, u32, u64)>> {
    let mut bytes = vec![0u8; (records as usize) * KILL_RECORD];
    let mut done = 0;
    while done < bytes.len() {
        let n = file.read_at(&mut bytes[done..], done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    bytes.truncate(done - done % KILL_RECORD);
    Ok(bytes
        .chunks_exact(KILL_RECORD)
        .filter_map(|r| {
            let slot = u32::from_le_bytes(r[0..4].try_into().ok()?);
            let offset = u32::from_le_bytes(r[4..8].try_into().ok()?);
            let seq = u64::from_le_bytes(r[8..16].try_into().ok()?);
            (seq != 0).then_some((slot, offset, seq))
        })
        .collect())
}

impl FlashTier {
    /// The tier's flash-specific stats.
    pub fn flash_stats(&self) -> crate::tier::FlashStats {
        let c = &self.counters;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        crate::tier::FlashStats {
            direct: self.is_direct(),
            emulated: self.is_emulated(),
            buffer_bytes: self.buffer_bytes(),
            bytes_written: l(&c.bytes_written),
            bytes_read: l(&c.bytes_read),
            reads: l(&c.reads),
            segments_written: l(&c.segments_written),
            write_errors: l(&c.write_errors),
            read_errors: l(&c.read_errors),
            kills_logged: l(&c.kills_logged),
            punch_fallbacks: l(&c.punch_fallbacks),
            staged: l(&c.staged),
            staged_used: l(&c.staged_used),
            refused_no_room: l(&c.refused_no_room),
            refused_budget: l(&c.refused_budget),
            // The cache fills in how many it holds (`cache/replica.rs`).
            replicas: 0,
            replica_demotions: l(&c.replica_demotions),
            write_rate: self.budget.as_ref().map(WriteBudget::rate),
            sets: self.sets.as_ref().map(|s| {
                let c = &s.counters;
                crate::tier::SetStats {
                    sets: u64::from(s.geometry.sets),
                    items: s.items(),
                    memory_bytes: s.memory_bytes() as u64,
                    log_segments: self.lists.lock().small_fifo.len() as u64,
                    log_cap: self.small_log_cap as u64,
                    pages_written: l(&c.pages_written),
                    page_reads: l(&c.page_reads),
                    page_misses: l(&c.page_misses),
                    hits: l(&c.hits),
                    items_moved: l(&c.items_moved),
                    below_threshold: l(&c.below_threshold),
                    items_trimmed: l(&c.items_trimmed),
                    kills: l(&c.kills),
                    staged_used: l(&c.staged_used),
                }
            }),
        }
    }

    /// Free and stored segment counts (the small-item log's included).
    pub fn segment_counts(&self) -> (usize, usize) {
        let l = self.lists.lock();
        (l.free.len(), l.fifo.len() + l.small_fifo.len())
    }

    /// Whether `slot` holds a segment of the small-item log.
    pub fn is_small_log(&self, slot: u32) -> bool {
        self.slots
            .get(slot as usize)
            .is_some_and(|c| c.small.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flash tier of 8 segments of 32 KiB in a new directory (kept with it), values up
    /// to `max_value_len`; whether its file existed.
    fn tier(max_value_len: u32) -> (tempfile::TempDir, FlashTier, bool) {
        let dir = tempfile::tempdir().unwrap();
        let limits = ItemLimits {
            max_key_len: 250,
            max_value_len,
        };
        let at = FlashAt {
            dir: dir.path(),
            path: None,
            tier: 1,
        };
        let (f, existing) = FlashTier::open(
            at,
            FlashShape {
                segments: 8,
                sets: None,
                small_log_segments: 0,
            },
            15,
            100,
            limits,
        )
        .unwrap();
        (dir, f, existing)
    }

    fn header(slot: u32, write_seq: u64) -> SegmentHeader {
        SegmentHeader {
            tier: 1,
            size_shift: 15,
            checksummed: true,
            write_seq,
            slot,
            created_at: 0,
            expires_at: 0,
            ttl_bucket: 0,
        }
    }

    /// A stored segment of `n` items in `slot`; their offsets.
    fn stored(f: &FlashTier, slot: u32, write_seq: u64, n: u32) -> Vec<u32> {
        let buf = f.open_buffer(header(slot, write_seq)).unwrap();
        let offsets: Vec<u32> = (0..n)
            .map(|i| {
                let key = format!("k{i}");
                let spec = ItemSpec::new(key.as_bytes(), 10);
                let at = f.append(&buf, &spec, key.as_bytes(), b"0123456789");
                let at = at.unwrap().unwrap();
                assert!(f.finish_copy(&buf, at, true));
                at
            })
            .collect();
        f.write_buffer(&buf).unwrap();
        offsets
    }

    /// Runs a read plan the way a caller's I/O engine would (a `pread` of its blocks);
    /// `short` reports one byte less.
    fn run(f: &FlashTier, mut read: FlashRead, short: bool) -> (FlashRead, std::io::Result<usize>) {
        let at = read.file_offset();
        let n = read.len() - usize::from(short);
        f.file.read_at(at, read.buffer()).unwrap();
        (read, Ok(n))
    }

    /// A read planned for the caller's engine stages its item for the next `read`, with
    /// a second, longer read for an item beyond the first read's blocks; a short or
    /// failed read stages nothing and is counted; a slot reused meanwhile is not staged.
    #[test]
    fn a_planned_read_stages_its_item_and_asks_again_for_a_long_one() {
        let (_dir, f, _) = tier(16 << 10);
        let buf = f.open_buffer(header(0, 3)).unwrap();
        let put = |key: &str, len: usize| {
            let value = vec![key.as_bytes()[0]; len];
            let spec = ItemSpec::new(key.as_bytes(), len);
            let at = f
                .append(&buf, &spec, key.as_bytes(), &value)
                .unwrap()
                .unwrap();
            assert!(f.finish_copy(&buf, at, true));
            at
        };
        let small = put("small", 100);
        let long = put("long", 3 * BLOCK);
        f.write_buffer(&buf).unwrap();

        let plan = f.plan_read(0, small).unwrap();
        assert_eq!(plan.len(), FIRST_READ_BLOCKS * BLOCK);
        let (plan, result) = run(&f, plan, false);
        assert!(f.finish_read(plan, result).is_none());
        assert!(f.plan_read(0, small).is_none(), "staged: no read needed");
        let reads = f.counters.reads.load(Ordering::Relaxed);
        let item = f.read(0, small).unwrap();
        assert_eq!(item.item().value, &[b's'; 100][..]);
        assert_eq!(f.counters.reads.load(Ordering::Relaxed), reads, "no pread");
        assert_eq!(f.counters.staged_used.load(Ordering::Relaxed), 1);

        let (plan, result) = run(&f, f.plan_read(0, long).unwrap(), false);
        let more = f.finish_read(plan, result).expect("a longer read");
        assert!(more.len() > FIRST_READ_BLOCKS * BLOCK);
        let (more, result) = run(&f, more, false);
        assert!(f.finish_read(more, result).is_none());
        assert_eq!(
            f.read(0, long).unwrap().item().value,
            &vec![b'l'; 3 * BLOCK][..]
        );

        let (plan, result) = run(&f, f.plan_read(0, small).unwrap(), true);
        assert!(f.finish_read(plan, result).is_none());
        assert_eq!(f.counters.read_errors.load(Ordering::Relaxed), 1);
        assert!(f.plan_read(0, small).is_some(), "nothing staged");

        let plan = f.plan_read(0, small).unwrap();
        f.begin_evict(0).unwrap().unwrap();
        f.free(0);
        let renewed = stored(&f, 0, 4, 1);
        assert_eq!(
            renewed[0], small,
            "the new incarnation's item at the same offset"
        );
        let (plan, result) = run(&f, plan, false);
        assert!(f.finish_read(plan, result).is_none());
        let item = f.read(0, small).unwrap();
        assert_eq!(
            item.item().key,
            b"k0",
            "the old incarnation's item is not served"
        );
    }

    /// The kill log is written out (and its pages let go) every
    /// [`KILL_LOG_DROP_RECORDS`] records, and every record still reads back. (Whether the
    /// kernel drops the pages is not checked here: the benchmark's page-cache sampling
    /// shows it.)
    #[test]
    fn the_kill_log_is_written_out_in_steps_and_reads_back_whole() {
        let (_dir, f, _) = tier(8 << 10);
        let mut killed = 0;
        for slot in 0..3 {
            for o in stored(&f, slot, 10 + u64::from(slot), 1500) {
                f.kill(slot, o).unwrap();
                killed += 1;
            }
        }
        assert!(killed > KILL_LOG_DROP_RECORDS);
        let log = f.kill_log.lock();
        assert_eq!(log.dropped_to, KILL_LOG_DROP_RECORDS);
        assert_eq!(log.records, killed);
        drop(log);
        assert_eq!(f.kills().unwrap().len() as u64, killed);
    }

    #[test]
    fn the_kill_log_compacts_to_the_segments_still_on_flash() {
        let (_dir, f, existing) = tier(8 << 10);
        assert!(!existing && f.count == 8);
        let a = stored(&f, 0, 7, 40);
        let b = stored(&f, 1, 8, 40);
        f.kill_log.lock().limit = 30;
        // 20 kills in slot 0, then 20 in slot 1: the 30th record compacts the log, from
        // inside a kill (which holds its slot's state), and keeps every record.
        for &o in &a[..20] {
            f.kill(0, o).unwrap();
        }
        for &o in &b[..20] {
            f.kill(1, o).unwrap();
        }
        // It compacted (all 30 kept, so its limit doubled to 60).
        assert_eq!(f.kill_log.lock().limit, 60);
        let kills = f.kills().unwrap();
        assert_eq!(kills.len(), 40);
        assert!(kills.contains(&(0, a[0], 7)) && kills.contains(&(1, b[19], 8)));
        // Slot 0 is evicted (retired, freed): its records go at the next compaction.
        let data = f.begin_evict(0).unwrap().unwrap();
        assert_eq!(data.write_seq, 7);
        f.free(0);
        f.compact_kills().unwrap();
        let kills = f.kills().unwrap();
        assert_eq!(kills.len(), 20);
        assert!(kills.iter().all(|&(slot, _, seq)| slot == 1 && seq == 8));
        // The retired slot reads as nothing at a restart.
        let head = f.read_header(0).unwrap();
        assert!(SegmentReader::open(&head).is_err());
        assert!(f.read_segment(1).unwrap().is_some());
    }
}

//! The write log: a checksummed, sequence-numbered circular log of block writes on the
//! persistent tier. In write-back a volume acknowledges a write once its record — and
//! every record before it — is durable here; the write-back thread later copies records
//! to the backend a batch (a prefix of the log) at a time and then releases them
//! ([`WriteLog::persist_release`], [`WriteLog::reuse_through`]).
//!
//! # Layout (all integers little-endian)
//! - Bytes `[0, 8192)`: two superblock slots of 4 KiB (`SB_SLOT`). Each holds
//!   `"TVOLLOG1" | version u32 | block size u32 | volume size u64 | record area bytes u64
//!   | generation u64 | head position u64 | head sequence u64 | life u32 | head life u32
//!   | grown from u64 | crc32 u32` (version 2; version 1, still read, ends at the head life
//!   and its crc, with nothing grown).
//!   The valid slot with the higher generation is current; an update writes the other
//!   slot and syncs, so a torn update leaves the previous one.
//! - Bytes `[8192, 8192 + capacity)`: the record area. A *position* is a byte count that
//!   only grows; its place in the file is `8192 + position % capacity`. Records are
//!   64-byte aligned and never straddle the area's end: one that would is preceded by a
//!   WRAP record whose length is the bytes it skips (positions are 64-byte aligned, so
//!   64 bytes are always left for it), and the next record starts at the next multiple
//!   of `capacity`.
//! - A record: a 64-byte header `"TVLR" | kind u8 | 3 zero bytes | seq u64 | volume
//!   offset u64 | length u32 | payload length u32 | payload crc32 u32 | life u32 | 16
//!   zero bytes | header crc32 u32`, then the payload (WRITE only), padded to 64 bytes.
//!
//! # Invariants
//! - L1: records between head and tail have consecutive sequence numbers starting at the
//!   superblock's head sequence; every record a volume acknowledged is among them.
//! - L2: an acknowledgement waits for every record with a lower sequence number to be
//!   durable (`Commit::durable`), so the durable records always form a prefix.
//! - L3: a record's `life` is the superblock's life when it was written; `open` raises the
//!   life (durably) before the first append. The superblock's *head life* is the lowest
//!   life of any record at or after the head (the first pending record's, or the current
//!   life when none is pending), written at open and at every release. Recovery reads
//!   records from the head while each has a valid header and payload crc, the expected
//!   sequence number and a life no lower than the head life and the record before it; the
//!   first that fails ends the log. So bytes left
//!   from an earlier pass over the area, and records written after the last durable one
//!   in an earlier life (never acknowledged), are never read as records.
//! - L4: the head only moves forward, to just past a barrier, after the records before it
//!   are in the backend (the caller's promise) — `persist_release`, which moves
//!   it durably; the records' space is reused only after, at `reuse_through`.
//! - L5 (growing a volume): the superblock names the new size, with *grown from* the old
//!   one, before the backend grows, and drops *grown from* after; so a superblock whose
//!   *grown from* is set opens with a backend of either size, and the opener finishes the
//!   grow ([`LogRecovery::grow_to`]). Without it, the backend must have the log's size.
//!
//! Space: `tail - head <= capacity`. An append that does not fit waits for the
//! write-back to release records, at most the wait it is given, then fails with
//! [`BlockError::LogFull`].

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::backend::BLOCK_SIZE;
use crate::error::{BlockError, VolumeError};

/// Bytes before the record area: two superblock slots.
pub const SB_AREA: u64 = 2 * SB_SLOT;
const SB_SLOT: u64 = 4096;
const SB_MAGIC: &[u8; 8] = b"TVOLLOG1";
const SB_VERSION: u32 = 2;
const SB_BYTES: usize = 76;
/// A record header's size, and the alignment of records.
pub const HEADER: u64 = 64;
const REC_MAGIC: &[u8; 4] = b"TVLR";
/// Log space only barriers may take (two of them).
const BARRIER_ROOM: u64 = 2 * HEADER;

/// What a record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// `length` bytes at `offset`, carried as the payload.
    Write = 1,
    /// `length` zero bytes at `offset` (write-zeroes and trim), no payload.
    Zero = 2,
    /// A client's flush: every write acknowledged before it is in an earlier record.
    Barrier = 3,
    /// Nothing more before the record area's end.
    Wrap = 4,
    /// `length` bytes (this header included) that a failed request reserved and did not
    /// use.
    Pad = 5,
}

impl RecordKind {
    /// WRITE and ZERO records change blocks; barriers and wraps do not.
    pub fn carries_data(self) -> bool {
        matches!(self, RecordKind::Write | RecordKind::Zero)
    }

    fn from_u8(v: u8) -> Option<RecordKind> {
        Some(match v {
            1 => RecordKind::Write,
            2 => RecordKind::Zero,
            3 => RecordKind::Barrier,
            4 => RecordKind::Wrap,
            5 => RecordKind::Pad,
            _ => return None,
        })
    }
}

/// One record as the DRAM side knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordMeta {
    pub seq: u64,
    /// Position of the header (see the module docs).
    pub pos: u64,
    pub kind: RecordKind,
    /// Volume byte offset (block aligned) and length (whole blocks) it covers.
    pub offset: u64,
    pub len: u64,
    /// The life it was written in (L3).
    pub life: u32,
}

impl RecordMeta {
    /// Position just past this record (a WRAP's `len` is the bytes it skips).
    pub fn end(&self) -> u64 {
        match self.kind {
            RecordKind::Wrap | RecordKind::Pad => self.pos + self.len,
            kind => self.pos + record_span(kind, self.len),
        }
    }
}

fn record_span(kind: RecordKind, len: u64) -> u64 {
    let payload = if kind == RecordKind::Write { len } else { 0 };
    HEADER + payload.div_ceil(HEADER) * HEADER
}

/// The medium a write log lives on: a file (on tmpfs, a DAX file system or a disk), or in
/// tests a recorder of durable images. `sync` makes every completed write durable.
pub trait LogStore: Send + Sync {
    fn size(&self) -> u64;
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Writes `head` and then `body` at `offset`, as [`write_at`](LogStore::write_at)
    /// of the two joined would (by default it is that; a file does it without the copy).
    fn write_parts_at(&self, offset: u64, head: &[u8], body: &[u8]) -> io::Result<()> {
        let mut bytes = Vec::with_capacity(head.len() + body.len());
        bytes.extend_from_slice(head);
        bytes.extend_from_slice(body);
        self.write_at(offset, &bytes)
    }
    fn sync(&self) -> io::Result<()>;
    /// Makes what this node's own store holds durable, and waits for nothing else (a
    /// replicated store's peers): a clean stop's last step. By default, `sync`.
    fn sync_local(&self) -> io::Result<()> {
        self.sync()
    }
    fn describe(&self) -> String;
    /// Whether [`sync`](LogStore::sync) costs nothing (memory: tmpfs, a test's store), so
    /// an append may wait for durability on a thread that must not block long.
    fn sync_is_free(&self) -> bool {
        false
    }
    /// Lets another opener have the store (a file's lock); the owner writes no more.
    fn unlock(&self) {}
}

/// A write log in a file: `pwrite` and `fdatasync`. On tmpfs (or ramfs) the page cache is
/// the medium: the log survives a process crash, not a power loss, and there is nothing
/// to sync; on a DAX or disk file it survives both.
pub struct FileLogStore {
    file: File,
    path: PathBuf,
    len: u64,
    in_memory: bool,
}

impl FileLogStore {
    /// Opens `path`, creating it with `len` bytes (blocks reserved) if it does not exist.
    /// An existing file keeps its length.
    pub fn open(path: &Path, len: u64) -> Result<FileLogStore, VolumeError> {
        let io_err = |source| VolumeError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io_err)?;
        // One process per log: a second one would write over the first one's records.
        if let Err(e) = file.try_lock() {
            return Err(match e {
                std::fs::TryLockError::WouldBlock => VolumeError::Config(format!(
                    "write log {} is in use by another process",
                    path.display()
                )),
                std::fs::TryLockError::Error(source) => io_err(source),
            });
        }
        use std::os::fd::AsFd;
        let in_memory = matches!(
            terrace_media::os::fs_type(file.as_fd()),
            Ok(t) if t == terrace_media::os::TMPFS_MAGIC || t == terrace_media::os::RAMFS_MAGIC
        );
        let mut existing = file.metadata().map_err(io_err)?.len();
        if existing == 0 {
            reserve(&file, len).map_err(io_err)?;
            if in_memory {
                prefault(&file, len).map_err(io_err)?;
            }
            existing = len;
        }
        Ok(FileLogStore {
            file,
            path: path.to_path_buf(),
            len: existing,
            in_memory,
        })
    }
}

/// Gives `file` `len` bytes with blocks behind them, so appends cannot meet a full file
/// system later (`fallocate`; a file system that cannot reserve keeps a plain length).
fn reserve(file: &File, len: u64) -> io::Result<()> {
    use std::os::fd::AsFd;
    match terrace_media::os::fallocate(file.as_fd(), 0, 0, len) {
        Ok(()) => Ok(()),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EINVAL)
            ) =>
        {
            file.set_len(len)
        }
        Err(e) => Err(e),
    }
}

/// Writes zeroes over a new in-memory log, so its pages exist before the first append:
/// the first write to a tmpfs page allocates and clears it (and, in a virtual machine,
/// may make the host back it), several times the cost of writing an existing page, and
/// that cost would otherwise fall on acknowledged writes for the log's whole first pass.
/// A fresh file reads as zeroes either way, so this changes no content.
fn prefault(file: &File, len: u64) -> io::Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeroes = vec![0u8; CHUNK as usize];
    let mut at = 0;
    while at < len {
        let n = CHUNK.min(len - at);
        file.write_all_at(&zeroes[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

impl LogStore for FileLogStore {
    fn size(&self) -> u64 {
        self.len
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }
    /// One `pwritev`: one system call and no copy of a 64 KiB payload into a record
    /// buffer (a tenth of the server's CPU at 64 KiB writes). A short write finishes
    /// with plain writes.
    fn write_parts_at(&self, offset: u64, head: &[u8], body: &[u8]) -> io::Result<()> {
        let parts = [io::IoSlice::new(head), io::IoSlice::new(body)];
        let written = loop {
            match rustix::io::pwritev(&self.file, &parts, offset) {
                Ok(n) => break n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        };
        if written < head.len() {
            self.file
                .write_all_at(&head[written..], offset + written as u64)?;
            self.file.write_all_at(body, offset + head.len() as u64)
        } else {
            let done = written - head.len();
            self.file
                .write_all_at(&body[done..], offset + written as u64)
        }
    }
    fn sync(&self) -> io::Result<()> {
        if self.in_memory {
            return Ok(());
        }
        self.file.sync_data()
    }
    fn describe(&self) -> String {
        format!("{}", self.path.display())
    }
    fn sync_is_free(&self) -> bool {
        self.in_memory
    }
    fn unlock(&self) {
        let _ = self.file.unlock();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Superblock {
    volume_size: u64,
    capacity: u64,
    generation: u64,
    head_pos: u64,
    head_seq: u64,
    life: u32,
    /// No record at or after the head has a lower life (L3).
    head_life: u32,
    /// While a grow is unfinished, the size before it; else 0 (L5).
    grown_from: u64,
}

impl Superblock {
    fn encode(&self) -> [u8; SB_BYTES] {
        let mut b = [0u8; SB_BYTES];
        b[0..8].copy_from_slice(SB_MAGIC);
        b[8..12].copy_from_slice(&SB_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(BLOCK_SIZE as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.volume_size.to_le_bytes());
        b[24..32].copy_from_slice(&self.capacity.to_le_bytes());
        b[32..40].copy_from_slice(&self.generation.to_le_bytes());
        b[40..48].copy_from_slice(&self.head_pos.to_le_bytes());
        b[48..56].copy_from_slice(&self.head_seq.to_le_bytes());
        b[56..60].copy_from_slice(&self.life.to_le_bytes());
        b[60..64].copy_from_slice(&self.head_life.to_le_bytes());
        b[64..72].copy_from_slice(&self.grown_from.to_le_bytes());
        let crc = crc32fast::hash(&b[..72]);
        b[72..76].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `Err` says why the slot is not a superblock; `Ok(None)` means an all-zero slot.
    fn decode(b: &[u8; SB_BYTES]) -> Result<Option<Superblock>, String> {
        if b.iter().all(|&x| x == 0) {
            return Ok(None);
        }
        if &b[0..8] != SB_MAGIC {
            return Err("not a Terrace write log (bad magic)".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        // Version 1 had no *grown from*: its crc follows the head life.
        let crc_at = match u32_at(8) {
            1 => 64,
            SB_VERSION => 72,
            other => {
                return Err(format!(
                    "format version {other} (this build reads 1 and {SB_VERSION})"
                ))
            }
        };
        if u32_at(crc_at) != crc32fast::hash(&b[..crc_at]) {
            return Err("superblock checksum mismatch".into());
        }
        if u32_at(12) as usize != BLOCK_SIZE {
            return Err(format!(
                "block size {} (this build uses {BLOCK_SIZE})",
                u32_at(12)
            ));
        }
        Ok(Some(Superblock {
            volume_size: u64_at(16),
            capacity: u64_at(24),
            generation: u64_at(32),
            head_pos: u64_at(40),
            head_seq: u64_at(48),
            life: u32_at(56),
            head_life: u32_at(60),
            grown_from: if crc_at == 72 { u64_at(64) } else { 0 },
        }))
    }
}

struct Header {
    kind: RecordKind,
    seq: u64,
    offset: u64,
    len: u32,
    payload_len: u32,
    payload_crc: u32,
    life: u32,
}

impl Header {
    fn encode(&self) -> [u8; HEADER as usize] {
        let mut b = [0u8; HEADER as usize];
        b[0..4].copy_from_slice(REC_MAGIC);
        b[4] = self.kind as u8;
        b[8..16].copy_from_slice(&self.seq.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        b[24..28].copy_from_slice(&self.len.to_le_bytes());
        b[28..32].copy_from_slice(&self.payload_len.to_le_bytes());
        b[32..36].copy_from_slice(&self.payload_crc.to_le_bytes());
        b[36..40].copy_from_slice(&self.life.to_le_bytes());
        let crc = crc32fast::hash(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8; HEADER as usize]) -> Option<Header> {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if &b[0..4] != REC_MAGIC || u32_at(60) != crc32fast::hash(&b[..60]) {
            return None;
        }
        Some(Header {
            kind: RecordKind::from_u8(b[4])?,
            seq: u64_at(8),
            offset: u64_at(16),
            len: u32_at(24),
            payload_len: u32_at(28),
            payload_crc: u32_at(32),
            life: u32_at(36),
        })
    }
}

/// The append side: the next sequence number and position, and the records not yet
/// released, in sequence order.
struct Tail {
    next_seq: u64,
    tail_pos: u64,
    head_pos: u64,
    records: VecDeque<RecordMeta>,
    /// How many of `records` are WRITE or ZERO records, and how many are barriers.
    data_records: usize,
    barrier_records: usize,
}

/// Which records are written and which are durable.
struct Commit {
    /// Sequence numbers written but not yet contiguous with `written_through`.
    written_ahead: std::collections::BTreeSet<u64>,
    /// Every record with a lower sequence number is written.
    written_through: u64,
    /// Every record with a lower sequence number is durable.
    durable_through: u64,
    syncing: bool,
    /// A store error seen by a sync: every later acknowledgement fails.
    failed: Option<String>,
}

/// What [`WriteLog::open`] found.
#[derive(Debug, Clone)]
pub struct LogRecovery {
    /// The records from the head to the last valid one, in order.
    pub records: Vec<RecordMeta>,
    /// Whether the log was created by this open.
    pub created: bool,
    /// Why the scan stopped (a short reason, for the log line).
    pub end: String,
    /// A grow to this size was begun and may not have reached the backend: the opener
    /// grows the backend to it, then calls [`WriteLog::finish_grow`] (L5).
    pub grow_to: Option<u64>,
}

/// Counters of a write log (monotonic unless said otherwise).
#[derive(Debug, Clone, Default)]
pub struct LogStats {
    pub capacity: u64,
    /// Bytes between head and tail now.
    pub used: u64,
    pub appended_records: u64,
    pub appended_bytes: u64,
    pub syncs: u64,
    pub released_records: u64,
    /// Appends that waited for space, and the waits that ran out.
    pub full_waits: u64,
    pub full_timeouts: u64,
}

/// The write log. See the module docs.
pub struct WriteLog {
    store: Box<dyn LogStore>,
    capacity: u64,
    volume_size: AtomicU64,
    life: u32,
    superblock: Mutex<Superblock>,
    tail: Mutex<Tail>,
    space_freed: Condvar,
    commit: Mutex<Commit>,
    committed: Condvar,
    appended_records: AtomicU64,
    appended_bytes: AtomicU64,
    syncs: AtomicU64,
    released_records: AtomicU64,
    full_waits: AtomicU64,
    full_timeouts: AtomicU64,
    /// Appends waiting for space now (the write-back starts for them).
    space_waiters: AtomicU64,
    /// See [`WriteLog::keep_room`].
    kept_room: AtomicU64,
}

/// How long an append waits for durability.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Return once written (persistent-on-flush; a later flush or FUA waits).
    Written,
    /// Return once this record and all before it are durable.
    Durable,
}

impl WriteLog {
    /// Opens the log in `store` for a volume of `volume_size` bytes (the backend's size),
    /// creating it if the store is all zeroes, and recovers its records (see L3). The
    /// life is raised and made durable before this returns. A log of another size is
    /// refused, unless a grow between the two sizes was under way (L5).
    pub fn open(
        store: Box<dyn LogStore>,
        volume_size: u64,
    ) -> Result<(WriteLog, LogRecovery), VolumeError> {
        let described = PathBuf::from(store.describe());
        let bad = |what: String| VolumeError::BadLog {
            path: described.clone(),
            what,
        };
        let len = store.size();
        if len < SB_AREA + 64 * HEADER {
            return Err(bad(format!("{len} bytes is too small for a write log")));
        }
        let capacity = (len - SB_AREA) / HEADER * HEADER;
        let mut slots = [None, None];
        let mut errors = Vec::new();
        for (i, slot) in slots.iter_mut().enumerate() {
            let mut b = [0u8; SB_BYTES];
            store
                .read_at(i as u64 * SB_SLOT, &mut b)
                .map_err(|e| bad(format!("reading the superblock: {e}")))?;
            match Superblock::decode(&b) {
                Ok(sb) => *slot = sb,
                Err(e) => errors.push(e),
            }
        }
        let current = match (slots[0], slots[1]) {
            (Some(a), Some(b)) => Some(if a.generation >= b.generation { a } else { b }),
            (a, b) => a.or(b),
        };
        let (mut sb, created) = match current {
            Some(sb) => (sb, false),
            None if errors.len() == 2 => return Err(bad(errors.join("; "))),
            // No superblock yet — or one slot torn and the other never written: a log
            // whose creation did not finish holds nothing.
            None => (
                Superblock {
                    volume_size,
                    capacity,
                    generation: 0,
                    head_pos: 0,
                    head_seq: 1,
                    life: 0,
                    head_life: 0,
                    grown_from: 0,
                },
                true,
            ),
        };
        let grow_to = if sb.grown_from != 0 {
            if volume_size != sb.grown_from && volume_size != sb.volume_size {
                return Err(bad(format!(
                    "it was growing from {} to {} bytes, but the backend has {volume_size}",
                    sb.grown_from, sb.volume_size
                )));
            }
            Some(sb.volume_size)
        } else if sb.volume_size != volume_size {
            return Err(bad(format!(
                "it belongs to a volume of {} bytes, not {volume_size}",
                sb.volume_size
            )));
        } else {
            None
        };
        if sb.capacity != capacity {
            return Err(bad(format!(
                "its record area is {} bytes but the file gives {capacity}",
                sb.capacity
            )));
        }
        let (records, end) = if created {
            (Vec::new(), "new log".to_string())
        } else {
            scan(store.as_ref(), &sb)
        };
        let tail_pos = records.last().map_or(sb.head_pos, |r| r.end());
        let next_seq = records.last().map_or(sb.head_seq, |r| r.seq + 1);
        sb.life = sb.life.wrapping_add(1).max(1);
        // L3: the recovered records' lowest life, or this life's if there are none (every
        // record after them will be this life's).
        sb.head_life = records.first().map_or(sb.life, |r| r.life);
        let log = WriteLog {
            store,
            capacity,
            volume_size: AtomicU64::new(sb.volume_size),
            life: sb.life,
            superblock: Mutex::new(sb),
            tail: Mutex::new(Tail {
                next_seq,
                tail_pos,
                head_pos: sb.head_pos,
                records: records.iter().copied().collect(),
                data_records: records.iter().filter(|r| r.kind.carries_data()).count(),
                barrier_records: records
                    .iter()
                    .filter(|r| r.kind == RecordKind::Barrier)
                    .count(),
            }),
            space_freed: Condvar::new(),
            commit: Mutex::new(Commit {
                written_ahead: Default::default(),
                written_through: next_seq,
                durable_through: next_seq,
                syncing: false,
                failed: None,
            }),
            committed: Condvar::new(),
            appended_records: AtomicU64::new(0),
            appended_bytes: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            released_records: AtomicU64::new(0),
            full_waits: AtomicU64::new(0),
            full_timeouts: AtomicU64::new(0),
            space_waiters: AtomicU64::new(0),
            kept_room: AtomicU64::new(0),
        };
        {
            let mut sb = log.superblock.lock();
            log.write_superblock(&mut sb)
                .map_err(|e| bad(format!("writing the superblock: {e}")))?;
        }
        Ok((
            log,
            LogRecovery {
                records,
                created,
                end,
                grow_to,
            },
        ))
    }

    /// Bytes of the record area.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The volume size the log was made for (the new one once a grow has begun).
    pub fn volume_size(&self) -> u64 {
        self.volume_size.load(Ordering::Acquire)
    }

    /// Starts growing the volume to `new_size` (larger than now): durably records the
    /// new size with the old one as *grown from* (L5). The caller then grows the backend
    /// and calls [`finish_grow`](Self::finish_grow) — or
    /// [`cancel_grow`](Self::cancel_grow) if the backend could not grow.
    pub fn begin_grow(&self, new_size: u64) -> Result<(), BlockError> {
        let mut sb = self.superblock.lock();
        if sb.grown_from != 0 {
            // An earlier grow whose end could not be recorded: the next open ends it.
            return Err(BlockError::Log(format!(
                "a grow from {} to {} bytes is unfinished (the next open finishes it)",
                sb.grown_from, sb.volume_size
            )));
        }
        if new_size <= sb.volume_size {
            return Err(BlockError::Log(format!(
                "cannot grow from {} to {new_size} bytes",
                sb.volume_size
            )));
        }
        self.update_superblock(&mut sb, |sb| {
            sb.grown_from = sb.volume_size;
            sb.volume_size = new_size;
        })
        .map_err(|e| BlockError::Log(format!("recording a grow to {new_size} bytes: {e}")))?;
        self.volume_size.store(new_size, Ordering::Release);
        Ok(())
    }

    /// Ends a grow whose backend has its new size (L5).
    pub fn finish_grow(&self) -> Result<(), BlockError> {
        let mut sb = self.superblock.lock();
        if sb.grown_from == 0 {
            return Ok(());
        }
        self.update_superblock(&mut sb, |sb| sb.grown_from = 0)
            .map_err(|e| BlockError::Log(format!("ending a grow: {e}")))
    }

    /// Takes back a grow the backend refused: the superblock names the old size again.
    pub fn cancel_grow(&self) -> Result<(), BlockError> {
        let mut sb = self.superblock.lock();
        if sb.grown_from == 0 {
            return Ok(());
        }
        let new_size = sb.volume_size;
        self.update_superblock(&mut sb, |sb| {
            sb.volume_size = sb.grown_from;
            sb.grown_from = 0;
        })
        .map_err(|e| BlockError::Log(format!("taking back a grow to {new_size} bytes: {e}")))?;
        self.volume_size.store(sb.volume_size, Ordering::Release);
        Ok(())
    }

    /// Writes `sb` (with the next generation) to the slot not holding the current one,
    /// and syncs.
    fn write_superblock(&self, sb: &mut Superblock) -> io::Result<()> {
        sb.generation += 1;
        let slot = sb.generation % 2;
        self.store.write_at(slot * SB_SLOT, &sb.encode())?;
        self.store.sync()?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes `sb` with `change` made (as [`write_superblock`](Self::write_superblock));
    /// `sb` takes the change only once it is durable, so a failed update leaves the
    /// superblock — generation included — as it was, and the next update goes to the same
    /// slot again, never over the current one.
    fn update_superblock(
        &self,
        sb: &mut Superblock,
        change: impl FnOnce(&mut Superblock),
    ) -> io::Result<()> {
        let mut next = *sb;
        change(&mut next);
        self.write_superblock(&mut next)?;
        *sb = next;
        Ok(())
    }

    fn file_offset(&self, pos: u64) -> u64 {
        SB_AREA + pos % self.capacity
    }

    /// Takes a sequence number and space for a record, waiting up to `max_wait` for the
    /// write-back to free space. The record is pending until [`WriteLog::write_record`]
    /// (or [`WriteLog::abandon`]): every reservation must end in one of them, or nothing
    /// after it is ever acknowledged.
    pub fn reserve(
        &self,
        kind: RecordKind,
        offset: u64,
        len: u64,
        max_wait: Duration,
    ) -> Result<RecordMeta, BlockError> {
        Ok(self.reserve_all(&[(kind, offset, len)], max_wait)?[0])
    }

    /// Reserves several records at once, all or none (a request that needs a few records
    /// never holds some while it waits for the others). They must leave the kept room
    /// ([`WriteLog::keep_room`]) free.
    pub fn reserve_all(
        &self,
        wanted: &[(RecordKind, u64, u64)],
        max_wait: Duration,
    ) -> Result<Vec<RecordMeta>, BlockError> {
        self.reserve_within(wanted, max_wait, self.kept_room.load(Ordering::Relaxed))
    }

    /// [`reserve_all`](Self::reserve_all) for the one caller that may use the kept room
    /// (storage mode's compaction, which frees space by copying live records forward).
    pub fn reserve_in_kept_room(
        &self,
        wanted: &[(RecordKind, u64, u64)],
    ) -> Result<Vec<RecordMeta>, BlockError> {
        self.reserve_within(wanted, Duration::ZERO, 0)
    }

    /// Bytes that appends other than barriers and
    /// [`reserve_in_kept_room`](Self::reserve_in_kept_room) must leave free (0 unless
    /// set).
    pub fn keep_room(&self, bytes: u64) {
        self.kept_room
            .store(bytes.min(self.capacity / 2), Ordering::Relaxed);
    }

    fn reserve_within(
        &self,
        wanted: &[(RecordKind, u64, u64)],
        max_wait: Duration,
        kept_room: u64,
    ) -> Result<Vec<RecordMeta>, BlockError> {
        let spans: Vec<u64> = wanted.iter().map(|&(k, _, l)| record_span(k, l)).collect();
        let total: u64 = spans.iter().sum();
        let largest = spans.iter().copied().max().unwrap_or(0);
        if total + largest + BARRIER_ROOM + kept_room > self.capacity {
            return Err(BlockError::Log(format!(
                "{total} bytes of records do not fit a {}-byte log ({kept_room} kept free)",
                self.capacity
            )));
        }
        // Barriers may use the last BARRIER_ROOM bytes; nothing else may, so a client's
        // flush never waits for space in a full log (a barrier never needs a wrap:
        // positions are 64-byte aligned, so 64 bytes always fit before the end).
        let only_barriers = wanted.iter().all(|&(k, _, _)| k == RecordKind::Barrier);
        let limit = if only_barriers {
            self.capacity
        } else {
            self.capacity - BARRIER_ROOM - kept_room
        };
        let deadline = Instant::now() + max_wait;
        let mut tail = self.tail.lock();
        let mut waited = false;
        loop {
            // Where the records would go: a record never straddles the area's end.
            let mut pos = tail.tail_pos;
            for &span in &spans {
                let to_end = self.capacity - pos % self.capacity;
                if to_end < span {
                    pos += to_end;
                }
                pos += span;
            }
            if pos - tail.head_pos <= limit {
                let mut placed = Vec::with_capacity(wanted.len());
                for (&(kind, offset, len), &span) in wanted.iter().zip(&spans) {
                    let to_end = self.capacity - tail.tail_pos % self.capacity;
                    if to_end < span {
                        self.place_wrap(&mut tail, to_end)?;
                    }
                    let meta = RecordMeta {
                        seq: tail.next_seq,
                        pos: tail.tail_pos,
                        kind,
                        offset,
                        len,
                        life: self.life,
                    };
                    tail.next_seq += 1;
                    tail.tail_pos += span;
                    tail.records.push_back(meta);
                    tail.data_records += usize::from(kind.carries_data());
                    tail.barrier_records += usize::from(kind == RecordKind::Barrier);
                    placed.push(meta);
                }
                if waited {
                    self.space_waiters.fetch_sub(1, Ordering::Relaxed);
                }
                return Ok(placed);
            }
            if max_wait.is_zero() {
                // A try (the NBD reader's): not a wait, not counted.
                return Err(BlockError::LogFull { waited_ms: 0 });
            }
            if !waited {
                waited = true;
                self.full_waits.fetch_add(1, Ordering::Relaxed);
                self.space_waiters.fetch_add(1, Ordering::Relaxed);
            }
            if self.space_freed.wait_until(&mut tail, deadline).timed_out() {
                self.full_timeouts.fetch_add(1, Ordering::Relaxed);
                self.space_waiters.fetch_sub(1, Ordering::Relaxed);
                return Err(BlockError::LogFull {
                    waited_ms: max_wait.as_millis() as u64,
                });
            }
        }
    }

    /// Fills a reservation that will not be used (its request failed before writing it)
    /// with a PAD record of the same span, so the log stays readable past it and the
    /// records after it can be acknowledged.
    pub fn abandon(&self, meta: &RecordMeta) -> Result<(), BlockError> {
        let span = record_span(meta.kind, meta.len);
        {
            let mut tail = self.tail.lock();
            let at = tail.records.partition_point(|r| r.seq < meta.seq);
            if tail.records.get(at).is_some_and(|r| r.seq == meta.seq) {
                if tail.records[at].kind.carries_data() {
                    tail.data_records -= 1;
                }
                if tail.records[at].kind == RecordKind::Barrier {
                    tail.barrier_records -= 1;
                }
                let r = &mut tail.records[at];
                r.kind = RecordKind::Pad;
                r.offset = 0;
                r.len = span;
            }
        }
        let pad = RecordMeta {
            kind: RecordKind::Pad,
            offset: 0,
            len: span,
            ..*meta
        };
        self.write_record(&pad, &[])
    }

    /// Fills the `to_end` bytes before the area's end: a WRAP record where 64 bytes fit
    /// (written and committed at once: it carries no data), else nothing.
    fn place_wrap(&self, tail: &mut Tail, to_end: u64) -> Result<(), BlockError> {
        if to_end >= HEADER {
            let meta = RecordMeta {
                seq: tail.next_seq,
                pos: tail.tail_pos,
                kind: RecordKind::Wrap,
                offset: 0,
                len: to_end,
                life: self.life,
            };
            tail.next_seq += 1;
            tail.records.push_back(meta);
            let header = Header {
                kind: RecordKind::Wrap,
                seq: meta.seq,
                offset: 0,
                len: to_end as u32,
                payload_len: 0,
                payload_crc: 0,
                life: self.life,
            };
            if let Err(e) = self
                .store
                .write_at(self.file_offset(meta.pos), &header.encode())
            {
                // As in write_record: nothing after it can be acknowledged; waiters fail
                // instead of waiting for a record that will never be written.
                let why = format!("writing wrap record {}: {e}", meta.seq);
                self.commit.lock().failed = Some(why.clone());
                self.committed.notify_all();
                return Err(BlockError::Log(why));
            }
            self.mark_written(meta.seq);
        }
        tail.tail_pos += to_end;
        Ok(())
    }

    /// Writes a reserved record (`payload` for a WRITE, empty otherwise) and marks it
    /// written. On a store error the log refuses every later acknowledgement.
    pub fn write_record(&self, meta: &RecordMeta, payload: &[u8]) -> Result<(), BlockError> {
        let payload_len = if meta.kind == RecordKind::Write {
            meta.len
        } else {
            0
        };
        debug_assert_eq!(payload.len() as u64, payload_len);
        let header = Header {
            kind: meta.kind,
            seq: meta.seq,
            offset: meta.offset,
            len: meta.len as u32,
            payload_len: payload_len as u32,
            payload_crc: crc32fast::hash(payload),
            life: self.life,
        };
        let at = self.file_offset(meta.pos);
        let result = if payload.is_empty() {
            self.store.write_at(at, &header.encode())
        } else {
            // One write of header and payload: half the system calls of two.
            self.store.write_parts_at(at, &header.encode(), payload)
        };
        if let Err(e) = result {
            let why = format!(
                "writing record {} to {}: {e}",
                meta.seq,
                self.store.describe()
            );
            self.commit.lock().failed = Some(why.clone());
            self.committed.notify_all();
            // The sequence is broken here: nothing after it can be acknowledged, and
            // marking it written would let later records look durable.
            return Err(BlockError::Log(why));
        }
        self.appended_records.fetch_add(1, Ordering::Relaxed);
        self.appended_bytes
            .fetch_add(HEADER + payload.len() as u64, Ordering::Relaxed);
        self.mark_written(meta.seq);
        Ok(())
    }

    fn mark_written(&self, seq: u64) {
        let mut c = self.commit.lock();
        if seq == c.written_through {
            c.written_through += 1;
            loop {
                let next = c.written_through;
                if !c.written_ahead.remove(&next) {
                    break;
                }
                c.written_through += 1;
            }
        } else {
            c.written_ahead.insert(seq);
        }
        self.committed.notify_all();
    }

    /// Waits until every record up to `seq` is durable, syncing the store for every
    /// waiter at once (group commit) when no other thread is.
    pub fn wait_durable(&self, seq: u64) -> Result<(), BlockError> {
        let mut c = self.commit.lock();
        loop {
            if let Some(why) = &c.failed {
                return Err(BlockError::Log(why.clone()));
            }
            if c.durable_through > seq {
                return Ok(());
            }
            if !c.syncing && c.written_through > c.durable_through {
                c.syncing = true;
                let target = c.written_through;
                drop(c);
                let result = self.store.sync();
                self.syncs.fetch_add(1, Ordering::Relaxed);
                c = self.commit.lock();
                c.syncing = false;
                match result {
                    Ok(()) => c.durable_through = c.durable_through.max(target),
                    Err(e) => c.failed = Some(format!("syncing {}: {e}", self.store.describe())),
                }
                self.committed.notify_all();
                continue;
            }
            self.committed.wait(&mut c);
        }
    }

    /// Waits until every record up to `seq` is written (not necessarily durable).
    pub fn wait_written(&self, seq: u64) -> Result<(), BlockError> {
        let mut c = self.commit.lock();
        while c.written_through <= seq {
            if let Some(why) = &c.failed {
                return Err(BlockError::Log(why.clone()));
            }
            self.committed.wait(&mut c);
        }
        Ok(())
    }

    /// Appends a record and waits as `wait` says.
    pub fn append(
        &self,
        kind: RecordKind,
        offset: u64,
        payload_or_len: Payload<'_>,
        wait: Wait,
        max_wait: Duration,
    ) -> Result<RecordMeta, BlockError> {
        let (len, payload) = match payload_or_len {
            Payload::Data(d) => (d.len() as u64, d),
            Payload::Length(l) => (l, &[][..]),
        };
        let meta = self.reserve(kind, offset, len, max_wait)?;
        self.write_record(&meta, payload)?;
        match wait {
            Wait::Written => Ok(meta),
            Wait::Durable => self.wait_durable(meta.seq).map(|()| meta),
        }
    }

    /// Reads `buf.len()` payload bytes of the WRITE record at position `pos`, starting
    /// `within` bytes into its payload. The caller knows the record is not released.
    pub fn read_payload(&self, pos: u64, within: u64, buf: &mut [u8]) -> io::Result<()> {
        self.store
            .read_at(self.file_offset(pos) + HEADER + within, buf)
    }

    /// The sequence number of the newest reserved record (0 when none ever was).
    pub fn last_seq(&self) -> u64 {
        self.tail.lock().next_seq - 1
    }

    /// The oldest records to write back together: from the head through the first
    /// barrier, or fewer if they span over `max_bytes` of log, and only records already
    /// written. Any prefix of the log is a point in time a crash could leave (the log's
    /// order is the order writes were acknowledged in, and a flush's barrier follows every
    /// write it covers), so the write-back may release any prefix it has written back.
    /// `None` when nothing is pending or the oldest record is still being written.
    pub fn oldest_batch(&self, max_bytes: u64) -> Option<Vec<RecordMeta>> {
        let written_through = self.commit.lock().written_through;
        let tail = self.tail.lock();
        let first = tail.records.front()?;
        let mut batch = Vec::new();
        for r in tail.records.iter() {
            if r.seq >= written_through {
                break;
            }
            batch.push(*r);
            if r.kind == RecordKind::Barrier || r.end() - first.pos >= max_bytes {
                break;
            }
        }
        (!batch.is_empty()).then_some(batch)
    }

    /// Appends waiting for space now.
    pub fn space_waiters(&self) -> u64 {
        self.space_waiters.load(Ordering::Relaxed)
    }

    /// Whether any record other than barriers and wraps is pending.
    pub fn has_data_records(&self) -> bool {
        self.tail.lock().data_records > 0
    }

    /// Whether any barrier is pending (so the records before it must reach the backend
    /// before anything written after it).
    pub fn has_barriers(&self) -> bool {
        self.tail.lock().barrier_records > 0
    }

    /// Whether the newest pending record is a barrier (or nothing is pending).
    pub fn ends_in_barrier(&self) -> bool {
        self.tail
            .lock()
            .records
            .back()
            .is_none_or(|r| r.kind == RecordKind::Barrier)
    }

    /// Releases every record through `last` (the end of a batch the caller wrote back
    /// and flushed to the backend), in two steps (L4): this one moves the head past it
    /// durably; the records stay where they are, readable, until
    /// [`reuse_through`](Self::reuse_through). So a caller may hold its own locks over
    /// the second step only: this one may wait long — a replicated store's sync waits
    /// for a copy in sync (`ReplicatedStore`), indefinitely while the volume is
    /// read-only. Only the write-back releases, one batch at a time.
    pub fn persist_release(&self, last: &RecordMeta) -> Result<(), BlockError> {
        // L3: the life of the first record kept, or this life's if none is pending. (Only
        // the write-back releases, so nothing leaves the front meanwhile.)
        let head_life = {
            let tail = self.tail.lock();
            let after = tail.records.iter().find(|r| r.seq > last.seq);
            after.map_or(self.life, |r| r.life)
        };
        let mut sb = self.superblock.lock();
        self.update_superblock(&mut sb, |sb| {
            sb.head_pos = last.end();
            sb.head_seq = last.seq + 1;
            sb.head_life = head_life;
        })
        .map_err(|e| BlockError::Log(format!("writing the superblock: {e}")))
    }

    /// The release's second step, after [`persist_release`](Self::persist_release) of
    /// the same `last`: the space of every record through it may be written over from
    /// now on; wakes appends waiting for space.
    pub fn reuse_through(&self, last: &RecordMeta) {
        let mut tail = self.tail.lock();
        let mut released = 0;
        while let Some(r) = tail.records.front().copied().filter(|r| r.seq <= last.seq) {
            tail.records.pop_front();
            tail.data_records -= usize::from(r.kind.carries_data());
            tail.barrier_records -= usize::from(r.kind == RecordKind::Barrier);
            released += 1;
        }
        tail.head_pos = last.end();
        drop(tail);
        self.released_records.fetch_add(released, Ordering::Relaxed);
        self.space_freed.notify_all();
    }

    /// Whether waiting for durability costs no I/O ([`LogStore::sync_is_free`]).
    pub fn sync_is_free(&self) -> bool {
        self.store.sync_is_free()
    }

    /// Gives the store up (its file lock) after the last write: [`Volume::close`].
    ///
    /// [`Volume::close`]: crate::Volume::close
    pub fn unlock(&self) {
        self.store.unlock();
    }

    /// Syncs this node's store (a clean stop's last step: replication, if any, has
    /// stopped, and nothing is acknowledged after it — [`LogStore::sync_local`]).
    pub fn sync(&self) -> io::Result<()> {
        self.store.sync_local()
    }

    pub fn stats(&self) -> LogStats {
        let tail = self.tail.lock();
        LogStats {
            capacity: self.capacity,
            used: tail.tail_pos - tail.head_pos,
            appended_records: self.appended_records.load(Ordering::Relaxed),
            appended_bytes: self.appended_bytes.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
            released_records: self.released_records.load(Ordering::Relaxed),
            full_waits: self.full_waits.load(Ordering::Relaxed),
            full_timeouts: self.full_timeouts.load(Ordering::Relaxed),
        }
    }
}

/// A record's content for [`WriteLog::append`].
pub enum Payload<'a> {
    Data(&'a [u8]),
    Length(u64),
}

/// Reads records from the head (L3). Returns them and why the scan stopped.
fn scan(store: &dyn LogStore, sb: &Superblock) -> (Vec<RecordMeta>, String) {
    let capacity = sb.capacity;
    let mut records = Vec::new();
    let mut pos = sb.head_pos;
    let mut seq = sb.head_seq;
    let mut life = sb.head_life;
    let mut payload = Vec::new();
    loop {
        if pos - sb.head_pos >= capacity {
            return (records, "the log is full".into());
        }
        let to_end = capacity - pos % capacity;
        if to_end < HEADER {
            pos += to_end;
            continue;
        }
        let mut hb = [0u8; HEADER as usize];
        if let Err(e) = store.read_at(SB_AREA + pos % capacity, &mut hb) {
            return (records, format!("read error at position {pos}: {e}"));
        }
        let Some(h) = Header::decode(&hb) else {
            return (records, format!("no valid record at position {pos}"));
        };
        if h.seq != seq {
            return (records, format!("sequence {} where {seq} was due", h.seq));
        }
        if h.life < life {
            return (records, format!("record {seq} is from an earlier life"));
        }
        life = h.life;
        let kind = h.kind;
        let len = u64::from(h.len);
        let span = record_span(kind, len);
        let shape_ok = match kind {
            RecordKind::Write => {
                u64::from(h.payload_len) == len && len > 0 && len.is_multiple_of(BLOCK_SIZE as u64)
            }
            RecordKind::Zero => h.payload_len == 0 && len.is_multiple_of(BLOCK_SIZE as u64),
            RecordKind::Barrier => h.payload_len == 0,
            RecordKind::Wrap => h.payload_len == 0 && len == to_end,
            RecordKind::Pad => {
                h.payload_len == 0 && len >= HEADER && len.is_multiple_of(HEADER) && len <= to_end
            }
        };
        let skips = matches!(kind, RecordKind::Wrap | RecordKind::Pad);
        let in_volume = skips
            || h.offset
                .checked_add(len)
                .is_some_and(|e| e <= sb.volume_size);
        if !shape_ok || !in_volume || (!skips && span > to_end) {
            return (records, format!("record {seq} is malformed"));
        }
        if kind == RecordKind::Write {
            payload.resize(len as usize, 0);
            if store
                .read_at(SB_AREA + pos % capacity + HEADER, &mut payload)
                .is_err()
                || crc32fast::hash(&payload) != h.payload_crc
            {
                return (records, format!("record {seq}'s payload is torn"));
            }
        }
        let meta = RecordMeta {
            seq,
            pos,
            kind,
            offset: h.offset,
            len,
            life: h.life,
        };
        records.push(meta);
        seq += 1;
        pos = meta.end();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn superblock() -> Superblock {
        Superblock {
            volume_size: 1 << 30,
            capacity: 64 << 20,
            generation: 7,
            head_pos: 4096,
            head_seq: 12,
            life: 3,
            head_life: 2,
            grown_from: 0,
        }
    }

    #[test]
    fn a_superblock_round_trips_with_its_grow() {
        let grown = Superblock {
            grown_from: 1 << 29,
            ..superblock()
        };
        assert_eq!(Superblock::decode(&grown.encode()), Ok(Some(grown)));
        let mut torn = grown.encode();
        torn[66] ^= 1;
        assert!(Superblock::decode(&torn).unwrap_err().contains("checksum"));
    }

    /// A version 1 superblock (no *grown from*, its crc after the head life) still opens.
    #[test]
    fn a_version_1_superblock_is_read_with_nothing_grown() {
        let sb = superblock();
        let mut b = sb.encode();
        b[8..12].copy_from_slice(&1u32.to_le_bytes());
        b[64..76].fill(0);
        let crc = crc32fast::hash(&b[..64]);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(Superblock::decode(&b), Ok(Some(sb)));
        b[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert!(Superblock::decode(&b).unwrap_err().contains("version 3"));
    }
}

//! The saved index of a clean shutdown ([`Cache::shutdown`]): `terrace.index` beside the
//! first file tier. It holds the DRAM index itself — the raw table, bucket by bucket — and
//! per segment the write sequence and dead bytes, so that the next [`Cache::open`] reads
//! the table straight into its index (in parallel, a checksum per chunk) and touches only
//! segment headers: no item is decoded, hashed or re-inserted. A restart with another
//! index geometry (another capacity, item count or seed) decodes the saved entries and
//! re-inserts them item by item instead.
//!
//! Format (version 4), little-endian. The head: magic `"TRCIDX\0\0"`, version `u16`,
//! `size_shift: u8`, one zero byte, `segments: u32`, `seq_bound: u64`, `buckets: u64`,
//! `tag_bits, segment_bits, offset_bits: u8`, one zero byte, `chunk_bytes: u32`,
//! `seed: u64`, `entries: u64`; then per segment id `(write_seq: u64, dead_bytes: u32)`
//! (write sequence 0: not a saved segment); then per chunk of the table `(len: u32,
//! crc: u32, form: u8, three zero bytes)`; then the CRC-32 of the head before it. Then
//! the chunks, back to back, each `len` bytes with CRC-32 `crc`. The table is
//! `buckets * SLOTS` entries cut into chunks of `chunk_bytes` (the last may be shorter);
//! a chunk is stored *dense* (form 0: its entries, `u64` each) or, when less than a sixth
//! of its slots are occupied, *sparse* (form 1: `(slot in the chunk: u32, entry: u64)`
//! per occupied slot, slots increasing). Entries of segments that are not saved are zero.
//! Versions 1 and 2 (a list of `(segment, offset[, frequency])` records after the
//! per-segment write sequences) are still read; version 3 (every chunk dense) is not, and
//! the open scans.
//!
//! When it is trusted (invariants the restart relies on):
//! - its head CRC matches and its `seq_bound` equals the bound the write-sequence mark
//!   holds now: every open reserves a new bound, so a saved index is used at most by the
//!   first open after the shutdown that wrote it, and never after any other open —
//!   whatever that open did to the tiers;
//! - the table only if every chunk's CRC matches (a save torn by a crash is not used at
//!   all: every segment is then scanned);
//! - per segment: only if the segment's header carries the write sequence recorded here
//!   (the same incarnation, so every saved entry names an item start in it). A saved
//!   segment that fails this loses its entries (a sweep of the loaded table); the
//!   item-by-item path indexes a saved item only if it decodes and is LIVE.
//!
//! At shutdown every LIVE item of a durable tier is indexed (E2), and every LIVE item of
//! a snapshot is (nothing runs between the sweep and the save), so the saved entries are
//! all of them, and the segments not saved hold no LIVE item. The file is removed at open
//! whether or not it was used.

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{snapshot, Cache};
use crate::error::CacheError;
use crate::index::{Index, Layout, Sweep, SLOTS};

const MAGIC: [u8; 8] = *b"TRCIDX\0\0";
const VERSION: u16 = 4;
/// Bytes of an entry record in versions 1 and 2.
const fn entry_len(version: u16) -> usize {
    if version >= 2 {
        9
    } else {
        8
    }
}
/// The fixed part of versions 1 and 2.
const FIXED_V2: usize = 8 + 2 + 1 + 1 + 4 + 8 + 8;
/// The fixed part of version 4.
const FIXED: usize = 8 + 2 + 1 + 1 + 4 + 8 + 8 + 4 + 4 + 8 + 8;
/// Bytes of a version-3 segment record.
const SEGMENT_RECORD: usize = 12;
/// Bytes of the table one chunk covers: big enough that the chunk records are a small part
/// of the head, small enough that the chunks spread evenly over the cores.
const CHUNK_BYTES: usize = 1 << 20;
/// Bytes of a chunk record in the head.
const CHUNK_RECORD: usize = 12;
/// A chunk stored as its entries.
const DENSE: u8 = 0;
/// A chunk stored as `(slot, entry)` records of its occupied slots.
const SPARSE: u8 = 1;
/// Bytes of a sparse record.
const SPARSE_RECORD: usize = 12;

/// Where a chunk lies in the file and how it is stored.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    at: u64,
    len: usize,
    crc: u32,
    form: u8,
    /// Slots of the table it covers.
    slots: usize,
}

/// Calls `each(slot in the chunk, entry)` for every occupied slot of a chunk's bytes;
/// `false` if they do not decode as `chunk` says (a slot out of range or out of order).
fn decode_chunk(chunk: &Chunk, bytes: &[u8], mut each: impl FnMut(usize, u64)) -> bool {
    let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    match chunk.form {
        DENSE if bytes.len() == chunk.slots * 8 => {
            for (i, e) in bytes.chunks_exact(8).enumerate() {
                let entry = word(e);
                if entry != 0 {
                    each(i, entry);
                }
            }
            true
        }
        SPARSE if bytes.len().is_multiple_of(SPARSE_RECORD) => {
            let mut next = 0usize;
            for record in bytes.chunks_exact(SPARSE_RECORD) {
                let slot = u32::from_le_bytes(record[..4].try_into().unwrap_or([0; 4])) as usize;
                if slot < next || slot >= chunk.slots {
                    return false;
                }
                next = slot + 1;
                each(slot, word(&record[4..]));
            }
            true
        }
        _ => false,
    }
}

/// A chunk's bytes as stored: sparse when that is less than half the dense size.
fn encode_chunk(dense: &[u8], out: &mut Vec<u8>) -> u8 {
    let occupied = dense
        .chunks_exact(8)
        .filter(|e| e.iter().any(|&b| b != 0))
        .count();
    out.clear();
    if occupied * SPARSE_RECORD * 2 >= dense.len() {
        out.extend_from_slice(dense);
        return DENSE;
    }
    for (i, e) in dense.chunks_exact(8).enumerate() {
        if e.iter().any(|&b| b != 0) {
            out.extend_from_slice(&(i as u32).to_le_bytes());
            out.extend_from_slice(e);
        }
    }
    SPARSE
}

/// The file's name in its directory.
pub fn saved_path(dir: &Path) -> PathBuf {
    dir.join("terrace.index")
}

/// What a clean shutdown recorded of one segment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct SegmentRecord {
    /// 0: not saved.
    write_seq: u64,
    dead_bytes: u32,
}

/// A saved segment, as [`Saved::segment`] finds it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum SavedSegment<'a> {
    /// Its entries are already in the index (loaded with the table); these bytes of it are
    /// dead.
    Indexed { dead_bytes: u32 },
    /// Its saved items, `(offset, frequency)`, to be decoded and indexed one by one.
    Items(&'a [(u32, u8)]),
}

/// A saved index that passed its checks.
#[derive(Debug, Default)]
pub(super) struct Saved {
    segments: Vec<SegmentRecord>,
    /// How the items come back.
    form: Form,
}

#[derive(Debug, Default)]
enum Form {
    /// The table is in the index: `entries` of them.
    #[default]
    Loaded,
    /// Per segment id: the saved items' offsets and index frequencies.
    Items(HashMap<u32, Vec<(u32, u8)>>),
}

impl Saved {
    /// Segment `id` as saved, if it is still the incarnation with write sequence `seq`.
    pub(super) fn segment(&self, id: u32, seq: u64) -> Option<SavedSegment<'_>> {
        let record = self.segments.get(id as usize)?;
        if record.write_seq == 0 || record.write_seq != seq {
            return None;
        }
        Some(match &self.form {
            Form::Loaded => SavedSegment::Indexed {
                dead_bytes: record.dead_bytes,
            },
            Form::Items(items) => {
                SavedSegment::Items(items.get(&id).map_or(&[][..], |v| v.as_slice()))
            }
        })
    }

    /// Whether the table was loaded into the index as it lay (no item to insert).
    pub(super) fn is_loaded(&self) -> bool {
        matches!(self.form, Form::Loaded)
    }

    /// Whether segment `id` has saved entries (loaded or listed).
    pub(super) fn is_saved(&self, id: u32) -> bool {
        self.segments
            .get(id as usize)
            .is_some_and(|r| r.write_seq != 0)
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads and removes the saved index in `dir`; `None` unless it is present, intact and
/// written for this configuration (`shift`, `segments`) and mark `bound`. A version-3
/// table of `index`'s geometry is read straight into `index` (which must be empty);
/// on any failure `index` is left empty. Returns the saved index and the entries loaded.
pub(super) fn take(
    dir: &Path,
    shift: u8,
    segments: u32,
    bound: u64,
    index: &mut Index,
) -> Option<(Saved, usize)> {
    let path = saved_path(dir);
    let mut file = File::open(&path).ok()?;
    // Removed before use; if removal fails the bound check still keeps it from a second use.
    let _ = std::fs::remove_file(&path);
    let file_len = file.metadata().ok()?.len();
    let mut fixed = [0u8; FIXED];
    file.read_exact(&mut fixed[..10]).ok()?;
    if fixed[0..8] != MAGIC {
        return None;
    }
    let version = u16::from_le_bytes([fixed[8], fixed[9]]);
    if version < 3 {
        let mut bytes = fixed[..10].to_vec();
        file.read_to_end(&mut bytes).ok()?;
        return take_v2(&bytes, shift, segments, bound).map(|s| (s, 0));
    }
    if version != VERSION {
        return None;
    }
    file.read_exact(&mut fixed[10..]).ok()?;
    if fixed[10] != shift || u32_at(&fixed, 12)? != segments || u64_at(&fixed, 16)? != bound {
        return None;
    }
    let buckets = usize::try_from(u64_at(&fixed, 24)?).ok()?;
    let layout = Layout {
        tag_bits: u32::from(fixed[32]),
        segment_bits: u32::from(fixed[33]),
        offset_bits: u32::from(fixed[34]),
    };
    let chunk_bytes = u32_at(&fixed, 36)? as usize;
    let seed = u64_at(&fixed, 40)?;
    let table_len = buckets.checked_mul(SLOTS * 8)?;
    if chunk_bytes == 0
        || !chunk_bytes.is_multiple_of(SLOTS * 8)
        || layout.tag_bits + layout.segment_bits + layout.offset_bits + crate::index::FREQ_BITS
            != 64
    {
        return None;
    }
    let chunk_count = table_len.div_ceil(chunk_bytes);
    let head_len = FIXED
        .checked_add((segments as usize).checked_mul(SEGMENT_RECORD)?)?
        .checked_add(chunk_count.checked_mul(CHUNK_RECORD)?)?
        .checked_add(4)?;
    if file_len < head_len as u64 {
        return None;
    }
    let mut head = fixed.to_vec();
    head.resize(head_len, 0);
    file.read_exact(&mut head[FIXED..]).ok()?;
    let body = head_len - 4;
    if u32_at(&head, body)? != crc32fast::hash(&head[..body]) {
        return None;
    }
    let records: Vec<SegmentRecord> = (0..segments as usize)
        .map(|i| {
            let at = FIXED + SEGMENT_RECORD * i;
            Some(SegmentRecord {
                write_seq: u64_at(&head, at)?,
                dead_bytes: u32_at(&head, at + 8)?,
            })
        })
        .collect::<Option<_>>()?;
    let chunk_start = FIXED + SEGMENT_RECORD * segments as usize;
    let mut at = head_len as u64;
    let mut chunks = Vec::with_capacity(chunk_count);
    for c in 0..chunk_count {
        let record = chunk_start + CHUNK_RECORD * c;
        let len = u32_at(&head, record)? as usize;
        chunks.push(Chunk {
            at,
            len,
            crc: u32_at(&head, record + 4)?,
            form: *head.get(record + 8)?,
            slots: (table_len - c * chunk_bytes).min(chunk_bytes) / 8,
        });
        at = at.checked_add(len as u64)?;
    }
    if file_len != at {
        return None;
    }
    let read = |chunk: &Chunk| -> Option<Vec<u8>> {
        let mut bytes = vec![0u8; chunk.len];
        file.read_exact_at(&mut bytes, chunk.at).ok()?;
        (crc32fast::hash(&bytes) == chunk.crc).then_some(bytes)
    };
    if buckets == index.bucket_count() && layout == index.layout() && seed == index.seed() {
        // The table as it lay, chunk by chunk on all cores (`Index::import_chunks`).
        let entries = index.import_chunks(chunk_bytes, |c, slots| {
            let chunk = chunks.get(c)?;
            if slots.len() != chunk.slots {
                return None;
            }
            let bytes = read(chunk)?;
            let (mut entries, mut fits) = (0usize, true);
            let sound = decode_chunk(chunk, &bytes, |i, entry| {
                fits &= slots.set(i, entry);
                entries += usize::from(layout.decode_entry(entry).is_some());
            });
            (sound && fits).then_some(entries)
        })?;
        return Some((
            Saved {
                segments: records,
                form: Form::Loaded,
            },
            entries,
        ));
    }
    // Another geometry: the entries, decoded with the saved layout, go in one by one.
    let mut items: HashMap<u32, Vec<(u32, u8)>> = HashMap::new();
    for chunk in &chunks {
        let bytes = read(chunk)?;
        let sound = decode_chunk(chunk, &bytes, |_, entry| {
            if let Some((loc, frequency)) = layout.decode_entry(entry) {
                items
                    .entry(loc.segment)
                    .or_default()
                    .push((loc.offset, frequency));
            }
        });
        if !sound {
            return None;
        }
    }
    Some((
        Saved {
            segments: records,
            form: Form::Items(items),
        },
        0,
    ))
}

/// Versions 1 and 2: the per-segment write sequences, then one record per item.
fn take_v2(bytes: &[u8], shift: u8, segments: u32, bound: u64) -> Option<Saved> {
    let body_len = bytes.len().checked_sub(4)?;
    let (body, crc) = bytes.split_at(body_len);
    if u32_at(crc, 0)? != crc32fast::hash(body) || body.get(0..8)? != MAGIC {
        return None;
    }
    let version = u16::from_le_bytes(body.get(8..10)?.try_into().ok()?);
    if !(1..=2).contains(&version) || *body.get(10)? != shift || u32_at(body, 12)? != segments {
        return None;
    }
    if u64_at(body, 16)? != bound {
        return None;
    }
    let entries = usize::try_from(u64_at(body, 24)?).ok()?;
    let seq_end = FIXED_V2.checked_add((segments as usize).checked_mul(8)?)?;
    let record = entry_len(version);
    if body.len() != seq_end.checked_add(entries.checked_mul(record)?)? {
        return None;
    }
    let segments = (0..segments as usize)
        .map(|i| {
            Some(SegmentRecord {
                write_seq: u64_at(body, FIXED_V2 + 8 * i)?,
                dead_bytes: 0,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let mut items: HashMap<u32, Vec<(u32, u8)>> = HashMap::new();
    for i in 0..entries {
        let at = seq_end + record * i;
        let frequency = if record > 8 {
            (*body.get(at + 8)?).min(crate::index::MAX_FREQ)
        } else {
            0
        };
        items
            .entry(u32_at(body, at)?)
            .or_default()
            .push((u32_at(body, at + 4)?, frequency));
    }
    Some(Saved {
        segments,
        form: Form::Items(items),
    })
}

impl Cache {
    /// Clean shutdown: seals the open segments, writes the flash tier's buffers, saves
    /// every volatile (DRAM, NUMA) tier's
    /// sealed segments in a snapshot beside the first file tier (synced), and writes the
    /// saved index of the file tiers and snapshots (synced), so the next
    /// [`open`](Cache::open) puts the snapshots back and scans nothing: every item is a
    /// hit after the restart. A snapshot that cannot be written is
    /// [`CacheError::Snapshot`], returned after the saved index of the rest is written.
    /// Stop any movers first ([`Movers`](super::Movers) holds the cache). Without a file
    /// tier this is just a drop.
    pub fn shutdown(mut self) -> Result<(), CacheError> {
        self.seal_all();
        // A saved index does not name replicas: killed, so that none can come back.
        self.kill_all_replicas()?;
        // Every demoted item reaches flash, and the kill log the disk.
        self.flush_flash();
        if let Some(f) = &self.flash {
            f.sync()?;
        }
        let Some(dir) = self.first_file_dir.clone() else {
            return Ok(());
        };
        let bound = self.seq_bound.load(std::sync::atomic::Ordering::Acquire);
        let shift = self.shift;
        // A snapshot that cannot be written (a full file system: its space is not
        // reserved like a tier file's) loses that tier's items, not the saved index of the
        // others: its error is returned after the index is saved.
        let mut snapshotted = vec![false; self.tiers.len()];
        let mut snapshot_error = None;
        for (t, tier) in self.tiers.iter_mut().enumerate() {
            if tier.durable {
                continue;
            }
            match snapshot::save(&dir, t, &mut tier.area, shift, bound) {
                Ok(()) => snapshotted[t] = true,
                Err(source) => {
                    snapshot::remove_temp(&dir, t);
                    snapshot_error.get_or_insert(CacheError::Snapshot {
                        path: snapshot::snapshot_path(&dir, t),
                        source,
                    });
                }
            }
        }
        // Page-cache tiers reach the disk now, before the saved index says they may be
        // trusted after a restart of the system too (`crate::bootmark`).
        for t in self.tiers.iter().filter(|t| t.page_cache) {
            t.area.region().sync()?;
        }
        let segments = self.meta.len();
        let mut records = vec![SegmentRecord::default(); segments];
        for (t, _) in self
            .tiers
            .iter()
            .zip(&snapshotted)
            .filter(|&(t, &snapshotted)| t.durable || snapshotted)
        {
            for slot in 0..t.area.count() {
                let id = (t.base + slot) as usize;
                if t.area.state(slot) == crate::mem::SegState::Sealed {
                    let meta = &self.meta[id];
                    records[id] = SegmentRecord {
                        write_seq: meta.write_seq.load(std::sync::atomic::Ordering::Acquire),
                        dead_bytes: meta.dead_bytes.load(std::sync::atomic::Ordering::Acquire),
                    };
                }
            }
        }
        if let Some(f) = &self.flash {
            for slot in (0..f.count).filter(|&s| f.is_stored(s)) {
                let id = (f.base + slot) as usize;
                records[id] = SegmentRecord {
                    write_seq: self.meta[id]
                        .write_seq
                        .load(std::sync::atomic::Ordering::Acquire),
                    // A flash segment's record counts dead items (`cache/flash.rs`).
                    dead_bytes: f.occupancy(slot).1,
                };
            }
        }
        // Entries of segments not saved (a volatile tier whose snapshot failed) go: the
        // cache is being dropped, its index may be changed in place.
        let mut entries = 0u64;
        self.index.sweep(0..self.index.bucket_count(), |loc, _| {
            if records
                .get(loc.segment as usize)
                .is_some_and(|r| r.write_seq != 0)
            {
                entries += 1;
                Sweep::Keep
            } else {
                Sweep::Remove
            }
        });
        let layout = self.index.layout();
        let buckets = self.index.bucket_count() as u64;
        let seed = self.index.seed();
        let chunks = self.index.table_bytes().div_ceil(CHUNK_BYTES);
        let head_len = FIXED + SEGMENT_RECORD * segments + CHUNK_RECORD * chunks + 4;
        let path = saved_path(&dir);
        let saved_error = |source| CacheError::SavedIndex {
            path: path.clone(),
            source,
        };
        // The table first, after the head's place, then the head with the chunk records;
        // then one fsync. A crash before it completes leaves a file whose CRCs fail.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(saved_error)?;
        let mut chunk_records = Vec::with_capacity(chunks);
        let (mut dense, mut stored) = (Vec::with_capacity(CHUNK_BYTES), Vec::new());
        let mut at = head_len as u64;
        for c in 0..chunks {
            self.index.export_chunk(c, CHUNK_BYTES, &mut dense);
            let form = encode_chunk(&dense, &mut stored);
            file.write_all_at(&stored, at).map_err(saved_error)?;
            chunk_records.push((stored.len() as u32, crc32fast::hash(&stored), form));
            at += stored.len() as u64;
        }
        let mut head = Vec::with_capacity(head_len);
        head.extend_from_slice(&MAGIC);
        head.extend_from_slice(&VERSION.to_le_bytes());
        head.push(shift);
        head.push(0);
        head.extend_from_slice(&(segments as u32).to_le_bytes());
        head.extend_from_slice(&bound.to_le_bytes());
        head.extend_from_slice(&buckets.to_le_bytes());
        head.extend_from_slice(&[
            layout.tag_bits as u8,
            layout.segment_bits as u8,
            layout.offset_bits as u8,
            0,
        ]);
        head.extend_from_slice(&(CHUNK_BYTES as u32).to_le_bytes());
        head.extend_from_slice(&seed.to_le_bytes());
        head.extend_from_slice(&entries.to_le_bytes());
        for r in &records {
            head.extend_from_slice(&r.write_seq.to_le_bytes());
            head.extend_from_slice(&r.dead_bytes.to_le_bytes());
        }
        for (len, crc, form) in &chunk_records {
            head.extend_from_slice(&len.to_le_bytes());
            head.extend_from_slice(&crc.to_le_bytes());
            head.extend_from_slice(&[*form, 0, 0, 0]);
        }
        let crc = crc32fast::hash(&head);
        head.extend_from_slice(&crc.to_le_bytes());
        file.write_all_at(&head, 0).map_err(saved_error)?;
        file.sync_all().map_err(saved_error)?;
        snapshot_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::IndexConfig;

    /// A saved index as version `version` (1 or 2) writes it: two segments, one entry.
    fn file(version: u16, frequency: u8) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&[15, 0]);
        out.extend_from_slice(&2u32.to_le_bytes());
        out.extend_from_slice(&7u64.to_le_bytes());
        out.extend_from_slice(&1u64.to_le_bytes());
        out.extend_from_slice(&5u64.to_le_bytes());
        out.extend_from_slice(&0u64.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&64u32.to_le_bytes());
        if version >= 2 {
            out.push(frequency);
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    fn index() -> Index {
        Index::new(&IndexConfig::new(100, 2, 15)).unwrap()
    }

    #[test]
    fn chunks_round_trip_dense_and_sparse() {
        let entries = |occupied: &[(usize, u64)], slots: usize| {
            let mut dense = vec![0u8; slots * 8];
            for &(i, e) in occupied {
                dense[i * 8..i * 8 + 8].copy_from_slice(&e.to_le_bytes());
            }
            dense
        };
        let slots = 64;
        let few = [(3usize, 7u64), (40, u64::MAX)];
        let many: Vec<(usize, u64)> = (0..40).map(|i| (i, i as u64 + 1)).collect();
        for (occupied, expect_form) in [(&few[..], SPARSE), (&many[..], DENSE)] {
            let mut stored = Vec::new();
            let form = encode_chunk(&entries(occupied, slots), &mut stored);
            assert_eq!(form, expect_form);
            let chunk = Chunk {
                at: 0,
                len: stored.len(),
                crc: 0,
                form,
                slots,
            };
            let mut seen = Vec::new();
            assert!(decode_chunk(&chunk, &stored, |i, e| seen.push((i, e))));
            assert_eq!(seen, occupied);
        }
        // A sparse chunk naming a slot out of range or out of order does not decode.
        let record = |slot: u32, e: u64| {
            let mut r = slot.to_le_bytes().to_vec();
            r.extend_from_slice(&e.to_le_bytes());
            r
        };
        for bad in [record(64, 1), [record(5, 1), record(5, 2)].concat()] {
            let chunk = Chunk {
                at: 0,
                len: bad.len(),
                crc: 0,
                form: SPARSE,
                slots,
            };
            assert!(!decode_chunk(&chunk, &bad, |_, _| {}));
        }
    }

    #[test]
    fn older_versions_are_read_and_only_for_their_configuration() {
        let dir = tempfile::tempdir().unwrap();
        for (version, frequency, expect) in [(1u16, 9u8, 0u8), (2, 2, 2), (2, 9, 3)] {
            std::fs::write(saved_path(dir.path()), file(version, frequency)).unwrap();
            let (saved, loaded) = take(dir.path(), 15, 2, 7, &mut index()).expect("trusted");
            assert_eq!(loaded, 0);
            assert!(!saved.is_loaded());
            assert_eq!(
                saved.segment(0, 5),
                Some(SavedSegment::Items(&[(64, expect)][..]))
            );
            assert_eq!(saved.segment(0, 6), None, "another incarnation");
            assert_eq!(saved.segment(1, 0), None, "not saved");
            assert!(!saved_path(dir.path()).exists(), "used once");
        }
        for (shift, segments, bound) in [(16, 2, 7), (15, 3, 7), (15, 2, 8)] {
            std::fs::write(saved_path(dir.path()), file(2, 1)).unwrap();
            assert!(take(dir.path(), shift, segments, bound, &mut index()).is_none());
        }
        let mut torn = file(2, 1);
        torn[20] ^= 1;
        std::fs::write(saved_path(dir.path()), torn).unwrap();
        assert!(take(dir.path(), 15, 2, 7, &mut index()).is_none());
        let mut v9 = file(2, 1);
        v9[8] = 9;
        let body = v9.len() - 4;
        let crc = crc32fast::hash(&v9[..body]);
        v9[body..].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(saved_path(dir.path()), v9).unwrap();
        assert!(
            take(dir.path(), 15, 2, 7, &mut index()).is_none(),
            "a newer version"
        );
    }
}

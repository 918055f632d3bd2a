//! The saved index of a clean shutdown ([`Cache::shutdown`]): `terrace.index` beside the
//! first file tier, listing where every item of the file tiers and of the volatile tiers
//! saved in DRAM snapshots (`cache/snapshot.rs`) lives, so that the next
//! [`Cache::open`] reads only those items' headers and keys instead of scanning and
//! checksumming every segment.
//!
//! Format, little-endian: magic `"TRCIDX\0\0"`, version `u16` (2), `size_shift: u8`, one
//! zero byte, `segments: u32`, `seq_bound: u64`, `entries: u64`; then one `u64` write
//! sequence per segment id (0: not a saved segment, or not written); then `entries`
//! records `(segment: u32, offset: u32, frequency: u8)` — the frequency the item's index
//! entry had (0..=3), so that the restart keeps what the policy knew of it; version 1
//! had no frequency (read as 0); then the CRC-32 of everything before it.
//!
//! When it is trusted (invariants the restart relies on):
//! - its CRC matches (a save torn by a crash is ignored), and its `seq_bound` equals the
//!   bound the write-sequence mark holds now: every open reserves a new bound, so a saved
//!   index is used at most by the first open after the shutdown that wrote it, and never
//!   after any other open — whatever that open did to the tiers;
//! - per segment: only if the segment's header carries the write sequence recorded here
//!   (the same incarnation, so every saved offset is an item start in it); other segments
//!   are scanned in full. A saved item is indexed only if it decodes and is LIVE.
//!
//! At shutdown every LIVE item of a durable tier is indexed (E2), and every LIVE item of
//! a snapshot is (nothing runs between the sweep and the save), so the saved entries are
//! all of them. The file is removed at open whether or not it was used.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::{snapshot, Cache};
use crate::error::CacheError;
use crate::index::{Location, Sweep};
use crate::synced::write_synced;

const MAGIC: [u8; 8] = *b"TRCIDX\0\0";
const VERSION: u16 = 2;
/// Bytes of an entry record, by version.
const fn entry_len(version: u16) -> usize {
    if version >= 2 {
        9
    } else {
        8
    }
}
const FIXED: usize = 8 + 2 + 1 + 1 + 4 + 8 + 8;

/// The file's name in its directory.
pub fn saved_path(dir: &Path) -> PathBuf {
    dir.join("terrace.index")
}

/// A saved index that passed its checks.
#[derive(Debug, Default)]
pub(super) struct Saved {
    seqs: Vec<u64>,
    /// Per segment id: the saved items' offsets and index frequencies.
    offsets: HashMap<u32, Vec<(u32, u8)>>,
}

impl Saved {
    /// The saved item offsets of segment `id` if it is still the incarnation with write
    /// sequence `seq`.
    pub(super) fn offsets_for(&self, id: u32, seq: u64) -> Option<&[(u32, u8)]> {
        let saved_seq = *self.seqs.get(id as usize)?;
        (saved_seq != 0 && saved_seq == seq)
            .then(|| self.offsets.get(&id).map_or(&[][..], |v| v.as_slice()))
    }
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads and removes the saved index in `dir`; `None` unless it is present, intact and
/// written for this configuration (`shift`, `segments`) and mark `bound`.
pub(super) fn take(dir: &Path, shift: u8, segments: u32, bound: u64) -> Option<Saved> {
    let path = saved_path(dir);
    let bytes = std::fs::read(&path).ok()?;
    // Removed before use; if removal fails the bound check still keeps it from a second use.
    let _ = std::fs::remove_file(&path);
    let body_len = bytes.len().checked_sub(4)?;
    let (body, crc) = bytes.split_at(body_len);
    if u32_at(crc, 0)? != crc32fast::hash(body) || body.get(0..8)? != MAGIC {
        return None;
    }
    let version = u16::from_le_bytes(body.get(8..10)?.try_into().ok()?);
    if !(1..=VERSION).contains(&version) || *body.get(10)? != shift || u32_at(body, 12)? != segments
    {
        return None;
    }
    if u64_at(body, 16)? != bound {
        return None;
    }
    let entries = usize::try_from(u64_at(body, 24)?).ok()?;
    let seq_end = FIXED.checked_add((segments as usize).checked_mul(8)?)?;
    let record = entry_len(version);
    if body.len() != seq_end.checked_add(entries.checked_mul(record)?)? {
        return None;
    }
    let seqs = (0..segments as usize)
        .map(|i| u64_at(body, FIXED + 8 * i))
        .collect::<Option<Vec<u64>>>()?;
    let mut offsets: HashMap<u32, Vec<(u32, u8)>> = HashMap::new();
    for i in 0..entries {
        let at = seq_end + record * i;
        let frequency = if record > 8 {
            (*body.get(at + 8)?).min(crate::index::MAX_FREQ)
        } else {
            0
        };
        offsets
            .entry(u32_at(body, at)?)
            .or_default()
            .push((u32_at(body, at + 4)?, frequency));
    }
    Some(Saved { seqs, offsets })
}

impl Cache {
    /// Clean shutdown: seals the open segments, saves every volatile (DRAM, NUMA) tier's
    /// sealed segments in a snapshot beside the first file tier (synced), and writes the
    /// saved index of the file tiers and snapshots (synced), so the next
    /// [`open`](Cache::open) puts the snapshots back and scans nothing: every item is a
    /// hit after the restart. A snapshot that cannot be written is
    /// [`CacheError::Snapshot`], returned after the saved index of the rest is written.
    /// Stop any movers first ([`Movers`](super::Movers) holds the cache). Without a file
    /// tier this is just a drop.
    pub fn shutdown(mut self) -> Result<(), CacheError> {
        self.seal_all();
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
        let mut seqs = vec![0u64; segments];
        for (t, _) in self
            .tiers
            .iter()
            .zip(&snapshotted)
            .filter(|&(t, &snapshotted)| t.durable || snapshotted)
        {
            for slot in 0..t.area.count() {
                let id = t.base + slot;
                if t.area.state(slot) == crate::mem::SegState::Sealed {
                    seqs[id as usize] = self.meta[id as usize]
                        .write_seq
                        .load(std::sync::atomic::Ordering::Acquire);
                }
            }
        }
        let mut entries: Vec<(Location, u8)> = Vec::new();
        self.index
            .sweep(0..self.index.bucket_count(), |loc, frequency| {
                if seqs.get(loc.segment as usize).is_some_and(|&s| s != 0) {
                    entries.push((loc, frequency));
                }
                Sweep::Keep
            });
        let record = entry_len(VERSION);
        let mut out = Vec::with_capacity(FIXED + 8 * segments + record * entries.len() + 4);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.push(self.shift);
        out.push(0);
        out.extend_from_slice(&(segments as u32).to_le_bytes());
        out.extend_from_slice(&bound.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
        for s in &seqs {
            out.extend_from_slice(&s.to_le_bytes());
        }
        for (loc, frequency) in &entries {
            out.extend_from_slice(&loc.segment.to_le_bytes());
            out.extend_from_slice(&loc.offset.to_le_bytes());
            out.push(*frequency);
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        let path = saved_path(&dir);
        write_synced(&path, &out).map_err(|source| CacheError::SavedIndex { path, source })?;
        snapshot_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A saved index as version `version` writes it: two segments, one entry.
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

    #[test]
    fn both_versions_are_read_and_only_for_their_configuration() {
        let dir = tempfile::tempdir().unwrap();
        for (version, frequency, expect) in [(1u16, 9u8, 0u8), (2, 2, 2), (2, 9, 3)] {
            std::fs::write(saved_path(dir.path()), file(version, frequency)).unwrap();
            let saved = take(dir.path(), 15, 2, 7).expect("trusted");
            assert_eq!(saved.offsets_for(0, 5), Some(&[(64, expect)][..]));
            assert_eq!(saved.offsets_for(0, 6), None, "another incarnation");
            assert_eq!(saved.offsets_for(1, 0), None, "not saved");
            assert!(!saved_path(dir.path()).exists(), "used once");
        }
        for (shift, segments, bound) in [(16, 2, 7), (15, 3, 7), (15, 2, 8)] {
            std::fs::write(saved_path(dir.path()), file(2, 1)).unwrap();
            assert!(take(dir.path(), shift, segments, bound).is_none());
        }
        let mut torn = file(2, 1);
        torn[20] ^= 1;
        std::fs::write(saved_path(dir.path()), torn).unwrap();
        assert!(take(dir.path(), 15, 2, 7).is_none());
        let mut v3 = file(2, 1);
        v3[8] = 3;
        let body = v3.len() - 4;
        let crc = crc32fast::hash(&v3[..body]);
        v3[body..].copy_from_slice(&crc.to_le_bytes());
        std::fs::write(saved_path(dir.path()), v3).unwrap();
        assert!(take(dir.path(), 15, 2, 7).is_none(), "a newer version");
    }
}

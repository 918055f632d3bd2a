//! DRAM snapshots of a clean shutdown: `dram<i>.snapshot` beside the saved index, the
//! sealed segments of volatile tier `i` (DRAM or NUMA memory) as they were, so that the
//! next [`Cache::open`] puts them back and restores their items from the saved index
//! like a file tier's — every item of the cache is a hit after a clean restart, not only
//! those the file tiers had room for.
//!
//! Format (version 2), little-endian: magic `"TRCDRAM\0"`, version `u16`, `tier: u8`,
//! `size_shift: u8`, `slots: u32` (the tier's segment count), `seq_bound: u64`,
//! `segments: u32`; then `segments` records `(slot: u32, crc: u32)` (the CRC-32 of that
//! segment's bytes); then the CRC-32 of this head. Then the segments' bytes, whole, in
//! record order. Each segment is written and read on its own (all cores share the work)
//! and checked by its own CRC.
//!
//! When it is trusted (the saved index's rules, `cache/saved.rs`):
//! - only together with a saved index that is trusted, and only if its `seq_bound` is
//!   that index's — both were written by the same clean shutdown, and are used by the
//!   first open after it at most;
//! - its CRC matches and it was written for this tier, segment size and slot count;
//! - it is removed at open whether or not it was used, before the cache serves: after a
//!   crash of the restarted cache its tier holds newer items, and the old image must never
//!   come back. A segment it restores is trusted per segment as a file tier's is (header,
//!   slot, and the write sequence the saved index recorded).
//!
//! Written to a temporary name, synced, then renamed: a crash during the save leaves no
//! snapshot (or a torn temporary, ignored and removed at the next open).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::mem::{SegState, SegmentArea};
use crate::parallel;

const MAGIC: [u8; 8] = *b"TRCDRAM\0";
const VERSION: u16 = 2;
const FIXED: usize = 8 + 2 + 1 + 1 + 4 + 8 + 4;
const RECORD: usize = 8;

/// The snapshot file of volatile tier `tier` in `dir`.
pub fn snapshot_path(dir: &Path, tier: usize) -> PathBuf {
    dir.join(format!("dram{tier}.snapshot"))
}

fn temp_path(dir: &Path, tier: usize) -> PathBuf {
    dir.join(format!("dram{tier}.snapshot.tmp"))
}

/// Writes the sealed segments of `area` (volatile tier `tier`) to its snapshot, synced;
/// `seq_bound` ties it to the saved index written with it.
pub(super) fn save(
    dir: &Path,
    tier: usize,
    area: &mut SegmentArea,
    shift: u8,
    seq_bound: u64,
) -> std::io::Result<()> {
    let sealed: Vec<bool> = (0..area.count())
        .map(|slot| area.state(slot) == SegState::Sealed)
        .collect();
    let slots = area.count();
    let segments: Vec<(u32, &mut [u8])> = area
        .all_exclusive()
        .into_iter()
        .enumerate()
        .filter(|&(slot, _)| sealed[slot])
        .map(|(slot, bytes)| (slot as u32, bytes))
        .collect();
    let head_len = FIXED + RECORD * segments.len() + 4;
    let tmp = temp_path(dir, tier);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    let mut head = Vec::with_capacity(head_len);
    head.extend_from_slice(&MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    head.extend_from_slice(&[tier as u8, shift]);
    head.extend_from_slice(&slots.to_le_bytes());
    head.extend_from_slice(&seq_bound.to_le_bytes());
    head.extend_from_slice(&(segments.len() as u32).to_le_bytes());
    // The segments' CRCs on all cores; then the segments, one after another from this
    // thread (parallel writes into one file contend on it), the head with the CRCs, one
    // fsync and the rename.
    let crcs = parallel::map_parts(segments.iter().enumerate().collect(), |part| {
        part.into_iter()
            .map(|(i, (slot, bytes))| (i, *slot, crc32fast::hash(bytes)))
            .collect::<Vec<_>>()
    });
    let mut records: Vec<(usize, u32, u32)> = crcs.into_iter().flatten().collect();
    let size = 1usize << shift;
    for (i, (_, bytes)) in segments.iter().enumerate() {
        file.write_all_at(bytes, (head_len + i * size) as u64)?;
    }
    records.sort_unstable_by_key(|&(i, _, _)| i);
    for (_, slot, crc) in records {
        head.extend_from_slice(&slot.to_le_bytes());
        head.extend_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32fast::hash(&head);
    head.extend_from_slice(&crc.to_le_bytes());
    file.write_all_at(&head, 0)?;
    file.sync_all()?;
    std::fs::rename(&tmp, snapshot_path(dir, tier))?;
    File::open(dir)?.sync_all()?;
    Ok(())
}

/// Removes every snapshot file in `dir` (what `restore` has not consumed: a tier that is
/// durable now, or no longer there, or a torn temporary).
pub(super) fn remove_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("dram")
            && (name.ends_with(".snapshot") || name.ends_with(".snapshot.tmp"))
        {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// Removes a snapshot's temporary file after a failed save.
pub(super) fn remove_temp(dir: &Path, tier: usize) {
    let _ = std::fs::remove_file(temp_path(dir, tier));
}

/// Puts the snapshot of volatile tier `tier` back into `area` (fresh, zeroed memory) if
/// it is present, intact and written for this configuration and `seq_bound`; removes it
/// either way (a torn temporary goes with [`remove_leftovers`]). Returns whether it
/// restored any segment; on any mismatch, none, with what was copied given back or its
/// headers zeroed.
pub(super) fn restore(
    dir: &Path,
    tier: usize,
    area: &mut SegmentArea,
    shift: u8,
    seq_bound: Option<u64>,
) -> bool {
    let path = snapshot_path(dir, tier);
    let file = File::open(&path);
    // Removed before use (the open file stays readable): never used twice.
    let _ = std::fs::remove_file(&path);
    let (Ok(file), Some(bound)) = (file, seq_bound) else {
        return false;
    };
    let mut restored = Vec::new();
    if read_into(file, tier, area, shift, bound, &mut restored).is_none() {
        // Undo: the pages go back to the system (reading as zero), or where that cannot
        // be done (segments smaller than a page) the headers are zeroed, so no segment
        // of a refused image is ever read.
        for &slot in &restored {
            let released = area
                .region()
                .release((slot as usize) << shift, 1 << shift)
                .unwrap_or(false);
            if !released {
                area.clear_header(slot);
            }
        }
        return false;
    }
    !restored.is_empty()
}

/// Reads a snapshot into `area`, pushing each slot it may have written to `restored`;
/// `None` at the first mismatch (the caller undoes what was written).
fn read_into(
    mut file: File,
    tier: usize,
    area: &mut SegmentArea,
    shift: u8,
    bound: u64,
    restored: &mut Vec<u32>,
) -> Option<()> {
    let mut fixed = [0u8; FIXED];
    file.read_exact(&mut fixed).ok()?;
    let u32_at =
        |b: &[u8], at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let version = u16::from_le_bytes([fixed[8], fixed[9]]);
    let stored_bound = u64::from_le_bytes(fixed[16..24].try_into().ok()?);
    if fixed[0..8] != MAGIC
        || version != VERSION
        || usize::from(fixed[10]) != tier
        || fixed[11] != shift
        || u32_at(&fixed, 12)? != area.count()
        || stored_bound != bound
    {
        return None;
    }
    let segments = u32_at(&fixed, 24)? as usize;
    if segments > area.count() as usize {
        return None;
    }
    let head_len = FIXED + RECORD * segments + 4;
    let size = 1usize << shift;
    let file_len = file.metadata().ok()?.len();
    if file_len != (head_len as u64).checked_add((segments as u64).checked_mul(size as u64)?)? {
        return None;
    }
    let mut head = fixed.to_vec();
    head.resize(head_len, 0);
    file.read_exact(&mut head[FIXED..]).ok()?;
    let body = head_len - 4;
    if u32_at(&head, body)? != crc32fast::hash(&head[..body]) {
        return None;
    }
    let mut slices: Vec<Option<&mut [u8]>> = area.all_exclusive().into_iter().map(Some).collect();
    let mut work = Vec::with_capacity(segments);
    for i in 0..segments {
        let slot = u32_at(&head, FIXED + RECORD * i)?;
        let crc = u32_at(&head, FIXED + RECORD * i + 4)?;
        // A slot named twice (or out of range) refuses the file.
        let bytes = slices.get_mut(slot as usize)?.take()?;
        restored.push(slot);
        work.push(((head_len + i * size) as u64, crc, bytes));
    }
    let file = &file;
    let intact = parallel::map_parts(work, |part| {
        part.into_iter().all(|(at, crc, bytes)| {
            file.read_exact_at(bytes, at).is_ok() && crc32fast::hash(bytes) == crc
        })
    });
    intact.into_iter().all(|ok| ok).then_some(())
}

//! DRAM snapshots of a clean shutdown: `dram<i>.snapshot` beside the saved index, the
//! sealed segments of volatile tier `i` (DRAM or NUMA memory) as they were, so that the
//! next [`Cache::open`] puts them back and restores their items from the saved index
//! like a file tier's — every item of the cache is a hit after a clean restart, not only
//! those the file tiers had room for.
//!
//! Format (version 3), little-endian. The file mirrors the tier: segment `slot` at
//! offset `slot << size_shift` (slots not saved are holes), so that a DRAM tier can map
//! it in place. Then, at `head_at` = the tier's bytes rounded up to 2 MiB, the head:
//! magic `"TRCDRAM\0"`, version `u16`, `tier: u8`, `size_shift: u8`, `slots: u32` (the
//! tier's segment count), `seq_bound: u64`, `segments: u32`; then `segments` records
//! `(slot: u32, crc: u32)` (the CRC-32 of that segment's bytes); then the CRC-32 of the
//! head. The file ends there.
//!
//! Restoring a DRAM tier maps the file privately over the tier's memory
//! (`SegmentArea::map_image`): nothing is copied, the segments' CRCs are checked in
//! place on all cores, and a segment's image pages go back to the system when it is
//! first rewritten. A NUMA tier, whose pages must stay on its node, reads its segments
//! into its memory instead, on all cores.
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
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::mem::{SegState, SegmentArea};
use crate::parallel;

const MAGIC: [u8; 8] = *b"TRCDRAM\0";
const VERSION: u16 = 3;
const FIXED: usize = 8 + 2 + 1 + 1 + 4 + 8 + 4;
const RECORD: usize = 8;
/// The head starts at the tier's bytes rounded up to this (a multiple of any page size).
const HEAD_ALIGN: u64 = 2 << 20;

/// The snapshot file of volatile tier `tier` in `dir`.
pub fn snapshot_path(dir: &Path, tier: usize) -> PathBuf {
    dir.join(format!("dram{tier}.snapshot"))
}

fn temp_path(dir: &Path, tier: usize) -> PathBuf {
    dir.join(format!("dram{tier}.snapshot.tmp"))
}

/// Where the head of a snapshot of `slots` segments of `1 << shift` bytes starts.
fn head_at(slots: u32, shift: u8) -> u64 {
    (u64::from(slots) << shift).next_multiple_of(HEAD_ALIGN)
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
    let tmp = temp_path(dir, tier);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    // The segments' CRCs on all cores; then the segments at their places from this
    // thread (parallel writes into one file contend on it), the head, one fsync and the
    // rename.
    let crcs = parallel::map_parts(segments.iter().collect(), |part| {
        part.into_iter()
            .map(|(slot, bytes)| (*slot, crc32fast::hash(bytes)))
            .collect::<Vec<_>>()
    });
    let mut records: Vec<(u32, u32)> = crcs.into_iter().flatten().collect();
    records.sort_unstable();
    for (slot, bytes) in &segments {
        file.write_all_at(bytes, u64::from(*slot) << shift)?;
    }
    let mut head = Vec::with_capacity(FIXED + RECORD * records.len() + 4);
    head.extend_from_slice(&MAGIC);
    head.extend_from_slice(&VERSION.to_le_bytes());
    head.extend_from_slice(&[tier as u8, shift]);
    head.extend_from_slice(&slots.to_le_bytes());
    head.extend_from_slice(&seq_bound.to_le_bytes());
    head.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for (slot, crc) in records {
        head.extend_from_slice(&slot.to_le_bytes());
        head.extend_from_slice(&crc.to_le_bytes());
    }
    let crc = crc32fast::hash(&head);
    head.extend_from_slice(&crc.to_le_bytes());
    file.write_all_at(&head, head_at(slots, shift))?;
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
/// restored any segment; on any mismatch, none, with the area zeroed again.
pub(super) fn restore(
    dir: &Path,
    tier: usize,
    area: &mut SegmentArea,
    shift: u8,
    seq_bound: Option<u64>,
) -> bool {
    let path = snapshot_path(dir, tier);
    // Read-write: a mapped image gives its pages back by punching them out of the file.
    let file = OpenOptions::new().read(true).write(true).open(&path);
    // Removed before use (the open file stays readable): never used twice.
    let _ = std::fs::remove_file(&path);
    let (Ok(file), Some(bound)) = (file, seq_bound) else {
        return false;
    };
    let Some(records) = read_head(&file, tier, area.count(), shift, bound) else {
        return false;
    };
    if records.is_empty() {
        return false;
    }
    let slots: Vec<u32> = records.iter().map(|&(slot, _)| slot).collect();
    // In place where the tier is DRAM and its segments are whole pages; read in otherwise
    // (and where the mapping cannot be made).
    let in_place = area.region().medium() == terrace_media::MediumKind::Dram
        && (1usize << shift).is_multiple_of(terrace_media::os::page_size());
    let mapped = in_place
        && file
            .try_clone()
            .is_ok_and(|image| area.map_image(image, &slots).is_ok());
    if mapped {
        if check_segments(area, shift, &records, None) {
            return true;
        }
        // Refused: the tier is fresh zeroed memory again; if even that fails, no header
        // of the image may be read.
        if area.drop_image().is_err() {
            for &slot in &slots {
                area.clear_header(slot);
            }
        }
        return false;
    }
    if check_segments(area, shift, &records, Some(&file)) {
        return true;
    }
    // Undo: the pages go back to the system (reading as zero), or where that cannot be
    // done (segments smaller than a page) the headers are zeroed, so no segment of a
    // refused image is ever read.
    for &slot in &slots {
        let released = area
            .region()
            .release((slot as usize) << shift, 1 << shift)
            .unwrap_or(false);
        if !released {
            area.clear_header(slot);
        }
    }
    false
}

/// The head of a snapshot, checked against this tier (`tier`, `slots` segments of
/// `1 << shift` bytes) and `bound`: its `(slot, crc)` records, each slot once and in
/// range; `None` if anything does not match.
fn read_head(
    file: &File,
    tier: usize,
    slots: u32,
    shift: u8,
    bound: u64,
) -> Option<Vec<(u32, u32)>> {
    let at = head_at(slots, shift);
    let mut fixed = [0u8; FIXED];
    file.read_exact_at(&mut fixed, at).ok()?;
    let u32_at =
        |b: &[u8], at: usize| Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?));
    let version = u16::from_le_bytes([fixed[8], fixed[9]]);
    let stored_bound = u64::from_le_bytes(fixed[16..24].try_into().ok()?);
    if fixed[0..8] != MAGIC
        || version != VERSION
        || usize::from(fixed[10]) != tier
        || fixed[11] != shift
        || u32_at(&fixed, 12)? != slots
        || stored_bound != bound
    {
        return None;
    }
    let segments = u32_at(&fixed, 24)? as usize;
    if segments > slots as usize {
        return None;
    }
    let head_len = FIXED + RECORD * segments + 4;
    if file.metadata().ok()?.len() != at.checked_add(head_len as u64)? {
        return None;
    }
    let mut head = fixed.to_vec();
    head.resize(head_len, 0);
    file.read_exact_at(&mut head[FIXED..], at + FIXED as u64)
        .ok()?;
    let body = head_len - 4;
    if u32_at(&head, body)? != crc32fast::hash(&head[..body]) {
        return None;
    }
    let mut seen = vec![false; slots as usize];
    (0..segments)
        .map(|i| {
            let slot = u32_at(&head, FIXED + RECORD * i)?;
            let crc = u32_at(&head, FIXED + RECORD * i + 4)?;
            // A slot named twice (or out of range) refuses the file.
            (!std::mem::replace(seen.get_mut(slot as usize)?, true)).then_some((slot, crc))
        })
        .collect()
}

/// Whether every recorded segment of `area` matches its CRC, checked on many threads
/// (they mostly wait on page faults): in place for a mapped image (`read_from` `None`),
/// or after reading each from `read_from` at `slot << shift`.
fn check_segments(
    area: &mut SegmentArea,
    shift: u8,
    records: &[(u32, u32)],
    read_from: Option<&File>,
) -> bool {
    let mut slices: Vec<Option<&mut [u8]>> = area.all_exclusive().into_iter().map(Some).collect();
    let work: Option<Vec<(u32, u32, &mut [u8])>> = records
        .iter()
        .map(|&(slot, crc)| Some((slot, crc, slices.get_mut(slot as usize)?.take()?)))
        .collect();
    let Some(work) = work else {
        return false;
    };
    parallel::map_parts_on(parallel::fault_workers(), work, |part| {
        part.into_iter().all(|(slot, crc, bytes)| {
            read_from.is_none_or(|file| file.read_exact_at(bytes, u64::from(slot) << shift).is_ok())
                && crc32fast::hash(bytes) == crc
        })
    })
    .into_iter()
    .all(|ok| ok)
}

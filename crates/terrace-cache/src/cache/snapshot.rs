//! DRAM snapshots of a clean shutdown: `dram<i>.snapshot` beside the saved index, the
//! sealed segments of volatile tier `i` (DRAM or NUMA memory) as they were, so that the
//! next [`Cache::open`] puts them back and restores their items from the saved index
//! like a file tier's — every item of the cache is a hit after a clean restart, not only
//! those the file tiers had room for.
//!
//! Format, little-endian: magic `"TRCDRAM\0"`, version `u16` (1), `tier: u8`,
//! `size_shift: u8`, `slots: u32` (the tier's segment count), `seq_bound: u64`,
//! `segments: u32`; then `segments` records `(slot: u32, the segment's bytes)`; then the
//! CRC-32 of everything before it.
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
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use crate::mem::{SegState, SegmentArea};

const MAGIC: [u8; 8] = *b"TRCDRAM\0";
const VERSION: u16 = 1;
const FIXED: usize = 8 + 2 + 1 + 1 + 4 + 8 + 4;

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
    let sealed: Vec<u32> = (0..area.count())
        .filter(|&slot| area.state(slot) == SegState::Sealed)
        .collect();
    let tmp = temp_path(dir, tier);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    let mut out = HashingWriter {
        inner: BufWriter::with_capacity(1 << 20, file),
        crc: crc32fast::Hasher::new(),
    };
    out.write_all(&MAGIC)?;
    out.write_all(&VERSION.to_le_bytes())?;
    out.write_all(&[tier as u8, shift])?;
    out.write_all(&area.count().to_le_bytes())?;
    out.write_all(&seq_bound.to_le_bytes())?;
    out.write_all(&(sealed.len() as u32).to_le_bytes())?;
    for &slot in &sealed {
        out.write_all(&slot.to_le_bytes())?;
        if let Some(bytes) = area.exclusive(slot) {
            out.write_all(bytes)?;
        }
    }
    let crc = out.crc.clone().finalize();
    let mut inner = out.inner;
    inner.write_all(&crc.to_le_bytes())?;
    let file = inner.into_inner().map_err(|e| e.into_error())?;
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

/// Reads a snapshot into `area`, pushing each slot written to `restored`; `None` at the
/// first mismatch (the caller undoes what was written).
fn read_into(
    file: File,
    tier: usize,
    area: &mut SegmentArea,
    shift: u8,
    bound: u64,
    restored: &mut Vec<u32>,
) -> Option<()> {
    let mut input = HashingReader {
        inner: BufReader::with_capacity(1 << 20, file),
        crc: crc32fast::Hasher::new(),
    };
    let mut fixed = [0u8; FIXED];
    input.read_exact(&mut fixed).ok()?;
    let u32_at =
        |at: usize| u32::from_le_bytes([fixed[at], fixed[at + 1], fixed[at + 2], fixed[at + 3]]);
    let version = u16::from_le_bytes([fixed[8], fixed[9]]);
    let stored_bound = u64::from_le_bytes(fixed[16..24].try_into().ok()?);
    if fixed[0..8] != MAGIC
        || version != VERSION
        || usize::from(fixed[10]) != tier
        || fixed[11] != shift
        || u32_at(12) != area.count()
        || stored_bound != bound
    {
        return None;
    }
    let segments = u32_at(24);
    if segments > area.count() {
        return None;
    }
    let mut seen = vec![false; area.count() as usize];
    for _ in 0..segments {
        let mut slot = [0u8; 4];
        input.read_exact(&mut slot).ok()?;
        let slot = u32::from_le_bytes(slot);
        if std::mem::replace(seen.get_mut(slot as usize)?, true) {
            return None;
        }
        let bytes = area.exclusive(slot)?;
        restored.push(slot);
        input.read_exact(bytes).ok()?;
    }
    let computed = input.crc.clone().finalize();
    let mut stored = [0u8; 4];
    input.inner.read_exact(&mut stored).ok()?;
    let mut rest = [0u8; 1];
    if input.inner.read(&mut rest).ok()? != 0 {
        return None;
    }
    (u32::from_le_bytes(stored) == computed).then_some(())
}

/// A writer that checksums what passes through it.
struct HashingWriter<W: Write> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that checksums what passes through it.
struct HashingReader<R: Read> {
    inner: R,
    crc: crc32fast::Hasher,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
}

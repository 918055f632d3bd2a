//! Per-lane logs: the redo log that makes a group of word updates atomic (allocation,
//! free, publish, transaction commit), and the undo log that holds a transaction's
//! snapshots. Formats and the argument for their crash safety are in
//! `docs/pool-format.md` ("Lanes", "Commit protocol"); this module owns their encoding,
//! writing, replay and rollback.
//!
//! Invariants:
//! - a redo header is either 0 (empty) or `count | crc << 32` over exactly the `count`
//!   entries after it; entries are applied only after the header and entries are durable,
//!   and the header is zeroed (durably) before the lane is used again;
//! - every redo operation is idempotent (set a word, OR a mask, AND-NOT a mask), so
//!   replaying a log any number of times gives the same words;
//! - an undo state word is `gen << 1 | active`; while active, the entries carrying `gen`
//!   in their checksum, from the first up to the first that does not verify, are exactly
//!   the snapshots taken so far, each made durable before its range was first written.

use crate::backend::Backend;
use crate::error::{corrupt, PoolError, Result};
use crate::format::{Geometry, REDO_CAPACITY, REDO_ENTRY, STATE_OFF, UNDO_OFF, UNDO_SIZE};

/// What a redo entry does to its word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RedoOp {
    Set = 0,
    Or = 1,
    AndNot = 2,
}

/// One redo entry: `op` applied to the word at `off` with `value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RedoEntry {
    pub off: u64,
    pub op: RedoOp,
    pub value: u64,
}

/// The redo entries of one operation. An allocation, free or commit usually logs a handful
/// of words: kept on the stack up to 16, so the hot path does not allocate.
pub(crate) type Entries = smallvec::SmallVec<[RedoEntry; 16]>;

impl RedoEntry {
    pub fn set(off: u64, value: u64) -> RedoEntry {
        RedoEntry {
            off,
            op: RedoOp::Set,
            value,
        }
    }
    pub fn or(off: u64, value: u64) -> RedoEntry {
        RedoEntry {
            off,
            op: RedoOp::Or,
            value,
        }
    }
    pub fn and_not(off: u64, value: u64) -> RedoEntry {
        RedoEntry {
            off,
            op: RedoOp::AndNot,
            value,
        }
    }
}

/// Encodes `entries` into `out` (tests build logs by hand with it).
#[cfg(test)]
fn encode(entries: &[RedoEntry], out: &mut smallvec::SmallVec<[u8; 256]>) {
    out.reserve(entries.len() * REDO_ENTRY as usize);
    for e in entries {
        out.extend_from_slice(&(e.off | e.op as u64).to_le_bytes());
        out.extend_from_slice(&e.value.to_le_bytes());
    }
}

fn header_for(count: u32, bytes: &[u8]) -> u64 {
    let mut h = crc32fast::Hasher::new();
    h.update(&count.to_le_bytes());
    h.update(bytes);
    count as u64 | (h.finalize() as u64) << 32
}

/// Combines entries on the same word: ORs into one OR, AND-NOTs into one AND-NOT, and
/// for a repeated `Set` the last value wins (at the place of the first). The allocator
/// never mixes operations kinds on one word (descriptor words are set, bitmap words are
/// ORed and AND-NOTed on disjoint bits), so the result equals applying all in order.
fn merge(entries: &[RedoEntry], out: &mut Entries) {
    // Most logs hold a handful of entries: a linear scan beats building a map for them.
    let mut at: Option<rustc_hash::FxHashMap<(u64, u8), usize>> =
        (entries.len() > 32).then(rustc_hash::FxHashMap::default);
    for e in entries {
        let key = (e.off, e.op as u8);
        let found = match &at {
            Some(map) => map.get(&key).copied(),
            None => out.iter().position(|o| (o.off, o.op as u8) == key),
        };
        match found {
            Some(i) => match e.op {
                RedoOp::Set => out[i].value = e.value,
                RedoOp::Or | RedoOp::AndNot => out[i].value |= e.value,
            },
            None => {
                if let Some(map) = at.as_mut() {
                    map.insert(key, out.len());
                }
                out.push(*e);
            }
        }
    }
}

/// Applies entries and persists the lines they touched.
fn apply<B: Backend>(b: &B, entries: &[RedoEntry]) -> Result<()> {
    let mut lines: smallvec::SmallVec<[u64; 16]> = smallvec::SmallVec::with_capacity(entries.len());
    for e in entries {
        match e.op {
            RedoOp::Set => b.store_u64(e.off, e.value)?,
            RedoOp::Or => {
                b.fetch_or_u64(e.off, e.value)?;
            }
            RedoOp::AndNot => {
                b.fetch_and_u64(e.off, !e.value)?;
            }
        }
        lines.push(e.off / 64);
    }
    lines.sort_unstable();
    lines.dedup();
    let mut i = 0;
    while i < lines.len() {
        let mut j = i + 1;
        while j < lines.len() && lines[j] == lines[j - 1] + 1 {
            j += 1;
        }
        b.persist(lines[i] * 64, (j - i) as u64 * 64)?;
        i = j;
    }
    Ok(())
}

/// Commits one word update without a log: an aligned 8-byte store (or `or`, `and-not`)
/// is failure-atomic, so the persist that makes it durable is the commit point.
#[inline(always)]
pub(crate) fn apply_one<B: Backend>(b: &B, e: &RedoEntry) -> Result<()> {
    match e.op {
        RedoOp::Set => b.store_u64(e.off, e.value)?,
        RedoOp::Or => {
            b.fetch_or_u64(e.off, e.value)?;
        }
        RedoOp::AndNot => {
            b.fetch_and_u64(e.off, !e.value)?;
        }
    }
    b.persist(e.off, 8)
}

/// Redo records of up to this many entries are built on the stack.
const STACK_ENTRIES: usize = 16;

/// Makes `entries` happen atomically: log, persist (the commit point), apply, persist,
/// clear the log, persist. A single word update (after merging) is committed by
/// [`apply_one`] and leaves the lane untouched.
pub(crate) fn redo_commit<B: Backend>(b: &B, lane_off: u64, entries: &[RedoEntry]) -> Result<()> {
    if let [e] = entries {
        return apply_one(b, e);
    }
    let mut merged = Entries::new();
    merge(entries, &mut merged);
    let entries = &merged[..];
    match entries {
        [] => return Ok(()),
        [e] => return apply_one(b, e),
        _ => {}
    }
    if entries.len() as u64 > REDO_CAPACITY {
        return Err(PoolError::TxLogFull {
            what: "redo log",
            needed: entries.len() as u64 * REDO_ENTRY,
            free: REDO_CAPACITY * REDO_ENTRY,
        });
    }
    // The checksummed record is `count (4 bytes LE) ++ entries`: laid out contiguously on
    // the stack for the usual handful of entries, so one CRC pass covers it (the same
    // value `header_for` computes) and nothing is allocated.
    let n = entries.len();
    let mut stack = [0u8; 4 + STACK_ENTRIES * REDO_ENTRY as usize];
    let mut spilled = Vec::new();
    let record: &mut [u8] = if n <= STACK_ENTRIES {
        &mut stack[..4 + n * REDO_ENTRY as usize]
    } else {
        spilled.resize(4 + n * REDO_ENTRY as usize, 0);
        &mut spilled
    };
    record[..4].copy_from_slice(&(n as u32).to_le_bytes());
    for (slot, e) in record[4..]
        .chunks_exact_mut(REDO_ENTRY as usize)
        .zip(entries)
    {
        slot[..8].copy_from_slice(&(e.off | e.op as u64).to_le_bytes());
        slot[8..].copy_from_slice(&e.value.to_le_bytes());
    }
    let header = n as u64 | (crc32fast::hash(record) as u64) << 32;
    let bytes = &record[4..];
    b.write(lane_off + 64, bytes)?;
    b.store_u64(lane_off, header)?;
    b.persist(lane_off, 64 + bytes.len() as u64)?;
    apply(b, entries)?;
    b.store_u64(lane_off, 0)?;
    b.persist(lane_off, 8)
}

/// Replays a complete redo log found at open and clears it; a torn log (checksum
/// mismatch) never reached its commit point and is only cleared. Returns whether a log
/// was replayed.
pub(crate) fn redo_recover<B: Backend>(b: &B, lane_off: u64, geo: &Geometry) -> Result<bool> {
    let header = b.load_u64(lane_off)?;
    if header == 0 {
        return Ok(false);
    }
    let count = header as u32;
    let mut valid = false;
    let mut entries = Vec::new();
    if count as u64 <= REDO_CAPACITY && count > 0 {
        let mut bytes = vec![0u8; count as usize * REDO_ENTRY as usize];
        b.read(lane_off + 64, &mut bytes)?;
        if header_for(count, &bytes) == header {
            valid = true;
            for (i, chunk) in bytes.chunks_exact(16).enumerate() {
                let mut w = [0u8; 8];
                w.copy_from_slice(&chunk[..8]);
                let a = u64::from_le_bytes(w);
                w.copy_from_slice(&chunk[8..]);
                let value = u64::from_le_bytes(w);
                let off = a & !7;
                let op = match a & 7 {
                    0 => RedoOp::Set,
                    1 => RedoOp::Or,
                    2 => RedoOp::AndNot,
                    _ => {
                        return Err(corrupt(
                            format!("redo entry {i} has unknown operation {}", a & 7),
                            lane_off + 64 + i as u64 * 16,
                        ))
                    }
                };
                if off < STATE_OFF || off + 8 > geo.pool_size {
                    return Err(corrupt(
                        format!("redo entry {i} targets {off:#x}, outside the pool's mutable area"),
                        lane_off + 64 + i as u64 * 16,
                    ));
                }
                entries.push(RedoEntry { off, op, value });
            }
        }
    }
    if valid {
        apply(b, &entries)?;
    }
    b.store_u64(lane_off, 0)?;
    b.persist(lane_off, 8)?;
    Ok(valid)
}

/// Offset of a lane's undo state word.
pub(crate) fn undo_state_off(lane_off: u64) -> u64 {
    lane_off + UNDO_OFF
}

/// First undo entry offset relative to the undo area.
pub(crate) const UNDO_FIRST: u64 = 64;

fn undo_crc(gen: u64, off: u64, len: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&gen.to_le_bytes());
    h.update(&off.to_le_bytes());
    h.update(&len.to_le_bytes());
    h.update(data);
    h.finalize()
}

/// Bytes an undo entry of `len` data bytes occupies.
pub(crate) fn undo_entry_size(len: u64) -> u64 {
    16 + len.div_ceil(16) * 16
}

/// Appends a snapshot of `[off, off+len)` (its current bytes) at `*tail` and persists the
/// entry; the caller may write the range once this returns.
pub(crate) fn undo_append<B: Backend>(
    b: &B,
    lane_off: u64,
    gen: u64,
    tail: &mut u64,
    off: u64,
    len: u64,
) -> Result<()> {
    let size = undo_entry_size(len);
    let free = UNDO_SIZE - *tail;
    if size > free || len > u32::MAX as u64 {
        return Err(PoolError::TxLogFull {
            what: "undo log",
            needed: size,
            free,
        });
    }
    let mut data = vec![0u8; len as usize];
    b.read(off, &mut data)?;
    let at = lane_off + UNDO_OFF + *tail;
    let mut entry = Vec::with_capacity(size as usize);
    entry.extend_from_slice(&off.to_le_bytes());
    entry.extend_from_slice(&(len as u32).to_le_bytes());
    entry.extend_from_slice(&undo_crc(gen, off, len as u32, &data).to_le_bytes());
    entry.extend_from_slice(&data);
    entry.resize(size as usize, 0);
    b.write(at, &entry)?;
    b.persist(at, size)?;
    *tail += size;
    Ok(())
}

/// The snapshots of generation `gen` in a lane's undo area, oldest first.
fn undo_entries<B: Backend>(
    b: &B,
    lane_off: u64,
    gen: u64,
    geo: &Geometry,
) -> Result<Vec<(u64, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut pos = UNDO_FIRST;
    while pos + 16 <= UNDO_SIZE {
        let at = lane_off + UNDO_OFF + pos;
        let mut head = [0u8; 16];
        b.read(at, &mut head)?;
        let mut w = [0u8; 8];
        w.copy_from_slice(&head[..8]);
        let off = u64::from_le_bytes(w);
        let mut h = [0u8; 4];
        h.copy_from_slice(&head[8..12]);
        let len = u32::from_le_bytes(h);
        h.copy_from_slice(&head[12..16]);
        let crc = u32::from_le_bytes(h);
        let size = undo_entry_size(len as u64);
        if len == 0 || pos + size > UNDO_SIZE {
            break;
        }
        let mut data = vec![0u8; len as usize];
        b.read(at + 16, &mut data)?;
        if undo_crc(gen, off, len, &data) != crc {
            break;
        }
        if off < geo.heap_off
            || off
                .checked_add(len as u64)
                .is_none_or(|e| e > geo.heap_end())
        {
            return Err(corrupt(
                format!("undo entry covers {off:#x}+{len}, outside the heap"),
                at,
            ));
        }
        out.push((off, data));
        pos += size;
    }
    Ok(out)
}

/// Rolls back an active transaction in a lane (restoring snapshots newest first), then
/// marks the lane idle. Idempotent: a crash during rollback rolls back again at open.
pub(crate) fn undo_rollback<B: Backend>(b: &B, lane_off: u64, geo: &Geometry) -> Result<bool> {
    let state = b.load_u64(undo_state_off(lane_off))?;
    if state & 1 == 0 {
        return Ok(false);
    }
    let gen = state >> 1;
    let entries = undo_entries(b, lane_off, gen, geo)?;
    for (off, data) in entries.iter().rev() {
        b.write(*off, data)?;
        b.persist(*off, data.len() as u64)?;
    }
    b.store_u64(undo_state_off(lane_off), gen << 1)?;
    b.persist(undo_state_off(lane_off), 8)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::RecordingBackend;

    fn geo() -> Geometry {
        Geometry::compute(2 << 20, 2).unwrap()
    }

    #[test]
    fn redo_commit_applies_and_torn_logs_are_ignored() {
        let g = geo();
        let b = RecordingBackend::new(g.pool_size);
        let lane = g.lane_off(0);
        let w = g.heap_off;
        b.store_u64(w + 8, 0b1010).unwrap();
        let entries = [
            RedoEntry::set(w, 77),
            RedoEntry::or(w + 8, 1),
            RedoEntry::and_not(w + 8, 0b1000),
        ];
        redo_commit(&b, lane, &entries).unwrap();
        assert_eq!(b.load_u64(w).unwrap(), 77);
        assert_eq!(b.load_u64(w + 8).unwrap(), 0b0011);
        assert_eq!(b.load_u64(lane).unwrap(), 0);
        // A complete log left behind is replayed (idempotently); a torn one is dropped.
        let mut bytes = smallvec::SmallVec::new();
        encode(&[RedoEntry::set(w, 5)], &mut bytes);
        b.write(lane + 64, &bytes).unwrap();
        b.store_u64(lane, header_for(1, &bytes)).unwrap();
        assert!(redo_recover(&b, lane, &g).unwrap());
        assert_eq!(b.load_u64(w).unwrap(), 5);
        b.store_u64(lane, header_for(1, &bytes) ^ (1 << 40))
            .unwrap();
        b.store_u64(w, 6).unwrap();
        assert!(!redo_recover(&b, lane, &g).unwrap());
        assert_eq!(b.load_u64(w).unwrap(), 6);
        assert_eq!(b.load_u64(lane).unwrap(), 0);
        // A verified entry aimed at the header is corruption, not a write.
        let mut bad = smallvec::SmallVec::new();
        encode(&[RedoEntry::set(8, 1)], &mut bad);
        b.write(lane + 64, &bad).unwrap();
        b.store_u64(lane, header_for(1, &bad)).unwrap();
        assert!(matches!(
            redo_recover(&b, lane, &g),
            Err(PoolError::Corrupt { .. })
        ));
    }

    #[test]
    fn merging_combines_words_and_keeps_the_last_set() {
        let mut m = Entries::new();
        merge(
            &[
                RedoEntry::or(64, 1),
                RedoEntry::set(8, 1),
                RedoEntry::or(64, 4),
                RedoEntry::and_not(64, 2),
                RedoEntry::set(8, 3),
            ],
            &mut m,
        );
        assert_eq!(
            &m[..],
            &[
                RedoEntry::or(64, 5),
                RedoEntry::set(8, 3),
                RedoEntry::and_not(64, 2)
            ]
        );
        // Past 32 entries merging uses a map: same result.
        let many: Vec<RedoEntry> = (0..40)
            .map(|i| RedoEntry::or(64 * (i % 5), 1 << i))
            .collect();
        let mut merged = Entries::new();
        merge(&many, &mut merged);
        assert_eq!(merged.len(), 5);
        assert_eq!(
            merged[0],
            RedoEntry::or(0, (0..40).filter(|i| i % 5 == 0).map(|i| 1u64 << i).sum())
        );
    }

    #[test]
    fn undo_rolls_back_only_the_current_generation() {
        let g = geo();
        let b = RecordingBackend::new(g.pool_size);
        let lane = g.lane_off(1);
        let x = g.heap_off + 100;
        b.write(x, b"old!").unwrap();
        // Generation 1 snapshots, then commits (state back to idle).
        let mut tail = UNDO_FIRST;
        b.store_u64(undo_state_off(lane), 1 << 1 | 1).unwrap();
        undo_append(&b, lane, 1, &mut tail, x, 4).unwrap();
        undo_append(&b, lane, 1, &mut tail, x + 2, 2).unwrap();
        b.write(x, b"new1").unwrap();
        b.store_u64(undo_state_off(lane), 1 << 1).unwrap();
        // Generation 2 is active and snapshots one range; gen 1's second entry, still
        // in the log after it, is stale and must not be applied.
        let mut tail = UNDO_FIRST;
        b.store_u64(undo_state_off(lane), 2 << 1 | 1).unwrap();
        undo_append(&b, lane, 2, &mut tail, x, 2).unwrap();
        b.write(x, b"zzzz").unwrap();
        assert!(undo_rollback(&b, lane, &g).unwrap());
        let mut out = [0u8; 4];
        b.read(x, &mut out).unwrap();
        assert_eq!(&out, b"nezz");
        assert!(!undo_rollback(&b, lane, &g).unwrap());
        let mut tail = UNDO_SIZE - 16;
        assert!(matches!(
            undo_append(&b, lane, 3, &mut tail, x, 1),
            Err(PoolError::TxLogFull { .. })
        ));
    }
}

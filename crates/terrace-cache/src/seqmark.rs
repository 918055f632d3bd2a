//! The write-sequence high-water mark: a small file (`terrace.seq`, beside the first file
//! tier) recording a bound above every write sequence the cache has used, so that a
//! restart never reuses one — not even one of a DRAM segment that died with the process.
//! Write sequences are the high part of every CAS, so reusing one could let a client's
//! old CAS match a new item.
//!
//! Format: two 16-byte records, each `seq: u64 LE | crc32(seq bytes): u32 LE | "TSEQ"`.
//! A reservation overwrites the record holding the lower value and syncs it, so a write
//! torn by a power loss spoils at most one record and the other still bounds every
//! sequence in use before that reservation. The engine reserves in steps of
//! [`STEP`] sequences, ahead of use: opening a segment takes a sequence below the bound.
//!
//! Invariant: every write sequence handed out is below the larger valid record on media.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::CacheError;

/// Sequences reserved per write of the mark.
pub const STEP: u64 = 1 << 16;
const MAGIC: [u8; 4] = *b"TSEQ";
const RECORD: usize = 16;

/// The open mark file.
#[derive(Debug)]
pub struct SeqMark {
    file: File,
    path: PathBuf,
    records: [u64; 2],
}

fn decode(rec: &[u8]) -> Option<u64> {
    let seq = u64::from_le_bytes(rec.get(0..8)?.try_into().ok()?);
    let crc = u32::from_le_bytes(rec.get(8..12)?.try_into().ok()?);
    (rec.get(12..16)? == MAGIC && crc32fast::hash(&seq.to_le_bytes()) == crc).then_some(seq)
}

impl SeqMark {
    /// Opens (or creates) the mark in `dir`; returns it and the bound it records (0 when
    /// new or unreadable).
    pub fn open(dir: &Path) -> Result<(SeqMark, u64), CacheError> {
        let path = dir.join("terrace.seq");
        let io = |source: std::io::Error| CacheError::SeqMark {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        let mut buf = [0u8; 2 * RECORD];
        let n = file.read_at(&mut buf, 0).map_err(io)?;
        let records = [
            decode(&buf[..n.min(RECORD)]).unwrap_or(0),
            decode(buf.get(RECORD..n).unwrap_or(&[])).unwrap_or(0),
        ];
        let bound = records[0].max(records[1]);
        Ok((
            SeqMark {
                file,
                path,
                records,
            },
            bound,
        ))
    }

    /// Records `bound` (durably) in place of the lower record.
    pub fn reserve(&mut self, bound: u64) -> Result<(), CacheError> {
        let slot = usize::from(self.records[1] < self.records[0]);
        let mut rec = [0u8; RECORD];
        rec[0..8].copy_from_slice(&bound.to_le_bytes());
        rec[8..12].copy_from_slice(&crc32fast::hash(&bound.to_le_bytes()).to_le_bytes());
        rec[12..16].copy_from_slice(&MAGIC);
        let io = |source: std::io::Error| CacheError::SeqMark {
            path: self.path.clone(),
            source,
        };
        self.file
            .write_all_at(&rec, (slot * RECORD) as u64)
            .map_err(io)?;
        self.file.sync_data().map_err(io)?;
        self.records[slot] = bound;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn survives_reopen_and_a_torn_record() {
        let dir = tempfile::tempdir().unwrap();
        let (mut m, b) = SeqMark::open(dir.path()).unwrap();
        assert_eq!(b, 0);
        m.reserve(100).unwrap();
        m.reserve(200).unwrap();
        m.reserve(300).unwrap();
        drop(m);
        assert_eq!(SeqMark::open(dir.path()).unwrap().1, 300);
        // Tear the newest record: the other still bounds what was used before it.
        let path = dir.path().join("terrace.seq");
        let mut bytes = std::fs::read(&path).unwrap();
        let newest = if decode(&bytes[..16]) == Some(300) {
            0
        } else {
            16
        };
        bytes[newest + 3] ^= 0xFF;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(SeqMark::open(dir.path()).unwrap().1, 200);
    }
}

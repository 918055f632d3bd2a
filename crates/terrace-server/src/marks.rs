//! The meta protocol's per-item marks, which memcached keeps in its item header and the
//! Terrace engine does not: *stale* (`md I` or `ms I` invalidated the item; replies carry
//! `X`), *won* (a client was sent the win token `W` for this item; later replies carry
//! `Z`), and *read before* (the item was fetched before it was made stale, so `h` still
//! says so after the invalidation rewrote it).
//!
//! A mark belongs to one version of an item: it is stored with the CAS of the item it
//! describes, and any write that gives the key a new CAS (a set, an append, an incr, an
//! eviction) leaves it behind, unread. A version keeps its CAS when the engine moves it
//! between tiers, so marks survive demotion and promotion. They live in DRAM; a clean
//! shutdown saves them next to the tiers ([`Marks::save`], file [`FILE_NAME`]) and the
//! next start loads them ([`Marks::load`]), so they survive a clean restart as the items
//! do; after a crash they are lost (a stale item reads as fresh, anyone may win again).
//!
//! File format (version 1): the magic `TERRACE-MARKS-1\n`, then one record per marked
//! version — key length (u16, little-endian), the key, the CAS (u64, little-endian), a
//! bits byte (1: stale, 2: won, 4: read before; others must be zero) — and nothing
//! after the last record. A file that does not parse is ignored whole.
//!
//! Invariants:
//! - every change of a key's marks, and every write the server makes to set them (the
//!   rewrite of `md I`, the stale store of `ms I`, the creation of `mg N`), happens under
//!   the key's shard lock, so at most one client is sent `W` per version and a reader
//!   that found a new version after such a write sees its marks;
//! - [`Marks::is_empty`] is exact between operations and counts an operation in flight,
//!   so readers that find it zero skip the lock without missing a mark being set;
//! - about [`MAX_MARKS`] entries at most: an insert beyond it first drops a quarter of
//!   its shard's entries, whatever they mark (a dropped mark reads as "fresh, nobody
//!   won"); an entry whose version is gone is dropped when its key is marked again or
//!   read by `mg`.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Most marked item versions kept (with keys of 250 bytes, about 80 MB).
pub const MAX_MARKS: usize = 1 << 18;

/// The file a clean shutdown saves the marks to, in the data directory.
pub const FILE_NAME: &str = "meta-marks";

const MAGIC: &[u8] = b"TERRACE-MARKS-1\n";

/// Lock shards.
const SHARDS: usize = 64;

/// What is known about one item version beyond the engine's own fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    /// Invalidated: served with `X` until rewritten.
    pub stale: bool,
    /// A client was sent `W` for this version.
    pub won: bool,
    /// Fetched before an invalidation rewrote it.
    pub read_before: bool,
}

impl Mark {
    fn bits(self) -> u8 {
        u8::from(self.stale) | u8::from(self.won) << 1 | u8::from(self.read_before) << 2
    }

    fn from_bits(bits: u8) -> Option<Mark> {
        (bits & !0b111 == 0).then_some(Mark {
            stale: bits & 1 != 0,
            won: bits & 2 != 0,
            read_before: bits & 4 != 0,
        })
    }
}

#[derive(Debug)]
struct MarkedVersion {
    cas: u64,
    mark: Mark,
}

type MarkShard = HashMap<Box<[u8]>, MarkedVersion>;

/// The marks of every marked item version, by key.
#[derive(Debug)]
pub struct Marks {
    shards: Box<[Mutex<MarkShard>]>,
    /// Entries plus operations in flight.
    count: AtomicUsize,
}

impl Default for Marks {
    fn default() -> Self {
        Marks::new()
    }
}

/// A key's shard, locked: reads and changes its marks.
pub struct Locked<'m> {
    marks: &'m Marks,
    shard: MutexGuard<'m, MarkShard>,
    key: &'m [u8],
}

impl Marks {
    pub fn new() -> Marks {
        Marks {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            count: AtomicUsize::new(0),
        }
    }

    /// Writes every entry to `path` (through a temporary file renamed over it); returns
    /// how many. Call it once no connection can change the marks.
    pub fn save(&self, path: &Path) -> io::Result<usize> {
        let mut bytes = MAGIC.to_vec();
        let mut saved = 0;
        for shard in self.shards.iter() {
            let shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            for (key, entry) in shard.iter() {
                let Ok(len) = u16::try_from(key.len()) else {
                    continue;
                };
                bytes.extend_from_slice(&len.to_le_bytes());
                bytes.extend_from_slice(key);
                bytes.extend_from_slice(&entry.cas.to_le_bytes());
                bytes.push(entry.mark.bits());
                saved += 1;
            }
        }
        let temporary = path.with_extension("tmp");
        std::fs::write(&temporary, &bytes)?;
        std::fs::rename(&temporary, path)?;
        Ok(saved)
    }

    /// The marks saved at `path`, and removes the file (marks saved before a crash must
    /// not come back at a later start). No file: no marks; a file that does not parse:
    /// an `InvalidData` error, and the file is removed all the same.
    pub fn load(path: &Path) -> io::Result<Marks> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Marks::new()),
            Err(e) => return Err(e),
        };
        std::fs::remove_file(path)?;
        let marks = Marks::new();
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed meta marks file");
        let mut rest = bytes.strip_prefix(MAGIC).ok_or_else(bad)?;
        while !rest.is_empty() {
            let (len, tail) = rest.split_first_chunk::<2>().ok_or_else(bad)?;
            let len = usize::from(u16::from_le_bytes(*len));
            if tail.len() < len + 9 {
                return Err(bad());
            }
            let (key, tail) = tail.split_at(len);
            let (cas, tail) = tail.split_first_chunk::<8>().ok_or_else(bad)?;
            let (&bits, tail) = tail.split_first().ok_or_else(bad)?;
            let mark = Mark::from_bits(bits).ok_or_else(bad)?;
            if key.is_empty() || marks.count.load(Ordering::Relaxed) >= MAX_MARKS {
                return Err(bad());
            }
            marks.lock(key).set(u64::from_le_bytes(*cas), mark);
            rest = tail;
        }
        Ok(marks)
    }

    /// Whether no version is marked and no marking is in flight.
    pub fn is_empty(&self) -> bool {
        self.count.load(Ordering::Acquire) == 0
    }

    /// The marks of the version of `key` whose CAS is `cas` (none when unmarked).
    pub fn get(&self, key: &[u8], cas: u64) -> Mark {
        if self.is_empty() {
            return Mark::default();
        }
        self.lock(key).get(cas)
    }

    /// Locks `key`'s shard for a read-decide-write sequence.
    pub fn lock<'m>(&'m self, key: &'m [u8]) -> Locked<'m> {
        self.count.fetch_add(1, Ordering::AcqRel);
        let shard = &self.shards[shard_of(key)];
        let shard = shard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Locked {
            marks: self,
            shard,
            key,
        }
    }
}

impl Locked<'_> {
    /// The marks of the version of CAS `cas`.
    pub fn get(&self, cas: u64) -> Mark {
        match self.shard.get(self.key) {
            Some(entry) if entry.cas == cas => entry.mark,
            _ => Mark::default(),
        }
    }

    /// Sets the marks of the version of CAS `cas` (replacing those of any other version
    /// of the key); an all-clear mark removes the entry.
    pub fn set(&mut self, cas: u64, mark: Mark) {
        if mark == Mark::default() {
            if self.shard.remove(self.key).is_some() {
                self.marks.count.fetch_sub(1, Ordering::AcqRel);
            }
            return;
        }
        match self.shard.get_mut(self.key) {
            Some(entry) => *entry = MarkedVersion { cas, mark },
            None => {
                if self.marks.count.load(Ordering::Acquire) > MAX_MARKS {
                    self.make_room();
                }
                self.shard
                    .insert(self.key.into(), MarkedVersion { cas, mark });
                self.marks.count.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// Whether the key has marks, for a version other than `cas`.
    pub fn marks_other_than(&self, cas: u64) -> bool {
        self.shard.get(self.key).is_some_and(|e| e.cas != cas)
    }

    /// Forgets the marks of the key when they belong to a version other than `cas`
    /// (the version they describe is gone).
    pub fn forget_unless(&mut self, cas: u64) {
        if self.shard.get(self.key).is_some_and(|e| e.cas != cas) {
            self.shard.remove(self.key);
            self.marks.count.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Drops a quarter of this shard's entries (the table is over [`MAX_MARKS`]).
    fn make_room(&mut self) {
        let drop: Vec<Box<[u8]>> = self
            .shard
            .keys()
            .take(self.shard.len() / 4 + 1)
            .cloned()
            .collect();
        for key in drop {
            if self.shard.remove(&key).is_some() {
                self.marks.count.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        self.marks.count.fetch_sub(1, Ordering::AcqRel);
    }
}

fn shard_of(key: &[u8]) -> usize {
    // FNV-1a: keys are short and the shard count small.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h as usize) % SHARDS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_belongs_to_one_version() {
        let marks = Marks::new();
        assert!(marks.is_empty());
        let stale = Mark {
            stale: true,
            ..Mark::default()
        };
        marks.lock(b"k").set(7, stale);
        assert!(!marks.is_empty());
        assert_eq!(marks.get(b"k", 7), stale);
        assert_eq!(marks.get(b"k", 8), Mark::default());
        assert_eq!(marks.get(b"other", 7), Mark::default());
        marks.lock(b"k").forget_unless(7);
        assert_eq!(marks.get(b"k", 7), stale);
        marks.lock(b"k").forget_unless(8);
        assert_eq!(marks.get(b"k", 7), Mark::default());
        assert!(marks.is_empty());
        marks.lock(b"k").set(9, stale);
        marks.lock(b"k").set(9, Mark::default());
        assert!(marks.is_empty());
    }

    #[test]
    fn marks_round_trip_through_their_file_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        assert!(Marks::load(&path).unwrap().is_empty(), "no file: no marks");
        let marks = Marks::new();
        let won = Mark {
            won: true,
            read_before: true,
            ..Mark::default()
        };
        marks.lock(b"a").set(1, won);
        marks.lock(&[0, 255]).set(
            u64::MAX,
            Mark {
                stale: true,
                ..Mark::default()
            },
        );
        assert_eq!(marks.save(&path).unwrap(), 2);
        let loaded = Marks::load(&path).unwrap();
        assert_eq!(loaded.get(b"a", 1), won);
        assert!(loaded.get(&[0, 255], u64::MAX).stale);
        assert!(!path.exists(), "loading removes the file");
        // Damaged files are refused whole, and removed.
        for bad in [
            &b"TERRACE-MARKS-2\n"[..],
            b"TERRACE-MARKS-1\n\x01\x00a",
            b"TERRACE-MARKS-1\n\x01\x00a\x01\0\0\0\0\0\0\0\x08",
        ] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(
                Marks::load(&path).unwrap_err().kind(),
                io::ErrorKind::InvalidData
            );
            assert!(!path.exists());
        }
    }
}

//! Concurrency stress of the index: writers (set/delete under the bucket guard), a mover
//! repointing entries with compare-and-swap, and lock-free readers, all at once, on keys
//! whose hashes share tags and buckets. Checked:
//! - a reader only ever sees locations that were inserted, for a key with its tag;
//! - the versions a reader sees for a key never go backwards (a mover never resurrects
//!   an overwritten item, a reader never sees an entry older than one it already saw);
//! - at the end, every key has exactly the entry its writer left (or none after a delete).
//!
//! Every location is registered with (key, version) in a side table before it is
//! published, standing in for the item the real cache would read to verify the key.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::thread;

use terrace_cache::index::{Freq, Index, IndexConfig, Location};

const KEYS: u32 = 64;
const WRITERS: u32 = 2;
const READERS: usize = 2;
/// Each writer does at least this many operations, and goes on (up to 10×) until the
/// mover and the readers have made progress too, however the threads get scheduled.
const OPS_PER_WRITER: u32 = 10_000;
const MIN_MOVES: u32 = 2_000;
const MIN_READS: u64 = 20_000;
const CAPACITY: usize = 1 << 20;

fn hash(k: u32) -> u64 {
    (u64::from(k % 8 + 1) << 60) | u64::from(k.wrapping_mul(0x9E37_79B9) & 0xFFFF)
}

struct Registry {
    owner: Vec<AtomicU64>,
    next: AtomicU32,
}

impl Registry {
    /// A fresh location, registered as holding `version` of `key`.
    fn alloc(&self, key: u32, version: u32) -> Option<Location> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = self.owner.get(id as usize)?;
        slot.store(
            (u64::from(key + 1) << 32) | u64::from(version),
            Ordering::Release,
        );
        Some(Location {
            segment: id % 1000,
            offset: id / 1000,
        })
    }

    /// (key, version) registered at `loc`; panics if nothing was ever registered there.
    fn get(&self, loc: Location) -> (u32, u32) {
        let id = loc.offset as usize * 1000 + loc.segment as usize;
        let v = self.owner[id].load(Ordering::Acquire);
        assert_ne!(v, 0, "location {loc:?} was never inserted");
        (((v >> 32) - 1) as u32, v as u32)
    }
}

#[test]
fn readers_writers_and_movers() {
    let index = Index::new(&IndexConfig::new(256, 1000, 20)).unwrap();
    let reg = Registry {
        owner: (0..CAPACITY).map(|_| AtomicU64::new(0)).collect(),
        next: AtomicU32::new(0),
    };
    // Final state per key: 0 = absent, else the version.
    let finals: Vec<AtomicU32> = (0..KEYS).map(|_| AtomicU32::new(0)).collect();
    let writers_done = AtomicU32::new(0);
    let stop = AtomicBool::new(false);
    let (moved, move_lost) = (AtomicU32::new(0), AtomicU32::new(0));
    let reads = AtomicU64::new(0);

    thread::scope(|s| {
        for w in 0..WRITERS {
            let (index, reg, finals, writers_done) = (&index, &reg, &finals, &writers_done);
            let (moved, move_lost, reads) = (&moved, &move_lost, &reads);
            s.spawn(move || {
                let mut rng = common::Rng(0x1234_5678 + u64::from(w));
                let mut versions = vec![0u32; KEYS as usize];
                for op in 0..OPS_PER_WRITER * 10 {
                    if op >= OPS_PER_WRITER
                        && moved.load(Ordering::Relaxed) + move_lost.load(Ordering::Relaxed)
                            >= MIN_MOVES
                        && reads.load(Ordering::Relaxed) >= MIN_READS
                    {
                        break;
                    }
                    if op % 64 == 0 {
                        thread::yield_now();
                    }
                    let k = (rng.next() % u64::from(KEYS / WRITERS)) as u32 * WRITERS + w;
                    let mut g = index.lock(hash(k));
                    let old = g.candidates().find(|&l| reg.get(l).0 == k);
                    if rng.next().is_multiple_of(5) {
                        if let Some(old) = old {
                            assert!(g.remove(old));
                        }
                        finals[k as usize].store(0, Ordering::Relaxed);
                    } else {
                        versions[k as usize] += 1;
                        let v = versions[k as usize];
                        let new = reg.alloc(k, v).expect("registry sized for the writers");
                        match old {
                            Some(old) => assert!(g.repoint(old, new, Freq::Reset)),
                            None => g.insert(new).expect("the table is sized to never fill"),
                        }
                        finals[k as usize].store(v, Ordering::Relaxed);
                    }
                }
                writers_done.fetch_add(1, Ordering::Release);
            });
        }
        {
            let (index, reg, stop, moved, move_lost) = (&index, &reg, &stop, &moved, &move_lost);
            s.spawn(move || {
                let mut rng = common::Rng(0xDEAD_BEEF);
                // Leave the registry's second half to the writers.
                while !stop.load(Ordering::Acquire)
                    && (reg.next.load(Ordering::Relaxed) as usize) < CAPACITY / 2
                {
                    let k = (rng.next() % u64::from(KEYS)) as u32;
                    let Some((old, v)) = index
                        .lookup(hash(k))
                        .map(|h| (h.location(), reg.get(h.location())))
                        .find(|&(_, (owner, _))| owner == k)
                        .map(|(l, (_, v))| (l, v))
                    else {
                        continue;
                    };
                    // Copy the item (same version) and repoint only if still current;
                    // sometimes give the writers time to overtake the mover first.
                    for _ in 0..rng.next() % 256 {
                        std::hint::spin_loop();
                    }
                    let Some(new) = reg.alloc(k, v) else { break };
                    if index.repoint(hash(k), old, new, Freq::Keep) {
                        moved.fetch_add(1, Ordering::Relaxed);
                    } else {
                        move_lost.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        for r in 0..READERS {
            let (index, reg, stop, reads) = (&index, &reg, &stop, &reads);
            s.spawn(move || {
                let mut rng = common::Rng(0xFEED + r as u64);
                let mut seen = vec![0u32; KEYS as usize];
                let mut n = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let k = (rng.next() % u64::from(KEYS)) as u32;
                    let mut best = None;
                    for hit in index.lookup(hash(k)) {
                        let (owner, v) = reg.get(hit.location());
                        assert_eq!(owner % 8, k % 8, "candidate with another tag");
                        if owner == k {
                            best = best.max(Some(v));
                            hit.touch();
                        }
                    }
                    if let Some(v) = best {
                        assert!(
                            v >= seen[k as usize],
                            "key {k}: saw version {v} after {}",
                            seen[k as usize]
                        );
                        seen[k as usize] = v;
                    }
                    n += 1;
                    if n.is_multiple_of(1024) {
                        reads.fetch_add(1024, Ordering::Relaxed);
                    }
                }
                reads.fetch_add(n % 1024, Ordering::Relaxed);
            });
        }
        while writers_done.load(Ordering::Acquire) < WRITERS {
            thread::yield_now();
        }
        stop.store(true, Ordering::Release);
    });

    for k in 0..KEYS {
        let entries: Vec<(u32, u32)> = index
            .lookup(hash(k))
            .map(|h| reg.get(h.location()))
            .filter(|&(owner, _)| owner == k)
            .collect();
        let want = finals[k as usize].load(Ordering::Relaxed);
        match want {
            0 => assert!(entries.is_empty(), "key {k}: deleted but has {entries:?}"),
            v => assert_eq!(entries, vec![(k, v)], "key {k}"),
        }
    }
    // The run did interleave: moves both won and lost races, readers read.
    assert!(moved.load(Ordering::Relaxed) > 0);
    assert!(reads.load(Ordering::Relaxed) > 0);
    eprintln!(
        "moves {} won / {} lost, {} reads",
        moved.load(Ordering::Relaxed),
        move_lost.load(Ordering::Relaxed),
        reads.load(Ordering::Relaxed)
    );
}

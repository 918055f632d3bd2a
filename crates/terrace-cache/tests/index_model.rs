//! The index against a `HashMap` model. Keys get deliberately colliding hashes (few tags,
//! few buckets) so that candidate filtering, key verification by the caller, and the
//! `Full` policy are exercised. The "store" that verifies keys is a map from location to
//! key, standing in for reading the item in its segment.

use std::collections::HashMap;

use proptest::prelude::*;
use terrace_cache::index::{Freq, Index, IndexConfig, Location, Sweep, SLOTS};

const KEYS: u32 = 24;

#[derive(Clone, Debug)]
enum Op {
    Set(u32),
    Delete(u32),
    Move(u32),
    StaleMove(u32),
    Touch(u32),
    DropSegment(u32),
}

fn op() -> impl Strategy<Value = Op> {
    let k = 0..KEYS;
    prop_oneof![
        4 => k.clone().prop_map(Op::Set),
        2 => k.clone().prop_map(Op::Delete),
        2 => k.clone().prop_map(Op::Move),
        1 => k.clone().prop_map(Op::StaleMove),
        1 => k.prop_map(Op::Touch),
        1 => (0u32..7).prop_map(Op::DropSegment),
    ]
}

/// Colliding hashes: 4 distinct tags (the top bits; the layout here keeps 42 tag bits, so
/// bits 16..60 are left zero), bucket choice from the low 16 bits.
fn hash(k: u32) -> u64 {
    (u64::from(k % 4 + 1) << 60) | u64::from(k.wrapping_mul(0x9E37_79B9) & 0xFFFF)
}

struct Harness {
    index: Index,
    store: HashMap<Location, u32>,
    model: HashMap<u32, Location>,
    next: u32,
}

impl Harness {
    fn new(items: usize) -> Harness {
        Harness {
            index: {
                let index = Index::new(&IndexConfig::new(items, 8, 16)).unwrap();
                assert_eq!(index.layout().tag_bits, 42);
                index
            },
            store: HashMap::new(),
            model: HashMap::new(),
            next: 0,
        }
    }

    fn fresh(&mut self, k: u32) -> Location {
        let n = self.next;
        self.next += 1;
        let loc = Location {
            segment: n % 7,
            offset: n / 7,
        };
        self.store.insert(loc, k);
        loc
    }

    /// Candidates that verify as key `k`.
    fn verified(&self, k: u32) -> Vec<Location> {
        self.index
            .lookup(hash(k))
            .map(|h| h.location())
            .filter(|l| self.store.get(l) == Some(&k))
            .collect()
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Set(k) => {
                let new = self.fresh(k);
                let mut g = self.index.lock(hash(k));
                let old = g.candidates().find(|l| self.store.get(l) == Some(&k));
                match old {
                    Some(old) => {
                        assert!(g.repoint(old, new, Freq::Reset));
                        self.model.insert(k, new);
                    }
                    None => match g.insert(new) {
                        Ok(()) => {
                            self.model.insert(k, new);
                        }
                        Err(_) => {
                            // Full: both buckets (or the only one) are really full.
                            let buckets = if self.index.bucket_count() == 1 { 1 } else { 2 };
                            assert_eq!(g.occupants().count(), buckets * SLOTS);
                            // Policy: evict the least-frequent occupant, then insert.
                            let (victim, _) = g.occupants().min_by_key(|&(_, f)| f).unwrap();
                            assert!(g.remove_occupant(victim));
                            let owner = self.store[&victim];
                            assert_eq!(self.model.remove(&owner), Some(victim));
                            g.insert(new).unwrap();
                            self.model.insert(k, new);
                        }
                    },
                }
            }
            Op::Delete(k) => {
                let mut g = self.index.lock(hash(k));
                let old = g.candidates().find(|l| self.store.get(l) == Some(&k));
                assert_eq!(old, self.model.get(&k).copied());
                if let Some(old) = old {
                    assert!(g.remove(old));
                    self.model.remove(&k);
                }
            }
            Op::Move(k) => {
                if let Some(&old) = self.verified(k).first() {
                    let new = self.fresh(k);
                    assert!(self.index.repoint(hash(k), old, new, Freq::Keep));
                    self.model.insert(k, new);
                }
            }
            Op::StaleMove(k) => {
                // A mover holding a location the entry no longer points to must fail.
                let stale = self.fresh(k);
                let new = self.fresh(k);
                assert!(!self.index.repoint(hash(k), stale, new, Freq::Keep));
            }
            Op::Touch(k) => {
                if let Some(h) = self
                    .index
                    .lookup(hash(k))
                    .find(|h| self.store.get(&h.location()) == Some(&k))
                {
                    let before = h.frequency();
                    h.touch();
                    let after = self
                        .index
                        .lookup(hash(k))
                        .find(|h2| h2.location() == h.location())
                        .unwrap()
                        .frequency();
                    assert_eq!(after, (before + 1).min(3));
                }
            }
            Op::DropSegment(s) => {
                self.index.sweep(0..self.index.bucket_count(), |l, _| {
                    if l.segment == s {
                        Sweep::Remove
                    } else {
                        Sweep::Keep
                    }
                });
                self.model.retain(|_, l| l.segment != s);
            }
        }
    }

    fn check(&self) {
        for k in 0..KEYS {
            let v = self.verified(k);
            assert!(v.len() <= 1, "key {k} has {} entries", v.len());
            assert_eq!(v.first(), self.model.get(&k), "key {k}");
            // Every candidate is an entry some key with the same tag owns.
            for h in self.index.lookup(hash(k)) {
                let owner = self.store[&h.location()];
                assert_eq!(owner % 4, k % 4, "candidate of another tag");
                assert_eq!(self.model.get(&owner), Some(&h.location()));
            }
        }
        assert_eq!(self.index.count(), self.model.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A roomy table: nothing is ever refused.
    #[test]
    fn matches_a_hashmap(ops in prop::collection::vec(op(), 1..200)) {
        let mut h = Harness::new(64);
        for op in &ops {
            h.apply(op);
            h.check();
        }
    }

    /// A table of one or two buckets: `Full` and the victim policy are exercised.
    #[test]
    fn matches_a_hashmap_when_tiny(ops in prop::collection::vec(op(), 1..200), items in 1usize..12) {
        let mut h = Harness::new(items);
        for op in &ops {
            h.apply(op);
            h.check();
        }
    }
}

//! [`Cache::verify`]: the engine's invariants (E1, E2 and E4 of the `cache` module docs)
//! checked over the whole cache; compiled in tests and debug builds only (the test suites
//! run it at their quiescent points). It must run at a quiescent
//! point — no operation in flight and the movers stopped or idle — since it reads the
//! index and the segments without their locks, and a copy or a write half done is not a
//! violation but looks like one.
//!
//! What it checks:
//! - every index entry points at the start of an item that decodes, in a segment that is
//!   `Open` or `Sealed` (E1; `Evicting` is allowed only mid-walk), whose state is LIVE
//!   (E4), and whose key hashes to the entry's buckets with the entry among its
//!   candidates; on flash, that the item reads back with such a key;
//! - no two entries name items of the same key;
//! - every LIVE item of an `Open` or `Sealed` memory segment is the one the index maps its
//!   key to (E2: at most one LIVE item per key).

use std::collections::HashSet;

use super::Cache;
use crate::index::Location;
use crate::item::ItemState;
use crate::mem::SegState;

/// What [`Cache::verify`] looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Index entries checked.
    pub entries: usize,
    /// Of those, entries into the flash tier.
    pub flash_entries: usize,
    /// LIVE items of memory segments checked against the index.
    pub live_items: usize,
}

impl Cache {
    /// Checks the engine's invariants over the whole cache (see `cache/verify.rs`); call
    /// it only at a quiescent point. Returns what it checked, or every violation found
    /// (the first hundred), each naming its invariant.
    pub fn verify(&self) -> Result<VerifyReport, Vec<String>> {
        let mut report = VerifyReport::default();
        let mut errors = Vec::new();
        let mut keys: HashSet<Vec<u8>> = HashSet::new();
        let mut entries = Vec::new();
        self.index.for_each_location(|loc| entries.push(loc));
        for loc in entries {
            report.entries += 1;
            let key = match self.entry_key(loc) {
                Ok(Some(key)) => key,
                Ok(None) => {
                    report.flash_entries += 1;
                    continue;
                }
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            if self.flash_slot(loc.segment).is_some() {
                report.flash_entries += 1;
            }
            let hash = self.index.hash_key(&key);
            if !self.index.lookup(hash).any(|h| h.location() == loc) {
                errors.push(format!(
                    "E1: the entry for {loc:?} is not in its key's buckets"
                ));
            }
            if !keys.insert(key) {
                errors.push(format!("E2: a second entry ({loc:?}) for one key"));
            }
        }
        for (t, tier) in self.tiers.iter().enumerate() {
            for slot in 0..tier.area.count() {
                if !matches!(tier.area.state(slot), SegState::Open | SegState::Sealed) {
                    continue;
                }
                let Some(pin) = tier.area.pin(slot) else {
                    continue;
                };
                for item in pin.items(pin.committed_end()) {
                    if item.state != ItemState::Live {
                        continue;
                    }
                    report.live_items += 1;
                    let loc = Location {
                        segment: tier.base + slot,
                        offset: item.offset,
                    };
                    let hash = self.index.hash_key(item.key);
                    if !self.index.lookup(hash).any(|h| h.location() == loc) {
                        errors.push(format!(
                            "E2: a LIVE item in tier {t} at {loc:?} that its key's entry \
                             does not name"
                        ));
                    }
                }
            }
        }
        errors.truncate(100);
        if errors.is_empty() {
            Ok(report)
        } else {
            Err(errors)
        }
    }

    /// The key of the item the entry at `loc` names, checked against E1 and E4: `None`
    /// for an entry into the flash tier whose item is not there to read (a segment being
    /// written or evicted), an error naming the invariant otherwise.
    fn entry_key(&self, loc: Location) -> Result<Option<Vec<u8>>, String> {
        if self.flash_slot(loc.segment).is_some() {
            return Ok(self.read_flash(loc).map(|item| item.item().key.to_vec()));
        }
        let Some((t, slot)) = self.locate(loc.segment) else {
            return Err(format!("E1: an entry names no segment: {loc:?}"));
        };
        let area = &self.tiers[t].area;
        let state = area.state(slot);
        if !matches!(state, SegState::Open | SegState::Sealed) {
            return Err(format!(
                "E1: an entry into a segment in state {state:?}: {loc:?}"
            ));
        }
        let Some(pin) = area.pin(slot) else {
            return Err(format!(
                "E1: an entry into a segment that cannot be pinned: {loc:?}"
            ));
        };
        // Within the committed end: an entry names a committed item (E1).
        let item = pin
            .item_within(loc.offset, pin.committed_end())
            .map_err(|e| format!("E1: the entry's item does not decode ({e}): {loc:?}"))?;
        if item.state != ItemState::Live {
            return Err(format!(
                "E4: an entry names a {:?} item: {loc:?}",
                item.state
            ));
        }
        Ok(Some(item.key.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::{TierConfig, TierSize};
    use crate::CacheConfig;

    fn cache() -> Cache {
        let config = CacheConfig {
            segment_shift: Some(15),
            limits: crate::ItemLimits {
                max_key_len: 250,
                max_value_len: 8 << 10,
            },
            stripes: 2,
            ..CacheConfig::new(vec![
                TierConfig::dram(TierSize::Bytes(2 << 20)),
                TierConfig::dram(TierSize::Bytes(2 << 20)),
            ])
        };
        Cache::open(config).unwrap().0
    }

    /// The location the index gives `key`.
    fn location(c: &Cache, key: &[u8]) -> Location {
        let hash = c.index.hash_key(key);
        c.index
            .lookup(hash)
            .map(|h| h.location())
            .find(|&loc| c.entry_key(loc) == Ok(Some(key.to_vec())))
            .unwrap()
    }

    #[test]
    fn a_cache_after_writes_evictions_and_deletes_verifies() {
        let c = cache();
        for k in 0..40_000u32 {
            let key = format!("k{}", k % 12_000);
            c.set(key.as_bytes(), &[k as u8; 300], 0, 0).unwrap();
            if k % 3 == 0 {
                c.get(key.as_bytes()).unwrap();
            }
            if k % 7 == 0 {
                c.delete(format!("k{}", k % 1_000).as_bytes()).unwrap();
            }
            if k % 500 == 0 {
                c.maintain().unwrap();
            }
        }
        let report = c.verify().unwrap();
        assert_eq!(report.entries, c.stats().items);
        assert!(report.live_items >= report.entries, "{report:?}");
        assert!(c.stats().demotions > 0, "both tiers were walked");
    }

    #[test]
    fn a_dead_item_with_an_entry_breaks_e4() {
        let c = cache();
        c.set(b"a", b"1", 0, 0).unwrap();
        c.set(b"b", b"2", 0, 0).unwrap();
        c.verify().unwrap();
        let loc = location(&c, b"a");
        let (_, pin) = c.pin(loc.segment).unwrap();
        pin.kill(loc.offset).unwrap();
        let errors = c.verify().unwrap_err();
        assert!(errors[0].starts_with("E4"), "{errors:?}");
    }

    #[test]
    fn a_live_item_without_its_entry_breaks_e2() {
        let c = cache();
        c.set(b"a", b"1", 0, 0).unwrap();
        let old = location(&c, b"a");
        c.set(b"a", b"2", 0, 0).unwrap();
        c.verify().unwrap();
        // The overwritten copy comes back to life beside the current one.
        let (_, pin) = c.pin(old.segment).unwrap();
        pin.set_state(old.offset, ItemState::Live).unwrap();
        let errors = c.verify().unwrap_err();
        assert!(errors.iter().any(|e| e.starts_with("E2")), "{errors:?}");
    }
}

//! The eviction policy: what becomes of one item of a segment being walked — evicted or
//! cleaned — decided from what the walk knows of it ([`ItemFacts`]) by one pure
//! function, [`fate`]. The walk, the copies and their publication are `cache/evict.rs`'s;
//! the movers that run them are `cache/movers.rs`'s. Changing the policy means changing
//! this module and its tests, and the no-livelock argument below with them.
//!
//! # Rules
//! - An expired item is dropped, and so is one no index entry points at (overwritten,
//!   deleted, moved), unless it has a replica (next rule).
//! - *Kept* items get another life, the others are dropped: out of a main queue (or a
//!   tier above the last), those with hits; out of a probation stage, those with hits and
//!   those smaller than [`SMALL_ITEM_SHARE`] of the stage's mean live item; in a
//!   cleaning, every live item; into a flash tier with room to spare, every live item.
//! - A promoted item whose flash replica is still there goes back to it, kept or not (a
//!   repoint, no write), unless it stays.
//! - Tier 0 of several keeps the kept items read [`STAY_HITS`] times (a *stay*, one hit
//!   spent) while the eviction's copy budget lasts; every other kept item of a tier
//!   above the last is demoted, frequency kept.
//! - The last tier reinserts kept items while the budget lasts: out of its main queue
//!   one hit spent, out of its probation queue frequency kept (a promotion). Past the
//!   budget they are dropped.
//! - A cleaning copies every live item within the tier, frequency kept, with no budget.
//! - The budget: [`REINSERT_BUDGET`] of a segment per eviction, for copies within the
//!   tier (stays and reinsertions); none where the eviction bars them (it opens the
//!   reinsertion segment itself, or the segment expired).
//!
//! # No livelock
//! Every eviction frees at least a quarter of its segment whatever the readers do: its
//! copies within the tier take at most [`REINSERT_BUDGET`] of it. An item nobody reads
//! survives a bounded number of evictions: each reinsertion out of a main queue and each
//! stay spends one recorded hit, frequencies are capped ([`crate::index::MAX_FREQ`]),
//! and an item leaves probation once per write. A cleaning spends nothing but frees the
//! dead share it chose its segment for (at least `CLEAN_DEAD_SHARE`, `cache/evict.rs`).
//! The property tests below check the first two against the rules.

use super::evict::Walk;

/// The most one eviction copies within its tier (stays, reinsertions), as a fraction
/// (numerator, denominator) of a segment's item bytes: every eviction frees at least the
/// rest.
pub(super) const REINSERT_BUDGET: (usize, usize) = (3, 4);

/// Items smaller than this share of the mean live item of a probation stage's last
/// evicted segment (`Tier::probation_mean_len`; 0, keeping nothing more, until one is)
/// are kept at their eviction from it — promoted or demoted, as items with hits are —
/// even without a hit: a small item costs little of the space a drop would free, so the
/// chance that it is read again is worth more than its bytes. A workload of items of one
/// size is filtered exactly as before. Items under 2/7 of the mean take under 2/7 of a
/// segment's bytes, so they leave most of [`REINSERT_BUDGET`] to the items with hits
/// walked after them. The cache then holds more, smaller items than the mean written,
/// which is why the index is sized for the whole live share (`super::index_items`).
/// Measurements: `docs/experiments.md`.
pub(super) const SMALL_ITEM_SHARE: (usize, usize) = (2, 7);

/// In a cache of several tiers, an item leaving tier 0 with at least this many hits
/// stays in tier 0 — copied into its reinsertion segment, one hit spent, within
/// [`REINSERT_BUDGET`] of the segment — instead of being demoted: the items read most are
/// kept in the fastest tier (CacheLib's tiers keep the hottest items in DRAM), and tier 0,
/// which is every tiered cache's probation stage, then also holds a small main queue of
/// its own (measured in `docs/experiments.md`).
pub(super) const STAY_HITS: u8 = 2;

/// Where the walked segment's tier stands, and what the eviction allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Place {
    /// The tier is the last one (it reinserts; nothing below to demote to).
    pub last: bool,
    /// The tier below is flash (demotions go to its write buffers).
    pub to_flash: bool,
    /// The flash tier has room to spare: it takes every live item, hit or not.
    pub flash_has_room: bool,
    /// This eviction may copy within the tier (`Reinsertion::Allowed`), and the tier is
    /// tier 0 of several walking its probation stage: its items read most may stay.
    pub stays: bool,
}

/// What the walk knows of one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ItemFacts {
    pub walk: Walk,
    /// Its expiry has passed.
    pub expired: bool,
    /// (frequency, reads) of the index entry that points at it; `None` when none does.
    pub hits: Option<(u8, u8)>,
    /// Its encoded length.
    pub len: usize,
    /// The probation stage's mean live item length (0 until one was measured).
    pub mean_len: usize,
    /// A promotion left its flash copy in place (`cache/replica.rs`).
    pub has_replica: bool,
    /// What is left of this eviction's copy budget within the tier.
    pub budget: usize,
}

/// What becomes of the item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fate {
    /// It loses its entry (remembered as a ghost out of a probation stage).
    Drop,
    /// Copied into the next tier (or flash), frequency kept.
    Demote,
    /// Back to its flash replica: the entry repointed, no copy.
    ToReplica,
    /// Tier 0 of several keeps it: copied within the tier, one hit spent.
    Stay,
    /// The last tier keeps it: copied within the tier, one hit spent out of the main
    /// queue, frequency kept out of probation.
    Reinsert,
    /// A cleaning keeps it: copied within the tier, frequency kept, no budget.
    CleanCopy,
}

impl Fate {
    /// The bytes of the copy budget this fate takes.
    pub fn budget_used(self, len: usize) -> usize {
        match self {
            Fate::Stay | Fate::Reinsert => len,
            _ => 0,
        }
    }

    /// Whether the copy spends one of the item's recorded hits (else its frequency is
    /// kept).
    pub fn spends_hit(self, walk: Walk) -> bool {
        match self {
            Fate::Stay => true,
            Fate::Reinsert => walk == Walk::Evict,
            _ => false,
        }
    }
}

/// The copy budget of one eviction within its tier, out of a segment of `item_bytes`:
/// [`REINSERT_BUDGET`] of it where the eviction may copy within the tier (the last
/// tier's reinsertions, tier 0's stays), else none.
pub(super) fn copy_budget(item_bytes: usize, place: Place, allowed: bool) -> usize {
    if allowed && (place.last || place.stays) {
        item_bytes / REINSERT_BUDGET.1 * REINSERT_BUDGET.0
    } else {
        0
    }
}

/// The fate of one walked item (the module docs' rules).
pub(super) fn fate(place: Place, item: ItemFacts) -> Fate {
    if item.expired {
        return Fate::Drop;
    }
    let reads = item.hits.map_or(0, |(_, reads)| reads);
    if place.stays && reads >= STAY_HITS && item.budget >= item.len {
        return Fate::Stay;
    }
    // With or without an entry: the walk's repoint finds whether it still has one, and
    // kills a replica it no longer has any use for.
    if place.to_flash && item.walk != Walk::Clean && item.has_replica {
        return Fate::ToReplica;
    }
    let kept = item.hits.is_some_and(|(frequency, _)| {
        place.flash_has_room
            || match item.walk {
                Walk::Evict => frequency > 0,
                Walk::Probation => {
                    frequency > 0
                        || item.len * SMALL_ITEM_SHARE.1 < item.mean_len * SMALL_ITEM_SHARE.0
                }
                Walk::Clean => true,
            }
    });
    match (kept, item.walk) {
        (false, _) => Fate::Drop,
        (true, Walk::Clean) => Fate::CleanCopy,
        (true, _) if !place.last => Fate::Demote,
        (true, _) if item.budget >= item.len => Fate::Reinsert,
        (true, _) => Fate::Drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LAST: Place = Place {
        last: true,
        to_flash: false,
        flash_has_room: false,
        stays: false,
    };
    const TIER0_OF_TWO: Place = Place {
        last: false,
        to_flash: false,
        flash_has_room: false,
        stays: true,
    };
    const ABOVE_FLASH: Place = Place {
        last: false,
        to_flash: true,
        flash_has_room: false,
        stays: true,
    };

    fn item(walk: Walk, hits: Option<(u8, u8)>) -> ItemFacts {
        ItemFacts {
            walk,
            expired: false,
            hits,
            len: 100,
            mean_len: 1_000,
            has_replica: false,
            budget: 10_000,
        }
    }

    #[test]
    fn the_rules_in_a_table() {
        use Fate::*;
        use Walk::*;
        let small = |walk, hits| ItemFacts {
            len: 200,
            ..item(walk, hits)
        };
        let big = |walk, hits| ItemFacts {
            len: 400,
            ..item(walk, hits)
        };
        // One rule a row: (what, where, the item, its fate).
        #[rustfmt::skip]
        let rows: &[(&str, Place, ItemFacts, Fate)] = &[
            ("no entry", LAST, item(Evict, None), Drop),
            ("expired", LAST, ItemFacts { expired: true, ..item(Evict, Some((3, 3))) }, Drop),
            ("main, unread", LAST, item(Evict, Some((0, 0))), Drop),
            ("main, read", LAST, item(Evict, Some((1, 1))), Reinsert),
            ("main, read, no budget", LAST, ItemFacts { budget: 99, ..item(Evict, Some((1, 1))) }, Drop),
            ("probation, read", LAST, item(Probation, Some((1, 1))), Reinsert),
            ("probation, small unread", LAST, small(Probation, Some((0, 0))), Reinsert),
            ("probation, big unread", LAST, big(Probation, Some((0, 0))), Drop),
            ("probation, no mean yet", LAST, ItemFacts { mean_len: 0, ..small(Probation, Some((0, 0))) }, Drop),
            ("clean, unread", LAST, item(Clean, Some((0, 0))), CleanCopy),
            ("clean, no budget", LAST, ItemFacts { budget: 0, ..item(Clean, Some((0, 0))) }, CleanCopy),
            ("tier 0, read once", TIER0_OF_TWO, item(Probation, Some((1, 1))), Demote),
            ("tier 0, read twice", TIER0_OF_TWO, item(Probation, Some((2, 2))), Stay),
            ("tier 0, read twice, no budget", TIER0_OF_TWO, ItemFacts { budget: 0, ..item(Probation, Some((2, 2))) }, Demote),
            ("tier 0, unread", TIER0_OF_TWO, big(Probation, Some((0, 0))), Drop),
            ("tier 0, recalled (frequency, no read)", TIER0_OF_TWO, big(Probation, Some((1, 0))), Demote),
            ("replica", ABOVE_FLASH, ItemFacts { has_replica: true, ..item(Probation, Some((1, 1))) }, ToReplica),
            ("replica, unread", ABOVE_FLASH, ItemFacts { has_replica: true, ..big(Probation, Some((0, 0))) }, ToReplica),
            ("replica, no entry", ABOVE_FLASH, ItemFacts { has_replica: true, ..item(Probation, None) }, ToReplica),
            ("replica, expired", ABOVE_FLASH, ItemFacts { has_replica: true, expired: true, ..item(Probation, Some((1, 1))) }, Drop),
            ("replica, cleaning", ABOVE_FLASH, ItemFacts { has_replica: true, ..item(Clean, Some((1, 1))) }, CleanCopy),
            ("replica, but it stays", ABOVE_FLASH, ItemFacts { has_replica: true, ..item(Probation, Some((2, 2))) }, Stay),
            ("flash with room, unread", Place { flash_has_room: true, ..ABOVE_FLASH }, big(Probation, Some((0, 0))), Demote),
            ("flash with room, no entry", Place { flash_has_room: true, ..ABOVE_FLASH }, item(Probation, None), Drop),
        ];
        for (name, place, facts, want) in rows {
            assert_eq!(fate(*place, *facts), *want, "{name}");
        }
    }

    #[test]
    fn which_fates_spend_a_hit_and_the_budget() {
        assert!(Fate::Stay.spends_hit(Walk::Probation));
        assert!(Fate::Reinsert.spends_hit(Walk::Evict));
        assert!(
            !Fate::Reinsert.spends_hit(Walk::Probation),
            "a promotion keeps it"
        );
        assert!(!Fate::CleanCopy.spends_hit(Walk::Clean));
        assert!(!Fate::Demote.spends_hit(Walk::Probation));
        assert_eq!(Fate::Reinsert.budget_used(7), 7);
        assert_eq!(Fate::CleanCopy.budget_used(7), 0);
        assert_eq!(copy_budget(4_000, LAST, true), 3_000);
        assert_eq!(copy_budget(4_000, LAST, false), 0, "barred");
        assert_eq!(
            copy_budget(
                4_000,
                Place {
                    stays: false,
                    ..TIER0_OF_TWO
                },
                true
            ),
            0,
            "a tier above the last copies nothing within itself but stays"
        );
    }

    fn places() -> impl Strategy<Value = Place> {
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(last, to_flash, flash_has_room, stays)| Place {
                last,
                to_flash: to_flash && !last,
                flash_has_room: flash_has_room && to_flash && !last,
                stays: stays && !last,
            },
        )
    }

    fn walks() -> impl Strategy<Value = Walk> {
        prop_oneof![Just(Walk::Evict), Just(Walk::Probation)]
    }

    proptest! {
        /// Whatever its items and their hits, one eviction's copies within its tier
        /// take at most its budget: every eviction frees at least the rest.
        #[test]
        fn an_eviction_copies_within_its_budget(
            place in places(),
            walk in walks(),
            allowed in any::<bool>(),
            items in prop::collection::vec(
                (1usize..5_000, prop::option::of((0u8..4, 0u8..4)), any::<bool>()),
                1..200,
            ),
            mean_len in 0usize..5_000,
        ) {
            let segment = items.iter().map(|i| i.0).sum::<usize>();
            let budget = copy_budget(segment, place, allowed);
            let mut left = budget;
            let mut copied = 0;
            for (len, hits, has_replica) in items {
                let f = fate(place, ItemFacts {
                    walk, expired: false, hits, len, mean_len, has_replica, budget: left,
                });
                prop_assert!(left >= f.budget_used(len));
                left -= f.budget_used(len);
                if matches!(f, Fate::Stay | Fate::Reinsert | Fate::CleanCopy) {
                    copied += len;
                }
            }
            prop_assert!(copied <= budget);
            prop_assert!(copied * REINSERT_BUDGET.1 <= segment * REINSERT_BUDGET.0);
        }

        /// An item nobody reads any more leaves the last tier's main queue, or tier 0,
        /// within as many evictions as it has recorded hits plus one: each copy within
        /// the tier spends one.
        #[test]
        fn an_unread_item_is_not_kept_for_ever(
            place in places(),
            frequency in 0u8..=3,
            len in 1usize..5_000,
        ) {
            let walk = if place.last { Walk::Evict } else { Walk::Probation };
            let mut hits = Some((frequency, frequency));
            let mut lives = 0;
            loop {
                let f = fate(place, ItemFacts {
                    walk, expired: false, hits, len, mean_len: 0, has_replica: false,
                    budget: usize::MAX,
                });
                match f {
                    Fate::Stay | Fate::Reinsert => {
                        lives += 1;
                        prop_assert!(f.spends_hit(walk));
                        hits = hits.map(|(f, r)| (f.saturating_sub(1), r.saturating_sub(1)));
                    }
                    // Out of this tier (dropped, demoted or back to flash).
                    _ => break,
                }
                prop_assert!(lives <= frequency, "{lives} lives with {frequency} hits");
            }
        }
    }
}

//! Promotion: an item read often in a lower tier is copied up into tier 0, off the
//! request path. A hit in tier *i > 0* whose index entry had already recorded
//! [`PROMOTE_AFTER_HITS`] hits asks for its promotion — it leaves the key's hash and the
//! item's location in a small queue (one of [`PROMOTION_SHARDS`], chosen by the hash, so
//! that readers on many cores do not meet on one lock), or nothing when the queue is
//! full or another reader holds it (a promotion is a hint, never a wait; counted in
//! `MoverStats::skipped_contended`) — and the movers ([`Cache::maintain`]) copy the
//! queued items into tier 0's copy segments.
//!
//! A promoted item enters tier 0 with a frequency of 1: it is demoted again when its
//! tier-0 segment is evicted (tier 0 is every tiered cache's probation stage) unless it
//! is read again up there (then tier 0 keeps it: `evict.rs`, `STAY_HITS`), and it must
//! record [`PROMOTE_AFTER_HITS`] hits again down there before a hit brings it back up,
//! so an item cannot bounce between the tiers on every read. On where
//! [`CacheConfig::promote`](super::CacheConfig::promote) is set (by default with a flash
//! tier).
//!
//! Out of flash the source stays: a promoted item out of a stored flash segment keeps
//! its flash copy as a replica, which its demotion repoints to instead of writing the
//! item again (`cache/replica.rs`).
//!
//! # Invariants
//! A copy is published exactly as a demotion is (`evict.rs`): written PENDING, then under
//! the key's bucket lock, only if the entry still points at the source and the source is
//! still LIVE, made LIVE, the entry repointed, the source killed (persisted on a durable
//! tier) — else the copy is killed. A writer needs the same lock to replace the key, so
//! between the copy turning LIVE and the source's death being durable nothing newer of
//! the key can exist: a crash there leaves two LIVE copies of the same value, of which
//! restart keeps neither (a miss), never a stale value (the tests race a delete and an
//! overwrite with a promotion at exactly that point, and restart). A reader never waits
//! to ask (`try_lock`). Lock order: `docs/concurrency.md`.

use std::sync::atomic::Ordering;

use super::evict::{Dest, Source};
use super::{Cache, Held};
use crate::error::CacheError;
use crate::index::{Freq, Location};
use crate::mem::SegState;

/// Hits an entry must have recorded before a hit in a lower tier asks for its promotion.
pub(super) const PROMOTE_AFTER_HITS: u8 = 2;

/// Most promotions waiting at once, all shards together (what the movers' rounds copy
/// at most between two looks).
pub(super) const PROMOTION_QUEUE: usize = 1024;

/// The promotion queue's shards (`Cache::promotions`).
pub(super) const PROMOTION_SHARDS: usize = 16;

impl Cache {
    /// Called on a hit in tier `tier` of an entry that had recorded `hits` hits: asks for
    /// the item's promotion if it qualifies (see the module docs). Never blocks.
    pub(super) fn consider_promotion(&self, tier: usize, hits: u8, hash: u64, loc: Location) {
        if !self.promote || tier == 0 || hits < PROMOTE_AFTER_HITS {
            return;
        }
        let shard = &self.promotions[(hash >> 32) as usize % PROMOTION_SHARDS];
        match shard.try_lock() {
            Some(mut queue) if queue.len() < PROMOTION_QUEUE / PROMOTION_SHARDS => {
                queue.push((hash, loc))
            }
            Some(_) => {}
            None => self.skipped_contended(),
        }
    }

    /// Promotes every queued item that is still where it was asked from; returns how many
    /// were promoted. Runs on the movers ([`Cache::maintain`]); several empty the shards
    /// at once, each taking what it finds.
    pub(super) fn run_promotions(&self) -> Result<usize, CacheError> {
        let mut promoted = 0;
        for shard in self.promotions.iter() {
            let queued = std::mem::take(&mut *shard.lock());
            for (hash, loc) in queued {
                if self.promote_one(hash, loc)? {
                    promoted += 1;
                }
            }
        }
        Ok(promoted)
    }

    fn promote_one(&self, hash: u64, loc: Location) -> Result<bool, CacheError> {
        // Cheap checks first: moved, replaced or evicted since the hit asked.
        if !self.index.lookup(hash).any(|h| h.location() == loc) {
            return Ok(false);
        }
        let Some((tier, held)) = self.hold(loc) else {
            return Ok(false);
        };
        let src = match &held {
            Held::Pin(pin) if matches!(pin.state(), SegState::Sealed | SegState::Open) => Some(pin),
            Held::Pin(_) => return Ok(false),
            Held::Copy(_) => None,
        };
        if tier == 0 {
            return Ok(false);
        }
        let Some(item) = held.item_at(loc.offset) else {
            return Ok(false);
        };
        let now = self.now();
        if item.state != crate::item::ItemState::Live || self.item_expired(loc.segment, &item, now)
        {
            return Ok(false);
        }
        let expires_at = self.item_expiry(loc.segment, &item);
        let cas = self.cas_of(loc.segment, &item);
        // A stored flash item stays where it is, as the key's replica (`cache/replica.rs`).
        let replica_seq = match src {
            None => self.replica_seq(loc),
            Some(_) => None,
        };
        let Some((dpin, dloc)) = self.copy_item(0, Dest::Moved, &item, cas, now, expires_at)?
        else {
            return Ok(false);
        };
        #[cfg(test)]
        super::evict::tests::before_publish(item.key);
        let mut g = self.index.lock(hash);
        let source = match (src, replica_seq) {
            (Some(p), _) => Source::Memory(p),
            (None, Some(write_seq)) => Source::KeptOnFlash { hash, write_seq },
            (None, None) => Source::Flash,
        };
        if !self.publish_copy(&mut g, source, loc, (dpin, dloc), Freq::Set(1))? {
            return Ok(false);
        }
        drop(g);
        self.counters.promotions.fetch_add(1, Ordering::Relaxed);
        self.tiers[0]
            .counters
            .promotions_in
            .fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
}

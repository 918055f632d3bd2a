//! Replicas: the flash copy a promotion leaves in place. An item promoted out of a stored
//! flash segment gets a copy in tier 0 and its entry moves there, but its flash copy is
//! not killed: the cache remembers where it is (by the key's hash, with the segment's
//! write sequence). When the tier-0 copy is demoted again, and the replica's segment is
//! still stored, the entry is repointed to the replica instead of writing the item to
//! flash a second time — a promotion then costs one DRAM copy and no flash write, and
//! the flash tier's live share does not fall with every item read often.
//!
//! # Invariants
//! - A replica is of the same version as the key's indexed item (same value, CAS and
//!   expiry): every write, touch or delete of the key kills it (a kill-log record, under
//!   the key's bucket lock, before the caller is answered) and forgets it, as it kills a
//!   set copy (`Cache::kill_flash_copies`).
//! - A replica is recorded, killed and repointed to under the key's bucket lock. The walk
//!   of an evicted segment forgets the replicas in it without the lock: they are gone
//!   with the segment, and a repoint checks the segment first. A shard's mutex is a leaf
//!   of the lock order (`docs/concurrency.md`).
//! - A repoint checks, under the bucket lock, that the replica's slot still holds a
//!   stored segment of the recorded write sequence. A segment eviction marks its slot
//!   (`FlashTier::begin_evict`) before its walk takes the bucket locks of its items, so
//!   an entry repointed before the mark is walked (reinserted or dropped) and none is
//!   repointed after it.
//! - Not persisted: a clean shutdown kills every replica first (a saved index does not
//!   name them, and an unnamed LIVE flash copy could come back after a later crash
//!   older than a write), and so does `flush_all`.
//!
//! # After a crash
//! With a volatile tier 0 the replica is the only copy left: the restart scan indexes
//! it, the version last acknowledged. With a durable tier 0 both copies are LIVE, and a
//! key with two LIVE items gets neither (`cache/recover.rs`): a miss, never a stale
//! value.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::Cache;
use crate::error::CacheError;
use crate::index::{BucketGuard, Freq, Location};
use crate::item::ItemState;
use crate::mem::Pin;

/// Lock shards of the replica map (by hash).
const SHARDS: usize = 64;

/// Where a replica is: its location on flash and the write sequence of its segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Replica {
    loc: Location,
    write_seq: u64,
}

/// The replicas of promoted items, by key hash.
pub(super) struct Replicas {
    shards: Box<[Mutex<HashMap<u64, Replica>>]>,
    /// Replicas held, all shards together (0: the write path skips the lookup).
    len: AtomicUsize,
}

impl Replicas {
    pub(super) fn new() -> Replicas {
        Replicas {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            len: AtomicUsize::new(0),
        }
    }

    /// Replicas held now.
    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    fn shard(&self, hash: u64) -> &Mutex<HashMap<u64, Replica>> {
        // The high bits: the index takes its buckets from the low ones.
        &self.shards[(hash >> 58) as usize % SHARDS]
    }

    fn insert(&self, hash: u64, replica: Replica) {
        if self.shard(hash).lock().insert(hash, replica).is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn take(&self, hash: u64) -> Option<Replica> {
        if self.len() == 0 {
            return None;
        }
        let taken = self.shard(hash).lock().remove(&hash);
        if taken.is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        taken
    }

    fn get(&self, hash: u64) -> Option<Replica> {
        if self.len() == 0 {
            return None;
        }
        self.shard(hash).lock().get(&hash).copied()
    }

    /// Forgets the replica of `hash` if it is the one at `loc` (its segment is being
    /// evicted: the copy goes with it).
    fn forget_at(&self, hash: u64, loc: Location) {
        if self.len() == 0 {
            return;
        }
        let mut shard = self.shard(hash).lock();
        if shard.get(&hash).is_some_and(|r| r.loc == loc) {
            shard.remove(&hash);
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn drain(&self) -> Vec<Replica> {
        let mut all = Vec::new();
        for shard in self.shards.iter() {
            let mut s = shard.lock();
            self.len.fetch_sub(s.len(), Ordering::Relaxed);
            all.extend(s.drain().map(|(_, r)| r));
        }
        all
    }
}

impl Cache {
    /// The write sequence a replica left at flash location `loc` would carry: `Some`
    /// when the item's segment is stored (not in a buffer or being evicted).
    pub(super) fn replica_seq(&self, loc: Location) -> Option<u64> {
        let (f, slot) = self.flash_slot(loc.segment)?;
        f.stored_write_seq(slot)
    }

    /// Records the flash item at `loc` (segment of write sequence `write_seq`) as the
    /// replica of the key of `hash`, whose entry a promotion has just moved to tier 0
    /// (`Cache::publish_copy` with `Source::KeptOnFlash`); the caller holds the key's
    /// bucket lock.
    pub(super) fn keep_replica(&self, hash: u64, loc: Location, write_seq: u64) {
        self.replicas.insert(hash, Replica { loc, write_seq });
    }

    /// Whether the key of `hash` has a replica whose segment is still stored (checked
    /// again under the bucket lock by [`demote_to_replica`](Self::demote_to_replica)).
    pub(super) fn has_replica(&self, hash: u64) -> bool {
        self.replicas
            .get(hash)
            .is_some_and(|r| self.replica_seq(r.loc) == Some(r.write_seq))
    }

    /// Demotes the item at `loc` (LIVE in `src`, a memory tier) by repointing its entry
    /// to its replica, if the replica's segment is still stored; the item at `loc` is
    /// killed. The replica is forgotten either way. The caller holds the key's bucket lock.
    pub(super) fn demote_to_replica(
        &self,
        g: &mut BucketGuard<'_>,
        hash: u64,
        src: &Pin<'_>,
        loc: Location,
        frequency: Freq,
    ) -> Result<bool, CacheError> {
        let Some(replica) = self.replicas.take(hash) else {
            return Ok(false);
        };
        let present = g.candidates().any(|l| l == loc);
        let live = src.item_state(loc.offset) == Some(ItemState::Live);
        if !(present && live && self.replica_seq(replica.loc) == Some(replica.write_seq)) {
            // The replica is of this version still, or gone with its segment: kill what
            // may be left of it, so that no forgotten copy outlives a later write.
            self.kill_replica(replica)?;
            return Ok(false);
        }
        g.repoint(loc, replica.loc, frequency);
        self.kill(src, loc)?;
        if let Some(f) = &self.flash {
            f.counters.replica_demotions.fetch_add(1, Ordering::Relaxed);
        }
        Ok(true)
    }

    /// Kills and forgets the replica of the key of `hash`, if it has one; the caller
    /// holds the key's bucket lock and has just written, touched or deleted the key.
    pub(super) fn kill_replica_of(&self, hash: u64) -> Result<(), CacheError> {
        match self.replicas.take(hash) {
            Some(r) => self.kill_replica(r),
            None => Ok(()),
        }
    }

    fn kill_replica(&self, r: Replica) -> Result<(), CacheError> {
        if let Some((f, slot)) = self.flash_slot(r.loc.segment) {
            f.kill_replica(slot, r.loc.offset, r.write_seq)?;
        }
        Ok(())
    }

    /// Forgets the replica of the key of `hash` if it is the item at `loc`, whose segment
    /// is being evicted (its walk found the item unindexed).
    pub(super) fn forget_replica_at(&self, hash: u64, loc: Location) {
        self.replicas.forget_at(hash, loc);
    }

    /// Kills every replica (a clean shutdown, `flush_all`).
    pub(super) fn kill_all_replicas(&self) -> Result<(), CacheError> {
        let mut first_error = None;
        for r in self.replicas.drain() {
            if let Err(e) = self.kill_replica(r) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

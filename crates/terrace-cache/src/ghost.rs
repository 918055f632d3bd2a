//! The ghost filter: fingerprints of keys a probation stage recently dropped (S3-FIFO's
//! ghost queue, in a fixed array). When the evictor drops a key from the single tier's
//! small queue, or from tier 0 of several, without reinserting or demoting it, it
//! remembers the key's hash here; when a key that is not in the cache is stored and the
//! filter recalls it, its index entry is marked [`RECALLED`](crate::index::RECALLED): its
//! probation stage keeps it as if it had been read once (a key that comes back soon after
//! being dropped is worth keeping) and passes it on with no hit, as S3-FIFO inserts such
//! a key into its main queue with a frequency of 0.
//!
//! It is direct-mapped: one 8-bit fingerprint per slot, a newer key overwriting an older
//! one in its slot, so it remembers roughly the last `len` drops and costs one byte per
//! slot, counted with the index in [`Stats::index_bytes_per_item`](crate::Stats). A false
//! recall (a new key whose slot holds the same fingerprint, at most 1 in 255) only gives
//! that key one extra eviction pass; a forgotten key is only treated as new. Lock-free:
//! relaxed loads and stores of independent slots, nothing else depends on them.

use std::sync::atomic::{AtomicU8, Ordering};

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Ghost {
    slots: Box<[AtomicU8]>,
}

impl Ghost {
    /// A filter of `len` slots; 0 makes one that remembers nothing.
    pub fn new(len: usize) -> Ghost {
        Ghost {
            slots: (0..len).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    /// The slot and fingerprint of a key hash (fingerprints are never 0, the empty slot).
    fn place(&self, hash: u64) -> Option<(&AtomicU8, u8)> {
        let n = self.slots.len() as u64;
        let slot = ((hash >> 16) as u32 as u64 * n) >> 32;
        let fingerprint = ((hash >> 56) as u8).max(1);
        Some((self.slots.get(slot as usize)?, fingerprint))
    }

    /// Remembers that the key with this hash was dropped.
    pub fn remember(&self, hash: u64) {
        if let Some((slot, fp)) = self.place(hash) {
            slot.store(fp, Ordering::Relaxed);
        }
    }

    /// Whether the key with this hash was dropped recently (as far as the filter knows).
    pub fn recalls(&self, hash: u64) -> bool {
        self.place(hash)
            .is_some_and(|(slot, fp)| slot.load(Ordering::Relaxed) == fp)
    }

    /// Bytes of DRAM the filter occupies.
    pub fn memory_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<AtomicU8>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_and_forgets_by_overwriting() {
        let g = Ghost::new(1024);
        let h = 0x1234_5678_9abc_def0u64;
        assert!(!g.recalls(h));
        g.remember(h);
        assert!(g.recalls(h));
        // Another key of the same slot (same bits 16..48) with another fingerprint
        // replaces it.
        let other = h ^ (1 << 60);
        g.remember(other);
        assert!(g.recalls(other));
        assert!(!g.recalls(h));
        assert_eq!(g.memory_bytes(), 1024);
        let none = Ghost::new(0);
        none.remember(h);
        assert!(!none.recalls(h));
    }
}

//! [`CachedBlocks`]: which blocks of one volume may have a clean copy in the cache the
//! volumes share — one bit per block (32 KiB per GiB of volume).
//!
//! The cache is keyed `volume id | block` and evicts on its own, so it cannot say how
//! much of one volume it holds. These bits can: the volume sets a block's bit before it
//! puts the block in the cache and clears it when it deletes the block, both under the
//! block's shard lock; an eviction leaves the bit set until a count finds the copy gone.
//!
//! Invariants:
//! - C1: every block with a copy in the cache has its bit set (the bits are a superset),
//!   so a clear bit lets a write skip deleting the block's copy.
//! - C2: a bit is changed only under its block's shard lock (the volume's V1), so a count
//!   that looks a block up and clears its bit under that lock never clears the bit of a
//!   copy put there meanwhile.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

/// One bit per block; grows with the volume.
pub(crate) struct CachedBlocks {
    words: RwLock<Vec<AtomicU64>>,
}

fn words_for(blocks: u64) -> usize {
    blocks.div_ceil(64) as usize
}

impl CachedBlocks {
    /// `blocks` blocks, every bit `set` (a cache that may hold copies from an earlier
    /// run) or clear.
    pub(crate) fn new(blocks: u64, set: bool) -> CachedBlocks {
        let fill = if set { u64::MAX } else { 0 };
        let mut words: Vec<AtomicU64> = (0..words_for(blocks))
            .map(|_| AtomicU64::new(fill))
            .collect();
        if set && !blocks.is_multiple_of(64) {
            // No bits past the last block: a count visits only real blocks.
            if let Some(last) = words.last_mut() {
                *last.get_mut() = (1u64 << (blocks % 64)) - 1;
            }
        }
        CachedBlocks {
            words: RwLock::new(words),
        }
    }

    /// Room for `blocks` blocks; the new ones clear.
    pub(crate) fn grow(&self, blocks: u64) {
        let mut words = self.words.write();
        let want = words_for(blocks);
        while words.len() < want {
            words.push(AtomicU64::new(0));
        }
    }

    pub(crate) fn mark(&self, block: u64) {
        if let Some(word) = self.words.read().get((block / 64) as usize) {
            word.fetch_or(1 << (block % 64), Ordering::Relaxed);
        }
    }

    pub(crate) fn unmark(&self, block: u64) {
        if let Some(word) = self.words.read().get((block / 64) as usize) {
            word.fetch_and(!(1 << (block % 64)), Ordering::Relaxed);
        }
    }

    /// Whether `block` may have a copy in the cache (C1: false means it has none).
    pub(crate) fn may_hold(&self, block: u64) -> bool {
        self.words
            .read()
            .get((block / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (block % 64)) != 0)
    }

    /// The blocks whose bits are set now, in order.
    pub(crate) fn marked(&self) -> Vec<u64> {
        let words = self.words.read();
        let mut blocks = Vec::new();
        for (i, word) in words.iter().enumerate() {
            let mut bits = word.load(Ordering::Relaxed);
            while bits != 0 {
                blocks.push(i as u64 * 64 + u64::from(bits.trailing_zeros()));
                bits &= bits - 1;
            }
        }
        blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bits_follow_marks_and_grow() {
        let bits = CachedBlocks::new(100, false);
        assert!(bits.marked().is_empty());
        bits.mark(3);
        bits.mark(99);
        bits.mark(500); // past the end: ignored
        assert_eq!(bits.marked(), vec![3, 99]);
        assert!(bits.may_hold(3) && !bits.may_hold(4));
        bits.unmark(3);
        assert_eq!(bits.marked(), vec![99]);
        bits.grow(600);
        bits.mark(500);
        assert_eq!(bits.marked(), vec![99, 500]);
    }

    #[test]
    fn all_set_covers_exactly_the_blocks() {
        assert_eq!(
            CachedBlocks::new(70, true).marked(),
            (0..70).collect::<Vec<_>>()
        );
        assert_eq!(CachedBlocks::new(128, true).marked().len(), 128);
    }
}

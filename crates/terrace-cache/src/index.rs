//! The DRAM index: a fixed-size table of packed 64-bit entries mapping a key's hash to
//! the candidate locations (segment, offset) of items whose tag matches. Design and
//! contract in `docs/cache-format.md` ("Index"); in short:
//!
//! - **Layout.** `buckets` buckets of [`SLOTS`] `AtomicU64` slots (two cache lines, an
//!   aligned pair the hardware fetches together); a key may live in either of two
//!   buckets derived from its hash (two-choice hashing). An entry
//!   packs `tag | segment | offset | frequency` ([`Layout`]); a slot is occupied iff its
//!   tag field is non-zero (tags are never zero), so stray frequency bits in an empty slot
//!   leave it empty.
//! - **Readers** ([`Index::lookup`]) load slots with `Acquire` and never lock, retry or
//!   block. A hit records itself with one `fetch_or` of the frequency bits
//!   ([`Candidate::touch`]), skipped once saturated so hot keys do not keep dirtying the
//!   line.
//! - **Writers** lock the key's two buckets, lower index first (`docs/concurrency.md`),
//!   and change single slots with single stores: an entry never moves between slots, so
//!   every value a reader loads is a whole entry that some writer stored, for a key with
//!   that tag.
//! - **Bounded.** The bucket count is fixed at construction from the expected item count
//!   and load factor; when both of a key's buckets are full, [`BucketGuard::insert`]
//!   fails with [`Full`] and the caller evicts one of the occupants (policy in
//!   `docs/cache-format.md`, "When full"). The table never grows.
//! - **Key verification is the caller's job**: lookups return locations whose tag matches;
//!   the caller reads the item there and compares keys.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::mem::AtomicTable;

use crate::error::IndexError;

/// Slots per bucket: two 64-byte cache lines of `u64`s. Sixteen rather than eight because
/// a cache's index is never just filled, it churns (every insert follows an eviction),
/// and at the default load sixteen slots refuse ([`Full`]) a few hundred times fewer
/// inserts than eight (`docs/experiments.md`). Lookups read two buckets either way.
pub const SLOTS: usize = 16;
/// Low bits of an entry holding the access frequency as a thermometer code
/// (`0b000, 0b001, 0b011, 0b111` = 0..=3 hits), so a hit can raise it with `fetch_or`.
/// One more code, [`RECALLED`], marks a new item whose key the ghost filter recalled.
pub const FREQ_BITS: u32 = 3;
/// The frequency code of a new item admitted on the ghost filter's word and not read since
/// (`crate::ghost`): where it stands it counts as one hit (the frequency is the number of
/// bits set), so its probation stage keeps it; once moved (passed on by that stage) or
/// replaced it counts as none, so it is passed on with no hit recorded — as S3-FIFO inserts
/// a key its ghost queue recalls straight into the main queue with a frequency of 0,
/// instead of granting it a hit it never had (which would buy it a whole extra pass of the
/// main queue unread). A hit raises it like any other code: `0b101` counts two where it
/// stands and one once moved ([`Candidate::reads`]); a second hit makes it `0b111`, three,
/// like any item read three times. A saved index keeps the mark as one hit.
pub const RECALLED: u64 = 0b100;
/// Highest frequency the entry can record.
pub const MAX_FREQ: u8 = 3;
/// Fewest tag bits a layout may leave (more is better: false candidates per lookup are
/// about `2 * SLOTS * load / 2^tag_bits`).
pub const MIN_TAG_BITS: u32 = 8;
/// Default fraction of slots expected to be occupied at the configured item count: at
/// 0.8 a churning table refuses about one insert in 20,000 (see [`SLOTS`]).
pub const DEFAULT_LOAD: f64 = 0.8;

const FREQ_MASK: u64 = (1 << FREQ_BITS) - 1;

/// Where an item lives: a segment id (unique across all tiers; the engine maps it to a
/// tier and slot) and the byte offset of the item's state byte in that segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Location {
    pub segment: u32,
    pub offset: u32,
}

/// How entries are packed, from the most significant bit down:
/// `tag (tag_bits) | segment (segment_bits) | offset (offset_bits) | frequency (3)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub tag_bits: u32,
    pub segment_bits: u32,
    pub offset_bits: u32,
}

impl Layout {
    /// The layout for `segments` segment ids and offsets below `1 << segment_shift`.
    pub fn new(segments: u32, segment_shift: u8) -> Result<Layout, IndexError> {
        if segments == 0 {
            return Err(IndexError::BadSize {
                why: "zero segments",
            });
        }
        let segment_bits = (32 - (segments - 1).leading_zeros()).max(1);
        let offset_bits = u32::from(segment_shift);
        let used = segment_bits + offset_bits + FREQ_BITS;
        if used + MIN_TAG_BITS > 64 {
            return Err(IndexError::LayoutTooWide {
                segment_bits,
                offset_bits,
                min_tag: MIN_TAG_BITS,
            });
        }
        Ok(Layout {
            tag_bits: 64 - used,
            segment_bits,
            offset_bits,
        })
    }

    fn tag_shift(&self) -> u32 {
        64 - self.tag_bits
    }

    /// The tag of a hash: its top `tag_bits` bits, with 0 mapped to 1 (0 means "empty").
    pub fn tag_of_hash(&self, hash: u64) -> u64 {
        (hash >> self.tag_shift()).max(1)
    }

    fn tag_of_entry(&self, entry: u64) -> u64 {
        entry >> self.tag_shift()
    }

    /// Whether `loc` is representable in this layout.
    pub fn fits(&self, loc: Location) -> bool {
        u64::from(loc.segment) < (1u64 << self.segment_bits)
            && u64::from(loc.offset) < (1u64 << self.offset_bits)
    }

    fn pack(&self, tag: u64, loc: Location) -> u64 {
        debug_assert!(self.fits(loc));
        (tag << self.tag_shift())
            | (u64::from(loc.segment) << (FREQ_BITS + self.offset_bits))
            | (u64::from(loc.offset) << FREQ_BITS)
    }

    fn location(&self, entry: u64) -> Location {
        let offset_mask = (1u64 << self.offset_bits) - 1;
        let segment_mask = (1u64 << self.segment_bits) - 1;
        Location {
            segment: ((entry >> (FREQ_BITS + self.offset_bits)) & segment_mask) as u32,
            offset: ((entry >> FREQ_BITS) & offset_mask) as u32,
        }
    }
}

fn freq_count(entry: u64) -> u8 {
    (entry & FREQ_MASK).count_ones() as u8
}

/// The hits an entry carries when it moves: its frequency without the one a
/// [`RECALLED`] mark counts (`0b100` is no hit, `0b101` one; `0b111` stays three).
fn reads_count(entry: u64) -> u8 {
    match entry & FREQ_MASK {
        RECALLED => 0,
        code if code == RECALLED | 1 => 1,
        code => code.count_ones() as u8,
    }
}

fn freq_code(count: u8) -> u64 {
    (1u64 << count.min(MAX_FREQ)) - 1
}

/// How to build an index.
#[derive(Clone, Copy, Debug)]
pub struct IndexConfig {
    /// Items the cache is expected to hold at most (from capacity / smallest typical item).
    pub items: usize,
    /// Fraction of slots occupied at `items` (0.1..=0.95; default [`DEFAULT_LOAD`]).
    pub load: f64,
    /// Segment ids are below this.
    pub segments: u32,
    /// Offsets are below `1 << segment_shift` (the segment size).
    pub segment_shift: u8,
    /// Seed of the key hash. Persist it with a saved index: a different seed maps keys
    /// elsewhere.
    pub seed: u64,
}

impl IndexConfig {
    pub fn new(items: usize, segments: u32, segment_shift: u8) -> IndexConfig {
        IndexConfig {
            items,
            load: DEFAULT_LOAD,
            segments,
            segment_shift,
            seed: 0,
        }
    }
}

/// One bucket: [`SLOTS`] slots, 128-byte aligned (the table is 2 MiB aligned).
type Bucket = [AtomicU64; SLOTS];

/// The DRAM index. See the module docs for its invariants.
pub struct Index {
    /// `bucket_count * SLOTS` slots, bucket after bucket.
    table: AtomicTable,
    /// One writer lock per bucket (a byte each); readers never take them.
    locks: Box<[Mutex<()>]>,
    layout: Layout,
    seed: u64,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("buckets", &self.bucket_count())
            .field("layout", &self.layout)
            .finish()
    }
}

/// Both possible buckets of a hash (equal only when there is a single bucket).
fn bucket_pair(hash: u64, n: usize) -> (usize, usize) {
    let range = |x: u32| ((u64::from(x) * n as u64) >> 32) as usize;
    let b1 = range(hash as u32);
    let mixed = hash.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29);
    let mut b2 = range(mixed as u32);
    if b2 == b1 && n > 1 {
        b2 = if b1 + 1 == n { 0 } else { b1 + 1 };
    }
    (b1, b2)
}

impl Index {
    /// Builds an empty index sized for `config.items` at `config.load`.
    pub fn new(config: &IndexConfig) -> Result<Index, IndexError> {
        let layout = Layout::new(config.segments, config.segment_shift)?;
        if config.items == 0 {
            return Err(IndexError::BadSize { why: "zero items" });
        }
        if !(0.1..=0.95).contains(&config.load) {
            return Err(IndexError::BadSize {
                why: "load factor outside 0.1..=0.95",
            });
        }
        let slots = (config.items as f64 / config.load).ceil();
        let buckets = ((slots / SLOTS as f64).ceil() as usize).max(1);
        if buckets > u32::MAX as usize {
            return Err(IndexError::BadSize {
                why: "more than 2^32 buckets",
            });
        }
        let table = AtomicTable::new(buckets * SLOTS).map_err(|e| IndexError::Memory {
            bytes: buckets * SLOTS * 8,
            reason: e.to_string(),
        })?;
        Ok(Index {
            table,
            locks: (0..buckets).map(|_| Mutex::new(())).collect(),
            layout,
            seed: config.seed,
        })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    fn buckets(&self) -> &[Bucket] {
        self.table.as_slice().as_chunks::<SLOTS>().0
    }

    fn buckets_mut(&mut self) -> &mut [Bucket] {
        self.table.as_mut_slice().as_chunks_mut::<SLOTS>().0
    }

    pub fn bucket_count(&self) -> usize {
        self.buckets().len()
    }

    /// Total slots (the most entries the index can ever hold).
    pub fn slot_count(&self) -> usize {
        self.buckets().len() * SLOTS
    }

    /// Bytes of DRAM the index occupies (buckets and locks), for metadata statistics.
    pub fn memory_bytes(&self) -> usize {
        self.buckets().len() * (std::mem::size_of::<Bucket>() + std::mem::size_of::<Mutex<()>>())
    }

    /// The hash the index uses for `key` (XXH3-64 with the configured seed).
    pub fn hash_key(&self, key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64_with_seed(key, self.seed)
    }

    /// Lock-free, wait-free lookup: the occupied entries of the hash's two buckets whose
    /// tag matches, home bucket first. Candidates only: the caller verifies the key.
    pub fn lookup(&self, hash: u64) -> Lookup<'_> {
        let (b1, b2) = bucket_pair(hash, self.buckets().len());
        Lookup {
            index: self,
            tag: self.layout.tag_of_hash(hash),
            buckets: [b1, b2],
            bucket: 0,
            slot: 0,
        }
    }

    /// Hints the CPU to fetch the lines a [`lock`](Self::lock) and insert of `hash` will
    /// touch (both buckets and their locks): for loops over many keys, a few keys ahead.
    pub fn prefetch(&self, hash: u64) {
        let (b1, b2) = bucket_pair(hash, self.buckets().len());
        for b in [b1, b2] {
            terrace_media::os::prefetch(self.buckets()[b].as_ptr().cast());
            terrace_media::os::prefetch((&self.locks[b] as *const Mutex<()>).cast());
        }
    }

    /// Locks the hash's two buckets for writing (lower index first).
    pub fn lock(&self, hash: u64) -> BucketGuard<'_> {
        let (b1, b2) = bucket_pair(hash, self.buckets().len());
        let (lo, hi) = (b1.min(b2), b1.max(b2));
        let first = self.locks[lo].lock();
        let second = (hi != lo).then(|| self.locks[hi].lock());
        BucketGuard {
            index: self,
            tag: self.layout.tag_of_hash(hash),
            buckets: [b1, b2],
            _locks: (first, second),
        }
    }

    /// The two buckets `hash` may live in (equal when the table has one bucket).
    pub fn buckets_of(&self, hash: u64) -> (usize, usize) {
        bucket_pair(hash, self.buckets().len())
    }

    /// The locations of bucket `bucket`'s occupied entries (a restart's search for room,
    /// with [`relocate_before_sharing`](Self::relocate_before_sharing)).
    pub fn bucket_locations(&self, bucket: usize) -> Vec<Location> {
        self.bucket_entries(bucket)
            .into_iter()
            .map(|(loc, _)| loc)
            .collect()
    }

    /// The occupied entries of bucket `bucket`, with their tags (the search for the index
    /// entries of one flash set's items, `cache/sets.rs`). Loaded without the lock: the
    /// caller checks each against its item under the key's lock.
    pub fn bucket_entries(&self, bucket: usize) -> Vec<(Location, u64)> {
        let layout = self.layout;
        self.buckets().get(bucket).map_or_else(Vec::new, |b| {
            b.iter()
                .map(|s| s.load(Ordering::Acquire))
                .filter(|&e| layout.tag_of_entry(e) != 0)
                .map(|e| (layout.location(e), layout.tag_of_entry(e)))
                .collect()
        })
    }

    /// Whether bucket `bucket` has a free slot.
    pub fn bucket_has_room(&self, bucket: usize) -> bool {
        self.free_slot(bucket).is_some()
    }

    /// The first free slot of bucket `bucket`, if any.
    fn free_slot(&self, bucket: usize) -> Option<usize> {
        let layout = self.layout;
        self.buckets()
            .get(bucket)?
            .iter()
            .position(|s| layout.tag_of_entry(s.load(Ordering::Relaxed)) == 0)
    }

    /// Moves the entry for `hash` at `loc` to a free slot of its other bucket, if that one
    /// has room; returns whether it moved. Moving an entry between slots is what readers
    /// never expect (see the module docs), so this takes `&mut self`: only a restart,
    /// rebuilding the index before it is shared, calls it — to make room for an item
    /// whose two buckets the rebuild's order happened to fill (cuckoo hashing's one step).
    pub fn relocate_before_sharing(&mut self, hash: u64, loc: Location) -> bool {
        let layout = self.layout;
        if !layout.fits(loc) {
            return false;
        }
        let (b1, b2) = bucket_pair(hash, self.buckets().len());
        if b1 == b2 {
            return false;
        }
        let entry_of = |s: &AtomicU64| s.load(Ordering::Relaxed);
        let want = layout.pack(layout.tag_of_hash(hash), loc);
        let holds = |b: usize| {
            self.buckets()[b]
                .iter()
                .position(|s| entry_of(s) & !FREQ_MASK == want)
        };
        let (from, at, to) = match (holds(b1), holds(b2)) {
            (Some(at), _) => (b1, at, b2),
            (None, Some(at)) => (b2, at, b1),
            (None, None) => return false,
        };
        let Some(free) = self.free_slot(to) else {
            return false;
        };
        let entry = entry_of(&self.buckets()[from][at]);
        self.buckets()[to][free].store(entry, Ordering::Relaxed);
        self.buckets()[from][at].store(0, Ordering::Relaxed);
        true
    }

    /// Repoints the entry for `hash` at `expected` to `new`, its frequency as `freq` says,
    /// only if it still points at `expected` ([`BucketGuard::repoint`] under a lock taken
    /// for this call alone).
    pub fn repoint(&self, hash: u64, expected: Location, new: Location, freq: Freq) -> bool {
        self.lock(hash).repoint(expected, new, freq)
    }

    /// Removes the entry for `hash` at `loc` if it is still there.
    pub fn remove(&self, hash: u64, loc: Location) -> bool {
        self.lock(hash).remove(loc)
    }

    /// Visits every occupied entry of buckets `range`, one bucket at a time under that
    /// bucket's lock, applying the visitor's [`Sweep`] decision. Used by whole-table passes
    /// (dropping a tier, frequency decay, saving the index); the per-segment eviction pass
    /// instead walks the segment's items and calls [`Index::remove`] for each. Cost:
    /// O(buckets in `range`).
    pub fn sweep(
        &self,
        range: std::ops::Range<usize>,
        mut visit: impl FnMut(Location, u8) -> Sweep,
    ) {
        let end = range.end.min(self.buckets().len());
        for b in range.start.min(end)..end {
            let _lock = self.locks[b].lock();
            for slot in &self.buckets()[b] {
                let entry = slot.load(Ordering::Acquire);
                if self.layout.tag_of_entry(entry) == 0 {
                    continue;
                }
                match visit(self.layout.location(entry), freq_count(entry)) {
                    Sweep::Keep => {}
                    Sweep::Remove => slot.store(0, Ordering::Release),
                    Sweep::SetFrequency(count) => {
                        slot.store((entry & !FREQ_MASK) | freq_code(count), Ordering::Release)
                    }
                }
            }
        }
    }

    /// Calls `f` with the location of every occupied entry, in a lock-free pass over the
    /// table (O(slots); for statistics, not hot paths: entries changing meanwhile may be
    /// seen or not).
    pub fn for_each_location(&self, mut f: impl FnMut(Location)) {
        for s in self.buckets().iter().flat_map(|b| b.iter()) {
            let entry = s.load(Ordering::Relaxed);
            if self.layout.tag_of_entry(entry) != 0 {
                f(self.layout.location(entry));
            }
        }
    }

    /// Occupied entries, counted by a lock-free pass over the table (O(slots); for tests
    /// and statistics, not hot paths).
    pub fn count(&self) -> usize {
        self.buckets()
            .iter()
            .flat_map(|b| b.iter())
            .filter(|s| self.layout.tag_of_entry(s.load(Ordering::Relaxed)) != 0)
            .count()
    }
}

/// The raw table, for the saved index of a clean shutdown (`crate::cache::saved`): the
/// entries of all buckets in order, [`SLOTS`] per bucket, as little-endian `u64`s, cut
/// into chunks of whole buckets.
impl Index {
    /// The seed of the key hash (a saved table is usable only under the same seed).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Bytes of the raw table.
    pub fn table_bytes(&self) -> usize {
        self.buckets().len() * SLOTS * 8
    }

    /// Chunk `chunk` of `chunk_bytes` (a multiple of a bucket's bytes) of the raw table,
    /// into `out` (replacing its contents; the last chunk may be shorter). A lock-free
    /// read: call it when nothing writes (a shutdown).
    pub fn export_chunk(&self, chunk: usize, chunk_bytes: usize, out: &mut Vec<u8>) {
        let per_chunk = (chunk_bytes / (SLOTS * 8)).max(1);
        out.clear();
        let first = chunk.saturating_mul(per_chunk).min(self.buckets().len());
        let end = first.saturating_add(per_chunk).min(self.buckets().len());
        for bucket in &self.buckets()[first..end] {
            for slot in bucket {
                out.extend_from_slice(&slot.load(Ordering::Acquire).to_le_bytes());
            }
        }
    }

    /// Fills the whole table, chunk by chunk of `chunk_bytes` (a multiple of a bucket's
    /// bytes) on all cores: `fill(chunk, slots)` sets the chunk's occupied slots (all are
    /// empty before) and returns how many, or `None` if the chunk is not sound. Returns
    /// the entries loaded, or `None` (with the table left empty) if any chunk failed.
    /// Under `&mut self`: before the index is shared.
    pub fn import_chunks(
        &mut self,
        chunk_bytes: usize,
        fill: impl Fn(usize, &mut ChunkSlots<'_>) -> Option<usize> + Sync,
    ) -> Option<usize> {
        let per_chunk = (chunk_bytes / (SLOTS * 8)).max(1);
        let chunks: Vec<(usize, &mut [Bucket])> = self
            .buckets_mut()
            .chunks_mut(per_chunk)
            .enumerate()
            .collect();
        let counts =
            crate::parallel::map_parts_on(crate::parallel::fault_workers(), chunks, |part| {
                let mut entries = 0usize;
                for (c, buckets) in part {
                    entries += fill(c, &mut ChunkSlots { buckets })?;
                }
                Some(entries)
            });
        let loaded = counts.into_iter().sum::<Option<usize>>();
        if loaded.is_none() {
            for slot in self.buckets_mut().iter_mut().flat_map(|b| b.iter_mut()) {
                *slot.get_mut() = 0;
            }
        }
        loaded
    }
}

impl Layout {
    /// The location and frequency of a raw entry; `None` for an empty slot.
    pub fn decode_entry(&self, entry: u64) -> Option<(Location, u8)> {
        (self.tag_of_entry(entry) != 0).then(|| (self.location(entry), freq_count(entry)))
    }
}

/// What a [`Index::sweep`] visitor decides for one entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sweep {
    Keep,
    Remove,
    SetFrequency(u8),
}

/// Iterator of a lookup's candidates.
#[derive(Debug)]
pub struct Lookup<'a> {
    index: &'a Index,
    tag: u64,
    buckets: [usize; 2],
    bucket: usize,
    slot: usize,
}

impl<'a> Iterator for Lookup<'a> {
    type Item = Candidate<'a>;

    fn next(&mut self) -> Option<Candidate<'a>> {
        loop {
            if self.slot == SLOTS {
                self.slot = 0;
                self.bucket += 1;
                if self.bucket == 1 && self.buckets[1] == self.buckets[0] {
                    self.bucket = 2;
                }
            }
            let b = *self.buckets.get(self.bucket)?;
            let slot = &self.index.buckets()[b][self.slot];
            self.slot += 1;
            let entry = slot.load(Ordering::Acquire);
            if self.index.layout.tag_of_entry(entry) == self.tag {
                return Some(Candidate {
                    slot,
                    entry,
                    layout: self.index.layout,
                });
            }
        }
    }
}

/// A candidate found by a lookup: the entry as loaded, and its slot for
/// [`Candidate::touch`]. Its key is unverified until the caller compares it.
#[derive(Clone, Copy, Debug)]
pub struct Candidate<'a> {
    slot: &'a AtomicU64,
    entry: u64,
    layout: Layout,
}

impl Candidate<'_> {
    pub fn location(&self) -> Location {
        self.layout.location(self.entry)
    }

    /// Whether the slot still holds this entry (frequency bits aside). The engine calls it
    /// after pinning the entry's segment: if it holds, the entry was current after the pin
    /// was taken, so the segment cannot have been freed and reused under it.
    pub fn is_current(&self) -> bool {
        self.slot.load(Ordering::SeqCst) & !FREQ_MASK == self.entry & !FREQ_MASK
    }

    /// Hits recorded when the entry was loaded (0..=3; [`RECALLED`] counts as one).
    pub fn frequency(&self) -> u8 {
        freq_count(self.entry)
    }

    /// Whether the entry, when loaded, was a recalled new item nobody had read yet
    /// ([`RECALLED`]).
    pub fn recalled_without_hit(&self) -> bool {
        self.entry & FREQ_MASK == RECALLED
    }

    /// Hits recorded by reads (and overwrites) when the entry was loaded: the frequency
    /// without the one a [`RECALLED`] mark counts. What the item carries if it moves.
    pub fn reads(&self) -> u8 {
        reads_count(self.entry)
    }

    /// Records a hit: one `fetch_or` raising the frequency by one, none when it is already
    /// at [`MAX_FREQ`]. Lock-free. If a writer changed the slot since the lookup, the bit
    /// lands on whatever is there now (an occupant's frequency, or an empty slot's ignored
    /// bits): noise in a heuristic, never a change of tag or location.
    pub fn touch(&self) {
        let code = self.entry & FREQ_MASK;
        let raised = ((code << 1) | 1) & FREQ_MASK;
        if raised != code {
            self.slot.fetch_or(raised, Ordering::Relaxed);
        }
    }
}

/// Returned by [`BucketGuard::insert`] when both of the key's buckets are full.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("both index buckets of the key are full")]
pub struct Full;

/// What a repointed entry's frequency becomes ([`BucketGuard::repoint`]), from the hits
/// it carried ([`Candidate::reads`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Freq {
    /// 0: a new item replaced the old one, and starts unread.
    Reset,
    /// One more: a new item replaced the old one, and an overwrite counts as an access
    /// of the key (a key overwritten often stays hot).
    Bump,
    /// Unchanged: the same item moved (a demotion, a promotion out of probation, a
    /// cleaning).
    Keep,
    /// One less: the same item moved and spent one recorded hit (a reinsertion's second
    /// chance, a stay in tier 0).
    Spend,
    /// Exactly this count (saturating at [`MAX_FREQ`]): the same item moved to a tier
    /// where it starts over (a promotion).
    Set(u8),
}

impl Freq {
    fn apply(self, reads: u8) -> u8 {
        match self {
            Freq::Reset => 0,
            Freq::Bump => reads.saturating_add(1),
            Freq::Keep => reads,
            Freq::Spend => reads.saturating_sub(1),
            Freq::Set(count) => count,
        }
    }
}

/// Exclusive write access to one key's two buckets. Everything a writer must do
/// atomically with respect to other writers of the key (verify the key at the candidates,
/// flip item states, publish) happens while holding it.
pub struct BucketGuard<'a> {
    index: &'a Index,
    tag: u64,
    buckets: [usize; 2],
    _locks: (MutexGuard<'a, ()>, Option<MutexGuard<'a, ()>>),
}

impl std::fmt::Debug for BucketGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BucketGuard")
            .field("buckets", &self.buckets)
            .field("tag", &self.tag)
            .finish()
    }
}

impl<'a> BucketGuard<'a> {
    fn distinct_buckets(&self) -> &[usize] {
        if self.buckets[0] == self.buckets[1] {
            &self.buckets[..1]
        } else {
            &self.buckets[..]
        }
    }

    fn slots(&self) -> impl Iterator<Item = &'a AtomicU64> + '_ {
        let index = self.index;
        self.distinct_buckets()
            .iter()
            .flat_map(move |&b| index.buckets()[b].iter())
    }

    fn find(&self, loc: Location) -> Option<&'a AtomicU64> {
        if !self.index.layout.fits(loc) {
            return None;
        }
        let want = self.index.layout.pack(self.tag, loc);
        self.slots()
            .find(|s| s.load(Ordering::Relaxed) & !FREQ_MASK == want)
    }

    /// Locations whose tag matches the key's (stable while the guard is held, except for
    /// frequency bits).
    pub fn candidates(&self) -> impl Iterator<Item = Location> + '_ {
        let layout = self.index.layout;
        let tag = self.tag;
        self.slots().filter_map(move |s| {
            let e = s.load(Ordering::Relaxed);
            (layout.tag_of_entry(e) == tag).then(|| layout.location(e))
        })
    }

    /// Every occupied entry of the two buckets, any tag, with its frequency: the victims
    /// to choose from when [`insert`](Self::insert) reports [`Full`].
    pub fn occupants(&self) -> impl Iterator<Item = (Location, u8)> + '_ {
        let layout = self.index.layout;
        self.slots().filter_map(move |s| {
            let e = s.load(Ordering::Relaxed);
            (layout.tag_of_entry(e) != 0).then(|| (layout.location(e), freq_count(e)))
        })
    }

    /// Removes any entry at `loc` in these buckets whatever its tag (evicting a victim
    /// picked from [`occupants`](Self::occupants)). Returns whether one was removed.
    pub fn remove_occupant(&mut self, loc: Location) -> bool {
        let layout = self.index.layout;
        if !layout.fits(loc) {
            return false;
        }
        for s in self.slots() {
            let e = s.load(Ordering::Relaxed);
            if layout.tag_of_entry(e) != 0 && layout.location(e) == loc {
                s.store(0, Ordering::Release);
                return true;
            }
        }
        false
    }

    /// Adds an entry for the key at `loc` with frequency 0, in the emptier bucket. The
    /// caller has verified that no candidate holds the key (else it would
    /// [`repoint`](Self::repoint) it). A `loc` outside the layout is a caller bug: it
    /// asserts in debug builds and is refused as `Err(Full)` in release builds.
    pub fn insert(&mut self, loc: Location) -> Result<(), Full> {
        let layout = self.index.layout;
        if !layout.fits(loc) {
            debug_assert!(false, "location {loc:?} does not fit {layout:?}");
            return Err(Full);
        }
        let occupied = |b: usize| {
            self.index.buckets()[b]
                .iter()
                .filter(|s| layout.tag_of_entry(s.load(Ordering::Relaxed)) != 0)
                .count()
        };
        let [b1, b2] = self.buckets;
        let order = if b1 != b2 && occupied(b2) < occupied(b1) {
            [b2, b1]
        } else {
            [b1, b2]
        };
        let entry = layout.pack(self.tag, loc);
        for b in order {
            if let Some(slot) = self.index.free_slot(b) {
                self.index.buckets()[b][slot].store(entry, Ordering::Release);
                return Ok(());
            }
        }
        Err(Full)
    }

    /// Points the key's entry at `expected` to `new`, its frequency as `freq` says — the
    /// one compare-and-swap of every move and every replacement. One `fetch_update`, so
    /// hits readers record concurrently are counted before `freq` applies. The count
    /// `freq` starts from is [`Candidate::reads`]: a [`RECALLED`] mark keeps an item
    /// through its probation stage, and wherever the item goes from there (or whatever
    /// replaces it) starts without that one. False when `new` does not fit the layout or
    /// no entry of this key points at `expected`.
    pub fn repoint(&mut self, expected: Location, new: Location, freq: Freq) -> bool {
        let layout = self.index.layout;
        if !layout.fits(new) {
            return false;
        }
        let Some(s) = self.find(expected) else {
            return false;
        };
        let target = layout.pack(self.tag, new);
        let _ = s.fetch_update(Ordering::Release, Ordering::Relaxed, |e| {
            Some(target | freq_code(freq.apply(reads_count(e))))
        });
        true
    }

    /// Removes the key's entry at `loc`. False when it is not there.
    pub fn remove(&mut self, loc: Location) -> bool {
        match self.find(loc) {
            Some(s) => {
                s.store(0, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Sets the frequency of the key's entry at `loc` (policy decay). False when absent.
    pub fn set_frequency(&mut self, loc: Location, count: u8) -> bool {
        self.set_code(loc, freq_code(count))
    }

    /// Marks the key's entry at `loc` as a new item the ghost filter recalled
    /// ([`RECALLED`]). False when absent.
    pub fn mark_recalled(&mut self, loc: Location) -> bool {
        self.set_code(loc, RECALLED)
    }

    fn set_code(&mut self, loc: Location, code: u64) -> bool {
        match self.find(loc) {
            Some(s) => {
                let _ = s.fetch_update(Ordering::Release, Ordering::Relaxed, |e| {
                    Some((e & !FREQ_MASK) | code)
                });
                true
            }
            None => false,
        }
    }
}

/// The slots of one chunk of the table being loaded ([`Index::import_chunks`]).
pub struct ChunkSlots<'a> {
    buckets: &'a mut [Bucket],
}

impl ChunkSlots<'_> {
    /// Slots in the chunk.
    pub fn len(&self) -> usize {
        self.buckets.len() * SLOTS
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }

    /// Sets slot `i` of the chunk to raw entry `entry`; `false` if `i` is out of range.
    pub fn set(&mut self, i: usize, entry: u64) -> bool {
        match self.buckets.get_mut(i / SLOTS) {
            Some(bucket) => {
                *bucket[i % SLOTS].get_mut() = entry;
                true
            }
            None => false,
        }
    }
}

// A bucket is two cache lines, and buckets start at multiples of 128 bytes of the
// 2 MiB-aligned table: the aligned pair the hardware fetches together.
const _: () = assert!(std::mem::size_of::<Bucket>() == 8 * SLOTS);

#[cfg(test)]
mod tests {
    use super::*;

    fn index(items: usize) -> Index {
        Index::new(&IndexConfig::new(items, 1024, 20)).unwrap()
    }

    fn loc(segment: u32, offset: u32) -> Location {
        Location { segment, offset }
    }

    #[test]
    fn layout_packs_and_unpacks() {
        let l = Layout::new(1024, 20).unwrap();
        assert_eq!((l.segment_bits, l.offset_bits, l.tag_bits), (10, 20, 31));
        let e = l.pack(l.tag_of_hash(u64::MAX), loc(1023, (1 << 20) - 1));
        assert_eq!(l.location(e), loc(1023, (1 << 20) - 1));
        assert_eq!(l.tag_of_entry(e), (1 << 31) - 1);
        assert_eq!(l.tag_of_hash(0), 1);
        assert!(!l.fits(loc(1024, 0)));
        assert!(matches!(
            Layout::new(u32::MAX, 31),
            Err(IndexError::LayoutTooWide { .. })
        ));
        assert_eq!(Layout::new(1, 8).unwrap().segment_bits, 1);
    }

    #[test]
    fn relocation_frees_a_slot_in_a_full_pair_of_buckets() {
        // Fill a key's two buckets with entries of hashes whose other bucket is elsewhere
        // (as a rebuild in another order than the writes can); the key cannot be
        // inserted, then can once one of them moves.
        let mut i = index(1000);
        let n = i.bucket_count();
        let target: u64 = 0x1234_5678_9ABC_DEF0;
        let (t1, t2) = bucket_pair(target, n);
        assert_ne!(t1, t2);
        let mut placed = Vec::new();
        let mut h: u64 = 1;
        for &bucket in &[t1, t2] {
            let mut slot = 0;
            while slot < SLOTS {
                h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
                let (a, b) = bucket_pair(h, n);
                let other = if a == bucket {
                    b
                } else if b == bucket {
                    a
                } else {
                    continue;
                };
                if other == t1 || other == t2 {
                    continue;
                }
                let l = loc(placed.len() as u32, 64);
                let entry = i.layout.pack(i.layout.tag_of_hash(h), l);
                i.buckets()[bucket][slot].store(entry, Ordering::Relaxed);
                placed.push((h, l));
                slot += 1;
            }
        }
        assert!(
            i.lock(target).insert(loc(999, 64)).is_err(),
            "the pair is full"
        );
        let (h, l) = placed[0];
        assert!(i.relocate_before_sharing(h, l));
        assert!(
            i.lookup(h).any(|hit| hit.location() == l),
            "still found after the move"
        );
        assert!(i.lock(target).insert(loc(999, 64)).is_ok());
        // An entry that is not there, or whose other bucket is full, does not move.
        assert!(!i.relocate_before_sharing(h, loc(1000, 64)));
    }

    #[test]
    fn sizing_and_memory() {
        // The per-bucket writer lock is one byte (parking_lot).
        assert_eq!(std::mem::size_of::<Mutex<()>>(), 1);
        let i = index(1_000_000);
        let per_item = i.memory_bytes() as f64 / 1_000_000.0;
        // With a 5-byte item header, the 16-byte metadata budget per item holds.
        assert!(per_item + 5.0 <= 16.0, "{per_item} bytes of index per item");
        assert!(Index::new(&IndexConfig::new(0, 1, 20)).is_err());
        assert!(Index::new(&IndexConfig {
            load: 1.5,
            ..IndexConfig::new(10, 1, 20)
        })
        .is_err());
    }

    #[test]
    fn insert_lookup_replace_remove() {
        let i = index(1000);
        let h = i.hash_key(b"key");
        assert_eq!(i.lookup(h).count(), 0);
        i.lock(h).insert(loc(1, 64)).unwrap();
        let hits: Vec<_> = i.lookup(h).map(|x| x.location()).collect();
        assert_eq!(hits, vec![loc(1, 64)]);
        assert!(!i.lock(h).repoint(loc(1, 65), loc(2, 64), Freq::Reset));
        assert!(i.lock(h).repoint(loc(1, 64), loc(2, 64), Freq::Reset));
        assert!(i.repoint(h, loc(2, 64), loc(3, 64), Freq::Keep));
        assert!(!i.repoint(h, loc(2, 64), loc(4, 64), Freq::Keep));
        assert_eq!(i.lookup(h).next().unwrap().location(), loc(3, 64));
        assert!(i.remove(h, loc(3, 64)));
        assert!(!i.remove(h, loc(3, 64)));
        assert_eq!(i.lookup(h).count(), 0);
        assert_eq!(i.count(), 0);
    }

    #[test]
    fn touch_raises_frequency_and_repoint_keeps_it() {
        let i = index(1000);
        let h = i.hash_key(b"hot");
        i.lock(h).insert(loc(5, 100)).unwrap();
        for expected in [0, 1, 2, 3, 3] {
            let hit = i.lookup(h).next().unwrap();
            assert_eq!(hit.frequency(), expected);
            hit.touch();
        }
        assert!(i.repoint(h, loc(5, 100), loc(6, 100), Freq::Keep));
        assert_eq!(i.lookup(h).next().unwrap().frequency(), 3);
        assert!(i.lock(h).set_frequency(loc(6, 100), 1));
        assert_eq!(i.lookup(h).next().unwrap().frequency(), 1);
        assert!(i.lock(h).repoint(loc(6, 100), loc(7, 100), Freq::Reset));
        assert_eq!(i.lookup(h).next().unwrap().frequency(), 0);
        assert!(i.lock(h).repoint(loc(7, 100), loc(8, 100), Freq::Set(2)));
        assert_eq!(i.lookup(h).next().unwrap().frequency(), 2);
        assert!(i.lock(h).repoint(loc(8, 100), loc(9, 100), Freq::Set(9)));
        assert_eq!(i.lookup(h).next().unwrap().frequency(), MAX_FREQ);
    }

    #[test]
    fn a_recalled_entry_counts_as_one_hit_until_it_is_read() {
        let i = index(1000);
        let h = i.hash_key(b"back");
        i.lock(h).insert(loc(5, 100)).unwrap();
        assert!(i.lock(h).mark_recalled(loc(5, 100)));
        let hit = i.lookup(h).next().unwrap();
        assert!(hit.recalled_without_hit());
        assert_eq!(hit.frequency(), 1);
        // A read raises it like any other code: then it counts as read.
        for expected in [2, 3, 3] {
            i.lookup(h).next().unwrap().touch();
            let now = i.lookup(h).next().unwrap();
            assert!(!now.recalled_without_hit());
            assert_eq!(now.frequency(), expected);
        }
        // Wherever it moves unread, or whatever replaces it, starts from no hit.
        assert!(i.lock(h).mark_recalled(loc(5, 100)));
        assert!(i.repoint(h, loc(5, 100), loc(6, 100), Freq::Keep));
        let moved = i.lookup(h).next().unwrap();
        assert!(!moved.recalled_without_hit());
        assert_eq!(moved.frequency(), 0);
        assert!(!i.lock(h).mark_recalled(loc(5, 100)), "moved on");
        assert!(i.lock(h).mark_recalled(loc(6, 100)));
        assert!(i.lock(h).repoint(loc(6, 100), loc(7, 100), Freq::Bump));
        assert_eq!(i.lookup(h).next().unwrap().frequency(), 1);
        // Read once, it carries that one read and no more.
        assert!(i.lock(h).mark_recalled(loc(7, 100)));
        i.lookup(h).next().unwrap().touch();
        let read = i.lookup(h).next().unwrap();
        assert_eq!((read.frequency(), read.reads()), (2, 1));
        assert!(i.repoint(h, loc(7, 100), loc(8, 100), Freq::Keep));
        assert_eq!(i.lookup(h).next().unwrap().frequency(), 1);
    }

    #[test]
    fn reinsertion_decays_and_overwrites_count_as_hits() {
        let i = index(1000);
        let h = i.hash_key(b"hot");
        i.lock(h).insert(loc(5, 100)).unwrap();
        for _ in 0..3 {
            i.lookup(h).next().unwrap().touch();
        }
        // Each reinsertion spends one hit, down to 0 and no further.
        for (to, expected) in [(6, 2), (7, 1), (8, 0), (9, 0)] {
            assert!(i
                .lock(h)
                .repoint(loc(to - 1, 100), loc(to, 100), Freq::Spend));
            assert_eq!(i.lookup(h).next().unwrap().frequency(), expected);
        }
        assert!(
            !i.lock(h).repoint(loc(5, 100), loc(10, 100), Freq::Spend),
            "moved on"
        );
        // An overwrite counts as an access, up to the maximum.
        for (to, expected) in [(10, 1), (11, 2), (12, 3), (13, 3)] {
            assert!(i
                .lock(h)
                .repoint(loc(to - 1, 100), loc(to, 100), Freq::Bump));
            assert_eq!(i.lookup(h).next().unwrap().frequency(), expected);
        }
        assert!(
            !i.lock(h).repoint(loc(5, 100), loc(14, 100), Freq::Bump),
            "moved on"
        );
        assert_eq!(i.count(), 1);
    }

    #[test]
    fn touch_on_an_emptied_slot_leaves_it_empty() {
        let i = index(1000);
        let h = i.hash_key(b"gone");
        i.lock(h).insert(loc(5, 100)).unwrap();
        let hit = i.lookup(h).next().unwrap();
        assert!(i.remove(h, loc(5, 100)));
        hit.touch();
        assert_eq!(i.lookup(h).count(), 0);
        assert_eq!(i.count(), 0);
        // The slot is reusable.
        i.lock(h).insert(loc(5, 200)).unwrap();
        assert_eq!(i.lookup(h).count(), 1);
    }

    #[test]
    fn full_buckets_refuse_and_offer_victims() {
        // One bucket only: 8 slots.
        let i = Index::new(&IndexConfig::new(1, 16, 10)).unwrap();
        assert_eq!(i.bucket_count(), 1);
        for n in 0..SLOTS as u32 {
            i.lock(u64::from(n) << 40).insert(loc(n, 0)).unwrap();
        }
        let mut g = i.lock(99 << 40);
        assert_eq!(g.insert(loc(9, 0)), Err(Full));
        let victim = g.occupants().min_by_key(|&(_, f)| f).unwrap().0;
        assert!(g.remove_occupant(victim));
        g.insert(loc(9, 0)).unwrap();
        drop(g);
        assert_eq!(i.count(), SLOTS);
    }

    #[test]
    fn two_choices_fill_densely_before_refusing() {
        // Fill to the design load with random hashes; refusals must be rare.
        let items = 100_000;
        let i = index(items);
        let mut full = 0;
        let mut x = 0x1234_5678_9abc_def0u64;
        for n in 0..items as u32 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i.lock(x).insert(loc(n % 1024, n % (1 << 20))).is_err() {
                full += 1;
            }
        }
        assert!(
            full * 1000 < items,
            "{full} refusals at load {DEFAULT_LOAD}"
        );
    }

    #[test]
    fn sweep_removes_and_decays() {
        let i = index(1000);
        for n in 0..100u32 {
            let h = i.hash_key(&n.to_le_bytes());
            i.lock(h).insert(loc(n % 4, n)).unwrap();
            i.lookup(h).next().unwrap().touch();
        }
        i.sweep(0..i.bucket_count(), |l, f| {
            assert_eq!(f, 1);
            if l.segment == 2 {
                Sweep::Remove
            } else {
                Sweep::SetFrequency(0)
            }
        });
        assert_eq!(i.count(), 75);
        let mut seen = 0;
        i.sweep(0..usize::MAX, |l, f| {
            assert_ne!(l.segment, 2);
            assert_eq!(f, 0);
            seen += 1;
            Sweep::Keep
        });
        assert_eq!(seen, 75);
    }
}

//! Small items on flash without an index entry (Kangaroo's sets): a region of the flash
//! file after its segment slots, cut into 4 KiB pages, one per set; a key's set is fixed
//! by its hash ([`SetGeometry`]). DRAM keeps, per set, a 128-bit Bloom filter of the keys
//! its page may hold, the page's generation and its item count — 21 bytes a set, about
//! one byte per item at twenty items a page — and the kills of items in pages not yet
//! rewritten. Which items move into sets, lookups and kills are the engine's side
//! (`cache/sets.rs`); this module owns the pages and that DRAM state.
//!
//! # Page format
//! `magic "TSET" | set u32 | generation u32 | items u16 | used u16 | crc32 u32 | sets u32`,
//! then `items` packed items in the item format of segments (`crate::item`), all LIVE,
//! newest first, `used` bytes of them; `sets` is the region's set count, so that a page
//! left by a region cut differently (a device reused with another share) never reads as
//! this set's. The checksum covers the first 16 header bytes, the items and `sets`. A page
//! that does not validate (never written, torn by a crash, another set's) holds nothing.
//!
//! # Kills
//! A set copy cannot be marked dead in place (that would be a page rewrite per delete).
//! A write or delete of a key whose set's filter may hold it records a kill — set,
//! 32-bit key hash, the set's generation — in DRAM and as a record in the flash tier's
//! kill log before the operation returns. A read skips the items its set's kills of the
//! current generation name; a page rewrite leaves them out and starts a generation with
//! no kills; a restart applies the records of each page's generation.
//!
//! # Invariants
//! - A set's filter holds every key its page holds: it is raised before a page is
//!   written and narrowed to the page's keys only after.
//! - A page is rewritten, and its set's generation, filter and kills changed, only under
//!   the set's stripe lock; a kill takes the same lock, so it names the generation of
//!   the page that holds (or may hold) the killed item.
//! - A reader serves a page of generation `g` only if `g` is still its set's generation
//!   after the read, and filters it by the kills of `g`.
//!
//! Lock order: a key's bucket lock, then a set stripe, then the kill log.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use parking_lot::{Mutex, MutexGuard};
use terrace_media::flash::{AlignedBuf, BLOCK};
use terrace_media::MediaError;

use super::{FlashRead, FlashTier, OwnedItem};
use crate::item::{self, ItemState};

/// Bytes of a set's page.
pub(crate) const PAGE: usize = BLOCK;
const PAGE_HEADER: usize = 24;
const PAGE_MAGIC: u32 = u32::from_le_bytes(*b"TSET");

/// Words of a set's Bloom filter (128 bits) and the bits a key sets: at twenty keys a
/// page about 8% false positives, each a 4 KiB read of a miss.
const FILTER_WORDS: usize = 2;
const FILTER_PROBES: u32 = 3;

/// Stripes of set locks (a set's is `set % STRIPES`).
const STRIPES: usize = 1024;

/// Pages a restart reads at once when it rebuilds the DRAM state.
const REBUILD_PAGES: usize = 256;

/// The slot field of a kill-log record of a set kill, and of a [`FlashRead`] of a set's
/// page: the offset field is then the set.
pub(super) const SET_SLOT: u32 = u32::MAX;

/// How keys map to sets. The index's home bucket of a hash fixes its set, so that the
/// index entries of the small items still in the log that belong to one set are found in
/// one bucket (`cache/sets.rs` moves them together): with at least as many sets as
/// buckets, `per_bucket` sets share a bucket and the tag picks one; with fewer,
/// `buckets_per_set` buckets share a set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SetGeometry {
    pub sets: u32,
    per_bucket: u32,
    buckets_per_set: u32,
}

impl SetGeometry {
    /// The geometry for `pages` pages over an index of `buckets` buckets; `None` without
    /// a page.
    pub fn new(pages: u64, buckets: usize) -> Option<SetGeometry> {
        let buckets = buckets.max(1) as u64;
        if pages == 0 {
            return None;
        }
        let (sets, per_bucket, buckets_per_set) = if pages >= buckets {
            let k = (pages / buckets).min(u64::from(u32::MAX) / buckets);
            (buckets * k, k, 1)
        } else {
            let j = buckets.div_ceil(pages);
            (buckets.div_ceil(j), 1, j)
        };
        Some(SetGeometry {
            sets: u32::try_from(sets).ok()?,
            per_bucket: u32::try_from(per_bucket).ok()?,
            buckets_per_set: u32::try_from(buckets_per_set).ok()?,
        })
    }

    /// The set of a key whose home bucket is `home` and whose index tag is `tag`.
    pub fn set_of(&self, home: usize, tag: u64) -> u32 {
        let home = home as u64;
        let s = if self.buckets_per_set > 1 {
            home / u64::from(self.buckets_per_set)
        } else {
            home * u64::from(self.per_bucket) + tag % u64::from(self.per_bucket)
        };
        s as u32
    }

    /// The buckets whose home entries may be of set `set`.
    pub fn buckets_of_set(&self, set: u32) -> std::ops::Range<usize> {
        if self.buckets_per_set > 1 {
            let first = set as usize * self.buckets_per_set as usize;
            first..first + self.buckets_per_set as usize
        } else {
            let b = (set / self.per_bucket) as usize;
            b..b + 1
        }
    }

    /// Whether an entry of tag `tag` in one of [`buckets_of_set`](Self::buckets_of_set)
    /// may be of set `set` (its home bucket is checked by the caller, who reads its key).
    pub fn tag_may_match(&self, set: u32, tag: u64) -> bool {
        self.buckets_per_set > 1
            || tag % u64::from(self.per_bucket) == u64::from(set % self.per_bucket)
    }
}

/// The 32 bits of a key's hash a kill names.
pub(crate) fn kill_hash(hash: u64) -> u32 {
    (hash >> 16) as u32
}

/// The filter bits of a hash: mixed first, since the set was chosen by some of its bits.
fn filter_bits(hash: u64) -> [u32; FILTER_PROBES as usize] {
    let x = hash.wrapping_mul(0xff51_afd7_ed55_8ccd).rotate_left(31);
    let bits = (FILTER_WORDS * 64) as u64;
    [0, 1, 2].map(|i| ((x >> (i * 21)) % bits) as u32)
}

fn filter_of(hashes: impl IntoIterator<Item = u64>) -> [u64; FILTER_WORDS] {
    let mut f = [0u64; FILTER_WORDS];
    for h in hashes {
        for b in filter_bits(h) {
            f[b as usize / 64] |= 1 << (b % 64);
        }
    }
    f
}

/// Counters of the sets.
#[derive(Debug, Default)]
pub(crate) struct SetCounters {
    pub pages_written: AtomicU64,
    pub page_reads: AtomicU64,
    /// Page reads for keys the page did not hold (filter false positives, killed items).
    pub page_misses: AtomicU64,
    pub items_moved: AtomicU64,
    /// Log items that met no other item of their set (below the move threshold): dropped,
    /// or reinserted into the log if they had a hit.
    pub below_threshold: AtomicU64,
    /// Items pushed out of a full page by newer ones.
    pub items_trimmed: AtomicU64,
    pub kills: AtomicU64,
    pub hits: AtomicU64,
    /// Lookups that found their page staged (read ahead, off a server's worker).
    pub staged_used: AtomicU64,
}

/// The kills of a stripe's sets in their current generations: `set << 32 | kill hash`.
/// A flat set (about ten bytes a kill), emptied of one set's kills by a scan of its
/// stripe when that set's page is rewritten.
type Kills = HashSet<u64>;

fn kill_key(set: u32, hash: u32) -> u64 {
    (u64::from(set) << 32) | u64::from(hash)
}

/// The sets' DRAM state. See the module docs.
pub(crate) struct SetStore {
    pub geometry: SetGeometry,
    /// File offset of page 0.
    base: u64,
    filters: Box<[AtomicU64]>,
    generations: Box<[AtomicU32]>,
    counts: Box<[AtomicU8]>,
    /// The sum of `counts`.
    items: AtomicU64,
    stripes: Box<[Mutex<Kills>]>,
    /// Pages read ahead of the lookup that wants them (a server's worker must not wait
    /// on the device), taken by that lookup.
    staged: Mutex<StagedPages>,
    pub counters: SetCounters,
}

/// Staged pages, at most [`STAGED_PAGES`], the oldest dropped first.
#[derive(Default)]
struct StagedPages {
    pages: HashMap<u32, Page>,
    /// Insertion order (may name pages already taken).
    order: VecDeque<u32>,
}

/// Pages staged at most (about 4 KiB of items each).
const STAGED_PAGES: usize = 1024;

impl std::fmt::Debug for SetStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetStore")
            .field("sets", &self.geometry.sets)
            .finish()
    }
}

/// A set locked for a rewrite or a kill ([`SetStore::lock`]).
pub(crate) struct SetLock<'a> {
    store: &'a SetStore,
    set: u32,
    kills: MutexGuard<'a, Kills>,
}

impl SetLock<'_> {
    pub fn generation(&self) -> u32 {
        self.store.generations[self.set as usize].load(Ordering::Acquire)
    }
}

impl SetStore {
    /// Empty sets of `geometry`, their pages from file offset `base`.
    pub fn new(geometry: SetGeometry, base: u64) -> SetStore {
        let n = geometry.sets as usize;
        SetStore {
            geometry,
            base,
            filters: (0..n * FILTER_WORDS).map(|_| AtomicU64::new(0)).collect(),
            generations: (0..n).map(|_| AtomicU32::new(0)).collect(),
            counts: (0..n).map(|_| AtomicU8::new(0)).collect(),
            items: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| Mutex::new(Kills::new())).collect(),
            staged: Mutex::new(StagedPages::default()),
            counters: SetCounters::default(),
        }
    }

    /// DRAM the sets take (filters, generations, counts).
    pub fn memory_bytes(&self) -> usize {
        self.geometry.sets as usize * (FILTER_WORDS * 8 + 4 + 1)
    }

    /// Items in the pages (as last written or read at a restart).
    pub fn items(&self) -> u64 {
        self.items.load(Ordering::Relaxed)
    }

    /// Sets `set`'s item count (saturating at 255), keeping their sum.
    fn set_count(&self, set: u32, n: usize) {
        let n = n.min(255) as u8;
        let old = self.counts[set as usize].swap(n, Ordering::Relaxed);
        if n >= old {
            self.items.fetch_add(u64::from(n - old), Ordering::Relaxed);
        } else {
            self.items.fetch_sub(u64::from(old - n), Ordering::Relaxed);
        }
    }

    pub fn page_offset(&self, set: u32) -> u64 {
        self.base + u64::from(set) * PAGE as u64
    }

    /// Whether `set`'s page may hold the key of `hash`.
    pub fn may_hold(&self, set: u32, hash: u64) -> bool {
        let at = set as usize * FILTER_WORDS;
        filter_bits(hash).iter().all(|&b| {
            self.filters[at + b as usize / 64].load(Ordering::Relaxed) & (1 << (b % 64)) != 0
        })
    }

    fn raise_filter(&self, set: u32, hashes: impl IntoIterator<Item = u64>) {
        let at = set as usize * FILTER_WORDS;
        for (i, w) in filter_of(hashes).into_iter().enumerate() {
            self.filters[at + i].fetch_or(w, Ordering::Release);
        }
    }

    fn set_filter(&self, set: u32, hashes: impl IntoIterator<Item = u64>) {
        let at = set as usize * FILTER_WORDS;
        for (i, w) in filter_of(hashes).into_iter().enumerate() {
            self.filters[at + i].store(w, Ordering::Release);
        }
    }

    pub fn lock(&self, set: u32) -> SetLock<'_> {
        SetLock {
            store: self,
            set,
            kills: self.stripes[set as usize % STRIPES].lock(),
        }
    }

    /// Whether `set`'s generation is still `generation`, and if so whether the key of
    /// `hash` was killed in it.
    pub fn killed(&self, set: u32, generation: u32, hash: u64) -> Option<bool> {
        let lock = self.lock(set);
        if lock.generation() != generation {
            return None;
        }
        Some(self.killed_locked(&lock, kill_hash(hash)))
    }

    /// Whether the locked set's current generation killed the key of kill hash `h`.
    pub fn killed_locked(&self, lock: &SetLock<'_>, h: u32) -> bool {
        lock.kills.contains(&kill_key(lock.set, h))
    }

    /// Records a kill of the key of `hash` in the locked set's current generation (the
    /// caller logged it).
    pub fn add_kill(lock: &mut SetLock<'_>, hash: u32) {
        lock.kills.insert(kill_key(lock.set, hash));
        lock.store.counters.kills.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether the kill log's record of a set kill still matters: its generation is the
    /// set's current one.
    pub fn record_current(&self, set: u32, generation: u32) -> bool {
        self.generations
            .get(set as usize)
            .is_some_and(|g| g.load(Ordering::Acquire) == generation)
    }
}

/// A page's contents: its generation and its items, newest first.
pub(crate) struct Page {
    pub generation: u32,
    pub items: Vec<OwnedItem>,
}

/// Decodes a page of `set` of a region of `sets` sets; an empty page of generation 0
/// when it does not validate.
pub(crate) fn decode_page(bytes: &[u8], set: u32, sets: u32) -> Page {
    let empty = Page {
        generation: 0,
        items: Vec::new(),
    };
    let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
    if bytes.len() < PAGE || word(0) != PAGE_MAGIC || word(4) != set || word(20) != sets {
        return empty;
    }
    let count = u16::from_le_bytes([bytes[12], bytes[13]]) as usize;
    let used = u16::from_le_bytes([bytes[14], bytes[15]]) as usize;
    if PAGE_HEADER + used > PAGE {
        return empty;
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&bytes[..16]);
    crc.update(&bytes[PAGE_HEADER..PAGE_HEADER + used]);
    crc.update(&bytes[20..24]);
    if crc.finalize() != word(16) {
        return empty;
    }
    let end = PAGE_HEADER + used;
    let mut items = Vec::with_capacity(count);
    let mut at = PAGE_HEADER as u32;
    while (at as usize) < end && items.len() < count {
        let Ok(i) = item::decode(&bytes[..end], at, end) else {
            return empty;
        };
        at = i.end();
        if i.state == ItemState::Live {
            items.push(OwnedItem::from_ref(&i));
        }
    }
    Page {
        generation: word(8),
        items,
    }
}

/// Encodes `items` (newest first) as a page of `set` of `sets` at `generation` into `out`
/// (a page), as many as fit; returns how many.
pub(crate) fn encode_page(
    (set, sets): (u32, u32),
    generation: u32,
    items: &[OwnedItem],
    out: &mut [u8],
) -> usize {
    out[..PAGE].fill(0);
    let mut at = PAGE_HEADER;
    let mut n = 0;
    for owned in items {
        let i = owned.item();
        let spec = i.spec();
        let Ok(len) = item::encode(&spec, i.key, i.value, &mut out[at..PAGE]) else {
            break;
        };
        item::set_state(&mut out[..PAGE], at as u32, ItemState::Live);
        at += len;
        n += 1;
    }
    let used = at - PAGE_HEADER;
    out[0..4].copy_from_slice(&PAGE_MAGIC.to_le_bytes());
    out[4..8].copy_from_slice(&set.to_le_bytes());
    out[8..12].copy_from_slice(&generation.to_le_bytes());
    out[12..14].copy_from_slice(&(n as u16).to_le_bytes());
    out[14..16].copy_from_slice(&(used as u16).to_le_bytes());
    out[20..24].copy_from_slice(&sets.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[..16]);
    crc.update(&out[PAGE_HEADER..at]);
    crc.update(&out[20..24]);
    out[16..20].copy_from_slice(&crc.finalize().to_le_bytes());
    n
}

impl FlashTier {
    /// The tier's sets, if it has any.
    pub fn sets(&self) -> Option<&SetStore> {
        self.sets.as_ref()
    }

    /// Whether a page of `set` is staged.
    pub fn page_staged(&self, set: u32) -> bool {
        self.sets
            .as_ref()
            .is_some_and(|s| s.staged.lock().pages.contains_key(&set))
    }

    /// Takes the staged page of `set`, if any (the caller checks its generation).
    pub fn staged_page(&self, set: u32) -> Option<Page> {
        let s = self.sets.as_ref()?;
        let page = s.staged.lock().pages.remove(&set)?;
        self.counters.staged_used.fetch_add(1, Ordering::Relaxed);
        s.counters.staged_used.fetch_add(1, Ordering::Relaxed);
        Some(page)
    }

    fn put_staged_page(&self, set: u32, page: Page) {
        let Some(s) = self.sets.as_ref() else {
            return;
        };
        self.counters.staged.fetch_add(1, Ordering::Relaxed);
        let mut st = s.staged.lock();
        if st.pages.insert(set, page).is_none() {
            st.order.push_back(set);
        }
        while st.pages.len() > STAGED_PAGES {
            let Some(oldest) = st.order.pop_front() else {
                break;
            };
            st.pages.remove(&oldest);
        }
        if st.pages.is_empty() {
            st.order.clear();
        }
    }

    /// Reads `set`'s page into DRAM for the next lookup of a key of it (on a thread that
    /// may wait on the device, for one that may not).
    pub fn stage_page(&self, set: u32) {
        if let Some(page) = self.read_page(set) {
            self.put_staged_page(set, page);
        }
    }

    /// A read of `set`'s page for the caller's own I/O engine (see [`FlashRead`]), unless
    /// one is staged.
    pub fn plan_page_read(&self, set: u32) -> Option<FlashRead> {
        let s = self.sets.as_ref()?;
        if self.page_staged(set) {
            return None;
        }
        Some(FlashRead {
            slot: SET_SLOT,
            offset: set,
            generation: 0,
            end: 0,
            start: 0,
            file_offset: s.page_offset(set),
            buf: AlignedBuf::new(PAGE).ok()?,
            fd: self.file.raw_fd(),
        })
    }

    /// Stages the page a [`plan_page_read`](Self::plan_page_read) read; a failed or
    /// short read is counted and stages nothing (the lookup reads inline, and fails
    /// alike).
    pub(super) fn finish_page_read(&self, read: FlashRead, result: std::io::Result<usize>) {
        let Some(s) = self.sets.as_ref() else {
            return;
        };
        self.counters.reads.fetch_add(1, Ordering::Relaxed);
        if !matches!(result, Ok(n) if n == PAGE) {
            self.counters.read_errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.counters
            .bytes_read
            .fetch_add(PAGE as u64, Ordering::Relaxed);
        s.counters.page_reads.fetch_add(1, Ordering::Relaxed);
        let page = decode_page(&read.buf, read.offset, s.geometry.sets);
        self.put_staged_page(read.offset, page);
    }

    /// Reads `set`'s page (one 4 KiB `pread`, counted); `None` on a read error.
    pub fn read_page(&self, set: u32) -> Option<Page> {
        let s = self.sets.as_ref()?;
        let mut buf = AlignedBuf::new(PAGE).ok()?;
        self.read_blocks(s.page_offset(set), &mut buf)?;
        s.counters.page_reads.fetch_add(1, Ordering::Relaxed);
        Some(decode_page(&buf, set, s.geometry.sets))
    }

    /// Rewrites the locked set's page with `items` (newest first, killed ones already
    /// left out) as its next generation: filter raised by their keys (`hash` gives a
    /// key's) before the write, narrowed to what the page holds after; the kills of the
    /// old generation dropped. Returns how many items the page took (the oldest beyond
    /// its room are left out).
    pub fn rewrite_page(
        &self,
        lock: &mut SetLock<'_>,
        items: &[OwnedItem],
        hash: impl Fn(&[u8]) -> u64,
    ) -> Result<usize, MediaError> {
        let Some(s) = self.sets.as_ref() else {
            return Ok(0);
        };
        let set = lock.set;
        let generation = next_generation(lock.generation());
        let mut buf = AlignedBuf::new(PAGE)?;
        let n = encode_page((set, s.geometry.sets), generation, items, &mut buf);
        let hashes: Vec<u64> = items[..n].iter().map(|i| hash(i.item().key)).collect();
        s.raise_filter(set, hashes.iter().copied());
        if let Err(e) = self.file.write_at(s.page_offset(set), &buf) {
            self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            return Err(e);
        }
        self.counters
            .bytes_written
            .fetch_add(PAGE as u64, Ordering::Relaxed);
        s.counters.pages_written.fetch_add(1, Ordering::Relaxed);
        s.counters
            .items_trimmed
            .fetch_add((items.len() - n) as u64, Ordering::Relaxed);
        s.generations[set as usize].store(generation, Ordering::Release);
        s.set_count(set, n);
        s.set_filter(set, hashes);
        lock.kills.retain(|&k| (k >> 32) as u32 != set);
        Ok(n)
    }

    /// Records a kill of the key of `hash` in the locked set: a kill-log record, then
    /// the DRAM kill.
    pub fn kill_in_set(&self, lock: &mut SetLock<'_>, hash: u64) -> Result<(), MediaError> {
        let h = kill_hash(hash);
        let due = self.log_kill(SET_SLOT, lock.set, set_record_seq(lock.generation(), h))?;
        SetStore::add_kill(lock, h);
        if due {
            self.compact_kill_log()?;
        }
        Ok(())
    }

    /// Restart: reads every page to rebuild the filters, generations and counts, then
    /// applies the kill log's set records of each page's generation (`records`: slot
    /// field, offset field, sequence field). With `untrusted`, the pages are dropped
    /// instead (punched, else zeroed page by page).
    pub fn rebuild_sets(
        &self,
        records: &[(u32, u32, u64)],
        hash: impl Fn(&[u8]) -> u64 + Sync,
        untrusted: bool,
    ) -> Result<(), MediaError> {
        let Some(s) = self.sets.as_ref() else {
            return Ok(());
        };
        let sets = s.geometry.sets as usize;
        if untrusted {
            return self.drop_sets();
        }
        let mut buf = AlignedBuf::new(REBUILD_PAGES * PAGE)?;
        let mut first = 0usize;
        while first < sets {
            let n = REBUILD_PAGES.min(sets - first);
            self.file
                .read_at(s.page_offset(first as u32), &mut buf[..n * PAGE])?;
            for i in 0..n {
                let set = (first + i) as u32;
                let page = decode_page(&buf[i * PAGE..(i + 1) * PAGE], set, s.geometry.sets);
                s.generations[set as usize].store(page.generation, Ordering::Relaxed);
                s.set_count(set, page.items.len());
                s.set_filter(set, page.items.iter().map(|it| hash(it.item().key)));
            }
            first += n;
        }
        for &(slot, set, seq) in records {
            let (generation, h) = split_set_record(seq);
            if slot == SET_SLOT && s.record_current(set, generation) {
                let mut lock = s.lock(set);
                lock.kills.insert(kill_key(set, h));
            }
        }
        Ok(())
    }

    /// Empties every set (`flush_all`, or pages not trusted at a restart): their region
    /// punched (else zeroed), filters, counts and kills cleared, generations moved on.
    pub fn drop_sets(&self) -> Result<(), MediaError> {
        let Some(s) = self.sets.as_ref() else {
            return Ok(());
        };
        for stripe in s.stripes.iter() {
            stripe.lock().clear();
        }
        for f in s.filters.iter() {
            f.store(0, Ordering::Release);
        }
        for c in s.counts.iter() {
            c.store(0, Ordering::Relaxed);
        }
        s.items.store(0, Ordering::Relaxed);
        for g in s.generations.iter() {
            g.store(
                next_generation(g.load(Ordering::Acquire)),
                Ordering::Release,
            );
        }
        let len = u64::from(s.geometry.sets) * PAGE as u64;
        if self.file.punch(s.base, len).is_ok() {
            return Ok(());
        }
        self.counters
            .punch_fallbacks
            .fetch_add(1, Ordering::Relaxed);
        let zero = AlignedBuf::new(REBUILD_PAGES * PAGE)?;
        let mut at = 0u64;
        while at < len {
            let n = (len - at).min(zero.len() as u64) as usize;
            self.file.write_at(s.base + at, &zero[..n])?;
            at += n as u64;
        }
        Ok(())
    }
}

/// The generation after `g`: 31 bits, the top bit of a record's sequence field is its
/// mark.
fn next_generation(g: u32) -> u32 {
    g.wrapping_add(1) & 0x7fff_ffff
}

/// The sequence field of a set kill's record: generation, then the key's kill hash.
fn set_record_seq(generation: u32, hash: u32) -> u64 {
    // Never 0 (a record of sequence 0 is read as none): the top bit marks it.
    (1 << 63) | (u64::from(generation) << 32) | u64::from(hash)
}

fn split_set_record(seq: u64) -> (u32, u32) {
    (((seq >> 32) as u32) & 0x7fff_ffff, seq as u32)
}

/// Whether a kill-log record (slot field, offset field, sequence field) of a set kill is
/// still of its set's current generation.
pub(super) fn set_record_current(store: Option<&SetStore>, set: u32, seq: u64) -> bool {
    let (generation, _) = split_set_record(seq);
    store.is_some_and(|s| s.record_current(set, generation))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::item::ItemRef;

    fn owned(key: &[u8], value: &[u8]) -> OwnedItem {
        OwnedItem::from_ref(&ItemRef {
            offset: 0,
            len: 0,
            state: ItemState::Live,
            client_flags: 7,
            expires_at: 0,
            origin_cas: Some(42),
            key,
            value,
        })
    }

    #[test]
    fn a_page_round_trips_and_a_damaged_one_holds_nothing() {
        let items: Vec<OwnedItem> = (0..10u8).map(|i| owned(&[b'k', i], &[i; 100])).collect();
        let mut page = vec![0u8; PAGE];
        assert_eq!(encode_page((5, 64), 9, &items, &mut page), 10);
        let p = decode_page(&page, 5, 64);
        assert_eq!(p.generation, 9);
        assert_eq!(p.items.len(), 10);
        let second = p.items[1].item();
        assert_eq!((second.key, second.value.len()), (&[b'k', 1][..], 100));
        assert_eq!((second.client_flags, second.origin_cas), (7, Some(42)));
        // Another set's page, another region's, a flipped bit, zeros: empty.
        assert!(decode_page(&page, 6, 64).items.is_empty());
        assert!(decode_page(&page, 5, 65).items.is_empty());
        page[PAGE_HEADER + 30] ^= 1;
        assert!(decode_page(&page, 5, 64).items.is_empty());
        assert!(decode_page(&[0u8; PAGE], 5, 64).items.is_empty());
    }

    #[test]
    fn a_full_page_keeps_the_newest_items() {
        let items: Vec<OwnedItem> = (0..100u8).map(|i| owned(&[b'k', i], &[i; 200])).collect();
        let mut page = vec![0u8; PAGE];
        let n = encode_page((0, 1), 1, &items, &mut page);
        assert!(n > 10 && n < 100, "{n}");
        let p = decode_page(&page, 0, 1);
        assert_eq!(p.items.len(), n);
        assert_eq!(p.items[0].item().key, b"k\0");
    }

    #[test]
    fn geometry_maps_every_hash_into_range_and_lists_its_bucket() {
        for (pages, buckets) in [(1000u64, 100usize), (100, 1000), (7, 3), (3, 7), (1, 1)] {
            let g = SetGeometry::new(pages, buckets).unwrap();
            assert!(u64::from(g.sets) <= pages.max(1), "{pages} {buckets} {g:?}");
            for home in 0..buckets {
                for tag in 1..20u64 {
                    let s = g.set_of(home, tag);
                    assert!(s < g.sets, "{g:?} {home} {tag}");
                    assert!(g.buckets_of_set(s).contains(&home));
                    assert!(g.tag_may_match(s, tag));
                }
            }
        }
        assert!(SetGeometry::new(0, 10).is_none());
    }

    #[test]
    fn a_filter_holds_what_it_was_given() {
        let g = SetGeometry::new(4, 4).unwrap();
        let s = SetStore::new(g, 0);
        let hashes: Vec<u64> = (0..20u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        s.raise_filter(1, hashes.iter().copied());
        assert!(hashes.iter().all(|&h| s.may_hold(1, h)));
        assert!(!s.may_hold(2, hashes[0]));
        let strangers = (1000..3000u64)
            .map(|i| i.wrapping_mul(0xD6E8_FEB8_6659_FD93))
            .filter(|&h| s.may_hold(1, h))
            .count();
        assert!(strangers < 400, "{strangers} of 2000 false positives");
    }

    #[test]
    fn set_records_round_trip() {
        let seq = set_record_seq(0x1234_5678, 0xdead_beef);
        assert_ne!(seq, 0);
        assert_eq!(split_set_record(seq), (0x1234_5678, 0xdead_beef));
    }
}

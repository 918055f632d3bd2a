//! The ordered map: a B+-tree of pool objects whose leaves are unsorted, with a live-slot
//! bitmap and one fingerprint byte per slot (the FPTree / NV-Tree leaf), and whose inner
//! nodes are sorted. Layout: [`crate::layout`]; commit protocol and crash argument: the
//! crate docs.
//!
//! Owns [`OrderedMap`] (an open map: its writer lock and the sequence counters readers
//! validate against) and [`Range`] (a cursor).
//!
//! Invariants:
//! - writers hold `writer`; readers take no lock. A leaf's bitmap word changes only
//!   between two increments of its stripe counter (odd while changing); inner nodes, the
//!   header and the slots a transaction writes change only while `structure` is odd. A
//!   reader's result is used only if both counters were even and unchanged around its
//!   reads; otherwise it retries. Reads of a node being changed may see torn bytes: they
//!   are bounds-checked pool reads whose result is discarded, never trusted;
//! - a single-leaf update writes a slot that is free in the bitmap, persists it, then
//!   changes the bitmap word with one 8-byte store and persists it (the commit point);
//!   everything else (a split, a move between leaves, an out-of-line value, removing a
//!   node) runs in one pool transaction, whose undo log restores it on abort or crash;
//! - every key in the subtree of child `i` of an inner node lies in
//!   `[separator i-1, separator i)` (unbounded at the ends); leaves are all at depth
//!   `height`; an inner node with no separator has one child; only the root may be an
//!   empty leaf.
//! - lock order: a map's `writer`, then a pool lane (a transaction); the directory's
//!   `writer` before a map's (see `docs/concurrency.md`).

use std::cmp::Ordering as Cmp;
use std::ops::Bound;

use parking_lot::{Mutex, MutexGuard};
use terrace_pool::{Backend, Oid, Pool, Tx};

use crate::error::{CollectionError, Result};
use crate::layout::{
    key_hash, prefix_word, Geometry, HEADER_SIZE, H_GEOMETRY, H_HEIGHT, H_MAGIC, H_ROOT,
    INNER_COUNT, INNER_SAMPLES, INNER_SAMPLE_OFF, LEAF_BITMAP, LEAF_FPS, MAP_MAGIC, OUT_OF_LINE,
    TYPE_INNER, TYPE_LEAF, TYPE_MAP,
};
use crate::page::{PageImage, Pages, Slot, MAX_VALUE};
use crate::sync::{Attempt, LazyCount, OpenGuard, Seqlocks};

/// Deepest tree a reader follows (guards a corrupt height word).
const MAX_HEIGHT: u64 = 32;

/// The way down to a leaf: `(inner node, child index taken)` from the root.
type Path = Vec<(u64, u32)>;

/// An open ordered map (bytes → bytes). See the module docs.
pub struct OrderedMap<'p, B: Backend> {
    pool: &'p Pool<B>,
    header: u64,
    geo: Geometry,
    writer: Mutex<()>,
    pages: Pages<'p, B>,
    seq: Seqlocks,
    count: LazyCount,
    _open: OpenGuard,
}

impl<B: Backend> std::fmt::Debug for OrderedMap<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrderedMap")
            .field("header", &format_args!("{:#x}", self.header))
            .field("geometry", &self.geo)
            .finish()
    }
}

/// Allocates a map header in `tx` (published by whatever the caller stores its offset
/// into in the same transaction).
pub(crate) fn create_header<B: Backend>(tx: &mut Tx<'_, B>, geo: &Geometry) -> Result<Oid> {
    geo.validate()
        .map_err(|detail| CollectionError::InvalidArgument {
            what: "geometry",
            detail,
        })?;
    let oid = tx.alloc(HEADER_SIZE, TYPE_MAP)?;
    let mut bytes = [0u8; HEADER_SIZE as usize];
    bytes[..8].copy_from_slice(&MAP_MAGIC.to_le_bytes());
    bytes[8..16].copy_from_slice(&geo.encode().to_le_bytes());
    tx.write(oid, 0, &bytes)?;
    Ok(oid)
}

/// Writes a fresh header into an object being initialised (the directory's).
pub(crate) fn header_bytes(geo: &Geometry) -> [u8; HEADER_SIZE as usize] {
    let mut bytes = [0u8; HEADER_SIZE as usize];
    bytes[..8].copy_from_slice(&MAP_MAGIC.to_le_bytes());
    bytes[8..16].copy_from_slice(&geo.encode().to_le_bytes());
    bytes
}

/// Reads and validates a map header: its geometry.
pub(crate) fn read_header<B: Backend>(pool: &Pool<B>, header: u64) -> Result<Geometry> {
    let b = pool.backend();
    if b.load_u64(header + H_MAGIC)? != MAP_MAGIC {
        return Err(CollectionError::corrupt(
            header,
            "map header has a wrong magic",
        ));
    }
    Geometry::decode(b.load_u64(header + H_GEOMETRY)?)
        .map_err(|what| CollectionError::corrupt(header + H_GEOMETRY, what))
}

/// An inner node's sample words for separators `seps` (see [`crate::layout`]).
pub(crate) fn sample_words(geo: &Geometry, seps: &[Vec<u8>]) -> [u64; INNER_SAMPLES as usize] {
    let block = geo.sample_block() as usize;
    let mut out = [u64::MAX; INNER_SAMPLES as usize];
    for (k, w) in out.iter_mut().enumerate() {
        if let Some(s) = seps.get((k + 1) * block) {
            *w = prefix_word(s);
        }
    }
    out
}

/// Whether `key` lies within `bound` taken as the low end (`low`) or the high end.
fn within(key: &[u8], bound: &Bound<Vec<u8>>, low: bool) -> bool {
    match (bound, low) {
        (Bound::Unbounded, _) => true,
        (Bound::Included(b), true) => key >= b.as_slice(),
        (Bound::Excluded(b), true) => key > b.as_slice(),
        (Bound::Included(b), false) => key <= b.as_slice(),
        (Bound::Excluded(b), false) => key < b.as_slice(),
    }
}

impl<'p, B: Backend> OrderedMap<'p, B> {
    /// Opens the map whose header is at `header` (validated). `Busy` when this process
    /// already has it open.
    pub(crate) fn attach(pool: &'p Pool<B>, header: u64) -> Result<Self> {
        let geo = read_header(pool, header)?;
        let open = OpenGuard::register(pool.uuid_lo(), header)?;
        Ok(OrderedMap {
            pool,
            header,
            geo,
            writer: Mutex::new(()),
            pages: Pages { pool, geo },
            seq: Seqlocks::default(),
            count: LazyCount::default(),
            _open: open,
        })
    }

    /// The pool offset of the map's header (what the directory binds).
    pub fn header(&self) -> Oid {
        Oid::from_offset(self.header).expect("a header is never at offset 0")
    }

    /// The sizes the map was created with.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Longest key accepted.
    pub fn max_key(&self) -> u32 {
        self.geo.key_cap
    }

    /// The pool the map lives in.
    pub fn pool(&self) -> &'p Pool<B> {
        self.pool
    }

    fn b(&self) -> &'p B {
        self.pages.b()
    }

    fn ld(&self, off: u64) -> Result<u64> {
        self.pages.ld(off)
    }

    /// Runs `f` in one pool transaction with readers held off (see [`Seqlocks`]).
    pub(crate) fn structural<T>(&self, f: impl FnOnce(&mut Tx<'p, B>) -> Result<T>) -> Result<T> {
        self.seq.structural(self.pool, f)
    }

    /// The root node and the height (0: the root is a leaf); root 0 for an empty map.
    fn root(&self) -> Result<(u64, u64)> {
        const _: () = assert!(H_HEIGHT == H_ROOT + 8);
        let mut words = [0u64; 2];
        self.pages.lds(self.header + H_ROOT, &mut words)?;
        let [root, height] = words;
        if height > MAX_HEIGHT {
            return Err(CollectionError::corrupt(
                self.header + H_HEIGHT,
                format!("height {height} is above {MAX_HEIGHT}"),
            ));
        }
        Ok((root, height))
    }

    fn inner_count(&self, node: u64) -> Result<u32> {
        self.checked_count(node, self.ld(node + INNER_COUNT)?)
    }

    /// `n`, read as `node`'s separator count, if it is one.
    fn checked_count(&self, node: u64, n: u64) -> Result<u32> {
        if n >= self.geo.fanout as u64 {
            return Err(CollectionError::corrupt(
                node,
                format!(
                    "inner node holds {n} separators, fanout is {}",
                    self.geo.fanout
                ),
            ));
        }
        Ok(n as u32)
    }

    fn child(&self, node: u64, i: u32) -> Result<u64> {
        let c = self.ld(node + self.geo.child_off(i))?;
        if c == 0 || c % 8 != 0 {
            return Err(CollectionError::corrupt(
                node + self.geo.child_off(i),
                format!("child {i} is {c:#x}"),
            ));
        }
        Ok(c)
    }

    /// Reads separator `i` of `node` into `buf`; returns its length.
    fn read_sep(&self, node: u64, i: u32, buf: &mut [u8; 256]) -> Result<usize> {
        let off = node + self.geo.sep_off(i);
        let mut raw = [0u8; 256];
        let n = 1 + self.geo.key_cap as usize;
        self.b().read(off, &mut raw[..n])?;
        let len = raw[0] as usize;
        if len > self.geo.key_cap as usize {
            return Err(CollectionError::corrupt(
                off,
                format!("separator of {len} bytes"),
            ));
        }
        buf[..len].copy_from_slice(&raw[1..1 + len]);
        Ok(len)
    }

    fn sep_vec(&self, node: u64, i: u32) -> Result<Vec<u8>> {
        let mut buf = [0u8; 256];
        let n = self.read_sep(node, i, &mut buf)?;
        Ok(buf[..n].to_vec())
    }

    /// Child index for `key` in `node`: the number of separators `<= key` (`upper`) or
    /// `< key`.
    fn route(&self, node: u64, key: &[u8], upper: bool) -> Result<(u32, u32)> {
        // The first line: the count, then the samples, which pick the block of prefix
        // words holding the first one not below `want` (each sample is its block's first
        // word).
        const _: () = assert!(INNER_COUNT == 0 && INNER_SAMPLE_OFF == 8 && INNER_SAMPLES == 7);
        let mut line = [0u64; 8];
        self.pages.lds(node, &mut line)?;
        let n = self.checked_count(node, line[0])?;
        let want = prefix_word(key);
        let block = self.geo.sample_block();
        let mut first = 0u32;
        for (k, &sample) in line[1..].iter().enumerate() {
            first += ((k as u32 + 1) * block < n && sample < want) as u32;
        }
        let start = first * block;
        let len = block.min(n.saturating_sub(start));
        // The search reads the block's prefix words, then one of its children: fetch
        // their lines together rather than one miss after another.
        self.pages
            .prefetch_range(node + self.geo.prefix_off(start), 8 * len as u64);
        self.pages
            .prefetch_range(node + self.geo.child_off(start), 8 * (len as u64 + 1));
        // How many prefix words of the block are below `want`: a count over the whole
        // block (16 words for 16-byte keys), whose loads do not wait for each other as a binary
        // search's do, and with no branch on the comparisons to mispredict.
        let mut below = 0;
        let mut words = [0u64; 32];
        for from in (start..start + len).step_by(words.len()) {
            let words = &mut words[..(start + len - from).min(32) as usize];
            self.pages.lds(node + self.geo.prefix_off(from), words)?;
            below += words.iter().map(|&w| (w < want) as u32).sum::<u32>();
        }
        let base = start + below;
        // Separators whose prefix word equals the key's are ordered by their whole bytes
        // (rare for keys that differ in their first eight bytes).
        let mut end = base;
        while end < n && self.ld(node + self.geo.prefix_off(end))? == want {
            end += 1;
        }
        let mut raw = [0u8; 256];
        let mut lo = base;
        let mut hi = end;
        while lo < hi {
            let mid = (lo + hi) / 2;
            let len = self.read_sep(node, mid, &mut raw)?;
            let c = raw[..len].cmp(key);
            if c == Cmp::Less || (upper && c == Cmp::Equal) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok((lo, n))
    }

    /// Descends to the leaf that holds `key`; fills `path` when given. `None` for an
    /// empty map.
    fn descend(&self, key: &[u8], mut path: Option<&mut Path>) -> Result<Option<u64>> {
        let (mut node, height) = self.root()?;
        if node == 0 {
            return Ok(None);
        }
        for _ in 0..height {
            let (i, _) = self.route(node, key, true)?;
            if let Some(p) = path.as_deref_mut() {
                p.push((node, i));
            }
            node = self.child(node, i)?;
        }
        Ok(Some(node))
    }

    /// Replaces `out` with the value of `key`; false when absent, when `out` is left as it
    /// was (unless the read was retried around a concurrent remove of the key: then it may
    /// hold that value or nothing).
    pub fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        let found = self.read_slot(key, |slot, at| {
            out.clear();
            slot.append_value(&self.pages, at, out)
        })?;
        Ok(found.is_some())
    }

    /// Copies the first `buf.len()` bytes of `key`'s value into `buf` and returns the
    /// value's whole length (compare it with `buf.len()` to see a cut); `None` when absent.
    /// Nothing is allocated.
    pub fn get_to(&self, key: &[u8], buf: &mut [u8]) -> Result<Option<u64>> {
        self.read_slot(key, |slot, at| slot.copy_value(&self.pages, at, buf))
    }

    /// Finds `key` and runs `read` on its slot (the slot's bytes, and its pool offset)
    /// within one consistent attempt; `None` when absent. `read` runs once per attempt
    /// that finds the key; the last attempt's result is returned.
    fn read_slot<T>(
        &self,
        key: &[u8],
        mut read: impl FnMut(&Slot, u64) -> Result<T>,
    ) -> Result<Option<T>> {
        self.geo.check_key(key)?;
        let h = key_hash(key);
        let mut slot = Slot::default();
        self.seq.read_consistent(|| {
            let Some(leaf) = self.descend(key, None)? else {
                return Ok((0, 0, Attempt::Done(None)));
            };
            self.pages.prefetch(leaf, h);
            let Some(v1) = self.seq.page_version(leaf) else {
                return Ok((0, 0, Attempt::Retry));
            };
            let Some(i) = self.pages.find_into(leaf, key, h, &mut slot)?.1 else {
                return Ok((leaf, v1, Attempt::Done(None)));
            };
            let value = read(&slot, leaf + self.geo.slot_off(i))?;
            Ok((leaf, v1, Attempt::Done(Some(value))))
        })
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut out = Vec::new();
        Ok(self.get_into(key, &mut out)?.then_some(out))
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        self.geo.check_key(key)?;
        let h = key_hash(key);
        self.seq.read_consistent(|| {
            let Some(leaf) = self.descend(key, None)? else {
                return Ok((0, 0, Attempt::Done(false)));
            };
            self.pages.prefetch(leaf, h);
            let Some(v1) = self.seq.page_version(leaf) else {
                return Ok((0, 0, Attempt::Retry));
            };
            let found = self.pages.find(leaf, key, h)?.1.is_some();
            Ok((leaf, v1, Attempt::Done(found)))
        })
    }

    /// Entries in the map. The first call counts them (every leaf's bitmap) under the
    /// writer lock; later calls read a counter writers keep.
    pub fn len(&self) -> Result<u64> {
        self.count.get(&self.writer, || {
            let mut n = 0u64;
            self.for_each_leaf(&mut |leaf| {
                n += (self.ld(leaf + LEAF_BITMAP)? & self.geo.full_bitmap()).count_ones() as u64;
                Ok(())
            })?;
            Ok(n)
        })
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Visits every leaf (writer lock held, or no concurrent writer).
    fn for_each_leaf(&self, f: &mut dyn FnMut(u64) -> Result<()>) -> Result<()> {
        let (root, height) = self.root()?;
        if root != 0 {
            self.walk(root, height, f)?;
        }
        Ok(())
    }

    fn walk(&self, node: u64, level: u64, f: &mut dyn FnMut(u64) -> Result<()>) -> Result<()> {
        if level == 0 {
            return f(node);
        }
        let n = self.inner_count(node)?;
        for i in 0..=n {
            self.walk(self.child(node, i)?, level - 1, f)?;
        }
        Ok(())
    }

    /// Every object of the map but its header: nodes and out-of-line values.
    pub(crate) fn objects(&self) -> Result<Vec<u64>> {
        let _w = self.lock();
        let (root, height) = self.root()?;
        let mut out = Vec::new();
        if root != 0 {
            self.collect(root, height, &mut out)?;
        }
        Ok(out)
    }

    fn collect(&self, node: u64, level: u64, out: &mut Vec<u64>) -> Result<()> {
        out.push(node);
        if level > 0 {
            for i in 0..=self.inner_count(node)? {
                self.collect(self.child(node, i)?, level - 1, out)?;
            }
            return Ok(());
        }
        let mut live = self.ld(node + LEAF_BITMAP)? & self.geo.full_bitmap();
        while live != 0 {
            let i = live.trailing_zeros();
            live &= live - 1;
            let vlen = self.pages.slot_vlen(node, i)?;
            out.extend(self.pages.slot_blob(node, i, vlen)?);
        }
        Ok(())
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.writer.lock()
    }

    /// Inserts or replaces `key`'s value; crash-atomic (after a crash the map holds the
    /// old value or the new one). Returns whether the key was new.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.geo.check_key(key)?;
        if value.len() as u64 > MAX_VALUE {
            return Err(CollectionError::ValueTooLong { len: value.len() });
        }
        let _w = self.lock();
        if let Some(added) = self.put_fast(key, value)? {
            self.count.record(added, false);
            return Ok(added);
        }
        let added = self.structural(|tx| self.put_tx(tx, key, value))?;
        self.count.record(added, false);
        Ok(added)
    }

    /// A put that touches one leaf and needs no allocation: write a free slot, persist,
    /// then swap the bitmap word (the commit point). `None` when it cannot.
    fn put_fast(&self, key: &[u8], value: &[u8]) -> Result<Option<bool>> {
        if value.len() > self.geo.val_area as usize {
            return Ok(None);
        }
        let Some(leaf) = self.descend(key, None)? else {
            return Ok(None);
        };
        let h = key_hash(key);
        let (bitmap, old) = self.pages.find(leaf, key, h)?;
        if let Some(i) = old {
            if self.pages.slot_vlen(leaf, i)? == OUT_OF_LINE {
                return Ok(None);
            }
        }
        let free = !bitmap & self.geo.full_bitmap();
        if free == 0 {
            return Ok(None);
        }
        let j = self.geo.pick_slot(free, h);
        self.pages
            .write_slot(leaf, j, key, value.len() as u8, value)?;
        self.pages.persist_slot(leaf, j, value.len())?;
        let new = (bitmap | 1 << j) & !old.map_or(0, |i| 1u64 << i);
        self.seq
            .commit_word(self.b(), leaf, leaf + LEAF_BITMAP, new)?;
        Ok(Some(old.is_none()))
    }

    /// A put inside a transaction (writer lock held, `structure` odd): makes room by
    /// splitting or moving entries when the leaf is full, stores long values out of line
    /// and frees a replaced out-of-line value.
    pub(crate) fn put_tx(&self, tx: &mut Tx<'p, B>, key: &[u8], value: &[u8]) -> Result<bool> {
        loop {
            let (root, _) = self.root()?;
            if root == 0 {
                let leaf = self.pages.new_page(tx, TYPE_LEAF)?;
                self.pages.txw_u64(tx, self.header + H_ROOT, leaf)?;
                self.pages.txw_u64(tx, self.header + H_HEIGHT, 0)?;
            }
            let mut path = Path::new();
            let leaf = self.descend(key, Some(&mut path))?.ok_or_else(|| {
                CollectionError::corrupt(self.header, "empty root after creating one")
            })?;
            let h = key_hash(key);
            let (bitmap, old) = self.pages.find(leaf, key, h)?;
            let free = !bitmap & self.geo.full_bitmap();
            if free == 0 {
                self.make_room(tx, &path, leaf)?;
                continue;
            }
            let j = self.geo.pick_slot(free, h);
            self.pages.write_slot_tx(tx, leaf, j, key, value)?;
            if let Some(i) = old {
                self.pages.free_value_tx(tx, leaf, i)?;
            }
            let new = (bitmap | 1 << j) & !old.map_or(0, |i| 1u64 << i);
            self.pages.txw_u64(tx, leaf + LEAF_BITMAP, new)?;
            return Ok(old.is_none());
        }
    }

    /// The live slots of a leaf sorted by key, with the leaf's bytes they index.
    fn sorted_entries(&self, leaf: u64) -> Result<(Vec<u32>, PageImage)> {
        let mut image = PageImage::default();
        image.load(&self.pages, leaf)?;
        let mut slots = image.live_slots(&self.geo, leaf)?;
        slots.sort_unstable_by(|&a, &b| image.key(&self.geo, a).cmp(image.key(&self.geo, b)));
        Ok((slots, image))
    }

    /// Copies the given slots of a leaf (from its image) into free slots of `to` and
    /// returns the bits of `to` they took (the caller commits both bitmaps). Out-of-line
    /// values move with their slot.
    fn copy_slots(
        &self,
        tx: &mut Tx<'p, B>,
        from: &PageImage,
        slots: &[u32],
        to: u64,
        to_bitmap: u64,
    ) -> Result<u64> {
        let mut free = !to_bitmap & self.geo.full_bitmap();
        let mut taken = 0u64;
        for &s in slots {
            let j = self.geo.pick_slot(free, key_hash(from.key(&self.geo, s)));
            free &= !(1 << j);
            taken |= 1 << j;
            self.pages
                .txw(tx, to + self.geo.slot_off(j), from.slot(&self.geo, s))?;
            self.pages
                .txw(tx, to + LEAF_FPS + j as u64, &[from.fingerprint(s)])?;
        }
        Ok(taken)
    }

    /// Makes a free slot in a full leaf: moves its highest entries into the right
    /// sibling or its lowest into the left one when that sibling is at most 7/8 full
    /// (which keeps leaves fuller than plain splits do), else splits it.
    fn make_room(&self, tx: &mut Tx<'p, B>, path: &[(u64, u32)], leaf: u64) -> Result<()> {
        let (sorted, image) = self.sorted_entries(leaf)?;
        let key_at = |k: usize| image.key(&self.geo, sorted[k]).to_vec();
        let cleared = |moved: &[u32]| moved.iter().fold(0u64, |m, &s| m | 1 << s);
        let slots = self.geo.leaf_slots;
        let min_free = (slots / 8).max(2);
        if let Some(&(parent, i)) = path.last() {
            let n = self.inner_count(parent)?;
            for right in [true, false] {
                if (right && i == n) || (!right && i == 0) {
                    continue;
                }
                let sib = self.child(parent, if right { i + 1 } else { i - 1 })?;
                let sib_bitmap = self.ld(sib + LEAF_BITMAP)? & self.geo.full_bitmap();
                let free = slots - sib_bitmap.count_ones();
                if free < min_free {
                    continue;
                }
                let t = (free / 2) as usize;
                let (moved, sep, sep_index) = if right {
                    let at = sorted.len() - t;
                    (&sorted[at..], key_at(at), i)
                } else {
                    (&sorted[..t], key_at(t), i - 1)
                };
                let taken = self.copy_slots(tx, &image, moved, sib, sib_bitmap)?;
                self.pages
                    .txw_u64(tx, sib + LEAF_BITMAP, sib_bitmap | taken)?;
                self.pages
                    .txw_u64(tx, leaf + LEAF_BITMAP, image.bitmap & !cleared(moved))?;
                self.write_sep(tx, parent, sep_index, &sep)?;
                return Ok(());
            }
        }
        let m = sorted.len() / 2;
        let right = self.pages.new_page(tx, TYPE_LEAF)?;
        let moved = &sorted[m..];
        let taken = self.copy_slots(tx, &image, moved, right, 0)?;
        self.b().store_u64(right + LEAF_BITMAP, taken)?;
        self.pages
            .txw_u64(tx, leaf + LEAF_BITMAP, image.bitmap & !cleared(moved))?;
        self.insert_child(tx, path, &key_at(m), right)
    }

    fn sep_bytes(&self, key: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; 1 + self.geo.key_cap as usize];
        buf[0] = key.len() as u8;
        buf[1..1 + key.len()].copy_from_slice(key);
        buf
    }

    fn write_sep(&self, tx: &mut Tx<'p, B>, node: u64, i: u32, key: &[u8]) -> Result<()> {
        self.pages
            .txw_u64(tx, node + self.geo.prefix_off(i), prefix_word(key))?;
        let block = self.geo.sample_block();
        if i > 0 && i.is_multiple_of(block) && i / block <= INNER_SAMPLES {
            let at = node + INNER_SAMPLE_OFF + 8 * (i / block - 1) as u64;
            self.pages.txw_u64(tx, at, prefix_word(key))?;
        }
        let bytes = self.sep_bytes(key);
        self.pages.txw(tx, node + self.geo.sep_off(i), &bytes)
    }

    /// Writes an inner node's count, and its separators and children from index `from`
    /// on (those before are unchanged), snapshotting what it overwrites.
    fn write_inner(
        &self,
        tx: &mut Tx<'p, B>,
        node: u64,
        seps: &[Vec<u8>],
        children: &[u64],
        from: usize,
    ) -> Result<()> {
        debug_assert_eq!(seps.len() + 1, children.len());
        self.pages
            .txw_u64(tx, node + INNER_COUNT, seps.len() as u64)?;
        let samples: Vec<u8> = sample_words(&self.geo, seps)
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
        self.pages.txw(tx, node + INNER_SAMPLE_OFF, &samples)?;
        let kids: Vec<u8> = children[from..]
            .iter()
            .flat_map(|c| c.to_le_bytes())
            .collect();
        self.pages
            .txw(tx, node + self.geo.child_off(from as u32), &kids)?;
        let mut keys = Vec::with_capacity(seps.len() * (1 + self.geo.key_cap as usize));
        for s in seps.iter().skip(from) {
            keys.extend_from_slice(&self.sep_bytes(s));
        }
        if !keys.is_empty() {
            self.pages
                .txw(tx, node + self.geo.sep_off(from as u32), &keys)?;
            let prefixes: Vec<u8> = seps[from..]
                .iter()
                .flat_map(|s| prefix_word(s).to_le_bytes())
                .collect();
            self.pages
                .txw(tx, node + self.geo.prefix_off(from as u32), &prefixes)?;
        }
        Ok(())
    }

    fn read_inner(&self, node: u64) -> Result<(Vec<Vec<u8>>, Vec<u64>)> {
        let n = self.inner_count(node)?;
        let mut seps = Vec::with_capacity(n as usize + 1);
        let mut children = Vec::with_capacity(n as usize + 2);
        for i in 0..n {
            seps.push(self.sep_vec(node, i)?);
        }
        for i in 0..=n {
            children.push(self.child(node, i)?);
        }
        Ok((seps, children))
    }

    /// Inserts `right` (whose keys start at `sep`) just right of the node at the end of
    /// `path`'s last step; splits full inner nodes up to a new root.
    fn insert_child(
        &self,
        tx: &mut Tx<'p, B>,
        path: &[(u64, u32)],
        sep: &[u8],
        right: u64,
    ) -> Result<()> {
        let Some((&(parent, i), up)) = path.split_last() else {
            let (root, height) = self.root()?;
            let node = tx.alloc(self.geo.inner_size(), TYPE_INNER)?.offset();
            self.write_inner(tx, node, &[sep.to_vec()], &[root, right], 0)?;
            self.pages.txw_u64(tx, self.header + H_ROOT, node)?;
            return self.pages.txw_u64(tx, self.header + H_HEIGHT, height + 1);
        };
        let (mut seps, mut children) = self.read_inner(parent)?;
        seps.insert(i as usize, sep.to_vec());
        children.insert(i as usize + 1, right);
        if seps.len() < self.geo.fanout as usize {
            return self.write_inner(tx, parent, &seps, &children, i as usize);
        }
        let mid = seps.len() / 2;
        let node = tx.alloc(self.geo.inner_size(), TYPE_INNER)?.offset();
        self.write_inner(tx, node, &seps[mid + 1..], &children[mid + 1..], 0)?;
        self.write_inner(tx, parent, &seps[..mid], &children[..=mid], 0)?;
        self.insert_child(tx, up, &seps[mid], node)
    }

    /// Removes `key`; crash-atomic. Returns whether it was present.
    pub fn remove(&self, key: &[u8]) -> Result<bool> {
        self.geo.check_key(key)?;
        let _w = self.lock();
        let mut path = Path::new();
        let Some(leaf) = self.descend(key, Some(&mut path))? else {
            return Ok(false);
        };
        let (bitmap, Some(i)) = self.pages.find(leaf, key, key_hash(key))? else {
            return Ok(false);
        };
        let vlen = self.pages.slot_vlen(leaf, i)?;
        let new = bitmap & !(1 << i);
        let merge_into = self.merge_target(&path, new.count_ones())?;
        if vlen != OUT_OF_LINE && (new != 0 || path.is_empty()) && merge_into.is_none() {
            self.seq
                .commit_word(self.b(), leaf, leaf + LEAF_BITMAP, new)?;
        } else {
            self.structural(|tx| {
                self.pages.free_value_tx(tx, leaf, i)?;
                self.pages.txw_u64(tx, leaf + LEAF_BITMAP, new)?;
                if let Some(sibling) = merge_into {
                    let mut image = PageImage::default();
                    image.load(&self.pages, leaf)?;
                    let live = image.live_slots(&self.geo, leaf)?;
                    let sib_bitmap = self.pages.bitmap(sibling)?;
                    let taken = self.copy_slots(tx, &image, &live, sibling, sib_bitmap)?;
                    self.pages
                        .txw_u64(tx, sibling + LEAF_BITMAP, sib_bitmap | taken)?;
                }
                if (new == 0 || merge_into.is_some()) && !path.is_empty() {
                    self.remove_node(tx, &path, leaf)?;
                }
                Ok(())
            })?;
        }
        self.count.record(false, true);
        Ok(true)
    }

    /// Where a leaf left with `live` entries merges, if it should: a leaf at most a
    /// quarter full goes into the sibling that takes over its key range when it is
    /// removed (the left one; the right one for a parent's first child), when the two fit
    /// in three quarters of a leaf. Keeps scans from walking near-empty leaves after many
    /// removes.
    fn merge_target(&self, path: &[(u64, u32)], live: u32) -> Result<Option<u64>> {
        let slots = self.geo.leaf_slots;
        let Some(&(parent, i)) = path.last() else {
            return Ok(None);
        };
        if live == 0 || live > slots / 4 || self.inner_count(parent)? == 0 {
            return Ok(None);
        }
        let sibling = self.child(parent, if i > 0 { i - 1 } else { 1 })?;
        let fits = self.pages.bitmap(sibling)?.count_ones() + live <= slots * 3 / 4;
        Ok(fits.then_some(sibling))
    }

    /// Frees `node` (an empty leaf, or an inner node left with no child) and removes it
    /// from its parent, the last step of `path`; collapses a root left with one child.
    fn remove_node(&self, tx: &mut Tx<'p, B>, path: &[(u64, u32)], node: u64) -> Result<()> {
        tx.free(Oid::from_offset(node).expect("nonzero"))?;
        let Some((&(parent, i), up)) = path.split_last() else {
            self.pages.txw_u64(tx, self.header + H_ROOT, 0)?;
            return self.pages.txw_u64(tx, self.header + H_HEIGHT, 0);
        };
        let (mut seps, mut children) = self.read_inner(parent)?;
        if seps.is_empty() {
            return self.remove_node(tx, up, parent);
        }
        children.remove(i as usize);
        seps.remove(i.saturating_sub(1) as usize);
        self.write_inner(tx, parent, &seps, &children, i.saturating_sub(1) as usize)?;
        if up.is_empty() {
            let (mut root, mut height) = (parent, self.root()?.1);
            while height > 0 && self.inner_count(root)? == 0 {
                let only = self.child(root, 0)?;
                tx.free(Oid::from_offset(root).expect("nonzero"))?;
                root = only;
                height -= 1;
            }
            if root != parent {
                self.pages.txw_u64(tx, self.header + H_ROOT, root)?;
                self.pages.txw_u64(tx, self.header + H_HEIGHT, height)?;
            }
        }
        Ok(())
    }

    /// A cursor over the keys within `(low, high)`, ascending, or descending when
    /// `reverse`. It reads one leaf at a time, each consistent; entries put or removed
    /// while it runs may or may not be seen.
    pub fn range(&self, low: Bound<&[u8]>, high: Bound<&[u8]>, reverse: bool) -> Range<'_, 'p, B> {
        let own = |b: Bound<&[u8]>| match b {
            Bound::Included(k) => Bound::Included(k.to_vec()),
            Bound::Excluded(k) => Bound::Excluded(k.to_vec()),
            Bound::Unbounded => Bound::Unbounded,
        };
        let (low, high) = (own(low), own(high));
        let (near, far) = if reverse { (high, low) } else { (low, high) };
        Range {
            map: self,
            near,
            far,
            reverse,
            batch: Batch::default(),
            pos: 0,
            done: false,
        }
    }

    /// Every entry, ascending.
    pub fn iter(&self) -> Range<'_, 'p, B> {
        self.range(Bound::Unbounded, Bound::Unbounded, false)
    }

    /// One consistent read of the leaf a cursor's `near` bound routes to: its entries
    /// within both bounds into `out`, in cursor order, and the next `near` (None: no leaf
    /// beyond).
    fn cursor_step(
        &self,
        near: &Bound<Vec<u8>>,
        far: &Bound<Vec<u8>>,
        reverse: bool,
        out: &mut Batch,
    ) -> Result<Option<Bound<Vec<u8>>>> {
        let next = self.seq.read_consistent(|| {
            out.clear();
            let (mut node, height) = self.root()?;
            if node == 0 {
                return Ok((0, 0, Attempt::Done(None)));
            }
            let (mut lower, mut upper) = (None, None);
            for _ in 0..height {
                let (i, n) = match (near, reverse) {
                    (Bound::Unbounded, false) => (0, self.inner_count(node)?),
                    (Bound::Unbounded, true) => {
                        let n = self.inner_count(node)?;
                        (n, n)
                    }
                    (Bound::Excluded(k), true) => self.route(node, k, false)?,
                    (Bound::Included(k) | Bound::Excluded(k), _) => self.route(node, k, true)?,
                };
                if i > 0 {
                    lower = Some((node, i - 1));
                }
                if i < n {
                    upper = Some((node, i));
                }
                node = self.child(node, i)?;
            }
            let leaf = node;
            let Some(v1) = self.seq.page_version(leaf) else {
                return Ok((0, 0, Attempt::Retry));
            };
            out.image.load(&self.pages, leaf)?;
            let (lo, hi) = if reverse { (far, near) } else { (near, far) };
            for i in out.image.live_slots(&self.geo, leaf)? {
                let key = out.image.key(&self.geo, i);
                if !(within(key, lo, true) && within(key, hi, false)) {
                    continue;
                }
                let k0 = out.arena.len();
                out.arena.extend_from_slice(key);
                let v0 = out.arena.len();
                out.image
                    .append_value(&self.pages, leaf, i, &mut out.arena)?;
                out.entries.push([k0, v0, out.arena.len()]);
            }
            let next = if reverse {
                lower
                    .map(|(n, i)| self.sep_vec(n, i).map(Bound::Excluded))
                    .transpose()?
            } else {
                upper
                    .map(|(n, i)| self.sep_vec(n, i).map(Bound::Included))
                    .transpose()?
            };
            Ok((leaf, v1, Attempt::Done(next)))
        })?;
        let arena = &out.arena;
        let key = |e: &[usize; 3]| &arena[e[0]..e[1]];
        if reverse {
            out.entries.sort_unstable_by(|a, b| key(b).cmp(key(a)));
        } else {
            out.entries.sort_unstable_by(|a, b| key(a).cmp(key(b)));
        }
        Ok(next)
    }
}

/// The entries of one leaf a cursor read: keys and values in `arena`, each entry
/// `[key start, value start, value end]`, in cursor order.
#[derive(Default)]
struct Batch {
    image: PageImage,
    arena: Vec<u8>,
    entries: Vec<[usize; 3]>,
}

impl Batch {
    fn clear(&mut self) {
        self.arena.clear();
        self.entries.clear();
    }
}

/// A cursor over an ordered map; see [`OrderedMap::range`]. [`Range::next_entry`] lends
/// each entry without allocating; as an iterator it yields owned `(key, value)` pairs.
pub struct Range<'m, 'p, B: Backend> {
    map: &'m OrderedMap<'p, B>,
    /// The bound the cursor has not yet passed (low end ascending, high end descending).
    near: Bound<Vec<u8>>,
    far: Bound<Vec<u8>>,
    reverse: bool,
    batch: Batch,
    pos: usize,
    done: bool,
}

impl<B: Backend> Range<'_, '_, B> {
    /// The next entry, borrowed until the next call; `None` at the end.
    pub fn next_entry(&mut self) -> Result<Option<(&[u8], &[u8])>> {
        while self.pos == self.batch.entries.len() && !self.done {
            self.pos = 0;
            let next =
                match self
                    .map
                    .cursor_step(&self.near, &self.far, self.reverse, &mut self.batch)
                {
                    Ok(next) => next,
                    Err(e) => {
                        self.done = true;
                        self.batch.clear();
                        return Err(e);
                    }
                };
            match next {
                Some(b) => {
                    let key = match &b {
                        Bound::Included(k) | Bound::Excluded(k) => k.as_slice(),
                        Bound::Unbounded => unreachable!("fences are keys"),
                    };
                    // Ascending, the next leaf's keys are >= its fence; descending, < it.
                    self.done = if self.reverse {
                        match &self.far {
                            Bound::Unbounded => false,
                            Bound::Included(f) | Bound::Excluded(f) => key <= f.as_slice(),
                        }
                    } else {
                        !within(key, &self.far, false)
                    };
                    self.near = b;
                }
                None => self.done = true,
            }
        }
        let Some(&[k, v, end]) = self.batch.entries.get(self.pos) else {
            return Ok(None);
        };
        self.pos += 1;
        let arena = &self.batch.arena;
        Ok(Some((&arena[k..v], &arena[v..end])))
    }
}

impl<B: Backend> Iterator for Range<'_, '_, B> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_entry()
            .map(|e| e.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .transpose()
    }
}

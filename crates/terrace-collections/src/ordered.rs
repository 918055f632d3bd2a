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
use std::collections::HashSet;
use std::ops::Bound;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};
use terrace_pool::{Backend, Oid, Pool, Tx};

use crate::error::{CollectionError, Result};
use crate::layout::{
    fingerprint, Geometry, HEADER_SIZE, H_GEOMETRY, H_HEIGHT, H_MAGIC, H_ROOT, INNER_COUNT,
    LEAF_BITMAP, LEAF_FPS, MAP_MAGIC, OUT_OF_LINE, TYPE_BLOB, TYPE_INNER, TYPE_LEAF, TYPE_MAP,
};

/// Stripe counters readers validate leaves against (a leaf maps to one by its offset).
const STRIPES: usize = 512;
/// Deepest tree a reader follows (guards a corrupt height word).
const MAX_HEIGHT: u64 = 32;
/// Largest out-of-line value (the blob's length word is 8 bytes; the C ABI returns a
/// signed 64-bit length).
const MAX_VALUE: u64 = u32::MAX as u64;

/// Maps open in this process, by (pool uuid, header offset): a map has one writer lock
/// and one set of counters, so it may be open once per process.
static OPEN: Mutex<Option<HashSet<(u64, u64)>>> = Mutex::new(None);

struct OpenGuard(u64, u64);

impl OpenGuard {
    fn register(uuid: u64, header: u64) -> Result<OpenGuard> {
        let mut open = OPEN.lock();
        if !open.get_or_insert_with(HashSet::new).insert((uuid, header)) {
            return Err(CollectionError::Busy { offset: header });
        }
        Ok(OpenGuard(uuid, header))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        if let Some(set) = OPEN.lock().as_mut() {
            set.remove(&(self.0, self.1));
        }
    }
}

/// Where a reader's attempt ended.
enum Attempt<T> {
    Done(T),
    Retry,
}

/// A leaf slot's two length bytes and its key.
struct SlotKey {
    buf: [u8; 258],
    klen: usize,
    vlen: u8,
}

impl SlotKey {
    fn key(&self) -> &[u8] {
        &self.buf[2..2 + self.klen]
    }
}

/// The way down to a leaf: `(inner node, child index taken)` from the root.
type Path = Vec<(u64, u32)>;

/// An open ordered map (bytes → bytes). See the module docs.
pub struct OrderedMap<'p, B: Backend> {
    pool: &'p Pool<B>,
    header: u64,
    geo: Geometry,
    writer: Mutex<()>,
    structure: AtomicU64,
    stripes: Box<[AtomicU64]>,
    len: AtomicU64,
    counted: AtomicBool,
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

fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
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
            structure: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
            len: AtomicU64::new(0),
            counted: AtomicBool::new(false),
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

    fn b(&self) -> &B {
        self.pool.backend()
    }

    fn ld(&self, off: u64) -> Result<u64> {
        Ok(self.b().load_u64(off)?)
    }

    fn stripe(&self, leaf: u64) -> &AtomicU64 {
        &self.stripes[(leaf >> 6) as usize % STRIPES]
    }

    fn check_key(&self, key: &[u8]) -> Result<()> {
        if key.len() > self.geo.key_cap as usize {
            return Err(CollectionError::KeyTooLong {
                len: key.len(),
                max: self.geo.key_cap,
            });
        }
        Ok(())
    }

    /// The root node and the height (0: the root is a leaf); root 0 for an empty map.
    fn root(&self) -> Result<(u64, u64)> {
        let root = self.ld(self.header + H_ROOT)?;
        let height = self.ld(self.header + H_HEIGHT)?;
        if height > MAX_HEIGHT {
            return Err(CollectionError::corrupt(
                self.header + H_HEIGHT,
                format!("height {height} is above {MAX_HEIGHT}"),
            ));
        }
        Ok((root, height))
    }

    fn inner_count(&self, node: u64) -> Result<u32> {
        let n = self.ld(node + INNER_COUNT)?;
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
        let n = self.inner_count(node)?;
        let (mut lo, mut hi) = (0u32, n);
        let mut raw = [0u8; 256];
        let width = 1 + self.geo.key_cap as usize;
        while lo < hi {
            let mid = (lo + hi) / 2;
            let off = node + self.geo.sep_off(mid);
            self.b().read(off, &mut raw[..width])?;
            let len = raw[0] as usize;
            if len > self.geo.key_cap as usize {
                return Err(CollectionError::corrupt(
                    off,
                    format!("separator of {len} bytes"),
                ));
            }
            let c = raw[1..1 + len].cmp(key);
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

    fn read_slot_key(&self, leaf: u64, slot: u32) -> Result<SlotKey> {
        let mut k = SlotKey {
            buf: [0u8; 258],
            klen: 0,
            vlen: 0,
        };
        let off = leaf + self.geo.slot_off(slot);
        let n = 2 + self.geo.key_cap as usize;
        self.b().read(off, &mut k.buf[..n])?;
        k.klen = k.buf[0] as usize;
        k.vlen = k.buf[1];
        if k.klen > self.geo.key_cap as usize {
            return Err(CollectionError::corrupt(
                off,
                format!("key of {} bytes", k.klen),
            ));
        }
        if k.vlen != OUT_OF_LINE && k.vlen as u32 > self.geo.val_area {
            return Err(CollectionError::corrupt(
                off,
                format!("inline value of {} bytes", k.vlen),
            ));
        }
        Ok(k)
    }

    /// The leaf's bitmap and the live slot holding `key`, if any.
    fn leaf_find(&self, leaf: u64, key: &[u8]) -> Result<(u64, Option<u32>)> {
        let bitmap = self.ld(leaf + LEAF_BITMAP)? & self.geo.full_bitmap();
        let fp = fingerprint(key);
        let mut fps = [0u8; 64];
        self.b()
            .read(leaf + LEAF_FPS, &mut fps[..self.geo.leaf_slots as usize])?;
        let mut live = bitmap;
        while live != 0 {
            let i = live.trailing_zeros();
            live &= live - 1;
            if fps[i as usize] != fp {
                continue;
            }
            if self.read_slot_key(leaf, i)?.key() == key {
                return Ok((bitmap, Some(i)));
            }
        }
        Ok((bitmap, None))
    }

    /// The out-of-line blob a slot refers to, if its value is out of line.
    fn slot_blob(&self, leaf: u64, slot: u32, vlen: u8) -> Result<Option<u64>> {
        if vlen != OUT_OF_LINE {
            return Ok(None);
        }
        // Slots are not word-aligned: read the reference as bytes.
        let at = leaf + self.geo.slot_off(slot) + 2 + self.geo.key_cap as u64;
        let mut word = [0u8; 8];
        self.b().read(at, &mut word)?;
        let blob = u64::from_le_bytes(word);
        if blob == 0 {
            return Err(CollectionError::corrupt(
                at,
                "out-of-line value at offset 0",
            ));
        }
        Ok(Some(blob))
    }

    /// Copies the value of a live slot into `out` (replacing its contents).
    fn read_value(&self, leaf: u64, slot: u32, vlen: u8, out: &mut Vec<u8>) -> Result<()> {
        let area = leaf + self.geo.slot_off(slot) + 2 + self.geo.key_cap as u64;
        out.clear();
        match self.slot_blob(leaf, slot, vlen)? {
            None => {
                out.resize(vlen as usize, 0);
                self.b().read(area, out)?;
            }
            Some(blob) => {
                let len = self.ld(blob)?;
                if len > MAX_VALUE || len > self.pool.size() {
                    return Err(CollectionError::corrupt(
                        blob,
                        format!("value of {len} bytes"),
                    ));
                }
                out.resize(len as usize, 0);
                self.b().read(blob + 8, out)?;
            }
        }
        Ok(())
    }

    /// Runs a reader's attempt until it saw a consistent state: `f` gets nothing and
    /// returns the leaf it validated against (0: none) with its result.
    fn read_consistent<T>(&self, mut f: impl FnMut() -> Result<(u64, u64, T)>) -> Result<T> {
        let mut spins = 0;
        loop {
            let s1 = self.structure.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let r = f();
                fence(Ordering::Acquire);
                let same = self.structure.load(Ordering::Relaxed) == s1;
                match r {
                    Ok((leaf, v1, value)) => {
                        if same && (leaf == 0 || self.stripe(leaf).load(Ordering::Relaxed) == v1) {
                            return Ok(value);
                        }
                    }
                    Err(e) if same => return Err(e),
                    Err(_) => {}
                }
            }
            backoff(&mut spins);
        }
    }

    /// Copies the value of `key` into `out`; false (and `out` unchanged) when absent.
    pub fn get_into(&self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        self.check_key(key)?;
        let mut spins = 0;
        loop {
            let attempt = self.read_consistent(|| {
                let Some(leaf) = self.descend(key, None)? else {
                    return Ok((0, 0, Attempt::Done(false)));
                };
                let v1 = self.stripe(leaf).load(Ordering::Acquire);
                if v1 & 1 == 1 {
                    return Ok((0, 0, Attempt::Retry));
                }
                let (_, slot) = self.leaf_find(leaf, key)?;
                let Some(i) = slot else {
                    return Ok((leaf, v1, Attempt::Done(false)));
                };
                let vlen = self.read_slot_key(leaf, i)?.vlen;
                self.read_value(leaf, i, vlen, out)?;
                Ok((leaf, v1, Attempt::Done(true)))
            })?;
            match attempt {
                Attempt::Done(found) => return Ok(found),
                Attempt::Retry => backoff(&mut spins),
            }
        }
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut out = Vec::new();
        Ok(self.get_into(key, &mut out)?.then_some(out))
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        self.check_key(key)?;
        let mut spins = 0;
        loop {
            let attempt = self.read_consistent(|| {
                let Some(leaf) = self.descend(key, None)? else {
                    return Ok((0, 0, Attempt::Done(false)));
                };
                let v1 = self.stripe(leaf).load(Ordering::Acquire);
                if v1 & 1 == 1 {
                    return Ok((0, 0, Attempt::Retry));
                }
                let (_, slot) = self.leaf_find(leaf, key)?;
                Ok((leaf, v1, Attempt::Done(slot.is_some())))
            })?;
            match attempt {
                Attempt::Done(found) => return Ok(found),
                Attempt::Retry => backoff(&mut spins),
            }
        }
    }

    /// Entries in the map. The first call counts them (every leaf's bitmap) under the
    /// writer lock; later calls read a counter writers keep.
    pub fn len(&self) -> Result<u64> {
        if !self.counted.load(Ordering::Acquire) {
            let _w = self.writer.lock();
            if !self.counted.load(Ordering::Relaxed) {
                let mut n = 0u64;
                self.for_each_leaf(&mut |leaf| {
                    n +=
                        (self.ld(leaf + LEAF_BITMAP)? & self.geo.full_bitmap()).count_ones() as u64;
                    Ok(())
                })?;
                self.len.store(n, Ordering::Relaxed);
                self.counted.store(true, Ordering::Release);
            }
        }
        Ok(self.len.load(Ordering::Relaxed))
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    fn count(&self, added: bool, removed: bool) {
        if self.counted.load(Ordering::Relaxed) && added != removed {
            if added {
                self.len.fetch_add(1, Ordering::Relaxed);
            } else {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
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
        let _w = self.lock()?;
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
            let vlen = self.read_slot_key(node, i)?.vlen;
            out.extend(self.slot_blob(node, i, vlen)?);
        }
        Ok(())
    }

    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, ()>> {
        Ok(self.writer.lock())
    }

    /// Inserts or replaces `key`'s value; crash-atomic (after a crash the map holds the
    /// old value or the new one). Returns whether the key was new.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.check_key(key)?;
        if value.len() as u64 > MAX_VALUE {
            return Err(CollectionError::ValueTooLong { len: value.len() });
        }
        let _w = self.lock()?;
        if let Some(added) = self.put_fast(key, value)? {
            self.count(added, false);
            return Ok(added);
        }
        let added = self.structural(|tx| self.put_tx(tx, key, value))?;
        self.count(added, false);
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
        let (bitmap, old) = self.leaf_find(leaf, key)?;
        if let Some(i) = old {
            if self.read_slot_key(leaf, i)?.vlen == OUT_OF_LINE {
                return Ok(None);
            }
        }
        let free = !bitmap & self.geo.full_bitmap();
        if free == 0 {
            return Ok(None);
        }
        let j = free.trailing_zeros();
        self.write_slot(leaf, j, key, value.len() as u8, value)?;
        let b = self.b();
        b.persist(
            leaf + self.geo.slot_off(j),
            2 + self.geo.key_cap as u64 + value.len() as u64,
        )?;
        b.persist(leaf + LEAF_FPS + j as u64, 1)?;
        let new = (bitmap | 1 << j) & !old.map_or(0, |i| 1u64 << i);
        let stripe = self.stripe(leaf);
        let v = stripe.load(Ordering::Relaxed);
        stripe.store(v + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        b.store_u64(leaf + LEAF_BITMAP, new)?;
        stripe.store(v + 2, Ordering::Release);
        b.persist(leaf + LEAF_BITMAP, 8)?;
        Ok(Some(old.is_none()))
    }

    /// Writes slot `j` (lengths, key, value area) and its fingerprint; not persisted.
    fn write_slot(&self, leaf: u64, j: u32, key: &[u8], vlen: u8, area: &[u8]) -> Result<()> {
        let mut buf = [0u8; 2 + 255 + 255];
        buf[0] = key.len() as u8;
        buf[1] = vlen;
        let k = self.geo.key_cap as usize;
        buf[2..2 + key.len()].copy_from_slice(key);
        buf[2 + k..2 + k + area.len()].copy_from_slice(area);
        let off = leaf + self.geo.slot_off(j);
        let b = self.b();
        b.write(off, &buf[..2 + k + area.len()])?;
        b.write(leaf + LEAF_FPS + j as u64, &[fingerprint(key)])?;
        Ok(())
    }

    /// Runs `f` in one pool transaction with `structure` odd (readers wait).
    pub(crate) fn structural<T>(&self, f: impl FnOnce(&mut Tx<'p, B>) -> Result<T>) -> Result<T> {
        let s = self.structure.load(Ordering::Relaxed);
        self.structure.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let r = (|| {
            let mut tx = self.pool.begin()?;
            let v = f(&mut tx)?;
            tx.commit()?;
            Ok(v)
        })();
        self.structure.store(s + 2, Ordering::Release);
        r
    }

    /// Snapshots `[off, off+len)` in `tx`, then writes `data` there.
    fn txw(&self, tx: &mut Tx<'p, B>, off: u64, data: &[u8]) -> Result<()> {
        tx.add_range_direct(off, data.len() as u64)?;
        self.b().write(off, data)?;
        Ok(())
    }

    fn txw_u64(&self, tx: &mut Tx<'p, B>, off: u64, v: u64) -> Result<()> {
        self.txw(tx, off, &v.to_le_bytes())
    }

    fn new_leaf(&self, tx: &mut Tx<'p, B>) -> Result<u64> {
        let leaf = tx.alloc(self.geo.leaf_size(), TYPE_LEAF)?.offset();
        self.b().store_u64(leaf + LEAF_BITMAP, 0)?;
        Ok(leaf)
    }

    /// A put inside a transaction (writer lock held, `structure` odd): makes room by
    /// splitting or moving entries when the leaf is full, stores long values out of line
    /// and frees a replaced out-of-line value.
    pub(crate) fn put_tx(&self, tx: &mut Tx<'p, B>, key: &[u8], value: &[u8]) -> Result<bool> {
        loop {
            let (root, _) = self.root()?;
            if root == 0 {
                let leaf = self.new_leaf(tx)?;
                self.txw_u64(tx, self.header + H_ROOT, leaf)?;
                self.txw_u64(tx, self.header + H_HEIGHT, 0)?;
            }
            let mut path = Path::new();
            let leaf = self.descend(key, Some(&mut path))?.ok_or_else(|| {
                CollectionError::corrupt(self.header, "empty root after creating one")
            })?;
            let (bitmap, old) = self.leaf_find(leaf, key)?;
            let free = !bitmap & self.geo.full_bitmap();
            if free == 0 {
                self.make_room(tx, &path, leaf)?;
                continue;
            }
            let j = free.trailing_zeros();
            let slot = leaf + self.geo.slot_off(j);
            tx.add_range_direct(slot, self.geo.slot_size())?;
            tx.add_range_direct(leaf + LEAF_FPS + j as u64, 1)?;
            if value.len() <= self.geo.val_area as usize {
                self.write_slot(leaf, j, key, value.len() as u8, value)?;
            } else {
                let blob = tx.alloc(8 + value.len() as u64, TYPE_BLOB)?;
                tx.write(blob, 0, &(value.len() as u64).to_le_bytes())?;
                tx.write(blob, 8, value)?;
                self.write_slot(leaf, j, key, OUT_OF_LINE, &blob.offset().to_le_bytes())?;
            }
            if let Some(i) = old {
                let vlen = self.read_slot_key(leaf, i)?.vlen;
                if let Some(blob) = self.slot_blob(leaf, i, vlen)? {
                    tx.free(Oid::from_offset(blob).expect("nonzero"))?;
                }
            }
            let new = (bitmap | 1 << j) & !old.map_or(0, |i| 1u64 << i);
            self.txw_u64(tx, leaf + LEAF_BITMAP, new)?;
            return Ok(old.is_none());
        }
    }

    /// The live slots of a leaf sorted by key, with the leaf's bytes they index.
    fn sorted_entries(&self, leaf: u64) -> Result<(Vec<u32>, LeafImage)> {
        let mut image = LeafImage::default();
        image.load(self, leaf)?;
        let mut slots = image.live_slots(self, leaf)?;
        slots.sort_unstable_by(|&a, &b| image.key(&self.geo, a).cmp(image.key(&self.geo, b)));
        Ok((slots, image))
    }

    /// Copies the given slots of a leaf (from its image) into free slots of `to` and
    /// returns the bits of `to` they took (the caller commits both bitmaps). Out-of-line
    /// values move with their slot.
    fn copy_slots(
        &self,
        tx: &mut Tx<'p, B>,
        from: &LeafImage,
        slots: &[u32],
        to: u64,
        to_bitmap: u64,
    ) -> Result<u64> {
        let mut free = !to_bitmap & self.geo.full_bitmap();
        let mut taken = 0u64;
        for &s in slots {
            let j = free.trailing_zeros();
            free &= free - 1;
            taken |= 1 << j;
            self.txw(tx, to + self.geo.slot_off(j), from.slot(&self.geo, s))?;
            self.txw(tx, to + LEAF_FPS + j as u64, &[from.fingerprint(s)])?;
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
                self.txw_u64(tx, sib + LEAF_BITMAP, sib_bitmap | taken)?;
                self.txw_u64(tx, leaf + LEAF_BITMAP, image.bitmap & !cleared(moved))?;
                self.write_sep(tx, parent, sep_index, &sep)?;
                return Ok(());
            }
        }
        let m = sorted.len() / 2;
        let right = self.new_leaf(tx)?;
        let moved = &sorted[m..];
        let taken = self.copy_slots(tx, &image, moved, right, 0)?;
        self.b().store_u64(right + LEAF_BITMAP, taken)?;
        self.txw_u64(tx, leaf + LEAF_BITMAP, image.bitmap & !cleared(moved))?;
        self.insert_child(tx, path, &key_at(m), right)
    }

    fn sep_bytes(&self, key: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; 1 + self.geo.key_cap as usize];
        buf[0] = key.len() as u8;
        buf[1..1 + key.len()].copy_from_slice(key);
        buf
    }

    fn write_sep(&self, tx: &mut Tx<'p, B>, node: u64, i: u32, key: &[u8]) -> Result<()> {
        let bytes = self.sep_bytes(key);
        self.txw(tx, node + self.geo.sep_off(i), &bytes)
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
        self.txw_u64(tx, node + INNER_COUNT, seps.len() as u64)?;
        let kids: Vec<u8> = children[from..]
            .iter()
            .flat_map(|c| c.to_le_bytes())
            .collect();
        self.txw(tx, node + self.geo.child_off(from as u32), &kids)?;
        let mut keys = Vec::with_capacity(seps.len() * (1 + self.geo.key_cap as usize));
        for s in seps.iter().skip(from) {
            keys.extend_from_slice(&self.sep_bytes(s));
        }
        if !keys.is_empty() {
            self.txw(tx, node + self.geo.sep_off(from as u32), &keys)?;
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
            self.txw_u64(tx, self.header + H_ROOT, node)?;
            return self.txw_u64(tx, self.header + H_HEIGHT, height + 1);
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
        self.check_key(key)?;
        let _w = self.lock()?;
        let mut path = Path::new();
        let Some(leaf) = self.descend(key, Some(&mut path))? else {
            return Ok(false);
        };
        let (bitmap, Some(i)) = self.leaf_find(leaf, key)? else {
            return Ok(false);
        };
        let vlen = self.read_slot_key(leaf, i)?.vlen;
        let new = bitmap & !(1 << i);
        if vlen != OUT_OF_LINE && (new != 0 || path.is_empty()) {
            let b = self.b();
            let stripe = self.stripe(leaf);
            let v = stripe.load(Ordering::Relaxed);
            stripe.store(v + 1, Ordering::Relaxed);
            fence(Ordering::Release);
            b.store_u64(leaf + LEAF_BITMAP, new)?;
            stripe.store(v + 2, Ordering::Release);
            b.persist(leaf + LEAF_BITMAP, 8)?;
        } else {
            self.structural(|tx| {
                if let Some(blob) = self.slot_blob(leaf, i, vlen)? {
                    tx.free(Oid::from_offset(blob).expect("nonzero"))?;
                }
                self.txw_u64(tx, leaf + LEAF_BITMAP, new)?;
                if new == 0 && !path.is_empty() {
                    self.remove_node(tx, &path, leaf)?;
                }
                Ok(())
            })?;
        }
        self.count(false, true);
        Ok(true)
    }

    /// Frees `node` (an empty leaf, or an inner node left with no child) and removes it
    /// from its parent, the last step of `path`; collapses a root left with one child.
    fn remove_node(&self, tx: &mut Tx<'p, B>, path: &[(u64, u32)], node: u64) -> Result<()> {
        tx.free(Oid::from_offset(node).expect("nonzero"))?;
        let Some((&(parent, i), up)) = path.split_last() else {
            self.txw_u64(tx, self.header + H_ROOT, 0)?;
            return self.txw_u64(tx, self.header + H_HEIGHT, 0);
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
                self.txw_u64(tx, self.header + H_ROOT, root)?;
                self.txw_u64(tx, self.header + H_HEIGHT, height)?;
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
        let mut spins = 0;
        loop {
            let attempt = self.read_consistent(|| {
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
                        (Bound::Included(k) | Bound::Excluded(k), _) => {
                            self.route(node, k, true)?
                        }
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
                let v1 = self.stripe(leaf).load(Ordering::Acquire);
                if v1 & 1 == 1 {
                    return Ok((0, 0, Attempt::Retry));
                }
                out.image.load(self, leaf)?;
                let (lo, hi) = if reverse { (far, near) } else { (near, far) };
                for i in out.image.live_slots(self, leaf)? {
                    let key = out.image.key(&self.geo, i);
                    if !(within(key, lo, true) && within(key, hi, false)) {
                        continue;
                    }
                    let k0 = out.arena.len();
                    out.arena.extend_from_slice(key);
                    let v0 = out.arena.len();
                    let vlen = out.image.vlen(&self.geo, i);
                    if vlen == OUT_OF_LINE {
                        let blob = self.slot_blob(leaf, i, vlen)?.expect("out of line");
                        let len = self.ld(blob)?;
                        if len > MAX_VALUE || len > self.pool.size() {
                            return Err(CollectionError::corrupt(
                                blob,
                                format!("value of {len} bytes"),
                            ));
                        }
                        out.arena.resize(v0 + len as usize, 0);
                        self.b().read(blob + 8, &mut out.arena[v0..])?;
                    } else {
                        out.arena.extend_from_slice(
                            &out.image.value_area(&self.geo, i)[..vlen as usize],
                        );
                    }
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
            match attempt {
                Attempt::Done(next) => {
                    let arena = &out.arena;
                    let key = |e: &[usize; 3]| &arena[e[0]..e[1]];
                    if reverse {
                        out.entries.sort_unstable_by(|a, b| key(b).cmp(key(a)));
                    } else {
                        out.entries.sort_unstable_by(|a, b| key(a).cmp(key(b)));
                    }
                    return Ok(next);
                }
                Attempt::Retry => backoff(&mut spins),
            }
        }
    }
}

/// A copy of one leaf's bytes (one read), parsed in place. Slots are read through
/// [`LeafImage::live_slots`], which validates their lengths first.
#[derive(Default)]
struct LeafImage {
    bytes: Vec<u8>,
    bitmap: u64,
}

impl LeafImage {
    fn load<B: Backend>(&mut self, map: &OrderedMap<'_, B>, leaf: u64) -> Result<()> {
        self.bytes.resize(map.geo.leaf_size() as usize, 0);
        map.b().read(leaf, &mut self.bytes)?;
        let word = u64::from_le_bytes(self.bytes[..8].try_into().expect("8 bytes"));
        self.bitmap = word & map.geo.full_bitmap();
        Ok(())
    }

    /// The live slots, each checked: key and inline value lengths within the geometry.
    fn live_slots<B: Backend>(&self, map: &OrderedMap<'_, B>, leaf: u64) -> Result<Vec<u32>> {
        let geo = &map.geo;
        let mut live = self.bitmap;
        let mut out = Vec::with_capacity(live.count_ones() as usize);
        while live != 0 {
            let i = live.trailing_zeros();
            live &= live - 1;
            let slot = self.slot(geo, i);
            let (klen, vlen) = (slot[0], slot[1]);
            if klen as u32 > geo.key_cap {
                let at = leaf + geo.slot_off(i);
                return Err(CollectionError::corrupt(at, format!("key of {klen} bytes")));
            }
            if vlen != OUT_OF_LINE && vlen as u32 > geo.val_area {
                let at = leaf + geo.slot_off(i);
                return Err(CollectionError::corrupt(
                    at,
                    format!("inline value of {vlen} bytes"),
                ));
            }
            out.push(i);
        }
        Ok(out)
    }

    fn slot(&self, geo: &Geometry, i: u32) -> &[u8] {
        let at = geo.slot_off(i) as usize;
        &self.bytes[at..at + geo.slot_size() as usize]
    }

    fn key(&self, geo: &Geometry, i: u32) -> &[u8] {
        let slot = self.slot(geo, i);
        &slot[2..2 + (slot[0] as usize).min(geo.key_cap as usize)]
    }

    fn vlen(&self, geo: &Geometry, i: u32) -> u8 {
        self.slot(geo, i)[1]
    }

    fn value_area(&self, geo: &Geometry, i: u32) -> &[u8] {
        &self.slot(geo, i)[2 + geo.key_cap as usize..]
    }

    fn fingerprint(&self, i: u32) -> u8 {
        self.bytes[LEAF_FPS as usize + i as usize]
    }
}

/// The entries of one leaf a cursor read: keys and values in `arena`, each entry
/// `[key start, value start, value end]`, in cursor order.
#[derive(Default)]
struct Batch {
    image: LeafImage,
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

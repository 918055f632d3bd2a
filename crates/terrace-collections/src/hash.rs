//! The hash map: linear hashing over bucket chains of slotted pages (the ordered map's
//! leaf layout), growing one bucket split at a time, so no operation ever rehashes the
//! whole table (no stop-the-world pause).
//!
//! Owns [`HashMap`] (an open hash map) and [`HashIter`] (a cursor over it, in no order).
//!
//! Layout: a header (`magic, geometry, state, table`), where `state` is
//! `level << 56 | split`: the map has `2^level + split` buckets and bucket `b` of a key
//! whose 64-bit hash is `h` is `h mod 2^level`, or `h mod 2^(level+1)` when that is below
//! `split`. `table` is an object of `capacity` segment offsets; a segment holds
//! `geometry.fanout` bucket words, each the first page of the bucket's chain (0: empty).
//! Pages chain through their next word.
//!
//! Commit protocol and crash argument: as the ordered map's (crate docs). A put or remove
//! that stays within one page and allocates nothing commits by the page's bitmap word;
//! everything else runs in one pool transaction: appending an overflow page (then one
//! bucket split in the same transaction: the entries of bucket `split` are copied into
//! fresh pages for it and for bucket `split + 2^level`, the old pages freed, the segment
//! words and `state` rewritten), growing the table, out-of-line values.
//!
//! Invariants: every key lives in the chain of the bucket its hash addresses under the
//! current `state`; pages of a chain are never shared; buckets below `2^level + split`
//! only are addressed; the table only grows (removes leave empty pages, which the bucket's
//! next split drops). Concurrency as [`crate::ordered`]: one writer at a time, readers
//! validate every page they read against its stripe and the structure counter.

use std::sync::atomic::{fence, Ordering};

use parking_lot::{Mutex, MutexGuard};
use terrace_pool::{Backend, Oid, Pool, Tx};

use crate::error::{CollectionError, Result};
use crate::layout::{
    Geometry, LEAF_BITMAP, OUT_OF_LINE, TYPE_BUCKET, TYPE_HASH, TYPE_SEGMENT, TYPE_TABLE,
};
use crate::page::{PageImage, Pages, Slot, MAX_VALUE};
use crate::sync::{Attempt, LazyCount, OpenGuard, Seqlocks};

/// Header: magic.
pub const HASH_MAGIC: u64 = u64::from_le_bytes(*b"TRCHASH1");
/// Header word offsets: magic, geometry, state (`level << 56 | split`), table.
pub const HH_MAGIC: u64 = 0;
pub const HH_GEOMETRY: u64 = 8;
pub const HH_STATE: u64 = 16;
pub const HH_TABLE: u64 = 24;
/// Bytes of a hash map header.
pub const HASH_HEADER_SIZE: u64 = 64;
/// Bucket words per segment (a hash map's `geometry.fanout`).
pub const SEGMENT_BUCKETS: u32 = 512;
/// Segments a new table has room for; each growth doubles it.
const FIRST_TABLE: u64 = 8;
/// Most levels (2^48 buckets).
pub const MAX_LEVEL: u64 = 48;
/// Longest chain a reader follows (guards a cycle in corrupt next words).
const MAX_CHAIN: usize = 1 << 16;

/// A key's 64-bit hash ([`crate::layout::key_hash`]): its bucket is the low bits.
pub(crate) use crate::layout::key_hash as hash_of;

/// The bucket of hash `h` under `state`.
pub(crate) fn bucket_of(h: u64, state: u64) -> u64 {
    let (level, split) = (state >> 56, state & ((1 << 56) - 1));
    let b = h & ((1u64 << level) - 1);
    if b < split {
        h & ((1u64 << (level + 1)) - 1)
    } else {
        b
    }
}

/// Buckets that exist under `state`.
pub(crate) fn bucket_count(state: u64) -> u64 {
    (1u64 << (state >> 56)) + (state & ((1 << 56) - 1))
}

/// The geometry of a hash map for keys up to `max_key` bytes, values inline up to
/// `inline_value` bytes.
pub(crate) fn hash_geometry(max_key: u32, inline_value: u32) -> Geometry {
    Geometry {
        fanout: SEGMENT_BUCKETS,
        ..Geometry::new(max_key, inline_value)
    }
}

/// Allocates a hash map header in `tx`.
pub(crate) fn create_hash_header<B: Backend>(tx: &mut Tx<'_, B>, geo: &Geometry) -> Result<Oid> {
    geo.validate()
        .map_err(|detail| CollectionError::InvalidArgument {
            what: "geometry",
            detail,
        })?;
    let oid = tx.alloc(HASH_HEADER_SIZE, TYPE_HASH)?;
    let mut bytes = [0u8; HASH_HEADER_SIZE as usize];
    bytes[..8].copy_from_slice(&HASH_MAGIC.to_le_bytes());
    bytes[8..16].copy_from_slice(&geo.encode().to_le_bytes());
    tx.write(oid, 0, &bytes)?;
    Ok(oid)
}

/// Reads and validates a hash map header: its geometry and state.
pub(crate) fn read_hash_header<B: Backend>(pool: &Pool<B>, header: u64) -> Result<(Geometry, u64)> {
    let b = pool.backend();
    if b.load_u64(header + HH_MAGIC)? != HASH_MAGIC {
        return Err(CollectionError::corrupt(
            header,
            "hash map header has a wrong magic",
        ));
    }
    let geo = Geometry::decode(b.load_u64(header + HH_GEOMETRY)?)
        .map_err(|what| CollectionError::corrupt(header + HH_GEOMETRY, what))?;
    let state = b.load_u64(header + HH_STATE)?;
    if state >> 56 > MAX_LEVEL || state & ((1 << 56) - 1) >= 1u64 << (state >> 56) {
        return Err(CollectionError::corrupt(
            header + HH_STATE,
            format!("state {state:#x}"),
        ));
    }
    Ok((geo, state))
}

/// Pages visited by one read, with the stripe version each had.
type Seen = Vec<(u64, u64)>;

/// An open hash map (bytes → bytes). See the module docs.
pub struct HashMap<'p, B: Backend> {
    pool: &'p Pool<B>,
    header: u64,
    geo: Geometry,
    pages: Pages<'p, B>,
    seq: Seqlocks,
    writer: Mutex<()>,
    count: LazyCount,
    _open: OpenGuard,
}

impl<B: Backend> std::fmt::Debug for HashMap<'_, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HashMap")
            .field("header", &format_args!("{:#x}", self.header))
            .field("geometry", &self.geo)
            .finish()
    }
}

impl<'p, B: Backend> HashMap<'p, B> {
    /// Opens the hash map whose header is at `header` (validated). `Busy` when this
    /// process already has it open.
    pub(crate) fn attach(pool: &'p Pool<B>, header: u64) -> Result<Self> {
        let (geo, _) = read_hash_header(pool, header)?;
        let open = OpenGuard::register(pool.uuid_lo(), header)?;
        Ok(HashMap {
            pool,
            header,
            geo,
            pages: Pages { pool, geo },
            seq: Seqlocks::default(),
            writer: Mutex::new(()),
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

    /// Buckets the map has now.
    pub fn buckets(&self) -> Result<u64> {
        Ok(bucket_count(self.state()?))
    }

    fn b(&self) -> &'p B {
        self.pages.b()
    }

    fn ld(&self, off: u64) -> Result<u64> {
        self.pages.ld(off)
    }

    fn state(&self) -> Result<u64> {
        let state = self.ld(self.header + HH_STATE)?;
        if state >> 56 > MAX_LEVEL {
            return Err(CollectionError::corrupt(
                self.header + HH_STATE,
                format!("state {state:#x}"),
            ));
        }
        Ok(state)
    }

    /// The pool offset of bucket `b`'s word (0 when its segment does not exist yet).
    fn bucket_word(&self, b: u64) -> Result<u64> {
        let table = self.ld(self.header + HH_TABLE)?;
        if table == 0 {
            return Ok(0);
        }
        let seg_index = b / self.geo.fanout as u64;
        let capacity = self.ld(table)?;
        if seg_index >= capacity {
            return Ok(0);
        }
        let segment = self.ld(table + 8 + 8 * seg_index)?;
        if segment == 0 {
            return Ok(0);
        }
        Ok(segment + 8 * (b % self.geo.fanout as u64))
    }

    /// The first page of bucket `b`'s chain (0: empty).
    fn bucket_head(&self, b: u64) -> Result<u64> {
        match self.bucket_word(b)? {
            0 => Ok(0),
            at => self.ld(at),
        }
    }

    /// The pages of a chain, in order.
    fn chain(&self, head: u64) -> Result<Vec<u64>> {
        let mut pages = Vec::new();
        let mut page = head;
        while page != 0 {
            if pages.len() >= MAX_CHAIN {
                return Err(CollectionError::corrupt(head, "bucket chain does not end"));
            }
            pages.push(page);
            page = self.pages.next(page)?;
        }
        Ok(pages)
    }

    /// Validates the pages `seen` against their stripes: `Done(value)` if none changed.
    fn settle<T>(&self, seen: &Seen, value: T) -> Attempt<T> {
        fence(Ordering::Acquire);
        let same = seen
            .iter()
            .all(|&(p, v)| self.seq.stripe(p).load(Ordering::Relaxed) == v);
        if same {
            Attempt::Done(value)
        } else {
            Attempt::Retry
        }
    }

    /// Finds `key` in its bucket: the page and slot holding it, if any, recording the
    /// pages read in `seen`. `None` (retry) when a page was being changed.
    fn locate(
        &self,
        key: &[u8],
        h: u64,
        seen: &mut Seen,
        slot: &mut Slot,
    ) -> Result<Option<Option<(u64, u32)>>> {
        let state = self.state()?;
        let mut page = self.bucket_head(bucket_of(h, state))?;
        while page != 0 {
            if seen.len() >= MAX_CHAIN {
                return Err(CollectionError::corrupt(page, "bucket chain does not end"));
            }
            let Some(v) = self.seq.page_version(page) else {
                return Ok(None);
            };
            seen.push((page, v));
            self.pages.prefetch(page, h);
            if let (_, Some(i)) = self.pages.find_into(page, key, h, slot)? {
                return Ok(Some(Some((page, i))));
            }
            page = self.pages.next(page)?;
        }
        Ok(Some(None))
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
    /// value's whole length; `None` when absent. Nothing is allocated.
    pub fn get_to(&self, key: &[u8], buf: &mut [u8]) -> Result<Option<u64>> {
        self.read_slot(key, |slot, at| slot.copy_value(&self.pages, at, buf))
    }

    /// Finds `key` and runs `read` on its slot (bytes and pool offset) within one
    /// consistent attempt; `None` when absent. `read` runs once per attempt that finds the
    /// key; the last attempt's result is returned.
    fn read_slot<T>(
        &self,
        key: &[u8],
        mut read: impl FnMut(&Slot, u64) -> Result<T>,
    ) -> Result<Option<T>> {
        self.geo.check_key(key)?;
        let h = hash_of(key);
        let mut seen = Seen::new();
        let mut slot = Slot::default();
        self.seq.read_consistent(|| {
            seen.clear();
            let Some(found) = self.locate(key, h, &mut seen, &mut slot)? else {
                return Ok((0, 0, Attempt::Retry));
            };
            let Some((page, i)) = found else {
                return Ok((0, 0, self.settle(&seen, None)));
            };
            let value = read(&slot, page + self.geo.slot_off(i))?;
            Ok((0, 0, self.settle(&seen, Some(value))))
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
        let h = hash_of(key);
        let mut seen = Seen::new();
        let mut slot = Slot::default();
        self.seq.read_consistent(|| {
            seen.clear();
            let Some(found) = self.locate(key, h, &mut seen, &mut slot)? else {
                return Ok((0, 0, Attempt::Retry));
            };
            Ok((0, 0, self.settle(&seen, found.is_some())))
        })
    }

    /// Entries in the map. The first call counts them under the writer lock; later
    /// calls read a counter writers keep.
    pub fn len(&self) -> Result<u64> {
        self.count.get(&self.writer, || {
            let mut n = 0u64;
            for b in 0..bucket_count(self.state()?) {
                for page in self.chain(self.bucket_head(b)?)? {
                    n += self.pages.bitmap(page)?.count_ones() as u64;
                }
            }
            Ok(n)
        })
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.writer.lock()
    }

    /// Inserts or replaces `key`'s value; crash-atomic. Returns whether the key was new.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<bool> {
        self.geo.check_key(key)?;
        if value.len() as u64 > MAX_VALUE {
            return Err(CollectionError::ValueTooLong { len: value.len() });
        }
        let _w = self.lock();
        let h = hash_of(key);
        let added = match self.put_fast(key, h, value)? {
            Some(added) => added,
            None => self
                .seq
                .structural(self.pool, |tx| self.put_tx(tx, key, h, value))?,
        };
        self.count.record(added, false);
        Ok(added)
    }

    /// A put within one page that allocates nothing; `None` when it cannot.
    fn put_fast(&self, key: &[u8], h: u64, value: &[u8]) -> Result<Option<bool>> {
        if value.len() > self.geo.val_area as usize {
            return Ok(None);
        }
        let head = self.bucket_head(bucket_of(h, self.state()?))?;
        if head == 0 {
            return Ok(None);
        }
        let mut target = None;
        let (mut page, mut visited) = (head, 0);
        while page != 0 {
            visited += 1;
            if visited > MAX_CHAIN {
                return Err(CollectionError::corrupt(head, "bucket chain does not end"));
            }
            let (bitmap, old) = self.pages.find(page, key, h)?;
            let free = !bitmap & self.geo.full_bitmap();
            if let Some(i) = old {
                if free == 0 || self.pages.slot_vlen(page, i)? == OUT_OF_LINE {
                    return Ok(None);
                }
                target = Some((page, bitmap, Some(i)));
                break;
            }
            if target.is_none() && free != 0 {
                target = Some((page, bitmap, None));
            }
            page = self.pages.next(page)?;
        }
        let Some((page, bitmap, old)) = target else {
            return Ok(None);
        };
        let j = self.geo.pick_slot(!bitmap & self.geo.full_bitmap(), h);
        self.pages
            .write_slot(page, j, key, value.len() as u8, value)?;
        self.pages.persist_slot(page, j, value.len())?;
        let new = (bitmap | 1 << j) & !old.map_or(0, |i| 1u64 << i);
        self.seq
            .commit_word(self.b(), page, page + LEAF_BITMAP, new)?;
        Ok(Some(old.is_none()))
    }

    /// A put inside a transaction: creates the table and the bucket's first page,
    /// appends an overflow page (and splits one bucket) when the chain is full, stores a
    /// long value out of line, frees a replaced one.
    pub(crate) fn put_tx(
        &self,
        tx: &mut Tx<'p, B>,
        key: &[u8],
        h: u64,
        value: &[u8],
    ) -> Result<bool> {
        let state = self.state()?;
        let b = bucket_of(h, state);
        let word = self.ensure_bucket_word(tx, b)?;
        let head = self.ld(word)?;
        let chain = self.chain(head)?;
        let mut old = None;
        let mut room = None;
        for &page in &chain {
            let (bitmap, found) = self.pages.find(page, key, h)?;
            if let Some(i) = found {
                old = Some((page, i));
            }
            if room.is_none() && bitmap != self.geo.full_bitmap() {
                room = Some(page);
            }
        }
        let mut grew = false;
        let page = match room {
            Some(page) => page,
            None => {
                let page = self.pages.new_page(tx, TYPE_BUCKET)?;
                match chain.last() {
                    Some(&last) => self.pages.txw_u64(tx, last + self.geo.next_off(), page)?,
                    None => self.pages.txw_u64(tx, word, page)?,
                }
                grew = !chain.is_empty();
                page
            }
        };
        let bitmap = self.pages.bitmap(page)?;
        let j = self.geo.pick_slot(!bitmap & self.geo.full_bitmap(), h);
        self.pages.write_slot_tx(tx, page, j, key, value)?;
        self.pages
            .txw_u64(tx, page + LEAF_BITMAP, bitmap | 1 << j)?;
        if let Some((old_page, i)) = old {
            self.pages.free_value_tx(tx, old_page, i)?;
            let bits = self.pages.bitmap(old_page)?;
            self.pages
                .txw_u64(tx, old_page + LEAF_BITMAP, bits & !(1 << i))?;
        }
        if grew {
            self.split(tx)?;
        }
        Ok(old.is_none())
    }

    /// The pool offset of bucket `b`'s word, creating the table and its segment in `tx`
    /// when missing (doubling a full table).
    fn ensure_bucket_word(&self, tx: &mut Tx<'p, B>, b: u64) -> Result<u64> {
        let seg_index = b / self.geo.fanout as u64;
        let mut table = self.ld(self.header + HH_TABLE)?;
        let capacity = if table == 0 { 0 } else { self.ld(table)? };
        if seg_index >= capacity {
            let new_capacity = (capacity * 2).max(FIRST_TABLE).max(seg_index + 1);
            let new_table = tx.alloc(8 + 8 * new_capacity, TYPE_TABLE)?.offset();
            let mut bytes = vec![0u8; 8 + 8 * new_capacity as usize];
            bytes[..8].copy_from_slice(&new_capacity.to_le_bytes());
            if table != 0 {
                self.b()
                    .read(table + 8, &mut bytes[8..8 + 8 * capacity as usize])?;
                tx.free(Oid::from_offset(table).expect("nonzero"))?;
            }
            self.b().write(new_table, &bytes)?;
            self.pages.txw_u64(tx, self.header + HH_TABLE, new_table)?;
            table = new_table;
        }
        let seg_at = table + 8 + 8 * seg_index;
        let mut segment = self.ld(seg_at)?;
        if segment == 0 {
            segment = tx
                .zalloc(8 * self.geo.fanout as u64, TYPE_SEGMENT)?
                .offset();
            self.pages.txw_u64(tx, seg_at, segment)?;
        }
        Ok(segment + 8 * (b % self.geo.fanout as u64))
    }

    /// Splits bucket `split` into itself and `split + 2^level` and advances the state:
    /// both chains are rebuilt from fresh pages (compacting them), the old pages freed.
    fn split(&self, tx: &mut Tx<'p, B>) -> Result<()> {
        let state = self.state()?;
        let (level, split) = (state >> 56, state & ((1 << 56) - 1));
        if level >= MAX_LEVEL {
            return Ok(());
        }
        let high = split + (1u64 << level);
        let old_word = self.ensure_bucket_word(tx, split)?;
        let new_word = self.ensure_bucket_word(tx, high)?;
        let old_chain = self.chain(self.ld(old_word)?)?;
        let mut image = PageImage::default();
        let mut stay: Vec<Vec<u8>> = Vec::new();
        let mut moved: Vec<Vec<u8>> = Vec::new();
        let mut fps_stay = Vec::new();
        let mut fps_moved = Vec::new();
        for &page in &old_chain {
            image.load(&self.pages, page)?;
            for i in image.live_slots(&self.geo, page)? {
                let h = hash_of(image.key(&self.geo, i));
                let (slots, fps) = if h >> level & 1 == 1 {
                    (&mut moved, &mut fps_moved)
                } else {
                    (&mut stay, &mut fps_stay)
                };
                slots.push(image.slot(&self.geo, i).to_vec());
                fps.push(image.fingerprint(i));
            }
        }
        let stay_head = self.fill_chain(tx, &stay, &fps_stay)?;
        let moved_head = self.fill_chain(tx, &moved, &fps_moved)?;
        for &page in &old_chain {
            tx.free(Oid::from_offset(page).expect("nonzero"))?;
        }
        self.pages.txw_u64(tx, old_word, stay_head)?;
        self.pages.txw_u64(tx, new_word, moved_head)?;
        let next = if split + 1 == 1u64 << level {
            (level + 1) << 56
        } else {
            level << 56 | (split + 1)
        };
        self.pages.txw_u64(tx, self.header + HH_STATE, next)
    }

    /// Fresh pages holding `slots` (raw slot bytes, out-of-line values moving with
    /// them), chained; the first page's offset (0 for no slot).
    fn fill_chain(&self, tx: &mut Tx<'p, B>, slots: &[Vec<u8>], fps: &[u8]) -> Result<u64> {
        let per = self.geo.leaf_slots as usize;
        let mut head = 0;
        let mut prev = 0;
        for (chunk, chunk_fps) in slots.chunks(per).zip(fps.chunks(per)) {
            let page = self.pages.new_page(tx, TYPE_BUCKET)?;
            let b = self.b();
            // Each entry at or after its home slot, as a put places it (see
            // `Geometry::pick_slot`), so that lookups find it where they prefetch.
            let mut free = self.geo.full_bitmap();
            for (slot, &fp) in chunk.iter().zip(chunk_fps) {
                let key = &slot[2..2 + slot[0] as usize];
                let j = self.geo.pick_slot(free, hash_of(key));
                free &= !(1 << j);
                b.write(page + self.geo.slot_off(j), slot)?;
                b.write(page + crate::layout::LEAF_FPS + j as u64, &[fp])?;
            }
            let bits = self.geo.full_bitmap() & !free;
            b.store_u64(page + LEAF_BITMAP, bits)?;
            if prev == 0 {
                head = page;
            } else {
                b.store_u64(prev + self.geo.next_off(), page)?;
            }
            prev = page;
        }
        Ok(head)
    }

    /// Removes `key`; crash-atomic. Returns whether it was present.
    pub fn remove(&self, key: &[u8]) -> Result<bool> {
        self.geo.check_key(key)?;
        let _w = self.lock();
        let h = hash_of(key);
        let mut seen = Seen::new();
        let mut slot = Slot::default();
        let Some((page, i)) = self.locate(key, h, &mut seen, &mut slot)?.flatten() else {
            return Ok(false);
        };
        let bitmap = self.pages.bitmap(page)?;
        if self.pages.slot_vlen(page, i)? != OUT_OF_LINE {
            self.seq
                .commit_word(self.b(), page, page + LEAF_BITMAP, bitmap & !(1 << i))?;
        } else {
            self.seq.structural(self.pool, |tx| {
                self.pages.free_value_tx(tx, page, i)?;
                self.pages
                    .txw_u64(tx, page + LEAF_BITMAP, bitmap & !(1 << i))
            })?;
        }
        self.count.record(false, true);
        Ok(true)
    }

    /// Every object of the map but its header: table, segments, pages, blobs.
    pub(crate) fn objects(&self) -> Result<Vec<u64>> {
        let _w = self.lock();
        let mut out = Vec::new();
        let table = self.ld(self.header + HH_TABLE)?;
        if table == 0 {
            return Ok(out);
        }
        out.push(table);
        for s in 0..self.ld(table)? {
            let segment = self.ld(table + 8 + 8 * s)?;
            if segment == 0 {
                continue;
            }
            out.push(segment);
            for w in 0..self.geo.fanout as u64 {
                for page in self.chain(self.ld(segment + 8 * w)?)? {
                    out.push(page);
                    let mut live = self.pages.bitmap(page)?;
                    while live != 0 {
                        let i = live.trailing_zeros();
                        live &= live - 1;
                        let vlen = self.pages.slot_vlen(page, i)?;
                        out.extend(self.pages.slot_blob(page, i, vlen)?);
                    }
                }
            }
        }
        Ok(out)
    }

    /// A cursor over every entry, bucket by bucket (no order). Each bucket is read
    /// consistently; entries put or removed while it runs may or may not be seen, and a
    /// split during the walk may show an entry twice.
    pub fn iter(&self) -> HashIter<'_, 'p, B> {
        HashIter {
            map: self,
            bucket: 0,
            image: PageImage::default(),
            arena: Vec::new(),
            entries: Vec::new(),
            pos: 0,
            done: false,
        }
    }

    /// Reads bucket `b` consistently into `arena`/`entries`; returns the bucket count.
    fn read_bucket(
        &self,
        b: u64,
        image: &mut PageImage,
        arena: &mut Vec<u8>,
        entries: &mut Vec<[usize; 3]>,
    ) -> Result<u64> {
        let mut seen = Seen::new();
        self.seq.read_consistent(|| {
            seen.clear();
            arena.clear();
            entries.clear();
            let count = bucket_count(self.state()?);
            if b >= count {
                return Ok((0, 0, self.settle(&seen, count)));
            }
            let mut page = self.bucket_head(b)?;
            while page != 0 {
                if seen.len() >= MAX_CHAIN {
                    return Err(CollectionError::corrupt(page, "bucket chain does not end"));
                }
                let Some(v) = self.seq.page_version(page) else {
                    return Ok((0, 0, Attempt::Retry));
                };
                seen.push((page, v));
                image.load(&self.pages, page)?;
                for i in image.live_slots(&self.geo, page)? {
                    let k0 = arena.len();
                    arena.extend_from_slice(image.key(&self.geo, i));
                    let v0 = arena.len();
                    image.append_value(&self.pages, page, i, arena)?;
                    entries.push([k0, v0, arena.len()]);
                }
                page = self.pages.next(page)?;
            }
            Ok((0, 0, self.settle(&seen, count)))
        })
    }
}

/// A cursor over a hash map; see [`HashMap::iter`]. [`HashIter::next_entry`] lends each
/// entry; as an iterator it yields owned `(key, value)` pairs.
pub struct HashIter<'m, 'p, B: Backend> {
    map: &'m HashMap<'p, B>,
    bucket: u64,
    image: PageImage,
    arena: Vec<u8>,
    entries: Vec<[usize; 3]>,
    pos: usize,
    done: bool,
}

impl<B: Backend> HashIter<'_, '_, B> {
    /// The next entry, borrowed until the next call; `None` at the end.
    pub fn next_entry(&mut self) -> Result<Option<(&[u8], &[u8])>> {
        while self.pos == self.entries.len() && !self.done {
            self.pos = 0;
            match self.map.read_bucket(
                self.bucket,
                &mut self.image,
                &mut self.arena,
                &mut self.entries,
            ) {
                Ok(count) => {
                    self.bucket += 1;
                    self.done = self.bucket >= count;
                }
                Err(e) => {
                    self.done = true;
                    self.entries.clear();
                    return Err(e);
                }
            }
        }
        let Some(&[k, v, end]) = self.entries.get(self.pos) else {
            return Ok(None);
        };
        self.pos += 1;
        Ok(Some((&self.arena[k..v], &self.arena[v..end])))
    }
}

impl<B: Backend> Iterator for HashIter<'_, '_, B> {
    type Item = Result<(Vec<u8>, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_entry()
            .map(|e| e.map(|(k, v)| (k.to_vec(), v.to_vec())))
            .transpose()
    }
}

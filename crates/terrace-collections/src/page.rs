//! Slotted pages, the unit both maps store entries in: an ordered map's leaf and a hash
//! map's bucket page share one layout ([`crate::layout`]): a live-slot bitmap, a next
//! word, fingerprints, slots of `key_len, value_len, key, value area`, with long values in
//! blob objects.
//!
//! Owns [`Pages`] (reading, finding, writing slots of one geometry) and [`PageImage`] (a
//! page copied in one read and parsed in place).
//!
//! Invariants: a slot is read only when its bitmap bit is set; its lengths are validated
//! before its bytes are used, so corrupt contents are [`CollectionError::Corrupt`], never
//! a panic or an out-of-range read. A slot is written only while its bit is clear.

use terrace_pool::{Backend, Oid, Pool, Tx};

use crate::error::{CollectionError, Result};
use crate::layout::{
    fingerprint, fingerprint_of, Geometry, LEAF_BITMAP, LEAF_FPS, MAX_LEAF_SLOTS, OUT_OF_LINE,
    TYPE_BLOB,
};

/// Largest value a collection stores (the C ABI returns a signed 64-bit length; 4 GiB
/// keeps a blob within any sane pool).
pub(crate) const MAX_VALUE: u64 = u32::MAX as u64;

/// One slot's bytes (lengths, key area, value area), read in one copy: a lookup compares
/// the key and takes an inline value from the same read. Slots of up to 64 bytes (keys
/// and inline values that small) live on the stack.
pub(crate) struct Slot {
    small: [u8; 64],
    big: Vec<u8>,
    len: usize,
}

impl Default for Slot {
    fn default() -> Self {
        Slot {
            small: [0; 64],
            big: Vec::new(),
            len: 0,
        }
    }
}

/// Lines a lookup prefetches from its home slot on ([`Pages::prefetch`]): an entry sits
/// at its home slot or some slots after it (placement probes forward from home, and
/// leaves run three-quarters full or more), and four lines hold about ten 26-byte slots
/// (two and three lines measured slower at 200K keys).
const PREFETCH_SLOT_LINES: u64 = 4;

/// Slots up to this many bytes are read as exactly this many (see [`Slot::fill`]).
const FIXED_READ: usize = 32;

impl Slot {
    fn bytes(&self) -> &[u8] {
        if self.len <= self.small.len() {
            &self.small[..self.len]
        } else {
            &self.big[..self.len]
        }
    }

    fn fill<B: Backend>(&mut self, pages: &Pages<'_, B>, page: u64, i: u32) -> Result<()> {
        let geo = &pages.geo;
        let off = page + geo.slot_off(i);
        self.len = geo.slot_size() as usize;
        let buf = if self.len <= FIXED_READ {
            // 32 bytes when the pool has them: a copy of constant length is two vector
            // moves, not a call (the bytes past the slot are never looked at).
            if pages.b().read(off, &mut self.small[..FIXED_READ]).is_ok() {
                &mut self.small[..self.len]
            } else {
                let buf = &mut self.small[..self.len];
                pages.b().read(off, buf)?;
                buf
            }
        } else if self.len <= self.small.len() {
            let buf = &mut self.small[..self.len];
            pages.b().read(off, buf)?;
            buf
        } else {
            self.big.resize(self.len, 0);
            pages.b().read(off, &mut self.big)?;
            &mut self.big[..]
        };
        let (klen, vlen) = (buf[0] as u32, buf[1]);
        if klen > geo.key_cap {
            return Err(CollectionError::corrupt(
                off,
                format!("key of {klen} bytes"),
            ));
        }
        if vlen != OUT_OF_LINE && vlen as u32 > geo.val_area {
            return Err(CollectionError::corrupt(
                off,
                format!("inline value of {vlen} bytes"),
            ));
        }
        Ok(())
    }

    pub(crate) fn key(&self) -> &[u8] {
        let b = self.bytes();
        &b[2..2 + b[0] as usize]
    }

    pub(crate) fn vlen(&self) -> u8 {
        self.bytes()[1]
    }

    /// Copies the first `buf.len()` bytes of the value into `buf` and returns its whole
    /// length (`at`: the slot's offset, for errors).
    pub(crate) fn copy_value<B: Backend>(
        &self,
        pages: &Pages<'_, B>,
        at: u64,
        buf: &mut [u8],
    ) -> Result<u64> {
        let area = &self.bytes()[2 + pages.geo.key_cap as usize..];
        let vlen = self.vlen();
        if vlen != OUT_OF_LINE {
            let n = (vlen as usize).min(buf.len());
            buf[..n].copy_from_slice(&area[..n]);
            return Ok(vlen as u64);
        }
        let blob = u64::from_le_bytes(area[..8].try_into().expect("8 bytes"));
        let len = pages.blob_len(blob, at)?;
        let n = (len as usize).min(buf.len());
        pages.b().read(blob + 8, &mut buf[..n])?;
        Ok(len)
    }

    /// Appends the value to `out`: the inline bytes, or the blob's (`key_cap` locates the
    /// value area).
    pub(crate) fn append_value<B: Backend>(
        &self,
        pages: &Pages<'_, B>,
        at: u64,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let area = &self.bytes()[2 + pages.geo.key_cap as usize..];
        let vlen = self.vlen();
        if vlen != OUT_OF_LINE {
            out.extend_from_slice(&area[..vlen as usize]);
            return Ok(());
        }
        let blob = u64::from_le_bytes(area[..8].try_into().expect("8 bytes"));
        pages.read_blob(blob, at, out)
    }
}

/// Bit `k` (of the low eight) set where byte `k` of the little-endian `word` equals `fp`:
/// each zero byte of `word ^ fp repeated` found exactly (no false positive) and its high
/// bit gathered.
fn fingerprint_matches(word: u64, fp: u8) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    let x = word ^ u64::from_ne_bytes([fp; 8]);
    // High bit of each byte set iff that byte of x is zero.
    let zero = !(((x & LOW7) + LOW7) | x | LOW7);
    // Gather the eight high bits (byte k's to bit k).
    ((zero >> 7).wrapping_mul(0x0102_0408_1020_4080)) >> 56
}

/// Slot access for pages of one geometry in one pool.
pub(crate) struct Pages<'p, B: Backend> {
    pub(crate) pool: &'p Pool<B>,
    pub(crate) geo: Geometry,
}

impl<'p, B: Backend> Pages<'p, B> {
    pub(crate) fn b(&self) -> &'p B {
        self.pool.backend()
    }

    pub(crate) fn ld(&self, off: u64) -> Result<u64> {
        Ok(self.b().load_u64(off)?)
    }

    /// Loads `out.len()` consecutive words from `off` (one bounds check).
    pub(crate) fn lds(&self, off: u64, out: &mut [u64]) -> Result<()> {
        Ok(self.b().load_words(off, out)?)
    }

    pub(crate) fn bitmap(&self, page: u64) -> Result<u64> {
        Ok(self.ld(page + LEAF_BITMAP)? & self.geo.full_bitmap())
    }

    pub(crate) fn next(&self, page: u64) -> Result<u64> {
        self.ld(page + self.geo.next_off())
    }

    /// A live slot's value length byte (`OUT_OF_LINE` for a blob), its lengths checked.
    pub(crate) fn slot_vlen(&self, page: u64, slot: u32) -> Result<u8> {
        let off = page + self.geo.slot_off(slot);
        let mut lens = [0u8; 2];
        self.b().read(off, &mut lens)?;
        let [klen, vlen] = lens;
        if klen as u32 > self.geo.key_cap {
            return Err(CollectionError::corrupt(
                off,
                format!("key of {klen} bytes"),
            ));
        }
        if vlen != OUT_OF_LINE && vlen as u32 > self.geo.val_area {
            return Err(CollectionError::corrupt(
                off,
                format!("inline value of {vlen} bytes"),
            ));
        }
        Ok(vlen)
    }

    /// Starts loading what a lookup of hash `h` in `page` reads: the page's first line
    /// and [`PREFETCH_SLOT_LINES`] lines from its home slot on, where
    /// [`Geometry::pick_slot`] put the entry or a few slots after, so their misses overlap
    /// instead of following each other.
    pub(crate) fn prefetch(&self, page: u64, h: u64) {
        let b = self.b();
        b.prefetch(page);
        let slot = page + self.geo.slot_off(self.geo.home_slot(h));
        for line in 0..PREFETCH_SLOT_LINES {
            b.prefetch(slot + 64 * line);
        }
    }

    /// Starts loading every cache line of `[off, off + len)` (a hint, as
    /// [`Pages::prefetch`]).
    pub(crate) fn prefetch_range(&self, off: u64, len: u64) {
        let b = self.b();
        let mut line = off & !63;
        while line < off + len {
            b.prefetch(line);
            line += 64;
        }
    }

    /// The page's bitmap and the live slot holding `key` (hash `h`), if any.
    pub(crate) fn find(&self, page: u64, key: &[u8], h: u64) -> Result<(u64, Option<u32>)> {
        self.find_into(page, key, h, &mut Slot::default())
    }

    /// [`Pages::find`], leaving the found slot's bytes in `slot`.
    pub(crate) fn find_into(
        &self,
        page: u64,
        key: &[u8],
        h: u64,
        slot: &mut Slot,
    ) -> Result<(u64, Option<u32>)> {
        let fp = fingerprint_of(h);
        // The first line: the bitmap, then the fingerprint area, 56 bytes whatever the
        // slot count. Its seven words, each compared eight bytes at once and masked by the
        // bitmap, leave the one or two slots whose key is worth reading. (Loaded as words,
        // not copied out as bytes: bytes read back as words stall on store forwarding.)
        const _: () = assert!(LEAF_BITMAP == 0 && LEAF_FPS == 8 && MAX_LEAF_SLOTS == 56);
        let mut line = [0u64; 8];
        self.lds(page + LEAF_BITMAP, &mut line)?;
        let bitmap = line[0] & self.geo.full_bitmap();
        let mut candidates = 0u64;
        for (c, &word) in line[1..].iter().enumerate() {
            candidates |= fingerprint_matches(word, fp) << (8 * c);
        }
        candidates &= bitmap;
        while candidates != 0 {
            let i = candidates.trailing_zeros();
            candidates &= candidates - 1;
            slot.fill(self, page, i)?;
            if slot.key() == key {
                return Ok((bitmap, Some(i)));
            }
        }
        Ok((bitmap, None))
    }

    /// The out-of-line blob a slot refers to, if its value is out of line.
    pub(crate) fn slot_blob(&self, page: u64, slot: u32, vlen: u8) -> Result<Option<u64>> {
        if vlen != OUT_OF_LINE {
            return Ok(None);
        }
        // Slots are not word-aligned: read the reference as bytes.
        let at = page + self.geo.slot_off(slot) + 2 + self.geo.key_cap as u64;
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

    /// The length of the blob at `blob` that the slot at `at` refers to, checked.
    pub(crate) fn blob_len(&self, blob: u64, at: u64) -> Result<u64> {
        if blob == 0 {
            return Err(CollectionError::corrupt(
                at,
                "out-of-line value at offset 0",
            ));
        }
        let len = self.ld(blob)?;
        if len > MAX_VALUE || len > self.pool.size() {
            return Err(CollectionError::corrupt(
                blob,
                format!("value of {len} bytes"),
            ));
        }
        Ok(len)
    }

    /// Appends the bytes of the blob at `blob`, which the slot at `at` refers to, to `out`.
    pub(crate) fn read_blob(&self, blob: u64, at: u64, out: &mut Vec<u8>) -> Result<()> {
        let len = self.blob_len(blob, at)?;
        let start = out.len();
        out.resize(start + len as usize, 0);
        self.b().read(blob + 8, &mut out[start..])?;
        Ok(())
    }

    /// Writes slot `j` (lengths, key, value area) and its fingerprint; not persisted.
    pub(crate) fn write_slot(
        &self,
        page: u64,
        j: u32,
        key: &[u8],
        vlen: u8,
        area: &[u8],
    ) -> Result<()> {
        let mut buf = [0u8; 2 + 255 + 255];
        buf[0] = key.len() as u8;
        buf[1] = vlen;
        let k = self.geo.key_cap as usize;
        buf[2..2 + key.len()].copy_from_slice(key);
        buf[2 + k..2 + k + area.len()].copy_from_slice(area);
        let off = page + self.geo.slot_off(j);
        let b = self.b();
        b.write(off, &buf[..2 + k + area.len()])?;
        b.write(page + LEAF_FPS + j as u64, &[fingerprint(key)])?;
        Ok(())
    }

    /// Persists what [`Pages::write_slot`] wrote for an inline value of `vlen` bytes.
    pub(crate) fn persist_slot(&self, page: u64, j: u32, vlen: usize) -> Result<()> {
        let b = self.b();
        b.persist(
            page + self.geo.slot_off(j),
            2 + self.geo.key_cap as u64 + vlen as u64,
        )?;
        b.persist(page + LEAF_FPS + j as u64, 1)?;
        Ok(())
    }

    /// Writes slot `j` inside `tx`: snapshotted first (a slot freed earlier in the same
    /// transaction would be live again after a rollback), the value out of line in a new
    /// blob when it does not fit the area.
    pub(crate) fn write_slot_tx(
        &self,
        tx: &mut Tx<'p, B>,
        page: u64,
        j: u32,
        key: &[u8],
        value: &[u8],
    ) -> Result<()> {
        tx.add_range_direct(page + self.geo.slot_off(j), self.geo.slot_size())?;
        tx.add_range_direct(page + LEAF_FPS + j as u64, 1)?;
        if value.len() <= self.geo.val_area as usize {
            return self.write_slot(page, j, key, value.len() as u8, value);
        }
        let blob = tx.alloc(8 + value.len() as u64, TYPE_BLOB)?;
        tx.write(blob, 0, &(value.len() as u64).to_le_bytes())?;
        tx.write(blob, 8, value)?;
        self.write_slot(page, j, key, OUT_OF_LINE, &blob.offset().to_le_bytes())
    }

    /// Frees slot `i`'s out-of-line value in `tx`, if it has one.
    pub(crate) fn free_value_tx(&self, tx: &mut Tx<'p, B>, page: u64, i: u32) -> Result<()> {
        let vlen = self.slot_vlen(page, i)?;
        if let Some(blob) = self.slot_blob(page, i, vlen)? {
            tx.free(Oid::from_offset(blob).expect("checked nonzero"))?;
        }
        Ok(())
    }

    /// Snapshots `[off, off+len)` in `tx`, then writes `data` there.
    pub(crate) fn txw(&self, tx: &mut Tx<'p, B>, off: u64, data: &[u8]) -> Result<()> {
        tx.add_range_direct(off, data.len() as u64)?;
        self.b().write(off, data)?;
        Ok(())
    }

    pub(crate) fn txw_u64(&self, tx: &mut Tx<'p, B>, off: u64, v: u64) -> Result<()> {
        self.txw(tx, off, &v.to_le_bytes())
    }

    /// A new empty page of type `type_num` in `tx`.
    pub(crate) fn new_page(&self, tx: &mut Tx<'p, B>, type_num: u64) -> Result<u64> {
        let page = tx.alloc(self.geo.leaf_size(), type_num)?.offset();
        self.b().store_u64(page + LEAF_BITMAP, 0)?;
        self.b().store_u64(page + self.geo.next_off(), 0)?;
        Ok(page)
    }
}

/// A copy of one page's bytes (one read), parsed in place. Slots are read through
/// [`PageImage::live_slots`], which validates their lengths first.
#[derive(Default)]
pub(crate) struct PageImage {
    bytes: Vec<u8>,
    pub(crate) bitmap: u64,
}

impl PageImage {
    pub(crate) fn load<B: Backend>(&mut self, pages: &Pages<'_, B>, page: u64) -> Result<()> {
        self.bytes.resize(pages.geo.leaf_size() as usize, 0);
        pages.b().read(page, &mut self.bytes)?;
        let word = u64::from_le_bytes(self.bytes[..8].try_into().expect("8 bytes"));
        self.bitmap = word & pages.geo.full_bitmap();
        Ok(())
    }

    /// The live slots, each checked: key and inline value lengths within the geometry.
    pub(crate) fn live_slots(&self, geo: &Geometry, page: u64) -> Result<Vec<u32>> {
        let mut live = self.bitmap;
        let mut out = Vec::with_capacity(live.count_ones() as usize);
        while live != 0 {
            let i = live.trailing_zeros();
            live &= live - 1;
            let slot = self.slot(geo, i);
            let (klen, vlen) = (slot[0], slot[1]);
            let at = page + geo.slot_off(i);
            if klen as u32 > geo.key_cap {
                return Err(CollectionError::corrupt(at, format!("key of {klen} bytes")));
            }
            if vlen != OUT_OF_LINE && vlen as u32 > geo.val_area {
                return Err(CollectionError::corrupt(
                    at,
                    format!("inline value of {vlen} bytes"),
                ));
            }
            out.push(i);
        }
        Ok(out)
    }

    pub(crate) fn slot(&self, geo: &Geometry, i: u32) -> &[u8] {
        let at = geo.slot_off(i) as usize;
        &self.bytes[at..at + geo.slot_size() as usize]
    }

    pub(crate) fn key(&self, geo: &Geometry, i: u32) -> &[u8] {
        let slot = self.slot(geo, i);
        &slot[2..2 + (slot[0] as usize).min(geo.key_cap as usize)]
    }

    pub(crate) fn vlen(&self, geo: &Geometry, i: u32) -> u8 {
        self.slot(geo, i)[1]
    }

    pub(crate) fn value_area(&self, geo: &Geometry, i: u32) -> &[u8] {
        &self.slot(geo, i)[2 + geo.key_cap as usize..]
    }

    pub(crate) fn fingerprint(&self, i: u32) -> u8 {
        self.bytes[LEAF_FPS as usize + i as usize]
    }

    /// Appends slot `i`'s value to `out` (reading its blob when out of line).
    pub(crate) fn append_value<B: Backend>(
        &self,
        pages: &Pages<'_, B>,
        page: u64,
        i: u32,
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let geo = &pages.geo;
        let vlen = self.vlen(geo, i);
        if vlen != OUT_OF_LINE {
            out.extend_from_slice(&self.value_area(geo, i)[..vlen as usize]);
            return Ok(());
        }
        let blob = u64::from_le_bytes(self.value_area(geo, i)[..8].try_into().expect("8 bytes"));
        pages.read_blob(blob, page + geo.slot_off(i), out)
    }
}

#[cfg(test)]
mod tests {
    use super::fingerprint_matches;

    #[test]
    fn fingerprint_matches_finds_exactly_the_equal_bytes() {
        let mut state = 7u64;
        for round in 0..2000 {
            let mut fps = [0u8; 64];
            for f in fps.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                // Few distinct values, zeros and 0x80s included: collisions and borrows.
                *f = [0u8, 1, 0x7f, 0x80, 0xff, state as u8][(state >> 40) as usize % 6];
            }
            let fp = fps[round % 64];
            let want = fps
                .iter()
                .enumerate()
                .fold(0u64, |m, (i, &f)| m | ((f == fp) as u64) << i);
            let got = fps.chunks_exact(8).enumerate().fold(0u64, |m, (c, chunk)| {
                let word = u64::from_le_bytes(chunk.try_into().unwrap());
                m | fingerprint_matches(word, fp) << (8 * c)
            });
            assert_eq!(got, want, "{fps:?} {fp}");
        }
    }
}

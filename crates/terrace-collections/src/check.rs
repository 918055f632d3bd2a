//! Reachability and structure: [`check()`] walks every named root of a pool, validates
//! every node of every map and every array's header against the layout and the tree's
//! invariants, and reports the collections' objects that no root reaches (what a crash in
//! [`Collections::destroy`] or a program's bug leaves behind); [`sweep`] frees those.
//!
//! Owns nothing persistent. It reads the pool without opening any map, so it runs on a
//! pool whose collections another handle has open only when no writer is active (the
//! `terrace pool check` command opens the pool itself). Every problem is a
//! [`CollectionError::Corrupt`] naming the offset, never a panic.
//!
//! [`Collections::destroy`]: crate::Collections::destroy

use std::collections::{HashMap, HashSet};

use terrace_pool::{Backend, Oid, Pool};

use crate::array::{read_array_header, ARRAY_HEADER};
use crate::directory::{decode_binding, directory_geometry, Kind};
use crate::error::{CollectionError, Result};
use crate::hash::{bucket_count, bucket_of, hash_of, read_hash_header, HASH_HEADER_SIZE, HH_TABLE};
use crate::layout::{
    fingerprint, is_collection_type, prefix_word, Geometry, HEADER_SIZE, H_HEIGHT, H_ROOT,
    INNER_COUNT, INNER_SAMPLE_OFF, LEAF_BITMAP, LEAF_FPS, OUT_OF_LINE, TYPE_ARRAY, TYPE_BLOB,
    TYPE_BUCKET, TYPE_HASH, TYPE_INNER, TYPE_LEAF, TYPE_MAP, TYPE_SEGMENT, TYPE_TABLE,
};
use crate::ordered::read_header;

/// Deepest tree `check` accepts.
const MAX_HEIGHT: u64 = 32;

/// What [`check()`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Names bound in the directory.
    pub bindings: u64,
    /// Maps reached (ordered and hash; the directory included).
    pub maps: u64,
    /// Arrays reached.
    pub arrays: u64,
    /// Slotted pages: ordered-map leaves and hash-map bucket pages.
    pub leaves: u64,
    pub inner_nodes: u64,
    /// Entries in the bound maps (the directory's not counted).
    pub entries: u64,
    /// Out-of-line values.
    pub blobs: u64,
    /// Objects of the collections' types that no named root reaches.
    pub unreachable: Vec<Oid>,
    /// Live objects of the program's types that no name binds (not judged: their
    /// contents may hold references the check cannot read).
    pub untracked: u64,
}

/// Called with each entry of a map: the walker, key, value, and the slot's offset.
type EntryFn<'e, W> = dyn FnMut(&mut W, &[u8], &[u8], u64) -> Result<()> + 'e;

struct Walker<'a, B: Backend> {
    pool: &'a Pool<B>,
    /// Every live object: offset → (type, usable bytes).
    live: HashMap<u64, (u64, u64)>,
    reached: HashSet<u64>,
    report: Report,
}

fn bad(offset: u64, what: impl Into<String>) -> CollectionError {
    CollectionError::corrupt(offset, what)
}

impl<B: Backend> Walker<'_, B> {
    /// Marks `off` reached as an object of `type_num` of at least `size` bytes.
    fn reach(&mut self, off: u64, type_num: u64, size: u64, from: u64) -> Result<()> {
        let Some(&(t, usable)) = self.live.get(&off) else {
            return Err(bad(
                from,
                format!("refers to {off:#x}, which is not a live object"),
            ));
        };
        if t != type_num {
            return Err(bad(
                off,
                format!("object has type {t:#x}, expected {type_num:#x}"),
            ));
        }
        if usable < size {
            return Err(bad(
                off,
                format!("object of {usable} bytes, a node needs {size}"),
            ));
        }
        if !self.reached.insert(off) {
            return Err(bad(off, "node reached twice (shared or a cycle)"));
        }
        Ok(())
    }

    fn u64_at(&self, off: u64) -> Result<u64> {
        Ok(self.pool.backend().load_u64(off)?)
    }

    fn bytes(&self, off: u64, len: usize) -> Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.pool.backend().read(off, &mut v)?;
        Ok(v)
    }

    /// Validates the map at `header`; calls `entry` with each key and value.
    fn map(&mut self, header: u64, from: u64, entry: &mut EntryFn<'_, Self>) -> Result<Geometry> {
        self.reach(header, TYPE_MAP, HEADER_SIZE, from)?;
        let geo = read_header(self.pool, header)?;
        self.report.maps += 1;
        let root = self.u64_at(header + H_ROOT)?;
        let height = self.u64_at(header + H_HEIGHT)?;
        if height > MAX_HEIGHT {
            return Err(bad(header + H_HEIGHT, format!("height {height}")));
        }
        if root != 0 {
            self.node(&geo, root, height, header + H_ROOT, None, None, entry)?;
        } else if height != 0 {
            return Err(bad(header + H_HEIGHT, "an empty map with a nonzero height"));
        }
        Ok(geo)
    }

    /// Validates one slotted page (a leaf or a bucket page) of `type_num`: its bitmap,
    /// every live slot's lengths, fingerprint and value, no repeated key, and each key
    /// `placed` where it lies (`place` names where that is in messages).
    #[allow(clippy::too_many_arguments)]
    fn page(
        &mut self,
        geo: &Geometry,
        node: u64,
        type_num: u64,
        from: u64,
        placed: &dyn Fn(&[u8]) -> bool,
        place: &str,
        entry: &mut EntryFn<'_, Self>,
    ) -> Result<()> {
        self.reach(node, type_num, geo.leaf_size(), from)?;
        let bitmap = self.u64_at(node + LEAF_BITMAP)?;
        if bitmap & !geo.full_bitmap() != 0 {
            return Err(bad(
                node,
                format!("bitmap {bitmap:#x} has bits past {} slots", geo.leaf_slots),
            ));
        }
        let fps = self.bytes(node + LEAF_FPS, geo.leaf_slots as usize)?;
        let mut keys = HashSet::new();
        let mut live = bitmap;
        while live != 0 {
            let i = live.trailing_zeros();
            live &= live - 1;
            let at = node + geo.slot_off(i);
            let slot = self.bytes(at, geo.slot_size() as usize)?;
            let (klen, vlen) = (slot[0] as usize, slot[1]);
            if klen > geo.key_cap as usize {
                return Err(bad(
                    at,
                    format!(
                        "slot {i} holds a key of {klen} bytes, the map's maximum is {}",
                        geo.key_cap
                    ),
                ));
            }
            let key = &slot[2..2 + klen];
            if fps[i as usize] != fingerprint(key) {
                return Err(bad(
                    node + LEAF_FPS + i as u64,
                    format!("slot {i}'s fingerprint does not match its key"),
                ));
            }
            if !placed(key) {
                return Err(bad(at, format!("slot {i}'s key lies outside {place}")));
            }
            if !keys.insert(key.to_vec()) {
                return Err(bad(at, format!("slot {i} repeats a key of its page")));
            }
            let area = &slot[2 + geo.key_cap as usize..];
            let value = if vlen == OUT_OF_LINE {
                let blob = u64::from_le_bytes(area[..8].try_into().expect("8 bytes"));
                let len = match self.live.get(&blob) {
                    Some(&(_, usable)) if usable >= 8 => self.u64_at(blob)?,
                    _ => 0,
                };
                self.reach(blob, TYPE_BLOB, 8u64.saturating_add(len), at)?;
                self.report.blobs += 1;
                self.bytes(blob + 8, len as usize)?
            } else if vlen as u32 > geo.val_area {
                return Err(bad(
                    at,
                    format!(
                        "slot {i} holds an inline value of {vlen} bytes, the area is {}",
                        geo.val_area
                    ),
                ));
            } else {
                area[..vlen as usize].to_vec()
            };
            entry(self, key, &value, at)?;
        }
        Ok(())
    }

    /// Validates the hash map at `header`: state, table, segments, every bucket's chain
    /// (each key in the bucket its hash addresses); calls `entry` with each entry.
    fn hash(&mut self, header: u64, from: u64, entry: &mut EntryFn<'_, Self>) -> Result<()> {
        self.reach(header, TYPE_HASH, HASH_HEADER_SIZE, from)?;
        let (geo, state) = read_hash_header(self.pool, header)?;
        self.report.maps += 1;
        let count = bucket_count(state);
        let table = self.u64_at(header + HH_TABLE)?;
        if table == 0 {
            return Ok(());
        }
        let capacity = match self.live.get(&table) {
            Some(&(_, usable)) if usable >= 8 => self.u64_at(table)?,
            _ => 0,
        };
        self.reach(
            table,
            TYPE_TABLE,
            8u64.saturating_add(capacity.saturating_mul(8)),
            header + HH_TABLE,
        )?;
        let per = geo.fanout as u64;
        for s in 0..capacity {
            let at = table + 8 + 8 * s;
            let segment = self.u64_at(at)?;
            if segment == 0 {
                continue;
            }
            self.reach(segment, TYPE_SEGMENT, 8 * per, at)?;
            for w in 0..per {
                let b = s * per + w;
                let word = segment + 8 * w;
                let mut page = self.u64_at(word)?;
                if page != 0 && b >= count {
                    return Err(bad(
                        word,
                        format!("bucket {b} has pages, the map has {count} buckets"),
                    ));
                }
                let mut from = word;
                while page != 0 {
                    let in_bucket = |k: &[u8]| bucket_of(hash_of(k), state) == b;
                    self.report.leaves += 1;
                    self.page(
                        &geo,
                        page,
                        TYPE_BUCKET,
                        from,
                        &in_bucket,
                        &format!("bucket {b}"),
                        entry,
                    )?;
                    from = page + geo.next_off();
                    page = self.u64_at(from)?;
                }
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn node(
        &mut self,
        geo: &Geometry,
        node: u64,
        level: u64,
        from: u64,
        lo: Option<&[u8]>,
        hi: Option<&[u8]>,
        entry: &mut EntryFn<'_, Self>,
    ) -> Result<()> {
        let in_fences = |k: &[u8]| lo.is_none_or(|l| k >= l) && hi.is_none_or(|h| k < h);
        if level == 0 {
            self.report.leaves += 1;
            if self.u64_at(node + geo.next_off())? != 0 {
                return Err(bad(node + geo.next_off(), "a leaf with a next page"));
            }
            return self.page(
                geo,
                node,
                TYPE_LEAF,
                from,
                &in_fences,
                "the leaf's key range",
                entry,
            );
        }
        self.reach(node, TYPE_INNER, geo.inner_size(), from)?;
        self.report.inner_nodes += 1;
        let n = self.u64_at(node + INNER_COUNT)?;
        if n >= geo.fanout as u64 {
            return Err(bad(node, format!("{n} separators, fanout {}", geo.fanout)));
        }
        let mut seps: Vec<Vec<u8>> = Vec::with_capacity(n as usize);
        for i in 0..n as u32 {
            let at = node + geo.sep_off(i);
            let raw = self.bytes(at, 1 + geo.key_cap as usize)?;
            let len = raw[0] as usize;
            if len > geo.key_cap as usize {
                return Err(bad(at, format!("separator {i} of {len} bytes")));
            }
            let sep = raw[1..1 + len].to_vec();
            if self.u64_at(node + geo.prefix_off(i))? != prefix_word(&sep) {
                return Err(bad(
                    node + geo.prefix_off(i),
                    format!("separator {i}'s prefix word does not match it"),
                ));
            }
            if !in_fences(&sep) || seps.last().is_some_and(|p| *p >= sep) {
                return Err(bad(at, format!("separator {i} is out of order")));
            }
            seps.push(sep);
        }
        let samples = crate::ordered::sample_words(geo, &seps);
        for (k, &want) in samples.iter().enumerate() {
            let at = node + INNER_SAMPLE_OFF + 8 * k as u64;
            if self.u64_at(at)? != want {
                return Err(bad(
                    at,
                    format!("sample word {k} does not match the separators"),
                ));
            }
        }
        for i in 0..=n as u32 {
            let at = node + geo.child_off(i);
            let child = self.u64_at(at)?;
            let clo = if i == 0 {
                lo
            } else {
                Some(seps[i as usize - 1].as_slice())
            };
            let chi = if i as u64 == n {
                hi
            } else {
                Some(seps[i as usize].as_slice())
            };
            self.node(geo, child, level - 1, at, clo, chi, entry)?;
        }
        Ok(())
    }
}

/// Validates every named root and reports the collections' objects none reaches. A pool
/// without a directory has no collections: then every collection-typed object is
/// unreachable.
pub fn check<B: Backend>(pool: &Pool<B>) -> Result<Report> {
    let mut w = Walker {
        pool,
        live: pool
            .objects(None)?
            .into_iter()
            .map(|o| (o.oid.offset(), (o.type_num, o.usable)))
            .collect(),
        reached: HashSet::new(),
        report: Report::default(),
    };
    if let Some(dir) = pool.directory()? {
        let mut bound = Vec::new();
        let geo = w.map(
            dir.offset(),
            terrace_pool::format::DIRECTORY_WORD,
            &mut |_, k, v, at| {
                bound.push(decode_binding(k, v, at).map(|b| (b, at)));
                Ok(())
            },
        )?;
        if geo != directory_geometry() {
            return Err(bad(dir.offset(), "the directory map has another geometry"));
        }
        for b in bound {
            let (b, at) = b?;
            w.report.bindings += 1;
            match b.kind {
                Kind::OrderedMap => {
                    w.map(b.oid.offset(), at, &mut |w, _, _, _| {
                        w.report.entries += 1;
                        Ok(())
                    })?;
                }
                Kind::HashMap => {
                    w.hash(b.oid.offset(), at, &mut |w, _, _, _| {
                        w.report.entries += 1;
                        Ok(())
                    })?;
                }
                Kind::Array => {
                    let off = b.oid.offset();
                    w.reach(off, TYPE_ARRAY, ARRAY_HEADER, at)?;
                    let usable = w.live.get(&off).map_or(0, |&(_, usable)| usable);
                    read_array_header(pool, off, usable)?;
                    w.report.arrays += 1;
                }
                Kind::Object => {
                    let off = b.oid.offset();
                    match w.live.get(&off) {
                        Some(&(t, _)) if !is_collection_type(t) => {
                            w.reached.insert(off);
                        }
                        Some(_) => {
                            return Err(bad(at, format!("{:?} binds a collection node", b.name)))
                        }
                        None => {
                            return Err(bad(
                                at,
                                format!("{:?} is bound to {off:#x}, not a live object", b.name),
                            ))
                        }
                    }
                }
            }
        }
    }
    let mut objects: Vec<_> = w.live.iter().map(|(&o, &(t, _))| (o, t)).collect();
    objects.sort_unstable();
    for (off, t) in objects {
        if w.reached.contains(&off) {
            continue;
        }
        if is_collection_type(t) {
            w.report.unreachable.extend(Oid::from_offset(off));
        } else {
            w.report.untracked += 1;
        }
    }
    Ok(w.report)
}

/// Frees the objects `report` found unreachable; each free is crash-atomic. Run it on a
/// report from a [`check()`] of the same pool with no collection open in between.
pub fn sweep<B: Backend>(pool: &Pool<B>, report: &Report) -> Result<u64> {
    for &oid in &report.unreachable {
        pool.free_oid(oid)?;
    }
    Ok(report.unreachable.len() as u64)
}

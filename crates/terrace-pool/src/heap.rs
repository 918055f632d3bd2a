//! The allocator: volatile free-space structures over the persistent page descriptors.
//!
//! Owns: the free page spans (one lock, [`Pages`]), the arenas (one lock each, holding
//! runs and the per-class lists of runs with free slots), the page→span map, and the scan
//! that validates page descriptors and rebuilds all of this at open.
//!
//! The persistent truth is the page descriptors (crate docs, "Heap"). The volatile state
//! is always *ahead* of it: a slot is reserved here before its bit is set durably, and a
//! slot or span becomes free here only after its release is durable. That ordering is why
//! a reservation can never be handed out twice and a crash can only lose reservations,
//! which were never published.
//!
//! Invariants (checked by [`Heap::verify_against`]):
//! - every heap page is in exactly one of: a free span of `Pages`, a run of one arena, an
//!   extent of `Pages.extents`; `head_of[p] == head + 1` for every page of a run and for
//!   the first page of an extent (objects in extents are only addressed by their first
//!   page, so mapping the others would cost a store per page for nothing), and 0 for
//!   extents' other pages and free pages;
//! - a run's `used` is the number of set bits in `bits` (reserved, allocated, or pending
//!   free); `pending` ⊆ `bits`; a run is in its arena's `avail` list iff `used < nslots`;
//! - when no operation is in flight, `bits` equals the persistent bitmap of the run.
//!
//! Lock order: an arena lock, then the pages lock; never two arena locks at once.

use std::collections::{BTreeMap, BTreeSet};

// The heap's volatile maps are keyed by page numbers: a fast non-cryptographic hash
// (SipHash was a third of a 64 B allocation's time).
use rustc_hash::FxHashMap as HashMap;
use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::backend::Backend;
use crate::class;
use crate::error::{corrupt, PoolError, Result};
use crate::format::{
    self, Geometry, KIND_EXTENT, KIND_FREE, KIND_RUN, META_BITMAP, META_TYPE, META_WORD0,
    META_WORD1, PAGE,
};
use crate::log::{Entries, Entry};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A span found by [`scan`]: a run or an extent as the page descriptors say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SpanInfo {
    pub head: u32,
    pub pages: u32,
    pub kind: u8,
    pub unit: u32,
    pub type_num: u64,
    /// Runs: the allocation bitmap (one word per page).
    pub bits: Vec<u64>,
}

/// Reads and validates every page descriptor; returns the spans in address order and the
/// number of free pages. Any violation is `Corrupt` naming the descriptor.
pub(crate) fn scan<B: Backend>(b: &B, geo: &Geometry) -> Result<(Vec<SpanInfo>, u64)> {
    let n = geo.page_count;
    let mut spans = Vec::new();
    let mut free = 0;
    let mut i = 0u64;
    while i < n {
        let at = geo.meta(i);
        let w0 = b.load_u64(at + META_WORD0)?;
        let bitmap = b.load_u64(at + META_BITMAP)?;
        let (kind, pages) = format::split_word0(w0);
        if w0 & 0xFFFF_FF00 != 0 {
            return Err(corrupt(
                format!("page {i} descriptor has reserved bits set ({w0:#x})"),
                at,
            ));
        }
        match kind {
            KIND_FREE => {
                if w0 != 0 || bitmap != 0 {
                    return Err(corrupt(
                        format!("free page {i} has a span length or allocation bits"),
                        at,
                    ));
                }
                free += 1;
                i += 1;
            }
            KIND_RUN | KIND_EXTENT => {
                if pages == 0 || i + pages as u64 > n {
                    return Err(corrupt(
                        format!("span at page {i} has {pages} pages; the heap has {n}"),
                        at,
                    ));
                }
                let w1 = b.load_u64(at + META_WORD1)?;
                let type_num = b.load_u64(at + META_TYPE)?;
                let unit = w1 as u32;
                let mut bits = Vec::new();
                if kind == KIND_RUN
                    && (w1 >> 32 != 0
                        || unit < class::MIN_UNIT
                        || unit % 16 != 0
                        || unit as u64 > pages as u64 * PAGE)
                {
                    return Err(corrupt(
                        format!("run at page {i} has impossible unit {w1:#x} for {pages} pages"),
                        at,
                    ));
                }
                let slots = class::slots(unit.max(1), pages) as u64;
                for j in 0..pages as u64 {
                    let pat = geo.meta(i + j);
                    if j > 0 && b.load_u64(pat + META_WORD0)? != 0 {
                        return Err(corrupt(
                            format!(
                                "page {} inside the span at page {i} has a descriptor",
                                i + j
                            ),
                            pat,
                        ));
                    }
                    let word = b.load_u64(pat + META_BITMAP)?;
                    if kind == KIND_EXTENT {
                        if word != 0 {
                            return Err(corrupt(
                                format!(
                                    "page {} of the extent at page {i} has allocation bits",
                                    i + j
                                ),
                                pat,
                            ));
                        }
                        continue;
                    }
                    let first = j * 64;
                    let valid = if first >= slots {
                        0
                    } else if slots - first >= 64 {
                        u64::MAX
                    } else {
                        (1u64 << (slots - first)) - 1
                    };
                    if word & !valid != 0 {
                        return Err(corrupt(
                            format!("run at page {i} has bits beyond its {slots} slots"),
                            pat,
                        ));
                    }
                    bits.push(word);
                }
                spans.push(SpanInfo {
                    head: i as u32,
                    pages,
                    kind,
                    unit: if kind == KIND_RUN { unit } else { 0 },
                    type_num,
                    bits,
                });
                i += pages as u64;
            }
            other => {
                return Err(corrupt(format!("page {i} has unknown kind {other}"), at));
            }
        }
    }
    Ok((spans, free))
}

/// Free page spans and extents.
#[derive(Debug, Default)]
struct Pages {
    by_start: BTreeMap<u32, u32>,
    by_len: BTreeSet<(u32, u32)>,
    free_pages: u64,
    extents: HashMap<u32, ExtentState>,
}

#[derive(Clone, Copy, Debug)]
struct ExtentState {
    pages: u32,
    type_num: u64,
    pending_free: bool,
}

impl Pages {
    fn insert(&mut self, start: u32, len: u32) {
        self.by_start.insert(start, len);
        self.by_len.insert((len, start));
    }

    fn remove(&mut self, start: u32, len: u32) {
        self.by_start.remove(&start);
        self.by_len.remove(&(len, start));
    }

    /// Best fit: the shortest free span of at least `len` pages, lowest address first.
    fn take(&mut self, len: u32) -> Option<u32> {
        let &(have, start) = self.by_len.range((len, 0)..).next()?;
        self.remove(start, have);
        if have > len {
            self.insert(start + len, have - len);
        }
        self.free_pages -= len as u64;
        Some(start)
    }

    /// Returns a span, merging it with free neighbours.
    fn give(&mut self, mut start: u32, mut len: u32) {
        self.free_pages += len as u64;
        if let Some((&ps, &pl)) = self.by_start.range(..start).next_back() {
            if ps + pl == start {
                self.remove(ps, pl);
                start = ps;
                len += pl;
            }
        }
        if let Some(&nl) = self.by_start.get(&(start + len)) {
            self.remove(start + len, nl);
            len += nl;
        }
        self.insert(start, len);
    }
}

#[derive(Clone, Debug)]
struct Run {
    unit: u32,
    type_num: u64,
    pages: u32,
    nslots: u32,
    used: u32,
    bits: Vec<u64>,
    pending: Vec<u64>,
    pending_count: u32,
    /// The descriptor is known durable (false for a run created since the last commit
    /// that wrote it: every allocation in it then re-writes the descriptor).
    durable: bool,
}

impl Run {
    fn new(unit: u32, type_num: u64, pages: u32) -> Run {
        Run {
            unit,
            type_num,
            pages,
            nslots: class::slots(unit, pages),
            used: 0,
            bits: vec![0; pages as usize],
            pending: vec![0; pages as usize],
            pending_count: 0,
            durable: false,
        }
    }

    fn reserve_slot(&mut self) -> Option<u32> {
        for (w, word) in self.bits.iter_mut().enumerate() {
            if *word != u64::MAX {
                let b = word.trailing_ones();
                let idx = w as u32 * 64 + b;
                if idx >= self.nslots {
                    return None;
                }
                *word |= 1 << b;
                self.used += 1;
                return Some(idx);
            }
        }
        None
    }
}

#[derive(Debug, Default)]
struct Arena {
    runs: HashMap<u32, Run>,
    avail: HashMap<(u32, u64), BTreeSet<u32>>,
}

impl Arena {
    fn take_slot(&mut self, unit: u32, type_num: u64) -> Option<(u32, u32, bool)> {
        let set = self.avail.get_mut(&(unit, type_num))?;
        let &head = set.iter().next()?;
        let run = self.runs.get_mut(&head)?;
        let idx = run.reserve_slot()?;
        let durable = run.durable;
        if run.used >= run.nslots {
            set.remove(&head);
        }
        Some((head, idx, durable))
    }

    fn mark_avail(&mut self, head: u32) {
        if let Some(run) = self.runs.get(&head) {
            if run.used < run.nslots {
                self.avail
                    .entry((run.unit, run.type_num))
                    .or_default()
                    .insert(head);
            }
        }
    }

    fn unlist(&mut self, head: u32, unit: u32, type_num: u64) {
        if let Some(set) = self.avail.get_mut(&(unit, type_num)) {
            set.remove(&head);
            if set.is_empty() {
                self.avail.remove(&(unit, type_num));
            }
        }
    }
}

/// A block reserved for an allocation, not yet durable.
#[derive(Clone, Debug)]
pub(crate) struct Reserved {
    pub off: u64,
    pub usable: u64,
    block: Block,
}

#[derive(Clone, Debug)]
enum Block {
    Slot {
        head: u32,
        idx: u32,
        arena: u8,
        unit: u32,
        pages: u32,
        type_num: u64,
        desc_durable: bool,
    },
    Extent {
        head: u32,
        pages: u32,
        type_num: u64,
    },
}

/// A block being freed: pending until its release is durable.
#[derive(Debug)]
pub(crate) struct Freeing {
    block: FreeBlock,
}

#[derive(Debug)]
enum FreeBlock {
    Slot {
        head: u32,
        idx: u32,
        arena: u8,
        /// The run's last object: the run is released with it (and held here meanwhile).
        released: Option<Box<Run>>,
    },
    Extent {
        head: u32,
        pages: u32,
    },
}

/// A live object as the volatile heap knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ObjectInfo {
    pub usable: u64,
    pub type_num: u64,
}

/// Allocation statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes of heap pages.
    pub heap_bytes: u64,
    /// Bytes in free pages.
    pub free_bytes: u64,
    /// Bytes handed out (slot units and extent pages), including in-flight reservations.
    pub allocated_bytes: u64,
    /// Bytes of runs not holding objects (free slots and run tails).
    pub run_slack_bytes: u64,
    pub runs: u64,
    pub extents: u64,
    /// Per unit size: (runs, slots, used slots).
    pub classes: BTreeMap<u32, (u64, u64, u64)>,
}

/// The volatile allocator. See the module docs.
#[derive(Debug)]
pub(crate) struct Heap {
    geo: Geometry,
    pages: Mutex<Pages>,
    arenas: Vec<Mutex<Arena>>,
    head_of: Vec<AtomicU32>,
    arena_of: Vec<AtomicU8>,
}

static THREAD_IDS: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static THREAD_ID: usize = THREAD_IDS.fetch_add(1, Ordering::Relaxed);
}

/// A small per-thread number, used to pick an arena and a lane.
pub(crate) fn thread_slot() -> usize {
    THREAD_ID.with(|id| *id)
}

impl Heap {
    /// Rebuilds the volatile heap from validated page descriptors.
    pub fn load(geo: Geometry, spans: &[SpanInfo], arenas: usize) -> Heap {
        let arenas = arenas.clamp(1, 255);
        let n = geo.page_count as usize;
        let heap = Heap {
            geo,
            pages: Mutex::new(Pages::default()),
            arenas: (0..arenas).map(|_| Mutex::new(Arena::default())).collect(),
            head_of: (0..n).map(|_| AtomicU32::new(0)).collect(),
            arena_of: (0..n).map(|_| AtomicU8::new(0)).collect(),
        };
        {
            let mut pages = lock(&heap.pages);
            let mut next = 0u32;
            for (k, s) in spans.iter().enumerate() {
                if s.head > next {
                    pages.give(next, s.head - next);
                }
                next = s.head + s.pages;
                if s.kind == KIND_EXTENT {
                    heap.mark_span(s.head, 1);
                } else {
                    heap.mark_span(s.head, s.pages);
                }
                if s.kind == KIND_EXTENT {
                    pages.extents.insert(
                        s.head,
                        ExtentState {
                            pages: s.pages,
                            type_num: s.type_num,
                            pending_free: false,
                        },
                    );
                } else {
                    let a = k % arenas;
                    heap.arena_of[s.head as usize].store(a as u8, Ordering::Relaxed);
                    let mut run = Run::new(s.unit, s.type_num, s.pages);
                    run.bits.clone_from(&s.bits);
                    run.used = s.bits.iter().map(|w| w.count_ones()).sum();
                    run.durable = true;
                    let mut arena = lock(&heap.arenas[a]);
                    arena.runs.insert(s.head, run);
                    arena.mark_avail(s.head);
                }
            }
            if (next as u64) < geo.page_count {
                pages.give(next, geo.page_count as u32 - next);
            }
        }
        heap
    }

    fn mark_span(&self, head: u32, pages: u32) {
        for p in head..head + pages {
            self.head_of[p as usize].store(head + 1, Ordering::Release);
        }
    }

    fn clear_span(&self, head: u32, pages: u32) {
        for p in head..head + pages {
            self.head_of[p as usize].store(0, Ordering::Release);
        }
    }

    /// Reserves a block for `size` bytes of type `type_num`: from the calling thread's
    /// arena, else a new run, else any other arena's runs, else out of space.
    pub fn reserve(&self, size: u64, type_num: u64) -> Result<Reserved> {
        if size == 0 {
            return Err(PoolError::InvalidArgument {
                what: "allocation size",
                detail: "0 bytes".into(),
            });
        }
        let Some(unit) = class::unit_for(size) else {
            return self.reserve_extent(size, type_num);
        };
        let home = thread_slot() % self.arenas.len();
        {
            let mut arena = lock(&self.arenas[home]);
            if let Some(r) = self.slot_in(&mut arena, home, unit, type_num) {
                return Ok(r);
            }
            let mut pages = lock(&self.pages);
            let want = class::run_pages(unit);
            let got = pages.take(want).map(|h| (h, want)).or_else(|| {
                let min = class::min_pages(unit);
                pages.take(min).map(|h| (h, min))
            });
            drop(pages);
            if let Some((head, npages)) = got {
                self.mark_span(head, npages);
                self.arena_of[head as usize].store(home as u8, Ordering::Relaxed);
                arena.runs.insert(head, Run::new(unit, type_num, npages));
                arena.mark_avail(head);
                if let Some(r) = self.slot_in(&mut arena, home, unit, type_num) {
                    return Ok(r);
                }
            }
        }
        for k in 1..self.arenas.len() {
            let a = (home + k) % self.arenas.len();
            let mut arena = lock(&self.arenas[a]);
            if let Some(r) = self.slot_in(&mut arena, a, unit, type_num) {
                return Ok(r);
            }
        }
        Err(PoolError::OutOfSpace { size })
    }

    fn slot_in(&self, arena: &mut Arena, a: usize, unit: u32, type_num: u64) -> Option<Reserved> {
        let (head, idx, desc_durable) = arena.take_slot(unit, type_num)?;
        let pages = arena.runs.get(&head).map(|r| r.pages)?;
        Some(Reserved {
            off: self.geo.page_addr(head as u64) + idx as u64 * unit as u64,
            usable: unit as u64,
            block: Block::Slot {
                head,
                idx,
                arena: a as u8,
                unit,
                pages,
                type_num,
                desc_durable,
            },
        })
    }

    fn reserve_extent(&self, size: u64, type_num: u64) -> Result<Reserved> {
        let npages = class::extent_pages(size);
        if npages > self.geo.page_count {
            return Err(PoolError::OutOfSpace { size });
        }
        let npages = npages as u32;
        let mut pages = lock(&self.pages);
        let head = pages.take(npages).ok_or(PoolError::OutOfSpace { size })?;
        pages.extents.insert(
            head,
            ExtentState {
                pages: npages,
                type_num,
                pending_free: false,
            },
        );
        // Only the first page: see the module invariants.
        self.mark_span(head, 1);
        Ok(Reserved {
            off: self.geo.page_addr(head as u64),
            usable: npages as u64 * PAGE,
            block: Block::Extent {
                head,
                pages: npages,
                type_num,
            },
        })
    }

    /// The redo entries that make a reservation durably allocated.
    pub fn alloc_entries(&self, r: &Reserved, out: &mut Entries) {
        let geo = &self.geo;
        match r.block {
            Block::Slot {
                head,
                idx,
                unit,
                pages,
                type_num,
                desc_durable,
                ..
            } => {
                let meta = geo.meta(head as u64);
                if !desc_durable {
                    out.push(Entry::set(meta + META_WORD1, unit as u64));
                    out.push(Entry::set(meta + META_TYPE, type_num));
                    out.push(Entry::set(
                        meta + META_WORD0,
                        format::word0(KIND_RUN, pages),
                    ));
                }
                let word = geo.meta(head as u64 + idx as u64 / 64) + META_BITMAP;
                out.push(Entry::or(word, 1 << (idx % 64)));
            }
            Block::Extent {
                head,
                pages,
                type_num,
            } => {
                let meta = geo.meta(head as u64);
                out.push(Entry::set(meta + META_WORD1, 0));
                out.push(Entry::set(meta + META_TYPE, type_num));
                out.push(Entry::set(
                    meta + META_WORD0,
                    format::word0(KIND_EXTENT, pages),
                ));
            }
        }
    }

    /// The reservation is durably allocated now.
    pub fn alloc_done(&self, r: &Reserved) {
        if let Block::Slot {
            head,
            arena,
            desc_durable: false,
            ..
        } = r.block
        {
            if let Some(run) = lock(&self.arenas[arena as usize]).runs.get_mut(&head) {
                run.durable = true;
            }
        }
    }

    /// The reservation will never be made durable: give it back.
    pub fn cancel(&self, r: &Reserved) {
        match r.block {
            Block::Slot {
                head, idx, arena, ..
            } => {
                let mut a = lock(&self.arenas[arena as usize]);
                let Some(run) = a.runs.get_mut(&head) else {
                    return;
                };
                run.bits[idx as usize / 64] &= !(1 << (idx % 64));
                run.used -= 1;
                if run.used == 0 && !run.durable {
                    // Never described durably: its pages go straight back.
                    let (unit, type_num, pages) = (run.unit, run.type_num, run.pages);
                    a.runs.remove(&head);
                    a.unlist(head, unit, type_num);
                    self.clear_span(head, pages);
                    lock(&self.pages).give(head, pages);
                } else {
                    a.mark_avail(head);
                }
            }
            Block::Extent { head, pages, .. } => {
                let mut p = lock(&self.pages);
                p.extents.remove(&head);
                self.clear_span(head, 1);
                p.give(head, pages);
            }
        }
    }

    fn head_of(&self, off: u64) -> Result<u32> {
        let page = self
            .geo
            .page_of(off)
            .ok_or(PoolError::InvalidObject { offset: off })?;
        match self.head_of[page as usize].load(Ordering::Acquire) {
            0 => Err(PoolError::InvalidObject { offset: off }),
            h => Ok(h - 1),
        }
    }

    /// What the volatile heap knows of the live object at `off`.
    pub fn object(&self, off: u64) -> Result<ObjectInfo> {
        let head = self.head_of(off)?;
        let start = self.geo.page_addr(head as u64);
        {
            let pages = lock(&self.pages);
            if let Some(e) = pages.extents.get(&head) {
                if off != start {
                    return Err(PoolError::InvalidObject { offset: off });
                }
                return Ok(ObjectInfo {
                    usable: e.pages as u64 * PAGE,
                    type_num: e.type_num,
                });
            }
        }
        let a = self.arena_of[head as usize].load(Ordering::Relaxed) as usize;
        let arena = lock(&self.arenas[a.min(self.arenas.len() - 1)]);
        let run = arena
            .runs
            .get(&head)
            .ok_or(PoolError::InvalidObject { offset: off })?;
        let rel = off - start;
        let idx = rel / run.unit as u64;
        if rel % run.unit as u64 != 0
            || idx >= run.nslots as u64
            || run.bits[idx as usize / 64] & (1 << (idx % 64)) == 0
        {
            return Err(PoolError::InvalidObject { offset: off });
        }
        Ok(ObjectInfo {
            usable: run.unit as u64,
            type_num: run.type_num,
        })
    }

    /// Marks the live object at `off` as being freed (a second free of it fails until the
    /// first is cancelled) and returns the ticket.
    pub fn begin_free(&self, off: u64) -> Result<Freeing> {
        let head = self.head_of(off)?;
        let start = self.geo.page_addr(head as u64);
        {
            let mut pages = lock(&self.pages);
            if let Some(e) = pages.extents.get_mut(&head) {
                if off != start || e.pending_free {
                    return Err(PoolError::InvalidObject { offset: off });
                }
                e.pending_free = true;
                return Ok(Freeing {
                    block: FreeBlock::Extent {
                        head,
                        pages: e.pages,
                    },
                });
            }
        }
        let a = self.arena_of[head as usize].load(Ordering::Relaxed) as usize;
        let a = a.min(self.arenas.len() - 1);
        let mut arena = lock(&self.arenas[a]);
        let run = arena
            .runs
            .get_mut(&head)
            .ok_or(PoolError::InvalidObject { offset: off })?;
        let rel = off - start;
        let idx = (rel / run.unit as u64) as u32;
        let (w, bit) = (idx as usize / 64, 1u64 << (idx % 64));
        if rel % run.unit as u64 != 0
            || idx >= run.nslots
            || run.bits[w] & bit == 0
            || run.pending[w] & bit != 0
        {
            return Err(PoolError::InvalidObject { offset: off });
        }
        run.pending[w] |= bit;
        run.pending_count += 1;
        let release = run.used == 1 && run.durable;
        let released = if release {
            let (unit, type_num) = (run.unit, run.type_num);
            let run = arena.runs.remove(&head).map(Box::new);
            arena.unlist(head, unit, type_num);
            run
        } else {
            None
        };
        Ok(Freeing {
            block: FreeBlock::Slot {
                head,
                idx,
                arena: a as u8,
                released,
            },
        })
    }

    /// The redo entries that durably free a block.
    pub fn free_entries(&self, f: &Freeing, out: &mut Entries) {
        match &f.block {
            FreeBlock::Slot {
                head,
                idx,
                released,
                ..
            } => {
                let word = self.geo.meta(*head as u64 + *idx as u64 / 64) + META_BITMAP;
                out.push(Entry::and_not(word, 1 << (idx % 64)));
                if released.is_some() {
                    out.push(Entry::set(self.geo.meta(*head as u64) + META_WORD0, 0));
                }
            }
            FreeBlock::Extent { head, .. } => {
                out.push(Entry::set(self.geo.meta(*head as u64) + META_WORD0, 0));
            }
        }
    }

    /// The free is durable: the block becomes available.
    pub fn free_done(&self, f: Freeing) {
        match f.block {
            FreeBlock::Slot {
                head,
                idx,
                arena,
                released,
            } => {
                if let Some(run) = released {
                    self.clear_span(head, run.pages);
                    lock(&self.pages).give(head, run.pages);
                    return;
                }
                let mut a = lock(&self.arenas[arena as usize]);
                if let Some(run) = a.runs.get_mut(&head) {
                    let (w, bit) = (idx as usize / 64, 1u64 << (idx % 64));
                    run.bits[w] &= !bit;
                    run.pending[w] &= !bit;
                    run.pending_count -= 1;
                    run.used -= 1;
                }
                a.mark_avail(head);
            }
            FreeBlock::Extent { head, pages } => {
                let mut p = lock(&self.pages);
                p.extents.remove(&head);
                self.clear_span(head, 1);
                p.give(head, pages);
            }
        }
    }

    /// The free will not happen: the object stays live.
    pub fn free_cancel(&self, f: Freeing) {
        match f.block {
            FreeBlock::Slot {
                head,
                idx,
                arena,
                released,
            } => {
                let mut a = lock(&self.arenas[arena as usize]);
                if let Some(run) = released {
                    a.runs.insert(head, *run);
                }
                if let Some(run) = a.runs.get_mut(&head) {
                    let (w, bit) = (idx as usize / 64, 1u64 << (idx % 64));
                    run.pending[w] &= !bit;
                    run.pending_count -= 1;
                }
                a.mark_avail(head);
            }
            FreeBlock::Extent { head, .. } => {
                if let Some(e) = lock(&self.pages).extents.get_mut(&head) {
                    e.pending_free = false;
                }
            }
        }
    }

    pub fn stats(&self) -> Stats {
        let mut s = Stats {
            heap_bytes: self.geo.page_count * PAGE,
            ..Stats::default()
        };
        {
            let pages = lock(&self.pages);
            s.free_bytes = pages.free_pages * PAGE;
            for e in pages.extents.values() {
                s.extents += 1;
                s.allocated_bytes += e.pages as u64 * PAGE;
            }
        }
        for arena in &self.arenas {
            let arena = lock(arena);
            for run in arena.runs.values() {
                s.runs += 1;
                let used = run.used as u64 * run.unit as u64;
                s.allocated_bytes += used;
                s.run_slack_bytes += run.pages as u64 * PAGE - used;
                let c = s.classes.entry(run.unit).or_default();
                c.0 += 1;
                c.1 += run.nslots as u64;
                c.2 += run.used as u64;
            }
        }
        s
    }

    /// Checks that the volatile heap describes exactly the persistent spans (call only
    /// when no operation is in flight). Returns what disagrees.
    pub fn verify_against(&self, spans: &[SpanInfo], free_pages: u64) -> Result<(), String> {
        // Runs first, one arena lock at a time, then the pages lock (never both: the
        // allocation path takes an arena lock and then the pages lock).
        let mut runs: HashMap<u32, Run> = HashMap::default();
        for arena in &self.arenas {
            runs.extend(lock(arena).runs.iter().map(|(&h, r)| (h, r.clone())));
        }
        let pages = lock(&self.pages);
        if pages.free_pages != free_pages {
            return Err(format!(
                "{} free pages in memory, {free_pages} on the medium",
                pages.free_pages
            ));
        }
        let total_runs = runs.len();
        let n_runs = spans.iter().filter(|s| s.kind == KIND_RUN).count();
        if total_runs != n_runs || pages.extents.len() != spans.len() - n_runs {
            return Err(format!(
                "{total_runs} runs and {} extents in memory, {n_runs} and {} on the medium",
                pages.extents.len(),
                spans.len() - n_runs
            ));
        }
        for s in spans {
            for p in s.head..s.head + s.pages {
                let want = if s.kind == KIND_EXTENT && p != s.head {
                    0
                } else {
                    s.head + 1
                };
                if self.head_of[p as usize].load(Ordering::Acquire) != want {
                    return Err(format!("page {p} is not mapped to its span at {}", s.head));
                }
            }
            if s.kind == KIND_EXTENT {
                match pages.extents.get(&s.head) {
                    Some(e) if e.pages == s.pages && e.type_num == s.type_num => {}
                    _ => return Err(format!("extent at page {} differs in memory", s.head)),
                }
                continue;
            }
            match runs.get(&s.head) {
                Some(r)
                    if r.unit == s.unit
                        && r.type_num == s.type_num
                        && r.pages == s.pages
                        && r.bits == s.bits
                        && r.pending_count == 0 => {}
                _ => return Err(format!("run at page {} differs in memory", s.head)),
            }
        }
        for (&start, &len) in &pages.by_start {
            for p in start..start + len {
                if self.head_of[p as usize].load(Ordering::Acquire) != 0 {
                    return Err(format!("free page {p} is mapped to a span"));
                }
            }
        }
        Ok(())
    }
}

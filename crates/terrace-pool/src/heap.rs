//! The allocator: volatile free-space structures over the persistent page descriptors.
//!
//! Owns: the free page spans (one lock, [`Pages`]); per heap page, the page→span map, the
//! span's shape (unit, custom class, pages), type and state, and a volatile copy of the
//! run bitmap word (which also marks reservations and frees in flight); per class
//! (built-in size class or custom class), the lists of runs that have free slots and of
//! runs owned by threads; each thread's cache of the runs it owns; and the volatile copy
//! of the pool's class table. Also the scan that validates page descriptors (against the
//! class table) and rebuilds all of this at open.
//!
//! The persistent truth is the page descriptors (`docs/pool-format.md`, "Page
//! descriptors"). The volatile state is always *ahead* of it: a slot is reserved here
//! before its bit is set durably, and a slot or span becomes free here only after its
//! release is durable. That ordering is why a reservation can never be handed out twice
//! and a crash can only lose reservations, which were never published.
//!
//! # Threads and runs
//!
//! A thread allocates from runs it *owns*: per (class, type) its thread cache holds one
//! run, and an allocation claims a clear bit of that run's volatile bitmap word with
//! one atomic `fetch_or`: no lock, and other threads allocate in other runs. When the
//! run is full the thread gives it back (*unowns* it) and takes a *listed* run of the
//! class (unowned, with free slots) or carves a new run from the free pages. A thread's
//! runs are given back when it exits. Any thread frees into any run (an atomic bit
//! clear, after the durable free); a free that leaves an unowned run with a free slot
//! lists it, and one that empties an unowned run releases it (its pages return to the
//! free spans). Before an allocation fails, the thread takes a slot from any run of its
//! class, owned by another thread or not (*stealing*), and releases empty listed runs
//! of every class.
//!
//! Invariants (checked by [`Heap::verify_against`] when no operation is in flight):
//! - every heap page is in exactly one of: a free span of `Pages`, a live run, a live
//!   extent; `head_of[p] == head + 1` for every page of a run and for the first page of an
//!   extent (objects in extents are only addressed by their first page), and 0 for
//!   extents' other pages and free pages;
//! - a live span's state has `LIVE`; only a head page's state is ever non-zero;
//! - a run of `n` slots uses `words(n)` volatile bitmap words (on its first pages); a bit
//!   is set iff its slot is reserved, allocated, or being freed, and the bits past `n` in
//!   the last word are always set (so a clear bit is always a free slot); every other
//!   volatile bitmap word is 0; `pending` ⊆ the bitmap;
//! - a run is `OWNED` iff one thread cache holds it, and then it is in its class's
//!   `owned` list; it is `LISTED` iff it is in its class's `partial` set; an unowned run
//!   with a free slot is listed (a free that clears a bit of an unowned, unlisted run lists
//!   it; unowning checks for free slots after clearing `OWNED`, and both sides use
//!   sequentially consistent operations, so one of them sees the other);
//! - every live run is durably described (the descriptor is persisted when the run is
//!   carved, before any slot of it is handed out);
//! - when no operation is in flight, a run's bitmap words (without the tail bits) equal
//!   its persistent bitmap;
//! - a run of custom class `c` is in the lists of class slot `CLASSES + c` and has the
//!   class's unit and run length; a custom class is in the volatile table only once its
//!   entry is durable (the pool publishes it after the commit), so a run of class `c` is
//!   never carved before class `c` is durably registered.
//!
//! Locks: `pages`, and one per class slot (their order: `docs/concurrency.md`,
//! "terrace-pool").
//! State flags of runs change only under their class lock; bitmap words change with
//! atomics only. An owned run is never released, so its owner claims without a lock;
//! stealing and releasing happen under the class lock, so a released run has no claim in
//! flight.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

// The class lists are keyed by type number: a fast non-cryptographic hash.
use rustc_hash::FxHashMap as HashMap;

use crate::backend::Backend;
use crate::class::{self, ClassId};
use crate::error::{corrupt, PoolError, Result};
use crate::format::{
    self, ClassEntry, Geometry, CLASS_SLOTS, KIND_EXTENT, KIND_FREE, KIND_RUN, META_BITMAP,
    META_TYPE, META_WORD0, META_WORD1, PAGE,
};
use crate::log::{self, Entries, RedoEntry};
use crate::pool::ROOT_TYPE;

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
    /// Runs: the custom class (0: a built-in size class).
    pub class: u8,
    pub type_num: u64,
    /// Runs: the allocation bitmap (one word per page).
    pub bits: Vec<u64>,
}

/// The pool's custom classes by id (`None`: not registered); index 0 and 255 are always
/// `None`.
pub(crate) type ClassTable = [Option<ClassEntry>; CLASS_SLOTS];

/// Reads and validates every page descriptor (a run of a custom class must match that
/// class in `classes`); returns the spans in address order and the number of free pages.
/// Any violation is `Corrupt` naming the descriptor.
pub(crate) fn scan<B: Backend>(
    b: &B,
    geo: &Geometry,
    classes: &ClassTable,
) -> Result<(Vec<SpanInfo>, u64)> {
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
                let cls = (w1 >> 32) as u8;
                let mut bits = Vec::new();
                if kind == KIND_RUN {
                    check_run(i, pages, w1, classes).map_err(|what| corrupt(what, at))?;
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
                    class: if kind == KIND_RUN { cls } else { 0 },
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

/// Checks a run head's `word1` (unit and class) against its length and the class table.
fn check_run(
    page: u64,
    pages: u32,
    w1: u64,
    classes: &ClassTable,
) -> std::result::Result<(), String> {
    let unit = w1 as u32;
    let cls = (w1 >> 32) as u8;
    if w1 >> 40 != 0 {
        return Err(format!(
            "run at page {page} has reserved unit-word bits set ({w1:#x})"
        ));
    }
    if cls == 0 {
        if unit < class::MIN_UNIT || !unit.is_multiple_of(16) || unit as u64 > pages as u64 * PAGE {
            return Err(format!(
                "run at page {page} has impossible unit {w1:#x} for {pages} pages"
            ));
        }
        return Ok(());
    }
    match classes[cls as usize] {
        None => Err(format!(
            "run at page {page} belongs to allocation class {cls}, which is not registered"
        )),
        Some(e) if e.unit != unit || e.pages != pages => Err(format!(
            "run at page {page} of class {cls} has unit {unit} and {pages} pages; the class \
             says unit {} and {} pages",
            e.unit, e.pages
        )),
        Some(_) => Ok(()),
    }
}

/// Free page spans.
#[derive(Debug, Default)]
struct Pages {
    by_start: BTreeMap<u32, u32>,
    by_len: BTreeSet<(u32, u32)>,
    free_pages: u64,
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

/// Span state: the span exists (set from its creation until its release starts).
const LIVE: u64 = 1;
/// Run state: a thread cache holds the run.
const OWNED: u64 = 2;
/// Run state: the run is in its class's `partial` set.
const LISTED: u64 = 4;
/// Extent state: a free of the extent is in flight.
const FREEING: u64 = 8;

/// "No run" in a thread cache.
const NONE: u32 = u32::MAX;

/// Volatile description of the span headed at a page (meaningful at head pages only).
#[derive(Debug, Default)]
struct Span {
    /// `unit | class << 24 | pages << 32` (units are below 2^24); the unit and class are
    /// 0 for an extent, the class 0 for a run of a built-in size class.
    shape: AtomicU64,
    type_num: AtomicU64,
    /// `LIVE | OWNED | LISTED | FREEING`.
    state: AtomicU64,
}

#[inline]
fn shape(unit: u32, class: u8, pages: u32) -> u64 {
    unit as u64 | (class as u64) << 24 | (pages as u64) << 32
}

/// The lists a class's runs are kept in: built-in size classes by index, then the runs of
/// units no built-in class has (from another class table: usable for frees only) at
/// `CLASSES`, then custom class `c` at `CLASSES + c`.
const CLASS_LISTS: usize = class::CLASSES + CLASS_SLOTS;

/// A class a reservation is served from: where its runs are listed, their unit, and how
/// carving a run for it goes.
#[derive(Clone, Copy, Debug)]
struct RunClass {
    /// Index into the class lists and thread cache ways (see [`CLASS_LISTS`]).
    slot: usize,
    unit: u32,
    /// Custom class id (0: built-in).
    id: u8,
    /// Custom classes: the run length (built-in classes compute theirs, with a fallback).
    pages: u32,
}

impl RunClass {
    #[inline(always)]
    fn builtin(slot: usize, unit: u32) -> RunClass {
        RunClass {
            slot,
            unit,
            id: 0,
            pages: 0,
        }
    }
}

/// Bitmap words a run of `nslots` slots uses.
#[inline]
fn words(nslots: u32) -> u32 {
    nslots.div_ceil(64).max(1)
}

/// The bits of word `j` of a run of `nslots` slots that are slots.
#[inline]
fn valid(nslots: u32, j: u32) -> u64 {
    let first = j as u64 * 64;
    let n = nslots as u64;
    if first >= n {
        0
    } else if n - first >= 64 {
        u64::MAX
    } else {
        (1u64 << (n - first)) - 1
    }
}

/// The slot of a run of `unit` at byte `rel` of the run, and the remainder (0 at a
/// slot's start). Runs this crate makes span at most 1 MiB: 32-bit division then.
#[inline(always)]
fn slot_of(rel: u64, unit: u32) -> (u32, u32) {
    match u32::try_from(rel) {
        Ok(rel) => (rel / unit, rel % unit),
        Err(_) => (
            u32::try_from(rel / unit as u64).unwrap_or(u32::MAX),
            (rel % unit as u64) as u32,
        ),
    }
}

/// Stores into one element of `a` per 4 KiB of it (see `Heap::load`).
fn prefault<T>(a: &[T], touch: impl Fn(&T)) {
    let step = (4096 / std::mem::size_of::<T>().max(1)).max(1);
    for x in a.iter().step_by(step) {
        touch(x);
    }
}

/// A run's geometry, read from its volatile span (its class is [`HeapState::run_class`]'s:
/// only list changes need it, and this is on every free).
#[derive(Clone, Copy, Debug)]
struct RunInfo {
    unit: u32,
    pages: u32,
    nslots: u32,
}

/// The runs of one (class, type): unowned ones with free slots, and owned ones.
#[derive(Debug, Default)]
struct TypeLists {
    partial: BTreeSet<u32>,
    owned: Vec<u32>,
}

/// The lists of one size class, by type number.
#[derive(Debug, Default)]
struct ClassLists {
    by_type: HashMap<u64, TypeLists>,
}

/// A block reserved for an allocation, not yet durable.
#[derive(Clone, Debug)]
pub(crate) struct Reserved {
    pub off: u64,
    pub usable: u64,
    block: Block,
}

#[derive(Clone, Copy, Debug)]
enum Block {
    Slot { head: u32, idx: u32 },
    Extent { head: u32, pages: u32 },
}

/// Which objects [`Heap::begin_free`] accepts: the root object is freed only when the
/// root moves (it is never freed by a user's free).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Freeable {
    /// Any live object but the root.
    NotRoot,
    /// Any live object, the root included.
    RootToo,
}

/// A block being freed: pending until its release is durable.
#[derive(Debug)]
pub(crate) struct Freeing {
    block: Block,
}

/// An empty run taken out of every list, whose release is to be made durable.
#[derive(Clone, Copy, Debug)]
struct Emptied {
    head: u32,
    pages: u32,
    nslots: u32,
}

/// A live object as the volatile heap knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ObjectInfo {
    pub usable: u64,
    pub type_num: u64,
}

/// Allocation statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
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
    /// Runs of built-in size classes, per unit size: (runs, slots, used slots).
    pub classes: BTreeMap<u32, (u64, u64, u64)>,
    /// Runs of custom classes, per class id: (runs, slots, used slots).
    pub custom_classes: BTreeMap<u8, (u64, u64, u64)>,
}

/// The volatile heap's state: held by the pool's [`Heap`] and (weakly) by every thread's
/// cache of it.
struct HeapState {
    /// Distinguishes heaps in thread caches (never reused in a process).
    id: u64,
    geo: Geometry,
    pages: Mutex<Pages>,
    head_of: Box<[AtomicU32]>,
    spans: Box<[Span]>,
    /// Volatile bitmap word per page (see the module invariants).
    vbits: Box<[AtomicU64]>,
    /// Slots whose free is in flight, per page like `vbits`.
    pending: Box<[AtomicU64]>,
    /// One per class slot (see [`CLASS_LISTS`]).
    classes: Box<[Mutex<ClassLists>]>,
    /// The custom classes: entry words of the class table (0: none), stored only after
    /// the entry is durable.
    custom: Box<[AtomicU64]>,
    /// Listed runs that may be empty (a hint for [`HeapState::reclaim`]).
    empty_listed: AtomicUsize,
}

/// The volatile allocator. See the module docs.
pub(crate) struct Heap {
    s: Arc<HeapState>,
}

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heap")
            .field("id", &self.s.id)
            .field("pages", &self.s.geo.page_count)
            .finish_non_exhaustive()
    }
}

static HEAP_IDS: AtomicU64 = AtomicU64::new(1);
static THREAD_IDS: AtomicUsize = AtomicUsize::new(0);

/// One run a thread owns, for one (class, type).
#[derive(Clone, Copy, Debug)]
struct Cur {
    head: u32,
    nslots: u32,
    /// The bitmap word the last claim found a clear bit in.
    hint: u32,
    type_num: u64,
}

const EMPTY: Cur = Cur {
    head: NONE,
    nslots: 0,
    hint: 0,
    type_num: 0,
};

/// A thread's runs in one heap: two (class, type) ways per class slot (built-in slots
/// from the start, custom slots added when first used).
struct PoolCache {
    id: u64,
    heap: Weak<HeapState>,
    ways: Vec<[Cur; 2]>,
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        // The thread exits (or the heap is gone): its runs go back to the class lists.
        if let Some(s) = self.heap.upgrade() {
            for c in self.ways.iter().flatten() {
                if c.head != NONE {
                    s.unown(c.head, c.type_num);
                }
            }
        }
    }
}

thread_local! {
    static THREAD_ID: usize = THREAD_IDS.fetch_add(1, Relaxed);
    static CACHES: RefCell<Vec<PoolCache>> = const { RefCell::new(Vec::new()) };
}

/// A small per-thread number, used to pick a lane.
#[inline]
pub(crate) fn thread_slot() -> usize {
    THREAD_ID.try_with(|id| *id).unwrap_or(0)
}

/// The calling thread's cache for `s`, created on first use (caches of heaps that are
/// gone are dropped then), moved to the front (where the fast path looks).
fn cache_of<'c>(caches: &'c mut Vec<PoolCache>, s: &Arc<HeapState>) -> &'c mut PoolCache {
    match caches.iter().position(|c| c.id == s.id) {
        Some(i) => caches.swap(0, i),
        None => {
            caches.retain(|c| c.heap.strong_count() > 0);
            caches.push(PoolCache {
                id: s.id,
                heap: Arc::downgrade(s),
                ways: vec![[EMPTY; 2]; class::CLASSES],
            });
            let last = caches.len() - 1;
            caches.swap(0, last);
        }
    }
    &mut caches[0]
}

impl HeapState {
    #[inline(always)]
    fn span(&self, head: u32) -> &Span {
        &self.spans[head as usize]
    }

    #[inline(always)]
    fn run_info(&self, head: u32) -> RunInfo {
        let sh = self.span(head).shape.load(Acquire);
        let (unit, pages) = (sh as u32 & 0xFF_FFFF, (sh >> 32) as u32);
        RunInfo {
            unit,
            pages,
            nslots: if unit == 0 {
                0
            } else {
                class::slots(unit, pages)
            },
        }
    }

    /// The custom class of the run at `head` (0: a built-in size class, or an extent).
    fn run_class(&self, head: u32) -> u8 {
        (self.span(head).shape.load(Acquire) >> 24) as u8
    }

    /// The class lists a run of `unit` and custom class `class` (0: none) belongs to.
    fn class_slot(&self, unit: u32, class: u8) -> usize {
        if class != 0 {
            return class::CLASSES + class as usize;
        }
        class::index(unit).unwrap_or(class::CLASSES)
    }

    fn mark_span(&self, head: u32, pages: u32) {
        for p in head..head + pages {
            self.head_of[p as usize].store(head + 1, Release);
        }
    }

    fn clear_span(&self, head: u32, pages: u32) {
        for p in head..head + pages {
            self.head_of[p as usize].store(0, Release);
        }
    }

    /// Claims a clear bit of the run at `head`, starting at word `hint`; `None` when the
    /// run is full.
    #[inline(always)]
    fn claim(&self, head: u32, nslots: u32, hint: &mut u32) -> Option<u32> {
        let n = words(nslots);
        let mut w = if *hint < n { *hint } else { 0 };
        for _ in 0..n {
            let word = &self.vbits[(head + w) as usize];
            let mut v = word.load(Relaxed);
            while v != u64::MAX {
                let bit = 1u64 << (!v).trailing_zeros();
                let old = word.fetch_or(bit, AcqRel);
                if old & bit == 0 {
                    *hint = w;
                    return Some(w * 64 + bit.trailing_zeros());
                }
                v = old | bit;
            }
            w += 1;
            if w == n {
                w = 0;
            }
        }
        None
    }

    fn has_free(&self, head: u32, nslots: u32) -> bool {
        (0..words(nslots)).any(|j| self.vbits[(head + j) as usize].load(SeqCst) != u64::MAX)
    }

    fn is_empty(&self, head: u32, nslots: u32) -> bool {
        (0..words(nslots))
            .all(|j| self.vbits[(head + j) as usize].load(SeqCst) == !valid(nslots, j))
    }

    #[inline(always)]
    fn slot(&self, head: u32, idx: u32, unit: u32) -> Reserved {
        Reserved {
            off: self.geo.page_addr(head as u64) + idx as u64 * unit as u64,
            usable: unit as u64,
            block: Block::Slot { head, idx },
        }
    }

    /// Carves a new run of class `rc` from the free pages and describes it durably: unit,
    /// class and type first, then word 0 (the run exists on the medium once word 0 is
    /// durable; it has no bit set). `Ok(None)` when no span of pages fits. A built-in
    /// class takes a shorter run when its preferred length does not fit; a custom class
    /// always has its recorded length.
    fn new_run<B: Backend>(
        &self,
        b: &B,
        rc: RunClass,
        type_num: u64,
        state: u64,
    ) -> Result<Option<(u32, u32)>> {
        let unit = rc.unit;
        let got = {
            let mut p = lock(&self.pages);
            if rc.id != 0 {
                p.take(rc.pages).map(|h| (h, rc.pages))
            } else {
                let want = class::run_pages(unit);
                p.take(want).map(|h| (h, want)).or_else(|| {
                    let min = class::min_pages(unit);
                    p.take(min).map(|h| (h, min))
                })
            }
        };
        let Some((head, pages)) = got else {
            return Ok(None);
        };
        let meta = self.geo.meta(head as u64);
        // On failure the descriptor's state is unknown: the pages stay taken (the caller
        // poisons the pool; reopening rebuilds the heap from the medium).
        b.store_u64(meta + META_WORD1, format::run_word1(unit, rc.id))?;
        b.store_u64(meta + META_TYPE, type_num)?;
        b.persist(meta + META_WORD1, 16)?;
        b.store_u64(meta + META_WORD0, format::word0(KIND_RUN, pages))?;
        b.persist(meta + META_WORD0, 8)?;
        let nslots = class::slots(unit, pages);
        let span = self.span(head);
        span.shape.store(shape(unit, rc.id, pages), Relaxed);
        span.type_num.store(type_num, Relaxed);
        let last = words(nslots) - 1;
        self.vbits[(head + last) as usize].store(!valid(nslots, last), Relaxed);
        span.state.store(state, SeqCst);
        self.mark_span(head, pages);
        Ok(Some((head, nslots)))
    }

    /// A run of (`rc`, `type_num`) for the calling thread to own: a listed one, else a
    /// new one. `Ok(None)` when there is neither.
    fn acquire_run<B: Backend>(
        &self,
        b: &B,
        rc: RunClass,
        type_num: u64,
    ) -> Result<Option<(u32, u32)>> {
        {
            let mut lists = lock(&self.classes[rc.slot]);
            let tl = lists.by_type.entry(type_num).or_default();
            if let Some(head) = tl.partial.pop_first() {
                self.span(head).state.store(LIVE | OWNED, SeqCst);
                tl.owned.push(head);
                return Ok(Some((head, self.run_info(head).nslots)));
            }
        }
        let Some((head, nslots)) = self.new_run(b, rc, type_num, LIVE | OWNED)? else {
            return Ok(None);
        };
        lock(&self.classes[rc.slot])
            .by_type
            .entry(type_num)
            .or_default()
            .owned
            .push(head);
        Ok(Some((head, nslots)))
    }

    /// Gives an owned run back to its class: listed if it has a free slot.
    fn unown(&self, head: u32, type_num: u64) {
        let info = self.run_info(head);
        let mut lists = lock(&self.classes[self.class_slot(info.unit, self.run_class(head))]);
        let span = self.span(head);
        span.state.store(LIVE, SeqCst);
        let tl = lists.by_type.entry(type_num).or_default();
        if let Some(i) = tl.owned.iter().position(|&h| h == head) {
            tl.owned.swap_remove(i);
        }
        if self.has_free(head, info.nslots) {
            span.state.store(LIVE | LISTED, SeqCst);
            tl.partial.insert(head);
            if self.is_empty(head, info.nslots) {
                self.empty_listed.fetch_add(1, Relaxed);
            }
        }
    }

    /// Called after bit `j`-word of the run at `head` was cleared (its word is now
    /// `word`): lists the run if it is unowned and unlisted; takes it out of every list
    /// and returns it for release if it is unowned and empty.
    #[inline(always)]
    fn after_clear(&self, head: u32, info: RunInfo, word: u64, j: u32) -> Option<Emptied> {
        let st = self.span(head).state.load(SeqCst);
        if st & (OWNED | LIVE) != LIVE {
            return None;
        }
        if st & LISTED != 0 && word != !valid(info.nslots, j) {
            return None;
        }
        self.list_or_empty(head, info)
    }

    #[inline(never)]
    fn list_or_empty(&self, head: u32, info: RunInfo) -> Option<Emptied> {
        let span = self.span(head);
        let type_num = span.type_num.load(Relaxed);
        let mut lists = lock(&self.classes[self.class_slot(info.unit, self.run_class(head))]);
        let st = span.state.load(SeqCst);
        if st & (OWNED | LIVE) != LIVE {
            return None;
        }
        let tl = lists.by_type.entry(type_num).or_default();
        if self.is_empty(head, info.nslots) {
            tl.partial.remove(&head);
            span.state.store(0, SeqCst);
            return Some(Emptied {
                head,
                pages: info.pages,
                nslots: info.nslots,
            });
        }
        if st & LISTED == 0 {
            span.state.store(LIVE | LISTED, SeqCst);
            tl.partial.insert(head);
        }
        None
    }

    /// Makes a release durable (word 0 := 0, a single-word commit: every bit of the run
    /// is durably clear), then returns the pages.
    #[inline(never)]
    fn release<B: Backend>(&self, b: &B, rel: Emptied) -> Result<()> {
        let meta = self.geo.meta(rel.head as u64);
        log::apply_one(b, &RedoEntry::set(meta + META_WORD0, 0))?;
        self.clear_span(rel.head, rel.pages);
        for j in 0..words(rel.nslots) {
            self.vbits[(rel.head + j) as usize].store(0, Relaxed);
        }
        let span = self.span(rel.head);
        span.shape.store(0, Relaxed);
        span.type_num.store(0, Relaxed);
        lock(&self.pages).give(rel.head, rel.pages);
        Ok(())
    }

    /// Releases every listed run that is empty (the free pages ran out). Returns whether
    /// any was.
    fn reclaim<B: Backend>(&self, b: &B) -> Result<bool> {
        if self.empty_listed.swap(0, AcqRel) == 0 {
            return Ok(false);
        }
        let mut found = Vec::new();
        for class in self.classes.iter() {
            let mut lists = lock(class);
            for tl in lists.by_type.values_mut() {
                let empty: Vec<u32> = tl
                    .partial
                    .iter()
                    .copied()
                    .filter(|&h| self.is_empty(h, self.run_info(h).nslots))
                    .collect();
                for head in empty {
                    tl.partial.remove(&head);
                    self.span(head).state.store(0, SeqCst);
                    let info = self.run_info(head);
                    found.push(Emptied {
                        head,
                        pages: info.pages,
                        nslots: info.nslots,
                    });
                }
            }
        }
        for &rel in &found {
            self.release(b, rel)?;
        }
        Ok(!found.is_empty())
    }

    /// Takes a slot from any run of (`rc`, `type_num`), owned by another thread or not.
    fn steal(&self, rc: RunClass, type_num: u64) -> Option<Reserved> {
        let lists = lock(&self.classes[rc.slot]);
        let tl = lists.by_type.get(&type_num)?;
        for &head in tl.owned.iter().chain(tl.partial.iter()) {
            let mut hint = 0;
            if let Some(idx) = self.claim(head, self.run_info(head).nslots, &mut hint) {
                return Some(self.slot(head, idx, rc.unit));
            }
        }
        None
    }

    /// When no run could be acquired: a stolen slot (`Some`), or `None` after empty runs
    /// were released (try again), or `OutOfSpace`.
    fn last_resort<B: Backend>(
        &self,
        b: &B,
        rc: RunClass,
        type_num: u64,
        size: u64,
    ) -> Result<Option<Reserved>> {
        if let Some(r) = self.steal(rc, type_num) {
            return Ok(Some(r));
        }
        if self.reclaim(b)? {
            return Ok(None);
        }
        Err(PoolError::OutOfSpace { size })
    }

    fn reserve_cached<B: Backend>(
        &self,
        b: &B,
        pc: &mut PoolCache,
        rc: RunClass,
        type_num: u64,
        size: u64,
    ) -> Result<Reserved> {
        if pc.ways.len() <= rc.slot {
            pc.ways.resize(rc.slot + 1, [EMPTY; 2]);
        }
        let ways = &mut pc.ways[rc.slot];
        let w = match ways
            .iter()
            .position(|w| w.head != NONE && w.type_num == type_num)
        {
            Some(w) => w,
            None => match ways.iter().position(|w| w.head == NONE) {
                Some(w) => w,
                None => {
                    // Both ways hold runs of other types: give back the second.
                    self.unown(ways[1].head, ways[1].type_num);
                    ways[1] = EMPTY;
                    1
                }
            },
        };
        let cur = &mut ways[w];
        if cur.head != NONE {
            if let Some(idx) = self.claim(cur.head, cur.nslots, &mut cur.hint) {
                return Ok(self.slot(cur.head, idx, rc.unit));
            }
        }
        self.refill(b, cur, rc, type_num, size)
    }

    /// The slow path of a cached reservation: the owned run is full (or there is none).
    fn refill<B: Backend>(
        &self,
        b: &B,
        cur: &mut Cur,
        rc: RunClass,
        type_num: u64,
        size: u64,
    ) -> Result<Reserved> {
        loop {
            if cur.head != NONE {
                if let Some(idx) = self.claim(cur.head, cur.nslots, &mut cur.hint) {
                    return Ok(self.slot(cur.head, idx, rc.unit));
                }
                let full = cur.head;
                *cur = EMPTY;
                self.unown(full, type_num);
            }
            match self.acquire_run(b, rc, type_num)? {
                Some((head, nslots)) => {
                    *cur = Cur {
                        head,
                        nslots,
                        hint: 0,
                        type_num,
                    }
                }
                None => {
                    if let Some(r) = self.last_resort(b, rc, type_num, size)? {
                        return Ok(r);
                    }
                }
            }
        }
    }

    /// A reservation without a thread cache (the thread is exiting): a run is owned
    /// for one claim only.
    fn reserve_uncached<B: Backend>(
        &self,
        b: &B,
        rc: RunClass,
        type_num: u64,
        size: u64,
    ) -> Result<Reserved> {
        loop {
            match self.acquire_run(b, rc, type_num)? {
                Some((head, nslots)) => {
                    let got = self.claim(head, nslots, &mut 0);
                    self.unown(head, type_num);
                    if let Some(idx) = got {
                        return Ok(self.slot(head, idx, rc.unit));
                    }
                }
                None => {
                    if let Some(r) = self.last_resort(b, rc, type_num, size)? {
                        return Ok(r);
                    }
                }
            }
        }
    }

    fn reserve_extent<B: Backend>(&self, b: &B, size: u64, type_num: u64) -> Result<Reserved> {
        let npages = class::extent_pages(size);
        if npages > self.geo.page_count {
            return Err(PoolError::OutOfSpace { size });
        }
        let npages = npages as u32;
        let head = loop {
            if let Some(head) = lock(&self.pages).take(npages) {
                break head;
            }
            if !self.reclaim(b)? {
                return Err(PoolError::OutOfSpace { size });
            }
        };
        // Everything but word 0, which the allocation's commit sets: a free page's unit
        // and type words mean nothing, so this needs no log.
        let meta = self.geo.meta(head as u64);
        let described = (|| {
            b.store_u64(meta + META_WORD1, 0)?;
            b.store_u64(meta + META_TYPE, type_num)?;
            b.persist(meta + META_WORD1, 16)
        })();
        if let Err(e) = described {
            lock(&self.pages).give(head, npages);
            return Err(e);
        }
        let span = self.span(head);
        span.shape.store(shape(0, 0, npages), Relaxed);
        span.type_num.store(type_num, Relaxed);
        span.state.store(LIVE, SeqCst);
        // Only the first page: see the module invariants.
        self.mark_span(head, 1);
        Ok(Reserved {
            off: self.geo.page_addr(head as u64),
            usable: npages as u64 * PAGE,
            block: Block::Extent {
                head,
                pages: npages,
            },
        })
    }

    /// An extent is gone from the volatile heap: its pages are free again.
    fn drop_extent(&self, head: u32, pages: u32) {
        let span = self.span(head);
        span.state.store(0, SeqCst);
        self.clear_span(head, 1);
        span.shape.store(0, Relaxed);
        span.type_num.store(0, Relaxed);
        lock(&self.pages).give(head, pages);
    }

    /// Clears a slot's bit (its reservation was cancelled or its free is durable) and
    /// lists or releases its run as the module docs say.
    #[inline(always)]
    fn clear_slot<B: Backend>(&self, b: &B, head: u32, idx: u32) -> Result<()> {
        let info = self.run_info(head);
        let j = idx / 64;
        let bit = 1u64 << (idx % 64);
        let word = self.vbits[(head + j) as usize].fetch_and(!bit, SeqCst) & !bit;
        match self.after_clear(head, info, word, j) {
            Some(rel) => self.release(b, rel),
            None => Ok(()),
        }
    }

    #[inline(always)]
    fn head_of(&self, off: u64) -> Result<u32> {
        let page = self
            .geo
            .page_of(off)
            .ok_or(PoolError::InvalidObject { offset: off })?;
        match self.head_of[page as usize].load(Acquire) {
            0 => Err(PoolError::InvalidObject { offset: off }),
            h => Ok(h - 1),
        }
    }
}

impl Heap {
    /// Rebuilds the volatile heap from a validated class table and the page descriptors
    /// validated against it.
    pub fn load(geo: Geometry, classes: &ClassTable, spans: &[SpanInfo]) -> Heap {
        let n = geo.page_count as usize;
        let s = HeapState {
            id: HEAP_IDS.fetch_add(1, Relaxed),
            geo,
            pages: Mutex::new(Pages::default()),
            head_of: (0..n).map(|_| AtomicU32::new(0)).collect(),
            spans: (0..n).map(|_| Span::default()).collect(),
            vbits: (0..n).map(|_| AtomicU64::new(0)).collect(),
            pending: (0..n).map(|_| AtomicU64::new(0)).collect(),
            classes: (0..CLASS_LISTS)
                .map(|_| Mutex::new(ClassLists::default()))
                .collect(),
            custom: (0..CLASS_SLOTS)
                .map(|id| {
                    let word = classes[id].map_or(0, |e| e.encode(id as u8));
                    AtomicU64::new(word)
                })
                .collect(),
            empty_listed: AtomicUsize::new(0),
        };
        // The arrays may come from fresh zero pages the kernel maps on first touch: touch
        // them now, so allocations do not take those page faults (up to 11 bytes of
        // arrays per KiB of heap).
        prefault(&s.head_of, |a| a.store(0, Relaxed));
        prefault(&s.spans, |a| a.state.store(0, Relaxed));
        prefault(&s.vbits, |a| a.store(0, Relaxed));
        prefault(&s.pending, |a| a.store(0, Relaxed));
        {
            let mut gaps = Vec::new();
            let mut next = 0u32;
            for sp in spans {
                if sp.head > next {
                    gaps.push((next, sp.head - next));
                }
                next = sp.head + sp.pages;
                let span = s.span(sp.head);
                span.type_num.store(sp.type_num, Relaxed);
                if sp.kind == KIND_EXTENT {
                    span.shape.store(shape(0, 0, sp.pages), Relaxed);
                    span.state.store(LIVE, Relaxed);
                    s.mark_span(sp.head, 1);
                    continue;
                }
                span.shape
                    .store(shape(sp.unit, sp.class, sp.pages), Relaxed);
                s.mark_span(sp.head, sp.pages);
                let nslots = class::slots(sp.unit, sp.pages);
                for (j, &w) in sp.bits.iter().enumerate() {
                    s.vbits[sp.head as usize + j].store(w, Relaxed);
                }
                let last = words(nslots) - 1;
                s.vbits[(sp.head + last) as usize].fetch_or(!valid(nslots, last), Relaxed);
                let mut state = LIVE;
                if s.has_free(sp.head, nslots) {
                    state |= LISTED;
                    lock(&s.classes[s.class_slot(sp.unit, sp.class)])
                        .by_type
                        .entry(sp.type_num)
                        .or_default()
                        .partial
                        .insert(sp.head);
                    if s.is_empty(sp.head, nslots) {
                        s.empty_listed.fetch_add(1, Relaxed);
                    }
                }
                span.state.store(state, Relaxed);
            }
            if (next as u64) < geo.page_count {
                gaps.push((next, geo.page_count as u32 - next));
            }
            let mut pages = lock(&s.pages);
            for (start, len) in gaps {
                pages.give(start, len);
            }
        }
        Heap { s: Arc::new(s) }
    }

    /// Reserves a block for `size` bytes of type `type_num`: a slot of a run the calling
    /// thread owns (see the module docs), or an extent.
    #[inline]
    pub fn reserve<B: Backend>(&self, b: &B, size: u64, type_num: u64) -> Result<Reserved> {
        if let Some(r) = self.reserve_owned(size, type_num) {
            return Ok(r);
        }
        self.reserve_slow(b, size, type_num)
    }

    /// The fast path: a clear bit of the run the thread cache holds for the class and
    /// type (in the cache of this heap, which is the thread's first one).
    #[inline(always)]
    fn reserve_owned(&self, size: u64, type_num: u64) -> Option<Reserved> {
        if size == 0 {
            return None;
        }
        let unit = class::unit_for(size)?;
        let cls = class::index(unit)?;
        self.claim_owned(cls, unit, type_num)
    }

    /// A clear bit of the run the thread owns for class slot `cls` and `type_num`.
    #[inline(always)]
    fn claim_owned(&self, cls: usize, unit: u32, type_num: u64) -> Option<Reserved> {
        let s = &*self.s;
        // (head, slot) packed in a word: the result stays in registers.
        let at = CACHES
            .try_with(|c| {
                let mut caches = c.try_borrow_mut().ok()?;
                let pc = caches.first_mut().filter(|pc| pc.id == s.id)?;
                let ways = pc.ways.get_mut(cls)?;
                let cur = ways
                    .iter_mut()
                    .find(|w| w.head != NONE && w.type_num == type_num)?;
                let idx = s.claim(cur.head, cur.nslots, &mut cur.hint)?;
                Some((cur.head as u64) << 32 | idx as u64)
            })
            .ok()
            .flatten()?;
        Some(s.slot((at >> 32) as u32, at as u32, unit))
    }

    #[inline(never)]
    fn reserve_slow<B: Backend>(&self, b: &B, size: u64, type_num: u64) -> Result<Reserved> {
        if size == 0 {
            return Err(PoolError::InvalidArgument {
                what: "allocation size",
                detail: "0 bytes".into(),
            });
        }
        let Some((unit, cls)) = class::unit_for(size).and_then(|u| Some((u, class::index(u)?)))
        else {
            return self.s.reserve_extent(b, size, type_num);
        };
        self.reserve_run(b, RunClass::builtin(cls, unit), type_num, size)
    }

    /// A slot of class `rc` through the thread's cache (or without one while the thread
    /// exits).
    fn reserve_run<B: Backend>(
        &self,
        b: &B,
        rc: RunClass,
        type_num: u64,
        size: u64,
    ) -> Result<Reserved> {
        let s = &self.s;
        let cached = CACHES.try_with(|c| {
            let mut caches = c.try_borrow_mut().ok()?;
            let pc = cache_of(&mut caches, s);
            Some(s.reserve_cached(b, pc, rc, type_num, size))
        });
        match cached {
            Ok(Some(r)) => r,
            _ => s.reserve_uncached(b, rc, type_num, size),
        }
    }

    /// Reserves a slot of custom class `id` for `size` bytes (at most its unit) of type
    /// `type_num`, as [`Heap::reserve`] does for a size class.
    #[inline]
    pub fn reserve_in<B: Backend>(
        &self,
        b: &B,
        id: ClassId,
        size: u64,
        type_num: u64,
    ) -> Result<Reserved> {
        let word = self.s.custom[id.get() as usize].load(Acquire);
        if word == 0 {
            return Err(PoolError::NoSuchClass {
                id: id.get() as u32,
            });
        }
        let e = ClassEntry::fields(word);
        if size == 0 || size > e.unit as u64 {
            return Err(PoolError::InvalidArgument {
                what: "allocation size",
                detail: format!(
                    "{size} bytes in class {id}: must be 1 to its unit, {} bytes",
                    e.unit
                ),
            });
        }
        let rc = RunClass {
            slot: class::CLASSES + id.get() as usize,
            unit: e.unit,
            id: id.get(),
            pages: e.pages,
        };
        if let Some(r) = self.claim_owned(rc.slot, rc.unit, type_num) {
            return Ok(r);
        }
        self.reserve_run(b, rc, type_num, size)
    }

    /// The table entry of custom class `id`, if it is registered.
    pub fn class_entry(&self, id: ClassId) -> Option<ClassEntry> {
        match self.s.custom[id.get() as usize].load(Acquire) {
            0 => None,
            w => Some(ClassEntry::fields(w)),
        }
    }

    /// The volatile class table (every registered class).
    pub fn class_table(&self) -> ClassTable {
        let mut t: ClassTable = [None; CLASS_SLOTS];
        for id in ClassId::all() {
            t[id.get() as usize] = self.class_entry(id);
        }
        t
    }

    /// Makes class `id` usable: call only once its entry is durable (module invariants).
    pub fn add_class(&self, id: ClassId, e: &ClassEntry) {
        self.s.custom[id.get() as usize].store(e.encode(id.get()), Release);
    }

    /// The custom class of the run holding the live object at `off` (`None`: a built-in
    /// size class or an extent).
    pub fn class_of(&self, off: u64) -> Result<Option<ClassId>> {
        self.object(off)?;
        let head = self.s.head_of(off)?;
        let c = self.s.run_class(head);
        Ok((c != 0).then(|| ClassId::new(c as u32).ok()).flatten())
    }

    /// The redo entry that makes a reservation durably allocated: the slot's bit, or the
    /// extent's word 0 (its other words were persisted by `reserve`).
    #[inline(always)]
    pub fn alloc_entries(&self, r: &Reserved, out: &mut Entries) {
        let geo = &self.s.geo;
        match r.block {
            Block::Slot { head, idx } => {
                let word = geo.meta(head as u64 + idx as u64 / 64) + META_BITMAP;
                out.push(RedoEntry::or(word, 1 << (idx % 64)));
            }
            Block::Extent { head, pages } => {
                out.push(RedoEntry::set(
                    geo.meta(head as u64) + META_WORD0,
                    format::word0(KIND_EXTENT, pages),
                ));
            }
        }
    }

    /// The reservation will never be made durable: give it back. A run of the calling
    /// thread that this leaves empty is released, so an aborted allocation leaves no
    /// trace but durably described empty runs of other threads.
    pub fn cancel<B: Backend>(&self, b: &B, r: &Reserved) -> Result<()> {
        let s = &self.s;
        match r.block {
            Block::Slot { head, idx } => {
                let info = s.run_info(head);
                let j = idx / 64;
                let bit = 1u64 << (idx % 64);
                let word = s.vbits[(head + j) as usize].fetch_and(!bit, SeqCst) & !bit;
                if s.is_empty(head, info.nslots) {
                    self.disown_mine(head);
                }
                match s.after_clear(head, info, word, j) {
                    Some(rel) => s.release(b, rel),
                    None => Ok(()),
                }
            }
            Block::Extent { head, pages } => {
                s.drop_extent(head, pages);
                Ok(())
            }
        }
    }

    /// If the calling thread owns the run at `head`, gives it back.
    fn disown_mine(&self, head: u32) {
        let s = &self.s;
        let _ = CACHES.try_with(|c| {
            let Ok(mut caches) = c.try_borrow_mut() else {
                return;
            };
            let Some(pc) = caches.iter_mut().find(|pc| pc.id == s.id) else {
                return;
            };
            for cur in pc.ways.iter_mut().flatten() {
                if cur.head == head {
                    let type_num = cur.type_num;
                    *cur = EMPTY;
                    s.unown(head, type_num);
                    return;
                }
            }
        });
    }

    /// What the volatile heap knows of the live object at `off`.
    pub fn object(&self, off: u64) -> Result<ObjectInfo> {
        let s = &self.s;
        let head = s.head_of(off)?;
        let span = s.span(head);
        if span.state.load(Acquire) & LIVE == 0 {
            return Err(PoolError::InvalidObject { offset: off });
        }
        let info = s.run_info(head);
        let type_num = span.type_num.load(Relaxed);
        let start = s.geo.page_addr(head as u64);
        if info.unit == 0 {
            if off != start {
                return Err(PoolError::InvalidObject { offset: off });
            }
            return Ok(ObjectInfo {
                usable: info.pages as u64 * PAGE,
                type_num,
            });
        }
        let (idx, rem) = slot_of(off - start, info.unit);
        if rem != 0
            || idx >= info.nslots
            || s.vbits[(head + idx / 64) as usize].load(Acquire) & (1 << (idx % 64)) == 0
        {
            return Err(PoolError::InvalidObject { offset: off });
        }
        Ok(ObjectInfo {
            usable: info.unit as u64,
            type_num,
        })
    }

    /// Marks the live object at `off` as being freed (a second free of it fails until the
    /// first is cancelled) and returns the ticket. The root object is refused unless
    /// `which` is [`Freeable::RootToo`].
    #[inline]
    pub fn begin_free(&self, off: u64, which: Freeable) -> Result<Freeing> {
        match self.try_begin_free(off, which) {
            Some(f) => Ok(f),
            None => Err(self.free_error(off, which)),
        }
    }

    /// [`Heap::begin_free`] without saying why it refuses (kept small for the hot path).
    #[inline(always)]
    pub fn try_begin_free(&self, off: u64, which: Freeable) -> Option<Freeing> {
        let s = &self.s;
        let head = s.head_of(off).ok()?;
        let span = s.span(head);
        let st = span.state.load(Acquire);
        if st & LIVE == 0
            || (which == Freeable::NotRoot && span.type_num.load(Relaxed) == ROOT_TYPE)
        {
            return None;
        }
        let info = s.run_info(head);
        let start = s.geo.page_addr(head as u64);
        if info.unit == 0 {
            if off != start
                || span
                    .state
                    .compare_exchange(st & !FREEING, st | FREEING, AcqRel, Acquire)
                    .is_err()
            {
                return None;
            }
            return Some(Freeing {
                block: Block::Extent {
                    head,
                    pages: info.pages,
                },
            });
        }
        let (idx, rem) = slot_of(off - start, info.unit);
        let (w, bit) = ((head + idx / 64) as usize, 1u64 << (idx % 64));
        if rem != 0
            || idx >= info.nslots
            || s.vbits[w].load(Acquire) & bit == 0
            || s.pending[w].fetch_or(bit, AcqRel) & bit != 0
        {
            return None;
        }
        Some(Freeing {
            block: Block::Slot { head, idx },
        })
    }

    /// Why [`Heap::try_begin_free`] refused `off`.
    #[cold]
    pub fn free_error(&self, off: u64, which: Freeable) -> PoolError {
        let s = &self.s;
        if let Ok(head) = s.head_of(off) {
            let span = s.span(head);
            if which == Freeable::NotRoot
                && span.state.load(Acquire) & LIVE != 0
                && span.type_num.load(Relaxed) == ROOT_TYPE
                && self.object(off).is_ok()
            {
                return PoolError::InvalidArgument {
                    what: "object",
                    detail: "the root object cannot be freed".into(),
                };
            }
        }
        PoolError::InvalidObject { offset: off }
    }

    /// The redo entry that durably frees a block.
    #[inline(always)]
    pub fn free_entries(&self, f: &Freeing, out: &mut Entries) {
        let geo = &self.s.geo;
        match f.block {
            Block::Slot { head, idx } => {
                let word = geo.meta(head as u64 + idx as u64 / 64) + META_BITMAP;
                out.push(RedoEntry::and_not(word, 1 << (idx % 64)));
            }
            Block::Extent { head, .. } => {
                out.push(RedoEntry::set(geo.meta(head as u64) + META_WORD0, 0));
            }
        }
    }

    /// The free is durable: the block becomes available (a run it empties is released,
    /// which is a durable step of its own).
    #[inline(always)]
    pub fn free_done<B: Backend>(&self, b: &B, f: Freeing) -> Result<()> {
        let s = &self.s;
        match f.block {
            Block::Slot { head, idx } => {
                s.pending[(head + idx / 64) as usize].fetch_and(!(1u64 << (idx % 64)), AcqRel);
                s.clear_slot(b, head, idx)
            }
            Block::Extent { head, pages } => {
                s.drop_extent(head, pages);
                Ok(())
            }
        }
    }

    /// The free will not happen: the object stays live.
    pub fn free_cancel(&self, f: Freeing) {
        let s = &self.s;
        match f.block {
            Block::Slot { head, idx } => {
                s.pending[(head + idx / 64) as usize].fetch_and(!(1u64 << (idx % 64)), AcqRel);
            }
            Block::Extent { head, .. } => {
                s.span(head).state.fetch_and(!FREEING, AcqRel);
            }
        }
    }

    /// Visits every live span: `f(head, info)` (unit 0 for extents).
    fn for_each_span(&self, mut f: impl FnMut(u32, RunInfo)) {
        let s = &self.s;
        let n = s.geo.page_count as u32;
        let mut p = 0;
        while p < n {
            if s.span(p).state.load(Acquire) & LIVE != 0 {
                let info = s.run_info(p);
                f(p, info);
                p += info.pages.max(1);
            } else {
                p += 1;
            }
        }
    }

    fn used_slots(&self, head: u32, nslots: u32) -> u64 {
        (0..words(nslots))
            .map(|j| {
                (self.s.vbits[(head + j) as usize].load(Acquire) & valid(nslots, j)).count_ones()
                    as u64
            })
            .sum()
    }

    pub fn stats(&self) -> HeapStats {
        let mut st = HeapStats {
            heap_bytes: self.s.geo.page_count * PAGE,
            free_bytes: lock(&self.s.pages).free_pages * PAGE,
            ..HeapStats::default()
        };
        self.for_each_span(|head, info| {
            if info.unit == 0 {
                st.extents += 1;
                st.allocated_bytes += info.pages as u64 * PAGE;
                return;
            }
            st.runs += 1;
            let used_slots = self.used_slots(head, info.nslots);
            let used = used_slots * info.unit as u64;
            st.allocated_bytes += used;
            st.run_slack_bytes += info.pages as u64 * PAGE - used;
            let class = self.s.run_class(head);
            let c = if class != 0 {
                st.custom_classes.entry(class).or_default()
            } else {
                st.classes.entry(info.unit).or_default()
            };
            c.0 += 1;
            c.1 += info.nslots as u64;
            c.2 += used_slots;
        });
        st
    }

    /// Checks that the volatile heap describes exactly the persistent spans (call only
    /// when no operation is in flight). Returns what disagrees.
    pub fn verify_against(&self, spans: &[SpanInfo], free_pages: u64) -> Result<(), String> {
        let s = &self.s;
        let mut live = 0usize;
        self.for_each_span(|_, _| live += 1);
        let pages = lock(&s.pages);
        if pages.free_pages != free_pages {
            return Err(format!(
                "{} free pages in memory, {free_pages} on the medium",
                pages.free_pages
            ));
        }
        if live != spans.len() {
            return Err(format!(
                "{live} spans in memory, {} on the medium",
                spans.len()
            ));
        }
        for sp in spans {
            for p in sp.head..sp.head + sp.pages {
                let want = if sp.kind == KIND_EXTENT && p != sp.head {
                    0
                } else {
                    sp.head + 1
                };
                if s.head_of[p as usize].load(Acquire) != want {
                    return Err(format!("page {p} is not mapped to its span at {}", sp.head));
                }
            }
            let span = s.span(sp.head);
            let st = span.state.load(Acquire);
            let info = s.run_info(sp.head);
            let same = st & LIVE != 0
                && st & FREEING == 0
                && info.pages == sp.pages
                && info.unit == sp.unit
                && s.run_class(sp.head) == sp.class
                && span.type_num.load(Relaxed) == sp.type_num;
            if !same {
                return Err(format!("span at page {} differs in memory", sp.head));
            }
            if sp.kind == KIND_EXTENT {
                continue;
            }
            let n = words(info.nslots);
            for (j, &bits) in sp.bits.iter().enumerate() {
                let j = j as u32;
                let at = (sp.head + j) as usize;
                let want = if j < n {
                    bits | !valid(info.nslots, j)
                } else {
                    bits
                };
                if s.vbits[at].load(Acquire) != want || s.pending[at].load(Acquire) != 0 {
                    return Err(format!("run at page {} differs in memory", sp.head));
                }
            }
        }
        for (&start, &len) in &pages.by_start {
            for p in start..start + len {
                if s.head_of[p as usize].load(Acquire) != 0 {
                    return Err(format!("free page {p} is mapped to a span"));
                }
            }
        }
        Ok(())
    }
}

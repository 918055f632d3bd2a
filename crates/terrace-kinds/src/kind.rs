//! Kinds: the public handle and every per-kind operation — create (DRAM, file, NUMA,
//! unified, and the NUMA selections), malloc, calloc, realloc, posix_memalign, free,
//! usable size, kind detection, stats and destroy.
//!
//! A [`Kind`] is a copyable `(slot, generation)` handle; using a destroyed kind's handle
//! is an error (`NoSuchKind`), not undefined behaviour. Freeing needs no kind: the
//! registry finds the owner of any address in O(1). Freeing a pointer no kind owns
//! (never allocated here, or from a destroyed kind) does nothing and reports `false`.
//!
//! Concurrency: any thread may allocate from and free into any kind. Destroying a kind
//! while other threads still use it is the caller's error (as in memkind): their
//! operations may fail with `NoSuchKind`, and objects still in use become invalid.

use std::ffi::c_int;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use terrace_media::numa::Topology;
use terrace_media::{registry, FileLocation, FileOptions, MediaError, PageSize};
use tikv_jemalloc_sys as je;

use crate::engine::{self, FreedMemory};
use crate::error::{KindError, Result};
use crate::slots::{self, Slot, SlotKind};
use crate::space::{self, Space, SpaceMedium};
use crate::tcache;
use crate::unified::{Strategy, Unified};

/// The smallest maximum size of a file kind (memkind's `MEMKIND_PMEM_MIN_SIZE`): the
/// engine's metadata and first slabs need a few MiB.
pub const MIN_FILE_KIND_SIZE: usize = 16 << 20;

/// Address space a DRAM kind may grow to (virtual; pages are committed on touch).
const DRAM_CAPACITY: usize = 1 << 46;

/// Largest single request: beyond it sizes wrap or exceed the address space.
const MAX_REQUEST: usize = isize::MAX as usize;

/// A heap on one medium, or a unified heap over several. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Kind {
    index: u32,
    generation: u32,
}

/// The medium of a kind (None for unified kinds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KindMedium {
    Dram,
    File,
    Numa(u32),
}

/// How to create a file kind.
#[derive(Clone, Debug)]
pub struct FileKindOptions {
    /// `FileLocation::TempIn(dir)` for an unlinked file (nothing left behind), or
    /// `FileLocation::Path(path)` for a file kept after the kind is destroyed.
    pub location: FileLocation,
    /// The kind's maximum size in bytes, at least [`MIN_FILE_KIND_SIZE`].
    pub max_size: usize,
    /// Punch freed memory out of the file (off by default: see `terrace_media::FileOptions`).
    pub hole_punching: bool,
    /// File bytes kept reserved ahead of use, from creation on (None: an eighth of
    /// `max_size`, at most 512 MiB; 0: reserve one chunk at a time, on demand). Creation
    /// reserves them; afterwards a background thread keeps them ahead. This takes the
    /// `fallocate` cost off the allocating thread; the price is up to this many bytes
    /// reserved but unused (on tmpfs: memory) and a slower creation.
    pub reserve_ahead: Option<usize>,
}

impl FileKindOptions {
    /// An unlinked file of at most `max_size` bytes in `dir`.
    pub fn in_dir(dir: impl Into<std::path::PathBuf>, max_size: usize) -> Self {
        FileKindOptions {
            location: FileLocation::TempIn(dir.into()),
            max_size,
            hole_punching: false,
            reserve_ahead: None,
        }
    }
}

/// Per-kind statistics (bytes). For a unified kind, the sum over its members.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KindStats {
    /// Bytes in live allocations (rounded to size classes; includes objects held in thread
    /// caches).
    pub allocated: u64,
    /// Bytes in pages holding live allocations.
    pub active: u64,
    /// Bytes of the kind's memory that is physically resident (an upper bound).
    pub resident: u64,
    /// The most the kind can hold.
    pub capacity: u64,
    /// File blocks reserved so far (0 for anonymous media).
    pub reserved: u64,
}

/// The environment variable that names `MEMKIND_DAX_KMEM`'s nodes, as in memkind.
pub const DAX_KMEM_NODES_ENV: &str = "MEMKIND_DAX_KMEM_NODES";

/// A strict node list (`1`, `1,3`, `0-2,5`): None if any part is malformed or it is empty.
fn parse_node_list(list: &str) -> Option<Vec<u32>> {
    let mut nodes = Vec::new();
    for part in list.split(',').map(str::trim) {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let n = part.parse::<u32>().ok()?;
                (n, n)
            }
        };
        if last < first || last - first >= 1024 {
            return None;
        }
        nodes.extend(first..=last);
    }
    nodes.sort_unstable();
    nodes.dedup();
    (!nodes.is_empty()).then_some(nodes)
}

/// The static NUMA-based kinds memkind offers, created on first use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Selection {
    /// Nearest node first (memkind's `MEMKIND_LOWEST_LATENCY_LOCAL`, plus overflow).
    LowestLatencyLocal = 0,
    /// The node with the most memory (`MEMKIND_HIGHEST_CAPACITY`).
    HighestCapacity = 1,
    /// CPU-less nodes: PMem or CXL as system RAM (`MEMKIND_DAX_KMEM`).
    CpuLessMemory = 2,
    /// Nodes with CPUs (`MEMKIND_REGULAR`).
    Regular = 3,
}

const SELECTION_ORDER: [Selection; 4] = [
    Selection::LowestLatencyLocal,
    Selection::HighestCapacity,
    Selection::CpuLessMemory,
    Selection::Regular,
];

static SELECTIONS: Mutex<[Option<Kind>; 4]> = Mutex::new([None; 4]);

/// The selection whose kind is `kind` or has `kind` as a member (so the C ABI can report
/// `MEMKIND_REGULAR` for memory allocated through it, as memkind does).
pub fn selection_of(kind: Kind) -> Option<Selection> {
    let selections = *SELECTIONS.lock().unwrap_or_else(|p| p.into_inner());
    selections
        .iter()
        .zip(SELECTION_ORDER)
        .find_map(|(selected, which)| {
            let selected = (*selected)?;
            let member = selected.live_slot().ok().is_some_and(|slot| {
                let unified = slot.unified.load(Ordering::Acquire);
                // SAFETY: a live unified slot's pointer stays valid until the kind is
                // destroyed, which must not race with its use (module docs).
                !unified.is_null() && unsafe { &*unified }.members.contains(&kind)
            });
            (selected == kind || member).then_some(which)
        })
}

impl Kind {
    /// The default DRAM kind (memkind's `MEMKIND_DEFAULT`), created on first use.
    pub const DEFAULT: Kind = Kind {
        index: 0,
        generation: 1,
    };

    /// A DRAM kind of its own, on base pages or transparent huge pages.
    pub fn create_dram(pages: PageSize) -> Result<Kind> {
        create_arena_kind(
            match pages {
                PageSize::Huge => "dram (huge pages)".into(),
                PageSize::Base => "dram".into(),
            },
            SpaceMedium::Dram { pages },
            DRAM_CAPACITY,
            None,
        )
    }

    /// A file kind: volatile memory in a file (an emulated or real persistent/CXL tier).
    pub fn create_file(options: &FileKindOptions) -> Result<Kind> {
        if options.max_size < MIN_FILE_KIND_SIZE {
            return Err(KindError::SizeTooSmall {
                size: options.max_size,
                minimum: MIN_FILE_KIND_SIZE,
            });
        }
        if options.max_size > MAX_REQUEST / 2 {
            return Err(KindError::TooLarge {
                size: options.max_size,
            });
        }
        let where_ = match &options.location {
            FileLocation::TempIn(dir) => dir.display().to_string(),
            FileLocation::Path(path) => {
                // A volatile kind starts empty: the engine is told fresh space reads as
                // zero, so a kept file from an earlier run is emptied first.
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(path)
                    .map_err(|source| MediaError::Open {
                        path: path.clone(),
                        source,
                    })?;
                path.display().to_string()
            }
            FileLocation::Existing(_) => {
                return Err(KindError::Unsupported {
                    kind: "file".into(),
                    why: "a volatile kind starts empty; use FileLocation::Path to reuse a file",
                })
            }
        };
        let media = FileOptions {
            location: options.location.clone(),
            size: options.max_size,
            hole_punching: options.hole_punching,
        };
        let headroom = options
            .reserve_ahead
            .unwrap_or_else(|| space::default_headroom(options.max_size));
        create_arena_kind(
            format!("file:{where_}"),
            SpaceMedium::File {
                options: media,
                headroom,
            },
            options.max_size,
            None,
        )
    }

    /// A kind on NUMA node `node` (memory bound with `mbind`).
    pub fn create_numa(node: u32) -> Result<Kind> {
        let topology = Topology::discover();
        let capacity = topology
            .node(node)
            .map(|n| {
                if n.mem_total > 0 {
                    n.mem_total as usize
                } else {
                    DRAM_CAPACITY
                }
            })
            .unwrap_or(DRAM_CAPACITY);
        create_arena_kind(
            format!("numa:{node}"),
            SpaceMedium::Numa { node },
            capacity,
            None,
        )
    }

    /// A unified kind over `members` (at least one; not themselves unified).
    pub fn create_unified(members: &[Kind], strategy: Strategy) -> Result<Kind> {
        if members.is_empty() {
            return Err(KindError::EmptyUnified);
        }
        for member in members {
            let slot = member.live_slot()?;
            if slot.what() != SlotKind::Arena {
                return Err(KindError::Unsupported {
                    kind: slot.name(),
                    why: "a unified kind's members must not be unified kinds",
                });
            }
        }
        let names: Vec<String> = members.iter().map(|m| m.name()).collect();
        let name = format!("unified({strategy:?}: {})", names.join(", "));
        let unified = Box::into_raw(Box::new(Unified::new(members.to_vec(), strategy)));
        let created = slots::create_with(
            None,
            |_, slot| {
                slot.unified.store(unified, Ordering::Release);
                slot.arena_flags.store(0, Ordering::Release);
                slot.what.store(SlotKind::Unified as u8, Ordering::Release);
                *slot.name.lock().unwrap_or_else(|p| p.into_inner()) = name;
                Ok(())
            },
            || KindError::TooManyKinds {
                why: "kind table is full",
            },
        );
        match created {
            Ok((index, generation)) => Ok(Kind { index, generation }),
            Err(e) => {
                // SAFETY: not published (creation failed), so still exclusively ours.
                drop(unsafe { Box::from_raw(unified) });
                Err(e)
            }
        }
    }

    /// The kind of a static selection, created on first use.
    pub fn selected(which: Selection) -> Result<Kind> {
        match which {
            Selection::LowestLatencyLocal => Kind::lowest_latency_local(),
            Selection::HighestCapacity => Kind::highest_capacity(),
            Selection::CpuLessMemory => Kind::cpu_less_memory(),
            Selection::Regular => Kind::regular(),
        }
    }

    fn selection(which: Selection, make: impl FnOnce(&Topology) -> Result<Kind>) -> Result<Kind> {
        let which = which as usize;
        let mut selections = SELECTIONS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(kind) = selections[which] {
            if kind.live_slot().is_ok() {
                return Ok(kind);
            }
        }
        let kind = make(&Topology::discover())?;
        selections[which] = Some(kind);
        Ok(kind)
    }

    fn per_node(nodes: &[u32], strategy: Strategy) -> Result<Kind> {
        if nodes.is_empty() {
            return Err(KindError::Media(terrace_media::MediaError::NoSuchNode {
                node: u32::MAX,
                why: "no NUMA node matches this selection".into(),
            }));
        }
        let members: Vec<Kind> = nodes
            .iter()
            .map(|&n| Kind::create_numa(n))
            .collect::<Result<_>>()?;
        Kind::create_unified(&members, strategy)
    }

    /// Memory on the node nearest the calling thread, overflowing to farther nodes
    /// (memkind's `MEMKIND_LOWEST_LATENCY_LOCAL`, plus overflow).
    pub fn lowest_latency_local() -> Result<Kind> {
        Kind::selection(Selection::LowestLatencyLocal, |t| {
            let nodes: Vec<u32> = t
                .nodes()
                .iter()
                .filter(|n| n.has_memory)
                .map(|n| n.id)
                .collect();
            Kind::per_node(&nodes, Strategy::NumaLocal)
        })
    }

    /// Memory on the node with the most capacity (memkind's `MEMKIND_HIGHEST_CAPACITY`).
    pub fn highest_capacity() -> Result<Kind> {
        Kind::selection(Selection::HighestCapacity, |t| {
            let node = t
                .highest_capacity(terrace_media::os::current_node())
                .unwrap_or(0);
            Kind::create_numa(node)
        })
    }

    /// Memory on CPU-less nodes — PMem or CXL onlined as system RAM (memkind's
    /// `MEMKIND_DAX_KMEM`), nearest first. An error on machines without such nodes.
    ///
    /// As in memkind, [`DAX_KMEM_NODES_ENV`] (a node list such as `1,3-4`), when set,
    /// names the nodes instead; a malformed list or a node without memory is an error.
    pub fn cpu_less_memory() -> Result<Kind> {
        Kind::selection(Selection::CpuLessMemory, |t| {
            let nodes = match std::env::var(DAX_KMEM_NODES_ENV) {
                Ok(list) => parse_node_list(&list).ok_or_else(|| {
                    KindError::Media(terrace_media::MediaError::NoSuchNode {
                        node: u32::MAX,
                        why: format!("{DAX_KMEM_NODES_ENV}={list:?} is not a node list"),
                    })
                })?,
                Err(_) => t.cpu_less(),
            };
            Kind::per_node(&nodes, Strategy::NumaLocal)
        })
    }

    /// Memory on nodes with CPUs (memkind's `MEMKIND_REGULAR`), nearest first.
    pub fn regular() -> Result<Kind> {
        Kind::selection(Selection::Regular, |t| {
            let nodes: Vec<u32> = t
                .nodes()
                .iter()
                .filter(|n| n.has_memory && !n.cpus.is_empty())
                .map(|n| n.id)
                .collect();
            Kind::per_node(&nodes, Strategy::NumaLocal)
        })
    }

    /// The slot number, stable for the kind's life (for the C ABI).
    pub const fn index(self) -> u32 {
        self.index
    }

    /// Rebuilds a handle from [`index`](Self::index) and [`generation`](Self::generation).
    pub const fn from_parts(index: u32, generation: u32) -> Kind {
        Kind { index, generation }
    }

    pub const fn generation(self) -> u32 {
        self.generation
    }

    #[inline]
    fn live_slot(self) -> Result<&'static Slot> {
        let slot = slots::slot(self.index).ok_or(KindError::NoSuchKind)?;
        if slot.generation.load(Ordering::Acquire) == self.generation {
            return Ok(slot);
        }
        if self == Kind::DEFAULT {
            init_default()?;
            return Ok(slot);
        }
        Err(KindError::NoSuchKind)
    }

    /// The strategy of a unified kind (None for other kinds).
    pub fn strategy(self) -> Option<Strategy> {
        let slot = self.live_slot().ok()?;
        let unified = slot.unified.load(Ordering::Acquire);
        // SAFETY: as in unified_alloc.
        (!unified.is_null()).then(|| unsafe { &*unified }.strategy())
    }

    /// Whether the kind is live.
    pub fn is_live(self) -> bool {
        self.live_slot().is_ok()
    }

    /// A human-readable name ("dram", "file:/dev/shm", "numa:0", "unified(…)").
    pub fn name(self) -> String {
        match self.live_slot() {
            Ok(slot) => slot.name(),
            Err(_) => "<destroyed kind>".into(),
        }
    }

    /// The medium of an arena kind (None for unified or destroyed kinds).
    pub fn medium(self) -> Option<KindMedium> {
        let slot = self.live_slot().ok()?;
        let space = slot.lock_space();
        match space.as_ref()?.medium() {
            SpaceMedium::Dram { .. } => Some(KindMedium::Dram),
            SpaceMedium::Numa { node } => Some(KindMedium::Numa(*node)),
            SpaceMedium::File { .. } => Some(KindMedium::File),
        }
    }

    /// What writes to this kind's memory survive (volatile kinds on tmpfs: a process crash
    /// at most — the memory is unreachable after exit anyway unless the file is kept).
    pub fn durability(self) -> Option<terrace_media::Durability> {
        let slot = self.live_slot().ok()?;
        let space = slot.lock_space();
        let durability = space.as_ref()?.regions().next().map(|r| r.durability());
        durability
    }

    #[inline]
    fn alloc_flags(self, size: usize, extra: c_int) -> Result<NonNull<u8>> {
        if size == 0 {
            return Err(KindError::ZeroSize);
        }
        if size > MAX_REQUEST {
            return Err(KindError::TooLarge { size });
        }
        let slot = self.live_slot()?;
        let arena_flags = slot.flags();
        if arena_flags == 0 {
            return self.unified_alloc(slot, size, extra);
        }
        let flags = arena_flags | tcache::flags(self.index, slot, self.generation) | extra;
        // SAFETY: size is non-zero; flags name a live arena of this kind and a cache
        // created for it.
        let ptr = unsafe { je::mallocx(size, flags) };
        NonNull::new(ptr.cast()).ok_or_else(|| KindError::OutOfMemory {
            kind: slot.name(),
            size,
        })
    }

    #[cold]
    fn unified_alloc(self, slot: &'static Slot, size: usize, extra: c_int) -> Result<NonNull<u8>> {
        let unified = slot.unified.load(Ordering::Acquire);
        if unified.is_null() {
            return Err(KindError::NoSuchKind);
        }
        // SAFETY: a live unified slot's pointer stays valid until the kind is destroyed,
        // which must not race with its use (module docs).
        let unified = unsafe { &*unified };
        unified.alloc(
            |member| member.alloc_flags(size, extra),
            size,
            || slot.name(),
        )
    }

    /// Allocates `size` bytes (memkind_malloc).
    #[inline]
    pub fn malloc(self, size: usize) -> Result<NonNull<u8>> {
        self.alloc_flags(size, 0)
    }

    /// Allocates `count * size` zeroed bytes (memkind_calloc).
    pub fn calloc(self, count: usize, size: usize) -> Result<NonNull<u8>> {
        let total = count
            .checked_mul(size)
            .ok_or(KindError::TooLarge { size: usize::MAX })?;
        self.alloc_flags(total, je::MALLOCX_ZERO)
    }

    /// Allocates `size` bytes aligned to `align`, a power of two and a multiple of the
    /// pointer size (memkind_posix_memalign).
    pub fn aligned_alloc(self, align: usize, size: usize) -> Result<NonNull<u8>> {
        if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<usize>()) {
            return Err(KindError::BadAlignment { align });
        }
        if align > 1 << 40 {
            return Err(KindError::TooLarge { size: align });
        }
        self.alloc_flags(size, je::MALLOCX_ALIGN(align))
    }

    /// Resizes `ptr` (None: allocate) to `size` bytes in this kind. Size 0 frees `ptr` and
    /// returns `Ok(None)`. If `ptr` lives in another kind, the object moves here. On error
    /// `ptr` is untouched.
    ///
    /// # Safety
    /// `ptr` must be a live allocation from a kind, not used after a successful call.
    pub unsafe fn realloc(
        self,
        ptr: Option<NonNull<u8>>,
        size: usize,
    ) -> Result<Option<NonNull<u8>>> {
        let Some(ptr) = ptr else {
            return self.malloc(size).map(Some);
        };
        if size == 0 {
            // SAFETY: caller's contract.
            unsafe { free(ptr.as_ptr()) };
            return Ok(None);
        }
        if size > MAX_REQUEST {
            return Err(KindError::TooLarge { size });
        }
        let owner = detect_kind(ptr.as_ptr()).ok_or(KindError::NoSuchKind)?;
        let target = self.live_slot()?;
        let in_place_ok = owner == self
            || (target.flags() == 0 && {
                let unified = target.unified.load(Ordering::Acquire);
                // SAFETY: as in unified_alloc.
                !unified.is_null() && unsafe { &*unified }.members.contains(&owner)
            });
        if in_place_ok {
            // SAFETY: caller's contract.
            if let Ok(moved) = unsafe { owner.realloc_within(ptr, size) } {
                return Ok(Some(moved));
            }
        }
        let fresh = self.malloc(size)?;
        // SAFETY: ptr is live (caller) and owned by a kind; both ranges are valid for the
        // copied length and distinct allocations.
        unsafe {
            let keep = usable_size(ptr.as_ptr()).min(size);
            std::ptr::copy_nonoverlapping(ptr.as_ptr(), fresh.as_ptr(), keep);
            free(ptr.as_ptr());
        }
        Ok(Some(fresh))
    }

    /// # Safety
    /// `ptr` must be a live allocation of this (arena) kind.
    unsafe fn realloc_within(self, ptr: NonNull<u8>, size: usize) -> Result<NonNull<u8>> {
        let slot = self.live_slot()?;
        let flags = slot.flags() | tcache::flags(self.index, slot, self.generation);
        // SAFETY: ptr belongs to this kind's arena (contract); flags name that arena.
        let moved = unsafe { je::rallocx(ptr.as_ptr().cast(), size, flags) };
        NonNull::new(moved.cast()).ok_or_else(|| KindError::OutOfMemory {
            kind: slot.name(),
            size,
        })
    }

    /// Statistics of this kind.
    pub fn stats(self) -> Result<KindStats> {
        let slot = self.live_slot()?;
        if slot.flags() == 0 {
            let unified = slot.unified.load(Ordering::Acquire);
            // SAFETY: as in unified_alloc.
            let members = unsafe { &*unified }.members.clone();
            let mut total = KindStats::default();
            for member in members.into_iter().filter(|m| m.is_live()) {
                let s = member.stats()?;
                total.allocated += s.allocated;
                total.active += s.active;
                total.resident += s.resident;
                total.capacity += s.capacity;
                total.reserved += s.reserved;
            }
            return Ok(total);
        }
        engine::refresh_stats();
        let arena = slot.arena.load(Ordering::Acquire);
        let read = |name: &str| {
            engine::read::<usize>(&format!("stats.arenas.{arena}.{name}")).unwrap_or(0) as u64
        };
        let page = terrace_media::os::page_size() as u64;
        let (capacity, reserved) = {
            let space = slot.lock_space();
            space
                .as_ref()
                .map_or((0, 0), |s| (s.capacity() as u64, s.reserved_bytes()))
        };
        Ok(KindStats {
            allocated: read("small.allocated") + read("large.allocated"),
            active: read("pactive") * page,
            resident: read("resident"),
            capacity,
            reserved,
        })
    }

    /// Destroys the kind and everything allocated from it (memkind_destroy_kind). The
    /// default kind cannot be destroyed. Members of a unified kind are not destroyed with it.
    pub fn destroy(self) -> Result<()> {
        if self == Kind::DEFAULT {
            return Err(KindError::Unsupported {
                kind: "dram".into(),
                why: "the default kind is static",
            });
        }
        let slot = self.live_slot()?;
        let what = slot.what();
        let mut result = Ok(());
        let destroyed = slots::destroy_with(self.index, self.generation, |slot| match what {
            SlotKind::Arena => {
                tcache::destroy_all(slot);
                result = engine::destroy_arena(slot.arena.load(Ordering::Acquire));
                slot.arena_flags.store(0, Ordering::Release);
                let space: Option<Space> = slot.lock_space().take();
                drop(space);
            }
            SlotKind::Unified => {
                let unified = slot.unified.swap(std::ptr::null_mut(), Ordering::AcqRel);
                if !unified.is_null() {
                    // SAFETY: created by Box::into_raw in create_unified; no longer
                    // reachable from the slot.
                    drop(unsafe { Box::from_raw(unified) });
                }
            }
            SlotKind::Empty => {}
        });
        if !destroyed {
            return Err(KindError::NoSuchKind);
        }
        result
    }
}

fn create_arena_kind(
    name: String,
    medium: SpaceMedium,
    capacity: usize,
    fixed: Option<u32>,
) -> Result<Kind> {
    let freed = match &medium {
        SpaceMedium::File { options, .. } if !options.hole_punching => FreedMemory::Kept,
        _ => FreedMemory::Purged,
    };
    let (index, generation) = slots::create_with(
        fixed,
        |index, slot| {
            let space = Space::new(medium, capacity, slots::tag_of(index))?;
            *slot.lock_space() = Some(space);
            match engine::create_arena(slot, freed) {
                Ok(arena) => {
                    slot.arena.store(arena, Ordering::Release);
                    slot.arena_flags
                        .store(je::MALLOCX_ARENA(arena as usize), Ordering::Release);
                    slot.what.store(SlotKind::Arena as u8, Ordering::Release);
                    *slot.name.lock().unwrap_or_else(|p| p.into_inner()) = name;
                    Ok(())
                }
                Err(e) => {
                    slot.lock_space().take();
                    Err(e)
                }
            }
        },
        || KindError::TooManyKinds {
            why: "kind table is full",
        },
    )?;
    Ok(Kind { index, generation })
}

#[cold]
fn init_default() -> Result<()> {
    create_arena_kind(
        "dram".into(),
        SpaceMedium::Dram {
            pages: PageSize::Base,
        },
        DRAM_CAPACITY,
        Some(0),
    )
    .map(|_| ())
}

/// The kind owning `ptr` (memkind_detect_kind), or None if no live kind owns it.
pub fn detect_kind(ptr: *const u8) -> Option<Kind> {
    let tag = registry::lookup(ptr as usize)?;
    let index = slots::index_of(tag);
    let generation = slots::slot(index)?.generation.load(Ordering::Acquire);
    (generation % 2 == 1).then_some(Kind { index, generation })
}

/// Frees `ptr` into whichever kind owns it (memkind_free with or without a kind). Returns
/// false, doing nothing, when no kind owns `ptr` (null, foreign or from a destroyed kind).
///
/// # Safety
/// If a kind owns `ptr`, it must be a live allocation not used afterwards.
#[inline]
pub unsafe fn free(ptr: *mut u8) -> bool {
    let Some(tag) = registry::lookup(ptr as usize) else {
        return false;
    };
    let index = slots::index_of(tag);
    let Some(slot) = slots::slot(index) else {
        return false;
    };
    let generation = slot.generation.load(Ordering::Acquire);
    if generation % 2 == 0 {
        // The owner was destroyed; its regions may still be registered for an instant
        // while a background reservation lets go of them.
        return false;
    }
    let flags = tcache::flags(index, slot, generation);
    // SAFETY: the registry says a live kind's arena owns ptr, and the caller guarantees it
    // is a live allocation; the cache belongs to that kind.
    unsafe { je::dallocx(ptr.cast(), flags) };
    true
}

/// Usable size of an allocation (memkind_malloc_usable_size); 0 when no kind owns `ptr`.
///
/// # Safety
/// If a kind owns `ptr`, it must be a live allocation.
pub unsafe fn usable_size(ptr: *const u8) -> usize {
    if detect_kind(ptr).is_none() {
        return 0;
    }
    // SAFETY: owned by a kind's arena and live (contract).
    unsafe { je::sallocx(ptr.cast(), 0) }
}

#[cfg(test)]
mod tests {
    use super::parse_node_list;

    #[test]
    fn node_lists_parse_strictly() {
        assert_eq!(parse_node_list("1"), Some(vec![1]));
        assert_eq!(parse_node_list("3,0-1, 1"), Some(vec![0, 1, 3]));
        for bad in ["", "1,", "x", "2-1", "-1", "0-5000", "1 2"] {
            assert_eq!(parse_node_list(bad), None, "{bad:?}");
        }
    }
}

//! terrace-kinds: volatile heterogeneous heaps — the maintained successor of memkind.
//!
//! A program allocates from a *kind*: a heap on one medium (DRAM, a file on a
//! DAX/tmpfs/disk file system, a NUMA node) or a *unified* heap over several kinds that
//! overflows from one to the next before reporting out of memory. Every kind offers
//! malloc, calloc, realloc, aligned allocation, free and usable size; free, realloc and
//! kind detection also work without naming the kind, through the media layer's address
//! registry. Nothing here survives the process: persistent objects are `terrace-pool`'s.
//!
//! ```text
//!   Kind (handle) ──► slot ──► jemalloc arena ──extent hooks──► Space ──► Region(s) (terrace-media)
//!                       └────► unified member list (no arena of its own)
//! ```
//!
//! Differences from memkind worth knowing:
//! - no limit of a few dozen file kinds: up to 4,095 kinds of any mix at once;
//! - a full file system is an allocation failure (NULL/`OutOfMemory`), never `SIGBUS`:
//!   file blocks are reserved with `fallocate` as the heap grows, in large chunks;
//! - freed file memory is kept and reused, not punched out, unless asked
//!   (`FileKindOptions::hole_punching`); file systems without hole punching just work;
//! - freeing a pointer no kind owns is a no-op that reports `false`.
//!
//! # Glossary
//! - **kind** ([`Kind`]): a handle `(slot, generation)` to one heap; a destroyed kind's
//!   stale handles are refused (`NoSuchKind`). Its medium is a [`KindMedium`].
//! - **file kind**: a kind in a file ([`FileKindOptions`]), unlinked or kept; its bytes
//!   are volatile in meaning even where the file system is persistent.
//! - **unified kind**: a kind over member kinds, with a [`Strategy`] choosing the member
//!   that serves an allocation; it has no arena of its own.
//! - **selection** ([`Selection`]): one of memkind's static NUMA kinds (lowest latency,
//!   highest capacity, CPU-less memory, regular), created on first use.
//! - **slot**: a kind's entry in the static kind table (at most [`MAX_KINDS`]); its
//!   index + 1 is the registry tag of the kind's regions.
//! - **arena**: the jemalloc arena of a non-unified kind; jemalloc asks the kind's space
//!   for memory through *extent hooks*.
//! - **space**: the address ranges one kind's arena draws from, grown region by region
//!   (DRAM, NUMA) or within one file region.
//! - **thread cache** (tcache): an explicit jemalloc cache per (thread, kind), so an
//!   object never leaves its kind's medium.
//! - **reservation**: file blocks allocated (`fallocate`) ahead of use, in *chunks*, up to
//!   a *headroom* beyond the highest offset asked for, by a background thread.
//! - **hole punching**: giving a file kind's freed memory back to the file system (off by
//!   default).
//!
//! # Modules
//! - [`kind`]: the API — create (DRAM, file, NUMA, unified, selections), malloc and
//!   friends, detection, stats, destroy.
//! - [`unified`]: unified kinds and their strategies.
//! - `allocation`: [`Allocation`], an owned block freed on drop.
//! - `slots`: the kind table (one slot per live kind, generations).
//! - `engine`: the jemalloc binding — arenas, extent hooks, start-up options, and why
//!   jemalloc.
//! - `tcache`: the per-thread table of explicit caches.
//! - `space`: a kind's address space and how it grows.
//! - `reserve`: file-block reservation ahead of use, on a background thread.
//! - [`error`]: the typed errors ([`KindError`]).

mod allocation;
mod engine;
pub mod error;
pub mod kind;
mod reserve;
mod slots;
mod space;
mod tcache;
pub mod unified;

pub use allocation::Allocation;
pub use error::{KindError, Result};
pub use kind::{
    detect_kind, free, selection_of, usable_size, FileKindOptions, Kind, KindMedium, KindStats,
    Selection, DAX_KMEM_NODES_ENV, MIN_FILE_KIND_SIZE,
};
pub use slots::MAX_KINDS;
pub use terrace_media::{FileLocation, PageSize};
pub use unified::Strategy;

/// Returns every object the calling thread holds in its per-kind caches to its kind.
/// Threads flush automatically when they exit; call this before reading exact statistics
/// or before a thread goes idle for long.
pub fn flush_thread_caches() {
    tcache::flush_thread();
}

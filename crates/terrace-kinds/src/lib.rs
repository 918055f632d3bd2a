//! terrace-kinds: volatile heterogeneous heaps — the maintained successor of memkind.
//!
//! A **kind** is a heap on one medium (DRAM, a file on a DAX/tmpfs/disk file system, a
//! NUMA node) or a **unified** heap over several kinds that overflows from one to the next
//! before reporting out of memory. Every kind offers malloc, calloc, realloc,
//! aligned allocation, free and usable size; free, realloc and kind detection also work
//! without naming the kind, through the media layer's address registry.
//!
//! ```text
//!   Kind (handle) ──► slot ──► jemalloc arena ──extent hooks──► Space ──► Region(s) (terrace-media)
//!                       └────► unified member list (no arena of its own)
//! ```
//!
//! Modules: [`kind`] (the API), [`unified`] (strategies), `slots` (the kind table),
//! `engine` (jemalloc binding and hooks — read it for why jemalloc), `tcache` (per-thread
//! caches), `space` (address space of a kind), `reserve` (file-block reservation ahead of
//! use, on a background thread).
//!
//! Differences from memkind worth knowing:
//! - no limit of a few dozen file kinds: up to 4,095 kinds of any mix at once;
//! - a full file system is an allocation failure (NULL/`OutOfMemory`), never `SIGBUS`:
//!   file blocks are reserved with `fallocate` as the heap grows, in large chunks;
//! - freed file memory is kept and reused, not punched out, unless asked
//!   (`FileKindOptions::hole_punching`); file systems without hole punching just work;
//! - freeing a pointer no kind owns is a no-op that reports `false`.

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
    Selection, MIN_FILE_KIND_SIZE,
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

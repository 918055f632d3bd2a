//! terrace-media: where bytes live.
//!
//! The lowest layer of Terrace. Everything above it (kinds, pool, cache) asks this crate
//! for address ranges and for ways to make bytes durable; nothing here knows about
//! allocation, objects or items. All operating-system calls live in [`os`]; the other
//! modules speak in terms of it.
//!
//! # Glossary
//! - **medium** ([`MediumKind`]): a kind of memory with a known speed and durability:
//!   DRAM, a file mapping (DAX persistent memory, tmpfs, page cache), a NUMA node, or
//!   flash (block I/O).
//! - **region** ([`Region`]): one mapped, contiguous address range on a medium. Regions are
//!   aligned to [`registry::GRANULE`] so the registry can own them whole.
//! - **granule** ([`registry::GRANULE`], 2 MiB): the unit of region sizes and alignment,
//!   and of the registry's map.
//! - **reservation**: making sure a file region's backing store holds blocks for a range
//!   (`fallocate`, [`Region::reserve`]), so that first touch cannot turn a full file
//!   system into `SIGBUS`.
//! - **persist**: making stores to a region durable ([`Region::persist`]): cache-line
//!   flushes and a fence on DAX, `msync` on a disk-backed file, nothing further on tmpfs.
//! - **durability** ([`Durability`]): what a write survives once persisted: nothing (DRAM),
//!   a process crash (tmpfs, page cache before `msync`), or a power loss (DAX with
//!   cache-line flushes, or a file after `msync`).
//! - **DAX**: a file system mapping persistent memory directly; detected by trying
//!   `MAP_SYNC`, never from the path.
//! - **registry** ([`registry`]): process-wide map from any address to the tag of the region
//!   owning it, in O(1) however many regions exist.
//! - **flash** ([`flash::FlashFile`]): a file used through `pread`/`pwrite` (O_DIRECT where
//!   the file system supports it), never mapped.
//!
//! # Modules
//! - [`region`]: [`Region`] — mapping DRAM, NUMA and file regions; reserve, persist, sync.
//! - [`registry`]: address → region tag, lock-free lookups.
//! - [`persist`]: cache-line flush instructions (chosen from CPUID) and the fence.
//! - [`numa`]: the NUMA topology from sysfs (nodes, distances, HMAT attributes).
//! - [`flash`]: [`flash::FlashFile`], block I/O on a file, and aligned buffers for it.
//! - [`os`]: every system call (`mmap`, `fallocate`, `madvise`, `mbind`, `statfs`, clocks,
//!   resource usage).
//! - [`ffi`]: the panic boundary of every function C calls.
//! - [`error`]: the typed errors ([`MediaError`]).

pub mod error;
pub mod ffi;
pub mod flash;
pub mod numa;
pub mod os;
pub mod persist;
pub mod persist_hook;
pub mod region;
pub mod registry;

pub use error::MediaError;
pub use region::{Durability, FileLocation, FileOptions, MediumKind, PageSize, Region};

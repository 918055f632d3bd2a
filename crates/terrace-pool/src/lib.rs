//! terrace-pool: a persistent, crash-consistent, transactional object heap in a file — the
//! successor to PMDK's libpmemobj and Intel's LLPL, built on `terrace-media`.
//!
//! A pool is a file mapped shared. Objects inside it are named by their offset from the
//! start of the pool ([`Oid`]), so the pool can be mapped anywhere next time. Allocation
//! is crash-atomic and *publishes* the new handle into a location inside the pool in the
//! same atomic step ([`HandleAt`]); transactions snapshot what they overwrite (undo log)
//! and allocate and free at commit (redo log). Opening a pool recovers from any crash.
//!
//! The byte layout, the commit protocol of every operation, the argument that every
//! crash point recovers, and recovery itself are in `docs/pool-format.md`, also rendered
//! as the docs of module [`format`](mod@format). The lock order is in `docs/concurrency.md`.
//!
//! ```
//! use terrace_pool::{HandleAt, Pool, RecordingBackend};
//! # fn main() -> terrace_pool::Result<()> {
//! // Pool::create(path, size, layout) on a real file; a simulated medium here.
//! let pool = Pool::create_on(RecordingBackend::new(4 << 20), "example", 2)?;
//! let root = pool.root(64)?;
//! // Allocate 100 bytes of type 1 and publish the handle in the root's first word.
//! let obj = pool.alloc_with(100, 1, HandleAt::Word(root.offset()), |w| w.write(0, b"hi"))?;
//! pool.tx(|tx| {
//!     tx.write(obj, 2, b" there")?; // snapshotted, then written
//!     tx.write_u64(root, 8, 1)
//! })?;
//! assert_eq!(pool.objects(Some(1))?.len(), 1);
//! pool.check()?;
//! # Ok(()) }
//! ```
//!
//! # Glossary
//! - **pool**: one file holding a header, a state block, lanes, page descriptors and the
//!   heap; addressed by offsets. [`Pool`].
//! - **heap**: the pool's pages that hold objects (4 KiB each), and the allocator over
//!   them. Terrace has a single *zone* (libpmemobj's word): the whole heap, described by
//!   one array of page descriptors.
//! - **page**: the unit of heap space, 4 KiB ([`format::PAGE`]); runs and extents are
//!   whole pages (libpmemobj's unit is a 256 KiB *chunk*, which makes its large objects
//!   waste up to 25%). Nothing limits a pool's size but the 2^32-page index.
//! - **span**: consecutive pages that are one run or one extent; its first page is the
//!   *head* and carries the descriptor.
//! - **run**: a span holding slots of one size (its *unit*) and one type number; its
//!   allocation bitmap (one bit per slot) lives in the run's page descriptors, so objects
//!   carry no header.
//! - **extent**: a span holding one large object (above 128 KiB), sized in whole pages.
//! - **size class**: the unit serving a request size ([`class`]): multiples of 16 B from
//!   64 B to 1 KiB, then 32 steps per power of two up to 128 KiB (< 3.1% rounding).
//!   Built in: nothing about them is stored in the pool.
//! - **custom class** ([`ClassId`], [`ClassDesc`]; libpmemobj's allocation class): a unit
//!   and run length a program registers ([`Pool::register_class`]) and names when it
//!   allocates ([`Pool::alloc_in`]); recorded in the pool's *class table*, so it
//!   survives close and reopen (libpmemobj keeps its classes in memory only). Runs
//!   carved for it record its id.
//! - **owned run**: a run a thread allocates from without locks (volatile). A full run
//!   goes back to its class, where runs with free slots are *listed* for any thread.
//! - **lane**: a per-operation log area (redo + undo). A commit of more than one word
//!   takes any free lane; a transaction ([`Tx`]) holds one from begin to end.
//! - **redo log**: a lane's list of word updates (`set`, `or`, `and-not`) that become
//!   durable together.
//! - **single-word commit**: an operation that changes exactly one word (an allocation
//!   or free whose handle the caller keeps, a run's release, a class registration) makes
//!   that aligned 8-byte update and persists it; the persist is its commit point, no log.
//! - **undo log**: a lane's snapshots taken by a transaction before it first writes a
//!   range; rolled back on abort and at open after a crash.
//! - **persist point**: one call to [`Backend::persist`]; after it returns, what it
//!   covered survives a crash (to the medium's [`Durability`]). The crash tests take the
//!   durable image at every persist point.
//! - **publish**: storing an object's handle at a [`HandleAt`] inside the pool,
//!   atomically with allocating (or, for a free, clearing) it.
//! - **poisoned**: the state of a pool after a persistence step failed midway; it
//!   refuses further work until reopened.
//!
//! # Modules
//! - [`pool`]: [`Pool`] — create, open (validation, recovery), check, the root object,
//!   allocation, free and realloc with publish, custom class registration.
//! - [`tx`]: [`Tx`] — undo-logged writes, allocations and frees that take effect at commit.
//! - [`class`]: built-in size classes and run sizes; custom class descriptions.
//! - [`format`](mod@format): the on-media layout (constants, header, descriptors, geometry) and its
//!   description, `docs/pool-format.md`.
//! - `heap`: the volatile allocator over the page descriptors, and the descriptor scan.
//! - `log`: the redo and undo logs of a lane: encoding, commit, replay, rollback.
//! - [`backend`]: [`Backend`], the persistence seam, and [`RegionBackend`], a file region.
//! - `mem`: bounds-checked access to mapped memory by offset (the `unsafe` accesses).
//! - [`recording`]: [`RecordingBackend`], a simulated medium for crash tests.
//! - [`error`]: the typed errors ([`PoolError`]).

pub mod backend;
pub mod class;
pub mod error;
pub mod format;
mod heap;
mod log;
mod mem;
pub mod pool;
pub mod recording;
pub mod tx;

pub use backend::{Backend, RegionBackend};
pub use class::{AllocClass, ClassDesc, ClassId, HeaderType, RunSize};
pub use error::{PoolError, Result};
pub use heap::HeapStats;
pub use pool::{CheckReport, HandleAt, Object, ObjectWriter, Oid, Pool, ROOT_TYPE};
pub use recording::{PersistEvent, Recording, RecordingBackend};
pub use terrace_media::Durability;
pub use tx::{Contents, Tx};

//! terrace-pool: a persistent, crash-consistent, transactional object heap in a file — the
//! successor to PMDK's libpmemobj and Intel's LLPL, built on `terrace-media`.
//!
//! A pool is a file mapped shared. Objects inside it are named by their offset from the
//! start of the pool ([`Oid`]), so the pool can be mapped anywhere next time. Allocation
//! is crash-atomic and *publishes* the new handle into a location inside the pool in the
//! same atomic step ([`HandleAt`]); transactions snapshot what they overwrite (undo log) and
//! allocate and free at commit (redo log). Opening a pool recovers from any crash.
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
//! - **heap**: the pool's pages that hold objects (4 KiB each), and the allocator over them.
//! - **zone** (libpmemobj's word): Terrace has a single zone — the whole heap, described by
//!   one array of page descriptors. Nothing limits a pool's size but the 2^32-page index.
//! - **chunk**: in Terrace the unit of heap space is the 4 KiB *page*; a run or an extent is
//!   a span of whole pages. (libpmemobj's 256 KiB chunks are what make its large objects
//!   waste up to 25%.)
//! - **span**: consecutive pages that are one run or one extent; its first page is the
//!   *head* and carries the descriptor.
//! - **run**: a span holding slots of one size (its *unit*) and one type number; an
//!   allocation bitmap (one bit per slot) lives in the run's page descriptors, so objects
//!   carry no header.
//! - **extent**: a span holding one large object (above 128 KiB), sized in whole pages.
//! - **size class**: the unit serving a request size ([`class`]): multiples of 16 B from
//!   64 B to 1 KiB, then 32 steps per power of two up to 128 KiB (< 3.1% rounding).
//!   Built in: nothing about them is stored in the pool.
//! - **custom class** (libpmemobj's allocation class from `heap.alloc_class.*.desc`): a
//!   unit and run length a program registers under an id 1..=254 ([`Pool::register_class`])
//!   and names when it allocates ([`Pool::alloc_in`]). Recorded in the pool's *class
//!   table*, so it survives close and reopen (libpmemobj keeps its classes in memory
//!   only); runs carved for it record its id.
//! - **owned run**: a run a thread allocates from without locks (volatile; module
//!   `heap`). Per (size class, type) a thread owns one run; a full run goes back to its
//!   class, where runs with free slots are *listed* for any thread to take; a thread that
//!   finds neither a listed run nor free pages takes a slot from any run of its class
//!   (owned by another thread or not) before an allocation fails.
//! - **lane**: a per-operation log area (redo + undo). An allocation or free whose commit
//!   updates more than one word takes any free lane for it; a transaction holds one lane
//!   from begin to end.
//! - **redo log**: a lane's list of word updates (`set`, `or`, `and-not`) that become
//!   durable together: the atomic step of every allocation, free and commit that changes
//!   more than one word.
//! - **single-word commit**: an operation that changes exactly one word (an allocation or
//!   free whose handle the caller keeps, a run's release) makes that aligned 8-byte update
//!   and persists it: the update is its own commit point, no log is written.
//! - **undo log**: a lane's list of snapshots taken by a transaction before it first
//!   writes a range; rolled back on abort and at open after a crash.
//! - **persist point**: one call to [`Backend::persist`]; after it returns, what it
//!   covered survives a crash (to the medium's [`Durability`]). Crash tests take the
//!   durable image at every persist point.
//! - **publish**: storing an object's handle in a destination inside the pool, atomically
//!   with allocating (or, for free, clearing) it.
//!
//! # On-media format (version 2)
//!
//! Version 2 added the class table (in the state block) and the class byte of run
//! descriptors. Version 1 pools (written by older builds) open and work: both are zero
//! in them. Registering a custom class in a version 1 pool is refused (`FormatTooOld`):
//! its header would still let an older build open it and misread the class bytes.
//! Versions above 2 are refused at open (`UnsupportedVersion`).
//!
//! All integers are little-endian. All references are byte offsets from the start of the
//! pool file, never pointers. `P` is the page size, 4096.
//!
//! | offset | size | what |
//! |---|---|---|
//! | 0 | 4096 | header page: the 256-byte header, then zeros |
//! | 4096 | 4096 | state block (root object), then zeros |
//! | 8192 | `lanes * 65536` | lanes |
//! | `meta_off` | `pages * 32`, rounded up to `P` | page descriptors |
//! | `heap_off` | `pages * P` | heap pages |
//! | … | < `P + 32` per page | unused tail |
//!
//! The pool size is a multiple of 2 MiB (the media layer's mapping granule), at least
//! 2 MiB. `lanes` is chosen at create (one per 32 MiB, 2 to 64). `pages` is the largest
//! `n` with `round_up(n * 32, P) + n * P <= size - meta_off`. The geometry is a pure
//! function of (size, lanes) ([`format::Geometry::compute`]) and `open` recomputes and
//! compares it.
//!
//! ## Header (offset 0, 256 bytes; written once at create, never changed)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `"TRCPOOL\0"` |
//! | 8 | 4 | format version (2; 1 is read too) |
//! | 12 | 4 | header length covered by the layout (256) |
//! | 16 | 16 | pool uuid (random); bytes 16..24 are `pool_uuid_lo` of a `PMEMoid` |
//! | 32 | 8 | pool size in bytes (must equal the file length) |
//! | 40 | 64 | layout name, UTF-8, NUL-padded (at most 63 bytes) |
//! | 104 | 4 | page size (4096) |
//! | 108 | 4 | lane count |
//! | 112 | 8 | lane size (65536) |
//! | 120 | 8 | `lanes_off` (8192) |
//! | 128 | 8 | `meta_off` |
//! | 136 | 8 | `heap_off` |
//! | 144 | 8 | page count |
//! | 152 | 8 | creation time, ns since the Unix epoch |
//! | 160 | 92 | reserved, zero |
//! | 252 | 4 | CRC-32 (IEEE, `crc32fast`) of bytes 0..252 |
//!
//! `open` checks, in order: the file exists and is a regular file; it is at least 256
//! bytes and starts with the magic (else `NotAPool`: foreign, empty, or creation never
//! finished); version and header length (`UnsupportedVersion`); checksum (`BadChecksum`);
//! layout name (`LayoutMismatch`); size against the file length (`SizeMismatch`:
//! truncated or extended); geometry fields against the recomputed geometry (`Corrupt`).
//! The file is mapped only after all of that passes, so a foreign file is never touched.
//!
//! ## State block (offset 4096)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 4096 | 8 | root object offset (0: none yet) |
//! | 4104 | 8 | root object size as requested (0 iff no root) |
//! | 4112 | 2032 | reserved, zero |
//! | 6144 | 2048 | class table: 256 words, word `i` for custom class `i` |
//!
//! The root words change only through a redo log, together with the root's allocation.
//!
//! ## Class table (offset 6144, 256 × 8 bytes)
//!
//! Word `i` (at `6144 + 8 i`) is 0 (class `i` not registered) or the entry of custom
//! class `i`. Words 0 and 255 are always 0 (id 0 means "no class"; ids are 1..=254). An
//! entry is one word:
//!
//! | bits | field |
//! |---|---|
//! | 0..24 | unit in bytes: a multiple of 8, 16..=131072 |
//! | 24..40 | pages of every run of the class, 1..=4096, holding at least one unit |
//! | 40..42 | header type as registered (libpmemobj's 0 legacy, 1 compact, 2 none); objects have no header whatever it says |
//! | 42..46 | alignment: 0 none, else `log2(alignment) + 1` (a power of two up to 4096 dividing the unit) |
//! | 46..48 | reserved, zero |
//! | 48..64 | check: low 16 bits of CRC-32 over `i` (1 byte) and bytes 0..6 of the word |
//!
//! An entry is written once, by a single-word commit, and never changed or removed (a
//! class is never unregistered: its runs depend on it). `open` and [`Pool::check`]
//! validate every word: a non-zero word that fails its check, has reserved bits, sits
//! at 0 or 255, describes an impossible class, or appears in a version 1 pool is
//! `Corrupt`, naming the entry and its offset.
//!
//! ## Lanes (lane `i` at `8192 + i * 65536`)
//!
//! A lane is 8 KiB of redo area followed by 56 KiB of undo area.
//!
//! Redo area (lane + 0):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | header: 0 = empty, else `count` (bits 0..32) and `crc` (bits 32..64) |
//! | 8 | 56 | zero (the header has its cache line to itself) |
//! | 64 | `16 * count` | entries, at most 508 |
//!
//! `crc` is CRC-32 over `count` (4 bytes LE) followed by the `16 * count` entry bytes. An
//! entry is `word_offset | op` (8 bytes; the offset is 8-aligned so its low 3 bits hold
//! `op`: 0 set, 1 or, 2 and-not) and `value` (8 bytes). Applying an entry: set stores
//! `value`; or stores `word | value`; and-not stores `word & !value`. Every entry is
//! idempotent. A redo entry may only target offsets at or after the state block.
//!
//! Undo area (lane + 8192):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | state: `gen << 1 \| active` |
//! | 8 | 56 | zero |
//! | 64 | … | entries, back to back |
//!
//! An undo entry is `offset` (8), `len` (4, > 0), `crc` (4) = CRC-32 of `gen` (8 bytes
//! LE), `offset`, `len` and the data, then `len` bytes of data, padded with zeros to a
//! multiple of 16. `gen` is the transaction generation of the lane, incremented by every
//! transaction that snapshots anything. The valid entries of an active state are those
//! from offset 64 up to the first whose `len` is 0, does not fit, or whose `crc` does not
//! verify *for the current `gen`* (so entries left from older transactions are never
//! taken for current ones). Snapshots must lie in the heap.
//!
//! ## Page descriptors (32 bytes per heap page, at `meta_off + 32 * page`)
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | kind: 0 free, 1 run, 2 extent (head pages only; 0 on every other page) |
//! | 1 | 3 | reserved, zero |
//! | 4 | 4 | span length in pages (heads only) |
//! | 8 | 4 | run unit in bytes (run heads only; see below) |
//! | 12 | 1 | custom class id of the run, 0 for a built-in size class (run heads only) |
//! | 13 | 3 | reserved, zero on run heads |
//! | 16 | 8 | type number of every object in the span (heads only) |
//! | 24 | 8 | allocation bitmap word: on page `h + j` of the run headed at `h`, bit `b` is slot `64 j + b` |
//!
//! Bytes 0..8 are one word (`kind | pages << 32`), written atomically; bytes 8..16 are
//! one word too (`unit | class << 32`). A run of a built-in size class (class 0) has a
//! unit that is a multiple of 16, at least 64. A run of custom class `c` has exactly the
//! unit and page count of entry `c` of the class table, which must be registered. A run
//! of `p` pages and unit `u` has `min(floor(p * 4096 / u), 64 p)` slots (the bitmap has
//! 64 bits per page; only custom units below 64 B reach that bound); slot `k` is at
//! `heap_off + 4096 h + k u`. An extent's object starts at its first page and is
//! `p * 4096` bytes. The type of the root object is `u64::MAX`.
//!
//! Descriptor invariants (verified by `open` and [`Pool::check`]): scanning from page 0 and
//! skipping each head's span visits exactly the heads and the free pages; every non-head
//! page has word 0 equal to 0; free pages and extent pages have bitmap words of 0; bits
//! beyond a run's slot count are 0; a run's unit and class agree with the class table as
//! above. A run with no bit set is allowed (it serves allocations of its class). Only word
//! 0 and the bitmap word of a free page are read: its unit and type words may hold those of
//! a span that was never completed or was released. Volatile structures are rebuilt from
//! these descriptors alone.
//!
//! # Commit protocol
//!
//! **Redo commit** (the primitive, module `log`): (1) write the entries, then the header, and
//! persist header and entries together — *this persist is the commit point*; (2) apply the
//! entries and persist every line they touched; (3) store 0 in the header and persist it.
//! The lane is not reused before (3) completes.
//!
//! **Single-word commit** (`log::apply_one`): when an operation's entries come down to one
//! word update (after merging), that update is made (`set` as a store, `or` / `and-not` as
//! an atomic read-modify-write) and persisted; the persist is the commit point. No lane is
//! taken and no log written.
//!
//! **Registering a custom class** (`register_class`, serialised by a pool lock): validate
//! the description, pick the id (the lowest free one, or the one asked for if free), then
//! a single-word commit of its class table entry: store the word, persist it — the commit
//! point. Only after that persist returns does the class enter the volatile heap, so no
//! allocation can name it, and no run of it can be carved, before it is durable.
//!
//! **Carving a run** (volatile heap, before any slot of the run is handed out): take free
//! pages; store the head descriptor's unit-and-class and type words and persist them;
//! then store word 0 (kind run, page count) and persist it. The run now exists durably,
//! empty. A custom class's run has the class's recorded length (built-in classes fall
//! back to a shorter run when the preferred one does not fit).
//!
//! **Allocation with publish** (`alloc`, `zalloc`, `alloc_with`): reserve a slot (in a run
//! that is durably described) or an extent's pages in the volatile heap — for an extent,
//! store its head descriptor's unit word (0) and type word and persist them; write the
//! initial contents (constructor, zeroing) into the reserved object and persist them;
//! then one commit with: `or` of the slot's bit (for an extent, word 0 := kind extent,
//! page count), and the publish words (`HandleAt::Word`: the offset; `HandleAt::Oid`:
//! `pool_uuid_lo`, then the offset). With `HandleAt::None` that is one word: a single-word
//! commit.
//!
//! **Free** (`free`): mark the slot pending-free in the volatile heap; one commit with
//! `and-not` of its bit (or extent word 0 := 0) and the cleared destination (with
//! `HandleAt::None`, a single-word commit). The volatile heap makes the space reusable only
//! after the commit completes.
//!
//! **Releasing a run**: when a completed free (or a cancelled reservation) leaves a run
//! that no thread owns (or that the cancelling thread owned and gives back) with no slot
//! reserved, allocated or being freed, the run is taken
//! out of the volatile heap's lists (so no allocation can pick it), then word 0 := 0 is a
//! single-word commit, then its pages return to the free spans. Empty runs given back
//! by exiting threads are released the same way when the free pages run out.
//!
//! **Realloc and root growth**: reserve the new block, copy (and zero the rest), persist
//! it, then one redo commit holding the new allocation, the free of the old block and the
//! publish (or the root words).
//!
//! **Transactions** ([`Tx`]): the first snapshot sets the lane's undo state to
//! `(gen + 1) << 1 | 1` and persists it; every snapshot appends an entry and persists it
//! before the caller may write the range; allocations are volatile reservations (the
//! medium's metadata is not touched, but for a run carved for them, durably empty, or an
//! extent's unit and type words) and frees are pending tickets. Commit:
//! persist every snapshotted range and every new object, then one redo commit with the
//! new objects' bits (and extents' words 0), the frees' bits, and the undo state :=
//! `gen << 1` (inactive) — a single-word commit when that state word is all. Abort:
//! restore the snapshots newest first, persist them, set the state inactive and persist;
//! drop reservations and tickets. Nested transactions are flattened (a failure at any
//! depth aborts the whole). Dropping an active `Tx` — an early return, or a panic
//! unwinding — aborts it.
//!
//! **Recovery at open**: for every lane, first replay its redo log if the header's `crc`
//! verifies, then clear the header; then, if its undo state is active, roll back (restore
//! the valid entries newest first, persist, set inactive). Then load and validate the
//! class table, validate the descriptors against it, and rebuild the volatile heap (its
//! custom classes first: they are known before any allocation).
//!
//! **Create**: zero and persist the state block, lanes and descriptors; then write and
//! persist the header. The magic becomes durable last.
//!
//! # Why every crash point recovers
//!
//! Assumptions about the medium: an aligned 8-byte store is never torn; a store survives
//! once a persist covering it has returned; before that, any subset of the cache lines
//! written so far may have reached the medium, in any order. (The crash suite builds
//! exactly these images: the durable image at every persist point, and variants with a
//! random subset of the dirty lines applied.)
//!
//! - *Redo commit, crash before the header and entries are durable*: recovery computes the
//!   crc over what it finds; a header that is 0, or whose entries are not all the new
//!   ones, fails the check (up to the CRC-32 collision probability) and is discarded.
//!   Nothing was applied yet (application starts after the persist returns), so the words
//!   are all old: the operation did not happen. Stale entries of an older log cannot pass
//!   a check computed over the new count and the new entries unless they equal them.
//! - *Crash after the commit point, during application or before the header is cleared*:
//!   the log verifies; recovery re-applies every entry. Because entries are idempotent
//!   (set, or, and-not), applying some of them twice gives the same words: the operation
//!   happened completely.
//! - *Crash after the header is cleared*: everything was applied and persisted before.
//! - *Single-word commit*: an aligned 8-byte update is never torn, so the medium holds
//!   the old word (the operation did not happen) or the new one (it did), whichever
//!   lines were written back; once its persist returns, the new one.
//! - *Registering a class*: the entry is one aligned word, so the medium holds 0 (the
//!   class is absent: nothing refers to it yet, see below) or the whole entry (the class
//!   is registered as described); once its persist returns, the entry. A torn entry
//!   cannot exist; a damaged one fails its check and is reported, never half-used.
//! - *Carving a run*: until word 0 is durable the head descriptor still says "free page"
//!   (the scan reads neither unit nor type of a free page, and the run's bitmap words are
//!   0 like every free page's), so a crash leaves free pages. Unit, class and type are
//!   durable before word 0 is stored, so once word 0 is durable the run is complete: an
//!   empty run of the right class and type, which the format allows. A run of custom
//!   class `c` is only carved after class `c` entered the volatile heap, which is after
//!   its entry's persist returned; so no durable run ever names a class whose entry is
//!   not durable (and entries are never removed).
//! - *Allocation*: the object's contents are persisted before the commit, so a published
//!   object always has its initial contents. Before the commit point, the bit is clear
//!   (extent: word 0 says free) and the destination old: the reservation was volatile and
//!   disappears. A slot is only reserved in a run carved durably before, so a bit is never
//!   durable in a run whose descriptor is not; an extent's unit and type words are
//!   durable before its word 0 is set by the commit.
//! - *Free*: the space returns to the volatile heap only after the commit completed, so no
//!   new allocation can be durably placed in a slot whose free could still be undone.
//! - *Release*: a run is released only when no thread owns it and every volatile bit of
//!   it is clear; a volatile bit is clear only after the free of its slot is durable
//!   (and a reservation never set a durable bit), so all its durable bits are clear. Taken
//!   out of the lists first, no allocation can set a bit in it meanwhile. Word 0 := 0 is
//!   a single-word commit: before, the run is empty (allowed); after, its pages are free
//!   pages with clear bitmaps. The pages are reused only after that persist returned.
//! - *Transaction before the commit point*: the undo state is active (it was made durable
//!   before the first snapshot), and every range written has a durable snapshot (each
//!   snapshot is persisted before its range is written). Recovery restores them; a torn
//!   last snapshot was never followed by a write to its range, so stopping at the first
//!   entry that does not verify loses nothing. Allocations and frees never touched the
//!   durable bitmaps, so rollback needs no allocator work (a run carved meanwhile stays,
//!   empty, as the format allows). If the state word itself is not durable, nothing was
//!   written yet.
//! - *Transaction after the commit point*: the redo log carries the bitmap changes *and*
//!   the undo state := inactive; recovery replays it first, so the rollback does not run
//!   and every snapshotted range keeps its new contents (persisted before the commit).
//! - *Abort interrupted*: the state is still active; restoring snapshots is idempotent.
//! - *Lanes are independent*: bitmap words shared by concurrent operations are changed only
//!   with `or` / `and-not` on distinct bits, never with `set`, so replaying one lane's log
//!   cannot undo another lane's (or a single-word commit's) completed change. The only
//!   descriptor word a log sets is an extent's word 0, for the extent that operation
//!   reserved or frees, which no other operation touches meanwhile; carving and releasing
//!   runs write descriptors directly, never through a log, and a run is released only when
//!   no operation in it is in flight. Class table entries are written only by their
//!   registration's single-word commit, never through a log. Redo logs are replayed before
//!   any undo log, and a transaction's undo ranges are not touched by another lane's redo
//!   entries (which target metadata and publish destinations the caller owns).
//!
//! Caller obligations (as in libpmemobj): a destination or snapshotted range must not be
//! written by another thread while the operation runs, a handle must not be used after
//! the object is freed, and an object must not be freed before the allocation that
//! returned (or published) it has returned.
//!
//! # Volatile state and concurrency
//!
//! The `heap` module keeps, per heap page, the span it belongs to, the span's shape,
//! type and state, and an atomic copy of the run's bitmap word (which also marks
//! reservations and frees in flight); per size class, the runs with free slots that no
//! thread owns and the runs threads own; per thread, the runs it owns; and the free
//! page spans (best fit, coalescing). An allocation of a run size claims a clear bit of
//! the calling thread's run with one atomic `fetch_or` — no lock, and other allocating
//! threads work in other runs (only neighbouring runs' boundary lines can be shared) —
//! and, keeping its handle (`HandleAt::None`), commits with one atomic `or` on the
//! descriptor's bitmap word: two atomic operations and one persist. A free from any
//! thread takes a pending-free ticket (atomic), commits, and clears the volatile bit
//! (atomic). Class and page locks are taken only to change run ownership or lists (a
//! run filled or emptied) and to carve or release spans; no code path holds two of
//! them. Lanes are taken with `try_lock` (never blocking on one lane), with no heap
//! lock held, and only by commits of more than one word and by transactions.
//!
//! # Durability per medium
//!
//! [`RegionBackend`] follows terrace-media: on DAX, cache-line flush + `sfence`; on other
//! disk-backed files, `msync`; on tmpfs (`Durability::Process`), a fence only, because the
//! page cache *is* the medium there: the pool survives a process crash, not a power loss,
//! and [`Pool::durability`] says so.
//!
//! # Present limits
//! - A transaction's snapshots must fit in one lane's undo area (56 KiB minus headers);
//!   larger is `TxLogFull` (libpmemobj extends logs into the heap; not done yet).
//! - A redo commit holds at most 508 distinct word updates (updates of one bitmap word
//!   merge), bounding the allocations and frees of one transaction.
//! - Custom classes (up to 254) cannot be unregistered or changed, and an allocation in
//!   one is always a single unit (libpmemobj's compact-header classes can combine up to
//!   64 units). Their units are multiples of 8 from 16 B; a run tracks at most 64 slots
//!   per 4 KiB page (one bitmap word per page descriptor), so a class with units below
//!   64 B uses only `64 u` bytes of each page (25% for 16 B units).
//! - A run a thread still owns when it exits goes back to its class; if it is empty it
//!   stays (empty, durably described) until the free pages run out, when such runs are
//!   released.
//! - `check` needs a quiescent pool (no operation or transaction in flight).

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

//! terrace-collections: crash-safe persistent collections inside a Terrace pool, named
//! roots, and a reachability check — what PCJ offered over libpmemobj and LLPL's
//! `ConcurrentLongART` offers Cassandra, on `terrace-pool`.
//!
//! ```
//! use std::ops::Bound;
//! use terrace_collections::{Collections, MapOptions};
//! use terrace_pool::{Pool, RecordingBackend};
//! # fn main() -> terrace_collections::Result<()> {
//! let pool = Pool::create_on(RecordingBackend::new(8 << 20), "example", 2)?;
//! let colls = Collections::open(&pool)?;
//! let map = colls.ordered_map("memtable", MapOptions::create(16, 8))?;
//! map.put(b"apple", &7u64.to_le_bytes())?;
//! map.put(b"pear", &9u64.to_le_bytes())?;
//! assert_eq!(map.get(b"apple")?, Some(7u64.to_le_bytes().to_vec()));
//! let keys: Vec<_> = map
//!     .range(Bound::Included(b"b".as_slice()), Bound::Unbounded, false)
//!     .map(|e| e.map(|(k, _)| k))
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(keys, vec![b"pear".to_vec()]);
//! assert!(terrace_collections::check(&pool)?.unreachable.is_empty());
//! # Ok(()) }
//! ```
//!
//! # The ordered map: why this structure
//! A B+-tree whose **leaves are unsorted** (a live-slot bitmap word plus one fingerprint
//! byte per slot, as FPTree and NV-Tree do) and whose inner nodes are sorted arrays. Chosen
//! by what a persistent map pays for:
//! - an insert or update that fits its leaf writes one free slot and then one 8-byte
//!   bitmap word: two persist points, no log, no lane. A sorted leaf would shift half of
//!   itself (a logged copy of up to kilobytes); an adaptive radix tree (LLPL's
//!   `LongART`) allocates and logs nodes as prefixes grow, and a skip list writes a
//!   tower of pointers per insert;
//! - a lookup reads at most `height` inner nodes, then 64 fingerprint bytes, and compares
//!   the key of the one or two slots whose fingerprint matches;
//! - reopening is free: the tree lives in the pool, so a map of a million keys answers its
//!   first get after the pool's open (no rebuild, unlike FPTree's volatile inner nodes);
//! - a lookup touches the leaf's first cache line (bitmap and fingerprints) and the line
//!   or two of the slot it wants, and fetches them together: writers put an entry at or
//!   just after a home slot its hash picks ([`layout::Geometry::pick_slot`]), so the reader
//!   prefetches that slot's lines with the first line instead of missing on them after
//!   it (placement only: a reader finds an entry by fingerprint wherever it is);
//! - space: a 16-byte key and 8-byte value take a 26-byte slot plus a fingerprint byte.
//!   A full leaf first moves entries into a sibling with room (a B*-tree's rotation),
//!   which keeps leaves fuller than splitting alone: 34.4 bytes per entry at 1M keys
//!   (README). A leaf a remove leaves a quarter full merges into its sibling;
//! - inner nodes count the prefix words (each separator's first 8 bytes) below the key,
//!   branch-free, within the block that samples in the node's first cache line point to;
//!   the block's lines and its children's are prefetched together.
//!
//! # Layout
//! See [`layout`]. A map is a header object (magic, geometry, root, height); leaves hold
//! `bitmap: u64, fingerprints: [u8; 56]` (one cache line), `slots, next: u64` (in whole,
//! 64-byte aligned cache lines), a slot `key_len: u8, value_len: u8,
//! key[key_cap], value[val_area]`; a value longer than the area lives in a blob object
//! (`len: u64, bytes`) and the slot holds its offset with `value_len = 255`. Inner nodes
//! hold `n: u64, children[fanout], separators[fanout-1]` (each `len: u8, key[key_cap]`).
//!
//! # Commit protocol and crash argument
//! Every persistent change is one of two kinds.
//! 1. **Single-leaf commit** (put of an inline value into a leaf with a free slot;
//!    replace of an inline value; remove of an inline value that does not empty a
//!    non-root leaf). The writer (holding the map's writer lock) fills slot `j`, which
//!    the bitmap marks free, persists it and its fingerprint, then stores the new bitmap
//!    word (`| 1 << j`, and `& !(1 << i)` for the replaced slot `i`, or just `& !(1 << i)`
//!    for a remove) and persists it. Crash before the word's persist: the word is the old
//!    one (an aligned 8-byte store is never torn) and slot `j` was free, so the map is as
//!    before. Crash after: the new slot was durable before the word, so the map holds the
//!    new entry. No other byte changed.
//! 2. **Transactional change** (anything else: the first leaf, a split, a move of entries
//!    between siblings, an out-of-line value, a remove that empties a leaf or merges a
//!    quarter-full one into its sibling, collapsing the root, creating a map and binding
//!    its name; for the hash map, an overflow page with its bucket split, and table
//!    growth). One pool transaction ([`terrace_pool::Tx`])
//!    snapshots every live byte it overwrites (bitmaps, slots, inner nodes, header words)
//!    and allocates and frees nodes and blobs at commit; `terrace-pool`'s undo and redo
//!    logs make it all-or-nothing (`docs/pool-format.md`, "Transactions"). Slots are
//!    snapshotted even when free, because a slot freed earlier in the same transaction
//!    would be live again after a rollback.
//!
//! The crash-image suite (`tests/crash.rs`) takes the durable image at every persist
//! point of random puts, replaces and removes on both maps with tiny nodes (splits, moves,
//! merges, root changes, overflow pages, bucket splits, table growth), plus torn variants,
//! and checks each recovers to the models' state before or after the operation in flight,
//! with [`check()`] passing and nothing unreachable. A kill test SIGKILLs a writer of both
//! maps.
//!
//! # The hash map
//! [`HashMap`]: linear hashing over chains of the same pages, for point lookups; a chain
//! that fills gets an overflow page and one bucket splits in the same transaction, so the
//! map grows a bucket at a time and never rehashes as a whole. See [`hash`].
//!
//! # Concurrency
//! Writers of a map serialize on its writer lock; readers take no lock and validate
//! against sequence counters (a counter per leaf stripe for bitmap changes, one for
//! transactional changes), retrying when a writer intervened. See [`ordered`].
//!
//! # The array
//! [`PersistentArray`]: a fixed number of fixed-size elements in one object; an 8-byte
//! element is set by one atomic store (no log), anything else in one transaction, and
//! readers never see a torn element. See [`array`](mod@array).
//!
//! # Named roots and reachability
//! [`Collections`] is the pool's directory: name → map, array or program object, itself an
//! ordered map whose header the pool's directory word names. [`check()`] walks it, validates
//! every node and reports collection objects no name reaches; [`sweep`] frees them.
//!
//! # Modules
//! - [`ordered`]: [`OrderedMap`] and its cursor [`Range`].
//! - [`hash`]: [`HashMap`] and its iterator [`HashIter`].
//! - `page`: slotted pages (leaves and buckets); `sync`: the readers' sequence counters
//!   and the registry of open collections.
//! - [`array`](mod@array): [`PersistentArray`], fixed-size elements in one object.
//! - [`directory`]: [`Collections`], named roots.
//! - [`check`](mod@check): [`check()`], [`sweep`].
//! - [`layout`]: type numbers and node formats.
//! - [`error`](mod@error): [`CollectionError`].

pub mod array;
pub mod check;
pub mod directory;
pub mod error;
pub mod hash;
pub mod layout;
pub mod ordered;
mod page;
mod sync;

pub use array::PersistentArray;
pub use check::{check, sweep, Report};
pub use directory::{ArrayOptions, Binding, Collections, Kind, MapOptions, MAX_NAME};
pub use error::{CollectionError, Result};
pub use hash::{HashIter, HashMap};
pub use ordered::{OrderedMap, Range};

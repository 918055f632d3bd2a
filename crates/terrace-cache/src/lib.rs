//! terrace-cache: the tiered cache engine. A [`Cache`] keeps key/value items in
//! append-only segments spread over tiers of memory — DRAM, a PMem/CXL or disk file, a
//! NUMA node — with one lock-free-on-read DRAM index over all of them, moves items
//! between tiers as they cool (demotion) or warm up (promotion), and survives a restart:
//! from a saved index after a clean shutdown, by scanning its file tiers after a crash,
//! never returning a deleted or overwritten value. `terrace serve` is a memcached front
//! end over it; [`Pools`] splits one configuration into named caches with quotas.
//!
//! The byte layouts, the commit protocol with its crash argument, the index contract and
//! the restart are in `docs/cache-format.md`; the locks and their order in
//! `docs/concurrency.md`; the measurements behind the policy's thresholds in
//! `docs/experiments.md`.
//!
//! # Glossary
//! - **tier**: one medium with a capacity (DRAM, a file `tier<i>.terrace`, a NUMA node),
//!   ordered fastest first ([`TierConfig`]). Tier 0 takes new writes; eviction from tier
//!   *i* demotes to tier *i + 1*. A *durable* tier (a file) survives a crash.
//! - **segment**: a `2^size_shift`-byte slice of a tier (2 MiB by default, always larger
//!   than the largest item): a 64-byte header, then items packed back to back. Written by
//!   one appender at a time, evicted whole. Its *slot* is its index in its tier; its
//!   *segment id* is unique across tiers.
//! - **commit word**: the last 8 bytes of a segment header: how many item bytes are
//!   committed and their running checksum, stored as one aligned `u64`. Zeroing it
//!   *retires* the segment: nothing in it is scanned again.
//! - **item**: one key/value with a few bytes of header inside a segment; its state byte
//!   is PENDING, LIVE or DEAD ([`ItemState`]). At most one LIVE item per key exists.
//! - **dead bytes**: bytes of DEAD items (overwritten, deleted, moved away) in segments not
//!   yet evicted, counted per segment.
//! - **write sequence**: a number from one cache-wide counter, taken each time a segment is
//!   opened; it orders segments by age and is the high part of every CAS. Never reused,
//!   even across restarts ([`seqmark`]).
//! - **CAS**: memcached's 64-bit unique, not stored but derived: the item's log position
//!   `write_seq << size_shift | offset`, or the *origin CAS* a moved or touched item
//!   carries.
//! - **TTL bucket**: the group of remaining lifetimes a segment is opened for; a segment's
//!   expiry is no earlier than any of its items'.
//! - **location**: where an item lives, a segment id and an offset ([`Location`]).
//! - **index entry**: one packed `u64` of the DRAM [`Index`]: tag, segment id, offset,
//!   frequency ([`index::Layout`]).
//! - **tag**: the top bits of the key's hash kept in the entry, so most lookups reject
//!   other keys without touching their segment; never 0 (0 marks an empty slot).
//! - **candidate**: a location whose tag matches ([`Candidate`]); the caller compares the
//!   key there. The index never verifies keys.
//! - **frequency**: the hits an entry records, 0..=3 in a thermometer code; a move or a
//!   replacement sets it as a [`Freq`] says.
//! - **repoint**: the compare-and-swap that moves a key's entry from the location it was
//!   read at to a new one ([`BucketGuard::repoint`]); it fails if the entry moved on.
//! - **pin**, **guard**: a reader's hold on one segment incarnation (a count in the
//!   segment's control word); a segment is reused only when no pin holds it. A [`Guard`]
//!   is a pinned hit, read zero-copy.
//! - **stripe**: one of the engine's sets of open tier-0 segments (one per TTL bucket);
//!   each thread appends through one stripe.
//! - **mover**: the work that keeps segments free ahead of writers — eviction, cleaning,
//!   promotion — run by [`Cache::maintain`] or by the threads of [`Cache::start_movers`]
//!   ([`Movers`], one per four cores by default); a writer that finds no free segment
//!   evicts inline, and then cleans as a mover would.
//! - **eviction**: freeing a sealed segment by walking its items: the ones worth keeping
//!   are copied (demoted, reinserted or kept in tier 0), the others lose their entries.
//! - **probation queue** (small queue): where new writes are judged — the single tier's
//!   `fifo` queue (a tenth of it, S3-FIFO's small queue), or tier 0 of several. It keeps
//!   items with hits and small items.
//! - **main queue**: the last tier's queue of the segments it keeps items in, evicted
//!   oldest first.
//! - **ghost**: a key a probation stage recently dropped, remembered by its fingerprint;
//!   if it is stored again soon its entry is marked [`index::RECALLED`] and its probation
//!   stage passes it on.
//! - **demotion**: copying a kept item from tier *i* to *i + 1* when its segment is
//!   evicted, frequency kept.
//! - **reinsertion**: copying a kept item into its own tier's reinsertion segment when its
//!   segment is evicted from the last tier (which has nowhere to demote to): one hit spent
//!   out of the main queue, none out of the single tier's probation queue.
//! - **stay**: a reinsertion in tier 0 of several: an item read twice or more stays in the
//!   fastest tier instead of being demoted, one hit spent.
//! - **cleaning**: copying every live item of a main-queue segment whose dead bytes pass
//!   a threshold into the reinsertion segment, and freeing it, long before FIFO order
//!   reaches it.
//! - **promotion**: copying an item read often in tier *i > 0* up into tier 0 (off by
//!   default, [`CacheConfig::promote`]).
//! - **tombstone**: what makes a delete survive a restart — here the deleted item itself,
//!   its state byte flipped to DEAD in place; there is no separate record.
//! - **saved index**, **snapshot**: what a clean [`Cache::shutdown`] writes
//!   (`terrace.index`, `dram<i>.snapshot`) so the next open reads no segment twice and
//!   loses no DRAM item.
//! - **pool**: a named [`Cache`] of its own with a quota of every tier ([`Pools`]).
//!
//! # Modules
//! - [`item`]: the item codec — one item's bytes, its state byte, [`ItemLimits`].
//! - [`segment`]: the segment codec — header, commit word, [`SegmentWriter`],
//!   [`SegmentReader`] and the scan's [`ScanEnd`].
//! - [`index`]: the DRAM index — buckets, entries, [`BucketGuard`], [`Freq`].
//! - `mem` (private): segment memory — control words, pins, appenders; the crate's only
//!   `unsafe`.
//! - [`tier`]: one medium's segment area, its lists and counters; tier sizes.
//! - [`cache`]: the concurrent engine [`Cache`] — reads, writes, TTL buckets, stats; its
//!   submodules own eviction and cleaning (`cache/evict.rs`), the mover threads
//!   (`cache/movers.rs`), promotion
//!   (`cache/promote.rs`), the restart scan (`cache/recover.rs`), the saved index
//!   (`cache/saved.rs`) and DRAM snapshots (`cache/snapshot.rs`).
//! - [`flash`]: the flash tier's I/O — its file, write buffers, kill log; the engine's
//!   side of it is `cache/flash.rs`.
//! - `write_budget` (private): the flash tier's bytes-per-second admission cap.
//! - `ghost` (private): the ghost filter.
//! - [`seqmark`]: the write-sequence high-water mark (`terrace.seq`).
//! - `bootmark` (private): the boot mark (`terrace.boot`) that says whether a page-cache
//!   tier may be trusted after an unclean stop.
//! - `synced` (private): small side files written whole and synced.
//! - [`pools`]: named pools with quotas over one configuration.
//! - [`spec`]: text forms of a configuration (sizes, tier lists) shared by the front ends.
//! - [`error`]: one typed error enum per operation family.

#![deny(unsafe_code)]

mod bootmark;
pub mod cache;
pub mod error;
pub mod flash;
mod ghost;
pub mod index;
pub mod item;
#[allow(unsafe_code)]
mod mem;
mod parallel;
pub mod pools;
pub mod segment;
pub mod seqmark;
pub mod spec;
mod synced;
pub mod tier;
mod write_budget;

#[cfg(any(test, debug_assertions))]
pub use cache::VerifyReport;
pub use cache::{
    default_movers, Cache, CacheConfig, Checked, Delta, FlashFetch, FlashSetsConfig, Guard,
    MoverStats, Movers, RestartReport, Side, Stats, Store, DEFAULT_SET_ITEM_MAX,
    MAX_DEFAULT_MOVERS,
};
pub use error::{CacheError, EncodeError, HeaderError, IndexError, ItemError};
pub use flash::FlashRead;
pub use index::{BucketGuard, Candidate, Freq, Full, Index, IndexConfig, Location};
pub use item::{ItemLimits, ItemRef, ItemSpec, ItemState};
pub use pools::{PoolConfig, PoolQuota, Pools};
pub use segment::{ScanEnd, SegmentHeader, SegmentReader, SegmentWriter};
pub use tier::{FlashStats, Medium, SetStats, TierConfig, TierSize, TierStats};

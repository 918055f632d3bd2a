//! The concurrent engine: [`Cache`] over the [`Index`] and the tiers ([`crate::tier`]). It
//! owns the write protocol of `docs/cache-format.md` ("Commit protocol") in its concurrent
//! form, the read path with its [`Guard`], TTL buckets, segment allocation with eviction,
//! demotion and reinsertion (ahead of need by the movers, [`Cache::maintain`], else inline;
//! the policy is in `cache/evict.rs`), the write-sequence mark and the restart scan.
//! Eviction lives in `cache/evict.rs`, the mover threads in `cache/movers.rs`, the restart
//! scan in `cache/recover.rs`; the invariants below are the ones all of them keep.
//!
//! Invariants (outside a bucket lock held by a writer):
//! - **E1** every index entry points at the start of a committed item of a segment in state
//!   `Open`, `Sealed` or `Evicting` (never `Free`/`Opening`); entries are created only for
//!   committed items, and an evictor removes or repoints every entry into its segment
//!   before the segment can be freed. `mem`'s invariant 4 rests on this.
//! - **E2** every LIVE item of a non-retired, non-`Evicting` segment is the one the index
//!   maps its key to, so at most one LIVE item per key outside segments being evicted; on
//!   durable tiers an item stops being LIVE on media (DEAD flipped and persisted, or its
//!   segment retired — which eviction does first there) before the write that supersedes
//!   or drops it is acknowledged, or its entry is dropped. This is the no-stale-value rule
//!   after a crash. (A DRAM segment being evicted keeps LIVE items whose entries are gone:
//!   DRAM does not survive a crash, and the segment is retired once walked.)
//! - **E3** a new item is published (made LIVE, entered in the index) only under its
//!   key's bucket lock, while its segment is `Open` or `Sealed` — never `Evicting` — and
//!   pinned by the writer. An evictor sets `Evicting` before walking and takes the bucket
//!   lock of every non-DEAD item it walks, so it either sees the published entry or the
//!   publisher sees `Evicting` and retries elsewhere. Under the lock, a writer finds the
//!   key's current item wherever an entry points — also in a durable segment already
//!   retired for its eviction walk (`Pin::indexed_item` reads past a zeroed commit word) —
//!   so it replaces that entry instead of publishing a second one for the key.
//! - **E4** a current index entry never points at a non-LIVE item: a writer makes the new
//!   item LIVE, then publishes it, then kills the old one; a delete removes the entry,
//!   then kills the item. So a reader that finds its key's item DEAD knows the entry
//!   changed under it and looks again, and a hot key never reads as a miss while it is
//!   being overwritten. (`flush_all` kills, then removes, under the bucket lock: readers
//!   racing with it may miss, which a flush allows.)
//!
//! Locks and their order: `docs/concurrency.md` ("terrace-cache"). What this module
//! keeps of them: nothing is allocated, appended or evicted under a bucket lock, and no
//! thread waits for a pin to drain — an evicted segment waits in its tier's reclaim
//! list, so a thread holding a [`Guard`] can still write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;

use crate::bootmark;
use crate::error::CacheError;
use crate::flash::{FlashAt, FlashTier, OwnedItem};
use crate::ghost::Ghost;
use crate::index::{BucketGuard, Freq, Index, IndexConfig, Location};
use crate::item::{ItemLimits, ItemRef, ItemSpec, ItemState};
use crate::mem::{Appender, OpenError, Pin, SegState, SegmentArea};
use crate::segment::{self, SegmentHeader, HEADER_LEN};
use crate::seqmark::{self, SeqMark};
use crate::tier::{self, Tier, TierConfig, TierStats};
use terrace_media::Durability;

mod evict;
mod flash;
mod movers;
pub mod number;
mod policy;
mod promote;
mod recover;
mod replica;
mod saved;
mod sets;
mod snapshot;
#[cfg(any(test, debug_assertions))]
mod verify;

use evict::Queue;
pub use flash::FlashFetch;
pub use movers::{default_movers, MoverStats, Movers, MAX_DEFAULT_MOVERS};
pub use recover::{DropReason, RestartReport};
pub use saved::saved_path;
pub use sets::{FlashSetsConfig, DEFAULT_SET_ITEM_MAX};
#[cfg(any(test, debug_assertions))]
pub use verify::VerifyReport;

/// How to open a [`Cache`].
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// Tiers, fastest first. New items go to tier 0; evicting tier *i* demotes to *i + 1*.
    pub tiers: Vec<TierConfig>,
    /// Total capacity, needed when a tier's size is a ratio.
    pub total_bytes: Option<u64>,
    /// Segments are `2^segment_shift` bytes; `None` picks the smallest power of two above
    /// the largest item the limits allow (2 MiB for the default 1 MiB values).
    pub segment_shift: Option<u8>,
    pub limits: ItemLimits,
    /// Items the whole capacity holds at the expected item size (capacity divided by the
    /// mean item size); `None`: one per 256 bytes of capacity, or per half the sets'
    /// largest item with flash sets (`default_item_bytes`). The index is sized for the
    /// share of them that the engine keeps live (about 95%, about 85% of a flash tier's; see
    /// `index_items`).
    pub expected_items: Option<usize>,
    /// Open-segment stripes (threads map to stripes round-robin); 0 = available
    /// parallelism.
    pub stripes: usize,
    /// Mover threads [`Cache::start_movers`] starts (`cache/movers.rs`); 0 = one per four
    /// cores of the available parallelism, 1 to 8 ([`default_movers`]).
    pub movers: usize,
    /// Test and benchmark knob: every mover thread sleeps this long after each segment it
    /// evicts, as a mover starved of CPU would be slow. `None` in production.
    #[doc(hidden)]
    pub mover_delay: Option<std::time::Duration>,
    /// Copy items read often in a lower tier up into tier 0, in the background (the
    /// mover thread does it; see `cache/promote.rs`). [`CacheConfig::new`] turns it on
    /// with a flash tier: a flash hit costs a device read, and an item promoted out of
    /// flash keeps its flash copy, which its demotion returns to (`cache/replica.rs`).
    /// Off otherwise: it pays when the lower tiers are slower to read than DRAM (PMem,
    /// CXL or far NUMA memory); with a file tier in page cache or on tmpfs it only costs
    /// copies and space, and so hit ratio and throughput (`docs/experiments.md`).
    pub promote: bool,
    /// Key hash seed.
    pub seed: u64,
    /// The running system boot's identity; `None` reads Linux's
    /// `/proc/sys/kernel/random/boot_id`. A file tier on a disk-backed file system is
    /// trusted after an unclean stop only within the boot that wrote it (`bootmark`).
    pub boot_id: Option<String>,
    /// The flash tier's write budget, bytes per second admitted to flash (demotions and
    /// reinsertions; `crate::write_budget`); what it refuses is dropped and counted.
    /// `None`: no cap beyond the device's speed.
    pub flash_write_rate: Option<u64>,
    /// Small items on the flash tier in sets rather than indexed segments (about a byte
    /// of DRAM per item instead of ten; `cache/sets.rs`). `None`: all in segments.
    pub flash_sets: Option<FlashSetsConfig>,
}

impl CacheConfig {
    /// The largest item the limits allow, encoded.
    fn max_item_len(&self) -> usize {
        ItemSpec {
            client_flags: u32::MAX,
            expires_at: u32::MAX,
            origin_cas: Some(0),
            ..ItemSpec {
                key_len: self.limits.max_key_len,
                value_len: self.limits.max_value_len,
                client_flags: 0,
                expires_at: 0,
                origin_cas: None,
            }
        }
        .encoded_len()
    }

    /// The segment size [`Cache::open`] uses, as a power of two: `segment_shift` if set,
    /// else the smallest that holds the largest item the limits allow (validated by open).
    pub fn chosen_segment_shift(&self) -> u8 {
        self.segment_shift.unwrap_or_else(|| {
            let need = (self.max_item_len() + HEADER_LEN).next_power_of_two();
            need.trailing_zeros().max(u32::from(segment::MIN_SHIFT)) as u8
        })
    }

    /// Defaults for `tiers`: promotion on when one of them is flash.
    pub fn new(tiers: Vec<TierConfig>) -> CacheConfig {
        let promote = tiers
            .iter()
            .any(|t| matches!(t.medium, tier::Medium::Flash { .. }));
        CacheConfig {
            tiers,
            total_bytes: None,
            segment_shift: None,
            limits: ItemLimits::default(),
            expected_items: None,
            stripes: 0,
            movers: 0,
            mover_delay: None,
            promote,
            seed: 0x7e77ace,
            boot_id: None,
            flash_write_rate: None,
            flash_sets: None,
        }
    }
}

/// Which end of a value [`Cache::concat`] adds to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Before the value (`prepend`).
    Front,
    /// After the value (`append`).
    Back,
}

/// Which way [`Cache::arith`] moves a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delta {
    /// Add, wrapping at 2^64 (`incr`).
    Incr,
    /// Subtract, stopping at 0 (`decr`).
    Decr,
}

/// The outcome of a conditional store (memcached's replies).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    /// Stored; the new item's CAS.
    Stored { cas: u64 },
    /// The condition failed: `add` of a present key, `replace`/`append`/`prepend` of an
    /// absent one.
    NotStored,
    /// `cas`: the key's CAS is not the one given.
    Exists,
    /// `cas`: the key is absent.
    NotFound,
}

/// The outcome of an operation on a present key that may be conditional on its CAS
/// (memcached's binary DELETE/APPEND/INCR and meta `md`/`ma` with a CAS): the check is
/// made against the very item the operation replaces or removes, under the same
/// guarantee as [`Cache::cas`], never just before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked<T> {
    Done(T),
    /// The key is absent.
    NotFound,
    /// The key's CAS is not the one given.
    Exists,
}

/// Cache-wide counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub hits: u64,
    pub misses: u64,
    pub sets: u64,
    pub deletes: u64,
    /// Reads that found their item's segment expired.
    pub expired: u64,
    /// Entries evicted because both index buckets of a new key were full.
    pub index_evictions: u64,
    /// Items copied from tier *i* to *i + 1* on eviction.
    pub demotions: u64,
    /// Items copied from a lower tier into tier 0 because they were read often there
    /// (see `cache/promote.rs`).
    pub promotions: u64,
    /// Items worth keeping (with hits, or small ones out of probation: `cache/evict.rs`)
    /// copied within their tier when their segment was evicted: the last tier's
    /// reinsertions (instead of being dropped), and the items read most that tier 0 of
    /// several keeps (instead of demoting them). Cleanings are counted apart
    /// ([`TierStats::items_cleaned`](crate::TierStats::items_cleaned)).
    pub reinsertions: u64,
    /// Segment evictions done on a request's critical path (no free segment was ready).
    pub inline_evictions: u64,
    /// Failed persists of a state flip that could not be reported to a caller (flush).
    pub persist_errors: u64,
    /// Segment evictions done by [`Cache::maintain`] (the movers), off the request path.
    pub background_evictions: u64,
    /// Rounds of the mover threads that ended in an error.
    pub mover_errors: u64,
    /// What the mover threads did and waited for (`cache/movers.rs`).
    pub movers: MoverStats,
    /// Index memory (with the ghost filter's) per indexed item, in bytes (the per-item
    /// header is extra: 4–5 bytes).
    pub index_bytes_per_item: f64,
    pub items: usize,
    pub tiers: Vec<TierStats>,
}

impl Stats {
    /// Items dropped for good: by any tier's eviction (a tier above the last drops what it
    /// does not demote) and index entries evicted for want of a slot. memcached's
    /// `evictions`.
    pub fn evictions(&self) -> u64 {
        self.tiers.iter().map(|t| t.items_evicted).sum::<u64>() + self.index_evictions
    }
}

#[derive(Debug, Default)]
struct EngineCounters {
    hits: AtomicU64,
    misses: AtomicU64,
    sets: AtomicU64,
    deletes: AtomicU64,
    expired: AtomicU64,
    index_evictions: AtomicU64,
    demotions: AtomicU64,
    promotions: AtomicU64,
    persist_errors: AtomicU64,
}

/// DRAM copy of what the engine needs from a segment header.
#[derive(Debug, Default)]
struct SegMeta {
    write_seq: AtomicU64,
    expires_at: AtomicU32,
    /// Bytes of this incarnation's committed items that are DEAD (reset when opened).
    dead_bytes: AtomicU32,
}

/// A hit: pins the item's segment so its bytes stay valid (zero-copy) until dropped.
/// Holding a guard delays the reuse of one segment; do not keep guards for long.
pub struct Guard<'c> {
    held: Held<'c>,
    segment: u32,
    offset: u32,
    end: u32,
    client_flags: u32,
    cas: u64,
    tier: usize,
    /// The item's expiry, Unix seconds (0: never).
    expires_at: u32,
    /// Whether the index had recorded a read of the item before this lookup.
    read_before: bool,
}

impl std::fmt::Debug for Guard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("segment", &self.segment)
            .field("offset", &self.offset)
            .field("cas", &self.cas)
            .finish()
    }
}

/// What a [`Guard`] reads its item from.
enum Held<'c> {
    /// A memory tier's segment, pinned (zero-copy).
    Pin(Pin<'c>),
    /// A copy read from flash.
    Copy(OwnedItem),
}

impl Held<'_> {
    /// The item at `offset` (an index entry's): decoded in the pinned segment, or the
    /// copy itself.
    fn item_at(&self, offset: u32) -> Option<ItemRef<'_>> {
        match self {
            Held::Pin(pin) => pin.indexed_item(offset).ok(),
            Held::Copy(owned) => Some(owned.item()),
        }
    }
}

impl Guard<'_> {
    fn item(&self) -> Option<ItemRef<'_>> {
        match &self.held {
            Held::Pin(pin) => pin.item_within(self.offset, self.end).ok(),
            Held::Copy(owned) => Some(owned.item()),
        }
    }

    /// The value, borrowed from the segment.
    pub fn value(&self) -> &[u8] {
        self.item().map_or(&[][..], |i| i.value)
    }

    pub fn key(&self) -> &[u8] {
        self.item().map_or(&[][..], |i| i.key)
    }

    pub fn client_flags(&self) -> u32 {
        self.client_flags
    }

    pub fn cas(&self) -> u64 {
        self.cas
    }

    /// The tier the item was found in.
    pub fn tier(&self) -> usize {
        self.tier
    }

    /// When the item stops being served, Unix seconds on the cache's clock; `None`: it
    /// does not expire. Exactly the TTL it was given (items carry their own expiry; only
    /// an item written by a version-1 build expires with its segment, up to about a
    /// quarter early).
    pub fn expires_at(&self) -> Option<u32> {
        (self.expires_at != 0).then_some(self.expires_at)
    }

    /// Whether the item had been read before this lookup (memcached's "fetched" bit, the
    /// meta protocol's `h`): the index entry's frequency as loaded, so a read the index
    /// has forgotten (the item was moved or its entry rewritten) reads as none.
    pub fn read_before(&self) -> bool {
        self.read_before
    }
}

/// What a write expects to find under the key's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Any,
    Absent,
    /// The live item at exactly this location.
    At(Location),
}

impl Expect {
    fn met_by(self, found: FoundEntry) -> bool {
        match (self, found) {
            (Expect::Any, _) => true,
            (Expect::Absent, FoundEntry::Live(_)) => false,
            (Expect::Absent, _) => true,
            (Expect::At(at), FoundEntry::Live(cur)) => cur.loc == at,
            (Expect::At(_), _) => false,
        }
    }
}

/// Which version of a key a write stores ([`Cache::write_as`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    /// A new one: its CAS is where it lands.
    New,
    /// The version of this CAS with a new expiry (a touch).
    Touched(u64),
    /// The version of this CAS read from a flash set (a promotion): the set copy stays.
    FromSet(u64),
}

/// Whether a lookup is a client's read, which records a hit (and may start a
/// promotion), or the engine's own look at the current item, which must not steer
/// eviction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Access {
    Read,
    Peek,
}

/// A live item found under a lookup: its location, value copy excluded.
#[derive(Clone, Copy, Debug)]
struct Current {
    loc: Location,
    cas: u64,
    client_flags: u32,
    expires_at: u32,
}

/// Ghost-filter slots (one byte each): one per this many of the items the capacity holds,
/// about 0.4 bytes per item.
const GHOST_ITEMS_PER_SLOT: usize = 3;

static NEXT_STRIPE: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static STRIPE: usize = NEXT_STRIPE.fetch_add(1, Ordering::Relaxed);
}

/// The item size the index is sized for when the configuration gives no expected item
/// count: 256 bytes, or with flash sets half their largest item (at most 256, at least
/// 64). A cache with sets is one for small items: counted at 256 bytes, items of 100 in
/// DRAM alone would outnumber the index's entries, and index evictions would drop fresh
/// items.
fn default_item_bytes(sets: Option<&FlashSetsConfig>) -> u64 {
    const WITHOUT_SETS: u64 = 256;
    sets.map_or(WITHOUT_SETS, |c| {
        (c.max_item as u64 / 2).clamp(64, WITHOUT_SETS)
    })
}

/// The items the index is sized for, of `expected` (what the whole capacity would hold at
/// the mean item size written): only live items have entries, and the engine never fills
/// all of its capacity with them. It keeps each tier's free reserve ready and one segment
/// per stripe and one per tier (for copies) open and partly filled; the rest — about 95%
/// of a single tier of 128 segments with two stripes — is taken as live, and the index
/// is sized for that at its design load, so that it runs near that load when the cache
/// is full. Dead bytes are
/// not subtracted: the movers clean them down to about a tenth of a tier
/// (`cache/evict.rs`, `CLEAN_DEAD_SHARE`), and the probation stages' preference for small
/// items makes the mean item the cache holds smaller than the mean written, which makes
/// up for that tenth. (When the index is fuller than its load, a few percent of inserts
/// find both buckets full and evict an occupant: see `docs/cache-format.md`, "When
/// full", and `index::SLOTS`. Subtracting dead bytes here would make that happen to the
/// very items cleaning makes room for: `docs/experiments.md`.)
///
/// A flash tier (`flash_segments`) counts with its free reserve and reinsertion buffer
/// out and only [`FLASH_LIVE_SHARE`] of the rest: flash is never cleaned, so its FIFO
/// holds dead items until their segments go, and its index entries are most of the
/// DRAM a flash item costs. The flash tier's sets (`unindexed_segments`, in segments'
/// worth of bytes) hold items without entries.
fn index_items(
    expected: usize,
    areas: &[(SegmentArea, bool, u32)],
    flash_segments: Option<u32>,
    unindexed_segments: u64,
    stripes: usize,
) -> usize {
    let memory: u64 = areas.iter().map(|(a, _, _)| u64::from(a.count())).sum();
    let reserved: u64 = areas
        .iter()
        .map(|(a, _, _)| evict::free_target_of(a.count()) as u64 + 1)
        .sum::<u64>()
        + stripes as u64;
    let flash = u64::from(flash_segments.unwrap_or(0));
    let flash_usable =
        flash.saturating_sub(flash::FLASH_FREE_TARGET as u64 + 1) as f64 * FLASH_LIVE_SHARE;
    let usable = memory.saturating_sub(reserved).max(1) as f64 + flash_usable;
    let share = usable / (memory + flash + unindexed_segments).max(1) as f64;
    ((expected as f64 * share).ceil() as usize).max(1)
}

/// The share of a flash tier's segments taken as live when the index is sized: about
/// what its FIFO with dead-heavy-first eviction keeps live on a mixed workload (82–86%
/// measured on W1 of `bench/flash-vs-anchors.sh`).
const FLASH_LIVE_SHARE: f64 = 0.85;

/// The index's design load with a flash tier (without one, [`crate::index::DEFAULT_LOAD`]):
/// at a DRAM:flash ratio of 1:16 the index is most of the DRAM a flash item costs, and
/// the few more inserts a fuller table refuses evict one of its coldest entries, which
/// are flash items too.
const FLASH_INDEX_LOAD: f64 = 0.9;

/// Open segments one set of them (a stripe's, or a tier's movers') may hold in a tier of
/// `segments`: `share` of the tier shared between `sets`, at least one each.
fn open_segments_cap(segments: u32, share: (usize, usize), sets: usize) -> usize {
    (segments as usize * share.0 / share.1 / sets.max(1)).max(1)
}

/// Fewest segments a tier may have. Open segments take up to three quarters of a tier
/// (writers half, the movers' copies a quarter), the last tier keeps one free for its
/// reinsertions, and an allocation needs a sealed segment to evict: below eight, writes
/// could stall and fail for want of a segment.
pub const MIN_TIER_SEGMENTS: u32 = 8;

/// The share of a tier its writers' open segments may hold, all stripes together.
const WRITER_OPEN_SHARE: (usize, usize) = (1, 2);
/// The share of a tier the open segments of its movers (demotions, reinsertions) may hold.
const MOVER_OPEN_SHARE: (usize, usize) = (1, 4);

/// TTL bucket of a remaining lifetime: 0 = none; exact below 8 s; else eight buckets per
/// power of two. Returns the bucket and the longest lifetime in it.
fn ttl_bucket(remaining: u32) -> (u16, u32) {
    if remaining == 0 {
        return (0, 0);
    }
    let k = 32 - remaining.leading_zeros();
    if k <= 3 {
        return (remaining as u16, remaining);
    }
    let sub = (remaining >> (k - 4)) & 7;
    let lowest = (8 | sub) << (k - 4);
    ((k * 8 + sub) as u16, lowest + ((1 << (k - 4)) - 1))
}

/// Whether an expiry (Unix seconds, 0: never) has passed at `now`.
pub(crate) fn past(expires_at: u32, now: u32) -> bool {
    expires_at != 0 && now >= expires_at
}

/// Whether a segment expiring at `segment` (0: never) may hold an item expiring at `item`
/// (0: never): a segment never expires before an item in it.
fn segment_outlives(segment: u32, item: u32) -> bool {
    segment == 0 || (item != 0 && item <= segment)
}

/// Where an item goes among a set of open segments keyed by TTL bucket (a writer
/// stripe's, or a tier's movers'): its own bucket's segment if that one outlives it and
/// has room; else, when the set is at its cap of open segments, the open segment that
/// outlives it by the least (items carry their own expiry, so sharing a longer-lived
/// segment costs only the space of the item after it expires, until that segment is
/// reclaimed), and if none does, a new never-expiring segment (bucket 0), which every
/// later item can share; else a new segment of its bucket ([`Placement::Open`]). So with
/// more TTL buckets in use than open segments allowed, the set degrades to what memcached
/// does — items expire lazily, one by one, and their space returns when FIFO eviction
/// reaches them — instead of sealing segments nearly empty.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    Append(u16),
    /// Open a segment for `bucket` expiring at `expires_at` (sealing the bucket's
    /// current one, and the fullest while the set is at its cap).
    Open {
        bucket: u16,
        expires_at: u32,
    },
}

fn place(
    open: &HashMap<u16, Appender>,
    need: usize,
    expires_at: u32,
    now: u32,
    cap: usize,
) -> Placement {
    let (bucket, longest) = ttl_bucket(expires_at.saturating_sub(now));
    let takes = |app: &Appender| {
        app.remaining() >= need && segment_outlives(app.header().expires_at, expires_at)
    };
    // (A bucket's own segment never expires where its items do not: bucket 0 is the
    // never-expiring one.)
    if open.get(&bucket).is_some_and(takes) {
        return Placement::Append(bucket);
    }
    let others = open.len() - usize::from(open.contains_key(&bucket));
    if others >= cap.max(1) {
        let shared = open
            .iter()
            .filter(|(_, app)| takes(app))
            .min_by_key(|(_, app)| match app.header().expires_at {
                0 => u64::MAX,
                e => u64::from(e),
            });
        if let Some((&b, _)) = shared {
            return Placement::Append(b);
        }
        return Placement::Open {
            bucket: 0,
            expires_at: 0,
        };
    }
    // A new segment lives the bucket's longest lifetime and an eighth more (a second
    // at least), so that the bucket's items keep joining it for a while (each still
    // expires on its own).
    let expires_at = if expires_at == 0 {
        0
    } else {
        now.saturating_add(longest)
            .saturating_add((longest / 8).max(1))
    };
    Placement::Open { bucket, expires_at }
}

/// Promotions asked for: each key's hash and where its item was read
/// (`cache/promote.rs`).
type PromotionQueue = Vec<(u64, Location)>;

/// The tiered cache engine. See the module docs for its invariants.
pub struct Cache {
    tiers: Vec<Tier>,
    /// The flash tier, always the last (`crate::flash`, `cache/flash.rs`); its segment
    /// ids follow the memory tiers'.
    flash: Option<FlashTier>,
    meta: Box<[SegMeta]>,
    index: Index,
    /// Keys a probation stage dropped recently (see `crate::ghost`).
    ghost: Ghost,
    /// Mover threads to start ([`CacheConfig::movers`], resolved).
    movers: usize,
    /// [`CacheConfig::mover_delay`].
    mover_delay: Option<std::time::Duration>,
    /// The mover threads started, if any: writers wake them when free segments run low.
    mover_threads: Mutex<Vec<std::thread::Thread>>,
    mover_counters: movers::MoverCounters,
    stripes: Box<[Mutex<HashMap<u16, Appender>>]>,
    shift: u8,
    limits: ItemLimits,
    next_seq: AtomicU64,
    /// Every sequence below this is covered by the mark file (u64::MAX: no file tier).
    seq_bound: AtomicU64,
    seqmark: Option<Mutex<SeqMark>>,
    /// Where the mark, the saved index and the DRAM snapshots live.
    first_file_dir: Option<std::path::PathBuf>,
    clock_offset: AtomicI64,
    /// Whether hits in lower tiers ask for promotion ([`CacheConfig::promote`]).
    promote: bool,
    /// Promotions asked for and not yet done, in shards by hash (`cache/promote.rs`).
    promotions: Box<[Mutex<PromotionQueue>]>,
    /// The flash copies promotions left in place (`cache/replica.rs`).
    replicas: replica::Replicas,
    /// Small items in the flash tier's sets ([`CacheConfig::flash_sets`]).
    sets_config: Option<FlashSetsConfig>,
    counters: EngineCounters,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("tiers", &self.tiers)
            .field("shift", &self.shift)
            .finish()
    }
}

/// Unix seconds from the coarse clock: read on every get and set, where a full
/// `clock_gettime` was about 3% of an operation; TTLs are whole seconds anyway.
fn system_now() -> i64 {
    terrace_media::os::unix_seconds_coarse()
}

impl Cache {
    /// Opens a cache: maps every tier, and on file tiers that already exist rebuilds the
    /// index by scanning their segments (see `docs/cache-format.md`, "Restart").
    pub fn open(config: CacheConfig) -> Result<(Cache, RestartReport), CacheError> {
        let started = std::time::Instant::now();
        config.limits.validate()?;
        if config.tiers.is_empty() {
            return Err(CacheError::Config { why: "no tiers" });
        }
        if config.tiers.len() > usize::from(u8::MAX) {
            return Err(CacheError::Config {
                why: "more than 255 tiers",
            });
        }
        let max_item = config.max_item_len();
        let shift = config.chosen_segment_shift();
        if !(segment::MIN_SHIFT..=segment::MAX_SHIFT).contains(&shift) {
            return Err(CacheError::Config {
                why: "segment size outside 256 B ..= 2 GiB",
            });
        }
        if max_item > (1usize << shift) - HEADER_LEN {
            return Err(CacheError::Config {
                why: "segments are smaller than the largest item the limits allow",
            });
        }
        let mut sizes = tier::resolve_sizes(&config.tiers, config.total_bytes)?;
        // A flash tier is the last; the others are mapped.
        let flash_of = |t: &TierConfig| match &t.medium {
            tier::Medium::Flash { dir, path } => Some((dir.clone(), path.clone())),
            _ => None,
        };
        let flash_config = config.tiers.last().and_then(flash_of).map(|at| {
            let bytes = sizes.pop().unwrap_or(0);
            (at, bytes)
        });
        let memory_tiers = &config.tiers[..sizes.len()];
        if memory_tiers.iter().any(|t| flash_of(t).is_some()) {
            return Err(CacheError::Config {
                why: "a flash tier must be the last tier",
            });
        }
        if memory_tiers.is_empty() {
            return Err(CacheError::Config {
                why: "a flash tier needs a memory tier above it",
            });
        }
        let sets_config = config.flash_sets.filter(|_| flash_config.is_some());
        if let Some(c) = sets_config {
            if !(0.05..=0.95).contains(&c.share) {
                return Err(CacheError::Config {
                    why: "the flash sets' share must be between 0.05 and 0.95",
                });
            }
            if !(16..=crate::flash::SET_PAGE / 4).contains(&c.max_item) {
                return Err(CacheError::Config {
                    why: "the largest set item must be between 16 B and a quarter page",
                });
            }
        }
        // The flash tier's bytes: its segments, then its sets' pages.
        let flash_set_bytes = flash_config.as_ref().map_or(0, |(_, bytes)| {
            sets_config.map_or(0, |c| {
                (*bytes as f64 * c.share) as u64 / crate::flash::SET_PAGE as u64
                    * crate::flash::SET_PAGE as u64
            })
        });
        let flash_segments = flash_config.as_ref().map(|(_, bytes)| {
            u32::try_from((bytes - flash_set_bytes) >> shift).unwrap_or(u32::MAX)
        });
        if let Some(segments) = flash_segments {
            if segments < MIN_TIER_SEGMENTS {
                return Err(CacheError::TierTooSmall {
                    tier: sizes.len(),
                    segments,
                    min: MIN_TIER_SEGMENTS,
                    segment_bytes: 1 << shift,
                });
            }
        }
        // The flash tier's buffers (a demotion and a reinsertion buffer, a segment being
        // evicted) are DRAM: they come out of the first DRAM tier's size, which must
        // still hold a tier's minimum. Tiers are mapped in whole granules, so what comes
        // out is rounded down to granules: all of it at the default 2 MiB segments,
        // nothing for segments below a third of a granule.
        if flash_config.is_some() {
            let dram = memory_tiers
                .iter()
                .position(|t| matches!(t.medium, tier::Medium::Dram { .. }));
            let granule = terrace_media::registry::GRANULE as u64;
            let buffers = (u64::from(flash::FLASH_BUFFER_SEGMENTS) << shift) / granule * granule;
            if let Some(i) = dram.filter(|_| buffers > 0) {
                let mapped = tier::mapped_len(sizes[i]);
                let segments = u32::try_from(mapped >> shift).unwrap_or(u32::MAX);
                let min = MIN_TIER_SEGMENTS + u32::try_from(buffers >> shift).unwrap_or(u32::MAX);
                if segments < min {
                    return Err(CacheError::TierTooSmall {
                        tier: i,
                        segments,
                        min,
                        segment_bytes: 1 << shift,
                    });
                }
                sizes[i] = mapped - buffers;
            }
        }
        // Every tier's segment count before any is mapped (regions are whole granules),
        // so that a refused size leaves no tier file behind.
        for (i, &bytes) in sizes.iter().enumerate() {
            let segments = u32::try_from(tier::mapped_len(bytes) >> shift).unwrap_or(u32::MAX);
            if segments < MIN_TIER_SEGMENTS {
                return Err(CacheError::TierTooSmall {
                    tier: i,
                    segments,
                    min: MIN_TIER_SEGMENTS,
                    segment_bytes: 1 << shift,
                });
            }
        }
        let mut tiers = Vec::with_capacity(sizes.len());
        let mut areas = Vec::with_capacity(sizes.len());
        let mut base: u64 = 0;
        for (i, (tc, &bytes)) in memory_tiers.iter().zip(&sizes).enumerate() {
            let (region, existing) = tier::map_tier(tc, i, bytes)?;
            let area = SegmentArea::new(region, shift).ok_or(CacheError::Config {
                why: "more than 2^32 segments in a tier",
            })?;
            let count = u64::from(area.count());
            areas.push((area, existing, base as u32));
            base += count;
            if base > u64::from(u32::MAX) {
                return Err(CacheError::Config {
                    why: "more than 2^32 segments",
                });
            }
        }
        let flash_base = base as u32;
        if let Some(segments) = flash_segments {
            base += u64::from(segments);
            if base > u64::from(u32::MAX) {
                return Err(CacheError::Config {
                    why: "more than 2^32 segments",
                });
            }
        }
        let total_segments = base as u32;
        let capacity: u64 =
            sizes.iter().sum::<u64>() + flash_config.as_ref().map_or(0, |(_, b)| *b);
        let expected_items = config
            .expected_items
            .unwrap_or((capacity / default_item_bytes(sets_config.as_ref())).max(1024) as usize);
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        let movers = match config.movers {
            0 => default_movers(cores),
            n => n,
        };
        // Each stripe keeps at least one open segment in tier 0: no more stripes than a
        // quarter of its segments, so that they stay within their share of it.
        let stripes = if config.stripes == 0 {
            cores
        } else {
            config.stripes
        }
        .min((areas[0].0.count() / 4).max(1) as usize);
        let mut index = Index::new(&IndexConfig {
            seed: config.seed,
            load: if flash_segments.is_some() {
                FLASH_INDEX_LOAD
            } else {
                crate::index::DEFAULT_LOAD
            },
            ..IndexConfig::new(
                index_items(
                    expected_items,
                    &areas,
                    flash_segments,
                    flash_set_bytes >> shift,
                    stripes,
                ),
                total_segments,
                shift,
            )
        })?;
        let meta: Box<[SegMeta]> = (0..total_segments).map(|_| SegMeta::default()).collect();
        // The mark first: its bound says whether a saved index may be used.
        let first_file_dir = config
            .tiers
            .iter()
            .find_map(|t| match &t.medium {
                tier::Medium::File { dir } => Some(dir.clone()),
                _ => None,
            })
            .or_else(|| flash_config.as_ref().map(|((dir, _), _)| dir.clone()));
        let mut mark = match &first_file_dir {
            Some(dir) => Some(SeqMark::open(dir)?),
            None => None,
        };
        let mut report = RestartReport::default();
        let saved = match (&first_file_dir, &mark) {
            (Some(dir), Some((_, bound))) => {
                saved::take(dir, shift, total_segments, *bound, &mut index)
            }
            _ => None,
        }
        .map(|(saved, loaded)| {
            report.items = loaded;
            report.loaded_from_saved_index = loaded;
            saved
        });
        // Page-cache tiers written before a system restart, with no clean shutdown since,
        // hold whatever pages reached the disk: never scanned (`bootmark`).
        // (A flash tier's kill log is written through the page cache.)
        let page_cache =
            areas.iter().any(|(a, _, _)| a.region().is_page_cached()) || flash_config.is_some();
        let boot_dir = first_file_dir.as_deref().filter(|_| page_cache);
        // Only page-cache tiers need the boot's identity (read from /proc otherwise).
        let boot = boot_dir.and_then(|_| config.boot_id.clone().or_else(bootmark::current_boot_id));
        // Without a boot id (no /proc) a reboot cannot be told apart: never trusted.
        let untrusted = boot_dir.is_some_and(|dir| {
            saved.is_none()
                && (boot.is_none() || bootmark::recorded(dir).as_deref() != boot.as_deref())
        });
        let mut found = Vec::new();
        let mut from_saved = vec![false; total_segments as usize];
        let mut max_seq = 0;
        let now = system_now() as u32;
        let saved_bound = saved.as_ref().and(mark.as_ref()).map(|(_, bound)| *bound);
        for (t, (mut area, mut existing, base)) in areas.into_iter().enumerate() {
            let mut kept = Vec::new();
            if let Some(dir) = &first_file_dir {
                if area.region().durability() == Durability::None {
                    // A clean shutdown's snapshot of this tier, if the saved index written
                    // with it is trusted; removed in any case (`cache/snapshot.rs`).
                    existing = snapshot::restore(dir, t, &mut area, shift, saved_bound);
                }
            }
            if existing && untrusted && area.region().is_page_cached() {
                report.untrusted_after_reboot += Self::wipe_tier(&mut area)?;
            } else if existing {
                Self::scan_tier(
                    t,
                    &mut area,
                    base,
                    shift,
                    now,
                    &meta,
                    &index,
                    &mut found,
                    &mut kept,
                    &mut from_saved,
                    &mut max_seq,
                    &mut report,
                    saved.as_ref(),
                )?;
            }
            // Lanes for every mover and one for the writers' inline evictions, as many
            // as the copies' share of the tier has segments for.
            let copy_sets = if t == 0 && config.tiers.len() > 1 {
                2
            } else {
                1
            };
            let lanes =
                (movers + 1).min(open_segments_cap(area.count(), MOVER_OPEN_SHARE, copy_sets));
            let tier = Tier::new(area, base, lanes);
            {
                let mut lists = tier.lists.lock();
                kept.sort_unstable();
                // The last tier's recovered segments go to its main queue: they held
                // what it kept, not a probation of new writes.
                let sealed = kept.iter().map(|&(_, slot)| slot).collect();
                if t + 1 == config.tiers.len() && flash_config.is_none() {
                    lists.main = sealed;
                } else {
                    lists.fifo = sealed;
                }
                let mut is_kept = vec![false; tier.area.count() as usize];
                for &(_, slot) in &kept {
                    is_kept[slot as usize] = true;
                }
                lists.free.retain(|&s| !is_kept[s as usize]);
            }
            tiers.push(tier);
        }
        let flash = match &flash_config {
            Some(((dir, path), bytes)) => {
                let segments = flash_segments.unwrap_or(0);
                let small_log =
                    (bytes * sets::SMALL_LOG_SHARE.0 / sets::SMALL_LOG_SHARE.1) >> shift;
                let shape = crate::flash::FlashShape {
                    segments,
                    sets: crate::flash::SetGeometry::new(
                        flash_set_bytes / crate::flash::SET_PAGE as u64,
                        index.bucket_count(),
                    ),
                    small_log_segments: (small_log as usize)
                        .max(2)
                        .min((segments as usize).saturating_sub(flash::FLASH_FREE_TARGET + 2)),
                };
                let (f, existing) = FlashTier::open(
                    FlashAt {
                        dir,
                        path: path.as_deref(),
                        tier: tiers.len(),
                    },
                    shape,
                    shift,
                    flash_base,
                    config.limits,
                )?;
                let f = f.with_write_rate(config.flash_write_rate);
                if existing {
                    let scan = flash::FlashScan {
                        index: &index,
                        meta: &meta,
                        saved: saved.as_ref(),
                        found: &mut found,
                        from_saved: &mut from_saved,
                        max_seq: &mut max_seq,
                        report: &mut report,
                        now,
                    };
                    flash::scan_flash(&f, scan, untrusted)?;
                    let records: Vec<_> = f.kills()?.into_iter().collect();
                    f.rebuild_sets(&records, |k| index.hash_key(k), untrusted)?;
                }
                Some(f)
            }
            None => None,
        };
        if let Some(dir) = &first_file_dir {
            snapshot::remove_leftovers(dir);
        }
        // Only now, with every untrusted tier wiped and flushed, may the mark name this
        // boot: a crash before this point leaves the old mark, and the next open wipes
        // again (before any write to the tiers, which come after this open).
        // A mark that already names this boot is left as it is (a synced rewrite costs a
        // restart within one boot a few milliseconds for nothing).
        if let (Some(dir), Some(boot)) = (boot_dir, &boot) {
            if bootmark::recorded(dir).as_deref() != Some(boot.as_str()) {
                bootmark::record(dir, boot)?;
            }
        }
        // Sequences continue above everything used before, DRAM segments included.
        let mut next_seq = max_seq + 1;
        let mut seq_bound = u64::MAX;
        if let Some((m, bound)) = mark.as_mut() {
            next_seq = next_seq.max(*bound).max(1);
            seq_bound = next_seq + seqmark::STEP;
            m.reserve(seq_bound)?;
        }
        // Only where the flash tier has pages for them.
        let sets_config =
            sets_config.filter(|_| flash.as_ref().is_some_and(|f| f.sets().is_some()));
        let mut cache = Cache {
            tiers,
            flash,
            meta,
            ghost: Ghost::new(expected_items / GHOST_ITEMS_PER_SLOT),
            movers,
            mover_delay: config.mover_delay,
            mover_threads: Mutex::new(Vec::new()),
            mover_counters: movers::MoverCounters::default(),
            index,
            stripes: (0..stripes).map(|_| Mutex::new(HashMap::new())).collect(),
            shift,
            limits: config.limits,
            next_seq: AtomicU64::new(next_seq),
            seq_bound: AtomicU64::new(seq_bound),
            seqmark: mark.map(|(m, _)| Mutex::new(m)),
            first_file_dir,
            clock_offset: AtomicI64::new(0),
            promote: config.promote,
            promotions: (0..promote::PROMOTION_SHARDS)
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
            replicas: replica::Replicas::new(),
            sets_config,
            counters: EngineCounters::default(),
        };
        if let Some(saved) = &saved {
            cache.forget_unrestored(saved, &from_saved, &mut report);
        }
        cache.index_found(found, &mut report)?;
        if let Some(f) = &cache.flash {
            cache.count_flash_items(f);
            f.compact_kills()?;
        }
        report.duration = started.elapsed();
        Ok((cache, report))
    }

    fn locate(&self, id: u32) -> Option<(usize, u32)> {
        self.tiers
            .iter()
            .enumerate()
            .rev()
            .find(|(_, t)| id >= t.base)
            .and_then(|(i, t)| (id - t.base < t.area.count()).then_some((i, id - t.base)))
    }

    fn pin(&self, id: u32) -> Option<(usize, Pin<'_>)> {
        let (t, slot) = self.locate(id)?;
        Some((t, self.tiers[t].area.pin(slot)?))
    }

    /// What the item at `loc` is read through, with its tier: its memory segment pinned,
    /// or a copy read from flash. `None` when the segment is not readable (freed, or the
    /// flash slot no longer holds the incarnation `loc` meant).
    fn hold(&self, loc: Location) -> Option<(usize, Held<'_>)> {
        if self.flash_slot(loc.segment).is_some() {
            return Some((self.tiers.len(), Held::Copy(self.read_flash(loc)?)));
        }
        let (t, pin) = self.pin(loc.segment)?;
        Some((t, Held::Pin(pin)))
    }

    /// Seconds since the Unix epoch, plus any [`advance_clock`](Self::advance_clock).
    pub fn now(&self) -> u32 {
        (system_now() + self.clock_offset.load(Ordering::Relaxed)).clamp(0, u32::MAX as i64) as u32
    }

    /// Moves the cache's clock forward (tests and simulations of TTL expiry).
    pub fn advance_clock(&self, secs: i64) {
        self.clock_offset.fetch_add(secs, Ordering::Relaxed);
    }

    /// When the item `item` of segment `id` stops being served (0: never): its own
    /// expiry, or, for an item without one (written by a version-1 build), its segment's.
    fn item_expiry(&self, id: u32, item: &ItemRef<'_>) -> u32 {
        if item.expires_at != 0 {
            item.expires_at
        } else {
            self.meta[id as usize].expires_at.load(Ordering::Acquire)
        }
    }

    /// Whether the item `item` of segment `id` has expired at `now`.
    fn item_expired(&self, id: u32, item: &ItemRef<'_>, now: u32) -> bool {
        past(self.item_expiry(id, item), now)
    }

    /// Whether every item of segment `id` has expired at `now` (a segment's expiry is
    /// never earlier than its items').
    fn expired(&self, id: u32, now: u32) -> bool {
        past(
            self.meta[id as usize].expires_at.load(Ordering::Acquire),
            now,
        )
    }

    /// Removes the key's entry at `loc` under its bucket lock `g`, then flips the item
    /// DEAD (persisted): a delete.
    fn unlink(&self, g: &mut BucketGuard<'_>, loc: Location) -> Result<(), CacheError> {
        g.remove(loc);
        self.kill_at(loc)
    }

    /// Flips the item at `loc` DEAD (persisted) through `pin`, a pin of `loc.segment`,
    /// and counts its bytes as dead in its segment (for the choice of segments to clean).
    fn kill(&self, pin: &Pin<'_>, loc: Location) -> Result<(), terrace_media::MediaError> {
        if let Some(len) = pin.kill(loc.offset)? {
            if let Some(m) = self.meta.get(loc.segment as usize) {
                m.dead_bytes.fetch_add(len, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn cas_of(&self, id: u32, item: &ItemRef<'_>) -> u64 {
        item.origin_cas.unwrap_or_else(|| {
            (self.meta[id as usize].write_seq.load(Ordering::Acquire) << self.shift)
                | u64::from(item.offset)
        })
    }

    fn check_key(&self, key: &[u8]) -> Result<(), CacheError> {
        self.limits.check(key.len(), 0)?;
        Ok(())
    }

    /// Looks `key` up. A hit pins the item's segment for as long as the [`Guard`] lives
    /// and raises the entry's frequency (one `fetch_or`, no lock). Expired items are
    /// misses (lazy expiry).
    pub fn get(&self, key: &[u8]) -> Result<Option<Guard<'_>>, CacheError> {
        self.check_key(key)?;
        let found = self.lookup(key, Access::Read);
        match &found {
            Some(g) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                let tier = match (self.tiers.get(g.tier), &self.flash) {
                    (Some(t), _) => &t.counters,
                    (None, Some(f)) => &f.stats,
                    (None, None) => return Ok(found),
                };
                tier.hits.fetch_add(1, Ordering::Relaxed);
            }
            None => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(found)
    }

    /// Looks `key` up without counting a hit or a miss and without raising the entry's
    /// frequency: for a server's own reads around a client's command (its CAS, size or
    /// remaining TTL), which are not gets and must not steer eviction.
    pub fn peek(&self, key: &[u8]) -> Result<Option<Guard<'_>>, CacheError> {
        self.check_key(key)?;
        Ok(self.lookup(key, Access::Peek))
    }

    /// Looks several keys up (memcached's multi-key get); one guard per hit.
    pub fn get_many<'k>(
        &self,
        keys: impl IntoIterator<Item = &'k [u8]>,
    ) -> Result<Vec<Option<Guard<'_>>>, CacheError> {
        keys.into_iter().map(|k| self.get(k)).collect()
    }

    /// A copy of the value, its client flags and CAS.
    pub fn get_copy(&self, key: &[u8]) -> Result<Option<(Vec<u8>, u32, u64)>, CacheError> {
        Ok(self
            .get(key)?
            .map(|g| (g.value().to_vec(), g.client_flags(), g.cas())))
    }

    fn lookup(&self, key: &[u8], access: Access) -> Option<Guard<'_>> {
        let hash = self.index.hash_key(key);
        let now = self.now();
        'retry: for _ in 0..64 {
            for hit in self.index.lookup(hash) {
                let loc = hit.location();
                let Some((tier, held)) = self.hold(loc) else {
                    if hit.is_current() {
                        continue;
                    }
                    continue 'retry;
                };
                // E1 after the pin: the entry is still there, so its segment was not freed
                // (on flash: the read was of the incarnation the entry meant).
                if !hit.is_current() {
                    // Replaced in place since the load (replace reuses the slot, so the
                    // new entry may be behind us): look again.
                    continue 'retry;
                }
                let Some(item) = held.item_at(loc.offset) else {
                    continue;
                };
                if item.key != key {
                    continue;
                }
                if item.state != ItemState::Live {
                    // E4: a current entry never points at a non-LIVE item, so a writer
                    // replaced the entry after our load: look again.
                    continue 'retry;
                }
                let expires_at = self.item_expiry(loc.segment, &item);
                if past(expires_at, now) {
                    self.counters.expired.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if access == Access::Read {
                    self.consider_promotion(tier, hit.frequency(), hash, loc);
                    hit.touch();
                }
                let (end, client_flags, cas) = (
                    item.end(),
                    item.client_flags,
                    self.cas_of(loc.segment, &item),
                );
                return Some(Guard {
                    held,
                    segment: loc.segment,
                    offset: loc.offset,
                    end,
                    client_flags,
                    cas,
                    tier,
                    expires_at,
                    read_before: hit.reads() > 0,
                });
            }
            return self.lookup_set(key, hash, now, access);
        }
        None
    }

    /// A lookup that missed the index: the key's copy in its flash set, if any; a client's
    /// read promotes it into the first tier (leaving the set copy, of the same version).
    fn lookup_set(&self, key: &[u8], hash: u64, now: u32, access: Access) -> Option<Guard<'_>> {
        self.sets_config?;
        let (set, copy) = self.set_item(key, hash, now)?;
        let i = copy.item();
        let (client_flags, cas, expires_at, end) = (
            i.client_flags,
            i.origin_cas.unwrap_or(0),
            i.expires_at,
            i.end(),
        );
        if access == Access::Read {
            if let Some(s) = self.flash.as_ref().and_then(|f| f.sets()) {
                s.counters.hits.fetch_add(1, Ordering::Relaxed);
            }
            let promoted = self.write_as(
                key,
                &[i.value],
                client_flags,
                expires_at,
                Version::FromSet(cas),
                Expect::Absent,
            );
            if promoted.is_err() {
                self.counters.persist_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        Some(Guard {
            held: Held::Copy(copy),
            segment: sets::SET_SEGMENT,
            offset: set,
            end,
            client_flags,
            cas,
            tier: self.tiers.len(),
            expires_at,
            read_before: true,
        })
    }

    /// The key's live, unexpired item, under its bucket lock; also any expired or other
    /// entry of the key (to be replaced); without an entry, its copy in a flash set.
    fn find_locked(&self, guard: &BucketGuard<'_>, key: &[u8], hash: u64, now: u32) -> FoundEntry {
        match self.find_indexed(guard, key, now) {
            FoundEntry::None => self.set_entry(key, hash, now),
            found => found,
        }
    }

    /// [`find_locked`](Self::find_locked) among the index's entries only.
    fn find_indexed(&self, guard: &BucketGuard<'_>, key: &[u8], now: u32) -> FoundEntry {
        for loc in guard.candidates() {
            let Some((_, held)) = self.hold(loc) else {
                if self.flash_slot(loc.segment).is_some() {
                    // Under the bucket lock the entry cannot move, so only a failing
                    // medium makes a flash read fail: taken as this key's item, to be
                    // replaced, rather than risk a second entry for the key (at worst
                    // another key becomes a miss).
                    return FoundEntry::Stale(loc);
                }
                continue;
            };
            let Some(item) = held.item_at(loc.offset) else {
                continue;
            };
            if item.key != key {
                continue;
            }
            let expires_at = self.item_expiry(loc.segment, &item);
            if item.state == ItemState::Live && !past(expires_at, now) {
                return FoundEntry::Live(Current {
                    loc,
                    cas: self.cas_of(loc.segment, &item),
                    client_flags: item.client_flags,
                    expires_at,
                });
            }
            return FoundEntry::Stale(loc);
        }
        FoundEntry::None
    }

    /// The key's current item (for read-modify-write operations), without touching it.
    fn current(&self, key: &[u8]) -> Option<(Current, Vec<u8>)> {
        let g = self.lookup(key, Access::Peek)?;
        let cur = Current {
            loc: Location {
                segment: g.segment,
                offset: g.offset,
            },
            cas: g.cas,
            client_flags: g.client_flags,
            expires_at: g.expires_at,
        };
        Some((cur, g.value().to_vec()))
    }

    /// Absolute expiry of a TTL in seconds (0 = never).
    fn expiry(&self, ttl_secs: u32) -> u32 {
        if ttl_secs == 0 {
            0
        } else {
            self.now().saturating_add(ttl_secs)
        }
    }

    /// Stores `key` → `value`; returns the new CAS. `ttl_secs` 0 = never expires.
    pub fn set(
        &self,
        key: &[u8],
        value: &[u8],
        client_flags: u32,
        ttl_secs: u32,
    ) -> Result<u64, CacheError> {
        match self.write(
            key,
            &[value],
            client_flags,
            self.expiry(ttl_secs),
            Expect::Any,
        )? {
            Store::Stored { cas } => Ok(cas),
            _ => Ok(0),
        }
    }

    /// Stores only if the key is absent.
    pub fn add(
        &self,
        key: &[u8],
        value: &[u8],
        client_flags: u32,
        ttl_secs: u32,
    ) -> Result<Store, CacheError> {
        self.write(
            key,
            &[value],
            client_flags,
            self.expiry(ttl_secs),
            Expect::Absent,
        )
    }

    /// Stores only if the key is present.
    pub fn replace(
        &self,
        key: &[u8],
        value: &[u8],
        client_flags: u32,
        ttl_secs: u32,
    ) -> Result<Store, CacheError> {
        self.store_over(
            key,
            value,
            client_flags,
            ttl_secs,
            |_| None,
            Store::NotStored,
        )
    }

    /// Stores only if the key's CAS is `cas`.
    pub fn cas(
        &self,
        key: &[u8],
        value: &[u8],
        client_flags: u32,
        ttl_secs: u32,
        cas: u64,
    ) -> Result<Store, CacheError> {
        let refuse = |cur: &Current| (cur.cas != cas).then_some(Store::Exists);
        self.store_over(key, value, client_flags, ttl_secs, refuse, Store::NotFound)
    }

    /// Replaces the key's current item if it exists (else `absent`) and `refuse` does not
    /// object to it; retries while another writer replaces the item in between (the write
    /// publishes only over the exact item that was read).
    fn store_over(
        &self,
        key: &[u8],
        value: &[u8],
        client_flags: u32,
        ttl_secs: u32,
        refuse: impl Fn(&Current) -> Option<Store>,
        absent: Store,
    ) -> Result<Store, CacheError> {
        self.check_key(key)?;
        loop {
            let Some((cur, _)) = self.current(key) else {
                return Ok(absent);
            };
            if let Some(answer) = refuse(&cur) {
                return Ok(answer);
            }
            let r = self.write(
                key,
                &[value],
                client_flags,
                self.expiry(ttl_secs),
                Expect::At(cur.loc),
            )?;
            if r != Store::NotStored {
                return Ok(r);
            }
        }
    }

    /// Appends `data` to the key's value (flags and expiry kept).
    pub fn append(&self, key: &[u8], data: &[u8]) -> Result<Store, CacheError> {
        self.concat(key, data, Side::Back, None)
    }

    /// Prepends `data` to the key's value (flags and expiry kept).
    pub fn prepend(&self, key: &[u8], data: &[u8]) -> Result<Store, CacheError> {
        self.concat(key, data, Side::Front, None)
    }

    /// Adds `data` to the key's value at `side` (`append` or `prepend`); with `if_cas`,
    /// only to the item of that CAS ([`Store::Exists`] otherwise). A missing key is
    /// [`Store::NotStored`].
    pub fn concat(
        &self,
        key: &[u8],
        data: &[u8],
        side: Side,
        if_cas: Option<u64>,
    ) -> Result<Store, CacheError> {
        self.check_key(key)?;
        loop {
            let Some((cur, value)) = self.current(key) else {
                return Ok(Store::NotStored);
            };
            if if_cas.is_some_and(|want| want != cur.cas) {
                return Ok(Store::Exists);
            }
            let parts: [&[u8]; 2] = match side {
                Side::Front => [data, &value],
                Side::Back => [&value, data],
            };
            let r = self.write(
                key,
                &parts,
                cur.client_flags,
                cur.expires_at,
                Expect::At(cur.loc),
            )?;
            if r != Store::NotStored {
                return Ok(r);
            }
        }
    }

    /// Adds `delta` to a decimal value (wrapping at 2^64, as memcached); `None` on a miss.
    pub fn incr(&self, key: &[u8], delta: u64) -> Result<Option<u64>, CacheError> {
        Ok(match self.arith(key, delta, Delta::Incr, None)? {
            Checked::Done((value, _)) => Some(value),
            _ => None,
        })
    }

    /// Subtracts `delta` from a decimal value (stopping at 0, as memcached).
    pub fn decr(&self, key: &[u8], delta: u64) -> Result<Option<u64>, CacheError> {
        Ok(match self.arith(key, delta, Delta::Decr, None)? {
            Checked::Done((value, _)) => Some(value),
            _ => None,
        })
    }

    /// Moves a decimal value by `delta` the `way` [`incr`](Self::incr) or
    /// [`decr`](Self::decr) does; with `if_cas`, only the item of that CAS. Returns the new
    /// value and the new item's CAS. The number is read and written back as memcached
    /// does (`cache/number.rs`): a new number not longer than the old value is padded
    /// with spaces to its length.
    pub fn arith(
        &self,
        key: &[u8],
        delta: u64,
        way: Delta,
        if_cas: Option<u64>,
    ) -> Result<Checked<(u64, u64)>, CacheError> {
        let op = |v: u64| match way {
            Delta::Incr => v.wrapping_add(delta),
            Delta::Decr => v.saturating_sub(delta),
        };
        self.check_key(key)?;
        loop {
            let Some((cur, value)) = self.current(key) else {
                return Ok(Checked::NotFound);
            };
            if if_cas.is_some_and(|want| want != cur.cas) {
                return Ok(Checked::Exists);
            }
            let n = number::strtoull(&value).ok_or(CacheError::NotANumber)?;
            let next = op(n);
            let text = number::rewrite(next, value.len());
            match self.write(
                key,
                &[&text],
                cur.client_flags,
                cur.expires_at,
                Expect::At(cur.loc),
            )? {
                Store::NotStored => {}
                Store::Stored { cas } => return Ok(Checked::Done((next, cas))),
                _ => return Ok(Checked::Done((next, 0))),
            }
        }
    }

    /// Gives the key a new TTL (re-appends it to a segment of the new TTL bucket; the
    /// item keeps its CAS, as memcached's does). Returns whether the key was there.
    pub fn touch(&self, key: &[u8], ttl_secs: u32) -> Result<bool, CacheError> {
        self.check_key(key)?;
        loop {
            let Some((cur, value)) = self.current(key) else {
                return Ok(false);
            };
            // The new item keeps the CAS (as memcached's touch does): it is the same
            // version of the key, with a new expiry.
            let r = self.write_as(
                key,
                &[&value],
                cur.client_flags,
                self.expiry(ttl_secs),
                Version::Touched(cur.cas),
                Expect::At(cur.loc),
            )?;
            if r != Store::NotStored {
                return Ok(true);
            }
        }
    }

    /// Deletes `key`; returns whether a live item was there. The item is DEAD on media
    /// (persisted) before this returns.
    pub fn delete(&self, key: &[u8]) -> Result<bool, CacheError> {
        Ok(self.delete_checked(key, None)? == Checked::Done(()))
    }

    /// Deletes `key` as [`delete`](Self::delete) does; with `if_cas`, only the item of
    /// that CAS (compared under the key's bucket lock).
    pub fn delete_checked(
        &self,
        key: &[u8],
        if_cas: Option<u64>,
    ) -> Result<Checked<()>, CacheError> {
        self.check_key(key)?;
        let hash = self.index.hash_key(key);
        let now = self.now();
        let mut g = self.index.lock(hash);
        let (loc, was_live) = match self.find_locked(&g, key, hash, now) {
            FoundEntry::Live(cur) if if_cas.is_some_and(|want| want != cur.cas) => {
                return Ok(Checked::Exists)
            }
            FoundEntry::Live(cur) => (cur.loc, true),
            FoundEntry::Stale(loc) => (loc, false),
            FoundEntry::None => return Ok(Checked::NotFound),
        };
        self.unlink(&mut g, loc)?;
        self.kill_flash_copies(hash)?;
        drop(g);
        if !was_live {
            return Ok(Checked::NotFound);
        }
        self.counters.deletes.fetch_add(1, Ordering::Relaxed);
        Ok(Checked::Done(()))
    }

    /// Removes every item: each is flipped DEAD (persisted) and its entry removed, one
    /// index bucket at a time. Writes that race with it may survive it.
    pub fn flush_all(&self) {
        self.index.sweep(0..self.index.bucket_count(), |loc, _| {
            if self.kill_at(loc).is_err() {
                self.counters.persist_errors.fetch_add(1, Ordering::Relaxed);
            }
            crate::index::Sweep::Remove
        });
        if self.kill_all_replicas().is_err() {
            self.counters.persist_errors.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(f) = &self.flash {
            if f.drop_sets().is_err() {
                self.counters.persist_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The write path (commit protocol steps 1–5): append a PENDING item to tier 0,
    /// then under the key's bucket lock check `expect`, kill the old item, make the new
    /// one LIVE and publish it. `NotStored` when `expect` failed.
    fn write(
        &self,
        key: &[u8],
        value: &[&[u8]],
        client_flags: u32,
        expires_at: u32,
        expect: Expect,
    ) -> Result<Store, CacheError> {
        self.write_as(key, value, client_flags, expires_at, Version::New, expect)
    }

    /// [`write`](Self::write) of a `version` of the key: a new one (its CAS is where it
    /// lands), or one that keeps an earlier CAS (a touch; a promotion out of a flash set,
    /// which leaves the set copy in place and looks past it for `expect`).
    fn write_as(
        &self,
        key: &[u8],
        value: &[&[u8]],
        client_flags: u32,
        expires_at: u32,
        version: Version,
        expect: Expect,
    ) -> Result<Store, CacheError> {
        let origin_cas = match version {
            Version::New => None,
            Version::Touched(cas) | Version::FromSet(cas) => Some(cas),
        };
        let value_len: usize = value.iter().map(|v| v.len()).sum();
        self.limits.check(key.len(), value_len)?;
        let spec = ItemSpec {
            client_flags,
            expires_at,
            origin_cas,
            ..ItemSpec::new(key, value_len)
        };
        let capacity = (1u32 << self.shift) - HEADER_LEN as u32;
        if spec.encoded_len() > capacity as usize {
            return Err(CacheError::TooLarge {
                need: spec.encoded_len(),
                capacity,
            });
        }
        let now = self.now();
        let hash = self.index.hash_key(key);
        if past(expires_at, now) {
            // Already expired (memcached: a negative TTL; or an append, incr or touch
            // that kept an expiry which has just passed): the store deletes what it would
            // have replaced — only if `expect` still holds, under the key's lock, so that
            // a newer write that slipped in is never deleted by an older one.
            let mut g = self.index.lock(hash);
            let found = self.find_locked(&g, key, hash, now);
            if !expect.met_by(found) {
                return Ok(Store::NotStored);
            }
            if let FoundEntry::Live(Current { loc, .. }) | FoundEntry::Stale(loc) = found {
                self.unlink(&mut g, loc)?;
            }
            self.kill_flash_copies(hash)?;
            return Ok(Store::Stored { cas: 0 });
        }
        loop {
            let (pin, new) = self.append_new(&spec, key, value, expires_at, now)?;
            let mut g = self.index.lock(hash);
            // A promotion out of a set looks past the copy it promotes.
            let found = match version {
                Version::FromSet(_) => self.find_indexed(&g, key, now),
                _ => self.find_locked(&g, key, hash, now),
            };
            if !expect.met_by(found) {
                self.kill(&pin, new)?;
                return Ok(Store::NotStored);
            }
            if !matches!(pin.state(), SegState::Open | SegState::Sealed) {
                // E3: the segment is being evicted; write the item again elsewhere.
                self.kill(&pin, new)?;
                continue;
            }
            // A copy in a flash set has no entry to repoint: the new item is inserted,
            // and the set copy killed below.
            let old = match found {
                FoundEntry::Live(cur) => Some(cur.loc),
                FoundEntry::Stale(loc) => Some(loc),
                FoundEntry::None => None,
            }
            .filter(|l| l.segment != sets::SET_SEGMENT);
            // E4: LIVE, then publish, then kill the old item — so that a current entry
            // never points at a DEAD item and readers never see a hole. A crash between
            // the two flips leaves two LIVE items of the key, which the restart scan
            // drops both of (a miss; the write was not acknowledged). The policy counts
            // an overwrite as an access of the key, and marks a new key the ghost filter
            // recalls so that its probation stage passes it on (see `cache/evict.rs`).
            pin.set_state(new.offset, ItemState::Live)?;
            let published = match old {
                Some(old) => g.repoint(old, new, Freq::Bump),
                None => {
                    let inserted = self.insert_evicting(&mut g, new)?;
                    if inserted && self.ghost.recalls(hash) {
                        g.mark_recalled(new);
                    }
                    inserted
                }
            };
            if let Some(old) = old {
                self.kill_at(old)?;
            }
            if !matches!(version, Version::FromSet(_)) {
                self.kill_flash_copies(hash)?;
            }
            if !published {
                self.kill(&pin, new)?;
            }
            drop(g);
            self.counters.sets.fetch_add(1, Ordering::Relaxed);
            let cas = origin_cas.unwrap_or_else(|| {
                (self.meta[new.segment as usize]
                    .write_seq
                    .load(Ordering::Acquire)
                    << self.shift)
                    | u64::from(new.offset)
            });
            return Ok(Store::Stored { cas });
        }
    }

    /// Inserts a new entry; when both buckets are full, evicts the least-hit occupant
    /// (flipped DEAD first, as a delete) and retries once.
    fn insert_evicting(&self, g: &mut BucketGuard<'_>, new: Location) -> Result<bool, CacheError> {
        if g.insert(new).is_ok() {
            return Ok(true);
        }
        let victim = g.occupants().min_by_key(|&(l, f)| (f, l.segment));
        let Some((victim, _)) = victim else {
            return Ok(false);
        };
        g.remove_occupant(victim);
        self.kill_at(victim)?;
        self.counters
            .index_evictions
            .fetch_add(1, Ordering::Relaxed);
        Ok(g.insert(new).is_ok())
    }

    /// A header for a segment opened now, with a fresh write sequence (reserving more in
    /// the mark file first when the sequence reaches the reserved bound).
    fn next_header(
        &self,
        tier: usize,
        slot: u32,
        expires_at: u32,
        bucket: u16,
        now: u32,
    ) -> Result<SegmentHeader, CacheError> {
        let write_seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        if write_seq >= self.seq_bound.load(Ordering::Acquire) {
            if let Some(mark) = &self.seqmark {
                let mut mark = mark.lock();
                if write_seq >= self.seq_bound.load(Ordering::Acquire) {
                    let bound = write_seq + seqmark::STEP;
                    mark.reserve(bound)?;
                    self.seq_bound.store(bound, Ordering::Release);
                }
            }
        }
        Ok(SegmentHeader {
            tier: tier as u8,
            size_shift: self.shift,
            // (Flash segments are always checksummed: a torn write must not scan clean.)
            checksummed: self.tiers.get(tier).is_none_or(|t| t.durable),
            write_seq,
            slot,
            created_at: now,
            expires_at,
            ttl_bucket: bucket,
        })
    }

    /// Opens a fresh segment of `tier` (allocating, evicting if need be).
    fn open_segment(
        &self,
        tier: usize,
        expires_at: u32,
        bucket: u16,
        now: u32,
    ) -> Result<Appender, CacheError> {
        self.open_segment_with(tier, expires_at, bucket, now, || {
            self.allocate(tier).map(Some)
        })?
        .ok_or(CacheError::NoSpace { tier })
    }

    /// Opens a fresh segment of `tier` in a slot from `slot` (`None`: no slot, no segment).
    fn open_segment_with(
        &self,
        tier: usize,
        expires_at: u32,
        bucket: u16,
        now: u32,
        slot: impl Fn() -> Result<Option<u32>, CacheError>,
    ) -> Result<Option<Appender>, CacheError> {
        loop {
            let Some(slot) = slot()? else {
                return Ok(None);
            };
            let header = match self.next_header(tier, slot, expires_at, bucket, now) {
                Ok(h) => h,
                Err(e) => {
                    self.tiers[tier].lists.lock().free.push(slot);
                    return Err(e);
                }
            };
            let m = &self.meta[(self.tiers[tier].base + slot) as usize];
            m.write_seq.store(header.write_seq, Ordering::Release);
            m.expires_at.store(expires_at, Ordering::Release);
            m.dead_bytes.store(0, Ordering::Relaxed);
            match self.tiers[tier].area.open(&header, self.limits) {
                Ok(Some(app)) => return Ok(Some(app)),
                // Pinned by readers backing off for too long: try another slot.
                Ok(None) => self.tiers[tier].lists.lock().free.push(slot),
                Err(OpenError::Encode(e)) => return Err(e.into()),
                Err(OpenError::Media(e, app)) => {
                    if let Some(app) = app {
                        self.seal(tier, app, Queue::Fifo);
                    }
                    return Err(e.into());
                }
            }
        }
    }

    /// Seals the fullest of `open`'s segments while it holds `cap` or more, so that one
    /// more may be opened: with many TTL buckets in use, open segments (one per bucket)
    /// would otherwise take every segment of the tier, and no write could find one.
    /// Expired ones go first: they take no more items.
    fn seal_fullest(
        &self,
        tier: usize,
        open: &mut HashMap<u16, Appender>,
        cap: usize,
        queue: Queue,
    ) {
        let now = self.now();
        while open.len() >= cap.max(1) {
            let Some(fullest) = open
                .iter()
                .min_by_key(|(_, app)| {
                    let e = app.header().expires_at;
                    (!past(e, now), app.remaining())
                })
                .map(|(&bucket, _)| bucket)
            else {
                return;
            };
            if let Some(app) = open.remove(&fullest) {
                self.seal(tier, app, queue);
            }
        }
    }

    /// Opens a new segment for `bucket` in `open` (a stripe's or a tier's movers' set, at
    /// most `cap` segments, sealed into `queue`): seals the bucket's current one, and the
    /// fullest while the set is at its cap (`seal_fullest`), then adds what `open_new`
    /// opens. Returns whether it opened one.
    fn replace_open(
        &self,
        tier: usize,
        open: &mut HashMap<u16, Appender>,
        bucket: u16,
        cap: usize,
        queue: Queue,
        open_new: impl FnOnce() -> Result<Option<Appender>, CacheError>,
    ) -> Result<bool, CacheError> {
        if let Some(old) = open.remove(&bucket) {
            self.seal(tier, old, queue);
        }
        self.seal_fullest(tier, open, cap, queue);
        let Some(app) = open_new()? else {
            return Ok(false);
        };
        open.insert(bucket, app);
        Ok(true)
    }

    /// Seals an open segment into one of its tier's queues (`cache/evict.rs`).
    fn seal(&self, tier: usize, app: Appender, queue: Queue) {
        let slot = app.seg();
        if self.tiers[tier].area.seal(app) {
            let mut lists = self.tiers[tier].lists.lock();
            match queue {
                Queue::Fifo => lists.fifo.push_back(slot),
                Queue::Main => lists.main.push_back(slot),
            }
        }
    }

    /// Appends a committed PENDING item to tier 0's open segment of this thread's stripe
    /// and TTL bucket; returns it pinned.
    fn append_new(
        &self,
        spec: &ItemSpec,
        key: &[u8],
        value: &[&[u8]],
        expires_at: u32,
        now: u32,
    ) -> Result<(Pin<'_>, Location), CacheError> {
        let stripe = STRIPE.with(|s| *s) % self.stripes.len();
        let mut open = self.stripes[stripe].lock();
        let tier = &self.tiers[0];
        let cap = open_segments_cap(tier.area.count(), WRITER_OPEN_SHARE, self.stripes.len());
        let bucket = match place(&open, spec.encoded_len(), expires_at, now, cap) {
            Placement::Append(bucket) => bucket,
            Placement::Open {
                bucket,
                expires_at: seg_expiry,
            } => {
                self.replace_open(0, &mut open, bucket, cap, Queue::Fifo, || {
                    self.open_segment(0, seg_expiry, bucket, now).map(Some)
                })?;
                bucket
            }
        };
        let app = open
            .get_mut(&bucket)
            .ok_or(CacheError::NoSpace { tier: 0 })?;
        let offset = match app.append(&tier.area, spec, key, value) {
            Ok(o) => o,
            Err(crate::mem::AppendError::Encode(e)) => return Err(e.into()),
            Err(crate::mem::AppendError::Media(e)) => return Err(e.into()),
        };
        let slot = app.seg();
        let pin = tier.area.pin(slot).ok_or(CacheError::NoSpace { tier: 0 })?;
        Ok((
            pin,
            Location {
                segment: tier.base + slot,
                offset,
            },
        ))
    }

    /// Counters and per-tier state.
    /// Each tier's shape and counters, without the sweeps [`Cache::stats`] makes for item
    /// counts and live and dead bytes (those read 0 here): cheap at any size.
    pub fn tier_overview(&self) -> Vec<TierStats> {
        let flash = self.flash.as_ref().map(|_| self.flash_tier_stats(0));
        self.tiers.iter().map(|t| t.stats()).chain(flash).collect()
    }

    pub fn stats(&self) -> Stats {
        let c = &self.counters;
        let mut tier_items = vec![0u64; self.levels()];
        self.index.for_each_location(|loc| {
            if let Some((t, _)) = self.locate(loc.segment) {
                tier_items[t] += 1;
            } else if self.flash_slot(loc.segment).is_some() {
                tier_items[self.tiers.len()] += 1;
            }
        });
        let flash_stats = self
            .flash
            .as_ref()
            .map(|_| self.flash_tier_stats(tier_items[self.tiers.len()]));
        let items = tier_items.iter().sum::<u64>() as usize;
        let mut stats = Stats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            sets: c.sets.load(Ordering::Relaxed),
            deletes: c.deletes.load(Ordering::Relaxed),
            expired: c.expired.load(Ordering::Relaxed),
            index_evictions: c.index_evictions.load(Ordering::Relaxed),
            demotions: c.demotions.load(Ordering::Relaxed),
            promotions: c.promotions.load(Ordering::Relaxed),
            reinsertions: self
                .tiers
                .iter()
                .map(|t| t.counters.reinserted.load(Ordering::Relaxed))
                .sum(),
            inline_evictions: self
                .tiers
                .iter()
                .map(|t| t.counters.inline_evictions.load(Ordering::Relaxed))
                .sum(),
            persist_errors: c.persist_errors.load(Ordering::Relaxed),
            background_evictions: self
                .tiers
                .iter()
                .map(|t| t.counters.background_evictions.load(Ordering::Relaxed))
                .sum(),
            mover_errors: self.mover_counters.errors.load(Ordering::Relaxed),
            movers: self.mover_stats(),
            index_bytes_per_item: (self.index.memory_bytes() + self.ghost.memory_bytes()) as f64
                / items.max(1) as f64,
            items,
            tiers: self
                .tiers
                .iter()
                .zip(tier_items)
                .map(|(t, items)| {
                    let mut st = t.stats();
                    st.items = items;
                    for slot in 0..t.area.count() {
                        if !matches!(t.area.state(slot), SegState::Open | SegState::Sealed) {
                            continue;
                        }
                        let Some(pin) = t.area.pin(slot) else {
                            continue;
                        };
                        let meta = &self.meta[(t.base + slot) as usize];
                        let dead = u64::from(meta.dead_bytes.load(Ordering::Relaxed));
                        let written = u64::from(pin.committed_end()) - HEADER_LEN as u64;
                        st.dead_bytes += dead;
                        st.live_bytes += written.saturating_sub(dead);
                    }
                    st
                })
                .chain(flash_stats)
                .collect(),
        };
        for f in stats.tiers.iter().skip(self.tiers.len()) {
            stats.reinsertions += f.reinserted;
            stats.background_evictions += f.background_evictions;
            stats.inline_evictions += f.inline_evictions;
        }
        stats
    }

    /// Segment size in bytes.
    pub fn segment_size(&self) -> usize {
        1 << self.shift
    }
}

#[derive(Clone, Copy)]
enum FoundEntry {
    Live(Current),
    /// An entry of the key whose item is expired or not LIVE (to be replaced).
    Stale(Location),
    None,
}

impl Drop for Cache {
    /// Seals open segments so their state is tidy; the bytes on file tiers are already
    /// committed (nothing is lost by not sealing: restart scans up to the commit word).
    /// Dropping is an unclean shutdown as far as restart goes: the next open scans. See
    /// [`Cache::shutdown`].
    fn drop(&mut self) {
        self.seal_all();
    }
}

impl Cache {
    fn seal_all(&self) {
        for stripe in self.stripes.iter() {
            for (_, app) in stripe.lock().drain() {
                self.tiers[0].area.seal(app);
            }
        }
        for t in &self.tiers {
            for lane in t.mover.iter().chain(t.reinsert.iter()) {
                for (_, app) in lane.lock().drain() {
                    t.area.seal(app);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_that_expired_on_the_way_deletes_only_what_it_read() {
        // An append, incr or touch reads the item, and its expiry passes before the write:
        // the write is a delete of the item read — not of a newer value written between.
        let (c, _) = Cache::open(CacheConfig {
            segment_shift: Some(15),
            limits: ItemLimits {
                max_key_len: 250,
                max_value_len: 8 << 10,
            },
            ..CacheConfig::new(vec![TierConfig::dram(crate::TierSize::Bytes(1 << 20))])
        })
        .unwrap();
        c.set(b"k", b"old", 0, 10).unwrap();
        let (read, _) = c.current(b"k").unwrap();
        c.set(b"k", b"newer", 0, 0).unwrap();
        let past = c.now() - 1;
        let r = c
            .write(b"k", &[b"old+"], 0, past, Expect::At(read.loc))
            .unwrap();
        assert_eq!(r, Store::NotStored);
        assert_eq!(c.get(b"k").unwrap().unwrap().value(), b"newer");
        // An add with a past expiry over a present key stores nothing, deletes nothing.
        let r = c.write(b"k", &[b"x"], 0, past, Expect::Absent).unwrap();
        assert_eq!(r, Store::NotStored);
        assert_eq!(c.get(b"k").unwrap().unwrap().value(), b"newer");
        // Over the item it read, it deletes it.
        let (read, _) = c.current(b"k").unwrap();
        let r = c
            .write(b"k", &[b"x"], 0, past, Expect::At(read.loc))
            .unwrap();
        assert!(matches!(r, Store::Stored { .. }));
        assert!(c.get(b"k").unwrap().is_none());
    }

    #[test]
    fn a_ttl_bucket_spans_at_most_an_eighth_of_its_lifetimes() {
        for ttl in [1u32, 2, 7, 8, 9, 15, 16, 100, 3600, 86_400, u32::MAX] {
            let (b, longest) = ttl_bucket(ttl);
            assert!(longest >= ttl, "{ttl}: {longest}");
            assert!(longest - ttl <= ttl / 8, "{ttl}: {longest}");
            assert_eq!(ttl_bucket(longest).0, b);
            if let Some(next) = longest.checked_add(1) {
                assert_ne!(ttl_bucket(next).0, b, "{ttl}");
            }
        }
        assert_eq!(ttl_bucket(0), (0, 0));
    }
}

//! Segment memory: the only module of the crate that touches mapped bytes through raw
//! pointers (crate-private: its safe functions rely on the engine's invariant 4 below).
//! A [`SegmentArea`] owns one `terrace_media::Region` cut into `2^shift`-byte segments,
//! and with it one control word per segment (its [`SegState`] and how many readers pin
//! it). Everything else reaches segment bytes through the four doors here:
//!
//! - [`SegmentArea::pin`] → [`Pin`]: read committed items ([`Pin::indexed_item`],
//!   [`Pin::items`]), flip item state bytes ([`Pin::set_state`], [`Pin::kill`], one
//!   atomic byte store or swap), retire the segment ([`Pin::retire`], one atomic store of
//!   the commit word);
//! - [`SegmentArea::open`] → [`Appender`]: the one writer of an open segment's tail;
//! - [`SegmentArea::exclusive`] (`&mut self`): the whole segment as a slice, for the
//!   single-threaded restart scan;
//! - control-word transitions ([`SegmentArea::seal`], [`begin_evict`], [`try_free`]).
//!
//! Invariants (what the `// SAFETY:` comments below rely on):
//! 1. A segment's bytes are rewritten only between `Free → Opening` and `Opening → Open`,
//!    and `Free → Opening` needs zero pins; a pin succeeds only in `Open`, `Sealed` or
//!    `Evicting`, and `→ Free` needs zero pins too. So the incarnation a pin sees cannot
//!    change while the pin lives.
//! 2. Inside an incarnation, the committed items' bytes never change except their state
//!    bytes, which are only ever accessed atomically (and the commit word, likewise).
//!    Item key/value slices handed out therefore alias no byte anybody writes.
//! 3. An `Open` segment has exactly one [`Appender`] (it is created by the `Free →
//!    Opening` compare-and-swap and consumed by [`SegmentArea::seal`]); only it writes past
//!    the committed end, and nobody reads there: readers stop at the commit word they
//!    loaded (`Acquire`, paired with the appender's `Release` store). Once the segment
//!    is no longer `Open`, nobody writes past any committed item, and readers may read
//!    to the segment's end whatever the commit word says (a retire zeroes it; see
//!    `Pin::readable_end`, which re-checks the state after loading the commit word).
//! 4. Offsets passed to [`Pin::indexed_item`] are item starts in the pinned incarnation:
//!    the walker steps from item to item from the header; the engine takes all others
//!    from index entries, which it only ever points at committed items and removes before
//!    a segment is freed (the engine's invariant, argued in `cache.rs`). Item headers are
//!    read with atomic byte loads, so even a wrong offset cannot race; only the key/value
//!    slices depend on this invariant.
//!
//! [`begin_evict`]: SegmentArea::begin_evict
//! [`try_free`]: SegmentArea::try_free

use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicU8, Ordering};

use terrace_media::{MediaError, Region};

use crate::error::EncodeError;
use crate::item::{self, ItemLimits, ItemRef, ItemSpec, ItemState, MAX_HEADER_LEN};
use crate::segment::{Commit, SegmentHeader, COMMIT_WORD_OFFSET, HEADER_LEN};

/// `len` `AtomicU64`s, all zero at first, in anonymous memory of their own on huge pages
/// where the kernel offers them: the DRAM index's table. Fresh anonymous memory reads as
/// zero with nothing written, so a table about to be loaded from a saved index is written
/// once, not zeroed first; and random lookups over hundreds of megabytes miss the TLB far
/// less on 2 MiB pages. Pages are committed on first touch.
pub struct AtomicTable {
    region: Region,
    len: usize,
}

impl AtomicTable {
    pub fn new(len: usize) -> Result<AtomicTable, MediaError> {
        let bytes = len.checked_mul(8).ok_or(MediaError::InvalidSize {
            size: usize::MAX,
            why: "larger than the address space",
        })?;
        let region = Region::dram(bytes.max(1), terrace_media::PageSize::Base)?;
        Ok(AtomicTable { region, len })
    }

    pub fn as_slice(&self) -> &[AtomicU64] {
        // SAFETY: the region is a live anonymous mapping of at least `len * 8` bytes
        // (checked at `new`), aligned to 2 MiB (so to 8), owned by `self` for the
        // lifetime of the borrow; anonymous memory starts zeroed, and zero (like any bit
        // pattern) is a valid `AtomicU64`; all access goes through atomics or `&mut`.
        unsafe { std::slice::from_raw_parts(self.region.base().as_ptr().cast(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [AtomicU64] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.region.base().as_ptr().cast(), self.len) }
    }
}

/// Lifecycle of a segment slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegState {
    /// Unused; may be opened.
    Free,
    /// Being given a new header by the thread that won it; unreadable.
    Opening,
    /// Appended to by its one [`Appender`]; readable up to the commit word.
    Open,
    /// Full or closed; read-only except for state bytes.
    Sealed,
    /// Being evicted: items are moved or dropped, then the segment is freed once unpinned.
    Evicting,
}

impl SegState {
    fn code(self) -> u64 {
        match self {
            SegState::Free => 0,
            SegState::Opening => 1,
            SegState::Open => 2,
            SegState::Sealed => 3,
            SegState::Evicting => 4,
        }
    }

    fn from_code(code: u64) -> SegState {
        match code {
            1 => SegState::Opening,
            2 => SegState::Open,
            3 => SegState::Sealed,
            4 => SegState::Evicting,
            _ => SegState::Free,
        }
    }

    fn readable(self) -> bool {
        matches!(self, SegState::Open | SegState::Sealed | SegState::Evicting)
    }
}

const PIN_MASK: u64 = (1 << 32) - 1;

fn control(state: SegState, pins: u64) -> u64 {
    (state.code() << 32) | pins
}

static NEXT_AREA_ID: AtomicU64 = AtomicU64::new(1);

/// One region cut into segments, with a control word per segment. See the module docs.
pub struct SegmentArea {
    region: Region,
    shift: u8,
    count: u32,
    control: Box<[AtomicU64]>,
    /// Per segment: whether it still shows a restored image ([`SegmentArea::map_image`]).
    imaged: Box<[AtomicBool]>,
    id: u64,
}

impl std::fmt::Debug for SegmentArea {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SegmentArea")
            .field("medium", &self.region.medium())
            .field("shift", &self.shift)
            .field("count", &self.count)
            .finish()
    }
}

impl SegmentArea {
    /// Cuts `region` into `region.len() >> shift` segments (at most `u32::MAX`), all
    /// `Free`. `None` when not even one segment fits.
    pub fn new(region: Region, shift: u8) -> Option<SegmentArea> {
        let count = u32::try_from(region.len() >> shift).ok()?;
        if count == 0 {
            return None;
        }
        Some(SegmentArea {
            control: (0..count).map(|_| AtomicU64::new(0)).collect(),
            imaged: (0..count).map(|_| AtomicBool::new(false)).collect(),
            region,
            shift,
            count,
            id: NEXT_AREA_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Bytes of one segment.
    pub fn segment_size(&self) -> usize {
        self.size()
    }

    fn size(&self) -> usize {
        1usize << self.shift
    }

    /// Start of segment `seg`; `seg < count` is checked by every caller.
    fn seg_ptr(&self, seg: u32) -> *mut u8 {
        debug_assert!(seg < self.count);
        // SAFETY: seg < count, so (seg << shift) + size <= region.len(): the offset stays
        // inside the live mapping the region owns.
        unsafe {
            self.region
                .base()
                .as_ptr()
                .add((seg as usize) << self.shift)
        }
    }

    fn ctl(&self, seg: u32) -> Option<&AtomicU64> {
        self.control.get(seg as usize)
    }

    pub fn state(&self, seg: u32) -> SegState {
        self.ctl(seg).map_or(SegState::Free, |c| {
            SegState::from_code(c.load(Ordering::Acquire) >> 32)
        })
    }

    /// Pins `seg` if it is readable. The `SeqCst` increment and fence order the pin before
    /// the caller's next loads (the engine re-checks its index entry after pinning).
    pub fn pin(&self, seg: u32) -> Option<Pin<'_>> {
        let ctl = self.ctl(seg)?;
        let before = ctl.fetch_add(1, Ordering::SeqCst);
        if !SegState::from_code(before >> 32).readable() {
            ctl.fetch_sub(1, Ordering::Release);
            return None;
        }
        fence(Ordering::SeqCst);
        Some(Pin { area: self, seg })
    }

    fn transition(&self, seg: u32, from: SegState, to: SegState) -> bool {
        let Some(ctl) = self.ctl(seg) else {
            return false;
        };
        ctl.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
            (w >> 32 == from.code()).then_some(control(to, w & PIN_MASK))
        })
        .is_ok()
    }

    /// `Sealed → Evicting`: the caller became the segment's one evictor.
    pub fn begin_evict(&self, seg: u32) -> bool {
        self.transition(seg, SegState::Sealed, SegState::Evicting)
    }

    /// `Evicting → Free`, only when no reader pins it.
    pub fn try_free(&self, seg: u32) -> bool {
        let Some(ctl) = self.ctl(seg) else {
            return false;
        };
        ctl.compare_exchange(
            control(SegState::Evicting, 0),
            control(SegState::Free, 0),
            Ordering::AcqRel,
            Ordering::Relaxed,
        )
        .is_ok()
    }

    /// Ends an appender's life: `Open → Sealed`.
    pub fn seal(&self, appender: Appender) -> bool {
        appender.area_id == self.id
            && self.transition(appender.seg, SegState::Open, SegState::Sealed)
    }

    /// Makes `[offset, offset + len)` of segment `seg` durable (see `Region::persist`).
    fn persist(&self, seg: u32, offset: usize, len: usize) -> Result<(), MediaError> {
        self.region
            .persist(((seg as usize) << self.shift) + offset, len)
    }

    /// Opens a `Free` segment for appending: writes and persists `header`, then makes the
    /// segment `Open`. `Ok(None)` when the segment is not free (or stays pinned by
    /// readers that are backing off).
    pub fn open(
        &self,
        header: &SegmentHeader,
        limits: ItemLimits,
    ) -> Result<Option<Appender>, OpenError> {
        let seg = header.slot;
        let Some(ctl) = self.ctl(seg) else {
            return Ok(None);
        };
        if header.size() != self.size() {
            return Err(OpenError::Encode(EncodeError::BufferSize {
                len: self.size(),
                expected: header.size(),
            }));
        }
        limits.validate()?;
        let bytes = header.encode()?;
        let free = control(SegState::Free, 0);
        let mut won = false;
        for _ in 0..1000 {
            match ctl.compare_exchange(
                free,
                control(SegState::Opening, 0),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    won = true;
                    break;
                }
                // A reader holding a stale index entry pins and unpins at once.
                Err(w) if w >> 32 == SegState::Free.code() => std::thread::yield_now(),
                Err(_) => return Ok(None),
            }
        }
        if !won {
            return Ok(None);
        }
        // A segment still showing a restored image is rewritten now: its image pages go,
        // so they do not stay in memory beside the new ones (a hint: on failure they only
        // stay until the tier is dropped).
        if self
            .imaged
            .get(seg as usize)
            .is_some_and(|i| i.swap(false, Ordering::Relaxed))
        {
            let _ = self
                .region
                .forget_image((seg as usize) << self.shift, self.size());
        }
        // SAFETY: the segment is `Opening` and this thread won it: no pin can succeed, no
        // appender exists (invariants 1 and 3), so nobody else reads or writes these 64
        // bytes, which lie inside the segment (seg < count, checked by `ctl`).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.seg_ptr(seg), HEADER_LEN);
        }
        let persisted = self.persist(seg, 0, HEADER_LEN);
        // Publish the new incarnation (Release: the header happens-before any pin).
        self.transition(seg, SegState::Opening, SegState::Open);
        if let Err(e) = persisted {
            // Leave it open but unused: the caller seals it (no items) and reports.
            return Err(OpenError::Media(e, Some(self.appender(header, limits))));
        }
        Ok(Some(self.appender(header, limits)))
    }

    fn appender(&self, header: &SegmentHeader, limits: ItemLimits) -> Appender {
        Appender {
            area_id: self.id,
            seg: header.slot,
            header: *header,
            limits,
            committed: 0,
            crc: if header.checksummed {
                crate::segment::data_crc_seed(header.write_seq)
            } else {
                0
            },
        }
    }

    /// The whole of segment `seg`, for the single-threaded restart scan: `&mut self`
    /// proves no pin, appender or guard exists.
    pub fn exclusive(&mut self, seg: u32) -> Option<&mut [u8]> {
        if seg >= self.count {
            return None;
        }
        // SAFETY: seg < count, so the range is inside the mapping; `&mut self` means no
        // `Pin` (which borrows `&self`) exists and no other slice of this area is live.
        Some(unsafe { std::slice::from_raw_parts_mut(self.seg_ptr(seg), self.size()) })
    }

    /// Starts reading `len` bytes of segment `seg` from `offset` into memory, where the
    /// tier is a file read through the page cache (see `Region::will_need`); a hint.
    pub fn will_need(&self, seg: u32, offset: usize, len: usize) {
        if seg < self.count && self.region.is_page_cached() {
            let at = ((seg as usize) << self.shift) + offset;
            self.region
                .will_need(at, len.min(self.size().saturating_sub(offset)));
        }
    }

    /// Shows segments `slots` of `file` as this (volatile, anonymous) area's, read in
    /// place (`Region::map_image`): segment `slot` is the file's bytes at `slot << shift`;
    /// other segments stay as they are. Each gives its image pages back when it is next
    /// opened for writing. Segments must be whole pages. At restart only (`&mut self`).
    pub fn map_image(&mut self, file: std::fs::File, slots: &[u32]) -> Result<(), MediaError> {
        // Runs of consecutive slots, each mapped once; the slots between stay anonymous.
        let mut sorted: Vec<u32> = slots.iter().copied().filter(|&s| s < self.count).collect();
        sorted.sort_unstable();
        let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
        for slot in sorted {
            let start = (slot as usize) << self.shift;
            match ranges.last_mut() {
                Some(last) if last.end == start => last.end += self.size(),
                _ => ranges.push(start..start + self.size()),
            }
        }
        self.region.map_image(file, &ranges)?;
        for &slot in slots {
            if let Some(i) = self.imaged.get(slot as usize) {
                i.store(true, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Undoes [`map_image`](Self::map_image): the area is fresh zeroed memory again.
    pub fn drop_image(&mut self) -> Result<(), MediaError> {
        for i in self.imaged.iter() {
            i.store(false, Ordering::Relaxed);
        }
        self.region.drop_image()
    }

    /// Every segment, each as its own slice, in slot order: for restart work spread over
    /// threads (each slice to one thread). `&mut self`, as for [`exclusive`](Self::exclusive).
    pub fn all_exclusive(&mut self) -> Vec<&mut [u8]> {
        let len = (self.count as usize) << self.shift;
        if self.count == 0 {
            return Vec::new();
        }
        // SAFETY: `count << shift` bytes from the base lie inside the live mapping the
        // region owns (`new` cut `count` whole segments out of it); `&mut self` means no
        // `Pin` (which borrows `&self`) exists and no other slice of this area is live.
        let all = unsafe { std::slice::from_raw_parts_mut(self.seg_ptr(0), len) };
        all.chunks_mut(self.size()).collect()
    }

    /// Zeroes segment `seg`'s header during restart, so that no scan finds its items;
    /// returns whether it held anything (false also for a slot out of range).
    pub fn clear_header(&mut self, seg: u32) -> bool {
        let Some(bytes) = self.exclusive(seg) else {
            return false;
        };
        let header = &mut bytes[..crate::segment::HEADER_LEN];
        let written = header.iter().any(|&b| b != 0);
        header.fill(0);
        written
    }

    /// Sets a segment's state during restart (no pins can exist under `&mut self`).
    pub fn set_state_exclusive(&mut self, seg: u32, state: SegState) {
        if let Some(ctl) = self.ctl(seg) {
            ctl.store(control(state, 0), Ordering::Release);
        }
    }

    /// Persists the bytes of segment `seg` that a restart scan changed through
    /// [`exclusive`](Self::exclusive).
    pub fn persist_exclusive(
        &mut self,
        seg: u32,
        offset: usize,
        len: usize,
    ) -> Result<(), MediaError> {
        self.persist(seg, offset, len)
    }
}

/// Why a segment could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Encode(#[from] EncodeError),
    /// The header was written but could not be persisted; the appender is handed back so
    /// the caller can seal the (empty) segment.
    #[error("persisting a segment header: {0}")]
    Media(MediaError, Option<Appender>),
}

/// A reader's hold on one segment incarnation: while it lives the segment is not reused
/// (invariant 1). Unpins on drop.
pub struct Pin<'a> {
    area: &'a SegmentArea,
    seg: u32,
}

impl std::fmt::Debug for Pin<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pin").field("seg", &self.seg).finish()
    }
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        if let Some(ctl) = self.area.ctl(self.seg) {
            ctl.fetch_sub(1, Ordering::Release);
        }
    }
}

impl<'a> Pin<'a> {
    pub fn state(&self) -> SegState {
        self.area.state(self.seg)
    }

    fn commit_word(&self) -> &AtomicU64 {
        // SAFETY: the commit word is 8 bytes at offset 56 of the segment, inside the
        // mapping; segments start on a 2^shift >= 256-byte boundary of a 2 MiB-aligned
        // base, so it is 8-byte aligned. It is only ever accessed atomically while the
        // segment is readable (the opener's plain write happens-before any pin).
        unsafe { AtomicU64::from_ptr(self.area.seg_ptr(self.seg).add(COMMIT_WORD_OFFSET).cast()) }
    }

    fn load_commit(&self) -> Commit {
        Commit::from_word(u64::from_le(self.commit_word().load(Ordering::Acquire)))
    }

    /// Offset just past the last committed item (as of now).
    pub fn committed_end(&self) -> u32 {
        let max = (self.area.size() - HEADER_LEN) as u32;
        HEADER_LEN as u32 + self.load_commit().committed.min(max)
    }

    /// How far items may be read: the commit word in an open segment (its appender writes
    /// beyond it), else the end of the segment (nobody writes item bytes any more).
    ///
    /// The state is loaded again after the commit word: between the two loads the segment
    /// may have been sealed, evicted and retired (a retire zeroes the commit word), and a
    /// commit word read then would cut a pinned item off. If it is still `Open` after the
    /// load, it was `Open` throughout (it cannot be reopened while pinned), so the commit
    /// word was not retired.
    fn readable_end(&self, end: u32) -> u32 {
        if self.state() == SegState::Open {
            let committed = self.committed_end();
            if self.state() == SegState::Open {
                return end.min(committed);
            }
        }
        end.min(self.area.size() as u32)
    }

    fn byte(&self, offset: usize) -> &AtomicU8 {
        debug_assert!(offset < self.area.size());
        // SAFETY: offset < segment size (checked by callers), so the byte is inside the
        // mapping; a byte has no alignment requirement; item bytes that change (state
        // bytes) are only ever accessed atomically (invariant 2).
        unsafe { AtomicU8::from_ptr(self.area.seg_ptr(self.seg).add(offset)) }
    }

    /// The committed item at `offset` (an item start, invariant 4), bounded by the
    /// committed end. Its key and value borrow the pin. (The engine reads through
    /// [`indexed_item`](Self::indexed_item).)
    #[cfg(test)]
    pub fn item(&self, offset: u32) -> Result<ItemRef<'_>, crate::ItemError> {
        self.item_within(offset, self.committed_end())
    }

    /// The item an index entry points at: bounded by the commit word while the segment
    /// is open, by the segment's end after (see [`readable_end`](Self::readable_end)),
    /// whatever the commit word says. A durable segment is retired — its commit word
    /// zeroed — *before* its eviction walk, and the items the index still points at must
    /// stay readable until the walk has moved or dropped them: a writer that could not
    /// read the key's current item would publish a second one beside it.
    pub fn indexed_item(&self, offset: u32) -> Result<ItemRef<'_>, crate::ItemError> {
        self.item_within(offset, u32::MAX)
    }

    /// Like [`indexed_item`](Self::indexed_item), bounded by `end` as well
    /// (a guard re-reads its item after the segment may have been retired).
    pub fn item_within(&self, offset: u32, end: u32) -> Result<ItemRef<'_>, crate::ItemError> {
        let end = self.readable_end(end) as usize;
        let start = offset as usize;
        let overrun = |len: u64| crate::ItemError::Overrun { len, end };
        if start < HEADER_LEN || start >= end {
            return Err(overrun(1));
        }
        let mut head = [0u8; MAX_HEADER_LEN];
        let n = MAX_HEADER_LEN.min(end - start);
        for (i, b) in head[..n].iter_mut().enumerate() {
            *b = self.byte(start + i).load(Ordering::Relaxed);
        }
        let h = item::decode_header(&head[..n]).map_err(|e| match e {
            crate::ItemError::Overrun { len, .. } => overrun(len),
            e => e,
        })?;
        let total = h.total_len();
        if total > (end - start) as u64 {
            return Err(overrun(total));
        }
        let (key_range, value_range) = h.key_value_ranges(start);
        // SAFETY: [key_range.start, start + total) lies inside the segment (checked against `end`
        // <= size). These are the key and value bytes of a committed item of this pinned
        // incarnation: written before the commit word / index entry we loaded with Acquire,
        // never written again while the pin lives (invariants 1-2), and containing no
        // state byte since `offset` is an item start (invariant 4).
        let (key, value) = unsafe {
            let base = self.area.seg_ptr(self.seg);
            (
                std::slice::from_raw_parts(base.add(key_range.start), key_range.len()),
                std::slice::from_raw_parts(base.add(value_range.start), value_range.len()),
            )
        };
        Ok(ItemRef {
            offset,
            len: total as u32,
            state: h.state,
            client_flags: h.client_flags,
            expires_at: h.expires_at,
            origin_cas: h.origin_cas,
            key,
            value,
        })
    }

    /// Walks the items from the header up to `end` (a committed end read earlier, e.g.
    /// before [`retire`](Self::retire)); stops at the first item that does not decode.
    pub fn items(&self, end: u32) -> impl Iterator<Item = ItemRef<'_>> + '_ {
        let mut pos = HEADER_LEN as u32;
        std::iter::from_fn(move || {
            let found = self.item_within(pos, end).ok()?;
            pos = found.end();
            Some(found)
        })
    }

    /// The current state byte of the item at `offset`.
    pub fn item_state(&self, offset: u32) -> Option<ItemState> {
        let limit = self.readable_end(u32::MAX);
        if (offset as usize) < HEADER_LEN || offset >= limit {
            return None;
        }
        ItemState::from_byte(self.byte(offset as usize).load(Ordering::Acquire)).ok()
    }

    /// Flips the state byte of the item at `offset` (one atomic store) and persists it.
    /// `Ok(false)` when `offset` is outside what may be written.
    pub fn set_state(&self, offset: u32, state: ItemState) -> Result<bool, MediaError> {
        let limit = self.readable_end(u32::MAX);
        if (offset as usize) < HEADER_LEN || offset >= limit {
            return Ok(false);
        }
        self.byte(offset as usize)
            .store(state.byte(), Ordering::Release);
        self.area.persist(self.seg, offset as usize, 1)?;
        Ok(true)
    }

    /// Flips the item at `offset` DEAD (one atomic swap of its state byte) and persists
    /// it. Returns the item's length if it was not DEAD before (the bytes that just died),
    /// `None` if it already was, or if `offset` is outside what may be written.
    pub fn kill(&self, offset: u32) -> Result<Option<u32>, MediaError> {
        let limit = self.readable_end(u32::MAX);
        if (offset as usize) < HEADER_LEN || offset >= limit {
            return Ok(None);
        }
        let len = self.item_within(offset, limit).map_or(0, |i| i.len);
        let dead = ItemState::Dead.byte();
        let was = self.byte(offset as usize).swap(dead, Ordering::AcqRel);
        self.area.persist(self.seg, offset as usize, 1)?;
        Ok((was != dead).then_some(len))
    }

    /// Zeroes the commit word of an `Evicting` segment (persisted) so that no item of it
    /// is scanned at restart; returns the committed end it had.
    pub fn retire(&self) -> Result<Option<u32>, MediaError> {
        if self.state() != SegState::Evicting {
            return Ok(None);
        }
        let end = self.committed_end();
        self.commit_word().store(0, Ordering::Release);
        self.area.persist(self.seg, COMMIT_WORD_OFFSET, 8)?;
        Ok(Some(end))
    }
}

/// The one writer of an `Open` segment (invariant 3). Not `Clone`; created only by
/// [`SegmentArea::open`], consumed by [`SegmentArea::seal`].
#[derive(Debug)]
pub struct Appender {
    area_id: u64,
    seg: u32,
    header: SegmentHeader,
    limits: ItemLimits,
    committed: u32,
    crc: u32,
}

impl Appender {
    pub fn seg(&self) -> u32 {
        self.seg
    }

    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// Item bytes still free.
    pub fn remaining(&self) -> usize {
        self.header.capacity() as usize - self.committed as usize
    }

    /// Appends a PENDING item whose value is the concatenation of `value` and commits it
    /// (steps 1–2 of the commit protocol, each persisted); returns its offset.
    pub fn append(
        &mut self,
        area: &SegmentArea,
        spec: &ItemSpec,
        key: &[u8],
        value: &[&[u8]],
    ) -> Result<u32, AppendError> {
        if area.id != self.area_id || area.state(self.seg) != SegState::Open {
            return Err(EncodeError::CursorMismatch.into());
        }
        let value_len: usize = value.iter().map(|v| v.len()).sum();
        self.limits.check(key.len(), value_len)?;
        spec.matches(key, value_len)?;
        let need = spec.encoded_len();
        if need > self.remaining() {
            return Err(EncodeError::SegmentFull {
                need,
                available: self.remaining(),
            }
            .into());
        }
        let start = HEADER_LEN + self.committed as usize;
        // SAFETY: [start, start + need) lies inside the segment (need <= remaining). It is
        // past the committed end of an `Open` segment whose only appender is `self`
        // (invariant 3): nobody else reads or writes it until the commit word below.
        let out =
            unsafe { std::slice::from_raw_parts_mut(area.seg_ptr(self.seg).add(start), need) };
        let h = item::encode_header(spec, out)?;
        let mut pos = h;
        out[pos..pos + key.len()].copy_from_slice(key);
        pos += key.len();
        for part in value {
            out[pos..pos + part.len()].copy_from_slice(part);
            pos += part.len();
        }
        if self.header.checksummed {
            let mut hasher = crc32fast::Hasher::new_with_initial(self.crc);
            item::hash_item(&mut hasher, out);
            self.crc = hasher.finalize();
        }
        area.persist(self.seg, start, need)?;
        self.committed += need as u32;
        let word = Commit {
            committed: self.committed,
            data_crc: self.crc,
        }
        .word();
        // SAFETY: as in `Pin::commit_word`: the aligned commit word inside the segment,
        // only accessed atomically while the segment is readable.
        let commit =
            unsafe { AtomicU64::from_ptr(area.seg_ptr(self.seg).add(COMMIT_WORD_OFFSET).cast()) };
        commit.store(word.to_le(), Ordering::Release);
        area.persist(self.seg, COMMIT_WORD_OFFSET, 8)?;
        Ok(start as u32)
    }
}

/// Why an append failed.
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Media(#[from] MediaError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::segment::SegmentReader;

    fn header(slot: u32, seq: u64) -> SegmentHeader {
        SegmentHeader {
            tier: 0,
            size_shift: 16,
            checksummed: true,
            write_seq: seq,
            slot,
            created_at: 0,
            expires_at: 0,
            ttl_bucket: 0,
        }
    }

    #[test]
    fn lifecycle_pins_and_scan_compatibility() {
        let region = Region::dram(2 << 20, terrace_media::PageSize::Base).unwrap();
        let mut area = SegmentArea::new(region, 16).unwrap();
        assert_eq!(area.count(), 32);
        assert!(area.pin(3).is_none(), "free segments cannot be pinned");
        let mut app = area
            .open(&header(3, 9), ItemLimits::default())
            .unwrap()
            .unwrap();
        assert!(area
            .open(&header(3, 10), ItemLimits::default())
            .unwrap()
            .is_none());
        let spec = ItemSpec::new(b"key", 6);
        let a = app.append(&area, &spec, b"key", &[b"abc", b"def"]).unwrap();
        let pin = area.pin(3).unwrap();
        let item = pin.item(a).unwrap();
        assert_eq!(
            (item.key, item.value, item.state),
            (&b"key"[..], &b"abcdef"[..], ItemState::Pending)
        );
        assert!(pin.set_state(a, ItemState::Live).unwrap());
        assert!(
            !pin.set_state(a + 100, ItemState::Live).unwrap(),
            "past the commit word"
        );
        assert_eq!(pin.items(u32::MAX).count(), 1);
        assert!(area.seal(app));
        assert!(area.begin_evict(3));
        assert!(!area.try_free(3), "pinned");
        drop(pin);
        assert!(area.try_free(3));
        assert_eq!(area.state(3), SegState::Free);
        // The bytes are the segment format: the codec's reader accepts them.
        let bytes = area.exclusive(3).unwrap();
        let r = SegmentReader::open(bytes).unwrap();
        assert!(r.verify().is_complete());
        assert_eq!(r.items().next().unwrap().value, b"abcdef");
    }

    /// A reader holding a pin (a `Guard`) must always be able to read its committed item,
    /// even while the segment goes `Open → Sealed → Evicting` and is retired (its commit
    /// word zeroed) under it: a reader that loaded `Open`, then a retired commit word,
    /// would cut its own item off (seen as an empty value under young-segment evictions).
    #[test]
    fn a_pinned_item_stays_readable_while_its_segment_is_retired() {
        use std::sync::atomic::AtomicBool;
        let region = Region::dram(2 << 20, terrace_media::PageSize::Base).unwrap();
        let area = SegmentArea::new(region, 16).unwrap();
        let stop = AtomicBool::new(false);
        let lost = std::sync::atomic::AtomicU64::new(0);
        let reads = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    let Some(pin) = area.pin(0) else {
                        continue;
                    };
                    let Ok(end) = pin.item(HEADER_LEN as u32).map(|i| i.end()) else {
                        continue;
                    };
                    for _ in 0..64 {
                        reads.fetch_add(1, Ordering::Relaxed);
                        if pin.item_within(HEADER_LEN as u32, end).is_err() {
                            lost.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
            // Two seconds of churn, longer if the reader has not got to read yet (a busy
            // machine), at most twenty.
            let start = std::time::Instant::now();
            let mut seq = 1;
            while lost.load(Ordering::Relaxed) == 0
                && start.elapsed() < std::time::Duration::from_secs(20)
                && (start.elapsed() < std::time::Duration::from_secs(2)
                    || reads.load(Ordering::Relaxed) < 10_000)
            {
                if seq % 64 == 0 {
                    std::thread::yield_now();
                }
                let Some(mut app) = area.open(&header(0, seq), ItemLimits::default()).unwrap()
                else {
                    continue;
                };
                seq += 1;
                app.append(&area, &ItemSpec::new(b"key", 100), b"key", &[&[7u8; 100]])
                    .unwrap();
                assert!(area.seal(app));
                assert!(area.begin_evict(0));
                let pin = area.pin(0).unwrap();
                pin.retire().unwrap();
                drop(pin);
                while !area.try_free(0) {
                    std::hint::spin_loop();
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert!(reads.load(Ordering::Relaxed) > 0);
        assert_eq!(lost.load(Ordering::Relaxed), 0, "a pinned item was cut off");
    }

    #[test]
    fn retire_hides_items() {
        let region = Region::dram(2 << 20, terrace_media::PageSize::Base).unwrap();
        let area = SegmentArea::new(region, 16).unwrap();
        let mut app = area
            .open(&header(0, 1), ItemLimits::default())
            .unwrap()
            .unwrap();
        app.append(&area, &ItemSpec::new(b"k", 1), b"k", &[b"v"])
            .unwrap();
        assert!(area.seal(app));
        let pin = area.pin(0).unwrap();
        assert_eq!(pin.retire().unwrap(), None, "only evicting segments retire");
        assert!(area.begin_evict(0));
        let end = pin.retire().unwrap().unwrap();
        assert_eq!(pin.committed_end(), HEADER_LEN as u32);
        assert!(pin.item(HEADER_LEN as u32).is_err());
        assert_eq!(
            pin.items(end).count(),
            1,
            "the evictor still walks what it saw"
        );
    }
}

//! Size classes: which slot size (unit) serves a request, and how many pages a run of
//! that unit spans. Pure functions; nothing here is stored in the pool (a run records its
//! own unit in its descriptor, so changing these tables never invalidates a pool).
//!
//! Classes: requests up to 1 KiB round up to a multiple of 16 (minimum 64); above that,
//! each power-of-two range `(2^e, 2^(e+1)]` is cut into 32 equal steps, so rounding wastes
//! less than 1/32 (3.1%) of any request above 1 KiB. Requests above [`MAX_RUN_UNIT`]
//! become extents of whole pages (waste < 4 KiB / 128 KiB = 3.1%).
//!
//! Run sizes: a run of unit `u` spans the fewest pages `p >= p_min(u)` whose tail
//! `p*4096 mod u` wastes at most 1/256 of the run; units are multiples of a power of two
//! that divides 4096 often enough that such `p` is always found quickly.

use crate::format::PAGE;

/// Smallest slot.
pub const MIN_UNIT: u32 = 64;
/// Largest slot served from runs; larger objects are page extents.
pub const MAX_RUN_UNIT: u32 = 128 * 1024;
/// Preferred minimum run length in pages (64 KiB), so small classes take the page lock
/// rarely.
pub const MIN_RUN_PAGES: u32 = 16;
/// Longest run in pages (1 MiB).
pub const MAX_RUN_PAGES: u32 = 256;
/// Fewest slots a run is sized for (large units), so runs outlive single objects.
pub const MIN_RUN_SLOTS: u32 = 4;

/// The slot size serving a request of `size` bytes, or `None` when it is an extent.
#[inline]
pub fn unit_for(size: u64) -> Option<u32> {
    if size > MAX_RUN_UNIT as u64 {
        return None;
    }
    let s = size.max(MIN_UNIT as u64);
    // The step is a power of two: round up with shifts (this is on every allocation).
    let shift = if s <= 1024 {
        4
    } else {
        let e = 63 - (s - 1).leading_zeros() as u64; // floor(log2(s - 1))
        e - 5
    };
    Some(((((s - 1) >> shift) + 1) << shift) as u32)
}

/// Number of size classes (units served from runs): 61 multiples of 16 from 64 B to
/// 1 KiB, then 32 per power of two up to [`MAX_RUN_UNIT`].
pub const CLASSES: usize = 61 + 7 * 32;

/// The dense index (`0..CLASSES`) of a class unit, or `None` for a unit no request maps
/// to (a run from another class table stays usable for frees, not for allocations).
#[inline]
pub fn index(unit: u32) -> Option<usize> {
    if !(MIN_UNIT..=MAX_RUN_UNIT).contains(&unit) || unit % 16 != 0 {
        return None;
    }
    if unit <= 1024 {
        return Some((unit / 16 - MIN_UNIT / 16) as usize);
    }
    let e = 31 - (unit - 1).leading_zeros(); // floor(log2(unit - 1)), 10..=16
    let step = 1u32 << (e - 5);
    if unit % step != 0 {
        return None;
    }
    Some(61 + (e as usize - 10) * 32 + (unit / step - 33) as usize)
}

/// Pages of an extent holding `size` bytes.
pub fn extent_pages(size: u64) -> u64 {
    size.div_ceil(PAGE)
}

/// Fewest pages that hold one slot of `unit`.
pub fn min_pages(unit: u32) -> u32 {
    (unit as u64).div_ceil(PAGE) as u32
}

/// Slots in a run of `pages` pages of `unit`-byte slots.
#[inline]
pub fn slots(unit: u32, pages: u32) -> u32 {
    // 32-bit division when the run is under 4 GiB (always, for runs this crate makes).
    match u32::try_from(pages as u64 * PAGE) {
        Ok(bytes) => bytes / unit,
        Err(_) => (pages as u64 * PAGE / unit as u64) as u32,
    }
}

/// The preferred run length for `unit` (see the module docs).
pub fn run_pages(unit: u32) -> u32 {
    // At least MIN_RUN_SLOTS slots: a run of one large slot made every allocation create a
    // run and every free destroy it (64 KiB objects were 4x slower than 4 KiB ones).
    let lo = MIN_RUN_PAGES
        .max(min_pages(unit) * MIN_RUN_SLOTS)
        .min(MAX_RUN_PAGES);
    let waste = |p: u32| (p as u64 * PAGE) % unit as u64;
    let mut best = lo;
    for p in lo..=MAX_RUN_PAGES {
        if waste(p) * 256 <= p as u64 * PAGE {
            return p;
        }
        if waste(p) * best as u64 * PAGE < waste(best) * p as u64 * PAGE {
            best = p;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_and_run_tails_waste_little_above_1k() {
        for size in (1025..=MAX_RUN_UNIT as u64).step_by(7) {
            let unit = unit_for(size).unwrap() as u64;
            assert!(
                unit >= size && (unit - size) * 32 < size,
                "{size} -> {unit}"
            );
            assert_eq!(unit % 16, 0);
        }
        for size in 1..=1024u64 {
            let unit = unit_for(size).unwrap() as u64;
            assert!(unit >= size.max(64) && unit - size.max(64) < 16);
        }
        assert_eq!(unit_for(MAX_RUN_UNIT as u64 + 1), None);
        assert_eq!(unit_for(64), Some(64));
        assert_eq!(unit_for(4096), Some(4096));
        // Class indexes are dense, distinct and cover exactly the class units.
        let mut seen = vec![false; CLASSES];
        for size in 1..=MAX_RUN_UNIT as u64 {
            let unit = unit_for(size).unwrap();
            let i = index(unit).unwrap();
            assert!(i < CLASSES);
            seen[i] = true;
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(index(1024), Some(60));
        assert_eq!(index(1040), None);
        assert_eq!(index(1056), Some(61));
        assert_eq!(index(1088), Some(62));
        assert_eq!(index(2048 + 48), None);
        assert_eq!(index(48), None);
        assert_eq!(index(MAX_RUN_UNIT), Some(CLASSES - 1));
        let mut unit = MIN_UNIT;
        while unit <= MAX_RUN_UNIT {
            let p = run_pages(unit);
            let bytes = p as u64 * PAGE;
            let used = slots(unit, p) as u64 * unit as u64;
            assert!((bytes - used) * 100 <= bytes, "unit {unit}: {p} pages");
            assert!(slots(unit, p) as u64 <= 64 * p as u64);
            unit = unit_for(unit as u64 + 1).unwrap_or(u32::MAX);
        }
    }
}

//! Allocation classes. Two kinds:
//!
//! - **Built-in size classes**: which slot size (unit) serves a request, and how many
//!   pages a run of that unit spans. Pure functions; nothing of them is stored in the pool
//!   (a run records its own unit in its descriptor, so changing these tables never
//!   invalidates a pool).
//! - **Custom classes** (libpmemobj's `heap.alloc_class.new.desc`): a unit and a run
//!   length chosen by the program, registered under a [`ClassId`] and *recorded in the
//!   pool's class table* (`docs/pool-format.md`, "Class table"), so they survive close
//!   and reopen. This module owns their description ([`ClassDesc`]), its validation and
//!   its translation to a table entry ([`ClassEntry`]); the pool writes the entry (a
//!   single-word commit) and the heap serves allocations that name the class.
//!
//! Invariants of a custom class entry (checked at registration by `resolve` and at
//! every open by `validate`): the unit is a multiple of [`CUSTOM_UNIT_ALIGN`] in
//! [`MIN_CUSTOM_UNIT`]`..=`[`MAX_RUN_UNIT`]; the run length is 1 to
//! [`MAX_CUSTOM_RUN_PAGES`] pages and holds at least one unit; the header type is one of
//! libpmemobj's three; the alignment is 0 or a power of two up to a page that divides the
//! unit (slots start at `page + k * unit`, so such an alignment holds for every slot).
//! A custom class serves only allocations that name it; built-in requests never use it.
//!
//! Classes: requests up to 1 KiB round up to a multiple of 16 (minimum 64); above that,
//! each power-of-two range `(2^e, 2^(e+1)]` is cut into 32 equal steps, so rounding wastes
//! less than 1/32 (3.1%) of any request above 1 KiB. Requests above [`MAX_RUN_UNIT`]
//! become extents of whole pages (waste < 4 KiB / 128 KiB = 3.1%).
//!
//! Run sizes: a run of unit `u` spans the fewest pages `p >= p_min(u)` whose tail
//! `p*4096 mod u` wastes at most 1/256 of the run; units are multiples of a power of two
//! that divides 4096 often enough that such `p` is always found quickly.

use std::fmt;

use crate::error::{PoolError, Result};
use crate::format::{ClassEntry, PAGE};

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
    if !(MIN_UNIT..=MAX_RUN_UNIT).contains(&unit) || !unit.is_multiple_of(16) {
        return None;
    }
    if unit <= 1024 {
        return Some((unit / 16 - MIN_UNIT / 16) as usize);
    }
    let e = 31 - (unit - 1).leading_zeros(); // floor(log2(unit - 1)), 10..=16
    let step = 1u32 << (e - 5);
    if !unit.is_multiple_of(step) {
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

/// Slots a run can track per page: its bitmap is one 64-bit descriptor word per page.
pub const SLOTS_PER_PAGE: u32 = 64;

/// Slots in a run of `pages` pages of `unit`-byte slots: as many units as fit, but at
/// most [`SLOTS_PER_PAGE`] per page (which only binds for custom units below 64 bytes).
#[inline]
pub fn slots(unit: u32, pages: u32) -> u32 {
    // 32-bit division when the run is under 4 GiB (always, for runs this crate makes).
    let fit = match u32::try_from(pages as u64 * PAGE) {
        Ok(bytes) => bytes / unit,
        Err(_) => (pages as u64 * PAGE / unit as u64) as u32,
    };
    if unit >= MIN_UNIT {
        // 64 B or more: at most 64 per page already (the common case, kept cheap: this
        // runs on every free).
        return fit;
    }
    fit.min(pages.saturating_mul(SLOTS_PER_PAGE))
}

/// The preferred run length for `unit` (see the module docs).
pub fn run_pages(unit: u32) -> u32 {
    // At least MIN_RUN_SLOTS slots: in a run of one large slot every allocation would
    // carve a run and every free release it.
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

/// Smallest unit of a custom class.
pub const MIN_CUSTOM_UNIT: u32 = 16;
/// Units of custom classes are multiples of this (so every object is 8-byte aligned and
/// its words can be published atomically).
pub const CUSTOM_UNIT_ALIGN: u32 = 8;
/// Longest run of a custom class in pages (16 MiB).
pub const MAX_CUSTOM_RUN_PAGES: u32 = 4096;
/// Largest alignment a custom class can ask for: a page (runs start on pages).
pub const MAX_ALIGNMENT: u32 = PAGE as u32;
/// Custom class ids are `1..=MAX_CUSTOM_CLASSES` (libpmemobj's limit of 255 classes, ids
/// 0..=254; id 0 means "no class" in `POBJ_CLASS_ID`).
pub const MAX_CUSTOM_CLASSES: usize = 254;

/// The id of a custom allocation class, `1..=254`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClassId(u8);

impl ClassId {
    /// The id `id`, if it can name a custom class (`InvalidClass` otherwise).
    pub fn new(id: u32) -> Result<ClassId> {
        match u8::try_from(id) {
            Ok(v) if (1..=MAX_CUSTOM_CLASSES as u8).contains(&v) => Ok(ClassId(v)),
            _ => Err(PoolError::InvalidClass {
                field: "class id",
                detail: format!(
                    "{id}: custom class ids are 1..={MAX_CUSTOM_CLASSES} (0 names the built-in size classes)"
                ),
            }),
        }
    }

    pub fn get(self) -> u8 {
        self.0
    }

    /// Every id, in order.
    pub fn all() -> impl Iterator<Item = ClassId> {
        (1..=MAX_CUSTOM_CLASSES as u8).map(ClassId)
    }
}

impl fmt::Display for ClassId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// libpmemobj's object header types (`enum pobj_header_type`, same codes). Recorded with
/// the class and reported back; Terrace objects carry no header whichever is chosen, so
/// an allocation in a custom class is always one unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HeaderType {
    Legacy = 0,
    Compact = 1,
    #[default]
    None = 2,
}

impl HeaderType {
    /// The type with libpmemobj's code `code`.
    pub fn from_code(code: u32) -> Option<HeaderType> {
        match code {
            0 => Some(HeaderType::Legacy),
            1 => Some(HeaderType::Compact),
            2 => Some(HeaderType::None),
            _ => None,
        }
    }

    pub fn code(self) -> u8 {
        self as u8
    }
}

/// How long the runs of a custom class are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum RunSize {
    /// As a built-in class of that unit would have them ([`run_pages`]).
    #[default]
    Default,
    /// The fewest pages holding at least this many units (libpmemobj's
    /// `units_per_block`; a run holds at most 64 slots per page).
    Units(u32),
    /// Exactly this many pages.
    Pages(u32),
}

/// What a program asks for when registering a custom class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClassDesc {
    /// Slot size in bytes: what every allocation in the class gets.
    pub unit: u32,
    pub run: RunSize,
    /// 0 (none), or a power of two up to 4096 dividing `unit`.
    pub alignment: u32,
    pub header: HeaderType,
}

impl ClassDesc {
    /// A header-less class of `unit`-byte slots in runs of the default length.
    pub fn new(unit: u32) -> ClassDesc {
        ClassDesc {
            unit,
            run: RunSize::Default,
            alignment: 0,
            header: HeaderType::None,
        }
    }

    /// Runs hold at least `n` units.
    pub fn units_per_run(self, n: u32) -> ClassDesc {
        ClassDesc {
            run: RunSize::Units(n),
            ..self
        }
    }

    /// Runs are `pages` pages long.
    pub fn run_pages(self, pages: u32) -> ClassDesc {
        ClassDesc {
            run: RunSize::Pages(pages),
            ..self
        }
    }

    pub fn alignment(self, alignment: u32) -> ClassDesc {
        ClassDesc { alignment, ..self }
    }

    pub fn header(self, header: HeaderType) -> ClassDesc {
        ClassDesc { header, ..self }
    }
}

/// An allocation class as the pool serves it: a built-in size class (`id: None`) or a
/// registered custom class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AllocClass {
    pub id: Option<ClassId>,
    pub unit: u32,
    /// Pages of a run of the class (built-in classes fall back to fewer when the heap has
    /// no span that long; custom classes never do).
    pub run_pages: u32,
    /// Slots in such a run (libpmemobj's `units_per_block` as `pmemobj_ctl_get` reports).
    pub slots_per_run: u32,
    /// Requested alignment (0: none; every object is aligned to the largest power of two
    /// dividing the unit, up to a page, anyway).
    pub alignment: u32,
    pub header: HeaderType,
}

fn invalid(field: &'static str, detail: String) -> PoolError {
    PoolError::InvalidClass { field, detail }
}

/// Validates a description and computes its table entry (see the module invariants).
pub(crate) fn resolve(desc: &ClassDesc) -> Result<ClassEntry> {
    let unit = desc.unit;
    if !(MIN_CUSTOM_UNIT..=MAX_RUN_UNIT).contains(&unit) || !unit.is_multiple_of(CUSTOM_UNIT_ALIGN)
    {
        return Err(invalid(
            "unit size",
            format!(
                "{unit} bytes: must be a multiple of {CUSTOM_UNIT_ALIGN} from {MIN_CUSTOM_UNIT} to {MAX_RUN_UNIT}"
            ),
        ));
    }
    let a = desc.alignment;
    if a != 0 && (!a.is_power_of_two() || a > MAX_ALIGNMENT || !unit.is_multiple_of(a)) {
        return Err(invalid(
            "alignment",
            format!(
                "{a}: must be 0 or a power of two up to {MAX_ALIGNMENT} that divides the unit ({unit})"
            ),
        ));
    }
    let pages = match desc.run {
        RunSize::Default => run_pages(unit),
        RunSize::Units(n) => {
            if n == 0 {
                return Err(invalid("units per run", "0: must be at least 1".into()));
            }
            let by_bytes = (n as u64 * unit as u64).div_ceil(PAGE);
            let by_bits = (n as u64).div_ceil(SLOTS_PER_PAGE as u64);
            let pages = by_bytes.max(by_bits).max(1);
            if pages > MAX_CUSTOM_RUN_PAGES as u64 {
                return Err(invalid(
                    "units per run",
                    format!(
                        "{n} units of {unit} bytes need {pages} pages; a run has at most {MAX_CUSTOM_RUN_PAGES}"
                    ),
                ));
            }
            pages as u32
        }
        RunSize::Pages(p) => {
            if p == 0 || p > MAX_CUSTOM_RUN_PAGES || (p as u64 * PAGE) < unit as u64 {
                return Err(invalid(
                    "run pages",
                    format!(
                        "{p}: must be 1..={MAX_CUSTOM_RUN_PAGES} and hold one {unit}-byte unit"
                    ),
                ));
            }
            p
        }
    };
    let entry = ClassEntry {
        unit,
        pages,
        header: desc.header.code(),
        align_code: if a == 0 {
            0
        } else {
            a.trailing_zeros() as u8 + 1
        },
    };
    validate(&entry).map_err(|what| invalid("description", what))?;
    Ok(entry)
}

/// Whether a decoded table entry is a usable class (the module invariants); the error
/// says what is not.
pub(crate) fn validate(e: &ClassEntry) -> std::result::Result<(), String> {
    if !(MIN_CUSTOM_UNIT..=MAX_RUN_UNIT).contains(&e.unit)
        || !e.unit.is_multiple_of(CUSTOM_UNIT_ALIGN)
    {
        return Err(format!("impossible unit {}", e.unit));
    }
    if e.pages == 0 || e.pages > MAX_CUSTOM_RUN_PAGES || (e.pages as u64 * PAGE) < e.unit as u64 {
        return Err(format!(
            "impossible run length {} pages for unit {}",
            e.pages, e.unit
        ));
    }
    if HeaderType::from_code(e.header as u32).is_none() {
        return Err(format!("unknown header type {}", e.header));
    }
    let a = alignment_of(e.align_code);
    if a > MAX_ALIGNMENT || (a != 0 && !e.unit.is_multiple_of(a)) {
        return Err(format!(
            "impossible alignment code {} for unit {}",
            e.align_code, e.unit
        ));
    }
    Ok(())
}

/// The alignment an entry's code stands for (0: none).
fn alignment_of(code: u8) -> u32 {
    match code {
        0 => 0,
        c if c <= 13 => 1 << (c - 1),
        _ => u32::MAX,
    }
}

/// The class a validated entry describes.
pub(crate) fn describe(id: ClassId, e: &ClassEntry) -> AllocClass {
    AllocClass {
        id: Some(id),
        unit: e.unit,
        run_pages: e.pages,
        slots_per_run: slots(e.unit, e.pages),
        alignment: alignment_of(e.align_code),
        header: HeaderType::from_code(e.header as u32).unwrap_or_default(),
    }
}

/// The built-in size classes, smallest unit first ([`CLASSES`] of them).
pub fn builtin_classes() -> Vec<AllocClass> {
    let mut out = Vec::with_capacity(CLASSES);
    let mut unit = Some(MIN_UNIT);
    while let Some(u) = unit {
        let pages = run_pages(u);
        out.push(AllocClass {
            id: None,
            unit: u,
            run_pages: pages,
            slots_per_run: slots(u, pages),
            alignment: 0,
            header: HeaderType::None,
        });
        unit = unit_for(u as u64 + 1);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_descriptions_resolve_or_name_the_bad_field() {
        let e = resolve(&ClassDesc::new(48).units_per_run(1000)).unwrap();
        // 1000 slots need 16 pages (64 per page) although 48 KB fit in 12.
        assert_eq!((e.unit, e.pages), (48, 16));
        assert!(slots(e.unit, e.pages) >= 1000);
        let e = resolve(&ClassDesc::new(4096).units_per_run(3).alignment(4096)).unwrap();
        assert_eq!((e.pages, alignment_of(e.align_code)), (3, 4096));
        let e = resolve(&ClassDesc::new(MAX_RUN_UNIT).run_pages(32)).unwrap();
        assert_eq!(slots(e.unit, e.pages), 1);
        assert_eq!(resolve(&ClassDesc::new(64)).unwrap().pages, run_pages(64));
        for (desc, field) in [
            (ClassDesc::new(8), "unit size"),
            (ClassDesc::new(0), "unit size"),
            (ClassDesc::new(20), "unit size"),
            (ClassDesc::new(MAX_RUN_UNIT + 8), "unit size"),
            (ClassDesc::new(64).alignment(3), "alignment"),
            (ClassDesc::new(64).alignment(128), "alignment"),
            (ClassDesc::new(8192).alignment(8192), "alignment"),
            (ClassDesc::new(64).units_per_run(0), "units per run"),
            (
                ClassDesc::new(MAX_RUN_UNIT).units_per_run(1000),
                "units per run",
            ),
            (ClassDesc::new(64).run_pages(0), "run pages"),
            (ClassDesc::new(8192).run_pages(1), "run pages"),
            (
                ClassDesc::new(64).run_pages(MAX_CUSTOM_RUN_PAGES + 1),
                "run pages",
            ),
        ] {
            match resolve(&desc) {
                Err(PoolError::InvalidClass { field: f, .. }) => assert_eq!(f, field, "{desc:?}"),
                other => panic!("{desc:?}: {other:?}"),
            }
        }
        assert!(ClassId::new(0).is_err() && ClassId::new(255).is_err());
        assert_eq!(ClassId::new(254).unwrap().get(), 254);
        assert_eq!(ClassId::all().count(), MAX_CUSTOM_CLASSES);
        let b = builtin_classes();
        assert_eq!(b.len(), CLASSES);
        assert!(b.iter().enumerate().all(|(i, c)| index(c.unit) == Some(i)));
    }

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

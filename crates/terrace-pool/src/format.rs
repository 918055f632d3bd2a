//! The on-media format: constants, the header, the state block, page descriptors, lane
//! areas and the geometry that places them. This module is the executable form of the
//! description below (`docs/pool-format.md`), and the compile-time asserts at the bottom
//! pin every on-media struct's size and field offsets to it.
//!
//! The `#[repr(C)]` structs here are never transmuted from pool bytes: they document the
//! layout and give `offset_of!` for the explicit little-endian encoders and decoders.
//!
//! Invariants of a [`Geometry`]: `lanes_off < meta_off < heap_off <= pool_size`, all
//! page-aligned; `meta_off + page_count * PAGE_META_SIZE <= heap_off`;
//! `heap_off + page_count * PAGE <= pool_size`.
//!
//! Versions: this build writes [`FORMAT_VERSION`] (2) and reads 1 and 2. Version 2 added
//! the class table in the state block and the class byte of run descriptors; in a
//! version 1 pool both are zero (create zeroed them, and version 1 never wrote there),
//! so a version 1 pool opens unchanged, but custom classes cannot be registered in it
//! (its header would still let a version-1 build open it and misread the class bytes).
//!
//! ---
//!
#![doc = include_str!("../../../docs/pool-format.md")]

use std::mem::{offset_of, size_of};

use crate::error::{corrupt, PoolError, Result};

/// Unit of heap space: runs and extents are whole pages.
pub const PAGE: u64 = 4096;
/// First eight bytes of every pool.
pub const MAGIC: [u8; 8] = *b"TRCPOOL\0";
/// The format version this build writes (and the newest it reads).
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads.
pub const MIN_FORMAT_VERSION: u32 = 1;
/// The first format version with the class table (custom allocation classes).
pub const CLASS_TABLE_VERSION: u32 = 2;
/// Bytes of the header covered by the checksum (the checksum itself is the last 4).
pub const HEADER_LEN: u64 = 256;
/// Offset of the mutable state block (root object).
pub const STATE_OFF: u64 = PAGE;
/// Offset of the first lane.
pub const LANES_OFF: u64 = 2 * PAGE;
/// Bytes per lane: a redo area then an undo area.
pub const LANE_SIZE: u64 = 64 * 1024;
/// Bytes of a lane's redo area (header line + entries).
pub const REDO_SIZE: u64 = 8 * 1024;
/// Offset of the undo area inside a lane.
pub const UNDO_OFF: u64 = REDO_SIZE;
/// Bytes of a lane's undo area (state line + entries).
pub const UNDO_SIZE: u64 = LANE_SIZE - REDO_SIZE;
/// Bytes of one redo entry.
pub const REDO_ENTRY: u64 = 16;
/// Redo entries per lane.
pub const REDO_CAPACITY: u64 = (REDO_SIZE - 64) / REDO_ENTRY;
/// Bytes of one page descriptor.
pub const PAGE_META_SIZE: u64 = 32;
/// Longest layout name in bytes (one byte stays NUL).
pub const MAX_LAYOUT: usize = 63;
/// Smallest pool: the media layer maps in 2 MiB granules.
pub const MIN_POOL_SIZE: u64 = 2 << 20;
/// Pool sizes are multiples of this (the media layer's granule).
pub const POOL_ALIGN: u64 = 2 << 20;
/// Most lanes a pool has.
pub const MAX_LANES: u32 = 64;

/// Page kinds in a descriptor's first byte.
pub const KIND_FREE: u8 = 0;
pub const KIND_RUN: u8 = 1;
pub const KIND_EXTENT: u8 = 2;

/// The pool header at offset 0 (documentation struct; see "Header" above).
#[repr(C)]
pub struct RawPoolHeader {
    pub magic: [u8; 8],
    pub version: u32,
    pub header_len: u32,
    pub uuid: [u8; 16],
    pub pool_size: u64,
    pub layout: [u8; 64],
    pub page_size: u32,
    pub lane_count: u32,
    pub lane_size: u64,
    pub lanes_off: u64,
    pub meta_off: u64,
    pub heap_off: u64,
    pub page_count: u64,
    pub created_ns: u64,
    pub reserved: [u8; 92],
    pub checksum: u32,
}

/// The mutable state block at [`STATE_OFF`] (documentation struct).
#[repr(C)]
pub struct RawState {
    pub root_off: u64,
    pub root_size: u64,
    /// The named-root directory object (terrace-collections), 0 when none.
    pub directory_off: u64,
    pub reserved: [u8; 2024],
    /// The class table: entry `i` describes custom allocation class `i` (0: none).
    /// Entries 0 and 255 are never used.
    pub classes: [u64; CLASS_SLOTS],
}

/// Entries in the class table (one per possible class id, 0..=255).
pub const CLASS_SLOTS: usize = 256;

/// One class table entry, decoded (see "Class table" above). Only the encoding
/// is checked here; whether the values make a usable class is `class::validate`'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassEntry {
    /// Slot size in bytes (bits 0..24).
    pub unit: u32,
    /// Pages of every run of the class (bits 24..40).
    pub pages: u32,
    /// libpmemobj header type as registered, 0..=2 (bits 40..42); objects have no header
    /// whatever it says.
    pub header: u8,
    /// Requested alignment: 0 none, else `log2(alignment) + 1` (bits 42..46).
    pub align_code: u8,
}

const CLASS_UNIT_BITS: u32 = 24;
const CLASS_PAGES_SHIFT: u32 = 24;
const CLASS_HEADER_SHIFT: u32 = 40;
const CLASS_ALIGN_SHIFT: u32 = 42;
const CLASS_CHECK_SHIFT: u32 = 48;
/// Bits 46..48: reserved, zero.
const CLASS_RESERVED: u64 = 0b11 << 46;

impl ClassEntry {
    /// The 16-bit check of an entry's low 48 bits, for class `id`: the low half of the
    /// CRC-32 of `id` (1 byte) followed by the 6 low bytes of the word.
    fn check(id: u8, low: u64) -> u64 {
        let mut h = crc32fast::Hasher::new();
        h.update(&[id]);
        h.update(&low.to_le_bytes()[..6]);
        (h.finalize() & 0xFFFF) as u64
    }

    /// The table word of this entry as class `id` (not 0 for a valid class, whose unit
    /// is not 0).
    pub fn encode(&self, id: u8) -> u64 {
        let low = (self.unit as u64 & ((1 << CLASS_UNIT_BITS) - 1))
            | (self.pages as u64 & 0xFFFF) << CLASS_PAGES_SHIFT
            | (self.header as u64 & 0b11) << CLASS_HEADER_SHIFT
            | (self.align_code as u64 & 0b1111) << CLASS_ALIGN_SHIFT;
        low | Self::check(id, low) << CLASS_CHECK_SHIFT
    }

    /// Decodes the table word of class `id`: `Ok(None)` for 0 (no class), `Err` naming
    /// what is wrong with a word that is not a well-formed entry for `id`.
    pub fn decode(id: u8, w: u64) -> Result<Option<ClassEntry>, &'static str> {
        if w == 0 {
            return Ok(None);
        }
        let low = w & ((1 << CLASS_CHECK_SHIFT) - 1);
        if w >> CLASS_CHECK_SHIFT != Self::check(id, low) {
            return Err("checksum mismatch");
        }
        if w & CLASS_RESERVED != 0 {
            return Err("reserved bits set");
        }
        Ok(Some(Self::fields(w)))
    }

    /// The fields of a word known to be a valid entry (the volatile copy in the heap).
    #[inline(always)]
    pub fn fields(w: u64) -> ClassEntry {
        ClassEntry {
            unit: (w & ((1 << CLASS_UNIT_BITS) - 1)) as u32,
            pages: ((w >> CLASS_PAGES_SHIFT) & 0xFFFF) as u32,
            header: ((w >> CLASS_HEADER_SHIFT) & 0b11) as u8,
            align_code: ((w >> CLASS_ALIGN_SHIFT) & 0b1111) as u8,
        }
    }
}

/// Offset of the class table entry of class `id`.
pub fn class_entry_off(id: u8) -> u64 {
    CLASS_TABLE_OFF + 8 * id as u64
}

/// One page descriptor (documentation struct).
#[repr(C)]
pub struct RawPageMeta {
    /// kind (byte 0) | reserved (bytes 1..4) | span pages (bytes 4..8); head pages only.
    pub word0: u64,
    /// run unit size in bytes (bytes 0..4) | custom class id (byte 4; 0: a built-in
    /// size class) | reserved, zero (bytes 5..8); run heads only.
    pub word1: u64,
    /// type number of every object in the span; heads only.
    pub type_num: u64,
    /// allocation bitmap word: bit b of page i of a run is slot 64*i + b.
    pub bitmap: u64,
}

/// Offset of the root offset word.
pub const ROOT_OFF_WORD: u64 = STATE_OFF + offset_of!(RawState, root_off) as u64;
/// Offset of the root size word.
pub const ROOT_SIZE_WORD: u64 = STATE_OFF + offset_of!(RawState, root_size) as u64;
/// Pool offset of the directory word (see [`RawState::directory_off`]).
pub const DIRECTORY_WORD: u64 = STATE_OFF + offset_of!(RawState, directory_off) as u64;
pub const META_WORD0: u64 = offset_of!(RawPageMeta, word0) as u64;
pub const META_WORD1: u64 = offset_of!(RawPageMeta, word1) as u64;
pub const META_TYPE: u64 = offset_of!(RawPageMeta, type_num) as u64;
pub const META_BITMAP: u64 = offset_of!(RawPageMeta, bitmap) as u64;
/// Offset of the class table.
pub const CLASS_TABLE_OFF: u64 = STATE_OFF + offset_of!(RawState, classes) as u64;

/// `word1` of a run head: unit and class id.
pub fn run_word1(unit: u32, class: u8) -> u64 {
    unit as u64 | (class as u64) << 32
}

const _: () = assert!(size_of::<RawPoolHeader>() as u64 == HEADER_LEN);
const _: () = assert!(offset_of!(RawPoolHeader, version) == 8);
const _: () = assert!(offset_of!(RawPoolHeader, uuid) == 16);
const _: () = assert!(offset_of!(RawPoolHeader, pool_size) == 32);
const _: () = assert!(offset_of!(RawPoolHeader, layout) == 40);
const _: () = assert!(offset_of!(RawPoolHeader, page_size) == 104);
const _: () = assert!(offset_of!(RawPoolHeader, lane_count) == 108);
const _: () = assert!(offset_of!(RawPoolHeader, lane_size) == 112);
const _: () = assert!(offset_of!(RawPoolHeader, lanes_off) == 120);
const _: () = assert!(offset_of!(RawPoolHeader, meta_off) == 128);
const _: () = assert!(offset_of!(RawPoolHeader, heap_off) == 136);
const _: () = assert!(offset_of!(RawPoolHeader, page_count) == 144);
const _: () = assert!(offset_of!(RawPoolHeader, created_ns) == 152);
const _: () = assert!(offset_of!(RawPoolHeader, checksum) == 252);
const _: () = assert!(size_of::<RawState>() as u64 == PAGE);
const _: () = assert!(CLASS_TABLE_OFF == STATE_OFF + 2048 && CLASS_TABLE_OFF.is_multiple_of(64));
const _: () = assert!(size_of::<RawPageMeta>() as u64 == PAGE_META_SIZE);
const _: () = assert!(META_BITMAP == 24);
const _: () = assert!(REDO_CAPACITY == 508);
const _: () = assert!(LANE_SIZE.is_multiple_of(PAGE) && UNDO_OFF.is_multiple_of(64));

/// Where everything is, derived from the pool size and lane count alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub pool_size: u64,
    pub lane_count: u32,
    pub lanes_off: u64,
    pub meta_off: u64,
    pub heap_off: u64,
    pub page_count: u64,
}

impl Geometry {
    /// The default lane count for a pool of `pool_size` bytes: one per 32 MiB, 2..=64.
    pub fn default_lanes(pool_size: u64) -> u32 {
        (pool_size / (32 << 20)).clamp(2, MAX_LANES as u64) as u32
    }

    /// Places lanes, page descriptors and heap pages in a pool of `pool_size` bytes.
    pub fn compute(pool_size: u64, lane_count: u32) -> Result<Geometry> {
        if pool_size < MIN_POOL_SIZE || !pool_size.is_multiple_of(POOL_ALIGN) {
            return Err(PoolError::InvalidArgument {
                what: "pool size",
                detail: format!(
                    "{pool_size} bytes: must be a multiple of {POOL_ALIGN} and at least {MIN_POOL_SIZE}"
                ),
            });
        }
        if lane_count == 0 || lane_count > MAX_LANES {
            return Err(PoolError::InvalidArgument {
                what: "lane count",
                detail: format!("{lane_count}: must be 1..={MAX_LANES}"),
            });
        }
        let lanes_off = LANES_OFF;
        let meta_off = lanes_off + lane_count as u64 * LANE_SIZE;
        let avail = pool_size.saturating_sub(meta_off);
        let mut pages = avail / (PAGE + PAGE_META_SIZE);
        let meta_bytes = |n: u64| (n * PAGE_META_SIZE).div_ceil(PAGE) * PAGE;
        while pages > 0 && meta_bytes(pages) + pages * PAGE > avail {
            pages -= 1;
        }
        if pages >= u32::MAX as u64 {
            return Err(PoolError::InvalidArgument {
                what: "pool size",
                detail: format!("{pool_size} bytes: more than 2^32 heap pages"),
            });
        }
        if pages < 16 {
            return Err(PoolError::InvalidArgument {
                what: "pool size",
                detail: format!("{pool_size} bytes leave only {pages} heap pages"),
            });
        }
        Ok(Geometry {
            pool_size,
            lane_count,
            lanes_off,
            meta_off,
            heap_off: meta_off + meta_bytes(pages),
            page_count: pages,
        })
    }

    pub fn lane_off(&self, lane: u32) -> u64 {
        self.lanes_off + lane as u64 * LANE_SIZE
    }

    pub fn meta(&self, page: u64) -> u64 {
        self.meta_off + page * PAGE_META_SIZE
    }

    pub fn page_addr(&self, page: u64) -> u64 {
        self.heap_off + page * PAGE
    }

    /// The heap page holding `offset`, if it lies in the heap.
    pub fn page_of(&self, offset: u64) -> Option<u64> {
        if offset < self.heap_off {
            return None;
        }
        let page = (offset - self.heap_off) / PAGE;
        (page < self.page_count).then_some(page)
    }

    pub fn heap_end(&self) -> u64 {
        self.heap_off + self.page_count * PAGE
    }
}

/// The decoded header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolHeader {
    /// Format version ([`MIN_FORMAT_VERSION`]..=[`FORMAT_VERSION`]); `create` writes
    /// [`FORMAT_VERSION`].
    pub version: u32,
    pub uuid: [u8; 16],
    pub layout: String,
    pub geometry: Geometry,
    pub created_ns: u64,
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    buf[at..at + bytes.len()].copy_from_slice(bytes);
}

fn get<const N: usize>(buf: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&buf[at..at + N]);
    out
}

fn get_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(get(buf, at))
}

fn get_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(get(buf, at))
}

/// CRC-32 (IEEE) of `bytes`.
pub fn checksum(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// Checks a layout name: at most [`MAX_LAYOUT`] bytes, no NUL.
pub fn check_layout(layout: &str) -> Result<()> {
    if layout.len() > MAX_LAYOUT || layout.as_bytes().contains(&0) {
        return Err(PoolError::InvalidArgument {
            what: "layout name",
            detail: format!("{layout:?}: at most {MAX_LAYOUT} bytes, no NUL"),
        });
    }
    Ok(())
}

impl PoolHeader {
    /// The 256 header bytes, checksum included.
    pub fn encode(&self) -> [u8; HEADER_LEN as usize] {
        let g = &self.geometry;
        let mut b = [0u8; HEADER_LEN as usize];
        put(&mut b, offset_of!(RawPoolHeader, magic), &MAGIC);
        put(
            &mut b,
            offset_of!(RawPoolHeader, version),
            &self.version.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(RawPoolHeader, header_len),
            &(HEADER_LEN as u32).to_le_bytes(),
        );
        put(&mut b, offset_of!(RawPoolHeader, uuid), &self.uuid);
        put(
            &mut b,
            offset_of!(RawPoolHeader, pool_size),
            &g.pool_size.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(RawPoolHeader, layout),
            self.layout.as_bytes(),
        );
        put(
            &mut b,
            offset_of!(RawPoolHeader, page_size),
            &(PAGE as u32).to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(RawPoolHeader, lane_count),
            &g.lane_count.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(RawPoolHeader, lane_size),
            &LANE_SIZE.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(RawPoolHeader, lanes_off),
            &g.lanes_off.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(RawPoolHeader, meta_off),
            &g.meta_off.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(RawPoolHeader, heap_off),
            &g.heap_off.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(RawPoolHeader, page_count),
            &g.page_count.to_le_bytes(),
        );
        put(
            &mut b,
            offset_of!(RawPoolHeader, created_ns),
            &self.created_ns.to_le_bytes(),
        );
        let crc_at = offset_of!(RawPoolHeader, checksum);
        let crc = checksum(&b[..crc_at]);
        put(&mut b, crc_at, &crc.to_le_bytes());
        b
    }

    /// Decodes and validates header bytes: magic, version, checksum, geometry. The
    /// layout name is checked by the caller (it knows what it expects).
    pub fn decode(b: &[u8]) -> Result<PoolHeader> {
        if b.len() < HEADER_LEN as usize {
            return Err(PoolError::NotAPool {
                why: "shorter than a pool header",
            });
        }
        let magic: [u8; 8] = get(b, offset_of!(RawPoolHeader, magic));
        if magic != MAGIC {
            return Err(PoolError::NotAPool {
                why: if magic == [0; 8] {
                    "no header (empty, or creation did not finish)"
                } else {
                    "wrong magic"
                },
            });
        }
        let version = get_u32(b, offset_of!(RawPoolHeader, version));
        let header_len = get_u32(b, offset_of!(RawPoolHeader, header_len));
        if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version)
            || header_len as u64 != HEADER_LEN
        {
            return Err(PoolError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        let crc_at = offset_of!(RawPoolHeader, checksum);
        let stored = get_u32(b, crc_at);
        let computed = checksum(&b[..crc_at]);
        if stored != computed {
            return Err(PoolError::BadChecksum { stored, computed });
        }
        let layout_bytes: [u8; 64] = get(b, offset_of!(RawPoolHeader, layout));
        let end = layout_bytes.iter().position(|&c| c == 0).unwrap_or(64);
        let layout = String::from_utf8(layout_bytes[..end].to_vec())
            .map_err(|_| corrupt("layout name is not UTF-8", 40))?;
        let pool_size = get_u64(b, offset_of!(RawPoolHeader, pool_size));
        let lane_count = get_u32(b, offset_of!(RawPoolHeader, lane_count));
        let geometry = Geometry::compute(pool_size, lane_count)
            .map_err(|e| corrupt(format!("header geometry is impossible: {e}"), 32))?;
        let stored_geometry = Geometry {
            pool_size,
            lane_count,
            lanes_off: get_u64(b, offset_of!(RawPoolHeader, lanes_off)),
            meta_off: get_u64(b, offset_of!(RawPoolHeader, meta_off)),
            heap_off: get_u64(b, offset_of!(RawPoolHeader, heap_off)),
            page_count: get_u64(b, offset_of!(RawPoolHeader, page_count)),
        };
        if stored_geometry != geometry
            || get_u32(b, offset_of!(RawPoolHeader, page_size)) as u64 != PAGE
            || get_u64(b, offset_of!(RawPoolHeader, lane_size)) != LANE_SIZE
        {
            return Err(corrupt(
                "header geometry disagrees with pool size and lane count",
                offset_of!(RawPoolHeader, lanes_off) as u64,
            ));
        }
        Ok(PoolHeader {
            version,
            uuid: get(b, offset_of!(RawPoolHeader, uuid)),
            layout,
            geometry,
            created_ns: get_u64(b, offset_of!(RawPoolHeader, created_ns)),
        })
    }

    /// The low 64 bits of the uuid, as in `PMEMoid.pool_uuid_lo`.
    pub fn uuid_lo(&self) -> u64 {
        u64::from_le_bytes(get(&self.uuid, 0))
    }
}

/// A decoded page descriptor head word pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpanHead {
    pub kind: u8,
    pub pages: u32,
    pub unit: u32,
    pub type_num: u64,
}

/// `word0` of a span head.
pub fn word0(kind: u8, pages: u32) -> u64 {
    kind as u64 | (pages as u64) << 32
}

/// Splits `word0` into (kind, pages).
pub fn split_word0(w: u64) -> (u8, u32) {
    ((w & 0xFF) as u8, (w >> 32) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_fits_and_small_pools_are_refused() {
        for size in [2u64 << 20, 8 << 20, 1 << 30, 64 << 30] {
            let g = Geometry::compute(size, Geometry::default_lanes(size)).unwrap();
            assert!(g.meta_off + g.page_count * PAGE_META_SIZE <= g.heap_off);
            assert!(g.heap_end() <= size);
            assert_eq!(g.heap_off % PAGE, 0);
            // Metadata (header, lanes, descriptors) stays small against the heap.
            if size >= 1 << 30 {
                assert!(g.heap_end() - g.heap_off > size / 100 * 98, "{g:?}");
            }
        }
        assert!(Geometry::compute(1 << 20, 2).is_err());
        assert!(Geometry::compute(3 << 20, 2).is_err());
        assert!(Geometry::compute(2 << 20, 0).is_err());
    }

    #[test]
    fn header_round_trips_and_detects_damage() {
        let h = PoolHeader {
            version: FORMAT_VERSION,
            uuid: [7; 16],
            layout: "anchor".into(),
            geometry: Geometry::compute(4 << 20, 2).unwrap(),
            created_ns: 99,
        };
        let mut b = h.encode();
        assert_eq!(PoolHeader::decode(&b).unwrap(), h);
        b[45] ^= 1;
        assert!(matches!(
            PoolHeader::decode(&b),
            Err(PoolError::BadChecksum { .. })
        ));
        b[45] ^= 1;
        b[8] = 3;
        assert!(matches!(
            PoolHeader::decode(&b),
            Err(PoolError::UnsupportedVersion { found: 3, .. })
        ));
        // A version 1 header (written by older builds) still decodes.
        let old = PoolHeader { version: 1, ..h };
        assert_eq!(PoolHeader::decode(&old.encode()).unwrap(), old);
        assert!(matches!(
            PoolHeader::decode(&[0u8; 256]),
            Err(PoolError::NotAPool { .. })
        ));
        assert!(matches!(
            PoolHeader::decode(&[1u8; 100]),
            Err(PoolError::NotAPool { .. })
        ));
    }

    #[test]
    fn class_entries_round_trip_and_detect_damage() {
        let e = ClassEntry {
            unit: 131072,
            pages: 4096,
            header: 2,
            align_code: 13,
        };
        for id in [1u8, 77, 254] {
            let w = e.encode(id);
            assert_ne!(w, 0);
            assert_eq!(ClassEntry::decode(id, w), Ok(Some(e)));
            assert_eq!(ClassEntry::fields(w), e);
            // The check covers the id: an entry copied to another slot is caught.
            assert!(ClassEntry::decode(id.wrapping_add(1), w).is_err());
            for bit in 0..64 {
                assert!(ClassEntry::decode(id, w ^ 1 << bit).is_err(), "bit {bit}");
            }
        }
        assert_eq!(ClassEntry::decode(9, 0), Ok(None));
        assert_eq!(run_word1(48, 7), 48 | 7 << 32);
    }
}

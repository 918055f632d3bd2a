//! The persistent layout of the ordered map: type numbers, the header, leaf, inner node
//! and blob formats, and [`Geometry`], the sizes a map fixes at creation. Every integer is
//! little-endian; every node is one pool object. The commit protocol over these bytes is
//! in the crate docs.
//!
//! Invariants: a map's geometry is written once, in its header, before the header is
//! published, and never changes; every node's size follows from it. Decoding a geometry
//! word validates it, so a corrupt header is an error and never an out-of-range size.

/// Pool type numbers `TYPE_BASE..TYPE_BASE + 0x1_0000` are the collections'; programs
/// must not allocate objects of these types (`check` judges them by reachability).
pub const TYPE_BASE: u64 = 0x5452_434f_0000_0000; // "TRCO"
/// A map header (also the directory's).
pub const TYPE_MAP: u64 = TYPE_BASE | 1;
/// A leaf node.
pub const TYPE_LEAF: u64 = TYPE_BASE | 2;
/// An inner node.
pub const TYPE_INNER: u64 = TYPE_BASE | 3;
/// An out-of-line value: `len: u64` then the bytes.
pub const TYPE_BLOB: u64 = TYPE_BASE | 4;
/// A hash map header.
pub const TYPE_HASH: u64 = TYPE_BASE | 5;
/// A hash map bucket page (the leaf layout).
pub const TYPE_BUCKET: u64 = TYPE_BASE | 6;
/// A hash map segment: bucket words.
pub const TYPE_SEGMENT: u64 = TYPE_BASE | 7;
/// A hash map table: `capacity`, then segment offsets.
pub const TYPE_TABLE: u64 = TYPE_BASE | 8;
/// A persistent array: header and elements in one object ([`crate::array`]).
pub const TYPE_ARRAY: u64 = TYPE_BASE | 9;

/// Whether objects of pool type `type_num` belong to the collections.
pub fn is_collection_type(type_num: u64) -> bool {
    type_num & !0xffff == TYPE_BASE
}

/// Header: magic.
pub const MAP_MAGIC: u64 = u64::from_le_bytes(*b"TRCOMAP1");
/// Header word offsets: magic, geometry, root node (0: empty map), height (inner levels
/// above the leaves).
pub const H_MAGIC: u64 = 0;
pub const H_GEOMETRY: u64 = 8;
pub const H_ROOT: u64 = 16;
pub const H_HEIGHT: u64 = 24;
/// Bytes of a map header object.
pub const HEADER_SIZE: u64 = 64;

/// Leaf (and hash bucket page: the same layout), sized in whole cache lines and allocated
/// 64-byte aligned: the first line holds the live-slot bitmap word (the commit word of
/// single-page updates) and one fingerprint byte per slot (56 bytes whatever the slot
/// count), so a lookup reads one line before the slot it wants; then the slots; then the
/// next page of a bucket's overflow chain (0 in a leaf), at [`Geometry::next_off`].
pub const LEAF_BITMAP: u64 = 0;
pub const LEAF_FPS: u64 = 8;
pub const LEAF_SLOTS: u64 = 64;
/// Most slots a page has (the fingerprints fill the rest of its first cache line).
pub const MAX_LEAF_SLOTS: u32 = 56;

/// Inner node, first cache line: separator count `n`, then [`INNER_SAMPLES`] sample
/// words (sample `k` is the prefix word of separator `(k + 1) * block`, or `u64::MAX`
/// past `n`; see [`Geometry::sample_block`]), so a search reads this line, then the one
/// block of prefix words the samples point it to. Then `fanout` child words (`n + 1`
/// used), `fanout - 1` separator prefix words (each separator's first 8 bytes, zero-padded,
/// as a big-endian word: the search compares words and reads a whole separator only on a
/// tie), and `fanout - 1` separators of `1 + key_cap` bytes (length byte, key bytes).
pub const INNER_COUNT: u64 = 0;
pub const INNER_SAMPLE_OFF: u64 = 8;
pub const INNER_SAMPLES: u32 = 7;
pub const INNER_CHILDREN: u64 = 64;

/// A slot's value-length byte saying the value is out of line: the value area's first
/// word is the offset of a [`TYPE_BLOB`] object.
pub const OUT_OF_LINE: u8 = 255;
/// Longest value kept in a slot.
pub const MAX_INLINE: u32 = 254;
/// Most inner-node children.
pub const MAX_FANOUT: u32 = 1024;

/// The sizes a map fixes at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Longest key in bytes (0..=255).
    pub key_cap: u32,
    /// Bytes of a slot's value area (8..=254): values up to this long are inline.
    pub val_area: u32,
    /// Slots per leaf or bucket page (4..=56).
    pub leaf_slots: u32,
    /// Children per inner node (4..=1024).
    pub fanout: u32,
}

impl Geometry {
    /// The geometry for keys up to `max_key` bytes and values inline up to
    /// `inline_value` bytes (raised to 8, the size of an out-of-line reference), with
    /// 64-slot leaves and inner nodes of about 4 KiB.
    pub fn new(max_key: u32, inline_value: u32) -> Geometry {
        let fanout = (4032 / (17 + max_key as u64)).clamp(16, MAX_FANOUT as u64) as u32;
        Geometry {
            key_cap: max_key,
            val_area: inline_value.max(8),
            leaf_slots: MAX_LEAF_SLOTS,
            fanout,
        }
    }

    /// Validates every field's range.
    pub fn validate(&self) -> Result<(), String> {
        if self.key_cap > 255 {
            return Err(format!("max key {} is above 255", self.key_cap));
        }
        if !(8..=MAX_INLINE).contains(&self.val_area) {
            return Err(format!("value area {} is outside 8..=254", self.val_area));
        }
        if !(4..=MAX_LEAF_SLOTS).contains(&self.leaf_slots) {
            return Err(format!("leaf slots {} outside 4..=56", self.leaf_slots));
        }
        if !(4..=MAX_FANOUT).contains(&self.fanout) {
            return Err(format!("fanout {} outside 4..=1024", self.fanout));
        }
        Ok(())
    }

    /// The header's geometry word.
    pub fn encode(&self) -> u64 {
        self.key_cap as u64
            | (self.val_area as u64) << 8
            | (self.leaf_slots as u64) << 16
            | (self.fanout as u64) << 24
    }

    /// Decodes and validates a geometry word.
    pub fn decode(word: u64) -> Result<Geometry, String> {
        if word >> 40 != 0 {
            return Err(format!("geometry word {word:#x} has unknown bits set"));
        }
        let g = Geometry {
            key_cap: (word & 0xff) as u32,
            val_area: (word >> 8 & 0xff) as u32,
            leaf_slots: (word >> 16 & 0xff) as u32,
            fanout: (word >> 24 & 0xffff) as u32,
        };
        g.validate()?;
        Ok(g)
    }

    /// Bytes of one leaf slot: key length, value length, key area, value area.
    pub fn slot_size(&self) -> u64 {
        2 + self.key_cap as u64 + self.val_area as u64
    }

    /// Refuses a key longer than the map's maximum.
    pub fn check_key(&self, key: &[u8]) -> Result<(), crate::CollectionError> {
        if key.len() > self.key_cap as usize {
            return Err(crate::CollectionError::KeyTooLong {
                len: key.len(),
                max: self.key_cap,
            });
        }
        Ok(())
    }

    /// Offset of slot `i` in a leaf.
    pub fn slot_off(&self, i: u32) -> u64 {
        LEAF_SLOTS + i as u64 * self.slot_size()
    }

    /// The home slot of a key of hash `h` in a page: writers put an entry in the first
    /// free slot at or after it (wrapping), so a lookup can fetch the slot's cache line
    /// together with the page's first line instead of after it. Placement only: readers
    /// find entries by fingerprint wherever they are, so nothing depends on it.
    pub fn home_slot(&self, h: u64) -> u32 {
        ((((h >> 24) & 0xffff_ffff) * self.leaf_slots as u64) >> 32) as u32
    }

    /// The slot a new entry of hash `h` takes among the `free` ones (bits of a page's
    /// slots; not 0): the first free slot at or after its home slot, else the lowest.
    pub fn pick_slot(&self, free: u64, h: u64) -> u32 {
        debug_assert!(free != 0);
        let above = free & (u64::MAX << self.home_slot(h));
        if above != 0 {
            above.trailing_zeros()
        } else {
            free.trailing_zeros()
        }
    }

    /// Offset of a page's next word (8-byte aligned, after the slots).
    pub fn next_off(&self) -> u64 {
        self.slot_off(self.leaf_slots).next_multiple_of(8)
    }

    /// Bytes of a leaf or bucket page: whole cache lines, so that the pool's size class
    /// for it (every class from 1 KiB up is a multiple of 32, and a multiple of 64 is a
    /// class) keeps every page 64-byte aligned.
    pub fn leaf_size(&self) -> u64 {
        (self.next_off() + 8).next_multiple_of(64)
    }

    /// The bitmap of a leaf whose every slot is live.
    pub fn full_bitmap(&self) -> u64 {
        if self.leaf_slots == 64 {
            u64::MAX
        } else {
            (1u64 << self.leaf_slots) - 1
        }
    }

    /// Offset of child word `i` in an inner node.
    pub fn child_off(&self, i: u32) -> u64 {
        INNER_CHILDREN + 8 * i as u64
    }

    /// Separators per sampled block of an inner node: the samples split the prefix words
    /// into at most `INNER_SAMPLES + 1` blocks.
    pub fn sample_block(&self) -> u32 {
        (self.fanout - 1).div_ceil(INNER_SAMPLES + 1)
    }

    /// Offset of separator `i`'s prefix word in an inner node.
    pub fn prefix_off(&self, i: u32) -> u64 {
        INNER_CHILDREN + 8 * self.fanout as u64 + 8 * i as u64
    }

    /// Offset of separator `i` in an inner node.
    pub fn sep_off(&self, i: u32) -> u64 {
        self.prefix_off(self.fanout - 1) + i as u64 * (1 + self.key_cap as u64)
    }

    /// Bytes of an inner node.
    pub fn inner_size(&self) -> u64 {
        // Whole cache lines, so the node is 64-byte aligned (as a page is).
        self.sep_off(self.fanout - 1).next_multiple_of(64)
    }
}

/// A key's prefix word: its first 8 bytes, zero-padded, big-endian. Prefix words order as
/// the keys do, except that equal words say nothing.
pub fn prefix_word(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// A key's 64-bit hash. Its top byte is the key's fingerprint, bits 24..56 pick its home
/// slot in a page ([`Geometry::home_slot`]), and a hash map's bucket is its low bits.
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

/// The fingerprint of a key of hash `h`: the byte a page keeps per slot so that a lookup
/// compares only the keys whose fingerprint matches.
pub fn fingerprint_of(h: u64) -> u8 {
    (h >> 56) as u8
}

/// A key's fingerprint ([`fingerprint_of`] its [`key_hash`]).
pub fn fingerprint(key: &[u8]) -> u8 {
    fingerprint_of(key_hash(key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_round_trips_and_rejects_bad_words() {
        let g = Geometry::new(16, 8);
        assert_eq!(Geometry::decode(g.encode()), Ok(g));
        assert_eq!(g.slot_size(), 26);
        assert_eq!(
            g.leaf_size(),
            1536,
            "56 slots of 26 bytes, header and next word"
        );
        assert!(g.inner_size() <= 4096);
        assert!(Geometry::decode(1 << 50).is_err());
        // Placement: the home slot when free, the next free one after it, else wrap.
        let h = (0..u64::MAX)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .find(|&h| g.home_slot(h) == 40)
            .unwrap();
        let all = g.full_bitmap();
        assert_eq!(g.pick_slot(all, h), 40);
        assert_eq!(g.pick_slot(all & !(0b111 << 40), h), 43);
        assert_eq!(
            g.pick_slot(0b110, h),
            1,
            "nothing free at or above 40: the lowest"
        );
        assert!((0..1000u64).all(|i| g.home_slot(i << 40) < g.leaf_slots));
        assert!(
            Geometry::decode(g.encode() & !(0xff << 16)).is_err(),
            "0 leaf slots"
        );
        assert!(
            Geometry::decode(16 | 4 << 8 | 64 << 16 | 16 << 24).is_err(),
            "value area 4"
        );
    }
}

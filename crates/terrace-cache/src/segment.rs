//! The segment codec: the 64-byte header with its commit word, a [`SegmentWriter`] that
//! appends items to any `&mut [u8]` (a DRAM buffer or a slice of a mapped file), and a
//! [`SegmentReader`] whose [`Items`] iterator walks the committed items and ends with a
//! typed [`ScanEnd`]. The byte layout and the commit protocol are in `docs/cache-format.md`
//! ("Segment format", "Commit protocol"); [`RawHeader`] and the asserts at the bottom pin
//! them.
//!
//! Invariants of a segment buffer `s` with header `h` and commit word `(committed, crc)`:
//! - `s.len() == 1 << h.size_shift`, `HEADER_LEN + committed <= s.len()`;
//! - `s[HEADER_LEN .. HEADER_LEN + committed]` is a sequence of whole encoded items, each
//!   written before the commit word that covers it;
//! - when the segment is checksummed, `crc == crc32(h.write_seq as LE bytes ‖ every
//!   committed item without its state byte)`;
//! - nothing reads past the committed end: whatever lies beyond (a torn item, an earlier
//!   incarnation's bytes) is invisible.

use crate::error::{EncodeError, HeaderError, ItemError};
use crate::item::{self, ItemLimits, ItemRef, ItemSpec, ItemState};

/// Bytes of the segment header; items start here.
pub const HEADER_LEN: usize = 64;
/// First eight bytes of every written segment.
pub const MAGIC: [u8; 8] = *b"TRCSEGM\0";
/// The format version this build writes. Version 2 added the item's own expiry
/// (`item::KIND_HAS_EXPIRY`); a version-1 segment is read as it was written (its items
/// expire with the segment), so an upgrade keeps a warm cache.
pub const FORMAT_VERSION: u16 = 2;
/// The oldest format version this build reads.
pub const MIN_FORMAT_VERSION: u16 = 1;
/// Smallest segment: 256 bytes (tests); real tiers use 1 MiB and up.
pub const MIN_SHIFT: u8 = 8;
/// Largest segment: 2 GiB, so offsets and the committed length fit in a `u32`.
pub const MAX_SHIFT: u8 = 31;
/// Header flag: the commit word carries a running CRC of the items.
pub const FLAG_DATA_CRC: u32 = 0x1;
/// Header flags this format version defines.
pub const FLAGS_KNOWN: u32 = FLAG_DATA_CRC;
/// Bytes of the header covered by `header_crc`.
pub const HEADER_CRC_COVERS: usize = 52;
/// Offset of the 8-byte commit word (`committed` then `data_crc`).
pub const COMMIT_WORD_OFFSET: usize = 56;

/// The segment header as laid out on media (documentation struct: never transmuted from
/// segment bytes; the encoders below write each field little-endian at its offset).
#[repr(C)]
pub struct RawHeader {
    pub magic: [u8; 8],
    pub version: u16,
    pub tier: u8,
    pub size_shift: u8,
    pub flags: u32,
    pub write_seq: u64,
    pub slot: u32,
    pub created_at: u32,
    pub expires_at: u32,
    pub ttl_bucket: u16,
    pub reserved: [u8; 14],
    pub header_crc: u32,
    pub committed: u32,
    pub data_crc: u32,
}

/// The immutable part of a segment header: written once when the segment is opened for
/// appending, covered by the header checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Index of the tier (0 = fastest) the segment belongs to.
    pub tier: u8,
    /// Segment size is `1 << size_shift` bytes.
    pub size_shift: u8,
    /// Whether the commit word carries a running CRC of the items.
    pub checksummed: bool,
    /// Monotonic across the whole cache (all tiers): orders segments by age and makes CAS
    /// values unique. Never 0.
    pub write_seq: u64,
    /// Index of the segment in its tier's region (checked at restart against where the
    /// segment was found, so a shifted or truncated file is detected).
    pub slot: u32,
    /// Unix seconds when the segment was opened.
    pub created_at: u32,
    /// Unix seconds after which every item of the segment has expired; 0 = never.
    pub expires_at: u32,
    /// The TTL bucket the segment was opened for (engine bookkeeping).
    pub ttl_bucket: u16,
}

/// The commit word: how many item bytes are committed, and their running CRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Commit {
    pub committed: u32,
    pub data_crc: u32,
}

impl Commit {
    /// The word as one little-endian `u64` (`committed` in the low half), the unit a
    /// media-backed writer stores atomically.
    pub fn word(self) -> u64 {
        u64::from(self.committed) | (u64::from(self.data_crc) << 32)
    }

    pub fn from_word(word: u64) -> Commit {
        Commit {
            committed: word as u32,
            data_crc: (word >> 32) as u32,
        }
    }
}

/// The data CRC of a segment with no items: the CRC of its write sequence, so that a
/// commit word left over from an earlier incarnation of the same slot never validates.
pub fn data_crc_seed(write_seq: u64) -> u32 {
    crc32fast::hash(&write_seq.to_le_bytes())
}

fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl SegmentHeader {
    /// Segment size in bytes.
    pub fn size(&self) -> usize {
        1usize << self.size_shift
    }

    /// Bytes available to items.
    pub fn capacity(&self) -> u32 {
        (self.size() - HEADER_LEN) as u32
    }

    /// The largest write sequence a segment of this size can carry: `write_seq <<
    /// size_shift` must fit in 64 bits (it is the high part of every CAS value).
    pub fn max_write_seq(size_shift: u8) -> u64 {
        u64::MAX >> size_shift
    }

    /// The CAS value of a fresh item at `offset`: its position in the infinite log,
    /// `write_seq << size_shift | offset`. Unique for as long as write sequences are.
    pub fn cas_at(&self, offset: u32) -> u64 {
        (self.write_seq << self.size_shift) | u64::from(offset)
    }

    /// The CAS of `item`: its origin CAS when it was moved or touched, else where it lives.
    pub fn cas_of(&self, item: &ItemRef<'_>) -> u64 {
        item.origin_cas.unwrap_or_else(|| self.cas_at(item.offset))
    }

    fn validate(&self) -> Result<(), EncodeError> {
        if !(MIN_SHIFT..=MAX_SHIFT).contains(&self.size_shift) {
            return Err(EncodeError::BadShift {
                shift: self.size_shift,
                min: MIN_SHIFT,
                max: MAX_SHIFT,
            });
        }
        if self.write_seq == 0 || self.write_seq > Self::max_write_seq(self.size_shift) {
            return Err(EncodeError::BadWriteSeq {
                seq: self.write_seq,
                shift: self.size_shift,
            });
        }
        Ok(())
    }

    /// The 64 header bytes of a segment with no committed items.
    pub fn encode(&self) -> Result<[u8; HEADER_LEN], EncodeError> {
        self.validate()?;
        let mut b = [0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[10] = self.tier;
        b[11] = self.size_shift;
        let flags = if self.checksummed { FLAG_DATA_CRC } else { 0 };
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.write_seq.to_le_bytes());
        b[24..28].copy_from_slice(&self.slot.to_le_bytes());
        b[28..32].copy_from_slice(&self.created_at.to_le_bytes());
        b[32..36].copy_from_slice(&self.expires_at.to_le_bytes());
        b[36..38].copy_from_slice(&self.ttl_bucket.to_le_bytes());
        let crc = crc32fast::hash(&b[..HEADER_CRC_COVERS]);
        b[52..56].copy_from_slice(&crc.to_le_bytes());
        let commit = Commit {
            committed: 0,
            data_crc: self.empty_crc(),
        };
        b[56..64].copy_from_slice(&commit.word().to_le_bytes());
        Ok(b)
    }

    fn empty_crc(&self) -> u32 {
        if self.checksummed {
            data_crc_seed(self.write_seq)
        } else {
            0
        }
    }

    /// Parses and validates the header at the start of `buf`.
    pub fn decode(buf: &[u8]) -> Result<(SegmentHeader, Commit), HeaderError> {
        let b = buf
            .get(..HEADER_LEN)
            .ok_or(HeaderError::TooShort { len: buf.len() })?;
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&b[0..8]);
        if magic == [0u8; 8] {
            return Err(HeaderError::Unwritten);
        }
        if magic != MAGIC {
            return Err(HeaderError::BadMagic { found: magic });
        }
        let version = get_u16(b, 8);
        if !(MIN_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(HeaderError::UnsupportedVersion {
                found: version,
                oldest: MIN_FORMAT_VERSION,
                supported: FORMAT_VERSION,
            });
        }
        let stored = get_u32(b, 52);
        let computed = crc32fast::hash(&b[..HEADER_CRC_COVERS]);
        if stored != computed {
            return Err(HeaderError::Checksum { stored, computed });
        }
        let size_shift = b[11];
        if !(MIN_SHIFT..=MAX_SHIFT).contains(&size_shift) {
            return Err(HeaderError::BadShift { shift: size_shift });
        }
        let flags = get_u32(b, 12);
        if flags & !FLAGS_KNOWN != 0 {
            return Err(HeaderError::ReservedFlags { flags });
        }
        let header = SegmentHeader {
            tier: b[10],
            size_shift,
            checksummed: flags & FLAG_DATA_CRC != 0,
            write_seq: get_u64(b, 16),
            slot: get_u32(b, 24),
            created_at: get_u32(b, 28),
            expires_at: get_u32(b, 32),
            ttl_bucket: get_u16(b, 36),
        };
        if header.write_seq == 0 || header.write_seq > Self::max_write_seq(size_shift) {
            return Err(HeaderError::BadWriteSeq {
                seq: header.write_seq,
            });
        }
        let commit = Commit::from_word(get_u64(b, COMMIT_WORD_OFFSET));
        if commit.committed > header.capacity() {
            return Err(HeaderError::CommitOutOfRange {
                committed: commit.committed,
                capacity: header.capacity(),
            });
        }
        Ok((header, commit))
    }
}

/// Writes the commit word into a segment buffer. On media this is one aligned 8-byte
/// store (atomic on x86-64 and power-fail atomic on DAX); the slice version is the same
/// bytes for tests and DRAM.
fn store_commit(buf: &mut [u8], commit: Commit) {
    buf[COMMIT_WORD_OFFSET..HEADER_LEN].copy_from_slice(&commit.word().to_le_bytes());
}

/// Retires a segment in one store: zeroes its commit word so that no item of it is ever
/// scanned again (the eviction protocol's first step; see `docs/cache-format.md`).
pub fn retire(buf: &mut [u8]) -> bool {
    match buf.get_mut(COMMIT_WORD_OFFSET..HEADER_LEN) {
        Some(word) => {
            word.fill(0);
            true
        }
        None => false,
    }
}

/// Appends items to one segment buffer. There is one writer per segment at a time (the
/// single-appender rule in `docs/cache-format.md`), so appends need no atomics and each
/// item is complete before the commit word that covers it is stored.
#[derive(Debug)]
pub struct SegmentWriter<'a> {
    buf: &'a mut [u8],
    header: SegmentHeader,
    limits: ItemLimits,
    committed: u32,
    crc: u32,
}

impl<'a> SegmentWriter<'a> {
    /// Opens `buf` (exactly `1 << header.size_shift` bytes) as a fresh segment: writes the
    /// header and an empty commit word. Bytes past the header are left as they are; they
    /// stay invisible until committed over.
    pub fn create(
        buf: &'a mut [u8],
        header: SegmentHeader,
        limits: ItemLimits,
    ) -> Result<SegmentWriter<'a>, EncodeError> {
        limits.validate()?;
        let bytes = header.encode()?;
        if buf.len() != header.size() {
            return Err(EncodeError::BufferSize {
                len: buf.len(),
                expected: header.size(),
            });
        }
        buf[..HEADER_LEN].copy_from_slice(&bytes);
        Ok(SegmentWriter {
            buf,
            crc: header.empty_crc(),
            header,
            limits,
            committed: 0,
        })
    }

    /// Resumes appending to a segment that scans clean (after a restart). Returns the
    /// scan's end reason when it does not: such a segment is read-only.
    pub fn resume(buf: &'a mut [u8], limits: ItemLimits) -> Result<SegmentWriter<'a>, ResumeError> {
        limits.validate().map_err(ResumeError::Encode)?;
        let reader = SegmentReader::open(buf).map_err(ResumeError::Header)?;
        let end = reader.verify();
        if !end.is_complete() {
            return Err(ResumeError::Scan(end));
        }
        let (header, commit) = (*reader.header(), reader.commit());
        if buf.len() != header.size() {
            return Err(ResumeError::Encode(EncodeError::BufferSize {
                len: buf.len(),
                expected: header.size(),
            }));
        }
        Ok(SegmentWriter {
            buf,
            header,
            limits,
            committed: commit.committed,
            crc: commit.data_crc,
        })
    }

    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// The writer's state, detached from the buffer (see [`Cursor`]).
    pub fn cursor(&self) -> Cursor {
        Cursor {
            header: self.header,
            limits: self.limits,
            committed: self.committed,
            crc: self.crc,
        }
    }

    /// Re-attaches a cursor to its segment's buffer. The buffer's commit word must be the
    /// cursor's (nobody else appended in between).
    pub fn attach(buf: &'a mut [u8], cursor: Cursor) -> Result<SegmentWriter<'a>, EncodeError> {
        if buf.len() != cursor.header.size() {
            return Err(EncodeError::BufferSize {
                len: buf.len(),
                expected: cursor.header.size(),
            });
        }
        let mut word = [0u8; 8];
        word.copy_from_slice(&buf[COMMIT_WORD_OFFSET..HEADER_LEN]);
        let expected = Commit {
            committed: cursor.committed,
            data_crc: cursor.crc,
        };
        if Commit::from_word(u64::from_le_bytes(word)) != expected {
            return Err(EncodeError::CursorMismatch);
        }
        Ok(SegmentWriter {
            buf,
            header: cursor.header,
            limits: cursor.limits,
            committed: cursor.committed,
            crc: cursor.crc,
        })
    }

    /// Item bytes committed so far.
    pub fn committed(&self) -> u32 {
        self.committed
    }

    /// Item bytes still free.
    pub fn remaining(&self) -> usize {
        self.header.capacity() as usize - self.committed as usize
    }

    /// The whole segment buffer.
    pub fn bytes(&self) -> &[u8] {
        self.buf
    }

    /// Appends a PENDING item and commits it; returns its offset in the segment.
    pub fn append(
        &mut self,
        spec: &ItemSpec,
        key: &[u8],
        value: &[u8],
    ) -> Result<u32, EncodeError> {
        spec.matches(key, value.len())?;
        let mut pending = self.reserve(spec, key)?;
        pending.value_mut().copy_from_slice(value);
        Ok(pending.commit())
    }

    /// Writes the header and key of a PENDING item and hands out its value bytes to be
    /// filled in place (for instance straight from a socket). Nothing is visible until
    /// [`PendingItem::commit`]; dropping the pending item abandons it.
    pub fn reserve(
        &mut self,
        spec: &ItemSpec,
        key: &[u8],
    ) -> Result<PendingItem<'_, 'a>, EncodeError> {
        self.limits.check(key.len(), spec.value_len as usize)?;
        spec.matches(key, spec.value_len as usize)?;
        let need = spec.encoded_len();
        if need > self.remaining() {
            return Err(EncodeError::SegmentFull {
                need,
                available: self.remaining(),
            });
        }
        let start = HEADER_LEN + self.committed as usize;
        let out = &mut self.buf[start..start + need];
        let h = item::encode_header(spec, out)?;
        out[h..h + key.len()].copy_from_slice(key);
        Ok(PendingItem {
            value_start: start + h + key.len(),
            start,
            len: need,
            writer: self,
        })
    }

    /// Flips the state of a committed item. Returns false when `offset` is not inside the
    /// committed range.
    pub fn set_state(&mut self, offset: u32, state: ItemState) -> bool {
        let end = HEADER_LEN as u64 + u64::from(self.committed);
        (offset as usize) >= HEADER_LEN
            && u64::from(offset) < end
            && item::set_state(self.buf, offset, state)
    }

    fn commit_range(&mut self, start: usize, len: usize) -> u32 {
        if self.header.checksummed {
            let mut h = crc32fast::Hasher::new_with_initial(self.crc);
            item::hash_item(&mut h, &self.buf[start..start + len]);
            self.crc = h.finalize();
        }
        self.committed += len as u32;
        store_commit(
            self.buf,
            Commit {
                committed: self.committed,
                data_crc: self.crc,
            },
        );
        start as u32
    }
}

/// A [`SegmentWriter`]'s state without its buffer, so an engine can keep an open
/// segment's append position between appends without holding a borrow of the segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    pub header: SegmentHeader,
    pub limits: ItemLimits,
    pub committed: u32,
    pub crc: u32,
}

impl Cursor {
    /// Item bytes still free.
    pub fn remaining(&self) -> usize {
        self.header.capacity() as usize - self.committed as usize
    }
}

/// An item whose header and key are written but which is not committed yet.
#[derive(Debug)]
pub struct PendingItem<'w, 'a> {
    writer: &'w mut SegmentWriter<'a>,
    start: usize,
    value_start: usize,
    len: usize,
}

impl PendingItem<'_, '_> {
    /// The value's bytes, to be filled before committing.
    pub fn value_mut(&mut self) -> &mut [u8] {
        &mut self.writer.buf[self.value_start..self.start + self.len]
    }

    /// Offset the item will have.
    pub fn offset(&self) -> u32 {
        self.start as u32
    }

    /// Commits the item (still PENDING: publication flips it LIVE); returns its offset.
    pub fn commit(self) -> u32 {
        self.writer.commit_range(self.start, self.len)
    }
}

/// Why a segment cannot be resumed for appending.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResumeError {
    #[error("segment header rejected: {0}")]
    Header(HeaderError),
    #[error("segment does not scan clean: {0:?}")]
    Scan(ScanEnd),
    #[error(transparent)]
    Encode(EncodeError),
}

/// How a walk over a segment's committed items ended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScanEnd {
    /// Every committed item decoded and (when checksummed) the running CRC matched.
    Complete,
    /// The buffer ends before the committed range does (a truncated file): the items
    /// yielded are the ones wholly inside the buffer.
    Truncated {
        offset: u32,
        committed_end: u64,
        len: usize,
    },
    /// The bytes at `offset`, inside the committed range, are not an item.
    Corrupt { offset: u32, error: ItemError },
    /// All items decoded but their CRC differs from the commit word's.
    ChecksumMismatch { stored: u32, computed: u32 },
}

impl ScanEnd {
    /// True when the items yielded can be trusted.
    pub fn is_complete(&self) -> bool {
        matches!(self, ScanEnd::Complete)
    }
}

/// A validated segment header over a buffer, ready to walk.
#[derive(Clone, Copy, Debug)]
pub struct SegmentReader<'a> {
    buf: &'a [u8],
    header: SegmentHeader,
    commit: Commit,
}

impl<'a> SegmentReader<'a> {
    /// Validates the header of the segment at the start of `buf`. `buf` may be shorter
    /// than the segment (a truncated file); bytes past the segment size are ignored.
    pub fn open(buf: &'a [u8]) -> Result<SegmentReader<'a>, HeaderError> {
        let (header, commit) = SegmentHeader::decode(buf)?;
        let buf = &buf[..buf.len().min(header.size())];
        Ok(SegmentReader {
            buf,
            header,
            commit,
        })
    }

    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    pub fn commit(&self) -> Commit {
        self.commit
    }

    /// Offset just past the last committed item.
    pub fn committed_end(&self) -> u64 {
        HEADER_LEN as u64 + u64::from(self.commit.committed)
    }

    /// Decodes the item at `offset` (taken from the index), bounded by the committed end.
    pub fn item_at(&self, offset: u32) -> Result<ItemRef<'a>, ItemError> {
        if (offset as usize) < HEADER_LEN {
            return Err(ItemError::Overrun {
                len: 0,
                end: offset as usize,
            });
        }
        item::decode(self.buf, offset, self.committed_end() as usize)
    }

    /// True when the commit word is zero: the segment was retired (or never held an
    /// item, unchecksummed). It has no items and nothing to verify.
    pub fn is_retired(&self) -> bool {
        self.commit.word() == 0
    }

    /// Walks the committed items in write order.
    pub fn items(&self) -> Items<'a> {
        Items {
            buf: self.buf,
            pos: HEADER_LEN,
            end: self.committed_end() as usize,
            hasher: (self.header.checksummed && !self.is_retired())
                .then(|| crc32fast::Hasher::new_with_initial(data_crc_seed(self.header.write_seq))),
            stored_crc: self.commit.data_crc,
            done: None,
        }
    }

    /// Walks every item and reports how the walk ended.
    pub fn verify(&self) -> ScanEnd {
        let mut items = self.items();
        for _ in items.by_ref() {}
        items.done.unwrap_or(ScanEnd::Complete)
    }
}

/// Iterator over a segment's committed items. Items are yielded as they decode; the
/// checksum can only be judged at the end, so a consumer that must not trust a corrupt
/// segment collects what it needs and acts only when [`Items::end`] is
/// [`ScanEnd::Complete`].
#[derive(Clone, Debug)]
pub struct Items<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
    hasher: Option<crc32fast::Hasher>,
    stored_crc: u32,
    done: Option<ScanEnd>,
}

impl<'a> Items<'a> {
    /// How the walk ended; `None` while items remain.
    pub fn end(&self) -> Option<&ScanEnd> {
        self.done.as_ref()
    }

    fn finish(&mut self) {
        let end = match self.hasher.take() {
            Some(h) => {
                let computed = h.finalize();
                if computed == self.stored_crc {
                    ScanEnd::Complete
                } else {
                    ScanEnd::ChecksumMismatch {
                        stored: self.stored_crc,
                        computed,
                    }
                }
            }
            None => ScanEnd::Complete,
        };
        self.done = Some(end);
    }
}

impl<'a> Iterator for Items<'a> {
    type Item = ItemRef<'a>;

    fn next(&mut self) -> Option<ItemRef<'a>> {
        if self.done.is_some() {
            return None;
        }
        if self.pos >= self.end {
            self.finish();
            return None;
        }
        match item::decode(self.buf, self.pos as u32, self.end) {
            Ok(found) => {
                let next = found.end() as usize;
                if let Some(h) = self.hasher.as_mut() {
                    item::hash_item(h, &self.buf[self.pos..next]);
                }
                self.pos = next;
                Some(found)
            }
            Err(error) => {
                self.done = Some(match error {
                    ItemError::Overrun { .. } | ItemError::Varint { .. }
                        if self.buf.len() < self.end =>
                    {
                        ScanEnd::Truncated {
                            offset: self.pos as u32,
                            committed_end: self.end as u64,
                            len: self.buf.len(),
                        }
                    }
                    error => ScanEnd::Corrupt {
                        offset: self.pos as u32,
                        error,
                    },
                });
                None
            }
        }
    }
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<RawHeader>() == HEADER_LEN);
    assert!(offset_of!(RawHeader, version) == 8);
    assert!(offset_of!(RawHeader, tier) == 10);
    assert!(offset_of!(RawHeader, size_shift) == 11);
    assert!(offset_of!(RawHeader, flags) == 12);
    assert!(offset_of!(RawHeader, write_seq) == 16);
    assert!(offset_of!(RawHeader, slot) == 24);
    assert!(offset_of!(RawHeader, created_at) == 28);
    assert!(offset_of!(RawHeader, expires_at) == 32);
    assert!(offset_of!(RawHeader, ttl_bucket) == 36);
    assert!(offset_of!(RawHeader, reserved) == 38);
    assert!(offset_of!(RawHeader, header_crc) == HEADER_CRC_COVERS);
    assert!(offset_of!(RawHeader, committed) == COMMIT_WORD_OFFSET);
    assert!(offset_of!(RawHeader, data_crc) == COMMIT_WORD_OFFSET + 4);
    // The commit word is one naturally aligned u64.
    assert!(COMMIT_WORD_OFFSET.is_multiple_of(8));
};

#[cfg(test)]
mod tests {
    use super::*;

    fn header(shift: u8) -> SegmentHeader {
        SegmentHeader {
            tier: 1,
            size_shift: shift,
            checksummed: true,
            write_seq: 42,
            slot: 7,
            created_at: 1_700_000_000,
            expires_at: 0,
            ttl_bucket: 3,
        }
    }

    #[test]
    fn crc32fast_continues_from_a_value() {
        let whole = crc32fast::hash(b"hello world");
        let mut h = crc32fast::Hasher::new_with_initial(crc32fast::hash(b"hello "));
        h.update(b"world");
        assert_eq!(h.finalize(), whole);
    }

    #[test]
    fn header_round_trip() {
        let h = header(12);
        let bytes = h.encode().unwrap();
        let (back, commit) = SegmentHeader::decode(&bytes).unwrap();
        assert_eq!(back, h);
        assert_eq!(commit.committed, 0);
        assert_eq!(commit.data_crc, data_crc_seed(42));
        assert_eq!(h.cas_at(100), (42 << 12) | 100);
    }

    #[test]
    fn header_rejections() {
        let h = header(12);
        let good = h.encode().unwrap();
        assert_eq!(
            SegmentHeader::decode(&good[..63]),
            Err(HeaderError::TooShort { len: 63 })
        );
        assert_eq!(
            SegmentHeader::decode(&[0u8; 64]),
            Err(HeaderError::Unwritten)
        );
        let mut b = good;
        b[0] = b'X';
        assert!(matches!(
            SegmentHeader::decode(&b),
            Err(HeaderError::BadMagic { .. })
        ));
        let mut b = good;
        b[8] = 3;
        assert!(matches!(
            SegmentHeader::decode(&b),
            Err(HeaderError::UnsupportedVersion { found: 3, .. })
        ));
        // Version 1 (no per-item expiry) is still read.
        let mut b = good;
        b[8] = 1;
        let crc = crc32fast::hash(&b[..HEADER_CRC_COVERS]);
        b[52..56].copy_from_slice(&crc.to_le_bytes());
        assert!(SegmentHeader::decode(&b).is_ok());
        let mut b = good;
        b[20] ^= 1;
        assert!(matches!(
            SegmentHeader::decode(&b),
            Err(HeaderError::Checksum { .. })
        ));
        // The commit word is not covered by the header CRC but is range-checked.
        let mut b = good;
        b[56..60].copy_from_slice(&5000u32.to_le_bytes());
        assert!(matches!(
            SegmentHeader::decode(&b),
            Err(HeaderError::CommitOutOfRange {
                committed: 5000,
                ..
            })
        ));
        assert!(matches!(
            SegmentHeader { write_seq: 0, ..h }.encode(),
            Err(EncodeError::BadWriteSeq { .. })
        ));
        assert!(matches!(
            SegmentHeader { size_shift: 7, ..h }.encode(),
            Err(EncodeError::BadShift { .. })
        ));
        assert!(SegmentHeader {
            write_seq: SegmentHeader::max_write_seq(12) + 1,
            ..h
        }
        .encode()
        .is_err());
    }

    #[test]
    fn write_then_scan() {
        let mut buf = vec![0u8; 1 << 12];
        let mut w = SegmentWriter::create(&mut buf, header(12), ItemLimits::default()).unwrap();
        let a = w
            .append(&ItemSpec::new(b"alpha", 3), b"alpha", b"one")
            .unwrap();
        let spec = ItemSpec {
            client_flags: 9,
            ..ItemSpec::new(b"beta", 4)
        };
        let mut p = w.reserve(&spec, b"beta").unwrap();
        p.value_mut().copy_from_slice(b"two!");
        let b = p.commit();
        // An abandoned reservation leaves nothing behind.
        let _abandoned = w.reserve(&ItemSpec::new(b"gamma", 2), b"gamma").unwrap();
        assert!(w.set_state(a, ItemState::Live));
        assert!(!w.set_state(3, ItemState::Live));
        assert_eq!(a as usize, HEADER_LEN);
        let committed = w.committed();
        let cursor = w.cursor();

        let r = SegmentReader::open(&buf).unwrap();
        assert_eq!(r.commit().committed, committed);
        let mut items = r.items();
        let got: Vec<_> = items.by_ref().collect();
        assert_eq!(items.end(), Some(&ScanEnd::Complete));
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].offset, got[0].state, got[0].key),
            (a, ItemState::Live, &b"alpha"[..])
        );
        assert_eq!(
            (got[1].offset, got[1].value, got[1].client_flags),
            (b, &b"two!"[..], 9)
        );
        // State flips do not disturb the checksum.
        assert_eq!(r.verify(), ScanEnd::Complete);
        assert_eq!(r.item_at(b).unwrap().key, b"beta");
        assert!(r.item_at(0).is_err());

        // Detach and re-attach; a cursor that does not match the buffer is refused.
        let w = SegmentWriter::attach(&mut buf, cursor).unwrap();
        assert_eq!(w.committed(), committed);
        let stale = Cursor {
            committed: 0,
            ..cursor
        };
        assert_eq!(
            SegmentWriter::attach(&mut buf, stale).unwrap_err(),
            EncodeError::CursorMismatch
        );

        // Resume and keep appending.
        let mut w = SegmentWriter::resume(&mut buf, ItemLimits::default()).unwrap();
        w.append(&ItemSpec::new(b"delta", 1), b"delta", b"4")
            .unwrap();
        let r = SegmentReader::open(&buf).unwrap();
        assert_eq!(r.items().count(), 3);
        assert_eq!(r.verify(), ScanEnd::Complete);
    }

    #[test]
    fn full_segment_and_limits() {
        let mut buf = vec![0u8; 256];
        let mut w = SegmentWriter::create(&mut buf, header(8), ItemLimits::default()).unwrap();
        let v = [7u8; 150];
        w.append(&ItemSpec::new(b"k", 150), b"k", &v).unwrap();
        assert!(matches!(
            w.append(&ItemSpec::new(b"k", 150), b"k", &v),
            Err(EncodeError::SegmentFull { .. })
        ));
        assert_eq!(
            w.append(&ItemSpec::new(b"", 1), b"", b"x"),
            Err(EncodeError::EmptyKey)
        );
        let long = [b'k'; 251];
        assert!(matches!(
            w.append(&ItemSpec::new(&long, 1), &long, b"x"),
            Err(EncodeError::KeyTooLong { .. })
        ));
        assert!(matches!(
            w.append(&ItemSpec::new(b"k", 3), b"k", b"four"),
            Err(EncodeError::SpecMismatch { what: "value", .. })
        ));
        assert!(matches!(
            w.append(&ItemSpec::new(b"kk", 1), b"k", b"x"),
            Err(EncodeError::SpecMismatch { what: "key", .. })
        ));
        let mut small = vec![0u8; 100];
        assert!(matches!(
            SegmentWriter::create(&mut small, header(8), ItemLimits::default()),
            Err(EncodeError::BufferSize { .. })
        ));
    }

    #[test]
    fn a_one_mib_value_fits_a_two_mib_segment() {
        let mut buf = vec![0u8; 2 << 20];
        let mut w = SegmentWriter::create(&mut buf, header(21), ItemLimits::default()).unwrap();
        let value = vec![0xAB; 1 << 20];
        let key = [b'k'; 250];
        let at = w
            .append(&ItemSpec::new(&key, value.len()), &key, &value)
            .unwrap();
        let r = SegmentReader::open(&buf).unwrap();
        let item = r.item_at(at).unwrap();
        assert_eq!((item.key.len(), item.value.len()), (250, 1 << 20));
        assert_eq!(r.verify(), ScanEnd::Complete);
        // 64 MiB values (the largest a configuration is expected to allow) take a
        // 4-byte length.
        assert_eq!(item::varint_len(64 << 20), 4);
    }

    #[test]
    fn corruption_and_truncation_are_reported() {
        let mut buf = vec![0u8; 1 << 12];
        let mut w = SegmentWriter::create(&mut buf, header(12), ItemLimits::default()).unwrap();
        let mut offsets = vec![];
        for i in 0..10u8 {
            let key = [b'a' + i; 4];
            offsets.push(w.append(&ItemSpec::new(&key, 20), &key, &[i; 20]).unwrap());
        }
        // A flipped value byte: structure fine, checksum not.
        let mut bad = buf.clone();
        bad[offsets[3] as usize + 10] ^= 0xFF;
        assert!(matches!(
            SegmentReader::open(&bad).unwrap().verify(),
            ScanEnd::ChecksumMismatch { .. }
        ));
        // A bad state byte mid-segment: corrupt at that item.
        let mut bad = buf.clone();
        bad[offsets[5] as usize] = 0x33;
        let r = SegmentReader::open(&bad).unwrap();
        let mut it = r.items();
        assert_eq!(it.by_ref().count(), 5);
        assert!(matches!(it.end(), Some(ScanEnd::Corrupt { offset, .. }) if *offset == offsets[5]));
        // Truncated in the middle of item 7: items 0..7 come back.
        let cut = offsets[7] as usize + 5;
        let r = SegmentReader::open(&buf[..cut]).unwrap();
        let mut it = r.items();
        assert_eq!(it.by_ref().count(), 7);
        assert!(matches!(it.end(), Some(ScanEnd::Truncated { .. })));
        // Retiring hides everything.
        let mut retired = buf.clone();
        assert!(retire(&mut retired));
        let r = SegmentReader::open(&retired).unwrap();
        assert!(r.is_retired());
        assert_eq!(r.commit().committed, 0);
        assert_eq!(r.items().count(), 0);
        assert_eq!(r.verify(), ScanEnd::Complete);
    }

    #[test]
    fn stale_commit_word_from_an_earlier_incarnation_fails() {
        let mut buf = vec![0u8; 1 << 12];
        let mut w = SegmentWriter::create(&mut buf, header(12), ItemLimits::default()).unwrap();
        w.append(&ItemSpec::new(b"old", 3), b"old", b"val").unwrap();
        let old_word = buf[56..64].to_vec();
        // Reopen the slot with a new write sequence; a torn open that kept the old commit
        // word must not validate.
        SegmentWriter::create(
            &mut buf,
            SegmentHeader {
                write_seq: 43,
                ..header(12)
            },
            ItemLimits::default(),
        )
        .unwrap();
        buf[56..64].copy_from_slice(&old_word);
        assert!(matches!(
            SegmentReader::open(&buf).unwrap().verify(),
            ScanEnd::ChecksumMismatch { .. }
        ));
    }
}

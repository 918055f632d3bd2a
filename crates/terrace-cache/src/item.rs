//! The item codec: one item's bytes inside a segment (layout in `docs/cache-format.md`,
//! "Item layout"). Encoding writes a PENDING item; [`set_state`] flips it later; [`decode`]
//! validates one item at an offset without trusting any byte it reads.
//!
//! Invariants:
//! - an encoded item is `1 + 1 + varint(key_len) + varint(value_len) [+ varint(flags)]
//!   [+ varint(expiry)] [+ 8] + key_len + value_len` bytes, computed by
//!   [`ItemSpec::encoded_len`] and nothing else;
//! - varints are canonical LEB128 of a `u32` (at most 5 bytes, no redundant trailing zero
//!   groups), so every item has exactly one encoding and decode∘encode is the identity;
//! - the state byte (offset 0) is the only byte of an item that changes after it is
//!   written; checksums skip it.

use crate::error::{EncodeError, ItemError};

/// State byte of an item that was deleted, overwritten, evicted or moved away. Zero, so
/// that zeroed memory never reads as a live item.
pub const STATE_DEAD: u8 = 0x00;
/// State byte of an item written but not yet published (or whose publication lost a race).
pub const STATE_PENDING: u8 = 0x5A;
/// State byte of the item the index maps its key to.
pub const STATE_LIVE: u8 = 0xA5;

/// Kind bit: a client-flags varint follows the value length.
pub const KIND_HAS_FLAGS: u8 = 0x01;
/// Kind bit: an 8-byte origin CAS follows (the item was moved between segments, or
/// touched: a copy of an earlier version that keeps its CAS).
pub const KIND_HAS_ORIGIN: u8 = 0x02;
/// Kind bit: the item's own expiry follows the client flags, a non-zero varint of Unix
/// seconds (format version 2; a version-1 item expires with its segment).
pub const KIND_HAS_EXPIRY: u8 = 0x04;
/// Kind bits this format version defines; the others must be zero.
pub const KIND_KNOWN: u8 = KIND_HAS_FLAGS | KIND_HAS_ORIGIN | KIND_HAS_EXPIRY;

/// Longest key the format can describe (configured limits may be lower; memcached's is
/// 250).
pub const FORMAT_MAX_KEY: u32 = 65_535;
/// Most bytes a `u32` varint takes.
pub const MAX_VARINT: usize = 5;
/// Smallest possible item: state, kind, two one-byte lengths, a one-byte key.
pub const MIN_ITEM_LEN: usize = 5;

/// The state of an item, from its state byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ItemState {
    Dead,
    Pending,
    Live,
}

impl ItemState {
    /// The on-media byte.
    pub const fn byte(self) -> u8 {
        match self {
            ItemState::Dead => STATE_DEAD,
            ItemState::Pending => STATE_PENDING,
            ItemState::Live => STATE_LIVE,
        }
    }

    /// Parses a state byte; anything else is corruption.
    pub const fn from_byte(byte: u8) -> Result<ItemState, ItemError> {
        match byte {
            STATE_DEAD => Ok(ItemState::Dead),
            STATE_PENDING => Ok(ItemState::Pending),
            STATE_LIVE => Ok(ItemState::Live),
            _ => Err(ItemError::BadState { byte }),
        }
    }
}

/// Size limits enforced when encoding. Decoding enforces only the format's own bounds, so
/// lowering a limit never makes existing segments unreadable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemLimits {
    /// Longest key accepted, 1..=[`FORMAT_MAX_KEY`]. Default 250 (memcached's).
    pub max_key_len: u32,
    /// Longest value accepted. Default 1 MiB; segments must be larger than this.
    pub max_value_len: u32,
}

impl Default for ItemLimits {
    fn default() -> Self {
        ItemLimits {
            max_key_len: 250,
            max_value_len: 1 << 20,
        }
    }
}

impl ItemLimits {
    /// Checks the limits themselves.
    pub fn validate(&self) -> Result<(), EncodeError> {
        if self.max_key_len == 0 || self.max_key_len > FORMAT_MAX_KEY {
            return Err(EncodeError::BadLimits {
                why: "max_key_len must be in 1..=65535",
            });
        }
        Ok(())
    }

    /// Checks a key and a value length against the limits.
    pub fn check(&self, key_len: usize, value_len: usize) -> Result<(), EncodeError> {
        if key_len == 0 {
            return Err(EncodeError::EmptyKey);
        }
        if key_len > self.max_key_len as usize {
            return Err(EncodeError::KeyTooLong {
                len: key_len,
                max: self.max_key_len,
            });
        }
        if value_len > self.max_value_len as usize {
            return Err(EncodeError::ValueTooLong {
                len: value_len,
                max: self.max_value_len,
            });
        }
        Ok(())
    }
}

/// What an item will hold, before it is written: lengths and the optional fields. The key
/// and value bytes are supplied separately (the value may be filled in place, zero-copy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemSpec {
    pub key_len: u32,
    pub value_len: u32,
    /// memcached client flags; 0 costs no bytes.
    pub client_flags: u32,
    /// When the item stops being served, Unix seconds; 0 (never) costs no bytes.
    pub expires_at: u32,
    /// The CAS the item had before a mover copied it (or a touch rewrote it); `None` for
    /// a fresh write, whose CAS is derived from where it lands.
    pub origin_cas: Option<u64>,
}

impl ItemSpec {
    /// A spec for `key` and a value of `value_len` bytes; lengths beyond `u32` saturate and
    /// are rejected by [`ItemLimits::check`].
    pub fn new(key: &[u8], value_len: usize) -> ItemSpec {
        ItemSpec {
            key_len: u32::try_from(key.len()).unwrap_or(u32::MAX),
            value_len: u32::try_from(value_len).unwrap_or(u32::MAX),
            client_flags: 0,
            expires_at: 0,
            origin_cas: None,
        }
    }

    fn kind(&self) -> u8 {
        let mut kind = 0;
        if self.client_flags != 0 {
            kind |= KIND_HAS_FLAGS;
        }
        if self.expires_at != 0 {
            kind |= KIND_HAS_EXPIRY;
        }
        if self.origin_cas.is_some() {
            kind |= KIND_HAS_ORIGIN;
        }
        kind
    }

    /// Bytes from the state byte to the first key byte.
    pub fn header_len(&self) -> usize {
        let mut len = 2 + varint_len(self.key_len) + varint_len(self.value_len);
        if self.client_flags != 0 {
            len += varint_len(self.client_flags);
        }
        if self.expires_at != 0 {
            len += varint_len(self.expires_at);
        }
        if self.origin_cas.is_some() {
            len += 8;
        }
        len
    }

    /// Total bytes of the encoded item.
    pub fn encoded_len(&self) -> usize {
        self.header_len() + self.key_len as usize + self.value_len as usize
    }

    /// Checks that `key` and a value of `value_len` bytes are what the spec announces.
    pub fn matches(&self, key: &[u8], value_len: usize) -> Result<(), EncodeError> {
        if key.len() != self.key_len as usize {
            return Err(EncodeError::SpecMismatch {
                what: "key",
                spec: self.key_len as usize,
                actual: key.len(),
            });
        }
        if value_len != self.value_len as usize {
            return Err(EncodeError::SpecMismatch {
                what: "value",
                spec: self.value_len as usize,
                actual: value_len,
            });
        }
        Ok(())
    }
}

/// Bytes of the canonical LEB128 encoding of `v`.
pub const fn varint_len(v: u32) -> usize {
    match v {
        0..=0x7F => 1,
        0x80..=0x3FFF => 2,
        0x4000..=0x1F_FFFF => 3,
        0x20_0000..=0xFFF_FFFF => 4,
        _ => 5,
    }
}

/// Writes `v` at the start of `out` and returns the bytes written. `out` must hold
/// [`varint_len`]`(v)` bytes (callers size buffers with [`ItemSpec::encoded_len`]).
fn put_varint(out: &mut [u8], mut v: u32) -> usize {
    let mut i = 0;
    loop {
        let low = (v & 0x7F) as u8;
        v >>= 7;
        if v == 0 {
            out[i] = low;
            return i + 1;
        }
        out[i] = low | 0x80;
        i += 1;
    }
}

/// Reads a canonical varint at `buf[*pos..]`, advancing `pos`.
fn get_varint(buf: &[u8], pos: &mut usize, field: &'static str) -> Result<u32, ItemError> {
    let mut v: u32 = 0;
    for i in 0..MAX_VARINT {
        let byte = *buf.get(*pos + i).ok_or(ItemError::Varint { field })?;
        let bits = u32::from(byte & 0x7F);
        if i == MAX_VARINT - 1 && (byte & 0xF0) != 0 {
            // The fifth group holds only the top 4 bits of a u32; no continuation.
            return Err(ItemError::Varint { field });
        }
        v |= bits << (7 * i);
        if byte & 0x80 == 0 {
            if i > 0 && byte == 0 {
                // A trailing zero group: not the canonical (shortest) encoding.
                return Err(ItemError::Varint { field });
            }
            *pos += i + 1;
            return Ok(v);
        }
    }
    Err(ItemError::Varint { field })
}

/// Writes the item header (state PENDING, kind, lengths, optional fields) at the start of
/// `out`; returns the header length. The caller then writes `key_len` key bytes and
/// `value_len` value bytes right after it.
///
/// `out` must be at least [`ItemSpec::header_len`] bytes; otherwise `SegmentFull`.
pub fn encode_header(spec: &ItemSpec, out: &mut [u8]) -> Result<usize, EncodeError> {
    let len = spec.header_len();
    if out.len() < len {
        return Err(EncodeError::SegmentFull {
            need: len,
            available: out.len(),
        });
    }
    out[0] = STATE_PENDING;
    out[1] = spec.kind();
    let mut pos = 2;
    pos += put_varint(&mut out[pos..], spec.key_len);
    pos += put_varint(&mut out[pos..], spec.value_len);
    if spec.client_flags != 0 {
        pos += put_varint(&mut out[pos..], spec.client_flags);
    }
    if spec.expires_at != 0 {
        pos += put_varint(&mut out[pos..], spec.expires_at);
    }
    if let Some(cas) = spec.origin_cas {
        out[pos..pos + 8].copy_from_slice(&cas.to_le_bytes());
        pos += 8;
    }
    debug_assert_eq!(pos, len);
    Ok(len)
}

/// Encodes a whole PENDING item (header, key, value) at the start of `out` and returns
/// its length. ItemLimits are the caller's business (see [`ItemLimits::check`]).
pub fn encode(
    spec: &ItemSpec,
    key: &[u8],
    value: &[u8],
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    spec.matches(key, value.len())?;
    let total = spec.encoded_len();
    if out.len() < total {
        return Err(EncodeError::SegmentFull {
            need: total,
            available: out.len(),
        });
    }
    let h = encode_header(spec, out)?;
    out[h..h + key.len()].copy_from_slice(key);
    out[h + key.len()..total].copy_from_slice(value);
    Ok(total)
}

/// One decoded item, borrowing the segment's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemRef<'a> {
    /// Offset of the item's state byte from the start of the segment.
    pub offset: u32,
    /// Total encoded length.
    pub len: u32,
    pub state: ItemState,
    pub client_flags: u32,
    /// The item's own expiry, Unix seconds; 0: none of its own (it expires with its
    /// segment, see `Cache::item_expiry`).
    pub expires_at: u32,
    pub origin_cas: Option<u64>,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

impl ItemRef<'_> {
    /// The spec this item was encoded from.
    pub fn spec(&self) -> ItemSpec {
        ItemSpec {
            key_len: self.key.len() as u32,
            value_len: self.value.len() as u32,
            client_flags: self.client_flags,
            expires_at: self.expires_at,
            origin_cas: self.origin_cas,
        }
    }

    /// Offset just past the item: where the next item starts.
    pub fn end(&self) -> u32 {
        self.offset + self.len
    }
}

/// The fixed part of an encoded item: everything before the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemHeader {
    pub state: ItemState,
    pub client_flags: u32,
    /// The item's own expiry (0: none).
    pub expires_at: u32,
    pub origin_cas: Option<u64>,
    /// Bytes from the state byte to the first key byte.
    pub header_len: u32,
    pub key_len: u32,
    pub value_len: u32,
}

impl ItemHeader {
    /// Total encoded length of the item, header included.
    pub fn total_len(&self) -> u64 {
        u64::from(self.header_len) + u64::from(self.key_len) + u64::from(self.value_len)
    }

    /// Where the key and the value of an item starting at `start` lie (the caller has
    /// checked that `start + total_len()` is in bounds).
    pub fn key_value_ranges(
        &self,
        start: usize,
    ) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let key_at = start + self.header_len as usize;
        let value_at = key_at + self.key_len as usize;
        (
            key_at..value_at,
            value_at..value_at + self.value_len as usize,
        )
    }
}

/// Longest item header: state, kind, four 5-byte varints and an 8-byte origin CAS.
pub const MAX_HEADER_LEN: usize = 2 + 4 * MAX_VARINT + 8;

/// Decodes the header of the item whose state byte is `head[0]`. `head` may end anywhere
/// after the header (the engine passes a copy of at most [`MAX_HEADER_LEN`] bytes, read
/// atomically); the caller checks [`ItemHeader::total_len`] against the committed end.
/// Never panics.
pub fn decode_header(head: &[u8]) -> Result<ItemHeader, ItemError> {
    let overrun = |len: u64| ItemError::Overrun {
        len,
        end: head.len(),
    };
    if head.len() < 2 {
        return Err(overrun(2));
    }
    let state = ItemState::from_byte(head[0])?;
    let kind = head[1];
    if kind & !KIND_KNOWN != 0 {
        return Err(ItemError::ReservedKind { kind });
    }
    let mut pos = 2;
    let key_len = get_varint(head, &mut pos, "key length")?;
    if key_len == 0 {
        return Err(ItemError::EmptyKey);
    }
    if key_len > FORMAT_MAX_KEY {
        return Err(ItemError::KeyTooLong { len: key_len });
    }
    let value_len = get_varint(head, &mut pos, "value length")?;
    let client_flags = if kind & KIND_HAS_FLAGS != 0 {
        let flags = get_varint(head, &mut pos, "client flags")?;
        if flags == 0 {
            // Zero flags are encoded by omission; an explicit zero is not canonical.
            return Err(ItemError::Varint {
                field: "client flags",
            });
        }
        flags
    } else {
        0
    };
    let expires_at = if kind & KIND_HAS_EXPIRY != 0 {
        let at = get_varint(head, &mut pos, "expiry")?;
        if at == 0 {
            // Never is encoded by omission, like zero flags.
            return Err(ItemError::Varint { field: "expiry" });
        }
        at
    } else {
        0
    };
    let origin_cas = if kind & KIND_HAS_ORIGIN != 0 {
        let bytes: [u8; 8] = head
            .get(pos..pos + 8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| overrun((pos + 8) as u64))?;
        pos += 8;
        Some(u64::from_le_bytes(bytes))
    } else {
        None
    };
    Ok(ItemHeader {
        state,
        client_flags,
        expires_at,
        origin_cas,
        header_len: pos as u32,
        key_len,
        value_len,
    })
}

/// Decodes the item whose state byte is at `segment[offset]`, reading nothing at or past
/// `end` (the committed end of the segment, clamped to the buffer). Never panics.
pub fn decode(segment: &[u8], offset: u32, end: usize) -> Result<ItemRef<'_>, ItemError> {
    let end = end.min(segment.len());
    let buf = segment.get(..end).unwrap_or(segment);
    let start = offset as usize;
    let overrun = |len: u64| ItemError::Overrun { len, end };
    if start >= end || end - start < 2 {
        return Err(overrun(2));
    }
    let h = decode_header(&buf[start..]).map_err(|e| match e {
        ItemError::Overrun { len, .. } => overrun(len),
        e => e,
    })?;
    let total = h.total_len();
    if total > (end - start) as u64 || start as u64 + total > u64::from(u32::MAX) {
        return Err(overrun(total));
    }
    let (key, value) = h.key_value_ranges(start);
    Ok(ItemRef {
        offset,
        len: total as u32,
        state: h.state,
        client_flags: h.client_flags,
        expires_at: h.expires_at,
        origin_cas: h.origin_cas,
        key: &buf[key],
        value: &buf[value],
    })
}

/// Reads the state byte of the item at `offset`.
pub fn state_at(segment: &[u8], offset: u32) -> Result<ItemState, ItemError> {
    let byte = *segment.get(offset as usize).ok_or(ItemError::Overrun {
        len: 1,
        end: segment.len(),
    })?;
    ItemState::from_byte(byte)
}

/// Flips the state byte of the item at `offset` (the one in-place write the format
/// allows). Returns false when `offset` is outside `segment`.
pub fn set_state(segment: &mut [u8], offset: u32, state: ItemState) -> bool {
    match segment.get_mut(offset as usize) {
        Some(b) => {
            *b = state.byte();
            true
        }
        None => false,
    }
}

/// Feeds the checksummed bytes of an encoded item (everything but its state byte) to
/// `hasher`. `item` is exactly one encoded item.
pub fn hash_item(hasher: &mut crc32fast::Hasher, item: &[u8]) {
    if let Some(rest) = item.get(1..) {
        hasher.update(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trip_and_canonical() {
        for v in [0u32, 1, 127, 128, 300, 16_383, 16_384, 1 << 21, u32::MAX] {
            let mut buf = [0u8; 5];
            let n = put_varint(&mut buf, v);
            assert_eq!(n, varint_len(v));
            let mut pos = 0;
            assert_eq!(get_varint(&buf[..n], &mut pos, "t"), Ok(v));
            assert_eq!(pos, n);
        }
        // 0 encoded in two bytes is rejected.
        let mut pos = 0;
        assert!(get_varint(&[0x80, 0x00], &mut pos, "t").is_err());
        // Six-byte / over-u32 encodings are rejected.
        let mut pos = 0;
        assert!(get_varint(&[0xFF, 0xFF, 0xFF, 0xFF, 0x1F], &mut pos, "t").is_err());
        let mut pos = 0;
        assert!(get_varint(&[0xFF, 0xFF, 0xFF, 0xFF, 0x8F, 0x01], &mut pos, "t").is_err());
    }

    #[test]
    fn typical_item_header_is_five_bytes_or_less() {
        // 20-byte key, 64..=4096-byte value, no flags: state, kind, klen, vlen (1-2 B).
        let spec = ItemSpec::new(&[b'k'; 20], 4096);
        assert_eq!(spec.header_len(), 5);
        let spec = ItemSpec::new(&[b'k'; 20], 100);
        assert_eq!(spec.header_len(), 4);
    }

    #[test]
    fn encode_decode_with_all_fields() {
        let spec = ItemSpec {
            key_len: 3,
            value_len: 5,
            client_flags: 0xDEAD,
            expires_at: 1_900_000_000,
            origin_cas: Some(0x0102_0304_0506_0708),
        };
        let mut buf = vec![0u8; 64];
        let n = encode(&spec, b"abc", b"hello", &mut buf[10..]).unwrap();
        assert_eq!(n, spec.encoded_len());
        let item = decode(&buf, 10, buf.len()).unwrap();
        assert_eq!(item.state, ItemState::Pending);
        assert_eq!(item.key, b"abc");
        assert_eq!(item.value, b"hello");
        assert_eq!(item.client_flags, 0xDEAD);
        assert_eq!(item.expires_at, 1_900_000_000);
        assert_eq!(item.origin_cas, Some(0x0102_0304_0506_0708));
        assert_eq!(item.len as usize, n);
        assert!(set_state(&mut buf, 10, ItemState::Live));
        assert_eq!(state_at(&buf, 10), Ok(ItemState::Live));
        // Cut one byte short: overrun, not a panic.
        assert!(matches!(
            decode(&buf, 10, 10 + n - 1),
            Err(ItemError::Overrun { .. })
        ));
    }

    #[test]
    fn bad_bytes_are_typed_errors() {
        assert_eq!(
            decode(&[0x11, 0, 1, 0, b'k'], 0, 5),
            Err(ItemError::BadState { byte: 0x11 })
        );
        assert_eq!(
            decode(&[STATE_LIVE, 0x80, 1, 0, b'k'], 0, 5),
            Err(ItemError::ReservedKind { kind: 0x80 })
        );
        assert_eq!(
            decode(&[STATE_LIVE, 0, 0, 0, b'k'], 0, 5),
            Err(ItemError::EmptyKey)
        );
        assert_eq!(
            decode(&[STATE_LIVE, KIND_HAS_FLAGS, 1, 0, 0, b'k'], 0, 6),
            Err(ItemError::Varint {
                field: "client flags"
            })
        );
        assert_eq!(
            decode(&[STATE_LIVE, KIND_HAS_EXPIRY, 1, 0, 0, b'k'], 0, 6),
            Err(ItemError::Varint { field: "expiry" })
        );
        assert_eq!(
            decode(&[STATE_LIVE, 0x08, 1, 0, b'k'], 0, 5),
            Err(ItemError::ReservedKind { kind: 0x08 })
        );
        assert!(decode(&[], 0, 0).is_err());
        assert!(decode(&[STATE_LIVE], 0, 100).is_err());
        assert!(decode(&[STATE_LIVE, 0, 1, 0, b'k'], u32::MAX, usize::MAX).is_err());
    }

    #[test]
    fn limits() {
        let l = ItemLimits::default();
        assert_eq!(l.check(0, 1), Err(EncodeError::EmptyKey));
        assert!(l.check(250, 1 << 20).is_ok());
        assert!(matches!(
            l.check(251, 0),
            Err(EncodeError::KeyTooLong { .. })
        ));
        assert!(matches!(
            l.check(1, (1 << 20) + 1),
            Err(EncodeError::ValueTooLong { .. })
        ));
        assert!(ItemLimits {
            max_key_len: 0,
            max_value_len: 1
        }
        .validate()
        .is_err());
    }
}

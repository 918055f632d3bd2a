//! Typed errors of the cache crate, one enum per operation family: encoding an item or a
//! segment header ([`EncodeError`]), reading a segment header ([`HeaderError`]), decoding
//! one item ([`ItemError`]) and building the index ([`IndexError`]). Every variant says
//! what was wrong and where; none is produced by a panic path, and decoding arbitrary bytes
//! only ever yields these values.

/// Why an item or a segment header could not be written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// Keys are at least one byte long (memcached rejects empty keys too).
    #[error("empty key")]
    EmptyKey,
    /// The key is longer than the configured limit.
    #[error("key of {len} bytes is longer than the limit of {max}")]
    KeyTooLong { len: usize, max: u32 },
    /// The value is longer than the configured limit.
    #[error("value of {len} bytes is longer than the limit of {max}")]
    ValueTooLong { len: usize, max: u32 },
    /// The item does not fit in what is left of the segment.
    #[error("item of {need} bytes does not fit: {available} bytes left in the segment")]
    SegmentFull { need: usize, available: usize },
    /// The buffer does not match the segment size the header announces.
    #[error("segment buffer of {len} bytes, expected {expected} (1 << size_shift)")]
    BufferSize { len: usize, expected: usize },
    /// The segment size exponent is outside the supported range.
    #[error("segment size shift {shift} outside {min}..={max}")]
    BadShift { shift: u8, min: u8, max: u8 },
    /// The write sequence is zero (reserved for "never written") or too large to form a
    /// CAS value with this segment size.
    #[error("write sequence {seq} invalid for segment size shift {shift}")]
    BadWriteSeq { seq: u64, shift: u8 },
    /// The key or value passed does not have the length its [`ItemSpec`] announced.
    ///
    /// [`ItemSpec`]: crate::item::ItemSpec
    #[error("{what} of {actual} bytes, but the item spec says {spec}")]
    SpecMismatch {
        what: &'static str,
        spec: usize,
        actual: usize,
    },
    /// A writer cursor re-attached to a buffer whose commit word differs from it.
    #[error("the segment's commit word does not match the writer cursor")]
    CursorMismatch,
    /// The limits themselves are invalid (a key limit of 0 or above the format maximum).
    #[error("invalid limits: {why}")]
    BadLimits { why: &'static str },
}

/// Why a segment header was not accepted. A segment whose header is rejected is never
/// trusted: its items are not scanned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// The buffer is shorter than a header.
    #[error("segment of {len} bytes is shorter than its 64-byte header")]
    TooShort { len: usize },
    /// All-zero magic: the segment was never written (a fresh file, or a free segment).
    #[error("segment never written (zero magic)")]
    Unwritten,
    /// The magic is neither zero nor Terrace's.
    #[error("bad magic {found:02x?}")]
    BadMagic { found: [u8; 8] },
    /// Written by another format version.
    #[error("unsupported format version {found} (this build reads {oldest} to {supported})")]
    UnsupportedVersion {
        found: u16,
        oldest: u16,
        supported: u16,
    },
    /// The header's checksum does not match: torn while being opened, or corrupt.
    #[error("header checksum {stored:#010x} does not match computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    /// The segment size exponent is outside the supported range.
    #[error("segment size shift {shift} unsupported")]
    BadShift { shift: u8 },
    /// Reserved flag bits are set (written by a newer build, or corrupt).
    #[error("reserved header flags {flags:#x} set")]
    ReservedFlags { flags: u32 },
    /// A write sequence of zero, or too large for the segment size.
    #[error("invalid write sequence {seq}")]
    BadWriteSeq { seq: u64 },
    /// The committed length runs past the segment.
    #[error("committed length {committed} exceeds the segment's item capacity {capacity}")]
    CommitOutOfRange { committed: u32, capacity: u32 },
}

/// Why the bytes at an offset are not a valid item.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ItemError {
    /// The state byte is none of DEAD, PENDING, LIVE.
    #[error("unknown state byte {byte:#04x}")]
    BadState { byte: u8 },
    /// Reserved kind bits are set.
    #[error("reserved kind bits {kind:#04x} set")]
    ReservedKind { kind: u8 },
    /// A length or flags varint is overlong, non-canonical or runs past the end.
    #[error("malformed varint for {field}")]
    Varint { field: &'static str },
    /// A key length of zero.
    #[error("empty key")]
    EmptyKey,
    /// A key length above the format maximum.
    #[error("key length {len} above the format maximum")]
    KeyTooLong { len: u32 },
    /// The item's bytes run past the end of the committed range (or of the buffer).
    #[error("item of {len} bytes runs past the end at {end}")]
    Overrun { len: u64, end: usize },
}

/// Why an index could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// The packed layout leaves too few bits for the tag.
    #[error("{segment_bits} segment bits + {offset_bits} offset bits leave fewer than {min_tag} tag bits")]
    LayoutTooWide {
        segment_bits: u32,
        offset_bits: u32,
        min_tag: u32,
    },
    /// A capacity of zero items or segments.
    #[error("invalid index size: {why}")]
    BadSize { why: &'static str },
    /// The table's memory could not be mapped.
    #[error("cannot map {bytes} bytes for the index table: {reason}")]
    Memory { bytes: usize, reason: String },
}

/// Why a cache operation (or opening the cache) failed. Misses and unmet conditions
/// (`add` of a present key, a `cas` mismatch) are not errors: see [`crate::Store`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The configuration cannot work.
    #[error("invalid cache configuration: {why}")]
    Config { why: &'static str },
    /// A tier holds too few segments for its writers, movers and free reserve.
    #[error(
        "tier {tier} holds {segments} segments of {segment_bytes} bytes; a tier needs at \
         least {min} ({} bytes): give it more space, or allow smaller values (segments \
         are sized to hold the largest)",
        u64::from(*min) * segment_bytes
    )]
    TierTooSmall {
        tier: usize,
        segments: u32,
        min: u32,
        segment_bytes: u64,
    },
    /// A file tier's directory is missing (or not a directory).
    #[error("tier directory {dir:?} does not exist or is not a directory")]
    TierDir { dir: std::path::PathBuf },
    /// An existing tier file has another size than the configuration gives the tier.
    #[error("tier file {path:?} is {found} bytes, the configuration says {expected}")]
    TierFileSize {
        path: std::path::PathBuf,
        found: u64,
        expected: u64,
    },
    /// The medium failed (mapping, reserving, persisting).
    #[error(transparent)]
    Media(#[from] terrace_media::MediaError),
    /// A key or value outside the limits.
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Index(#[from] IndexError),
    /// The item is larger than a segment can hold.
    #[error("item of {need} bytes cannot fit in a segment of {capacity} item bytes")]
    TooLarge { need: usize, capacity: u32 },
    /// No segment of the tier could be freed: all are open for writing or pinned by read
    /// guards.
    #[error(
        "no free segment in tier {tier}: every segment is open for writing or pinned by readers"
    )]
    NoSpace { tier: usize },
    /// The write-sequence mark file could not be read or written.
    #[error("write-sequence mark {path:?}: {source}")]
    SeqMark {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// The saved index could not be written at shutdown (the next open scans instead).
    #[error("saved index {path:?}: {source}")]
    SavedIndex {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// A volatile tier's snapshot could not be written at shutdown: the saved index of
    /// the other tiers was written, and the next open starts that tier empty.
    #[error("DRAM snapshot {path:?}: {source} (the next start has that tier empty)")]
    Snapshot {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// `incr`/`decr` on a value that is not a decimal number below 2^64.
    #[error("the value is not a decimal 64-bit unsigned integer")]
    NotANumber,
    /// The boot mark (`terrace.boot`) could not be written.
    #[error("boot mark {path:?}: {source}")]
    BootMark {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    /// A pool's configuration cannot work, or the pool failed to open or shut down
    /// (`crate::pools`).
    #[error("pool {pool:?}: {why}")]
    Pool { pool: String, why: String },
}

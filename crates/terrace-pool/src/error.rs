//! Typed errors of the pool. Every variant says what failed and where; opening a corrupt,
//! truncated or foreign file produces one of these, never a panic.

use std::io;
use std::path::PathBuf;

use terrace_media::MediaError;

/// An error from creating, opening, checking or using a pool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// The media layer failed (mapping, reserving, persisting).
    #[error(transparent)]
    Media(#[from] MediaError),
    /// A file operation outside the media layer failed.
    #[error("{op} failed on {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// `create` refuses to overwrite an existing file.
    #[error("{path} already exists")]
    Exists { path: PathBuf },
    /// `open` of a path that does not exist.
    #[error("{path} does not exist")]
    NotFound { path: PathBuf },
    /// The file does not start with a pool header: foreign, empty, or never finished.
    #[error("not a Terrace pool: {why}")]
    NotAPool { why: &'static str },
    /// The header's format version is not one this build reads.
    #[error(
        "pool format version {found} is not supported (this build reads versions {} to {supported})",
        crate::format::MIN_FORMAT_VERSION
    )]
    UnsupportedVersion { found: u32, supported: u32 },
    /// The pool's format version predates a feature that would change what it records
    /// (the pool still opens and works without that feature).
    #[error(
        "pool format version {found} cannot record {feature} (needs version {needed}); \
         create a new pool to use them"
    )]
    FormatTooOld {
        found: u32,
        needed: u32,
        feature: &'static str,
    },
    /// The header's checksum does not match its contents.
    #[error("pool header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    /// The pool was created with another layout name.
    #[error("layout mismatch: pool has {found:?}, caller expects {expected:?}")]
    LayoutMismatch { expected: String, found: String },
    /// The file's length differs from the size in the header (truncated or extended).
    #[error("pool size mismatch: header says {header} bytes, the file has {file}")]
    SizeMismatch { header: u64, file: u64 },
    /// An argument is out of range (size, layout name, alignment).
    #[error("invalid argument {what}: {detail}")]
    InvalidArgument { what: &'static str, detail: String },
    /// Persistent state violates an invariant: what is broken and where.
    #[error("pool is corrupt at offset {offset:#x}: {what}")]
    Corrupt { what: String, offset: u64 },
    /// A custom allocation class description is unusable: which field, and why.
    #[error("invalid allocation class {field}: {detail}")]
    InvalidClass { field: &'static str, detail: String },
    /// No custom allocation class with this id is registered in the pool.
    #[error("allocation class {id} is not registered in this pool")]
    NoSuchClass { id: u32 },
    /// A custom allocation class with this id is already registered (classes are never
    /// replaced: objects in its runs depend on it).
    #[error("allocation class {id} is already registered")]
    ClassExists { id: u8 },
    /// Every custom class id is taken.
    #[error("the pool's class table is full ({max} custom classes)")]
    ClassTableFull { max: usize },
    /// No space for an allocation of this many bytes anywhere in the heap.
    #[error("out of space for an allocation of {size} bytes")]
    OutOfSpace { size: u64 },
    /// An access outside the pool or outside an object.
    #[error("range {offset:#x}+{len} is outside {what} ({limit} bytes)")]
    OutOfBounds {
        offset: u64,
        len: u64,
        what: &'static str,
        limit: u64,
    },
    /// An offset that is not the start of a live object.
    #[error("offset {offset:#x} is not a live object")]
    InvalidObject { offset: u64 },
    /// A transaction's undo or redo log has no room left.
    #[error("transaction log full: {what} needs {needed} bytes, {free} left")]
    TxLogFull {
        what: &'static str,
        needed: u64,
        free: u64,
    },
    /// The transaction was aborted (explicitly, by a nested transaction, or by an error).
    #[error("transaction aborted")]
    TxAborted,
    /// The transaction is no longer active (already committed or aborted).
    #[error("transaction is not active")]
    TxNotActive,
    /// An earlier persistence failure left the pool in an unknown state; it refuses work
    /// until reopened (recovery then decides).
    #[error("pool refused work after an earlier persistence failure; reopen it")]
    Poisoned,
}

pub type Result<T, E = PoolError> = std::result::Result<T, E>;

pub(crate) fn corrupt(what: impl Into<String>, offset: u64) -> PoolError {
    PoolError::Corrupt {
        what: what.into(),
        offset,
    }
}

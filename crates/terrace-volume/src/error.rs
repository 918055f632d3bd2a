//! Typed errors of the volume layer. [`BlockError`] is what one block request can fail
//! with — the NBD front end turns it into an NBD error number ([`BlockError::errno`]);
//! [`VolumeError`] is what opening or managing a volume can fail with.

use std::path::PathBuf;

/// The failure of one block request (read, write, flush, trim, zeroes).
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The range does not lie inside the volume, or is not aligned as the request needs.
    #[error(
        "request out of range or misaligned: offset {offset}, length {len}, volume {size} bytes"
    )]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// A write to a read-only volume (or one in read-only mode).
    #[error("the volume is read-only")]
    ReadOnly,
    /// The backend failed; `what` says which operation and where.
    #[error("backend {what}: {source}")]
    Backend {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The write log stayed full longer than the volume's bounded wait (write-back with a
    /// backend that does not drain).
    #[error("the write log is full and did not drain within {waited_ms} ms")]
    LogFull { waited_ms: u64 },
    /// The write log's medium failed (persist or I/O error): nothing was acknowledged.
    #[error("write log: {0}")]
    Log(String),
    /// The volume is shutting down.
    #[error("the volume is shutting down")]
    ShuttingDown,
}

impl BlockError {
    /// The NBD error number (`NBD_E*`, Linux errno values) a client is sent.
    pub fn errno(&self) -> u32 {
        match self {
            BlockError::OutOfRange { .. } => libc::EINVAL as u32,
            BlockError::ReadOnly => libc::EPERM as u32,
            BlockError::Backend { source, .. } => match source.raw_os_error() {
                Some(code) if code == libc::ENOSPC => libc::ENOSPC as u32,
                _ => libc::EIO as u32,
            },
            BlockError::LogFull { .. } => libc::ENOSPC as u32,
            BlockError::Log(_) | BlockError::ShuttingDown => libc::EIO as u32,
        }
    }
}

/// Failures of opening, recovering or managing a volume.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Media(#[from] terrace_media::MediaError),
    #[error(transparent)]
    Cache(#[from] terrace_cache::CacheError),
    /// A write-log file that is not one, or belongs to another volume.
    #[error("write log {path}: {what}")]
    BadLog { path: PathBuf, what: String },
    /// A configuration that cannot work (sizes, names, a backend URI).
    #[error("{0}")]
    Config(String),
    /// The backend could not be opened or reached.
    #[error("backend {what}: {source}")]
    Backend {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

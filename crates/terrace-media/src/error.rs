//! Typed errors of the media layer. Every variant says what failed and where; none is
//! produced by a panic path.

use std::io;
use std::path::PathBuf;

/// An error from creating, growing or persisting a region, or from block I/O.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MediaError {
    /// A size was zero, not representable, or smaller than the medium's minimum.
    #[error("invalid size {size}: {why}")]
    InvalidSize { size: usize, why: &'static str },
    /// The address space could not hold a mapping of this size.
    #[error("cannot map {size} bytes: {source}")]
    Map { size: usize, source: io::Error },
    /// A file or directory could not be opened or created.
    #[error("cannot open {path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    /// The file system has no room for the requested reservation.
    #[error("no space left on {path} for {len} bytes at offset {offset}")]
    NoSpace {
        path: PathBuf,
        offset: u64,
        len: u64,
    },
    /// Another I/O error on a file-backed medium.
    #[error("{op} failed on {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A NUMA node that does not exist or has no memory.
    #[error("NUMA node {node} is not available: {why}")]
    NoSuchNode { node: u32, why: String },
    /// Binding memory to a NUMA node failed.
    #[error("mbind to node {node} failed: {source}")]
    Bind { node: u32, source: io::Error },
    /// The address range is already owned by another region in the registry.
    #[error("address range {base:#x}+{len:#x} overlaps a registered region")]
    Overlap { base: usize, len: usize },
    /// An access outside a region or a flash file.
    #[error("range {offset}+{len} is outside the medium of {size} bytes")]
    OutOfBounds { offset: u64, len: u64, size: u64 },
}

pub type Result<T, E = MediaError> = std::result::Result<T, E>;

//! Typed errors of the kinds layer. The C ABI maps each to an errno and a memkind error
//! code; nothing here panics on user input.

use terrace_media::MediaError;

/// Why a kind could not be created or could not serve a request.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KindError {
    /// A request for zero bytes (memkind returns NULL for it too).
    #[error("zero-byte request")]
    ZeroSize,
    /// A size no kind can hold (larger than the kind's capacity or the address space).
    #[error("request of {size} bytes exceeds what the kind can hold")]
    TooLarge { size: usize },
    /// The kind (and everything it overflows to) has no memory left.
    #[error("kind {kind} is out of memory for {size} bytes")]
    OutOfMemory { kind: String, size: usize },
    /// An alignment that is not a power of two multiple of the pointer size.
    #[error("invalid alignment {align}: must be a power of two and a multiple of {}", std::mem::size_of::<usize>())]
    BadAlignment { align: usize },
    /// A file kind's maximum size is below the minimum.
    #[error("maximum size {size} is below the minimum of {minimum} bytes")]
    SizeTooSmall { size: usize, minimum: usize },
    /// The handle refers to a kind that was destroyed (or never created).
    #[error("the kind was destroyed or never existed")]
    NoSuchKind,
    /// The operation is not possible on this kind (e.g. destroying a static kind).
    #[error("operation not supported on kind {kind}: {why}")]
    Unsupported { kind: String, why: &'static str },
    /// The allocator engine refused to create another arena or cache.
    #[error("the allocation engine has no room for another kind ({why})")]
    TooManyKinds { why: &'static str },
    /// A unified kind needs at least one member.
    #[error("a unified kind needs at least one member kind")]
    EmptyUnified,
    /// The medium below failed (missing or read-only directory, full file system, …).
    #[error(transparent)]
    Media(#[from] MediaError),
    /// The allocator engine reported an error.
    #[error("allocator engine: {what} failed with error {code}")]
    Engine { what: String, code: i32 },
}

impl KindError {
    /// The errno value a C caller sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            KindError::ZeroSize
            | KindError::BadAlignment { .. }
            | KindError::SizeTooSmall { .. }
            | KindError::NoSuchKind
            | KindError::EmptyUnified => libc::EINVAL,
            KindError::TooLarge { .. } | KindError::OutOfMemory { .. } => libc::ENOMEM,
            KindError::Unsupported { .. } => libc::EOPNOTSUPP,
            KindError::TooManyKinds { .. } => libc::EAGAIN,
            KindError::Engine { code, .. } => *code,
            KindError::Media(e) => match e {
                MediaError::NoSpace { .. } => libc::ENOSPC,
                MediaError::Open { source, .. } | MediaError::Io { source, .. } => {
                    source.raw_os_error().unwrap_or(libc::EIO)
                }
                MediaError::Map { .. } => libc::ENOMEM,
                MediaError::NoSuchNode { .. } | MediaError::InvalidSize { .. } => libc::EINVAL,
                _ => libc::EIO,
            },
        }
    }
}

pub type Result<T, E = KindError> = std::result::Result<T, E>;

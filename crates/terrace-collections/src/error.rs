//! Typed errors of the collections: what failed and where. Corrupt node contents found by
//! an operation or by [`check`](crate::check()) are [`CollectionError::Corrupt`], never a
//! panic.

use terrace_pool::PoolError;

/// An error from a collection operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CollectionError {
    /// The pool failed underneath (space, persistence, a poisoned pool...).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// A key longer than the map's `max_key`.
    #[error("key of {len} bytes is longer than the map's maximum of {max}")]
    KeyTooLong { len: usize, max: u32 },
    /// A value longer than a collection can store (4 GiB).
    #[error("value of {len} bytes is too long")]
    ValueTooLong { len: usize },
    /// An argument out of range: which, and why.
    #[error("invalid argument {what}: {detail}")]
    InvalidArgument { what: &'static str, detail: String },
    /// The name is not bound in the pool's directory.
    #[error("no collection or object is named {name:?}")]
    NotFound { name: String },
    /// The name is bound to something of another kind.
    #[error("{name:?} is a {found}, not a {expected}")]
    WrongKind {
        name: String,
        found: &'static str,
        expected: &'static str,
    },
    /// The name is already bound (binding never replaces silently).
    #[error("{name:?} is already bound")]
    AlreadyBound { name: String },
    /// This process already has the collection open; share that handle instead.
    #[error("collection at {offset:#x} is already open in this process")]
    Busy { offset: u64 },
    /// The map was created with other sizes than the caller asks for.
    #[error("map was created with {what} {found}, caller asks for {asked}")]
    Mismatch {
        what: &'static str,
        found: u32,
        asked: u32,
    },
    /// A persistent node violates an invariant: what is broken and at which pool offset.
    #[error("collection is corrupt at offset {offset:#x}: {what}")]
    Corrupt { what: String, offset: u64 },
}

impl CollectionError {
    pub(crate) fn corrupt(offset: u64, what: impl Into<String>) -> CollectionError {
        CollectionError::Corrupt {
            what: what.into(),
            offset,
        }
    }
}

/// Result of a collection operation.
pub type Result<T> = std::result::Result<T, CollectionError>;

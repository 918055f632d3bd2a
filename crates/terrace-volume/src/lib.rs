//! terrace-volume: cached block volumes (the HDCS successor). A [`Volume`] puts Terrace's
//! tiers in front of slow storage (a [`Backend`]: a file or block device, any NBD
//! server) and is exported over NBD ([`nbd`]), so unchanged clients — fio's `nbd`
//! engine, `nbdinfo`, `nbdcopy`, `nbdfuse` + a loop device + ext4, qemu — use it.
//!
//! # Glossary
//! - **block**: the 4 KiB unit the volume caches, logs and writes back ([`BLOCK_SIZE`]).
//! - **mode**: how writes travel ([`Mode`]): write-through (backend, then cache, then the
//!   reply; the default), write-back (the write log, then the reply; the backend later),
//!   write-around (backend only; the cached copy is dropped), read-only.
//! - **write log**: a checksummed, sequence-numbered circular log on the persistent tier
//!   ([`log`]); in write-back a write is acknowledged once its record, and every record
//!   before it, is durable there.
//! - **epoch**: the records between two barriers. A client's FLUSH ends one; so does the
//!   write-back thread when it wants to write back what has no barrier yet. Write-back
//!   writes one epoch to the backend, flushes the backend, then starts the next: the
//!   backend image is always every write of the epochs before plus some of the current
//!   one's — what a disk with a volatile write cache may show after a crash — so losing
//!   the whole cache leaves a consistent backend.
//! - **dirty block**: a block whose newest data is in the log and not yet in the backend.
//!   Clean blocks live in a `terrace-cache` [`Cache`](terrace_cache::Cache) keyed by
//!   volume and block number.
#![forbid(unsafe_code)]

pub mod backend;
pub mod control;
pub mod error;
pub mod export;
pub mod log;
pub mod nbd;
pub mod service;
pub mod volume;

pub use backend::{Backend, FileBackend, BLOCK_SIZE};
pub use error::{BlockError, VolumeError};
pub use export::{Export, MemoryExport};
pub use log::{FileLogStore, LogStore, WriteLog};
pub use service::{BackendSpec, Service, ServiceConfig};
pub use volume::{AckDurability, Mode, RecoveryReport, Volume, VolumeConfig, VolumeStatus};

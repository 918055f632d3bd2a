//! terrace-volume: cached block volumes (the HDCS successor). A [`Volume`] puts Terrace's
//! tiers in front of slow storage (a [`Backend`]: a file or block device, any NBD
//! server, an S3 bucket) and is exported over NBD ([`nbd`]), so unchanged clients —
//! fio's `nbd` engine, `nbdinfo`, `nbdcopy`, `nbdfuse` + a loop device + ext4, qemu —
//! use it.
//!
//! # Glossary
//! - **block**: the 4 KiB unit the volume caches, logs and writes back ([`BLOCK_SIZE`]).
//! - **mode**: how writes travel ([`Mode`]): write-through (backend, then cache, then the
//!   reply; the default), write-back (the write log, then the reply; the backend later),
//!   write-around (backend only; the cached copy is dropped), read-only, storage
//!   (write-back whose write-back runs only when asked — `terrace volume flush` — the log
//!   holding the volume and compacting itself: live records copied forward, the oldest
//!   released).
//! - **write log**: a checksummed, sequence-numbered circular log on the persistent tier
//!   ([`log`]); in write-back a write is acknowledged once its record, and every record
//!   before it, is durable there.
//! - **barrier**: a record a client's FLUSH appends: every write acknowledged before the
//!   flush is in a record before it.
//! - **batch**: what the write-back copies to the backend at once — the oldest records,
//!   through the first barrier or over at most 64 MiB of log. It writes the newest data
//!   of each block in the batch, flushes the backend, then releases the batch. The log's
//!   order is the order writes were acknowledged in, so every prefix of it is a point in
//!   time a crash could have left: the backend image is always all the writes of the
//!   batches before plus some of the current one's — what a disk with a volatile write
//!   cache may show after a crash — and losing the whole cache leaves a consistent
//!   backend.
//! - **large write**: one of at least `VolumeConfig::large_write` bytes (64 KiB). It is
//!   not kept in the cache; in write-back it *bypasses* the log, straight to the backend,
//!   while the log is congested and holds no barrier (so the backend stays a consistent
//!   point in time).
//! - **dirty block**: a block whose newest data is in the log and not yet in the backend.
//!   Clean blocks live in a `terrace-cache` [`Cache`](terrace_cache::Cache) keyed by
//!   volume and block number, one the volumes share; a bit per block (`cached`) says
//!   which may be there, so each volume's share can be counted.
#![forbid(unsafe_code)]

pub mod backend;
mod cached;
pub mod control;
pub mod error;
pub mod export;
pub mod fence;
pub mod log;
pub mod metrics;
pub mod nbd;
pub mod replication;
pub mod s3;
pub mod service;
pub mod volume;

pub use backend::{Backend, FileBackend, BLOCK_SIZE};
pub use error::{BlockError, VolumeError};
pub use export::{Export, MemoryExport};
pub use log::{FileLogStore, LogStore, WriteLog};
pub use s3::{S3Backend, S3Config};
pub use service::{BackendSpec, Service, ServiceConfig};
pub use volume::{
    AckDurability, FlushProgress, Mode, RecoveryReport, Volume, VolumeConfig, VolumeList,
    VolumeStatus,
};

//! What the pool's integration tests share: where pool files live, and the check that a
//! pool on a DAX file system persists by flushing cache lines.
//!
//! Pool files go to `/dev/shm` (tmpfs: the emulated persistent tier), or to the folder
//! named by `TERRACE_TEST_PMEM_DIR`: the guest of `tests/vm/run` points it at an ext4 file
//! system mounted `-o dax` on an emulated NVDIMM, and sets `TERRACE_TEST_REQUIRE_DAX=1` so
//! that a pool there which fails to map with `MAP_SYNC` fails the test instead of passing
//! on the `msync` path.

#![allow(dead_code)] // each test file uses its own part

use terrace_media::persist::thread_counts;
use terrace_media::Durability;
use terrace_pool::{Backend, Pool};

/// The folder pool files are created in.
pub fn pmem_dir() -> std::path::PathBuf {
    std::env::var_os("TERRACE_TEST_PMEM_DIR")
        .map_or_else(|| "/dev/shm".into(), std::path::PathBuf::from)
}

/// A fresh temporary folder in [`pmem_dir`].
pub fn pool_dir() -> tempfile::TempDir {
    let dir = pmem_dir();
    tempfile::tempdir_in(&dir).unwrap_or_else(|e| panic!("a folder in {}: {e}", dir.display()))
}

/// Whether the tests must prove the DAX persist path (`TERRACE_TEST_REQUIRE_DAX=1`).
pub fn dax_required() -> bool {
    std::env::var_os("TERRACE_TEST_REQUIRE_DAX").is_some_and(|v| v == "1")
}

/// Where DAX is required: runs `persisting` (which must persist something on `pool`) and
/// asserts that the pool is power-fail durable and that this thread flushed cache lines
/// and made no `msync` call meanwhile. Elsewhere just runs `persisting`.
///
/// The counters are the calling thread's (`terrace_media::persist::thread_counts`): this
/// holds only while the pool persists on the thread that calls it, as it does today. A
/// pool that handed persists to a helper thread would make the flush assertion fail,
/// not pass vacuously; the `msync` one would pass vacuously, so keep persists on the
/// caller's thread or count per pool.
pub fn expect_dax_persists<B: Backend, T>(pool: &Pool<B>, persisting: impl FnOnce() -> T) -> T {
    if !dax_required() {
        return persisting();
    }
    assert_eq!(
        pool.durability(),
        Durability::Power,
        "a pool in {} is not power-fail durable: not a DAX mapping",
        pmem_dir().display()
    );
    let before = thread_counts();
    let result = persisting();
    let after = thread_counts();
    assert!(
        after.flushed_lines > before.flushed_lines,
        "no cache line was flushed: the pool did not persist through MAP_SYNC and clwb"
    );
    assert_eq!(
        after.msyncs, before.msyncs,
        "the pool persisted with msync, not DAX"
    );
    result
}

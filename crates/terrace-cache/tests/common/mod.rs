//! Helpers shared by the engine's restart and pool tests: a configuration of small
//! segments (32 KiB, values up to 8 KiB, two writer stripes) and a directory for file
//! tiers on tmpfs where there is one.

use std::path::Path;

use terrace_cache::item::Limits;
use terrace_cache::{CacheConfig, TierConfig};

pub const MIB: u64 = 1 << 20;

pub fn config(tiers: Vec<TierConfig>) -> CacheConfig {
    CacheConfig {
        segment_shift: Some(15),
        limits: Limits {
            max_key_len: 250,
            max_value_len: 8 << 10,
        },
        stripes: 2,
        ..CacheConfig::new(tiers)
    }
}

/// A directory for file tiers: on tmpfs when there is one (durable against process
/// crashes, which is what these tests simulate; `persist` is a compiler fence there),
/// else the default temporary directory.
pub fn tier_dir() -> tempfile::TempDir {
    match Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm").expect("a directory on /dev/shm"),
        false => tempfile::tempdir().expect("a temporary directory"),
    }
}

//! Helpers shared by the engine's tests: a configuration of small segments (32 KiB,
//! values up to 8 KiB, two writer stripes), a directory for file tiers on tmpfs where
//! there is one, one for flash tiers on the disk, a set whose TTL is checked to be exact,
//! and a seeded generator. Each test crate uses a part.
#![allow(dead_code)]

use std::path::Path;

use terrace_cache::item::ItemLimits;
use terrace_cache::{Cache, CacheConfig, TierConfig};

pub const MIB: u64 = 1 << 20;

/// A seeded xorshift generator: the same sequence for a seed on every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

pub fn config(tiers: Vec<TierConfig>) -> CacheConfig {
    CacheConfig {
        segment_shift: Some(15),
        limits: ItemLimits {
            max_key_len: 250,
            max_value_len: 8 << 10,
        },
        stripes: 2,
        ..CacheConfig::new(tiers)
    }
}

/// A directory for a flash tier: on the disk where there is one (`O_DIRECT`), else the
/// default temporary directory.
pub fn flash_dir() -> tempfile::TempDir {
    match Path::new("/var/tmp").is_dir() {
        true => tempfile::tempdir_in("/var/tmp").expect("a directory in /var/tmp"),
        false => tempfile::tempdir().expect("a temporary directory"),
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

/// Sets `key` to `value` for `ttl` seconds and returns the expiry a hit then reports,
/// asserting that it is exactly the TTL from the set (the clock's second may tick
/// between the two).
pub fn set_with_ttl(c: &Cache, key: &[u8], value: &[u8], ttl: u32) -> u32 {
    let before = c.now();
    c.set(key, value, 0, ttl)
        .unwrap_or_else(|e| panic!("set (ttl {ttl}): {e}"));
    let at = c
        .get(key)
        .unwrap()
        .and_then(|g| g.expires_at())
        .unwrap_or_else(|| panic!("{} just set", String::from_utf8_lossy(key)));
    assert!(
        at >= before + ttl && at <= c.now() + ttl,
        "{} expires at now + {}, not its ttl {ttl}",
        String::from_utf8_lossy(key),
        i64::from(at) - i64::from(before)
    );
    at
}

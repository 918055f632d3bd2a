//! Many threads on one [`Cache`]: sets, gets, deletes and read guards on shared keys
//! while tier 0 evicts and demotes into tier 1 and tier 1 evicts. Every value read must be
//! whole and belong to its key (values describe themselves); `cas`-based increments must
//! not lose updates.

use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use terrace_cache::{Cache, CacheConfig, Store, TierConfig, TierSize};

mod common;
use common::MIB;

/// Two DRAM tiers of the shared test configuration, three writer stripes.
fn config() -> CacheConfig {
    CacheConfig {
        stripes: 3,
        ..common::config(vec![
            TierConfig::dram(TierSize::Bytes(2 * MIB)),
            TierConfig::dram(TierSize::Bytes(2 * MIB)),
        ])
    }
}

/// A value that names its key and writer and can be checked byte for byte.
fn make_value(key: u32, writer: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 16);
    v.extend_from_slice(&key.to_le_bytes());
    v.extend_from_slice(&writer.to_le_bytes());
    v.extend_from_slice(&(len as u32).to_le_bytes());
    v.extend((0..len).map(|i| (writer as usize).wrapping_mul(7).wrapping_add(i) as u8));
    v
}

fn check_value(key: u32, v: &[u8]) {
    assert!(v.len() >= 16, "short value for key {key}");
    let k = u32::from_le_bytes(v[0..4].try_into().unwrap());
    let writer = u64::from_le_bytes(v[4..12].try_into().unwrap());
    let len = u32::from_le_bytes(v[12..16].try_into().unwrap()) as usize;
    assert_eq!(k, key, "value of another key");
    assert_eq!(v.len(), len + 16, "torn value for key {key}");
    assert_eq!(
        v[16..],
        make_value(key, writer, len)[16..],
        "corrupt value for key {key}"
    );
}

#[test]
fn readers_writers_evictors_and_movers() {
    run_mixed(0);
}

#[test]
fn readers_writers_and_a_background_mover() {
    run_mixed(1);
}

/// Several movers evict, demote and reinsert at once, each into its own copy lanes.
#[test]
fn readers_writers_and_four_background_movers() {
    run_mixed(4);
}

/// Runs the mixed load with `movers` mover threads (0: writers evict inline).
fn run_mixed(movers: usize) {
    let with_mover = movers > 0;
    let (cache, _) = Cache::open(CacheConfig {
        movers: movers.max(1),
        ..config()
    })
    .unwrap();
    let cache = std::sync::Arc::new(cache);
    let movers =
        with_mover.then(|| Cache::start_movers(&cache, std::time::Duration::from_micros(200)));
    let writes = AtomicU64::new(1);
    let threads = 4;
    thread::scope(|s| {
        for t in 0..threads {
            let cache = &*cache;
            let writes = &writes;
            s.spawn(move || {
                let mut rng = common::Rng(0x9E37_79B9 + t as u64);
                for _ in 0..40_000 {
                    let r = rng.next();
                    // Skewed keys: a hot set that gets demoted, a long cold tail.
                    let k = if r.is_multiple_of(4) {
                        (r >> 8) as u32 % 2000
                    } else {
                        (r >> 8) as u32 % 64
                    };
                    let name = format!("key{k}");
                    match (r >> 40) % 10 {
                        0..=2 => {
                            let w = writes.fetch_add(1, Ordering::Relaxed);
                            let len = ((r >> 20) % 4000) as usize;
                            cache
                                .set(name.as_bytes(), &make_value(k, w, len), 0, 0)
                                .unwrap();
                        }
                        3 => {
                            cache.delete(name.as_bytes()).unwrap();
                        }
                        _ => {
                            if let Some(g) = cache.get(name.as_bytes()).unwrap() {
                                assert_eq!(g.key(), name.as_bytes());
                                check_value(k, g.value());
                                if r.is_multiple_of(97) {
                                    // Hold a guard across more traffic.
                                    thread::yield_now();
                                    check_value(k, g.value());
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    drop(movers);
    cache.verify().unwrap();
    let s = cache.stats();
    assert!(s.tiers[0].segments_evicted > 0, "{s:?}");
    assert_eq!(s.mover_errors, 0);
    if with_mover {
        assert!(s.background_evictions > 0, "{s:?}");
    }
    assert!(s.demotions > 0, "{s:?}");
    assert!(s.tiers[1].segments_evicted > 0, "{s:?}");
    for k in 0..2000u32 {
        if let Some(g) = cache.get(format!("key{k}").as_bytes()).unwrap() {
            check_value(k, g.value());
        }
    }
}

#[test]
fn concurrent_cas_increments_lose_nothing() {
    let (cache, _) = Cache::open(config()).unwrap();
    cache.set(b"ctr", b"0", 0, 0).unwrap();
    cache.set(b"incr", b"0", 0, 0).unwrap();
    let threads = 4;
    let per = 1500u64;
    thread::scope(|s| {
        for _ in 0..threads {
            let cache = &cache;
            s.spawn(move || {
                for _ in 0..per {
                    cache.incr(b"incr", 1).unwrap().unwrap();
                    loop {
                        let g = cache.get(b"ctr").unwrap().unwrap();
                        let n: u64 = std::str::from_utf8(g.value()).unwrap().parse().unwrap();
                        let cas = g.cas();
                        drop(g);
                        let next = (n + 1).to_string();
                        match cache.cas(b"ctr", next.as_bytes(), 0, 0, cas).unwrap() {
                            Store::Stored { .. } => break,
                            Store::Exists => continue,
                            other => panic!("{other:?}"),
                        }
                    }
                }
            });
        }
    });
    let total = (threads * per).to_string();
    assert_eq!(
        cache.get(b"ctr").unwrap().unwrap().value(),
        total.as_bytes()
    );
    assert_eq!(
        cache.get(b"incr").unwrap().unwrap().value(),
        total.as_bytes()
    );
}

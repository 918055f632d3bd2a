//! Pools (`terrace_cache::pools`): namespaces, quotas that hold under pressure from the
//! other pools, tiers split by quota, per-pool stats, restart of every pool (clean and
//! without a shutdown), and clear errors for configurations that cannot work.

use std::path::Path;

use terrace_cache::{
    CacheConfig, CacheError, PoolConfig, PoolQuota, Pools, Stats, TierConfig, TierSize,
};

mod common;
use common::{config, tier_dir, MIB};

/// The segment size of `common::config`.
const SEGMENT: u64 = 1 << 15;

fn pool(name: &str, quota: PoolQuota) -> PoolConfig {
    PoolConfig {
        name: name.to_string(),
        quota,
    }
}

fn value(tag: &str, k: u32) -> Vec<u8> {
    format!("{tag}:{k}:").repeat(40).into_bytes()
}

fn get(pools: &Pools, name: &str, key: &str) -> Option<Vec<u8>> {
    let cache = pools.get(name).expect("the pool exists");
    cache
        .get(key.as_bytes())
        .expect("get")
        .map(|g| g.value().to_vec())
}

#[test]
fn a_key_names_different_items_in_different_pools() {
    let (pools, _) = Pools::open(
        config(vec![TierConfig::dram(TierSize::Bytes(16 * MIB))]),
        &[
            pool("a", PoolQuota::Percent(25.0)),
            pool("b", PoolQuota::Bytes(2 * MIB)),
        ],
    )
    .expect("pools open");
    let names: Vec<&str> = pools.iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["default", "a", "b"]);
    for name in ["default", "a", "b"] {
        let cache = pools.get(name).expect("pool");
        cache
            .set(b"k", name.as_bytes(), 0, 0)
            .expect("set in a pool");
    }
    for name in ["default", "a", "b"] {
        assert_eq!(get(&pools, name, "k").as_deref(), Some(name.as_bytes()));
    }
    assert!(pools.get("a").expect("a").delete(b"k").expect("delete"));
    assert_eq!(get(&pools, "a", "k"), None);
    assert_eq!(get(&pools, "b", "k").as_deref(), Some(&b"b"[..]));
    assert_eq!(
        get(&pools, "default", "k").as_deref(),
        Some(&b"default"[..])
    );
    assert!(pools.get("c").is_none());
}

#[test]
fn a_pool_keeps_its_items_whatever_the_other_pools_write() {
    let (pools, _) = Pools::open(
        config(vec![TierConfig::dram(TierSize::Bytes(8 * MIB))]),
        &[pool("keep", PoolQuota::Percent(25.0))],
    )
    .expect("pools open");
    let keep = pools.get("keep").expect("keep");
    // ~300 KiB: far below the pool's 2 MiB.
    for k in 0..300 {
        keep.set(format!("k{k}").as_bytes(), &value("keep", k), 0, 0)
            .expect("set");
    }
    // Eight times the whole cache through the default pool.
    let default = pools.default_pool();
    for k in 0..64_000u32 {
        default
            .set(format!("d{k}").as_bytes(), &value("d", k), 0, 0)
            .expect("set");
    }
    for k in 0..300 {
        assert_eq!(
            get(&pools, "keep", &format!("k{k}")),
            Some(value("keep", k)),
            "key {k} of pool keep"
        );
    }
    let stats = pools.stats();
    assert!(
        stats[0].1.tiers[0].segments_evicted > 0,
        "the default pool evicted"
    );
    assert_eq!(stats[1].1.tiers[0].segments_evicted, 0, "pool keep evicted");

    // The other way round: pool keep, written far past its quota, evicts its own items
    // and leaves the default pool's alone.
    let survivors: Vec<u32> = (0..64_000u32)
        .rev()
        .take(200)
        .filter(|k| get(&pools, "default", &format!("d{k}")).is_some())
        .collect();
    assert!(
        survivors.len() > 150,
        "the default pool keeps its newest items"
    );
    for k in 0..20_000u32 {
        keep.set(format!("x{k}").as_bytes(), &value("x", k), 0, 0)
            .expect("set");
    }
    for &k in &survivors {
        assert_eq!(
            get(&pools, "default", &format!("d{k}")),
            Some(value("d", k))
        );
    }
    let keep_stats = keep.stats();
    assert!(keep_stats.tiers[0].segments_evicted > 0);
    // It kept what its 2 MiB hold (about 330 bytes an item), not the 20,000 written.
    assert!(
        (1000..=7000).contains(&keep_stats.items),
        "pool keep holds {} items",
        keep_stats.items
    );
}

#[test]
fn quotas_split_every_tier_and_stats_add_up() {
    let dir = tier_dir();
    let (pools, reports) = Pools::open(
        CacheConfig {
            total_bytes: Some(32 * MIB),
            ..config(vec![
                TierConfig::dram(TierSize::Ratio(1)),
                TierConfig::file(dir.path(), TierSize::Ratio(3)),
            ])
        },
        &[
            pool("quarter", PoolQuota::Percent(25.0)),
            pool("bytes", PoolQuota::Bytes(12 * MIB)),
        ],
    )
    .unwrap_or_else(|e| panic!("pools open: {e}"));
    assert_eq!(reports.len(), 3);
    let stats = pools.stats();
    let segments = |i: usize, t: usize| u64::from(stats[i].1.tiers[t].segments) * SEGMENT;
    // dram 8 MiB, file 24 MiB; quarter: 2 + 6 MiB; bytes (12 of 32 MiB): 3 + 9 MiB,
    // rounded down to whole 2 MiB granules: 2 + 8 MiB; the default pool the rest: 4 + 10.
    for (i, dram, file) in [
        (0, 4 * MIB, 10 * MIB),
        (1, 2 * MIB, 6 * MIB),
        (2, 2 * MIB, 8 * MIB),
    ] {
        assert_eq!((segments(i, 0), segments(i, 1)), (dram, file), "pool {i}");
    }
    assert!(dir.path().join("pool-quarter").is_dir());
    assert!(dir.path().join("pool-bytes").is_dir());

    for (i, (name, cache)) in pools.iter().enumerate() {
        for k in 0..=i as u32 * 10 {
            cache
                .set(format!("{name}{k}").as_bytes(), b"v", 0, 0)
                .expect("set");
        }
        let _ = cache.get(b"absent").expect("get");
    }
    let per_pool = pools.stats();
    let all = Stats::combined(per_pool.iter().map(|(_, s)| s));
    assert_eq!(all.items, 1 + 11 + 21);
    assert_eq!(all.misses, 3);
    assert_eq!(all.tiers.len(), 2);
    assert_eq!(
        all.tiers[1].segments,
        per_pool
            .iter()
            .map(|(_, s)| s.tiers[1].segments)
            .sum::<u32>()
    );
}

fn file_pools(dir: &Path) -> (Pools, Vec<terrace_cache::RestartReport>) {
    Pools::open(
        config(vec![TierConfig::file(dir, TierSize::Bytes(8 * MIB))]),
        &[pool("sessions", PoolQuota::Percent(50.0))],
    )
    .unwrap_or_else(|e| panic!("pools open: {e}"))
}

#[test]
fn every_pool_restarts_warm_and_after_a_drop_without_shutdown() {
    restart_rounds(&tier_dir());
}

/// The same on a disk (the checkout's file system): tiers written through the page cache,
/// each pool with its own boot mark.
#[test]
fn every_pool_on_a_disk_restarts_warm_and_after_a_drop_without_shutdown() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a directory");
    restart_rounds(&dir);
    let (pools, _) = file_pools(dir.path());
    if pools.default_pool().stats().tiers[0].flushed_at_shutdown {
        assert!(dir.path().join("terrace.boot").is_file());
        assert!(dir
            .path()
            .join("pool-sessions")
            .join("terrace.boot")
            .is_file());
    }
}

fn restart_rounds(dir: &tempfile::TempDir) {
    let write = |pools: &Pools, round: u32| {
        for (name, cache) in pools.iter() {
            for k in 0..200 {
                cache
                    .set(format!("k{k}").as_bytes(), &value(name, k + round), 0, 0)
                    .expect("set");
            }
            assert!(cache.delete(b"k7").expect("delete"));
        }
    };
    let check = |pools: &Pools, round: u32| {
        for name in ["default", "sessions"] {
            for k in 0..200 {
                let want = (k != 7).then(|| value(name, k + round));
                assert_eq!(get(pools, name, &format!("k{k}")), want, "{name} k{k}");
            }
        }
    };
    let (pools, _) = file_pools(dir.path());
    write(&pools, 0);
    pools.shutdown().expect("clean shutdown");
    let (pools, reports) = file_pools(dir.path());
    assert!(
        reports.iter().all(|r| r.from_saved_index > 0),
        "a clean stop makes every pool's start warm: {reports:?}"
    );
    check(&pools, 0);
    write(&pools, 1);
    drop(pools); // no shutdown: the next open scans
    let (pools, reports) = file_pools(dir.path());
    assert!(reports
        .iter()
        .all(|r| r.from_saved_index == 0 && r.items > 0));
    check(&pools, 1);
}

#[test]
fn configurations_that_cannot_work_are_clear_errors() {
    let base = || config(vec![TierConfig::dram(TierSize::Bytes(16 * MIB))]);
    let cases: Vec<(Vec<PoolConfig>, &str, &str)> = vec![
        (vec![pool("", PoolQuota::Percent(10.0))], "", "1 to 64"),
        (
            vec![pool("a/b", PoolQuota::Percent(10.0))],
            "a/b",
            "letters",
        ),
        (
            vec![pool("default", PoolQuota::Percent(10.0))],
            "default",
            "takes the space",
        ),
        (
            vec![
                pool("a", PoolQuota::Percent(10.0)),
                pool("a", PoolQuota::Percent(10.0)),
            ],
            "a",
            "twice",
        ),
        (
            vec![pool("a", PoolQuota::Percent(0.0))],
            "a",
            "more than nothing",
        ),
        (
            vec![pool("a", PoolQuota::Bytes(16 * MIB))],
            "a",
            "less than the whole",
        ),
        (
            vec![pool("a", PoolQuota::Percent(f64::NAN))],
            "a",
            "more than nothing",
        ),
        (
            vec![
                pool("a", PoolQuota::Percent(60.0)),
                pool("b", PoolQuota::Percent(40.0)),
            ],
            "default",
            "add up to 100.0%",
        ),
        // Less than the 2 MiB granule tiers are mapped in: nothing at all.
        (
            vec![pool("tiny", PoolQuota::Bytes(MIB))],
            "tiny",
            "0 segments of 32 KiB: a pool needs at least 8",
        ),
    ];
    for (named, who, why) in cases {
        match Pools::open(base(), &named) {
            Err(CacheError::Pool { pool, why: got }) => {
                assert_eq!(pool, who, "{named:?}");
                assert!(got.contains(why), "{named:?}: {got}");
            }
            Err(other) => panic!("{named:?}: not a pool error: {other}"),
            Ok(_) => panic!("{named:?}: opened"),
        }
    }
    // Every pool needs 8 segments of every tier, the default pool too: with 1 MiB
    // segments, a 70% pool of 16 MiB gets 10 MiB (whole granules) and leaves 6.
    let big_segments = |share: f64| {
        Pools::open(
            CacheConfig {
                segment_shift: Some(20),
                ..config(vec![TierConfig::dram(TierSize::Bytes(16 * MIB))])
            },
            &[pool("big", PoolQuota::Percent(share))],
        )
    };
    let err = big_segments(70.0).expect_err("6 segments left are too few");
    assert!(
        err.to_string()
            .contains("\"default\": it would get 6 MiB of tier 0, 6 segments"),
        "{err}"
    );
    let (pools, _) = big_segments(60.0).expect("8 + 8 segments");
    let segments: Vec<u32> = pools
        .stats()
        .iter()
        .map(|(_, s)| s.tiers[0].segments)
        .collect();
    assert_eq!(segments, [8, 8]);
    // Quotas in percent are exact: 29% of 200 MiB is 29 granules (0.29 in floating point
    // times 200 MiB falls just short of 58 MiB).
    let (pools, _) = Pools::open(
        config(vec![TierConfig::dram(TierSize::Bytes(200 * MIB))]),
        &[pool("p29", PoolQuota::Percent(29.0))],
    )
    .expect("pools open");
    let p29 = pools.get("p29").expect("p29").stats().tiers[0].segments;
    assert_eq!(u64::from(p29) * SEGMENT, 58 * MIB);
    // A named pool over a missing tier directory: the cache's own error, named.
    let missing = tempfile::tempdir().expect("dir").path().join("missing");
    let err = Pools::open(
        config(vec![TierConfig::file(&missing, TierSize::Bytes(4 * MIB))]),
        &[pool("a", PoolQuota::Percent(50.0))],
    )
    .expect_err("a missing directory is an error");
    assert!(err.to_string().contains("does not exist"), "{err}");
    // A flash tier at a path of its own cannot be split between pools.
    let dir = tempfile::tempdir().expect("dir");
    let err = Pools::open(
        config(vec![
            TierConfig::dram(TierSize::Bytes(32 * MIB)),
            TierConfig::flash_at(dir.path(), dir.path().join("f"), TierSize::Bytes(32 * MIB)),
        ]),
        &[pool("a", PoolQuota::Percent(50.0))],
    )
    .expect_err("one flash file for two pools");
    let one_pool = |why: &str| why.contains("serves one pool");
    assert!(
        matches!(&err, CacheError::Pool { pool, why } if pool == "a" && one_pool(why)),
        "{err}"
    );
}

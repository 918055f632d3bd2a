//! Small items in the flash tier's sets: they move out of the small-item log into their
//! sets and are read back with their values; an overwrite or delete of a set item never
//! lets the old value come back, not after an unclean stop either; a clean restart keeps
//! them; `flush_all` empties the sets for good.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

use terrace_cache::flash::flash_path;
use terrace_cache::{
    Cache, CacheConfig, CacheError, FlashSetsConfig, SetStats, TierConfig, TierSize,
};

mod common;
use common::{config, flash_dir, MIB};

fn with_sets(dir: &Path) -> CacheConfig {
    CacheConfig {
        expected_items: Some(200_000),
        flash_sets: Some(FlashSetsConfig::new(0.5)),
        ..config(vec![
            TierConfig::dram(TierSize::Bytes(2 * MIB)),
            TierConfig::flash(dir, TierSize::Bytes(16 * MIB)),
        ])
    }
}

fn value(k: u32, version: u32) -> Vec<u8> {
    let mut v = format!("{k}:{version}:").into_bytes();
    v.resize(20 + (k as usize * 37) % 100, b'a' + (version % 26) as u8);
    v
}

fn key(k: u32) -> Vec<u8> {
    format!("key{k}").into_bytes()
}

/// Writes keys `from..to` at `version`, each read once soon after (so that DRAM
/// probation passes it on to flash).
fn fill(c: &Cache, keys: std::ops::Range<u32>, version: u32, latest: &mut HashMap<u32, u32>) {
    for k in keys.clone() {
        c.set(&key(k), &value(k, version), 0, 0).unwrap();
        latest.insert(k, version);
        if k >= keys.start + 10 {
            let _ = c.get(&key(k - 10)).unwrap();
        }
    }
}

/// Every hit has the latest value and every deleted key misses; returns the hits.
fn check(c: &Cache, latest: &HashMap<u32, u32>, deleted: &[u32]) -> usize {
    let mut hits = 0;
    for (&k, &v) in latest {
        if let Some(g) = c.peek(&key(k)).unwrap() {
            assert_eq!(g.value(), &value(k, v)[..], "key{k}");
            hits += 1;
        }
    }
    for &k in deleted {
        assert!(c.peek(&key(k)).unwrap().is_none(), "deleted key{k}");
    }
    hits
}

fn set_stats(c: &Cache) -> SetStats {
    c.stats().tiers[1]
        .flash
        .as_ref()
        .and_then(|f| f.sets.clone())
        .expect("the flash tier has sets")
}

#[test]
fn small_items_move_into_sets_and_are_read_back() {
    let dir = flash_dir();
    let (c, _) = Cache::open(with_sets(dir.path())).unwrap();
    let mut latest = HashMap::new();
    fill(&c, 0..60_000, 0, &mut latest);
    let s = set_stats(&c);
    assert!(s.items_moved > 10_000 && s.items > 10_000, "{s:?}");
    assert!(
        s.pages_written > 0 && s.pages_written < s.items_moved,
        "{s:?}"
    );
    let hits = check(&c, &latest, &[]);
    // Reads that find set items promote them into DRAM.
    let mut from_sets = 0;
    for k in 0..20_000 {
        if let Some(g) = c.get(&key(k)).unwrap() {
            assert_eq!(g.value(), &value(k, 0)[..]);
            from_sets += usize::from(g.tier() == 1);
        }
    }
    let s = set_stats(&c);
    eprintln!("{hits} of 60000 hit, {from_sets} from sets; {s:?}");
    assert!(hits > 40_000, "{hits}");
    assert!(s.hits > 1000 && from_sets > 1000, "{s:?}");
    // About a byte of DRAM per set item.
    assert!(s.memory_bytes < s.items * 2, "{s:?}");
}

#[test]
fn overwrites_and_deletes_of_set_items_never_come_back() {
    let dir = flash_dir();
    let (c, _) = Cache::open(with_sets(dir.path())).unwrap();
    let mut latest = HashMap::new();
    fill(&c, 0..40_000, 0, &mut latest);
    assert!(set_stats(&c).items > 5_000);
    let mut deleted = Vec::new();
    for k in (0..40_000).step_by(3) {
        c.set(&key(k), &value(k, 1), 0, 0).unwrap();
        latest.insert(k, 1);
    }
    for k in (1..40_000).step_by(10) {
        c.delete(&key(k)).unwrap();
        latest.remove(&k);
        deleted.push(k);
    }
    assert!(set_stats(&c).kills > 1000, "{:?}", set_stats(&c));
    check(&c, &latest, &deleted);
    // Push the new versions through the log into the sets too.
    fill(&c, 40_000..80_000, 0, &mut latest);
    check(&c, &latest, &deleted);
    drop(c);
    let (c, report) = Cache::open(with_sets(dir.path())).unwrap();
    let hits = check(&c, &latest, &deleted);
    eprintln!("after an unclean stop: {hits} hits; {report:?}");
    assert!(set_stats(&c).items > 5_000);
}

#[test]
fn a_clean_restart_keeps_set_items() {
    let dir = flash_dir();
    let (c, _) = Cache::open(with_sets(dir.path())).unwrap();
    let mut latest = HashMap::new();
    fill(&c, 0..60_000, 0, &mut latest);
    let before = check(&c, &latest, &[]);
    let items = set_stats(&c).items;
    c.shutdown().unwrap();
    let (c, report) = Cache::open(with_sets(dir.path())).unwrap();
    let after = check(&c, &latest, &[]);
    assert_eq!(after, before, "{report:?}");
    assert_eq!(set_stats(&c).items, items);
}

#[test]
fn flush_all_empties_the_sets_for_good() {
    let dir = flash_dir();
    let (c, _) = Cache::open(with_sets(dir.path())).unwrap();
    let mut latest = HashMap::new();
    fill(&c, 0..40_000, 0, &mut latest);
    assert!(set_stats(&c).items > 5_000);
    c.flush_all();
    assert_eq!(check(&c, &latest, &[]), 0);
    drop(c);
    let (c, _) = Cache::open(with_sets(dir.path())).unwrap();
    assert_eq!(check(&c, &latest, &[]), 0);
}

#[test]
fn a_bad_sets_configuration_is_refused() {
    let dir = flash_dir();
    for sets in [
        FlashSetsConfig::new(0.99),
        FlashSetsConfig {
            max_item: 4096,
            ..FlashSetsConfig::new(0.5)
        },
    ] {
        let config = CacheConfig {
            flash_sets: Some(sets),
            ..with_sets(dir.path())
        };
        let err = Cache::open(config).unwrap_err();
        assert!(matches!(err, CacheError::Config { .. }), "{err}");
    }
}

#[test]
fn a_fetch_stages_set_pages_so_that_the_get_reads_no_page() {
    let dir = flash_dir();
    let (c, _) = Cache::open(with_sets(dir.path())).unwrap();
    let mut latest = HashMap::new();
    fill(&c, 0..60_000, 0, &mut latest);
    let staged_used = |c: &Cache| c.stats().tiers[1].flash.as_ref().unwrap().staged_used;
    // The test's own I/O engine for the planned reads (a server's ring).
    let file = std::fs::File::open(flash_path(dir.path(), 1)).unwrap();
    let mut from_sets = 0;
    for k in 0..20_000u32 {
        let Some(fetch) = c.flash_fetch(&key(k)) else {
            continue;
        };
        if k % 2 == 0 {
            std::thread::scope(|s| {
                s.spawn(|| c.run_flash_fetch(&fetch));
            });
        } else {
            for mut read in c.flash_reads(&fetch) {
                let at = read.file_offset();
                let n = file.read_at(read.buffer(), at).unwrap();
                assert!(c.finish_flash_read(read, Ok(n)).is_none());
            }
        }
        let (hits, used) = (set_stats(&c).hits, staged_used(&c));
        let g = c.get(&key(k)).unwrap();
        if set_stats(&c).hits > hits {
            assert!(staged_used(&c) > used, "key{k}: its page was read inline");
            assert_eq!(g.unwrap().value(), &value(k, 0)[..]);
            from_sets += 1;
        }
    }
    assert!(from_sets > 1000, "{from_sets} gets from sets");
}

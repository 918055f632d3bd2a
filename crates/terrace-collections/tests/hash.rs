//! The hash map against a `std::collections::HashMap` model: random puts, replaces and
//! removes on 4-slot pages (chains, overflow pages, a split per overflow, table growth),
//! inline and out-of-line values; iteration; reopen from a file; readers during writes.

mod common;

use std::collections::HashMap as Model;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use terrace_collections::{check, CollectionError, Collections, MapOptions};
use terrace_pool::{Pool, RecordingBackend};

use common::Rng;

fn tiny() -> MapOptions {
    MapOptions {
        shape: Some((4, 4)),
        ..MapOptions::create(12, 16)
    }
}

#[test]
fn random_operations_match_a_model_with_splits_and_overflow() {
    let pool = Pool::create_on(RecordingBackend::new(64 << 20), "hash", 4).unwrap();
    let colls = Collections::open(&pool).unwrap();
    let map = colls.hash_map("h", tiny()).unwrap();
    let mut model = Model::new();
    let mut rng = Rng(9);
    for round in 0..8000u64 {
        let k = format!("k{}", rng.below(if round < 4000 { 1500 } else { 600 })).into_bytes();
        match rng.below(10) {
            0..=5 => {
                let len = if rng.below(6) == 0 {
                    20 + rng.below(300)
                } else {
                    rng.below(17)
                } as usize;
                let v: Vec<u8> = (0..len).map(|i| (i as u64 ^ round) as u8).collect();
                assert_eq!(map.put(&k, &v).unwrap(), model.insert(k, v).is_none());
            }
            6..=7 => assert_eq!(map.remove(&k).unwrap(), model.remove(&k).is_some()),
            _ => {
                let want = model.get(&k);
                assert_eq!(map.get(&k).unwrap().as_ref(), want);
                let cap = rng.below(40) as usize;
                common::check_get_to(want, cap, |buf| map.get_to(&k, buf).unwrap());
            }
        }
        if round % 1000 == 999 {
            assert_eq!(map.len().unwrap(), model.len() as u64);
            let all: Model<Vec<u8>, Vec<u8>> = map.iter().collect::<Result<_, _>>().unwrap();
            assert_eq!(all, model);
            let report = check(&pool).unwrap();
            assert!(report.unreachable.is_empty(), "{report:?}");
            assert_eq!(report.entries, model.len() as u64);
        }
    }
    assert!(
        map.buckets().unwrap() > 100,
        "splits happened: {}",
        map.buckets().unwrap()
    );
    assert!(matches!(
        map.put(&[1; 13], b"v"),
        Err(CollectionError::KeyTooLong { .. })
    ));
    assert!(matches!(
        colls.ordered_map("h", MapOptions::existing()),
        Err(CollectionError::WrongKind { .. })
    ));
    drop(map);
    colls.destroy("h").unwrap();
    let report = check(&pool).unwrap();
    assert_eq!(
        (report.bindings, report.unreachable.len()),
        (0, 0),
        "{report:?}"
    );
}

#[test]
fn a_file_pool_reopens_with_its_hash_map() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let mut model = Model::new();
    {
        let pool = Pool::create(&path, 64 << 20, "hash").unwrap();
        let colls = Collections::open(&pool).unwrap();
        let map = colls.hash_map("h", MapOptions::create(16, 8)).unwrap();
        let mut rng = Rng(1);
        for _ in 0..50_000 {
            let (k, v) = (
                rng.next().to_be_bytes().to_vec(),
                rng.next().to_le_bytes().to_vec(),
            );
            map.put(&k, &v).unwrap();
            model.insert(k, v);
        }
    }
    let pool = Pool::open(&path, "hash").unwrap();
    let colls = Collections::open(&pool).unwrap();
    let map = colls.hash_map("h", MapOptions::existing()).unwrap();
    for (k, v) in model.iter().take(5000) {
        assert_eq!(map.get(k).unwrap().as_ref(), Some(v));
    }
    assert_eq!(map.len().unwrap(), model.len() as u64);
    assert!(check(&pool).unwrap().unreachable.is_empty());
}

#[test]
fn readers_see_consistent_values_while_buckets_split() {
    let pool = Pool::create_on(RecordingBackend::new(64 << 20), "hash", 4).unwrap();
    let colls = Collections::open(&pool).unwrap();
    let map = colls.hash_map("h", tiny()).unwrap();
    let val = |k: &[u8]| k.repeat(2);
    let stop = AtomicBool::new(false);
    let seen = AtomicU64::new(0);
    std::thread::scope(|s| {
        for r in 0..2u64 {
            let (map, stop, seen) = (&map, &stop, &seen);
            s.spawn(move || {
                let mut rng = Rng(r + 3);
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("{:05}", rng.below(3000)).into_bytes();
                    if let Some(v) = map.get(&k).unwrap() {
                        assert_eq!(v, val(&k));
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        let mut rng = Rng(4);
        let mut ops = 0;
        // Writes go on until the readers have read during them.
        while ops < 30_000 || seen.load(Ordering::Relaxed) == 0 {
            ops += 1;
            let k = format!("{:05}", rng.below(3000)).into_bytes();
            if rng.below(4) == 0 {
                map.remove(&k).unwrap();
            } else {
                map.put(&k, &val(&k)).unwrap();
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(seen.load(Ordering::Relaxed) > 0);
    assert!(check(&pool).unwrap().unreachable.is_empty());
}

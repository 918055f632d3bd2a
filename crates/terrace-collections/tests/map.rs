//! The ordered map against a `BTreeMap` model: random puts, replaces, removes and range
//! scans in both directions on tiny nodes (deep trees, many splits, moves and merges),
//! every value length (inline and out of line); reopen from a file; concurrent readers
//! with a writer; named roots; `check` on injected leaks and corrupt nodes.

mod common;

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use terrace_collections::layout::{H_ROOT, LEAF_BITMAP, TYPE_LEAF};
use terrace_collections::{
    check, sweep, CollectionError, Collections, Kind, MapOptions, OrderedMap,
};
use terrace_pool::{Backend, HandleAt, Pool, RecordingBackend};

use common::Rng;

fn key(rng: &mut Rng, space: u64) -> Vec<u8> {
    let k = rng.below(space);
    // Variable lengths, shared prefixes: 1..=12 bytes.
    let len = 1 + (k % 12) as usize;
    let mut v = format!("{k:08}").into_bytes();
    v.resize(len, b'~');
    v
}

fn value(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(10) {
        0 => 0,
        1..=6 => rng.below(17) as usize,
        7 | 8 => 17 + rng.below(40) as usize,
        _ => 200 + rng.below(3000) as usize,
    };
    let seed = rng.next() as u8;
    (0..len).map(|i| seed.wrapping_add(i as u8)).collect()
}

fn tiny() -> MapOptions {
    MapOptions {
        shape: Some((4, 4)),
        ..MapOptions::create(12, 16)
    }
}

fn collect<B: Backend>(
    map: &OrderedMap<'_, B>,
    lo: Bound<&[u8]>,
    hi: Bound<&[u8]>,
    rev: bool,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    map.range(lo, hi, rev)
        .collect::<Result<_, _>>()
        .expect("scan")
}

fn model_range(
    model: &BTreeMap<Vec<u8>, Vec<u8>>,
    lo: Bound<&[u8]>,
    hi: Bound<&[u8]>,
    rev: bool,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let own = |b: Bound<&[u8]>| match b {
        Bound::Included(k) => Bound::Included(k.to_vec()),
        Bound::Excluded(k) => Bound::Excluded(k.to_vec()),
        Bound::Unbounded => Bound::Unbounded,
    };
    let (lo, hi) = (own(lo), own(hi));
    if let (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) =
        (&lo, &hi)
    {
        if a > b
            || (a == b && !(matches!(lo, Bound::Included(_)) && matches!(hi, Bound::Included(_))))
        {
            return Vec::new();
        }
    }
    let it = model.range((lo, hi)).map(|(k, v)| (k.clone(), v.clone()));
    if rev {
        it.rev().collect()
    } else {
        it.collect()
    }
}

fn bound<'a>(rng: &mut Rng, k: &'a [u8]) -> Bound<&'a [u8]> {
    match rng.below(3) {
        0 => Bound::Unbounded,
        1 => Bound::Included(k),
        _ => Bound::Excluded(k),
    }
}

#[test]
fn random_operations_match_a_btreemap_on_tiny_nodes() {
    let pool = Pool::create_on(RecordingBackend::new(64 << 20), "map", 4).unwrap();
    let colls = Collections::open(&pool).unwrap();
    let map = colls.ordered_map("m", tiny()).unwrap();
    let mut model = BTreeMap::new();
    let mut rng = Rng(7);
    for round in 0..6000u64 {
        let k = key(&mut rng, if round < 3000 { 400 } else { 150 });
        match rng.below(10) {
            0..=5 => {
                let v = value(&mut rng);
                let added = map.put(&k, &v).unwrap();
                assert_eq!(added, model.insert(k, v).is_none());
            }
            6..=8 => assert_eq!(map.remove(&k).unwrap(), model.remove(&k).is_some()),
            _ => {
                let want = model.get(&k);
                assert_eq!(map.get(&k).unwrap().as_ref(), want);
                let cap = rng.below(40) as usize;
                common::check_get_to(want, cap, |buf| map.get_to(&k, buf).unwrap());
            }
        }
        if round % 500 == 499 {
            assert_eq!(map.len().unwrap(), model.len() as u64);
            assert_eq!(
                collect(&map, Bound::Unbounded, Bound::Unbounded, false),
                model_range(&model, Bound::Unbounded, Bound::Unbounded, false)
            );
            for _ in 0..40 {
                let (a, b) = (key(&mut rng, 400), key(&mut rng, 400));
                let (lo, hi) = (bound(&mut rng, &a), bound(&mut rng, &b));
                let rev = rng.below(2) == 1;
                assert_eq!(
                    collect(&map, lo, hi, rev),
                    model_range(&model, lo, hi, rev),
                    "range {lo:?}..{hi:?} rev {rev}"
                );
            }
            let report = check(&pool).unwrap();
            assert!(report.unreachable.is_empty(), "{report:?}");
            assert_eq!(report.entries, model.len() as u64);
        }
    }
    // Empty it: every leaf and inner node goes back to the pool.
    let keys: Vec<_> = model.keys().cloned().collect();
    for k in keys {
        assert!(map.remove(&k).unwrap());
    }
    assert_eq!(map.len().unwrap(), 0);
    // What is left: the map's empty root leaf and the directory's leaf.
    let report = check(&pool).unwrap();
    assert_eq!(
        (report.leaves, report.inner_nodes, report.blobs),
        (2, 0, 0),
        "{report:?}"
    );
}

#[test]
fn keys_too_long_and_wrong_kinds_are_errors() {
    let pool = Pool::create_on(RecordingBackend::new(8 << 20), "map", 2).unwrap();
    let colls = Collections::open(&pool).unwrap();
    let map = colls.ordered_map("m", MapOptions::create(8, 8)).unwrap();
    assert!(matches!(
        map.put(&[1; 9], b"v"),
        Err(CollectionError::KeyTooLong { len: 9, max: 8 })
    ));
    assert!(matches!(
        map.get(&[1; 9]),
        Err(CollectionError::KeyTooLong { .. })
    ));
    assert!(map.put(b"", b"empty key").unwrap());
    assert_eq!(map.get(b"").unwrap().as_deref(), Some(&b"empty key"[..]));
    assert!(matches!(
        colls.ordered_map("m", MapOptions::existing()),
        Err(CollectionError::Busy { .. })
    ));
    drop(map);
    assert!(matches!(
        colls.ordered_map("m", MapOptions::create(9, 8)),
        Err(CollectionError::Mismatch {
            what: "max key",
            ..
        })
    ));
    assert!(matches!(
        colls.ordered_map("nope", MapOptions::existing()),
        Err(CollectionError::NotFound { .. })
    ));
    assert!(matches!(
        colls.ordered_map("", MapOptions::create(8, 8)),
        Err(CollectionError::InvalidArgument { .. })
    ));
    assert!(
        colls.ordered_map("m", MapOptions::create(0, 8)).is_ok(),
        "0 accepts the map's size"
    );
    let obj = pool.zalloc(64, 5, HandleAt::None).unwrap();
    colls.bind_object("config", obj).unwrap();
    assert!(matches!(
        colls.bind_object("config", obj),
        Err(CollectionError::AlreadyBound { .. })
    ));
    assert!(matches!(
        colls.ordered_map("config", MapOptions::create(8, 8)),
        Err(CollectionError::WrongKind { .. })
    ));
    let names: Vec<_> = colls
        .bindings()
        .unwrap()
        .into_iter()
        .map(|b| (b.name, b.kind))
        .collect();
    assert_eq!(
        names,
        vec![
            ("config".into(), Kind::Object),
            ("m".into(), Kind::OrderedMap)
        ]
    );
    assert!(matches!(
        Collections::open(&pool),
        Err(CollectionError::Busy { .. })
    ));
    assert_eq!(colls.unbind_object("config").unwrap(), obj);
    assert_eq!(check(&pool).unwrap().untracked, 1);
}

#[test]
fn a_file_pool_reopens_with_its_maps() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool");
    let mut model = BTreeMap::new();
    {
        let pool = Pool::create(&path, 32 << 20, "reopen").unwrap();
        let colls = Collections::open(&pool).unwrap();
        let map = colls
            .ordered_map("index", MapOptions::create(16, 8))
            .unwrap();
        let mut rng = Rng(3);
        for _ in 0..20_000 {
            let k = rng.next().to_be_bytes().to_vec();
            let v = rng.next().to_le_bytes().to_vec();
            map.put(&k, &v).unwrap();
            model.insert(k, v);
        }
        for leaf in pool.objects(Some(TYPE_LEAF)).unwrap() {
            assert_eq!(leaf.oid.offset() % 64, 0, "leaves are cache-line aligned");
        }
        let stats = pool.stats();
        let per = (stats.heap_bytes - stats.free_bytes) as f64 / model.len() as f64;
        eprintln!("bytes per 8-byte key, 8-byte value entry: {per:.1}");
    }
    let pool = Pool::open(&path, "reopen").unwrap();
    let colls = Collections::open(&pool).unwrap();
    let map = colls.ordered_map("index", MapOptions::existing()).unwrap();
    assert_eq!(map.len().unwrap(), model.len() as u64);
    for (k, v) in model.iter().take(2000) {
        assert_eq!(map.get(k).unwrap().as_ref(), Some(v));
    }
    assert_eq!(
        collect(&map, Bound::Unbounded, Bound::Unbounded, true),
        model_range(&model, Bound::Unbounded, Bound::Unbounded, true)
    );
    drop(map);
    colls.destroy("index").unwrap();
    let report = check(&pool).unwrap();
    assert_eq!((report.bindings, report.unreachable.len()), (0, 0));
    // The directory's own leaf is all that is left.
    assert_eq!(pool.objects(Some(TYPE_LEAF)).unwrap().len(), 1);
}

#[test]
fn readers_see_consistent_values_while_a_writer_splits_and_removes() {
    let pool = Pool::create_on(RecordingBackend::new(64 << 20), "map", 4).unwrap();
    let colls = Collections::open(&pool).unwrap();
    let map = colls.ordered_map("m", tiny()).unwrap();
    // Every value is its key repeated: a reader that sees a torn or foreign value fails.
    let val = |k: &[u8]| k.repeat(3);
    for i in 0..300u32 {
        let k = format!("{i:05}").into_bytes();
        map.put(&k, &val(&k)).unwrap();
    }
    let stop = AtomicBool::new(false);
    let seen = AtomicU64::new(0);
    std::thread::scope(|s| {
        for r in 0..2u64 {
            let (map, stop, seen) = (&map, &stop, &seen);
            s.spawn(move || {
                let mut rng = Rng(r + 11);
                while !stop.load(Ordering::Relaxed) {
                    let k = format!("{:05}", rng.below(600)).into_bytes();
                    if let Some(v) = map.get(&k).unwrap() {
                        assert_eq!(v, val(&k));
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                    let mut last: Option<Vec<u8>> = None;
                    for e in map
                        .range(Bound::Included(k.as_slice()), Bound::Unbounded, false)
                        .take(20)
                    {
                        let (ek, ev) = e.unwrap();
                        assert_eq!(ev, val(&ek));
                        assert!(last.as_ref().is_none_or(|l| *l < ek), "ascending");
                        last = Some(ek);
                    }
                }
            });
        }
        let mut rng = Rng(5);
        let mut ops = 0;
        // Writes go on until the readers have read during them.
        while ops < 20_000 || seen.load(Ordering::Relaxed) == 0 {
            ops += 1;
            let k = format!("{:05}", rng.below(600)).into_bytes();
            if rng.below(2) == 0 {
                map.put(&k, &val(&k)).unwrap();
            } else {
                map.remove(&k).unwrap();
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(seen.load(Ordering::Relaxed) > 0);
    assert!(check(&pool).unwrap().unreachable.is_empty());
}

/// A writer waiting for a pool lane (every lane held by open transactions, as a program
/// holds one between its calls) does not hold readers off: a get answers while the writer
/// waits, and the writer goes on once a lane is free.
#[test]
fn readers_do_not_wait_for_a_writer_waiting_for_a_lane() {
    let pool = Pool::create_on(RecordingBackend::new(16 << 20), "map", 2).unwrap();
    let colls = Collections::open(&pool).unwrap();
    let map = colls.ordered_map("m", tiny()).unwrap();
    let key = |i: u32| format!("k{i:04}").into_bytes();
    for i in 0..40 {
        map.put(&key(i), b"v").unwrap();
    }
    let lanes: Vec<_> = (0..2).map(|_| pool.begin().unwrap()).collect();
    let (map, key) = (&map, &key);
    std::thread::scope(|s| {
        // New keys into 4-slot leaves: a split (a transaction) comes within a few puts.
        let writer = s.spawn(move || {
            for i in 1000..1040 {
                map.put(&key(i), b"w").unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !writer.is_finished(),
            "the writer should be waiting for a lane"
        );
        let (done, answered) = std::sync::mpsc::channel();
        s.spawn(move || {
            let got = map.get(&key(7)).unwrap();
            let _ = done.send(got);
        });
        let got = answered.recv_timeout(Duration::from_secs(5));
        // Free the lanes whatever happened, so that every thread ends.
        drop(lanes);
        let got = got.expect("a get waited for the writer, which waits for a lane");
        assert_eq!(got.as_deref(), Some(&b"v"[..]));
        writer.join().unwrap();
    });
    assert_eq!(map.len().unwrap(), 80);
}

#[test]
fn check_reports_an_unreachable_node_and_a_corrupt_one() {
    let pool = Pool::create_on(RecordingBackend::new(16 << 20), "map", 2).unwrap();
    let colls = Collections::open(&pool).unwrap();
    let map = colls.ordered_map("m", tiny()).unwrap();
    for i in 0..100u32 {
        map.put(format!("{i:04}").as_bytes(), b"v").unwrap();
    }
    // A leaf nobody links to: what a crash inside `destroy` leaves.
    let stray = pool
        .zalloc(map.geometry().leaf_size(), TYPE_LEAF, HandleAt::None)
        .unwrap();
    let report = check(&pool).unwrap();
    assert_eq!(report.unreachable, vec![stray]);
    assert_eq!(sweep(&pool, &report).unwrap(), 1);
    assert!(check(&pool).unwrap().unreachable.is_empty());
    // The opt-in sweep at open does the same.
    let again = pool
        .zalloc(64, terrace_collections::layout::TYPE_BLOB, HandleAt::None)
        .unwrap();
    drop(map);
    drop(colls);
    let (colls, freed) = Collections::open_sweeping(&pool).unwrap();
    assert_eq!(freed, 1);
    assert!(pool.usable_size(again).is_err(), "the stray blob is freed");
    let map = colls.ordered_map("m", MapOptions::existing()).unwrap();
    // Corrupt a live slot's key length in the first leaf.
    let mut first = map.iter();
    first.next().unwrap().unwrap();
    drop(first);
    let leaves = pool.objects(Some(TYPE_LEAF)).unwrap();
    let dir_leaf = pool
        .backend()
        .load_u64(pool.directory().unwrap().unwrap().offset() + H_ROOT)
        .unwrap();
    let leaf = leaves
        .iter()
        .find(|o| {
            o.oid.offset() != dir_leaf
                && pool
                    .backend()
                    .load_u64(o.oid.offset() + LEAF_BITMAP)
                    .unwrap()
                    != 0
        })
        .unwrap();
    let bitmap = pool
        .backend()
        .load_u64(leaf.oid.offset() + LEAF_BITMAP)
        .unwrap();
    let slot = leaf.oid.offset() + map.geometry().slot_off(bitmap.trailing_zeros());
    pool.backend().write(slot, &[200]).unwrap();
    match check(&pool) {
        Err(CollectionError::Corrupt { what, offset }) => {
            assert_eq!(offset, slot, "{what}");
            assert!(what.contains("key of 200 bytes"), "{what}");
        }
        other => panic!("expected a corrupt node, got {other:?}"),
    }
    // Operations touching it give the same kind of error, not a panic.
    let scan: Result<Vec<_>, _> = map.iter().collect();
    assert!(
        matches!(scan, Err(CollectionError::Corrupt { .. })),
        "{scan:?}"
    );
}

#[test]
fn removes_merge_near_empty_leaves_into_their_siblings() {
    let pool = Pool::create_on(RecordingBackend::new(32 << 20), "map", 2).unwrap();
    let colls = Collections::open(&pool).unwrap();
    let map = colls.ordered_map("m", MapOptions::create(16, 8)).unwrap();
    let mut rng = Rng(21);
    let mut keys: Vec<Vec<u8>> = (0..20_000)
        .map(|_| rng.next().to_be_bytes().repeat(2))
        .collect();
    for k in &keys {
        map.put(k, b"8 bytes!").unwrap();
    }
    let full = check(&pool).unwrap().leaves;
    // Remove 95% in random order: without merges the leaves would stay, nearly empty.
    for i in (1..keys.len()).rev() {
        keys.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let kept = keys.split_off(19_000);
    for k in &keys {
        assert!(map.remove(k).unwrap());
    }
    let report = check(&pool).unwrap();
    let slots = map.geometry().leaf_slots as u64;
    // Every leaf but a few holds more than a quarter of its slots or was merged away.
    assert!(
        report.leaves <= 1 + 2 * kept.len() as u64 / (slots / 4),
        "{} leaves for {} entries (from {full})",
        report.leaves,
        kept.len()
    );
    let mut sorted = kept.clone();
    sorted.sort();
    let scanned: Vec<Vec<u8>> = map.iter().map(|e| e.unwrap().0).collect();
    assert_eq!(scanned, sorted);
}

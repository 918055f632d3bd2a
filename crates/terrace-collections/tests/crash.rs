//! The collections' crash-image suite: creating a named ordered map and a named hash map,
//! then random puts (inline and out of line), replaces and removes on tiny nodes (4-slot
//! leaves and pages, fanout 4, 4-bucket segments: splits, moves into siblings, root
//! splits, leaf removals, root collapses, overflow pages, bucket splits and table growth
//! all happen within a few hundred operations), run on the recording backend. For every persist
//! point, the exact durable image and a torn variant (a random subset of the lines still
//! dirty also written back) are recovered and checked: the pool opens and its `check`
//! passes, the collections' `check` passes with nothing unreachable, and the maps' entries
//! equal the `BTreeMap` models before or after the operation in flight (after, once the
//! operation's last persist completed).

mod common;

use std::collections::BTreeMap;
use std::time::Instant;

use terrace_collections::{Collections, MapOptions};
use terrace_pool::{Pool, RecordingBackend};

use common::Rng;

const LAYOUT: &str = "collections-crash";
/// The ordered map's and the hash map's entries (`None`: not bound).
type Entries = Option<BTreeMap<Vec<u8>, Vec<u8>>>;
type Model = (Entries, Entries);

fn options() -> MapOptions {
    MapOptions {
        shape: Some((4, 4)),
        ..MapOptions::create(10, 12)
    }
}

/// What the image holds: each map's entries, or `None` when its name is not bound.
fn read_model(pool: &Pool<RecordingBackend>, what: &str) -> Model {
    let colls = Collections::open(pool).unwrap_or_else(|e| panic!("{what}: directory: {e}"));
    let bound = |name: &str| {
        colls
            .lookup(name)
            .unwrap_or_else(|e| panic!("{what}: lookup: {e}"))
            .is_some()
    };
    let ordered = bound("m").then(|| {
        let map = colls
            .ordered_map("m", MapOptions::existing())
            .unwrap_or_else(|e| panic!("{what}: open map: {e}"));
        let entries = map
            .iter()
            .collect::<Result<BTreeMap<_, _>, _>>()
            .unwrap_or_else(|e| panic!("{what}: scan: {e}"));
        assert_eq!(map.len().unwrap(), entries.len() as u64, "{what}: len");
        entries
    });
    let hash = bound("h").then(|| {
        let map = colls
            .hash_map("h", MapOptions::existing())
            .unwrap_or_else(|e| panic!("{what}: open hash map: {e}"));
        let entries = map
            .iter()
            .collect::<Result<BTreeMap<_, _>, _>>()
            .unwrap_or_else(|e| panic!("{what}: hash scan: {e}"));
        assert_eq!(map.len().unwrap(), entries.len() as u64, "{what}: hash len");
        entries
    });
    (ordered, hash)
}

fn verify(image: Vec<u8>, allowed: &[&Model], what: &str) {
    common::verify_image(image, LAYOUT, allowed, what, read_model);
}

fn run_sequence(seed: u64, ops: usize) -> usize {
    let pool = Pool::create_on(RecordingBackend::new(4 << 20), LAYOUT, 2).expect("pool");
    pool.backend().start_recording();
    let mut states: Vec<Model> = vec![(None, None)];
    let mut ends = Vec::new();
    let mut rng = Rng(seed);
    {
        let colls = Collections::open(&pool).expect("directory");
        let map = colls.ordered_map("m", options()).expect("map");
        let mut model = BTreeMap::new();
        states.push((Some(model.clone()), None));
        ends.push(pool.backend().recorded_points());
        let hash = colls.hash_map("h", options()).expect("hash map");
        let mut hash_model = BTreeMap::new();
        states.push((Some(model.clone()), Some(hash_model.clone())));
        ends.push(pool.backend().recorded_points());
        for i in 0..ops {
            let key = format!("k{:03}", rng.below(if i < ops / 2 { 48 } else { 24 })).into_bytes();
            let on_hash = rng.below(2) == 0;
            if rng.below(3) == 0 {
                if on_hash {
                    hash.remove(&key).expect("hash remove");
                    hash_model.remove(&key);
                } else {
                    map.remove(&key).expect("remove");
                    model.remove(&key);
                }
            } else {
                let len = match rng.below(6) {
                    0 => 40 + rng.below(200) as usize,
                    _ => rng.below(13) as usize,
                };
                let value: Vec<u8> = (0..len).map(|b| (b as u64 ^ rng.next()) as u8).collect();
                if on_hash {
                    hash.put(&key, &value).expect("hash put");
                    hash_model.insert(key, value);
                } else {
                    map.put(&key, &value).expect("put");
                    model.insert(key, value);
                }
            }
            states.push((Some(model.clone()), Some(hash_model.clone())));
            ends.push(pool.backend().recorded_points());
        }
    }
    let recording = pool.backend().take_recording();
    let points = recording.points();
    common::check_every_point(
        &recording,
        &states,
        &ends,
        &format!("seq {seed} "),
        seed,
        verify,
    );
    points
}

#[test]
fn every_persist_point_of_the_collections_recovers() {
    let start = Instant::now();
    let mut total = 0;
    for seed in [1u64, 2, 3] {
        let points = run_sequence(seed, 240);
        eprintln!("seq {seed}: {points} persist points");
        total += points;
    }
    eprintln!(
        "{total} persist points, each exact and torn, in {:?}",
        start.elapsed()
    );
    assert!(total >= 1000, "only {total} persist points");
}

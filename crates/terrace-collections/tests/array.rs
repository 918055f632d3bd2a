//! The persistent array: against a `Vec` model (single elements, runs, 8-byte words),
//! across reopening, with wrong arguments, kinds and sizes refused, destroy and check; a
//! crash image at every persist point of creating arrays and writing them (exact and torn),
//! each recovering to the model before or after the write in flight; and readers that
//! never see a torn element while a writer runs.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use terrace_collections::{
    check, ArrayOptions, CollectionError, Collections, Kind, MapOptions, PersistentArray,
};
use terrace_pool::{Backend, Pool, RecordingBackend};

use common::Rng;

const LAYOUT: &str = "collections-array";

fn temp_pool(tag: &str) -> (std::path::PathBuf, Pool) {
    let path = std::env::temp_dir().join(format!(
        "terrace-array-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let _ = std::fs::remove_file(&path);
    let pool = Pool::create(&path, 16 << 20, LAYOUT).expect("pool");
    (path, pool)
}

fn contents<B: terrace_pool::Backend>(a: &PersistentArray<'_, B>) -> Vec<u8> {
    let mut out = vec![0u8; (a.len() * a.element_size() as u64) as usize];
    a.get_range(0, &mut out).expect("get_range");
    out
}

/// Random writes of one element, of a run, and (8-byte elements) of a word.
fn random_write<B: terrace_pool::Backend>(
    a: &PersistentArray<'_, B>,
    model: &mut [u8],
    rng: &mut Rng,
) {
    let e = a.element_size() as usize;
    let n = a.len();
    let first = rng.below(n);
    let count = match rng.below(3) {
        0 => 1 + rng.below((n - first).min(5)),
        _ => 1,
    };
    let data: Vec<u8> = (0..count as usize * e).map(|_| rng.next() as u8).collect();
    let at = first as usize * e;
    if count == 1 && e == 8 && rng.below(2) == 0 {
        let word = u64::from_le_bytes(data[..8].try_into().unwrap());
        a.set_u64(first, word).expect("set_u64");
        assert_eq!(a.get_u64(first).unwrap(), word);
    } else if count == 1 {
        a.set(first, &data).expect("set");
    } else {
        a.set_range(first, &data).expect("set_range");
    }
    model[at..at + data.len()].copy_from_slice(&data);
}

#[test]
fn arrays_match_a_model_and_survive_reopening() {
    let (path, pool) = temp_pool("model");
    let shapes = [("words", 1000u64, 8u32), ("odd", 333, 3), ("wide", 50, 200)];
    let mut models = Vec::new();
    {
        let colls = Collections::open(&pool).unwrap();
        let mut rng = Rng(7);
        for &(name, len, e) in &shapes {
            let a = colls.array(name, ArrayOptions::create(len, e)).unwrap();
            assert_eq!((a.len(), a.element_size()), (len, e));
            let mut model = vec![0u8; (len * e as u64) as usize];
            assert_eq!(contents(&a), model, "{name}: created zeroed");
            for _ in 0..2000 {
                random_write(&a, &mut model, &mut rng);
            }
            let mut one = vec![0u8; e as usize];
            for i in [0, len / 2, len - 1] {
                a.get(i, &mut one).unwrap();
                let at = (i * e as u64) as usize;
                assert_eq!(one, model[at..at + e as usize], "{name}[{i}]");
            }
            assert_eq!(contents(&a), model, "{name}");
            models.push(model);
        }
    }
    drop(pool);
    let pool = Pool::open(&path, LAYOUT).unwrap();
    let colls = Collections::open(&pool).unwrap();
    for (&(name, len, e), model) in shapes.iter().zip(&models) {
        let a = colls.array(name, ArrayOptions::existing()).unwrap();
        assert_eq!((a.len(), a.element_size()), (len, e));
        assert_eq!(&contents(&a), model, "{name} after reopening");
        let b = colls.lookup(name).unwrap().unwrap();
        assert_eq!((b.kind, b.oid), (Kind::Array, a.header()));
    }
    let report = check(&pool).unwrap();
    assert_eq!(report.arrays, 3);
    assert!(report.unreachable.is_empty());
    drop(colls);
    drop(pool);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn wrong_arguments_kinds_and_sizes_are_refused() {
    let (path, pool) = temp_pool("args");
    let colls = Collections::open(&pool).unwrap();
    let invalid = |r: Result<PersistentArray<'_, _>, CollectionError>| {
        matches!(r, Err(CollectionError::InvalidArgument { .. }))
    };
    assert!(invalid(colls.array("a", ArrayOptions::create(0, 8))));
    assert!(invalid(colls.array("a", ArrayOptions::create(4, 0))));
    assert!(invalid(colls.array("a", ArrayOptions::create(4, 4097))));
    assert!(invalid(
        colls.array("a", ArrayOptions::create(u64::MAX / 2, 8))
    ));
    assert!(
        invalid(colls.array("a", ArrayOptions::create(1 << 30, 8))),
        "bigger than the pool"
    );
    assert!(
        colls.lookup("a").unwrap().is_none(),
        "nothing bound by refused creates"
    );
    assert!(matches!(
        colls.array("a", ArrayOptions::existing()),
        Err(CollectionError::NotFound { .. })
    ));

    let a = colls.array("a", ArrayOptions::create(10, 4)).unwrap();
    assert!(matches!(
        colls.array("a", ArrayOptions::existing()),
        Err(CollectionError::Busy { .. })
    ));
    let mut four = [0u8; 4];
    let mut eight = [0u8; 8];
    assert!(a.get(10, &mut four).is_err(), "index past the end");
    assert!(
        a.get(0, &mut eight).is_err(),
        "buffer of two elements for get"
    );
    assert!(a.set(0, &[1, 2, 3]).is_err(), "short value");
    assert!(a.set_range(9, &[0; 8]).is_err(), "run past the end");
    assert!(a.set_range(0, &[0; 6]).is_err(), "not whole elements");
    assert!(a.set_range(0, &[]).is_err(), "empty run");
    assert!(
        a.get_u64(0).is_err() && a.set_u64(0, 1).is_err(),
        "not 8-byte elements"
    );
    assert_eq!(
        contents(&a),
        vec![0u8; 40],
        "refused writes changed nothing"
    );
    drop(a);

    let big = colls.array("big", ArrayOptions::create(10_000, 8)).unwrap();
    assert!(
        big.set_range(0, &vec![1u8; 80_000]).is_err(),
        "a run above one transaction's limit"
    );
    drop(big);

    assert!(matches!(
        colls.array("a", ArrayOptions::create(11, 4)),
        Err(CollectionError::InvalidArgument { .. })
    ));
    assert!(matches!(
        colls.array("a", ArrayOptions::create(10, 8)),
        Err(CollectionError::InvalidArgument { .. })
    ));
    colls.array("a", ArrayOptions::create(10, 4)).unwrap();
    assert!(matches!(
        colls.ordered_map("a", MapOptions::create(8, 8)),
        Err(CollectionError::WrongKind { .. })
    ));
    colls.ordered_map("m", MapOptions::create(8, 8)).unwrap();
    assert!(matches!(
        colls.array("m", ArrayOptions::create(10, 4)),
        Err(CollectionError::WrongKind { .. })
    ));
    assert!(
        colls.unbind_object("a").is_err(),
        "an array is not unbound as an object"
    );
    assert!(matches!(
        colls.destroy_map("a"),
        Err(CollectionError::WrongKind { .. })
    ));
    assert!(matches!(
        colls.destroy_kind("m", Kind::Array),
        Err(CollectionError::WrongKind { .. })
    ));

    let objects = pool.objects(None).unwrap().len();
    colls.destroy("a").unwrap();
    colls.destroy("big").unwrap();
    assert_eq!(pool.objects(None).unwrap().len(), objects - 2);
    assert!(colls.lookup("a").unwrap().is_none());
    let report = check(&pool).unwrap();
    assert_eq!(report.arrays, 0);
    assert!(report.unreachable.is_empty());
    drop(colls);
    drop(pool);
    std::fs::remove_file(&path).unwrap();
}

/// check() names a bound array whose header was damaged, and an array object no name
/// reaches (what a crash between destroy's unbinding and its free leaves), which sweep
/// frees.
#[test]
fn check_finds_a_damaged_array_and_an_unbound_one() {
    let (path, pool) = temp_pool("check");
    {
        let colls = Collections::open(&pool).unwrap();
        let a = colls.array("a", ArrayOptions::create(100, 8)).unwrap();
        let header = a.header().offset();
        drop(a);
        assert!(check(&pool).unwrap().unreachable.is_empty());
        let b = pool.backend();
        let length = b.load_u64(header + 8).unwrap();
        b.store_u64(header + 8, 1 << 40).unwrap();
        assert!(
            matches!(check(&pool), Err(CollectionError::Corrupt { .. })),
            "a length beyond the object"
        );
        assert!(colls.array("a", ArrayOptions::existing()).is_err());
        b.store_u64(header + 8, length).unwrap();
        b.store_u64(header, 0).unwrap();
        assert!(
            matches!(check(&pool), Err(CollectionError::Corrupt { .. })),
            "a wrong magic"
        );
        b.store_u64(header, u64::from_le_bytes(*b"TRCARRY1"))
            .unwrap();
        assert!(check(&pool).is_ok());
    }
    // An array object that no name binds: reported, then swept.
    let stray = pool
        .alloc(
            64 + 8,
            terrace_collections::layout::TYPE_ARRAY,
            terrace_pool::HandleAt::None,
        )
        .unwrap();
    let report = check(&pool).unwrap();
    assert_eq!(report.unreachable, vec![stray]);
    assert_eq!(terrace_collections::sweep(&pool, &report).unwrap(), 1);
    assert!(check(&pool).unwrap().unreachable.is_empty());
    drop(pool);
    std::fs::remove_file(&path).unwrap();
}

/// One 24-byte element's bytes are all one value: a reader seeing two values tore it.
#[test]
fn readers_never_see_a_torn_element() {
    let (path, pool) = temp_pool("readers");
    let colls = Collections::open(&pool).unwrap();
    let a = colls.array("r", ArrayOptions::create(64, 24)).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (a, stop) = (&a, &stop);
                s.spawn(move || {
                    let mut buf = [0u8; 24];
                    let mut rng = Rng(t);
                    let mut reads = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        a.get(rng.below(64), &mut buf).unwrap();
                        assert!(buf.iter().all(|&b| b == buf[0]), "torn: {buf:?}");
                        reads += 1;
                    }
                    reads
                })
            })
            .collect();
        let mut rng = Rng(9);
        for n in 0..20_000u64 {
            a.set(rng.below(64), &[n as u8; 24]).unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            assert!(r.join().unwrap() > 0);
        }
    });
    drop(a);
    drop(colls);
    drop(pool);
    std::fs::remove_file(&path).unwrap();
}

/// What the image holds: each array's bytes, or `None` when its name is not bound.
type Model = Vec<Option<Vec<u8>>>;

const CRASH_SHAPES: [(&str, u64, u32); 2] = [("w", 40, 8), ("o", 30, 5)];

fn read_model(pool: &Pool<RecordingBackend>, what: &str) -> Model {
    let colls = Collections::open(pool).unwrap_or_else(|e| panic!("{what}: directory: {e}"));
    CRASH_SHAPES
        .iter()
        .map(|&(name, _, _)| {
            let bound = colls
                .lookup(name)
                .unwrap_or_else(|e| panic!("{what}: lookup: {e}"));
            bound.map(|_| {
                let a = colls
                    .array(name, ArrayOptions::existing())
                    .unwrap_or_else(|e| panic!("{what}: open {name}: {e}"));
                contents(&a)
            })
        })
        .collect()
}

fn verify(image: Vec<u8>, allowed: &[&Model], what: &str) {
    common::verify_image(image, LAYOUT, allowed, what, read_model);
}

#[test]
fn every_persist_point_of_the_arrays_recovers() {
    let pool = Pool::create_on(RecordingBackend::new(2 << 20), LAYOUT, 2).expect("pool");
    pool.backend().start_recording();
    let mut states: Model = vec![None, None];
    let mut history = vec![states.clone()];
    let mut ends = Vec::new();
    let mut rng = Rng(3);
    {
        let colls = Collections::open(&pool).expect("directory");
        ends.push(pool.backend().recorded_points());
        history.push(states.clone());
        let mut arrays = Vec::new();
        for (k, &(name, len, e)) in CRASH_SHAPES.iter().enumerate() {
            arrays.push(colls.array(name, ArrayOptions::create(len, e)).unwrap());
            states[k] = Some(vec![0u8; (len * e as u64) as usize]);
            ends.push(pool.backend().recorded_points());
            history.push(states.clone());
        }
        for _ in 0..150 {
            let k = rng.below(2) as usize;
            random_write(&arrays[k], states[k].as_mut().unwrap(), &mut rng);
            ends.push(pool.backend().recorded_points());
            history.push(states.clone());
        }
    }
    let recording = pool.backend().take_recording();
    let points = recording.points();
    common::check_every_point(&recording, &history, &ends, "", 0, verify);
    eprintln!("{points} persist points, each exact and torn");
    assert!(points >= 300, "only {points} persist points");
}

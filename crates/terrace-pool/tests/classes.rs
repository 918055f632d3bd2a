//! Custom allocation classes recorded in the pool: registration (by the next free id and
//! by a chosen id), allocation in a class (atomic and transactional), the classes and
//! their objects surviving close and reopen, typed errors for bad descriptions and ids,
//! a full class table, iteration, statistics and check over custom-class runs, damaged
//! class tables, and format version 1 pools (which open, but cannot record classes).

use std::collections::BTreeSet;

mod common;

use terrace_pool::class::{self, builtin_classes, MAX_CUSTOM_CLASSES};
use terrace_pool::format::{self, PoolHeader};
use terrace_pool::{
    AllocClass, ClassDesc, ClassId, HandleAt, HeaderType, Oid, Pool, PoolError, RecordingBackend,
};

fn mem_pool(size: u64) -> Pool<RecordingBackend> {
    Pool::create_on(RecordingBackend::new(size), "c", 2).unwrap()
}

/// Reopens a pool from what its medium holds now (a clean close, as far as the pool can
/// tell: everything acknowledged was persisted).
fn reopen(pool: Pool<RecordingBackend>) -> Pool<RecordingBackend> {
    let image = pool.into_backend().volatile_image();
    Pool::open_on(RecordingBackend::from_image(image), "c").unwrap()
}

fn id(n: u32) -> ClassId {
    ClassId::new(n).unwrap()
}

#[test]
fn classes_and_their_objects_survive_close_and_reopen() {
    let dir = common::pool_dir();
    let path = dir.path().join("pool");
    let small = ClassDesc::new(48).units_per_run(1000);
    let page = ClassDesc::new(4096)
        .run_pages(8)
        .alignment(4096)
        .header(HeaderType::Compact);
    let (a, b, objs, plain) = {
        let pool = Pool::create(&path, 16 << 20, "app").unwrap();
        let root = pool.root(256).unwrap();
        let a = pool.register_class(&small).unwrap();
        assert_eq!(a, id(1), "the lowest free id");
        let b = pool.register_class_as(id(200), &page).unwrap();
        assert_eq!(b, id(200));
        assert_eq!(
            pool.register_class(&small).unwrap(),
            id(2),
            "same shape, new id"
        );
        let ca = pool.class(a).unwrap();
        assert_eq!(
            ca,
            AllocClass {
                id: Some(a),
                unit: 48,
                run_pages: 16,
                slots_per_run: 1024,
                alignment: 0,
                header: HeaderType::None,
            }
        );
        let mut objs = Vec::new();
        for i in 0..20u64 {
            let (cls, size) = if i % 2 == 0 { (a, 40) } else { (b, 4096) };
            let oid = pool
                .alloc_in(cls, size, 5, HandleAt::Word(root.offset() + i * 8), |w| {
                    w.write(0, &i.to_le_bytes())
                })
                .unwrap();
            assert_eq!(pool.class_of(oid).unwrap(), Some(cls));
            assert_eq!(
                pool.usable_size(oid).unwrap(),
                if cls == a { 48 } else { 4096 }
            );
            if cls == b {
                assert_eq!(pool.direct(oid).unwrap().as_ptr() as usize % 4096, 0);
            }
            objs.push((oid, cls));
        }
        // A built-in allocation of the same size never lands in a custom run.
        let plain = pool
            .alloc(40, 5, HandleAt::Word(root.offset() + 200))
            .unwrap();
        assert_eq!(pool.class_of(plain).unwrap(), None);
        assert_eq!(pool.usable_size(plain).unwrap(), 64);
        let report = pool.check().unwrap();
        // Class b has 8 slots per run: its 10 objects take 2 runs.
        assert_eq!((report.classes, report.custom_runs), (3, 3));
        assert_eq!(report.objects, 22);
        (a, b, objs, plain)
    };
    let pool = Pool::open(&path, "app").unwrap();
    let listed: Vec<Option<ClassId>> = pool.classes().iter().map(|c| c.id).collect();
    assert_eq!(listed, vec![Some(a), Some(id(2)), Some(b)]);
    let cb = pool.class(b).unwrap();
    assert_eq!(
        (
            cb.unit,
            cb.run_pages,
            cb.slots_per_run,
            cb.alignment,
            cb.header
        ),
        (4096, 8, 8, 4096, HeaderType::Compact)
    );
    let root = pool.root(256).unwrap();
    for (i, &(oid, cls)) in objs.iter().enumerate() {
        assert_eq!(pool.read_u64(root, i as u64 * 8).unwrap(), oid.offset());
        assert_eq!(pool.read_u64(oid, 0).unwrap(), i as u64);
        assert_eq!(pool.class_of(oid).unwrap(), Some(cls));
        assert_eq!(pool.type_of(oid).unwrap(), 5);
    }
    assert_eq!(pool.class_of(plain).unwrap(), None);
    // Iteration reports each object's class.
    let by_class: Vec<(Oid, Option<ClassId>)> = pool
        .objects(Some(5))
        .unwrap()
        .iter()
        .map(|o| (o.oid, o.class))
        .collect();
    assert_eq!(by_class.len(), 21);
    for &(oid, cls) in &objs {
        assert!(by_class.contains(&(oid, Some(cls))));
    }
    // The classes serve allocations at once, without registering again; frees work.
    let more = pool.alloc_in(a, 48, 6, HandleAt::None, |_| Ok(())).unwrap();
    assert_eq!(pool.class_of(more).unwrap(), Some(a));
    pool.free(HandleAt::Word(root.offset())).unwrap();
    pool.free_oid(more).unwrap();
    assert_eq!(
        pool.register_class_as(b, &page).unwrap_err().to_string(),
        PoolError::ClassExists { id: 200 }.to_string()
    );
    let report = pool.check().unwrap();
    assert_eq!(
        (report.classes, report.objects),
        (3, 21),
        "19 class objects, plain, root"
    );
    drop(pool);
    assert_eq!(Pool::check_file(&path, "app").unwrap().classes, 3);
}

#[test]
fn bad_descriptions_ids_and_sizes_are_typed_errors() {
    let pool = mem_pool(4 << 20);
    for (desc, field) in [
        (ClassDesc::new(8), "unit size"),
        (ClassDesc::new(100), "unit size"),
        (ClassDesc::new(256 << 10), "unit size"),
        (ClassDesc::new(96).alignment(64), "alignment"),
        (ClassDesc::new(64).alignment(48), "alignment"),
        (ClassDesc::new(64).units_per_run(0), "units per run"),
        (
            ClassDesc::new(128 << 10).units_per_run(200),
            "units per run",
        ),
        (ClassDesc::new(8192).run_pages(1), "run pages"),
    ] {
        match pool.register_class(&desc) {
            Err(PoolError::InvalidClass { field: f, detail }) => {
                assert_eq!(f, field, "{desc:?}: {detail}")
            }
            other => panic!("{desc:?}: {other:?}"),
        }
    }
    assert!(pool.classes().is_empty(), "nothing was registered");
    assert!(matches!(
        ClassId::new(0),
        Err(PoolError::InvalidClass { .. })
    ));
    assert!(ClassId::new(255).is_err() && ClassId::new(1 << 20).is_err());
    let c = pool.register_class_as(id(9), &ClassDesc::new(24)).unwrap();
    assert!(matches!(
        pool.register_class_as(c, &ClassDesc::new(32)),
        Err(PoolError::ClassExists { id: 9 })
    ));
    assert_eq!(pool.class(c).unwrap().unit, 24, "a class is never replaced");
    // Allocation: unknown class, a size above the unit or 0, the root's type.
    assert!(matches!(
        pool.alloc_in(id(10), 8, 1, HandleAt::None, |_| Ok(())),
        Err(PoolError::NoSuchClass { id: 10 })
    ));
    for size in [0, 25, 1 << 20] {
        assert!(matches!(
            pool.alloc_in(c, size, 1, HandleAt::None, |_| Ok(())),
            Err(PoolError::InvalidArgument { .. })
        ));
    }
    assert!(pool
        .alloc_in(c, 1, u64::MAX, HandleAt::None, |_| Ok(()))
        .is_err());
    // Transactions: a class allocation commits with the transaction or not at all.
    let root = pool.root(64).unwrap();
    let kept = pool
        .tx(|tx| {
            let o = tx.zalloc_in(c, 24, 3)?;
            tx.write_u64(root, 0, o.offset())?;
            Ok(o)
        })
        .unwrap();
    assert_eq!(pool.read_u64(kept, 16).unwrap(), 0);
    assert_eq!(pool.class_of(kept).unwrap(), Some(c));
    let aborted = pool.tx(|tx| {
        tx.alloc_in(c, 24, 3)?;
        tx.alloc_in(id(77), 8, 3)
    });
    assert!(matches!(aborted, Err(PoolError::NoSuchClass { id: 77 })));
    assert_eq!(pool.objects(Some(3)).unwrap().len(), 1);
    pool.check().unwrap();
}

#[test]
fn a_pool_holds_the_maximum_number_of_classes() {
    let pool = mem_pool(8 << 20);
    let mut ids = Vec::new();
    for i in 0..MAX_CUSTOM_CLASSES as u32 {
        let desc = ClassDesc::new(16 + 8 * i).run_pages(1);
        ids.push(pool.register_class(&desc).unwrap());
    }
    assert_eq!(ids, ClassId::all().collect::<Vec<_>>());
    assert!(matches!(
        pool.register_class(&ClassDesc::new(64)),
        Err(PoolError::ClassTableFull { max: 254 })
    ));
    let mut objs = Vec::new();
    for &c in &ids {
        let unit = pool.class(c).unwrap().unit;
        objs.push(
            pool.alloc_in(c, unit as u64, 1, HandleAt::None, |w| {
                w.write(0, &[c.get(); 16])
            })
            .unwrap(),
        );
    }
    let pool = reopen(pool);
    assert_eq!(pool.classes().len(), MAX_CUSTOM_CLASSES);
    let report = pool.check().unwrap();
    assert_eq!((report.classes, report.custom_runs), (254, 254));
    for (&c, &o) in ids.iter().zip(&objs) {
        assert_eq!(pool.class(c).unwrap().unit, 16 + 8 * (c.get() as u32 - 1));
        let mut buf = [0u8; 16];
        pool.read(o, 0, &mut buf).unwrap();
        assert_eq!(buf, [c.get(); 16]);
        assert_eq!(pool.class_of(o).unwrap(), Some(c));
        pool.alloc_in(c, 16, 2, HandleAt::None, |_| Ok(())).unwrap();
    }
    assert!(matches!(
        pool.register_class(&ClassDesc::new(64)),
        Err(PoolError::ClassTableFull { .. })
    ));
    pool.check().unwrap();
}

#[test]
fn small_unit_runs_iterate_check_and_release() {
    let pool = mem_pool(4 << 20);
    // 16-byte units: a run tracks 64 slots per page, so a 1-page run holds 64.
    let c = pool
        .register_class(&ClassDesc::new(16).run_pages(1))
        .unwrap();
    assert_eq!(pool.class(c).unwrap().slots_per_run, 64);
    let objs: Vec<Oid> = (0..130)
        .map(|i| {
            pool.alloc_in(c, 16, 4, HandleAt::None, |w| w.write(0, &[i as u8; 16]))
                .unwrap()
        })
        .collect();
    let distinct: BTreeSet<u64> = objs.iter().map(|o| o.offset()).collect();
    assert_eq!(distinct.len(), 130);
    for w in objs.windows(2).take(63) {
        assert_eq!(w[1].offset() - w[0].offset(), 16, "slots are back to back");
    }
    let st = pool.stats();
    assert_eq!(st.custom_classes.get(&c.get()), Some(&(3, 192, 130)));
    assert!(st.classes.is_empty(), "no built-in run was carved");
    let report = pool.check().unwrap();
    assert_eq!((report.custom_runs, report.objects), (3, 130));
    let listed = pool.objects(Some(4)).unwrap();
    assert_eq!(listed.len(), 130);
    assert!(listed.iter().all(|o| o.class == Some(c) && o.usable == 16));
    // Freeing everything releases the runs (their pages go back to the free spans).
    let free_before = pool.stats().free_bytes;
    for o in objs {
        pool.free_oid(o).unwrap();
    }
    assert!(pool.stats().free_bytes > free_before);
    let pool = reopen(pool);
    let report = pool.check().unwrap();
    assert_eq!((report.objects, report.classes), (0, 1));
    assert!(
        report.custom_runs <= 1,
        "runs owned at the end may stay, empty"
    );
}

#[test]
fn threads_register_and_allocate_concurrently() {
    let pool = mem_pool(32 << 20);
    let ids: Vec<ClassId> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u32)
            .map(|t| {
                let pool = &pool;
                s.spawn(move || {
                    let c = pool
                        .register_class(&ClassDesc::new(32 + 16 * t).units_per_run(256))
                        .unwrap();
                    let mut mine = Vec::new();
                    for i in 0..2000u64 {
                        let o = pool
                            .alloc_in(c, 32, t as u64, HandleAt::None, |w| {
                                w.write(0, &i.to_le_bytes())
                            })
                            .unwrap();
                        mine.push(o);
                        if i % 3 == 0 {
                            pool.free_oid(mine.swap_remove(0)).unwrap();
                        }
                    }
                    c
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let distinct: BTreeSet<ClassId> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 4);
    pool.check().unwrap();
    let pool = reopen(pool);
    assert_eq!(pool.classes().len(), 4);
    pool.check().unwrap();
}

#[test]
fn damaged_class_tables_are_named() {
    let pool = mem_pool(4 << 20);
    let c = pool.register_class_as(id(7), &ClassDesc::new(96)).unwrap();
    let d = pool.register_class_as(id(8), &ClassDesc::new(128)).unwrap();
    let o = pool.alloc_in(c, 96, 1, HandleAt::None, |_| Ok(())).unwrap();
    pool.alloc_in(d, 96, 1, HandleAt::None, |_| Ok(())).unwrap();
    let g = pool.geometry();
    let head = (o.offset() - g.heap_off) / 4096;
    let entry = |n: u8| format::class_entry_off(n);
    let image = pool.into_backend().volatile_image();
    let word = |img: &[u8], at: u64| {
        u64::from_le_bytes(img[at as usize..at as usize + 8].try_into().unwrap())
    };
    let damaged = |at: u64, value: u64| {
        let mut img = image.clone();
        img[at as usize..at as usize + 8].copy_from_slice(&value.to_le_bytes());
        img
    };
    let good = word(&image, entry(7));
    let word1 = word(&image, g.meta_off + head * 32 + 8);
    assert_eq!(word1, 96 | 7 << 32, "the run records its class");
    for (what, img, needle) in [
        ("a flipped bit", damaged(entry(7), good ^ 1 << 3), "entry 7"),
        ("an entry moved", damaged(entry(9), good), "entry 9"),
        ("the reserved entry 0", damaged(entry(0), 1), "entry 0"),
        (
            "the reserved entry 255",
            damaged(entry(255), 1),
            "entry 255",
        ),
        (
            "a run of a missing class",
            damaged(entry(7), 0),
            "not registered",
        ),
        (
            "a run of another class",
            damaged(g.meta_off + head * 32 + 8, 96 | 8 << 32),
            "class 8",
        ),
        (
            "reserved unit-word bits",
            damaged(g.meta_off + head * 32 + 8, 96 | 7 << 32 | 1 << 45),
            "reserved",
        ),
    ] {
        match Pool::open_on(RecordingBackend::from_image(img), "c").and_then(|p| p.check()) {
            Err(PoolError::Corrupt { what: w, offset }) => {
                assert!(
                    w.contains(needle) && offset > 0,
                    "{what}: {w} at {offset:#x}"
                )
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // A well-formed entry that describes an impossible class is named too.
    let bad = format::ClassEntry {
        unit: 12,
        pages: 1,
        header: 2,
        align_code: 0,
    };
    let img = damaged(entry(20), bad.encode(20));
    let err = Pool::open_on(RecordingBackend::from_image(img), "c").unwrap_err();
    assert!(err.to_string().contains("entry 20") && err.to_string().contains("unit"));
}

#[test]
fn version_1_pools_open_but_cannot_record_classes() {
    let pool = mem_pool(4 << 20);
    let root = pool.root(64).unwrap();
    let obj = pool
        .alloc_with(300, 2, HandleAt::Word(root.offset()), |w| {
            w.write(0, b"old")
        })
        .unwrap();
    let header = pool.header().clone();
    assert_eq!(header.version, format::FORMAT_VERSION);
    let mut image = pool.into_backend().volatile_image();
    let as_version = |image: &mut Vec<u8>, version: u32| {
        let h = PoolHeader {
            version,
            ..header.clone()
        };
        image[..256].copy_from_slice(&h.encode());
    };
    as_version(&mut image, 1);
    let pool = Pool::open_on(RecordingBackend::from_image(image.clone()), "c").unwrap();
    assert_eq!(pool.header().version, 1);
    assert_eq!(pool.read_u64(root, 0).unwrap(), obj.offset());
    pool.alloc(100, 2, HandleAt::None).unwrap();
    match pool.register_class(&ClassDesc::new(64)) {
        Err(
            e @ PoolError::FormatTooOld {
                found: 1,
                needed: 2,
                ..
            },
        ) => {
            assert!(e.to_string().contains("version 1"), "{e}")
        }
        other => panic!("{other:?}"),
    }
    pool.check().unwrap();
    // A version 1 pool has no class table: a non-zero entry is corruption.
    let mut with_entry = image.clone();
    let at = format::class_entry_off(3) as usize;
    let w = format::ClassEntry {
        unit: 64,
        pages: 1,
        header: 2,
        align_code: 0,
    }
    .encode(3);
    with_entry[at..at + 8].copy_from_slice(&w.to_le_bytes());
    let err = Pool::open_on(RecordingBackend::from_image(with_entry), "c").unwrap_err();
    assert!(err.to_string().contains("version 1"), "{err}");
    // Versions this build does not know are refused, saying which it reads.
    as_version(&mut image, 3);
    match Pool::open_on(RecordingBackend::from_image(image), "c") {
        Err(e @ PoolError::UnsupportedVersion { found: 3, .. }) => {
            assert!(e.to_string().contains("1 to 2"), "{e}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn builtin_classes_are_listed() {
    let b = builtin_classes();
    assert_eq!(b.len(), class::CLASSES);
    assert_eq!((b[0].unit, b[b.len() - 1].unit), (64, 128 << 10));
    assert!(b.iter().all(|c| c.id.is_none() && c.slots_per_run >= 1));
}

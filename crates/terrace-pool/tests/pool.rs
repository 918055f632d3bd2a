//! Pool behaviour on real files (tmpfs) and on the recording backend: lifecycle, opening
//! damaged files, allocation semantics, transactions, space utilisation and concurrency.

use std::io::{Seek, SeekFrom, Write};
use std::path::PathBuf;

use terrace_pool::{Backend, HandleAt, Oid, Pool, PoolError, RecordingBackend};

mod common;

fn shm_dir() -> tempfile::TempDir {
    common::pool_dir()
}

fn pool_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("pool")
}

#[test]
fn create_open_close_keeps_root_objects_and_layout() {
    let dir = shm_dir();
    let path = pool_path(&dir);
    let (uuid, root, obj) = {
        let pool = Pool::create(&path, 8 << 20, "app").unwrap();
        assert_eq!(pool.size(), 8 << 20);
        if std::env::var_os("TERRACE_TEST_PMEM_DIR").is_none() {
            assert_eq!(pool.durability(), terrace_pool::Durability::Process);
        }
        let root = pool.root(64).unwrap();
        assert_eq!(
            pool.root(32).unwrap(),
            root,
            "a smaller request keeps the root"
        );
        let obj = common::expect_dax_persists(&pool, || {
            pool.alloc_with(1000, 7, HandleAt::Word(root.offset()), |w| {
                w.write(0, b"hello")
            })
        })
        .unwrap();
        assert_eq!(pool.read_u64(root, 0).unwrap(), obj.offset());
        pool.check().unwrap();
        let uuid = pool.uuid();
        pool.close();
        (uuid, root, obj)
    };
    assert!(matches!(
        Pool::create(&path, 8 << 20, "app"),
        Err(PoolError::Exists { .. })
    ));
    assert!(matches!(
        Pool::open(&path, "other"),
        Err(PoolError::LayoutMismatch { .. })
    ));
    {
        // libpmemobj's open with a NULL layout: any layout name is accepted.
        let any = Pool::open_any_layout(&path).unwrap();
        assert_eq!(any.layout(), "app");
        assert_eq!(any.uuid(), uuid);
    }
    let pool = Pool::open(&path, "app").unwrap();
    assert_eq!(pool.uuid(), uuid);
    assert_eq!(pool.root(64).unwrap(), root);
    assert_eq!(pool.root_size().unwrap(), 64);
    let mut buf = [0u8; 5];
    pool.read(obj, 0, &mut buf).unwrap();
    assert_eq!(&buf, b"hello");
    assert_eq!(pool.type_of(obj).unwrap(), 7);
    assert_eq!(pool.usable_size(obj).unwrap(), 1008);
    let report = pool.check().unwrap();
    assert_eq!(report.objects, 2);
    // Growing the root keeps its contents and moves it atomically.
    let bigger = pool.root(300_000).unwrap();
    assert_eq!(pool.read_u64(bigger, 0).unwrap(), obj.offset());
    assert_eq!(pool.read_u64(bigger, 299_992).unwrap(), 0);
    pool.check().unwrap();
    assert!(pool.direct(obj).is_some());
}

#[test]
fn damaged_foreign_and_missing_files_are_typed_errors() {
    let dir = shm_dir();
    let path = pool_path(&dir);
    assert!(matches!(
        Pool::open(&path, "x"),
        Err(PoolError::NotFound { .. })
    ));
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        Pool::open(&path, "x"),
        Err(PoolError::NotAPool { .. })
    ));
    std::fs::write(&path, vec![0x7fu8; 5000]).unwrap();
    assert!(matches!(
        Pool::open(&path, "x"),
        Err(PoolError::NotAPool { .. })
    ));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(
        Pool::open(dir.path(), "x"),
        Err(PoolError::NotAPool { .. })
    ));

    Pool::create(&path, 4 << 20, "x").unwrap().close();
    let good = std::fs::read(&path).unwrap();
    // Truncated (and extended) files.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(3 << 20).unwrap();
    assert!(matches!(
        Pool::open(&path, "x"),
        Err(PoolError::SizeMismatch { .. })
    ));
    f.set_len(100).unwrap();
    assert!(matches!(
        Pool::open(&path, "x"),
        Err(PoolError::NotAPool { .. })
    ));
    drop(f);
    // A flipped bit anywhere in the header is a checksum error; a newer version says so.
    for at in [0usize, 9, 20, 33, 41, 110, 150, 200, 253] {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        std::fs::write(&path, &bad).unwrap();
        let err = Pool::open(&path, "x").unwrap_err();
        assert!(
            matches!(
                err,
                PoolError::BadChecksum { .. }
                    | PoolError::NotAPool { .. }
                    | PoolError::UnsupportedVersion { .. }
            ),
            "byte {at}: {err}"
        );
    }
    // Corrupt page descriptors are reported with their offset, not a panic.
    let pool = Pool::open_on(RecordingBackend::from_image(good.clone()), "x").unwrap();
    let g = pool.geometry();
    drop(pool);
    for (word, value) in [
        (0u64, 7u64),          // unknown kind
        (0, 1 | 1 << 32),      // run with unit 0
        (0, 2 | 0xFFFF << 32), // extent beyond the heap
        (24, 1),               // allocation bits on a free page
    ] {
        let mut bad = good.clone();
        let at = (g.meta_off + 32 * 3 + word) as usize;
        bad[at..at + 8].copy_from_slice(&value.to_le_bytes());
        let err = Pool::open_on(RecordingBackend::from_image(bad), "x").unwrap_err();
        assert!(matches!(err, PoolError::Corrupt { .. }), "{err}");
    }
    // Garbage in every lane and descriptor byte never panics (random images).
    let mut state = 12345u64;
    for round in 0..200 {
        let mut bad = good.clone();
        for _ in 0..1 + round % 16 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let at = 4096 + (state >> 33) as usize % (g.heap_off as usize - 4096);
            bad[at] = (state >> 20) as u8;
        }
        if let Ok(pool) = Pool::open_on(RecordingBackend::from_image(bad), "x") {
            let _ = pool.check();
            let _ = pool.objects(None);
        }
    }
    let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.write_all(&good).unwrap();
    drop(f);
    Pool::check_file(&path, "x").unwrap();
}

fn mem_pool(size: u64) -> Pool<RecordingBackend> {
    Pool::create_on(RecordingBackend::new(size), "t", 2).unwrap()
}

#[test]
fn alloc_free_realloc_publish_and_reject_misuse() {
    let pool = mem_pool(4 << 20);
    let root = pool.root(64).unwrap();
    let slot = HandleAt::Word(root.offset());
    let a = pool.zalloc(100, 1, slot).unwrap();
    assert_eq!(pool.load_dest(slot).unwrap(), Some(a));
    assert_eq!(pool.usable_size(a).unwrap(), 112);
    pool.write_durable(a, 0, &[9; 112]).unwrap();
    assert!(matches!(
        pool.write(a, 100, &[0; 13]),
        Err(PoolError::OutOfBounds { .. })
    ));
    // Realloc to an extent keeps contents; to the same class it is a no-op.
    let b = pool.realloc(slot, 200_000, 1).unwrap();
    assert_ne!(a, b);
    assert_eq!(pool.read_u64(b, 0).unwrap(), u64::from_le_bytes([9; 8]));
    assert_eq!(pool.realloc(slot, 199_000, 1).unwrap(), b);
    assert!(matches!(
        pool.usable_size(a),
        Err(PoolError::InvalidObject { .. })
    ));
    // PMEMoid destinations carry the uuid.
    let oid_slot = HandleAt::Oid(root.offset() + 16);
    let c = pool.alloc(64, 2, oid_slot).unwrap();
    assert_eq!(pool.read_u64(root, 16).unwrap(), pool.uuid_lo());
    assert_eq!(pool.read_u64(root, 24).unwrap(), c.offset());
    pool.free(oid_slot).unwrap();
    assert_eq!(pool.read_u64(root, 16).unwrap(), 0);
    assert_eq!(pool.read_u64(root, 24).unwrap(), 0);
    pool.free(oid_slot).unwrap(); // null: no-op
    assert!(matches!(
        pool.free_oid(c),
        Err(PoolError::InvalidObject { .. })
    ));
    assert!(matches!(
        pool.free_oid(root),
        Err(PoolError::InvalidArgument { .. })
    ));
    assert!(matches!(
        pool.alloc(0, 1, HandleAt::None),
        Err(PoolError::InvalidArgument { .. })
    ));
    assert!(matches!(
        pool.alloc(64, 1, HandleAt::Word(3)),
        Err(PoolError::InvalidArgument { .. })
    ));
    assert!(matches!(
        pool.alloc(64 << 20, 1, HandleAt::None),
        Err(PoolError::OutOfSpace { .. })
    ));
    pool.free(slot).unwrap();
    pool.check().unwrap();
    assert_eq!(pool.check().unwrap().objects, 1);
}

#[test]
fn objects_are_iterated_by_type_and_survive_reopen() {
    let pool = mem_pool(16 << 20);
    let mut by_type = vec![Vec::new(); 3];
    for i in 0..60u64 {
        let t = i % 3;
        let size = [64, 3000, 200_000][(i % 3) as usize] + i;
        if i % 10 == 9 {
            continue;
        }
        let oid = pool.alloc(size, t, HandleAt::None).unwrap();
        by_type[t as usize].push(oid);
    }
    let backend = pool.into_backend();
    let pool = Pool::open_on(RecordingBackend::from_image(backend.volatile_image()), "t").unwrap();
    pool.check().unwrap();
    for (t, want) in by_type.iter().enumerate() {
        let mut got: Vec<Oid> = pool
            .objects(Some(t as u64))
            .unwrap()
            .iter()
            .map(|o| o.oid)
            .collect();
        got.sort();
        let mut want = want.clone();
        want.sort();
        assert_eq!(got, want, "type {t}");
    }
    assert_eq!(pool.objects(None).unwrap().len(), 54);
}

#[test]
fn transactions_commit_abort_nest_and_roll_back_on_panic() {
    let pool = mem_pool(4 << 20);
    let root = pool.root(256).unwrap();
    // Commit: snapshot + write + alloc published through the root.
    let obj = pool
        .tx(|tx| {
            let o = tx.zalloc(500, 4)?;
            tx.write(o, 0, b"committed")?;
            tx.write_u64(root, 0, o.offset())?;
            tx.nested(|tx| tx.write_u64(root, 8, 42))?;
            Ok(o)
        })
        .unwrap();
    assert_eq!(pool.read_u64(root, 0).unwrap(), obj.offset());
    assert_eq!(pool.read_u64(root, 8).unwrap(), 42);
    // Abort by error: writes restored, allocation undone, free undone.
    let before = pool.stats();
    let err = pool
        .tx(|tx| {
            tx.write_u64(root, 8, 7)?;
            let o = tx.alloc(100, 4)?;
            tx.write_u64(root, 16, o.offset())?;
            tx.free(obj)?;
            Err::<(), _>(PoolError::TxAborted)
        })
        .unwrap_err();
    assert!(matches!(err, PoolError::TxAborted));
    assert_eq!(pool.read_u64(root, 8).unwrap(), 42);
    assert_eq!(pool.read_u64(root, 16).unwrap(), 0);
    assert_eq!(pool.usable_size(obj).unwrap(), 512);
    assert_eq!(pool.stats(), before);
    // A failing nested transaction aborts the outer one even if its error is ignored.
    let mut tx = pool.begin().unwrap();
    tx.write_u64(root, 8, 1).unwrap();
    let _ = tx.nested(|tx| tx.write(root, 250, &[0; 100]));
    assert!(matches!(tx.commit(), Err(PoolError::TxAborted)));
    assert_eq!(pool.read_u64(root, 8).unwrap(), 42);
    // A panic unwinds through the transaction and rolls it back.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = pool.tx(|tx| -> Result<(), PoolError> {
            tx.write_u64(root, 8, 99)?;
            tx.free(obj)?;
            panic!("boom");
        });
    }));
    assert!(r.is_err());
    assert_eq!(pool.read_u64(root, 8).unwrap(), 42);
    assert_eq!(pool.usable_size(obj).unwrap(), 512);
    // Free inside a committed transaction.
    pool.tx(|tx| {
        tx.write_u64(root, 0, 0)?;
        tx.free(obj)
    })
    .unwrap();
    assert!(pool.usable_size(obj).is_err());
    // A snapshot larger than the undo log is refused (and aborts).
    let big = pool.alloc(100_000, 1, HandleAt::None).unwrap();
    let err = pool.tx(|tx| tx.add_range(big, 0, 100_000)).unwrap_err();
    assert!(matches!(err, PoolError::TxLogFull { .. }), "{err}");
    pool.check().unwrap();
}

/// A transaction holds its lane until it ends, whichever thread ends it: `try_begin`
/// refuses while every lane is held (and its refusal frees none of them), a transaction
/// moved to another thread commits there, and the lanes are idle only when all have ended.
#[test]
fn transactions_hold_lanes_try_begin_refuses_and_tx_moves_threads() {
    let pool = mem_pool(2 << 20); // two lanes
    let root = pool.root(16).unwrap();
    let a = pool.try_begin().unwrap().expect("a lane is free");
    let mut b = pool.try_begin().unwrap().expect("a lane is free");
    assert!(pool.try_begin().unwrap().is_none());
    assert!(
        pool.try_begin().unwrap().is_none(),
        "a refusal freed a lane"
    );
    assert!(!pool.lanes_idle());
    b.write_u64(root, 0, 42).unwrap();
    std::thread::scope(|s| {
        s.spawn(move || b.commit().unwrap());
    });
    let c = pool.try_begin().unwrap().expect("b's lane is free again");
    assert!(pool.try_begin().unwrap().is_none());
    c.abort().unwrap();
    a.commit().unwrap();
    assert!(pool.lanes_idle());
    let mut word = [0u8; 8];
    pool.read(root, 0, &mut word).unwrap();
    assert_eq!(u64::from_le_bytes(word), 42);
}

#[test]
fn crash_mid_transaction_rolls_back_at_open() {
    let pool = mem_pool(2 << 20);
    let root = pool.root(64).unwrap();
    pool.write_durable(root, 0, &[1; 64]).unwrap();
    let mut tx = pool.begin().unwrap();
    tx.write(root, 0, &[2; 64]).unwrap();
    let o = tx.alloc(64, 1).unwrap();
    tx.write_u64(root, 8, o.offset()).unwrap();
    pool.backend().persist(0, pool.size()).unwrap(); // even if every write reached media
    let image = pool.backend().durable_image();
    drop(tx);
    let pool = Pool::open_on(RecordingBackend::from_image(image), "t").unwrap();
    let mut buf = [0u8; 64];
    pool.read(root, 0, &mut buf).unwrap();
    assert_eq!(buf, [1; 64]);
    assert_eq!(pool.check().unwrap().objects, 1);
}

fn fill(size: u64, pool_size: u64) -> f64 {
    let pool = mem_pool(pool_size);
    let mut n = 0u64;
    while pool.alloc(size, 1, HandleAt::None).is_ok() {
        n += 1;
    }
    pool.check().unwrap();
    (n * size) as f64 / pool_size as f64
}

#[test]
fn utilization_is_at_least_97_percent_from_64_bytes_to_2_mib() {
    // Small objects in a 16 MiB pool, large ones in 256 MiB (a 2 MiB object cannot fill
    // a small pool finely); larger pools have smaller overheads still.
    for (size, pool_size) in [
        (64u64, 16u64 << 20),
        (512, 16 << 20),
        (4096, 16 << 20),
        (16384, 64 << 20),
        (65536, 64 << 20),
        (262_144, 256 << 20),
        (1 << 20, 256 << 20),
        (2 << 20, 256 << 20),
        (3000, 16 << 20),
        (100_000, 64 << 20),
    ] {
        let u = fill(size, pool_size);
        assert!(u >= 0.97, "{size} B objects: {:.1}%", u * 100.0);
    }
}

#[test]
fn threads_allocate_concurrently_and_lend_before_failing() {
    let dir = shm_dir();
    let path = pool_path(&dir);
    let pool = Pool::create(&path, 64 << 20, "mt").unwrap();
    let total: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let pool = &pool;
                s.spawn(move || {
                    let mut bytes = 0;
                    let mut k = t;
                    loop {
                        let size = 4096u64 << (k % 5);
                        k = k.wrapping_mul(2862933555777941757).wrapping_add(3037000493);
                        match pool.alloc(size, 1, HandleAt::None) {
                            Ok(_) => bytes += size,
                            Err(PoolError::OutOfSpace { .. }) => return bytes,
                            Err(e) => panic!("{e}"),
                        }
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let u = total as f64 / (64u64 << 20) as f64;
    assert!(u >= 0.97, "{:.1}%", u * 100.0);
    // Whatever the threads left (a failed 64 KiB request may leave 4 KiB holes) is
    // still usable by one thread: no thread keeps space to itself.
    while pool.alloc(4096, 1, HandleAt::None).is_ok() {}
    assert!(pool.stats().free_bytes < 4096, "{:?}", pool.stats());
    pool.check().unwrap();
    // Concurrent transactions on separate objects.
    let objs: Vec<Oid> = pool
        .objects(Some(1))
        .unwrap()
        .iter()
        .take(4)
        .map(|o| o.oid)
        .collect();
    std::thread::scope(|s| {
        for &o in &objs {
            let pool = &pool;
            s.spawn(move || {
                for i in 0..50u64 {
                    pool.tx(|tx| tx.write_u64(o, 0, i)).unwrap();
                }
            });
        }
    });
    for &o in &objs {
        assert_eq!(pool.read_u64(o, 0).unwrap(), 49);
    }
    pool.check().unwrap();
}

#[test]
fn check_names_injected_corruption() {
    let pool = mem_pool(4 << 20);
    let root = pool.root(64).unwrap();
    let a = pool.alloc(3000, 1, HandleAt::Word(root.offset())).unwrap();
    let _b = pool.alloc(300_000, 2, HandleAt::None).unwrap();
    pool.check().unwrap();
    let g = pool.geometry();
    let head = (a.offset() - g.heap_off) / 4096;
    let desc = |page: u64| g.meta_off + page * 32;
    let image = pool.into_backend().volatile_image();
    let damaged = |at: u64, value: u64| {
        let mut img = image.clone();
        img[at as usize..at as usize + 8].copy_from_slice(&value.to_le_bytes());
        img
    };
    // Each damage is reported as Corrupt, by open or by check, saying what and where.
    for (what, img) in [
        // A 3000-byte class run has far fewer than 64 slots per page.
        (
            "bits beyond the run's slots",
            damaged(desc(head) + 24, 1 << 63 | 1),
        ),
        (
            "bits on a free page",
            damaged(desc(g.page_count - 1) + 24, 4),
        ),
        (
            "descriptor inside a span",
            damaged(desc(head + 1), 2 | 1 << 32),
        ),
        (
            "root points at no object",
            damaged(4096, g.heap_off + 200 * 4096),
        ),
        ("root offset without a root", damaged(4096, 0)),
        ("unknown page kind", damaged(desc(head), 9 | 16 << 32)),
    ] {
        let result = Pool::open_on(RecordingBackend::from_image(img), "t").and_then(|p| p.check());
        match result {
            Err(PoolError::Corrupt { what: w, offset }) => {
                assert!(!w.is_empty() && offset > 0, "{what}: {w} at {offset:#x}")
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // A garbage redo header never verifies: open discards it, and the pool is intact.
    let img = damaged(g.lanes_off, 0x1234_0000_0001);
    let pool = Pool::open_on(RecordingBackend::from_image(img), "t").unwrap();
    assert_eq!(pool.check().unwrap().objects, 3);
}

#[test]
fn disk_backed_pool_persists_with_msync() {
    // A non-tmpfs file (the default temp dir here): persistence goes through `msync`.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.pool");
    let obj = {
        let pool = Pool::create(&path, 2 << 20, "disk").unwrap();
        let root = pool.root(16).unwrap();
        let obj = pool.zalloc(5000, 3, HandleAt::Word(root.offset())).unwrap();
        let before = terrace_media::persist::thread_counts();
        pool.tx(|tx| tx.write(obj, 10, b"durable")).unwrap();
        let after = terrace_media::persist::thread_counts();
        if pool.durability() == terrace_pool::Durability::Process {
            eprintln!("note: the temp dir is tmpfs; msync path not exercised");
        } else {
            assert!(
                after.msyncs > before.msyncs,
                "a disk-backed pool persisted without msync"
            );
        }
        obj
    };
    let pool = Pool::open(&path, "disk").unwrap();
    let mut buf = [0u8; 7];
    pool.read(obj, 10, &mut buf).unwrap();
    assert_eq!(&buf, b"durable");
    assert_eq!(pool.objects(Some(3)).unwrap().len(), 1);
    pool.check().unwrap();
}

#[test]
fn objects_freed_by_other_threads_and_runs_of_exited_threads_are_reused() {
    let dir = shm_dir();
    let path = pool_path(&dir);
    let pool = Pool::create(&path, 128 << 20, "xthread").unwrap();
    let sizes = [64u64, 200, 512, 4096, 20_000, 150_000];
    // Each thread allocates, hands every other object to the next thread to free, and
    // frees what it receives: frees land in runs other threads own, and in runs whose
    // owner has exited.
    let threads = 4;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..threads)
        .map(|_| std::sync::mpsc::channel::<Oid>())
        .unzip();
    std::thread::scope(|s| {
        for (t, rx) in receivers.into_iter().enumerate() {
            let pool = &pool;
            let next = senders[(t + 1) % threads].clone();
            s.spawn(move || {
                let mut mine = Vec::new();
                for k in 0..1200u64 {
                    let size = sizes[((k + t as u64) % sizes.len() as u64) as usize];
                    let oid = pool.alloc(size, 1 + k % 2, HandleAt::None).unwrap();
                    if k % 2 == 0 {
                        next.send(oid).unwrap();
                    } else {
                        mine.push(oid);
                    }
                    if k % 7 == 0 {
                        while let Ok(o) = rx.try_recv() {
                            pool.free_oid(o).unwrap();
                        }
                    }
                }
                drop(next);
                for o in mine {
                    pool.free_oid(o).unwrap();
                }
                // Objects still in flight are freed by whoever reads them last.
                while let Ok(o) = rx.recv_timeout(std::time::Duration::from_millis(200)) {
                    pool.free_oid(o).unwrap();
                }
            });
        }
        drop(senders);
    });
    pool.check().unwrap();
    let stats = pool.stats();
    assert_eq!(stats.allocated_bytes, 0, "{stats:?}");
    assert_eq!(pool.objects(None).unwrap().len(), 0);
    // Every page is usable again: runs emptied by frees were released at once, the empty
    // runs of exited threads are reclaimed when the free pages run out.
    let mut n = 0u64;
    while pool.alloc(4096, 7, HandleAt::None).is_ok() {
        n += 1;
    }
    assert!(pool.stats().free_bytes < 4096, "{:?}", pool.stats());
    assert!(n * 4096 >= stats.heap_bytes * 97 / 100, "{n} pages");
    pool.check().unwrap();
    // The state survives a reopen.
    drop(pool);
    let pool = Pool::open(&path, "xthread").unwrap();
    assert_eq!(pool.objects(Some(7)).unwrap().len() as u64, n);
    pool.check().unwrap();
}

#[test]
fn one_thread_uses_several_pools_and_type_numbers() {
    // A thread caches runs per pool and per (class, type): alternating pools, types of one
    // class, closing and reopening a pool must all keep the heaps exact.
    let a = mem_pool(8 << 20);
    let b = mem_pool(8 << 20);
    let mut live_a = Vec::new();
    for k in 0..600u64 {
        live_a.push((a.alloc(100, k % 5, HandleAt::None).unwrap(), k % 5));
        let o = b.alloc(100 + k % 3, 9, HandleAt::None).unwrap();
        if k % 3 == 0 {
            b.free_oid(o).unwrap();
        }
    }
    a.check().unwrap();
    b.check().unwrap();
    for t in 0..5 {
        assert_eq!(a.objects(Some(t)).unwrap().len(), 120);
    }
    for (o, t) in &live_a {
        assert_eq!(a.type_of(*o).unwrap(), *t);
    }
    let image = a.into_backend().volatile_image();
    let a = Pool::open_on(RecordingBackend::from_image(image), "t").unwrap();
    for (o, _) in live_a.iter().step_by(2) {
        a.free_oid(*o).unwrap();
    }
    for k in 0..300u64 {
        a.alloc(100, k % 5, HandleAt::None).unwrap();
        b.alloc(100, 9, HandleAt::None).unwrap();
    }
    a.check().unwrap();
    b.check().unwrap();
    assert_eq!(a.objects(None).unwrap().len(), 600);
    assert_eq!(b.objects(None).unwrap().len(), 700);
}

#[test]
fn threads_churn_a_nearly_full_pool() {
    // Allocation and free from every thread on a pool that keeps running out: stealing,
    // listing, releasing and reclaiming runs all race with each other's fast paths.
    let dir = shm_dir();
    let path = pool_path(&dir);
    let pool = Pool::create(&path, 8 << 20, "churn").unwrap();
    let orphans = std::sync::Mutex::new(Vec::<Oid>::new());
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (pool, orphans) = (&pool, &orphans);
            s.spawn(move || {
                let mut rng = t * 7919 + 1;
                let mut next = move || {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng
                };
                let mut mine: Vec<Oid> = Vec::new();
                for _ in 0..100_000 {
                    let r = next();
                    match r % 8 {
                        0..=3 => {
                            let size =
                                [64, 96, 700, 4096, 9000, 70_000, 200_000][(r >> 8) as usize % 7];
                            match pool.alloc(size, 1 + (r >> 16) % 3, HandleAt::None) {
                                Ok(o) => mine.push(o),
                                Err(PoolError::OutOfSpace { .. }) => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                        4 | 5 if !mine.is_empty() => {
                            let o = mine.swap_remove((r >> 8) as usize % mine.len());
                            pool.free_oid(o).unwrap();
                        }
                        6 if !mine.is_empty() => {
                            let o = mine.swap_remove((r >> 8) as usize % mine.len());
                            orphans.lock().unwrap().push(o);
                        }
                        _ => {
                            let o = orphans.lock().unwrap().pop();
                            if let Some(o) = o {
                                pool.free_oid(o).unwrap();
                            }
                        }
                    }
                }
                for o in mine {
                    pool.free_oid(o).unwrap();
                }
            });
        }
    });
    for o in orphans.into_inner().unwrap() {
        pool.free_oid(o).unwrap();
    }
    pool.check().unwrap();
    assert_eq!(pool.stats().allocated_bytes, 0, "{:?}", pool.stats());
    while pool.alloc(4096, 1, HandleAt::None).is_ok() {}
    assert!(pool.stats().free_bytes < 4096, "{:?}", pool.stats());
    pool.check().unwrap();
}

//! Behaviour of every per-kind operation on every medium, and of bad input (sizes,
//! alignments, pointers, kinds, file options): each must be a typed error, never a crash.

use std::ptr::NonNull;

use terrace_kinds::{
    detect_kind, free, usable_size, FileKindOptions, FileLocation, Kind, KindError, KindMedium,
    PageSize, Strategy, MIN_FILE_KIND_SIZE,
};
use terrace_media::{Durability, MediaError};

fn shm() -> tempfile::TempDir {
    tempfile::tempdir_in("/dev/shm").expect("tempdir on /dev/shm")
}

fn file_kind(dir: &std::path::Path, max: usize) -> Kind {
    Kind::create_file(&FileKindOptions::in_dir(dir, max)).expect("file kind")
}

/// Writes a pattern over the whole object and checks it reads back.
fn exercise(p: NonNull<u8>, len: usize, seed: u8) {
    // SAFETY: p is a live allocation of at least len bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = seed.wrapping_add(i as u8);
    }
    assert!(bytes
        .iter()
        .enumerate()
        .all(|(i, &b)| b == seed.wrapping_add(i as u8)));
}

#[test]
fn every_medium_allocates_detects_and_frees() {
    let dir = shm();
    let kinds = [
        Kind::DEFAULT,
        file_kind(dir.path(), 64 << 20),
        Kind::create_dram(PageSize::Huge).unwrap(),
        Kind::create_numa(0).unwrap(),
    ];
    for (n, &kind) in kinds.iter().enumerate() {
        for &size in &[
            1usize,
            8,
            64,
            100,
            512,
            4096,
            20_000,
            65536,
            1 << 20,
            3 << 20,
        ] {
            let p = kind.malloc(size).unwrap();
            // SAFETY: live allocation.
            assert!(unsafe { usable_size(p.as_ptr()) } >= size);
            assert_eq!(detect_kind(p.as_ptr()), Some(kind), "kind {n} size {size}");
            exercise(p, size, n as u8);
            // SAFETY: live allocation, not used afterwards.
            assert!(unsafe { free(p.as_ptr()) });
        }
    }
    assert_eq!(kinds[1].medium(), Some(KindMedium::File));
    assert_eq!(
        kinds[1].durability(),
        Some(Durability::Process),
        "tmpfs is process-durable"
    );
    assert_eq!(kinds[3].medium(), Some(KindMedium::Numa(0)));
    for kind in &kinds[1..] {
        kind.destroy().unwrap();
    }
}

#[test]
fn calloc_zeroes_and_realloc_preserves_contents_across_kinds() {
    let dir = shm();
    let file = file_kind(dir.path(), 64 << 20);
    for kind in [Kind::DEFAULT, file] {
        // Dirty memory first so that calloc must really zero recycled memory.
        let dirty = kind.malloc(1 << 16).unwrap();
        // SAFETY: live allocation of 64 KiB.
        unsafe { dirty.as_ptr().write_bytes(0xEE, 1 << 16) };
        // SAFETY: live, not used afterwards.
        unsafe { free(dirty.as_ptr()) };
        let z = kind.calloc(1000, 65).unwrap();
        // SAFETY: live allocation of 65,000 bytes.
        assert!(unsafe { std::slice::from_raw_parts(z.as_ptr(), 65_000) }
            .iter()
            .all(|&b| b == 0));
        // SAFETY: live, not used afterwards.
        unsafe { free(z.as_ptr()) };
    }
    let p = file.malloc(100).unwrap();
    exercise(p, 100, 7);
    // Grow within the kind, then move to another kind, then shrink: contents survive.
    // SAFETY: p is live and not used after each successful realloc.
    let grown = unsafe { file.realloc(Some(p), 300_000) }.unwrap().unwrap();
    assert_eq!(detect_kind(grown.as_ptr()), Some(file));
    // SAFETY: grown is live.
    let moved = unsafe { Kind::DEFAULT.realloc(Some(grown), 200) }
        .unwrap()
        .unwrap();
    assert_eq!(detect_kind(moved.as_ptr()), Some(Kind::DEFAULT));
    // SAFETY: moved is live with at least 100 bytes written earlier.
    let head = unsafe { std::slice::from_raw_parts(moved.as_ptr(), 100) };
    assert!(head
        .iter()
        .enumerate()
        .all(|(i, &b)| b == 7u8.wrapping_add(i as u8)));
    // Size 0 frees.
    // SAFETY: moved is live and not used afterwards.
    let freed = unsafe { Kind::DEFAULT.realloc(Some(moved), 0) };
    assert_eq!(freed.unwrap(), None);
    file.destroy().unwrap();
}

#[test]
fn aligned_allocations_honour_alignment() {
    let dir = shm();
    let file = file_kind(dir.path(), 64 << 20);
    for kind in [Kind::DEFAULT, file] {
        for shift in 3..=21 {
            let align = 1usize << shift;
            let p = kind.aligned_alloc(align, 24).unwrap();
            assert_eq!(p.as_ptr() as usize % align, 0, "align {align}");
            // SAFETY: live, not used afterwards.
            unsafe { free(p.as_ptr()) };
        }
    }
    file.destroy().unwrap();
}

#[test]
fn bad_sizes_and_alignments_are_errors() {
    let dir = shm();
    let file = file_kind(dir.path(), 32 << 20);
    for kind in [Kind::DEFAULT, file] {
        assert!(matches!(kind.malloc(0), Err(KindError::ZeroSize)));
        assert!(matches!(
            kind.malloc(usize::MAX),
            Err(KindError::TooLarge { .. })
        ));
        assert!(matches!(
            kind.malloc(usize::MAX / 2 + 1),
            Err(KindError::TooLarge { .. })
        ));
        assert!(matches!(
            kind.malloc(isize::MAX as usize - 4096),
            Err(KindError::OutOfMemory { .. })
        ));
        assert!(matches!(
            kind.calloc(usize::MAX / 2, 3),
            Err(KindError::TooLarge { .. })
        ));
        for align in [0usize, 1, 3, 4, 12, 24] {
            assert!(
                matches!(
                    kind.aligned_alloc(align, 64),
                    Err(KindError::BadAlignment { .. })
                ),
                "align {align}"
            );
        }
        assert!(kind.aligned_alloc(1 << 50, 64).is_err());
    }
    // Larger than the file kind can ever hold: out of memory, not a crash.
    assert!(matches!(
        file.malloc(33 << 20),
        Err(KindError::OutOfMemory { .. })
    ));
    assert_eq!(KindError::ZeroSize.errno(), libc::EINVAL);
    assert_eq!(KindError::TooLarge { size: 1 }.errno(), libc::ENOMEM);
    file.destroy().unwrap();
}

#[test]
fn bad_file_kind_parameters_are_errors() {
    let dir = shm();
    let too_small = Kind::create_file(&FileKindOptions::in_dir(dir.path(), MIN_FILE_KIND_SIZE - 1));
    assert!(matches!(too_small, Err(KindError::SizeTooSmall { .. })));
    let huge = Kind::create_file(&FileKindOptions::in_dir(dir.path(), usize::MAX));
    assert!(matches!(huge, Err(KindError::TooLarge { .. })));
    let missing = Kind::create_file(&FileKindOptions::in_dir(
        "/nonexistent/terrace-kinds",
        32 << 20,
    ));
    match missing {
        Err(KindError::Media(MediaError::Open { path, .. })) => {
            assert!(path.ends_with("terrace-kinds"))
        }
        other => panic!("expected an open error, got {other:?}"),
    }
    // /sys refuses new files even to root: a read-only directory.
    let read_only = Kind::create_file(&FileKindOptions::in_dir("/sys", 32 << 20));
    assert!(matches!(
        read_only,
        Err(KindError::Media(MediaError::Open { .. }))
    ));
    // A directory whose permissions forbid writing (meaningful when not running as root).
    let locked = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        locked.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o500),
    )
    .unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let denied = Kind::create_file(&FileKindOptions::in_dir(locked.path(), 32 << 20));
        assert!(matches!(
            denied,
            Err(KindError::Media(MediaError::Open { .. }))
        ));
    }
    // A path that is a regular file, not a directory.
    let not_dir = tempfile::NamedTempFile::new().unwrap();
    assert!(Kind::create_file(&FileKindOptions::in_dir(not_dir.path(), 32 << 20)).is_err());
    // Errors carry an errno for the C ABI.
    let err = Kind::create_file(&FileKindOptions::in_dir("/nonexistent/x", 32 << 20)).unwrap_err();
    assert_eq!(err.errno(), libc::ENOENT);
}

#[test]
fn foreign_pointers_are_ignored_and_destroyed_kinds_refused() {
    let on_stack = 5u64;
    let boxed = Box::new(7u64);
    // SAFETY: free of a pointer no kind owns is documented to do nothing.
    unsafe {
        assert!(!free((&on_stack as *const u64).cast_mut().cast()));
        assert!(!free((&*boxed as *const u64).cast_mut().cast()));
        assert!(!free(std::ptr::null_mut()));
        assert_eq!(usable_size((&on_stack as *const u64).cast()), 0);
    }
    assert_eq!(detect_kind(std::ptr::null()), None);
    assert_eq!(*boxed, 7);

    let dir = shm();
    let kind = file_kind(dir.path(), 32 << 20);
    let p = kind.malloc(4096).unwrap();
    kind.destroy().unwrap();
    assert!(!kind.is_live());
    assert!(matches!(kind.malloc(8), Err(KindError::NoSuchKind)));
    assert!(matches!(kind.destroy(), Err(KindError::NoSuchKind)));
    assert!(matches!(kind.stats(), Err(KindError::NoSuchKind)));
    // The destroyed kind's memory is no longer owned by anyone: free is a no-op.
    assert_eq!(detect_kind(p.as_ptr()), None);
    // SAFETY: documented no-op for pointers no kind owns.
    assert!(!unsafe { free(p.as_ptr()) });
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing left behind"
    );
    assert!(matches!(
        Kind::DEFAULT.destroy(),
        Err(KindError::Unsupported { .. })
    ));
    // A handle that never existed.
    assert!(matches!(
        Kind::from_parts(4000, 77).malloc(8),
        Err(KindError::NoSuchKind)
    ));
    assert!(matches!(
        Kind::from_parts(u32::MAX, 1).malloc(8),
        Err(KindError::NoSuchKind)
    ));
}

#[test]
fn kept_file_kind_leaves_its_file() {
    let dir = shm();
    let path = dir.path().join("kind.heap");
    let kind = Kind::create_file(&FileKindOptions {
        location: FileLocation::Path(path.clone()),
        max_size: 32 << 20,
        hole_punching: false,
        reserve_ahead: Some(0),
    })
    .unwrap();
    // Leave data all over the file (no hole punching: it stays there after destroy).
    let p = kind.malloc(24 << 20).unwrap();
    exercise(p, 24 << 20, 3);
    // SAFETY: live, not used afterwards.
    unsafe { free(p.as_ptr()) };
    kind.destroy().unwrap();
    assert!(path.exists());
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 32 << 20);
    // Creating a kind on the kept file again starts empty: calloc'd memory is zero even
    // though the file held the pattern written above.
    let again = Kind::create_file(&FileKindOptions {
        location: FileLocation::Path(path.clone()),
        max_size: 32 << 20,
        hole_punching: false,
        reserve_ahead: None,
    })
    .unwrap();
    let z = again.calloc(1, 24 << 20).unwrap();
    // SAFETY: live zeroed allocation of 24 MiB.
    assert!(unsafe { std::slice::from_raw_parts(z.as_ptr(), 24 << 20) }
        .iter()
        .all(|&b| b == 0));
    // SAFETY: live, not used afterwards.
    unsafe { free(z.as_ptr()) };
    again.destroy().unwrap();
    let existing = Kind::create_file(&FileKindOptions {
        location: FileLocation::Existing(path),
        max_size: 32 << 20,
        hole_punching: false,
        reserve_ahead: None,
    });
    assert!(matches!(existing, Err(KindError::Unsupported { .. })));
}

#[test]
fn stats_follow_allocations() {
    let dir = shm();
    let kind = file_kind(dir.path(), 256 << 20);
    let before = kind.stats().unwrap();
    assert_eq!(before.capacity, 256 << 20);
    assert!(before.reserved > 0, "a lead is reserved at creation");
    let blocks: Vec<_> = (0..10).map(|_| kind.malloc(1 << 20).unwrap()).collect();
    let during = kind.stats().unwrap();
    assert!(
        during.allocated >= before.allocated + (10 << 20),
        "{before:?} -> {during:?}"
    );
    assert!(during.active >= 10 << 20);
    assert!(during.reserved >= 10 << 20);
    for b in blocks {
        // SAFETY: live, not used afterwards.
        unsafe { free(b.as_ptr()) };
    }
    let after = kind.stats().unwrap();
    assert!(after.allocated < during.allocated);
    kind.destroy().unwrap();
}

#[test]
fn unified_kinds_overflow_and_follow_their_strategy() {
    let dir = shm();
    let a = file_kind(dir.path(), 16 << 20);
    let b = file_kind(dir.path(), 16 << 20);
    let ordered = Kind::create_unified(&[a, b], Strategy::Ordered).unwrap();
    assert_eq!(ordered.strategy(), Some(Strategy::Ordered));
    assert_eq!(a.strategy(), None);
    let mut blocks = Vec::new();
    let err = loop {
        match ordered.malloc(1 << 20) {
            Ok(p) => blocks.push(p),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, KindError::OutOfMemory { .. }), "{err}");
    let owners: Vec<Kind> = blocks
        .iter()
        .map(|p| detect_kind(p.as_ptr()).unwrap())
        .collect();
    let first_b = owners
        .iter()
        .position(|&k| k == b)
        .expect("overflowed into the second member");
    assert!(first_b > 8, "the first member filled first");
    assert!(owners[..first_b].iter().all(|&k| k == a));
    assert!(owners[first_b..].iter().all(|&k| k == b));
    assert!(blocks.len() > 20, "both members used: {}", blocks.len());
    for p in blocks.drain(..) {
        // SAFETY: live, not used afterwards.
        unsafe { free(p.as_ptr()) };
    }
    // Round robin alternates.
    let rr = Kind::create_unified(&[a, b], Strategy::RoundRobin).unwrap();
    let x = rr.malloc(64).unwrap();
    let y = rr.malloc(64).unwrap();
    assert_ne!(detect_kind(x.as_ptr()), detect_kind(y.as_ptr()));
    // NUMA-local puts DRAM first, file kinds last.
    let local = Kind::create_unified(&[a, Kind::DEFAULT], Strategy::NumaLocal).unwrap();
    let z = local.malloc(64).unwrap();
    assert_eq!(detect_kind(z.as_ptr()), Some(Kind::DEFAULT));
    // SAFETY: live, not used afterwards.
    unsafe {
        free(x.as_ptr());
        free(y.as_ptr());
        free(z.as_ptr());
    }
    let stats = ordered.stats().unwrap();
    assert_eq!(stats.capacity, 32 << 20);
    assert!(matches!(
        Kind::create_unified(&[], Strategy::Ordered),
        Err(KindError::EmptyUnified)
    ));
    assert!(matches!(
        Kind::create_unified(&[ordered], Strategy::Ordered),
        Err(KindError::Unsupported { .. })
    ));
    // A destroyed member is skipped, not fatal.
    a.destroy().unwrap();
    let w = ordered.malloc(64).unwrap();
    assert_eq!(detect_kind(w.as_ptr()), Some(b));
    // SAFETY: live, not used afterwards.
    unsafe { free(w.as_ptr()) };
    for k in [ordered, rr, local, b] {
        k.destroy().unwrap();
    }
}

#[test]
fn numa_selections_exist_on_a_single_node_machine() {
    let local = Kind::lowest_latency_local().unwrap();
    let p = local.malloc(100).unwrap();
    assert_eq!(
        detect_kind(p.as_ptr()).and_then(|k| k.medium()),
        Some(KindMedium::Numa(0))
    );
    // SAFETY: live, not used afterwards.
    unsafe { free(p.as_ptr()) };
    assert_eq!(
        Kind::lowest_latency_local().unwrap(),
        local,
        "selections are created once"
    );
    let big = Kind::highest_capacity().unwrap();
    assert_eq!(big.medium(), Some(KindMedium::Numa(0)));
    assert!(Kind::regular().is_ok());
    // This machine has no CPU-less memory node.
    if terrace_media::numa::Topology::discover()
        .cpu_less()
        .is_empty()
    {
        assert!(Kind::cpu_less_memory().is_err());
    }
    assert!(Kind::create_numa(4000).is_err());
}

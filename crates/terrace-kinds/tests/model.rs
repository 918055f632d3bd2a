//! Property test: random malloc / calloc / aligned / realloc / free sequences across a DRAM
//! kind, a file kind and a unified kind, checked against a model of every live object's
//! contents, size and possible owners. Any lost byte, short usable size or wrong owner
//! fails the property.

use std::ptr::NonNull;

use proptest::prelude::*;
use terrace_kinds::Strategy as Unify;
use terrace_kinds::{detect_kind, free, usable_size, FileKindOptions, Kind};

#[derive(Clone, Debug)]
enum Op {
    Malloc {
        kind: usize,
        size: usize,
    },
    Calloc {
        kind: usize,
        count: usize,
        size: usize,
    },
    Aligned {
        kind: usize,
        shift: u32,
        size: usize,
    },
    Realloc {
        victim: usize,
        kind: usize,
        size: usize,
    },
    Free {
        victim: usize,
    },
}

fn size() -> impl Strategy<Value = usize> {
    prop_oneof![
        6 => 1usize..256,
        3 => 256usize..16_384,
        1 => 16_384usize..600_000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..3, size()).prop_map(|(kind, size)| Op::Malloc { kind, size }),
        1 => (0usize..3, 1usize..64, 1usize..512).prop_map(|(kind, count, size)| Op::Calloc { kind, count, size }),
        1 => (0usize..3, 3u32..16, size()).prop_map(|(kind, shift, size)| Op::Aligned { kind, shift, size }),
        3 => (any::<usize>(), 0usize..3, size()).prop_map(|(victim, kind, size)| Op::Realloc { victim, kind, size }),
        3 => any::<usize>().prop_map(|victim| Op::Free { victim }),
    ]
}

struct Live {
    ptr: NonNull<u8>,
    len: usize,
    seed: u8,
    /// The kinds the object may live in.
    owners: Vec<Kind>,
}

fn fill(p: NonNull<u8>, len: usize, seed: u8) {
    // SAFETY: p is live with at least len bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) };
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = seed ^ (i as u8).wrapping_mul(31);
    }
}

fn check(o: &Live, upto: usize) {
    // SAFETY: the object is live with at least o.len bytes.
    let bytes = unsafe { std::slice::from_raw_parts(o.ptr.as_ptr(), upto.min(o.len)) };
    for (i, &b) in bytes.iter().enumerate() {
        assert_eq!(
            b,
            o.seed ^ (i as u8).wrapping_mul(31),
            "byte {i} of a {}-byte object",
            o.len
        );
    }
    // SAFETY: live object.
    assert!(unsafe { usable_size(o.ptr.as_ptr()) } >= o.len);
    let owner = detect_kind(o.ptr.as_ptr()).expect("owned by a kind");
    assert!(
        o.owners.contains(&owner),
        "owner {owner:?} not in {:?}",
        o.owners
    );
}

struct Fixture {
    _dir: tempfile::TempDir,
    kinds: [Kind; 3],
    owners: [Vec<Kind>; 3],
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let file = Kind::create_file(&FileKindOptions::in_dir(dir.path(), 256 << 20)).unwrap();
    let spill = Kind::create_file(&FileKindOptions::in_dir(dir.path(), 32 << 20)).unwrap();
    let unified = Kind::create_unified(&[spill, Kind::DEFAULT], Unify::Ordered).unwrap();
    Fixture {
        _dir: dir,
        kinds: [Kind::DEFAULT, file, unified],
        owners: [vec![Kind::DEFAULT], vec![file], vec![spill, Kind::DEFAULT]],
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_keep_every_byte(ops in proptest::collection::vec(op(), 1..160)) {
        let fx = fixture();
        let mut live: Vec<Live> = Vec::new();
        let mut seed = 1u8;
        for op in ops {
            seed = seed.wrapping_add(37);
            match op {
                Op::Malloc { kind, size } => {
                    let ptr = fx.kinds[kind].malloc(size).unwrap();
                    fill(ptr, size, seed);
                    live.push(Live { ptr, len: size, seed, owners: fx.owners[kind].clone() });
                }
                Op::Calloc { kind, count, size } => {
                    let ptr = fx.kinds[kind].calloc(count, size).unwrap();
                    // SAFETY: live allocation of count * size bytes.
                    let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), count * size) };
                    prop_assert!(bytes.iter().all(|&b| b == 0));
                    fill(ptr, count * size, seed);
                    live.push(Live { ptr, len: count * size, seed, owners: fx.owners[kind].clone() });
                }
                Op::Aligned { kind, shift, size } => {
                    let ptr = fx.kinds[kind].aligned_alloc(1 << shift, size).unwrap();
                    prop_assert_eq!(ptr.as_ptr() as usize % (1 << shift), 0);
                    fill(ptr, size, seed);
                    live.push(Live { ptr, len: size, seed, owners: fx.owners[kind].clone() });
                }
                Op::Realloc { victim, kind, size } => {
                    if live.is_empty() { continue; }
                    let mut o = live.swap_remove(victim % live.len());
                    check(&o, o.len);
                    // SAFETY: o.ptr is live and replaced by the result.
                    let moved = unsafe { fx.kinds[kind].realloc(Some(o.ptr), size) }.unwrap().unwrap();
                    let kept = o.len.min(size);
                    o.ptr = moved;
                    o.len = kept;
                    o.owners = fx.owners[kind].iter().copied().chain(o.owners.iter().copied()).collect();
                    check(&o, kept);
                    fill(moved, size, seed);
                    live.push(Live { ptr: moved, len: size, seed, owners: o.owners });
                }
                Op::Free { victim } => {
                    if live.is_empty() { continue; }
                    let o = live.swap_remove(victim % live.len());
                    check(&o, o.len);
                    // SAFETY: live, not used afterwards.
                    let freed = unsafe { free(o.ptr.as_ptr()) };
                    prop_assert!(freed);
                }
            }
        }
        for o in &live {
            check(o, o.len);
        }
        for o in live {
            // SAFETY: live, not used afterwards.
            unsafe { free(o.ptr.as_ptr()) };
        }
        for kind in &fx.kinds[1..] {
            kind.destroy().unwrap();
        }
        fx.owners[2][0].destroy().unwrap();
    }
}

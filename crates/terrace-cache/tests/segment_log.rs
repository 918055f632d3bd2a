//! The single-tier [`SegmentLog`] against a `HashMap` model (only misses may diverge),
//! and crash recovery from the segment image at every persist point: a get after recovery
//! returns the last acknowledged value, the value of the write in flight, or a miss —
//! never a deleted or overwritten value.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use proptest::prelude::*;
use terrace_cache::item::ItemLimits;
mod seglog;

use seglog::{LogConfig, LogDropReason, LogError, SegmentLog};
use terrace_cache::{EncodeError, ScanEnd};

const KEYS: u32 = 24;

fn config(segments: u32, expected_items: usize) -> LogConfig {
    LogConfig {
        segment_shift: 10,
        segments,
        limits: ItemLimits {
            max_key_len: 250,
            max_value_len: 512,
        },
        expected_items,
        checksummed: true,
        seed: 7,
    }
}

fn key(k: u32) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

#[derive(Clone, Debug)]
enum Op {
    Set(u32, u8, usize),
    Delete(u32),
    Get(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..KEYS, any::<u8>(), 0usize..300).prop_map(|(k, b, n)| Op::Set(k, b, n)),
        2 => (0..KEYS).prop_map(Op::Delete),
        3 => (0..KEYS).prop_map(Op::Get),
    ]
}

fn value(b: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| b.wrapping_add(i as u8)).collect()
}

/// What a recovered get may return for each key at one persist point.
#[derive(Clone, Debug, Default)]
struct Allowed {
    acked: HashMap<u32, Vec<u8>>,
    in_flight: Option<(u32, Option<Vec<u8>>)>,
}

impl Allowed {
    fn permits(&self, k: u32, got: Option<&[u8]>) -> bool {
        let Some(got) = got else { return true };
        if self.acked.get(&k).map(Vec::as_slice) == Some(got) {
            return true;
        }
        matches!(&self.in_flight, Some((fk, Some(v))) if *fk == k && v.as_slice() == got)
    }
}

/// The segments at one persist point, and what a recovered get may return there.
type CrashImage = (Vec<Box<[u8]>>, Allowed);

fn run_with_crash_images(ops: &[Op], segments: u32, items: usize) {
    let mut log = SegmentLog::new(config(segments, items)).unwrap();
    let state = Rc::new(RefCell::new(Allowed::default()));
    let images: Rc<RefCell<Vec<CrashImage>>> = Rc::default();
    {
        let (state, images) = (state.clone(), images.clone());
        log.set_persist_probe(Some(Box::new(move |segs| {
            images
                .borrow_mut()
                .push((segs.to_vec(), state.borrow().clone()));
        })));
    }
    for op in ops {
        match *op {
            Op::Set(k, b, n) => {
                let v = value(b, n);
                state.borrow_mut().in_flight = Some((k, Some(v.clone())));
                log.set(&key(k), &v, u32::from(b)).unwrap();
                let mut s = state.borrow_mut();
                s.in_flight = None;
                s.acked.insert(k, v);
            }
            Op::Delete(k) => {
                state.borrow_mut().in_flight = Some((k, None));
                log.delete(&key(k));
                let mut s = state.borrow_mut();
                s.in_flight = None;
                s.acked.remove(&k);
            }
            Op::Get(k) => {
                let s = state.borrow();
                let got = log.get(&key(k));
                assert!(s.permits(k, got.map(|f| f.value)), "live get of {k} stale");
                // Sets store the value's first byte as client flags.
                if let Some(f) = got.filter(|f| !f.value.is_empty()) {
                    assert_eq!(f.client_flags, u32::from(f.value[0]));
                }
            }
        }
    }
    let images = images.borrow();
    for (image, allowed) in images.iter() {
        let (recovered, report) =
            SegmentLog::recover(config(segments, items), image.clone()).unwrap();
        assert!(
            report.dropped.is_empty(),
            "a persist point left a bad segment: {report:?}"
        );
        assert_eq!(report.conflicts, 0);
        for k in 0..KEYS {
            let got = recovered.get(&key(k));
            assert!(
                allowed.permits(k, got.map(|f| f.value)),
                "key {k} came back stale after a crash: {:?} allowed {:?}",
                got.map(|f| f.value.len()),
                allowed
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Eight 1 KiB segments for up to 24 keys of up to 300 bytes: evictions happen.
    #[test]
    fn crash_at_every_persist_point(ops in prop::collection::vec(op(), 1..80)) {
        run_with_crash_images(&ops, 8, 64);
    }

    /// A tiny index (16 slots for 24 keys): index-full evictions happen too.
    #[test]
    fn crash_at_every_persist_point_tiny_index(ops in prop::collection::vec(op(), 1..80)) {
        run_with_crash_images(&ops, 8, 10);
    }
}

#[test]
fn model_hits_and_evicts() {
    let mut log = SegmentLog::new(config(4, 64)).unwrap();
    let mut model: HashMap<u32, Vec<u8>> = HashMap::new();
    let mut x = 99u64;
    let mut hits = 0;
    for _ in 0..3000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = (x % u64::from(KEYS)) as u32;
        match x % 10 {
            0..=3 => {
                let v = value(x as u8, (x >> 8) as usize % 200);
                log.set(&key(k), &v, 0).unwrap();
                model.insert(k, v);
            }
            4 => {
                log.delete(&key(k));
                model.remove(&k);
            }
            _ => {
                if let Some(f) = log.get(&key(k)) {
                    assert_eq!(Some(&f.value.to_vec()), model.get(&k));
                    hits += 1;
                }
            }
        }
    }
    let stats = log.stats();
    assert!(hits > 100, "{hits} hits");
    assert!(stats.segments_evicted > 10, "{stats:?}");
    // Retired and reused segments all recover clean, with only current values.
    let (log, report) = SegmentLog::recover(config(4, 64), log.into_segments()).unwrap();
    assert!(report.dropped.is_empty(), "{report:?}");
    for k in 0..KEYS {
        if let Some(f) = log.get(&key(k)) {
            assert_eq!(Some(&f.value.to_vec()), model.get(&k));
        }
    }
}

#[test]
fn clean_restart_is_warm_and_keeps_cas() {
    let mut log = SegmentLog::new(config(16, 256)).unwrap();
    let mut cas = HashMap::new();
    for k in 0..KEYS {
        cas.insert(k, log.set(&key(k), &value(k as u8, 50), k).unwrap());
    }
    // Overwrite and delete some: the old values must not come back.
    for k in 0..KEYS / 2 {
        cas.insert(k, log.set(&key(k), &value(k as u8 + 100, 60), k).unwrap());
    }
    assert!(log.delete(&key(KEYS - 1)));
    let before = log.get(&key(3)).unwrap().cas;
    assert_eq!(before, cas[&3]);
    let (log, report) = SegmentLog::recover(config(16, 256), log.into_segments()).unwrap();
    assert!(report.dropped.is_empty());
    assert_eq!(report.items, KEYS as usize - 1);
    for k in 0..KEYS - 1 {
        let f = log.get(&key(k)).expect("a clean restart keeps every item");
        let want = if k < KEYS / 2 {
            value(k as u8 + 100, 60)
        } else {
            value(k as u8, 50)
        };
        assert_eq!(f.value, &want[..]);
        assert_eq!(f.client_flags, k);
        assert_eq!(f.cas, cas[&k]);
    }
    assert!(log.get(&key(KEYS - 1)).is_none());
}

#[test]
fn corrupt_segments_are_dropped_with_a_reason() {
    let mut log = SegmentLog::new(config(16, 256)).unwrap();
    for k in 0..KEYS {
        log.set(&key(k), &value(k as u8, 100), 0).unwrap();
    }
    let mut segs = log.into_segments();
    // Damage a value byte in segment 0's first item (not its state byte).
    segs[0][64 + 20] ^= 0x40;
    // A shifted segment: slot 1's bytes copied into slot 5.
    let copy = segs[1].clone();
    segs[5] = copy;
    // A truncated segment.
    segs[2] = segs[2][..500].to_vec().into_boxed_slice();
    let (log, report) = SegmentLog::recover(config(16, 256), segs).unwrap();
    let reasons: HashMap<u32, LogDropReason> = report.dropped.iter().cloned().collect();
    assert!(matches!(
        reasons[&0],
        LogDropReason::Scan(ScanEnd::ChecksumMismatch { .. })
    ));
    assert!(matches!(reasons[&2], LogDropReason::WrongSize { len: 500 }));
    assert!(matches!(
        reasons[&5],
        LogDropReason::Misplaced { slot: 1, .. }
    ));
    // What survived is correct; what did not is a miss.
    let mut hits = 0;
    for k in 0..KEYS {
        if let Some(f) = log.get(&key(k)) {
            assert_eq!(f.value, &value(k as u8, 100)[..]);
            hits += 1;
        }
    }
    assert!(hits > 0 && hits < KEYS);
}

#[test]
fn bad_input_is_a_typed_error() {
    let mut log = SegmentLog::new(config(4, 64)).unwrap();
    assert_eq!(
        log.set(b"", b"v", 0),
        Err(LogError::Encode(EncodeError::EmptyKey))
    );
    assert!(matches!(
        log.set(&[b'k'; 251], b"v", 0),
        Err(LogError::Encode(EncodeError::KeyTooLong { .. }))
    ));
    assert!(matches!(
        log.set(b"k", &[0u8; 513], 0),
        Err(LogError::Encode(EncodeError::ValueTooLong { .. }))
    ));
    let big = LogConfig {
        limits: ItemLimits {
            max_key_len: 250,
            max_value_len: 4096,
        },
        ..config(4, 64)
    };
    let mut log = SegmentLog::new(big).unwrap();
    assert!(matches!(
        log.set(b"k", &[0u8; 2000], 0),
        Err(LogError::TooLarge { .. })
    ));
    assert!(SegmentLog::new(config(1, 64)).is_err());
    assert!(SegmentLog::recover(config(4, 64), vec![]).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Recovery over damaged segments (random bytes anywhere, headers included) never
    /// panics, and whatever it serves is a value once written for that key.
    #[test]
    fn recovery_over_damaged_segments(
        ops in prop::collection::vec(op(), 1..60),
        damage in prop::collection::vec((0usize..8, 0usize..1024, any::<u8>()), 0..12),
    ) {
        let mut log = SegmentLog::new(config(8, 64)).unwrap();
        let mut written: HashMap<u32, Vec<Vec<u8>>> = HashMap::new();
        for op in &ops {
            match *op {
                Op::Set(k, b, n) => {
                    let v = value(b, n);
                    log.set(&key(k), &v, u32::from(b)).unwrap();
                    written.entry(k).or_default().push(v);
                }
                Op::Delete(k) => {
                    log.delete(&key(k));
                }
                Op::Get(_) => {}
            }
        }
        let mut segs = log.into_segments();
        for (s, at, byte) in damage {
            segs[s][at] = byte;
        }
        let (log, _report) = SegmentLog::recover(config(8, 64), segs).unwrap();
        for k in 0..KEYS {
            if let Some(f) = log.get(&key(k)) {
                let ever = written.get(&k).map(Vec::as_slice).unwrap_or(&[]);
                prop_assert!(ever.iter().any(|v| v.as_slice() == f.value), "key {} served a value never written", k);
            }
        }
    }
}

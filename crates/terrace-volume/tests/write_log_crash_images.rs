//! Crash images of the write log: a seeded run of appends (writes, zeroes, barriers),
//! write-back releases and reopenings over a store that records, at every sync (the log's
//! only persist point), what a power loss could leave — the durable bytes plus none, all,
//! a random subset, or all but a torn last one of the writes since the last sync. Every
//! image is reopened and must give back every acknowledged, unreleased record with its
//! exact payload, and nothing that was never appended.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use terrace_volume::log::{LogStore, Payload, RecordKind, Wait, WriteLog, SB_AREA};
use terrace_volume::BLOCK_SIZE;

const VOLUME: u64 = 64 * BLOCK_SIZE as u64;
const BS: u64 = BLOCK_SIZE as u64;

mod common;
use common::Rng;

/// A crash image and what the test knew when it was taken.
struct Image {
    bytes: Vec<u8>,
    /// Records acknowledged (durable) before the image: every seq below this.
    acked_below: u64,
    /// Records released, or being released, by the write-back before the image: every
    /// seq below this.
    released_below: u64,
}

#[derive(Default)]
struct State {
    current: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<(u64, Vec<u8>)>,
    images: Vec<Image>,
}

/// An in-memory store that records crash images at each sync.
struct Recorder {
    state: Arc<Mutex<State>>,
    acked_below: Arc<AtomicU64>,
    released_below: Arc<AtomicU64>,
    seed: Mutex<Rng>,
}

impl LogStore for Recorder {
    fn size(&self) -> u64 {
        self.state.lock().current.len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let s = self.state.lock();
        let end = offset as usize + buf.len();
        if end > s.current.len() {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        buf.copy_from_slice(&s.current[offset as usize..end]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut s = self.state.lock();
        let at = offset as usize;
        s.current[at..at + data.len()].copy_from_slice(data);
        s.pending.push((offset, data.to_vec()));
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut s = self.state.lock();
        let acked_below = self.acked_below.load(Ordering::SeqCst);
        let released_below = self.released_below.load(Ordering::SeqCst);
        let mut rng = self.seed.lock();
        let apply = |image: &mut Vec<u8>, w: &(u64, Vec<u8>), upto: usize| {
            let at = w.0 as usize;
            image[at..at + upto].copy_from_slice(&w.1[..upto]);
        };
        let mut variants: Vec<Vec<u8>> = vec![s.durable.clone()];
        if !s.pending.is_empty() {
            let mut all = s.durable.clone();
            for w in &s.pending {
                apply(&mut all, w, w.1.len());
            }
            variants.push(all);
            let mut subset = s.durable.clone();
            for w in &s.pending {
                if rng.below(2) == 0 {
                    apply(&mut subset, w, w.1.len());
                }
            }
            variants.push(subset);
            let mut torn = s.durable.clone();
            let last = s.pending.len() - 1;
            for (i, w) in s.pending.iter().enumerate() {
                let upto = if i == last {
                    // A torn write lands in 512-byte sectors, a prefix of them.
                    (rng.below(w.1.len() as u64 / 512 + 1) * 512) as usize
                } else {
                    w.1.len()
                };
                apply(&mut torn, w, upto.min(w.1.len()));
            }
            variants.push(torn);
        }
        for bytes in variants {
            s.images.push(Image {
                bytes,
                acked_below,
                released_below,
            });
        }
        // The sync itself: everything written is durable.
        let current = s.current.clone();
        s.durable = current;
        s.pending.clear();
        Ok(())
    }
    fn describe(&self) -> String {
        "recorder".into()
    }
}

/// A plain in-memory store over one image, for reopening.
struct Plain(Arc<Mutex<Vec<u8>>>);
impl LogStore for Plain {
    fn size(&self) -> u64 {
        self.0.lock().len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let s = self.0.lock();
        buf.copy_from_slice(&s[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.lock()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "plain".into()
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Appended {
    kind: RecordKind,
    offset: u64,
    len: u64,
    payload: Vec<u8>,
}

fn run(seed: u64, log_bytes: u64, steps: usize) -> usize {
    let state = Arc::new(Mutex::new(State {
        current: vec![0; log_bytes as usize],
        durable: vec![0; log_bytes as usize],
        ..State::default()
    }));
    let acked_below = Arc::new(AtomicU64::new(0));
    let released_below = Arc::new(AtomicU64::new(0));
    let recorder = Recorder {
        state: Arc::clone(&state),
        acked_below: Arc::clone(&acked_below),
        released_below: Arc::clone(&released_below),
        seed: Mutex::new(Rng(seed ^ 0x5eed)),
    };
    let mut rng = Rng(seed);
    let mut appended: BTreeMap<u64, Appended> = BTreeMap::new();
    let (mut log, _) = WriteLog::open(Box::new(recorder), VOLUME).expect("create");
    let wait = Duration::from_millis(1);
    for step in 0..steps {
        let roll = rng.below(100);
        if roll < 60 {
            let blocks = 1 + rng.below(4);
            let offset = rng.below(VOLUME / BS - blocks + 1) * BS;
            let mut payload = vec![0u8; (blocks * BS) as usize];
            for b in payload.iter_mut().step_by(97) {
                *b = rng.next() as u8;
            }
            payload[0] = step as u8;
            // A third of the writes only wait to be written (persistent-on-flush), so
            // several records are pending at a sync and an image may hold any of them.
            let durability = if rng.below(3) == 0 {
                Wait::Written
            } else {
                Wait::Durable
            };
            match log.append(
                RecordKind::Write,
                offset,
                Payload::Data(&payload),
                durability,
                wait,
            ) {
                Ok(meta) => {
                    appended.insert(
                        meta.seq,
                        Appended {
                            kind: meta.kind,
                            offset,
                            len: meta.len,
                            payload,
                        },
                    );
                    if durability == Wait::Durable {
                        acked_below.store(meta.seq + 1, Ordering::SeqCst);
                    }
                }
                Err(terrace_volume::BlockError::LogFull { .. }) => {
                    release_oldest(&log, &released_below, &mut appended)
                }
                Err(e) => panic!("append: {e}"),
            }
        } else if roll < 70 {
            let blocks = 1 + rng.below(8);
            let offset = rng.below(VOLUME / BS - blocks + 1) * BS;
            if let Ok(meta) = log.append(
                RecordKind::Zero,
                offset,
                Payload::Length(blocks * BS),
                Wait::Durable,
                wait,
            ) {
                appended.insert(
                    meta.seq,
                    Appended {
                        kind: meta.kind,
                        offset,
                        len: meta.len,
                        payload: Vec::new(),
                    },
                );
                acked_below.store(meta.seq + 1, Ordering::SeqCst);
            }
        } else if roll < 85 {
            if let Ok(meta) = log.append(
                RecordKind::Barrier,
                0,
                Payload::Length(0),
                Wait::Durable,
                wait,
            ) {
                appended.insert(
                    meta.seq,
                    Appended {
                        kind: meta.kind,
                        offset: 0,
                        len: 0,
                        payload: Vec::new(),
                    },
                );
                acked_below.store(meta.seq + 1, Ordering::SeqCst);
            }
        } else if roll < 88 {
            // A request that failed after taking its space: the record becomes a pad.
            let blocks = 1 + rng.below(3);
            if let Ok(meta) = log.reserve(RecordKind::Write, 0, blocks * BS, wait) {
                log.abandon(&meta).expect("abandon");
            }
        } else if roll < 97 {
            release_oldest(&log, &released_below, &mut appended);
        } else {
            // A clean reopen in the middle of the run (raises the life).
            let store = take_store(&mut log, &state, &acked_below, &released_below, &mut rng);
            let (reopened, recovery) = WriteLog::open(store, VOLUME).expect("reopen");
            log = reopened;
            for r in &recovery.records {
                assert!(
                    appended.contains_key(&r.seq)
                        || matches!(r.kind, RecordKind::Wrap | RecordKind::Pad),
                    "reopen found record {} never appended",
                    r.seq
                );
            }
        }
    }
    // Wrap records are appended by the log itself: learn them from a final clean read.
    let images = std::mem::take(&mut state.lock().images);
    for (n, image) in images.iter().enumerate() {
        check_image(n, image, &appended);
    }
    images.len()
}

/// Hands the recorder to a new WriteLog: the old one is dropped first.
fn take_store(
    log: &mut WriteLog,
    state: &Arc<Mutex<State>>,
    acked_below: &Arc<AtomicU64>,
    released_below: &Arc<AtomicU64>,
    rng: &mut Rng,
) -> Box<dyn LogStore> {
    log.sync().expect("sync");
    Box::new(Recorder {
        state: Arc::clone(state),
        acked_below: Arc::clone(acked_below),
        released_below: Arc::clone(released_below),
        seed: Mutex::new(Rng(rng.next() | 1)),
    })
}

fn release_oldest(
    log: &WriteLog,
    released_below: &AtomicU64,
    appended: &mut BTreeMap<u64, Appended>,
) {
    // Sometimes a barrier first, as a client's flush would leave; then a batch of one
    // of three sizes: any prefix of the log may be released.
    let wait = Duration::from_millis(1);
    let ends = log.oldest_batch(u64::MAX).and_then(|b| b.last().copied());
    if ends.is_some_and(|r| r.kind != RecordKind::Barrier)
        && released_below.load(Ordering::SeqCst).is_multiple_of(2)
    {
        if let Ok(meta) = log.append(
            RecordKind::Barrier,
            0,
            Payload::Length(0),
            Wait::Written,
            wait,
        ) {
            let barrier = Appended {
                kind: meta.kind,
                offset: 0,
                len: 0,
                payload: Vec::new(),
            };
            appended.insert(meta.seq, barrier);
        }
    }
    let max_bytes =
        [4096, 64 << 10, u64::MAX][(released_below.load(Ordering::SeqCst) % 3) as usize];
    if let Some(batch) = log.oldest_batch(max_bytes) {
        let last = *batch.last().unwrap();
        // From here on the release may have happened: records up to `last` may be gone.
        released_below.store(last.seq + 1, Ordering::SeqCst);
        log.persist_release(&last).expect("release");
        log.reuse_through(&last);
    }
}

fn check_image(n: usize, image: &Image, appended: &BTreeMap<u64, Appended>) {
    let bytes = Arc::new(Mutex::new(image.bytes.clone()));
    let store = Plain(Arc::clone(&bytes));
    let (log, recovery) = match WriteLog::open(Box::new(store), VOLUME) {
        Ok(x) => x,
        Err(e) => panic!("image {n}: reopen failed: {e}"),
    };
    let first = recovery.records.first().map(|r| r.seq);
    for pair in recovery.records.windows(2) {
        assert_eq!(pair[1].seq, pair[0].seq + 1, "image {n}: sequence gap");
    }
    // Nothing invented: each record is one that was appended (wraps are the log's own).
    for r in &recovery.records {
        if matches!(r.kind, RecordKind::Wrap | RecordKind::Pad) {
            continue;
        }
        let Some(a) = appended.get(&r.seq) else {
            panic!(
                "image {n}: record {} ({:?}) was never appended",
                r.seq, r.kind
            );
        };
        assert_eq!(
            (a.kind, a.offset, a.len),
            (r.kind, r.offset, r.len),
            "image {n}: record {} differs",
            r.seq
        );
        if r.kind == RecordKind::Write {
            let mut got = vec![0u8; r.len as usize];
            log.read_payload(r.pos, 0, &mut got).unwrap();
            assert!(
                got == a.payload,
                "image {n}: record {}'s payload differs",
                r.seq
            );
        }
    }
    // Nothing acknowledged and unreleased is missing.
    let recovered_to = recovery.records.last().map_or(0, |r| r.seq + 1);
    for (&seq, _) in
        appended.range(image.released_below..image.acked_below.max(image.released_below))
    {
        assert!(
            first.is_some_and(|f| f <= seq) && seq < recovered_to,
            "image {n}: acknowledged record {seq} lost (recovered {first:?}..{recovered_to}, {})",
            recovery.end
        );
    }
    // And the log goes on from there: an epoch can be cut and released even in a full
    // log, and then a write fits.
    let mut appended_now = BTreeMap::new();
    let released = AtomicU64::new(0);
    let wait = Duration::from_millis(1);
    let block = vec![1u8; BLOCK_SIZE];
    let mut tries = 0;
    while let Err(e) = log.append(
        RecordKind::Write,
        0,
        Payload::Data(&block),
        Wait::Durable,
        wait,
    ) {
        tries += 1;
        assert!(tries < 100, "image {n}: append after recovery: {e}");
        release_oldest(&log, &released, &mut appended_now);
    }
    // Two more writes of other sizes, then a clean reopen: exactly the records up to the
    // last one appended come back — none left behind by the crash beyond it (L3's life
    // and sequence checks).
    let two = vec![2u8; 2 * BLOCK_SIZE];
    let mut last = 0;
    for payload in [&two[..], &block[..]] {
        if let Ok(meta) = log.append(
            RecordKind::Write,
            0,
            Payload::Data(payload),
            Wait::Durable,
            wait,
        ) {
            last = meta.seq;
        }
    }
    let last = last.max(log.last_seq());
    drop(log);
    let (_, again) = WriteLog::open(Box::new(Plain(bytes)), VOLUME).expect("second reopen");
    let end = again.records.last().map_or(0, |r| r.seq);
    assert_eq!(
        end, last,
        "image {n}: the second reopen ends at {end}, not {last} ({})",
        again.end
    );
}

#[test]
fn every_crash_image_of_the_write_log_recovers_every_acknowledged_record() {
    // A small log wraps many times: 64 records of 4 KiB or so.
    let mut images = 0;
    for seed in 1..=4u64 {
        images += run(seed * 0x9E37_79B9, SB_AREA + 256 * 1024, 1500);
    }
    assert!(images > 10_000, "only {images} images");
    eprintln!("checked {images} crash images");
}

#[test]
fn a_log_from_another_volume_or_garbage_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let store = terrace_volume::FileLogStore::open(&path, SB_AREA + (1 << 20)).unwrap();
    let (log, _) = WriteLog::open(Box::new(store), VOLUME).unwrap();
    drop(log);
    let store = terrace_volume::FileLogStore::open(&path, 0).unwrap();
    let err = WriteLog::open(Box::new(store), VOLUME * 2)
        .err()
        .expect("a size mismatch");
    assert!(err.to_string().contains("belongs to a volume"), "{err}");
    std::fs::write(&path, vec![0xAB; 2 << 20]).unwrap();
    let store = terrace_volume::FileLogStore::open(&path, 0).unwrap();
    let err = WriteLog::open(Box::new(store), VOLUME)
        .err()
        .expect("garbage");
    assert!(err.to_string().contains("not a Terrace write log"), "{err}");
    std::fs::write(&path, vec![0; 1000]).unwrap();
    let store = terrace_volume::FileLogStore::open(&path, 0).unwrap();
    let err = WriteLog::open(Box::new(store), VOLUME)
        .err()
        .expect("too small");
    assert!(err.to_string().contains("too small"), "{err}");
}

#[test]
fn a_record_left_past_a_hole_by_a_crash_never_comes_back_after_a_release() {
    // Life 1: record 1 reserved and never written (its writer was killed), record 2
    // written. Life 2 recovers nothing (the scan stops at the hole), writes a record of
    // the same size where record 1 was and releases it: the head now sits where life 1's
    // record 2 is, with its sequence number. The next open must not take it.
    let bytes = Arc::new(Mutex::new(vec![0u8; (SB_AREA + (1 << 20)) as usize]));
    let wait = Duration::from_millis(1);
    let block = vec![5u8; BLOCK_SIZE];
    {
        let (log, _) = WriteLog::open(Box::new(Plain(Arc::clone(&bytes))), VOLUME).unwrap();
        let _hole = log.reserve(RecordKind::Write, 0, BS, wait).unwrap();
        let orphan = log.reserve(RecordKind::Write, BS, BS, wait).unwrap();
        log.write_record(&orphan, &block).unwrap();
    }
    {
        let (log, recovery) = WriteLog::open(Box::new(Plain(Arc::clone(&bytes))), VOLUME).unwrap();
        assert!(recovery.records.is_empty(), "{recovery:?}");
        let other = vec![6u8; BLOCK_SIZE];
        log.append(
            RecordKind::Write,
            2 * BS,
            Payload::Data(&other),
            Wait::Durable,
            wait,
        )
        .unwrap();
        let batch = log.oldest_batch(u64::MAX).unwrap();
        let last = *batch.last().unwrap();
        log.persist_release(&last).unwrap();
        log.reuse_through(&last);
    }
    let (_, recovery) = WriteLog::open(Box::new(Plain(Arc::clone(&bytes))), VOLUME).unwrap();
    assert!(
        recovery.records.is_empty(),
        "a never-acknowledged record of an earlier life came back: {recovery:?}"
    );
}

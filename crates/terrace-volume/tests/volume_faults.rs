//! "Fail the N-th cache write, for every N": a fixed script of writes, flushes, mode
//! switches (write-back → write-through → write-back → storage, whose log compacts, →
//! write-back), a grow of the volume with writes to its new blocks, and drains runs over
//! a write log whose N-th write or sync fails, for every
//! N up to the number of log operations a clean run makes. Each run must end in bounded
//! time without a panic (operations may fail with an error); then the volume is reopened
//! from the log's *durable* image — what a power loss right after the failure leaves —
//! over the same backend, and every block must hold its last acknowledged write, or a
//! write after it that failed (a failed write may have landed, as on a disk).
//!
//! The same script without faults also records crash images at every sync of the log
//! (its only persist point): the durable bytes before the sync and after it, each with
//! the backend as it was then. Every image reopens as a volume in which every block holds
//! its last write acknowledged by then, or one in flight.

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use terrace_cache::{Cache, CacheConfig, TierConfig, TierSize};
use terrace_volume::log::LogStore;
use terrace_volume::{Backend, Export, Mode, Volume, VolumeConfig, BLOCK_SIZE};

const BS: u64 = BLOCK_SIZE as u64;
const BLOCKS: u64 = 64;
/// Blocks the script's grow adds.
const GROWN: u64 = 16;
const LOG_BYTES: u64 = 512 << 10;

/// A log in memory whose `fail_at`-th write or sync (counting both from 1) fails once;
/// with a recorder, it keeps a crash image at each sync; while `held`, syncs wait
/// (`syncs_waiting` of them now).
struct FaultyStore {
    current: Mutex<Vec<u8>>,
    durable: Mutex<Vec<u8>>,
    ops: AtomicU64,
    fail_at: u64,
    recorder: Option<Recorder>,
    held: Mutex<bool>,
    let_go: parking_lot::Condvar,
    syncs_waiting: AtomicU64,
}

/// What a crash image needs: the script's ledger and the backend, to copy at each sync.
struct Recorder {
    ledger: Arc<Mutex<Vec<Allowed>>>,
    backend: Arc<MemBackend>,
    images: Mutex<Vec<CrashImage>>,
}

struct CrashImage {
    log: Vec<u8>,
    backend: Vec<u8>,
    allowed: Vec<Allowed>,
}

impl FaultyStore {
    fn new(bytes: Vec<u8>, fail_at: u64) -> Arc<FaultyStore> {
        Arc::new(FaultyStore {
            durable: Mutex::new(bytes.clone()),
            current: Mutex::new(bytes),
            ops: AtomicU64::new(0),
            fail_at,
            recorder: None,
            held: Mutex::new(false),
            let_go: parking_lot::Condvar::new(),
            syncs_waiting: AtomicU64::new(0),
        })
    }

    fn failing_now(&self) -> bool {
        self.ops.fetch_add(1, Ordering::SeqCst) + 1 == self.fail_at
    }
}

/// The store as the volume owns it (a Box), sharing the test's Arc.
struct Shared(Arc<FaultyStore>);

impl LogStore for Shared {
    fn size(&self) -> u64 {
        self.0.current.lock().len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let c = self.0.current.lock();
        buf.copy_from_slice(&c[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        if self.0.failing_now() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let mut c = self.0.current.lock();
        c[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let mut held = self.0.held.lock();
        if *held {
            self.0.syncs_waiting.fetch_add(1, Ordering::SeqCst);
            while *held {
                self.0.let_go.wait(&mut held);
            }
            self.0.syncs_waiting.fetch_sub(1, Ordering::SeqCst);
        }
        drop(held);
        if self.0.failing_now() {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        // One sync at a time, as the durable image never goes back: a sync that took
        // its copy of `current` before another sync's must not land after it.
        let mut durable = self.0.durable.lock();
        let c = self.0.current.lock().clone();
        let before = std::mem::replace(&mut *durable, c.clone());
        if let Some(r) = &self.0.recorder {
            let allowed = r.ledger.lock().clone();
            let backend = r.backend.0.lock().clone();
            let mut images = r.images.lock();
            for log in [before, c] {
                images.push(CrashImage {
                    log,
                    backend: backend.clone(),
                    allowed: allowed.clone(),
                });
            }
        }
        Ok(())
    }
    fn describe(&self) -> String {
        "faulty memory".into()
    }
    fn sync_is_free(&self) -> bool {
        true
    }
}

struct MemBackend(Mutex<Vec<u8>>);

impl Backend for MemBackend {
    fn size(&self) -> u64 {
        self.0.lock().len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        buf.copy_from_slice(&self.0.lock()[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.0.lock()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.0.lock()[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn grow(&self, new_size: u64) -> io::Result<()> {
        self.0.lock().resize(new_size as usize, 0);
        Ok(())
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

fn open(
    store: &Arc<FaultyStore>,
    backend: &Arc<MemBackend>,
    mode: Mode,
) -> Result<Arc<Volume>, terrace_volume::VolumeError> {
    let cache = CacheConfig {
        movers: 1,
        ..CacheConfig::new(vec![TierConfig::dram(TierSize::Bytes(16 << 20))])
    };
    let config = VolumeConfig {
        mode,
        log_bytes: LOG_BYTES,
        high_watermark: 0.2,
        low_watermark: 0.1,
        idle_writeback: Duration::from_millis(5),
        full_wait: Duration::from_millis(100),
        ..VolumeConfig::new("v", 3, "unused.log")
    };
    let cache = Arc::new(Cache::open(cache).unwrap().0);
    let store: Box<dyn LogStore> = Box::new(Shared(Arc::clone(store)));
    Volume::open_with_store(config, backend.clone(), cache, store).map(|(v, _)| v)
}

/// What each block may hold: its last acknowledged stamp, or a later failed one's.
#[derive(Clone)]
struct Allowed {
    acked: u8,
    failed_after: BTreeSet<u8>,
}

fn new_ledger() -> Arc<Mutex<Vec<Allowed>>> {
    let nothing = Allowed {
        acked: 0,
        failed_after: BTreeSet::new(),
    };
    Arc::new(Mutex::new(vec![nothing; (BLOCKS + GROWN) as usize]))
}

/// The script, keeping in `ledger` what each block may hold (a write in flight counts
/// as failed until it is acknowledged).
fn script(volume: &Volume, ledger: &Mutex<Vec<Allowed>>) {
    let mut stamp = 0u8;
    let mut write = |volume: &Volume, blocks: std::ops::Range<u64>| {
        for b in blocks {
            stamp += 1;
            let data = vec![stamp; BLOCK_SIZE];
            ledger.lock()[b as usize].failed_after.insert(stamp);
            if volume.write(b * BS, &data, false).is_ok() {
                let a = &mut ledger.lock()[b as usize];
                a.acked = stamp;
                a.failed_after.clear();
            }
        }
    };
    let drain = |volume: &Volume| {
        let _ = volume.drain(Duration::from_millis(200));
    };
    write(volume, 0..8);
    let _ = volume.flush();
    volume.set_mode(Mode::WriteThrough);
    write(volume, 4..12);
    volume.set_mode(Mode::WriteBack);
    write(volume, 10..20);
    let _ = volume.flush();
    // A failed grow leaves the old size: the writes past it fail. Asked again, a grow
    // whose end could not be recorded is an error, not a panic.
    let _ = volume.grow((BLOCKS + GROWN) * BS);
    let _ = volume.grow((BLOCKS + GROWN) * BS);
    write(volume, BLOCKS - 4..BLOCKS + 8);
    volume.set_mode(Mode::Storage);
    for _ in 0..4 {
        write(volume, 0..24);
        let _ = volume.flush();
    }
    drain(volume);
    volume.set_mode(Mode::WriteBack);
    write(volume, 20..30);
    let _ = volume.flush();
    drain(volume);
    write(volume, 30..40);
}

fn run(fail_at: u64) -> (u64, Vec<Allowed>, Vec<u8>, Arc<MemBackend>) {
    let backend = Arc::new(MemBackend(Mutex::new(vec![0; (BLOCKS * BS) as usize])));
    let store = FaultyStore::new(vec![0; LOG_BYTES as usize], fail_at);
    let ledger = new_ledger();
    match open(&store, &backend, Mode::WriteBack) {
        Ok(volume) => {
            script(&volume, &ledger);
            volume.close();
        }
        // A fault while opening (the superblock's update) is a clear error; nothing
        // was acknowledged.
        Err(e) => assert!(e.to_string().contains("error"), "{e}"),
    }
    let allowed = ledger.lock().clone();
    let ops = store.ops.load(Ordering::SeqCst);
    let durable = store.durable.lock().clone();
    (ops, allowed, durable, backend)
}

fn check(fail_at: u64, allowed: &[Allowed], durable: Vec<u8>, backend: &Arc<MemBackend>) {
    let store = FaultyStore::new(durable, 0);
    let volume = open(&store, backend, Mode::WriteBack)
        .unwrap_or_else(|e| panic!("fail at {fail_at}: the durable image does not open: {e}"));
    let mut buf = vec![0u8; BLOCK_SIZE];
    let size = volume.size();
    assert!(
        size == BLOCKS * BS || size == (BLOCKS + GROWN) * BS,
        "fail at {fail_at}: the volume reopens with {size} bytes"
    );
    for (b, a) in allowed.iter().enumerate() {
        if b as u64 * BS >= size {
            // Not grown (or the grow was lost with the crash): nothing was acknowledged
            // there.
            assert_eq!(a.acked, 0, "fail at {fail_at}: block {b} was acknowledged");
            continue;
        }
        volume.read(b as u64 * BS, &mut buf).unwrap();
        let got = buf[0];
        assert!(
            buf.iter().all(|&x| x == got),
            "fail at {fail_at}: block {b} is torn"
        );
        assert!(
            got == a.acked || a.failed_after.contains(&got),
            "fail at {fail_at}: block {b} holds stamp {got}, acknowledged {}, failed since {:?}",
            a.acked,
            a.failed_after
        );
    }
    volume
        .drain(Duration::from_secs(10))
        .expect("drains after the fault");
    volume.close();
}

#[test]
fn failing_the_nth_log_write_or_sync_loses_no_acknowledged_write() {
    let (clean_ops, allowed, durable, backend) = run(0);
    check(0, &allowed, durable, &backend);
    assert!(
        clean_ops > 50,
        "the script makes {clean_ops} log operations"
    );
    // The background write-back and compaction make the count vary a little: go past it.
    // The runs mostly wait (write-back pauses, full-log waits), so eight go at once.
    let points: Vec<u64> = (1..=clean_ops + 20).collect();
    for group in points.chunks(8) {
        let runs: Vec<_> = group
            .iter()
            .map(|&fail_at| {
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    let _ = tx.send(run(fail_at));
                });
                (fail_at, rx)
            })
            .collect();
        for (fail_at, rx) in runs {
            let (_, allowed, durable, backend) = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("fail at {fail_at}: the script hung or panicked"));
            check(fail_at, &allowed, durable, &backend);
        }
    }
}

#[test]
fn every_sync_of_the_log_is_a_crash_image_the_volume_recovers_from() {
    let backend = Arc::new(MemBackend(Mutex::new(vec![0; (BLOCKS * BS) as usize])));
    let ledger = new_ledger();
    let store = Arc::new(FaultyStore {
        durable: Mutex::new(vec![0; LOG_BYTES as usize]),
        current: Mutex::new(vec![0; LOG_BYTES as usize]),
        ops: AtomicU64::new(0),
        fail_at: 0,
        recorder: Some(Recorder {
            ledger: Arc::clone(&ledger),
            backend: Arc::clone(&backend),
            images: Mutex::new(Vec::new()),
        }),
        held: Mutex::new(false),
        let_go: parking_lot::Condvar::new(),
        syncs_waiting: AtomicU64::new(0),
    });
    let volume = open(&store, &backend, Mode::WriteBack).unwrap();
    script(&volume, &ledger);
    volume.close();
    let images = std::mem::take(&mut *store.recorder.as_ref().unwrap().images.lock());
    assert!(images.len() > 100, "{} images", images.len());
    for (i, image) in images.into_iter().enumerate() {
        let backend = Arc::new(MemBackend(Mutex::new(image.backend)));
        check(i as u64, &image.allowed, image.log, &backend);
    }
}

/// What a test needs of a backend beyond [`MemBackend`]: refusing to grow, slow writes,
/// and a snapshot that runs `during` half-way through its copy and keeps the backend as
/// it was at both ends of the copy.
struct Hooked {
    memory: Arc<MemBackend>,
    fixed: bool,
    write_delay: Duration,
    during: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    copy: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
}

impl Hooked {
    fn new() -> Hooked {
        Hooked {
            memory: Arc::new(MemBackend(Mutex::new(vec![0; (BLOCKS * BS) as usize]))),
            fixed: false,
            write_delay: Duration::ZERO,
            during: Mutex::new(None),
            copy: Mutex::new(None),
        }
    }
}

impl Backend for Hooked {
    fn size(&self) -> u64 {
        self.memory.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.memory.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        std::thread::sleep(self.write_delay);
        self.memory.write_at(offset, data)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.memory.trim(offset, len)
    }
    fn grow(&self, new_size: u64) -> io::Result<()> {
        if self.fixed {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "hooked memory cannot grow",
            ));
        }
        self.memory.grow(new_size)
    }
    fn snapshot(&self, tag: &str) -> io::Result<String> {
        let before = self.memory.0.lock().clone();
        if let Some(during) = self.during.lock().take() {
            during();
        }
        let after = self.memory.0.lock().clone();
        *self.copy.lock() = Some((before, after));
        Ok(format!("memory:{tag}"))
    }
    fn describe(&self) -> String {
        "hooked memory".into()
    }
}

/// A 16 MiB DRAM cache for volumes to share.
fn small_cache() -> Arc<Cache> {
    let config = CacheConfig::new(vec![TierConfig::dram(TierSize::Bytes(16 << 20))]);
    Arc::new(Cache::open(config).unwrap().0)
}

/// A volume over `backend` with its log in `store` (a new one if `None`).
fn open_over(
    backend: Arc<dyn Backend>,
    config: VolumeConfig,
    cache: Arc<Cache>,
    store: Option<&Arc<FaultyStore>>,
) -> Arc<Volume> {
    let store = store
        .cloned()
        .unwrap_or_else(|| FaultyStore::new(vec![0; config.log_bytes as usize], 0));
    let store: Box<dyn LogStore> = Box::new(Shared(store));
    Volume::open_with_store(config, backend, cache, store)
        .unwrap()
        .0
}

/// A backend that cannot grow: the grow is refused with the backend's reason, the log
/// takes it back, and the volume keeps (and reopens with) its size.
#[test]
fn a_grow_the_backend_refuses_is_taken_back() {
    let backend = Arc::new(Hooked {
        fixed: true,
        ..Hooked::new()
    });
    let store = FaultyStore::new(vec![0; LOG_BYTES as usize], 0);
    let open_fixed = || {
        let config = VolumeConfig {
            mode: Mode::WriteBack,
            log_bytes: LOG_BYTES,
            ..VolumeConfig::new("v", 3, "unused.log")
        };
        open_over(backend.clone(), config, small_cache(), Some(&store))
    };
    let volume = open_fixed();
    volume.write(0, &[5; BLOCK_SIZE], false).unwrap();
    let e = volume.grow(2 * BLOCKS * BS).unwrap_err().to_string();
    assert!(e.contains("cannot grow"), "{e}");
    assert_eq!(volume.size(), BLOCKS * BS);
    assert!(volume.write(BLOCKS * BS, &[1; BLOCK_SIZE], false).is_err());
    volume.close();
    let volume = open_fixed();
    assert_eq!(volume.size(), BLOCKS * BS);
    let mut buf = vec![0; BLOCK_SIZE];
    volume.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 5));
    volume.close();
}

/// Two volumes share one small cache: each one's status counts its own clean copies
/// (the cache's items split between them exactly, evictions included), dirty blocks,
/// and present = clean + dirty; a large write drops its blocks' copies.
#[test]
fn status_counts_each_volumes_share_of_a_shared_cache() {
    const BIG: u64 = 16384; // 64 MiB of blocks against a 16 MiB cache
    let cache = small_cache();
    let open_one = |id: u32, mode: Mode| {
        let backend = Arc::new(MemBackend(Mutex::new(vec![0; (BIG * BS) as usize])));
        let config = VolumeConfig {
            mode,
            log_bytes: 4 << 20,
            high_watermark: 0.9,
            idle_writeback: Duration::from_secs(3600),
            ..VolumeConfig::new(&format!("v{id}"), id, "unused.log")
        };
        open_over(backend, config, Arc::clone(&cache), None)
    };
    let a = open_one(1, Mode::WriteThrough);
    let b = open_one(2, Mode::WriteBack);
    for block in 0..100 {
        a.write(block * BS, &[1; BLOCK_SIZE], false).unwrap();
    }
    // Every other block: a run of 64 KiB or more would be written back as a large write,
    // not cached.
    for block in 0..30 {
        b.write(2 * block * BS, &[2; BLOCK_SIZE], false).unwrap();
    }
    let (sa, sb) = (a.status(), b.status());
    assert_eq!((sa.clean_bytes, sa.dirty_bytes), (100 * BS, 0));
    assert_eq!((sb.clean_bytes, sb.dirty_bytes), (0, 30 * BS));
    assert_eq!(sb.present_bytes(), 30 * BS);
    assert!(sb.allocated_bytes() >= 30 * BS);

    // A large write (64 KiB) is not cached and drops the copies it covers.
    a.write(0, &[3; 65536], false).unwrap();
    assert_eq!(a.status().clean_bytes, (100 - 16) * BS);

    // The write-back puts b's blocks in the cache, clean.
    b.drain(Duration::from_secs(10)).unwrap();
    let sb = b.status();
    assert_eq!((sb.clean_bytes, sb.dirty_bytes), (30 * BS, 0));

    // Far more than the cache holds: evictions, which the counts follow exactly.
    for block in 100..BIG {
        a.write(block * BS, &[4; BLOCK_SIZE], false).unwrap();
    }
    let (sa, sb) = (a.status(), b.status());
    let items: u64 = cache.stats().tiers.iter().map(|t| t.items).sum();
    assert!(sa.clean_bytes < 16 << 20, "{} clean bytes", sa.clean_bytes);
    assert_eq!((sa.clean_bytes + sb.clean_bytes) / BS, items);
    a.close();
    b.close();
}

/// Flush progress: while a drain writes back to a slow backend, status says a flush is
/// under way with the dirty bytes it started from and what it has written back so far;
/// after it, none.
#[test]
fn status_shows_a_flush_in_progress() {
    let backend = Arc::new(Hooked {
        write_delay: Duration::from_millis(20),
        ..Hooked::new()
    });
    let config = VolumeConfig {
        mode: Mode::WriteBack,
        log_bytes: LOG_BYTES,
        high_watermark: 0.99,
        writeback_threads: 1,
        idle_writeback: Duration::from_secs(3600),
        ..VolumeConfig::new("v", 3, "unused.log")
    };
    let volume = open_over(backend, config, small_cache(), None);
    // Every other block: each one its own run, one slow backend write each.
    for block in 0..20 {
        volume
            .write(2 * block * BS, &[1; BLOCK_SIZE], false)
            .unwrap();
    }
    assert_eq!(volume.status().flush, None);
    let draining = {
        let volume = Arc::clone(&volume);
        std::thread::spawn(move || volume.drain(Duration::from_secs(30)))
    };
    let mut seen_progress = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !draining.is_finished() && std::time::Instant::now() < deadline {
        let status = volume.status();
        if let Some(flush) = status.flush {
            assert_eq!(flush.dirty_at_start, 20 * BS);
            seen_progress |= flush.written_back > 0 && flush.written_back < 20 * BS;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    draining.join().unwrap().unwrap();
    assert!(seen_progress, "the flush was seen part done");
    let status = volume.status();
    assert_eq!((status.flush, status.dirty_bytes), (None, 0));
    volume.close();
}

/// V7: while a snapshot copies the backend, writes go on (into the log, even in
/// write-through) and the backend holds still; the copy has every write acknowledged
/// before the snapshot and none after, and the later writes reach the backend after it.
#[test]
fn writes_during_a_snapshot_wait_in_the_log_and_the_backend_holds_still() {
    let backend = Arc::new(Hooked::new());
    let config = VolumeConfig {
        mode: Mode::WriteThrough,
        log_bytes: LOG_BYTES,
        ..VolumeConfig::new("v", 3, "unused.log")
    };
    let volume = open_over(backend.clone(), config, small_cache(), None);
    for block in 0..8 {
        volume.write(block * BS, &[1; BLOCK_SIZE], false).unwrap();
    }
    let during = {
        let volume = Arc::clone(&volume);
        Box::new(move || {
            // Large ones too: in write-back they would bypass the log.
            volume.write(0, &[2; 65536], false).unwrap();
            volume.write(20 * BS, &[2; BLOCK_SIZE], false).unwrap();
        })
    };
    *backend.during.lock() = Some(during);
    assert_eq!(
        volume.snapshot("t", Duration::from_secs(10)).unwrap(),
        "memory:t"
    );
    let (before, after) = backend.copy.lock().take().expect("the backend was copied");
    assert!(before == after, "the backend changed while it was copied");
    assert!(before[..(8 * BS) as usize].iter().all(|&b| b == 1));
    assert!(before[(20 * BS) as usize..(21 * BS) as usize]
        .iter()
        .all(|&b| b == 0));
    // The writes made meanwhile were acknowledged, read back, and reach the backend.
    let mut buf = vec![0; 65536];
    volume.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 2));
    volume.drain(Duration::from_secs(10)).unwrap();
    let now = backend.memory.0.lock().clone();
    assert!(now[..65536].iter().all(|&b| b == 2));
    assert!(now[(20 * BS) as usize..(21 * BS) as usize]
        .iter()
        .all(|&b| b == 2));
    volume.close();
}

/// V8: a read of a block whose newest write is not durable yet waits for it, as the
/// writer does — it never returns a value that a crash (or a failover to a copy the
/// write never reached) would take back.
#[test]
fn a_read_waits_for_the_write_it_returns_to_be_durable() {
    let gated = FaultyStore::new(vec![0; LOG_BYTES as usize], 0);
    let backend = Arc::new(MemBackend(Mutex::new(vec![0; (BLOCKS * BS) as usize])));
    let config = VolumeConfig {
        mode: Mode::WriteBack,
        log_bytes: LOG_BYTES,
        ..VolumeConfig::new("v", 3, "unused.log")
    };
    let v = open_over(backend, config, small_cache(), Some(&gated));
    *gated.held.lock() = true;
    std::thread::scope(|s| {
        let writer = s.spawn(|| v.write(0, &[7u8; BS as usize], false));
        // The write's record is in the log and its sync held.
        std::thread::sleep(Duration::from_millis(100));
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = Arc::clone(&v);
        s.spawn(move || {
            let mut buf = vec![0u8; BS as usize];
            let result = reader.read(0, &mut buf);
            let _ = tx.send((result, buf));
        });
        let early = rx.recv_timeout(Duration::from_millis(300));
        // Released before any check, so that a failure does not leave the writer held.
        *gated.held.lock() = false;
        gated.let_go.notify_all();
        assert!(
            early.is_err(),
            "a read returned a write that is not durable"
        );
        let (result, buf) = rx.recv_timeout(Duration::from_secs(10)).expect("the read");
        result.unwrap();
        assert!(buf.iter().all(|&b| b == 7), "the read after the sync");
        writer.join().unwrap().unwrap();
    });
    v.close();
}

/// The release of a written-back batch moves the log's head with a sync, which may wait
/// long (a replicated log's waits for a copy in sync, indefinitely while the volume is
/// read-only); reads and status go on meanwhile. Once, the release held every block's
/// lock through its sync, and a read-only primary answered nothing.
#[test]
fn a_release_waiting_for_its_sync_holds_up_no_read() {
    let gated = FaultyStore::new(vec![0; LOG_BYTES as usize], 0);
    let backend = Arc::new(MemBackend(Mutex::new(vec![0; (BLOCKS * BS) as usize])));
    let config = VolumeConfig {
        mode: Mode::WriteBack,
        log_bytes: LOG_BYTES,
        idle_writeback: Duration::from_secs(3600),
        ..VolumeConfig::new("v", 3, "unused.log")
    };
    let v = open_over(backend.clone(), config, small_cache(), Some(&gated));
    for b in 0..8u8 {
        v.write(u64::from(b) * BS, &[b + 1; BS as usize], false)
            .unwrap();
    }
    *gated.held.lock() = true;
    std::thread::scope(|s| {
        let drain = s.spawn(|| v.drain(Duration::from_secs(20)));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while gated.syncs_waiting.load(Ordering::SeqCst) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the drain never reached its release"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // The batch is in the backend; its release waits in the superblock's sync.
        assert!(backend.0.lock()[..(8 * BS) as usize]
            .chunks(BS as usize)
            .enumerate()
            .all(|(b, block)| block.iter().all(|&x| x == b as u8 + 1)));
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = Arc::clone(&v);
        s.spawn(move || {
            let mut buf = vec![0u8; 2 * BS as usize];
            let read = reader.read(3 * BS, &mut buf).map(|()| buf);
            let _ = tx.send((read, reader.status()));
        });
        let answered = rx.recv_timeout(Duration::from_secs(5));
        // Let go before any check, so that a failure does not leave the drain held.
        *gated.held.lock() = false;
        gated.let_go.notify_all();
        let (read, status) = answered.expect("a read and a status waited for the release");
        let buf = read.unwrap();
        assert!(buf[..BS as usize].iter().all(|&x| x == 4));
        assert!(buf[BS as usize..].iter().all(|&x| x == 5));
        assert!(
            status.dirty_bytes > 0,
            "released before its sync: {status:?}"
        );
        drain.join().unwrap().unwrap();
    });
    assert_eq!(v.status().dirty_bytes, 0);
    v.close();
}

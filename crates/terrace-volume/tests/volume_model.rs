//! A volume against a model: seeded random reads, writes (aligned and not), zeroes,
//! trims, flushes, mode switches, drains and reopenings — cold (a new cache) and warm
//! (the same cache) — over an in-memory backend, several threads at once. Every read
//! must equal the model; after a drain the backend alone must equal it; the backend
//! must never hold data the model never had.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use terrace_cache::{Cache, CacheConfig, TierConfig, TierSize};
use terrace_volume::{AckDurability, Backend, Export, Mode, Volume, VolumeConfig, BLOCK_SIZE};

const BS: u64 = BLOCK_SIZE as u64;

mod common;
use common::Rng;

/// An in-memory backend that can be told to fail.
struct MemBackend {
    bytes: Mutex<Vec<u8>>,
    fail_writes: AtomicU64,
    fail_reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    /// Writes wait while a test holds this for writing.
    gate: parking_lot::RwLock<()>,
}

impl MemBackend {
    fn new(size: u64) -> Arc<MemBackend> {
        Arc::new(MemBackend {
            bytes: Mutex::new(vec![0; size as usize]),
            fail_writes: AtomicU64::new(0),
            fail_reads: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            gate: parking_lot::RwLock::new(()),
        })
    }
}

impl Backend for MemBackend {
    fn size(&self) -> u64 {
        self.bytes.lock().len() as u64
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if self.fail_reads.load(Ordering::SeqCst) > 0 {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let b = self.bytes.lock();
        buf.copy_from_slice(&b[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let _open = self.gate.read();
        if self.fail_writes.load(Ordering::SeqCst) > 0 {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes.lock()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) > 0 {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.flushes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.fail_writes.load(Ordering::SeqCst) > 0 {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.bytes.lock()[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn describe(&self) -> String {
        "memory".into()
    }
}

fn cache(bytes: u64) -> Arc<Cache> {
    let config = CacheConfig {
        movers: 1,
        ..CacheConfig::new(vec![TierConfig::dram(TierSize::Bytes(bytes))])
    };
    Arc::new(Cache::open(config).expect("cache").0)
}

fn config(dir: &std::path::Path, mode: Mode) -> VolumeConfig {
    VolumeConfig {
        mode,
        // Four times the model volume: storage mode holds all of it in the log.
        log_bytes: 8 << 20,
        idle_writeback: Duration::from_millis(20),
        full_wait: Duration::from_secs(20),
        // Writes of 4 blocks and more are large: uncached, and bypassing a congested log
        // (from 2% full; storage mode compacts from there).
        large_write: 4 * BS,
        high_watermark: 0.02,
        low_watermark: 0.01,
        ..VolumeConfig::new("v", 7, dir.join("v.log"))
    }
}

/// One thread's random operations on its own quarter of the volume (so the model is
/// exact without ordering threads against each other); without `flushes`, a write
/// where a flush would be.
fn worker(
    volume: &Volume,
    model: &Mutex<Vec<u8>>,
    (lane, lanes): (u64, u64),
    seed: u64,
    ops: usize,
    flushes: bool,
) {
    let size = volume.size();
    let lane_bytes = size / lanes;
    let base = lane * lane_bytes;
    let mut rng = Rng(seed);
    for op in 0..ops {
        let len = match rng.below(4) {
            0 => 1 + rng.below(3 * BS),
            1 => BS,
            _ => BS * (1 + rng.below(8)),
        }
        .min(lane_bytes);
        let offset = base + rng.below(lane_bytes - len + 1);
        let offset = if rng.below(3) > 0 {
            offset / BS * BS
        } else {
            offset
        };
        let len = len.min(base + lane_bytes - offset);
        let kind = match rng.below(10) {
            9 if !flushes => 4,
            kind => kind,
        };
        match kind {
            0..=3 => {
                let mut got = vec![0u8; len as usize];
                // Half the reads as the NBD reader thread tries them first: from memory
                // only, falling back to a full read.
                let at_once = rng.below(2) == 0 && volume.read_cached(offset, &mut got).is_some();
                if !at_once {
                    volume.read(offset, &mut got).expect("read");
                }
                let m = model.lock();
                let want = &m[offset as usize..(offset + len) as usize];
                if got != want {
                    let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap();
                    panic!("op {op}: read {offset}+{len} differs at byte {at}");
                }
            }
            4..=7 => {
                let data: Vec<u8> = (0..len).map(|i| (rng.next() as u8) ^ (i as u8)).collect();
                let fua = rng.below(8) == 0;
                // Half the writes as the NBD reader thread tries them first: in memory
                // only, falling back to a full write.
                let at_once =
                    rng.below(2) == 0 && volume.write_at_once(offset, &data, fua).is_some();
                if !at_once {
                    volume.write(offset, &data, fua).expect("write");
                }
                model.lock()[offset as usize..(offset + len) as usize].copy_from_slice(&data);
            }
            8 => {
                if rng.below(2) == 0 {
                    volume.write_zeroes(offset, len, false).expect("zeroes");
                } else {
                    volume.trim(offset, len, false).expect("trim");
                }
                model.lock()[offset as usize..(offset + len) as usize].fill(0);
            }
            _ => volume.flush().expect("flush"),
        }
    }
}

fn check_all(volume: &Volume, model: &Mutex<Vec<u8>>, what: &str) {
    let mut got = vec![0u8; volume.size() as usize];
    for (i, chunk) in got.chunks_mut(64 * BLOCK_SIZE).enumerate() {
        volume.read(i as u64 * 64 * BS, chunk).expect("read");
    }
    let m = model.lock();
    if got != *m {
        let at = got.iter().zip(m.iter()).position(|(a, b)| a != b).unwrap();
        panic!("{what}: the volume differs from the model at byte {at}");
    }
}

fn run_threads(volume: &Arc<Volume>, model: &Arc<Mutex<Vec<u8>>>, seed: u64, ops: usize) {
    run_threads_flushing(volume, model, seed, ops, true)
}

fn run_threads_flushing(
    volume: &Arc<Volume>,
    model: &Arc<Mutex<Vec<u8>>>,
    seed: u64,
    ops: usize,
    flushes: bool,
) {
    std::thread::scope(|s| {
        for lane in 0..4 {
            let (volume, model) = (Arc::clone(volume), Arc::clone(model));
            s.spawn(move || worker(&volume, &model, (lane, 4), seed + lane, ops, flushes));
        }
    });
}

#[test]
fn a_volume_matches_its_model_in_every_mode_across_switches_and_reopens() {
    // On tmpfs where there is one, as a write log on the persistent tier would be, so
    // that writes also take the in-memory path (`write_at_once`).
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let size = 512 * BS;
    let backend = MemBackend::new(size);
    let model = Arc::new(Mutex::new(vec![0u8; size as usize]));
    let mut current_cache = cache(16 << 20);
    let (mut volume, _) = Volume::open(
        config(dir.path(), Mode::WriteBack),
        backend.clone(),
        Arc::clone(&current_cache),
    )
    .unwrap();
    let modes = [
        Mode::WriteBack,
        Mode::WriteThrough,
        Mode::Storage,
        Mode::WriteBack,
        Mode::WriteAround,
        Mode::Storage,
        Mode::WriteBack,
    ];
    let mut bypassed = 0;
    for (round, mode) in modes.iter().enumerate() {
        volume.set_mode(*mode);
        run_threads(&volume, &model, 100 * round as u64 + 1, 600);
        // Without flushes no barrier holds large writes back from bypassing a congested
        // log (once the write-back has passed the earlier ones: a drain).
        if *mode == Mode::WriteBack {
            volume.drain(Duration::from_secs(30)).expect("drain");
        }
        run_threads_flushing(&volume, &model, 100 * round as u64 + 51, 300, false);
        check_all(&volume, &model, &format!("round {round} ({})", mode.name()));
        bypassed += volume.status().bypassed_writes;
        // Reopen: warm (the same cache) on even rounds, cold (a new one) on odd ones,
        // without a drain.
        volume.close();
        if round % 2 == 1 {
            current_cache = cache(16 << 20);
        }
        let (reopened, report) = Volume::open(
            config(dir.path(), *mode),
            backend.clone(),
            Arc::clone(&current_cache),
        )
        .unwrap();
        volume = reopened;
        check_all(
            &volume,
            &model,
            &format!("round {round} after reopen ({report:?})"),
        );
    }
    volume.drain(Duration::from_secs(30)).expect("drain");
    assert_eq!(volume.status().dirty_bytes, 0);
    assert!(
        *backend.bytes.lock() == *model.lock(),
        "after a drain the backend equals the model"
    );
    assert!(bypassed > 0, "some large writes bypassed a congested log");
    volume.close();
}

#[test]
fn write_back_keeps_acknowledging_while_the_backend_fails_and_drains_after() {
    let dir = tempfile::tempdir().unwrap();
    let size = 256 * BS;
    let backend = MemBackend::new(size);
    let mut cfg = config(dir.path(), Mode::WriteBack);
    cfg.log_bytes = 32 << 20;
    let (volume, _) = Volume::open(cfg, backend.clone(), cache(32 << 20)).unwrap();
    backend.fail_writes.store(1, Ordering::SeqCst);
    let model = Arc::new(Mutex::new(vec![0u8; size as usize]));
    run_threads(&volume, &model, 42, 150);
    std::thread::sleep(Duration::from_millis(200));
    let status = volume.status();
    assert!(status.dirty_bytes > 0, "writes stayed dirty");
    assert!(
        status.backend_errors > 0,
        "the write-back tried and counted failures"
    );
    assert!(status.last_error.is_some());
    check_all(&volume, &model, "reads while the backend fails");
    assert!(
        volume.drain(Duration::from_millis(300)).is_err(),
        "a drain cannot finish"
    );
    backend.fail_writes.store(0, Ordering::SeqCst);
    volume
        .drain(Duration::from_secs(30))
        .expect("drains once the backend is back");
    assert!(*backend.bytes.lock() == *model.lock());
    volume.close();
}

#[test]
fn a_full_log_makes_writes_wait_then_fail_with_enospc_not_hang() {
    let dir = tempfile::tempdir().unwrap();
    let size = 1024 * BS;
    let backend = MemBackend::new(size);
    let mut cfg = config(dir.path(), Mode::WriteBack);
    cfg.log_bytes = 256 << 10;
    cfg.full_wait = Duration::from_millis(200);
    let (volume, _) = Volume::open(cfg, backend.clone(), cache(32 << 20)).unwrap();
    backend.fail_writes.store(1, Ordering::SeqCst);
    let data = vec![7u8; BLOCK_SIZE];
    let mut result = Ok(());
    for b in 0..1024 {
        result = volume.write(b * BS, &data, false);
        if result.is_err() {
            break;
        }
    }
    let err = result.expect_err("the log filled");
    assert_eq!(err.errno(), libc::ENOSPC as u32, "{err}");
    backend.fail_writes.store(0, Ordering::SeqCst);
    volume.drain(Duration::from_secs(30)).unwrap();
    volume.write(0, &data, false).expect("room again");
    volume.close();
}

#[test]
fn a_write_that_fails_after_its_log_space_was_taken_blocks_nothing_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let backend = MemBackend::new(64 * BS);
    let (volume, _) = Volume::open(
        config(dir.path(), Mode::WriteBack),
        backend.clone(),
        cache(32 << 20),
    )
    .unwrap();
    // A partial-block write must read the block's old bytes: the backend refuses.
    backend.fail_reads.store(1, Ordering::SeqCst);
    let err = volume.write(5 * BS + 100, &[9u8; 10], false).unwrap_err();
    assert_eq!(err.errno(), libc::EIO as u32, "{err}");
    backend.fail_reads.store(0, Ordering::SeqCst);
    // Its reserved record was padded: later writes are acknowledged, and a reopen reads
    // the log past the pad.
    volume
        .write(7 * BS, &[7u8; BLOCK_SIZE], false)
        .expect("not stuck behind the failure");
    volume.close();
    let (volume, report) = Volume::open(
        config(dir.path(), Mode::WriteBack),
        backend.clone(),
        cache(32 << 20),
    )
    .unwrap();
    assert_eq!(report.dirty_blocks, 1, "{report:?}");
    let mut got = vec![0u8; BLOCK_SIZE];
    volume.read(7 * BS, &mut got).unwrap();
    assert_eq!(got, vec![7u8; BLOCK_SIZE]);
    volume.read(5 * BS, &mut got).unwrap();
    assert_eq!(got, vec![0u8; BLOCK_SIZE], "the failed write left nothing");
    volume.close();
}

#[test]
fn bad_requests_get_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let backend = MemBackend::new(64 * BS);
    let (volume, _) = Volume::open(
        config(dir.path(), Mode::ReadOnly),
        backend.clone(),
        cache(32 << 20),
    )
    .unwrap();
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        volume.read(63 * BS + 1, &mut buf).unwrap_err().errno(),
        libc::EINVAL as u32
    );
    assert_eq!(
        volume.read(u64::MAX - 10, &mut buf).unwrap_err().errno(),
        libc::EINVAL as u32
    );
    assert_eq!(
        volume.write(0, &buf, false).unwrap_err().errno(),
        libc::EPERM as u32
    );
    assert!(volume.is_read_only());
    volume.set_mode(Mode::WriteThrough);
    volume.write(0, &buf, false).unwrap();
    assert_eq!(
        volume
            .write_zeroes(60 * BS, 8 * BS, false)
            .unwrap_err()
            .errno(),
        libc::EINVAL as u32
    );
    volume.close();
    // A log made for another size is refused, not misread.
    let other = MemBackend::new(128 * BS);
    let err = Volume::open(config(dir.path(), Mode::WriteBack), other, cache(32 << 20))
        .err()
        .unwrap();
    assert!(err.to_string().contains("belongs to a volume"), "{err}");
}

#[test]
fn concurrent_writes_to_parts_of_the_same_blocks_all_survive() {
    // Eight threads write their own 512-byte sectors of the same 2 blocks, over and over,
    // in write-back (each partial write merges the block's other sectors): every
    // sector must end with its thread's last bytes, before and after a reopen.
    let dir = tempfile::tempdir().unwrap();
    let backend = MemBackend::new(64 * BS);
    let cfg = || VolumeConfig {
        log_bytes: 32 << 20,
        ..config(dir.path(), Mode::WriteBack)
    };
    let (volume, _) = Volume::open(cfg(), backend.clone(), cache(32 << 20)).unwrap();
    let last: Vec<Mutex<Vec<u8>>> = (0..8).map(|_| Mutex::new(Vec::new())).collect();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (volume, last) = (&volume, &last);
            s.spawn(move || {
                let mut rng = Rng(t + 1);
                for round in 0..2000u64 {
                    let block = round % 2;
                    let sector = t;
                    let data = vec![(rng.next() as u8) | 1; 512];
                    volume
                        .write(block * BS + sector * 512, &data, false)
                        .expect("write");
                    let mut l = last[t as usize].lock();
                    l.resize(8 * 8 * 512, 0);
                    let at = ((block * 8 + sector) * 512) as usize;
                    l[at..at + 512].copy_from_slice(&data);
                }
            });
        }
    });
    let check = |volume: &Volume, when: &str| {
        let mut got = vec![0u8; 8 * BLOCK_SIZE];
        volume.read(0, &mut got).unwrap();
        for (t, l) in last.iter().enumerate() {
            let l = l.lock();
            for sector in [t] {
                for block in 0..2 {
                    let at = (block * 8 + sector) * 512;
                    assert!(
                        got[at..at + 512] == l[at..at + 512],
                        "{when}: block {block} sector {sector} lost thread {t}'s write"
                    );
                }
            }
        }
    };
    check(&volume, "before the reopen");
    volume.close();
    let (volume, _) = Volume::open(cfg(), backend.clone(), cache(32 << 20)).unwrap();
    check(&volume, "after the reopen");
    volume.drain(Duration::from_secs(30)).unwrap();
    volume.close();
    let (volume, _) = Volume::open(cfg(), backend.clone(), cache(32 << 20)).unwrap();
    check(&volume, "from the backend");
    volume.close();
}

#[test]
fn large_writes_bypass_a_congested_log_only_while_no_barrier_is_pending() {
    let dir = tempfile::tempdir().unwrap();
    let size = 256 * BS;
    for ack in [AckDurability::OnWrite, AckDurability::OnFlush] {
        let backend = MemBackend::new(size);
        let mut cfg = config(dir.path(), Mode::WriteBack);
        cfg.log_path = dir.path().join(format!("{ack:?}.log"));
        cfg.ack = ack;
        cfg.high_watermark = 0.0; // always congested
        cfg.low_watermark = 0.0;
        let (volume, _) = Volume::open(cfg, backend.clone(), cache(16 << 20)).unwrap();
        // No barrier: a large write goes straight to the backend, and is durable there
        // before its reply when acknowledged on write.
        let large = vec![0xA5u8; 4 * BLOCK_SIZE];
        let flushes = backend.flushes.load(Ordering::SeqCst);
        volume.write(8 * BS, &large, false).unwrap();
        let status = volume.status();
        assert_eq!(status.bypassed_writes, 1, "{ack:?}");
        assert_eq!(status.dirty_bytes, 0, "{ack:?}: nothing logged");
        assert_eq!(
            backend.bytes.lock()[8 * BLOCK_SIZE..12 * BLOCK_SIZE],
            large[..]
        );
        let flushed = backend.flushes.load(Ordering::SeqCst) - flushes;
        match ack {
            AckDurability::OnWrite => assert!(flushed >= 1, "flushed before the reply"),
            AckDurability::OnFlush => assert_eq!(flushed, 0, "flushed at the next FLUSH"),
        }
        // A small write and a flush leave a barrier the write-back cannot pass while the
        // backend's writes are held: a large write must not overtake the records before
        // it (V5), so it goes through the log and returns while the backend is held.
        let gate = backend.gate.write();
        volume.write(100 * BS, &[1u8; BLOCK_SIZE], false).unwrap();
        volume.flush().unwrap();
        let (done, waiting) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let (volume, large, done) = (&volume, &large, done);
            s.spawn(move || {
                volume.write(20 * BS, large, false).unwrap();
                done.send(()).unwrap();
            });
            let answered = waiting.recv_timeout(Duration::from_secs(10));
            drop(gate);
            answered.expect("the large write was logged, not sent to the held backend");
        });
        assert_eq!(volume.status().bypassed_writes, 1, "{ack:?}");
        volume.drain(Duration::from_secs(30)).unwrap();
        let mut got = vec![0u8; 4 * BLOCK_SIZE];
        volume.read(20 * BS, &mut got).unwrap();
        assert_eq!(got, large);
        assert_eq!(
            backend.bytes.lock()[20 * BLOCK_SIZE..24 * BLOCK_SIZE],
            large[..]
        );
        // Once the barriers are released, a large write over a dirty block still goes
        // through the log (V4): the write-back would write the older record over it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while volume.status().log.used > 0 {
            assert!(std::time::Instant::now() < deadline, "the log empties");
            std::thread::sleep(Duration::from_millis(5));
        }
        let gate = backend.gate.write();
        volume.write(200 * BS, &[2u8; BLOCK_SIZE], false).unwrap();
        let (done, waiting) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let (volume, large, done) = (&volume, &large, done);
            s.spawn(move || {
                volume.write(198 * BS, large, false).unwrap();
                done.send(()).unwrap();
            });
            let answered = waiting.recv_timeout(Duration::from_secs(10));
            drop(gate);
            answered.expect("the large write over a dirty block was logged");
        });
        assert_eq!(volume.status().bypassed_writes, 1, "{ack:?}");
        volume.drain(Duration::from_secs(30)).unwrap();
        assert_eq!(
            backend.bytes.lock()[198 * BLOCK_SIZE..202 * BLOCK_SIZE],
            large[..]
        );
        volume.close();
    }
}

#[test]
fn storage_mode_keeps_the_volume_in_the_log_compacting_it_and_never_writes_the_backend() {
    let dir = tempfile::tempdir().unwrap();
    let size = 1024 * BS;
    let backend = MemBackend::new(size);
    let open = |backend: &Arc<MemBackend>| {
        let mut cfg = config(dir.path(), Mode::Storage);
        cfg.log_bytes = 1 << 20;
        cfg.high_watermark = 0.5;
        cfg.low_watermark = 0.3;
        cfg.full_wait = Duration::from_millis(300);
        Volume::open(cfg, backend.clone(), cache(16 << 20))
            .unwrap()
            .0
    };
    let volume = open(&backend);
    let model = Arc::new(Mutex::new(vec![0u8; size as usize]));
    // 32 blocks written over and over: 25 times the log's size, never the backend's.
    let mut rng = Rng(9);
    for round in 0..200u64 {
        for b in 0..32u64 {
            let block = b * 7 % 1024;
            if round % 17 == 3 && b % 5 == 0 {
                volume.write_zeroes(block * BS, BS, false).unwrap();
                model.lock()[(block * BS) as usize..((block + 1) * BS) as usize].fill(0);
            } else {
                let data: Vec<u8> = (0..BS).map(|_| rng.next() as u8).collect();
                volume
                    .write(block * BS, &data, false)
                    .unwrap_or_else(|e| panic!("{e}: {:?}", volume.status()));
                model.lock()[(block * BS) as usize..((block + 1) * BS) as usize]
                    .copy_from_slice(&data);
            }
        }
        if round % 50 == 49 {
            volume.flush().unwrap(); // barriers too
        }
    }
    check_all(&volume, &model, "storage mode after 200 rounds");
    let status = volume.status();
    assert!(
        status.batches_compacted > 0,
        "the log compacted: {status:?}"
    );
    assert_eq!(backend.writes.load(Ordering::SeqCst), 0, "no backend write");
    // Reopened (as after a crash: nothing drained), the log still holds the volume.
    volume.close();
    let volume = open(&backend);
    check_all(&volume, &model, "storage mode after a reopen");
    assert_eq!(backend.writes.load(Ordering::SeqCst), 0, "no backend write");
    // More live data than the log holds: writes wait, then fail with ENOSPC, never hang.
    let data = vec![3u8; BLOCK_SIZE];
    let mut result = Ok(());
    for b in 100..1024 {
        result = volume.write(b * BS, &data, false);
        if result.is_err() {
            break;
        }
        model.lock()[(b * BS) as usize..((b + 1) * BS) as usize].copy_from_slice(&data);
    }
    let err = result.expect_err("the log filled with live blocks");
    assert_eq!(err.errno(), libc::ENOSPC as u32, "{err}");
    assert_eq!(backend.writes.load(Ordering::SeqCst), 0, "no backend write");
    check_all(&volume, &model, "storage mode with a full log");
    // `terrace volume flush` (a drain) writes the volume to the backend.
    volume.drain(Duration::from_secs(30)).unwrap();
    assert!(
        *backend.bytes.lock() == *model.lock(),
        "drained: the backend is the volume"
    );
    volume.close();
}

#[test]
fn promotion_by_hits_caches_a_block_on_its_nth_miss() {
    let dir = tempfile::tempdir().unwrap();
    for after in [1u32, 3] {
        let backend = MemBackend::new(64 * BS);
        backend
            .bytes
            .lock()
            .iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8);
        let mut cfg = config(dir.path(), Mode::WriteThrough);
        cfg.log_path = dir.path().join(format!("promote-{after}.log"));
        cfg.promote_after = after;
        let (volume, _) = Volume::open(cfg, backend.clone(), cache(16 << 20)).unwrap();
        let mut buf = vec![0u8; BLOCK_SIZE];
        for read in 1..=after + 1 {
            volume.read(5 * BS, &mut buf).unwrap();
            assert_eq!(buf, backend.bytes.lock()[5 * BLOCK_SIZE..6 * BLOCK_SIZE]);
            let status = volume.status();
            let misses = u64::from(read.min(after));
            assert_eq!(
                status.read_miss_blocks, misses,
                "after {after}, read {read}"
            );
            assert_eq!(status.read_hit_blocks, u64::from(read) - misses);
        }
        volume.close();
    }
}

#[test]
fn a_large_trim_in_write_back_zeroes_the_backend_without_a_dirty_entry_per_block() {
    let dir = tempfile::tempdir().unwrap();
    let size = 4096 * BS;
    let backend = MemBackend::new(size);
    backend.bytes.lock().fill(0x77);
    let (volume, _) = Volume::open(
        config(dir.path(), Mode::WriteBack),
        backend.clone(),
        cache(16 << 20),
    )
    .unwrap();
    let mut got = vec![0u8; BLOCK_SIZE];
    volume.read(5 * BS, &mut got).unwrap(); // cached now: the trim must drop it
    volume.trim(0, size / 2, false).unwrap();
    let status = volume.status();
    assert_eq!(status.dirty_bytes, 0, "no dirty entries: {status:?}");
    assert_eq!(status.bypassed_writes, 1);
    assert!(backend.bytes.lock()[..(size / 2) as usize]
        .iter()
        .all(|&b| b == 0));
    volume.read(5 * BS, &mut got).unwrap();
    assert!(
        got.iter().all(|&b| b == 0),
        "the cached copy went with the trim"
    );
    // With a barrier pending (the write-back held), a large trim goes through the log.
    let gate = backend.gate.write();
    volume.write(3000 * BS, &[1u8; BLOCK_SIZE], false).unwrap();
    volume.flush().unwrap();
    volume.trim(3200 * BS, 256 * BS, false).unwrap();
    let status = volume.status();
    assert_eq!(status.bypassed_writes, 1, "{status:?}");
    assert_eq!(status.dirty_bytes, 257 * BS, "{status:?}");
    drop(gate);
    volume.drain(Duration::from_secs(30)).unwrap();
    assert!(
        backend.bytes.lock()[(3200 * BS) as usize..(3456 * BS) as usize]
            .iter()
            .all(|&b| b == 0)
    );
    volume.close();
}

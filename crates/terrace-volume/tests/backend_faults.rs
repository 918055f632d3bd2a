//! Backend faults, with nbdkit's `error` filter in front of a file as the backend (the
//! volume reaches it through `NbdBackend`): while the error file exists every backend
//! write fails with EIO.
//! - write-through: the client gets EIO, cached reads still hit, nothing cached is stale;
//! - write-back: writes keep being acknowledged into the log, the failures are counted,
//!   a drain cannot finish; once the error file is gone the log drains and the backend
//!   file holds exactly what was written.
//!
//! Needs nbdkit (Debian package nbdkit): skipped with a loud message without it, unless
//! TERRACE_REQUIRE_TOOLS=1 (CI), which makes a missing tool a failure.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use terrace_cache::{Cache, CacheConfig, TierConfig, TierSize};
use terrace_volume::nbd::NbdBackend;
use terrace_volume::{Export, Mode, Volume, VolumeConfig, BLOCK_SIZE};

const BS: u64 = BLOCK_SIZE as u64;
const SIZE: u64 = 256 * BS;

fn nbdkit() -> Option<PathBuf> {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|d| d.join("nbdkit"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("TERRACE_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "nbdkit is not installed and TERRACE_REQUIRE_TOOLS=1"
        );
        eprintln!("*** SKIPPED: nbdkit not found (apt-get install nbdkit)");
    }
    found
}

/// nbdkit in the foreground, killed when dropped.
struct Nbdkit(Child);
impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_nbdkit(bin: &Path, dir: &Path) -> (Nbdkit, String) {
    let sock = dir.join("be.sock");
    let child = Command::new(bin)
        .arg("-f")
        .arg("-U")
        .arg(&sock)
        .args(["--filter=error", "file"])
        .arg(dir.join("backend.img"))
        .args([
            "error=EIO",
            "error-pwrite-rate=100%",
            "error-trim-rate=100%",
        ])
        .arg("error-zero-rate=100%")
        .arg(format!("error-file={}", dir.join("broken").display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nbdkit");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "nbdkit did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    (
        Nbdkit(child),
        format!("nbd+unix:///?socket={}", sock.display()),
    )
}

fn volume(dir: &Path, uri: &str, mode: Mode) -> Arc<Volume> {
    let backend = Arc::new(NbdBackend::connect(uri, 4).expect("connect"));
    let cache = CacheConfig {
        movers: 1,
        ..CacheConfig::new(vec![TierConfig::dram(TierSize::Bytes(32 << 20))])
    };
    let cache = Arc::new(Cache::open(cache).unwrap().0);
    let config = VolumeConfig {
        mode,
        log_bytes: 8 << 20,
        idle_writeback: Duration::from_millis(20),
        ..VolumeConfig::new("v", 1, dir.join("v.log"))
    };
    Volume::open(config, backend, cache).unwrap().0
}

fn setup() -> Option<(tempfile::TempDir, PathBuf)> {
    let bin = nbdkit()?;
    let dir = tempfile::tempdir().unwrap();
    std::fs::File::create(dir.path().join("backend.img"))
        .unwrap()
        .set_len(SIZE)
        .unwrap();
    Some((dir, bin))
}

#[test]
fn write_through_returns_eio_from_a_failing_backend_and_keeps_serving_cached_reads() {
    let Some((dir, bin)) = setup() else { return };
    let (_nbdkit, uri) = start_nbdkit(&bin, dir.path());
    let v = volume(dir.path(), &uri, Mode::WriteThrough);
    let old = vec![1u8; BLOCK_SIZE];
    v.write(0, &old, false).unwrap();
    std::fs::write(dir.path().join("broken"), b"").unwrap();
    let err = v.write(0, &[2u8; BLOCK_SIZE], false).unwrap_err();
    assert_eq!(err.errno(), libc::EIO as u32, "{err}");
    assert!(v.status().backend_errors > 0);
    // The failed write dropped the cached copy first (V2); the block reads from the
    // backend, which kept the old bytes — never the unacknowledged new ones.
    let mut got = vec![0u8; BLOCK_SIZE];
    v.read(0, &mut got).unwrap();
    assert_eq!(got, old);
    // Other cached blocks still read while the backend fails.
    std::fs::remove_file(dir.path().join("broken")).unwrap();
    v.write(BS, &[3u8; BLOCK_SIZE], false).unwrap();
    std::fs::write(dir.path().join("broken"), b"").unwrap();
    v.read(BS, &mut got).unwrap();
    assert_eq!(got, vec![3u8; BLOCK_SIZE]);
    v.close();
}

#[test]
fn write_back_acknowledges_into_the_log_while_the_backend_fails_and_drains_after() {
    let Some((dir, bin)) = setup() else { return };
    let (_nbdkit, uri) = start_nbdkit(&bin, dir.path());
    let v = volume(dir.path(), &uri, Mode::WriteBack);
    std::fs::write(dir.path().join("broken"), b"").unwrap();
    let mut model = vec![0u8; SIZE as usize];
    for i in 0..200u64 {
        let block = (i * 37) % (SIZE / BS);
        let data = vec![(i % 251) as u8 + 1; BLOCK_SIZE];
        v.write(block * BS, &data, false)
            .expect("acknowledged into the log");
        model[(block * BS) as usize..((block + 1) * BS) as usize].copy_from_slice(&data);
    }
    v.write_zeroes(10 * BS, 4 * BS, false).unwrap();
    model[(10 * BS) as usize..(14 * BS) as usize].fill(0);
    v.flush().expect("a flush is durable in the log");
    std::thread::sleep(Duration::from_millis(300));
    let status = v.status();
    assert!(
        status.dirty_bytes > 0 && status.backend_errors > 0,
        "{status:?}"
    );
    assert!(
        v.drain(Duration::from_millis(500)).is_err(),
        "no drain through a dead backend"
    );
    let mut got = vec![0u8; SIZE as usize];
    v.read(0, &mut got).unwrap();
    assert!(got == model, "reads come from the log meanwhile");
    std::fs::remove_file(dir.path().join("broken")).unwrap();
    v.drain(Duration::from_secs(30))
        .expect("drains once the backend is back");
    assert_eq!(v.status().dirty_bytes, 0);
    v.close();
    let on_disk = std::fs::read(dir.path().join("backend.img")).unwrap();
    assert!(
        on_disk == model,
        "the backend holds exactly what was written"
    );
}

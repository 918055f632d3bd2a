//! Kill test of `terrace serve-volume`, black box: fio (`ioengine=nbd`) writes random
//! 4 KiB blocks with `verify=crc32c` to a volume over a zeroed backend file; fio's trigger
//! saves which writes were acknowledged and SIGKILLs the server, 1 or 2 s into the run;
//! after a restart fio verifies every one of them (`verify_state_load`). A few rounds per mode here;
//! `bench/volume-kill-soak.sh` runs many, and the same rounds against nbdkit's cache
//! filter, which loses writes (the negative control).
//!
//! Needs fio (Debian package fio): skipped with a loud message without it, unless
//! TERRACE_REQUIRE_TOOLS=1 (CI), which makes a missing tool a failure.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{require_tool, run_with_timeout, terrace_bin, ChildGuard};

const VOLUME_BYTES: u64 = 1 << 30;

/// Starts `terrace serve-volume` and waits until its NBD socket accepts.
fn start(dir: &Path, backend: &Path, mode: &str) -> ChildGuard {
    let sock = dir.join("nbd.sock");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .unwrap();
    let child = Command::new(terrace_bin())
        .args([
            "serve-volume",
            "--mode",
            mode,
            "--tiers",
            "dram:32MiB",
            "--log-size",
            "64MiB",
        ])
        .arg("--backend")
        .arg(format!("file:{}", backend.display()))
        .arg("--dir")
        .arg(dir)
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting terrace serve-volume");
    let mut guard = ChildGuard::new("serve-volume", child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::os::unix::net::UnixStream::connect(&sock).is_ok() {
            return guard;
        }
        assert!(guard.running(), "serve-volume exited:\n{}", server_log(dir));
        assert!(
            Instant::now() < deadline,
            "serve-volume did not listen:\n{}",
            server_log(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn server_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
}

fn fio_job(fio: &Path, dir: &Path, extra: &[&str]) -> Command {
    let mut cmd = Command::new(fio);
    cmd.current_dir(dir)
        .arg("--name=kill")
        .arg("--ioengine=nbd")
        .arg(format!(
            "--uri=nbd+unix:///volume?socket={}",
            dir.join("nbd.sock").display()
        ))
        .args([
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--verify=crc32c",
        ])
        .arg(format!("--size={VOLUME_BYTES}"))
        .args(extra);
    cmd
}

fn backend_file(dir: &Path) -> PathBuf {
    let path = dir.join("backend.img");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(VOLUME_BYTES).unwrap(); // zeroes: a lost write cannot hide behind old data
    path
}

fn kill_rounds(mode: &str, rounds: u64) {
    let Some(fio) = require_tool("fio", "fio") else {
        return;
    };
    for round in 0..rounds {
        let dir = tempfile::Builder::new()
            .prefix("terrace-kill")
            .tempdir_in("/var/tmp")
            .unwrap();
        let backend = backend_file(dir.path());
        let mut server = start(dir.path(), &backend, mode);
        // fio saves which writes were acknowledged, then runs the trigger: kill -9 of the
        // server, 1 or 2 s into the run (fio's own crash-test recipe).
        let trigger = format!("--trigger=kill -9 {}", server.pid());
        let timeout = format!("--trigger-timeout={}", 1 + round % 2);
        let args = ["--verify_state_save=1", "--do_verify=0", &timeout, &trigger];
        let wrote = run_with_timeout(fio_job(&fio, dir.path(), &args), Duration::from_secs(120));
        assert!(
            !wrote.timed_out,
            "fio did not stop after the server died\n{}",
            wrote.text()
        );
        let killed = server.wait_timeout(Duration::from_secs(10));
        assert!(
            killed.is_some(),
            "{mode}, round {round}: the run ended before the trigger killed the server\n{}",
            wrote.text()
        );
        let mut server = start(dir.path(), &backend, mode);
        let verify = fio_job(
            &fio,
            dir.path(),
            &["--verify_only=1", "--verify_state_load=1"],
        );
        let done = run_with_timeout(verify, Duration::from_secs(120));
        assert!(
            done.success() && !done.stdout.contains("verify: bad"),
            "{mode}, round {round}: fio found lost or wrong writes after kill -9\n{}\n--- server ---\n{}",
            done.text(),
            server_log(dir.path())
        );
        server.signal(libc::SIGTERM);
        assert!(
            server.wait_timeout(Duration::from_secs(20)).is_some(),
            "no clean stop"
        );
    }
}

#[test]
#[ignore = "known bug (issue 23): about one write-back round in four loses up to ~16 \
            acknowledged writes that never reached the log; nbdkit's file plugin passes \
            the same recipe; run with --ignored while fixing it"]
fn write_back_loses_no_acknowledged_write_to_kill_9() {
    kill_rounds("write-back", 3);
}

#[test]
fn write_through_loses_no_acknowledged_write_to_kill_9() {
    kill_rounds("write-through", 2);
}

#[test]
fn write_around_loses_no_acknowledged_write_to_kill_9() {
    kill_rounds("write-around", 2);
}

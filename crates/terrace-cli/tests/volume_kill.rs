//! Kill tests of `terrace serve-volume`, black box. Sixteen writer threads, each with its
//! own blocks, write 4 KiB blocks over NBD (our NBD client, 16 connections) to a volume
//! over a zeroed backend file, each block stamped with its number, a write count and a
//! checksum, and record which write of each block was acknowledged; the server is
//! SIGKILLed 0.4 to 1.2 s in; after a restart every block must hold its last
//! acknowledged write or the one after it (in flight at the kill), never an older one,
//! zeroes or a torn block. Three rounds per mode.
//!
//! fio's own recipe (`verify_state_save` at each job's exit, `verify_only` after the
//! restart) is `bench/volume-kill-soak.sh`, 20 rounds per mode: 16 jobs at iodepth 1, as
//! fio 3.33 (Debian 12) records only a job's last iodepth completions, so at a deeper
//! queue a write completed out of order is verified as if acknowledged.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{read_stamp, serve_volume_log, stamp, start_serve_volume, ChildGuard};

/// Starts `terrace serve-volume` in `mode` over `backend` and waits until its NBD
/// socket accepts.
fn start(dir: &Path, backend: &Path, mode: &str) -> ChildGuard {
    let sock = dir.join("nbd.sock");
    let args: Vec<String> = [
        "--mode",
        mode,
        "--backend",
        &format!("file:{}", backend.display()),
        "--listen",
        &format!("unix:{}", sock.display()),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    start_serve_volume(dir, &args, sock.to_str().unwrap())
}

const BLOCKS: u64 = 4096;
const WRITERS: u64 = 16;
const BS: usize = 4096;

fn kill_rounds(mode: &str, rounds: u64) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use terrace_volume::Backend;
    for round in 0..rounds {
        let dir = tempfile::Builder::new()
            .prefix("terrace-kill")
            .tempdir_in("/var/tmp")
            .unwrap();
        let backend = dir.path().join("backend.img");
        std::fs::File::create(&backend)
            .unwrap()
            .set_len(BLOCKS * BS as u64)
            .unwrap();
        let mut server = start(dir.path(), &backend, mode);
        let uri = format!(
            "nbd+unix:///volume?socket={}",
            dir.path().join("nbd.sock").display()
        );
        let client = terrace_volume::nbd::NbdBackend::connect_with_timeout(
            &uri,
            WRITERS as usize,
            Duration::from_secs(10),
        )
        .expect("connect");
        let acked: Vec<AtomicU64> = (0..BLOCKS).map(|_| AtomicU64::new(0)).collect();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for t in 0..WRITERS {
                let (client, acked, stop) = (&client, &acked, &stop);
                s.spawn(move || {
                    let mut x = t * 7919 + round + 1;
                    while !stop.load(Ordering::Relaxed) {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let block = (x % (BLOCKS / WRITERS)) * WRITERS + t;
                        let count = acked[block as usize].load(Ordering::Relaxed) + 1;
                        if client
                            .write_at(block * BS as u64, &stamp(block, count))
                            .is_err()
                        {
                            return; // the server is gone
                        }
                        acked[block as usize].store(count, Ordering::Relaxed);
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(400 + (round * 397) % 800));
            server.kill9();
            stop.store(true, Ordering::Relaxed);
        });
        drop(client);
        let mut server = start(dir.path(), &backend, mode);
        let client = terrace_volume::nbd::NbdBackend::connect(&uri, 1).expect("reconnect");
        let mut buf = vec![0u8; BS];
        let mut written = 0;
        for block in 0..BLOCKS {
            let want = acked[block as usize].load(Ordering::Relaxed);
            client
                .read_at(block * BS as u64, &mut buf)
                .expect("read after restart");
            let got = read_stamp(block, &buf);
            assert!(
                got == want || got == want + 1,
                "{mode}, round {round}: block {block} holds write {got}, {want} was acknowledged\n{}",
                serve_volume_log(dir.path())
            );
            written += want;
        }
        assert!(
            written > 100,
            "{mode}, round {round}: only {written} writes before the kill"
        );
        drop(client);
        server.signal(libc::SIGTERM);
        assert!(
            server.wait_timeout(Duration::from_secs(20)).is_some(),
            "no clean stop"
        );
    }
}

#[test]
fn write_back_loses_no_acknowledged_write_to_kill_9() {
    kill_rounds("write-back", 3);
}

#[test]
fn write_through_loses_no_acknowledged_write_to_kill_9() {
    kill_rounds("write-through", 3);
}

#[test]
fn write_around_loses_no_acknowledged_write_to_kill_9() {
    kill_rounds("write-around", 3);
}

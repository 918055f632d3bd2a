//! The server's two socket I/O engines (`--io uring`, the default where the kernel allows
//! it, and `--io epoll`, the fallback): each must serve the same protocol, so the
//! conformance tool runs against the fallback here (the other server tests run on the
//! default), and the cases where the engines' own code decides — pipelined bursts larger
//! than the reply buffer, a half-closed client, replies nobody reads at shutdown — run on
//! both.

mod common;

use std::process::Command;
use std::time::Duration;

use common::Server;

/// The engines this machine can run: epoll always; io_uring where the default chose it.
fn engines() -> Vec<&'static str> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);
    let engine = server.stats()["terrace_io_engine"].clone();
    let mut engines = vec!["epoll"];
    if engine == "io_uring" {
        engines.push("uring");
    } else {
        assert_eq!(engine, "epoll");
        assert!(
            server.log_text().contains("io_uring is not available"),
            "fell back to epoll without saying why:\n{}",
            server.log_text()
        );
        eprintln!("io_uring is not available here: only the epoll engine is tested");
    }
    server.terminate();
    engines
}

fn start(dir: &std::path::Path, engine: &str) -> Server {
    let server = common::start(dir, &["--io", engine]);
    let expected = if engine == "uring" {
        "io_uring"
    } else {
        engine
    };
    assert_eq!(server.stats()["terrace_io_engine"], expected);
    server
}

#[test]
fn the_engine_is_chosen_reported_and_validated() {
    let engines = engines();
    for engine in &engines {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut server = start(dir.path(), engine);
        assert_eq!(server.connect().set("k", b"v"), "STORED");
        assert_eq!(server.connect().get("k").as_deref(), Some(&b"v"[..]));
        assert!(server.terminate().success());
    }
    let out = common::run_with_timeout(
        {
            let mut cmd = Command::new(common::terrace_bin());
            cmd.args(["serve", "--io", "kqueue", "--listen", "127.0.0.1:0"]);
            cmd
        },
        Duration::from_secs(20),
    );
    assert!(!out.success(), "an unknown engine was accepted");
    assert!(
        out.text().contains("kqueue") && !out.text().contains("panicked"),
        "no clear error for an unknown engine:\n{}",
        out.text()
    );
}

#[test]
fn memccapable_passes_on_the_epoll_fallback() {
    let Some(tool) = common::require_tool("memccapable", "libmemcached-tools") else {
        return;
    };
    for mode in ["-a", "-b"] {
        let dir = tempfile::tempdir().expect("temporary directory");
        let server = start(dir.path(), "epoll");
        let mut cmd = Command::new(&tool);
        cmd.args(["-h", "127.0.0.1", "-p", &server.port().to_string()]);
        cmd.args(["-t", "10", mode]);
        let out = common::run_with_timeout(cmd, Duration::from_secs(120));
        assert!(
            out.success() && out.stdout.contains("All tests passed"),
            "memccapable {mode} failed on epoll:\n{}\n{}",
            out.text(),
            server.log_text()
        );
    }
}

/// 3,000 sets and 3,000 gets of 200-byte values in one write (more than the reply
/// buffer holds, so the server must stop handling requests until its replies drain),
/// then a half-close: every reply comes back, in order, before the server closes.
#[test]
fn a_pipelined_burst_then_half_close_gets_every_reply_in_order() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut server = start(dir.path(), engine);
        let value = |i: usize| format!("{i:0>200}");
        let mut burst = Vec::new();
        for i in 0..3000 {
            burst.extend_from_slice(format!("set key{i} 0 0 200\r\n{}\r\n", value(i)).as_bytes());
        }
        for i in 0..3000 {
            burst.extend_from_slice(format!("get key{i} key{i} key{i}\r\n").as_bytes());
        }
        let mut expected = Vec::new();
        for _ in 0..3000 {
            expected.extend_from_slice(b"STORED\r\n");
        }
        for i in 0..3000 {
            for _ in 0..3 {
                expected.extend_from_slice(
                    format!("VALUE key{i} 0 200\r\n{}\r\n", value(i)).as_bytes(),
                );
            }
            expected.extend_from_slice(b"END\r\n");
        }
        let mut c = server.connect();
        // Write from another thread: the replies (1.9 MB) exceed the socket buffers, so
        // reading and writing must overlap.
        let mut writer = c.try_clone_stream();
        let sender = std::thread::spawn(move || {
            use std::io::Write;
            writer.write_all(&burst).expect("writing the burst");
            match &writer {
                common::Stream::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
                common::Stream::Unix(s) => s.shutdown(std::net::Shutdown::Write),
            }
            .expect("half-closing");
        });
        let got = c.read_to_close(Duration::from_secs(30));
        sender.join().expect("writer thread");
        assert_eq!(
            got.len(),
            expected.len(),
            "{engine}: {} of {} reply bytes",
            got.len(),
            expected.len()
        );
        assert!(
            got == expected,
            "{engine}: replies differ from the requests' order"
        );
        server.assert_alive(engine);
    }
}

/// Clients that never read their replies leave sends waiting in the kernel; a SIGTERM
/// must still stop the server cleanly (its operations cancelled, the index saved).
#[test]
fn a_stop_with_sends_waiting_on_clients_is_clean() {
    for engine in engines() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut server = start(dir.path(), engine);
        let value = vec![b'x'; 512 * 1024];
        assert_eq!(server.connect().set("big", &value), "STORED");
        let mut stuck = Vec::new();
        for _ in 0..8 {
            let mut c = server.connect();
            c.send(b"get big\r\n".repeat(64).as_slice());
            stuck.push(c);
        }
        std::thread::sleep(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let status = server.terminate();
        assert!(
            status.success(),
            "{engine}: the stop was not clean ({status:?}):\n{}",
            server.log_text()
        );
        assert!(
            server.log_text().contains("clean shutdown"),
            "{engine}: no clean shutdown:\n{}",
            server.log_text()
        );
        eprintln!("{engine}: stopped in {:?}", started.elapsed());
        drop(stuck);
    }
}

/// Large values go out of the cache in place on io_uring (referenced, not copied) and
/// fall back to a copy when the client's socket is full. Slow readers of multigets of
/// 4 KiB – 600 KiB values, while a writer overwrites the same keys, must each get whole
/// values of some version, byte for byte — never a mix, never a value changed under
/// the send.
#[test]
fn large_values_read_slowly_while_overwritten_arrive_whole() {
    const KEYS: usize = 12;
    let size = |k: usize| 4096 + k * 50_000;
    for engine in engines() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut server = start(dir.path(), engine);
        let keys: Vec<String> = (0..KEYS).map(|k| format!("large{k}")).collect();
        {
            let mut c = server.connect();
            for (k, key) in keys.iter().enumerate() {
                assert_eq!(
                    c.set(key, &common::versioned_value(key, 0, size(k))),
                    "STORED"
                );
            }
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (keys, stop) = (keys.clone(), stop.clone());
            let mut c = server.connect();
            std::thread::spawn(move || {
                let mut version = 1;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    for (k, key) in keys.iter().enumerate() {
                        let v = common::versioned_value(key, version, size(k));
                        assert_eq!(c.set(key, &v), "STORED");
                    }
                    version += 1;
                }
                version
            })
        };
        let readers: Vec<_> = (0..3)
            .map(|r| {
                let keys = keys.clone();
                let mut c = server.connect();
                std::thread::spawn(move || {
                    for round in 0..4 {
                        let line = format!("get {}\r\n", keys.join(" "));
                        c.send(line.as_bytes());
                        // Let the socket fill so sends stop short, then read.
                        std::thread::sleep(Duration::from_millis(20 * (r + round) as u64));
                        let items = c.read_items();
                        assert_eq!(items.len(), KEYS, "reader {r} round {round}");
                        for (k, item) in items.iter().enumerate() {
                            assert_eq!(item.key, keys[k]);
                            let text = String::from_utf8_lossy(&item.value[..24]).into_owned();
                            let version: u64 = text
                                .split('|')
                                .nth(1)
                                .and_then(|v| v.strip_prefix('v'))
                                .and_then(|v| v.parse().ok())
                                .unwrap_or_else(|| panic!("no version in {text:?}"));
                            assert!(
                                item.value == common::versioned_value(&keys[k], version, size(k)),
                                "reader {r}: {} version {version} is not whole",
                                keys[k]
                            );
                        }
                    }
                })
            })
            .collect();
        for reader in readers {
            reader.join().expect("a reader failed");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let versions = writer.join().expect("the writer failed");
        eprintln!("{engine}: the writer wrote {versions} versions meanwhile");
        server.assert_alive(engine);
    }
}

/// A flash tier on the disk where there is one (`O_DIRECT`), else the temporary directory.
fn flash_dir() -> tempfile::TempDir {
    match std::path::Path::new("/var/tmp").is_dir() {
        true => tempfile::tempdir_in("/var/tmp").expect("a directory on /var/tmp"),
        false => tempfile::tempdir().expect("a temporary directory"),
    }
}

/// Gets of items on flash are read ahead of the worker's handling of them (on its ring,
/// or on a blocking thread; `stats` counts the staged reads and their use), and their
/// replies come back right and in order: pipelined single gets, a multi-key get, meta
/// gets, items longer than a first read, on both engines.
#[test]
fn flash_hits_are_read_off_the_worker_and_answered_in_order() {
    for engine in engines() {
        let dir = flash_dir();
        let mut server = common::start(
            dir.path(),
            &["--io", engine, "--tiers", "dram:32MiB,flash:64MiB"],
        );
        let mut c = server.connect();
        let keys: Vec<String> = (0..40_000).map(|i| format!("k{i}")).collect();
        // One key in ten has a value longer than a flash read's first two blocks.
        let value = |k: &str| {
            let len = if k.ends_with('7') {
                9000
            } else {
                700 + k.len() * 13
            };
            common::versioned_value(k, 1, len)
        };
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(c.set(k, &value(k)), "STORED");
            // One read soon after: the DRAM tier keeps (demotes) items with a hit.
            if i >= 8 {
                let earlier = &keys[i - 8];
                assert_eq!(c.get(earlier).as_deref(), Some(&value(earlier)[..]));
            }
        }
        let before = c.stats();
        assert!(
            common::stat_u64(&before, "tier_1_items") > 1000,
            "few items reached flash: {before:?}"
        );
        // Early keys are on flash by now: pipelined gets in one write.
        let early = &keys[..2000];
        let mut burst = Vec::new();
        for k in early {
            burst.extend_from_slice(format!("get {k}\r\n").as_bytes());
        }
        c.send(&burst);
        let mut hits = 0;
        for k in early {
            let items = c.read_items();
            assert!(items.len() <= 1, "{k}: {} items", items.len());
            if let Some(item) = items.first() {
                assert_eq!(item.key, *k, "replies out of order");
                assert_eq!(item.value, value(k), "{k}");
                hits += 1;
            }
        }
        let multi: Vec<String> = keys[2000..2100].to_vec();
        for (k, v) in c.get_multi(&multi) {
            assert_eq!(v, value(&k), "{k}");
        }
        for k in &keys[2100..2200] {
            let reply = c.cmd(&format!("mg {k} v k"));
            if reply.starts_with("EN") {
                continue;
            }
            assert!(
                reply.starts_with("VA ") && reply.ends_with(&format!("k{k}")),
                "{reply}"
            );
            let len: usize = reply.split(' ').nth(1).unwrap().parse().unwrap();
            let data = c.bytes(len + 2);
            assert_eq!(&data[..len], &value(k)[..], "{k}");
        }
        let after = c.stats();
        let staged = common::stat_u64(&after, "tier_1_flash_staged");
        let used = common::stat_u64(&after, "tier_1_flash_staged_used");
        eprintln!("{engine}: {hits} of 2000 pipelined gets hit; {staged} staged, {used} used");
        assert!(hits > 500, "{engine}: {hits} hits");
        assert!(staged > 0 && used > 0, "{engine}: {after:?}");
        assert!(server.terminate().success());
    }
}

/// With `--flash-sets`, small items move into flash sets; a get of one reads its set's
/// page ahead of the worker's handling of it (its ring, or a blocking thread) and gets
/// the right value, on both engines.
#[test]
fn set_pages_are_read_off_the_worker() {
    for engine in engines() {
        let dir = flash_dir();
        let mut server = common::start(
            dir.path(),
            &[
                "--io",
                engine,
                "--tiers",
                "dram:24MiB,flash:64MiB",
                "--flash-sets",
                "0.5",
            ],
        );
        let mut c = server.connect();
        let keys: Vec<String> = (0..200_000).map(|i| format!("s{i}")).collect();
        // Items of about 100 bytes: with sets the server sizes its index for items of
        // half the sets' largest (160 bytes), so even these do not outnumber its entries
        // and every fresh item is found.
        let value = |k: &str| common::versioned_value(k, 1, 40 + k.len() * 7);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(c.set(k, &value(k)), "STORED");
            if i >= 8 {
                let earlier = &keys[i - 8];
                assert_eq!(c.get(earlier).as_deref(), Some(&value(earlier)[..]));
            }
        }
        let mut burst = Vec::new();
        for k in &keys[..20_000] {
            burst.extend_from_slice(format!("get {k}\r\n").as_bytes());
        }
        c.send(&burst);
        for k in &keys[..20_000] {
            let items = c.read_items();
            if let Some(item) = items.first() {
                assert_eq!(item.key, *k, "replies out of order");
                assert_eq!(item.value, value(k), "{k}");
            }
        }
        let after = c.stats();
        let set_items = common::stat_u64(&after, "tier_1_flash_set_items");
        let set_hits = common::stat_u64(&after, "tier_1_flash_set_hits");
        let used = common::stat_u64(&after, "tier_1_flash_set_staged_used");
        eprintln!("{engine}: {set_items} items in sets, {set_hits} set hits, {used} pages staged and used");
        assert!(set_items > 10_000 && set_hits > 1000, "{engine}: {after:?}");
        // Every set hit found its page staged, but for a rare page rewritten between
        // the read ahead and the get.
        assert!(used * 10 >= set_hits * 9, "{engine}: {after:?}");
        assert!(server.terminate().success());
    }
}

//! The flash-tier engines of `cache`: foyer's hybrid cache on a temporary directory,
//! memcached over the meta protocol (a real memcached started on a free loopback port;
//! those tests pass, saying so, if it is not installed), a fake server whose values are
//! wrong or who never answers, the `/proc` sampling, and the flags each engine takes or
//! refuses.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{bench, free_port, is_root, memcached};

/// A small look-aside run (5000 keys, 30 000 ops, 2 threads) of `engine_args`; its JSON.
fn run(engine_args: &[&str]) -> (Output, Option<Value>) {
    let mut args = vec!["cache"];
    args.extend_from_slice(engine_args);
    args.extend_from_slice(&[
        "--keys",
        "5000",
        "--value-size",
        "64-4096",
        "--ops",
        "30000",
        "--threads",
        "2",
        "--json",
    ]);
    let out = bench(&args);
    let json = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).ok();
    (out, json)
}

fn ok(engine_args: &[&str]) -> Value {
    let (out, json) = run(engine_args);
    assert!(
        out.status.success(),
        "{engine_args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json.expect("one JSON object on stdout");
    assert_eq!(v["wrong_values"], 0);
    assert_eq!(v["ops"], 30000);
    assert!(v["hits"].as_u64().unwrap() > 0, "{v}");
    // The sampler's figures.
    assert!(v["samples"].as_u64().unwrap() >= 2, "{v}");
    assert!(v["peak_rss_sampled_bytes"].as_u64().unwrap() > 0, "{v}");
    assert!(v["peak_dram_bytes"].as_u64() >= v["peak_rss_sampled_bytes"].as_u64());
    let inserted = v["inserted_bytes"].as_u64().unwrap();
    assert!(inserted >= v["sets"].as_u64().unwrap() * (16 + 64), "{v}");
    v
}

fn is_empty_dir(p: &Path) -> bool {
    std::fs::read_dir(p).unwrap().next().is_none()
}

/// A foyer-hybrid run of 1 MiB of memory over 32 MiB of disk (1 MiB blocks) in `dir`.
fn foyer_hybrid(dir: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "--engine",
        "foyer-hybrid",
        "--capacity",
        "1MiB",
        "--flash",
        "32MiB",
        "--foyer-block-size",
        "1MiB",
        "--dir",
        dir,
    ];
    args.extend_from_slice(extra);
    ok(&args)
}

#[test]
fn foyer_hybrid_serves_hits_from_disk_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    // 1 MiB of memory holds ~500 of the 5000 items: the rest are on disk.
    let v = foyer_hybrid(d, &[]);
    assert_eq!(v["engine"], "foyer-hybrid");
    assert_eq!(v["tiers"], "dram:1MiB,flash:32MiB");
    assert_eq!(v["flash_bytes"], 32 << 20);
    let s = &v["engine_stats"];
    assert!(s["disk_write_bytes"].as_u64().unwrap() > 0, "{s}");
    assert!(s["disk_hits"].as_u64().unwrap() > 0, "{s}");
    assert!(s["disk_read_bytes"].as_u64().unwrap() > 0, "{s}");
    // The run's own directory was watched, then removed.
    let watched = v["files_watched"][0].as_str().unwrap();
    assert!(watched.starts_with(d), "{watched}");
    assert!(is_empty_dir(dir.path()));
}

#[test]
fn foyer_hybrid_clean_restart_keeps_its_items() {
    let dir = tempfile::tempdir().unwrap();
    let v = foyer_hybrid(dir.path().to_str().unwrap(), &["--restart"]);
    let r = &v["restart"];
    assert_eq!(r["mode"], "clean");
    assert_eq!(r["wrong_after"], 0);
    let before = r["keys_present_before"].as_u64().unwrap();
    let missing = r["missing_after"].as_u64().unwrap();
    assert!(before > 500, "{r}");
    // Most come back (foyer's `contains` may count a hash collision as present).
    assert!(missing * 10 < before, "{r}");
    assert!(is_empty_dir(dir.path()));
}

#[test]
fn terrace_with_a_flash_tier_is_sampled() {
    let dir = tempfile::tempdir().unwrap();
    let v = ok(&[
        "--engine",
        "terrace",
        "--capacity",
        "64MiB",
        "--tiers",
        "dram:32MiB,flash:32MiB",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(v["engine_stats"]["flash"].is_object(), "{v}");
    assert!(v["files_watched"][0]
        .as_str()
        .unwrap()
        .starts_with(dir.path().to_str().unwrap()));
    assert!(v["peak_page_cache_bytes"].is_u64() || v["peak_page_cache_bytes"].is_null());
    assert!(is_empty_dir(dir.path()));
}

#[test]
fn flags_each_engine_takes_or_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let cases: [(&[&str], &str); 9] = [
        (
            &["--engine", "foyer-hybrid", "--capacity", "1MiB", "--dir", d],
            "needs --flash",
        ),
        (
            &["--engine", "moka", "--capacity", "1MiB", "--flash", "1GiB"],
            "--flash applies to --engine foyer-hybrid only",
        ),
        (
            &[
                "--engine",
                "terrace",
                "--capacity",
                "1MiB",
                "--flash",
                "1GiB",
            ],
            "flash:SIZE",
        ),
        (&["--engine", "memcached"], "needs --server"),
        (
            &[
                "--engine",
                "moka",
                "--capacity",
                "1MiB",
                "--server",
                "127.0.0.1:1",
            ],
            "--server applies to --engine memcached only",
        ),
        (
            &[
                "--engine",
                "memcached",
                "--server",
                "127.0.0.1:1",
                "--capacity",
                "1MiB",
            ],
            "no --capacity",
        ),
        (&["--engine", "moka"], "needs --capacity"),
        (
            &[
                "--engine",
                "foyer",
                "--capacity",
                "1MiB",
                "--foyer-block-size",
                "1MiB",
            ],
            "foyer-hybrid only",
        ),
        (
            &[
                "--engine",
                "moka",
                "--capacity",
                "1MiB",
                "--pid",
                "999999999",
            ],
            "no such process",
        ),
    ];
    for (args, why) in cases {
        let (out, _) = run(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn memcached_engine_checks_every_value() {
    let Some(m) = memcached(&["-m", "64"]) else {
        return;
    };
    let pid = m.child.id().to_string();
    let v = ok(&["--engine", "memcached", "--server", &m.addr, "--pid", &pid]);
    assert_eq!(v["engine"], "memcached");
    assert_eq!(v["tiers"], format!("server:{}", m.addr));
    assert!(v["capacity_bytes"].is_null());
    assert_eq!(v["sampled_pid"], m.child.id());
    let s = &v["engine_stats"];
    assert_eq!(s["sets_refused"], 0);
    assert!(s["connections"].as_u64().unwrap() <= 2, "{s}");
    // Every stat, numbers parsed; items() is curr_items.
    let curr = s["stats"]["curr_items"].as_u64().unwrap();
    assert!(curr > 0);
    assert_eq!(v["items"], curr);
    assert!(s["stats"]["version"].is_string());
    assert_eq!(
        s["stats"]["cmd_set"].as_u64().unwrap(),
        v["sets"].as_u64().unwrap()
    );
    // Nothing watched: no page cache figure, DRAM is the server's RSS.
    assert!(v["peak_page_cache_bytes"].is_null());
    assert_eq!(v["peak_dram_bytes"], v["peak_rss_sampled_bytes"]);
}

#[test]
fn memcached_extstore_files_are_watched() {
    let dir = tempfile::tempdir().unwrap();
    if is_root() {
        // memcached runs as nobody and must create its file there.
        let ok = Command::new("chown")
            .args(["nobody", dir.path().to_str().unwrap()])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: cannot chown the extstore directory to nobody");
            return;
        }
    }
    let ext = format!(
        // extstore's smallest page: a multiple of its 4 MiB write buffer.
        "ext_page_size=4,ext_path={}/extstore:64M,ext_threads=1",
        dir.path().display()
    );
    let Some(m) = memcached(&["-m", "8", "-o", &ext]) else {
        return;
    };
    let pid = m.child.id().to_string();
    let v = ok(&[
        "--engine",
        "memcached",
        "--server",
        &m.addr,
        "--pid",
        &pid,
        "--pid-files",
        dir.path().to_str().unwrap(),
    ]);
    let stats = &v["engine_stats"]["stats"];
    assert!(stats["extstore_bytes_written"].is_u64(), "{stats}");
    assert!(stats["get_extstore"].is_u64(), "{stats}");
    assert!(v["peak_page_cache_bytes"].is_u64(), "{v}");
    assert!(v["peak_dram_bytes"].as_u64() >= v["peak_page_cache_bytes"].as_u64());
}

/// A fake meta-protocol server on a free port: `mn` is answered `MN`, every `mg` a
/// 3-byte value (wrong for every key of the workload), `ms` `HD`, `stats` one stat; or,
/// `silent`, nothing at all after `mn`.
fn fake_server(silent: bool) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            std::thread::spawn(move || {
                let mut w = conn.try_clone().unwrap();
                let mut r = BufReader::new(conn);
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    let reply: Vec<u8> = if line.starts_with("mn") {
                        b"MN\r\n".to_vec()
                    } else if silent {
                        // Hold the connection, answer nothing.
                        std::thread::sleep(Duration::from_secs(30));
                        return;
                    } else if line.starts_with("mg ") {
                        b"VA 3\r\nabc\r\n".to_vec()
                    } else if let Some(rest) = line.strip_prefix("ms ") {
                        let len: usize = rest.split(' ').nth(1).unwrap().parse().unwrap();
                        let mut data = vec![0u8; len + 2];
                        r.read_exact(&mut data).unwrap();
                        b"HD\r\n".to_vec()
                    } else if line.starts_with("stats") {
                        b"STAT curr_items 7\r\nEND\r\n".to_vec()
                    } else {
                        b"ERROR\r\n".to_vec()
                    };
                    if w.write_all(&reply).is_err() {
                        return;
                    }
                    line.clear();
                }
            });
        }
    });
    addr
}

#[test]
fn a_wrong_value_fails_the_run_with_its_numbers() {
    let addr = fake_server(false);
    let (out, json) = run(&["--engine", "memcached", "--server", &addr]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not the key's"), "{err}");
    let v = json.expect("the numbers are printed");
    assert_eq!(v["wrong_values"], v["gets"]);
    assert_eq!(v["items"], 7);
}

#[test]
fn a_dead_or_silent_server_fails_the_run_without_hanging() {
    let start = Instant::now();
    let dead = format!("127.0.0.1:{}", free_port());
    let (out, _) = run(&["--engine", "memcached", "--server", &dead]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));

    let silent = fake_server(true);
    let (out, _) = run(&[
        "--engine",
        "memcached",
        "--server",
        &silent,
        "--timeout-secs",
        "1",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no reply in time"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(20));
}

//! `net-fill`, `net-probe` and `net-stats` against a real memcached (started on a free
//! loopback port; the tests that need it say so and pass if it is not installed) and
//! against a fake server that answers nonsense.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
use common::{bench, free_port, memcached};

fn json_of(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Sends `request` and reads until `end` is at the end of what came back.
fn raw(addr: &str, request: &[u8], end: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(request).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(end) {
        let n = s.read(&mut buf).expect("read a reply");
        assert!(n > 0, "closed after {got:?}");
        got.extend_from_slice(&buf[..n]);
    }
    got
}

#[test]
fn fill_then_probe_finds_every_item_and_flags_a_wrong_one() {
    let Some(m) = memcached(&["-m", "64"]) else {
        return;
    };
    let a = m.addr.as_str();
    let fill = bench(&[
        "net-fill",
        "--addr",
        a,
        "--items",
        "5000",
        "--connections",
        "3",
        "--batch",
        "64",
        "--json",
    ]);
    assert!(fill.status.success(), "{fill:?}");
    let f = json_of(&fill);
    assert_eq!(f["stored"], 5000);
    assert_eq!(f["failed"], 0);
    // The scheme is fixed: key:<id>, values the hex digits of the id's tag.
    let got = raw(a, b"mg key:4999 v\r\nmg key:5000 v\r\nmn\r\n", b"MN\r\n");
    assert!(got.starts_with(b"VA 100\r\n"), "{got:?}");
    assert!(got.ends_with(b"\r\nEN\r\nMN\r\n"), "{got:?}");
    assert_eq!(got.len(), b"VA 100\r\n".len() + 102 + b"EN\r\nMN\r\n".len());

    // Filling again with --touch rewrites the same values and reads each item once.
    let fill = bench(&[
        "net-fill", "--addr", a, "--items", "5000", "--touch", "--batch", "100", "--json",
    ]);
    assert!(fill.status.success(), "{fill:?}");
    let f = json_of(&fill);
    assert_eq!(
        (f["stored"].clone(), f["touched"].clone()),
        (5000.into(), 5000.into())
    );

    let stats = bench(&["net-stats", "--addr", a, "--settle-secs", "5", "--json"]);
    assert!(stats.status.success(), "{stats:?}");
    let s = json_of(&stats);
    assert_eq!(s["curr_items"], 5000);
    assert_eq!(s["settled"], true);

    let probe = bench(&[
        "net-probe",
        "--addr",
        a,
        "--items",
        "5000",
        "--connections",
        "2",
        "--json",
    ]);
    assert!(probe.status.success(), "{probe:?}");
    let p = json_of(&probe);
    assert_eq!(p["checked"], 5000);
    assert_eq!(p["hits"], 5000);
    assert_eq!(p["misses"], 0);
    assert_eq!(p["wrong"], 0);
    assert_eq!(p["curr_items"], 5000);
    assert!(p["connect_seconds"].as_f64().unwrap() <= p["first_hit_seconds"].as_f64().unwrap());

    // Items the fill never stored are misses; a sample is evenly spread.
    let probe = bench(&[
        "net-probe",
        "--addr",
        a,
        "--items",
        "10000",
        "--sample",
        "100",
        "--json",
    ]);
    assert!(probe.status.success(), "{probe:?}");
    let p = json_of(&probe);
    assert_eq!(
        (p["checked"].clone(), p["hits"].clone(), p["misses"].clone()),
        (100.into(), 50.into(), 50.into())
    );

    // One value changed behind the fill's back is a wrong value, and a failed run.
    raw(a, b"set key:1234 0 0 3\r\nabc\r\n", b"STORED\r\n");
    let probe = bench(&["net-probe", "--addr", a, "--items", "5000", "--json"]);
    assert!(!probe.status.success());
    let p = json_of(&probe);
    assert_eq!(p["wrong"], 1);
    assert_eq!(p["hits"], 4999);
    assert!(p["first_wrong"].as_str().unwrap().starts_with("key:1234:"));
    assert!(String::from_utf8_lossy(&probe.stderr).contains("not the ones stored"));
}

#[test]
fn probe_gives_up_on_a_closed_port() {
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let start = Instant::now();
    let out = bench(&[
        "net-probe",
        "--addr",
        &addr,
        "--items",
        "10",
        "--wait-secs",
        "0.3",
    ]);
    assert!(!out.status.success());
    assert!(start.elapsed() < Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no connection"), "{err}");
}

#[test]
fn nonsense_replies_are_clear_errors() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    // Not joined: if a run failed to connect, the thread would wait forever.
    std::thread::spawn(move || {
        // Answers every connection with a line no meta request asks for.
        for _ in 0..2 {
            let (mut s, _) = listener.accept().unwrap();
            let _ = s.write_all(b"VALUE nonsense 0 1\r\n");
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
        }
    });
    let out = bench(&[
        "net-fill",
        "--addr",
        &addr,
        "--items",
        "10",
        "--connections",
        "1",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("expected MN, HD, EN or an error line"),
        "{err}"
    );
    let out = bench(&["net-probe", "--addr", &addr, "--items", "10"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expected VA or EN"), "{err}");
}

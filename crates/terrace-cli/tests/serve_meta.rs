//! The meta protocol's stale-while-revalidate flows, compared with memcached 1.6.18
//! itself: each flow's requests go, byte for byte, to a `memcached` started for the test
//! and to `terrace serve`, and the replies must be equal once CAS values (which each
//! server assigns its own way) are masked. Flows: `N` vivify (the creator wins `W`,
//! later clients see `Z`), `md I` invalidation (the item stays, stale: `X`, and the
//! first reader wins), `ms I` with an older CAS (a stale store keeps the win token),
//! `R` recache (a win when the TTL left is below the threshold), and `h` (hit before).
//!
//! Skipped with a loud message when memcached is not installed, unless
//! TERRACE_REQUIRE_TOOLS=1 (CI), which makes a missing tool a failure.

mod common;

use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ChildGuard, Conn};

/// A memcached on a free loopback port, killed when dropped.
struct Memcached {
    _proc: ChildGuard,
    port: u16,
}

fn start_memcached() -> Option<Memcached> {
    let tool = common::require_tool("memcached", "memcached")?;
    let port = common::free_port();
    let mut cmd = Command::new(tool);
    cmd.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"]);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // memcached refuses to run as root without a user to run as.
        cmd.args(["-u", "root"]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting memcached");
    let proc = ChildGuard::new("memcached", child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "memcached did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(Memcached { _proc: proc, port })
}

/// Sends `request` (lines joined with `\r\n`) then `mn`, and returns everything before
/// the `MN` with CAS values masked ([`mask_cas`]).
fn exchange(conn: &mut Conn, request: &str) -> String {
    let mut bytes = request.replace('\n', "\r\n");
    bytes.push_str("\r\nmn\r\n");
    conn.send(bytes.as_bytes());
    let mut lines = Vec::new();
    loop {
        let line = conn.line();
        if line == "MN" {
            break;
        }
        lines.push(mask_cas(&line));
    }
    lines.join("\n")
}

/// Masks CAS values: meta's `c<n>` flags and the fifth token of a `gets` hit.
fn mask_cas(line: &str) -> String {
    let tokens: Vec<&str> = line.split(' ').collect();
    if tokens.len() == 5 && tokens[0] == "VALUE" {
        return format!("{} {} {} {} c*", tokens[0], tokens[1], tokens[2], tokens[3]);
    }
    line.split(' ')
        .map(|token| match token.strip_prefix('c') {
            Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => "c*",
            _ => token,
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Each flow, one step (request bytes) at a time, on both servers; the replies must be
/// equal. `expected` pins a few steps' replies so that a test is not passed by two
/// servers agreeing on something else (e.g. both refusing a flag).
fn compare(flows: &[(&str, &[&str])], pinned: &[(&str, &str)]) {
    let Some(memcached) = start_memcached() else {
        return;
    };
    let dir = tempfile::tempdir().expect("creating a temporary directory");
    let terrace = common::start(dir.path(), &[]);
    let mut theirs = Conn::tcp(memcached.port);
    let mut ours = terrace.connect();
    for (name, steps) in flows {
        for step in steps.iter() {
            eprintln!("{name}: {step:?}");
            let want = exchange(&mut theirs, step);
            eprintln!("  memcached: {want:?}");
            let got = exchange(&mut ours, step);
            assert_eq!(
                got, want,
                "flow {name}: terrace serve and memcached answer {step:?} differently"
            );
            if let Some((_, pinned)) = pinned.iter().find(|(s, _)| s == step) {
                assert_eq!(&got, pinned, "flow {name}: {step:?}");
            }
        }
    }
}

#[test]
fn vivify_invalidate_and_recache_flows_match_memcached() {
    let vivify: &[&str] = &[
        "mg viv N30 s v c",
        "mg viv N30 v c s",
        "mg viv v",
        "mg viv N30 s k O1",
        // The winner fills the item: fresh again.
        "ms viv 1 T0\nx",
        "mg viv v",
        "mg viv N30 v",
        // N with q on a hit is answered; a plain miss under q is not.
        "mg viv2 q v",
        "mg viv2 N0 q",
        "mg viv2 q",
    ];
    let invalidate: &[&str] = &[
        "ms inv 2 T100\nhi",
        "mg inv v c s",
        "md inv I T30",
        "mg inv v c",
        "mg inv v c",
        "mg inv s k O9",
        // An older CAS stores a stale value that keeps the win token.
        "ms inv 3 I C1\nnew",
        "mg inv v c",
        // A plain set makes it fresh.
        "ms inv 3 T50\nnew",
        "mg inv v c",
        "md nope I",
        "md nope I q",
        "ms inv2 1\nz",
        "md inv2 I q",
        "mg inv2 c",
        "ms inv2 1 I\nw",
        "mg inv2 c v",
        "md inv2 I",
        "mg inv2 c",
        "ms inv2 1 I C18446744073709551615\nq",
        "mg inv2 v",
        "md inv2 I C1",
        "md inv2 C1",
        "md inv2 I T-1",
        "mg inv2 v",
        "md inv2",
    ];
    let recache: &[&str] = &[
        "ms rc 1 T20\nx",
        "mg rc R30 v c",
        "mg rc R30 v c",
        "mg rc R10 v",
        "ms rc 1 T100\ny",
        "mg rc R30 v",
        "ms rc2 1\nx",
        "mg rc2 R30 v",
    ];
    let hit_before: &[&str] = &[
        "ms hb 1\nx",
        "mg hb h",
        "mg hb h v",
        "mg hb h",
        "mg hbq h q",
        "ms hb2 1\nx",
        "get hb2",
        "mg hb2 h",
        "md hb2 I",
        "mg hb2 h",
    ];
    let base64: &[&str] = &[
        "ms YjY0 2 b\nhi",
        "md YjY0 b I",
        "mg YjY0 b k v c",
        "mg b64 v",
        "mg YjY0 b k",
    ];
    compare(
        &[
            ("vivify", vivify),
            ("invalidate", invalidate),
            ("recache", recache),
            ("hit before", hit_before),
            ("base64", base64),
        ],
        &[
            ("mg viv N30 s v c", "VA 0 s0 c* W\n"),
            ("mg inv s k O9", "HD s2 kinv O9 Z X"),
            ("mg rc R10 v", "VA 1 Z\nx"),
        ],
    );
}

/// `stats detail`: switched on and off, the per-prefix counts of the ascii commands
/// (meta commands are not counted), the usage error; compared with memcached byte for
/// byte (one prefix at a time: memcached lists prefixes in its hash table's order).
#[test]
fn stats_detail_matches_memcached() {
    let detail: &[&str] = &[
        "stats detail",
        "stats detail bogus",
        "stats detail dump",
        "set p:1 0 0 1\nx",
        "stats detail on",
        "set p:1 0 0 1\nx",
        "get p:1 p:2 nokey",
        "gets p:1",
        "delete p:2",
        "delete p:1",
        "ms p:3 1\ny",
        "mg p:3 v",
        "md p:3",
        "add p:1 0 0 1\nz",
        "stats detail dump",
        "stats detail off",
        "get p:1",
        "stats detail dump",
        "stats reset",
        "stats detail dump",
    ];
    compare(
        &[("detail", detail)],
        &[("gets p:1", "VALUE p:1 0 1 c*\nx\nEND")],
    );
}

/// `stats settings` lists memcached 1.6.18's keys, in its order.
#[test]
fn stats_settings_has_memcacheds_keys() {
    let Some(memcached) = start_memcached() else {
        return;
    };
    let dir = tempfile::tempdir().expect("creating a temporary directory");
    let terrace = common::start(dir.path(), &[]);
    let names = |conn: &mut Conn| -> Vec<String> {
        conn.send(b"stats settings\r\n");
        let mut names = Vec::new();
        loop {
            let line = conn.line();
            if line == "END" {
                break names;
            }
            names.push(line.split(' ').nth(1).unwrap_or_default().to_string());
        }
    };
    let theirs = names(&mut Conn::tcp(memcached.port));
    let ours = names(&mut terrace.connect());
    assert_eq!(theirs.len(), 76, "memcached 1.6.18 has 76 settings");
    assert_eq!(ours, theirs);
}

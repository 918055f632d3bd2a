//! The meta protocol's stale-while-revalidate flows and the stats and hardening that
//! came with them, compared with memcached 1.6.18 itself: each flow's requests go, byte
//! for byte, to a `memcached` started for the test and to `terrace serve`, and the
//! replies must be equal once CAS values (which each server assigns its own way) are
//! masked. Flows: `N` vivify (the creator wins `W`, later clients see `Z`), `md I`
//! invalidation (the item stays, stale: `X`, and the first reader wins), `ms I` with an
//! older CAS (a stale store keeps the win token), `R` recache (a win when the TTL left
//! is below the threshold), `h` (hit before), base64 keys; `stats detail` and the keys
//! of `stats settings`; request lines that look like HTTP. Terrace-only: the marks
//! survive demotion and a clean restart, not a crash.
//!
//! Skipped with a loud message when memcached is not installed, unless
//! TERRACE_REQUIRE_TOOLS=1 (CI), which makes a missing tool a failure.

mod common;

use std::net::TcpStream;
use std::time::Duration;

use common::{ChildGuard, Conn};

/// A memcached on a free loopback port, killed when dropped.
struct Memcached {
    _proc: ChildGuard,
    port: u16,
}

fn start_memcached() -> Option<Memcached> {
    let (proc, port) = common::start_memcached(&[])?;
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

/// What a fresh connection gets back for `request`: the bytes until the server closes
/// the connection or goes quiet for a moment, and whether it closed.
fn first_reply(port: u16, request: &[u8]) -> (String, bool) {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting");
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .expect("read timeout");
    // A server that closes on the request's first line may do so before the rest of it
    // is sent: the write then fails with a broken pipe or a reset, and the reads below
    // see the close.
    if let Err(e) = s.write_all(request) {
        use std::io::ErrorKind::{BrokenPipe, ConnectionReset};
        assert!(
            matches!(e.kind(), BrokenPipe | ConnectionReset),
            "sending the request: {e}"
        );
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            // A reset is a close too.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    (String::from_utf8_lossy(&got).into_owned(), closed)
}

/// memcached's defence against cross-protocol requests: a command line it does not know
/// whose last token starts with `HTTP/` closes the connection without a reply; a known
/// command with such a token is served as usual.
#[test]
fn http_request_lines_close_like_memcached() {
    let Some(memcached) = start_memcached() else {
        return;
    };
    let dir = tempfile::tempdir().expect("creating a temporary directory");
    let terrace = common::start(dir.path(), &[]);
    for request in [
        &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"POST /submit HTTP/1.0\r\n",
        b"HEAD / HTTP/1.1\r\n",
        b"get / HTTP/1.1\r\n",
        b"BREW /pot HTTPS\r\n",
    ] {
        let want = first_reply(memcached.port, request);
        let got = first_reply(terrace.port(), request);
        assert_eq!(
            got,
            want,
            "terrace serve and memcached answer {:?} differently",
            String::from_utf8_lossy(request)
        );
    }
    let (reply, closed) = first_reply(terrace.port(), b"GET / HTTP/1.1\r\n");
    assert_eq!((reply.as_str(), closed), ("", true));
}

/// A stale item keeps its marks when the cache demotes it to the next tier (a move
/// keeps the item's CAS, which the marks belong to).
#[test]
fn stale_marks_survive_demotion() {
    let dir = tempfile::tempdir().expect("creating a temporary directory");
    let terrace = common::start(dir.path(), &["--tiers", "dram:16MiB,file:64MiB"]);
    let mut c = terrace.connect();
    assert_eq!(exchange(&mut c, "ms stale 5\nhello\nmd stale I"), "HD\nHD");
    let value = "x".repeat(4000);
    let mut demoted = false;
    for i in 0..20_000 {
        c.send(format!("ms filler{i} {} q\r\n{value}\r\n", value.len()).as_bytes());
        if i % 500 == 499 {
            let me = exchange(&mut c, "me stale");
            assert!(me.starts_with("ME stale "), "the stale item was lost: {me}");
            if me.ends_with(" tier=1") {
                demoted = true;
                break;
            }
        }
    }
    assert!(demoted, "80 MB of writes never demoted the item");
    assert_eq!(exchange(&mut c, "mg stale v s"), "VA 5 s5 X W\nhello");
    assert_eq!(exchange(&mut c, "mg stale v"), "VA 5 Z X\nhello");
}

/// A clean restart keeps the stale and win marks with the items; a crash (SIGKILL) loses
/// them: the item reads as fresh.
#[test]
fn stale_marks_survive_a_clean_restart_only() {
    let dir = tempfile::tempdir().expect("creating a temporary directory");
    let mut terrace = common::start(dir.path(), &[]);
    let mut c = terrace.connect();
    let setup = "ms stale 5\nhello\nmd stale I\nms won 1\nx\nmd won I\nmg won";
    assert_eq!(exchange(&mut c, setup), "HD\nHD\nHD\nHD\nHD X W");
    drop(c);
    assert!(terrace.terminate().success(), "a clean stop");
    let mut terrace = common::start(dir.path(), &[]);
    let mut c = terrace.connect();
    assert_eq!(exchange(&mut c, "mg stale v"), "VA 5 X W\nhello");
    assert_eq!(exchange(&mut c, "mg won"), "HD Z X");
    drop(c);
    terrace.kill9();
    let terrace = common::start(dir.path(), &[]);
    let mut c = terrace.connect();
    let after_crash = exchange(&mut c, "mg stale v");
    assert!(
        after_crash == "VA 5\nhello" || after_crash == "EN",
        "after a crash: {after_crash:?}"
    );
}

/// One binary request: opcode, key, extras, value (opaque 7, CAS 0).
fn binary_request(opcode: u8, key: &[u8], extras: &[u8], value: &[u8]) -> Vec<u8> {
    let body = (extras.len() + key.len() + value.len()) as u32;
    let mut r = vec![0x80, opcode];
    r.extend_from_slice(&(key.len() as u16).to_be_bytes());
    r.push(extras.len() as u8);
    r.extend_from_slice(&[0, 0, 0]);
    r.extend_from_slice(&body.to_be_bytes());
    r.extend_from_slice(&7u32.to_be_bytes());
    r.extend_from_slice(&0u64.to_be_bytes());
    r.extend_from_slice(extras);
    r.extend_from_slice(key);
    r.extend_from_slice(value);
    r
}

/// A binary reply as compared: opcode, status, key, value, whether the CAS is non-zero.
type BinaryReply = (u8, u16, Vec<u8>, Vec<u8>, bool);

/// The binary replies to `requests`, up to and including the NOOP's.
fn binary_replies(port: u16, requests: &[Vec<u8>]) -> Vec<BinaryReply> {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut all: Vec<u8> = requests.concat();
    all.extend_from_slice(&binary_request(0x0a, b"", b"", b""));
    s.write_all(&all).expect("sending");
    let mut replies = Vec::new();
    loop {
        let mut head = [0u8; 24];
        s.read_exact(&mut head).expect("a reply header");
        let key_len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        let extras = usize::from(head[4]);
        let status = u16::from_be_bytes([head[6], head[7]]);
        let body = u32::from_be_bytes([head[8], head[9], head[10], head[11]]) as usize;
        let cas = u64::from_be_bytes(head[16..24].try_into().unwrap());
        let mut bytes = vec![0u8; body];
        s.read_exact(&mut bytes).expect("a reply body");
        let key = bytes[extras..extras + key_len].to_vec();
        let value = bytes[extras + key_len..].to_vec();
        replies.push((head[1], status, key, value, cas != 0));
        if head[1] == 0x0a {
            return replies;
        }
    }
}

/// The binary STAT of `detail on`, `detail dump` (one `detailed` stat holding the dump)
/// and an unknown `detail` key, as memcached answers them.
#[test]
fn binary_stats_detail_matches_memcached() {
    let Some(memcached) = start_memcached() else {
        return;
    };
    let dir = tempfile::tempdir().expect("creating a temporary directory");
    let terrace = common::start(dir.path(), &[]);
    let requests = [
        binary_request(0x10, b"detail on", b"", b""),
        binary_request(0x01, b"b:k", &[0; 8], b"v"),
        binary_request(0x00, b"b:k", b"", b""),
        binary_request(0x00, b"b:missing", b"", b""),
        binary_request(0x04, b"b:k", b"", b""),
        binary_request(0x10, b"detail dump", b"", b""),
        binary_request(0x10, b"detail bogus", b"", b""),
        binary_request(0x10, b"detail off", b"", b""),
    ];
    let want = binary_replies(memcached.port, &requests);
    let got = binary_replies(terrace.port(), &requests);
    assert_eq!(got, want);
    let dump = got
        .iter()
        .find(|r| r.2 == b"detailed")
        .expect("a detailed stat");
    assert_eq!(dump.3, b"PREFIX b get 2 hit 1 set 1 del 1\r\nEND\r\n");
}

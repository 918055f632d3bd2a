//! `terrace serve` under hostile and careless clients, and bad startup input:
//! - malformed commands get an error reply and the connection stays usable;
//! - a 100 KiB line without a newline is refused (error, then closed), the server stays;
//! - huge and negative value lengths; a value over the item size limit is refused with
//!   SERVER_ERROR before its data is read, the connection stays usable and the key's old
//!   value is gone;
//! - 1 MiB of random bytes on a connection (text and binary first bytes);
//! - a client that disconnects in the middle of a value: nothing partial is stored;
//! - 2000 idle connections at once, RSS bounded; `--max-connections` refuses the next
//!   with memcached's `ERROR Too many open connections`;
//! - 200 MiB of overwriting `set` traffic does not grow RSS beyond the tiers + 100 MiB;
//! - a tier directory that is a file, `--tiers bogus`, an unknown config key: a non-zero
//!   exit with a message naming the problem, never a panic.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{show, Conn, Server};

/// Sends `request`, then `version`; returns the reply lines before the VERSION line.
fn replies_before_version(c: &mut Conn, request: &[u8]) -> Vec<String> {
    c.send(request);
    c.send(b"version\r\n");
    let mut lines = Vec::new();
    loop {
        let line = c.try_line().unwrap_or_else(|e| {
            panic!(
                "after {:?}: connection unusable: {e}; replies so far {lines:?}",
                show(request)
            )
        });
        if line.starts_with("VERSION ") {
            return lines;
        }
        lines.push(line);
        assert!(
            lines.len() < 10,
            "after {:?}: too many replies {lines:?}",
            show(request)
        );
    }
}

fn is_error(line: &str) -> bool {
    line == "ERROR" || line.starts_with("CLIENT_ERROR ") || line.starts_with("SERVER_ERROR ")
}

#[test]
fn malformed_commands_get_an_error_and_the_connection_stays_usable() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);
    let mut c = server.connect();
    assert_eq!(c.set("keep", b"kept"), "STORED");
    let long_key = "k".repeat(251);
    let cases: Vec<Vec<u8>> = vec![
        b"bogus\r\n".to_vec(),
        b"\r\n".to_vec(),
        b"get\r\n".to_vec(),
        b"set\r\n".to_vec(),
        b"set k\r\n".to_vec(),
        b"set k 0 0\r\n".to_vec(),
        b"set k abc 0 1\r\nx\r\n".to_vec(),
        b"set k 0 abc 1\r\nx\r\n".to_vec(),
        b"set k -1 0 1\r\nx\r\n".to_vec(),
        b"set k 0 0 1 extra tokens\r\nx\r\n".to_vec(),
        b"set k 0 0 1\r\nxyz\r\n".to_vec(),
        b"cas k 0 0 1\r\nx\r\n".to_vec(),
        b"cas k 0 0 1 notanumber\r\nx\r\n".to_vec(),
        format!("set {long_key} 0 0 1\r\nx\r\n").into_bytes(),
        format!("get {long_key}\r\n").into_bytes(),
        b"incr\r\n".to_vec(),
        b"incr keep\r\n".to_vec(),
        b"incr keep abc\r\n".to_vec(),
        b"decr keep -1\r\n".to_vec(),
        b"touch keep\r\n".to_vec(),
        b"touch keep abc\r\n".to_vec(),
        b"gat\r\n".to_vec(),
        b"gat abc keep\r\n".to_vec(),
        b"delete\r\n".to_vec(),
        b"delete keep 5\r\n".to_vec(),
        b"delete a b c\r\n".to_vec(),
        b"flush_all abc\r\n".to_vec(),
        b"flush_all 0 0 0\r\n".to_vec(),
        b"stats nonsense\r\n".to_vec(),
        b"verbosity\r\n".to_vec(),
        b"GET keep\r\n".to_vec(),
        b"\x00\x01\x02\r\n".to_vec(),
        b"\xff\xfe set\r\n".to_vec(),
    ];
    for case in &cases {
        let replies = replies_before_version(&mut c, case);
        assert!(
            !replies.is_empty() && replies.iter().all(|l| is_error(l)),
            "{:?} must be answered with errors only, got {replies:?}",
            show(case)
        );
    }
    // Nothing of the above stored anything or damaged "keep".
    assert_eq!(c.get("keep").as_deref(), Some(&b"kept"[..]));
    assert_eq!(c.get("k"), None, "no malformed set may store k");
    server.assert_alive("after malformed commands");
}

#[test]
fn a_100kib_line_without_newline_is_refused_and_the_server_stays_up() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);
    let mut c = server.connect();
    assert_eq!(c.set("before", b"1"), "STORED");
    // The server may close while we are still writing: write from a thread, ignore its
    // errors (EPIPE/ECONNRESET), and read what came back.
    let mut writer = c.try_clone_stream();
    let w = std::thread::spawn(move || {
        let line = vec![b'a'; 100 * 1024];
        let _ = writer.write_all(&line);
    });
    let reply = c.read_to_close(Duration::from_secs(10));
    let _ = w.join();
    // As memcached: the connection is closed without a reply.
    assert!(
        reply.is_empty(),
        "an over-long line closes the connection without a reply; got {:?}",
        show(&reply)
    );
    server.assert_alive("after a 100 KiB line");
    assert_eq!(server.connect().get("before").as_deref(), Some(&b"1"[..]));
}

#[test]
fn huge_and_negative_lengths() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);

    // Negative: cannot be skipped, answered, the connection goes on.
    let mut c = server.connect();
    assert_eq!(c.set("neg", b"old"), "STORED");
    let replies = replies_before_version(&mut c, b"set neg 0 0 -5\r\n");
    assert_eq!(
        replies,
        vec!["CLIENT_ERROR bad command line format".to_string()]
    );
    assert_eq!(
        c.get("neg").as_deref(),
        Some(&b"old"[..]),
        "a refused set -5 leaves the key"
    );

    // Huge: refused at once, without waiting for (or buffering) the data; the key's old
    // value is removed as memcached does. The connection then discards what follows as
    // that value's data, so only a new connection is checked.
    let mut c = server.connect();
    assert_eq!(c.set("huge", b"old"), "STORED");
    let rss_before = server.rss();
    c.send(b"set huge 0 0 99999999999\r\n");
    assert_eq!(c.line(), "SERVER_ERROR object too large for cache");
    // 32 MiB of "data": swallowed, not buffered.
    let chunk = vec![b'z'; 1 << 20];
    for _ in 0..32 {
        c.send(&chunk);
    }
    let mut c2 = server.connect();
    assert_eq!(
        c2.get("huge"),
        None,
        "a refused set must not leave the old value readable"
    );
    let grown = server.rss().saturating_sub(rss_before);
    assert!(
        grown < 24 << 20,
        "swallowing 32 MiB grew RSS by {} MiB",
        grown >> 20
    );

    // 2^64 and beyond: not a number.
    let replies = replies_before_version(&mut c2, b"set h2 0 0 18446744073709551616\r\n");
    assert!(replies.len() == 1 && is_error(&replies[0]), "{replies:?}");
    server.assert_alive("after huge and negative lengths");
}

#[test]
fn an_oversized_value_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);
    let mut c = server.connect();
    let max = 1usize << 20;
    assert_eq!(c.set("k", b"old value"), "STORED");
    // Only the command line: the reply must come before any data is sent.
    c.send(format!("set k 0 0 {}\r\n", max + 1).as_bytes());
    c.set_read_timeout(Duration::from_secs(5));
    let reply = c
        .try_line()
        .unwrap_or_else(|e| panic!("no reply to an oversized set before its data was sent: {e}"));
    assert_eq!(reply, "SERVER_ERROR object too large for cache");
    c.set_read_timeout(common::IO_TIMEOUT);
    // The data then follows and is discarded; the connection is usable after it.
    let data = vec![b'v'; max + 1];
    c.send(&data);
    c.send(b"\r\n");
    assert_eq!(
        c.get("k"),
        None,
        "the old value of an oversized set must be gone"
    );
    assert_eq!(c.set("k", b"new"), "STORED");
    assert_eq!(c.get("k").as_deref(), Some(&b"new"[..]));
    // The same with the data sent in the same write as the line.
    let mut req = format!("set k 0 0 {}\r\n", max + 1).into_bytes();
    req.extend_from_slice(&data);
    req.extend_from_slice(b"\r\nget k\r\n");
    c.send(&req);
    assert_eq!(c.line(), "SERVER_ERROR object too large for cache");
    assert_eq!(
        c.line(),
        "END",
        "the old value of an oversized set must be gone"
    );
    // Other storage commands refuse the same way (the key stays absent).
    for op in ["add", "replace", "append", "prepend"] {
        let mut req = format!("{op} k 0 0 {}\r\n", max + 1).into_bytes();
        req.extend_from_slice(&data);
        req.extend_from_slice(b"\r\n");
        c.send(&req);
        assert_eq!(c.line(), "SERVER_ERROR object too large for cache", "{op}");
    }
    server.assert_alive("after oversized values");
}

/// Writes `garbage` on a new connection while draining whatever comes back, until the
/// server closes or the data is all written and the replies stop.
fn pour_garbage(server: &Server, garbage: Vec<u8>) {
    let mut c = server.connect();
    let mut writer = c.try_clone_stream();
    let w = std::thread::spawn(move || {
        for chunk in garbage.chunks(16 * 1024) {
            if writer.write_all(chunk).is_err() {
                return;
            }
        }
    });
    c.set_read_timeout(Duration::from_millis(500));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match c.stream.read(&mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if w.is_finished() {
                    break;
                }
            }
            Err(_) => break,
        }
        assert!(
            Instant::now() < deadline,
            "pouring 1 MiB of garbage took over 20 s"
        );
    }
    c.shutdown_write();
    let _ = w.join();
}

#[test]
fn a_mebibyte_of_random_garbage_does_not_hurt_the_server() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);
    let mut rng = common::Rng::new("garbage");
    assert_eq!(server.connect().set("survivor", b"here"), "STORED");
    for first in [b'g', 0x80] {
        let mut garbage = vec![0u8; 1 << 20];
        rng.fill(&mut garbage);
        // The first byte picks the protocol: text, then binary.
        garbage[0] = first;
        pour_garbage(&server, garbage);
        server.assert_alive(&format!("after 1 MiB of garbage starting with {first:#x}"));
    }
    // Garbage made of text tokens, which reaches deeper into the parser.
    let words: [&[u8]; 12] = [
        b"get ",
        b"set ",
        b"cas ",
        b"incr ",
        b"0 ",
        b"1 ",
        b"99999 ",
        b"-1 ",
        b"noreply ",
        b"\r\n",
        b"k ",
        b"mg ",
    ];
    let mut garbage = Vec::with_capacity(1 << 20);
    while garbage.len() < 1 << 20 {
        garbage.extend_from_slice(words[rng.range(0, words.len() as u64) as usize]);
    }
    pour_garbage(&server, garbage);
    server.assert_alive("after 1 MiB of command-shaped garbage");
    let mut c = server.connect();
    let v = c.get("survivor");
    // Random bytes may contain a valid flush_all or delete; anything else is a bug.
    assert!(
        v.is_none() || v.as_deref() == Some(&b"here"[..]),
        "survivor changed to {v:?}"
    );
}

#[test]
fn a_client_that_disconnects_mid_value_stores_nothing() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);
    let mut c = server.connect();
    assert_eq!(c.set("had", b"old value"), "STORED");
    for (key, len, sent) in [
        ("had", 100usize, 50usize),
        ("fresh", 100, 0),
        ("fresh2", 512 * 1024, 300 * 1024),
        ("fresh3", 100, 100),
    ] {
        let mut half = server.connect();
        let mut req = format!("set {key} 0 0 {len}\r\n").into_bytes();
        req.extend(std::iter::repeat_n(b'p', sent));
        // ("fresh3": the whole value but not its \r\n.)
        half.send(&req);
        std::thread::sleep(Duration::from_millis(50));
        drop(half);
    }
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(
        c.get("had").as_deref(),
        Some(&b"old value"[..]),
        "a cut-off set must not change the value"
    );
    for key in ["fresh", "fresh2", "fresh3"] {
        assert_eq!(
            c.get(key).map(|v| show(&v)),
            None,
            "a cut-off set of {key} must store nothing"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let open = common::stat_u64(&c.stats(), "curr_connections");
        if open == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{open} connections still counted 5 s after the cut-off clients left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server.assert_alive("after clients cut off mid-value");
}

#[test]
fn two_thousand_idle_connections() {
    const N: usize = 2000;
    let limit = common::raise_nofile(N as u64 + 1000);
    assert!(
        limit >= N as u64 + 200,
        "RLIMIT_NOFILE is {limit}: cannot open {N} connections"
    );
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &["--max-connections", "3000"]);
    let rss_start = server.rss();
    let started = Instant::now();
    let mut conns: Vec<Conn> = Vec::with_capacity(N);
    // Connect in batches, each batch proves its connections were admitted by a
    // `version` round trip.
    for batch in 0..N / 100 {
        let first = conns.len();
        for _ in 0..100 {
            conns.push(server.connect());
        }
        for c in &mut conns[first..] {
            c.send(b"version\r\n");
        }
        for (i, c) in conns[first..].iter_mut().enumerate() {
            let v = c
                .try_line()
                .unwrap_or_else(|e| panic!("connection {} of batch {batch}: {e}", first + i));
            assert!(v.starts_with("VERSION "), "connection {}: {v:?}", first + i);
        }
    }
    eprintln!("{N} connections open in {:?}", started.elapsed());
    let mut extra = server.connect();
    assert_eq!(
        extra.set("k", b"v"),
        "STORED",
        "a new connection works with {N} open"
    );
    let stats = extra.stats();
    assert_eq!(common::stat_u64(&stats, "curr_connections"), N as u64 + 1);
    let rss = server.rss();
    eprintln!(
        "RSS: {} MiB at start, {} MiB with {} connections",
        rss_start >> 20,
        rss >> 20,
        N + 1
    );
    assert!(
        rss < 200 << 20,
        "RSS with {N} idle connections is {} MiB (bound 200 MiB)",
        rss >> 20
    );
    // Every connection still answers.
    for (i, c) in conns.iter_mut().enumerate().step_by(97) {
        assert_eq!(c.get("k").as_deref(), Some(&b"v"[..]), "connection {i}");
    }
    drop(conns);
    server.assert_alive(&format!("after closing {N} connections"));
}

#[test]
fn max_connections_refuses_the_next_one() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let server = common::start(dir.path(), &["--max-connections", "5"]);
    let mut conns: Vec<Conn> = (0..5).map(|_| server.connect()).collect();
    for c in &mut conns {
        assert!(c.cmd("version").starts_with("VERSION "));
    }
    let mut sixth = server.connect();
    let refused = sixth.read_to_close(Duration::from_secs(10));
    assert_eq!(
        String::from_utf8_lossy(&refused),
        "ERROR Too many open connections\r\n",
        "the 6th connection must be refused as memcached does"
    );
    // The five still work; once one closes, a new connection is admitted.
    for c in &mut conns {
        assert_eq!(c.set("k", b"v"), "STORED");
    }
    drop(conns.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = TcpStream::connect(("127.0.0.1", server.port())).expect("connect");
        let mut c = Conn::from_tcp(s);
        c.send(b"version\r\n");
        match c.try_line() {
            Ok(l) if l.starts_with("VERSION ") => break,
            Ok(l) if l == "ERROR Too many open connections" => {}
            other => panic!("unexpected answer to a new connection: {other:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "no connection admitted 10 s after one closed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn overwrite_traffic_does_not_grow_memory() {
    const TOTAL: usize = 200 << 20;
    const VALUE: usize = 64 * 1024;
    // ~62 MiB of live values: more than the DRAM tier, so hot items are demoted.
    const KEYS: usize = 1000;
    let dir = tempfile::tempdir().expect("temporary directory");
    let tiers_bytes: u64 = (16 + 64) << 20;
    let mut server = common::start(dir.path(), &["--tiers", "dram:16MiB,file:64MiB"]);
    let before = server.rss();
    let mut c = server.connect();
    let started = Instant::now();
    let mut writer = c.try_clone_stream();
    let sets = TOTAL / VALUE;
    // Every 8th set is read back at once: hot items are demoted to the file tier, so the
    // movers work too, not only DRAM eviction.
    let reread = |i: usize| i.is_multiple_of(8);
    let w = std::thread::spawn(move || {
        let mut batch = Vec::with_capacity(33 * (VALUE + 64));
        for i in 0..sets {
            let key = format!("ow{}", i % KEYS);
            let value = common::versioned_value(&key, i as u64, VALUE);
            batch.extend_from_slice(format!("set {key} 0 0 {VALUE}\r\n").as_bytes());
            batch.extend_from_slice(&value);
            batch.extend_from_slice(b"\r\n");
            if reread(i) {
                batch.extend_from_slice(format!("get {key}\r\n").as_bytes());
            }
            if batch.len() >= 32 * VALUE {
                writer.write_all(&batch).expect("writing set traffic");
                batch.clear();
            }
        }
        writer.write_all(&batch).expect("writing set traffic");
    });
    for i in 0..sets {
        let reply = c.line();
        assert_eq!(reply, "STORED", "set {i} of {sets}");
        if reread(i) {
            let key = format!("ow{}", i % KEYS);
            let items = c.read_items();
            // A single connection: the value just stored, or a miss if already evicted.
            if let Some(item) = items.first() {
                assert_eq!(
                    common::version_of(&key, &item.value),
                    Some(i as u64),
                    "{key}: {}",
                    show(&item.value)
                );
            }
        }
    }
    w.join().expect("the writer thread");
    let after = server.rss();
    let stats = c.stats();
    eprintln!(
        "{} MiB of overwrites in {:?}: RSS {} MiB before, {} MiB after; {} demotions",
        TOTAL >> 20,
        started.elapsed(),
        before >> 20,
        after >> 20,
        common::stat_u64(&stats, "terrace_demotions")
    );
    assert!(
        after <= before + tiers_bytes + (100 << 20),
        "RSS grew from {} MiB to {} MiB over 200 MiB of overwrites (bound: + tiers {} MiB + 100 MiB)",
        before >> 20,
        after >> 20,
        tiers_bytes >> 20
    );
    // The last value of every key is the one read back (or it was evicted).
    for k in 0..KEYS {
        let key = format!("ow{k}");
        let last = (0..sets)
            .rev()
            .find(|i| i % KEYS == k)
            .expect("each key was written");
        if let Some(v) = c.get(&key) {
            assert_eq!(
                common::version_of(&key, &v),
                Some(last as u64),
                "{key}: {}",
                show(&v)
            );
        }
    }
    server.assert_alive("after 200 MiB of overwrites");
}

#[test]
fn a_huge_multiget_streams_with_bounded_memory() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);
    let mut c = server.connect();
    let value = common::versioned_value("big", 1, 1 << 20);
    assert_eq!(c.set("big", &value), "STORED");
    let before = server.rss();
    // One line asking for the same 1 MiB value 1500 times: a 1.5 GiB reply.
    const N: usize = 1500;
    let line = format!("get{}\r\n", " big".repeat(N));
    c.send(line.as_bytes());
    let mut peak = before;
    for i in 0..N {
        let l = c.line();
        assert_eq!(l, format!("VALUE big 0 {}", value.len()), "value {i}");
        let data = c.bytes(value.len() + 2);
        assert!(data[..value.len()] == value[..], "value {i} altered");
        if i % 100 == 0 {
            peak = peak.max(server.rss());
        }
    }
    assert_eq!(c.line(), "END");
    eprintln!(
        "1.5 GiB multi-get: RSS {} MiB before, peak {} MiB",
        before >> 20,
        peak >> 20
    );
    assert!(
        peak < before + (100 << 20),
        "a multi-get reply was buffered: RSS {} -> {} MiB",
        before >> 20,
        peak >> 20
    );
    server.assert_alive("after a 1.5 GiB multi-get");
}

#[test]
fn clients_that_never_read_their_replies_do_not_grow_memory() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);
    let value = common::versioned_value("big", 1, 1 << 20);
    assert_eq!(server.connect().set("big", &value), "STORED");
    let before = server.rss();
    // Four connections each ask for 1 GiB of replies and read none of it.
    let mut idle: Vec<Conn> = Vec::new();
    for _ in 0..4 {
        let mut c = server.connect();
        let line = format!("get{}\r\n", " big".repeat(1000));
        c.send(line.as_bytes());
        c.send(b"get big\r\n".repeat(50).as_slice());
        idle.push(c);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let rss = server.rss();
    eprintln!(
        "4 clients not reading 1 GiB each: RSS {} MiB before, {} MiB after",
        before >> 20,
        rss >> 20
    );
    assert!(
        rss < before + (100 << 20),
        "replies nobody reads were buffered: RSS {} -> {} MiB",
        before >> 20,
        rss >> 20
    );
    server.assert_alive("with clients that never read");
    drop(idle);
    server.assert_alive("after clients that never read left");
}

/// Runs `terrace serve` with bad input; it must exit non-zero (within 20 s) with a
/// message containing each of `names`, and must not panic.
fn refuses_to_start(args: &[&str], names: &[&str]) {
    let mut cmd = Command::new(common::terrace_bin());
    cmd.arg("serve").args(args);
    let out = common::run_with_timeout(cmd, Duration::from_secs(20));
    let text = out.text();
    assert!(
        !out.timed_out,
        "terrace serve {args:?} kept running instead of refusing:\n{text}"
    );
    assert!(
        !out.success(),
        "terrace serve {args:?} must exit non-zero:\n{text}"
    );
    assert!(
        !out.stderr.contains("panicked"),
        "terrace serve {args:?} panicked:\n{text}"
    );
    assert_eq!(
        out.status.and_then(|s| s.code()).map(|c| c > 128),
        Some(false),
        "killed by a signal?\n{text}"
    );
    for name in names {
        assert!(
            out.stderr.contains(name),
            "the error of terrace serve {args:?} must name {name:?}:\n{text}"
        );
    }
}

#[test]
fn bad_startup_input_is_named_not_panicked_on() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"I am a file").expect("writing a file");
    let file_arg = file.display().to_string();
    refuses_to_start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--dir",
            &file_arg,
            "--tiers",
            "dram:16MiB,file:16MiB",
        ],
        &["not-a-dir"],
    );
    // A file tier under a file.
    let below = file.join("sub").display().to_string();
    refuses_to_start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--dir",
            &below,
            "--tiers",
            "dram:16MiB,file:16MiB",
        ],
        &["not-a-dir"],
    );
    refuses_to_start(
        &["--listen", "127.0.0.1:0", "--tiers", "bogus"],
        &["bogus", "tiers"],
    );
    // A pool too small for the segments it needs, and one whose quota is not a size.
    let data = dir.path().join("data").display().to_string();
    refuses_to_start(
        &[
            "--listen",
            "127.0.0.1:0",
            "--dir",
            &data,
            "--pool",
            "tiny:t::1%",
        ],
        &["pool \"tiny\"", "a pool needs at least 8"],
    );
    refuses_to_start(
        &["--listen", "127.0.0.1:0", "--pool", "big:b::lots"],
        &["lots"],
    );
    refuses_to_start(
        &["--listen", "127.0.0.1:0", "--tiers", "dram:1XB"],
        &["1XB"],
    );
    refuses_to_start(
        &["--listen", "127.0.0.1:0", "--max-item-size", "0"],
        &["max-item-size"],
    );
    refuses_to_start(&["--listen", "127.0.0.1:0", "--threads", "0"], &["threads"]);
    refuses_to_start(&["--listen", "not-an-address"], &["not-an-address"]);
    let config = dir.path().join("terrace.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\nbogus_key = 1\n")
        .expect("writing the config");
    let config_arg = config.display().to_string();
    refuses_to_start(&["--config", &config_arg], &["bogus_key", "terrace.toml"]);
    let missing = dir.path().join("missing.toml").display().to_string();
    refuses_to_start(&["--config", &missing], &["missing.toml"]);
    std::fs::write(&config, "listen = [\n").expect("writing the config");
    refuses_to_start(&["--config", &config_arg], &["terrace.toml"]);
    // A port in use.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("binding a port");
    let addr = taken.local_addr().expect("local address").to_string();
    let data = dir.path().join("data").display().to_string();
    refuses_to_start(
        &[
            "--listen",
            &addr,
            "--dir",
            &data,
            "--tiers",
            "dram:16MiB,file:16MiB",
        ],
        &[&addr],
    );
}

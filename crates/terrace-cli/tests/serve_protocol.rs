//! `terrace serve`'s ascii protocol end to end over raw sockets, on TCP and on a UNIX
//! socket: every command (set/add/replace/append/prepend/cas, get/gets/gat/gats, incr/
//! decr, touch, delete, flush_all, stats, version, verbosity, quit), `noreply`, multi-key
//! gets, 1000 requests pipelined in one write, expiry; values of exactly the maximum item
//! size (1 MiB by default, 2 MiB with `--max-item-size 2MiB`) stored and read back; and a
//! real client library (the `memcache` crate) in its ascii and binary modes.

mod common;

use std::time::{Duration, Instant};

use common::{show, Conn};

/// Every ascii command on one connection, replies checked byte for byte.
fn exercise_ascii(c: &mut Conn, tag: &str) {
    let k = |name: &str| format!("{tag}-{name}");

    let v = c.cmd("version");
    assert!(v.starts_with("VERSION "), "version: {v:?}");

    // set / get / gets, flags kept.
    assert_eq!(c.store("set", &k("a"), 42, 0, b"hello"), "STORED");
    c.send(format!("get {}\r\n", k("a")).as_bytes());
    assert_eq!(c.line(), format!("VALUE {} 42 5", k("a")));
    assert_eq!(c.line(), "hello");
    assert_eq!(c.line(), "END");
    assert_eq!(c.get(&k("missing")), None, "get of a key never set");
    let item = c.gets(&k("a")).expect("gets of a stored key");
    assert_eq!((item.flags, item.value.as_slice()), (42, &b"hello"[..]));
    let cas = item.cas.expect("gets returns a cas unique");

    // cas: wrong unique, right unique, missing key; the unique changes with the value.
    c.send(format!("cas {} 0 0 1 {}\r\nX\r\n", k("a"), cas.wrapping_add(1)).as_bytes());
    assert_eq!(c.line(), "EXISTS");
    c.send(format!("cas {} 7 0 1 {cas}\r\nY\r\n", k("a")).as_bytes());
    assert_eq!(c.line(), "STORED");
    c.send(format!("cas {} 7 0 1 {cas}\r\nZ\r\n", k("a")).as_bytes());
    assert_eq!(c.line(), "EXISTS", "a used cas unique must not match again");
    c.send(format!("cas {} 0 0 1 1\r\nZ\r\n", k("nocas")).as_bytes());
    assert_eq!(c.line(), "NOT_FOUND");
    let item = c.gets(&k("a")).expect("gets after cas");
    assert_eq!((item.flags, item.value.as_slice()), (7, &b"Y"[..]));
    assert_ne!(item.cas, Some(cas));

    // add / replace.
    assert_eq!(c.store("add", &k("a"), 0, 0, b"no"), "NOT_STORED");
    assert_eq!(c.store("add", &k("b"), 0, 0, b"new"), "STORED");
    assert_eq!(c.store("replace", &k("nob"), 0, 0, b"x"), "NOT_STORED");
    assert_eq!(c.store("replace", &k("b"), 3, 0, b"mid"), "STORED");
    assert_eq!(
        c.get(&k("nob")),
        None,
        "a failed replace must not create the key"
    );

    // append / prepend keep the flags.
    assert_eq!(c.store("append", &k("b"), 0, 0, b"-tail"), "STORED");
    assert_eq!(c.store("prepend", &k("b"), 0, 0, b"head-"), "STORED");
    assert_eq!(c.store("append", &k("noapp"), 0, 0, b"x"), "NOT_STORED");
    let item = c.gets(&k("b")).expect("gets after append");
    assert_eq!(item.value, b"head-mid-tail");
    assert_eq!(item.flags, 3, "append/prepend keep the item's flags");

    // incr / decr: arithmetic, floor at 0, 64-bit wrap, misses, non-numbers.
    assert_eq!(c.set(&k("n"), b"10"), "STORED");
    assert_eq!(c.cmd(&format!("incr {} 5", k("n"))), "15");
    assert_eq!(c.cmd(&format!("decr {} 3", k("n"))), "12");
    assert_eq!(
        c.cmd(&format!("decr {} 100", k("n"))),
        "0",
        "decr stops at 0"
    );
    // The shorter number is written over "12" in place, padded (as memcached does).
    assert_eq!(c.get(&k("n")).as_deref(), Some(&b"0 "[..]));
    assert_eq!(c.set(&k("n"), b"18446744073709551615"), "STORED");
    assert_eq!(
        c.cmd(&format!("incr {} 1", k("n"))),
        "0",
        "incr wraps at 2^64"
    );
    assert_eq!(c.cmd(&format!("incr {} 1", k("non"))), "NOT_FOUND");
    // A result longer than the stored digits, and a new cas unique after incr.
    assert_eq!(c.set(&k("n9"), b"99"), "STORED");
    let before = c.gets(&k("n9")).and_then(|i| i.cas).expect("gets n9");
    assert_eq!(c.cmd(&format!("incr {} 1", k("n9"))), "100");
    assert_eq!(c.get(&k("n9")).as_deref(), Some(&b"100"[..]));
    let after = c.gets(&k("n9")).and_then(|i| i.cas).expect("gets n9");
    assert_ne!(before, after, "incr must change the cas unique");
    c.send(format!("cas {} 0 0 1 {before}\r\n1\r\n", k("n9")).as_bytes());
    assert_eq!(
        c.line(),
        "EXISTS",
        "a cas unique from before an incr must not match"
    );
    assert_eq!(c.set(&k("s"), b"abc"), "STORED");
    assert_eq!(
        c.cmd(&format!("incr {} 1", k("s"))),
        "CLIENT_ERROR cannot increment or decrement non-numeric value"
    );
    assert_eq!(
        c.cmd(&format!("incr {} -1", k("n"))),
        "CLIENT_ERROR invalid numeric delta argument"
    );

    // touch / gat / gats.
    assert_eq!(c.cmd(&format!("touch {} 100", k("a"))), "TOUCHED");
    assert_eq!(c.cmd(&format!("touch {} 100", k("none"))), "NOT_FOUND");
    c.send(format!("gat 100 {} {}\r\n", k("a"), k("none")).as_bytes());
    let items = c.read_items();
    assert_eq!(items.len(), 1, "gat returns only the present key");
    assert_eq!(
        (items[0].key.as_str(), items[0].value.as_slice()),
        (k("a").as_str(), &b"Y"[..])
    );
    assert_eq!(items[0].cas, None, "gat has no cas");
    c.send(format!("gats 100 {}\r\n", k("a")).as_bytes());
    let items = c.read_items();
    assert_eq!(items.len(), 1);
    assert!(items[0].cas.is_some(), "gats returns the cas unique");

    // Keys of 250 bytes (memcached's limit) work.
    let long = format!("{}{}", k("L"), "x".repeat(250 - k("L").len()));
    assert_eq!(c.set(&long, b"long key"), "STORED");
    assert_eq!(c.get(&long).as_deref(), Some(&b"long key"[..]));

    // delete.
    assert_eq!(c.cmd(&format!("delete {}", k("b"))), "DELETED");
    assert_eq!(c.cmd(&format!("delete {}", k("b"))), "NOT_FOUND");
    assert_eq!(c.get(&k("b")), None, "a deleted key must miss");

    // noreply: no reply at all, the effect still happens; `version` right after proves
    // nothing was left in the reply stream.
    c.send(format!("set {} 0 0 2 noreply\r\nnr\r\n", k("q")).as_bytes());
    c.send(format!("add {} 0 0 1 noreply\r\nx\r\n", k("q")).as_bytes());
    c.send(format!("append {} 0 0 1 noreply\r\n!\r\n", k("q")).as_bytes());
    c.send(format!("set {} 0 0 1 noreply\r\n5\r\n", k("qn")).as_bytes());
    c.send(format!("incr {} 2 noreply\r\n", k("qn")).as_bytes());
    c.send(format!("touch {} 100 noreply\r\n", k("qn")).as_bytes());
    c.send(format!("delete {} noreply\r\n", k("a")).as_bytes());
    c.send(b"verbosity 1 noreply\r\n");
    let v = c.cmd("version");
    assert!(
        v.starts_with("VERSION "),
        "noreply commands must not reply; got {v:?}"
    );
    assert_eq!(c.get(&k("q")).as_deref(), Some(&b"nr!"[..]));
    assert_eq!(c.get(&k("qn")).as_deref(), Some(&b"7"[..]));
    assert_eq!(c.get(&k("a")), None);

    // Multi-key get: hits in request order, misses skipped.
    let keys: Vec<String> = (0..100).map(|i| k(&format!("m{i}"))).collect();
    for (i, key) in keys.iter().enumerate() {
        if i % 3 != 0 {
            assert_eq!(c.set(key, format!("value-{i}").as_bytes()), "STORED");
        }
    }
    c.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
    let items = c.read_items();
    let expected: Vec<(String, Vec<u8>)> = keys
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(i, key)| (key.clone(), format!("value-{i}").into_bytes()))
        .collect();
    let got: Vec<(String, Vec<u8>)> = items.into_iter().map(|i| (i.key, i.value)).collect();
    assert_eq!(got, expected, "multi-get returns the hits in request order");

    // 1000 requests in one write: set, get, incr and delete interleaved; every reply in
    // order.
    let mut batch = Vec::new();
    let mut expect: Vec<String> = Vec::new();
    for i in 0..250 {
        let key = k(&format!("p{i}"));
        let val = format!("{i}");
        batch.extend_from_slice(format!("set {key} 0 0 {}\r\n{val}\r\n", val.len()).as_bytes());
        expect.push("STORED".into());
        batch.extend_from_slice(format!("incr {key} 1000\r\n").as_bytes());
        expect.push(format!("{}", i + 1000));
        batch.extend_from_slice(format!("get {key}\r\n").as_bytes());
        expect.push(format!("VALUE {key} 0 {}", (i + 1000).to_string().len()));
        expect.push(format!("{}", i + 1000));
        expect.push("END".into());
        batch.extend_from_slice(format!("delete {key}\r\n").as_bytes());
        expect.push("DELETED".into());
    }
    c.send(&batch);
    for (n, want) in expect.iter().enumerate() {
        let got = c.line();
        assert_eq!(&got, want, "pipelined reply line {n}");
    }
    assert_eq!(c.get(&k("p7")), None);

    // stats: memcached's names, numbers that moved.
    let stats = c.stats();
    for name in [
        "pid",
        "uptime",
        "curr_connections",
        "cmd_get",
        "cmd_set",
        "get_hits",
        "curr_items",
        "limit_maxbytes",
    ] {
        assert!(stats.contains_key(name), "stats lacks {name}: {stats:?}");
    }
    assert!(common::stat_u64(&stats, "cmd_set") >= 250);
    assert!(common::stat_u64(&stats, "get_hits") >= 250);
    assert!(common::stat_u64(&stats, "curr_connections") >= 1);
    c.send(b"stats settings\r\n");
    let mut settings = Vec::new();
    loop {
        let l = c.line();
        if l == "END" {
            break;
        }
        settings.push(l);
    }
    assert!(
        settings
            .iter()
            .any(|l| l.starts_with("STAT item_size_max ")),
        "stats settings: {settings:?}"
    );
    assert_eq!(c.cmd("verbosity 1"), "OK");

    // flush_all empties the cache; the connection goes on.
    assert_eq!(c.set(&k("f"), b"x"), "STORED");
    assert_eq!(c.cmd("flush_all"), "OK");
    assert_eq!(c.get(&k("f")), None, "flush_all must remove every item");
    assert_eq!(c.get(&k("q")), None);
    assert_eq!(
        c.set(&k("f"), b"y"),
        "STORED",
        "stores work after flush_all"
    );
    assert_eq!(c.get(&k("f")).as_deref(), Some(&b"y"[..]));

    // Expiry: a relative exptime, touch to a short one, a negative one (already expired).
    assert_eq!(c.store("set", &k("e1"), 0, 1, b"short"), "STORED");
    assert_eq!(c.set(&k("e2"), b"touched"), "STORED");
    assert_eq!(c.cmd(&format!("touch {} 1", k("e2"))), "TOUCHED");
    assert_eq!(c.store("set", &k("e3"), 0, 100, b"long"), "STORED");
    assert_eq!(c.set(&k("e4"), b"old"), "STORED");
    assert_eq!(c.store("set", &k("e4"), 0, -1, b"gone"), "STORED");
    assert_eq!(
        c.get(&k("e4")),
        None,
        "a negative exptime stores an expired item"
    );
    assert_eq!(c.get(&k("e1")).as_deref(), Some(&b"short"[..]));
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        c.get(&k("e1")),
        None,
        "an item with exptime 1 s must be gone after 2.5 s"
    );
    assert_eq!(c.get(&k("e2")), None, "touch 1 must make the item expire");
    assert_eq!(c.get(&k("e3")).as_deref(), Some(&b"long"[..]));

    // quit closes the connection.
    c.send(b"quit\r\n");
    let rest = c.read_to_close(Duration::from_secs(5));
    assert!(
        rest.is_empty(),
        "quit replies nothing; got {:?}",
        show(&rest)
    );
}

#[test]
fn ascii_commands_over_tcp() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);
    let mut c = server.connect();
    exercise_ascii(&mut c, "tcp");
    server.assert_alive("after the ascii commands over TCP");
}

#[test]
fn ascii_commands_over_unix_socket() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let sock = dir.path().join("terrace.sock");
    let sock_arg = sock.display().to_string();
    let mut server = common::start(dir.path(), &["--unix", &sock_arg]);
    assert_eq!(server.port, None, "--unix alone turns TCP off");
    assert_eq!(server.unix.as_deref(), Some(sock.as_path()));
    let mut c = server.connect_unix();
    exercise_ascii(&mut c, "unix");
    // A second UNIX connection sees the same cache.
    let mut c2 = server.connect_unix();
    assert_eq!(c2.set("shared", b"1"), "STORED");
    let mut c3 = server.connect_unix();
    assert_eq!(c3.get("shared").as_deref(), Some(&b"1"[..]));
    // Clean shutdown removes the socket file.
    let status = server.terminate();
    assert!(
        status.success(),
        "SIGTERM exit: {status:?}\n{}",
        server.log_text()
    );
    assert!(!sock.exists(), "the socket file is removed at shutdown");
}

#[test]
fn delayed_flush_all() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let server = common::start(dir.path(), &[]);
    let mut c = server.connect();
    assert_eq!(c.set("d", b"1"), "STORED");
    assert_eq!(c.cmd("flush_all 2"), "OK");
    assert_eq!(
        c.get("d").as_deref(),
        Some(&b"1"[..]),
        "a delayed flush_all waits"
    );
    let deadline = Instant::now() + Duration::from_secs(6);
    while c.get("d").is_some() {
        assert!(
            Instant::now() < deadline,
            "flush_all 2 had no effect after 6 s"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(c.set("d", b"2"), "STORED");
    assert_eq!(
        c.get("d").as_deref(),
        Some(&b"2"[..]),
        "stores after the flush stay"
    );
}

#[test]
fn tcp_and_unix_together_share_the_cache() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let sock = dir.path().join("both.sock");
    let sock_arg = sock.display().to_string();
    let server = common::start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--unix", &sock_arg],
    );
    let mut tcp = server.connect();
    let mut unix = server.connect_unix();
    assert_eq!(tcp.set("both", b"over tcp"), "STORED");
    assert_eq!(unix.get("both").as_deref(), Some(&b"over tcp"[..]));
}

/// A value of exactly `size` bytes is stored and read back intact; `size + 1` is refused.
fn max_size_value(c: &mut Conn, size: usize) {
    let mut rng = common::Rng::new("max_size_value");
    let mut value = vec![0u8; size];
    rng.fill(&mut value);
    let started = Instant::now();
    assert_eq!(
        c.set("big", &value),
        "STORED",
        "a value of exactly {size} bytes"
    );
    let got = c.get("big").expect("the maximum-size value reads back");
    assert!(
        got.len() == value.len() && got == value,
        "the {size}-byte value came back altered"
    );
    // Also through gets, and twice in one multi-get.
    let item = c.gets("big").expect("gets of the big value");
    assert!(item.value == value);
    let both = {
        c.send(b"get big big\r\n");
        c.read_items()
    };
    assert_eq!(both.len(), 2);
    assert!(both.iter().all(|i| i.value == value));
    let over = vec![b'x'; size + 1];
    assert_eq!(
        c.set("big2", &over),
        "SERVER_ERROR object too large for cache"
    );
    assert_eq!(c.get("big2"), None);
    eprintln!("{size}-byte round trips took {:?}", started.elapsed());
}

#[test]
fn values_up_to_the_default_max_item_size() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let server = common::start(dir.path(), &[]);
    let mut c = server.connect();
    max_size_value(&mut c, 1 << 20);
    let settings = {
        c.send(b"stats settings\r\n");
        let mut v = Vec::new();
        loop {
            let l = c.line();
            if l == "END" {
                break v;
            }
            v.push(l);
        }
    };
    assert!(
        settings.contains(&"STAT item_size_max 1048576".to_string()),
        "{settings:?}"
    );
}

#[test]
fn max_item_size_flag_allows_2mib() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let server = common::start(
        dir.path(),
        &[
            "--max-item-size",
            "2MiB",
            "--tiers",
            "dram:32MiB,file:64MiB",
        ],
    );
    let mut c = server.connect();
    max_size_value(&mut c, 2 << 20);
}

/// The `memcache` crate (rust-memcache) over `url`: set/get/incr/delete and friends.
fn client_library(url: &str) {
    let client = memcache::Client::builder()
        .add_server(url)
        .unwrap_or_else(|e| panic!("memcache client for {url}: {e}"))
        .with_connection_timeout(Duration::from_secs(10))
        .with_read_timeout(Duration::from_secs(10))
        .with_write_timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_else(|e| panic!("memcache client for {url}: {e}"));
    let ctx = |op: &str| format!("{op} through the memcache crate at {url}");
    let version = client
        .version()
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("version")));
    assert!(
        !version.is_empty() && version[0].1.contains("terrace"),
        "{version:?}"
    );

    client
        .set("lib:s", "hello", 0)
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("set")));
    let v: Option<String> = client
        .get("lib:s")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("get")));
    assert_eq!(v.as_deref(), Some("hello"));
    let none: Option<String> = client
        .get("lib:none")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("get miss")));
    assert_eq!(none, None);

    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    client
        .set("lib:bin", bytes.as_slice(), 0)
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("set binary")));
    let back: Option<Vec<u8>> = client
        .get("lib:bin")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("get binary")));
    assert!(
        back.as_deref() == Some(bytes.as_slice()),
        "binary value altered"
    );

    client
        .set("lib:n", 41u64, 0)
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("set number")));
    assert_eq!(
        client
            .increment("lib:n", 1)
            .unwrap_or_else(|e| panic!("{}: {e}", ctx("incr"))),
        42
    );
    assert_eq!(
        client
            .decrement("lib:n", 2)
            .unwrap_or_else(|e| panic!("{}: {e}", ctx("decr"))),
        40
    );
    let n: Option<u64> = client
        .get("lib:n")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("get number")));
    assert_eq!(n, Some(40));

    client
        .add("lib:a", "first", 0)
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("add")));
    // The crate reports NOT_STORED as an error in binary mode but as Ok in ascii mode:
    // what counts is that the present value was kept.
    let second = client.add("lib:a", "second", 0);
    if !url.contains("protocol=ascii") {
        assert!(
            second.is_err(),
            "{}: add of a present key must fail",
            ctx("add")
        );
    }
    let a: Option<String> = client
        .get("lib:a")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("get")));
    assert_eq!(
        a.as_deref(),
        Some("first"),
        "{}: add must not replace a present key",
        ctx("add")
    );
    client
        .replace("lib:a", "third", 0)
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("replace")));
    client
        .append("lib:a", "!")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("append")));
    client
        .prepend("lib:a", "<")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("prepend")));
    let a: Option<String> = client
        .get("lib:a")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("get")));
    assert_eq!(
        a.as_deref(),
        Some("<third!"),
        "{}",
        ctx("replace/append/prepend")
    );

    assert!(client
        .touch("lib:a", 100)
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("touch"))));
    assert!(!client
        .touch("lib:none", 100)
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("touch miss"))));

    let multi: std::collections::HashMap<String, String> = client
        .gets(&["lib:s", "lib:none", "lib:a"])
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("multi-get")));
    assert_eq!(multi.len(), 2, "{multi:?}");
    assert_eq!(multi.get("lib:s").map(String::as_str), Some("hello"));

    assert!(client
        .delete("lib:s")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("delete"))));
    assert!(!client
        .delete("lib:s")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("delete miss"))));
    let gone: Option<String> = client
        .get("lib:s")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("get deleted")));
    assert_eq!(gone, None);

    // memcache 0.21's ascii `stats` stops at the first STAT line (its loop tests
    // `response != END` the wrong way round) and leaves the rest unread, which
    // desynchronises the connection: only the binary mode's is usable.
    if !url.contains("protocol=ascii") {
        let stats = client
            .stats()
            .unwrap_or_else(|e| panic!("{}: {e}", ctx("stats")));
        assert!(
            stats.iter().any(|(_, s)| s.contains_key("curr_items")),
            "{}: {stats:?}",
            ctx("stats")
        );
    }
    client
        .flush()
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("flush")));
    let flushed: Option<String> = client
        .get("lib:a")
        .unwrap_or_else(|e| panic!("{}: {e}", ctx("get after flush")));
    assert_eq!(flushed, None);
}

#[test]
fn memcache_crate_ascii_mode() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let sock = dir.path().join("lib.sock");
    let sock_arg = sock.display().to_string();
    let server = common::start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--unix", &sock_arg],
    );
    client_library(&format!(
        "memcache://127.0.0.1:{}?protocol=ascii",
        server.port()
    ));
    // No host and no port: the crate connects to the UNIX socket at the path.
    client_library(&format!("memcache://{}?protocol=ascii", sock.display()));
}

#[test]
fn memcache_crate_binary_mode() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let sock = dir.path().join("lib.sock");
    let sock_arg = sock.display().to_string();
    let server = common::start(
        dir.path(),
        &["--listen", "127.0.0.1:0", "--unix", &sock_arg],
    );
    client_library(&format!("memcache://127.0.0.1:{}", server.port()));
    client_library(&format!("memcache://{}", sock.display()));
}

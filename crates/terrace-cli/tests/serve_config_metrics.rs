//! `terrace serve` configured from a TOML file (the same settings as the flags, flags
//! winning), the Prometheus endpoint (`--metrics`) reporting what the protocol did, the
//! meta protocol end to end, and `--promote` moving items read in the file tier back
//! into DRAM.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// The body of `GET /metrics`, retried while the endpoint comes up.
fn scrape(port: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(mut s) => {
                s.set_read_timeout(Some(Duration::from_secs(10)))
                    .expect("read timeout");
                s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                    .expect("sending the scrape");
                let mut text = String::new();
                s.read_to_string(&mut text).expect("reading the scrape");
                return text;
            }
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("metrics endpoint on port {port}: {e}"),
        }
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

#[test]
fn config_file_settings_apply_and_flags_win() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let metrics_port = common::free_port();
    let config = dir.path().join("terrace.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\n\
             dir = \"{}\"\n\
             tiers = \"dram:1,file:3\"\n\
             capacity = \"128MiB\"\n\
             threads = 1\n\
             max-item-size = \"2MiB\"\n\
             max-connections = 3\n\
             metrics = \"127.0.0.1:{metrics_port}\"\n",
            dir.path().join("data").display()
        ),
    )
    .expect("writing the config file");
    let config = config.display().to_string();
    let server = common::start(dir.path(), &["--config", &config, "--max-connections", "4"]);

    // max-item-size from the file: a 2 MiB value is stored.
    let mut c = server.connect();
    let value = vec![b'x'; 2 << 20];
    c.send(format!("set big 0 0 {}\r\n", value.len()).as_bytes());
    c.send(&value);
    c.send(b"\r\n");
    assert_eq!(c.line(), "STORED");

    // Tiers and capacity from the file: 8 MiB of DRAM, 24 MiB of file.
    // Asked on `c` itself: a separate stats connection would still be counted
    // against max-connections until the server notices its close, which races
    // with the admissions below.
    let stats = c.stats();
    let seg: u64 = stats["terrace_segment_bytes"]
        .parse()
        .expect("segment size");
    let tier0: u64 = stats["tier_0_bytes"].parse().expect("tier 0 bytes");
    let tier1: u64 = stats["tier_1_bytes"].parse().expect("tier 1 bytes");
    assert!(
        tier0 <= 32 << 20 && tier0 + seg > 32 << 20,
        "tier 0: {tier0}"
    );
    assert!(
        tier1 <= 96 << 20 && tier1 + seg > 96 << 20,
        "tier 1: {tier1}"
    );
    // The one item is counted in tier 0, with its bytes.
    assert_eq!(stats["tier_0_items"], "1");
    assert_eq!(stats["tier_1_items"], "0");
    let live: u64 = stats["tier_0_live_bytes"]
        .parse()
        .expect("tier 0 live bytes");
    assert!(live >= 2 << 20, "tier 0 live bytes: {live}");
    // The test harness passes --threads 2, which beats the file's 1.
    assert_eq!(stats["threads"], "2");

    // max-connections: the flag (4) beats the file (3).
    assert_eq!(stats["max_connections"], "4");
    let mut others: Vec<_> = (0..3).map(|_| server.connect()).collect();
    for other in &mut others {
        let reply = other.cmd("version");
        assert!(reply.starts_with("VERSION "), "connection 2..4: {reply}");
    }
    let mut fifth = server.connect();
    assert_eq!(fifth.line(), "ERROR Too many open connections");
    drop(others);
    drop(c);
    drop(fifth);
    // The server notices the closes asynchronously: a slot frees up within moments.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = server.connect().cmd("version");
        if reply.starts_with("VERSION ") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no connection slot freed: {reply}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn prometheus_endpoint_reports_the_protocol_counters() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let metrics_port = common::free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut server = common::start(dir.path(), &["--metrics", &metrics]);
    let mut c = server.connect();
    for i in 0..10 {
        c.send(format!("set k{i} 0 0 1\r\nx\r\n").as_bytes());
        assert_eq!(c.line(), "STORED");
    }
    c.send(b"get k1 k2 nope\r\n");
    for _ in 0..4 {
        c.line();
    }
    assert_eq!(c.line(), "END");

    let scrape = scrape(metrics_port);
    assert!(scrape.starts_with("HTTP/1.1 200 OK\r\n"), "{scrape}");
    assert!(
        scrape.contains("Content-Type: text/plain; version=0.0.4"),
        "{scrape}"
    );
    assert_eq!(metric(&scrape, "memcached_cmd_set"), 10.0);
    assert_eq!(metric(&scrape, "memcached_get_hits"), 2.0);
    assert_eq!(metric(&scrape, "memcached_get_misses"), 1.0);
    assert_eq!(metric(&scrape, "memcached_curr_items"), 10.0);
    assert!(metric(&scrape, "memcached_curr_connections") >= 1.0);
    assert!(metric(&scrape, "terrace_tier_segments{tier=\"0\"}") > 0.0);
    assert!(metric(&scrape, "terrace_tier_segments{tier=\"1\"}") > 0.0);

    // Anything but /metrics is a 404; a client that sends nothing is dropped.
    let mut s = TcpStream::connect(("127.0.0.1", metrics_port)).expect("metrics connect");
    s.write_all(b"GET /other HTTP/1.1\r\n\r\n").expect("send");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    assert!(text.starts_with("HTTP/1.1 404"), "{text}");
    server.assert_alive("after the scrapes");
}

#[test]
fn meta_commands_end_to_end() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &[]);
    let mut c = server.connect();
    c.send(b"ms mkey 5 T0 F7 c\r\nhello\r\n");
    let stored = c.line();
    assert!(stored.starts_with("HD c"), "{stored}");
    let cas: u64 = stored[4..].trim().parse().expect("cas after ms c");
    c.send(b"mg mkey v f c k s\r\n");
    assert_eq!(c.line(), format!("VA 5 f7 c{cas} kmkey s5"));
    assert_eq!(c.line(), "hello");
    c.send(format!("ms mkey 3 C{}\r\nnew\r\n", cas + 1).as_bytes());
    assert_eq!(c.line(), "EX");
    c.send(b"ma counter N0 J10 v\r\n");
    assert_eq!(c.line(), "VA 2");
    assert_eq!(c.line(), "10");
    c.send(b"mg missing v q\r\nmg mkey v q O42\r\nmn\r\n");
    assert_eq!(c.line(), "VA 5 O42");
    assert_eq!(c.line(), "hello");
    assert_eq!(c.line(), "MN");
    c.send(b"md mkey q\r\nmg mkey v\r\n");
    assert_eq!(c.line(), "EN");
    server.assert_alive("after the meta commands");
}

#[test]
fn promote_brings_items_read_in_the_file_tier_back_into_dram() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let server = common::start(
        dir.path(),
        &["--tiers", "dram:16MiB,file:64MiB", "--promote"],
    );
    let mut c = server.connect();
    // Hot keys, read once in DRAM (so they are demoted, not dropped), then a stream of
    // cold writes that pushes them down into the file tier.
    let value = vec![b'h'; 4000];
    for k in 0..64 {
        assert_eq!(c.set(&format!("hot{k}"), &value), "STORED");
        assert!(c.get(&format!("hot{k}")).is_some());
    }
    let cold = vec![b'c'; 8000];
    for k in 0..6000 {
        assert_eq!(c.set(&format!("cold{k}"), &cold), "STORED");
    }
    let stats = server.stats();
    let demoted: u64 = stats["tier_1_demotions_in"].parse().expect("demotions");
    assert!(demoted >= 64, "hot keys were demoted: {demoted}");
    // Two more reads each in the file tier: the second asks for promotion, and the
    // movers (every few milliseconds) copy the item up.
    for _ in 0..2 {
        for k in 0..64 {
            assert_eq!(c.get(&format!("hot{k}")).as_deref(), Some(&value[..]));
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stats = server.stats();
        let promoted: u64 = stats["terrace_promotions"].parse().expect("promotions");
        let into_dram: u64 = stats["tier_0_promotions_in"]
            .parse()
            .expect("promotions_in");
        if promoted >= 32 {
            assert_eq!(into_dram, promoted);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {promoted} of 64 hot keys promoted after 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Promoted items read back unchanged.
    for k in 0..64 {
        assert_eq!(c.get(&format!("hot{k}")).as_deref(), Some(&value[..]));
    }
}

#[test]
fn pools_route_keys_by_prefix_keep_their_quota_and_restart_warm() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let metrics_port = common::free_port();
    let metrics = format!("127.0.0.1:{metrics_port}");
    // 64 + 192 MiB; pool sess (keys "sess:…") a quarter of each tier: 16 + 48 MiB (8 and
    // 24 segments of 2 MiB; a pool needs 8 in every tier).
    let args = [
        "--tiers",
        "dram:64MiB,file:192MiB",
        "--pool",
        "sess:sess::25%",
        "--metrics",
        &metrics,
    ];
    let mut server = common::start(dir.path(), &args);
    let mut c = server.connect();
    let value = vec![b'v'; 1000];
    for k in 0..100 {
        assert_eq!(c.set(&format!("keep{k}"), &value), "STORED");
    }
    // More session data than the pool's 64 MiB: the pool evicts its own items only.
    let session = vec![b's'; 4000];
    for k in 0..20_000 {
        assert_eq!(c.set(&format!("sess:{k}"), &session), "STORED");
    }
    for k in 0..100 {
        assert!(
            c.get(&format!("keep{k}")).as_deref() == Some(&value[..]),
            "default-pool key keep{k} after the sess pool overflowed"
        );
    }
    assert!(c.get("sess:19999").as_deref() == Some(&session[..]));
    let stats = c.stats();
    let n = |name: &str| -> u64 {
        stats
            .get(name)
            .unwrap_or_else(|| panic!("no stat {name}"))
            .parse()
            .expect("a number")
    };
    assert_eq!(n("pool_default_curr_items"), 100);
    assert_eq!(n("pool_default_evictions"), 0);
    assert!(n("pool_sess_evictions") > 0);
    // Nothing here has a TTL: no space was reclaimed from expired items.
    assert_eq!(n("pool_sess_reclaimed"), 0);
    assert_eq!(n("pool_sess_limit_maxbytes"), 64 << 20);
    assert_eq!(n("pool_default_limit_maxbytes"), 192 << 20);
    assert_eq!(n("limit_maxbytes"), 256 << 20);
    assert_eq!(
        n("curr_items"),
        n("pool_default_curr_items") + n("pool_sess_curr_items")
    );
    assert!(n("pool_sess_get_hits") >= 1);
    let scrape = scrape(metrics_port);
    assert_eq!(
        metric(&scrape, "terrace_pool_curr_items{pool=\"default\"}"),
        100.0
    );
    assert!(metric(&scrape, "terrace_pool_evictions{pool=\"sess\"}") > 0.0);

    // A clean stop saves every pool; the next start is warm in each.
    let in_sess: Vec<u32> = (19_900..20_000)
        .filter(|k| c.get(&format!("sess:{k}")).is_some())
        .collect();
    assert!(in_sess.len() >= 90, "the newest sessions are kept");
    drop(c);
    assert!(server.terminate().success(), "{}", server.log_text());
    let server = common::start(dir.path(), &args[..4]);
    let mut c = server.connect();
    let expected = (0..100)
        .map(|k| (format!("keep{k}"), &value))
        .chain(in_sess.iter().map(|k| (format!("sess:{k}"), &session)));
    let lost: Vec<String> = expected
        .filter(|(key, want)| c.get(key).as_deref() != Some(&want[..]))
        .map(|(key, _)| key)
        .collect();
    assert!(lost.is_empty(), "lost over a clean restart: {lost:?}");
}

//! Scale-out behind twemproxy (nutcracker, Debian package nutcracker): three `terrace
//! serve` instances on loopback ports behind one proxy (fnv1a_64, ketama, auto-eject):
//! - 300 keys set through the proxy are spread over all three (> 10% each, checked on
//!   direct connections);
//! - one instance SIGKILLed: after at most a few failures the proxy ejects it and ≥ 95% of
//!   new sets and gets succeed;
//! - the instance restarted on the same port and data directory: after
//!   server_retry_timeout the proxy sends it new keys again.
//!
//! Skipped with a loud message when nutcracker is not installed, unless
//! TERRACE_REQUIRE_TOOLS=1 (CI), which makes a missing tool a failure.

mod common;

use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ChildGuard, Conn, Server};

const RETRY_MS: u64 = 2000;

/// A client of the proxy that reconnects after a failure.
struct ProxyClient {
    port: u16,
    conn: Option<Conn>,
}

impl ProxyClient {
    fn conn(&mut self) -> std::io::Result<&mut Conn> {
        if self.conn.is_none() {
            let s = TcpStream::connect(("127.0.0.1", self.port))?;
            let c = Conn::from_tcp(s);
            c.set_read_timeout(Duration::from_secs(3));
            self.conn = Some(c);
        }
        Ok(self.conn.as_mut().expect("just connected"))
    }

    /// One `set`: true if STORED.
    fn set_once(&mut self, key: &str, value: &str) -> bool {
        let r = self.conn().and_then(|c| {
            c.try_send(format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()).as_bytes())?;
            c.try_line()
        });
        match r {
            Ok(line) => line == "STORED",
            Err(_) => {
                self.conn = None;
                false
            }
        }
    }

    /// One `get`: true if it returned exactly `value`.
    fn get_once(&mut self, key: &str, value: &str) -> bool {
        let r = self.conn().and_then(|c| {
            c.try_send(format!("get {key}\r\n").as_bytes())?;
            c.try_read_items()
        });
        match r {
            Ok(Ok(items)) => items.len() == 1 && items[0].value == value.as_bytes(),
            Ok(Err(_)) => false,
            Err(_) => {
                self.conn = None;
                false
            }
        }
    }

    /// A set retried up to `tries` times, 100 ms apart; returns the failed attempts, or
    /// panics if every attempt failed.
    fn set_retrying(&mut self, key: &str, value: &str, tries: usize) -> usize {
        for failed in 0..tries {
            if self.set_once(key, value) {
                return failed;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("set {key} through the proxy failed {tries} times in a row");
    }
}

/// Which of the `servers` hold `key` (direct `get`).
fn holders(servers: &[&Server], keys: &[String]) -> Vec<usize> {
    servers
        .iter()
        .map(|s| {
            let mut c = s.connect();
            keys.chunks(100).map(|batch| c.get_multi(batch).len()).sum()
        })
        .collect()
}

fn write_config(path: &Path, proxy_port: u16, ports: &[u16]) {
    let mut yaml = format!(
        "terrace:\n  listen: 127.0.0.1:{proxy_port}\n  hash: fnv1a_64\n  distribution: ketama\n  \
         auto_eject_hosts: true\n  server_retry_timeout: {RETRY_MS}\n  server_failure_limit: 1\n  \
         timeout: 400\n  servers:\n"
    );
    for (i, p) in ports.iter().enumerate() {
        yaml.push_str(&format!("   - 127.0.0.1:{p}:1 terrace{i}\n"));
    }
    std::fs::write(path, yaml).expect("writing the nutcracker config");
}

#[test]
fn three_servers_behind_nutcracker() {
    let Some(nutcracker) = common::require_tool("nutcracker", "nutcracker") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let dirs: Vec<_> = (0..3)
        .map(|i| dir.path().join(format!("node{i}")))
        .collect();
    for d in &dirs {
        std::fs::create_dir_all(d).expect("creating a node directory");
    }
    let small = ["--tiers", "dram:16MiB,file:32MiB"];
    let mut servers: Vec<Server> = dirs.iter().map(|d| common::start(d, &small)).collect();
    let ports: Vec<u16> = servers.iter().map(|s| s.port()).collect();

    let proxy_port = common::free_port();
    let stats_port = common::free_port();
    let config = dir.path().join("nutcracker.yml");
    write_config(&config, proxy_port, &ports);
    let mut check = Command::new(&nutcracker);
    check.arg("-t").arg("-c").arg(&config);
    let checked = common::run_with_timeout(check, Duration::from_secs(20));
    assert!(
        checked.success(),
        "nutcracker -t rejected the config:\n{}",
        checked.text()
    );

    let log = dir.path().join("nutcracker.log");
    let child = Command::new(&nutcracker)
        .arg("-c")
        .arg(&config)
        .args(["-s", &stats_port.to_string(), "-a", "127.0.0.1", "-v", "6"])
        .arg("-o")
        .arg(&log)
        .arg("-p")
        .arg(dir.path().join("nutcracker.pid"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting nutcracker");
    let mut proxy = ChildGuard::new("nutcracker", child);
    let proxy_log = || {
        std::fs::read_to_string(&log)
            .map(|t| t[t.len().saturating_sub(4096)..].to_string())
            .unwrap_or_default()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", proxy_port)).is_err() {
        assert!(proxy.running(), "nutcracker exited:\n{}", proxy_log());
        assert!(
            Instant::now() < deadline,
            "nutcracker did not listen within 10 s:\n{}",
            proxy_log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut client = ProxyClient {
        port: proxy_port,
        conn: None,
    };

    // 300 keys through the proxy, spread over the three. The varying part leads the key:
    // twemproxy's fnv1a_64 barely mixes the last bytes, so keys that differ only in their
    // last digit land on one ketama point, ten at a time.
    let keys: Vec<String> = (0..300).map(|i| format!("{i}:spread")).collect();
    for k in &keys {
        assert_eq!(
            client.set_retrying(k, &format!("v-{k}"), 3),
            0,
            "set {k} with all servers up"
        );
    }
    for k in &keys {
        assert!(
            client.get_once(k, &format!("v-{k}")),
            "get {k} through the proxy"
        );
    }
    let shares = holders(&servers.iter().collect::<Vec<_>>(), &keys);
    eprintln!("300 keys through the proxy: {shares:?} per server");
    assert_eq!(
        shares.iter().sum::<usize>(),
        300,
        "each key on exactly one server: {shares:?}"
    );
    for (i, n) in shares.iter().enumerate() {
        assert!(*n > 30, "server {i} holds only {n} of 300 keys: {shares:?}");
    }

    // Kill one: the proxy ejects it after a few failures.
    let victim = 1;
    servers[victim].kill9();
    let mut failures = 0;
    let mut streak = 0;
    let mut i = 0;
    let deadline = Instant::now() + Duration::from_secs(15);
    while streak < 30 {
        let k = format!("{i}:eject");
        i += 1;
        if client.set_once(&k, "x") && client.get_once(&k, "x") {
            streak += 1;
        } else {
            failures += 1;
            streak = 0;
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(
            Instant::now() < deadline,
            "no 30 successes in a row within 15 s of a kill ({failures} failures)\n{}",
            proxy_log()
        );
    }
    eprintln!("after the kill: {failures} failed operations before the proxy ejected the server");
    assert!(
        failures <= 10,
        "{failures} failures before the proxy ejected the dead server"
    );
    // After ejection: new sets and gets, one attempt each (the proxy retries the dead
    // server every {RETRY_MS} ms, which may fail an operation now and then).
    let mut ok = 0;
    let total = 400;
    for j in 0..total / 2 {
        let k = format!("{j}:after");
        ok += usize::from(client.set_once(&k, "after"));
        ok += usize::from(client.get_once(&k, "after"));
    }
    eprintln!("after ejection: {ok}/{total} sets+gets succeeded");
    assert!(
        ok * 100 >= total * 95,
        "only {ok}/{total} operations succeeded after ejection\n{}",
        proxy_log()
    );

    // Restart the victim on its port and data directory; once the retry timeout has
    // passed the proxy sends it keys again.
    let listen = format!("127.0.0.1:{}", ports[victim]);
    servers[victim] = common::start(
        &dirs[victim],
        &["--listen", &listen, "--tiers", "dram:16MiB,file:32MiB"],
    );
    assert_eq!(servers[victim].port(), ports[victim]);
    std::thread::sleep(Duration::from_millis(RETRY_MS + 500));
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut round = 0;
    loop {
        let batch: Vec<String> = (0..300).map(|j| format!("{j}:back{round}")).collect();
        let mut failed = 0;
        for k in &batch {
            failed += client.set_retrying(k, "back", 5);
        }
        let shares = holders(&servers.iter().collect::<Vec<_>>(), &batch);
        eprintln!("300 keys after the restart (round {round}): {shares:?} per server, {failed} retried sets");
        if shares[victim] > 30 {
            assert!(shares.iter().all(|&n| n > 30), "{shares:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted server got no share of new keys within 15 s: {shares:?}\n{}",
            proxy_log()
        );
        round += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(proxy.running(), "nutcracker died:\n{}", proxy_log());
    for (i, s) in servers.iter_mut().enumerate() {
        s.assert_alive(&format!("server {i} at the end"));
    }
}

//! What the test crates of terrace-bench share: running the binary, and a real memcached
//! on a free loopback port (`None`, saying so, where it is not installed).
#![allow(dead_code)]

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_terrace-bench"))
        .args(args)
        .output()
        .expect("run terrace-bench")
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

/// A memcached child process, killed on drop.
pub struct Memcached {
    pub child: Child,
    pub addr: String,
}

impl Drop for Memcached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether this process runs as root (memcached then needs `-u`), from /proc.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("Uid:"))?.to_string();
            line.split_whitespace().nth(2).map(|euid| euid == "0")
        })
        .unwrap_or(false)
}

/// Starts memcached on a free port with `extra` arguments, or returns `None` (saying
/// why) if it is not installed.
pub fn memcached(extra: &[&str]) -> Option<Memcached> {
    if Command::new("memcached").arg("-V").output().is_err() {
        eprintln!("skipped: memcached is not installed (apt-get install memcached)");
        return None;
    }
    let port = free_port();
    let mut cmd = Command::new("memcached");
    cmd.args(["-l", "127.0.0.1", "-U", "0", "-t", "2"])
        .args(["-p", &port.to_string()])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if is_root() {
        cmd.args(["-u", "nobody"]);
    }
    let child = cmd.spawn().expect("start memcached");
    let mut m = Memcached {
        child,
        addr: format!("127.0.0.1:{port}"),
    };
    let start = Instant::now();
    while TcpStream::connect(&m.addr).is_err() {
        assert!(
            m.child.try_wait().unwrap().is_none(),
            "memcached {extra:?} exited"
        );
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "memcached did not listen on {}",
            m.addr
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(m)
}

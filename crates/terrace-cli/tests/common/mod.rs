//! Shared helpers of the `terrace serve` black-box tests: start the real binary in a
//! temporary directory, wait for its "listening" lines, talk to it over raw sockets with
//! timeouts, stop it (SIGTERM or SIGKILL), and run external tools (memccapable,
//! nutcracker) bounded in time.
//!
//! Every child process is owned by a guard whose `Drop` kills it, so a failing assertion
//! never leaves a server or a proxy running; every socket has read and write timeouts,
//! so no test can hang on a silent server.

#![allow(dead_code)] // each test file uses its own subset

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long a server gets to print its listening lines.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server gets to exit after SIGTERM.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(20);
/// Socket read/write timeout of test clients.
pub const IO_TIMEOUT: Duration = Duration::from_secs(15);

/// The `terrace` binary under test.
pub fn terrace_bin() -> &'static str {
    env!("CARGO_BIN_EXE_terrace")
}

// ---------------------------------------------------------------------------------------
// Child processes

/// A child process killed (SIGKILL) and reaped when dropped, unless it already exited.
pub struct ChildGuard {
    pub child: Option<Child>,
    pub name: String,
}

impl ChildGuard {
    pub fn new(name: &str, child: Child) -> ChildGuard {
        ChildGuard {
            child: Some(child),
            name: name.to_string(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Whether the process is still running (not yet reaped).
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends `signal` (if the process has not been reaped).
    pub fn signal(&mut self, signal: libc::c_int) {
        if self.running() {
            let pid = self.pid() as libc::pid_t;
            // SAFETY: kill(2) with the pid of our own unreaped child (so the pid cannot
            // have been reused) and a valid signal number; it touches no memory.
            let rc = unsafe { libc::kill(pid, signal) };
            assert_eq!(
                rc,
                0,
                "kill({pid}, {signal}) failed: {}",
                std::io::Error::last_os_error()
            );
        }
    }

    /// Waits for the process to exit, at most `timeout`; `None` if it is still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let child = self.child.as_mut()?;
        let deadline = Instant::now() + timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Ok(None) => return None,
                Err(e) => panic!("waiting for {} failed: {e}", self.name),
            }
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("child already taken");
        let _ = child.kill();
        child.wait().expect("reaping a killed child")
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// The output of a command run to completion (or killed at its deadline).
pub struct Finished {
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    pub timed_out: bool,
}

impl Finished {
    pub fn text(&self) -> String {
        format!(
            "status: {:?}{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            if self.timed_out {
                " (killed at its deadline)"
            } else {
                ""
            },
            self.stdout,
            self.stderr
        )
    }

    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Runs `cmd` with stdout and stderr captured; kills it after `timeout`.
pub fn run_with_timeout(mut cmd: Command, timeout: Duration) -> Finished {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take().expect("piped stderr");
    let read_all = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out = read_all(Box::new(out));
    let err = read_all(Box::new(err));
    let mut guard = ChildGuard::new("command", child);
    let status = guard.wait_timeout(timeout);
    let timed_out = status.is_none();
    if timed_out {
        guard.kill9();
    }
    drop(guard);
    Finished {
        status,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        timed_out,
    }
}

/// An external tool found on `PATH` (and, for system daemons such as nutcracker, in the
/// standard sbin directories, which a non-root user's `PATH` often lacks).
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    for sbin in ["/usr/local/sbin", "/usr/sbin", "/sbin"] {
        dirs.push(PathBuf::from(sbin));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// The tool, or `None` after a loud skip message; panics instead when the environment
/// says the tools are required (`TERRACE_REQUIRE_TOOLS=1`, as CI sets).
pub fn require_tool(name: &str, package: &str) -> Option<PathBuf> {
    if let Some(p) = find_tool(name) {
        return Some(p);
    }
    if std::env::var("TERRACE_REQUIRE_TOOLS").as_deref() == Ok("1") {
        panic!("{name} is not installed (Debian package {package}) and TERRACE_REQUIRE_TOOLS=1");
    }
    eprintln!();
    eprintln!("**************************************************************************");
    eprintln!("*** SKIPPED: {name} not found on PATH (apt-get install {package}).");
    eprintln!("*** Set TERRACE_REQUIRE_TOOLS=1 to make this a failure.");
    eprintln!("**************************************************************************");
    eprintln!();
    None
}

// ---------------------------------------------------------------------------------------
// The server

/// A running `terrace serve`, killed when dropped.
pub struct Server {
    pub proc: ChildGuard,
    /// TCP port, when it listens on TCP.
    pub port: Option<u16>,
    /// UNIX socket path, when it listens on one.
    pub unix: Option<PathBuf>,
    /// Where its stderr (the logs) goes.
    pub log: PathBuf,
    /// Every line it printed on stdout up to the listening lines.
    pub banner: Vec<String>,
}

/// Arguments of a server start. `args` are passed after `serve`; unless they say
/// otherwise the server gets `--listen 127.0.0.1:0`, `--threads 2` and
/// `--tiers dram:16MiB,file:64MiB`, and `--dir` is `dir/data`.
pub fn start(dir: &Path, args: &[&str]) -> Server {
    let has = |flag: &str| {
        args.iter()
            .any(|a| *a == flag || a.starts_with(&format!("{flag}=")))
    };
    let mut full: Vec<String> = vec!["serve".into()];
    if !has("--listen") && !has("--unix") && !has("--config") {
        full.extend(["--listen".into(), "127.0.0.1:0".into()]);
    }
    if !has("--threads") {
        full.extend(["--threads".into(), "2".into()]);
    }
    if !has("--tiers") && !has("--config") {
        full.extend(["--tiers".into(), "dram:16MiB,file:64MiB".into()]);
    }
    if !has("--dir") {
        full.extend(["--dir".into(), dir.join("data").display().to_string()]);
    }
    full.extend(args.iter().map(|s| s.to_string()));
    let expect_tcp = has("--listen") || !has("--unix");
    let expect_unix = has("--unix");
    start_raw(dir, &full, expect_tcp, expect_unix)
}

/// Starts `terrace` with exactly `args`; waits for a `listening on tcp` line if
/// `expect_tcp` and a `listening on unix` line if `expect_unix`.
pub fn start_raw(dir: &Path, args: &[String], expect_tcp: bool, expect_unix: bool) -> Server {
    static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = dir.join(format!("server-{n}.log"));
    let stderr = std::fs::File::create(&log).expect("creating the server's log file");
    let mut child = Command::new(terrace_bin())
        .args(args)
        .env("RUST_LOG", "info")
        // Plain log lines (no ANSI colours) in the log file, for messages and parsing.
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(stderr))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {} {args:?}: {e}", terrace_bin()));
    let stdout = child.stdout.take().expect("piped stdout");
    let proc = ChildGuard::new("terrace serve", child);
    let (tx, rx) = mpsc::channel::<String>();
    // Reads stdout to its end so the server never blocks on a full pipe.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // Once nobody listens any more, keep draining.
            let _ = tx.send(line);
        }
    });
    let mut server = Server {
        proc,
        port: None,
        unix: None,
        log,
        banner: Vec::new(),
    };
    let deadline = Instant::now() + START_TIMEOUT;
    while (expect_tcp && server.port.is_none()) || (expect_unix && server.unix.is_none()) {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(100))) {
            Ok(line) => {
                if let Some(addr) = line.strip_prefix("terrace: listening on tcp ") {
                    let port = addr
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.trim().parse().ok())
                        .unwrap_or_else(|| panic!("cannot parse the port of {line:?}"));
                    server.port = Some(port);
                } else if let Some(path) = line.strip_prefix("terrace: listening on unix ") {
                    server.unix = Some(PathBuf::from(path.trim()));
                }
                server.banner.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if !server.proc.running() {
                    panic!(
                        "terrace serve {args:?} exited before listening: {:?}\n{}",
                        server.proc.wait_timeout(Duration::ZERO),
                        server.log_text()
                    );
                }
                if Instant::now() >= deadline {
                    panic!(
                        "terrace serve {args:?} did not print its listening lines within {START_TIMEOUT:?}; stdout so far: {:?}\n{}",
                        server.banner,
                        server.log_text()
                    );
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = server.proc.wait_timeout(Duration::from_secs(5));
                panic!(
                    "terrace serve {args:?} closed stdout before listening (exit {status:?}); stdout: {:?}\n{}",
                    server.banner,
                    server.log_text()
                );
            }
        }
    }
    server
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn port(&self) -> u16 {
        self.port.expect("the server listens on TCP")
    }

    /// The server's stderr so far.
    pub fn log_text(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        // The last 8 KiB is enough to see why it stopped.
        let start = text.len().saturating_sub(8192);
        let start = (start..text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        format!(
            "--- server log ({}) ---\n{}",
            self.log.display(),
            &text[start..]
        )
    }

    /// A new TCP connection.
    pub fn connect(&self) -> Conn {
        Conn::tcp(self.port())
    }

    /// A new UNIX-socket connection.
    pub fn connect_unix(&self) -> Conn {
        Conn::unix(
            self.unix
                .as_deref()
                .expect("the server listens on a UNIX socket"),
        )
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        self.proc.running()
    }

    /// SIGTERM, then the exit status (panics if it does not exit within STOP_TIMEOUT).
    pub fn terminate(&mut self) -> ExitStatus {
        self.proc.signal(libc::SIGTERM);
        match self.proc.wait_timeout(STOP_TIMEOUT) {
            Some(status) => status,
            None => panic!(
                "terrace serve did not exit within {STOP_TIMEOUT:?} of SIGTERM\n{}",
                self.log_text()
            ),
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) -> ExitStatus {
        self.proc.kill9()
    }

    /// Resident set size (VmRSS) in bytes.
    pub fn rss(&self) -> u64 {
        rss_of(self.pid())
    }

    /// `stats` over a new connection.
    pub fn stats(&self) -> std::collections::HashMap<String, String> {
        self.connect().stats()
    }

    /// Asserts the server is running and answers `version` on a new connection.
    pub fn assert_alive(&mut self, context: &str) {
        assert!(
            self.running(),
            "{context}: the server died\n{}",
            self.log_text()
        );
        let mut c = self.connect();
        let v = c.cmd("version");
        assert!(
            v.starts_with("VERSION "),
            "{context}: version answered {v:?}"
        );
    }
}

/// VmRSS of a process, bytes.
pub fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// Raises this process's soft RLIMIT_NOFILE to at least `want` (up to the hard limit);
/// returns the soft limit now in force. Children inherit it.
pub fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the valid, live struct passed.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(rc, 0, "getrlimit: {}", std::io::Error::last_os_error());
    if lim.rlim_cur < want as libc::rlim_t {
        lim.rlim_cur = (want as libc::rlim_t).min(lim.rlim_max);
        // SAFETY: setrlimit reads the valid struct passed; raising the soft limit up to
        // the hard one is always permitted.
        let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
        assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());
    }
    lim.rlim_cur
}

/// A TCP port free right now on 127.0.0.1 (for tools that cannot listen on port 0),
/// taken *below* the kernel's ephemeral range: between this call and the tool's bind,
/// a port from that range may go to any listener on port 0 or any outgoing connection
/// (a test's relay, a client), and the tool then fails with "Address already in use".
/// Ports below it go only to whoever names them; each call of this process gets a
/// different one, and ones in use are skipped.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, high) = (10_000u32, ephemeral_low);
    // Processes started at once (test binaries side by side) start far apart.
    let _ = NEXT.compare_exchange(
        0,
        std::process::id().wrapping_mul(7919),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    // No room below the ephemeral range (a range starting under 10000): port 0's.
    for _ in 0..high.saturating_sub(low) {
        let port = low + NEXT.fetch_add(1, Ordering::Relaxed) % (high - low);
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    l.local_addr().expect("local address").port()
}

// ---------------------------------------------------------------------------------------
// A client connection

pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A text-protocol client connection with its own read buffer and timeouts.
pub struct Conn {
    pub stream: Stream,
    buf: Vec<u8>,
}

/// A `get`/`gets` hit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    pub key: String,
    pub flags: u32,
    pub value: Vec<u8>,
    pub cas: Option<u64>,
}

impl Conn {
    pub fn tcp(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port}: {e}"));
        Conn::from_tcp(s)
    }

    pub fn from_tcp(s: TcpStream) -> Conn {
        s.set_read_timeout(Some(IO_TIMEOUT)).expect("read timeout");
        s.set_write_timeout(Some(IO_TIMEOUT))
            .expect("write timeout");
        let _ = s.set_nodelay(true);
        Conn {
            stream: Stream::Tcp(s),
            buf: Vec::new(),
        }
    }

    pub fn unix(path: &Path) -> Conn {
        let s = UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", path.display()));
        s.set_read_timeout(Some(IO_TIMEOUT)).expect("read timeout");
        s.set_write_timeout(Some(IO_TIMEOUT))
            .expect("write timeout");
        Conn {
            stream: Stream::Unix(s),
            buf: Vec::new(),
        }
    }

    pub fn set_read_timeout(&self, t: Duration) {
        match &self.stream {
            Stream::Tcp(s) => s.set_read_timeout(Some(t)).expect("read timeout"),
            Stream::Unix(s) => s.set_read_timeout(Some(t)).expect("read timeout"),
        }
    }

    /// Half-closes the write side.
    pub fn shutdown_write(&self) {
        let _ = match &self.stream {
            Stream::Tcp(s) => s.shutdown(Shutdown::Write),
            Stream::Unix(s) => s.shutdown(Shutdown::Write),
        };
    }

    pub fn try_clone_stream(&self) -> Stream {
        match &self.stream {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone().expect("cloning a socket")),
            Stream::Unix(s) => Stream::Unix(s.try_clone().expect("cloning a socket")),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("writing {} bytes to the server: {e}", bytes.len()));
    }

    pub fn try_send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)
    }

    fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 64 * 1024];
        let n = self.stream.read(&mut chunk)?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// One reply line without its `\r\n`; `Err` on EOF, timeout or error.
    pub fn try_line(&mut self) -> std::io::Result<String> {
        loop {
            if let Some(nl) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=nl).collect();
                let line = line.strip_suffix(b"\n").unwrap_or(&line);
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                return Ok(String::from_utf8_lossy(line).into_owned());
            }
            if self.fill()? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed; unterminated bytes: {:?}",
                        String::from_utf8_lossy(&self.buf)
                    ),
                ));
            }
        }
    }

    pub fn line(&mut self) -> String {
        self.try_line()
            .unwrap_or_else(|e| panic!("reading a reply line from the server: {e}"))
    }

    /// Exactly `n` bytes.
    pub fn try_bytes(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if self.fill()? == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("connection closed after {} of {n} bytes", self.buf.len()),
                ));
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        self.try_bytes(n)
            .unwrap_or_else(|e| panic!("reading {n} bytes from the server: {e}"))
    }

    /// Sends one command line, returns the first reply line.
    pub fn cmd(&mut self, line: &str) -> String {
        self.send(format!("{line}\r\n").as_bytes());
        self.line()
    }

    /// `set` (or any storage command `op`) of one value; returns the reply line.
    pub fn store(&mut self, op: &str, key: &str, flags: u32, exptime: i64, value: &[u8]) -> String {
        let mut req = format!("{op} {key} {flags} {exptime} {}\r\n", value.len()).into_bytes();
        req.extend_from_slice(value);
        req.extend_from_slice(b"\r\n");
        self.send(&req);
        self.line()
    }

    pub fn set(&mut self, key: &str, value: &[u8]) -> String {
        self.store("set", key, 0, 0, value)
    }

    /// Reads a retrieval reply (VALUE blocks up to END).
    pub fn try_read_items(&mut self) -> std::io::Result<Result<Vec<Item>, String>> {
        let mut items = Vec::new();
        loop {
            let line = self.try_line()?;
            if line == "END" {
                return Ok(Ok(items));
            }
            let Some(rest) = line.strip_prefix("VALUE ") else {
                return Ok(Err(line));
            };
            let parts: Vec<&str> = rest.split(' ').collect();
            let bad = || {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("bad VALUE line {line:?}"),
                )
            };
            if parts.len() < 3 {
                return Err(bad());
            }
            let flags = parts[1].parse().map_err(|_| bad())?;
            let len: usize = parts[2].parse().map_err(|_| bad())?;
            let cas = match parts.get(3) {
                Some(c) => Some(c.parse().map_err(|_| bad())?),
                None => None,
            };
            let mut data = self.try_bytes(len + 2)?;
            if &data[len..] != b"\r\n" {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("value of {:?} not followed by \\r\\n", parts[0]),
                ));
            }
            data.truncate(len);
            items.push(Item {
                key: parts[0].to_string(),
                flags,
                value: data,
                cas,
            });
        }
    }

    /// Reads a retrieval reply; panics on anything but VALUE blocks and END.
    pub fn read_items(&mut self) -> Vec<Item> {
        match self.try_read_items() {
            Ok(Ok(items)) => items,
            Ok(Err(line)) => panic!("expected VALUE or END, got {line:?}"),
            Err(e) => panic!("reading a retrieval reply: {e}"),
        }
    }

    /// `get` of one key: its value, or `None` on a miss.
    pub fn get(&mut self, key: &str) -> Option<Vec<u8>> {
        self.send(format!("get {key}\r\n").as_bytes());
        let mut items = self.read_items();
        assert!(items.len() <= 1, "get {key} returned {} items", items.len());
        let item = items.pop()?;
        assert_eq!(item.key, key, "get {key} returned another key");
        Some(item.value)
    }

    /// `gets` of one key.
    pub fn gets(&mut self, key: &str) -> Option<Item> {
        self.send(format!("gets {key}\r\n").as_bytes());
        let mut items = self.read_items();
        assert!(
            items.len() <= 1,
            "gets {key} returned {} items",
            items.len()
        );
        items.pop()
    }

    /// A multi-key `get`: the hits by key.
    pub fn get_multi(&mut self, keys: &[String]) -> std::collections::HashMap<String, Vec<u8>> {
        self.send(format!("get {}\r\n", keys.join(" ")).as_bytes());
        self.read_items()
            .into_iter()
            .map(|i| (i.key, i.value))
            .collect()
    }

    /// `stats` as a map.
    pub fn stats(&mut self) -> std::collections::HashMap<String, String> {
        self.send(b"stats\r\n");
        let mut map = std::collections::HashMap::new();
        loop {
            let line = self.line();
            if line == "END" {
                return map;
            }
            let mut parts = line.splitn(3, ' ');
            assert_eq!(parts.next(), Some("STAT"), "bad stats line {line:?}");
            let name = parts.next().unwrap_or_default().to_string();
            map.insert(name, parts.next().unwrap_or_default().to_string());
        }
    }

    /// Reads until EOF (or a read error: a reset counts as closed); returns what came.
    /// Panics if the connection is still open after `within`.
    pub fn read_to_close(&mut self, within: Duration) -> Vec<u8> {
        self.set_read_timeout(within);
        let mut all = std::mem::take(&mut self.buf);
        let mut chunk = [0u8; 64 * 1024];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return all,
                Ok(n) => all.extend_from_slice(&chunk[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    panic!(
                        "the server did not close the connection within {within:?}; got {:?}",
                        String::from_utf8_lossy(&all[..all.len().min(512)])
                    )
                }
                Err(_) => return all,
            }
        }
    }
}

/// Value helpers shared by the tests.
pub fn stat_u64(stats: &std::collections::HashMap<String, String>, name: &str) -> u64 {
    stats
        .get(name)
        .unwrap_or_else(|| panic!("stats has no {name}: {stats:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("stat {name} = {:?} is not a number: {e}", stats[name]))
}

// ---------------------------------------------------------------------------------------
// Randomness without a dependency

/// xorshift64*: enough for test data; the seed is printed so a failure can be replayed
/// with `TERRACE_TEST_SEED`.
pub struct Rng(u64);

impl Rng {
    pub fn new(name: &str) -> Rng {
        let seed = std::env::var("TERRACE_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("{name}: random seed {seed} (replay with TERRACE_TEST_SEED={seed})");
        Rng::seeded(seed)
    }

    pub fn seeded(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15 | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo).max(1)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }
}

/// A deterministic value of `len` bytes (more if `len` is shorter than its prefix) that
/// names its key and version: `key|vN|` then
/// filler derived from both, so any stale or foreign value is recognisable.
pub fn versioned_value(key: &str, version: u64, len: usize) -> Vec<u8> {
    let mut v = format!("{key}|v{version}|").into_bytes();
    let mut rng = Rng::seeded(
        key.bytes()
            .fold(version.wrapping_mul(0x100_0000_01B3), |h, b| {
                (h ^ u64::from(b)).wrapping_mul(0x100_0000_01B3)
            }),
    );
    while v.len() < len {
        // Printable filler, so a mismatch prints readably.
        v.push(b'a' + (rng.next_u64() % 26) as u8);
    }
    v
}

/// The version a [`versioned_value`] names, if it is one for `key`.
pub fn version_of(key: &str, value: &[u8]) -> Option<u64> {
    let rest = value.strip_prefix(format!("{key}|v").as_bytes())?;
    let end = rest.iter().position(|&b| b == b'|')?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// Shows a value briefly in a message.
pub fn show(v: &[u8]) -> String {
    let s = String::from_utf8_lossy(&v[..v.len().min(60)]).into_owned();
    if v.len() > 60 {
        format!("{s}... ({} bytes)", v.len())
    } else {
        s
    }
}

/// Starts memcached on a free loopback port with `args` (and `-u root` when root), once
/// it listens; `None` (after a loud skip message) without it. A port taken by another
/// test's server between [`free_port`] and memcached's bind makes memcached exit at once
/// while the wait below connects to the other server: so memcached must still run a
/// moment after the port answers, else it is started again on another port.
#[allow(dead_code)] // not every test binary starts memcached
pub fn start_memcached(args: &[&str]) -> Option<(ChildGuard, u16)> {
    let tool = require_tool("memcached", "memcached")?;
    for _attempt in 0..5 {
        let port = free_port();
        let mut cmd = Command::new(&tool);
        cmd.args(["-l", "127.0.0.1", "-p", &port.to_string(), "-U", "0"])
            .args(args);
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // memcached refuses to run as root without a user to run as.
            cmd.args(["-u", "root"]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting memcached");
        let mut memcached = ChildGuard::new("memcached", child);
        let deadline = Instant::now() + START_TIMEOUT;
        while memcached.running() && TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "memcached did not listen on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        if memcached.running() {
            return Some((memcached, port));
        }
    }
    panic!("memcached exited at start five times (ports taken?)");
}

// ---------------------------------------------------------------------------------------
// Stamped blocks (the volume kill and replication tests)

/// The size of a stamped block.
pub const STAMPED: usize = 4096;

/// A block's bytes for its `count`-th write: block number, count, a fill, a checksum.
pub fn stamp(block: u64, count: u64) -> Vec<u8> {
    let mut b = vec![(block as u8) ^ (count as u8); STAMPED];
    b[..8].copy_from_slice(&block.to_le_bytes());
    b[8..16].copy_from_slice(&count.to_le_bytes());
    let crc = crc32fast::hash(&b[..STAMPED - 4]);
    b[STAMPED - 4..].copy_from_slice(&crc.to_le_bytes());
    b
}

/// The write count a block's bytes carry (0 for zeroes); panics on a torn or foreign block.
pub fn read_stamp(block: u64, b: &[u8]) -> u64 {
    if b.iter().all(|&x| x == 0) {
        return 0;
    }
    let crc = u32::from_le_bytes(b[STAMPED - 4..].try_into().unwrap());
    assert_eq!(
        crc,
        crc32fast::hash(&b[..STAMPED - 4]),
        "block {block} is torn"
    );
    assert_eq!(
        u64::from_le_bytes(b[..8].try_into().unwrap()),
        block,
        "block {block} holds another block"
    );
    u64::from_le_bytes(b[8..16].try_into().unwrap())
}

// ---------------------------------------------------------------------------------------
// terrace serve-volume

/// Starts `terrace serve-volume` in `dir` with `args`; waits for `ready` (a socket path
/// or a TCP address) to accept.
pub fn start_serve_volume(dir: &Path, args: &[String], ready: &str) -> ChildGuard {
    start_serve_volume_env(dir, args, ready, &[])
}

/// [`start_serve_volume`] with `env` set for the process.
pub fn start_serve_volume_env(
    dir: &Path,
    args: &[String],
    ready: &str,
    env: &[(String, String)],
) -> ChildGuard {
    start_serve_volume_with(Command::new(terrace_bin()), dir, args, ready, env)
}

/// [`start_serve_volume`] in network namespace `netns` (`ip netns exec`, which execs
/// terrace: the guard's process is the server's). `ready` must be a socket path.
pub fn start_serve_volume_in_netns(
    netns: &str,
    dir: &Path,
    args: &[String],
    ready: &str,
) -> ChildGuard {
    let mut ip = Command::new("ip");
    ip.args(["netns", "exec", netns]).arg(terrace_bin());
    start_serve_volume_with(ip, dir, args, ready, &[])
}

fn start_serve_volume_with(
    mut command: Command,
    dir: &Path,
    args: &[String],
    ready: &str,
    env: &[(String, String)],
) -> ChildGuard {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("server.log"))
        .unwrap();
    let child = command
        .arg("serve-volume")
        .args(["--tiers", "dram:32MiB", "--log-size", "64MiB"])
        .arg("--dir")
        .arg(dir)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("starting terrace serve-volume");
    let mut guard = ChildGuard::new("serve-volume", child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let up = if ready.starts_with('/') {
            std::os::unix::net::UnixStream::connect(ready).is_ok()
        } else {
            std::net::TcpStream::connect(ready).is_ok()
        };
        if up {
            return guard;
        }
        assert!(
            guard.running(),
            "serve-volume exited:\n{}",
            serve_volume_log(dir)
        );
        assert!(
            Instant::now() < deadline,
            "serve-volume did not listen:\n{}",
            serve_volume_log(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn serve_volume_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
}

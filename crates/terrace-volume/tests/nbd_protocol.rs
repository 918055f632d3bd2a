//! The NBD front end and back end end to end: our server over a `MemoryExport` on UNIX
//! and TCP sockets, probed by the real tools (`nbdinfo`, fio's `nbd` engine, `nbdcopy`,
//! `qemu-img`, `qemu-io`, `nbdsh`), by our
//! `NbdBackend` client, and by hand-made malformed byte streams; our client against
//! nbdkit. External tools are skipped with a printed note when missing, unless
//! `TERRACE_REQUIRE_TOOLS=1`, which makes a missing tool a failure.
//!
//! Every socket here has a timeout and every child process a deadline, so a broken
//! server fails a test instead of hanging it.

use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use terrace_volume::nbd::proto::{self, RequestHeader};
use terrace_volume::nbd::{Listen, NbdBackend, NbdServer};
use terrace_volume::{Backend, BlockError, Export, MemoryExport};

mod common;
use common::Rng;

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
/// Socket timeout of every raw test connection.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest an external tool may run.
const TOOL_DEADLINE: Duration = Duration::from_secs(120);

// ---- helpers ---------------------------------------------------------------------------

/// Whether `tool` runs; a missing tool fails the test under `TERRACE_REQUIRE_TOOLS=1`.
fn have_tool(tool: &str) -> bool {
    let found = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        if std::env::var("TERRACE_REQUIRE_TOOLS").as_deref() == Ok("1") {
            panic!("{tool} is missing and TERRACE_REQUIRE_TOOLS=1");
        }
        eprintln!("note: {tool} not found; skipping this test");
    }
    found
}

/// Runs `command` to completion, killing it after `deadline`.
fn run_with_deadline(command: &mut Command, deadline: Duration) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tool");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out_reader = thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stdout.read_to_end(&mut text);
        text
    });
    let err_reader = thread::spawn(move || {
        let mut text = Vec::new();
        let _ = stderr.read_to_end(&mut text);
        text
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for tool") {
            break status;
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            panic!("{command:?} ran past {deadline:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap(),
        stderr: err_reader.join().unwrap(),
    }
}

fn memory(size: u64) -> Arc<MemoryExport> {
    Arc::new(MemoryExport::new(size, false))
}

fn exports(list: &[(&str, &Arc<MemoryExport>)]) -> Vec<(String, Arc<dyn Export>)> {
    list.iter()
        .map(|(name, export)| (name.to_string(), Arc::clone(export) as Arc<dyn Export>))
        .collect()
}

/// A server on a UNIX socket in a fresh temporary directory.
struct UnixFixture {
    // The server first: dropped before its directory.
    server: NbdServer,
    dir: tempfile::TempDir,
}

impl UnixFixture {
    fn start(list: Vec<(String, Arc<dyn Export>)>) -> UnixFixture {
        let dir = tempfile::tempdir().unwrap();
        let server = NbdServer::start(Listen::Unix(dir.path().join("nbd.sock")), list).unwrap();
        UnixFixture { dir, server }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("nbd.sock")
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|index| (index as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A raw protocol client: speaks exactly the bytes a test tells it to.
struct Raw {
    stream: UnixStream,
}

impl Raw {
    fn connect(socket: &Path) -> Raw {
        let stream = UnixStream::connect(socket).expect("connect to the server");
        stream.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
        stream.set_write_timeout(Some(SOCKET_TIMEOUT)).unwrap();
        Raw { stream }
    }

    /// Reads the greeting and sends `client_flags`; returns the handshake flags.
    fn greet(&mut self, client_flags: u32) -> u16 {
        let mut greeting = [0; proto::GREETING_LEN];
        self.stream.read_exact(&mut greeting).unwrap();
        let flags = proto::parse_greeting(&greeting).unwrap();
        self.stream.write_all(&client_flags.to_be_bytes()).unwrap();
        flags
    }

    fn send_option(&mut self, option: u32, data: &[u8]) {
        self.stream
            .write_all(&proto::encode_option(option, data))
            .unwrap();
    }

    fn option_reply(&mut self) -> (proto::OptionReplyHeader, Vec<u8>) {
        let mut header = [0; proto::OPTION_REPLY_HEADER_LEN];
        self.stream.read_exact(&mut header).unwrap();
        let header = proto::parse_option_reply_header(&header).unwrap();
        let mut data = vec![0; header.length as usize];
        self.stream.read_exact(&mut data).unwrap();
        (header, data)
    }

    /// `NBD_OPT_GO` (or `INFO`) for `name`; returns the replies up to the final one.
    fn go(&mut self, option: u32, name: &str) -> Vec<(proto::OptionReplyHeader, Vec<u8>)> {
        self.send_option(
            option,
            &proto::encode_info_request(name, &[proto::INFO_NAME]),
        );
        let mut replies = Vec::new();
        loop {
            let (header, data) = self.option_reply();
            assert_eq!(header.option, option);
            let last = header.reply_type != proto::REP_INFO;
            replies.push((header, data));
            if last {
                return replies;
            }
        }
    }

    /// A whole handshake into transmission; returns (size, transmission flags).
    fn open(socket: &Path, name: &str, structured: bool) -> (Raw, u64, u16) {
        let mut raw = Raw::connect(socket);
        raw.greet(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES);
        if structured {
            raw.send_option(proto::OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(raw.option_reply().0.reply_type, proto::REP_ACK);
        }
        let replies = raw.go(proto::OPT_GO, name);
        assert_eq!(
            replies.last().unwrap().0.reply_type,
            proto::REP_ACK,
            "GO {name:?}"
        );
        let (size, flags) = replies
            .iter()
            .find_map(|(_, data)| match proto::parse_info(data) {
                Ok(proto::Info::Export {
                    size,
                    transmission_flags,
                }) => Some((size, transmission_flags)),
                _ => None,
            })
            .expect("NBD_INFO_EXPORT");
        (raw, size, flags)
    }

    fn request(&mut self, command: u16, flags: u16, cookie: u64, offset: u64, length: u32) {
        let header = RequestHeader {
            flags,
            command,
            cookie,
            offset,
            length,
        };
        self.stream
            .write_all(&proto::encode_request(&header))
            .unwrap();
    }

    fn simple_reply(&mut self) -> proto::SimpleReply {
        let mut reply = [0; proto::SIMPLE_REPLY_LEN];
        self.stream.read_exact(&mut reply).unwrap();
        proto::parse_simple_reply(&reply).unwrap()
    }

    fn read_exact(&mut self, len: usize) -> Vec<u8> {
        let mut data = vec![0; len];
        self.stream.read_exact(&mut data).unwrap();
        data
    }

    /// Reads `len` bytes at `offset` with simple replies.
    fn read(&mut self, offset: u64, len: u32) -> Vec<u8> {
        self.request(proto::CMD_READ, 0, 77, offset, len);
        let reply = self.simple_reply();
        assert_eq!(
            reply,
            proto::SimpleReply {
                error: 0,
                cookie: 77
            }
        );
        self.read_exact(len as usize)
    }

    /// Writes `data` at `offset`; returns the reply's error.
    fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.request(proto::CMD_WRITE, 0, 78, offset, data.len() as u32);
        self.stream.write_all(data).unwrap();
        let reply = self.simple_reply();
        assert_eq!(reply.cookie, 78);
        reply.error
    }

    fn disconnect(mut self) {
        self.request(proto::CMD_DISC, 0, 0, 0, 0);
        self.expect_closed();
    }

    /// Reads until the server closes; fails if it stays open past the socket timeout.
    fn expect_closed(&mut self) {
        let mut sink = [0; 4096];
        loop {
            match self.stream.read(&mut sink) {
                Ok(0) => return,
                Ok(_) => continue,
                Err(error) if error.kind() == io::ErrorKind::ConnectionReset => return,
                Err(error) => panic!("the server did not close the connection: {error}"),
            }
        }
    }
}

/// A fresh connection reads and writes: the server is still up and well.
fn assert_serves(socket: &Path) {
    let (mut raw, size, _) = Raw::open(socket, "", false);
    assert!(size >= 2 * BLOCK);
    let data = pattern(BLOCK as usize, 99);
    assert_eq!(raw.write(BLOCK, &data), 0);
    assert_eq!(raw.read(BLOCK, BLOCK as u32), data);
    raw.disconnect();
}

/// An export that sleeps before each operation: a backend with latency.
struct SlowExport {
    inner: MemoryExport,
    delay: Duration,
}

impl Export for SlowExport {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        thread::sleep(self.delay);
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), BlockError> {
        thread::sleep(self.delay);
        self.inner.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), BlockError> {
        thread::sleep(self.delay);
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), BlockError> {
        thread::sleep(self.delay);
        self.inner.trim(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), BlockError> {
        thread::sleep(self.delay);
        self.inner.write_zeroes(offset, len, fua)
    }
}

/// nbdkit in the foreground on a UNIX socket, killed on drop.
struct Nbdkit {
    child: Child,
}

impl Nbdkit {
    fn start(socket: &Path, args: &[&str]) -> Nbdkit {
        let _ = std::fs::remove_file(socket);
        // nbdkit writes its PID file once it accepts connections.
        let pid_file = socket.with_extension("pid");
        let _ = std::fs::remove_file(&pid_file);
        let child = Command::new("nbdkit")
            .arg("-f")
            .arg("--exit-with-parent")
            .arg("-U")
            .arg(socket)
            .arg("-P")
            .arg(&pid_file)
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .expect("start nbdkit");
        let mut nbdkit = Nbdkit { child };
        let start = Instant::now();
        while std::fs::metadata(&pid_file).map_or(true, |meta| meta.len() == 0) {
            if let Ok(Some(status)) = nbdkit.child.try_wait() {
                panic!("nbdkit exited: {status}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "nbdkit did not start"
            );
            thread::sleep(Duration::from_millis(20));
        }
        nbdkit
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Random reads, writes, trims and flushes on `[region_start, region_end)`, each read
/// checked against `model` (the region's expected bytes).
fn exercise_region(backend: &dyn Backend, region_start: u64, region_len: u64, seed: u64) {
    let mut rng = Rng(seed | 1);
    let mut model = vec![0u8; region_len as usize];
    backend.read_at(region_start, &mut model).unwrap();
    let blocks = region_len / BLOCK;
    for step in 0..300 {
        let first = rng.below(blocks);
        let count = 1 + rng.below((blocks - first).min(16));
        let (offset, len) = (first * BLOCK, (count * BLOCK) as usize);
        let range = offset as usize..offset as usize + len;
        match rng.below(10) {
            0..=3 => {
                let mut data = vec![0; len];
                rng.fill(&mut data);
                backend.write_at(region_start + offset, &data).unwrap();
                model[range].copy_from_slice(&data);
            }
            4..=7 => {
                let mut data = vec![0xa5; len];
                backend.read_at(region_start + offset, &mut data).unwrap();
                assert!(
                    data == model[range],
                    "seed {seed} step {step}: read {offset}+{len}"
                );
            }
            8 => {
                backend.trim(region_start + offset, len as u64).unwrap();
                model[range].fill(0);
            }
            _ => backend.flush().unwrap(),
        }
    }
    let mut whole = vec![0; region_len as usize];
    backend.read_at(region_start, &mut whole).unwrap();
    assert!(whole == model, "seed {seed}: final image differs");
}

// ---- (a) nbdinfo -----------------------------------------------------------------------

fn nbdinfo_json(uri: &str) -> String {
    let output = run_with_deadline(
        Command::new("nbdinfo").arg("--json").arg(uri),
        TOOL_DEADLINE,
    );
    assert!(
        output.status.success(),
        "nbdinfo {uri}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    // Compare without whitespace: `"key": value` becomes `"key":value`.
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .collect()
}

#[test]
fn nbdinfo_reports_size_and_flags() {
    if !have_tool("nbdinfo") {
        return;
    }
    let disk = memory(64 * MIB);
    let ro = Arc::new(MemoryExport::new(MIB, true));
    let fixture = UnixFixture::start(exports(&[("disk", &disk), ("ro", &ro)]));
    for uri in [fixture.server.uri("disk"), fixture.server.uri("")] {
        let json = nbdinfo_json(&uri);
        for expected in [
            "\"protocol\":\"newstyle-fixed\"",
            "\"structured\":true",
            "\"export-size\":67108864",
            "\"is_read_only\":false",
            "\"can_flush\":true",
            "\"can_fua\":true",
            "\"can_trim\":true",
            "\"can_zero\":true",
            "\"can_multi_conn\":true",
            "\"can_df\":true",
        ] {
            assert!(
                json.contains(expected),
                "{uri}: {expected} missing from {json}"
            );
        }
    }
    let json = nbdinfo_json(&fixture.server.uri("ro"));
    assert!(json.contains("\"export-size\":1048576"), "{json}");
    assert!(json.contains("\"is_read_only\":true"), "{json}");

    let output = run_with_deadline(
        Command::new("nbdinfo")
            .arg("--list")
            .arg("--json")
            .arg(fixture.server.uri("")),
        TOOL_DEADLINE,
    );
    assert!(output.status.success());
    let listing: String = String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .collect();
    assert!(listing.contains("\"export-name\":\"disk\""), "{listing}");
    assert!(listing.contains("\"export-name\":\"ro\""), "{listing}");

    // The same over TCP on an ephemeral port.
    let tcp = NbdServer::start(
        Listen::Tcp("127.0.0.1:0".parse().unwrap()),
        exports(&[("d", &disk)]),
    )
    .unwrap();
    let port = tcp.local_addr().unwrap().port();
    assert_ne!(port, 0);
    let json = nbdinfo_json(&format!("nbd://127.0.0.1:{port}/d"));
    assert!(json.contains("\"export-size\":67108864"), "{json}");
    tcp.shutdown();
    assert_eq!(fixture.server.stats().protocol_errors, 0);
}

// ---- (b) fio ---------------------------------------------------------------------------

/// Runs fio in `workdir` (where it may leave files), keeping no verify state file.
fn fio(workdir: &Path, uri: &str, extra: &[&str]) -> Output {
    let output = run_with_deadline(
        Command::new("fio")
            .current_dir(workdir)
            .arg("--name=terrace-nbd")
            .arg("--ioengine=nbd")
            .arg(format!("--uri={uri}"))
            .args([
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=16",
                "--size=16M",
                "--runtime=60",
                "--verify=crc32c",
                "--randrepeat=1",
                "--verify_state_save=0",
            ])
            .args(extra),
        TOOL_DEADLINE,
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "fio {extra:?} failed:\n{stdout}\n{stderr}"
    );
    assert!(
        !stdout.contains("verify:") && !stderr.contains("verify:"),
        "{stdout}\n{stderr}"
    );
    output
}

#[test]
fn fio_randwrite_then_verify() {
    if !have_tool("fio") {
        return;
    }
    let disk = memory(16 * MIB);
    let fixture = UnixFixture::start(exports(&[("disk", &disk)]));
    // Write every block once at QD16, then read it all back and check the checksums.
    fio(
        fixture.dir.path(),
        &fixture.server.uri("disk"),
        &["--do_verify=1"],
    );
    let stats = fixture.server.stats();
    assert!(stats.bytes_written >= 16 * MIB, "{stats:?}");
    assert!(stats.bytes_read >= 16 * MIB, "{stats:?}");
    assert_eq!(stats.errors, 0, "{stats:?}");

    // A second, verify-only pass on new connections over TCP sees the same data.
    let tcp = NbdServer::start(
        Listen::Tcp("127.0.0.1:0".parse().unwrap()),
        exports(&[("disk", &disk)]),
    )
    .unwrap();
    fio(fixture.dir.path(), &tcp.uri("disk"), &["--verify_only"]);
    assert!(tcp.stats().bytes_read >= 16 * MIB);
    tcp.shutdown();
    assert_eq!(fixture.server.stats().protocol_errors, 0);
}

// ---- (c) our client against our server -------------------------------------------------

#[test]
fn client_against_our_server_matches_a_model() {
    let disk = memory(48 * MIB);
    let fixture = UnixFixture::start(exports(&[("disk", &disk)]));
    let backend = Arc::new(NbdBackend::connect(&fixture.server.uri("disk"), 8).unwrap());
    assert_eq!(backend.size(), 48 * MIB);
    assert!(!backend.is_read_only());
    assert!(
        backend.describe().contains("nbd unix:"),
        "{}",
        backend.describe()
    );

    // Four threads, each on its own 4 MiB region.
    let threads: Vec<_> = (0..4u64)
        .map(|index| {
            let backend = Arc::clone(&backend);
            thread::spawn(move || exercise_region(&*backend, index * 4 * MIB, 4 * MIB, index + 7))
        })
        .collect();
    for handle in threads {
        handle.join().unwrap();
    }

    // Requests over 32 MiB are split, both ways.
    let mut big = vec![0; 36 * MIB as usize];
    Rng(5).fill(&mut big);
    backend.write_at(8 * MIB, &big).unwrap();
    let mut back = vec![0; big.len()];
    backend.read_at(8 * MIB, &mut back).unwrap();
    assert!(back == big);
    let mut direct = vec![0; big.len()];
    disk.read(8 * MIB, &mut direct).unwrap();
    assert!(direct == big, "the export holds what the client wrote");

    // A trim larger than the maximum payload reads back as zeroes.
    backend.trim(4 * MIB, 40 * MIB).unwrap();
    disk.read(4 * MIB, &mut back[..]).unwrap();
    assert!(back.iter().all(|&byte| byte == 0));

    // A range past the end is refused before it is sent.
    let mut block = vec![0; BLOCK as usize];
    let error = backend.read_at(48 * MIB, &mut block).unwrap_err();
    assert_eq!(error.kind(), io::ErrorKind::InvalidInput);
    let stats = fixture.server.stats();
    assert_eq!(stats.errors, 0, "{stats:?}");
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
}

#[test]
fn client_over_tcp_and_server_errnos() {
    let disk = memory(8 * MIB);
    let ro = Arc::new(MemoryExport::new(MIB, true));
    let server = NbdServer::start(
        Listen::Tcp("127.0.0.1:0".parse().unwrap()),
        exports(&[("disk", &disk), ("ro", &ro)]),
    )
    .unwrap();
    let backend = NbdBackend::connect(&server.uri("disk"), 3).unwrap();
    assert!(
        backend.describe().contains("tcp:127.0.0.1"),
        "{}",
        backend.describe()
    );
    exercise_region(&backend, 0, 8 * MIB, 3);

    // The server's errno comes back as the io::Error's raw OS error.
    let read_only = NbdBackend::connect(&server.uri("ro"), 1).unwrap();
    assert!(read_only.is_read_only());
    let error = read_only.write_at(0, &[1; 4096]).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc_eperm()));
    let error = read_only.trim(0, 4096).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(libc_eperm()));
    let mut block = vec![0; 4096];
    read_only.read_at(0, &mut block).unwrap();

    // An unknown export is a connect error, not a panic or a hang.
    assert!(NbdBackend::connect(&server.uri("nope"), 1).is_err());
    server.shutdown();
}

fn libc_eperm() -> i32 {
    proto::EPERM as i32
}

#[test]
fn client_reconnects_after_a_server_restart() {
    let disk = memory(4 * MIB);
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbd.sock");
    let start = || NbdServer::start(Listen::Unix(socket.clone()), exports(&[("", &disk)])).unwrap();
    let server = start();
    let uri = server.uri("");
    let backend = NbdBackend::connect_with_timeout(&uri, 2, Duration::from_secs(5)).unwrap();
    let data = pattern(8192, 3);
    backend.write_at(0, &data).unwrap();
    server.shutdown();

    // Server gone: an error, promptly.
    let begun = Instant::now();
    let mut back = vec![0; 8192];
    assert!(backend.read_at(0, &mut back).is_err());
    assert!(begun.elapsed() < Duration::from_secs(5));

    // Server back: the broken connections are replaced transparently.
    let server = start();
    for _ in 0..4 {
        back.fill(0);
        backend.read_at(0, &mut back).unwrap();
        assert_eq!(back, data);
    }
    backend.flush().unwrap();
    server.shutdown();
}

// ---- (d) our client against nbdkit -----------------------------------------------------

#[test]
fn client_against_nbdkit_memory() {
    if !have_tool("nbdkit") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbdkit.sock");
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let nbdkit = Nbdkit::start(&socket, &["memory", "64M"]);
    let backend = NbdBackend::connect_with_timeout(&uri, 4, Duration::from_secs(10)).unwrap();
    assert_eq!(backend.size(), 64 * MIB);
    let flags = backend.transmission_flags();
    assert_ne!(flags & proto::FLAG_CAN_MULTI_CONN, 0, "flags {flags:#x}");
    assert_ne!(flags & proto::FLAG_SEND_WRITE_ZEROES, 0, "flags {flags:#x}");
    let threads: Vec<_> = (0..2u64)
        .map(|index| {
            let uri = uri.clone();
            thread::spawn(move || {
                let backend = NbdBackend::connect(&uri, 2).unwrap();
                exercise_region(&backend, index * 8 * MIB, 8 * MIB, 40 + index);
            })
        })
        .collect();
    exercise_region(&backend, 32 * MIB, 8 * MIB, 50);
    for handle in threads {
        handle.join().unwrap();
    }
    let mut big = vec![0; 34 * MIB as usize];
    Rng(9).fill(&mut big);
    backend.write_at(16 * MIB, &big).unwrap();
    let mut back = vec![0; big.len()];
    backend.read_at(16 * MIB, &mut back).unwrap();
    assert!(back == big);

    // nbdkit restarts (its memory is fresh): requests reconnect and carry on.
    drop(nbdkit);
    let _nbdkit = Nbdkit::start(&socket, &["memory", "64M"]);
    let mut block = vec![0xff; 4096];
    backend.read_at(16 * MIB, &mut block).unwrap();
    assert!(block.iter().all(|&byte| byte == 0));
    backend.write_at(0, &pattern(4096, 1)).unwrap();
    backend.flush().unwrap();
}

#[test]
fn client_against_nbdkit_without_multi_conn_or_zeroes() {
    if !have_tool("nbdkit") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbdkit.sock");
    let log = dir.path().join("nbdkit.log");
    let logfile = format!("logfile={}", log.display());
    let _nbdkit = Nbdkit::start(
        &socket,
        &[
            "--filter=log",
            "--filter=multi-conn",
            "--filter=nozero",
            "memory",
            "16M",
            "multi-conn-mode=disable",
            "zeromode=none",
            &logfile,
        ],
    );
    let uri = format!("nbd+unix:///?socket={}", socket.display());
    let backend = NbdBackend::connect(&uri, 3).unwrap();
    let flags = backend.transmission_flags();
    assert_eq!(flags & proto::FLAG_CAN_MULTI_CONN, 0, "flags {flags:#x}");
    assert_eq!(flags & proto::FLAG_SEND_WRITE_ZEROES, 0, "flags {flags:#x}");
    // Trim becomes written zeroes; the model checks they read back as zeroes.
    exercise_region(&backend, 0, 16 * MIB, 11);
    backend.write_at(0, &pattern(4096, 2)).unwrap();
    backend.flush().unwrap();
    drop(backend);
    // Without CAN_MULTI_CONN each flush reached all three connections.
    let text = std::fs::read_to_string(&log).unwrap();
    let flushed: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|line| line.contains(" Flush "))
        .filter_map(|line| {
            line.split_whitespace()
                .find(|word| word.starts_with("connection="))
        })
        .collect();
    assert_eq!(flushed.len(), 3, "connections that flushed: {flushed:?}");
    assert!(!text.contains(" Zero "), "no NBD_CMD_WRITE_ZEROES was sent");
}

// ---- (e) malformed input ---------------------------------------------------------------

fn standard_fixture() -> (UnixFixture, Arc<MemoryExport>) {
    let disk = memory(4 * MIB);
    let ro = Arc::new(MemoryExport::new(MIB, true));
    let fixture = UnixFixture::start(exports(&[("disk", &disk), ("ro", &ro)]));
    (fixture, disk)
}

#[test]
fn client_flags_without_fixed_newstyle_or_unknown_are_refused() {
    let (fixture, _) = standard_fixture();
    for client_flags in [
        0,
        proto::FLAG_C_NO_ZEROES,
        proto::FLAG_C_FIXED_NEWSTYLE | 0x80,
    ] {
        let mut raw = Raw::connect(&fixture.socket());
        let handshake_flags = raw.greet(client_flags);
        assert_eq!(
            handshake_flags,
            proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES
        );
        raw.expect_closed();
        assert_serves(&fixture.socket());
    }
    // A client that sends garbage instead of a greeting reply, then vanishes.
    let mut raw = Raw::connect(&fixture.socket());
    raw.stream.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    raw.expect_closed();
    assert_serves(&fixture.socket());
    assert!(fixture.server.stats().protocol_errors >= 4);
}

#[test]
fn huge_or_malformed_options_close_only_that_connection() {
    let (fixture, _) = standard_fixture();
    // An option claiming 4 GiB of data: NBD_REP_ERR_TOO_BIG, then closed.
    let mut raw = Raw::connect(&fixture.socket());
    raw.greet(proto::FLAG_C_FIXED_NEWSTYLE);
    let mut header = proto::encode_option(proto::OPT_GO, &[]);
    header[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
    raw.stream.write_all(&header).unwrap();
    let (reply, _) = raw.option_reply();
    assert_eq!(reply.reply_type, proto::REP_ERR_TOO_BIG);
    raw.expect_closed();
    assert_serves(&fixture.socket());

    // An option with the wrong magic.
    let mut raw = Raw::connect(&fixture.socket());
    raw.greet(proto::FLAG_C_FIXED_NEWSTYLE);
    let mut option = proto::encode_option(proto::OPT_LIST, &[]);
    option[0] = b'X';
    raw.stream.write_all(&option).unwrap();
    raw.expect_closed();
    assert_serves(&fixture.socket());

    // A client that hangs up in the middle of an option's data.
    let mut raw = Raw::connect(&fixture.socket());
    raw.greet(proto::FLAG_C_FIXED_NEWSTYLE);
    let option = proto::encode_option(proto::OPT_GO, &proto::encode_info_request("disk", &[]));
    raw.stream.write_all(&option[..option.len() - 3]).unwrap();
    drop(raw);
    assert_serves(&fixture.socket());
}

#[test]
fn option_haggling_errors_and_recoveries() {
    let (fixture, _) = standard_fixture();
    let mut raw = Raw::connect(&fixture.socket());
    raw.greet(proto::FLAG_C_FIXED_NEWSTYLE);

    raw.send_option(99, b"whatever");
    let (reply, _) = raw.option_reply();
    assert_eq!((reply.option, reply.reply_type), (99, proto::REP_ERR_UNSUP));

    raw.send_option(proto::OPT_STARTTLS, &[]);
    assert_eq!(raw.option_reply().0.reply_type, proto::REP_ERR_UNSUP);

    let replies = raw.go(proto::OPT_GO, "nope");
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].0.reply_type, proto::REP_ERR_UNKNOWN);

    // A GO whose name length overruns its data.
    let mut bad = proto::encode_info_request("disk", &[]);
    bad[3] = 100;
    raw.send_option(proto::OPT_GO, &bad);
    assert_eq!(raw.option_reply().0.reply_type, proto::REP_ERR_INVALID);

    raw.send_option(proto::OPT_STRUCTURED_REPLY, b"x");
    assert_eq!(raw.option_reply().0.reply_type, proto::REP_ERR_INVALID);
    raw.send_option(proto::OPT_LIST, b"x");
    assert_eq!(raw.option_reply().0.reply_type, proto::REP_ERR_INVALID);

    raw.send_option(proto::OPT_LIST, &[]);
    let mut names = Vec::new();
    loop {
        let (reply, data) = raw.option_reply();
        if reply.reply_type == proto::REP_ACK {
            break;
        }
        assert_eq!(reply.reply_type, proto::REP_SERVER);
        names.push(String::from_utf8(data[4..].to_vec()).unwrap());
    }
    assert_eq!(names, ["disk", "ro"]);

    // INFO on the default export: size, canonical name, block sizes, ACK.
    let replies = raw.go(proto::OPT_INFO, "");
    assert_eq!(replies.last().unwrap().0.reply_type, proto::REP_ACK);
    let infos: Vec<_> = replies[..replies.len() - 1]
        .iter()
        .map(|(_, data)| (proto::parse_info(data).unwrap(), data.clone()))
        .collect();
    assert!(infos.iter().any(|(info, _)| matches!(info,
        proto::Info::Export { size, transmission_flags }
            if *size == 4 * MIB && transmission_flags & proto::FLAG_READ_ONLY == 0)));
    assert!(infos.iter().any(|(info, _)| *info
        == proto::Info::BlockSize {
            minimum: 1,
            preferred: 4096,
            maximum: 32 << 20
        }));
    assert!(infos
        .iter()
        .any(|(_, data)| data[..] == proto::encode_info_string(1, "disk")[..]));

    // After all that, GO still works and the connection serves.
    let replies = raw.go(proto::OPT_GO, "disk");
    assert_eq!(replies.last().unwrap().0.reply_type, proto::REP_ACK);
    let data = pattern(512, 4);
    assert_eq!(raw.write(0, &data), 0);
    assert_eq!(raw.read(0, 512), data);
    raw.disconnect();

    // ABORT is acknowledged and the connection closed.
    let mut raw = Raw::connect(&fixture.socket());
    raw.greet(proto::FLAG_C_FIXED_NEWSTYLE);
    raw.send_option(proto::OPT_ABORT, &[]);
    assert_eq!(raw.option_reply().0.reply_type, proto::REP_ACK);
    raw.expect_closed();
    assert_eq!(fixture.server.stats().protocol_errors, 0);
}

#[test]
fn export_name_option_old_style() {
    let (fixture, disk) = standard_fixture();
    disk.write(0, &pattern(4096, 8), false).unwrap();
    for no_zeroes in [false, true] {
        let mut raw = Raw::connect(&fixture.socket());
        let client_flags = if no_zeroes {
            proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES
        } else {
            proto::FLAG_C_FIXED_NEWSTYLE
        };
        raw.greet(client_flags);
        raw.send_option(proto::OPT_EXPORT_NAME, b"disk");
        let reply = raw.read_exact(if no_zeroes { 10 } else { 134 });
        let (size, flags) = proto::parse_export_name_reply(&reply).unwrap();
        assert_eq!(size, 4 * MIB);
        assert_ne!(flags & proto::FLAG_HAS_FLAGS, 0);
        assert!(reply[10..].iter().all(|&byte| byte == 0));
        assert_eq!(raw.read(0, 4096), pattern(4096, 8));
        raw.disconnect();
    }
    // An unknown name cannot be answered with an error: the connection closes.
    let mut raw = Raw::connect(&fixture.socket());
    raw.greet(proto::FLAG_C_FIXED_NEWSTYLE);
    raw.send_option(proto::OPT_EXPORT_NAME, b"nope");
    raw.expect_closed();
    assert_serves(&fixture.socket());
}

#[test]
fn request_with_bad_magic_closes_the_connection() {
    let (fixture, _) = standard_fixture();
    let (mut raw, _, _) = Raw::open(&fixture.socket(), "disk", false);
    let mut request = proto::encode_request(&RequestHeader {
        flags: 0,
        command: proto::CMD_READ,
        cookie: 1,
        offset: 0,
        length: 512,
    });
    request[0] ^= 0x55;
    raw.stream.write_all(&request).unwrap();
    raw.expect_closed();
    assert_serves(&fixture.socket());
    assert_eq!(fixture.server.stats().protocol_errors, 1);
}

#[test]
fn bad_requests_get_errors_and_the_connection_continues() {
    let (fixture, _) = standard_fixture();
    let (mut raw, size, flags) = Raw::open(&fixture.socket(), "disk", false);
    assert_eq!(size, 4 * MIB);
    for flag in [
        proto::FLAG_HAS_FLAGS,
        proto::FLAG_SEND_FLUSH,
        proto::FLAG_SEND_FUA,
        proto::FLAG_SEND_TRIM,
        proto::FLAG_SEND_WRITE_ZEROES,
        proto::FLAG_CAN_MULTI_CONN,
    ] {
        assert_ne!(flags & flag, 0, "flag {flag:#x} in {flags:#x}");
    }
    assert_eq!(flags & (proto::FLAG_READ_ONLY | proto::FLAG_SEND_DF), 0);

    let cases: [(u16, u16, u64, u32, u32); 9] = [
        // (command, flags, offset, length, expected errno)
        // Past the end; offset + length overflowing; zero length; over the maximum payload.
        (proto::CMD_READ, 0, size, 512, proto::EINVAL),
        (proto::CMD_READ, 0, u64::MAX - 10, 512, proto::EINVAL),
        (proto::CMD_READ, 0, 0, 0, proto::EINVAL),
        (proto::CMD_READ, 0, 0, (32 << 20) + 1, proto::EINVAL),
        // Past the end: TRIM gets EINVAL, WRITE_ZEROES ENOSPC (the spec's advice).
        (proto::CMD_TRIM, 0, size - 512, 1024, proto::EINVAL),
        (proto::CMD_WRITE_ZEROES, 0, size, 512, proto::ENOSPC),
        // Unknown command; BLOCK_STATUS (not negotiated); DF without structured replies.
        (99, 0, 0, 512, proto::EINVAL),
        (proto::CMD_BLOCK_STATUS, 0, 0, 512, proto::EINVAL),
        (proto::CMD_READ, proto::CMD_FLAG_DF, 0, 512, proto::EINVAL),
    ];
    for (cookie, (command, command_flags, offset, length, errno)) in cases.into_iter().enumerate() {
        raw.request(command, command_flags, cookie as u64, offset, length);
        let reply = raw.simple_reply();
        assert_eq!(
            reply,
            proto::SimpleReply {
                error: errno,
                cookie: cookie as u64
            },
            "case {cookie}"
        );
        // The connection is still in step: a good read works.
        assert_eq!(raw.read(0, 16).len(), 16);
    }
    // A write past the end: its payload is consumed, then ENOSPC.
    assert_eq!(raw.write(size - 512, &[7; 1024]), proto::ENOSPC);
    assert_eq!(raw.write(0, &[]), proto::EINVAL);
    // FUA, NO_HOLE and flush are accepted.
    raw.request(
        proto::CMD_WRITE_ZEROES,
        proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE,
        50,
        0,
        4096,
    );
    assert_eq!(raw.simple_reply().error, 0);
    raw.request(proto::CMD_FLUSH, 0, 51, 0, 0);
    assert_eq!(
        raw.simple_reply(),
        proto::SimpleReply {
            error: 0,
            cookie: 51
        }
    );
    // A TRIM larger than the maximum payload is fine (the spec allows it).
    raw.request(proto::CMD_TRIM, proto::CMD_FLAG_FUA, 52, 0, size as u32);
    assert_eq!(raw.simple_reply().error, 0);
    raw.disconnect();
    let stats = fixture.server.stats();
    assert_eq!(stats.errors, 11, "{stats:?}");
    assert_eq!(stats.protocol_errors, 0, "{stats:?}");
}

#[test]
fn writes_to_a_read_only_export_get_eperm() {
    let (fixture, _) = standard_fixture();
    let (mut raw, size, flags) = Raw::open(&fixture.socket(), "ro", false);
    assert_eq!(size, MIB);
    assert_ne!(flags & proto::FLAG_READ_ONLY, 0);
    assert_eq!(raw.write(0, &[1; 4096]), proto::EPERM);
    for command in [proto::CMD_TRIM, proto::CMD_WRITE_ZEROES] {
        raw.request(command, 0, 5, 0, 4096);
        assert_eq!(
            raw.simple_reply(),
            proto::SimpleReply {
                error: proto::EPERM,
                cookie: 5
            }
        );
    }
    assert_eq!(raw.read(0, 4096), vec![0; 4096]);
    raw.request(proto::CMD_FLUSH, 0, 6, 0, 0);
    assert_eq!(raw.simple_reply().error, 0);
    raw.disconnect();
    assert_serves(&fixture.socket());
}

#[test]
fn disconnect_in_the_middle_of_a_write_payload() {
    let (fixture, disk) = standard_fixture();
    let (mut raw, _, _) = Raw::open(&fixture.socket(), "disk", false);
    raw.request(proto::CMD_WRITE, 0, 1, 8192, 65536);
    raw.stream.write_all(&[0xee; 1000]).unwrap();
    drop(raw);
    assert_serves(&fixture.socket());
    // Nothing of the torn write reached the export.
    let mut data = vec![0xff; 65536];
    disk.read(8192, &mut data).unwrap();
    assert!(data.iter().all(|&byte| byte == 0));
    // A client that hangs up in the middle of a request header.
    let (mut raw, _, _) = Raw::open(&fixture.socket(), "disk", false);
    raw.stream.write_all(&[0x25, 0x60, 0x95]).unwrap();
    drop(raw);
    assert_serves(&fixture.socket());
    assert_eq!(fixture.server.stats().protocol_errors, 0);
}

#[test]
fn oversized_write_gets_einval_then_close() {
    let (fixture, _) = standard_fixture();
    let (mut raw, _, _) = Raw::open(&fixture.socket(), "disk", false);
    raw.request(proto::CMD_WRITE, 0, 9, 0, u32::MAX);
    assert_eq!(
        raw.simple_reply(),
        proto::SimpleReply {
            error: proto::EINVAL,
            cookie: 9
        }
    );
    raw.expect_closed();
    assert_serves(&fixture.socket());
}

#[test]
fn structured_replies() {
    let (fixture, disk) = standard_fixture();
    disk.write(4096, &pattern(4096, 6), false).unwrap();
    let (mut raw, _, flags) = Raw::open(&fixture.socket(), "disk", true);
    assert_ne!(flags & proto::FLAG_SEND_DF, 0);

    raw.request(proto::CMD_READ, proto::CMD_FLAG_DF, 21, 4096, 4096);
    let header = proto::parse_chunk_header(&raw.read_exact(proto::CHUNK_HEADER_LEN)).unwrap();
    assert_eq!(header.reply_type, proto::REPLY_TYPE_OFFSET_DATA);
    assert_eq!(header.flags, proto::REPLY_FLAG_DONE);
    assert_eq!((header.cookie, header.length), (21, 4096 + 8));
    let payload = raw.read_exact(header.length as usize);
    assert_eq!(u64::from_be_bytes(payload[..8].try_into().unwrap()), 4096);
    assert_eq!(payload[8..], pattern(4096, 6)[..]);

    // A READ error is an error chunk with a message.
    raw.request(proto::CMD_READ, 0, 22, 4 * MIB, 512);
    let header = proto::parse_chunk_header(&raw.read_exact(proto::CHUNK_HEADER_LEN)).unwrap();
    assert_eq!(header.reply_type, proto::REPLY_TYPE_ERROR);
    assert_eq!((header.flags, header.cookie), (proto::REPLY_FLAG_DONE, 22));
    let payload = raw.read_exact(header.length as usize);
    assert_eq!(
        u32::from_be_bytes(payload[..4].try_into().unwrap()),
        proto::EINVAL
    );
    let message_len = u16::from_be_bytes([payload[4], payload[5]]) as usize;
    assert_eq!(message_len, payload.len() - 6);
    assert!(message_len > 0);

    // Other commands may still use simple replies.
    raw.request(proto::CMD_FLUSH, 0, 23, 0, 0);
    assert_eq!(
        raw.simple_reply(),
        proto::SimpleReply {
            error: 0,
            cookie: 23
        }
    );
    raw.disconnect();
}

#[test]
fn pipelined_requests_run_concurrently_and_disc_drains_them() {
    let delay = Duration::from_millis(25);
    let slow = Arc::new(SlowExport {
        inner: MemoryExport::new(4 * MIB, false),
        delay,
    });
    let fixture = UnixFixture::start(vec![(
        "slow".to_owned(),
        Arc::clone(&slow) as Arc<dyn Export>,
    )]);
    let (mut raw, _, _) = Raw::open(&fixture.socket(), "slow", false);

    // 48 writes sent back to back, then their replies, in any order.
    let count = 48u64;
    let begun = Instant::now();
    for cookie in 0..count {
        raw.request(proto::CMD_WRITE, 0, cookie, cookie * 4096, 4096);
        raw.stream.write_all(&pattern(4096, cookie as u8)).unwrap();
    }
    let mut answered = vec![false; count as usize];
    for _ in 0..count {
        let reply = raw.simple_reply();
        assert_eq!(reply.error, 0);
        assert!(!std::mem::replace(
            &mut answered[reply.cookie as usize],
            true
        ));
    }
    let elapsed = begun.elapsed();
    let serial = delay * count as u32;
    assert!(
        elapsed < serial / 3,
        "{count} requests took {elapsed:?} (serial: {serial:?})"
    );

    // Requests still in flight at NBD_CMD_DISC are finished and answered first.
    for cookie in 0..16u64 {
        raw.request(
            proto::CMD_WRITE,
            proto::CMD_FLAG_FUA,
            100 + cookie,
            (64 + cookie) * 4096,
            4096,
        );
        raw.stream
            .write_all(&pattern(4096, 100 + cookie as u8))
            .unwrap();
    }
    raw.request(proto::CMD_DISC, 0, 0, 0, 0);
    let mut replies = 0;
    let mut reply = [0; proto::SIMPLE_REPLY_LEN];
    while raw.stream.read_exact(&mut reply).is_ok() {
        assert_eq!(proto::parse_simple_reply(&reply).unwrap().error, 0);
        replies += 1;
    }
    assert_eq!(replies, 16);
    for cookie in 0..16u64 {
        let mut block = vec![0; 4096];
        slow.inner.read((64 + cookie) * 4096, &mut block).unwrap();
        assert_eq!(block, pattern(4096, 100 + cookie as u8));
    }
}

/// An export whose reads and writes of its first block fail with EIO.
struct FailingExport(MemoryExport);

impl FailingExport {
    fn check(offset: u64) -> Result<(), BlockError> {
        if offset < BLOCK {
            let source = io::Error::from_raw_os_error(proto::EIO as i32);
            return Err(BlockError::Backend {
                what: format!("at {offset}"),
                source,
            });
        }
        Ok(())
    }
}

impl Export for FailingExport {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn is_read_only(&self) -> bool {
        false
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        FailingExport::check(offset)?;
        self.0.read(offset, buf)
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), BlockError> {
        FailingExport::check(offset)?;
        self.0.write(offset, data, fua)
    }
    fn flush(&self) -> Result<(), BlockError> {
        self.0.flush()
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), BlockError> {
        self.0.trim(offset, len, fua)
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), BlockError> {
        self.0.write_zeroes(offset, len, fua)
    }
}

#[test]
fn export_failures_reach_the_client_as_errnos() {
    let failing = Arc::new(FailingExport(MemoryExport::new(MIB, false)));
    let fixture = UnixFixture::start(vec![("".to_owned(), failing as Arc<dyn Export>)]);

    // Structured: an error chunk carrying EIO and the export's message.
    let (mut raw, _, _) = Raw::open(&fixture.socket(), "", true);
    raw.request(proto::CMD_READ, 0, 31, 0, 4096);
    let header = proto::parse_chunk_header(&raw.read_exact(proto::CHUNK_HEADER_LEN)).unwrap();
    assert_eq!(
        (header.reply_type, header.cookie),
        (proto::REPLY_TYPE_ERROR, 31)
    );
    let payload = raw.read_exact(header.length as usize);
    assert_eq!(
        u32::from_be_bytes(payload[..4].try_into().unwrap()),
        proto::EIO
    );
    assert!(String::from_utf8_lossy(&payload[6..]).contains("at 0"));
    raw.disconnect();

    // Our client: the errno as the io::Error's OS error; the connection stays usable.
    let backend = NbdBackend::connect(&fixture.server.uri(""), 1).unwrap();
    let mut block = vec![0; 4096];
    let error = backend.read_at(0, &mut block).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(proto::EIO as i32));
    let error = backend.write_at(0, &block).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(proto::EIO as i32));
    backend.write_at(4096, &pattern(4096, 1)).unwrap();
    backend.read_at(4096, &mut block).unwrap();
    assert_eq!(block, pattern(4096, 1));
    let stats = fixture.server.stats();
    assert_eq!((stats.errors, stats.protocol_errors), (3, 0), "{stats:?}");
}

// ---- (f) shutdown and binding ----------------------------------------------------------

#[test]
fn shutdown_is_bounded_with_clients_connected() {
    let (fixture, _) = standard_fixture();
    let socket = fixture.socket();
    let (mut idle, _, _) = Raw::open(&socket, "disk", false);
    let mut in_handshake = Raw::connect(&socket);
    in_handshake.greet(proto::FLAG_C_FIXED_NEWSTYLE);
    let backend = NbdBackend::connect(&fixture.server.uri("disk"), 4).unwrap();
    let mut block = vec![0; 4096];
    backend.read_at(0, &mut block).unwrap();
    // Let the server see every connection before it is told to stop.
    let begun = Instant::now();
    while fixture.server.stats().connections_active < 6 {
        assert!(begun.elapsed() < Duration::from_secs(5));
        thread::sleep(Duration::from_millis(5));
    }

    let UnixFixture { server, dir } = fixture;
    let begun = Instant::now();
    server.shutdown();
    let elapsed = begun.elapsed();
    assert!(
        elapsed < Duration::from_secs(3),
        "shutdown took {elapsed:?}"
    );
    idle.expect_closed();
    in_handshake.expect_closed();
    assert!(!socket.exists(), "the socket file is removed");
    assert!(backend.read_at(0, &mut block).is_err());
    drop(dir);

    // TCP too.
    let disk = memory(MIB);
    let tcp = NbdServer::start(
        Listen::Tcp("127.0.0.1:0".parse().unwrap()),
        exports(&[("", &disk)]),
    )
    .unwrap();
    let mut client = std::net::TcpStream::connect(tcp.local_addr().unwrap()).unwrap();
    client.set_read_timeout(Some(SOCKET_TIMEOUT)).unwrap();
    let mut greeting = [0; proto::GREETING_LEN];
    client.read_exact(&mut greeting).unwrap();
    let begun = Instant::now();
    drop(tcp);
    assert!(begun.elapsed() < Duration::from_secs(3));
    let mut rest = Vec::new();
    let _ = client.read_to_end(&mut rest);
    assert!(rest.is_empty(), "the connection ends after the greeting");
}

#[test]
fn shutdown_is_bounded_even_when_the_socket_path_is_gone() {
    let (fixture, _) = standard_fixture();
    let (mut idle, _, _) = Raw::open(&fixture.socket(), "disk", false);
    std::fs::remove_file(fixture.socket()).unwrap();
    let begun = Instant::now();
    fixture.server.shutdown();
    let elapsed = begun.elapsed();
    assert!(
        elapsed < Duration::from_secs(1),
        "shutdown took {elapsed:?}"
    );
    idle.expect_closed();
}

#[test]
fn unix_socket_binding_rules() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nbd.sock");
    let disk = memory(MIB);

    // A stale socket file (nobody listening) is replaced.
    drop(UnixListener::bind(&socket).unwrap());
    assert!(socket.exists());
    let server = NbdServer::start(Listen::Unix(socket.clone()), exports(&[("", &disk)])).unwrap();
    assert_eq!(server.socket_path(), Some(socket.as_path()));
    assert_eq!(server.local_addr(), None);

    // A live one is not stolen.
    let second = NbdServer::start(Listen::Unix(socket.clone()), exports(&[("", &disk)]));
    assert!(second.is_err());
    assert_serves(&socket);
    server.shutdown();

    // A file that is not a socket is left alone.
    std::fs::write(&socket, b"precious").unwrap();
    assert!(NbdServer::start(Listen::Unix(socket.clone()), exports(&[("", &disk)])).is_err());
    assert_eq!(std::fs::read(&socket).unwrap(), b"precious");

    // Bad export lists are configuration errors.
    let other = dir.path().join("other.sock");
    assert!(NbdServer::start(Listen::Unix(other.clone()), Vec::new()).is_err());
    let twice = exports(&[("a", &disk), ("a", &disk)]);
    assert!(NbdServer::start(Listen::Unix(other), twice).is_err());
}

// ---- unchanged clients: nbdcopy, qemu-img, qemu-io, nbdsh -------------------------------

/// Runs a client tool to success; its standard output.
fn client(command: &mut Command) -> String {
    let output = run_with_deadline(command, TOOL_DEADLINE);
    assert!(
        output.status.success(),
        "{command:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn export_bytes(export: &MemoryExport, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    export.read(offset, &mut out).unwrap();
    out
}

/// nbdsh (`python3 -mnbd`), with the system's python3 first on PATH when the first one
/// there (a pyenv, say) lacks libnbd's module.
fn nbdsh() -> Command {
    let works = |c: &mut Command| {
        c.arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut command = Command::new("nbdsh");
    if !works(&mut Command::new("nbdsh")) {
        let path = std::env::var("PATH").unwrap_or_default();
        command.env("PATH", format!("/usr/bin:{path}"));
    }
    command
}

#[test]
fn unchanged_clients_copy_write_and_read_through_the_server() {
    let tools = ["nbdcopy", "qemu-img", "qemu-io"];
    if !tools.iter().all(|t| have_tool(t)) {
        return;
    }
    let nbdsh_works = nbdsh()
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !nbdsh_works {
        assert!(
            std::env::var("TERRACE_REQUIRE_TOOLS").as_deref() != Ok("1"),
            "nbdsh (python3-libnbd) is missing and TERRACE_REQUIRE_TOOLS=1"
        );
        eprintln!("note: nbdsh not found; skipping this test");
        return;
    }
    let disk = memory(64 * MIB);
    let fixture = UnixFixture::start(exports(&[("disk", &disk)]));
    let uri = fixture.server.uri("disk");
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(23);
    let source: Vec<u8> = (0..4 * MIB).map(|_| rng.next() as u8).collect();
    let src = dir.path().join("src.img");
    std::fs::write(&src, &source).unwrap();

    // nbdcopy in (a 4 MiB file over the export's start) and out (the whole export).
    client(Command::new("nbdcopy").arg(&src).arg(&uri));
    assert!(export_bytes(&disk, 0, source.len()) == source, "nbdcopy in");
    let dst = dir.path().join("dst.img");
    client(Command::new("nbdcopy").arg(&uri).arg(&dst));
    let copied = std::fs::read(&dst).unwrap();
    assert_eq!(copied.len() as u64, 64 * MIB);
    assert!(copied[..source.len()] == source[..], "nbdcopy out");
    assert!(copied[source.len()..].iter().all(|&b| b == 0));

    // qemu-img sees the size and finds the export equal to the file it came from (the
    // rest of the export is zeroes).
    let info = client(
        Command::new("qemu-img")
            .args(["info", "--output=json"])
            .arg(&uri),
    );
    assert!(info.contains("\"virtual-size\": 67108864"), "{info}");
    client(
        Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(&src)
            .arg(&uri),
    );

    // qemu-io writes a pattern and reads it back (it checks the pattern itself).
    let io = client(
        Command::new("qemu-io")
            .args(["-f", "raw"])
            .args(["-c", "write -P 0x5a 8M 64k", "-c", "read -P 0x5a 8M 64k"])
            .args([
                "-c",
                "write -z 9M 64k",
                "-c",
                "read -P 0 9M 64k",
                "-c",
                "flush",
            ])
            .arg(&uri),
    );
    assert!(io.contains("wrote 65536/65536 bytes"), "{io}");
    assert!(!io.contains("Pattern verification failed"), "{io}");
    assert!(export_bytes(&disk, 8 * MIB, 65536)
        .iter()
        .all(|&b| b == 0x5a));

    // nbdsh (libnbd's Python shell): a write, a read, a flush, a zero.
    let script = "\
buf = b'\\x11' * 4096
h.pwrite(buf, 16 * 1024 * 1024)
assert h.pread(4096, 16 * 1024 * 1024) == buf
h.flush()
h.zero(4096, 16 * 1024 * 1024)
assert h.pread(4096, 16 * 1024 * 1024) == bytes(4096)
print('nbdsh ok', h.get_size())
";
    let out = client(nbdsh().arg("-u").arg(&uri).arg("-c").arg(script));
    assert!(out.contains("nbdsh ok 67108864"), "{out}");
}

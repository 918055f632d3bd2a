//! The differential harness: memcached and `terrace serve` side by side, the same
//! bytes sent to both, their replies normalised ([`normalise`]) and compared.
//!
//! A stream is a list of [`Part`]s rendered for one server at a time: literal bytes,
//! split points (a separate `write` after a pause, so requests cross TCP reads), sync
//! points (a marker request whose reply is awaited, so that a later part can use a CAS
//! value from the replies so far) and the CAS itself. After the last part the client
//! shuts its write side down and reads to EOF: both servers close a connection whose
//! input has ended, so the whole reply is what came before the close.
//!
//! Every stream's keys carry a prefix no other stream uses ([`Keys`]), so streams run in
//! parallel and state never leaks from one to another.

#![allow(dead_code)] // the test file uses a subset

pub mod gen;

use std::collections::HashMap;
use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::common;

/// How long a stream may take before the harness calls it a hang.
const STREAM_TIMEOUT: Duration = Duration::from_secs(20);
/// The pause between the writes of a split stream.
const SPLIT_PAUSE: Duration = Duration::from_millis(2);
/// Opaque of the binary NOOP that marks a sync point.
const SYNC_OPAQUE: u32 = 0x5EC0_5EC0;

/// One piece of a stream.
#[derive(Clone, PartialEq, Eq)]
pub enum Part {
    Bytes(Vec<u8>),
    /// End of a write: what follows is sent in a later write, after a short pause.
    Split,
    /// Sends a marker request (`mn` for text, a NOOP for binary) and waits for its reply.
    Sync,
    /// The latest CAS value the server sent so far (needs a [`Part::Sync`] before it):
    /// decimal digits on a text stream, 8 big-endian bytes on a binary one.
    Cas,
}

impl fmt::Debug for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Part::Bytes(b) => write!(f, "{}", show(b)),
            Part::Split => write!(f, "<split>"),
            Part::Sync => write!(f, "<sync>"),
            Part::Cas => write!(f, "<cas>"),
        }
    }
}

/// Bytes as an escaped string, long runs of one byte shortened.
pub fn show(b: &[u8]) -> String {
    let mut s = String::new();
    let mut i = 0;
    while i < b.len() {
        let run = b[i..].iter().take_while(|&&c| c == b[i]).count();
        if run > 16 {
            s.push_str(&format!("<{}x{}>", run, show(&b[i..i + 1])));
            i += run;
            continue;
        }
        let c = b[i];
        match c {
            b'\r' => s.push_str("\\r"),
            b'\n' => s.push_str("\\n"),
            b'\\' => s.push_str("\\\\"),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
        i += 1;
    }
    s
}

/// Whether a stream speaks the binary protocol (its first byte is 0x80).
pub fn is_binary(parts: &[Part]) -> bool {
    parts.iter().find_map(|p| match p {
        Part::Bytes(b) if !b.is_empty() => Some(b[0] == 0x80),
        _ => None,
    }) == Some(true)
}

/// The keys of one stream: `k(i)` are distinct for distinct `i`, and no other stream
/// (in this run or a later one) uses them.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn fresh() -> Keys {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // Unique across runs against the same servers too: the process id and the time.
        let salt = std::process::id() as u64 ^ (now_nanos() & 0xffff);
        Keys {
            prefix: format!("d{:04x}{:07}", salt & 0xffff, n % 10_000_000),
        }
    }

    /// Key `i` (12 to 14 bytes).
    pub fn k(&self, i: usize) -> Vec<u8> {
        format!("{}_{i}", self.prefix).into_bytes()
    }

    /// Key `i` padded to exactly `len` bytes (`len` >= 16).
    pub fn k_len(&self, i: usize, len: usize) -> Vec<u8> {
        let mut k = self.k(i);
        assert!(len > k.len(), "a key of {len} bytes cannot hold the prefix");
        k.push(b'_');
        k.resize(len, b'p');
        k
    }
}

fn now_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

// ---------------------------------------------------------------------------------------
// The two servers

/// memcached 1.6 and terrace serve, started once and shared by every stream.
pub struct Servers {
    memcached: common::ChildGuard,
    pub memcached_port: u16,
    pub terrace: common::Server,
    _dir: tempfile::TempDir,
}

impl Servers {
    /// Starts both, or `None` (after a loud skip message) without memcached.
    pub fn start() -> Option<Servers> {
        let (memcached, port) = common::start_memcached(&["-m", "64", "-t", "2"])?;
        let dir = tempfile::tempdir().expect("creating a temporary directory");
        let terrace = common::start(dir.path(), &[]);
        Some(Servers {
            memcached,
            memcached_port: port,
            terrace,
            _dir: dir,
        })
    }

    /// Both servers' normalised replies to `parts`.
    pub fn both(&self, parts: &[Part]) -> (Reply, Reply) {
        let terrace_port = self.terrace.port();
        std::thread::scope(|s| {
            let m = s.spawn(|| exchange(self.memcached_port, parts));
            let t = exchange(terrace_port, parts);
            (m.join().expect("the memcached exchange panicked"), t)
        })
    }

    /// Runs `parts` on both servers; `Err` describes the difference.
    pub fn compare(&self, parts: &[Part]) -> Result<(), String> {
        let (m, t) = self.both(parts);
        compare(parts, &m, &t)
    }

    pub fn check_alive(&mut self) {
        assert!(self.memcached.running(), "memcached died");
        self.terrace.assert_alive("after the differential streams");
    }
}

/// The comparison of two replies: equal after normalisation, or a report.
pub fn compare(parts: &[Part], memcached: &Reply, terrace: &Reply) -> Result<(), String> {
    if memcached.normalised == terrace.normalised && memcached.end == terrace.end {
        return Ok(());
    }
    Err(format!(
        "stream:    {parts:?}\nmemcached: {} [{:?}]\nterrace:   {} [{:?}]\n(raw memcached: {})\n(raw terrace:   {})",
        memcached.normalised,
        memcached.end,
        terrace.normalised,
        terrace.end,
        show(&memcached.raw[..memcached.raw.len().min(2000)]),
        show(&terrace.raw[..terrace.raw.len().min(2000)]),
    ))
}

/// How a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The server closed it (EOF or reset: both are a close to a client).
    Closed,
    /// Nothing more came and the connection stayed open: a hang.
    Hung,
}

/// One server's reply to a stream.
#[derive(Clone, Debug)]
pub struct Reply {
    pub raw: Vec<u8>,
    pub normalised: String,
    pub end: End,
}

/// Sends `parts` to the server on `port`, reads to EOF.
pub fn exchange(port: u16, parts: &[Part]) -> Reply {
    let binary = is_binary(parts);
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connecting to 127.0.0.1:{port}: {e}"));
    let _ = s.set_nodelay(true);
    s.set_write_timeout(Some(STREAM_TIMEOUT)).expect("timeout");
    let deadline = Instant::now() + STREAM_TIMEOUT;
    let mut got = Vec::new();
    let mut pending = Vec::new();
    let mut cas: Vec<u64> = Vec::new();
    let mut write_ok = true;
    let mut end = None;
    for part in parts {
        match part {
            Part::Bytes(b) => pending.extend_from_slice(b),
            Part::Cas => {
                let latest = cas.last().copied().unwrap_or(0);
                if binary {
                    pending.extend_from_slice(&latest.to_be_bytes());
                } else {
                    pending.extend_from_slice(latest.to_string().as_bytes());
                }
            }
            Part::Split => {
                write_ok &= send(&mut s, &mut pending);
                std::thread::sleep(SPLIT_PAUSE);
            }
            Part::Sync => {
                if binary {
                    pending.extend_from_slice(&binary_request(0x0a, &[], &[], &[], 0, SYNC_OPAQUE));
                } else {
                    pending.extend_from_slice(b"mn\r\n");
                }
                write_ok &= send(&mut s, &mut pending);
                if !write_ok {
                    break;
                }
                match read_until_sync(&mut s, &mut got, binary, deadline) {
                    Ok(()) => cas = cas_values(&got, binary),
                    Err(e) => {
                        end = Some(e);
                        break;
                    }
                }
            }
        }
    }
    if end.is_none() {
        if write_ok {
            send(&mut s, &mut pending);
        }
        let _ = s.shutdown(Shutdown::Write);
        end = Some(read_to_end(&mut s, &mut got, deadline));
    }
    let normalised = normalise(&got, binary);
    Reply {
        raw: got,
        normalised,
        end: end.unwrap_or(End::Closed),
    }
}

fn send(s: &mut TcpStream, pending: &mut Vec<u8>) -> bool {
    let ok = pending.is_empty() || s.write_all(pending).is_ok();
    pending.clear();
    ok
}

/// Reads until the reply ends with the sync marker's reply.
fn read_until_sync(
    s: &mut TcpStream,
    got: &mut Vec<u8>,
    binary: bool,
    deadline: Instant,
) -> Result<(), End> {
    let marker_reply = if binary {
        binary_response_header(0x0a, SYNC_OPAQUE)
    } else {
        b"MN\r\n".to_vec()
    };
    let mut chunk = [0u8; 64 * 1024];
    loop {
        if got.ends_with(&marker_reply) {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(End::Hung);
        }
        s.set_read_timeout(Some(left)).expect("timeout");
        match s.read(&mut chunk) {
            Ok(0) => return Err(End::Closed),
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(End::Hung)
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(End::Closed),
        }
    }
}

fn read_to_end(s: &mut TcpStream, got: &mut Vec<u8>, deadline: Instant) -> End {
    let mut chunk = [0u8; 64 * 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return End::Hung;
        }
        s.set_read_timeout(Some(left)).expect("timeout");
        match s.read(&mut chunk) {
            Ok(0) => return End::Closed,
            Ok(n) => got.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return End::Hung
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return End::Closed,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Binary requests

/// A binary request: header (magic 0x80) then extras, key, value.
pub fn binary_request(
    opcode: u8,
    extras: &[u8],
    key: &[u8],
    value: &[u8],
    cas: u64,
    opaque: u32,
) -> Vec<u8> {
    let body = extras.len() + key.len() + value.len();
    binary_raw(BinHeader {
        opcode,
        key_len: key.len() as u16,
        extras_len: extras.len() as u8,
        body_len: body as u32,
        cas,
        opaque,
        ..BinHeader::default()
    })
    .into_iter()
    .chain(extras.iter().copied())
    .chain(key.iter().copied())
    .chain(value.iter().copied())
    .collect()
}

/// A binary request header with every field chosen.
#[derive(Clone, Copy, Debug)]
pub struct BinHeader {
    pub magic: u8,
    pub opcode: u8,
    pub key_len: u16,
    pub extras_len: u8,
    pub data_type: u8,
    pub vbucket: u16,
    pub body_len: u32,
    pub opaque: u32,
    pub cas: u64,
}

impl Default for BinHeader {
    fn default() -> BinHeader {
        BinHeader {
            magic: 0x80,
            opcode: 0,
            key_len: 0,
            extras_len: 0,
            data_type: 0,
            vbucket: 0,
            body_len: 0,
            opaque: 0,
            cas: 0,
        }
    }
}

/// The 24 header bytes.
pub fn binary_raw(h: BinHeader) -> Vec<u8> {
    let mut r = vec![h.magic, h.opcode];
    r.extend_from_slice(&h.key_len.to_be_bytes());
    r.push(h.extras_len);
    r.push(h.data_type);
    r.extend_from_slice(&h.vbucket.to_be_bytes());
    r.extend_from_slice(&h.body_len.to_be_bytes());
    r.extend_from_slice(&h.opaque.to_be_bytes());
    r.extend_from_slice(&h.cas.to_be_bytes());
    r
}

/// The reply header of a successful, bodiless response (a NOOP's).
fn binary_response_header(opcode: u8, opaque: u32) -> Vec<u8> {
    let mut r = vec![0x81, opcode, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    r.extend_from_slice(&opaque.to_be_bytes());
    r.extend_from_slice(&[0; 8]);
    r
}

// ---------------------------------------------------------------------------------------
// Normalisation: the written list of intended differences, applied

/// The CAS values of a reply, in the order they appear.
pub fn cas_values(reply: &[u8], binary: bool) -> Vec<u64> {
    let mut values = Vec::new();
    if binary {
        let mut at = 0;
        while let Some(h) = reply.get(at..at + 24) {
            let cas = u64::from_be_bytes(h[16..24].try_into().expect("8 bytes"));
            if cas != 0 {
                values.push(cas);
            }
            at += 24 + u32::from_be_bytes(h[8..12].try_into().expect("4 bytes")) as usize;
        }
    } else {
        for_each_line(reply, |line| {
            for (i, t) in line.split(|&b| b == b' ').enumerate() {
                let numeric = |t: &[u8]| {
                    std::str::from_utf8(t)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                };
                if line.starts_with(b"VALUE ") && i == 4 {
                    values.extend(numeric(t));
                }
                if is_meta_reply(line) && i > 0 && t.first() == Some(&b'c') {
                    values.extend(numeric(&t[1..]));
                }
            }
        });
    }
    values
}

/// Calls `f` with each reply line (without its `\r\n`), skipping data blocks.
fn for_each_line(reply: &[u8], mut f: impl FnMut(&[u8])) {
    let mut at = 0;
    while at < reply.len() {
        let Some(end) = find(&reply[at..], b"\r\n") else {
            return;
        };
        let line = &reply[at..at + end];
        f(line);
        at += end + 2;
        if let Some(len) = data_len(line) {
            at += len + 2;
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The length of the data block that follows a `VALUE` or `VA` line.
fn data_len(line: &[u8]) -> Option<usize> {
    let tokens: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let n = match *tokens.first()? {
        b"VALUE" => tokens.get(3)?,
        b"VA" => tokens.get(1)?,
        _ => return None,
    };
    std::str::from_utf8(n).ok()?.parse().ok()
}

fn is_meta_reply(line: &[u8]) -> bool {
    [&b"HD"[..], b"VA", b"EN", b"NF", b"NS", b"EX", b"ME"]
        .iter()
        .any(|code| line.starts_with(code) && matches!(line.get(2), None | Some(b' ')))
}

/// A reply with the intended differences (the list at the top of the test file)
/// rewritten to one form: CAS values numbered in order of appearance, the version
/// string, the `STAT` lines of a stats reply, the seconds of meta's `t` and `l` flags.
pub fn normalise(reply: &[u8], binary: bool) -> String {
    let mut numbering: HashMap<u64, usize> = HashMap::new();
    let mut cas = |v: u64| {
        let next = numbering.len() + 1;
        format!("cas#{}", numbering.entry(v).or_insert(next))
    };
    if binary {
        return normalise_binary(reply, &mut cas);
    }
    let mut out = String::new();
    let mut at = 0;
    let mut in_stats = false;
    while at < reply.len() {
        let Some(end) = find(&reply[at..], b"\r\n") else {
            out.push_str(&show(&reply[at..]));
            break;
        };
        let line = &reply[at..at + end];
        at += end + 2;
        if line.starts_with(b"STAT ") {
            if !in_stats {
                out.push_str("STAT <stats>\\r\\n");
            }
            in_stats = true;
            continue;
        }
        in_stats = false;
        if line.starts_with(b"ME ") {
            // Meta debug: its fields are the engine's (memcached's slab class, item size
            // with header; Terrace's tier).
            let key = line[3..].split(|&b| b == b' ').next().unwrap_or_default();
            out.push_str(&format!("ME {} <debug>\\r\\n", show(key)));
            continue;
        }
        if line.starts_with(b"VERSION ") {
            out.push_str("VERSION <version>\\r\\n");
            continue;
        }
        let tokens: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
        let meta = is_meta_reply(line);
        for (i, t) in tokens.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            let number = std::str::from_utf8(t)
                .ok()
                .and_then(|s| s.parse::<u64>().ok());
            let flag_number = std::str::from_utf8(t.get(1..).unwrap_or_default())
                .ok()
                .and_then(|s| s.parse::<u64>().ok());
            match (t.first(), number, flag_number) {
                _ if line.starts_with(b"VALUE ") && i == 4 && number.is_some() => {
                    out.push_str(&cas(number.unwrap_or_default()))
                }
                (Some(b'c'), _, Some(v)) if meta && i > 0 => {
                    out.push('c');
                    out.push_str(&cas(v));
                }
                (Some(b't'), _, Some(_)) if meta && i > 0 => out.push_str("t<ttl>"),
                (Some(b'l'), _, Some(_)) if meta && i > 0 => out.push_str("l<secs>"),
                _ => out.push_str(&show(t)),
            }
        }
        out.push_str("\\r\\n");
        if let Some(len) = data_len(line) {
            let data = &reply[at.min(reply.len())..(at + len + 2).min(reply.len())];
            out.push_str(&show(data));
            at += len + 2;
        }
    }
    out
}

fn normalise_binary(reply: &[u8], cas: &mut impl FnMut(u64) -> String) -> String {
    let mut out = String::new();
    let mut at = 0;
    let mut in_stats = false;
    while at < reply.len() {
        let Some(h) = reply.get(at..at + 24) else {
            out.push_str(&format!("<partial header {}>", show(&reply[at..])));
            break;
        };
        let key_len = u16::from_be_bytes([h[2], h[3]]) as usize;
        let extras_len = h[4] as usize;
        let body_len = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes")) as usize;
        let opaque = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
        let cas_value = u64::from_be_bytes(h[16..24].try_into().expect("8 bytes"));
        let Some(body) = reply.get(at + 24..at + 24 + body_len) else {
            out.push_str(&format!("<partial response {}>", show(&reply[at..])));
            break;
        };
        at += 24 + body_len;
        let opcode = h[1];
        if opcode == 0x10 && key_len > 0 {
            // One STAT pair; the run ends with an empty one.
            if !in_stats {
                out.push_str("[STAT <stats>]");
            }
            in_stats = true;
            continue;
        }
        in_stats = false;
        let extras = body.get(..extras_len).unwrap_or_default();
        let key = body
            .get(extras_len..extras_len + key_len)
            .unwrap_or_default();
        let value = body.get(extras_len + key_len..).unwrap_or_default();
        let value = if opcode == 0x0b && h[6..8] == [0, 0] {
            "<version>".to_string()
        } else {
            show(value)
        };
        let cas_text = if cas_value == 0 {
            "0".to_string()
        } else {
            cas(cas_value)
        };
        out.push_str(&format!(
            "[{:02x} {:02x} op={opcode:02x} status={:02x}{:02x} type={:02x} opaque={opaque:08x} cas={cas_text} extras={} key={} value={value}]",
            h[0], h[1], h[6], h[7], h[5], show(extras), show(key)
        ));
    }
    out
}

/// A text stream from a template: `{k0}`..`{k9}` a key of the stream, `{k0:250}` the
/// same key padded to 250 bytes, `{cas}` the latest CAS, `{sync}` and `{split}` the
/// parts of those names; everything else literal, with `\r\n` and `\0` written as such.
pub fn template(keys: &Keys, t: &str) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut bytes = Vec::new();
    let mut rest = t;
    while let Some(open) = rest.find('{') {
        bytes.extend_from_slice(&rest.as_bytes()[..open]);
        let close = rest[open..].find('}').expect("an unclosed { in a template") + open;
        let name = &rest[open + 1..close];
        rest = &rest[close + 1..];
        let flush = |parts: &mut Vec<Part>, bytes: &mut Vec<u8>| {
            if !bytes.is_empty() {
                parts.push(Part::Bytes(std::mem::take(bytes)));
            }
        };
        match name {
            "cas" => {
                flush(&mut parts, &mut bytes);
                parts.push(Part::Cas);
            }
            "sync" => {
                flush(&mut parts, &mut bytes);
                parts.push(Part::Sync);
            }
            "split" => {
                flush(&mut parts, &mut bytes);
                parts.push(Part::Split);
            }
            key if key.starts_with('k') => {
                let (i, len) = match key[1..].split_once(':') {
                    Some((i, len)) => (i, Some(len)),
                    None => (&key[1..], None),
                };
                let i: usize = i.parse().expect("a key number");
                match len {
                    Some(len) => bytes.extend(keys.k_len(i, len.parse().expect("a key length"))),
                    None => bytes.extend(keys.k(i)),
                }
            }
            other => panic!("unknown template part {{{other}}}"),
        }
    }
    bytes.extend_from_slice(rest.as_bytes());
    if !bytes.is_empty() {
        parts.push(Part::Bytes(bytes));
    }
    parts
}

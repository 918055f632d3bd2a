//! memcached's binary protocol (memcached 1.6, `protocol_binary.h`): requests are a
//! 24-byte header (magic `0x80`) then extras, key and value; every response is a header
//! (magic `0x81`, echoing the request's opcode and opaque) then extras, key and value.
//!
//! This module owns the framing and each opcode's argument rules; the memcached
//! semantics (expiry, CAS, counted operations) are [`Shared`]'s.
//!
//! Invariants:
//! - a request is buffered whole only once its lengths are valid for its opcode, so
//!   `NeedMore` never asks for more than 24 + 255 + 65535 + `max_value` bytes;
//! - a value above `max_value` is answered "Too large." and its body swallowed unread
//!   (a SET/SETQ also removes the key's old value, as memcached does);
//! - an unknown opcode is answered "Unknown command" and its body skipped: the
//!   connection goes on;
//! - a body shorter than key + extras is answered "Unknown command", any other
//!   malformed request (a key above `max_key`, extras, key or value lengths its opcode
//!   does not take) "Invalid arguments", and the connection closed, as memcached does;
//!   a first byte other than `0x80` closes without a reply (no resynchronising); the
//!   data type is ignored, as memcached ignores it;
//! - quiet opcodes send nothing on success (GETQ/GETKQ/GATQ/GATKQ send hits, not
//!   misses); errors are always sent, with cas 0, no extras and memcached's text as
//!   the value (a GETK/GATK miss carries the key instead).
//!
//! A non-zero CAS on DELETE, APPEND, PREPEND, INCR and DECR must be the key's, compared
//! atomically with the operation (the cache's `Checked` operations), as memcached does.
//!
//! Deliberate differences from memcached 1.6: VERBOSITY is answered OK
//! (memcached 1.6 no longer knows the opcode, and its unknown-command path skips the
//! body twice); the body length of TOUCH/GAT must be exactly extras + key (memcached
//! does not check it and misframes).

use std::fmt::Write as _;

use terrace_cache::{Checked, Store};

use super::{push_decimal, Step};
use crate::shared::{Delta, Failure, Shared, StoreOp};
use crate::stats::{self, Counter};

/// First byte of every binary request.
pub const REQUEST_MAGIC: u8 = 0x80;

/// First byte of every binary response.
const RESPONSE_MAGIC: u8 = 0x81;

/// Length of a request or response header.
const HEADER_LEN: usize = 24;

/// The only data type defined: raw bytes.
const RAW_BYTES: u8 = 0;

/// INCR/DECR expiration meaning "fail on a missing key instead of creating it".
const NO_CREATE: u32 = 0xffff_ffff;

/// A parsed request header (lengths in host order, opaque kept as sent).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Header {
    opcode: u8,
    key_len: usize,
    extras_len: usize,
    body_len: usize,
    opaque: [u8; 4],
    cas: u64,
}

impl Header {
    /// The header at the start of `input` (whose magic the caller checked); `None` while
    /// fewer than 24 bytes are here.
    fn parse(input: &[u8]) -> Option<Header> {
        let h = input.get(..HEADER_LEN)?;
        Some(Header {
            opcode: h[1],
            key_len: usize::from(u16::from_be_bytes(field(h, 2))),
            // h[5], the data type, is ignored, as memcached ignores it.
            extras_len: usize::from(h[4]),
            body_len: usize::try_from(u32::from_be_bytes(field(h, 8))).unwrap_or(usize::MAX),
            opaque: field(h, 12),
            cas: u64::from_be_bytes(field(h, 16)),
        })
    }

    /// The whole request's length, header included.
    fn total_len(&self) -> usize {
        HEADER_LEN.saturating_add(self.body_len)
    }
}

/// The key of the get (GET, GAT and their quiet and key-returning variants) at the
/// start of `input`, once its header, extras and key are here; `None` for anything else.
pub(super) fn get_key(input: &[u8]) -> Option<&[u8]> {
    if input.first() != Some(&REQUEST_MAGIC) {
        return None;
    }
    let header = Header::parse(input)?;
    let opcode = Opcode::decode(header.opcode)?;
    if !matches!(opcode.command, Command::Get | Command::GetAndTouch) {
        return None;
    }
    let start = HEADER_LEN + header.extras_len;
    input.get(start..start + header.key_len)
}

/// `N` bytes of `bytes` at `at` (zeros if out of range: callers check lengths first).
fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    bytes
        .get(at..at.saturating_add(N))
        .and_then(|b| b.try_into().ok())
        .unwrap_or([0; N])
}

/// What a request asks for; quiet and key-returning variants share a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Command {
    Get,
    GetAndTouch,
    Touch,
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    Delete,
    Increment,
    Decrement,
    Quit,
    Flush,
    Noop,
    Version,
    Stat,
    Verbosity,
}

/// A known opcode: its command, whether it is a quiet variant, whether a hit returns
/// the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Opcode {
    command: Command,
    quiet: bool,
    with_key: bool,
}

impl Opcode {
    fn decode(byte: u8) -> Option<Opcode> {
        use Command::*;
        let (command, quiet, with_key) = match byte {
            0x00 => (Get, false, false),
            0x09 => (Get, true, false),
            0x0c => (Get, false, true),
            0x0d => (Get, true, true),
            0x1d => (GetAndTouch, false, false),
            0x1e => (GetAndTouch, true, false),
            0x23 => (GetAndTouch, false, true),
            0x24 => (GetAndTouch, true, true),
            0x1c => (Touch, false, false),
            0x01 => (Set, false, false),
            0x11 => (Set, true, false),
            0x02 => (Add, false, false),
            0x12 => (Add, true, false),
            0x03 => (Replace, false, false),
            0x13 => (Replace, true, false),
            0x0e => (Append, false, false),
            0x19 => (Append, true, false),
            0x0f => (Prepend, false, false),
            0x1a => (Prepend, true, false),
            0x04 => (Delete, false, false),
            0x14 => (Delete, true, false),
            0x05 => (Increment, false, false),
            0x15 => (Increment, true, false),
            0x06 => (Decrement, false, false),
            0x16 => (Decrement, true, false),
            0x07 => (Quit, false, false),
            0x17 => (Quit, true, false),
            0x08 => (Flush, false, false),
            0x18 => (Flush, true, false),
            0x0a => (Noop, false, false),
            0x0b => (Version, false, false),
            0x10 => (Stat, false, false),
            0x1b => (Verbosity, false, false),
            _ => return None,
        };
        Some(Opcode {
            command,
            quiet,
            with_key,
        })
    }
}

/// Whether a command's requests carry a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyRule {
    Required,
    Forbidden,
    Optional,
}

/// The body a command takes.
#[derive(Clone, Copy, Debug)]
struct Shape {
    /// Accepted extras lengths.
    extras: &'static [usize],
    key: KeyRule,
    /// Whether a value may follow the key.
    value: bool,
}

impl Command {
    fn shape(self) -> Shape {
        use Command::*;
        let (extras, key, value): (&'static [usize], _, _) = match self {
            Get | Delete => (&[0], KeyRule::Required, false),
            GetAndTouch | Touch => (&[4], KeyRule::Required, false),
            Set | Add | Replace => (&[8], KeyRule::Required, true),
            Append | Prepend => (&[0], KeyRule::Required, true),
            Increment | Decrement => (&[20], KeyRule::Required, false),
            Quit | Noop | Version => (&[0], KeyRule::Forbidden, false),
            Flush => (&[0, 4], KeyRule::Forbidden, false),
            Verbosity => (&[4], KeyRule::Forbidden, false),
            Stat => (&[0], KeyRule::Optional, false),
        };
        Shape { extras, key, value }
    }
}

impl Shape {
    /// Whether a request with this header and `value_len` value bytes is well formed.
    fn admits(&self, header: &Header, value_len: usize) -> bool {
        let key_ok = match self.key {
            KeyRule::Required => header.key_len > 0,
            KeyRule::Forbidden => header.key_len == 0,
            KeyRule::Optional => true,
        };
        key_ok && self.extras.contains(&header.extras_len) && (self.value || value_len == 0)
    }
}

/// Response status codes (memcached's `protocol_binary_response_status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
enum Status {
    Ok = 0x00,
    NotFound = 0x01,
    Exists = 0x02,
    TooLarge = 0x03,
    Invalid = 0x04,
    NotStored = 0x05,
    NotANumber = 0x06,
    UnknownCommand = 0x81,
    OutOfMemory = 0x82,
    /// Not in memcached's header; the binary protocol spec's "Internal error".
    Internal = 0x84,
}

impl Status {
    fn of(failure: Failure) -> Status {
        match failure {
            Failure::BadKey => Status::Invalid,
            Failure::TooLarge => Status::TooLarge,
            Failure::OutOfMemory => Status::OutOfMemory,
            Failure::NotANumber => Status::NotANumber,
            Failure::Internal => Status::Internal,
        }
    }

    /// The text an error response carries (memcached's `write_bin_error`).
    fn text(self) -> &'static [u8] {
        match self {
            Status::Ok => b"",
            Status::NotFound => b"Not found",
            Status::Exists => b"Data exists for key.",
            Status::TooLarge => b"Too large.",
            Status::Invalid => b"Invalid arguments",
            Status::NotStored => b"Not stored.",
            Status::NotANumber => b"Non-numeric server-side value for incr or decr",
            Status::UnknownCommand => b"Unknown command",
            Status::OutOfMemory => b"Out of memory",
            Status::Internal => b"Internal error",
        }
    }
}

/// The parts of a response after its header.
#[derive(Clone, Copy, Debug, Default)]
struct Body<'a> {
    extras: &'a [u8],
    key: &'a [u8],
    value: &'a [u8],
}

impl<'a> Body<'a> {
    fn new(extras: &'a [u8], key: &'a [u8], value: &'a [u8]) -> Body<'a> {
        Body { extras, key, value }
    }

    fn value(value: &'a [u8]) -> Body<'a> {
        Body::new(&[], &[], value)
    }
}

/// Appends one response: the header (echoing the request's opcode and opaque), then
/// extras, key and value.
fn respond(out: &mut Vec<u8>, header: &Header, status: Status, cas: u64, body: Body<'_>) {
    let Body { extras, key, value } = body;
    let body_len = extras.len() + key.len() + value.len();
    out.reserve(HEADER_LEN + body_len);
    out.push(RESPONSE_MAGIC);
    out.push(header.opcode);
    out.extend_from_slice(&u16::try_from(key.len()).unwrap_or(u16::MAX).to_be_bytes());
    out.push(u8::try_from(extras.len()).unwrap_or(u8::MAX));
    out.push(RAW_BYTES);
    out.extend_from_slice(&(status as u16).to_be_bytes());
    out.extend_from_slice(&u32::try_from(body_len).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&header.opaque);
    out.extend_from_slice(&cas.to_be_bytes());
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
}

/// Appends an error response: cas 0, memcached's text as the value.
fn respond_error(out: &mut Vec<u8>, header: &Header, status: Status) {
    respond(out, header, status, 0, Body::value(status.text()));
}

/// Handles at most one request at the start of `input`.
pub fn handle(shared: &Shared, input: &[u8], out: &mut Vec<u8>) -> Step {
    if input.first().is_some_and(|&magic| magic != REQUEST_MAGIC) {
        shared.counters.add(Counter::ProtocolErrors, 1);
        return Step::Close {
            consumed: input.len(),
        };
    }
    let Some(header) = Header::parse(input) else {
        return Step::NeedMore {
            total: Some(HEADER_LEN),
        };
    };
    // As memcached (`try_read_command_binary`, `dispatch_bin_command`): nothing is
    // judged before the extras and key are all here (at most 255 + 65535 bytes); then
    // the lengths, the key's length, then the opcode. The data type is not checked
    // (memcached ignores it).
    let head_len = HEADER_LEN + header.extras_len + header.key_len;
    if input.len() < head_len {
        // The whole request, when its value is one the limits allow.
        let whole = header.total_len();
        let total = match whole.checked_sub(head_len) {
            Some(value) if value <= shared.limits.max_value => whole,
            _ => head_len,
        };
        return Step::NeedMore { total: Some(total) };
    }
    let Some(value_len) = header.body_len.checked_sub(head_len - HEADER_LEN) else {
        return reject(shared, input, &header, Status::UnknownCommand, out);
    };
    if header.key_len > shared.limits.max_key {
        return reject(shared, input, &header, Status::Invalid, out);
    }
    let Some(opcode) = Opcode::decode(header.opcode) else {
        respond_error(out, &header, Status::UnknownCommand);
        return skip(input, header.total_len());
    };
    if !opcode.command.shape().admits(&header, value_len) {
        return reject(shared, input, &header, Status::Invalid, out);
    }
    if value_len > shared.limits.max_value {
        let Some(key) = input.get(head_len - header.key_len..head_len) else {
            return Step::NeedMore {
                total: Some(head_len),
            };
        };
        if opcode.command == Command::Set {
            // As memcached: a failed SET must not leave the old value readable.
            let _ = shared.cache(key).delete(key);
        }
        respond_error(out, &header, Status::TooLarge);
        return skip(input, header.total_len());
    }
    let total = head_len + value_len;
    let Some(whole) = input.get(..total) else {
        return Step::NeedMore { total: Some(total) };
    };
    let (head, value) = whole.split_at(head_len);
    let (extras, key) = head[HEADER_LEN..].split_at(header.extras_len);
    let request = Request {
        header,
        opcode,
        extras,
        key,
        value,
    };
    match execute(shared, &request, out) {
        After::Continue => Step::Done { consumed: total },
        After::Close => Step::Close { consumed: total },
    }
}

/// Consumes a `total`-byte request whose reply is written, without buffering the rest
/// of its body: `Done` if it is all here, else `Swallow` what is still to come.
fn skip(input: &[u8], total: usize) -> Step {
    match total.checked_sub(input.len()) {
        None | Some(0) => Step::Done { consumed: total },
        Some(rest) => Step::Swallow {
            consumed: input.len(),
            skip: rest,
        },
    }
}

/// A malformed request: an error (memcached's: "Unknown command" for a body shorter
/// than its key and extras, else "Invalid arguments"), then close (as memcached: past
/// a request whose lengths do not fit its opcode the stream is not trusted).
fn reject(
    shared: &Shared,
    input: &[u8],
    header: &Header,
    status: Status,
    out: &mut Vec<u8>,
) -> Step {
    shared.counters.add(Counter::ProtocolErrors, 1);
    respond_error(out, header, status);
    Step::Close {
        consumed: input.len(),
    }
}

/// A whole, well-formed request.
struct Request<'a> {
    header: Header,
    opcode: Opcode,
    extras: &'a [u8],
    key: &'a [u8],
    value: &'a [u8],
}

impl Request<'_> {
    fn reply(&self, out: &mut Vec<u8>, status: Status, cas: u64, body: Body<'_>) {
        respond(out, &self.header, status, cas, body);
    }

    /// A success reply with no extras or key: sent unless the opcode is quiet.
    fn ok(&self, out: &mut Vec<u8>, cas: u64, value: &[u8]) {
        if !self.opcode.quiet {
            self.reply(out, Status::Ok, cas, Body::value(value));
        }
    }

    fn fail(&self, out: &mut Vec<u8>, status: Status) {
        respond_error(out, &self.header, status);
    }

    /// The request's CAS as a condition: 0 asks for none.
    fn if_cas(&self) -> Option<u64> {
        (self.header.cas != 0).then_some(self.header.cas)
    }

    /// The big-endian u32 of the extras at `at`.
    fn extra_u32(&self, at: usize) -> u32 {
        u32::from_be_bytes(field(self.extras, at))
    }

    fn extra_u64(&self, at: usize) -> u64 {
        u64::from_be_bytes(field(self.extras, at))
    }
}

/// What the connection does after a request.
enum After {
    Continue,
    Close,
}

fn execute(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) -> After {
    match request.opcode.command {
        Command::Get => get(shared, request, out, None),
        Command::GetAndTouch => {
            let exptime = i64::from(request.extra_u32(0));
            get(shared, request, out, Some(exptime));
        }
        Command::Touch => touch(shared, request, out),
        Command::Set | Command::Add | Command::Replace => store(shared, request, out),
        Command::Append | Command::Prepend => concat(shared, request, out),
        Command::Delete => delete(shared, request, out),
        Command::Increment | Command::Decrement => arith(shared, request, out),
        Command::Quit => {
            request.ok(out, 0, &[]);
            return After::Close;
        }
        Command::Flush => {
            let delay = if request.extras.is_empty() {
                0
            } else {
                request.extra_u32(0)
            };
            shared.flush_all(i64::from(delay));
            request.ok(out, 0, &[]);
        }
        Command::Noop | Command::Verbosity => request.ok(out, 0, &[]),
        Command::Version => request.ok(out, 0, shared.version().as_bytes()),
        Command::Stat => stat(shared, request, out),
    }
    After::Continue
}

/// GET/GETQ/GETK/GETKQ, and with `touch` (an exptime) GAT/GATQ/GATK/GATKQ: a hit
/// returns the flags (4-byte extras), the key for the K variants, and the value.
fn get(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>, touch: Option<i64>) {
    let found = match touch {
        Some(exptime) => shared.gat(request.key, exptime),
        None => shared.get(request.key),
    };
    let key: &[u8] = if request.opcode.with_key {
        request.key
    } else {
        &[]
    };
    match found {
        Ok(Some(item)) => {
            let flags = item.client_flags().to_be_bytes();
            let body = Body::new(&flags, key, item.value());
            request.reply(out, Status::Ok, item.cas(), body);
        }
        Ok(None) if request.opcode.quiet => {}
        Ok(None) if request.opcode.with_key => {
            request.reply(out, Status::NotFound, 0, Body::new(&[], key, &[]));
        }
        Ok(None) => request.fail(out, Status::NotFound),
        Err(failure) => request.fail(out, Status::of(failure)),
    }
}

/// TOUCH: a hit returns the flags and CAS (as memcached), no value.
fn touch(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) {
    match shared.touch(request.key, i64::from(request.extra_u32(0))) {
        Ok(true) => {
            // The touch already counted itself; read the item uncounted for its flags.
            let (flags, cas) = match shared.cache(request.key).peek(request.key) {
                Ok(Some(item)) => (item.client_flags(), item.cas()),
                _ => (0, 0),
            };
            let flags = flags.to_be_bytes();
            request.reply(out, Status::Ok, cas, Body::new(&flags, &[], &[]));
        }
        Ok(false) => request.fail(out, Status::NotFound),
        Err(failure) => request.fail(out, Status::of(failure)),
    }
}

/// SET/ADD/REPLACE (and quiet variants): extras are flags and exptime; a non-zero
/// request CAS makes any of them a compare-and-set (as memcached).
fn store(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) {
    let flags = request.extra_u32(0);
    let exptime = i64::from(request.extra_u32(4));
    let (op, not_stored) = match (request.header.cas, request.opcode.command) {
        (0, Command::Add) => (StoreOp::Add, Status::Exists),
        (0, Command::Replace) => (StoreOp::Replace, Status::NotFound),
        (0, _) => (StoreOp::Set, Status::NotStored),
        (cas, _) => (StoreOp::Cas(cas), Status::NotStored),
    };
    let result = shared.store(op, request.key, request.value, flags, exptime);
    answer_store(request, out, result, not_stored);
}

/// APPEND/PREPEND (and quiet variants): a missing key is "Not stored."; a non-zero
/// request CAS must be the item's.
fn concat(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) {
    let op = if request.opcode.command == Command::Append {
        StoreOp::Append
    } else {
        StoreOp::Prepend
    };
    let result = shared.store_checked(op, request.key, request.value, 0, 0, request.if_cas());
    answer_store(request, out, result, Status::NotStored);
}

/// Replies to a storage command; `not_stored` is the status its failed condition
/// reports (ADD: exists, REPLACE: not found, others: not stored).
fn answer_store(
    request: &Request<'_>,
    out: &mut Vec<u8>,
    result: Result<Store, Failure>,
    not_stored: Status,
) {
    match result {
        Ok(Store::Stored { cas }) => request.ok(out, cas, &[]),
        Ok(Store::NotStored) => request.fail(out, not_stored),
        Ok(Store::Exists) => request.fail(out, Status::Exists),
        Ok(Store::NotFound) => request.fail(out, Status::NotFound),
        Err(failure) => request.fail(out, Status::of(failure)),
    }
}

/// DELETE/DELETEQ: a miss is always reported; a non-zero request CAS must be the
/// item's.
fn delete(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) {
    match shared.delete_checked(request.key, request.if_cas()) {
        Ok(Checked::Done(())) => request.ok(out, 0, &[]),
        Ok(Checked::NotFound) => request.fail(out, Status::NotFound),
        Ok(Checked::Exists) => request.fail(out, Status::Exists),
        Err(failure) => request.fail(out, Status::of(failure)),
    }
}

/// INCREMENT/DECREMENT (and quiet variants): extras are delta, initial value and
/// expiration; a miss creates the key with the initial value unless the expiration is
/// `0xffffffff`. The reply is the new value (u64, big-endian) and the item's CAS.
fn arith(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) {
    let delta = request.extra_u64(0);
    let initial = request.extra_u64(8);
    let expiration = request.extra_u32(16);
    let way = if request.opcode.command == Command::Increment {
        Delta::Incr
    } else {
        Delta::Decr
    };
    match shared.arith_checked(request.key, delta, way, request.if_cas()) {
        Ok(Checked::Done((value, cas))) => request.ok(out, cas, &value.to_be_bytes()),
        Ok(Checked::Exists) => request.fail(out, Status::Exists),
        Ok(Checked::NotFound) if expiration == NO_CREATE => request.fail(out, Status::NotFound),
        Ok(Checked::NotFound) => {
            let mut text = Vec::with_capacity(20);
            push_decimal(&mut text, initial);
            let exptime = i64::from(expiration);
            match shared.store(StoreOp::Add, request.key, &text, 0, exptime) {
                Ok(Store::Stored { cas }) => request.ok(out, cas, &initial.to_be_bytes()),
                Ok(_) => request.fail(out, Status::NotStored),
                Err(failure) => request.fail(out, Status::of(failure)),
            }
        }
        Err(failure) => request.fail(out, Status::of(failure)),
    }
}

/// STAT: one response per stat (key: name, value: text), then an empty one. The key
/// picks the group: none for the general report, "settings", or "reset".
fn stat(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) {
    let report = match request.key {
        b"" => stats::report(shared),
        b"settings" => stats::settings(shared),
        b"reset" => {
            shared.counters.reset();
            Vec::new()
        }
        key if key.starts_with(b"detail") => match stats::detail_binary(shared, &key[6..]) {
            Some(report) => report,
            None => return request.fail(out, Status::NotFound),
        },
        _ => return request.fail(out, Status::NotFound),
    };
    let mut text = String::new();
    for (name, value) in report {
        text.clear();
        let _ = write!(text, "{value}");
        let body = Body::new(&[], name.as_bytes(), text.as_bytes());
        request.reply(out, Status::Ok, 0, body);
    }
    request.reply(out, Status::Ok, 0, Body::default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::test_shared;
    use proptest::prelude::*;

    const OPAQUE: u32 = 0xdead_beef;

    /// A request with the given parts (opaque 0xdeadbeef, raw data type).
    fn request(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64) -> Vec<u8> {
        let mut r = vec![REQUEST_MAGIC, opcode];
        r.extend_from_slice(&(key.len() as u16).to_be_bytes());
        r.push(extras.len() as u8);
        r.push(RAW_BYTES);
        r.extend_from_slice(&[0, 0]);
        let body = (extras.len() + key.len() + value.len()) as u32;
        r.extend_from_slice(&body.to_be_bytes());
        r.extend_from_slice(&OPAQUE.to_be_bytes());
        r.extend_from_slice(&cas.to_be_bytes());
        r.extend_from_slice(extras);
        r.extend_from_slice(key);
        r.extend_from_slice(value);
        r
    }

    fn set_extras(flags: u32, exptime: u32) -> Vec<u8> {
        [flags.to_be_bytes(), exptime.to_be_bytes()].concat()
    }

    fn arith_extras(delta: u64, initial: u64, expiration: u32) -> Vec<u8> {
        let mut e = delta.to_be_bytes().to_vec();
        e.extend_from_slice(&initial.to_be_bytes());
        e.extend_from_slice(&expiration.to_be_bytes());
        e
    }

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Response {
        opcode: u8,
        status: u16,
        opaque: [u8; 4],
        cas: u64,
        extras: Vec<u8>,
        key: Vec<u8>,
        value: Vec<u8>,
    }

    /// Splits `out` into responses, checking the framing of each.
    fn responses(mut out: &[u8]) -> Vec<Response> {
        let mut all = Vec::new();
        while !out.is_empty() {
            assert!(out.len() >= HEADER_LEN, "truncated response header");
            assert_eq!(out[0], RESPONSE_MAGIC);
            assert_eq!(out[5], RAW_BYTES);
            let key_len = usize::from(u16::from_be_bytes([out[2], out[3]]));
            let extras_len = usize::from(out[4]);
            let body_len = u32::from_be_bytes(out[8..12].try_into().unwrap()) as usize;
            assert!(body_len >= key_len + extras_len);
            let body = &out[HEADER_LEN..HEADER_LEN + body_len];
            all.push(Response {
                opcode: out[1],
                status: u16::from_be_bytes([out[6], out[7]]),
                opaque: out[12..16].try_into().unwrap(),
                cas: u64::from_be_bytes(out[16..24].try_into().unwrap()),
                extras: body[..extras_len].to_vec(),
                key: body[extras_len..extras_len + key_len].to_vec(),
                value: body[extras_len + key_len..].to_vec(),
            });
            out = &out[HEADER_LEN + body_len..];
        }
        all
    }

    /// Sends one whole request, expects it consumed (`Done`), returns the responses.
    fn call(shared: &Shared, bytes: &[u8]) -> Vec<Response> {
        let mut out = Vec::new();
        let step = handle(shared, bytes, &mut out);
        assert_eq!(
            step,
            Step::Done {
                consumed: bytes.len()
            }
        );
        let all = responses(&out);
        assert!(
            all.iter().all(|r| r.opaque == OPAQUE.to_be_bytes()),
            "opaque echoed"
        );
        all
    }

    /// `call` for a request expecting exactly one response.
    fn call_one(shared: &Shared, bytes: &[u8]) -> Response {
        let mut r = call(shared, bytes);
        assert_eq!(r.len(), 1, "one response expected: {r:?}");
        r.remove(0)
    }

    fn set(shared: &Shared, key: &[u8], value: &[u8], flags: u32) -> u64 {
        let r = call_one(shared, &request(0x01, &set_extras(flags, 0), key, value, 0));
        assert_eq!(r.status, 0);
        assert_ne!(r.cas, 0);
        r.cas
    }

    fn assert_error(r: &Response, opcode: u8, status: Status) {
        assert_eq!(r.opcode, opcode);
        assert_eq!(r.status, status as u16);
        assert_eq!(r.cas, 0);
        assert!(r.extras.is_empty() && r.key.is_empty());
        assert_eq!(r.value, status.text());
    }

    fn get_value(shared: &Shared, key: &[u8]) -> Option<Vec<u8>> {
        let r = call_one(shared, &request(0x00, &[], key, &[], 0));
        (r.status == 0).then_some(r.value)
    }

    #[test]
    fn get_variants_return_flags_key_and_value() {
        let s = test_shared();
        let cas = set(&s, b"k", b"hello", 0xfeed_f00d);
        let r = call_one(&s, &request(0x00, &[], b"k", &[], 0));
        assert_eq!((r.opcode, r.status, r.cas), (0x00, 0, cas));
        assert_eq!(r.extras, 0xfeed_f00du32.to_be_bytes());
        assert!(r.key.is_empty());
        assert_eq!(r.value, b"hello");
        for (opcode, with_key) in [(0x09, false), (0x0c, true), (0x0d, true)] {
            let r = call_one(&s, &request(opcode, &[], b"k", &[], 0));
            assert_eq!((r.opcode, r.status, r.cas), (opcode, 0, cas));
            assert_eq!(r.key, if with_key { &b"k"[..] } else { &b""[..] });
            assert_eq!(r.value, b"hello");
        }
        assert_error(
            &call_one(&s, &request(0x00, &[], b"nope", &[], 0)),
            0x00,
            Status::NotFound,
        );
        let miss = call_one(&s, &request(0x0c, &[], b"nope", &[], 0));
        assert_eq!((miss.status, miss.cas), (Status::NotFound as u16, 0));
        assert_eq!((miss.key, miss.value), (b"nope".to_vec(), Vec::new()));
        assert!(call(&s, &request(0x09, &[], b"nope", &[], 0)).is_empty());
        assert!(call(&s, &request(0x0d, &[], b"nope", &[], 0)).is_empty());
    }

    #[test]
    fn binary_keys_may_hold_any_byte() {
        let s = test_shared();
        set(&s, b"a key\r\n\0", b"v", 0);
        assert_eq!(get_value(&s, b"a key\r\n\0"), Some(b"v".to_vec()));
    }

    #[test]
    fn storage_commands_and_their_quiet_variants() {
        let s = test_shared();
        // SETQ: silent on success.
        assert!(call(&s, &request(0x11, &set_extras(0, 0), b"q", b"1", 0)).is_empty());
        assert_eq!(get_value(&s, b"q"), Some(b"1".to_vec()));
        // ADD: stored once, then "exists" (quiet or not).
        let r = call_one(&s, &request(0x02, &set_extras(0, 0), b"a", b"x", 0));
        assert_eq!(r.status, 0);
        assert_ne!(r.cas, 0);
        assert!(r.value.is_empty());
        assert_error(
            &call_one(&s, &request(0x02, &set_extras(0, 0), b"a", b"y", 0)),
            0x02,
            Status::Exists,
        );
        assert_error(
            &call_one(&s, &request(0x12, &set_extras(0, 0), b"a", b"y", 0)),
            0x12,
            Status::Exists,
        );
        assert!(call(&s, &request(0x12, &set_extras(0, 0), b"a2", b"y", 0)).is_empty());
        // REPLACE: "not found" on a missing key, then replaces.
        assert_error(
            &call_one(&s, &request(0x03, &set_extras(0, 0), b"r", b"x", 0)),
            0x03,
            Status::NotFound,
        );
        assert_error(
            &call_one(&s, &request(0x13, &set_extras(0, 0), b"r", b"x", 0)),
            0x13,
            Status::NotFound,
        );
        set(&s, b"r", b"old", 0);
        assert_eq!(
            call_one(&s, &request(0x03, &set_extras(0, 0), b"r", b"new", 0)).status,
            0
        );
        assert!(call(&s, &request(0x13, &set_extras(0, 0), b"r", b"newer", 0)).is_empty());
        assert_eq!(get_value(&s, b"r"), Some(b"newer".to_vec()));
        // APPEND/PREPEND: "not stored" on a missing key; flags kept.
        for opcode in [0x0e, 0x0f, 0x19, 0x1a] {
            assert_error(
                &call_one(&s, &request(opcode, &[], b"none", b"x", 0)),
                opcode,
                Status::NotStored,
            );
        }
        set(&s, b"c", b"mid", 7);
        let r = call_one(&s, &request(0x0e, &[], b"c", b">", 0));
        assert_eq!(r.status, 0);
        assert_ne!(r.cas, 0);
        assert!(call(&s, &request(0x1a, &[], b"c", b"<", 0)).is_empty());
        assert!(call(&s, &request(0x19, &[], b"c", b"!", 0)).is_empty());
        assert_eq!(call_one(&s, &request(0x0f, &[], b"c", b"^", 0)).status, 0);
        let r = call_one(&s, &request(0x00, &[], b"c", &[], 0));
        assert_eq!(r.value, b"^<mid>!");
        assert_eq!(r.extras, 7u32.to_be_bytes());
    }

    #[test]
    fn cas_semantics() {
        let s = test_shared();
        let missing = call_one(&s, &request(0x01, &set_extras(0, 0), b"k", b"v", 42));
        assert_error(&missing, 0x01, Status::NotFound);
        let cas = set(&s, b"k", b"v1", 0);
        let stale = call_one(&s, &request(0x01, &set_extras(0, 0), b"k", b"v2", cas + 1));
        assert_error(&stale, 0x01, Status::Exists);
        let stale_q = call_one(&s, &request(0x11, &set_extras(0, 0), b"k", b"v2", cas + 1));
        assert_error(&stale_q, 0x11, Status::Exists);
        let r = call_one(&s, &request(0x01, &set_extras(0, 0), b"k", b"v2", cas));
        assert_eq!(r.status, 0);
        assert_ne!(r.cas, cas);
        let cas = r.cas;
        // REPLACE and ADD with a CAS are compare-and-sets too (as memcached).
        let replace = call_one(&s, &request(0x03, &set_extras(0, 0), b"k", b"v3", cas + 1));
        assert_error(&replace, 0x03, Status::Exists);
        let r = call_one(&s, &request(0x03, &set_extras(0, 0), b"k", b"v3", cas));
        assert_eq!(r.status, 0);
        let cas = r.cas;
        // APPEND, DELETE, INCR with a stale CAS: "exists", nothing changed.
        assert_error(
            &call_one(&s, &request(0x0e, &[], b"k", b"x", cas + 9)),
            0x0e,
            Status::Exists,
        );
        assert_error(
            &call_one(&s, &request(0x04, &[], b"k", &[], cas + 9)),
            0x04,
            Status::Exists,
        );
        let incr = request(0x05, &arith_extras(1, 0, 0), b"k", &[], cas + 9);
        assert_error(&call_one(&s, &incr), 0x05, Status::Exists);
        assert_eq!(get_value(&s, b"k"), Some(b"v3".to_vec()));
        let r = call_one(&s, &request(0x0e, &[], b"k", b"x", cas));
        assert_eq!(r.status, 0);
        let r = call_one(&s, &request(0x04, &[], b"k", &[], r.cas));
        assert_eq!((r.status, r.cas), (0, 0));
        assert_eq!(get_value(&s, b"k"), None);
        // INCR with the right CAS answers with the CAS of the item it wrote.
        let cas = set(&s, b"n", b"41", 0);
        let r = call_one(&s, &request(0x05, &arith_extras(1, 0, 0), b"n", &[], cas));
        assert_eq!((r.status, r.value), (0, 42u64.to_be_bytes().to_vec()));
        let now = call_one(&s, &request(0x00, &[], b"n", &[], 0));
        assert_eq!(now.cas, r.cas);
        assert_ne!(r.cas, cas);
    }

    #[test]
    fn delete_and_deleteq() {
        let s = test_shared();
        assert_error(
            &call_one(&s, &request(0x04, &[], b"d", &[], 0)),
            0x04,
            Status::NotFound,
        );
        assert_error(
            &call_one(&s, &request(0x14, &[], b"d", &[], 0)),
            0x14,
            Status::NotFound,
        );
        set(&s, b"d", b"v", 0);
        let r = call_one(&s, &request(0x04, &[], b"d", &[], 0));
        assert_eq!((r.status, r.cas, r.value.len()), (0, 0, 0));
        set(&s, b"d", b"v", 0);
        assert!(call(&s, &request(0x14, &[], b"d", &[], 0)).is_empty());
        assert_eq!(get_value(&s, b"d"), None);
    }

    #[test]
    fn incr_decr_with_initial_values() {
        let s = test_shared();
        let incr = request(0x05, &arith_extras(1, 0, 0), b"n", &[], 0);
        for expected in 0u64..10 {
            let r = call_one(&s, &incr);
            assert_eq!((r.opcode, r.status), (0x05, 0));
            assert_ne!(r.cas, 0);
            assert!(r.extras.is_empty() && r.key.is_empty());
            assert_eq!(r.value, expected.to_be_bytes());
        }
        assert_eq!(get_value(&s, b"n"), Some(b"9".to_vec()));
        assert!(call(&s, &request(0x15, &arith_extras(5, 0, 0), b"n", &[], 0)).is_empty());
        let decr = request(0x06, &arith_extras(20, 0, 0), b"n", &[], 0);
        assert_eq!(
            call_one(&s, &decr).value,
            0u64.to_be_bytes(),
            "decr stops at 0"
        );
        assert!(call(&s, &request(0x16, &arith_extras(1, 0, 0), b"n", &[], 0)).is_empty());
        // A miss creates the key with the initial value...
        let r = call_one(&s, &request(0x06, &arith_extras(1, 77, 0), b"m", &[], 0));
        assert_eq!(r.value, 77u64.to_be_bytes());
        assert_ne!(r.cas, 0);
        assert_eq!(get_value(&s, b"m"), Some(b"77".to_vec()));
        // ...unless the expiration is 0xffffffff.
        let no_create = request(0x05, &arith_extras(1, 5, NO_CREATE), b"x", &[], 0);
        assert_error(&call_one(&s, &no_create), 0x05, Status::NotFound);
        let no_create_q = request(0x15, &arith_extras(1, 5, NO_CREATE), b"x", &[], 0);
        assert_error(&call_one(&s, &no_create_q), 0x15, Status::NotFound);
        assert_eq!(get_value(&s, b"x"), None);
        // Wrapping at 2^64, as memcached.
        set(&s, b"big", u64::MAX.to_string().as_bytes(), 0);
        let r = call_one(&s, &request(0x05, &arith_extras(2, 0, 0), b"big", &[], 0));
        assert_eq!(r.value, 1u64.to_be_bytes());
        set(&s, b"text", b"abc", 0);
        let bad = request(0x05, &arith_extras(1, 0, 0), b"text", &[], 0);
        assert_error(&call_one(&s, &bad), 0x05, Status::NotANumber);
    }

    #[test]
    fn touch_and_get_and_touch() {
        let s = test_shared();
        let expiry = 100u32.to_be_bytes();
        assert_error(
            &call_one(&s, &request(0x1c, &expiry, b"t", &[], 0)),
            0x1c,
            Status::NotFound,
        );
        set(&s, b"t", b"val", 3);
        let r = call_one(&s, &request(0x1c, &expiry, b"t", &[], 0));
        assert_eq!(
            (r.status, r.extras.clone()),
            (0, 3u32.to_be_bytes().to_vec())
        );
        assert_ne!(r.cas, 0);
        assert!(r.key.is_empty() && r.value.is_empty());
        for (opcode, with_key) in [(0x1d, false), (0x1e, false), (0x23, true), (0x24, true)] {
            let r = call_one(&s, &request(opcode, &expiry, b"t", &[], 0));
            assert_eq!((r.opcode, r.status), (opcode, 0));
            assert_eq!(r.extras, 3u32.to_be_bytes());
            assert_eq!(r.key, if with_key { &b"t"[..] } else { &b""[..] });
            assert_eq!(r.value, b"val");
        }
        assert_error(
            &call_one(&s, &request(0x1d, &expiry, b"no", &[], 0)),
            0x1d,
            Status::NotFound,
        );
        let miss = call_one(&s, &request(0x23, &expiry, b"no", &[], 0));
        assert_eq!(
            (miss.status, miss.key),
            (Status::NotFound as u16, b"no".to_vec())
        );
        assert!(call(&s, &request(0x1e, &expiry, b"no", &[], 0)).is_empty());
        assert!(call(&s, &request(0x24, &expiry, b"no", &[], 0)).is_empty());
        // The new expiry holds: gone once the clock passes it.
        s.pools.advance_clock(101);
        assert_eq!(get_value(&s, b"t"), None);
    }

    #[test]
    fn noop_version_verbosity_flush_and_quit() {
        let s = test_shared();
        let r = call_one(&s, &request(0x0a, &[], &[], &[], 0));
        assert_eq!((r.opcode, r.status, r.cas, r.value.len()), (0x0a, 0, 0, 0));
        let r = call_one(&s, &request(0x0b, &[], &[], &[], 0));
        assert_eq!((r.status, r.cas), (0, 0));
        assert_eq!(r.value, s.version().as_bytes());
        assert_eq!(
            call_one(&s, &request(0x1b, &1u32.to_be_bytes(), &[], &[], 0)).status,
            0
        );
        // FLUSH without extras, FLUSHQ with a zero delay, FLUSH with a delay.
        set(&s, b"f", b"v", 0);
        let r = call_one(&s, &request(0x08, &[], &[], &[], 0));
        assert_eq!((r.status, r.cas), (0, 0));
        assert_eq!(get_value(&s, b"f"), None);
        set(&s, b"f", b"v", 0);
        assert!(call(&s, &request(0x18, &0u32.to_be_bytes(), &[], &[], 0)).is_empty());
        assert_eq!(get_value(&s, b"f"), None);
        set(&s, b"f", b"v", 0);
        assert_eq!(
            call_one(&s, &request(0x08, &10u32.to_be_bytes(), &[], &[], 0)).status,
            0
        );
        assert_eq!(get_value(&s, b"f"), Some(b"v".to_vec()));
        s.pools.advance_clock(11);
        assert!(s.run_delayed_flush());
        assert_eq!(get_value(&s, b"f"), None);
        // QUIT replies then closes; QUITQ closes silently.
        let quit = request(0x07, &[], &[], &[], 0);
        let mut out = Vec::new();
        assert_eq!(
            handle(&s, &quit, &mut out),
            Step::Close {
                consumed: HEADER_LEN
            }
        );
        let r = responses(&out);
        assert_eq!((r.len(), r[0].opcode, r[0].status), (1, 0x07, 0));
        out.clear();
        let quitq = request(0x17, &[], &[], &[], 0);
        assert_eq!(
            handle(&s, &quitq, &mut out),
            Step::Close {
                consumed: HEADER_LEN
            }
        );
        assert!(out.is_empty());
    }

    #[test]
    fn stat_groups() {
        let s = test_shared();
        let all = call(&s, &request(0x10, &[], &[], &[], 0));
        let (last, stats) = all.split_last().unwrap();
        assert!(last.key.is_empty() && last.value.is_empty() && last.status == 0);
        assert!(stats.len() > 10);
        for r in stats {
            assert_eq!((r.opcode, r.status, r.cas), (0x10, 0, 0));
            assert!(!r.key.is_empty() && r.extras.is_empty());
        }
        let version = stats.iter().find(|r| r.key == b"version").unwrap();
        assert_eq!(version.value, s.version().as_bytes());
        let settings = call(&s, &request(0x10, &[], b"settings", &[], 0));
        let max = settings.iter().find(|r| r.key == b"item_size_max").unwrap();
        assert_eq!(max.value, s.limits.max_value.to_string().as_bytes());
        assert!(settings.last().unwrap().key.is_empty());
        let reset = call(&s, &request(0x10, &[], b"reset", &[], 0));
        assert_eq!(reset.len(), 1);
        assert!(reset[0].key.is_empty() && reset[0].status == 0);
        assert_error(
            &call_one(&s, &request(0x10, &[], b"slabs", &[], 0)),
            0x10,
            Status::NotFound,
        );
    }

    #[test]
    fn oversized_values_are_swallowed_unbuffered() {
        let s = test_shared();
        set(&s, b"big", b"old", 0);
        let huge = s.limits.max_value + 1;
        let mut req = request(0x11, &set_extras(0, 0), b"big", &[], 0);
        req[8..12].copy_from_slice(&((8 + 3 + huge) as u32).to_be_bytes());
        let total = req.len() + huge;
        // The key is needed first (to drop the old value), never the value.
        let mut out = Vec::new();
        assert_eq!(
            handle(&s, &req[..HEADER_LEN + 4], &mut out),
            Step::NeedMore {
                total: Some(req.len())
            }
        );
        assert!(out.is_empty());
        let mut input = req.clone();
        input.extend_from_slice(b"partial value");
        let step = handle(&s, &input, &mut out);
        assert_eq!(
            step,
            Step::Swallow {
                consumed: input.len(),
                skip: total - input.len()
            }
        );
        assert_error(&responses(&out)[0], 0x11, Status::TooLarge);
        assert_eq!(
            get_value(&s, b"big"),
            None,
            "a failed SET drops the old value"
        );
        // Other storage commands leave the key alone; a fully buffered body is consumed.
        set(&s, b"big", b"old", 0);
        let mut append = request(0x0e, &[], b"big", &vec![b'x'; huge], 0);
        out.clear();
        assert_eq!(
            handle(&s, &append, &mut out),
            Step::Done {
                consumed: append.len()
            }
        );
        assert_error(&responses(&out)[0], 0x0e, Status::TooLarge);
        assert_eq!(get_value(&s, b"big"), Some(b"old".to_vec()));
        append.extend_from_slice(&request(0x0a, &[], &[], &[], 0));
        out.clear();
        let Step::Done { consumed } = handle(&s, &append, &mut out) else {
            panic!("an oversized, fully buffered value is consumed");
        };
        assert_eq!(
            call_one(&s, &append[consumed..]).opcode,
            0x0a,
            "in step afterwards"
        );
        // A value of exactly max_value is stored.
        let r = call_one(
            &s,
            &request(0x01, &set_extras(0, 0), b"max", &vec![b'y'; huge - 1], 0),
        );
        assert_eq!(r.status, 0);
    }

    /// Requests whose lengths do not fit their opcode: "Invalid arguments", then close.
    #[test]
    fn invalid_lengths_are_rejected_and_close() {
        let s = test_shared();
        let long_key = vec![b'k'; s.limits.max_key + 1];
        let mut short_body = request(0x00, &[], b"key", &[], 0);
        short_body[8..12].copy_from_slice(&2u32.to_be_bytes());
        let mut typed = request(0x00, &[], b"key", &[], 0);
        typed[5] = 1;
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("get with extras", request(0x00, &[0; 4], b"k", &[], 0)),
            ("get without key", request(0x00, &[], &[], &[], 0)),
            ("get with a value", request(0x00, &[], b"k", b"v", 0)),
            ("getk key too long", request(0x0c, &[], &long_key, &[], 0)),
            ("set without extras", request(0x01, &[], b"k", b"v", 0)),
            ("setq with 4 extras", request(0x11, &[0; 4], b"k", b"v", 0)),
            (
                "add without key",
                request(0x02, &set_extras(0, 0), &[], b"v", 0),
            ),
            (
                "append with extras",
                request(0x0e, &set_extras(0, 0), b"k", b"v", 0),
            ),
            ("delete with extras", request(0x04, &[0; 4], b"k", &[], 0)),
            ("incr with 8 extras", request(0x05, &[0; 8], b"k", &[], 0)),
            (
                "decr without key",
                request(0x06, &arith_extras(1, 0, 0), &[], &[], 0),
            ),
            ("noop with a key", request(0x0a, &[], b"k", &[], 0)),
            ("version with a value", request(0x0b, &[], &[], b"v", 0)),
            ("quit with extras", request(0x07, &[0; 4], &[], &[], 0)),
            ("flush with 8 extras", request(0x08, &[0; 8], &[], &[], 0)),
            ("touch without extras", request(0x1c, &[], b"k", &[], 0)),
            ("gat without key", request(0x1d, &[0; 4], &[], &[], 0)),
            ("gat with a value", request(0x1d, &[0; 4], b"k", b"v", 0)),
            ("stat with extras", request(0x10, &[0; 4], &[], &[], 0)),
            ("verbosity without extras", request(0x1b, &[], &[], &[], 0)),
        ];
        for (what, bytes) in cases {
            let mut out = Vec::new();
            let step = handle(&s, &bytes, &mut out);
            assert_eq!(
                step,
                Step::Close {
                    consumed: bytes.len()
                },
                "{what}"
            );
            let r = responses(&out);
            assert_eq!(r.len(), 1, "{what}");
            assert_error(&r[0], bytes[1], Status::Invalid);
        }
        assert!(s.counters.get(Counter::ProtocolErrors) >= 20);
        // As memcached: a body shorter than its key is an unknown command, and closes.
        let mut out = Vec::new();
        let step = handle(&s, &short_body, &mut out);
        assert_eq!(
            step,
            Step::Close {
                consumed: short_body.len()
            }
        );
        assert_error(&responses(&out)[0], 0x00, Status::UnknownCommand);
        // The data type is ignored, as memcached ignores it.
        let mut out = Vec::new();
        assert_eq!(
            handle(&s, &typed, &mut out),
            Step::Done {
                consumed: typed.len()
            }
        );
        assert_error(&responses(&out)[0], 0x00, Status::NotFound);
    }

    #[test]
    fn unknown_opcodes_are_answered_and_skipped() {
        let s = test_shared();
        for opcode in [0x1f, 0x20, 0x21, 0x22, 0x25, 0x30, 0x80, 0xff] {
            let r = call_one(&s, &request(opcode, &[1, 2], b"key", b"value", 0));
            assert_error(&r, opcode, Status::UnknownCommand);
        }
        // A huge body is swallowed, not buffered.
        let mut req = request(0x42, &[], &[], &[], 0);
        req[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        req.extend_from_slice(b"abc");
        let mut out = Vec::new();
        let step = handle(&s, &req, &mut out);
        let skip = (u32::MAX as usize) - 3;
        assert_eq!(
            step,
            Step::Swallow {
                consumed: req.len(),
                skip
            }
        );
        assert_error(&responses(&out)[0], 0x42, Status::UnknownCommand);
    }

    #[test]
    fn bad_magic_closes_without_reply() {
        let s = test_shared();
        for input in [&b"get k\r\n"[..], &[0x81; 30][..], &[0x00][..]] {
            let mut out = Vec::new();
            assert_eq!(
                handle(&s, input, &mut out),
                Step::Close {
                    consumed: input.len()
                }
            );
            assert!(out.is_empty());
        }
    }

    #[test]
    fn truncated_requests_ask_for_their_total() {
        let s = test_shared();
        let req = request(0x01, &set_extras(1, 0), b"key", b"some value", 0);
        let mut out = Vec::new();
        for cut in 1..HEADER_LEN {
            assert_eq!(
                handle(&s, &req[..cut], &mut out),
                Step::NeedMore {
                    total: Some(HEADER_LEN)
                }
            );
        }
        for cut in HEADER_LEN..req.len() {
            assert_eq!(
                handle(&s, &req[..cut], &mut out),
                Step::NeedMore {
                    total: Some(req.len())
                }
            );
        }
        assert!(out.is_empty());
        assert_eq!(
            s.counters.get(Counter::CmdSet),
            0,
            "nothing executed before the body is whole"
        );
    }

    #[test]
    fn pipelined_requests_are_handled_one_at_a_time() {
        let s = test_shared();
        let mut input = request(0x11, &set_extras(0, 0), b"p", b"1", 0);
        input.extend(request(0x09, &[], b"p", &[], 0));
        input.extend(request(0x0d, &[], b"missing", &[], 0));
        input.extend(request(0x0a, &[], &[], &[], 0));
        let mut out = Vec::new();
        let mut at = 0;
        while at < input.len() {
            match handle(&s, &input[at..], &mut out) {
                Step::Done { consumed } => at += consumed,
                other => panic!("unexpected {other:?}"),
            }
        }
        let r = responses(&out);
        assert_eq!(r.iter().map(|r| r.opcode).collect::<Vec<_>>(), [0x09, 0x0a]);
        assert_eq!(r[0].value, b"1");
    }

    /// The largest request `NeedMore` may ask for.
    fn need_bound(shared: &Shared) -> usize {
        HEADER_LEN + usize::from(u8::MAX) + usize::from(u16::MAX) + shared.limits.max_value
    }

    /// Feeds `input` to `handle` the way a connection loop does; checks the `Step`
    /// contract on the way.
    fn drive(shared: &Shared, input: &[u8]) {
        let mut out = Vec::new();
        let mut at = 0;
        while at < input.len() {
            let rest = &input[at..];
            match handle(shared, rest, &mut out) {
                Step::Done { consumed } => {
                    assert!(consumed > 0 && consumed <= rest.len());
                    at += consumed;
                }
                Step::Swallow { consumed, skip } => {
                    assert!(consumed <= rest.len() && skip > 0);
                    at = at.saturating_add(consumed).saturating_add(skip);
                }
                Step::NeedMore { total } => {
                    let total = total.expect("binary requests always know their total");
                    assert!(total > rest.len() && total <= need_bound(shared));
                    break;
                }
                Step::Close { consumed } => {
                    assert!(consumed <= rest.len());
                    break;
                }
                Step::Resume { .. } => panic!("binary requests are answered whole"),
            }
        }
        responses(&out);
    }

    fn fuzz_shared() -> &'static Shared {
        static SHARED: std::sync::OnceLock<Shared> = std::sync::OnceLock::new();
        SHARED.get_or_init(test_shared)
    }

    /// A request that is mostly well formed: a known opcode, mostly the lengths its
    /// shape takes and a body length that adds up, keys from a two-letter alphabet (so
    /// requests hit each other's items), filler bytes for extras and value.
    fn plausible_request() -> impl Strategy<Value = Vec<u8>> {
        let opcode = prop_oneof![4 => 0u8..0x26, 1 => any::<u8>()];
        let extras_len = prop_oneof![Just(0usize), Just(4), Just(8), Just(20), 0usize..32];
        let key = proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b')], 0..4);
        let value_len = prop_oneof![3 => Just(0usize), 1 => 0usize..40];
        let body_skew = prop_oneof![8 => Just(0i64), 1 => -30i64..30];
        let data_type = prop_oneof![9 => Just(RAW_BYTES), 1 => any::<u8>()];
        let fields = (opcode, extras_len, key, value_len, body_skew, data_type);
        let conform = prop_oneof![4 => Just(true), 1 => Just(false)];
        (fields, conform, 0u64..4, any::<u8>()).prop_map(|(fields, conform, cas, fill)| {
            let (opcode, mut extras_len, mut key, mut value_len, body_skew, data_type) = fields;
            if let Some(shape) = Opcode::decode(opcode).map(|o| o.command.shape()) {
                if conform {
                    extras_len = shape.extras[usize::from(fill) % shape.extras.len()];
                    match shape.key {
                        KeyRule::Required if key.is_empty() => key.push(b'a'),
                        KeyRule::Forbidden => key.clear(),
                        _ => {}
                    }
                    if !shape.value {
                        value_len = 0;
                    }
                }
            }
            let body_len = (extras_len + key.len() + value_len) as i64 + body_skew;
            let mut r = vec![REQUEST_MAGIC, opcode];
            r.extend_from_slice(&(key.len() as u16).to_be_bytes());
            r.push(extras_len as u8);
            r.push(data_type);
            r.extend_from_slice(&[0, 0]);
            r.extend_from_slice(&(body_len as u32).to_be_bytes());
            r.extend_from_slice(&OPAQUE.to_be_bytes());
            r.extend_from_slice(&cas.to_be_bytes());
            r.extend(std::iter::repeat_n(fill, extras_len));
            r.extend_from_slice(&key);
            r.extend(std::iter::repeat_n(fill, value_len));
            r
        })
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(input in proptest::collection::vec(any::<u8>(), 0..400)) {
            drive(fuzz_shared(), &input);
        }

        #[test]
        fn random_bytes_after_magic_never_panic(
            rest in proptest::collection::vec(any::<u8>(), 0..400)
        ) {
            let mut input = vec![REQUEST_MAGIC];
            input.extend_from_slice(&rest);
            drive(fuzz_shared(), &input);
        }

        #[test]
        fn plausible_requests_never_panic(
            requests in proptest::collection::vec(plausible_request(), 1..6)
        ) {
            drive(fuzz_shared(), &requests.concat());
        }
    }
}

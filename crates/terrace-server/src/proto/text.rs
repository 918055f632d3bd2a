//! memcached's ascii protocol: one command line, for storage commands a data block, and
//! the reply memcached gives (its strings, byte for byte, so clients that match on them
//! keep working). Lines whose command is a meta command (`mg`, `ms`, ...) go to
//! [`super::meta`].
//!
//! Invariants: a storage command whose length cannot be honoured (over the value limit)
//! gets `SERVER_ERROR object too large for cache` and its data is swallowed unread, and a
//! `set` of it also removes the key's old value (memcached does the same, so a failed
//! set never leaves the older value readable); `noreply` suppresses every reply but the
//! errors memcached reports regardless; nothing here allocates more than the reply.

use terrace_cache::Store;

use super::{
    data_block, meta, parse_i64, parse_u64, push_decimal, split_line, BadChunk, Line, LineError,
    Step, REPLY_BUDGET,
};
use crate::shared::{Delta, Failure, Shared, StoreOp};
use crate::stats::{self, Counter};

const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
const BAD_CHUNK: &[u8] = b"CLIENT_ERROR bad data chunk\r\n";
const ERROR: &[u8] = b"ERROR\r\n";

/// Handles one text request at the start of `input`.
pub fn handle(shared: &Shared, input: &[u8], out: &mut Vec<u8>) -> Step {
    let line = match split_line(input) {
        Ok(line) => line,
        Err(LineError::Incomplete) => return Step::NeedMore { total: None },
        Err(LineError::TooLong) => {
            shared.counters.add(Counter::ProtocolErrors, 1);
            out.extend_from_slice(b"CLIENT_ERROR line too long\r\n");
            return Step::Close {
                consumed: input.len(),
            };
        }
    };
    let mut tokens = Tokens::new(line.text);
    let Some(command) = tokens.next() else {
        out.extend_from_slice(ERROR);
        return done(line);
    };
    match command {
        b"get" => retrieve(shared, line, tokens, false, None, out),
        b"gets" => retrieve(shared, line, tokens, true, None, out),
        b"gat" | b"gats" => {
            let Some(exptime) = tokens.next().and_then(parse_i64) else {
                out.extend_from_slice(BAD_FORMAT);
                return done(line);
            };
            retrieve(shared, line, tokens, command == b"gats", Some(exptime), out)
        }
        b"set" => storage(shared, line, tokens, input, StoreOp::Set, out),
        b"add" => storage(shared, line, tokens, input, StoreOp::Add, out),
        b"replace" => storage(shared, line, tokens, input, StoreOp::Replace, out),
        b"append" => storage(shared, line, tokens, input, StoreOp::Append, out),
        b"prepend" => storage(shared, line, tokens, input, StoreOp::Prepend, out),
        b"cas" => storage(shared, line, tokens, input, StoreOp::Cas(0), out),
        b"delete" => delete(shared, line, tokens, out),
        b"incr" => arith(shared, line, tokens, Delta::Incr, out),
        b"decr" => arith(shared, line, tokens, Delta::Decr, out),
        b"touch" => touch(shared, line, tokens, out),
        b"flush_all" => flush_all(shared, line, tokens, out),
        b"version" => {
            out.extend_from_slice(b"VERSION ");
            out.extend_from_slice(shared.version().as_bytes());
            out.extend_from_slice(b"\r\n");
            done(line)
        }
        b"verbosity" => {
            // As memcached: one or two arguments (the level, `noreply`) are accepted
            // whatever they say; Terrace's logs take their level from RUST_LOG.
            let args = tokens.clone().count();
            let noreply = tokens.last() == Some(&b"noreply"[..]);
            if !(1..=2).contains(&args) {
                out.extend_from_slice(ERROR);
            } else if !noreply {
                out.extend_from_slice(b"OK\r\n");
            }
            done(line)
        }
        b"stats" => stats_command(shared, line, tokens, out),
        b"quit" => Step::Close {
            consumed: line.consumed,
        },
        b"shutdown" => {
            out.extend_from_slice(b"ERROR: shutdown not enabled\r\n");
            done(line)
        }
        b"mg" | b"ms" | b"md" | b"ma" | b"mn" | b"me" => meta::handle(shared, line, input, out),
        _ => {
            shared.counters.add(Counter::ProtocolErrors, 1);
            out.extend_from_slice(ERROR);
            done(line)
        }
    }
}

fn done(line: Line<'_>) -> Step {
    Step::Done {
        consumed: line.consumed,
    }
}

/// Space-separated tokens of a command line (memcached splits on single spaces; runs
/// of spaces are tolerated here).
#[derive(Clone)]
struct Tokens<'a> {
    rest: &'a [u8],
}

/// What follows a command's fixed arguments: how many tokens, and a trailing `noreply`.
struct Trailer {
    count: usize,
    noreply: bool,
}

impl<'a> Tokens<'a> {
    fn new(text: &'a [u8]) -> Tokens<'a> {
        Tokens { rest: text }
    }

    /// The remaining tokens counted, the last one checked for `noreply`.
    fn rest_without_noreply(self) -> Trailer {
        let mut count = 0;
        let mut last: &[u8] = b"";
        for t in self {
            count += 1;
            last = t;
        }
        let noreply = last == b"noreply";
        Trailer {
            count: count - usize::from(noreply),
            noreply,
        }
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = &self.rest[start..];
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        self.rest = &rest[end..];
        Some(&rest[..end])
    }
}

fn push_failure(out: &mut Vec<u8>, failure: Failure) {
    out.extend_from_slice(match failure {
        Failure::BadKey => BAD_FORMAT,
        Failure::TooLarge => TOO_LARGE,
        Failure::OutOfMemory => b"SERVER_ERROR out of memory storing object\r\n",
        Failure::NotANumber => b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        Failure::Internal => b"SERVER_ERROR internal error\r\n",
    });
}

/// `get`/`gets`/`gat`/`gats <exptime>` followed by one or more keys.
fn retrieve(
    shared: &Shared,
    line: Line<'_>,
    keys: Tokens<'_>,
    with_cas: bool,
    touch: Option<i64>,
    out: &mut Vec<u8>,
) -> Step {
    // The command and its arguments: kept when the request resumes.
    let prefix = line.text.len() - keys.rest.len();
    let mut count = 0;
    for key in keys.clone() {
        if !shared.key_ok(key) {
            out.extend_from_slice(BAD_FORMAT);
            return done(line);
        }
        count += 1;
    }
    if count == 0 {
        out.extend_from_slice(ERROR);
        return done(line);
    }
    let start = out.len();
    let mut keys = keys;
    while let Some(key) = keys.next() {
        let hit = match touch {
            Some(exptime) => shared.gat(key, exptime),
            None => shared.get(key),
        };
        match hit {
            Ok(Some(guard)) => {
                let value = guard.value();
                out.extend_from_slice(b"VALUE ");
                out.extend_from_slice(key);
                out.push(b' ');
                push_decimal(out, u64::from(guard.client_flags()));
                out.push(b' ');
                push_decimal(out, value.len() as u64);
                if with_cas {
                    out.push(b' ');
                    push_decimal(out, guard.cas());
                }
                out.extend_from_slice(b"\r\n");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
            Ok(None) => {}
            Err(failure) => {
                push_failure(out, failure);
                return done(line);
            }
        }
        if out.len() - start >= REPLY_BUDGET && keys.clone().next().is_some() {
            return Step::Resume {
                prefix,
                consumed: line.text.len() - keys.rest.len(),
            };
        }
    }
    out.extend_from_slice(b"END\r\n");
    done(line)
}

/// `<cmd> <key> <flags> <exptime> <bytes> [noreply]` and
/// `cas <key> <flags> <exptime> <bytes> <cas unique> [noreply]`, then the data block.
fn storage(
    shared: &Shared,
    line: Line<'_>,
    mut tokens: Tokens<'_>,
    input: &[u8],
    op: StoreOp,
    out: &mut Vec<u8>,
) -> Step {
    let key = tokens.next().unwrap_or_default();
    let flags = tokens.next().and_then(parse_u64);
    let exptime = tokens.next().and_then(parse_i64);
    let length = tokens.next().and_then(parse_i64);
    let cas = match op {
        StoreOp::Cas(_) => tokens.next().and_then(parse_u64),
        _ => Some(0),
    };
    let trailer = tokens.rest_without_noreply();
    let length = match length {
        Some(n) if n >= 0 => n as u64,
        _ => {
            // The data's length is unknown: it cannot be skipped; memcached answers the
            // same and reads the data as the next command.
            out.extend_from_slice(BAD_FORMAT);
            return done(line);
        }
    };
    let body = usize::try_from(length)
        .ok()
        .and_then(|n| n.checked_add(2))
        .unwrap_or(usize::MAX);
    let (Some(flags), Some(exptime), Some(cas)) = (flags, exptime, cas) else {
        out.extend_from_slice(BAD_FORMAT);
        return swallow(line, body);
    };
    let flags = match u32::try_from(flags) {
        Ok(f) => f,
        Err(_) => {
            out.extend_from_slice(BAD_FORMAT);
            return swallow(line, body);
        }
    };
    if trailer.count != 0 || !shared.key_ok(key) {
        out.extend_from_slice(BAD_FORMAT);
        return swallow(line, body);
    }
    if length > shared.limits.max_value as u64 {
        out.extend_from_slice(TOO_LARGE);
        if op == StoreOp::Set {
            // As memcached: a set that cannot be honoured must not leave the old value.
            let _ = shared.delete(key);
        }
        return swallow(line, body);
    }
    let length = length as usize;
    let value = match data_block(input, line.consumed, length) {
        Ok(Some(v)) => v,
        Ok(None) => {
            return Step::NeedMore {
                total: Some(line.consumed + length + 2),
            }
        }
        Err(BadChunk) => {
            out.extend_from_slice(BAD_CHUNK);
            return Step::Done {
                consumed: line.consumed + length + 2,
            };
        }
    };
    let op = match op {
        StoreOp::Cas(_) => StoreOp::Cas(cas),
        other => other,
    };
    let consumed = line.consumed + length + 2;
    let reply: &[u8] = match shared.store(op, key, value, flags, exptime) {
        Ok(Store::Stored { .. }) => b"STORED\r\n",
        Ok(Store::NotStored) => b"NOT_STORED\r\n",
        Ok(Store::Exists) => b"EXISTS\r\n",
        Ok(Store::NotFound) => b"NOT_FOUND\r\n",
        Err(failure) => {
            push_failure(out, failure);
            return Step::Done { consumed };
        }
    };
    if !trailer.noreply {
        out.extend_from_slice(reply);
    }
    Step::Done { consumed }
}

/// Skips a refused command's data block (`body` bytes after the line) without reading
/// it into memory.
fn swallow(line: Line<'_>, body: usize) -> Step {
    Step::Swallow {
        consumed: line.consumed,
        skip: body,
    }
}

/// `delete <key> [0] [noreply]`.
fn delete(shared: &Shared, line: Line<'_>, mut tokens: Tokens<'_>, out: &mut Vec<u8>) -> Step {
    let key = tokens.next().unwrap_or_default();
    let trailer = {
        let mut t = tokens.clone();
        // memcached still accepts a legacy hold time of 0.
        if t.next() == Some(b"0") {
            tokens = t;
        }
        tokens.rest_without_noreply()
    };
    if trailer.count != 0 {
        out.extend_from_slice(
            b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]\r\n",
        );
        return done(line);
    }
    if !shared.key_ok(key) {
        out.extend_from_slice(BAD_FORMAT);
        return done(line);
    }
    let reply: &[u8] = match shared.delete(key) {
        Ok(true) => b"DELETED\r\n",
        Ok(false) => b"NOT_FOUND\r\n",
        Err(failure) => {
            push_failure(out, failure);
            return done(line);
        }
    };
    if !trailer.noreply {
        out.extend_from_slice(reply);
    }
    done(line)
}

/// `incr|decr <key> <delta> [noreply]`.
fn arith(
    shared: &Shared,
    line: Line<'_>,
    mut tokens: Tokens<'_>,
    way: Delta,
    out: &mut Vec<u8>,
) -> Step {
    let key = tokens.next().unwrap_or_default();
    let delta = tokens.next();
    let trailer = tokens.rest_without_noreply();
    if trailer.count != 0 || delta.is_none() || !shared.key_ok(key) {
        out.extend_from_slice(BAD_FORMAT);
        return done(line);
    }
    let Some(delta) = delta.and_then(parse_u64) else {
        out.extend_from_slice(b"CLIENT_ERROR invalid numeric delta argument\r\n");
        return done(line);
    };
    match shared.arith(key, delta, way) {
        Ok(Some(n)) if !trailer.noreply => {
            push_decimal(out, n);
            out.extend_from_slice(b"\r\n");
        }
        Ok(None) if !trailer.noreply => out.extend_from_slice(b"NOT_FOUND\r\n"),
        Ok(_) => {}
        Err(failure) => push_failure(out, failure),
    }
    done(line)
}

/// `touch <key> <exptime> [noreply]`.
fn touch(shared: &Shared, line: Line<'_>, mut tokens: Tokens<'_>, out: &mut Vec<u8>) -> Step {
    let key = tokens.next().unwrap_or_default();
    let exptime = tokens.next().and_then(parse_i64);
    let trailer = tokens.rest_without_noreply();
    let Some(exptime) = exptime.filter(|_| trailer.count == 0 && shared.key_ok(key)) else {
        out.extend_from_slice(BAD_FORMAT);
        return done(line);
    };
    match shared.touch(key, exptime) {
        Ok(true) if !trailer.noreply => out.extend_from_slice(b"TOUCHED\r\n"),
        Ok(false) if !trailer.noreply => out.extend_from_slice(b"NOT_FOUND\r\n"),
        Ok(_) => {}
        Err(failure) => push_failure(out, failure),
    }
    done(line)
}

/// `flush_all [delay] [noreply]`.
fn flush_all(shared: &Shared, line: Line<'_>, mut tokens: Tokens<'_>, out: &mut Vec<u8>) -> Step {
    let mut delay = 0;
    let mut peek = tokens.clone();
    if let Some(t) = peek.next() {
        if t != b"noreply" {
            match parse_i64(t) {
                Some(d) => {
                    delay = d;
                    tokens = peek;
                }
                None => {
                    out.extend_from_slice(BAD_FORMAT);
                    return done(line);
                }
            }
        }
    }
    let trailer = tokens.rest_without_noreply();
    if trailer.count != 0 {
        out.extend_from_slice(BAD_FORMAT);
        return done(line);
    }
    shared.flush_all(delay);
    if !trailer.noreply {
        out.extend_from_slice(b"OK\r\n");
    }
    done(line)
}

/// `stats [settings|reset|items|slabs|sizes|conns]`.
fn stats_command(
    shared: &Shared,
    line: Line<'_>,
    mut tokens: Tokens<'_>,
    out: &mut Vec<u8>,
) -> Step {
    let pairs = match tokens.next() {
        None => stats::report(shared),
        Some(b"settings") => stats::settings(shared),
        Some(b"reset") => {
            shared.counters.reset();
            out.extend_from_slice(b"RESET\r\n");
            return done(line);
        }
        // Terrace has no slab classes: these report nothing rather than made-up numbers.
        Some(b"items" | b"slabs" | b"sizes" | b"conns") => Vec::new(),
        Some(_) => {
            out.extend_from_slice(ERROR);
            return done(line);
        }
    };
    for (name, value) in pairs {
        out.extend_from_slice(b"STAT ");
        out.extend_from_slice(name.as_bytes());
        out.push(b' ');
        out.extend_from_slice(value.to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"END\r\n");
    done(line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::test_shared;

    use crate::proto::drive_text as run;

    fn reply(shared: &Shared, input: &str) -> String {
        run(shared, input.as_bytes()).0
    }

    #[test]
    fn set_get_gets_and_multiget() {
        let s = test_shared();
        assert_eq!(reply(&s, "set a 5 0 3\r\nabc\r\n"), "STORED\r\n");
        assert_eq!(reply(&s, "get a\r\n"), "VALUE a 5 3\r\nabc\r\nEND\r\n");
        let gets = reply(&s, "gets a\r\n");
        assert!(gets.starts_with("VALUE a 5 3 "), "{gets}");
        assert_eq!(reply(&s, "set b 0 0 0\r\n\r\n"), "STORED\r\n");
        assert_eq!(
            reply(&s, "get a nope b\r\n"),
            "VALUE a 5 3\r\nabc\r\nVALUE b 0 0\r\n\r\nEND\r\n"
        );
        assert_eq!(reply(&s, "get\r\n"), "ERROR\r\n");
    }

    #[test]
    fn keys_may_hold_control_bytes_as_in_memcached() {
        let s = test_shared();
        // memcaslap's keys start with bytes such as 0x10.
        let key = "\x10\x10\tk\x7f";
        assert_eq!(
            reply(&s, &format!("set {key} 0 0 1\r\nx\r\n")),
            "STORED\r\n"
        );
        assert_eq!(
            reply(&s, &format!("get {key}\r\n")),
            format!("VALUE {key} 0 1\r\nx\r\nEND\r\n")
        );
    }

    #[test]
    fn conditional_stores_and_cas() {
        let s = test_shared();
        assert_eq!(reply(&s, "add k 0 0 1\r\nx\r\n"), "STORED\r\n");
        assert_eq!(reply(&s, "add k 0 0 1\r\ny\r\n"), "NOT_STORED\r\n");
        assert_eq!(reply(&s, "replace nope 0 0 1\r\ny\r\n"), "NOT_STORED\r\n");
        assert_eq!(reply(&s, "replace k 0 0 1\r\ny\r\n"), "STORED\r\n");
        assert_eq!(reply(&s, "append k 0 0 2\r\nzz\r\n"), "STORED\r\n");
        assert_eq!(reply(&s, "prepend k 0 0 2\r\naa\r\n"), "STORED\r\n");
        assert_eq!(reply(&s, "get k\r\n"), "VALUE k 0 5\r\naayzz\r\nEND\r\n");
        assert_eq!(reply(&s, "append nope 0 0 1\r\nx\r\n"), "NOT_STORED\r\n");
        let gets = reply(&s, "gets k\r\n");
        let cas: u64 = gets.split_whitespace().nth(4).unwrap().parse().unwrap();
        assert_eq!(
            reply(&s, &format!("cas k 0 0 1 {}\r\nq\r\n", cas + 1)),
            "EXISTS\r\n"
        );
        assert_eq!(
            reply(&s, &format!("cas k 0 0 1 {cas}\r\nq\r\n")),
            "STORED\r\n"
        );
        assert_eq!(reply(&s, "cas nope 0 0 1 1\r\nq\r\n"), "NOT_FOUND\r\n");
    }

    #[test]
    fn noreply_suppresses_success_replies() {
        let s = test_shared();
        assert_eq!(reply(&s, "set a 0 0 1 noreply\r\n1\r\n"), "");
        assert_eq!(reply(&s, "add a 0 0 1 noreply\r\nx\r\n"), "");
        assert_eq!(reply(&s, "incr a 1 noreply\r\n"), "");
        assert_eq!(reply(&s, "touch a 10 noreply\r\n"), "");
        assert_eq!(reply(&s, "delete a noreply\r\n"), "");
        assert_eq!(reply(&s, "flush_all noreply\r\n"), "");
        assert_eq!(reply(&s, "verbosity 1 noreply\r\n"), "");
        assert_eq!(reply(&s, "get a\r\n"), "END\r\n");
    }

    #[test]
    fn delete_incr_decr_touch() {
        let s = test_shared();
        assert_eq!(reply(&s, "delete a\r\n"), "NOT_FOUND\r\n");
        assert_eq!(reply(&s, "set a 0 0 2\r\n10\r\n"), "STORED\r\n");
        assert_eq!(reply(&s, "incr a 5\r\n"), "15\r\n");
        assert_eq!(reply(&s, "decr a 100\r\n"), "0\r\n");
        assert_eq!(
            reply(&s, "incr a x\r\n"),
            "CLIENT_ERROR invalid numeric delta argument\r\n"
        );
        assert_eq!(reply(&s, "incr nope 1\r\n"), "NOT_FOUND\r\n");
        assert_eq!(reply(&s, "set t 0 0 2\r\nhi\r\n"), "STORED\r\n");
        assert_eq!(
            reply(&s, "incr t 1\r\n"),
            "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
        );
        assert_eq!(
            reply(&s, "set big 0 0 20\r\n18446744073709551615\r\n"),
            "STORED\r\n"
        );
        assert_eq!(reply(&s, "incr big 2\r\n"), "1\r\n");
        assert_eq!(reply(&s, "touch a 100\r\n"), "TOUCHED\r\n");
        assert_eq!(reply(&s, "touch nope 100\r\n"), "NOT_FOUND\r\n");
        assert_eq!(reply(&s, "delete a 0\r\n"), "DELETED\r\n");
        assert!(reply(&s, "delete a 5\r\n").starts_with("CLIENT_ERROR bad command line format"));
    }

    #[test]
    fn expiry_rules() {
        let s = test_shared();
        assert_eq!(reply(&s, "set a 0 0 1\r\nx\r\n"), "STORED\r\n");
        // A negative exptime stores an already-expired item: the old value is gone too.
        assert_eq!(reply(&s, "set a 0 -1 1\r\ny\r\n"), "STORED\r\n");
        assert_eq!(reply(&s, "get a\r\n"), "END\r\n");
        assert_eq!(reply(&s, "set b 0 2 1\r\nx\r\n"), "STORED\r\n");
        s.pools.advance_clock(3);
        assert_eq!(reply(&s, "get b\r\n"), "END\r\n");
        // An absolute time in the future.
        let at = i64::from(s.now()) + 100;
        assert_eq!(reply(&s, &format!("set c 0 {at} 1\r\nx\r\n")), "STORED\r\n");
        assert_eq!(reply(&s, "get c\r\n"), "VALUE c 0 1\r\nx\r\nEND\r\n");
        assert_eq!(reply(&s, "gat -1 c\r\n"), "VALUE c 0 1\r\nx\r\nEND\r\n");
        assert_eq!(reply(&s, "get c\r\n"), "END\r\n");
        assert_eq!(reply(&s, "set d 0 0 1\r\nx\r\n"), "STORED\r\n");
        let gats = reply(&s, "gats 100 d\r\n");
        assert!(gats.starts_with("VALUE d 0 1 "), "{gats}");
    }

    #[test]
    fn flush_all_now_and_delayed() {
        let s = test_shared();
        assert_eq!(reply(&s, "set a 0 0 1\r\nx\r\n"), "STORED\r\n");
        assert_eq!(reply(&s, "flush_all\r\n"), "OK\r\n");
        assert_eq!(reply(&s, "get a\r\n"), "END\r\n");
        assert_eq!(reply(&s, "set a 0 0 1\r\nx\r\n"), "STORED\r\n");
        assert_eq!(reply(&s, "flush_all 10\r\n"), "OK\r\n");
        assert!(!s.run_delayed_flush());
        assert_eq!(reply(&s, "get a\r\n"), "VALUE a 0 1\r\nx\r\nEND\r\n");
        s.pools.advance_clock(11);
        assert!(s.run_delayed_flush());
        assert_eq!(reply(&s, "get a\r\n"), "END\r\n");
        assert_eq!(
            reply(&s, "flush_all x\r\n"),
            "CLIENT_ERROR bad command line format\r\n"
        );
    }

    #[test]
    fn bad_input_is_answered_and_resynchronised() {
        let s = test_shared();
        assert_eq!(reply(&s, "\r\n"), "ERROR\r\n");
        assert_eq!(reply(&s, "bogus\r\n"), "ERROR\r\n");
        let long_key = "k".repeat(251);
        assert_eq!(
            reply(&s, &format!("set {long_key} 0 0 1\r\nx\r\nget a\r\n")),
            "CLIENT_ERROR bad command line format\r\nEND\r\n"
        );
        assert_eq!(
            reply(&s, &format!("get {long_key}\r\n")),
            "CLIENT_ERROR bad command line format\r\n"
        );
        assert_eq!(
            reply(&s, "set a 0 0 -1\r\n"),
            "CLIENT_ERROR bad command line format\r\n"
        );
        assert_eq!(
            reply(&s, "set a x 0 1\r\nz\r\nget a\r\n"),
            "CLIENT_ERROR bad command line format\r\nEND\r\n"
        );
        assert_eq!(
            reply(&s, "set a 0 0 1\r\nxyz\r\n"),
            // As memcached: the declared length and its terminator are consumed, what
            // follows is read as the next command.
            "CLIENT_ERROR bad data chunk\r\nERROR\r\n"
        );
        // Flags above 32 bits.
        assert_eq!(
            reply(&s, "set a 4294967296 0 1\r\nx\r\n"),
            "CLIENT_ERROR bad command line format\r\n"
        );
    }

    #[test]
    fn oversized_values_are_swallowed_and_the_old_value_removed() {
        let s = test_shared();
        assert_eq!(reply(&s, "set a 0 0 1\r\nx\r\n"), "STORED\r\n");
        let n = (1 << 20) + 1;
        let mut input = format!("set a 0 0 {n}\r\n").into_bytes();
        let mut out = Vec::new();
        let step = handle(&s, &input, &mut out);
        assert_eq!(out, TOO_LARGE);
        assert_eq!(
            step,
            Step::Swallow {
                consumed: input.len(),
                skip: n + 2
            }
        );
        input.extend(std::iter::repeat_n(b'v', n));
        input.extend_from_slice(b"\r\nget a\r\n");
        assert_eq!(
            run(&s, &input).0,
            "SERVER_ERROR object too large for cache\r\nEND\r\n"
        );
        // A length no memory could hold is swallowed the same way, never buffered.
        let mut out = Vec::new();
        let step = handle(&s, b"set a 0 0 99999999999\r\n", &mut out);
        assert!(matches!(step, Step::Swallow { skip, .. } if skip == 99_999_999_999 + 2));
    }

    #[test]
    fn large_multigets_resume_in_bounded_pieces() {
        let s = test_shared();
        let value = "v".repeat(100_000);
        let mut keys = Vec::new();
        for i in 0..10 {
            let key = format!("key{i}");
            assert_eq!(
                reply(
                    &s,
                    &format!("set {key} {i} 0 {}\r\n{value}\r\n", value.len())
                ),
                "STORED\r\n"
            );
            keys.push(key);
        }
        let request = format!("gets {} nope\r\nget key0\r\n", keys.join(" "));
        let mut out = Vec::new();
        let step = handle(&s, request.as_bytes(), &mut out);
        let Step::Resume { prefix, consumed } = step else {
            panic!("{step:?}")
        };
        assert_eq!(&request[..prefix], "gets");
        assert!(out.len() >= REPLY_BUDGET && out.len() < REPLY_BUDGET + 200_000);
        // The whole exchange, resumed as the connection loop does.
        let (replies, _) = run(&s, request.as_bytes());
        assert_eq!(replies.matches("VALUE key").count(), 11);
        assert_eq!(replies.matches("END\r\n").count(), 2);
        for (i, key) in keys.iter().enumerate() {
            assert!(
                replies.contains(&format!("VALUE {key} {i} 100000 ")),
                "{key}"
            );
        }
        assert!(consumed > prefix);
    }

    #[test]
    fn incomplete_requests_ask_for_their_total() {
        let s = test_shared();
        let mut out = Vec::new();
        assert_eq!(
            handle(&s, b"get a", &mut out),
            Step::NeedMore { total: None }
        );
        assert_eq!(
            handle(&s, b"set a 0 0 10\r\nabc", &mut out),
            Step::NeedMore {
                total: Some(14 + 12)
            }
        );
        assert!(out.is_empty());
        let long = vec![b'g'; super::super::MAX_LINE + 1];
        assert!(matches!(handle(&s, &long, &mut out), Step::Close { .. }));
    }

    #[test]
    fn version_verbosity_stats_quit() {
        let s = test_shared();
        assert!(reply(&s, "version\r\n").starts_with("VERSION 1.6.18-terrace"));
        assert_eq!(reply(&s, "verbosity 1\r\n"), "OK\r\n");
        assert_eq!(reply(&s, "verbosity\r\n"), "ERROR\r\n");
        assert_eq!(reply(&s, "verbosity noreply\r\n"), "");
        assert_eq!(reply(&s, "verbosity foo bar my\r\n"), "ERROR\r\n");
        assert_eq!(reply(&s, "get a\r\n"), "END\r\n");
        let stats = reply(&s, "stats\r\n");
        assert!(stats.contains("STAT cmd_get 1\r\n"), "{stats}");
        assert!(stats.contains("STAT get_misses 1\r\n"), "{stats}");
        assert!(stats.contains("STAT tier_0_segments "), "{stats}");
        assert!(stats.ends_with("END\r\n"));
        assert_eq!(reply(&s, "stats reset\r\n"), "RESET\r\n");
        assert!(reply(&s, "stats\r\n").contains("STAT cmd_get 0\r\n"));
        assert!(reply(&s, "stats settings\r\n").contains("STAT item_size_max 1048576\r\n"));
        assert_eq!(reply(&s, "stats nonsense\r\n"), "ERROR\r\n");
        assert_eq!(run(&s, b"quit\r\nget a\r\n").1, Step::Close { consumed: 6 });
    }

    proptest::proptest! {
        #[test]
        fn garbage_never_panics(input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let s = test_shared();
            let mut out = Vec::new();
            let mut at = 0;
            while at < input.len() {
                match handle(&s, &input[at..], &mut out) {
                    Step::Done { consumed } => {
                        proptest::prop_assert!(consumed > 0 && at + consumed <= input.len());
                        at += consumed;
                    }
                    Step::Swallow { consumed, .. } => {
                        proptest::prop_assert!(at + consumed <= input.len());
                        break;
                    }
                    Step::NeedMore { total } => {
                        if let Some(t) = total {
                            proptest::prop_assert!(t <= super::super::MAX_LINE + (1 << 20) + 2);
                        }
                        break;
                    }
                    Step::Close { consumed } => {
                        proptest::prop_assert!(at + consumed <= input.len());
                        break;
                    }
                    Step::Resume { prefix, consumed } => {
                        proptest::prop_assert!(prefix < consumed && at + consumed <= input.len());
                        break;
                    }
                }
            }
        }

        #[test]
        fn command_shaped_garbage_never_panics(
            words in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::prelude::Just("get".to_string()),
                    proptest::prelude::Just("set".to_string()),
                    proptest::prelude::Just("cas".to_string()),
                    proptest::prelude::Just("incr".to_string()),
                    proptest::prelude::Just("gat".to_string()),
                    proptest::prelude::Just("touch".to_string()),
                    proptest::prelude::Just("delete".to_string()),
                    proptest::prelude::Just("flush_all".to_string()),
                    proptest::prelude::Just("noreply".to_string()),
                    proptest::prelude::Just("\r\n".to_string()),
                    "-?[0-9]{1,21}",
                    "[a-z]{1,4}",
                ],
                0..24,
            )
        ) {
            let s = test_shared();
            let input = words.join(" ").into_bytes();
            let _ = run(&s, &input);
        }
    }
}

//! memcached's ascii protocol: one command line, for storage commands a data block, and
//! the reply memcached 1.6 gives, byte for byte (its strings, its token counts, its
//! number parsing), so clients that match on them keep working. Lines whose command is
//! a meta command (`mg`, `ms`, ...) go to [`super::meta`].
//!
//! The rules, as memcached's `proto_text.c` has them:
//! - a line is read as a C string (a NUL byte ends it) and split on spaces into at most
//!   `MAX_TOKENS` tokens; a command with a token count it does not take is `ERROR`,
//!   and so is an unknown command or one shorter than two bytes (an unknown command
//!   that ends in an `HTTP/` token closes the connection without a reply);
//! - numbers are read by C's `strtoul`/`strtol` ([`strtoul32`], [`strtol32`],
//!   [`strtoull`]), 32-bit fields truncated as memcached truncates them;
//! - a command that takes `noreply` looks for it in its last token only, and once set it
//!   silences every reply of that command, errors included;
//! - a storage command whose line is refused (bad token, over-long key, bad length) is
//!   answered and its data block is NOT skipped: memcached reads the data as the next
//!   command line, and so does Terrace. A length the value limit refuses is answered
//!   `SERVER_ERROR object too large for cache` and its data swallowed unread, and a
//!   `set` of it also removes the key's old value (so a failed set never leaves the
//!   older value readable);
//! - a line longer than [`MAX_LINE`](super::MAX_LINE) closes the connection without a
//!   reply, except a `get`/`gets` line, which memcached accepts however long: Terrace
//!   handles such a line a chunk of whole keys at a time, so it never buffers more than
//!   about [`MAX_LINE`](super::MAX_LINE) of it.
//!
//! Nothing here allocates more than the reply.

use terrace_cache::Store;

use super::Replies;
use super::{
    data_block, meta, push_decimal, split_line, strtol32, strtoul32, strtoull, BadChunk, Line,
    LineError, Step, REPLY_BUDGET,
};
use crate::shared::{Delta, Failure, Shared, StoreOp};
use crate::stats::{self, Counter};

const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format";
const BAD_EXPTIME: &[u8] = b"CLIENT_ERROR invalid exptime argument";
const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache";
const BAD_CHUNK: &[u8] = b"CLIENT_ERROR bad data chunk";
const ERROR: &[u8] = b"ERROR";

/// memcached's `MAX_TOKENS`: a line is split into at most this many tokens, counting the
/// terminal one that holds the unsplit rest of the line (only `get` reads that rest).
const MAX_TOKENS: usize = 24;

/// A long `get` line whose first non-space byte comes later than this is refused, as
/// memcached refuses it.
const MAX_LEADING_SPACES: usize = 100;

/// Handles one text request at the start of `input`.
pub fn handle<'s>(shared: &'s Shared, input: &[u8], out: &mut Replies<'s>) -> Step {
    let line = match split_line(input) {
        Ok(line) => line,
        Err(LineError::Incomplete) => return Step::NeedMore { total: None },
        Err(LineError::TooLong) => return long_line(shared, input, out),
    };
    // memcached reads the line as a C string.
    let line = Line {
        text: until_nul(line.text),
        consumed: line.consumed,
    };
    let cmd = Command::split(line.text);
    let mut reply = Reply { out, silent: false };
    let name = cmd.token(0);
    if cmd.ntokens() < 2 || name.len() < 2 {
        reply.line(ERROR);
        return done(line);
    }
    match name {
        b"mg" | b"ms" | b"md" | b"ma" | b"mn" | b"me" => {
            return meta::handle(shared, line, input, out)
        }
        b"get" | b"gets" | b"gat" | b"gats" | b"bget" if cmd.ntokens() < 3 => reply.line(ERROR),
        b"get" | b"bget" => return get_line(shared, line, false, false, out),
        b"gets" => return get_line(shared, line, true, false, out),
        b"gat" => return get_line(shared, line, false, true, out),
        b"gats" => return get_line(shared, line, true, true, out),
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
            let (op, ntokens) = match name {
                b"set" => (StoreOp::Set, 6),
                b"add" => (StoreOp::Add, 6),
                b"replace" => (StoreOp::Replace, 6),
                b"append" => (StoreOp::Append, 6),
                b"prepend" => (StoreOp::Prepend, 6),
                _ => (StoreOp::Cas(0), 7),
            };
            if cmd.ntokens() != ntokens && cmd.ntokens() != ntokens + 1 {
                reply.line(ERROR);
            } else {
                return storage(shared, line, &cmd, input, op, reply);
            }
        }
        b"incr" | b"decr" if !matches!(cmd.ntokens(), 4 | 5) => reply.line(ERROR),
        b"incr" => arith(shared, &cmd, Delta::Incr, reply),
        b"decr" => arith(shared, &cmd, Delta::Decr, reply),
        b"delete" if !(3..=5).contains(&cmd.ntokens()) => reply.line(ERROR),
        b"delete" => delete(shared, &cmd, reply),
        b"touch" if !matches!(cmd.ntokens(), 4 | 5) => reply.line(ERROR),
        b"touch" => touch(shared, &cmd, reply),
        b"flush_all" if !(2..=4).contains(&cmd.ntokens()) => reply.line(ERROR),
        b"flush_all" => flush_all(shared, &cmd, reply),
        b"verbosity" if !matches!(cmd.ntokens(), 3 | 4) => reply.line(ERROR),
        b"verbosity" => {
            // Terrace's logs take their level from RUST_LOG: the level is checked as
            // memcached checks it, then ignored.
            reply.silent = cmd.noreply();
            match strtoul32(cmd.token(1)) {
                Some(_) => reply.line(b"OK"),
                None => reply.line(BAD_FORMAT),
            }
        }
        b"version" => {
            reply.out.extend_from_slice(b"VERSION ");
            reply.out.extend_from_slice(shared.version().as_bytes());
            reply.out.extend_from_slice(b"\r\n");
        }
        b"stats" => {
            let mut tokens = Tokens::new(line.text);
            tokens.next();
            return stats_command(shared, line, tokens, out);
        }
        b"quit" => {
            return Step::Close {
                consumed: line.consumed,
            }
        }
        b"shutdown" => reply.line(b"ERROR: shutdown not enabled"),
        _ if looks_like_http(&cmd) => {
            // memcached's defence against cross-protocol requests: close, no reply.
            shared.counters.add(Counter::ProtocolErrors, 1);
            return Step::Close {
                consumed: line.consumed,
            };
        }
        _ => {
            shared.counters.add(Counter::ProtocolErrors, 1);
            reply.line(ERROR);
        }
    }
    done(line)
}

/// An unknown command whose last token starts `HTTP/` (`GET / HTTP/1.1`): memcached
/// closes such a connection. It checks only commands its dispatcher does not route by
/// their first letter: `m` (two-byte meta commands), `g`, `s`, `a`, `c`, `i`, `d` and
/// `t` commands it does not know are plain `ERROR`, so `get / HTTP/1.1` is a get.
fn looks_like_http(cmd: &Command<'_>) -> bool {
    let name = cmd.token(0);
    let routed = match name.first() {
        Some(b'm') => name.len() == 2,
        Some(c) => b"gsacidt".contains(c),
        None => true,
    };
    !routed && cmd.n > 0 && cmd.tokens[cmd.n - 1].starts_with(b"HTTP/")
}

fn done(line: Line<'_>) -> Step {
    Step::Done {
        consumed: line.consumed,
    }
}

/// A reply under memcached's `noreply` rule: once `silent`, nothing is sent.
struct Reply<'o> {
    out: &'o mut Vec<u8>,
    silent: bool,
}

impl Reply<'_> {
    /// One reply line; `text` without its `\r\n`.
    fn line(&mut self, text: &[u8]) {
        if !self.silent {
            self.out.extend_from_slice(text);
            self.out.extend_from_slice(b"\r\n");
        }
    }

    fn failure(&mut self, failure: Failure) {
        self.line(match failure {
            Failure::BadKey => BAD_FORMAT,
            Failure::TooLarge => TOO_LARGE,
            Failure::OutOfMemory => b"SERVER_ERROR out of memory storing object",
            Failure::NotANumber => b"CLIENT_ERROR cannot increment or decrement non-numeric value",
            Failure::Internal => b"SERVER_ERROR internal error",
        });
    }
}

/// A command line split as memcached's `tokenize_command` splits it: on single spaces,
/// empty tokens skipped, at most `MAX_TOKENS - 1` tokens; `ntokens` counts a terminal
/// token as memcached does, so token-count rules read as memcached's.
struct Command<'a> {
    tokens: [&'a [u8]; MAX_TOKENS - 1],
    n: usize,
}

impl<'a> Command<'a> {
    fn split(text: &'a [u8]) -> Command<'a> {
        let mut cmd = Command {
            tokens: [&[]; MAX_TOKENS - 1],
            n: 0,
        };
        for token in text.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
            cmd.tokens[cmd.n] = token;
            cmd.n += 1;
            if cmd.n == MAX_TOKENS - 1 {
                break;
            }
        }
        cmd
    }

    /// memcached's `ntokens`: the tokens and the terminal one.
    fn ntokens(&self) -> usize {
        self.n + 1
    }

    /// Token `i`, empty past the last.
    fn token(&self, i: usize) -> &'a [u8] {
        if i < self.n {
            self.tokens[i]
        } else {
            &[]
        }
    }

    /// memcached's `set_noreply_maybe`: the last token is `noreply`.
    fn noreply(&self) -> bool {
        self.n > 0 && self.tokens[self.n - 1] == b"noreply"
    }
}

/// Space-separated tokens of a line from a point on (the keys of a get).
#[derive(Clone)]
struct Tokens<'a> {
    rest: &'a [u8],
}

impl<'a> Tokens<'a> {
    fn new(text: &'a [u8]) -> Tokens<'a> {
        Tokens { rest: text }
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

/// A line of [`MAX_LINE`](super::MAX_LINE) bytes or more with no `\n` yet: memcached
/// closes the connection without a reply, unless the line is a `get`/`gets` (after at
/// most [`MAX_LEADING_SPACES`] spaces), which it buffers whole however long. Terrace
/// handles such a line a chunk of whole keys at a time instead.
fn long_line<'s>(shared: &'s Shared, input: &[u8], out: &mut Replies<'s>) -> Step {
    let close = Step::Close {
        consumed: input.len(),
    };
    let lead = input.iter().take_while(|&&b| b == b' ').count();
    let with_cas = match &input[lead..] {
        _ if lead > MAX_LEADING_SPACES => {
            shared.counters.add(Counter::ProtocolErrors, 1);
            return close;
        }
        rest if rest.starts_with(b"get ") => false,
        rest if rest.starts_with(b"gets ") => true,
        _ => {
            shared.counters.add(Counter::ProtocolErrors, 1);
            return close;
        }
    };
    let keys_at = lead + if with_cas { 4 } else { 3 };
    // The whole line may be here already, past MAX_LINE (a read brings up to a chunk).
    if let Some(nl) = input.iter().position(|&b| b == b'\n') {
        let text = &input[..nl];
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let text = until_nul(text);
        let line = Line {
            text,
            consumed: nl + 1,
        };
        return retrieve(shared, line.text, keys_at, with_cas, None, Some(line), out);
    }
    if let Some(nul) = input.iter().position(|&b| b == 0) {
        // memcached would ignore the rest of the line; finding its end would mean
        // buffering it: the keys before the NUL are answered, then the connection closes.
        return match retrieve(shared, &input[..nul], keys_at, with_cas, None, None, out) {
            Step::Resume { .. } if nul <= keys_at => close,
            step @ Step::Resume { consumed, .. } if consumed < nul => step,
            _ => close,
        };
    }
    // Else the keys before the last space are whole, and the request goes on with at
    // least one key (so that its end is answered END, as one line's would be): the
    // partial key after the last space, or else the last whole key.
    let last_space = input.iter().rposition(|&b| b == b' ').unwrap_or(0);
    let partial = &input[last_space + 1..];
    if !partial.is_empty() && partial != b"\r" {
        if last_space <= keys_at {
            // One key of MAX_LINE bytes: far too long, and the line cannot be
            // resynchronised without buffering it.
            out.extend_from_slice(BAD_FORMAT);
            out.extend_from_slice(b"\r\n");
            return close;
        }
        return retrieve(
            shared,
            &input[..last_space],
            keys_at,
            with_cas,
            None,
            None,
            out,
        );
    }
    let region = &input[keys_at..last_space];
    let Some(end) = region.iter().rposition(|&b| b != b' ') else {
        // No key yet, only spaces: drop them.
        return Step::Resume {
            prefix: keys_at,
            consumed: last_space,
        };
    };
    let start = region[..end]
        .iter()
        .rposition(|&b| b == b' ')
        .map_or(0, |i| i + 1);
    let (start, end) = (keys_at + start, keys_at + end + 1);
    if end - start > shared.limits.max_key {
        out.extend_from_slice(BAD_FORMAT);
        out.extend_from_slice(b"\r\n");
        return close;
    }
    if start > keys_at + 1 {
        // Whole keys (or spaces) before the last key: answer them, keep the last.
        return retrieve(
            shared,
            &input[..start - 1],
            keys_at,
            with_cas,
            None,
            None,
            out,
        );
    }
    // The last key is the first: keep it, drop the spaces after it.
    Step::Resume {
        prefix: end,
        consumed: last_space,
    }
}

/// A line read as a C string: up to its first NUL byte.
fn until_nul(text: &[u8]) -> &[u8] {
    match text.iter().position(|&b| b == 0) {
        Some(nul) => &text[..nul],
        None => text,
    }
}

/// `get|gets|bget <key>*` and `gat|gats <exptime> <key>*`, a whole line.
fn get_line<'s>(
    shared: &'s Shared,
    line: Line<'_>,
    with_cas: bool,
    touch: bool,
    out: &mut Replies<'s>,
) -> Step {
    let mut tokens = Tokens::new(line.text);
    tokens.next();
    let exptime = if touch {
        match tokens.next().and_then(strtol32) {
            Some(exptime) => Some(i64::from(exptime)),
            None => {
                out.extend_from_slice(BAD_EXPTIME);
                out.extend_from_slice(b"\r\n");
                return done(line);
            }
        }
    } else {
        None
    };
    let keys_at = line.text.len() - tokens.rest.len();
    retrieve(
        shared,
        line.text,
        keys_at,
        with_cas,
        exptime,
        Some(line),
        out,
    )
}

/// The keys of `text` from `keys_at` on, each looked up (and touched, with `touch`)
/// in turn. `whole`: the line, when `text` is all of it (the reply ends in `END`);
/// `None` when `text` is a chunk of a longer line whose remaining keys come later.
///
/// As memcached: a key over the limit stops the command, the values found before it
/// are dropped and only `CLIENT_ERROR bad command line format` is sent. (Values already
/// written out, past [`REPLY_BUDGET`] or in an earlier chunk, cannot be taken back;
/// a chunked line is then closed, as its end cannot be found without buffering it.)
fn retrieve<'s>(
    shared: &'s Shared,
    text: &[u8],
    keys_at: usize,
    with_cas: bool,
    touch: Option<i64>,
    whole: Option<Line<'_>>,
    out: &mut Replies<'s>,
) -> Step {
    let start = out.len();
    let mut keys = Tokens::new(&text[keys_at..]);
    while let Some(key) = keys.next() {
        if !shared.key_ok(key) {
            out.truncate(start);
            out.extend_from_slice(BAD_FORMAT);
            out.extend_from_slice(b"\r\n");
            return match whole {
                Some(line) => done(line),
                None => Step::Close {
                    consumed: text.len(),
                },
            };
        }
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
                out.push_value(guard);
                out.extend_from_slice(b"\r\n");
            }
            Ok(None) => {}
            Err(failure) => {
                out.truncate(start);
                Reply { out, silent: false }.failure(failure);
                return match whole {
                    Some(line) => done(line),
                    None => Step::Close {
                        consumed: text.len(),
                    },
                };
            }
        }
        if out.len() - start >= REPLY_BUDGET && keys.clone().next().is_some() {
            return Step::Resume {
                prefix: keys_at,
                consumed: text.len() - keys.rest.len(),
            };
        }
    }
    match whole {
        Some(line) => {
            out.extend_from_slice(b"END\r\n");
            done(line)
        }
        None => Step::Resume {
            prefix: keys_at,
            consumed: text.len(),
        },
    }
}

/// `<cmd> <key> <flags> <exptime> <bytes> [noreply]` and
/// `cas <key> <flags> <exptime> <bytes> <cas unique> [noreply]`, then the data block
/// (memcached's `process_update_command`; the token count is checked by the caller).
fn storage(
    shared: &Shared,
    line: Line<'_>,
    cmd: &Command<'_>,
    input: &[u8],
    op: StoreOp,
    mut reply: Reply<'_>,
) -> Step {
    reply.silent = cmd.noreply();
    let key = cmd.token(1);
    if !shared.key_ok(key) {
        reply.line(BAD_FORMAT);
        return done(line);
    }
    let (Some(flags), Some(exptime), Some(length)) = (
        strtoul32(cmd.token(2)),
        strtol32(cmd.token(3)),
        strtol32(cmd.token(4)),
    ) else {
        reply.line(BAD_FORMAT);
        return done(line);
    };
    let op = match op {
        StoreOp::Cas(_) => match strtoull(cmd.token(5)) {
            Some(cas) => StoreOp::Cas(cas),
            None => {
                reply.line(BAD_FORMAT);
                return done(line);
            }
        },
        other => other,
    };
    // memcached refuses lengths whose block (with its `\r\n`) would overflow an int.
    let Some(length) = usize::try_from(length)
        .ok()
        .filter(|&n| n <= i32::MAX as usize - 2)
    else {
        reply.line(BAD_FORMAT);
        return done(line);
    };
    let consumed = line.consumed + length + 2;
    if length > shared.limits.max_value {
        reply.line(TOO_LARGE);
        if op == StoreOp::Set {
            // As memcached: a set that cannot be honoured must not leave the old value.
            let _ = shared.delete(key);
        }
        return Step::Swallow {
            consumed: line.consumed,
            skip: length + 2,
        };
    }
    let value = match data_block(input, line.consumed, length) {
        Ok(Some(v)) => v,
        Ok(None) => {
            return Step::NeedMore {
                total: Some(consumed),
            }
        }
        Err(BadChunk) => {
            // As memcached: the declared length and two more bytes are consumed, what
            // follows is read as the next command.
            reply.line(BAD_CHUNK);
            return Step::Done { consumed };
        }
    };
    // append/prepend check their flags and exptime tokens but keep the item's own (an
    // exptime in the past must not expire it).
    let exptime = match op {
        StoreOp::Append | StoreOp::Prepend => 0,
        _ => i64::from(exptime),
    };
    match shared.store(op, key, value, flags, exptime) {
        Ok(Store::Stored { .. }) => reply.line(b"STORED"),
        Ok(Store::NotStored) => reply.line(b"NOT_STORED"),
        Ok(Store::Exists) => reply.line(b"EXISTS"),
        Ok(Store::NotFound) => reply.line(b"NOT_FOUND"),
        Err(failure) => reply.failure(failure),
    }
    Step::Done { consumed }
}

/// `delete <key> [0] [noreply]` (a hold time other than 0 is refused).
fn delete(shared: &Shared, cmd: &Command<'_>, mut reply: Reply<'_>) {
    if cmd.ntokens() > 3 {
        let hold_is_zero = cmd.token(2) == b"0";
        reply.silent = cmd.noreply();
        let valid = (cmd.ntokens() == 4 && (hold_is_zero || reply.silent))
            || (cmd.ntokens() == 5 && hold_is_zero && reply.silent);
        if !valid {
            reply.line(b"CLIENT_ERROR bad command line format.  Usage: delete <key> [noreply]");
            return;
        }
    }
    let key = cmd.token(1);
    if !shared.key_ok(key) {
        reply.line(BAD_FORMAT);
        return;
    }
    match shared.delete(key) {
        Ok(true) => reply.line(b"DELETED"),
        Ok(false) => reply.line(b"NOT_FOUND"),
        Err(failure) => reply.failure(failure),
    }
}

/// `incr|decr <key> <delta> [noreply]`.
fn arith(shared: &Shared, cmd: &Command<'_>, way: Delta, mut reply: Reply<'_>) {
    reply.silent = cmd.noreply();
    let key = cmd.token(1);
    if !shared.key_ok(key) {
        reply.line(BAD_FORMAT);
        return;
    }
    let Some(delta) = strtoull(cmd.token(2)) else {
        reply.line(b"CLIENT_ERROR invalid numeric delta argument");
        return;
    };
    match shared.arith(key, delta, way) {
        Ok(Some(n)) => {
            let mut digits = Vec::with_capacity(20);
            push_decimal(&mut digits, n);
            reply.line(&digits);
        }
        Ok(None) => reply.line(b"NOT_FOUND"),
        Err(Failure::OutOfMemory) => reply.line(b"SERVER_ERROR out of memory"),
        Err(failure) => reply.failure(failure),
    }
}

/// `touch <key> <exptime> [noreply]`.
fn touch(shared: &Shared, cmd: &Command<'_>, mut reply: Reply<'_>) {
    reply.silent = cmd.noreply();
    let key = cmd.token(1);
    if !shared.key_ok(key) {
        reply.line(BAD_FORMAT);
        return;
    }
    let Some(exptime) = strtol32(cmd.token(2)) else {
        reply.line(BAD_EXPTIME);
        return;
    };
    match shared.touch(key, i64::from(exptime)) {
        Ok(true) => reply.line(b"TOUCHED"),
        Ok(false) => reply.line(b"NOT_FOUND"),
        Err(failure) => reply.failure(failure),
    }
}

/// `flush_all [delay] [noreply]`: a token before `noreply` (or a lone token that is not
/// `noreply`) is the delay.
fn flush_all(shared: &Shared, cmd: &Command<'_>, mut reply: Reply<'_>) {
    reply.silent = cmd.noreply();
    let mut delay = 0;
    if cmd.ntokens() != if reply.silent { 3 } else { 2 } {
        match strtol32(cmd.token(1)) {
            Some(d) => delay = d,
            None => {
                reply.line(BAD_EXPTIME);
                return;
            }
        }
    }
    shared.flush_all(i64::from(delay));
    reply.line(b"OK");
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
        Some(b"detail") => {
            out.extend_from_slice(&stats::detail_text(shared, tokens.next()));
            return done(line);
        }
        Some(b"reset") => {
            shared.counters.reset();
            out.extend_from_slice(b"RESET\r\n");
            return done(line);
        }
        // Terrace has no slab classes: these report nothing rather than made-up numbers.
        Some(b"items" | b"slabs" | b"sizes" | b"conns") => Vec::new(),
        Some(_) => {
            out.extend_from_slice(b"ERROR\r\n");
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
            "CLIENT_ERROR invalid exptime argument\r\n"
        );
        assert_eq!(reply(&s, "flush_all x noreply\r\n"), "");
        assert_eq!(reply(&s, "flush_all 1 2 3\r\n"), "ERROR\r\n");
    }

    #[test]
    fn bad_input_is_answered_and_resynchronised() {
        let s = test_shared();
        assert_eq!(reply(&s, "\r\n"), "ERROR\r\n");
        assert_eq!(reply(&s, "bogus\r\n"), "ERROR\r\n");
        let long_key = "k".repeat(251);
        // As memcached: a refused storage line's data block is read as a command line.
        assert_eq!(
            reply(&s, &format!("set {long_key} 0 0 1\r\nx\r\nget a\r\n")),
            "CLIENT_ERROR bad command line format\r\nERROR\r\nEND\r\n"
        );
        // ... and noreply silences the refusal too.
        assert_eq!(
            reply(&s, &format!("set {long_key} 0 0 1 noreply\r\nx\r\n")),
            "ERROR\r\n"
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
            "CLIENT_ERROR bad command line format\r\nERROR\r\nEND\r\n"
        );
        // Wrong token counts are ERROR, not CLIENT_ERROR; one extra token is ignored.
        assert_eq!(reply(&s, "set a 0 0\r\n"), "ERROR\r\n");
        assert_eq!(reply(&s, "incr a\r\n"), "ERROR\r\n");
        assert_eq!(reply(&s, "delete\r\n"), "ERROR\r\n");
        assert_eq!(reply(&s, "set b 0 0 1 junk\r\nx\r\n"), "STORED\r\n");
        // noreply silences errors after it is seen, as in memcached.
        assert_eq!(reply(&s, "delete a 10 noreply\r\n"), "");
        assert_eq!(reply(&s, "incr a x noreply\r\n"), "");
        assert_eq!(reply(&s, "touch a x noreply\r\n"), "");
        assert_eq!(
            reply(&s, "touch a x\r\n"),
            "CLIENT_ERROR invalid exptime argument\r\n"
        );
        // A NUL byte ends the line.
        assert_eq!(reply(&s, "get b\0junk\r\n"), "VALUE b 0 1\r\nx\r\nEND\r\n");
        assert_eq!(
            reply(&s, "set a 0 0 1\r\nxyz\r\n"),
            // As memcached: the declared length and its terminator are consumed, what
            // follows is read as the next command.
            "CLIENT_ERROR bad data chunk\r\nERROR\r\n"
        );
        // Flags above 32 bits are truncated, as memcached 1.6 truncates them.
        assert_eq!(reply(&s, "set a 4294967296 0 1\r\nx\r\n"), "STORED\r\n");
        assert_eq!(reply(&s, "get a\r\n"), "VALUE a 0 1\r\nx\r\nEND\r\n");
        // Lengths beyond int32 are refused; the data is read as a command.
        assert_eq!(
            reply(&s, "set a 0 0 2147483648\r\n"),
            "CLIENT_ERROR bad command line format\r\n"
        );
    }

    #[test]
    fn oversized_values_are_swallowed_and_the_old_value_removed() {
        let s = test_shared();
        assert_eq!(reply(&s, "set a 0 0 1\r\nx\r\n"), "STORED\r\n");
        let n = (1 << 20) + 1;
        let mut input = format!("set a 0 0 {n}\r\n").into_bytes();
        let mut out = super::Replies::default();
        let step = handle(&s, &input, &mut out);
        assert_eq!(out, b"SERVER_ERROR object too large for cache\r\n");
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
        // The largest length memcached parses is swallowed the same way, never buffered.
        let mut out = super::Replies::default();
        let step = handle(&s, b"set a 0 0 2147483645\r\n", &mut out);
        assert!(matches!(step, Step::Swallow { skip, .. } if skip == 2_147_483_647));
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
        let mut out = super::Replies::default();
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
        let mut out = super::Replies::default();
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

    /// Feeds `request` to the handler `read` bytes at a time, as a connection reads it;
    /// the replies, and the most input ever held unhandled.
    fn feed(s: &Shared, request: &[u8], read: usize) -> (String, usize) {
        let (mut buffer, mut out, mut fed, mut largest) =
            (Vec::new(), super::Replies::default(), 0, 0);
        loop {
            match handle(s, &buffer, &mut out) {
                Step::Done { consumed } => {
                    buffer.drain(..consumed);
                }
                Step::Resume { prefix, consumed } => {
                    buffer.copy_within(..prefix, consumed - prefix);
                    buffer.drain(..consumed - prefix);
                }
                Step::NeedMore { .. } if fed < request.len() => {
                    let n = read.min(request.len() - fed);
                    buffer.extend_from_slice(&request[fed..fed + n]);
                    fed += n;
                }
                step => panic!("{step:?}"),
            }
            largest = largest.max(buffer.len());
            if fed == request.len() && buffer.is_empty() {
                return (String::from_utf8(out.to_vec()).unwrap(), largest);
            }
        }
    }

    /// A get line far longer than MAX_LINE, arriving in pieces as a connection reads
    /// it: every value comes back, in order, and the unhandled input never grows past
    /// about MAX_LINE and one read.
    #[test]
    fn long_get_lines_are_handled_a_chunk_of_keys_at_a_time() {
        let s = test_shared();
        for i in [3, 10_000, 19_999] {
            assert_eq!(
                reply(&s, &format!("set k{i} {i} 0 1\r\nv\r\n")),
                "STORED\r\n"
            );
        }
        let keys: Vec<String> = (0..20_000).map(|i| format!("k{i}")).collect();
        let request = format!("get {}\r\nget k3\r\n", keys.join(" ")).into_bytes();
        let v = |i: u32| format!("VALUE k{i} {i} 1\r\nv\r\n");
        for read in [4096, 7, 20_000] {
            let (out, largest) = feed(&s, &request, read);
            assert!(largest <= super::super::MAX_LINE + read, "{largest}");
            assert_eq!(
                out,
                format!("{}{}{}END\r\n{}END\r\n", v(3), v(10_000), v(19_999), v(3))
            );
        }
        // Spaces where keys could be: the same answers, still bounded.
        let spaces = " ".repeat(40_000);
        for (request, want) in [
            (
                format!("get k3{spaces}k19999 \r\n"),
                format!("{}{}END\r\n", v(3), v(19_999)),
            ),
            (format!("get k3{spaces}\r\n"), format!("{}END\r\n", v(3))),
            (format!("get{spaces}k3 \r\n"), format!("{}END\r\n", v(3))),
            (
                format!("get{spaces}\r\nget k3\r\n"),
                format!("ERROR\r\n{}END\r\n", v(3)),
            ),
            (
                format!("gets {} \r\n", keys[..5_000].join(" ").replace('k', "x")),
                "END\r\n".to_string(),
            ),
        ] {
            for read in [4096, 1000, 16_383] {
                let (out, largest) = feed(&s, request.as_bytes(), read);
                assert!(largest <= super::super::MAX_LINE + read, "{largest}");
                assert_eq!(out, want, "{read}");
            }
        }
        // Other long lines close without a reply, as memcached closes them.
        let mut out = super::Replies::default();
        let long = format!("gat 0 {}", keys.join(" "));
        assert!(matches!(
            handle(&s, long.as_bytes(), &mut out),
            Step::Close { .. }
        ));
        assert!(out.is_empty());
        // A key longer than a chunk cannot be resynchronised: an error, then close; so
        // does a NUL byte in a long line, after the keys before it.
        let mut out = super::Replies::default();
        let line = format!("get k3 {}\0 k3", keys.join(" "));
        let step = handle(&s, line.as_bytes(), &mut out);
        assert_eq!(
            step,
            Step::Close {
                consumed: line.len()
            }
        );
        assert_eq!(
            String::from_utf8(std::mem::take(&mut out)).unwrap(),
            format!("{}{}{}{}", v(3), v(3), v(10_000), v(19_999))
        );
        let long = format!("get {}", "k".repeat(20_000));
        assert!(matches!(
            handle(&s, long.as_bytes(), &mut out),
            Step::Close { .. }
        ));
        assert_eq!(out, b"CLIENT_ERROR bad command line format\r\n");
    }

    #[test]
    fn http_request_lines_close_as_in_memcached() {
        let s = test_shared();
        assert_eq!(
            run(&s, b"GET / HTTP/1.1\r\n").1,
            Step::Close { consumed: 16 }
        );
        assert_eq!(run(&s, b"POST /x HTTP/1.0\r\n").0, "");
        // Commands routed by their first letter stay ERROR; a get is a get.
        assert_eq!(
            reply(&s, "gx / HTTP/1.1\r\nmx HTTP/1.1\r\n"),
            "ERROR\r\nERROR\r\n"
        );
        assert_eq!(reply(&s, "get / HTTP/1.1\r\n"), "END\r\n");
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
            let mut out = super::Replies::default();
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

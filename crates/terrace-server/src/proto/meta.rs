//! memcached's meta commands (`mg`, `ms`, `md`, `ma`, `mn`, `me`), as memcached 1.6
//! speaks them: a two-letter command, one key, then single-letter flags, some with a
//! token glued on (`T30`, `Oabc`); replies are a two-letter code followed by the flags the
//! request asked to have returned, in the request's order.
//!
//! This module owns the parsing of meta lines (a `Request`: the key, base64-decoded when
//! `b` is given, and one `Flags` per command) and the formatting of meta replies; the
//! cache semantics (expiry times, conditional stores, counted operations) are
//! [`Shared`]'s, called rather than re-implemented.
//!
//! Invariants:
//! - one call handles one request and never panics; `ms` asks for at most its line plus
//!   `datalen + 2` bytes, and an `ms` refused once its flags are parsed has its data
//!   block swallowed unread ([`Step::Swallow`]); one refused before (key too long, too
//!   many tokens, bad length) does not, and its data line is read as a command, as
//!   memcached does;
//! - flags parse as memcached's `_meta_flag_preparse` does (`parse_flags`), numbers as
//!   its `safe_strto*` do (`strtoull`, `strtol32`: white space around, a sign, truncated to 32 bits
//!   where it stores 32); an opaque too long is found where memcached's reply loop finds
//!   it (`md` before acting, `mg` and `ma` after, `ms` after its mode);
//! - `q` suppresses only the nominal reply (`EN` for `mg`, `HD` for `ms`/`md`, the
//!   success of `ma` on an existing item); errors and the other codes are always sent;
//! - `O` (opaque, at most [`MAX_OPAQUE`] bytes with its letter) and `k` are echoed on
//!   every reply code, `EN`/`NF`/`NS`/`EX` included; a base64 key comes back base64 with
//!   a trailing `b`;
//! - `t` (and `me`'s `exp=`) reports the seconds left until the item expires, `-1` for
//!   none; like memcached's reply loop, `T` (and `N` on the item it creates, which starts
//!   without a TTL) changes it where it stands in the request;
//! - stale and win state follow memcached: `md I` keeps the item, stale, with a new CAS
//!   (and `T`'s TTL); `ms I` with a CAS older than the item's stores a stale value that
//!   keeps the old TTL and win token; `mg` answers `Z` once a win token was sent for the
//!   item, `X` while it is stale, and `W` to the one client that wins it (`N` created
//!   it, `R` found less TTL left than asked, or it is stale) — after the requested flags,
//!   in that order. The marks are [`crate::marks`]'s: they follow the item across tiers
//!   and a clean restart, not a crash;
//! - `h` says whether the item was read before this request (before its touch, with
//!   `T`).
//!
//! Where Terrace differs from memcached:
//! - `l` (seconds since last access) is always `l0` and `me` says `la=0`: the engine
//!   keeps no per-item access time; `u` (no LRU bump) reads without recording an access
//!   (the item stays unread for `h`, and the read does not count toward promotion);
//! - `h` comes from the index's hit counter, which a write over a read item keeps
//!   (memcached's new item starts unread) and a touch raises, `mg T u` included;
//! - `k` (and `me`) give the key as this request spelled it (raw for an item this `mg N`
//!   created, as memcached): memcached gives it base64 exactly when the item was stored
//!   with `b`, a per-item bit Terrace does not keep;
//! - `t` of a TTL already past says `t0` (memcached prints its expiry minus now as an
//!   unsigned number); `me`'s `size` is the value's, and it adds `tier`;
//! - CAS checks the engine cannot make atomically (`ma C`, `ms C` in append or prepend
//!   mode) read the item's CAS, then act: a write racing in between may slip by.

use std::borrow::Cow;

use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use terrace_cache::{Checked, Guard, Store};

use super::{data_block, push_decimal, strtol32, strtoull, BadChunk, Line, Step};
use crate::marks::{Locked, Mark};
use crate::shared::{Delta, Expiry, Failure, Shared, StoreOp};
use crate::stats::Counter;

/// Most tokens a meta line may have, command and key included (memcached's
/// `MFLAG_MAX_OPT_LENGTH`).
const MAX_TOKENS: usize = 20;

/// Longest `O` token echoed back, its letter included (memcached's
/// `MFLAG_MAX_OPAQUE_LENGTH`).
pub const MAX_OPAQUE: usize = 32;

/// Largest `ms` datalen memcached parses (a 32-bit int with room for the `\r\n`).
const MAX_DATALEN: u64 = i32::MAX as u64 - 2;

const BAD_FORMAT: &[u8] = b"CLIENT_ERROR bad command line format\r\n";
const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
const BAD_CHUNK: &[u8] = b"CLIENT_ERROR bad data chunk\r\n";

/// Keys decode as memcached's decoder reads them: whole groups of four, `=` padding
/// required, stray low bits in the last group ignored; replies encode with padding.
const KEY_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::RequireCanonical)
        .with_decode_allow_trailing_bits(true),
);

/// Handles the meta command on `line` (whose first token is `mg`, `ms`, `md`, `ma`, `mn`
/// or `me`); `input` starts at that line.
pub fn handle(shared: &Shared, line: Line<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    let mut tokens = [&[][..]; MAX_TOKENS + 1];
    let mut count = 0;
    for token in line.text.split(|&b| b == b' ').filter(|t| !t.is_empty()) {
        if count == tokens.len() {
            break;
        }
        tokens[count] = token;
        count += 1;
    }
    let tokens = &tokens[..count];
    let done = Step::Done {
        consumed: line.consumed,
    };
    let command = tokens.first().copied().unwrap_or_default();
    // As memcached: a meta command without its key is not a command at all (`me`
    // excepted, which says bad format).
    if count < 2 && matches!(command, b"mg" | b"ms" | b"md" | b"ma") {
        out.extend_from_slice(b"ERROR\r\n");
        return done;
    }
    let parsed = match command {
        b"mn" => {
            out.extend_from_slice(b"MN\r\n");
            return done;
        }
        b"ms" => return meta_set(shared, line, tokens, input, out),
        b"mg" | b"md" | b"ma" => parse_request(shared, tokens, 2),
        // memcached's `me` reads one optional token after the key: `b`.
        b"me" => {
            let base64 = tokens.get(2) == Some(&&b"b"[..]);
            parse_request(shared, &tokens[..count.min(if base64 { 3 } else { 2 })], 2)
        }
        _ => {
            out.extend_from_slice(b"ERROR\r\n");
            return done;
        }
    };
    // memcached checks the opaque's length in each command's reply loop: `md` before it
    // does anything, `mg` and `ma` once they have (the item is read, created, touched,
    // counted), and then sends the error instead of the reply.
    let opaque_error = |out: &mut Vec<u8>, from: usize| {
        out.truncate(from);
        out.extend_from_slice(ParseError::OpaqueTooLong.message(command));
    };
    match parsed {
        Ok(request) => match command {
            b"mg" | b"ma" => {
                let from = out.len();
                if command == b"mg" {
                    meta_get(shared, &request, out);
                } else {
                    meta_arithmetic(shared, &request, out);
                }
                // An error the command met first (a bad mode, a value that is not a
                // number) stands, as memcached stops before its reply loop.
                let failed = out[from..].starts_with(b"CLIENT_ERROR")
                    || out[from..].starts_with(b"SERVER_ERROR");
                if !request.opaque_fits() && !failed {
                    opaque_error(out, from);
                }
            }
            b"md" if !request.opaque_fits() => opaque_error(out, out.len()),
            b"md" => meta_delete(shared, &request, out),
            _ => meta_debug(shared, &request, out),
        },
        Err(e) => out.extend_from_slice(e.message(command)),
    }
    done
}

/// Why a meta line was refused before anything was done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ParseError {
    /// Missing key, key too long or with bytes a key cannot hold.
    BadFormat,
    /// `F` without a 32-bit number.
    BadClientFlags,
    /// `M` not followed by exactly one byte.
    BadModeLength,
    TooManyTokens,
    DuplicateFlag,
    InvalidFlag,
    /// A flag's numeric token is missing or malformed.
    BadToken,
    BadInitial,
    BadDelta,
    OpaqueTooLong,
    /// `b` given and the key is not base64.
    KeyNotBase64,
}

impl ParseError {
    /// The error line memcached sends for this error in `command`: `md` and `ma` answer
    /// every flag error the same way, and only `mg` says "are too long".
    fn message(self, command: &[u8]) -> &'static [u8] {
        if matches!(command, b"md" | b"ma") && self.is_flag_error() {
            return b"CLIENT_ERROR invalid or duplicate flag\r\n";
        }
        match self {
            ParseError::BadFormat | ParseError::BadClientFlags => BAD_FORMAT,
            ParseError::BadModeLength => b"CLIENT_ERROR incorrect length for M token\r\n",
            ParseError::TooManyTokens if command == b"mg" => {
                b"CLIENT_ERROR options flags are too long\r\n"
            }
            ParseError::TooManyTokens => b"CLIENT_ERROR options flags too long\r\n",
            ParseError::DuplicateFlag => b"CLIENT_ERROR duplicate flag\r\n",
            ParseError::InvalidFlag => b"CLIENT_ERROR invalid flag\r\n",
            ParseError::BadToken => b"CLIENT_ERROR bad token in command line format\r\n",
            ParseError::BadInitial => b"CLIENT_ERROR invalid numeric initial value\r\n",
            ParseError::BadDelta => b"CLIENT_ERROR invalid numeric delta value\r\n",
            ParseError::OpaqueTooLong => b"CLIENT_ERROR opaque token too long\r\n",
            ParseError::KeyNotBase64 => b"CLIENT_ERROR error decoding key\r\n",
        }
    }

    /// Errors of the flags themselves (what `md` and `ma` report as one).
    fn is_flag_error(self) -> bool {
        !matches!(
            self,
            ParseError::BadFormat | ParseError::OpaqueTooLong | ParseError::TooManyTokens
        )
    }
}

/// The key of a request: the bytes looked up, and whether they came base64-encoded.
#[derive(Debug)]
struct Key<'a> {
    bytes: Cow<'a, [u8]>,
    binary: bool,
}

/// The flags of one meta request. The reply-shaping letters (`k`, `O`, `s`, `t`, ...)
/// are found in `letters`, which keeps every letter given in request order (each at
/// most once); the rest is parsed into the fields below.
#[derive(Clone, Debug, Default)]
struct Flags<'a> {
    letters: [u8; MAX_TOKENS],
    /// How many of `letters` are set.
    count: usize,
    /// `O`: the whole token, letter included, echoed as is.
    opaque: Option<&'a [u8]>,
    /// `q`.
    quiet: bool,
    /// `v`.
    value: bool,
    /// `b`.
    base64_key: bool,
    /// `C`.
    compare_cas: Option<u64>,
    /// `F`.
    client_flags: Option<u32>,
    /// `T`: an exptime.
    ttl: Option<i64>,
    /// `N`: the exptime of an item created on a miss.
    vivify: Option<i64>,
    /// `R`: win when the item has less than this TTL left.
    recache: Option<i64>,
    /// `I`: invalidate (`md`: mark stale; `ms`: a CAS store of an older CAS stores a
    /// stale item).
    invalidate: bool,
    /// `M`: the first byte after the letter (`0` when none).
    mode: Option<u8>,
    /// `J` (ma).
    initial: Option<u64>,
    /// `D` (ma).
    delta: Option<u64>,
}

impl Flags<'_> {
    /// The flag letters, in request order.
    fn order(&self) -> &[u8] {
        &self.letters[..self.count]
    }
}

/// A parsed meta line: its key and flags.
#[derive(Debug)]
struct Request<'a> {
    key: Key<'a>,
    flags: Flags<'a>,
}

impl Request<'_> {
    fn key(&self) -> &[u8] {
        &self.key.bytes
    }

    /// Whether `O` (if given) is at most [`MAX_OPAQUE`] bytes, its letter included.
    fn opaque_fits(&self) -> bool {
        self.flags.opaque.is_none_or(|o| o.len() <= MAX_OPAQUE)
    }

    /// The flags `mg` and `ma` act on. With an opaque too long, memcached's reply loop
    /// stops at `O` (the caller sends the error): a `T` or `N` after it never sets the
    /// TTL, and an item `N` creates on a miss is created all the same, with what a `T`
    /// before the opaque gave, else without a TTL.
    fn flags_up_to_opaque(&self) -> Cow<'_, Flags<'_>> {
        if self.opaque_fits() {
            return Cow::Borrowed(&self.flags);
        }
        let order = self.flags.order();
        let at = order.iter().position(|&l| l == b'O').unwrap_or(order.len());
        let before = |letter| order[..at].contains(&letter);
        let ttl = self.flags.ttl.filter(|_| before(b'T'));
        Cow::Owned(Flags {
            ttl,
            vivify: self
                .flags
                .vivify
                .map(|n| if before(b'N') { n } else { ttl.unwrap_or(0) }),
            ..self.flags.clone()
        })
    }
}

/// Parses `tokens` (command, key, then flags from index `first_flag`).
fn parse_request<'a>(
    shared: &Shared,
    tokens: &[&'a [u8]],
    first_flag: usize,
) -> Result<Request<'a>, ParseError> {
    let Some(&key_token) = tokens.get(1) else {
        return Err(ParseError::BadFormat);
    };
    if key_token.len() > shared.limits.max_key {
        return Err(ParseError::BadFormat);
    }
    // memcached counts a terminating empty token: 20 tokens are one too many.
    if tokens.len() >= MAX_TOKENS {
        return Err(ParseError::TooManyTokens);
    }
    let (flags, decoded) = parse_flags(tokens.get(first_flag..).unwrap_or_default(), key_token)?;
    let key = match decoded {
        Some(decoded) => Key {
            bytes: Cow::Owned(decoded),
            binary: true,
        },
        None => {
            if !shared.key_ok(key_token) {
                return Err(ParseError::BadFormat);
            }
            Key {
                bytes: Cow::Borrowed(key_token),
                binary: false,
            }
        }
    };
    Ok(Request { key, flags })
}

/// Parses flag tokens as memcached's `_meta_flag_preparse` does: a letter, for some a
/// token glued to it; every command accepts every known letter (only the ones it uses
/// have an effect). A repeated letter (or a byte above 126) and an unknown letter end
/// the parse at once; a bad token is remembered and the parse goes on, the last such
/// error being the one reported (a bad `F` keeps the error before it). `b` decodes the
/// key (`key_token`) where it stands; the decoded key is returned with the flags.
fn parse_flags<'a>(
    tokens: &[&'a [u8]],
    key_token: &[u8],
) -> Result<(Flags<'a>, Option<Vec<u8>>), ParseError> {
    let mut flags = Flags::default();
    let mut seen = [false; 128];
    let mut error = None;
    let mut decoded = None;
    for &token in tokens {
        let Some((&letter, arg)) = token.split_first() else {
            continue;
        };
        if letter >= 127 || seen[usize::from(letter)] {
            return Err(ParseError::DuplicateFlag);
        }
        seen[usize::from(letter)] = true;
        let mut fail = |e: ParseError| error = Some(e);
        match letter {
            b'b' => {
                flags.base64_key = true;
                match KEY_BASE64.decode(key_token) {
                    Ok(key) if !key.is_empty() => decoded = Some(key),
                    _ => fail(ParseError::KeyNotBase64),
                }
            }
            b'q' => flags.quiet = true,
            b'v' => flags.value = true,
            b'I' => flags.invalidate = true,
            // Reply-only letters, ignored proxy hints, and the flags Terrace accepts
            // without effect (see the module docs).
            b'k' | b's' | b't' | b'c' | b'f' | b'h' | b'l' | b'u' | b'P' | b'L' => {}
            b'O' => flags.opaque = Some(token),
            b'T' => match strtol(arg) {
                Some(n) => flags.ttl = Some(n),
                None => fail(ParseError::BadToken),
            },
            b'N' => match strtol(arg) {
                Some(n) => flags.vivify = Some(n),
                None => fail(ParseError::BadToken),
            },
            b'R' => match strtol(arg) {
                Some(n) => flags.recache = Some(n),
                None => fail(ParseError::BadToken),
            },
            b'C' => match strtoull(arg) {
                Some(n) => flags.compare_cas = Some(n),
                None => fail(ParseError::BadToken),
            },
            // memcached keeps the message of the error before (if any).
            b'F' => match strtoull(arg) {
                Some(n) => flags.client_flags = Some(n as u32),
                None => {
                    error.get_or_insert(ParseError::BadClientFlags);
                }
            },
            b'M' => match arg {
                [mode] => flags.mode = Some(*mode),
                _ => fail(ParseError::BadModeLength),
            },
            b'J' => match strtoull(arg) {
                Some(n) => flags.initial = Some(n),
                None => fail(ParseError::BadInitial),
            },
            b'D' => match strtoull(arg) {
                Some(n) => flags.delta = Some(n),
                None => fail(ParseError::BadDelta),
            },
            _ => return Err(ParseError::InvalidFlag),
        }
        if let Some(slot) = flags.letters.get_mut(flags.count) {
            *slot = letter;
            flags.count += 1;
        }
    }
    match error {
        Some(e) => Err(e),
        None => Ok((flags, decoded)),
    }
}

/// A number as memcached's `safe_strtol` reads it ([`strtol32`]: within a 64-bit
/// `long`, then truncated to 32 bits, so `T4294967296` is `T0`), widened for the flags.
fn strtol(arg: &[u8]) -> Option<i64> {
    strtol32(arg).map(i64::from)
}

/// Seconds until a found item stops being served (`-1`: never; `0`: now).
fn remaining_ttl(shared: &Shared, guard: &Guard<'_>) -> i64 {
    guard
        .expires_at()
        .map_or(-1, |at| (i64::from(at) - i64::from(shared.now())).max(0))
}

/// The remaining TTL an exptime gives an item written now (`-1`: none; `0`: already
/// past).
fn ttl_of(shared: &Shared, exptime: i64) -> i64 {
    match shared.expiry(exptime) {
        Expiry::Ttl(0) => -1,
        Expiry::Ttl(secs) => i64::from(secs),
        Expiry::Past => 0,
    }
}

/// Of `N` and `T`, the one given last: memcached applies each where it stands in the
/// request, so the last one sets the TTL of an item the request creates.
fn last_exptime(flags: &Flags<'_>) -> Option<i64> {
    let at = |letter| flags.order().iter().position(|&l| l == letter);
    match (flags.vivify, flags.ttl) {
        (Some(_), Some(t)) if at(b'T') > at(b'N') => Some(t),
        (Some(n), _) => Some(n),
        (None, t) => t,
    }
}

// ---- reply writing ----

/// What a reply can say about an item; `None` leaves the matching flag out.
#[derive(Clone, Copy, Debug, Default)]
struct Facts {
    size: Option<usize>,
    /// The item's TTL before the request changed it (`t`); `T`, and `N` when it created
    /// the item, change it where they stand in the request ([`Facts::ttl_at`]).
    ttl: Option<i64>,
    /// The TTL `T` gave.
    on_t: Option<i64>,
    /// The TTL `N` gave the item it created.
    on_n: Option<i64>,
    cas: Option<u64>,
    client_flags: Option<u32>,
    /// `k` gives the key's bytes as they are, even when the request sent it in base64
    /// (memcached: an item `mg N` created is not marked as having a binary key).
    raw_key: bool,
    /// `h` and `l`: whether the item was read before this request, and the seconds
    /// since its last access (`None`: leave both out).
    access: Option<(bool, u64)>,
}

impl Facts {
    /// The TTL in effect when memcached's reply loop reaches the `index`th flag.
    fn ttl_at(&self, order: &[u8], index: usize) -> Option<i64> {
        let mut ttl = self.ttl;
        for &letter in &order[..index.min(order.len())] {
            match letter {
                b'T' if self.on_t.is_some() => ttl = self.on_t,
                b'N' if self.on_n.is_some() => ttl = self.on_n,
                _ => {}
            }
        }
        ttl
    }
}

/// Appends ` <letter><n>`.
fn push_flag(out: &mut Vec<u8>, letter: u8, n: u64) {
    out.push(b' ');
    out.push(letter);
    push_decimal(out, n);
}

/// Appends a remaining TTL as `t` and `exp=` give it: seconds, or `-1` for none.
fn push_ttl(out: &mut Vec<u8>, ttl: i64) {
    if ttl < 0 {
        out.extend_from_slice(b"-1");
    } else {
        push_decimal(out, ttl.unsigned_abs());
    }
}

/// Appends ` k<key>`, base64 with a ` b` after it for a binary key.
fn push_key(out: &mut Vec<u8>, key: &Key<'_>) {
    out.extend_from_slice(b" k");
    if key.binary {
        out.extend_from_slice(KEY_BASE64.encode(&key.bytes).as_bytes());
        out.extend_from_slice(b" b");
    } else {
        out.extend_from_slice(&key.bytes);
    }
}

/// Appends the returned flags the request asked for, in its order.
fn push_flags(out: &mut Vec<u8>, request: &Request<'_>, facts: Facts) {
    let order = request.flags.order();
    for (index, &letter) in order.iter().enumerate() {
        match letter {
            b'O' => {
                if let Some(opaque) = request.flags.opaque {
                    out.push(b' ');
                    out.extend_from_slice(opaque);
                }
            }
            b'k' if facts.raw_key => push_key(
                out,
                &Key {
                    bytes: Cow::Borrowed(request.key()),
                    binary: false,
                },
            ),
            b'k' => push_key(out, &request.key),
            b's' => {
                if let Some(size) = facts.size {
                    push_flag(out, b's', size as u64);
                }
            }
            b't' => {
                if let Some(ttl) = facts.ttl_at(order, index) {
                    out.extend_from_slice(b" t");
                    push_ttl(out, ttl);
                }
            }
            b'c' => {
                if let Some(cas) = facts.cas {
                    push_flag(out, b'c', cas);
                }
            }
            b'f' => {
                if let Some(flags) = facts.client_flags {
                    push_flag(out, b'f', u64::from(flags));
                }
            }
            b'h' => {
                if let Some((read_before, _)) = facts.access {
                    push_flag(out, b'h', u64::from(read_before));
                }
            }
            b'l' => {
                if let Some((_, idle)) = facts.access {
                    push_flag(out, b'l', idle);
                }
            }
            _ => {}
        }
    }
}

/// Appends a status line: `code`, the requested flags, `\r\n`.
fn push_status(out: &mut Vec<u8>, code: &[u8], request: &Request<'_>, facts: Facts) {
    out.extend_from_slice(code);
    push_flags(out, request, facts);
    out.extend_from_slice(b"\r\n");
}

/// Appends the error line of a failed cache operation.
fn push_failure(out: &mut Vec<u8>, failure: Failure) {
    out.extend_from_slice(match failure {
        Failure::BadKey => BAD_FORMAT,
        Failure::TooLarge => TOO_LARGE,
        Failure::OutOfMemory => b"SERVER_ERROR out of memory storing object\r\n",
        Failure::NotANumber => b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
        Failure::Internal => b"SERVER_ERROR internal error\r\n",
    });
}

/// The code of a conditional store's outcome.
fn store_code(result: Store) -> &'static [u8] {
    match result {
        Store::Stored { .. } => b"HD",
        Store::NotStored => b"NS",
        Store::Exists => b"EX",
        Store::NotFound => b"NF",
    }
}

/// The key's CAS, without counting a get (`None`: absent).
fn current_cas(shared: &Shared, key: &[u8]) -> Result<Option<u64>, Failure> {
    Ok(shared
        .cache(key)
        .peek(key)
        .map_err(|e| Failure::of(&e))?
        .map(|g| g.cas()))
}

// ---- mg ----

/// An item `mg` found or created.
struct Hit<'g> {
    guard: Option<Guard<'g>>,
    cas: u64,
    client_flags: u32,
    /// The item's TTL before this request's `T` (`-1` for an item `N` created).
    ttl: i64,
    /// This request created the item (`N`).
    created: bool,
    /// The item had been read before this request.
    read_before: bool,
}

impl Hit<'_> {
    /// A found item: `before`, what it was before this request's touch, if any (read
    /// before, TTL).
    fn found<'g>(shared: &Shared, guard: Guard<'g>, before: Option<(bool, i64)>) -> Hit<'g> {
        let (read_before, ttl) =
            before.unwrap_or_else(|| (guard.read_before(), remaining_ttl(shared, &guard)));
        Hit {
            cas: guard.cas(),
            client_flags: guard.client_flags(),
            ttl,
            read_before,
            guard: Some(guard),
            created: false,
        }
    }

    fn value(&self) -> &[u8] {
        self.guard.as_ref().map_or(&[][..], |g| g.value())
    }
}

/// `mg <key> <flags>*`: `VA <size> <flags>*` + data with `v`, `HD <flags>*` without,
/// `EN` on a miss. After the requested flags come memcached's state flags, in its order:
/// `Z` (a win token was already sent for this item), `X` (stale), `W` (this client won:
/// it created the item with `N`, its `R` found the TTL below the threshold, or the item
/// is stale; once per item version).
fn meta_get(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) {
    let key = request.key();
    let flags = &*request.flags_up_to_opaque();
    // The key's marks are read and set under its shard lock whenever they may matter;
    // `locked` is taken before the lookup when this request may win or marks exist.
    let mut locked =
        (flags.vivify.is_some() || flags.recache.is_some() || !shared.marks.is_empty())
            .then(|| shared.marks.lock(key));
    // `h` and the TTL `t` sees before `T` are the item's before the touch.
    let before = match flags.ttl {
        Some(_) => match shared.cache(key).peek(key) {
            Ok(guard) => guard.map(|g| (g.read_before(), remaining_ttl(shared, &g))),
            Err(e) => return push_failure(out, Failure::of(&e)),
        },
        None => None,
    };
    // `u`: the read is not recorded as an access (memcached's no LRU bump), so the
    // item stays unread for the next `h`.
    let bump = !flags.order().contains(&b'u');
    let found = match flags.ttl {
        Some(exptime) => shared.gat_meta_bumping(key, exptime, bump),
        None => shared.get_meta_bumping(key, bump),
    };
    let hit = match found {
        Ok(Some(guard)) => Hit::found(shared, guard, before),
        Ok(None) => match (last_exptime(flags), locked.as_mut()) {
            (Some(exptime), Some(locked)) if flags.vivify.is_some() => {
                match vivify_empty(shared, locked, key, exptime, request.opaque_fits(), bump) {
                    Ok(Some(hit)) => hit,
                    Ok(None) => return push_miss(out, request),
                    Err(failure) => return push_failure(out, failure),
                }
            }
            _ => return push_miss(out, request),
        },
        Err(failure) => return push_failure(out, failure),
    };
    // A mark set between the first look at the table and the lookup is seen here.
    if locked.is_none() && !shared.marks.is_empty() {
        locked = Some(shared.marks.lock(key));
    }
    let mark = match locked.as_mut() {
        Some(locked) if !hit.created => {
            // Marks of a version that is gone are dropped here (only when the version
            // read is still the current one: a newer one may be what they mark).
            if locked.marks_other_than(hit.cas)
                && current_cas(shared, key).ok().flatten() == Some(hit.cas)
            {
                locked.forget_unless(hit.cas);
            }
            locked.get(hit.cas)
        }
        _ => Mark::default(),
    };
    let facts = Facts {
        size: Some(hit.value().len()),
        ttl: Some(hit.ttl),
        on_t: flags.ttl.map(|e| ttl_of(shared, e)),
        on_n: flags
            .vivify
            .filter(|_| hit.created)
            .map(|e| ttl_of(shared, e)),
        cas: Some(hit.cas),
        client_flags: Some(hit.client_flags),
        // Terrace keeps no per-item access time: `l` says 0.
        access: Some((hit.read_before || mark.read_before, 0)),
        raw_key: hit.created,
    };
    let wins = hit.created
        || (!mark.won && (mark.stale || recache_due(shared, flags, &facts, hit.created)));
    // The win is recorded only on the version still current, so one client wins it.
    // A request that fails (an opaque too long) wins nothing, as in memcached. A `T`
    // that expired the item now leaves nothing to record: the win is this client's.
    let expired_now = flags
        .ttl
        .is_some_and(|e| matches!(shared.expiry(e), Expiry::Past));
    let won = wins
        && request.opaque_fits()
        && (hit.created
            || expired_now
            || match locked.as_mut() {
                Some(locked) if current_cas(shared, key).ok().flatten() == Some(hit.cas) => {
                    locked.set(hit.cas, Mark { won: true, ..mark });
                    true
                }
                _ => false,
            });
    drop(locked);
    let value = hit.value();
    if flags.value {
        out.extend_from_slice(b"VA ");
        push_decimal(out, value.len() as u64);
    } else {
        out.extend_from_slice(b"HD");
    }
    push_flags(out, request, facts);
    if mark.won {
        out.extend_from_slice(b" Z");
    }
    if mark.stale {
        out.extend_from_slice(b" X");
    }
    if won {
        out.extend_from_slice(b" W");
    }
    out.extend_from_slice(b"\r\n");
    if flags.value {
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
}

/// `R<secs>`: whether the item, which expires, has less than `secs` left when the
/// request reaches `R` (memcached compares its absolute expiry with the recache time).
fn recache_due(shared: &Shared, flags: &Flags<'_>, facts: &Facts, created: bool) -> bool {
    let Some(exptime) = flags.recache else {
        return false;
    };
    let order = flags.order();
    let at = order.iter().position(|&l| l == b'R').unwrap_or(order.len());
    match (created, facts.ttl_at(order, at), shared.expiry(exptime)) {
        // Never expires (-1), or just created: no recache.
        (true, _, _) | (_, None, _) => false,
        (_, Some(left), Expiry::Ttl(secs)) => left >= 0 && secs != 0 && left < i64::from(secs),
        // A recache time already past is earlier than any expiry still ahead.
        (_, Some(_), Expiry::Past) => false,
    }
}

/// `mg N`: creates the missing key with an empty value, marked won by this client when
/// `replied` (the request is answered) and read when `bump` (no `u`), under the key's
/// shard lock. `None` when it vanished again.
fn vivify_empty<'s>(
    shared: &'s Shared,
    locked: &mut Locked<'_>,
    key: &[u8],
    exptime: i64,
    replied: bool,
    bump: bool,
) -> Result<Option<Hit<'s>>, Failure> {
    match shared.store_meta(StoreOp::Add, key, b"", 0, exptime)? {
        Store::Stored { cas } => {
            // memcached counts the creator's fetch (unless `u`): the next client sees
            // `h1`. The win is recorded with the reply that sends it (none when the
            // request fails).
            locked.set(
                cas,
                Mark {
                    won: replied,
                    read_before: bump,
                    ..Mark::default()
                },
            );
            Ok(Some(Hit {
                guard: None,
                cas,
                client_flags: 0,
                // memcached creates the item without a TTL; `N` then gives it one.
                ttl: -1,
                created: true,
                read_before: false,
            }))
        }
        // Another client created it first: answer with its item, without the win (a
        // peek: this request's get was already counted, as a miss).
        _ => Ok(shared
            .cache(key)
            .peek(key)
            .map_err(|e| Failure::of(&e))?
            .map(|guard| Hit::found(shared, guard, None))),
    }
}

/// `EN` with the echoed flags, unless quiet.
fn push_miss(out: &mut Vec<u8>, request: &Request<'_>) {
    if !request.flags.quiet {
        push_status(out, b"EN", request, Facts::default());
    }
}

// ---- ms ----

/// The write an `ms` mode asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SetMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
}

impl SetMode {
    fn of(mode: Option<u8>) -> Option<SetMode> {
        Some(match mode {
            None | Some(b'S') => SetMode::Set,
            Some(b'E') => SetMode::Add,
            Some(b'R') => SetMode::Replace,
            Some(b'A') => SetMode::Append,
            Some(b'P') => SetMode::Prepend,
            Some(_) => return None,
        })
    }
}

/// `ms <key> <datalen> <flags>*` and its data block: `HD`, `NS`, `EX` or `NF`.
fn meta_set(
    shared: &Shared,
    line: Line<'_>,
    tokens: &[&[u8]],
    input: &[u8],
    out: &mut Vec<u8>,
) -> Step {
    let done = Step::Done {
        consumed: line.consumed,
    };
    // Refused before the length is known, or without one, the data cannot be skipped:
    // memcached reads it as commands too.
    if tokens
        .get(1)
        .is_some_and(|key| key.len() > shared.limits.max_key)
    {
        out.extend_from_slice(BAD_FORMAT);
        return done;
    }
    let Some(&length) = tokens.get(2) else {
        out.extend_from_slice(BAD_FORMAT);
        return done;
    };
    if tokens.len() >= MAX_TOKENS {
        out.extend_from_slice(ParseError::TooManyTokens.message(b"ms"));
        return done;
    }
    // Read as memcached's safe_strtol: truncated to 32 bits, then range-checked.
    let Some(length) = strtol(length)
        .and_then(|n| u64::try_from(n).ok())
        .filter(|&n| n <= MAX_DATALEN)
    else {
        out.extend_from_slice(BAD_FORMAT);
        return done;
    };
    // At most i32::MAX: fits any usize Terrace runs on.
    let length = usize::try_from(length).unwrap_or(usize::MAX - 2);
    let body = length + 2;
    let swallow = Step::Swallow {
        consumed: line.consumed,
        skip: body,
    };
    let request = match parse_request(shared, tokens, 3) {
        Ok(request) => request,
        Err(e) => {
            out.extend_from_slice(e.message(b"ms"));
            return swallow;
        }
    };
    let Some(mode) = SetMode::of(request.flags.mode) else {
        out.extend_from_slice(b"CLIENT_ERROR invalid mode for ms M token\r\n");
        return swallow;
    };
    if !request.opaque_fits() {
        out.extend_from_slice(ParseError::OpaqueTooLong.message(b"ms"));
        return swallow;
    }
    if length > shared.limits.max_value {
        out.extend_from_slice(TOO_LARGE);
        // As memcached: a write that cannot be honoured must not leave the old value.
        let _ = shared.cache(request.key()).delete(request.key());
        return swallow;
    }
    let value = match data_block(input, line.consumed, length) {
        Ok(Some(value)) => value,
        Ok(None) => {
            return Step::NeedMore {
                total: Some(line.consumed + body),
            }
        }
        Err(BadChunk) => {
            // Errors are sent even when quiet.
            out.extend_from_slice(BAD_CHUNK);
            return Step::Done {
                consumed: line.consumed + body,
            };
        }
    };
    let consumed = Step::Done {
        consumed: line.consumed + body,
    };
    let result = match store_in_mode(shared, &request, mode, value) {
        Ok(result) => result,
        Err(failure) => {
            push_failure(out, failure);
            return consumed;
        }
    };
    if request.flags.quiet && matches!(result, Store::Stored { .. }) {
        return consumed;
    }
    // As memcached 1.6.18, an `ms` reply returns `O`, `k` and `c` only.
    let cas = match result {
        Store::Stored { cas } => cas,
        _ => 0,
    };
    let facts = Facts {
        cas: Some(cas),
        ..Facts::default()
    };
    push_status(out, store_code(result), &request, facts);
    consumed
}

/// Carries out an `ms` write. `C` makes set and replace a CAS store, conditions append
/// and prepend, and is ignored by add (as memcached); `C0` asks for no check.
fn store_in_mode(
    shared: &Shared,
    request: &Request<'_>,
    mode: SetMode,
    value: &[u8],
) -> Result<Store, Failure> {
    let key = request.key();
    let flags = request.flags.client_flags.unwrap_or(0);
    let exptime = request.flags.ttl.unwrap_or(0);
    let cas = request.flags.compare_cas;
    let op = match (mode, cas) {
        (SetMode::Set | SetMode::Replace, Some(cas)) if request.flags.invalidate => {
            return store_invalidating(shared, key, value, flags, exptime, cas)
        }
        (SetMode::Set | SetMode::Replace, Some(cas)) => StoreOp::Cas(cas),
        (SetMode::Set, None) => StoreOp::Set,
        (SetMode::Replace, None) => StoreOp::Replace,
        (SetMode::Add, _) => StoreOp::Add,
        (SetMode::Append, _) => return concat(shared, request, StoreOp::Append, value),
        (SetMode::Prepend, _) => return concat(shared, request, StoreOp::Prepend, value),
    };
    shared.store_meta(op, key, value, flags, exptime)
}

/// `ms` with `I` and `C`: as memcached, a CAS older (lower) than the item's stores the
/// value anyway, as a stale item that keeps the old item's TTL and win token; the item's
/// own CAS stores it as usual (fresh); any other is `EX`.
fn store_invalidating(
    shared: &Shared,
    key: &[u8],
    value: &[u8],
    flags: u32,
    exptime: i64,
    cas: u64,
) -> Result<Store, Failure> {
    let cache = shared.cache(key);
    let fail = |e| Failure::of(&e);
    let mut locked = shared.marks.lock(key);
    loop {
        let Some(current) = cache.peek(key).map_err(fail)? else {
            return shared.store_meta(StoreOp::Cas(cas), key, value, flags, exptime);
        };
        let (current_cas, ttl) = (current.cas(), ttl_left(shared, &current));
        drop(current);
        if cas == 0 || cas >= current_cas {
            return shared.store_meta(StoreOp::Cas(cas), key, value, flags, exptime);
        }
        let mark = locked.get(current_cas);
        match cache
            .cas(key, value, flags, ttl, current_cas)
            .map_err(fail)?
        {
            Store::Stored { cas } => {
                shared.counters.add(Counter::CmdSet, 1);
                shared.counters.add(Counter::CasHits, 1);
                shared.counters.add(Counter::TotalItems, 1);
                locked.set(
                    cas,
                    Mark {
                        stale: true,
                        won: mark.won,
                        read_before: false,
                    },
                );
                return Ok(Store::Stored { cas });
            }
            // Rewritten in between: look again.
            _ => continue,
        }
    }
}

/// The TTL, in seconds from now, that gives an item written now the expiry of `guard`'s
/// item (0: none; at least 1 when it expires this very second).
fn ttl_left(shared: &Shared, guard: &Guard<'_>) -> u32 {
    match guard.expires_at() {
        None => 0,
        Some(at) => at.saturating_sub(shared.now()).max(1),
    }
}

/// `ms` in append or prepend mode: the key's flags and expiry are kept (`T` and `F` are
/// ignored); a miss is `NS` (memcached 1.6.18's `N` does not create the item here).
fn concat(
    shared: &Shared,
    request: &Request<'_>,
    op: StoreOp,
    value: &[u8],
) -> Result<Store, Failure> {
    let key = request.key();
    // As memcached, C0 asks for no check; the check is atomic with the write.
    let if_cas = request.flags.compare_cas.filter(|&c| c != 0);
    // exptime 0: the concatenation keeps the item's own expiry.
    shared.store_checked_meta(op, key, value, 0, 0, if_cas)
}

// ---- md ----

/// `md <key> <flags>*`: `HD`, `NF`, or `EX` when `C` does not match; with `I` the item
/// is marked stale instead of removed ([`invalidate`]).
fn meta_delete(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) {
    let code: &[u8] = match delete_item(shared, request) {
        Ok(code) => code,
        Err(failure) => return push_failure(out, failure),
    };
    if request.flags.quiet && code == b"HD" {
        return;
    }
    push_status(out, code, request, Facts::default());
}

fn delete_item(shared: &Shared, request: &Request<'_>) -> Result<&'static [u8], Failure> {
    let key = request.key();
    if request.flags.invalidate {
        return invalidate(shared, request);
    }
    Ok(
        match shared.delete_checked_meta(key, request.flags.compare_cas)? {
            Checked::Done(()) => b"HD",
            Checked::NotFound => b"NF",
            Checked::Exists => b"EX",
        },
    )
}

/// `md I`: as memcached, the item stays, marked stale, with a new CAS (and `T`'s TTL when
/// given); its win token is taken back so that the next reader wins the recache.
fn invalidate(shared: &Shared, request: &Request<'_>) -> Result<&'static [u8], Failure> {
    let key = request.key();
    let cache = shared.cache(key);
    let fail = |e| Failure::of(&e);
    let mut locked = shared.marks.lock(key);
    loop {
        let Some(current) = cache.peek(key).map_err(fail)? else {
            shared.counters.add(Counter::DeleteMisses, 1);
            return Ok(b"NF");
        };
        let current_cas = current.cas();
        if request.flags.compare_cas.is_some_and(|c| c != current_cas) {
            shared.counters.add(Counter::DeleteMisses, 1);
            return Ok(b"EX");
        }
        let ttl = match request.flags.ttl.map(|e| shared.expiry(e)) {
            None => ttl_left(shared, &current),
            Some(Expiry::Ttl(ttl)) => ttl,
            Some(Expiry::Past) => {
                // Stale and already expired: gone.
                drop(current);
                locked.forget_unless(0);
                cache.delete(key).map_err(fail)?;
                return Ok(b"HD");
            }
        };
        let mark = locked.get(current_cas);
        let read_before = current.read_before() || mark.read_before;
        let (value, flags) = (current.value().to_vec(), current.client_flags());
        drop(current);
        if let Store::Stored { cas } = cache
            .cas(key, &value, flags, ttl, current_cas)
            .map_err(fail)?
        {
            locked.set(
                cas,
                Mark {
                    stale: true,
                    won: false,
                    read_before,
                },
            );
            return Ok(b"HD");
        }
    }
}

// ---- ma ----

/// `ma <key> <flags>*`: `HD` (or `VA` with the number under `v`), `NF` on a miss, `NS`
/// when `N` could not create the item, `EX` when `C` does not match.
fn meta_arithmetic(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) {
    let way = match request.flags.mode {
        None | Some(b'I' | b'+') => Delta::Incr,
        Some(b'D' | b'-') => Delta::Decr,
        Some(_) => {
            out.extend_from_slice(b"CLIENT_ERROR invalid mode for ma M token\r\n");
            return;
        }
    };
    let flags = &*request.flags_up_to_opaque();
    let outcome = match apply_arithmetic(shared, request.key(), flags, way) {
        Ok(outcome) => outcome,
        Err(failure) => return push_failure(out, failure),
    };
    let (number, facts, created) = match outcome {
        Arith::Done {
            number,
            facts,
            created,
        } => (number, facts, created),
        Arith::Refused(code) => return push_status(out, code, request, Facts::default()),
    };
    // As memcached: quiet suppresses the success on an existing item, the number
    // included; an item `N` created is answered.
    if request.flags.quiet && !created {
        return;
    }
    let mut digits = Vec::with_capacity(20);
    push_decimal(&mut digits, number);
    if request.flags.value {
        out.extend_from_slice(b"VA ");
        push_decimal(out, digits.len() as u64);
    } else {
        out.extend_from_slice(b"HD");
    }
    push_flags(out, request, facts);
    out.extend_from_slice(b"\r\n");
    if request.flags.value {
        out.extend_from_slice(&digits);
        out.extend_from_slice(b"\r\n");
    }
}

/// The outcome of an `ma`.
enum Arith {
    Done {
        number: u64,
        facts: Facts,
        /// `N` created the item.
        created: bool,
    },
    /// `NF`, `NS` or `EX`.
    Refused(&'static [u8]),
}

fn apply_arithmetic(
    shared: &Shared,
    key: &[u8],
    flags: &Flags<'_>,
    way: Delta,
) -> Result<Arith, Failure> {
    let delta = flags.delta.unwrap_or(1);
    // As memcached, C0 asks for no check; a miss goes on to create or NF. The check is
    // atomic with the write.
    let if_cas = flags.compare_cas.filter(|&c| c != 0);
    let peek = |key: &[u8]| shared.cache(key).peek(key).map_err(|e| Failure::of(&e));
    let mut created = false;
    let mut ttl = None;
    let (number, cas) = match shared.arith_checked(key, delta, way, if_cas)? {
        Checked::Done((number, cas)) => (number, cas),
        Checked::Exists => return Ok(Arith::Refused(b"EX")),
        Checked::NotFound => {
            let Some(exptime) = last_exptime(flags).filter(|_| flags.vivify.is_some()) else {
                return Ok(Arith::Refused(b"NF"));
            };
            let initial = flags.initial.unwrap_or(0);
            let mut text = Vec::with_capacity(20);
            push_decimal(&mut text, initial);
            match shared.store_meta(StoreOp::Add, key, &text, 0, exptime)? {
                Store::Stored { cas } => {
                    created = true;
                    // memcached creates it without a TTL; `N` and `T` then set one.
                    ttl = Some(-1);
                    (initial, cas)
                }
                // Created by another client in between: apply the delta to it.
                _ => match shared.arith_checked(key, delta, way, if_cas)? {
                    Checked::Done((number, cas)) => (number, cas),
                    Checked::Exists => return Ok(Arith::Refused(b"EX")),
                    Checked::NotFound => return Ok(Arith::Refused(b"NS")),
                },
            }
        }
    };
    if !created {
        ttl = peek(key)?.map(|guard| remaining_ttl(shared, &guard));
        if let Some(exptime) = flags.ttl {
            // The touch keeps the CAS just written.
            shared.touch(key, exptime)?;
        }
    }
    Ok(Arith::Done {
        number,
        facts: Facts {
            ttl,
            on_t: flags.ttl.map(|e| ttl_of(shared, e)),
            on_n: flags.vivify.filter(|_| created).map(|e| ttl_of(shared, e)),
            cas: Some(cas),
            ..Facts::default()
        },
        created,
    })
}

// ---- me ----

/// `me <key> [b]`: a debug line about the item, `EN` on a miss. Terrace reports what it
/// knows: `exp` the seconds left (`-1`: never), `la=0 fetch=no` (not tracked), `cls=1`
/// (no slab classes), `size` the value's length, and the tier the item is in.
fn meta_debug(shared: &Shared, request: &Request<'_>, out: &mut Vec<u8>) {
    let guard = match shared.cache(request.key()).peek(request.key()) {
        Ok(Some(guard)) => guard,
        Ok(None) => return out.extend_from_slice(b"EN\r\n"),
        Err(e) => return push_failure(out, Failure::of(&e)),
    };
    out.extend_from_slice(b"ME ");
    if request.key.binary {
        out.extend_from_slice(KEY_BASE64.encode(request.key()).as_bytes());
    } else {
        out.extend_from_slice(request.key());
    }
    out.extend_from_slice(b" exp=");
    push_ttl(out, remaining_ttl(shared, &guard));
    out.extend_from_slice(b" la=0 cas=");
    push_decimal(out, guard.cas());
    out.extend_from_slice(if guard.read_before() {
        &b" fetch=yes cls=1 size="[..]
    } else {
        b" fetch=no cls=1 size="
    });
    push_decimal(out, guard.value().len() as u64);
    out.extend_from_slice(b" tier=");
    push_decimal(out, guard.tier() as u64);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{split_line, MAX_LINE};
    use crate::shared::test_shared;
    use crate::stats::Counter;

    /// Runs the requests of `input` as the connection loop would, swallowing what a step
    /// asks to skip; returns the replies and the last step.
    /// Requests go through the text protocol, which hands meta lines to this module.
    use crate::proto::drive_text as run;

    fn reply(shared: &Shared, input: &str) -> String {
        run(shared, input.as_bytes()).0
    }

    /// The one step `input` (one request) gives, and its reply.
    fn step(shared: &Shared, input: &[u8]) -> (Step, String) {
        let line = split_line(input).expect("a whole line");
        let mut out = Vec::new();
        let step = handle(shared, line, input, &mut out);
        (step, String::from_utf8_lossy(&out).into_owned())
    }

    fn cas_of(shared: &Shared, key: &[u8]) -> u64 {
        shared
            .cache(key)
            .peek(key)
            .unwrap()
            .expect("key present")
            .cas()
    }

    #[test]
    fn noop() {
        let s = test_shared();
        assert_eq!(reply(&s, "mn\r\n"), "MN\r\n");
        assert_eq!(reply(&s, "mn\r\nmn\r\n"), "MN\r\nMN\r\n");
    }

    #[test]
    fn get_hit_returns_the_requested_flags_in_order() {
        let s = test_shared();
        assert_eq!(reply(&s, "ms foo 2 F5\r\nhi\r\n"), "HD\r\n");
        let cas = cas_of(&s, b"foo");
        assert_eq!(reply(&s, "mg foo v\r\n"), "VA 2\r\nhi\r\n");
        assert_eq!(reply(&s, "mg foo\r\n"), "HD\r\n");
        assert_eq!(
            reply(&s, "mg foo s f k O123 c\r\n"),
            format!("HD s2 f5 kfoo O123 c{cas}\r\n")
        );
        assert_eq!(
            reply(&s, "mg foo c v f\r\n"),
            format!("VA 2 c{cas} f5\r\nhi\r\n")
        );
        // Read before (above); Terrace keeps no access time, so `l` is 0.
        assert_eq!(reply(&s, "mg foo h l\r\n"), "HD h1 l0\r\n");
        // A new key has not been read; the index counts the first read.
        reply(&s, "ms fresh 1\r\nx\r\n");
        assert_eq!(reply(&s, "mg fresh h\r\n"), "HD h0\r\n");
        assert_eq!(reply(&s, "mg fresh h\r\n"), "HD h1\r\n");
        // No LRU bump is accepted without effect.
        assert_eq!(reply(&s, "mg foo u v\r\n"), "VA 2\r\nhi\r\n");
        // memcached 1.6.18 knows neither E (client CAS) nor x (empty on delete).
        assert_eq!(reply(&s, "mg foo E99\r\n"), "CLIENT_ERROR invalid flag\r\n");
        assert_eq!(
            reply(&s, "md foo x\r\n"),
            "CLIENT_ERROR invalid or duplicate flag\r\n"
        );
        // Without a key a meta command is no command.
        assert_eq!(reply(&s, "mg\r\nmd\r\nma\r\nms\r\n"), "ERROR\r\n".repeat(4));
        assert_eq!(cas_of(&s, b"foo"), cas);
        // Proxy hints are ignored.
        assert_eq!(reply(&s, "mg foo Pxyz L/path v\r\n"), "VA 2\r\nhi\r\n");
    }

    #[test]
    fn get_miss_quiet_and_opaque() {
        let s = test_shared();
        assert_eq!(reply(&s, "mg nope v\r\n"), "EN\r\n");
        assert_eq!(reply(&s, "mg nope v q\r\n"), "");
        assert_eq!(reply(&s, "mg nope v q O1\r\nmn\r\n"), "MN\r\n");
        // Opaque and key come back on a miss too; asked-for item flags do not.
        assert_eq!(reply(&s, "mg nope s Oab k v\r\n"), "EN Oab knope\r\n");
        // Quiet only hides the miss: a hit is answered.
        assert_eq!(reply(&s, "ms foo 1\r\nx\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "mg foo q v\r\n"), "VA 1\r\nx\r\n");
        assert_eq!(reply(&s, "mg foo q\r\n"), "HD\r\n");
        assert_eq!(s.counters.get(Counter::GetMisses), 4);
        assert_eq!(s.counters.get(Counter::GetHits), 2);
    }

    #[test]
    fn get_ignores_a_cas_compare() {
        // As memcached 1.6.18: `C` is parsed and has no effect on `mg`.
        let s = test_shared();
        reply(&s, "ms foo 2\r\nhi\r\n");
        let cas = cas_of(&s, b"foo");
        assert_eq!(reply(&s, &format!("mg foo v C{cas}\r\n")), "VA 2\r\nhi\r\n");
        assert_eq!(
            reply(&s, &format!("mg foo v C{}\r\n", cas + 1)),
            "VA 2\r\nhi\r\n"
        );
    }

    /// The `t<n>` of a reply: the seconds it says are left.
    fn t_of(reply: &str) -> i64 {
        reply
            .split([' ', '\r'])
            .find_map(|token| token.strip_prefix('t')?.parse().ok())
            .unwrap_or_else(|| panic!("no t flag in {reply:?}"))
    }

    #[test]
    fn get_ttl_is_the_items_remaining_life() {
        let s = test_shared();
        reply(&s, "ms foo 2 T100\r\nhi\r\n");
        // Exactly the TTL (less a second if the clock ticked in between).
        let left = t_of(&reply(&s, "mg foo t v\r\n"));
        assert!((99..=100).contains(&left), "t{left}");
        s.pools.advance_clock(50);
        let later = t_of(&reply(&s, "mg foo t\r\n"));
        assert!(
            (left - 51..=left - 50).contains(&later),
            "t{later} after t{left}"
        );
        // T touches where it stands: a t before it shows the TTL before, one after it
        // the TTL just set (as memcached's reply loop).
        let before = t_of(&reply(&s, "mg foo t T100\r\n"));
        assert!(
            (later - 1..=later).contains(&before),
            "t{before} after t{later}"
        );
        assert_eq!(reply(&s, "mg foo T0 t\r\n"), "HD t-1\r\n");
        assert_eq!(reply(&s, "mg foo t\r\n"), "HD t-1\r\n");
        s.pools.advance_clock(200);
        assert_eq!(reply(&s, "mg foo v\r\n"), "VA 2\r\nhi\r\n");
        assert_eq!(reply(&s, "mg foo T10 t s\r\n"), "HD t10 s2\r\n");
        s.pools.advance_clock(11);
        assert_eq!(reply(&s, "mg foo v\r\n"), "EN\r\n");
        // A touch on a miss is a miss.
        assert_eq!(reply(&s, "mg foo T10 t\r\n"), "EN\r\n");
        // A past TTL returns the item once, then it is gone.
        reply(&s, "ms bar 1\r\nb\r\n");
        assert_eq!(reply(&s, "mg bar T-1 v\r\n"), "VA 1\r\nb\r\n");
        assert_eq!(reply(&s, "mg bar v\r\n"), "EN\r\n");
        assert!(s.counters.get(Counter::CmdTouch) >= 4);
    }

    /// Racing clients: exactly one wins each item version, whether the version was just
    /// created (`N`) or invalidated (`md I`); the others see `Z`.
    #[test]
    fn one_client_wins_per_version() {
        let s = test_shared();
        for round in 0..20 {
            let key = format!("race{round}");
            let wins = |request: String| {
                std::thread::scope(|scope| {
                    let replies: Vec<_> = (0..8)
                        .map(|_| scope.spawn(|| reply(&s, &request)))
                        .collect();
                    let replies: Vec<String> =
                        replies.into_iter().map(|h| h.join().unwrap()).collect();
                    for r in &replies {
                        assert!(r.starts_with("HD"), "{r:?}");
                    }
                    replies.iter().filter(|r| r.contains(" W")).count()
                })
            };
            assert_eq!(wins(format!("mg {key} N30\r\n")), 1, "vivify");
            assert_eq!(reply(&s, &format!("md {key} I\r\n")), "HD\r\n");
            assert_eq!(wins(format!("mg {key}\r\n")), 1, "invalidated");
            assert_eq!(reply(&s, &format!("mg {key}\r\n")), "HD Z X\r\n");
        }
    }

    /// A write gives the key a new version: the stale mark stays behind, unread, and the
    /// next `mg` drops it.
    #[test]
    fn a_new_version_is_fresh_and_its_old_marks_go() {
        let s = test_shared();
        reply(&s, "ms k 1\r\na\r\n");
        assert_eq!(reply(&s, "md k I\r\n"), "HD\r\n");
        assert!(!s.marks.is_empty());
        assert_eq!(reply(&s, "ms k 1\r\nb\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "mg k v\r\n"), "VA 1\r\nb\r\n");
        assert!(s.marks.is_empty());
        // A touch keeps the version, and its marks.
        assert_eq!(reply(&s, "md k I\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "touch k 100\r\n"), "TOUCHED\r\n");
        assert_eq!(reply(&s, "mg k T200 v\r\n"), "VA 1 X W\r\nb\r\n");
    }

    #[test]
    fn get_vivifies_on_miss_and_the_creator_wins() {
        let s = test_shared();
        assert_eq!(reply(&s, "mg new N30 s t v\r\n"), "VA 0 s0 t30 W\r\n\r\n");
        // Later clients find the empty item, flagged: someone already won it.
        assert_eq!(reply(&s, "mg new N30 s v\r\n"), "VA 0 s0 Z\r\n\r\n");
        assert_eq!(reply(&s, "mg new h\r\n"), "HD h1 Z\r\n");
        s.pools.advance_clock(31);
        assert_eq!(reply(&s, "mg new v\r\n"), "EN\r\n");
        // N on a hit does nothing.
        reply(&s, "ms foo 1\r\nx\r\n");
        assert_eq!(reply(&s, "mg foo N30 v\r\n"), "VA 1\r\nx\r\n");
        // The won item has a real CAS.
        let out = reply(&s, "mg other N0 c\r\n");
        assert_eq!(out, format!("HD c{} W\r\n", cas_of(&s, b"other")));
    }

    #[test]
    fn base64_keys() {
        let s = test_shared();
        // "Zm9v" is "foo".
        assert_eq!(reply(&s, "ms Zm9v 2 b\r\nhi\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "mg foo v\r\n"), "VA 2\r\nhi\r\n");
        assert_eq!(reply(&s, "mg Zm9v b k v\r\n"), "VA 2 kZm9v b\r\nhi\r\n");
        assert_eq!(reply(&s, "mg Zm9v k b\r\n"), "HD kZm9v b\r\n");
        // Binary bytes (0, 1, 2, 0xff) are a valid key when sent in base64.
        assert_eq!(
            reply(&s, "ms AAEC/w== 1 b k\r\nz\r\n"),
            "HD kAAEC/w== b\r\n"
        );
        assert_eq!(reply(&s, "mg AAEC/w== b v\r\n"), "VA 1\r\nz\r\n");
        // As memcached: padding is required, stray bits in the last group are not.
        assert_eq!(
            reply(&s, "mg AAEC/w b v\r\n"),
            "CLIENT_ERROR error decoding key\r\n"
        );
        reply(&s, "ms YQ== 1 b\r\na\r\n");
        assert_eq!(reply(&s, "mg YW== b v\r\n"), "VA 1\r\na\r\n");
        assert_eq!(
            s.cache(&[0, 1, 2, 0xff])
                .get(&[0, 1, 2, 0xff])
                .unwrap()
                .unwrap()
                .value(),
            b"z"
        );
        assert_eq!(reply(&s, "mg AAEE b k\r\n"), "EN kAAEE b\r\n");
        assert_eq!(reply(&s, "md AAEC/w== b k\r\n"), "HD kAAEC/w== b\r\n");
        assert_eq!(reply(&s, "ma AAEC b k\r\n"), "NF kAAEC b\r\n");
        assert_eq!(
            reply(&s, "mg !!!! b v\r\n"),
            "CLIENT_ERROR error decoding key\r\n"
        );
        // Empty once decoded.
        assert_eq!(
            reply(&s, "mg = b v\r\n"),
            "CLIENT_ERROR error decoding key\r\n"
        );
        // Decoding errors of ms swallow the data.
        assert_eq!(
            reply(&s, "ms !!!! 2 b\r\nhi\r\nmn\r\n"),
            "CLIENT_ERROR error decoding key\r\nMN\r\n"
        );
    }

    #[test]
    fn line_errors() {
        let s = test_shared();
        let long = "k".repeat(251);
        assert_eq!(reply(&s, "mg\r\n"), "ERROR\r\n");
        assert_eq!(
            reply(&s, "me\r\n"),
            "CLIENT_ERROR bad command line format\r\n"
        );
        // 20 tokens are too many (memcached counts a terminating empty one); md and ma
        // say it without "are", and answer every flag error alike.
        let flags = "s t c f k h l u O1 T5 N5 R5 L P q I D1 J1";
        assert_eq!(
            reply(&s, &format!("mg key {flags}\r\n")),
            "CLIENT_ERROR options flags are too long\r\n"
        );
        assert_eq!(
            reply(&s, &format!("md key {flags}\r\n")),
            "CLIENT_ERROR options flags too long\r\n"
        );
        assert_eq!(
            reply(&s, "md key T\r\nma key M\r\nmd key b\r\n"),
            "CLIENT_ERROR invalid or duplicate flag\r\n".repeat(3)
        );
        assert_eq!(
            reply(&s, "mg key M\r\n"),
            "CLIENT_ERROR incorrect length for M token\r\n"
        );
        assert_eq!(
            reply(&s, &format!("mg {long} v\r\n")),
            "CLIENT_ERROR bad command line format\r\n"
        );
        // Control bytes are key bytes, as in memcached's ascii keys.
        assert_eq!(reply(&s, "mg a\x01b v\r\n"), "EN\r\n");
        assert_eq!(reply(&s, "mg foo z\r\n"), "CLIENT_ERROR invalid flag\r\n");
        assert_eq!(
            reply(&s, "mg foo v v\r\n"),
            "CLIENT_ERROR duplicate flag\r\n"
        );
        assert_eq!(
            reply(&s, "mg foo T1 T2\r\n"),
            "CLIENT_ERROR duplicate flag\r\n"
        );
        assert_eq!(
            reply(&s, "mg foo Tx\r\n"),
            "CLIENT_ERROR bad token in command line format\r\n"
        );
        assert_eq!(
            reply(&s, "mg foo T\r\n"),
            "CLIENT_ERROR bad token in command line format\r\n"
        );
        // As memcached's strtol: 64-bit range, then truncated to 32 bits.
        assert_eq!(reply(&s, "mg foo T4294967296\r\n"), "EN\r\n");
        assert_eq!(
            reply(&s, "mg foo T99999999999999999999\r\n"),
            "CLIENT_ERROR bad token in command line format\r\n"
        );
        assert_eq!(
            reply(&s, "md foo C-1\r\n"),
            "CLIENT_ERROR invalid or duplicate flag\r\n"
        );
        let opaque = format!("O{}", "x".repeat(MAX_OPAQUE));
        assert_eq!(
            reply(&s, &format!("mg foo {opaque}\r\n")),
            "CLIENT_ERROR opaque token too long\r\n"
        );
        assert_eq!(
            reply(&s, &format!("mg foo {}\r\n", &opaque[..MAX_OPAQUE])),
            format!("EN {}\r\n", &opaque[..MAX_OPAQUE])
        );
        // 19 tokens are the most memcached takes.
        let many = "s c f k t v h l q u O1 D1 T1 J1 R1 P L";
        assert_eq!(
            reply(&s, &format!("mg foo {many} I\r\n")),
            "CLIENT_ERROR options flags are too long\r\n"
        );
        assert_eq!(reply(&s, &format!("mg foo {many}\r\n")), "");
        // Errors are sent even when quiet.
        assert_eq!(reply(&s, "mg foo q z\r\n"), "CLIENT_ERROR invalid flag\r\n");
        // Every flag error of ma reads the same, as in memcached.
        assert_eq!(
            reply(&s, "ma foo z\r\n"),
            "CLIENT_ERROR invalid or duplicate flag\r\n"
        );
        assert_eq!(
            reply(&s, "ma foo Dx\r\n"),
            "CLIENT_ERROR invalid or duplicate flag\r\n"
        );
        assert_eq!(
            reply(&s, "mg foo Dx\r\n"),
            "CLIENT_ERROR invalid numeric delta value\r\n"
        );
        assert_eq!(reply(&s, "md\r\n"), "ERROR\r\n");
        assert_eq!(reply(&s, "mx foo\r\n"), "ERROR\r\n");
    }

    #[test]
    fn numbers_read_as_memcacheds_strtol_family() {
        assert_eq!(strtol(b"5"), Some(5));
        assert_eq!(strtol(b"\t+5"), Some(5));
        assert_eq!(strtol(b"5\tjunk"), Some(5));
        assert_eq!(strtol(b"-5"), Some(-5));
        assert_eq!(strtol(b"4294967297"), Some(1));
        assert_eq!(strtol(b"2147483648"), Some(-2_147_483_648));
        assert_eq!(strtol(b"99999999999999999999"), None);
        assert_eq!(strtol(b"5x"), None);
        assert_eq!(strtol(b""), None);
        assert_eq!(strtol(b"-"), None);
        assert_eq!(strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(strtoull(b"-0"), Some(0));
        assert_eq!(strtoull(b"-1"), None);
        assert_eq!(strtoull(b"-18446744073709551615"), Some(1));
        assert_eq!(strtoull(b"18446744073709551616"), None);
    }

    #[test]
    fn u_reads_leave_the_item_unread_and_an_expiring_t_hands_out_the_win() {
        let s = test_shared();
        reply(&s, "ms k 1\r\na\r\n");
        assert_eq!(reply(&s, "mg k u\r\nmg k h\r\n"), "HD\r\nHD h0\r\n");
        assert_eq!(reply(&s, "mg k h\r\n"), "HD h1\r\n");
        assert_eq!(
            reply(&s, "mg new N30 u\r\nmg new h\r\n"),
            "HD W\r\nHD h0 Z\r\n"
        );
        // R compares with the TTL the T before it just set: expired now, so it wins.
        reply(&s, "ms e 0\r\n\r\n");
        assert_eq!(reply(&s, "mg e T-1 R1000\r\nmg e\r\n"), "HD W\r\nEN\r\n");
        // ma: an N after an opaque too long still creates the item, without a TTL.
        let long = format!("O{}", "x".repeat(MAX_OPAQUE));
        assert_eq!(
            reply(&s, &format!("ma n {long} N30\r\nma n t v\r\n")),
            "CLIENT_ERROR opaque token too long\r\nVA 1 t-1\r\n1\r\n"
        );
    }

    #[test]
    fn an_overlong_opaque_is_found_where_memcached_finds_it() {
        let s = test_shared();
        let long = format!("O{}", "x".repeat(MAX_OPAQUE));
        // ma: a bad mode is reported first; otherwise the increment happens, then the
        // opaque error replaces the reply (even under q).
        assert_eq!(
            reply(&s, &format!("ma n Mx {long}\r\n")),
            "CLIENT_ERROR invalid mode for ma M token\r\n"
        );
        reply(&s, "ms n 1\r\n5\r\n");
        assert_eq!(
            reply(&s, &format!("ma n q {long}\r\n")),
            "CLIENT_ERROR opaque token too long\r\n"
        );
        assert_eq!(reply(&s, "mg n v\r\n"), "VA 1\r\n6\r\n");
        // mg: N creates the item, but a TTL after the opaque never applies.
        assert_eq!(
            reply(&s, &format!("mg new {long} N30 t\r\n")),
            "CLIENT_ERROR opaque token too long\r\n"
        );
        assert_eq!(reply(&s, "mg new t\r\n"), "HD t-1\r\n");
        // mg: a `T` before the opaque applies to the item `N` after it creates.
        assert_eq!(
            reply(&s, &format!("mg gone T-1 {long} N0\r\n")),
            "CLIENT_ERROR opaque token too long\r\n"
        );
        assert_eq!(reply(&s, "mg gone\r\n"), "EN\r\n");
        // ms: the mode first, then the opaque; the data is swallowed either way.
        assert_eq!(
            reply(&s, &format!("ms m 1 MZ {long}\r\nx\r\nmn\r\n")),
            "CLIENT_ERROR invalid mode for ms M token\r\nMN\r\n"
        );
        // md: before anything is done.
        assert_eq!(
            reply(&s, &format!("md n {long}\r\n")),
            "CLIENT_ERROR opaque token too long\r\n"
        );
        assert_eq!(reply(&s, "mg n v\r\n"), "VA 1\r\n6\r\n");
        // An item mg N created gives its key back raw, even when asked in base64.
        assert_eq!(reply(&s, "mg YWJj b N30 k\r\n"), "HD kabc W\r\n");
    }

    #[test]
    fn set_flags_ttl_and_reply_flags() {
        let s = test_shared();
        assert_eq!(
            reply(&s, "ms foo 2 T1 F7 k O9 s\r\nhi\r\n"),
            "HD kfoo O9\r\n"
        );
        assert_eq!(reply(&s, "mg foo f v\r\n"), "VA 2 f7\r\nhi\r\n");
        let out = reply(&s, "ms foo 3 c\r\nabc\r\n");
        assert_eq!(out, format!("HD c{}\r\n", cas_of(&s, b"foo")));
        assert_eq!(reply(&s, "mg foo f v\r\n"), "VA 3 f0\r\nabc\r\n");
        reply(&s, "ms ttl 1 T1\r\nx\r\n");
        s.pools.advance_clock(2);
        assert_eq!(reply(&s, "mg ttl v\r\n"), "EN\r\n");
        // A negative TTL leaves nothing behind; the store still has a CAS of its own.
        assert_eq!(reply(&s, "ms foo 1 T-1\r\nx\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "mg foo v\r\n"), "EN\r\n");
        let first = reply(&s, "ms foo 1 T-1 c\r\nx\r\n");
        let second = reply(&s, "ms foo 1 T-1 c\r\nx\r\n");
        assert!(
            first.starts_with("HD c") && first != "HD c0\r\n",
            "{first:?}"
        );
        assert_ne!(first, second);
        // An empty value, and I (invalidate) storing as usual.
        assert_eq!(reply(&s, "ms e 0 I\r\n\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "mg e s v\r\n"), "VA 0 s0\r\n\r\n");
        // Flags above 32 bits are cut to 32, as memcached's strtoul does.
        assert_eq!(reply(&s, "ms foo 1 F4294967297\r\nx\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "mg foo f\r\n"), "HD f1\r\n");
        assert_eq!(
            reply(&s, "ms foo 1 F-1\r\nx\r\nmn\r\n"),
            "CLIENT_ERROR bad command line format\r\nMN\r\n"
        );
    }

    #[test]
    fn set_quiet_hides_only_stored() {
        let s = test_shared();
        assert_eq!(reply(&s, "ms foo 2 q\r\nhi\r\nmn\r\n"), "MN\r\n");
        assert_eq!(reply(&s, "ms foo 2 q ME O5\r\nhi\r\n"), "NS O5\r\n");
        assert_eq!(reply(&s, "ms nope 2 q C1\r\nhi\r\n"), "NF\r\n");
        assert_eq!(reply(&s, "ms foo 2 q C1\r\nhi\r\n"), "EX\r\n");
    }

    #[test]
    fn set_modes() {
        let s = test_shared();
        // Add.
        assert_eq!(reply(&s, "ms foo 1 ME\r\na\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "ms foo 1 ME\r\nb\r\n"), "NS\r\n");
        // Replace.
        assert_eq!(reply(&s, "ms bar 1 MR\r\nb\r\n"), "NS\r\n");
        assert_eq!(reply(&s, "ms foo 1 MR\r\nc\r\n"), "HD\r\n");
        // Append and prepend keep the client flags; s is the new size.
        assert_eq!(reply(&s, "ms foo 1 F3\r\nm\r\n"), "HD\r\n");
        // An ms reply carries O, k and c only.
        assert_eq!(reply(&s, "ms foo 2 MA s F9 O1\r\nzz\r\n"), "HD O1\r\n");
        assert_eq!(reply(&s, "ms foo 2 MP\r\naa\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "mg foo f v\r\n"), "VA 5 f3\r\naamzz\r\n");
        assert_eq!(reply(&s, "ms bar 1 MA\r\nx\r\n"), "NS\r\n");
        assert_eq!(reply(&s, "ms bar 1 MP\r\nx\r\n"), "NS\r\n");
        // N does not create the item in append mode (memcached 1.6.18).
        assert_eq!(reply(&s, "ms bar 1 MA N5 F2\r\nx\r\n"), "NS\r\n");
        assert_eq!(reply(&s, "mg bar v\r\n"), "EN\r\n");
        // Set, explicitly.
        assert_eq!(reply(&s, "ms foo 1 MS\r\nS\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "mg foo v\r\n"), "VA 1\r\nS\r\n");
        // Unknown modes refuse the command and swallow its data.
        assert_eq!(
            reply(&s, "ms foo 1 MX\r\nx\r\nmn\r\n"),
            "CLIENT_ERROR invalid mode for ms M token\r\nMN\r\n"
        );
        assert_eq!(
            reply(&s, "ms foo 1 M\r\nx\r\nmn\r\n"),
            "CLIENT_ERROR incorrect length for M token\r\nMN\r\n"
        );
        // Refused before its length is read, the data line is read as a command.
        let long = "k".repeat(251);
        assert_eq!(
            reply(&s, &format!("ms {long} 1\r\nmn\r\n")),
            "CLIENT_ERROR bad command line format\r\nMN\r\n"
        );
    }

    #[test]
    fn set_compares_cas() {
        let s = test_shared();
        assert_eq!(reply(&s, "ms foo 1 C5\r\nx\r\n"), "NF\r\n");
        reply(&s, "ms foo 1\r\na\r\n");
        let cas = cas_of(&s, b"foo");
        assert_eq!(
            reply(&s, &format!("ms foo 1 C{} c\r\nb\r\n", cas + 1)),
            "EX c0\r\n"
        );
        let out = reply(&s, &format!("ms foo 1 C{cas} c\r\nb\r\n"));
        let new_cas = cas_of(&s, b"foo");
        assert_ne!(new_cas, cas);
        assert_eq!(out, format!("HD c{new_cas}\r\n"));
        // Replace with C is a CAS store; add ignores C.
        assert_eq!(reply(&s, &format!("ms foo 1 MR C{cas}\r\nc\r\n")), "EX\r\n");
        assert_eq!(
            reply(&s, &format!("ms foo 1 ME C{new_cas}\r\nc\r\n")),
            "NS\r\n"
        );
        // Append respects C.
        assert_eq!(reply(&s, &format!("ms foo 1 MA C{cas}\r\nc\r\n")), "EX\r\n");
        assert_eq!(
            reply(&s, &format!("ms foo 1 MA C{new_cas}\r\nc\r\n")),
            "HD\r\n"
        );
        assert_eq!(reply(&s, "mg foo v\r\n"), "VA 2\r\nbc\r\n");
        assert_eq!(reply(&s, "ms bar 1 MA C7\r\nc\r\n"), "NS\r\n");
        assert_eq!(s.counters.get(Counter::CasBadval), 2);
    }

    #[test]
    fn set_too_large_is_swallowed_and_removes_the_old_value() {
        let s = test_shared();
        reply(&s, "ms foo 1\r\nx\r\n");
        let n = s.limits.max_value + 1;
        let head = format!("ms foo {n} T0\r\n");
        let (st, out) = step(&s, head.as_bytes());
        assert_eq!(out, "SERVER_ERROR object too large for cache\r\n");
        assert_eq!(
            st,
            Step::Swallow {
                consumed: head.len(),
                skip: n + 2
            }
        );
        let mut input = head.into_bytes();
        input.extend(std::iter::repeat_n(b'v', n));
        input.extend_from_slice(b"\r\nmg foo v\r\n");
        assert_eq!(
            run(&s, &input).0,
            "SERVER_ERROR object too large for cache\r\nEN\r\n"
        );
        // Lengths memcached cannot parse are a format error, with nothing to swallow.
        for bad in ["x", "-1", "2147483646", "99999999999999999999999"] {
            let line = format!("ms foo {bad}\r\n");
            let (st, out) = step(&s, line.as_bytes());
            assert_eq!(out, "CLIENT_ERROR bad command line format\r\n", "{bad}");
            assert_eq!(
                st,
                Step::Done {
                    consumed: line.len()
                }
            );
        }
        let (st, _) = step(&s, b"ms foo 2147483645\r\n");
        assert!(matches!(
            st,
            Step::Swallow {
                skip: 2147483647,
                ..
            }
        ));
        let (st, out) = step(&s, b"ms foo\r\n");
        assert_eq!(out, "CLIENT_ERROR bad command line format\r\n");
        assert_eq!(st, Step::Done { consumed: 8 });
    }

    #[test]
    fn set_needs_its_whole_data_block() {
        let s = test_shared();
        let (st, out) = step(&s, b"ms foo 5\r\nhel");
        assert_eq!(
            st,
            Step::NeedMore {
                total: Some(10 + 7)
            }
        );
        assert!(out.is_empty());
        let (st, _) = step(&s, b"ms foo 5\r\nhello\r");
        assert_eq!(st, Step::NeedMore { total: Some(17) });
        let (st, out) = step(&s, b"ms foo 5\r\nhello\r\nmn\r\n");
        assert_eq!(st, Step::Done { consumed: 17 });
        assert_eq!(out, "HD\r\n");
        // A block without its terminator: the declared bytes are consumed, as memcached.
        let (st, out) = step(&s, b"ms foo 2 q\r\nabcd\r\n");
        assert_eq!(out, "CLIENT_ERROR bad data chunk\r\n");
        assert_eq!(st, Step::Done { consumed: 12 + 4 });
        // Flag errors swallow the data.
        assert_eq!(
            reply(&s, "ms foo 2 zz\r\nhi\r\nmn\r\n"),
            "CLIENT_ERROR invalid flag\r\nMN\r\n"
        );
        let (st, _) = step(&s, b"ms foo 2 zz\r\n");
        assert_eq!(
            st,
            Step::Swallow {
                consumed: 13,
                skip: 4
            }
        );
        // Incomplete lines are the caller's to wait for.
        assert!(split_line(b"mg foo v").is_err());
    }

    #[test]
    fn delete() {
        let s = test_shared();
        assert_eq!(reply(&s, "md foo\r\n"), "NF\r\n");
        assert_eq!(reply(&s, "md foo q O1 k\r\n"), "NF O1 kfoo\r\n");
        reply(&s, "ms foo 1\r\nx\r\n");
        assert_eq!(reply(&s, "md foo O1 k\r\n"), "HD O1 kfoo\r\n");
        assert_eq!(reply(&s, "mg foo\r\n"), "EN\r\n");
        reply(&s, "ms foo 1\r\nx\r\n");
        assert_eq!(reply(&s, "md foo q\r\nmn\r\n"), "MN\r\n");
        // CAS compare.
        reply(&s, "ms foo 1\r\nx\r\n");
        let cas = cas_of(&s, b"foo");
        assert_eq!(reply(&s, &format!("md foo C{}\r\n", cas + 1)), "EX\r\n");
        assert_eq!(reply(&s, &format!("md foo C{cas} q\r\n")), "");
        assert_eq!(reply(&s, &format!("md foo C{cas}\r\n")), "NF\r\n");
        // Invalidate keeps the item, stale, with a new CAS and T's TTL; the first reader
        // wins the recache, later ones see the token was sent.
        reply(&s, "ms foo 1\r\nx\r\n");
        let before = cas_of(&s, b"foo");
        assert_eq!(reply(&s, "md foo I T30 q\r\n"), "");
        assert_ne!(cas_of(&s, b"foo"), before);
        assert_eq!(reply(&s, "mg foo v\r\n"), "VA 1 X W\r\nx\r\n");
        assert_eq!(reply(&s, "mg foo s\r\n"), "HD s1 Z X\r\n");
        assert!((29..=30).contains(&t_of(&reply(&s, "mg foo t\r\n"))));
        assert_eq!(reply(&s, "md nope I\r\n"), "NF\r\n");
        assert_eq!(reply(&s, "md foo I C1\r\n"), "EX\r\n");
        // A plain delete removes a stale item.
        assert_eq!(reply(&s, "md foo\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "mg foo\r\n"), "EN\r\n");
        assert_eq!(s.counters.get(Counter::DeleteHits), 4);
    }

    #[test]
    fn arithmetic() {
        let s = test_shared();
        assert_eq!(reply(&s, "ma n\r\n"), "NF\r\n");
        assert_eq!(reply(&s, "ma n q O7 k\r\n"), "NF O7 kn\r\n");
        // Autovivify with an initial value, then count.
        assert_eq!(reply(&s, "ma n N0 J10 v\r\n"), "VA 2\r\n10\r\n");
        assert_eq!(reply(&s, "ma n v\r\n"), "VA 2\r\n11\r\n");
        assert_eq!(reply(&s, "ma n\r\n"), "HD\r\n");
        assert_eq!(reply(&s, "ma n D10 v\r\n"), "VA 2\r\n22\r\n");
        assert_eq!(reply(&s, "ma n MD D5 v\r\n"), "VA 2\r\n17\r\n");
        assert_eq!(reply(&s, "ma n M- D100 v\r\n"), "VA 1\r\n0\r\n");
        assert_eq!(reply(&s, "ma n M+ v\r\n"), "VA 1\r\n1\r\n");
        assert_eq!(reply(&s, "ma n MI v\r\n"), "VA 1\r\n2\r\n");
        // Incr wraps at 2^64.
        assert_eq!(
            reply(&s, "ma n D18446744073709551615 v\r\n"),
            "VA 1\r\n1\r\n"
        );
        // Quiet hides any success.
        assert_eq!(reply(&s, "ma n q v\r\nmn\r\n"), "MN\r\n");
        // A shorter number is written over the old one, padded (as memcached does).
        assert_eq!(reply(&s, "mg n v\r\n"), "VA 2\r\n2 \r\n");
        // Returned flags.
        let out = reply(&s, "ma n c k O1\r\n");
        assert_eq!(out, format!("HD c{} kn O1\r\n", cas_of(&s, b"n")));
        assert_eq!(reply(&s, "ma n t v\r\n"), "VA 1 t-1\r\n4\r\n");
        assert_eq!(reply(&s, "ma n t T100 v\r\n"), "VA 1 t-1\r\n5\r\n");
        assert_eq!(reply(&s, "ma n T100 t\r\n"), "HD t100\r\n");
        let out = reply(&s, "ma n T0 t c\r\n");
        assert_eq!(out, format!("HD t-1 c{}\r\n", cas_of(&s, b"n")));
        // Autovivified items get N's TTL.
        assert_eq!(reply(&s, "ma m N50 t v\r\n"), "VA 1 t50\r\n0\r\n");
        s.pools.advance_clock(51);
        assert_eq!(reply(&s, "ma m\r\n"), "NF\r\n");
        // CAS compare.
        let cas = cas_of(&s, b"n");
        assert_eq!(reply(&s, &format!("ma n C{}\r\n", cas + 1)), "EX\r\n");
        assert_eq!(reply(&s, &format!("ma n C{cas} v\r\n")), "VA 1\r\n8\r\n");
        assert_eq!(reply(&s, "ma nope C5\r\n"), "NF\r\n");
        // Errors.
        reply(&s, "ms t 3\r\nabc\r\n");
        assert_eq!(
            reply(&s, "ma t q\r\n"),
            "CLIENT_ERROR cannot increment or decrement non-numeric value\r\n"
        );
        assert_eq!(
            reply(&s, "ma n MX\r\n"),
            "CLIENT_ERROR invalid mode for ma M token\r\n"
        );
        assert_eq!(
            reply(&s, "ma n v v\r\n"),
            "CLIENT_ERROR invalid or duplicate flag\r\n"
        );
        assert!(s.counters.get(Counter::IncrHits) >= 8);
        assert_eq!(s.counters.get(Counter::DecrHits), 2);
    }

    #[test]
    fn debug() {
        let s = test_shared();
        assert_eq!(reply(&s, "me foo\r\n"), "EN\r\n");
        reply(&s, "ms foo 2\r\nhi\r\n");
        let cas = cas_of(&s, b"foo");
        let expected = format!("ME foo exp=-1 la=0 cas={cas} fetch=no cls=1 size=2 tier=0\r\n");
        assert_eq!(reply(&s, "me foo\r\n"), expected);
        // Other tokens are ignored, as memcached.
        assert_eq!(reply(&s, "me foo zz\r\n"), expected);
        let expected = format!("ME Zm9v exp=-1 la=0 cas={cas} fetch=no cls=1 size=2 tier=0\r\n");
        assert_eq!(reply(&s, "me Zm9v b\r\n"), expected);
        reply(&s, "ms bar 1 T3600\r\nb\r\n");
        let line = reply(&s, "me bar\r\n");
        let exp: u32 = line
            .split(' ')
            .find_map(|t| t.strip_prefix("exp=")?.parse().ok())
            .unwrap_or_else(|| panic!("no exp= in {line:?}"));
        assert!((3600 - 450..=3600).contains(&exp), "{line}");
        // `me` reads no counted get.
        assert_eq!(s.counters.get(Counter::CmdGet), 0);
    }

    #[test]
    fn pipelined_quiet_gets_end_with_noop() {
        let s = test_shared();
        reply(&s, "ms b 1\r\n2\r\n");
        assert_eq!(
            reply(&s, "mg a v q O1\r\nmg b v q O2 k\r\nmg c v q O3\r\nmn\r\n"),
            "VA 1 O2 kb\r\n2\r\nMN\r\n"
        );
    }

    fn check_step(step: Step, len: usize, line: usize, max_value: usize) -> Result<(), String> {
        let ok = match step {
            Step::Done { consumed } => consumed > 0 && consumed <= len,
            Step::Swallow { consumed, .. } | Step::Close { consumed } => consumed <= len,
            Step::NeedMore { total } => total.is_none_or(|t| t > len && t <= line + max_value + 2),
            Step::Resume { .. } => false,
        };
        if ok {
            Ok(())
        } else {
            Err(format!("{step:?} for {len} input bytes"))
        }
    }

    proptest::proptest! {
        #[test]
        fn meta_lines_never_panic(
            words in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::prelude::Just("mg".to_string()),
                    proptest::prelude::Just("ms".to_string()),
                    proptest::prelude::Just("md".to_string()),
                    proptest::prelude::Just("ma".to_string()),
                    proptest::prelude::Just("mn".to_string()),
                    proptest::prelude::Just("me".to_string()),
                    proptest::prelude::Just("Zm9v".to_string()),
                    "[bcfhklqstuvxIPL]",
                    "[OTNRCEFMJD]-?[0-9A-Za-z+=/]{0,22}",
                    "-?[0-9]{1,21}",
                    "[a-z]{1,4}",
                    proptest::prelude::Just("\r\n".to_string()),
                ],
                0..26,
            ),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let s = test_shared();
            let mut input = words.join(" ").into_bytes();
            input.extend_from_slice(b"\r\n");
            input.extend_from_slice(&tail);
            let mut at = 0;
            while at < input.len() {
                let Ok(line) = split_line(&input[at..]) else { break };
                let mut out = Vec::new();
                let step = handle(&s, line, &input[at..], &mut out);
                let checked = check_step(step, input.len() - at, line.consumed, s.limits.max_value);
                proptest::prop_assert!(checked.is_ok(), "{:?}", checked);
                match step {
                    Step::Done { consumed } => at += consumed,
                    _ => break,
                }
            }
        }

        #[test]
        fn raw_bytes_never_panic(
            head in proptest::sample::select(vec!["mg ", "ms ", "md ", "ma ", "me ", "mn ", "ms k 3 "]),
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
        ) {
            let s = test_shared();
            let mut input = head.as_bytes().to_vec();
            input.extend_from_slice(&bytes);
            input.extend_from_slice(b"\n");
            let line = split_line(&input);
            proptest::prop_assert!(input.len() < MAX_LINE && line.is_ok());
            if let Ok(line) = line {
                let mut out = Vec::new();
                let step = handle(&s, line, &input, &mut out);
                let checked = check_step(step, input.len(), line.consumed, s.limits.max_value);
                proptest::prop_assert!(checked.is_ok(), "{:?}", checked);
            }
        }
    }
}

//! The wire protocols, as pure functions from input bytes to reply bytes: no sockets, no
//! async, so every parser is tested and fuzzed on byte slices.
//!
//! A connection's loop (`conn.rs`) keeps an input buffer and calls [`handle`] until it
//! asks for more bytes; each call handles at most one request and appends its reply (if
//! any) to `out`, which the loop writes out when the input runs dry (so pipelined and
//! quiet requests batch into one write).
//!
//! Invariants every protocol keeps:
//! - never panic, whatever the bytes (the fuzz tests feed garbage);
//! - ask for more input only up to a bound: a command line is at most
//!   [`MAX_LINE`] bytes (a longer `get` line is handled a chunk of keys at a time,
//!   [`Step::Resume`]), a request body at most what the limits allow; anything larger is
//!   answered as memcached answers it and either swallowed without buffering
//!   ([`Step::Swallow`]) or the connection is closed ([`Step::Close`]);
//! - the first byte of a connection picks its protocol: `0x80` is binary, anything else
//!   text (ascii and meta commands share the text protocol, as in memcached).

pub mod binary;
pub mod flash_keys;
pub mod meta;
pub mod text;

use crate::shared::Shared;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use terrace_cache::cache::number;
use terrace_cache::Guard;

/// Longest text command line accepted, `\r\n` included: memcached's read buffer (16 KiB),
/// the longest line memcached can ever act on (it closes the connection, without a
/// reply, when its buffer holds more than 2 KiB and no `\n`). Longer `get`/`gets` lines
/// are accepted all the same, handled a chunk of keys at a time (`text.rs`).
pub const MAX_LINE: usize = 16 * 1024;

/// Reply bytes one call may append before a multi-key request yields ([`Step::Resume`]).
pub const REPLY_BUDGET: usize = 256 * 1024;

/// Values at least this large may be sent from the cache in place (see [`Replies`]).
pub const IN_PLACE_MIN: usize = 4096;

/// A connection's pending reply bytes, and (when the connection's loop can send them
/// that way) values of `get`/`gets` hits left in the cache and referenced, not copied.
///
/// A referenced value keeps its [`Guard`] (a pin of its segment: the bytes cannot change
/// or go away while it lives) and sits, in the reply stream, before `bytes[at..]`.
/// Lengths and truncation count the referenced values, so budgets see the whole reply.
/// It derefs to the byte buffer, so formatting code appends with `Vec`'s methods; only
/// [`Replies::len`] and [`Replies::truncate`] are its own.
///
/// Invariant: guards are held only for as long as a send that cannot wait on the
/// client (`uring`) — the loop calls [`Replies::flatten`] before replies are left
/// waiting — so a slow client never keeps a segment pinned.
#[derive(Default)]
pub struct Replies<'s> {
    bytes: Vec<u8>,
    /// `(at, value)`: the value goes before `bytes[at..]`; `at` ascending.
    values: Vec<(usize, Referenced<'s>)>,
    /// Sum of the referenced values' lengths.
    referenced: usize,
    /// When set, values of [`IN_PLACE_MIN`] bytes or more are referenced rather than
    /// copied, as long as the budget lasts.
    in_place: Option<Arc<PinBudget>>,
}

/// How many values one worker's replies may reference in place at once. A pinned
/// segment cannot be reused, and the worker that pins it may itself need a free segment
/// for a `set` before its pins go (one round of its ring), so it may pin only a small
/// share of a tier.
#[derive(Debug)]
pub struct PinBudget {
    left: AtomicUsize,
}

impl PinBudget {
    pub fn new(values: usize) -> Arc<PinBudget> {
        Arc::new(PinBudget {
            left: AtomicUsize::new(values),
        })
    }

    fn take(&self) -> bool {
        self.left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// A value referenced in place: its guard, and the budget it gives back when dropped.
struct Referenced<'s> {
    guard: Guard<'s>,
    budget: Arc<PinBudget>,
}

impl Drop for Referenced<'_> {
    fn drop(&mut self) {
        self.budget.left.fetch_add(1, Ordering::Relaxed);
    }
}

impl Replies<'_> {
    /// The whole reply, copied (for comparisons and tests).
    pub fn to_vec(&self) -> Vec<u8> {
        let mut all = Vec::with_capacity(self.len());
        self.slices_from(0, |part| all.extend_from_slice(part));
        all
    }
}

impl<T: AsRef<[u8]>> PartialEq<T> for Replies<'_> {
    fn eq(&self, other: &T) -> bool {
        self.to_vec() == other.as_ref()
    }
}

impl std::fmt::Debug for Replies<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.to_vec()))
    }
}

impl std::ops::Deref for Replies<'_> {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.bytes
    }
}

impl std::ops::DerefMut for Replies<'_> {
    fn deref_mut(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }
}

impl<'s> Replies<'s> {
    /// Replies that reference large values in place (for a loop that sends them so),
    /// within `budget`.
    pub fn in_place(budget: Arc<PinBudget>) -> Replies<'s> {
        Replies {
            in_place: Some(budget),
            ..Replies::default()
        }
    }

    /// Appends a hit's value: referenced when large and the budget allows, else copied.
    pub fn push_value(&mut self, guard: Guard<'s>) {
        let len = guard.value().len();
        if let Some(budget) = self.in_place.as_ref().filter(|_| len >= IN_PLACE_MIN) {
            if budget.take() {
                self.referenced += len;
                let budget = Arc::clone(budget);
                self.values
                    .push((self.bytes.len(), Referenced { guard, budget }));
                return;
            }
        }
        self.bytes.extend_from_slice(guard.value());
    }

    /// The reply's length, referenced values included.
    pub fn len(&self) -> usize {
        self.bytes.len() + self.referenced
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Cuts the reply to its first `len` bytes (referenced values included), which must
    /// not fall inside a referenced value.
    pub fn truncate(&mut self, len: usize) {
        while let Some((at, value)) = self.values.last() {
            let value_len = value.guard.value().len();
            let starts = at + self.referenced - value_len;
            if starts < len {
                break;
            }
            self.referenced -= value_len;
            self.values.pop();
        }
        self.bytes.truncate(len - self.referenced);
    }

    /// Exchanges the replies of `self` and `other`; each keeps its own mode.
    pub fn swap_contents(&mut self, other: &mut Replies<'s>) {
        std::mem::swap(&mut self.bytes, &mut other.bytes);
        std::mem::swap(&mut self.values, &mut other.values);
        std::mem::swap(&mut self.referenced, &mut other.referenced);
    }

    /// Whether any value is referenced in place.
    pub fn has_references(&self) -> bool {
        !self.values.is_empty()
    }

    /// Copies the referenced values into the byte buffer and lets their segments go.
    pub fn flatten(&mut self) {
        if self.values.is_empty() {
            return;
        }
        let mut flat = Vec::with_capacity(self.len());
        let mut from = 0;
        for (at, value) in self.values.drain(..) {
            flat.extend_from_slice(&self.bytes[from..at]);
            flat.extend_from_slice(value.guard.value());
            from = at;
        }
        flat.extend_from_slice(&self.bytes[from..]);
        self.bytes = flat;
        self.referenced = 0;
    }

    /// The reply from byte `skip` on, as slices in order (for a vectored send).
    pub fn slices_from(&self, skip: usize, mut each: impl FnMut(&[u8])) {
        let mut skip = skip;
        let mut from = 0;
        let mut emit = |part: &[u8]| {
            if skip >= part.len() {
                skip -= part.len();
            } else {
                each(&part[skip..]);
                skip = 0;
            }
        };
        for (at, value) in &self.values {
            emit(&self.bytes[from..*at]);
            emit(value.guard.value());
            from = *at;
        }
        emit(&self.bytes[from..]);
    }

    /// Empties the reply (dropping its guards), keeping at most `keep` bytes of capacity.
    pub fn clear_keeping(&mut self, keep: usize) {
        self.values.clear();
        self.referenced = 0;
        self.bytes.clear();
        if self.bytes.capacity() > keep {
            self.bytes.shrink_to(keep);
        }
    }
}

/// What the connection loop does after one call of a protocol handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// One request handled, its reply (if any) appended: drop `consumed` input bytes.
    Done { consumed: usize },
    /// The request is incomplete. `total`: the whole request's length from the start of
    /// the input, when known (so the loop can reserve it); always bounded by the limits.
    NeedMore { total: Option<usize> },
    /// An error reply was appended for a request whose body is too large to buffer:
    /// drop `consumed` bytes, then discard the next `skip` bytes as they arrive.
    Swallow { consumed: usize, skip: usize },
    /// Append nothing more: drop `consumed` bytes, write out what was replied so far and
    /// close (`quit`, or input that cannot be resynchronised).
    Close { consumed: usize },
    /// Part of a request was handled and its reply is large: write the reply out, then
    /// handle the rest, which is the request's first `prefix` bytes followed by what
    /// comes after its first `consumed` bytes (a multi-key get resumes at its next key,
    /// so one request never buffers more than about [`REPLY_BUDGET`] of values).
    Resume { prefix: usize, consumed: usize },
}

/// Which protocol a connection speaks, fixed by its first byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Text,
    Binary,
}

impl Protocol {
    /// The protocol of a connection whose first input byte is `first`.
    pub fn detect(first: u8) -> Protocol {
        if first == binary::REQUEST_MAGIC {
            Protocol::Binary
        } else {
            Protocol::Text
        }
    }
}

/// The flash reads the request at the start of `input` would wait for (see
/// [`flash_keys`]); `None` when it would wait for none.
pub fn flash_fetch(shared: &Shared, proto: Protocol, input: &[u8]) -> Option<crate::shared::Fetch> {
    let mut fetch = crate::shared::Fetch::default();
    flash_keys::for_each_key(proto, input, |key| shared.add_flash_fetch(key, &mut fetch));
    (!fetch.is_empty()).then_some(fetch)
}

/// Handles at most one request at the start of `input` (non-empty).
pub fn handle<'s>(
    shared: &'s Shared,
    proto: Protocol,
    input: &[u8],
    out: &mut Replies<'s>,
) -> Step {
    match proto {
        Protocol::Text => text::handle(shared, input, out),
        Protocol::Binary => binary::handle(shared, input, out),
    }
}

/// A text command line found at the start of the input.
#[derive(Clone, Copy, Debug)]
pub struct Line<'a> {
    /// The line without its `\n` (and without a `\r` before it).
    pub text: &'a [u8],
    /// Bytes up to and including the `\n`.
    pub consumed: usize,
}

/// Why no whole command line is at the start of the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineError {
    /// More input may complete it.
    Incomplete,
    /// No `\n` within [`MAX_LINE`] bytes.
    TooLong,
}

/// A storage command's data block is not followed by `\r\n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadChunk;

/// The first line of `input`.
pub fn split_line(input: &[u8]) -> Result<Line<'_>, LineError> {
    let window = &input[..input.len().min(MAX_LINE)];
    match window.iter().position(|&b| b == b'\n') {
        Some(nl) => {
            let text = &input[..nl];
            let text = text.strip_suffix(b"\r").unwrap_or(text);
            Ok(Line {
                text,
                consumed: nl + 1,
            })
        }
        None if input.len() >= MAX_LINE => Err(LineError::TooLong),
        None => Err(LineError::Incomplete),
    }
}

/// The body of a text storage command: `len` data bytes then `\r\n`, starting at `start`.
/// `Ok(None)`: not all here yet.
pub fn data_block(input: &[u8], start: usize, len: usize) -> Result<Option<&[u8]>, BadChunk> {
    let end = start.checked_add(len).ok_or(BadChunk)?;
    let Some(rest) = input.get(end..) else {
        return Ok(None);
    };
    if rest.len() < 2 {
        return Ok(None);
    }
    if &rest[..2] != b"\r\n" {
        return Err(BadChunk);
    }
    Ok(Some(&input[start..end]))
}

/// Appends the decimal digits of `n`.
pub fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// Parses an unsigned decimal (ASCII digits only, no sign, no spaces), as memcached's
/// `safe_strtoull`.
pub fn parse_u64(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 20 {
        return None;
    }
    let mut n: u64 = 0;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some(n)
}

/// Parses a signed decimal (optional leading `-`).
pub fn parse_i64(b: &[u8]) -> Option<i64> {
    match b.strip_prefix(b"-") {
        Some(digits) => {
            let n = parse_u64(digits)?;
            if n <= i64::MAX as u64 + 1 {
                Some((n as i128).wrapping_neg() as i64)
            } else {
                None
            }
        }
        None => i64::try_from(parse_u64(b)?).ok(),
    }
}

/// memcached's `safe_strtoull` (the one C `strtoull` reading the cache's incr/decr
/// uses too): leading white space, an optional sign, digits, then the end of the token,
/// white space or a NUL; a minus sign is refused only when the wrapped result has its
/// top bit set (so `-0` is 0, and `-1` is refused).
pub use terrace_cache::cache::number::strtoull;

/// memcached's `safe_strtoul` into a `uint32_t`: [`strtoull`] on a 64-bit `long`, then
/// truncated to 32 bits (so `4294967296` reads as 0, as memcached 1.6 stores it).
pub fn strtoul32(b: &[u8]) -> Option<u32> {
    strtoull(b).map(|n| n as u32)
}

/// memcached's `safe_strtol` into an `int32_t`: `strtol` on a 64-bit `long` (range
/// checked there), then truncated to 32 bits (so `2147483648` reads as `-2147483648`).
pub fn strtol32(b: &[u8]) -> Option<i32> {
    let (negative, n) = number::strto(b)?;
    let n: i64 = if negative {
        if n > i64::MAX as u64 + 1 {
            return None;
        }
        (n as i64).wrapping_neg()
    } else {
        i64::try_from(n).ok()?
    };
    Some(n as i32)
}

/// Test support: every text request in `input` handled as the connection loop would,
/// shared by the text and meta tests; returns the replies and the last step.
#[cfg(test)]
pub(crate) fn drive_text(shared: &Shared, input: &[u8]) -> (String, Step) {
    let mut input = input.to_vec();
    let mut out = Replies::default();
    let mut at = 0;
    let mut skip = 0usize;
    loop {
        if skip > 0 {
            let n = skip.min(input.len() - at);
            at += n;
            skip -= n;
        }
        if at >= input.len() {
            return (
                String::from_utf8_lossy(&out).into_owned(),
                Step::NeedMore { total: None },
            );
        }
        let step = text::handle(shared, &input[at..], &mut out);
        match step {
            Step::Done { consumed } => at += consumed,
            Step::Swallow { consumed, skip: s } => {
                at += consumed;
                skip = s;
            }
            Step::Resume { prefix, consumed } => {
                input.copy_within(at..at + prefix, at + consumed - prefix);
                at += consumed - prefix;
            }
            Step::NeedMore { .. } | Step::Close { .. } => {
                return (String::from_utf8_lossy(&out).into_owned(), step)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded() {
        assert_eq!(split_line(b"get a\r\nrest").unwrap().text, b"get a");
        assert_eq!(split_line(b"get a\r\nrest").unwrap().consumed, 7);
        assert_eq!(split_line(b"get a\nx").unwrap().text, b"get a");
        assert_eq!(split_line(b"get a").unwrap_err(), LineError::Incomplete);
        assert_eq!(
            split_line(&vec![b'a'; MAX_LINE]).unwrap_err(),
            LineError::TooLong
        );
    }

    #[test]
    fn numbers() {
        let mut out = Replies::default();
        for n in [0u64, 7, 10, 12345, u64::MAX] {
            out.clear();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
            assert_eq!(parse_u64(&out), Some(n));
        }
        assert_eq!(parse_u64(b"18446744073709551616"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b"1x"), None);
        assert_eq!(parse_i64(b"-1"), Some(-1));
        assert_eq!(parse_i64(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_i64(b"9223372036854775808"), None);
        assert_eq!(parse_i64(b"-"), None);
    }

    #[test]
    fn numbers_read_as_memcached_reads_them() {
        assert_eq!(strtoull(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(strtoull(b"18446744073709551616"), None);
        assert_eq!(strtoull(b"+5"), Some(5));
        assert_eq!(strtoull(b"\t5"), Some(5));
        assert_eq!(strtoull(b"5\tx"), Some(5));
        assert_eq!(strtoull(b"5x"), None);
        assert_eq!(strtoull(b"-0"), Some(0));
        assert_eq!(strtoull(b"-1"), None);
        assert_eq!(strtoull(b"-18446744073709551615"), Some(1));
        assert_eq!(strtoull(b""), None);
        assert_eq!(strtoull(b"-"), None);
        // A NUL ends the C string memcached scans, as white space does.
        assert_eq!(strtoull(b"5\0x"), Some(5));
        assert_eq!(strtol32(b"-5\0x"), Some(-5));
        assert_eq!(strtoul32(b"4294967296"), Some(0));
        assert_eq!(strtoul32(b"4294967295"), Some(u32::MAX));
        assert_eq!(strtol32(b"2147483648"), Some(i32::MIN));
        assert_eq!(strtol32(b"-1"), Some(-1));
        assert_eq!(strtol32(b"9223372036854775807"), Some(-1));
        assert_eq!(strtol32(b"9223372036854775808"), None);
        assert_eq!(strtol32(b"-9223372036854775808"), Some(0));
        assert_eq!(strtol32(b"-9223372036854775809"), None);
    }

    #[test]
    fn data_blocks_need_their_terminator() {
        assert_eq!(data_block(b"xxabc\r\n", 2, 3), Ok(Some(&b"abc"[..])));
        assert_eq!(data_block(b"xxabc\r", 2, 3), Ok(None));
        assert_eq!(data_block(b"xxabcde", 2, 3), Err(BadChunk));
        assert_eq!(data_block(b"xx", 2, usize::MAX), Err(BadChunk));
    }
}

#[cfg(test)]
mod replies_tests {
    use super::{PinBudget, Replies, IN_PLACE_MIN};
    use crate::shared::test_shared;

    #[test]
    fn large_values_are_referenced_small_ones_copied_and_the_stream_is_the_same() {
        let s = test_shared();
        let big = vec![b'B'; IN_PLACE_MIN * 3];
        let mut request = b"set big 0 0 12288\r\n".to_vec();
        request.extend_from_slice(&big);
        request.extend_from_slice(b"\r\nset small 0 0 5\r\nsmall\r\n");
        assert_eq!(super::drive_text(&s, &request).0, "STORED\r\nSTORED\r\n");

        let mut copied = Replies::default();
        let budget = PinBudget::new(8);
        let mut referenced = Replies::in_place(budget.clone());
        for out in [&mut copied, &mut referenced] {
            super::handle(&s, super::Protocol::Text, b"get big small big\r\n", out);
        }
        assert!(!copied.has_references());
        assert!(referenced.has_references());
        assert_eq!(referenced.len(), copied.len());
        assert_eq!(referenced.to_vec(), copied.to_vec());
        // The byte buffer holds everything but the two big values.
        assert_eq!(referenced.as_slice().len(), copied.len() - 2 * big.len());

        // Pieces from any offset give the rest of the stream.
        for skip in [0, 1, 20, 30, 5000, copied.len() - 6, copied.len()] {
            let mut rest = Vec::new();
            referenced.slices_from(skip, |part| {
                assert!(!part.is_empty());
                rest.extend_from_slice(part)
            });
            assert_eq!(rest, copied[skip..], "from {skip}");
        }

        // Truncation drops the references past the cut; flattening keeps the stream.
        let whole = copied.to_vec();
        let head = b"VALUE big 0 12288\r\n".len();
        let mut cut = Replies::in_place(budget.clone());
        super::handle(
            &s,
            super::Protocol::Text,
            b"get big small big\r\n",
            &mut cut,
        );
        cut.truncate(head);
        assert!(!cut.has_references());
        assert_eq!(cut.to_vec(), whole[..head]);
        referenced.flatten();
        assert!(!referenced.has_references());
        assert_eq!(referenced.as_slice(), whole.as_slice());
        drop(cut);
        assert_eq!(budget.left.load(std::sync::atomic::Ordering::Relaxed), 8);

        // An exhausted budget copies: one reference left, the second big value copied.
        let budget = PinBudget::new(1);
        let mut short = Replies::in_place(budget.clone());
        super::handle(
            &s,
            super::Protocol::Text,
            b"get big small big\r\n",
            &mut short,
        );
        assert_eq!(short.values.len(), 1);
        assert_eq!(short.to_vec(), whole);
        drop(short);
        assert_eq!(budget.left.load(std::sync::atomic::Ordering::Relaxed), 1);
    }
}

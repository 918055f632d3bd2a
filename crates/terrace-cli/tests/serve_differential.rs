//! `terrace serve` against memcached 1.6 itself: the same bytes sent to both, the replies
//! compared byte for byte. memcached (Debian package `memcached`, 1.6.18) runs on its own
//! loopback port (`-p PORT -U 0 -l 127.0.0.1 -m 64 -t 2`), Terrace with the tests' usual
//! two tiers; each stream uses keys no other stream uses, so streams run in parallel.
//!
//! Three parts:
//! - [`CASES`]: a table of named streams, every command and flag of memcached's
//!   `protocol.txt` and their error paths; [`COVERAGE`] maps each command and flag to
//!   the cases that exercise it (a test checks that every name it lists exists, and
//!   that every case is listed);
//! - property-based streams ([`differential::gen`]): at least [`GENERATED`] streams per
//!   run (ascii 60%, binary 25%, meta 15%), shrunk to a minimal stream on failure;
//! - regression cases (names starting `regression_`): differences the generators found,
//!   kept once fixed (the table's own cases pin the ones it found).
//!
//! Intended differences: the comparison applies exactly these, nothing else
//! (`differential::normalise`):
//! 1. CAS values: each server numbers its own; they are compared by order of first
//!    appearance within a stream (`cas#1`, `cas#2`...), so "the same item has the same
//!    CAS" and "a write changes the CAS" are still checked.
//! 2. `version` / binary VERSION: Terrace says `1.6.18-terrace-<its version>`.
//! 3. `stats` values and keys, ascii and binary: each server reports its own counters
//!    (only the framing is compared: a run of `STAT` lines then `END`).
//! 4. meta `t` (remaining TTL) and `l` (seconds since the last access) values, and the
//!    fields of `me` (meta debug): a second may tick between the two servers (or, for
//!    `l`, between memcached's write and read; Terrace keeps no access time and says 0),
//!    and `me`'s fields are the engine's (slab class, size with item header; Terrace's
//!    tier).
//! 5. The close: a connection reset and an orderly close both count as "closed".
//!
//! And what the streams steer clear of, because the two differ by design (memcached's
//! behaviour there is a bug, depends on timing or memory layout, or describes what
//! Terrace does not have); the generators' module lists how:
//! - memcached's slab, LRU and log admin commands (`slabs`, `lru`, `lru_crawler`,
//!   `watch`, `cache_memlimit`, `stats items|slabs|sizes|cachedump|conns`) describe a
//!   slab allocator Terrace does not have: Terrace answers `ERROR` (or an empty list);
//! - the largest storable value: memcached's is 1 MiB less its item header (which
//!   depends on the key's length), Terrace's exactly `--max-item-size`;
//! - a refusal of an over-large body, or any reply followed by an incomplete data
//!   block: memcached sends it only once the body has been read, Terrace at once (the
//!   bytes agree once the body is sent);
//! - a non-`get` line longer than 2 KiB whose end arrives in a later read: memcached
//!   closes the connection, Terrace handles lines up to 16 KiB (memcached's read buffer)
//!   however they arrive;
//! - a `get` line longer than 16 KiB holding an over-long key (or a NUL byte): memcached
//!   buffers the whole line and answers only `CLIENT_ERROR`; Terrace handles such a line
//!   a chunk of keys at a time, so values before the bad key are already sent, and closes
//!   (memcached's unbounded buffering is what Terrace will not copy);
//! - a get with an over-long key, an HTTP request line, a bad binary magic byte: memcached
//!   drops every reply not yet sent on the connection, earlier pipelined commands'
//!   replies included (which ones depends on what it had written); Terrace sends them;
//! - binary VERBOSITY, and unknown opcodes whose request has extras or a key: memcached
//!   1.6 no longer knows VERBOSITY, and its "unknown command" path skips the body length
//!   again after the extras and key, misframing the stream; Terrace answers VERBOSITY
//!   with success and skips an unknown request's body once;
//! - incr/decr of a stored number of 2^63 or more: memcached looks for a minus sign with
//!   `strchr` on the unterminated value, past its end;
//! - meta `k` of a base64 key (memcached keeps a per-item "stored with b" bit), `h` after
//!   an overwrite (Terrace's eviction policy counts it as an access), `t` of a TTL
//!   already past (memcached prints the negative difference as unsigned): documented
//!   in the README and `meta.rs`.
//!
//! [`PENDING`] lists table cases whose difference is being fixed elsewhere.

mod common;
mod differential;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use differential::gen::{binary_stream, meta_stream, text_stream};
use differential::{binary_raw, binary_request, template, BinHeader, Keys, Part, Servers};
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Generated streams per run, at least (`TERRACE_DIFF_STREAMS` asks for more).
const GENERATED: usize = 10_000;
/// Streams run at once in one generated case (each against both servers).
const BATCH: usize = 8;

/// A named stream of the table.
struct Case {
    name: &'static str,
    /// Runs alone (nothing else in flight): flush_all and the like.
    alone: bool,
    build: fn(&Keys) -> Vec<Part>,
}

macro_rules! text_case {
    ($name:literal, $t:expr) => {
        Case {
            name: $name,
            alone: false,
            build: |k| template(k, $t),
        }
    };
}

macro_rules! alone_case {
    ($name:literal, $t:expr) => {
        Case {
            name: $name,
            alone: true,
            build: |k| template(k, $t),
        }
    };
}

macro_rules! build_case {
    ($name:literal, $f:expr) => {
        Case {
            name: $name,
            alone: false,
            build: $f,
        }
    };
}

// ---------------------------------------------------------------------------------------
// Binary request helpers

fn bin(opcode: u8, extras: &[u8], key: &[u8], value: &[u8]) -> Vec<u8> {
    binary_request(opcode, extras, key, value, 0, 0x1000 + u32::from(opcode))
}

fn store_extras(flags: u32, exptime: u32) -> Vec<u8> {
    let mut e = flags.to_be_bytes().to_vec();
    e.extend_from_slice(&exptime.to_be_bytes());
    e
}

fn arith_extras(delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
    let mut e = delta.to_be_bytes().to_vec();
    e.extend_from_slice(&initial.to_be_bytes());
    e.extend_from_slice(&exptime.to_be_bytes());
    e
}

fn b(parts: Vec<Vec<u8>>) -> Vec<Part> {
    vec![Part::Bytes(parts.concat())]
}

/// A binary request whose CAS field is the latest CAS seen (after a sync).
fn with_latest_cas(request: Vec<u8>) -> Vec<Part> {
    vec![
        Part::Sync,
        Part::Bytes(request[..16].to_vec()),
        Part::Cas,
        Part::Bytes(request[24..].to_vec()),
    ]
}

fn show_key(k: &Keys, i: usize) -> String {
    String::from_utf8(k.k(i)).expect("keys are ascii")
}

fn long_get(k: &Keys, n: usize, with_cas: bool) -> Vec<u8> {
    let mut line = if with_cas {
        b"gets".to_vec()
    } else {
        b"get".to_vec()
    };
    for i in 0..n {
        line.push(b' ');
        line.extend(k.k(i));
    }
    line.extend_from_slice(b"\r\n");
    line
}

// ---------------------------------------------------------------------------------------
// The table

const CASES: &[Case] = &[
    // --- storage commands
    text_case!("set_get", "set {k0} 5 0 3\r\nabc\r\nget {k0}\r\nget {k0} {k1} {k0}\r\n"),
    text_case!("set_noreply", "set {k0} 0 0 1 noreply\r\na\r\nget {k0}\r\n"),
    text_case!("set_empty_value", "set {k0} 0 0 0\r\n\r\nget {k0}\r\n"),
    text_case!("set_binary_value", "set {k0} 0 0 6\r\n\0\r\n\x7f \r\r\nget {k0}\r\n"),
    text_case!("set_extra_token_ignored", "set {k0} 0 0 1 junk\r\na\r\nget {k0}\r\n"),
    text_case!("set_too_many_tokens", "set {k0} 0 0 1 noreply junk\r\na\r\nget {k0}\r\n"),
    text_case!("set_too_few_tokens", "set {k0} 0 0\r\na\r\nset {k0}\r\nset\r\n"),
    text_case!("set_flags_edges", "set {k0} 4294967295 0 1\r\na\r\nget {k0}\r\nset {k1} 4294967296 0 1\r\nb\r\nget {k1}\r\nset {k2} -1 0 1\r\nc\r\nget {k2}\r\nset {k3} +7 0 1\r\nd\r\nget {k3}\r\nset {k4} 18446744073709551615 0 1\r\ne\r\nget {k4}\r\nset {k5} 18446744073709551616 0 1\r\nf\r\nget {k5}\r\n"),
    text_case!("set_flags_junk", "set {k0} 1x 0 1\r\na\r\nset {k0} x 0 1\r\na\r\nset {k0} -0 0 1\r\na\r\nget {k0}\r\n"),
    text_case!("set_exptime_edges", "set {k0} 0 -1 1\r\na\r\nget {k0}\r\nset {k1} 0 2147483648 1\r\nb\r\nget {k1}\r\nset {k2} 0 4294967296 1\r\nc\r\nget {k2}\r\nset {k3} 0 1000000000 1\r\nd\r\nget {k3}\r\nset {k4} 0 4000000000 1\r\ne\r\nget {k4}\r\nset {k5} 0 x 1\r\nf\r\nget {k5}\r\nset {k6} 0 2592000 1\r\ng\r\nget {k6}\r\n"),
    text_case!("set_length_int32_edges", "set {k0} 0 0 -1\r\nset {k0} 0 0 2147483648\r\nset {k0} 0 0 2147483647\r\nset {k0} 0 0 2147483646\r\nset {k0} 0 0 4294967297\r\na\r\nget {k0}\r\n"),
    text_case!("set_length_junk", "set {k0} 0 0 1x\r\na\r\nset {k0} 0 0 +1\r\nb\r\nset {k0} 0 0 01\r\nc\r\nget {k0}\r\n"),
    text_case!("set_length_64bit", "set {k0} 0 0 18446744073709551616\r\nset {k0} 0 0 9223372036854775807\r\nget {k0}\r\n"),
    text_case!("set_data_shorter_than_announced", "set {k0} 0 0 5\r\nab\r\nget {k0}\r\n"),
    text_case!("set_data_longer_than_announced", "set {k0} 0 0 1\r\nabc\r\nget {k0}\r\n"),
    text_case!("set_data_longer_noreply", "set {k0} 0 0 1 noreply\r\nabc\r\nget {k0}\r\n"),
    text_case!("set_data_bad_terminator", "set {k0} 0 0 1\r\nab\nget {k0}\r\n"),
    text_case!("set_key_250", "set {k0:250} 0 0 1\r\na\r\nget {k0:250}\r\n"),
    text_case!("set_key_251", "set {k0:251} 0 0 1\r\na\r\nget {k0}\r\n"),
    text_case!("set_key_251_noreply", "set {k0:251} 0 0 1 noreply\r\na\r\nget {k0}\r\n"),
    text_case!("set_key_control_bytes", "set {k0}\x01\x7f\t 0 0 1\r\na\r\nget {k0}\x01\x7f\t\r\n"),
    Case {
        name: "set_too_large_with_body",
        alone: false,
        build: |k| {
            let mut s = template(k, "set {k0} 0 0 1\r\na\r\nset {k0} 0 0 2097152\r\n");
            s.push(Part::Bytes(vec![b'v'; 2_097_152]));
            s.extend(template(k, "\r\nget {k0}\r\nadd {k1} 0 0 2097152 noreply\r\n"));
            s.push(Part::Bytes(vec![b'w'; 2_097_152]));
            s.extend(template(k, "\r\nget {k1}\r\n"));
            s
        },
    },
    text_case!("add", "add {k0} 0 0 1\r\na\r\nadd {k0} 0 0 1\r\nb\r\nadd {k0} 0 0 1 noreply\r\nc\r\nget {k0}\r\n"),
    text_case!("replace", "replace {k0} 0 0 1\r\na\r\nset {k0} 0 0 1\r\nb\r\nreplace {k0} 3 0 1\r\nc\r\nreplace {k0} 0 0 1 noreply\r\nd\r\nget {k0}\r\n"),
    text_case!("append_prepend", "append {k0} 0 0 1\r\na\r\nprepend {k0} 0 0 1\r\na\r\nset {k0} 7 0 2\r\nmm\r\nappend {k0} 9 0 2\r\nzz\r\nprepend {k0} 9 0 2\r\naa\r\nappend {k0} 0 0 1 noreply\r\n!\r\nget {k0}\r\n"),
    text_case!("regression_append_ignores_exptime", "set {k0} 0 0 1\r\na\r\nappend {k0} 0 -1 1\r\nb\r\nprepend {k0} 0 2592001 1\r\nc\r\nadd {k0} 0 0 1\r\nd\r\nget {k0}\r\n"),
    text_case!("append_bad_tokens", "append {k0} x 0 1\r\na\r\nprepend {k0} 0 0\r\nappend {k0:251} 0 0 1\r\na\r\n"),
    text_case!("cas", "set {k0} 0 0 1\r\na\r\ngets {k0}\r\n{sync}cas {k0} 0 0 1 {cas}\r\nb\r\ncas {k0} 0 0 1 {cas}\r\nc\r\ngets {k0}\r\ncas {k1} 0 0 1 1\r\nd\r\n"),
    text_case!("cas_noreply", "set {k0} 0 0 1\r\na\r\ngets {k0}\r\n{sync}cas {k0} 0 0 1 {cas} noreply\r\nb\r\ngets {k0}\r\ncas {k0} 0 0 1 99999999999 noreply\r\nc\r\nget {k0}\r\n"),
    text_case!("cas_bad_unique", "cas {k0} 0 0 1 x\r\na\r\ncas {k0} 0 0 1 -1\r\na\r\ncas {k0} 0 0 1 18446744073709551616\r\na\r\ncas {k0} 0 0 1\r\na\r\ncas {k0} 0 0 1 1 noreply junk\r\na\r\n"),
    text_case!("cas_after_append", "set {k0} 0 0 1\r\na\r\ngets {k0}\r\nappend {k0} 0 0 1\r\nb\r\ngets {k0}\r\nprepend {k0} 0 0 1\r\nb\r\ngets {k0}\r\n"),
    text_case!("cas_after_touch", "set {k0} 0 0 1\r\na\r\ngets {k0}\r\ntouch {k0} 1000\r\ngets {k0}\r\ngats 100 {k0}\r\n{sync}cas {k0} 0 0 1 {cas}\r\nb\r\n"),
    // --- retrieval
    text_case!("get_miss_and_multi", "get {k0}\r\nget {k0} {k1} {k2}\r\nset {k1} 1 0 1\r\nx\r\nget {k0} {k1} {k2} {k1}\r\n"),
    text_case!("get_no_key", "get\r\ngets\r\nget \r\ngets  \r\n"),
    text_case!("get_key_251", "set {k0} 0 0 1\r\na\r\n{sync}get {k0} {k1:251} {k0}\r\nget {k0:250}\r\n"),
    text_case!("get_many_tokens", "set {k3} 0 0 1\r\na\r\nget {k0} {k1} {k2} {k0} {k1} {k2} {k0} {k1} {k2} {k0} {k1} {k2} {k0} {k1} {k2} {k0} {k1} {k2} {k0} {k1} {k2} {k0} {k1} {k2} {k3} {k0} {k3}\r\n"),
    text_case!("get_spacing", "set {k0} 0 0 1\r\na\r\n   get   {k0}    {k0}  \r\nget {k0}\n"),
    text_case!("get_nul_ends_line", "set {k0} 0 0 1\r\na\r\nget {k0}\0{k0} junk\r\nget {k1}\0\r\n"),
    text_case!("gets", "set {k0} 3 0 2\r\nab\r\ngets {k0} {k1} {k0}\r\n"),
    text_case!("bget", "set {k0} 0 0 1\r\na\r\nbget {k0}\r\nbget\r\n"),
    text_case!("gat_gats", "set {k0} 0 0 1\r\na\r\ngat 1000 {k0} {k1}\r\ngats 0 {k0}\r\ngat -1 {k0}\r\nget {k0}\r\n"),
    text_case!("gat_bad_exptime", "gat x {k0}\r\ngat\r\ngat 10\r\ngats 1x {k0}\r\ngat 4294967296 {k0}\r\n"),
    // --- incr/decr
    // Stored numbers stay below 2^63: memcached reads past the end of a larger one
    // (see `counter_value` in the generator).
    text_case!("incr_decr", "incr {k0} 1\r\nset {k0} 0 0 2\r\n10\r\nincr {k0} 5\r\ndecr {k0} 3\r\ndecr {k0} 100\r\nincr {k0} 4611686018427387904\r\ndecr {k0} 1\r\nincr {k0} 18446744073709551616\r\n"),
    text_case!("incr_large", "set {k0} 0 0 19\r\n9223372036854775806\r\nincr {k0} 1\r\n"),
    text_case!("incr_grows_value", "set {k0} 0 0 2\r\n99\r\nincr {k0} 1\r\nget {k0}\r\n"),
    // A number not longer than the old value is written over it, padded with spaces.
    text_case!("incr_decr_in_place", "set {k0} 0 0 3\r\n100\r\ndecr {k0} 95\r\nget {k0}\r\nincr {k0} 10\r\nget {k0}\r\nincr {k0} 1000\r\nget {k0}\r\nset {k1} 0 0 5\r\n00007\r\nincr {k1} 1\r\ngets {k1}\r\n"),
    // The stored number is read as strtoull reads it.
    text_case!("incr_reads_like_strtoull", "set {k0} 0 0 4\r\n10 x\r\nincr {k0} 1\r\nget {k0}\r\nset {k1} 0 0 3\r\n 10\r\nincr {k1} 1\r\nget {k1}\r\nset {k2} 0 0 3\r\n+10\r\ndecr {k2} 1\r\nget {k2}\r\nset {k3} 0 0 4\r\n5\t\n\r\r\nincr {k3} 1\r\nset {k4} 0 0 2\r\n-0\r\nincr {k4} 1\r\nget {k4}\r\nset {k5} 0 0 3\r\n1+1\r\nincr {k5} 1\r\n"),
    text_case!("incr_noreply", "set {k0} 0 0 1\r\n1\r\nincr {k0} 1 noreply\r\ndecr {k0} 1 noreply\r\nincr {k1} 1 noreply\r\nincr {k0} x noreply\r\nincr {k0} 0\r\n"),
    text_case!("incr_bad_delta", "set {k0} 0 0 1\r\n1\r\nincr {k0} x\r\nincr {k0} -1\r\nincr {k0} 18446744073709551616\r\nincr {k0} +2\r\nincr {k0} 01\r\n"),
    text_case!("incr_non_numeric", "set {k0} 0 0 2\r\nab\r\nincr {k0} 1\r\nset {k1} 0 0 0\r\n\r\nincr {k1} 1\r\nset {k2} 0 0 20\r\n18446744073709551616\r\nincr {k2} 1\r\n"),
    text_case!("incr_token_counts", "incr\r\nincr {k0}\r\nincr {k0} 1 2 3\r\ndecr {k0} 1 noreply junk\r\nincr {k0:251} 1\r\nincr {k0:251} 1 noreply\r\n"),
    // --- touch, delete
    text_case!("touch", "touch {k0} 10\r\nset {k0} 0 0 1\r\na\r\ntouch {k0} 1000\r\ntouch {k0} 0 noreply\r\ntouch {k0} -1\r\nget {k0}\r\n"),
    text_case!("touch_bad", "touch {k0} x\r\ntouch {k0} x noreply\r\ntouch {k0}\r\ntouch {k0} 1 2 3\r\ntouch {k0:251} 1\r\n"),
    text_case!("delete", "delete {k0}\r\nset {k0} 0 0 1\r\na\r\ndelete {k0}\r\nset {k0} 0 0 1\r\na\r\ndelete {k0} noreply\r\nget {k0}\r\n"),
    text_case!("delete_hold_time", "set {k0} 0 0 1\r\na\r\ndelete {k0} 10\r\ndelete {k0} 0\r\nset {k0} 0 0 1\r\na\r\ndelete {k0} 0 noreply\r\nget {k0}\r\n"),
    text_case!("regression_delete_hold_time_noreply", "delete {k0} 10 noreply\r\ndelete {k0} x noreply\r\nget {k0}\r\n"),
    text_case!("delete_token_counts", "delete\r\ndelete {k0} 0 noreply junk\r\ndelete {k0} noreply 0\r\ndelete {k0:251}\r\ndelete {k0:251} noreply\r\n"),
    // --- the others
    alone_case!("flush_all", "set {k0} 0 0 1\r\na\r\nflush_all\r\nget {k0}\r\nset {k0} 0 0 1\r\na\r\nflush_all noreply\r\nget {k0}\r\nset {k0} 0 0 1\r\na\r\nflush_all 0\r\nget {k0}\r\nflush_all -1\r\nflush_all 0 noreply\r\n"),
    alone_case!("flush_all_delayed", "set {k0} 0 0 1\r\na\r\nflush_all 1000\r\nget {k0}\r\nflush_all 0\r\nget {k0}\r\n"),
    alone_case!("flush_all_bad", "flush_all x\r\nflush_all noreply x\r\nflush_all x noreply\r\nflush_all 1 2 3\r\nflush_all 1000 junk\r\nflush_all 0\r\n"),
    text_case!("verbosity", "verbosity 1\r\nverbosity 0 noreply\r\nverbosity\r\nverbosity x\r\nverbosity x noreply\r\nverbosity noreply\r\nverbosity 1 2\r\nverbosity 1 2 3\r\n"),
    text_case!("version", "version\r\nversion junk\r\n"),
    text_case!("quit", "get {k0}\r\nquit\r\nget {k0}\r\n"),
    text_case!("quit_with_tokens", "quit now\r\nget {k0}\r\n"),
    text_case!("shutdown_disabled", "shutdown\r\nshutdown graceful\r\nshutdown x y\r\n"),
    text_case!("stats", "stats\r\nstats settings\r\nstats reset\r\nstats reset junk\r\nstats nonsense\r\nstats nonsense x\r\n"),
    alone_case!("stats_detail", "stats detail on\r\nset {k0} 0 0 1\r\na\r\nstats detail dump\r\nstats detail off\r\nstats detail\r\nstats detail x\r\nstats detail on x\r\nstats detail off\r\n"),
    build_case!("binary_stat_detail", |_| b(vec![
        bin(0x10, &[], b"detail on", &[]),
        bin(0x10, &[], b"detail dump", &[]),
        bin(0x10, &[], b"detail off", &[]),
        bin(0x10, &[], b"detail", &[]),
    ])),
    // --- malformed lines
    text_case!("unknown_commands", "bogus\r\nGET {k0}\r\nx\r\ngetx {k0}\r\nsetx {k0} 0 0 1\r\nmx\r\nm\r\ng\r\nmisbehave\r\ndebugtime 10\r\n"),
    text_case!("http_request_closes", "GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
    text_case!("http_like_get_is_a_get", "set HTTP/1.1 0 0 1\r\na\r\nget / HTTP/1.1\r\n{sync}GET / HTTP/1.1\r\n"),
    text_case!("http_post_closes", "POST /x HTTP/1.0\r\n"),
    text_case!("http_routed_commands_are_errors", "gxx / HTTP/1.1\r\nsx HTTP/1.1\r\nmx HTTP/1.1\r\n{sync}mxy HTTP/1.1\r\n"),
    text_case!("empty_and_blank_lines", "\r\n\n \r\n  \r\n\r\r\n\t\r\n"),
    text_case!("bare_newlines", "set {k0} 0 0 1\na\r\nget {k0}\nget {k0}\r\r\n"),
    text_case!("many_tokens", "set {k0} 0 0 1 a a a a a a a a a a a a a a a a a a a a a a a a a\r\nverbosity a a a a a a a a a a a a a a a a a a a a a a a a a noreply\r\nstats a a a a a a a a a a a a a a a a a a a a a a a a a\r\n"),
    text_case!("tabs_are_not_separators", "set {k0}\t0 0 1\r\nget {k0}\t\r\nincr {k0} \t5\r\n"),
    Case {
        name: "line_2048_to_16k_in_one_write",
        alone: false,
        // memcached acts on a line longer than 2 KiB only when it arrives whole in its
        // first read: one line per stream, at its start.
        build: |k| {
            let mut s = template(k, "set {k0} 0 0 1");
            s.push(Part::Bytes(vec![b' '; 10_000]));
            s.extend(template(k, "\r\na\r\nget {k0}\r\n"));
            s
        },
    },
    Case {
        name: "line_16k_exactly",
        alone: false,
        build: |k| {
            let mut line = b"verbosity 1".to_vec();
            line.resize(16 * 1024 - 2, b' ');
            line.extend_from_slice(b"\r\n");
            let mut s = vec![Part::Bytes(line)];
            s.extend(template(k, "get {k0}\r\n"));
            s
        },
    },
    Case {
        name: "line_over_16k_closes",
        alone: false,
        build: |k| {
            let mut s = template(k, "set {k0} 0 0 1");
            s.push(Part::Bytes(vec![b' '; 17_000]));
            s.extend(template(k, "\r\na\r\n"));
            s
        },
    },
    Case {
        name: "regression_long_multiget",
        alone: false,
        build: |k| {
            let mut s = template(k, "set {k5} 0 0 1\r\na\r\nset {k999} 0 0 3\r\nbcd\r\n");
            s.push(Part::Bytes(long_get(k, 2_000, false)));
            s.push(Part::Bytes(long_get(k, 2_000, true)));
            s
        },
    },
    Case {
        name: "regression_20000_key_multiget",
        alone: false,
        build: |k| {
            let mut s = template(k, "set {k7} 0 0 1\r\na\r\nset {k19999} 5 0 2\r\nbc\r\n");
            s.push(Part::Bytes(long_get(k, 20_000, false)));
            s.push(Part::Split);
            s.push(Part::Bytes(long_get(k, 20_000, true)));
            s.extend(template(k, "get {k7}\r\n"));
            s
        },
    },
    Case {
        name: "long_get_split_across_reads",
        alone: false,
        build: |k| {
            let line = long_get(k, 5_000, false);
            let mut s = template(k, "set {k4321} 0 0 1\r\na\r\n");
            for chunk in line.chunks(7_777) {
                s.push(Part::Bytes(chunk.to_vec()));
                s.push(Part::Split);
            }
            s.extend(template(k, "get {k4321}\r\n"));
            s
        },
    },
    Case {
        name: "regression_long_get_line_of_spaces",
        alone: false,
        build: |k| {
            let mut s = template(k, "set {k1} 0 0 1\r\na\r\nset {k2} 0 0 1\r\nb\r\n");
            let spaces = vec![b' '; 40_000];
            for tail in [&b" \r\n"[..], b"{k2} \r\n", b"\r\n"] {
                let mut line = template(k, "get {k1}");
                line.push(Part::Bytes(spaces.clone()));
                line.extend(template(k, std::str::from_utf8(tail).expect("ascii")));
                let bytes: Vec<u8> = line
                    .into_iter()
                    .flat_map(|p| match p {
                        Part::Bytes(b) => b,
                        _ => Vec::new(),
                    })
                    .collect();
                for chunk in bytes.chunks(6_000) {
                    s.push(Part::Bytes(chunk.to_vec()));
                    s.push(Part::Split);
                }
            }
            s
        },
    },
    Case {
        name: "long_get_with_large_replies",
        alone: false,
        // Values past the reply budget inside a line past MAX_LINE: both resumptions
        // at once.
        build: |k| {
            let mut s = Vec::new();
            let value = vec![b'v'; 3_000];
            let mut sets = Vec::new();
            for i in (0..3_000).step_by(7) {
                sets.extend(format!("set {} {i} 0 3000 noreply\r\n", show_key(k, i)).bytes());
                sets.extend_from_slice(&value);
                sets.extend_from_slice(b"\r\n");
            }
            s.push(Part::Bytes(sets));
            s.push(Part::Sync);
            let line = long_get(k, 3_000, true);
            for chunk in line.chunks(5_000) {
                s.push(Part::Bytes(chunk.to_vec()));
                s.push(Part::Split);
            }
            s
        },
    },
    Case {
        name: "long_get_leading_spaces",
        alone: false,
        build: |k| {
            let mut s = template(k, "set {k1} 0 0 1\r\na\r\n");
            let mut line = vec![b' '; 100];
            line.extend(long_get(k, 2_000, false));
            s.push(Part::Bytes(line));
            s
        },
    },
    Case {
        name: "long_gat_line_closes",
        alone: false,
        build: |k| {
            let mut line = b"gat 0".to_vec();
            for i in 0..3_000 {
                line.push(b' ');
                line.extend(k.k(i));
            }
            line.extend_from_slice(b"\r\n");
            vec![Part::Bytes(line)]
        },
    },
    text_case!("pipelined_mix", "set {k0} 1 0 1\r\na\r\nget {k0}\r\nadd {k0} 0 0 1\r\nb\r\nincr {k1} 1\r\ndelete {k0}\r\nget {k0}\r\nbogus\r\nset {k1} 0 0 1\r\n5\r\nincr {k1} 2\r\ntouch {k1} 100\r\ngets {k1}\r\nmn\r\n"),
    text_case!("pipelined_split_everywhere", "se{split}t {k0} 1 0 3\r{split}\nab{split}c\r\n{split}ge{split}t {k0}{split}\r\n"),
    // --- meta commands (their semantics are meta.rs's; the cases pin the framing)
    text_case!("meta_noop", "mn\r\nmn junk\r\n"),
    text_case!("meta_get_flags", "ms {k0} 2 T0 F5\r\nab\r\nmg {k0} v\r\nmg {k0} s f v k\r\nmg {k0} c\r\nmg {k0} t\r\nmg {k0} O123 k q\r\nmg {k1} v\r\nmg {k1} v q\r\nmg {k1} k O9\r\nmn\r\n"),
    text_case!("meta_get_hit_last_access", "ms {k0} 1\r\na\r\nmg {k0} h l\r\nmg {k0} h l\r\nmg {k0} u v\r\n"),
    text_case!("meta_get_touch", "ms {k0} 1\r\na\r\nmg {k0} T1000 t v\r\nmg {k0} T-1 v\r\nmg {k0} v\r\n"),
    text_case!("meta_get_base64", "ms Zm9vYmFy 1 b\r\na\r\nmg Zm9vYmFy b k v\r\nmg Zm9vYmFy v\r\nmg !!! b v\r\n"),
    text_case!("meta_vivify_recache", "mg {k0} N30 s v c\r\nmg {k0} N30 s v\r\nms {k0} 1 T100\r\na\r\nmg {k0} R30 v t\r\nmg {k0} R200 v\r\nmg {k0} R200 v\r\n"),
    text_case!("meta_set_modes", "ms {k0} 1 MA\r\na\r\nms {k0} 1 MS\r\nb\r\nms {k0} 1 MA\r\nc\r\nms {k0} 1 MP\r\nd\r\nms {k0} 1 MR\r\ne\r\nms {k0} 1 ME\r\nf\r\nmg {k0} v\r\nms {k0} 1 MX\r\ng\r\nms {k1} 1 MR\r\nh\r\nms {k1} 1 MA\r\nh\r\n"),
    text_case!("meta_set_flags", "ms {k0} 2 c k O5 F7 T0\r\nab\r\nms {k0} 2 q\r\ncd\r\nms {k0} 2 C1\r\nef\r\nms {k0} 2 I\r\ngh\r\nmg {k0} v f\r\nms {k0} S2\r\nij\r\n"),
    text_case!("meta_set_cas", "ms {k0} 1 c\r\na\r\n{sync}ms {k0} 1 c C{cas}\r\nb\r\nms {k0} 1 C1\r\nc\r\nmg {k0} v\r\n"),
    text_case!("meta_set_bad", "ms {k0}\r\nms {k0} x\r\nms {k0} -1\r\na\r\nms {k0:251} 1\r\na\r\nms {k0} 1 Fx\r\na\r\nms {k0} 2\r\nabc\r\nmn\r\n"),
    text_case!("meta_delete", "md {k0}\r\nmd {k0} q\r\nms {k0} 1\r\na\r\nmd {k0} k O1\r\nms {k0} 1\r\na\r\nmd {k0} C1\r\nmd {k0} I T30\r\nmg {k0} v c\r\nmd {k0} q\r\nmn\r\n"),
    text_case!("meta_delete_invalidate", "ms {k0} 1\r\na\r\nmd {k0} I\r\nmg {k0} v\r\nmg {k0} v\r\nms {k0} 1\r\nb\r\nmg {k0} v\r\n"),
    text_case!("meta_arith_in_place", "ms {k0} 3\r\n100\r\nma {k0} MD D95 v\r\nmg {k0} v s\r\nms {k1} 4\r\n10 x\r\nma {k1} v\r\nmg {k1} v\r\n"),
    text_case!("meta_arith", "ma {k0}\r\nma {k0} N0 J10\r\nma {k0} v\r\nma {k0} MD D5 v\r\nma {k0} MI D100 v t c\r\nma {k0} q\r\nma {k0} O7 k\r\nma {k0} C1\r\nma {k0} Dx\r\nma {k0} Mx\r\nmn\r\n"),
    text_case!("meta_arith_error_after_vivify", "ma {k0} O012345678901234567890123456789012 N-1\r\nma {k0}\r\nmg {k1} O012345678901234567890123456789012 N0 v\r\nmg {k1} v\r\nma {k2} N-1 O012345678901234567890123456789012 T30\r\nma {k2} t\r\n"),
    text_case!("meta_get_expire_and_recache", "ms {k0} 0\r\n\r\nmg {k0} T-1 R1000\r\nmg {k0} R1000\r\nms {k1} 0\r\n\r\nmg {k1} T2147483648 R100000\r\n"),
    text_case!("meta_get_u_keeps_hit_before", "ms {k0} 1\r\na\r\nmg {k0} u\r\nmg {k0} h\r\nmg {k0} h\r\nmg {k1} N30 u\r\nmg {k1} h\r\n"),
    text_case!("meta_arith_non_numeric", "ms {k0} 1\r\na\r\nma {k0}\r\nma {k0} q\r\nmn\r\n"),
    text_case!("meta_debug", "me {k0}\r\nms {k0} 1\r\na\r\nme {k0}\r\nme\r\n"),
    text_case!("meta_no_key", "mg\r\nms\r\nmd\r\nma\r\nme\r\n"),
    text_case!("meta_key_251", "mg {k0:251} v\r\nmd {k0:251}\r\nma {k0:251}\r\n"),
    text_case!("meta_opaque_long", "mg {k0} O01234567890123456789012345678901234567890\r\nmg {k0} O1234567890123456789012345678901\r\n"),
    // --- binary protocol: every opcode, quiet variants, malformed requests
    build_case!("binary_get_set", |k| b(vec![
        bin(0x00, &[], &k.k(0), &[]),
        bin(0x01, &store_extras(5, 0), &k.k(0), b"hello"),
        bin(0x00, &[], &k.k(0), &[]),
        bin(0x0c, &[], &k.k(0), &[]),
        bin(0x0c, &[], &k.k(1), &[]),
        bin(0x09, &[], &k.k(1), &[]),
        bin(0x09, &[], &k.k(0), &[]),
        bin(0x0d, &[], &k.k(1), &[]),
        bin(0x0d, &[], &k.k(0), &[]),
        bin(0x0a, &[], &[], &[]),
    ])),
    build_case!("binary_add_replace", |k| b(vec![
        bin(0x03, &store_extras(0, 0), &k.k(0), b"a"),
        bin(0x02, &store_extras(0, 0), &k.k(0), b"b"),
        bin(0x02, &store_extras(0, 0), &k.k(0), b"c"),
        bin(0x03, &store_extras(1, 0), &k.k(0), b"d"),
        bin(0x12, &store_extras(0, 0), &k.k(0), b"e"),
        bin(0x13, &store_extras(0, 0), &k.k(0), b"f"),
        bin(0x13, &store_extras(0, 0), &k.k(1), b"g"),
        bin(0x11, &store_extras(0, 0), &k.k(1), b"h"),
        bin(0x0a, &[], &[], &[]),
        bin(0x00, &[], &k.k(0), &[]),
        bin(0x00, &[], &k.k(1), &[]),
    ])),
    build_case!("binary_cas", |k| {
        let mut s = b(vec![
            bin(0x01, &store_extras(0, 0), &k.k(0), b"a"),
            binary_request(0x01, &store_extras(0, 0), &k.k(0), b"b", 0x0123_4567_89ab, 1),
        ]);
        s.extend(with_latest_cas(bin(0x01, &store_extras(0, 0), &k.k(0), b"c")));
        s.extend(with_latest_cas(bin(0x04, &[], &k.k(0), &[])));
        s.push(Part::Bytes(binary_request(0x04, &[], &k.k(1), &[], 5, 1)));
        s
    }),
    build_case!("binary_set_expired", |k| b(vec![
        bin(0x01, &store_extras(0, 2_592_001), &k.k(0), b"a"),
        bin(0x00, &[], &k.k(0), &[]),
    ])),
    build_case!("binary_delete", |k| b(vec![
        bin(0x04, &[], &k.k(0), &[]),
        bin(0x01, &store_extras(0, 0), &k.k(0), b"a"),
        bin(0x04, &[], &k.k(0), &[]),
        bin(0x01, &store_extras(0, 0), &k.k(0), b"a"),
        bin(0x14, &[], &k.k(0), &[]),
        bin(0x14, &[], &k.k(0), &[]),
        bin(0x0a, &[], &[], &[]),
    ])),
    // A shorter number is written in place, padded; the stored number read as strtoull.
    build_case!("binary_incr_in_place", |k| b(vec![
        bin(0x01, &store_extras(0, 0), &k.k(0), b"100"),
        bin(0x06, &arith_extras(95, 0, 0), &k.k(0), &[]),
        bin(0x00, &[], &k.k(0), &[]),
        bin(0x01, &store_extras(0, 0), &k.k(1), b" 10 x"),
        bin(0x05, &arith_extras(1, 0, 0), &k.k(1), &[]),
        bin(0x00, &[], &k.k(1), &[]),
    ])),
    build_case!("binary_incr_decr", |k| b(vec![
        bin(0x05, &arith_extras(1, 5, 0), &k.k(0), &[]),
        bin(0x05, &arith_extras(1, 5, 0), &k.k(0), &[]),
        bin(0x06, &arith_extras(10, 5, 0), &k.k(0), &[]),
        bin(0x05, &arith_extras(1, 5, 0xffff_ffff), &k.k(1), &[]),
        bin(0x15, &arith_extras(u64::MAX, 0, 0), &k.k(0), &[]),
        bin(0x16, &arith_extras(1, 0, 0), &k.k(0), &[]),
        bin(0x16, &arith_extras(1, 0, 0xffff_ffff), &k.k(2), &[]),
        bin(0x05, &arith_extras(0, 0, 0), &k.k(0), &[]),
        bin(0x01, &store_extras(0, 0), &k.k(3), b"x"),
        bin(0x05, &arith_extras(1, 0, 0), &k.k(3), &[]),
        bin(0x0a, &[], &[], &[]),
    ])),
    build_case!("binary_append_prepend", |k| b(vec![
        bin(0x0e, &[], &k.k(0), b"x"),
        bin(0x0f, &[], &k.k(0), b"x"),
        bin(0x01, &store_extras(3, 0), &k.k(0), b"m"),
        bin(0x0e, &[], &k.k(0), b"z"),
        bin(0x0f, &[], &k.k(0), b"a"),
        bin(0x19, &[], &k.k(0), b"!"),
        bin(0x1a, &[], &k.k(0), b"<"),
        bin(0x19, &[], &k.k(1), b"!"),
        bin(0x00, &[], &k.k(0), &[]),
    ])),
    build_case!("binary_touch_gat", |k| b(vec![
        bin(0x1c, &1000u32.to_be_bytes(), &k.k(0), &[]),
        bin(0x01, &store_extras(9, 0), &k.k(0), b"v"),
        bin(0x1c, &1000u32.to_be_bytes(), &k.k(0), &[]),
        bin(0x1d, &1000u32.to_be_bytes(), &k.k(0), &[]),
        bin(0x1e, &1000u32.to_be_bytes(), &k.k(0), &[]),
        bin(0x1e, &1000u32.to_be_bytes(), &k.k(1), &[]),
        bin(0x23, &0u32.to_be_bytes(), &k.k(0), &[]),
        bin(0x23, &0u32.to_be_bytes(), &k.k(1), &[]),
        bin(0x24, &0u32.to_be_bytes(), &k.k(0), &[]),
        bin(0x24, &0u32.to_be_bytes(), &k.k(1), &[]),
        bin(0x0a, &[], &[], &[]),
    ])),
    build_case!("binary_noop_version_stat", |_| b(vec![
        bin(0x0a, &[], &[], &[]),
        bin(0x0b, &[], &[], &[]),
        bin(0x10, &[], &[], &[]),
        bin(0x10, &[], b"settings", &[]),
        bin(0x10, &[], b"nonsense", &[]),
        bin(0x10, &[], b"reset", &[]),
    ])),
    build_case!("binary_quit", |k| b(vec![
        bin(0x00, &[], &k.k(0), &[]),
        bin(0x07, &[], &[], &[]),
        bin(0x00, &[], &k.k(0), &[]),
    ])),
    build_case!("binary_quitq", |k| b(vec![
        bin(0x00, &[], &k.k(0), &[]),
        bin(0x17, &[], &[], &[]),
        bin(0x00, &[], &k.k(0), &[]),
    ])),
    Case {
        name: "binary_flush",
        alone: true,
        build: |k| {
            b(vec![
                bin(0x01, &store_extras(0, 0), &k.k(0), b"a"),
                bin(0x08, &[], &[], &[]),
                bin(0x00, &[], &k.k(0), &[]),
                bin(0x01, &store_extras(0, 0), &k.k(0), b"a"),
                bin(0x18, &[], &[], &[]),
                bin(0x00, &[], &k.k(0), &[]),
                bin(0x08, &0u32.to_be_bytes(), &[], &[]),
                bin(0x08, &1000u32.to_be_bytes(), &[], &[]),
                bin(0x08, &0u32.to_be_bytes(), &[], &[]),
            ])
        },
    },
    build_case!("binary_unknown_opcodes", |k| b(vec![
        bin(0x30, &[], &[], &[]),
        bin(0x50, &[], &[], b"body"),
        bin(0xfe, &[], &[], &[]),
        bin(0x20, &[], &[], &[]),
        bin(0x00, &[], &k.k(0), &[]),
    ])),
    build_case!("binary_sasl", |_| b(vec![
        bin(0x21, &[], b"PLAIN", b"\0user\0pass"),
        bin(0x22, &[], b"PLAIN", b"\0user\0pass"),
        bin(0x0a, &[], &[], &[]),
    ])),
    build_case!("binary_opaque_datatype_vbucket", |k| {
        let h = BinHeader {
            opcode: 0x0a,
            data_type: 1,
            vbucket: 7,
            opaque: 0xdead_beef,
            ..BinHeader::default()
        };
        b(vec![binary_raw(h), bin(0x00, &[], &k.k(0), &[])])
    }),
    build_case!("binary_key_250", |k| b(vec![
        bin(0x01, &store_extras(0, 0), &k.k_len(0, 250), b"a"),
        bin(0x00, &[], &k.k_len(0, 250), &[]),
    ])),
    build_case!("binary_key_251", |k| b(vec![
        bin(0x00, &[], &k.k_len(0, 251), &[]),
        bin(0x0a, &[], &[], &[]),
    ])),
    build_case!("binary_get_with_extras", |k| b(vec![
        bin(0x00, &[1, 2, 3, 4], &k.k(0), &[]),
        bin(0x0a, &[], &[], &[]),
    ])),
    build_case!("binary_get_with_value", |k| b(vec![bin(0x00, &[], &k.k(0), b"v")])),
    build_case!("binary_get_without_key", |_| b(vec![bin(0x00, &[], &[], &[])])),
    build_case!("binary_set_without_extras", |k| b(vec![bin(0x01, &[], &k.k(0), b"v")])),
    build_case!("binary_noop_with_body", |_| b(vec![bin(0x0a, &[], &[], b"x")])),
    build_case!("binary_body_shorter_than_key", |k| {
        let key = k.k(0);
        let h = BinHeader {
            opcode: 0x00,
            key_len: key.len() as u16,
            body_len: 2,
            ..BinHeader::default()
        };
        b(vec![binary_raw(h), key])
    }),
    build_case!("regression_binary_key_judged_once_it_is_here", |_| {
        let h = BinHeader {
            opcode: 0x0d,
            key_len: 2573,
            extras_len: 10,
            body_len: 0x0d0a_0d0a,
            ..BinHeader::default()
        };
        b(vec![binary_raw(h), b"\r\n".repeat(40)])
    }),
    build_case!("binary_bad_magic_first", |_| b(vec![vec![0x81; 24]])),
    build_case!("binary_bad_magic_later", |k| b(vec![
        bin(0x00, &[], &k.k(0), &[]),
        binary_raw(BinHeader {
            magic: 0x00,
            ..BinHeader::default()
        }),
    ])),
    Case {
        name: "binary_too_large_with_body",
        alone: false,
        build: |k| {
            let mut s = b(vec![bin(0x01, &store_extras(0, 0), &k.k(0), b"a")]);
            s.push(Part::Bytes(bin(0x01, &store_extras(0, 0), &k.k(0), &vec![b'v'; 2_097_152])));
            s.push(Part::Bytes(bin(0x00, &[], &k.k(0), &[])));
            s
        },
    },
    build_case!("binary_split_header", |k| {
        let r = bin(0x01, &store_extras(0, 0), &k.k(0), b"abc");
        vec![
            Part::Bytes(r[..5].to_vec()),
            Part::Split,
            Part::Bytes(r[5..30].to_vec()),
            Part::Split,
            Part::Bytes(r[30..].to_vec()),
            Part::Bytes(bin(0x00, &[], &k.k(0), &[])),
        ]
    }),
];

/// Every command and flag of memcached's protocol.txt (1.6.18), and the cases that
/// exercise it. `pending:` marks what the comparison does not check yet, with why.
const COVERAGE: &[(&str, &[&str])] = &[
    (
        "set",
        &[
            "set_get",
            "set_empty_value",
            "set_binary_value",
            "set_flags_edges",
            "set_flags_junk",
            "set_exptime_edges",
        ],
    ),
    (
        "set noreply",
        &[
            "set_noreply",
            "set_data_longer_noreply",
            "set_key_251_noreply",
        ],
    ),
    ("add / add noreply", &["add"]),
    ("replace / replace noreply", &["replace"]),
    (
        "append / prepend (+ noreply)",
        &[
            "append_prepend",
            "regression_append_ignores_exptime",
            "append_bad_tokens",
            "binary_append_prepend",
        ],
    ),
    (
        "cas / cas noreply",
        &[
            "cas",
            "cas_noreply",
            "cas_bad_unique",
            "cas_after_append",
            "cas_after_touch",
        ],
    ),
    (
        "storage: token counts",
        &[
            "set_extra_token_ignored",
            "set_too_many_tokens",
            "set_too_few_tokens",
        ],
    ),
    (
        "storage: lengths at and beyond int32",
        &[
            "set_length_int32_edges",
            "set_length_64bit",
            "set_length_junk",
        ],
    ),
    (
        "storage: data shorter/longer than announced",
        &[
            "set_data_shorter_than_announced",
            "set_data_longer_than_announced",
            "set_data_bad_terminator",
        ],
    ),
    (
        "storage: keys 250/251, control bytes",
        &["set_key_250", "set_key_251", "set_key_control_bytes"],
    ),
    (
        "storage: value over the limit",
        &["set_too_large_with_body"],
    ),
    (
        "get / gets",
        &[
            "set_get",
            "gets",
            "get_miss_and_multi",
            "get_no_key",
            "get_spacing",
        ],
    ),
    ("get: keys 250/251", &["get_key_251"]),
    ("get: more tokens than MAX_TOKENS", &["get_many_tokens"]),
    ("get: NUL ends the line", &["get_nul_ends_line"]),
    (
        "get: long lines (20,000 keys), split reads",
        &[
            "regression_20000_key_multiget",
            "regression_long_multiget",
            "long_get_split_across_reads",
            "long_get_leading_spaces",
            "regression_long_get_line_of_spaces",
            "long_get_with_large_replies",
        ],
    ),
    ("bget", &["bget"]),
    (
        "gat / gats",
        &["gat_gats", "gat_bad_exptime", "long_gat_line_closes"],
    ),
    (
        "incr / decr (+ noreply)",
        &[
            "incr_decr",
            "incr_large",
            "incr_grows_value",
            "incr_decr_in_place",
            "incr_reads_like_strtoull",
            "incr_noreply",
            "incr_bad_delta",
            "incr_non_numeric",
            "incr_token_counts",
        ],
    ),
    ("touch (+ noreply)", &["touch", "touch_bad"]),
    (
        "delete (+ noreply, hold time)",
        &[
            "delete",
            "delete_hold_time",
            "regression_delete_hold_time_noreply",
            "delete_token_counts",
        ],
    ),
    (
        "flush_all [delay] [noreply]",
        &["flush_all", "flush_all_delayed", "flush_all_bad"],
    ),
    ("verbosity (+ noreply)", &["verbosity"]),
    ("version", &["version"]),
    ("quit", &["quit", "quit_with_tokens"]),
    ("shutdown", &["shutdown_disabled"]),
    (
        "stats / stats settings / stats reset / stats detail",
        &["stats", "stats_detail", "binary_stat_detail"],
    ),
    (
        "slabs reassign|automove, lru, lru_crawler, watch, cache_memlimit, stats items|slabs|sizes|conns|cachedump (intended difference: no slab allocator)",
        &[],
    ),
    (
        "misbehave, debugtime (memcached debug builds only: ERROR in both)",
        &["unknown_commands"],
    ),
    (
        "HTTP request lines",
        &[
            "http_request_closes",
            "http_like_get_is_a_get",
            "http_post_closes",
            "http_routed_commands_are_errors",
        ],
    ),
    (
        "malformed lines, unknown commands",
        &[
            "unknown_commands",
            "empty_and_blank_lines",
            "bare_newlines",
            "many_tokens",
            "tabs_are_not_separators",
        ],
    ),
    (
        "over-long lines of each command",
        &[
            "line_2048_to_16k_in_one_write",
            "line_16k_exactly",
            "line_over_16k_closes",
            "long_gat_line_closes",
        ],
    ),
    (
        "pipelined mixes, splits across reads",
        &[
            "pipelined_mix",
            "pipelined_split_everywhere",
            "binary_split_header",
        ],
    ),
    ("mn", &["meta_noop", "pipelined_mix"]),
    (
        "mg flags b c f h k l O q s t u v",
        &[
            "meta_get_flags",
            "meta_get_hit_last_access",
            "meta_get_u_keeps_hit_before",
            "meta_get_base64",
        ],
    ),
    (
        "mg flags E N R T",
        &["meta_get_touch", "meta_vivify_recache", "meta_get_expire_and_recache"],
    ),
    (
        "mg return flags W X Z",
        &["meta_vivify_recache", "meta_delete_invalidate"],
    ),
    (
        "ms flags b c C F I k O q S T M(E A P R S)",
        &[
            "meta_set_modes",
            "meta_set_flags",
            "meta_set_cas",
            "meta_set_bad",
            "meta_get_base64",
        ],
    ),
    (
        "md flags b C I k O q T",
        &["meta_delete", "meta_delete_invalidate"],
    ),
    (
        "ma flags b C N J D T M q t c v O k",
        &[
            "meta_arith",
            "meta_arith_in_place",
            "meta_arith_non_numeric",
            "meta_arith_error_after_vivify",
        ],
    ),
    ("me", &["meta_debug"]),
    (
        "meta: no key, key 251, long opaque",
        &["meta_no_key", "meta_key_251", "meta_opaque_long"],
    ),
    ("binary GET GETQ GETK GETKQ SET", &["binary_get_set"]),
    (
        "binary ADD ADDQ REPLACE REPLACEQ SETQ",
        &["binary_add_replace"],
    ),
    ("binary CAS field", &["binary_cas", "binary_set_expired"]),
    ("binary DELETE DELETEQ", &["binary_delete", "binary_cas"]),
    (
        "binary INCREMENT(Q) DECREMENT(Q)",
        &["binary_incr_decr", "binary_incr_in_place"],
    ),
    ("binary APPEND(Q) PREPEND(Q)", &["binary_append_prepend"]),
    ("binary TOUCH GAT GATQ GATK GATKQ", &["binary_touch_gat"]),
    ("binary NOOP VERSION STAT", &["binary_noop_version_stat"]),
    ("binary QUIT QUITQ", &["binary_quit", "binary_quitq"]),
    ("binary FLUSH FLUSHQ", &["binary_flush"]),
    ("binary SASL", &["binary_sasl", "binary_unknown_opcodes"]),
    ("binary VERBOSITY (intended difference: memcached 1.6 misframes it)", &[]),
    ("binary unknown opcodes", &["binary_unknown_opcodes"]),
    (
        "binary opaque, data type, vbucket",
        &["binary_opaque_datatype_vbucket"],
    ),
    (
        "binary malformed: key 251, extras, body, magic",
        &[
            "binary_key_250",
            "binary_key_251",
            "binary_get_with_extras",
            "binary_get_with_value",
            "binary_get_without_key",
            "binary_set_without_extras",
            "binary_noop_with_body",
            "binary_body_shorter_than_key",
            "binary_bad_magic_first",
            "binary_bad_magic_later",
            "regression_binary_key_judged_once_it_is_here",
        ],
    ),
    (
        "binary value over the limit",
        &["binary_too_large_with_body"],
    ),
];

/// Every command that reads a line, with the arguments of a well-formed call.
const LINE_COMMANDS: &[&str] = &[
    "set {k0} 0 0 1",
    "add {k0} 0 0 1",
    "replace {k0} 0 0 1",
    "append {k0} 0 0 1",
    "prepend {k0} 0 0 1",
    "cas {k0} 0 0 1 1",
    "get {k0}",
    "gets {k0}",
    "gat 0 {k0}",
    "gats 0 {k0}",
    "bget {k0}",
    "incr {k0} 1",
    "decr {k0} 1",
    "touch {k0} 0",
    "delete {k0}",
    "flush_all 100000000",
    "verbosity 1",
    "version",
    "stats",
    "quit",
    "mg {k0} v",
    "ms {k0} 1",
    "md {k0}",
    "ma {k0}",
    "mn",
    "me {k0}",
    "bogus",
];

/// Cases `line_within_16k_<command>` and `line_over_16k_<command>`: each command's line
/// padded with spaces to 10,000 bytes (handled, when it comes whole in the first read)
/// and to 17,000 (memcached closes without a reply; `get`/`gets` are handled).
fn long_lines_of_each_command() -> Vec<(String, Vec<Part>)> {
    let mut streams = Vec::new();
    for cmd in LINE_COMMANDS {
        let word = cmd.split(' ').next().unwrap_or_default();
        if word == "flush_all" {
            // Would flush the streams running beside it; covered alone by flush_all.
            continue;
        }
        for (name, len) in [("within", 10_000), ("over", 17_000)] {
            let k = Keys::fresh();
            let mut s = template(&k, "set {k0} 0 0 1\r\na\r\n");
            let mut line: Vec<u8> = Vec::new();
            for p in template(&k, cmd) {
                if let Part::Bytes(b) = p {
                    line.extend(b);
                }
            }
            line.resize(len, b' ');
            line.extend_from_slice(b"\r\n");
            if word.starts_with('s') && word != "stats"
                || ["add", "replace", "append", "prepend", "cas", "ms"].contains(&word)
            {
                line.extend_from_slice(b"b\r\n");
            }
            // Alone in its first read, as memcached needs it (see the case of that name).
            s.insert(0, Part::Bytes(line));
            s.swap(0, 1);
            s.insert(1, Part::Sync);
            s.extend(template(&k, "get {k0}\r\n"));
            streams.push((format!("line_{name}_16k_{word}"), s));
        }
    }
    streams
}

/// Cases whose difference is known and owned elsewhere: reported, not failed.
const PENDING: &[&str] = &[];

fn case_named(name: &str) -> Option<&'static Case> {
    CASES.iter().find(|c| c.name == name)
}

#[test]
fn coverage_names_existing_cases() {
    let mut names: Vec<&str> = CASES.iter().map(|c| c.name).collect();
    names.sort_unstable();
    let before = names.len();
    names.dedup();
    assert_eq!(before, names.len(), "two cases share a name");
    for (what, cases) in COVERAGE {
        for name in *cases {
            assert!(case_named(name).is_some(), "{what}: no case named {name}");
        }
    }
    // Every case appears in the coverage table.
    for case in CASES {
        assert!(
            COVERAGE.iter().any(|(_, cases)| cases.contains(&case.name)),
            "case {} is not in the coverage table",
            case.name
        );
    }
}

#[test]
fn the_comparison_fails_on_a_different_reply() {
    let parts = vec![Part::Bytes(b"get a\r\n".to_vec())];
    let reply = |raw: &[u8]| differential::Reply {
        raw: raw.to_vec(),
        normalised: differential::normalise(raw, false),
        end: differential::End::Closed,
    };
    // Equal after normalisation: CAS numbering, version, stats.
    assert!(differential::compare(
        &parts,
        &reply(b"VALUE a 0 1 17\r\nx\r\nVALUE a 0 1 17\r\nx\r\nVERSION 1.6.18\r\nSTAT pid 1\r\nEND\r\n"),
        &reply(b"VALUE a 0 1 9\r\nx\r\nVALUE a 0 1 9\r\nx\r\nVERSION 1.6.18-terrace-0.1.0\r\nSTAT pid 2\r\nSTAT x 3\r\nEND\r\n"),
    )
    .is_ok());
    // One byte apart, a CAS that changed on one side only, a missing reply, a hang.
    for (m, t) in [
        (&b"END\r\n"[..], &b"END \r\n"[..]),
        (
            b"VALUE a 0 1 17\r\nx\r\nVALUE a 0 1 17\r\nx\r\n",
            b"VALUE a 0 1 9\r\nx\r\nVALUE a 0 1 10\r\nx\r\n",
        ),
        (b"STORED\r\n", b""),
        (
            b"VALUE a 0 1\r\nx\r\nEND\r\n",
            b"VALUE a 0 1\r\ny\r\nEND\r\n",
        ),
    ] {
        assert!(
            differential::compare(&parts, &reply(m), &reply(t)).is_err(),
            "{m:?} vs {t:?}"
        );
    }
    let mut hung = reply(b"END\r\n");
    hung.end = differential::End::Hung;
    assert!(differential::compare(&parts, &reply(b"END\r\n"), &hung).is_err());
    // Binary: the CAS field numbered, everything else compared.
    let r1 = [
        vec![0x81, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        77u64.to_be_bytes().to_vec(),
    ]
    .concat();
    let r2 = [
        vec![0x81, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        5u64.to_be_bytes().to_vec(),
    ]
    .concat();
    let r3 = [
        vec![0x81, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0],
        5u64.to_be_bytes().to_vec(),
    ]
    .concat();
    assert_eq!(
        differential::normalise(&r1, true),
        differential::normalise(&r2, true)
    );
    assert_ne!(
        differential::normalise(&r1, true),
        differential::normalise(&r3, true)
    );
}

/// Runs `streams` against both servers, `width` at a time; the differences found.
fn run_all(servers: &Servers, streams: Vec<(String, Vec<Part>)>, width: usize) -> Vec<String> {
    let queue = Mutex::new(streams.into_iter());
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..width {
            s.spawn(|| loop {
                let Some((name, parts)) = queue.lock().expect("queue").next() else {
                    return;
                };
                if let Err(e) = servers.compare(&parts) {
                    failures
                        .lock()
                        .expect("failures")
                        .push(format!("case {name}:\n{e}"));
                }
            });
        }
    });
    failures.into_inner().expect("failures")
}

/// The table, then the generated streams, against one pair of servers.
#[test]
fn terrace_answers_as_memcached_does() {
    let Some(mut servers) = Servers::start() else {
        return;
    };
    let started = std::time::Instant::now();
    // The table: cases that run alone first, one at a time; then the rest in parallel.
    let render = |c: &Case| {
        let keys = Keys::fresh();
        (c.name.to_string(), (c.build)(&keys))
    };
    let alone: Vec<_> = CASES.iter().filter(|c| c.alone).map(render).collect();
    let mut failures = run_all(&servers, alone, 1);
    let mut together: Vec<_> = CASES.iter().filter(|c| !c.alone).map(render).collect();
    together.extend(long_lines_of_each_command());
    failures.extend(run_all(&servers, together, 4));
    let (pending, failures): (Vec<String>, Vec<String>) = failures
        .into_iter()
        .partition(|f| PENDING.iter().any(|p| f.starts_with(&format!("case {p}:"))));
    for p in &pending {
        eprintln!("pending (known difference owned elsewhere):\n{p}\n");
    }
    assert!(
        failures.is_empty(),
        "{} of {} table cases differ from memcached:\n\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n\n")
    );
    eprintln!("table: {} cases in {:?}", CASES.len(), started.elapsed());

    // Generated streams.
    let generated_target = std::env::var("TERRACE_DIFF_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(GENERATED)
        .max(GENERATED);
    let generated = AtomicUsize::new(0);
    let run_batch = |streams: Vec<Vec<Part>>| -> Result<(), TestCaseError> {
        let named = streams
            .into_iter()
            .enumerate()
            .map(|(i, p)| (format!("generated #{i}"), p))
            .collect::<Vec<_>>();
        generated.fetch_add(named.len(), Ordering::Relaxed);
        let failures = run_all(&servers, named, BATCH);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(TestCaseError::fail(failures.join("\n\n")))
        }
    };
    // Each generator's share of the streams, and its runner: a failure is shrunk to a
    // minimal batch (the failing stream, the others reduced to one command each).
    let runner = |share: usize| {
        TestRunner::new(Config {
            cases: (generated_target * share / 100).div_ceil(BATCH) as u32,
            failure_persistence: None,
            max_shrink_iters: 2_000,
            ..Config::default()
        })
    };
    let text = proptest::collection::vec(text_stream(), BATCH);
    if let Err(e) = runner(60).run(&text, |batch| {
        run_batch(batch.iter().map(|s| s.render(&Keys::fresh())).collect())
    }) {
        panic!("a generated ascii stream differs from memcached (shrunk):\n{e}");
    }
    let binary = proptest::collection::vec(binary_stream(), BATCH);
    if let Err(e) = runner(25).run(&binary, |batch| {
        run_batch(batch.iter().map(|s| s.render(&Keys::fresh())).collect())
    }) {
        panic!("a generated binary stream differs from memcached (shrunk):\n{e}");
    }
    let meta = proptest::collection::vec(meta_stream(), BATCH);
    if let Err(e) = runner(15).run(&meta, |batch| {
        run_batch(batch.iter().map(|s| s.render(&Keys::fresh())).collect())
    }) {
        panic!("a generated meta stream differs from memcached (shrunk):\n{e}");
    }
    let n = generated.load(Ordering::Relaxed);
    assert!(n >= generated_target, "only {n} generated streams ran");
    eprintln!(
        "{n} generated streams (and shrinking) compared equal; {:?} in all",
        started.elapsed()
    );
    servers.check_alive();
}

/// Survey: generated meta streams run without stopping at the first difference, every
/// difference printed (`--ignored --nocapture`), for whoever brings meta.rs in line.
#[test]
#[ignore = "a survey, not a check"]
fn meta_differences_survey() {
    use proptest::strategy::{Strategy, ValueTree};
    let Some(servers) = Servers::start() else {
        return;
    };
    let mut runner = TestRunner::default();
    let mut streams = Vec::new();
    for i in 0..2_000 {
        let s = meta_stream()
            .new_tree(&mut runner)
            .expect("a stream")
            .current();
        streams.push((format!("meta #{i}"), s.render(&Keys::fresh())));
    }
    let failures = run_all(&servers, streams, BATCH);
    eprintln!("{} of 2000 meta streams differ", failures.len());
    for f in failures {
        eprintln!("{f}\n");
    }
}

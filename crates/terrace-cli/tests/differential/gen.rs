//! Property-based streams: sequences of commands (well-formed and not), keys of several
//! lengths, numbers at and beyond every limit memcached parses, data blocks shorter or
//! longer than announced, and split points between TCP writes. proptest shrinks a
//! failing stream to fewer commands, simpler tokens and fewer splits.
//!
//! What the generators leave out, and why (the table covers each):
//! - `flush_all` and binary FLUSH: they would empty the other streams running in
//!   parallel; the table runs them alone;
//! - lengths above the value limit, and streams that end inside a data block (a
//!   padding of empty lines closes any a garbage line may have opened): memcached sends
//!   no reply while it waits inside a block;
//! - `get` of a counter after `decr`: memcached pads a shrunk number with spaces in
//!   place (an engine difference listed in the test file), so counters live on key 8,
//!   which only incr/decr read, and stay below 2^63 ([`counter_value`]);
//! - memcached's slab, LRU and log admin commands (intended differences);
//! - close-causing requests (`quit`, malformed binary) anywhere but last, and a bad
//!   magic byte only after a sync point;
//! - a get with an over-long key anywhere but first (see [`get_key`]), get lines over
//!   2,000 bytes;
//! - a CAS from an earlier reply anywhere but in a well-formed line (where the two
//!   servers' different CAS values would be read as a length, they rightly part ways);
//! - meta: `k` with a base64 key, `h`, `u`, an over-long opaque with `N`, `I` with a CAS
//!   from an earlier reply, and `T` that expires the item now with `R` (see
//!   `MetaStream::render`).

use proptest::prelude::*;
use proptest::sample::{select, Index};

use super::{binary_raw, binary_request, BinHeader, Keys, Part};

/// The key only counters use.
const COUNTER: usize = 8;

/// A key of the stream.
#[derive(Clone, Debug)]
pub enum KeyRef {
    Plain(usize),
    /// The key padded to this many bytes (250 is the limit).
    Len(usize, usize),
    /// The key with a control or high byte at its end (memcached takes any byte but
    /// space and newline in a key).
    Odd(usize, u8),
}

impl KeyRef {
    fn render(&self, keys: &Keys) -> Vec<u8> {
        match *self {
            KeyRef::Plain(i) => keys.k(i),
            KeyRef::Len(i, len) => keys.k_len(i, len),
            KeyRef::Odd(i, b) => {
                let mut k = keys.k(i);
                k.push(b);
                k
            }
        }
    }

    fn plain(&self) -> bool {
        !matches!(self, KeyRef::Len(_, n) if *n > 250)
    }
}

fn key_ref() -> impl Strategy<Value = KeyRef> {
    prop_oneof![
        24 => (0usize..4).prop_map(KeyRef::Plain),
        1 => (0usize..4, prop_oneof![Just(250usize), Just(251), Just(300), 16usize..252])
            .prop_map(|(i, l)| KeyRef::Len(i, l)),
        1 => (0usize..4, select(b"\x01\t\x0b\x0c\r\x7f\x80\xff".to_vec()))
            .prop_map(|(i, b)| KeyRef::Odd(i, b)),
    ]
}

/// Numbers as memcached's parsers meet them: small ones mostly, then every edge.
fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u32..100).prop_map(|n| n.to_string()),
        1 => select(vec![
            "-1", "-0", "+1", "01", "x", "1x", "", "4294967295", "4294967296", "2147483647",
            "2147483648", "-2147483648", "-2147483649", "9223372036854775807",
            "9223372036854775808", "18446744073709551615", "18446744073709551616",
            "-18446744073709551615", "\t5", "5\t", "5\tx", "0x10", "1e3",
        ])
        .prop_map(String::from),
    ]
}

/// Expiry times that cannot pass during a run: never, past, far future, and junk.
fn exptime() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just("0".to_string()),
        3 => select(vec![
            "-1", "1000", "100000", "2592000", "2592001", "1000000000", "4000000000",
            "2147483647", "2147483648", "4294967296", "-2147483649", "x", "+1000", "0\t",
        ])
        .prop_map(String::from),
    ]
}

/// A declared length, relative to the data actually sent.
#[derive(Clone, Debug)]
pub enum Length {
    Exact,
    /// Announced this much more (or less) than sent.
    Off(i8),
    /// A token whose parse never lands between the value limit and `INT_MAX - 2`.
    Token(&'static str),
}

fn length() -> impl Strategy<Value = Length> {
    prop_oneof![
        20 => Just(Length::Exact),
        2 => select(vec![-2i8, -1, 1, 2]).prop_map(Length::Off),
        1 => select(vec![
            "-1", "x", "", "2147483646", "2147483647", "2147483648", "4294967296",
            "4294967297", "-2147483649", "+3", "03", "3x",
        ])
        .prop_map(Length::Token),
    ]
}

/// Data bytes: no digits (so only key 8 holds numbers), and bytes that matter to a
/// line parser (`\r`, `\n`, NUL, space).
fn data() -> impl Strategy<Value = Vec<u8>> {
    let byte = select(b"abcXYZ \r\n\0\xff-_.".to_vec());
    prop_oneof![
        12 => proptest::collection::vec(byte.clone(), 0..24),
        // Below 2 KiB: memcached closes a connection whose buffer holds more than 2 KiB
        // of one line, and a desynchronised stream reads data as lines.
        1 => (100usize..2000, byte).prop_map(|(n, b)| vec![b; n]),
    ]
}

/// Counter values below 2^62. memcached checks a stored number of 2^63 or more for a
/// minus sign with `strchr` on the unterminated value, reading past its end: whether
/// it then says "non-numeric" depends on the bytes after the item in memory.
fn counter_value() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => (0u64..1000).prop_map(|n| n.to_string()),
        1 => select(vec![
            "4611686018427387903", "18446744073709551616", "007", "-1", "12abc", "",
        ])
        .prop_map(String::from),
    ]
}

/// Deltas that keep counters below 2^63 (see [`counter_value`]), and malformed ones.
fn delta() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u32..100).prop_map(|n| n.to_string()),
        1 => select(vec![
            "-1", "-0", "+1", "01", "x", "1x", "", "18446744073709551616", "\t5", "5\t",
            "5\tx", "0x10", "1e3", "4611686018427387904", "-18446744073709551615",
        ])
        .prop_map(String::from),
    ]
}

/// The CAS unique of a `cas` command.
#[derive(Clone, Debug)]
pub enum CasArg {
    /// The latest CAS a reply carried (a sync point is sent first).
    Latest,
    Token(String),
}

/// Extra tokens a command line may carry.
fn extras() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        8 => Just(Vec::new()),
        1 => proptest::collection::vec(
            prop_oneof![Just("noreply".to_string()), Just("0".to_string()), number()],
            1..3
        ),
    ]
}

/// One ascii command.
#[derive(Clone, Debug)]
pub enum TextOp {
    Store {
        cmd: &'static str,
        key: KeyRef,
        flags: String,
        exptime: String,
        length: Length,
        data: Vec<u8>,
        cas: CasArg,
        noreply: bool,
        extra: Vec<String>,
        /// A value of this many bytes instead, when the line is surely well formed.
        big: Option<usize>,
    },
    SetCounter {
        value: String,
        noreply: bool,
    },
    Get {
        cmd: &'static str,
        exptime: String,
        keys: Vec<KeyRef>,
    },
    Delete {
        key: KeyRef,
        extra: Vec<String>,
    },
    Arith {
        cmd: &'static str,
        on_counter: bool,
        key: KeyRef,
        delta: String,
        noreply: bool,
        extra: Vec<String>,
    },
    Touch {
        key: KeyRef,
        exptime: String,
        noreply: bool,
        extra: Vec<String>,
    },
    Verbosity(Vec<String>),
    Version(Vec<String>),
    Garbage(Vec<String>),
    /// Any bytes but `\n`, then `\r\n`.
    Raw(Vec<u8>),
    /// Spaces before and after a well-formed get, and a bare `\n` ending.
    OddSpacing {
        before: usize,
        between: usize,
        bare_newline: bool,
        key: KeyRef,
    },
}

fn text_op() -> impl Strategy<Value = TextOp> {
    let store = (
        select(vec!["set", "add", "replace", "append", "prepend", "cas"]),
        key_ref(),
        number(),
        exptime(),
        length(),
        data(),
        prop_oneof![2 => Just(CasArg::Latest), 1 => number().prop_map(CasArg::Token)],
        prop::bool::weighted(0.2),
        (
            extras(),
            prop_oneof![20 => Just(None), 1 => (2_000usize..300_000).prop_map(Some)],
        ),
    )
        .prop_map(
            |(cmd, key, flags, exptime, length, data, cas, noreply, (extra, big))| TextOp::Store {
                cmd,
                key,
                flags,
                exptime,
                length,
                data,
                cas,
                noreply,
                extra,
                big,
            },
        );
    let get = (
        select(vec!["get", "gets", "gat", "gats", "bget"]),
        exptime(),
        prop_oneof![8 => proptest::collection::vec(key_ref(), 0..5), 1 => proptest::collection::vec(key_ref(), 20..40)],
    )
        .prop_map(|(cmd, exptime, keys)| TextOp::Get { cmd, exptime, keys });
    let arith = (
        select(vec!["incr", "decr"]),
        prop::bool::weighted(0.8),
        key_ref(),
        delta(),
        prop::bool::weighted(0.2),
        extras(),
    )
        .prop_map(
            |(cmd, on_counter, key, delta, noreply, extra)| TextOp::Arith {
                cmd,
                on_counter,
                key,
                delta,
                noreply,
                extra,
            },
        );
    let word = prop_oneof![
        select(vec![
            "get",
            "set",
            "cas",
            "incr",
            "gat",
            "touch",
            "delete",
            "noreply",
            "verbosity",
            "version",
            "stats",
            "shutdown",
            "m",
            "mx",
            "GET",
            "",
            "\t",
            "\0",
            "\r",
            "0",
        ])
        .prop_map(String::from),
        "[a-z]{1,6}",
        number(),
    ];
    prop_oneof![
        6 => store,
        2 => (counter_value(), prop::bool::weighted(0.2))
            .prop_map(|(value, noreply)| TextOp::SetCounter { value, noreply }),
        6 => get,
        2 => (key_ref(), extras()).prop_map(|(key, extra)| TextOp::Delete { key, extra }),
        3 => arith,
        2 => (key_ref(), exptime(), prop::bool::weighted(0.2), extras())
            .prop_map(|(key, exptime, noreply, extra)| TextOp::Touch { key, exptime, noreply, extra }),
        1 => proptest::collection::vec(
            prop_oneof![Just("1".to_string()), Just("noreply".to_string()), number()],
            0..4
        )
        .prop_map(TextOp::Verbosity),
        1 => proptest::collection::vec(number(), 0..2).prop_map(TextOp::Version),
        2 => proptest::collection::vec(word, 0..5).prop_map(TextOp::Garbage),
        1 => proptest::collection::vec(any::<u8>().prop_filter("no newline", |&b| b != b'\n'), 0..40)
            .prop_map(TextOp::Raw),
        1 => (0usize..4, 1usize..4, any::<bool>(), key_ref()).prop_map(
            |(before, between, bare_newline, key)| TextOp::OddSpacing {
                before,
                between,
                bare_newline,
                key,
            }
        ),
    ]
}

impl TextOp {
    /// Whether this command may announce a data block longer than what follows it in
    /// the stream: memcached sends no reply while it waits inside a data block, so a
    /// stream ending there would lose the replies still unsent (Terrace sends them when
    /// its input runs dry). Such a block is at most 101 bytes: a garbage line's length
    /// is a number below 100, a store's is its data's plus at most 3.
    fn may_leave_a_block_open(&self) -> bool {
        match self {
            TextOp::Garbage(_) | TextOp::Raw(_) => true,
            // An empty flags or exptime token shifts the length onto a later token.
            TextOp::Store {
                length,
                flags,
                exptime,
                ..
            } => {
                !matches!(length, Length::Exact | Length::Off(..=0))
                    || flags.is_empty()
                    || exptime.is_empty()
            }
            _ => false,
        }
    }
}

/// A generated stream: commands, an optional `quit` at the end, split points.
#[derive(Clone, Debug)]
pub struct TextStream {
    pub ops: Vec<TextOp>,
    pub quit: bool,
    pub splits: Vec<Index>,
}

pub fn text_stream() -> impl Strategy<Value = TextStream> {
    (
        proptest::collection::vec(text_op(), 1..12),
        prop::bool::weighted(0.05),
        proptest::collection::vec(any::<Index>(), 0..4),
    )
        .prop_map(|(ops, quit, splits)| TextStream { ops, quit, splits })
}

/// A key of a get: over-long only in the stream's first command (memcached answers a
/// get with an over-long key by dropping every reply not yet sent on the connection,
/// earlier commands' included: what it drops depends on what it had written).
fn get_key(key: &KeyRef, keys: &Keys, first: bool) -> Vec<u8> {
    match *key {
        KeyRef::Len(i, n) if n > 250 && !first => keys.k_len(i, 250),
        ref k => k.render(keys),
    }
}

fn line(words: &[&[u8]]) -> Vec<u8> {
    let mut l = words.join(&b' ');
    l.extend_from_slice(b"\r\n");
    l
}

impl TextStream {
    pub fn render(&self, keys: &Keys) -> Vec<Part> {
        let mut parts = Vec::new();
        let mut bytes = Vec::new();
        // Whether the server is surely at a command boundary (so a sync point's `mn` is
        // read as a command, not as data).
        let mut clean = true;
        for (i, op) in self.ops.iter().enumerate() {
            let first = i == 0;
            match op {
                TextOp::Store {
                    cmd,
                    key,
                    flags,
                    exptime,
                    length,
                    data,
                    cas,
                    noreply,
                    extra,
                    big,
                } => {
                    let k = key.render(keys);
                    let well_formed = key.plain()
                        && matches!(length, Length::Exact)
                        && flags.parse::<u32>().is_ok()
                        && exptime.parse::<i32>().is_ok()
                        && extra.is_empty();
                    // A large value only where it is surely read as data: a refused line
                    // would have it read as a command line over 2 KiB, which memcached
                    // closes on or not depending on how it arrives.
                    let large;
                    let data = match big {
                        Some(n) if clean && well_formed && *cmd != "cas" => {
                            large = vec![b'v'; *n];
                            &large
                        }
                        _ => data,
                    };
                    let declared = match length {
                        Length::Exact => data.len().to_string(),
                        Length::Off(d) => (data.len() as i64 + i64::from(*d)).max(0).to_string(),
                        Length::Token(t) => t.to_string(),
                    };
                    let mut words: Vec<&[u8]> = vec![
                        cmd.as_bytes(),
                        &k,
                        flags.as_bytes(),
                        exptime.as_bytes(),
                        declared.as_bytes(),
                    ];
                    if *cmd == "cas" {
                        match cas {
                            CasArg::Latest if clean && well_formed => {
                                if !bytes.is_empty() {
                                    parts.push(Part::Bytes(std::mem::take(&mut bytes)));
                                }
                                parts.push(Part::Sync);
                                let mut start = words.join(&b' ');
                                start.push(b' ');
                                parts.push(Part::Bytes(start));
                                parts.push(Part::Cas);
                                words.clear();
                            }
                            CasArg::Latest => words.push(b"1"),
                            CasArg::Token(t) => words.push(t.as_bytes()),
                        }
                    }
                    let tail: Vec<&[u8]> = extra
                        .iter()
                        .map(|s| s.as_bytes())
                        .chain(noreply.then_some(&b"noreply"[..]))
                        .collect();
                    if words.is_empty() {
                        for t in tail {
                            bytes.push(b' ');
                            bytes.extend_from_slice(t);
                        }
                        bytes.extend_from_slice(b"\r\n");
                    } else {
                        words.extend(tail);
                        bytes.extend(line(&words));
                    }
                    bytes.extend_from_slice(data);
                    bytes.extend_from_slice(b"\r\n");
                    clean &= well_formed
                        && !(*cmd == "cas"
                            && matches!(cas, CasArg::Token(t) if t.parse::<u64>().is_err()));
                }
                TextOp::SetCounter { value, noreply } => {
                    let k = keys.k(COUNTER);
                    let n = value.len().to_string();
                    let mut words: Vec<&[u8]> = vec![b"set", &k, b"0", b"0", n.as_bytes()];
                    if *noreply {
                        words.push(b"noreply");
                    }
                    bytes.extend(line(&words));
                    bytes.extend_from_slice(value.as_bytes());
                    bytes.extend_from_slice(b"\r\n");
                }
                TextOp::Get {
                    cmd,
                    exptime,
                    keys: ks,
                } => {
                    let rendered: Vec<Vec<u8>> =
                        ks.iter().map(|k| get_key(k, keys, first)).collect();
                    let mut words: Vec<&[u8]> = vec![cmd.as_bytes()];
                    if cmd.starts_with("gat") {
                        words.push(exptime.as_bytes());
                    }
                    // At most 2,000 bytes: memcached may close on a longer line that
                    // arrives in pieces (a case of the table covers long get lines).
                    let mut len = words.iter().map(|w| w.len() + 1).sum::<usize>();
                    for k in &rendered {
                        len += k.len() + 1;
                        if len > 2_000 {
                            break;
                        }
                        words.push(k);
                    }
                    bytes.extend(line(&words));
                }
                TextOp::Delete { key, extra } => {
                    let k = key.render(keys);
                    let mut words: Vec<&[u8]> = vec![b"delete", &k];
                    words.extend(extra.iter().map(|s| s.as_bytes()));
                    bytes.extend(line(&words));
                }
                TextOp::Arith {
                    cmd,
                    on_counter,
                    key,
                    delta,
                    noreply,
                    extra,
                } => {
                    let k = if *on_counter {
                        keys.k(COUNTER)
                    } else {
                        key.render(keys)
                    };
                    let mut words: Vec<&[u8]> = vec![cmd.as_bytes(), &k, delta.as_bytes()];
                    words.extend(extra.iter().map(|s| s.as_bytes()));
                    if *noreply {
                        words.push(b"noreply");
                    }
                    bytes.extend(line(&words));
                }
                TextOp::Touch {
                    key,
                    exptime,
                    noreply,
                    extra,
                } => {
                    let k = key.render(keys);
                    let mut words: Vec<&[u8]> = vec![b"touch", &k, exptime.as_bytes()];
                    words.extend(extra.iter().map(|s| s.as_bytes()));
                    if *noreply {
                        words.push(b"noreply");
                    }
                    bytes.extend(line(&words));
                }
                TextOp::Verbosity(args) => {
                    let mut words: Vec<&[u8]> = vec![b"verbosity"];
                    words.extend(args.iter().map(|s| s.as_bytes()));
                    bytes.extend(line(&words));
                }
                TextOp::Version(args) => {
                    let mut words: Vec<&[u8]> = vec![b"version"];
                    words.extend(args.iter().map(|s| s.as_bytes()));
                    bytes.extend(line(&words));
                }
                TextOp::Garbage(words) => {
                    let words: Vec<&[u8]> = words.iter().map(|s| s.as_bytes()).collect();
                    bytes.extend(line(&words));
                    // A storage word may make the server read what follows as data.
                    clean = false;
                }
                TextOp::Raw(b) => {
                    bytes.extend_from_slice(b);
                    bytes.extend_from_slice(b"\r\n");
                    clean = false;
                }
                TextOp::OddSpacing {
                    before,
                    between,
                    bare_newline,
                    key,
                } => {
                    bytes.extend(std::iter::repeat_n(b' ', *before));
                    bytes.extend_from_slice(b"get");
                    bytes.extend(std::iter::repeat_n(b' ', *between));
                    bytes.extend(get_key(key, keys, first));
                    bytes.extend_from_slice(if *bare_newline { b"\n" } else { b" \r\n" });
                }
            }
        }
        if self.ops.iter().any(TextOp::may_leave_a_block_open) {
            // Completes any data block a line announced beyond the stream's end (see
            // `may_leave_a_block_open`); at a command boundary each is an empty line.
            for _ in 0..56 {
                bytes.extend_from_slice(b"\r\n");
            }
        }
        if self.quit {
            bytes.extend_from_slice(b"quit\r\n");
        }
        if !bytes.is_empty() {
            parts.push(Part::Bytes(bytes));
        }
        apply_splits(parts, &self.splits)
    }
}

/// Cuts the byte parts at the chosen offsets (over all bytes of the stream).
pub fn apply_splits(parts: Vec<Part>, splits: &[Index]) -> Vec<Part> {
    let total: usize = parts
        .iter()
        .map(|p| match p {
            Part::Bytes(b) => b.len(),
            _ => 0,
        })
        .sum();
    if total < 2 {
        return parts;
    }
    let mut cuts: Vec<usize> = splits.iter().map(|i| 1 + i.index(total - 1)).collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut out = Vec::new();
    let mut at = 0;
    let mut cut = cuts.into_iter().peekable();
    for part in parts {
        let Part::Bytes(b) = part else {
            out.push(part);
            continue;
        };
        let mut start = 0;
        while let Some(&c) = cut.peek() {
            if c >= at + b.len() {
                break;
            }
            cut.next();
            if c > at + start {
                out.push(Part::Bytes(b[start..c - at].to_vec()));
                out.push(Part::Split);
                start = c - at;
            }
        }
        out.push(Part::Bytes(b[start..].to_vec()));
        at += b.len();
    }
    out
}

// ---------------------------------------------------------------------------------------
// Binary

/// The opcodes a generated binary stream uses anywhere (see the module header for those
/// it leaves out), with unknown ones.
const BINARY_OPCODES: &[u8] = &[
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11,
    0x12, 0x13, 0x14, 0x15, 0x16, 0x19, 0x1a, 0x1c, 0x1d, 0x1e, 0x23, 0x24, 0x30, 0x50,
];

/// The CAS field of a binary request.
#[derive(Clone, Debug)]
pub enum BinCas {
    Zero,
    Latest,
    Bogus,
}

#[derive(Clone, Debug)]
pub struct BinOp {
    pub opcode: u8,
    pub key: KeyRef,
    pub on_counter: bool,
    pub value: Vec<u8>,
    pub cas: BinCas,
    pub opaque: u32,
    pub flags: u32,
    pub exptime: u32,
    pub delta: u64,
    pub initial: u64,
    pub data_type: u8,
    pub vbucket: u16,
}

fn bin_op() -> impl Strategy<Value = BinOp> {
    (
        select(BINARY_OPCODES.to_vec()),
        key_ref(),
        prop::bool::weighted(0.3),
        prop_oneof![
            20 => data(),
            1 => (2_000usize..300_000, any::<u8>()).prop_map(|(n, b)| vec![b; n]),
        ],
        prop_oneof![3 => Just(BinCas::Zero), 2 => Just(BinCas::Latest), 1 => Just(BinCas::Bogus)],
        prop_oneof![Just(0u32), any::<u32>()],
        prop_oneof![Just(0u32), any::<u32>()],
        // No past times: Terrace answers a store of an expired item with CAS 0 (pending).
        select(vec![
            0u32,
            0,
            0,
            1000,
            100000,
            2592000,
            4000000000,
            0xffff_ffff,
        ]),
        // Below 2^62: see `counter_value`.
        prop_oneof![Just(1u64), 0u64..1000, 0u64..1 << 62],
        prop_oneof![Just(0u64), 0u64..1000, 0u64..1 << 62],
        prop_oneof![9 => Just(0u8), 1 => any::<u8>()],
        prop_oneof![9 => Just(0u16), 1 => any::<u16>()],
    )
        .prop_map(
            |(
                opcode,
                key,
                on_counter,
                value,
                cas,
                opaque,
                flags,
                exptime,
                delta,
                initial,
                data_type,
                vbucket,
            )| BinOp {
                opcode,
                key,
                on_counter,
                value,
                cas,
                opaque,
                flags,
                exptime,
                delta,
                initial,
                data_type,
                vbucket,
            },
        )
}

/// A malformed last request: one that closes the connection (or a quit).
#[derive(Clone, Debug)]
pub enum BinLast {
    None,
    Quit(bool),
    BadExtras(u8, u8),
    KeyTooLong(u8),
    ShortBody(u8),
    BadMagic(u8),
    MissingKey(u8),
}

fn bin_last() -> impl Strategy<Value = BinLast> {
    let op = select(BINARY_OPCODES.to_vec());
    prop_oneof![
        12 => Just(BinLast::None),
        1 => any::<bool>().prop_map(BinLast::Quit),
        // Known opcodes only: memcached misframes an unknown one with extras.
        1 => (select(BINARY_OPCODES[..28].to_vec()), 1u8..30).prop_map(|(o, e)| BinLast::BadExtras(o, e)),
        1 => op.clone().prop_map(BinLast::KeyTooLong),
        1 => op.clone().prop_map(BinLast::ShortBody),
        1 => any::<u8>().prop_map(BinLast::BadMagic),
        1 => op.prop_map(BinLast::MissingKey),
    ]
}

#[derive(Clone, Debug)]
pub struct BinaryStream {
    pub ops: Vec<BinOp>,
    pub last: BinLast,
    pub splits: Vec<Index>,
}

pub fn binary_stream() -> impl Strategy<Value = BinaryStream> {
    (
        proptest::collection::vec(bin_op(), 1..8),
        bin_last(),
        proptest::collection::vec(any::<Index>(), 0..4),
    )
        .prop_map(|(ops, last, splits)| BinaryStream { ops, last, splits })
}

/// The extras an opcode takes, from the op's fields.
fn extras_of(op: &BinOp) -> Vec<u8> {
    let mut e = Vec::new();
    match op.opcode {
        0x01..=0x03 | 0x11..=0x13 => {
            e.extend_from_slice(&op.flags.to_be_bytes());
            e.extend_from_slice(&op.exptime.to_be_bytes());
        }
        0x05 | 0x06 | 0x15 | 0x16 => {
            e.extend_from_slice(&op.delta.to_be_bytes());
            e.extend_from_slice(&op.initial.to_be_bytes());
            e.extend_from_slice(&op.exptime.to_be_bytes());
        }
        0x1c | 0x1d | 0x1e | 0x23 | 0x24 => e.extend_from_slice(&op.exptime.to_be_bytes()),
        _ => {}
    }
    e
}

/// Whether the opcode takes a key, a value.
fn takes(opcode: u8) -> (bool, bool) {
    match opcode {
        0x0a | 0x0b => (false, false),
        0x10 => (false, false),
        0x01..=0x03 | 0x11..=0x13 | 0x0e | 0x0f | 0x19 | 0x1a => (true, true),
        0x30 | 0x50 => (false, true),
        _ => (true, false),
    }
}

/// A request of no particular fields.
fn blank_op() -> BinOp {
    BinOp {
        opcode: 0,
        key: KeyRef::Plain(0),
        on_counter: false,
        value: Vec::new(),
        cas: BinCas::Zero,
        opaque: 0,
        flags: 0,
        exptime: 0,
        delta: 1,
        initial: 0,
        data_type: 0,
        vbucket: 0,
    }
}

impl BinaryStream {
    pub fn render(&self, keys: &Keys) -> Vec<Part> {
        let mut parts = Vec::new();
        for op in &self.ops {
            let (with_key, with_value) = takes(op.opcode);
            let numeric = matches!(op.opcode, 0x05 | 0x06 | 0x15 | 0x16);
            let key = if !with_key {
                Vec::new()
            } else if numeric || (op.on_counter && matches!(op.opcode, 0x01 | 0x11)) {
                keys.k(COUNTER)
            } else {
                // Malformed lengths only in the last request.
                match op.key {
                    KeyRef::Len(i, n) if n > 250 => keys.k_len(i, 250),
                    ref k => k.render(keys),
                }
            };
            let value: Vec<u8> = if !with_value {
                Vec::new()
            } else if op.on_counter && matches!(op.opcode, 0x01 | 0x11) {
                op.initial.to_string().into_bytes()
            } else {
                op.value.clone()
            };
            let extras = extras_of(op);
            let mut header = BinHeader {
                opcode: op.opcode,
                key_len: key.len() as u16,
                extras_len: extras.len() as u8,
                data_type: op.data_type,
                vbucket: op.vbucket,
                body_len: (extras.len() + key.len() + value.len()) as u32,
                opaque: op.opaque,
                cas: 0,
                ..BinHeader::default()
            };
            let latest = matches!(op.cas, BinCas::Latest);
            if matches!(op.cas, BinCas::Bogus) {
                header.cas = 0x0123_4567_89ab;
            }
            let raw = binary_raw(header);
            if latest {
                parts.push(Part::Sync);
                parts.push(Part::Bytes(raw[..16].to_vec()));
                parts.push(Part::Cas);
            } else {
                parts.push(Part::Bytes(raw[..16].to_vec()));
                parts.push(Part::Bytes(raw[16..].to_vec()));
            }
            let mut body = extras;
            body.extend_from_slice(&key);
            body.extend_from_slice(&value);
            parts.push(Part::Bytes(body));
        }
        let k = keys.k(0);
        let last = match self.last {
            BinLast::None => None,
            BinLast::Quit(quiet) => Some(binary_request(
                if quiet { 0x17 } else { 0x07 },
                &[],
                &[],
                &[],
                0,
                7,
            )),
            BinLast::BadExtras(op, n) => {
                // Never the length the opcode takes.
                let right = extras_of(&BinOp {
                    opcode: op,
                    ..blank_op()
                })
                .len();
                let n = if usize::from(n) == right { n + 1 } else { n };
                Some(binary_request(op, &vec![0; n as usize], &k, &[], 0, 7))
            }
            BinLast::KeyTooLong(op) => {
                Some(binary_request(op, &[], &keys.k_len(0, 251), &[], 0, 7))
            }
            BinLast::ShortBody(op) => {
                let mut h = BinHeader {
                    opcode: op,
                    key_len: k.len() as u16,
                    body_len: k.len() as u32 - 1,
                    opaque: 7,
                    ..BinHeader::default()
                };
                h.extras_len = 0;
                let mut r = binary_raw(h);
                r.extend_from_slice(&k);
                Some(r)
            }
            BinLast::BadMagic(m) => {
                let m = if m == 0x80 { 0x81 } else { m };
                Some(binary_raw(BinHeader {
                    magic: m,
                    opcode: 0x0a,
                    ..BinHeader::default()
                }))
            }
            BinLast::MissingKey(op) => {
                let extras = extras_of(&BinOp {
                    opcode: op,
                    ..blank_op()
                });
                Some(binary_request(op, &extras, &[], &[], 0, 7))
            }
        };
        if let Some(last) = last {
            if matches!(self.last, BinLast::BadMagic(_)) {
                // memcached closes at a bad magic byte at once, dropping the replies it
                // has not sent yet: have them all first.
                parts.push(Part::Sync);
            }
            parts.push(Part::Bytes(last));
        }
        apply_splits(parts, &self.splits)
    }
}

// ---------------------------------------------------------------------------------------
// Meta commands

/// A meta flag: its letter and its token (empty for flags that take none).
#[derive(Clone, Debug)]
pub struct MetaFlag(pub char, pub String);

fn ttl_token() -> impl Strategy<Value = String> {
    select(vec![
        "0",
        "-1",
        "1000",
        "100000",
        "x",
        "",
        "4294967296",
        "2147483648",
    ])
    .prop_map(String::from)
}

/// Flags of each meta command as protocol.txt lists them, with tokens at their edges,
/// and some letters no command takes.
fn meta_flag(cmd: &'static str) -> BoxedStrategy<MetaFlag> {
    let bare = |letters: &'static str| {
        select(letters.chars().collect::<Vec<_>>()).prop_map(|c| MetaFlag(c, String::new()))
    };
    let with = |letters: &'static str, token: BoxedStrategy<String>| {
        (select(letters.chars().collect::<Vec<_>>()), token).prop_map(|(c, t)| MetaFlag(c, t))
    };
    let opaque = prop_oneof![
        5 => (0u32..1000).prop_map(|n| n.to_string()),
        1 => Just("x".repeat(32)),
        1 => Just("x".repeat(33)),
        1 => Just(String::new()),
    ]
    .boxed();
    let number = number().boxed();
    let odd = bare("aKYz");
    match cmd {
        "mg" => prop_oneof![
            8 => bare("cfhklqstuv"),
            2 => with("O", opaque),
            3 => with("NRT", ttl_token().boxed()),
            1 => odd,
        ]
        .boxed(),
        "ms" => prop_oneof![
            6 => bare("ckqI"),
            2 => with("O", opaque),
            2 => with("F", number.clone()),
            2 => with("T", ttl_token().boxed()),
            2 => with("M", select(vec!["E", "A", "P", "R", "S", "a", "x", "", "ES"]).prop_map(String::from).boxed()),
            1 => with("C", number),
            1 => odd,
        ]
        .boxed(),
        "md" => prop_oneof![
            6 => bare("kqI"),
            2 => with("O", opaque),
            2 => with("T", ttl_token().boxed()),
            1 => with("C", number),
            1 => odd,
        ]
        .boxed(),
        _ => prop_oneof![
            6 => bare("qtcvk"),
            2 => with("O", opaque),
            2 => with("NT", ttl_token().boxed()),
            2 => with("JD", delta().boxed()),
            2 => with("M", select(vec!["I", "D", "+", "-", "i", "d", "x", ""]).prop_map(String::from).boxed()),
            1 => odd,
        ]
        .boxed(),
    }
}

/// One meta command.
#[derive(Clone, Debug)]
pub enum MetaOp {
    Get {
        key: KeyRef,
        base64: bool,
        flags: Vec<MetaFlag>,
    },
    Set {
        key: KeyRef,
        base64: bool,
        flags: Vec<MetaFlag>,
        data: Vec<u8>,
        length: Length,
        cas: bool,
    },
    Delete {
        key: KeyRef,
        base64: bool,
        flags: Vec<MetaFlag>,
        cas: bool,
    },
    Arith {
        on_counter: bool,
        key: KeyRef,
        flags: Vec<MetaFlag>,
    },
    SetCounter(String),
    Noop,
}

fn meta_op() -> impl Strategy<Value = MetaOp> {
    let flags = |cmd| proptest::collection::vec(meta_flag(cmd), 0..5);
    let base64 = prop::bool::weighted(0.1);
    prop_oneof![
        6 => (key_ref(), base64, flags("mg")).prop_map(|(key, base64, flags)| MetaOp::Get { key, base64, flags }),
        5 => (key_ref(), base64, flags("ms"), data(), prop_oneof![8 => Just(Length::Exact), 1 => length()], prop::bool::weighted(0.2))
            .prop_map(|(key, base64, flags, data, length, cas)| MetaOp::Set { key, base64, flags, data, length, cas }),
        2 => (key_ref(), base64, flags("md"), prop::bool::weighted(0.2))
            .prop_map(|(key, base64, flags, cas)| MetaOp::Delete { key, base64, flags, cas }),
        3 => (prop::bool::weighted(0.7), key_ref(), flags("ma"))
            .prop_map(|(on_counter, key, flags)| MetaOp::Arith { on_counter, key, flags }),
        1 => counter_value().prop_map(MetaOp::SetCounter),
        1 => Just(MetaOp::Noop),
    ]
}

#[derive(Clone, Debug)]
pub struct MetaStream {
    pub ops: Vec<MetaOp>,
    pub splits: Vec<Index>,
}

pub fn meta_stream() -> impl Strategy<Value = MetaStream> {
    (
        proptest::collection::vec(meta_op(), 1..8),
        proptest::collection::vec(any::<Index>(), 0..4),
    )
        .prop_map(|(ops, splits)| MetaStream { ops, splits })
}

fn base64(b: &[u8]) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    for chunk in b.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &c)| n | u32::from(c) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]);
            } else {
                out.push(b'=');
            }
        }
    }
    out
}

/// Whether a meta command names this key in base64 (with `b`): always for key 3, never
/// for the others. memcached answers `k` in base64 when the item was stored with `b`,
/// a per-item bit Terrace does not keep (a documented difference), so a key is
/// always spelled one way.
fn b64_of(key: &KeyRef) -> bool {
    matches!(
        key,
        KeyRef::Plain(3) | KeyRef::Len(3, _) | KeyRef::Odd(3, _)
    )
}

impl MetaStream {
    pub fn render(&self, keys: &Keys) -> Vec<Part> {
        let mut parts = Vec::new();
        let mut bytes = Vec::new();
        let mut clean = true;
        // The generator steers clear of `k` of a base64 key: memcached answers it
        // decoded for an item that mg N created (the per-item bit of the documented k/b
        // difference); and of `h`, which Terrace sets after an overwrite (documented: its
        // eviction policy counts an overwrite, a touch included, as an access).
        let flag_words = |flags: &[MetaFlag], b64: bool| -> Vec<Vec<u8>> {
            flags
                .iter()
                .filter(|f| f.0 != 'h' && !(b64 && f.0 == 'k'))
                .map(|MetaFlag(c, t)| format!("{c}{t}").into_bytes())
                .collect()
        };
        let key_of = |key: &KeyRef, b64: bool| {
            let k = key.render(keys);
            if b64 {
                base64(&k)
            } else {
                k
            }
        };
        for op in &self.ops {
            match op {
                MetaOp::Get {
                    key,
                    base64: _,
                    flags,
                } => {
                    let k = key_of(key, b64_of(key));
                    let mut words = vec![b"mg".to_vec(), k];
                    if b64_of(key) {
                        words.push(b"b".to_vec());
                    }
                    words.extend(flag_words(flags, b64_of(key)));
                    let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
                    bytes.extend(line(&refs));
                }
                MetaOp::Set {
                    key,
                    base64: _,
                    flags,
                    data,
                    length,
                    cas,
                } => {
                    let k = key_of(key, b64_of(key));
                    let declared = match length {
                        Length::Exact => data.len().to_string(),
                        Length::Off(d) => (data.len() as i64 + i64::from(*d)).max(0).to_string(),
                        Length::Token(t) => t.to_string(),
                    };
                    let mut words = vec![b"ms".to_vec(), k, declared.into_bytes()];
                    if b64_of(key) {
                        words.push(b"b".to_vec());
                    }
                    let with_cas = *cas && clean;
                    // Pending in meta.rs: `I` with a CAS from an earlier reply was seen
                    // answered EX by memcached, HD by Terrace.
                    words.extend(
                        flag_words(flags, b64_of(key))
                            .into_iter()
                            .filter(|w| !(with_cas && w.first() == Some(&b'I'))),
                    );
                    let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
                    let mut l = refs.join(&b' ');
                    if with_cas {
                        if !bytes.is_empty() {
                            parts.push(Part::Bytes(std::mem::take(&mut bytes)));
                        }
                        parts.push(Part::Sync);
                        l.extend_from_slice(b" C");
                        parts.push(Part::Bytes(l));
                        parts.push(Part::Cas);
                    } else {
                        bytes.extend(l);
                    }
                    bytes.extend_from_slice(b"\r\n");
                    bytes.extend_from_slice(data);
                    bytes.extend_from_slice(b"\r\n");
                    clean &= matches!(length, Length::Exact) && key.plain();
                }
                MetaOp::Delete {
                    key,
                    base64: _,
                    flags,
                    cas,
                } => {
                    let k = key_of(key, b64_of(key));
                    let mut words = vec![b"md".to_vec(), k];
                    if b64_of(key) {
                        words.push(b"b".to_vec());
                    }
                    words.extend(flag_words(flags, b64_of(key)));
                    let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
                    let mut l = refs.join(&b' ');
                    if *cas && clean {
                        if !bytes.is_empty() {
                            parts.push(Part::Bytes(std::mem::take(&mut bytes)));
                        }
                        parts.push(Part::Sync);
                        l.extend_from_slice(b" C");
                        parts.push(Part::Bytes(l));
                        parts.push(Part::Cas);
                    } else {
                        bytes.extend(l);
                    }
                    bytes.extend_from_slice(b"\r\n");
                }
                MetaOp::Arith {
                    on_counter,
                    key,
                    flags,
                } => {
                    let k = if *on_counter {
                        keys.k(COUNTER)
                    } else {
                        key.render(keys)
                    };
                    let mut words = vec![b"ma".to_vec(), k];
                    words.extend(flag_words(flags, b64_of(key)));
                    let refs: Vec<&[u8]> = words.iter().map(|w| w.as_slice()).collect();
                    bytes.extend(line(&refs));
                }
                MetaOp::SetCounter(value) => {
                    let n = value.len().to_string();
                    let k = keys.k(COUNTER);
                    bytes.extend(line(&[b"ms", &k, n.as_bytes()]));
                    bytes.extend_from_slice(value.as_bytes());
                    bytes.extend_from_slice(b"\r\n");
                }
                MetaOp::Noop => bytes.extend_from_slice(b"mn\r\n"),
            }
        }
        if self.ops.iter().any(|op| matches!(op, MetaOp::Set { length, .. } if !matches!(length, Length::Exact | Length::Off(..=0)))) {
            for _ in 0..56 {
                bytes.extend_from_slice(b"\r\n");
            }
        }
        if !bytes.is_empty() {
            parts.push(Part::Bytes(bytes));
        }
        apply_splits(parts, &self.splits)
    }
}

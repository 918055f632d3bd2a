//! Property and fuzz-style tests of the segment codec: round trips, truncation yields a
//! prefix, single-byte damage inside the committed range is detected, and arbitrary bytes
//! (with or without a valid header in front) never panic the decoder.

use proptest::prelude::*;
use terrace_cache::item::{self, ItemLimits, ItemSpec, ItemState};
use terrace_cache::segment::{
    self, ScanEnd, SegmentHeader, SegmentReader, SegmentWriter, HEADER_LEN,
};
use terrace_cache::EncodeError;

const SHIFT: u8 = 12;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Written {
    offset: u32,
    key: Vec<u8>,
    value: Vec<u8>,
    flags: u32,
    expires: u32,
    origin: Option<u64>,
}

fn header(checksummed: bool) -> SegmentHeader {
    SegmentHeader {
        tier: 0,
        size_shift: SHIFT,
        checksummed,
        write_seq: 7,
        slot: 3,
        created_at: 1,
        expires_at: 0,
        ttl_bucket: 0,
    }
}

fn limits() -> ItemLimits {
    ItemLimits {
        max_key_len: 300,
        max_value_len: 1 << 20,
    }
}

/// Key, value, client flags, expiry, origin CAS.
type Generated = (Vec<u8>, Vec<u8>, u32, u32, Option<u64>);

fn item_strategy() -> impl Strategy<Value = Generated> {
    (
        prop::collection::vec(any::<u8>(), 1..=300),
        prop::collection::vec(any::<u8>(), 0..400),
        prop_oneof![3 => Just(0u32), 1 => any::<u32>()],
        prop_oneof![3 => Just(0u32), 1 => any::<u32>()],
        prop_oneof![3 => Just(None), 1 => any::<u64>().prop_map(Some)],
    )
}

/// Appends items until one does not fit; returns the buffer and what was written.
fn build(items: &[Generated], checksummed: bool) -> (Vec<u8>, Vec<Written>) {
    let mut buf = vec![0u8; 1 << SHIFT];
    let mut written = vec![];
    let mut w = SegmentWriter::create(&mut buf, header(checksummed), limits()).unwrap();
    for (key, value, flags, expires, origin) in items {
        let spec = ItemSpec {
            client_flags: *flags,
            expires_at: *expires,
            origin_cas: *origin,
            ..ItemSpec::new(key, value.len())
        };
        match w.append(&spec, key, value) {
            Ok(offset) => written.push(Written {
                offset,
                key: key.clone(),
                value: value.clone(),
                flags: *flags,
                expires: *expires,
                origin: *origin,
            }),
            Err(EncodeError::SegmentFull { .. }) => break,
            Err(e) => panic!("unexpected {e}"),
        }
    }
    (buf, written)
}

fn read_all(buf: &[u8]) -> (Vec<Written>, Option<ScanEnd>) {
    let r = SegmentReader::open(buf).unwrap();
    let mut it = r.items();
    let got = it
        .by_ref()
        .map(|i| Written {
            offset: i.offset,
            key: i.key.to_vec(),
            value: i.value.to_vec(),
            flags: i.client_flags,
            expires: i.expires_at,
            origin: i.origin_cas,
        })
        .collect();
    (got, it.end().cloned())
}

/// Walks a segment that may be garbage; must not panic, and whatever it yields lies
/// inside the buffer and the committed range.
fn walk_anything(buf: &[u8]) {
    if let Ok(r) = SegmentReader::open(buf) {
        let end = r.committed_end();
        let mut it = r.items();
        let mut prev_end = HEADER_LEN as u64;
        for i in it.by_ref() {
            assert_eq!(u64::from(i.offset), prev_end);
            prev_end = u64::from(i.end());
            assert!(prev_end <= end && prev_end as usize <= buf.len());
            assert!(!i.key.is_empty());
        }
        assert!(it.end().is_some());
        let _ = r.verify();
        let _ = r.item_at(HEADER_LEN as u32 + 1);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn round_trip(items in prop::collection::vec(item_strategy(), 0..24), checksummed in any::<bool>()) {
        let (buf, written) = build(&items, checksummed);
        let (got, end) = read_all(&buf);
        prop_assert_eq!(end, Some(ScanEnd::Complete));
        prop_assert_eq!(&got, &written);
        let r = SegmentReader::open(&buf).unwrap();
        for w in &written {
            let i = r.item_at(w.offset).unwrap();
            prop_assert_eq!(i.key, &w.key[..]);
            prop_assert_eq!(i.state, ItemState::Pending);
            // Re-encoding a decoded item reproduces its bytes exactly (canonical format).
            let mut again = vec![0u8; i.len as usize];
            item::encode(&i.spec(), i.key, i.value, &mut again).unwrap();
            prop_assert_eq!(&again[..], &buf[w.offset as usize..i.end() as usize]);
            prop_assert_eq!(r.header().cas_of(&i), w.origin.unwrap_or((7u64 << SHIFT) | u64::from(w.offset)));
        }
    }

    #[test]
    fn state_flips_keep_the_segment_valid(
        items in prop::collection::vec(item_strategy(), 1..16),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3), 0..16),
    ) {
        let (mut buf, written) = build(&items, true);
        prop_assume!(!written.is_empty());
        let mut expect: Vec<ItemState> = written.iter().map(|_| ItemState::Pending).collect();
        for (which, state) in flips {
            let i = which.index(written.len());
            let state = [ItemState::Dead, ItemState::Pending, ItemState::Live][state as usize];
            prop_assert!(item::set_state(&mut buf, written[i].offset, state));
            expect[i] = state;
        }
        let r = SegmentReader::open(&buf).unwrap();
        let states: Vec<ItemState> = r.items().map(|i| i.state).collect();
        prop_assert_eq!(states, expect);
        prop_assert_eq!(r.verify(), ScanEnd::Complete);
    }

    #[test]
    fn truncation_yields_a_prefix(items in prop::collection::vec(item_strategy(), 0..24), cut in 0usize..(1 << SHIFT)) {
        let (buf, written) = build(&items, true);
        let cut_buf = &buf[..cut];
        match SegmentReader::open(cut_buf) {
            Err(_) => prop_assert!(cut < HEADER_LEN),
            Ok(r) => {
                let (got, end) = read_all(cut_buf);
                prop_assert!(got.len() <= written.len());
                prop_assert_eq!(&got[..], &written[..got.len()]);
                if cut as u64 >= r.committed_end() {
                    prop_assert_eq!(got.len(), written.len());
                    prop_assert_eq!(end, Some(ScanEnd::Complete));
                } else {
                    // Every item wholly inside the cut comes back.
                    let inside = written.iter().filter(|w| {
                        (w.offset as usize) + item::ItemSpec {
                            client_flags: w.flags,
                            expires_at: w.expires,
                            origin_cas: w.origin,
                            ..ItemSpec::new(&w.key, w.value.len())
                        }.encoded_len() <= cut
                    }).count();
                    prop_assert_eq!(got.len(), inside);
                    prop_assert!(matches!(end, Some(ScanEnd::Truncated { .. })), "{:?}", end);
                }
            }
        }
    }

    #[test]
    fn damage_inside_the_committed_range_is_detected(
        items in prop::collection::vec(item_strategy(), 1..16),
        at in any::<prop::sample::Index>(),
        xor in 1u8..=255,
    ) {
        let (mut buf, written) = build(&items, true);
        prop_assume!(!written.is_empty());
        let end = SegmentReader::open(&buf).unwrap().committed_end() as usize;
        let pos = HEADER_LEN + at.index(end - HEADER_LEN);
        buf[pos] ^= xor;
        let is_state_byte = written.iter().any(|w| w.offset as usize == pos);
        let verdict = SegmentReader::open(&buf).unwrap().verify();
        if is_state_byte {
            // State bytes are outside the checksum: either still a valid state or corrupt.
            prop_assert!(matches!(verdict, ScanEnd::Complete | ScanEnd::Corrupt { .. }), "{:?}", verdict);
        } else {
            prop_assert!(!verdict.is_complete(), "undetected damage at {}", pos);
        }
        walk_anything(&buf);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048), offset in any::<u32>(), end in any::<usize>()) {
        walk_anything(&bytes);
        let _ = item::decode(&bytes, offset, end);
        let _ = item::decode(&bytes, offset % 64, bytes.len());
        let _ = SegmentHeader::decode(&bytes);
    }

    /// The fuzz that matters: a valid header (so the item walker runs) over random bytes
    /// and a random committed length.
    #[test]
    fn valid_header_over_random_items_never_panics(
        body in prop::collection::vec(any::<u8>(), 0..((1 << SHIFT) - HEADER_LEN)),
        committed in 0u32..((1 << SHIFT) as u32 - HEADER_LEN as u32),
        truncate_to in any::<prop::sample::Index>(),
        checksummed in any::<bool>(),
    ) {
        let mut buf = vec![0u8; 1 << SHIFT];
        buf[..HEADER_LEN].copy_from_slice(&header(checksummed).encode().unwrap());
        buf[HEADER_LEN..HEADER_LEN + body.len()].copy_from_slice(&body);
        buf[56..60].copy_from_slice(&committed.to_le_bytes());
        walk_anything(&buf);
        let cut = truncate_to.index(buf.len() + 1);
        walk_anything(&buf[..cut]);
    }

    /// Retiring a segment (zeroing its commit word) hides every item it held.
    #[test]
    fn retired_segments_show_nothing(items in prop::collection::vec(item_strategy(), 0..8)) {
        let (mut buf, _) = build(&items, true);
        prop_assert!(segment::retire(&mut buf));
        let (got, end) = read_all(&buf);
        prop_assert!(got.is_empty());
        prop_assert_eq!(end, Some(ScanEnd::Complete));
    }
}

#[test]
fn random_byte_storm_with_valid_headers() {
    // Deterministic fuzz loop (xorshift), cheap enough to run every time: 20,000 segments
    // of 512 bytes behind a valid header with a random commit word. Half start from
    // random bytes biased towards valid-looking ones, half from a real segment with a few
    // bytes damaged, so the walker gets deep into the committed range.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let h = SegmentHeader {
        size_shift: 9,
        ..header(true)
    };
    let mut real = vec![0u8; 512];
    {
        let mut w = SegmentWriter::create(&mut real, h, limits()).unwrap();
        let mut n = 0u32;
        while w
            .append(
                &ItemSpec {
                    client_flags: n % 3,
                    ..ItemSpec::new(&n.to_le_bytes(), (n % 40) as usize)
                },
                &n.to_le_bytes(),
                &vec![n as u8; (n % 40) as usize],
            )
            .is_ok()
        {
            n += 1;
        }
    }
    let mut buf = vec![0u8; 512];
    let mut items_seen = 0usize;
    for round in 0..20_000 {
        if round % 2 == 0 {
            buf[..HEADER_LEN].copy_from_slice(&h.encode().unwrap());
            for b in buf[HEADER_LEN..].iter_mut() {
                let r = next();
                *b = match r % 8 {
                    0 => item::STATE_LIVE,
                    1 => 0,
                    2 => (r >> 8) as u8 & 0x0F,
                    _ => (r >> 16) as u8,
                };
            }
            let committed = (next() % 449) as u32;
            buf[56..60].copy_from_slice(&committed.to_le_bytes());
        } else {
            buf.copy_from_slice(&real);
            for _ in 0..1 + next() % 4 {
                let at = HEADER_LEN + (next() % 448) as usize;
                buf[at] = next() as u8;
            }
        }
        let cut = if round % 4 < 2 {
            (next() % 513) as usize
        } else {
            512
        };
        if let Ok(r) = SegmentReader::open(&buf[..cut]) {
            items_seen += r.items().count();
        }
        walk_anything(&buf[..cut]);
    }
    // The fuzz reaches past the first item.
    assert!(items_seen > 20_000, "{items_seen}");
}

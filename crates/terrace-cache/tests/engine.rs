//! The concurrent engine ([`Cache`]): memcached operations, TTLs, eviction with
//! demotion between tiers, bad input, and a property test against a `HashMap` model in
//! which the only divergence allowed is a miss (an evicted key).

use std::collections::HashMap;

use proptest::prelude::*;
use terrace_cache::cache::number;
use terrace_cache::{
    Cache, CacheConfig, CacheError, Checked, Delta, Side, Store, TierConfig, TierSize,
};

mod common;
use common::{flash_dir, set_with_ttl, MIB};

/// The shared test configuration, with values up to 16 KiB (half a segment).
fn config(tiers: Vec<TierConfig>) -> CacheConfig {
    let mut config = common::config(tiers);
    config.limits.max_value_len = 16 << 10;
    config
}

fn dram(mib: u64) -> TierConfig {
    TierConfig::dram(TierSize::Bytes(mib * MIB))
}

fn value(seed: u32, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed as usize * 31 + i) as u8).collect()
}

#[test]
fn memcached_operations() {
    let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
    assert!(c.get(b"a").unwrap().is_none());
    let cas1 = c.set(b"a", b"one", 5, 0).unwrap();
    let g = c.get(b"a").unwrap().unwrap();
    assert_eq!(
        (g.value(), g.key(), g.client_flags(), g.cas(), g.tier()),
        (&b"one"[..], &b"a"[..], 5, cas1, 0)
    );
    drop(g);
    assert_eq!(c.add(b"a", b"x", 0, 0).unwrap(), Store::NotStored);
    assert!(matches!(
        c.add(b"b", b"two", 0, 0).unwrap(),
        Store::Stored { .. }
    ));
    assert_eq!(c.replace(b"zz", b"x", 0, 0).unwrap(), Store::NotStored);
    assert!(matches!(
        c.replace(b"b", b"2", 0, 0).unwrap(),
        Store::Stored { .. }
    ));
    assert_eq!(c.cas(b"a", b"x", 0, 0, cas1 + 1).unwrap(), Store::Exists);
    assert_eq!(c.cas(b"nope", b"x", 0, 0, 1).unwrap(), Store::NotFound);
    let Store::Stored { cas: cas2 } = c.cas(b"a", b"uno", 0, 0, cas1).unwrap() else {
        panic!("cas with the right value must store");
    };
    assert_ne!(cas1, cas2);
    assert!(matches!(
        c.append(b"a", b"!").unwrap(),
        Store::Stored { .. }
    ));
    assert!(matches!(
        c.prepend(b"a", b"<").unwrap(),
        Store::Stored { .. }
    ));
    assert_eq!(c.get_copy(b"a").unwrap().unwrap().0, b"<uno!");
    assert_eq!(c.append(b"missing", b"x").unwrap(), Store::NotStored);
    c.set(b"n", b"41", 0, 0).unwrap();
    assert_eq!(c.incr(b"n", 1).unwrap(), Some(42));
    assert_eq!(c.decr(b"n", 100).unwrap(), Some(0));
    assert_eq!(c.incr(b"missing", 1).unwrap(), None);
    c.set(b"n", &u64::MAX.to_string().into_bytes(), 0, 0)
        .unwrap();
    assert_eq!(c.incr(b"n", 2).unwrap(), Some(1), "wraps like memcached");
    assert!(matches!(c.incr(b"a", 1), Err(CacheError::NotANumber)));
    let many = c.get_many([&b"a"[..], b"nope", b"b"]).unwrap();
    assert_eq!(
        many.iter()
            .map(|g| g.as_ref().map(|g| g.value().to_vec()))
            .collect::<Vec<_>>(),
        vec![Some(b"<uno!".to_vec()), None, Some(b"2".to_vec())]
    );
    drop(many);
    assert!(c.delete(b"a").unwrap());
    assert!(!c.delete(b"a").unwrap());
    assert!(c.get(b"a").unwrap().is_none());
    c.flush_all();
    assert!(c.get(b"b").unwrap().is_none());
    assert!(c.get(b"n").unwrap().is_none());
    let s = c.stats();
    assert!(s.hits >= 2 && s.misses >= 4 && s.sets >= 8, "{s:?}");
    assert_eq!(s.tiers[0].hits, s.hits);
    assert_eq!(s.items, 0);
}

#[test]
fn delete_concat_and_arith_can_be_conditional_on_the_cas() {
    let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
    let cas = c.set(b"n", b"10", 5, 0).unwrap();
    let stale = cas + 1;
    // A wrong CAS refuses and changes nothing.
    assert_eq!(
        c.arith(b"n", 1, Delta::Incr, Some(stale)).unwrap(),
        Checked::Exists
    );
    assert_eq!(
        c.concat(b"n", b"0", Side::Back, Some(stale)).unwrap(),
        Store::Exists
    );
    assert_eq!(
        c.delete_checked(b"n", Some(stale)).unwrap(),
        Checked::Exists
    );
    let g = c.get(b"n").unwrap().unwrap();
    assert_eq!((g.value(), g.cas()), (&b"10"[..], cas));
    drop(g);
    // The right one applies, and the new CAS comes back with the result.
    let Checked::Done((11, cas)) = c.arith(b"n", 1, Delta::Incr, Some(cas)).unwrap() else {
        panic!("incr with the right CAS");
    };
    assert_eq!(c.get(b"n").unwrap().unwrap().cas(), cas);
    let Checked::Done((6, cas)) = c.arith(b"n", 5, Delta::Decr, Some(cas)).unwrap() else {
        panic!("decr with the right CAS");
    };
    let Store::Stored { cas } = c.concat(b"n", b"0", Side::Back, Some(cas)).unwrap() else {
        panic!("append with the right CAS");
    };
    let Store::Stored { cas } = c.concat(b"n", b"1", Side::Front, Some(cas)).unwrap() else {
        panic!("prepend with the right CAS");
    };
    // The decr wrote "6" over "11" in place, padded as memcached pads it: "6 ".
    let g = c.get(b"n").unwrap().unwrap();
    assert_eq!(
        (g.value(), g.client_flags(), g.cas()),
        (&b"16 0"[..], 5, cas)
    );
    drop(g);
    assert_eq!(
        c.delete_checked(b"n", Some(cas)).unwrap(),
        Checked::Done(())
    );
    // Absent keys.
    assert_eq!(
        c.delete_checked(b"n", Some(cas)).unwrap(),
        Checked::NotFound
    );
    assert_eq!(c.delete_checked(b"n", None).unwrap(), Checked::NotFound);
    assert_eq!(
        c.arith(b"n", 1, Delta::Incr, None).unwrap(),
        Checked::NotFound
    );
    assert_eq!(
        c.concat(b"n", b"x", Side::Back, Some(cas)).unwrap(),
        Store::NotStored
    );
}

#[test]
fn ttls_expire_lazily_and_touch_renews() {
    let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
    c.set(b"short", b"v", 0, 10).unwrap();
    c.set(b"long", b"v", 0, 1000).unwrap();
    c.set(b"forever", b"v", 0, 0).unwrap();
    let cas = c.set(b"touched", b"v", 0, 10).unwrap();
    assert!(c.touch(b"touched", 1000).unwrap());
    assert!(!c.touch(b"absent", 5).unwrap());
    // A touch keeps the CAS (memcached's does): a cas write with it still succeeds.
    assert_eq!(c.peek(b"touched").unwrap().unwrap().cas(), cas);
    assert!(matches!(
        c.cas(b"touched", b"v", 0, 1000, cas).unwrap(),
        Store::Stored { .. }
    ));
    assert!(c.get(b"short").unwrap().is_some());
    c.advance_clock(11);
    assert!(c.get(b"short").unwrap().is_none());
    assert!(c.get(b"touched").unwrap().is_some());
    assert!(c.get(b"long").unwrap().is_some());
    // An expired key can be added again.
    assert!(matches!(
        c.add(b"short", b"w", 0, 0).unwrap(),
        Store::Stored { .. }
    ));
    c.advance_clock(2000);
    assert!(c.get(b"long").unwrap().is_none());
    assert!(c.get(b"touched").unwrap().is_none());
    assert!(c.get(b"forever").unwrap().is_some());
    assert!(c.stats().expired >= 3);
}

#[test]
fn writes_with_many_ttls_never_run_out_of_segments_and_keep_their_items() {
    // 16 segments of 2 MiB, two writer stripes, and far more TTL buckets in use than
    // segments: each bucket wants an open segment of its own. Before open segments were
    // capped, the 17th bucket's write stalled for a second and failed (no free segment);
    // before items carried their own expiry, a write at the cap sealed a nearly empty
    // segment, and 3 MB of items in 32 MiB kept about 40 of them.
    let (c, _) = Cache::open(CacheConfig {
        stripes: 2,
        ..CacheConfig::new(vec![TierConfig::dram(TierSize::Bytes(32 * MIB))])
    })
    .unwrap();
    let v = vec![b'v'; 1000];
    for k in 0..3000u32 {
        let ttl = 10 + k * 37 % 100_000;
        set_with_ttl(&c, format!("k{k}").as_bytes(), &v, ttl);
    }
    let kept = (0..3000u32)
        .filter(|k| c.get(format!("k{k}").as_bytes()).unwrap().is_some())
        .count();
    assert!(kept >= 2900, "kept {kept} of 3000");
}

#[test]
fn a_hit_says_when_its_item_expires_which_is_its_ttl() {
    let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
    c.set(b"forever", b"v", 0, 0).unwrap();
    assert_eq!(c.get(b"forever").unwrap().unwrap().expires_at(), None);
    let expiry = |key: &[u8]| {
        c.get(key)
            .unwrap()
            .and_then(|g| g.expires_at())
            .expect("an expiry")
    };
    // (From 2 s: a 1 s TTL could expire between the set and the get below.)
    for ttl in [2u32, 10, 100, 143, 3600, 86_400] {
        let at = set_with_ttl(&c, b"k", b"v", ttl);
        // And it is when the item stops being served (unless the wall clock's second
        // ticked in between, taking it there).
        c.advance_clock(i64::from(at.saturating_sub(c.now())) - 1);
        let served = c.get(b"k").unwrap().is_some();
        assert!(served || c.now() >= at, "ttl {ttl}: gone early");
        c.advance_clock(1);
        assert!(c.get(b"k").unwrap().is_none(), "ttl {ttl}: still served");
    }
    // A later item of the same TTL bucket joins the segment opened for an earlier one,
    // and still expires exactly at its own TTL (the segment's expiry is only the latest
    // of its items').
    let ttl = 143u32;
    c.set(b"first", b"v", 0, ttl).unwrap();
    c.advance_clock(15);
    let at = set_with_ttl(&c, b"later", b"v", ttl);
    assert!(expiry(b"first") + 15 <= at);
    c.advance_clock(i64::from(expiry(b"first") - c.now()));
    assert!(c.get(b"first").unwrap().is_none());
    assert!(c.get(b"later").unwrap().is_some());
}

#[test]
fn the_movers_reclaim_a_segment_once_all_its_items_have_expired() {
    // 64 segments of 32 KiB. Short-lived items fill some segments, then items without a
    // TTL fill more; the FIFO would reach the short-lived ones only after the tier had
    // filled, the movers take them back as soon as they expire.
    let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
    let v = vec![b's'; 1000];
    for k in 0..300u32 {
        c.set(format!("short{k}").as_bytes(), &v, 0, 20).unwrap();
    }
    for k in 0..300u32 {
        c.set(format!("keep{k}").as_bytes(), &v, 0, 0).unwrap();
    }
    c.maintain().unwrap();
    let before = c.stats().tiers[0].clone();
    assert_eq!(before.items_expired, 0);
    c.advance_clock(30);
    c.maintain().unwrap();
    let after = c.stats().tiers[0].clone();
    assert!(
        after.free_segments >= before.free_segments + 8,
        "free segments {} -> {}",
        before.free_segments,
        after.free_segments
    );
    assert_eq!(after.items_expired, 300);
    assert_eq!(after.items_evicted, before.items_evicted);
    for k in 0..300u32 {
        assert!(
            c.get(format!("keep{k}").as_bytes()).unwrap().is_some(),
            "keep{k}"
        );
        assert!(c.get(format!("short{k}").as_bytes()).unwrap().is_none());
    }
}

#[test]
fn bad_input_is_a_typed_error() {
    let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
    let long = vec![b'k'; 251];
    assert!(matches!(
        c.set(&long, b"v", 0, 0),
        Err(CacheError::Encode(_))
    ));
    assert!(matches!(c.get(&long), Err(CacheError::Encode(_))));
    assert!(matches!(c.set(b"", b"v", 0, 0), Err(CacheError::Encode(_))));
    let big = vec![0u8; (16 << 10) + 1];
    assert!(matches!(
        c.set(b"k", &big, 0, 0),
        Err(CacheError::Encode(_))
    ));
    let max = vec![1u8; 16 << 10];
    c.set(b"k", &max, 0, 0).unwrap();
    assert_eq!(c.get(b"k").unwrap().unwrap().value().len(), 16 << 10);

    let zero = config(vec![TierConfig::dram(TierSize::Bytes(0))]);
    assert!(matches!(Cache::open(zero), Err(CacheError::Config { .. })));
    let ratio_without_total = config(vec![TierConfig::dram(TierSize::Ratio(1))]);
    assert!(matches!(
        Cache::open(ratio_without_total),
        Err(CacheError::Config { .. })
    ));
    let missing = config(vec![TierConfig::file(
        "/nonexistent/terrace",
        TierSize::Bytes(2 * MIB),
    )]);
    assert!(matches!(
        Cache::open(missing),
        Err(CacheError::TierDir { .. })
    ));
    let small_segments = CacheConfig {
        segment_shift: Some(12),
        ..config(vec![dram(2)])
    };
    assert!(matches!(
        Cache::open(small_segments),
        Err(CacheError::Config { .. })
    ));
    assert!(Cache::open(CacheConfig::new(vec![])).is_err());
    // Seven segments of 2 MiB: too few for the writers' and movers' open segments and
    // the free reserve (writes would stall, then fail); the error says how much is.
    let seven = CacheConfig::new(vec![dram(14)]);
    let Err(err) = Cache::open(seven) else {
        panic!("a tier of 7 segments was accepted");
    };
    assert!(
        matches!(
            err,
            CacheError::TierTooSmall {
                tier: 0,
                segments: 7,
                min: 8,
                segment_bytes: 0x20_0000
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("16777216 bytes"), "{err}");
    assert!(Cache::open(CacheConfig::new(vec![dram(16)])).is_ok());
}

#[test]
fn a_refused_tier_leaves_no_file_behind_so_the_suggested_size_then_opens() {
    let dir = tempfile::tempdir().unwrap();
    let tiers = |file_mib: u64| {
        CacheConfig::new(vec![
            dram(16),
            TierConfig::file(dir.path(), TierSize::Bytes(file_mib * MIB)),
        ])
    };
    let Err(err) = Cache::open(tiers(8)) else {
        panic!("a file tier of 4 segments was accepted");
    };
    assert!(
        matches!(
            err,
            CacheError::TierTooSmall {
                tier: 1,
                segments: 4,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let (c, _) = Cache::open(tiers(16)).expect("the size the error asked for");
    c.set(b"k", b"v", 0, 0).unwrap();
}

#[test]
fn a_small_tier_on_a_machine_of_many_threads_still_takes_writes() {
    // 8 segments and 64 writer threads asked for: every stripe keeps an open segment, so
    // the stripes are cut to what the tier can hold, and every write finds a segment.
    let (c, _) = Cache::open(CacheConfig {
        stripes: 64,
        ..config(vec![TierConfig::dram(TierSize::Bytes(8 << 15))])
    })
    .unwrap();
    let c = std::sync::Arc::new(c);
    let threads: Vec<_> = (0..16u32)
        .map(|t| {
            let c = std::sync::Arc::clone(&c);
            std::thread::spawn(move || {
                for k in 0..500u32 {
                    c.set(format!("t{t}-{k}").as_bytes(), &[b'v'; 300], 0, 0)
                        .unwrap_or_else(|e| panic!("thread {t}, set {k}: {e}"));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a writer panicked");
    }
    assert!(c.stats().items > 100);
}

#[test]
fn default_segment_size_holds_a_one_mib_value() {
    let (c, _) = Cache::open(CacheConfig::new(vec![dram(16)])).unwrap();
    assert_eq!(c.segment_size(), 2 << 20);
    let v = value(3, 1 << 20);
    c.set(&[b'k'; 250], &v, 1, 0).unwrap();
    assert_eq!(c.get(&[b'k'; 250]).unwrap().unwrap().value(), &v[..]);
}

#[test]
fn ratios_size_the_tiers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = CacheConfig {
        total_bytes: Some(8 * MIB),
        ..config(vec![
            TierConfig::dram(TierSize::Ratio(1)),
            TierConfig::file(dir.path(), TierSize::Ratio(3)),
        ])
    };
    let (c, _) = Cache::open(cfg).unwrap();
    let s = c.stats();
    assert_eq!(s.tiers[0].segments, 64);
    assert_eq!(s.tiers[1].segments, 192);
}

#[test]
fn eviction_demotes_hot_items_to_the_next_tier() {
    let dir = tempfile::tempdir().unwrap();
    let (c, _) = Cache::open(config(vec![
        dram(2),
        TierConfig::file(dir.path(), TierSize::Bytes(4 * MIB)),
    ]))
    .unwrap();
    // 64 hot keys, read once each, then a stream of cold ones that overflows tier 0.
    for k in 0..64u32 {
        c.set(format!("hot{k}").as_bytes(), &value(k, 1000), 0, 0)
            .unwrap();
        assert!(c.get(format!("hot{k}").as_bytes()).unwrap().is_some());
    }
    for k in 0..3000u32 {
        c.set(format!("cold{k}").as_bytes(), &value(k, 1000), 0, 0)
            .unwrap();
    }
    let s = c.stats();
    assert!(s.tiers[0].segments_evicted > 0, "{s:?}");
    assert!(s.demotions >= 64, "{s:?}");
    assert!(s.inline_evictions > 0);
    // Per-tier items add up, and the demoted ones are counted in tier 1 with their bytes.
    assert_eq!(s.tiers[0].items + s.tiers[1].items, s.items as u64);
    assert!(s.tiers[1].items >= 64, "{s:?}");
    assert!(s.tiers[1].live_bytes >= 64 * 1000, "{s:?}");
    assert!(s.tiers[0].live_bytes >= s.tiers[0].items * 1000, "{s:?}");
    for k in 0..64u32 {
        let g = c.get(format!("hot{k}").as_bytes()).unwrap().unwrap();
        assert_eq!(g.value(), &value(k, 1000)[..]);
        assert_eq!(g.tier(), 1, "hot{k} was demoted");
    }
    // Cold keys that were never read were dropped from tier 0, not demoted.
    assert!(c.get(b"cold0").unwrap().is_none());
    // A CAS survives a demotion; a write to a demoted key supersedes the copy.
    let cas = c.get(b"hot0").unwrap().unwrap().cas();
    assert!(matches!(
        c.cas(b"hot0", b"new", 0, 0, cas).unwrap(),
        Store::Stored { .. }
    ));
    assert_eq!(c.get(b"hot0").unwrap().unwrap().tier(), 0);
}

/// A cache whose hot keys (`hot0..64`, read once) were demoted into tier 1 by a stream of
/// cold writes.
fn with_hot_keys_in_tier_1(dir: &std::path::Path, promote: bool) -> Cache {
    let (c, _) = Cache::open(CacheConfig {
        promote,
        ..config(vec![
            dram(2),
            TierConfig::file(dir, TierSize::Bytes(4 * MIB)),
        ])
    })
    .unwrap();
    for k in 0..64u32 {
        c.set(format!("hot{k}").as_bytes(), &value(k, 1000), k, 0)
            .unwrap();
        assert!(c.get(format!("hot{k}").as_bytes()).unwrap().is_some());
    }
    for k in 0..3000u32 {
        c.set(format!("cold{k}").as_bytes(), &value(k, 1000), 0, 0)
            .unwrap();
    }
    c
}

#[test]
fn items_read_often_in_a_lower_tier_are_promoted_by_the_movers() {
    let dir = tempfile::tempdir().unwrap();
    let c = with_hot_keys_in_tier_1(dir.path(), true);
    let before = c.get(b"hot0").unwrap().unwrap();
    assert_eq!(before.tier(), 1);
    let cas = before.cas();
    drop(before);
    // The second read in tier 1 (the entry now has two hits) asks; the reader is served
    // from tier 1 meanwhile, and the mover does the copy.
    assert_eq!(c.get(b"hot0").unwrap().unwrap().tier(), 1);
    assert_eq!(c.stats().promotions, 0);
    c.maintain().unwrap();
    let s = c.stats();
    assert_eq!(s.promotions, 1, "{s:?}");
    assert_eq!(s.tiers[0].promotions_in, 1);
    let g = c.get(b"hot0").unwrap().unwrap();
    assert_eq!(g.tier(), 0);
    assert_eq!(g.value(), &value(0, 1000)[..]);
    assert_eq!((g.client_flags(), g.cas()), (0, cas));
    drop(g);
    // A gets/cas pair spanning the promotion still succeeds.
    assert!(matches!(
        c.cas(b"hot0", b"new", 0, 0, cas).unwrap(),
        Store::Stored { .. }
    ));
    // Asked for, then overwritten or deleted before the mover ran: the promotion is
    // dropped, the old value never comes back.
    for k in [1u32, 2] {
        for _ in 0..2 {
            assert_eq!(
                c.get(format!("hot{k}").as_bytes()).unwrap().unwrap().tier(),
                1
            );
        }
    }
    c.set(b"hot1", b"overwritten", 7, 0).unwrap();
    assert!(c.delete(b"hot2").unwrap());
    c.maintain().unwrap();
    assert_eq!(c.stats().promotions, 1);
    let g = c.get(b"hot1").unwrap().unwrap();
    assert_eq!((g.value(), g.client_flags()), (&b"overwritten"[..], 7));
    drop(g);
    assert!(c.get(b"hot2").unwrap().is_none());
    // An item three reads into tier 1 keeps its flags through the copy.
    for _ in 0..2 {
        c.get(b"hot3").unwrap();
    }
    c.maintain().unwrap();
    let g = c.get(b"hot3").unwrap().unwrap();
    assert_eq!((g.tier(), g.client_flags()), (0, 3));
    assert_eq!(g.value(), &value(3, 1000)[..]);
}

#[test]
fn without_promotion_hot_items_stay_in_their_tier() {
    let dir = tempfile::tempdir().unwrap();
    let c = with_hot_keys_in_tier_1(dir.path(), false);
    for _ in 0..4 {
        assert_eq!(c.get(b"hot0").unwrap().unwrap().tier(), 1);
        c.maintain().unwrap();
    }
    assert_eq!(c.stats().promotions, 0);
}

#[test]
fn a_guard_pins_its_segment_through_eviction() {
    let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
    c.set(b"pinned", &value(1, 2000), 0, 0).unwrap();
    let g = c.get(b"pinned").unwrap().unwrap();
    // The get gave the item a hit, so eviction reinserts it (at most three times more
    // without further hits); keys read once each make the cache evict its reinserted
    // items too, until the pinned one goes.
    for k in 0..20_000u32 {
        c.set(format!("k{k}").as_bytes(), &value(k, 1000), 0, 0)
            .unwrap();
        c.get(format!("k{k}").as_bytes()).unwrap();
    }
    // The item was evicted from the index, but its bytes are still valid under the guard.
    assert_eq!(g.value(), &value(1, 2000)[..]);
    drop(g);
    assert!(c.get(b"pinned").unwrap().is_none());
}

const KEYS: u32 = 24;

#[derive(Clone, Debug)]
enum Op {
    Set(u32, u32, usize),
    Add(u32, u32),
    Replace(u32, u32),
    Append(u32, u8),
    Cas(u32, u32, bool),
    Incr(u32, u8),
    Delete(u32),
    Get(u32),
}

fn op() -> impl Strategy<Value = Op> {
    op_over(KEYS, 16_000)
}

/// Operations on `keys` keys, values of set below `max_len` bytes.
fn op_over(keys: u32, max_len: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..keys, any::<u32>(), 0..max_len).prop_map(|(k, s, n)| Op::Set(k, s, n)),
        1 => (0..keys, any::<u32>()).prop_map(|(k, s)| Op::Add(k, s)),
        1 => (0..keys, any::<u32>()).prop_map(|(k, s)| Op::Replace(k, s)),
        1 => (0..keys, any::<u8>()).prop_map(|(k, b)| Op::Append(k, b)),
        1 => (0..keys, any::<u32>(), any::<bool>()).prop_map(|(k, s, r)| Op::Cas(k, s, r)),
        1 => (0..keys, any::<u8>()).prop_map(|(k, d)| Op::Incr(k, d)),
        2 => (0..keys).prop_map(Op::Delete),
        5 => (0..keys).prop_map(Op::Get),
    ]
}

/// Tier 0 a small file (2 MiB, like a DRAM tier: 64 segments) that the tiered model
/// operations overflow, tier 1
/// 2 MiB of DRAM, promotion on.
fn tiered_promoting(dir: &std::path::Path) -> Cache {
    Cache::open(CacheConfig {
        promote: true,
        ..config(vec![
            TierConfig::file(dir, TierSize::Bytes(2 * MIB)),
            dram(2),
        ])
    })
    .unwrap()
    .0
}

/// 2 MiB of DRAM over 8 MiB of flash on the disk, promotion on: promoted flash items
/// keep their flash copy as a replica (`cache/replica.rs`), which writes must kill.
fn flash_promoting(dir: &std::path::Path) -> Cache {
    Cache::open(CacheConfig {
        promote: true,
        ..config(vec![
            dram(2),
            TierConfig::flash(dir, TierSize::Bytes(8 * MIB)),
        ])
    })
    .unwrap()
    .0
}

fn key(k: u32) -> Vec<u8> {
    format!("key-{k}").into_bytes()
}

thread_local! {
    static EVICTIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[test]
fn the_model_test_exercises_eviction() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 4,
        ..ProptestConfig::default()
    });
    runner
        .run(&proptest::collection::vec(op(), 1000..1200), |ops| {
            let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
            for op in ops {
                if let Op::Set(k, s, n) = op {
                    c.set(&key(k), &value(s, n), 0, 0).unwrap();
                }
            }
            EVICTIONS.with(|e| e.set(e.get() + c.stats().inline_evictions));
            Ok(())
        })
        .unwrap();
    assert!(EVICTIONS.with(|e| e.get()) > 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Every answer matches the model, except that a key may be missing (evicted); a
    /// conditional op's outcome may differ only in the way a missing key explains.
    #[test]
    fn engine_matches_a_hashmap_model(ops in proptest::collection::vec(op(), 1..1200)) {
        let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
        check_against_model(&c, ops, KEYS, false, 0)?;
    }

    /// The same with two tiers and promotion on, the movers' work (demotions,
    /// promotions of keys read in tier 1) done after every read.
    #[test]
    fn a_tiered_engine_with_promotion_matches_a_hashmap_model(
        ops in proptest::collection::vec(op_over(TIERED_KEYS, 12_000), 1..1200),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let c = tiered_promoting(dir.path());
        check_against_model(&c, ops, TIERED_KEYS, true, 0)?;
    }

    /// The same over a flash tier: promotions out of flash leave replicas, and no
    /// write, touch or delete lets one be read again.
    #[test]
    fn a_flash_engine_with_promotion_matches_a_hashmap_model(
        ops in proptest::collection::vec(op_over(TIERED_KEYS, 12_000), 1..1200),
    ) {
        let dir = flash_dir();
        let c = flash_promoting(dir.path());
        check_against_model(&c, ops, TIERED_KEYS, true, FLASH_CHURN)?;
    }
}

#[test]
fn the_flash_model_test_exercises_replicas() {
    // Sixteen cases from a fixed seed: a case whose writes overwrite every promoted key
    // before its copy is demoted returns to no replica (a run of four random cases had none
    // about once in a dozen).
    let mut runner = proptest::test_runner::TestRunner::new_with_rng(
        ProptestConfig {
            cases: 16,
            ..ProptestConfig::default()
        },
        proptest::test_runner::TestRng::deterministic_rng(
            proptest::test_runner::RngAlgorithm::ChaCha,
        ),
    );
    let (promoted, returned) = (std::cell::Cell::new(0), std::cell::Cell::new(0));
    runner
        .run(
            &proptest::collection::vec(op_over(TIERED_KEYS, 12_000), 1000..1200),
            |ops| {
                let dir = flash_dir();
                let c = flash_promoting(dir.path());
                check_against_model(&c, ops, TIERED_KEYS, true, FLASH_CHURN)?;
                let s = c.stats();
                promoted.set(promoted.get() + s.promotions);
                let f = s.tiers[1].flash.as_ref().unwrap();
                returned.set(returned.get() + f.replica_demotions);
                Ok(())
            },
        )
        .unwrap();
    let (promoted, returned) = (promoted.get(), returned.get());
    assert!(
        promoted > 0 && returned > 0,
        "{promoted} promotions, {returned} demotions back to replicas"
    );
}

thread_local! {
    static PROMOTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

#[test]
fn the_tiered_model_test_exercises_promotion() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 4,
        ..ProptestConfig::default()
    });
    runner
        .run(
            &proptest::collection::vec(op_over(TIERED_KEYS, 12_000), 1000..1200),
            |ops| {
                let dir = tempfile::tempdir().unwrap();
                let c = tiered_promoting(dir.path());
                check_against_model(&c, ops, TIERED_KEYS, true, 0)?;
                PROMOTED.with(|p| p.set(p.get() + c.stats().promotions));
                Ok(())
            },
        )
        .unwrap();
    assert!(PROMOTED.with(|p| p.get()) > 0);
}

/// Keys of the tiered model test.
const TIERED_KEYS: u32 = 100;

/// Filler items the flash model test writes after every read: about 24 KB, so that a
/// run pushes its 2 MiB of DRAM out a few times and promoted items are demoted again
/// (back to their replicas).
const FLASH_CHURN: u32 = 8;

/// Runs `ops` on `c` and on a model (keys `0..keys`). With `tiered`, first sets every key
/// and reads it twice, then overflows tier 0 with other keys, so that the keys start in
/// tier 1 with the hits that make their next read ask for promotion, and runs the movers'
/// work after every read. After every read `churn` items of keys outside the model are
/// written.
fn check_against_model(
    c: &Cache,
    ops: Vec<Op>,
    keys: u32,
    tiered: bool,
    churn: u32,
) -> Result<(), TestCaseError> {
    {
        let mut model: HashMap<u32, (Vec<u8>, u64)> = HashMap::new();
        if tiered {
            for k in 0..keys {
                let v = value(k, 3000);
                let cas = c.set(&key(k), &v, 0, 0).unwrap();
                model.insert(k, (v, cas));
                for _ in 0..2 {
                    c.get(&key(k)).unwrap();
                }
            }
            for k in 0..1000 {
                c.set(&key(keys + k), &value(k, 3000), 0, 0).unwrap();
                c.maintain().unwrap();
            }
        }
        let maintain = tiered;
        let mut filler = 0u32;
        for op in ops {
            match op {
                Op::Set(k, s, n) => {
                    let v = value(s, n);
                    let cas = c.set(&key(k), &v, 0, 0).unwrap();
                    model.insert(k, (v, cas));
                }
                Op::Add(k, s) => {
                    let v = value(s, 10);
                    match c.add(&key(k), &v, 0, 0).unwrap() {
                        // Stored over a model value: the key had been evicted.
                        Store::Stored { cas } => {
                            model.insert(k, (v, cas));
                        }
                        Store::NotStored => {
                            prop_assert!(model.contains_key(&k), "add refused an absent key")
                        }
                        other => prop_assert!(false, "add returned {other:?}"),
                    }
                }
                Op::Replace(k, s) => {
                    let v = value(s, 10);
                    match c.replace(&key(k), &v, 0, 0).unwrap() {
                        Store::Stored { cas } => {
                            prop_assert!(model.contains_key(&k), "replace stored an absent key");
                            model.insert(k, (v, cas));
                        }
                        Store::NotStored => {
                            model.remove(&k);
                        }
                        other => prop_assert!(false, "replace returned {other:?}"),
                    }
                }
                Op::Append(k, b) => match c.append(&key(k), &[b; 3]).unwrap() {
                    Store::Stored { cas } => {
                        let Some((v, _)) = model.get(&k).cloned() else {
                            return Err(TestCaseError::fail("append stored an absent key"));
                        };
                        let mut v = v;
                        v.extend_from_slice(&[b; 3]);
                        model.insert(k, (v, cas));
                    }
                    Store::NotStored => {
                        model.remove(&k);
                    }
                    other => prop_assert!(false, "append returned {other:?}"),
                },
                Op::Cas(k, s, right) => {
                    let v = value(s, 20);
                    let given = match (model.get(&k), right) {
                        (Some((_, cas)), true) => *cas,
                        (Some((_, cas)), false) => cas.wrapping_add(1),
                        (None, _) => 12345,
                    };
                    match c.cas(&key(k), &v, 0, 0, given).unwrap() {
                        Store::Stored { cas } => {
                            prop_assert!(
                                right && model.contains_key(&k),
                                "cas stored with a wrong cas"
                            );
                            model.insert(k, (v, cas));
                        }
                        Store::Exists => prop_assert!(!right || !model.contains_key(&k)),
                        Store::NotFound => {
                            model.remove(&k);
                        }
                        other => prop_assert!(false, "cas returned {other:?}"),
                    }
                }
                Op::Incr(k, d) => {
                    // memcached's rules: the stored number is read as strtoull reads it
                    // (unit-tested in cache::number), and a result no longer than the
                    // old value is written over it, padded with spaces.
                    let old_value = model.get(&k).map(|(v, _)| v.clone());
                    let numeric = old_value.as_deref().and_then(number::strtoull);
                    match (c.incr(&key(k), u64::from(d)), numeric) {
                        (Ok(Some(n)), Some(old)) => {
                            prop_assert_eq!(n, old.wrapping_add(u64::from(d)));
                            let cas = c.get(&key(k)).unwrap().map_or(0, |g| g.cas());
                            let old_len = old_value.map_or(0, |v| v.len());
                            let mut v = n.to_string().into_bytes();
                            if v.len() <= old_len {
                                v.resize(old_len, b' ');
                            }
                            model.insert(k, (v, cas));
                        }
                        (Ok(None), _) => {
                            model.remove(&k);
                        }
                        (Err(CacheError::NotANumber), None) => {}
                        (r, m) => prop_assert!(false, "incr {r:?} with model {m:?}"),
                    }
                }
                Op::Delete(k) => {
                    let was = c.delete(&key(k)).unwrap();
                    prop_assert!(!was || model.contains_key(&k), "deleted an absent key");
                    model.remove(&k);
                }
                Op::Get(k) => {
                    if let Some(g) = c.get(&key(k)).unwrap() {
                        let Some((v, cas)) = model.get(&k) else {
                            return Err(TestCaseError::fail(format!("key {k} came back")));
                        };
                        prop_assert_eq!(g.value(), &v[..]);
                        prop_assert_eq!(g.cas(), *cas);
                    } else {
                        model.remove(&k);
                    }
                    for _ in 0..churn {
                        filler += 1;
                        c.set(
                            &key(keys + 1000 + filler % 4000),
                            &value(filler, 3000),
                            0,
                            0,
                        )
                        .unwrap();
                    }
                    if maintain {
                        c.maintain().unwrap();
                    }
                }
            }
        }
        // Final sweep: nothing the model lacks, nothing stale.
        for k in 0..keys {
            if let Some(g) = c.get(&key(k)).unwrap() {
                let Some((v, _)) = model.get(&k) else {
                    return Err(TestCaseError::fail(format!("key {k} came back")));
                };
                prop_assert_eq!(g.value(), &v[..]);
            }
        }
        if let Err(e) = c.verify() {
            return Err(TestCaseError::fail(format!("{e:?}")));
        }
    }
    Ok(())
}

#[test]
fn maintain_keeps_free_segments_so_writes_do_not_evict_inline() {
    let dir = tempfile::tempdir().unwrap();
    let (c, _) = Cache::open(config(vec![
        dram(2),
        TierConfig::file(dir.path(), TierSize::Bytes(2 * MIB)),
    ]))
    .unwrap();
    let mut k = 0u32;
    // Fill tier 0 until writes start evicting inline, reading some keys so they demote.
    while c.stats().inline_evictions == 0 {
        c.set(format!("k{k}").as_bytes(), &value(k, 1000), 0, 0)
            .unwrap();
        if k.is_multiple_of(3) {
            c.get(format!("k{k}").as_bytes()).unwrap();
        }
        k += 1;
    }
    // Rounds, as a mover thread runs them: each evicts a few segments at most.
    assert!(c.maintain().unwrap() > 0);
    while c.maintain().unwrap() > 0 {}
    let s = c.stats();
    assert!(s.tiers[0].free_segments >= 4, "{s:?}");
    assert!(s.background_evictions > 0);
    let inline = s.inline_evictions;
    // Three free segments' worth of writes (32 KiB each) take no inline eviction.
    for i in 0..90u32 {
        c.set(format!("n{i}").as_bytes(), &value(i, 1000), 0, 0)
            .unwrap();
    }
    assert_eq!(c.stats().inline_evictions, inline);
}

#[test]
fn a_mover_thread_runs_and_stops() {
    let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
    let c = std::sync::Arc::new(c);
    let movers = Cache::start_movers(&c, std::time::Duration::from_millis(1));
    assert!(movers.is_running());
    for k in 0..6000u32 {
        c.set(format!("k{k}").as_bytes(), &value(k, 1000), 0, 0)
            .unwrap();
        if k % 1000 == 0 {
            std::thread::sleep(std::time::Duration::from_millis(3));
        }
    }
    drop(movers);
    let s = c.stats();
    assert!(s.background_evictions > 0, "{s:?}");
    assert_eq!(s.mover_errors, 0);
    assert_eq!(
        std::sync::Arc::strong_count(&c),
        1,
        "the thread let go of the cache"
    );
}

#[test]
fn demoted_items_keep_their_ttl() {
    let (c, _) = Cache::open(config(vec![dram(2), dram(2)])).unwrap();
    c.set(b"ttl", b"v", 0, 100).unwrap();
    c.set(b"forever", b"w", 0, 0).unwrap();
    let expires = c.get(b"ttl").unwrap().unwrap().expires_at();
    assert!(expires.is_some());
    c.get(b"forever").unwrap();
    // Traffic in both TTL buckets, so that both open segments fill, seal and get evicted
    // (an open segment is never evicted). Peeks watch them: gets would record the hits
    // that keep an item in tier 0.
    for k in 0..8000u32 {
        let ttl = if k % 2 == 0 { 100 } else { 0 };
        c.set(format!("f{k}").as_bytes(), &value(k, 1000), 0, ttl)
            .unwrap();
        let tiers = (c.peek(b"ttl").unwrap().map(|g| g.tier()))
            .zip(c.peek(b"forever").unwrap().map(|g| g.tier()));
        if tiers == Some((1, 1)) {
            break;
        }
    }
    assert_eq!(c.get(b"ttl").unwrap().unwrap().tier(), 1);
    assert_eq!(c.get(b"forever").unwrap().unwrap().tier(), 1);
    // The copy expires exactly when the item did: neither later nor earlier.
    assert_eq!(c.get(b"ttl").unwrap().unwrap().expires_at(), expires);
    assert_eq!(c.get(b"forever").unwrap().unwrap().expires_at(), None);
    c.advance_clock(101);
    assert!(
        c.get(b"ttl").unwrap().is_none(),
        "outlived its TTL after demotion"
    );
    assert!(c.get(b"forever").unwrap().is_some());
}

#[test]
fn a_numa_tier_works_where_the_node_exists() {
    match Cache::open(config(vec![TierConfig::numa(0, TierSize::Bytes(2 * MIB))])) {
        Ok((c, _)) => {
            c.set(b"k", b"on node 0", 0, 0).unwrap();
            assert_eq!(c.get(b"k").unwrap().unwrap().value(), b"on node 0");
        }
        // No NUMA support here (a container without mbind): a typed error, no panic.
        Err(CacheError::Media(e)) => eprintln!("numa tier unavailable: {e}"),
        Err(e) => panic!("unexpected error {e}"),
    }
}

#[test]
fn a_peek_is_not_a_get() {
    // The server's own reads (a CAS, a size, a remaining TTL) neither count as hits or
    // misses nor give the item a hit the eviction policy would reward.
    let (c, _) = Cache::open(config(vec![dram(2)])).unwrap();
    c.set(b"k", b"v", 7, 0).unwrap();
    let before = c.stats();
    let g = c.peek(b"k").unwrap().expect("present");
    assert_eq!((g.value(), g.client_flags()), (&b"v"[..], 7));
    drop(g);
    assert!(c.peek(b"absent").unwrap().is_none());
    let after = c.stats();
    assert_eq!((after.hits, after.misses), (before.hits, before.misses));
    // Never read: dropped when its segment is evicted, where a read item would be kept.
    c.set(b"read", b"v", 0, 0).unwrap();
    c.get(b"read").unwrap();
    let v = vec![b'x'; 4000];
    let mut n = 0u32;
    while c.peek(b"k").unwrap().is_some() {
        c.set(format!("f{n}").as_bytes(), &v, 0, 0).unwrap();
        n += 1;
        assert!(n < 10_000, "k was never evicted");
    }
    assert!(c.get(b"read").unwrap().is_some(), "the read item was kept");
}

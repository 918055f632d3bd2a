//! The engine's crash images: a cache of two file tiers — alone, or split into two
//! pools — runs a seeded mix of sets,
//! overwrites, deletes, reads, TTL expiry and mover rounds (demotion, reinsertion,
//! cleaning, stays, promotion, expired segments reclaimed) on one thread, while a hook
//! under every `Region::persist` (`terrace_media::persist_hook`) keeps a shadow of each
//! tier file's durable image — what a power loss right after that persist would leave:
//! the bytes persisted up to then, and none stored since. After each operation, every
//! image recorded during it is reopened with `Cache::open` and checked against a model:
//! each key gives its last acknowledged value, the value of the operation in flight, or
//! a miss — never an older, deleted or expired one — and `Cache::verify` holds.
//!
//! Removing a persist the engine needs, or publishing in another order, makes some image
//! fail the check (see the commit that added this test for one such check).

mod common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use terrace_cache::pools::{PoolConfig, PoolQuota, Pools};
use terrace_cache::{CacheConfig, Stats, TierConfig, TierSize};

/// Keys of a run on one cache: about one and a half times what its first tier holds
/// (twice as many for two pools, [`Setup::keys`]).
const KEYS: u32 = 2_000;
/// Operations before images are kept on one cache: the first tier fills, and the movers
/// start demoting, promoting and reinserting (the shadows are kept from the start).
const WARM_UP: usize = 5_000;
/// Persist points to check at least, after the warm-up: one cache, and two pools.
const POINTS: usize = 2_500;
const POOL_POINTS: usize = 600;

#[derive(Default)]
struct Recorder {
    /// Images are kept (the shadows are kept whatever this says).
    on: bool,
    /// The durable image of each tier file.
    shadows: HashMap<PathBuf, Vec<u8>>,
    /// The durable images at each persist of the operation in flight.
    images: Vec<HashMap<PathBuf, Vec<u8>>>,
    points: usize,
}

thread_local! {
    static RECORDER: RefCell<Recorder> = RefCell::new(Recorder::default());
}

fn record(path: &Path, offset: usize, bytes: &[u8]) {
    RECORDER.with(|r| {
        let mut r = r.borrow_mut();
        let Some(shadow) = r.shadows.get_mut(path) else {
            return;
        };
        shadow[offset..offset + bytes.len()].copy_from_slice(bytes);
        if !r.on {
            return;
        }
        let image = r.shadows.clone();
        r.images.push(image);
        r.points += 1;
    });
}

/// Two file tiers of `mib` MiB each (whole 2 MiB granules: 64 segments of 32 KiB
/// each per 2 MiB), promotion on.
fn config(dir: &Path, mib: u64) -> CacheConfig {
    CacheConfig {
        stripes: 1,
        promote: true,
        expected_items: Some(4_096),
        ..common::config(vec![
            TierConfig::file(dir, TierSize::Bytes(mib << 20)),
            TierConfig::file(dir, TierSize::Bytes(mib << 20)),
        ])
    }
}

/// What is checked: one cache, or the default pool and a named one splitting the tiers.
#[derive(Clone, Copy)]
enum Setup {
    One,
    TwoPools,
}

impl Setup {
    fn open(self, dir: &Path) -> Pools {
        let (config, named) = match self {
            Setup::One => (config(dir, 2), vec![]),
            Setup::TwoPools => (
                config(dir, 4),
                vec![PoolConfig {
                    name: "odd".into(),
                    quota: PoolQuota::Percent(50.0),
                }],
            ),
        };
        Pools::open(config, &named)
            .unwrap_or_else(|e| panic!("open: {e}"))
            .0
    }

    /// The pool key `k` lives in (a server routes by prefix; here, odd keys to `odd`).
    fn pool(self, k: u32) -> usize {
        match self {
            Setup::One => 0,
            Setup::TwoPools => (k % 2) as usize,
        }
    }

    fn keys(self) -> u32 {
        match self {
            Setup::One => KEYS,
            Setup::TwoPools => 2 * KEYS,
        }
    }

    fn warm_up(self) -> usize {
        match self {
            Setup::One => WARM_UP,
            Setup::TwoPools => 2 * WARM_UP,
        }
    }

    fn tier_files(self) -> usize {
        match self {
            Setup::One => 2,
            Setup::TwoPools => 4,
        }
    }
}

/// Every file under `dir`, in its subdirectories (the pools') too.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// A key's value in the model: its bytes and its expiry (cache clock; 0: none).
type Entry = Option<(Vec<u8>, u32)>;

/// What the operation in flight may leave for a key besides its acknowledged value.
enum InFlight {
    None,
    Set(u32, Vec<u8>),
    Delete(u32),
}

fn key(k: u32) -> Vec<u8> {
    format!("key{k}").into_bytes()
}

fn value(k: u32, op: usize, len: usize) -> Vec<u8> {
    let mut v = format!("{k}:{op}:").into_bytes();
    v.resize(len.max(v.len()), b'a' + (op % 26) as u8);
    v
}

/// Reopens `image` (with the live directory's other files) in `scratch` and checks it.
#[allow(clippy::too_many_arguments)]
fn check_image(
    setup: Setup,
    image: &HashMap<PathBuf, Vec<u8>>,
    live: &Path,
    scratch: &Path,
    model: &HashMap<u32, Entry>,
    in_flight: &InFlight,
    clock: i64,
    op: usize,
    point: usize,
) {
    for e in std::fs::read_dir(scratch).unwrap() {
        let path = e.unwrap().path();
        match path.is_dir() {
            true => std::fs::remove_dir_all(path).unwrap(),
            false => std::fs::remove_file(path).unwrap(),
        }
    }
    for path in files(live) {
        let to = scratch.join(path.strip_prefix(live).unwrap());
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        match image.get(&path) {
            Some(bytes) => std::fs::write(&to, bytes).unwrap(),
            None => {
                std::fs::copy(&path, &to).unwrap();
            }
        }
    }
    let pools = setup.open(scratch);
    pools.advance_clock(clock);
    for k in 0..setup.keys() {
        let c = pools.at(setup.pool(k)).unwrap();
        let now = c.now();
        let Some(g) = c.peek(&key(k)).unwrap() else {
            continue;
        };
        let acked = model.get(&k).cloned().flatten();
        let acked_ok = acked
            .as_ref()
            .is_some_and(|(v, at)| g.value() == &v[..] && (*at == 0 || now < *at));
        let in_flight_ok =
            matches!(in_flight, InFlight::Set(ik, v) if *ik == k && g.value() == &v[..]);
        assert!(
            acked_ok || in_flight_ok,
            "op {op}, persist {point}: key{k} gave {:?}, acknowledged {:?}",
            String::from_utf8_lossy(&g.value()[..g.value().len().min(24)]),
            acked.map(|(v, at)| (
                String::from_utf8_lossy(&v[..v.len().min(24)]).into_owned(),
                at
            )),
        );
    }
    for (name, c) in pools.iter() {
        if let Err(e) = c.verify() {
            panic!("op {op}, persist {point}, pool {name}: {e:?}");
        }
    }
}

#[test]
fn every_persist_point_of_the_engine_recovers_to_an_acknowledged_state() {
    run(Setup::One, POINTS);
}

#[test]
fn every_persist_point_of_two_pools_recovers_to_an_acknowledged_state() {
    run(Setup::TwoPools, POOL_POINTS);
}

/// Whether the cache holds key `k` now (a peek: no hit recorded).
fn has(pools: &Pools, setup: Setup, k: u32) -> bool {
    let c = pools.at(setup.pool(k)).unwrap();
    c.peek(&key(k)).unwrap().is_some()
}

/// All the pools' counters, summed.
fn stats(pools: &Pools) -> Stats {
    let all = pools.stats();
    Stats::combined(all.iter().map(|(_, s)| s))
}

/// Runs the seeded mix on `setup` until `points` images were checked after the warm-up.
fn run(setup: Setup, points: usize) {
    // Once per process; the recorder is per thread, so the tests run side by side.
    terrace_media::persist_hook::install(record);
    let dir = common::tier_dir();
    let scratch = common::tier_dir();
    let pools = setup.open(dir.path());
    RECORDER.with(|r| {
        let mut r = r.borrow_mut();
        for path in files(dir.path()) {
            if path.extension().is_some_and(|x| x == "terrace") {
                let bytes = std::fs::read(&path).unwrap();
                r.shadows.insert(path, bytes);
            }
        }
        assert_eq!(r.shadows.len(), setup.tier_files(), "the tier files");
    });
    let mut model: HashMap<u32, Entry> = HashMap::new();
    let mut rng = common::Rng(0x5eed_c0de);
    let mut clock = 0i64;
    let mut images_checked = 0;
    let mut op = 0;
    let mut before = None;
    // Keys the last mover round dropped: deleting one of them while its old copy may
    // still be on the medium is what retiring a segment before its walk guards against.
    let mut just_dropped: Vec<u32> = Vec::new();
    while RECORDER.with(|r| r.borrow().points) < points {
        op += 1;
        assert!(op < 200_000, "too few persist points");
        if op == setup.warm_up() {
            before = Some(stats(&pools));
            RECORDER.with(|r| r.borrow_mut().on = true);
        }
        let r = rng.next();
        let k = (r >> 16) as u32 % setup.keys();
        let c = pools.at(setup.pool(k)).unwrap();
        let (in_flight, ttl) = match r % 100 {
            0..=39 => {
                let len = 100 + (r >> 40) as usize % 3_000;
                let ttl = if r.is_multiple_of(10) {
                    5 + (r >> 50) as u32 % 60
                } else {
                    0
                };
                (InFlight::Set(k, value(k, op, len)), ttl)
            }
            40..=43 => (InFlight::Delete(k), 0),
            // A delete of a key the cache evicted: its old copy must not come back
            // (the evicted segment was retired before its walk, E2).
            44..=47 => {
                // One the last mover round dropped if there is one (its segment may not
                // be reused yet), else any the cache no longer has.
                let evicted = just_dropped.pop().or_else(|| {
                    (0..setup.keys())
                        .map(|i| (k + i) % setup.keys())
                        .find(|&e| {
                            model.get(&e).is_some_and(Option::is_some) && !has(&pools, setup, e)
                        })
                });
                (InFlight::Delete(evicted.unwrap_or(k)), 0)
            }
            48..=84 => {
                c.get(&key(k)).unwrap();
                (InFlight::None, 0)
            }
            85..=97 => {
                let had: Vec<u32> = (0..setup.keys())
                    .filter(|&e| has(&pools, setup, e))
                    .collect();
                for (_, c) in pools.iter() {
                    c.maintain().unwrap();
                }
                just_dropped = had
                    .into_iter()
                    .filter(|&e| !has(&pools, setup, e))
                    .collect();
                (InFlight::None, 0)
            }
            _ => {
                pools.advance_clock(30);
                clock += 30;
                (InFlight::None, 0)
            }
        };
        match &in_flight {
            InFlight::Set(k, v) => {
                let c = pools.at(setup.pool(*k)).unwrap();
                c.set(&key(*k), v, 0, ttl).unwrap();
            }
            InFlight::Delete(k) => {
                pools.at(setup.pool(*k)).unwrap().delete(&key(*k)).unwrap();
            }
            InFlight::None => {}
        }
        let images = RECORDER.with(|r| std::mem::take(&mut r.borrow_mut().images));
        for (point, image) in images.iter().enumerate() {
            check_image(
                setup,
                image,
                dir.path(),
                scratch.path(),
                &model,
                &in_flight,
                clock,
                op,
                point,
            );
            images_checked += 1;
        }
        match in_flight {
            InFlight::Set(k, v) => {
                let at = if ttl == 0 { 0 } else { c.now() + ttl };
                model.insert(k, Some((v, at)));
            }
            InFlight::Delete(k) => {
                model.insert(k, None);
            }
            InFlight::None => {}
        }
    }
    // What the checked operations did, from the warm-up's end.
    let (a, b) = (before.unwrap(), stats(&pools));
    let tier = |f: fn(&terrace_cache::TierStats) -> u64| -> u64 {
        b.tiers.iter().map(f).sum::<u64>() - a.tiers.iter().map(f).sum::<u64>()
    };
    let (demotions, promotions) = (b.demotions - a.demotions, b.promotions - a.promotions);
    let (reinserted, cleaned, expired, evicted) = (
        tier(|t| t.reinserted),
        tier(|t| t.items_cleaned),
        tier(|t| t.items_expired),
        tier(|t| t.items_evicted),
    );
    eprintln!(
        "{images_checked} images over {} operations after {}: demotions {demotions}, \
         promotions {promotions}, reinserted {reinserted}, cleaned {cleaned}, expired \
         {expired}, evicted {evicted}",
        op - setup.warm_up(),
        setup.warm_up(),
    );
    assert!(images_checked >= points);
    assert!(expired > 0, "{b:?}");
    match setup {
        // Every kind of move, in the images checked.
        Setup::One => {
            assert!(demotions > 0 && promotions > 0 && reinserted > 0, "{b:?}");
            assert!(cleaned > 0 && evicted > 0, "{b:?}");
        }
        // The pools' shorter run: some mover work in its images, and every kind of move
        // over the whole run.
        Setup::TwoPools => {
            assert!(demotions + promotions + reinserted + cleaned > 0, "{b:?}");
            assert!(
                b.demotions > 0 && b.promotions > 0 && b.reinsertions > 0,
                "{b:?}"
            );
        }
    }
}

//! The movers: the threads that do the cache's background work ahead of the writers —
//! eviction with its demotions and reinsertions, cleaning, the expiry sweep, promotion and
//! the flash tier's moves ([`Cache::maintain`]) — how many run, how writers wake them,
//! and the counters that say whether they keep up ([`MoverStats`]).
//!
//! # Design
//! [`Cache::start_movers`] starts [`CacheConfig::movers`](super::CacheConfig::movers)
//! threads (default: [`default_movers`] of the core count). Each calls `maintain` in a
//! loop, again at once after a round that evicted, else after its interval. They share
//! no mover-wide state: a round pops victims under the tier's lists lock, so each segment
//! is walked by one mover while the others walk other segments, and each mover copies
//! into lanes of its own (`tier::CopyLanes`: a lane per mover in each of the tier's copy
//! sets, `Tier::mover` and `Tier::reinsert`), so that their copies do not queue for one
//! lock. Work is thus split by segment, which is what writes consume. A round evicts
//! at most `ROUND_EVICTIONS` segments per tier, so that under a steady load it still
//! reaches the cleaning, the tiers below and the flash tier.
//!
//! Wake-ups: a writer that takes a free segment and leaves fewer than the tier's target
//! ([`Cache::free_target`]) wakes every mover; a parked mover also wakes at its interval.
//!
//! The writers' help: a writer that finds no free segment past the reinsertion reserve
//! evicts itself (an *inline* eviction, counted) until there is one, so the reserve
//! stays for the reinsertions, and in the last tier it then cleans a segment as a round
//! would (`cache/evict.rs`, `Cache::allocate`). So the policy's work gets done however
//! far behind the movers are — a mover slowed to one eviction per 10 ms leaves the hit
//! ratio where it was (`docs/results.md`) — and only the tail latency of sets pays, which
//! is why the movers are there.
//!
//! # Counters
//! Busy time (inside `maintain`), blocked time (waiting for a lists or copy-set lock a
//! writer or another mover held), work skipped because a lock was busy (`try_lock`
//! failures that leave policy work for later: an open segment not swept for expiry, a
//! promotion not queued), and each tier's free-segment low-water mark. Blocked time
//! that grows with the movers says they contend with each other; a low-water mark of
//! zero with inline evictions says they are too few or too slow.
//!
//! Lock order: `docs/concurrency.md` (the movers take no lock of their own).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};

use super::evict::{CleanRoom, Reinsertion};
use super::Cache;
use crate::error::CacheError;

/// The most segments one round of [`Cache::maintain`] evicts in one tier: a round that
/// evicted until the writers stopped taking segments would, under a steady load, never
/// reach the tier's cleaning, the tiers below or the flash tier.
pub(super) const ROUND_EVICTIONS: usize = 2;

/// The most movers [`default_movers`] picks, however many cores.
pub const MAX_DEFAULT_MOVERS: usize = 8;

/// Movers for a machine of `cores` cores: one per four cores, at least one, at most
/// [`MAX_DEFAULT_MOVERS`]. On 16 cores, 4: measured in `docs/results.md` (a thread sweep
/// of the cache workload, with the movers' busy and blocked time).
pub fn default_movers(cores: usize) -> usize {
    (cores / 4).clamp(1, MAX_DEFAULT_MOVERS)
}

/// The movers' counters, cache-wide (summed over pools by `Stats::combined`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MoverStats {
    /// Mover threads running.
    pub threads: usize,
    /// Rounds of [`Cache::maintain`] the mover threads ran.
    pub rounds: u64,
    /// Time the mover threads spent inside those rounds, nanoseconds (all threads).
    pub busy_ns: u64,
    /// Of that, time spent waiting for a tier's lists lock or copy-set lock held by
    /// another thread, nanoseconds.
    pub blocked_ns: u64,
    /// Policy work skipped because its lock was busy: open segments not swept for expiry
    /// in a round (swept a second later), promotions not queued (asked again at the
    /// item's next hit).
    pub skipped_contended: u64,
}

impl MoverStats {
    /// Adds `other`'s counts to these (`Stats::combined`).
    pub fn add(&mut self, other: &MoverStats) {
        self.threads += other.threads;
        self.rounds += other.rounds;
        self.busy_ns += other.busy_ns;
        self.blocked_ns += other.blocked_ns;
        self.skipped_contended += other.skipped_contended;
    }
}

#[derive(Debug, Default)]
pub(super) struct MoverCounters {
    rounds: AtomicU64,
    busy_ns: AtomicU64,
    blocked_ns: AtomicU64,
    pub skipped_contended: AtomicU64,
    pub errors: AtomicU64,
}

thread_local! {
    /// Set while this thread runs [`Cache::maintain`]: its evictions are background ones,
    /// and its lock waits count as the movers' blocked time.
    static IN_MOVER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

thread_local! {
    /// The copy lane of a mover thread: its number (`Tier::mover`, `Tier::reinsert`).
    static MOVER_LANE: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Whether this thread is one of the mover threads.
fn is_mover_thread() -> bool {
    MOVER_LANE.with(|l| l.get()).is_some()
}

/// Whether this thread is running [`Cache::maintain`].
pub(super) fn in_mover() -> bool {
    IN_MOVER.with(|m| m.get())
}

/// The handle of the mover threads ([`Cache::start_movers`]); stops and joins them on drop.
#[derive(Debug)]
pub struct Movers {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
    /// To take the threads off the cache's wake-up list once they have stopped.
    cache: std::sync::Weak<Cache>,
}

impl Movers {
    /// Whether at least one thread could be started.
    pub fn is_running(&self) -> bool {
        !self.handles.is_empty()
    }

    /// How many threads were started.
    pub fn count(&self) -> usize {
        self.handles.len()
    }
}

impl Drop for Movers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for h in &self.handles {
            h.thread().unpark();
        }
        let ids: Vec<_> = self.handles.iter().map(|h| h.thread().id()).collect();
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
        if let Some(cache) = self.cache.upgrade() {
            cache
                .mover_threads
                .lock()
                .retain(|t| !ids.contains(&t.id()));
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Cache {
    /// Locks `m`, a tier's lists or copy-set lock; in a mover, the time spent waiting
    /// for it counts as blocked ([`MoverStats::blocked_ns`]).
    pub(super) fn lock_timed<'m, T>(&self, m: &'m Mutex<T>) -> MutexGuard<'m, T> {
        if let Some(g) = m.try_lock() {
            return g;
        }
        if !in_mover() {
            return m.lock();
        }
        let start = Instant::now();
        let g = m.lock();
        self.mover_counters
            .blocked_ns
            .fetch_add(nanos(start.elapsed()), Ordering::Relaxed);
        g
    }

    /// The copy lane this thread starts from (`tier::CopyLanes`): a mover's own, and for
    /// every other thread the one after the movers'.
    pub(super) fn copy_lane(&self) -> usize {
        MOVER_LANE.with(|l| l.get()).unwrap_or(self.movers)
    }

    /// Counts one piece of policy work skipped because its lock was busy.
    pub(super) fn skipped_contended(&self) {
        self.mover_counters
            .skipped_contended
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Wakes the mover threads, if any run, to refill free segments now rather than at
    /// their next interval.
    pub(super) fn wake_movers(&self) {
        for t in self.mover_threads.lock().iter() {
            t.unpark();
        }
    }

    /// Free segments [`maintain`](Self::maintain) keeps ready in a tier: 1/64 of it, at
    /// least `MIN_FREE`, at most `MAX_FREE_SHARE` of it (`evict::free_target_of`).
    /// Writers wake the movers as soon as a tier runs below it, so the reserve only has
    /// to cover the time they take to wake up and evict.
    pub(super) fn free_target(&self, tier: usize) -> usize {
        super::evict::free_target_of(self.tiers[tier].area.count())
    }

    /// One round of the movers' work: promotions; then in every tier, the expiry sweep,
    /// freeing segments whose eviction has drained and evicting sealed segments (chosen,
    /// demoting and reinserting as an inline eviction would) until the tier has its
    /// target of free segments — at most `ROUND_EVICTIONS` of them, so that a round
    /// ends however fast writers take segments — and in the last memory tier one
    /// cleaning; then the flash tier's moves. Returns the segments evicted. Safe to call
    /// from any thread, concurrently with everything else and with itself:
    /// [`start_movers`](Self::start_movers) calls it in a loop on every mover thread,
    /// again at once after a round that evicted.
    pub fn maintain(&self) -> Result<usize, CacheError> {
        struct Flag(bool);
        impl Drop for Flag {
            fn drop(&mut self) {
                IN_MOVER.with(|m| m.set(self.0));
            }
        }
        let _flag = Flag(IN_MOVER.with(|m| m.replace(true)));
        // Promotions first: they take tier 0 space, which the loop below then refills.
        self.run_promotions()?;
        let mut evicted = 0;
        for (i, t) in self.tiers.iter().enumerate() {
            self.reclaim_expired(i)?;
            let target = self.free_target(i);
            let mut budget = ROUND_EVICTIONS;
            loop {
                let victim = {
                    let mut lists = self.lock_timed(&t.lists);
                    lists.free_drained(&t.area);
                    if lists.free.len() + lists.reclaim.len() >= target || budget == 0 {
                        break;
                    }
                    budget -= 1;
                    self.pop_victim(i, &mut lists)
                };
                let Some(victim) = victim else {
                    break;
                };
                self.evict_counted(i, victim, Reinsertion::Allowed)?;
                evicted += 1;
                if let Some(delay) = self.mover_delay.filter(|_| is_mover_thread()) {
                    std::thread::sleep(delay);
                }
            }
            if i + 1 == self.levels() {
                self.clean_one(i, CleanRoom::Free)?;
            }
        }
        evicted += self.maintain_flash()?;
        Ok(evicted)
    }

    /// The mover threads this cache starts ([`CacheConfig::movers`](super::CacheConfig::movers),
    /// resolved at open).
    pub fn mover_count(&self) -> usize {
        self.movers
    }

    /// Starts the cache's mover threads ([`mover_count`](Self::mover_count) of them), each
    /// calling [`maintain`](Self::maintain) every `interval` until the returned handle is
    /// dropped; writers also wake them whenever a tier's free segments run below target.
    /// Errors are counted in [`Stats::mover_errors`](super::Stats::mover_errors). A thread
    /// the OS refuses is not started (the others are; [`Movers::count`] says how many).
    pub fn start_movers(cache: &Arc<Cache>, interval: Duration) -> Movers {
        let stop = Arc::new(AtomicBool::new(false));
        let handles: Vec<_> = (0..cache.movers)
            .filter_map(|n| {
                let cache = Arc::clone(cache);
                let stop = Arc::clone(&stop);
                std::thread::Builder::new()
                    .name(format!("terrace-mover-{n}"))
                    .spawn(move || {
                        MOVER_LANE.with(|l| l.set(Some(n)));
                        while !stop.load(Ordering::Acquire) {
                            let start = Instant::now();
                            let round = cache.maintain();
                            let c = &cache.mover_counters;
                            c.busy_ns
                                .fetch_add(nanos(start.elapsed()), Ordering::Relaxed);
                            c.rounds.fetch_add(1, Ordering::Relaxed);
                            match round {
                                // Work left (a round's evictions are bounded): at once.
                                Ok(evicted) if evicted > 0 => continue,
                                Ok(_) => {}
                                Err(_) => {
                                    c.errors.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            std::thread::park_timeout(interval);
                        }
                    })
                    .ok()
            })
            .collect();
        cache
            .mover_threads
            .lock()
            .extend(handles.iter().map(|h| h.thread().clone()));
        Movers {
            stop,
            handles,
            cache: Arc::downgrade(cache),
        }
    }

    /// A snapshot of the movers' counters.
    pub(super) fn mover_stats(&self) -> MoverStats {
        let c = &self.mover_counters;
        MoverStats {
            threads: self.mover_threads.lock().len(),
            rounds: c.rounds.load(Ordering::Relaxed),
            busy_ns: c.busy_ns.load(Ordering::Relaxed),
            blocked_ns: c.blocked_ns.load(Ordering::Relaxed),
            skipped_contended: c.skipped_contended.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::{TierConfig, TierSize};
    use crate::CacheConfig;

    /// One DRAM tier of 2 MiB in segments of `2^shift` bytes.
    fn config(movers: usize, shift: u8) -> CacheConfig {
        CacheConfig {
            segment_shift: Some(shift),
            limits: crate::ItemLimits {
                max_key_len: 250,
                max_value_len: 8 << 10,
            },
            stripes: 2,
            movers,
            ..CacheConfig::new(vec![TierConfig::dram(TierSize::Bytes(2 << 20))])
        }
    }

    fn cache(movers: usize) -> Arc<Cache> {
        Arc::new(Cache::open(config(movers, 15)).unwrap().0)
    }

    #[test]
    fn every_mover_and_the_writers_have_a_copy_lane_within_the_copies_share() {
        // 64 segments: a quarter for copies is room for a lane each.
        let c = cache(3);
        assert_eq!(c.mover_count(), 3);
        assert_eq!(c.tiers[0].reinsert.len(), 4);
        assert_eq!(c.tiers[0].mover.len(), 4);
        // With 256 KiB segments, the tier has 8, whose copies' quarter has room for 2
        // lanes only.
        let (c, _) = Cache::open(config(8, 18)).unwrap();
        assert_eq!(c.tiers[0].area.count(), 8);
        assert_eq!(c.tiers[0].reinsert.len(), 2);
        // The default: from the core count.
        let c = cache(0);
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get());
        assert_eq!(c.mover_count(), default_movers(cores));
    }

    #[test]
    fn several_movers_evict_while_writers_write_and_report_their_work() {
        let c = cache(3);
        let movers = Cache::start_movers(&c, Duration::from_millis(1));
        assert_eq!(movers.count(), 3);
        assert_eq!(c.stats().movers.threads, 3);
        std::thread::scope(|s| {
            for w in 0..2 {
                let c = &c;
                s.spawn(move || {
                    for k in 0..20_000u32 {
                        let key = format!("w{w}:{k}");
                        c.set(key.as_bytes(), &[k as u8; 400], 0, 0).unwrap();
                        if k % 3 == 0 {
                            c.get(key.as_bytes()).unwrap();
                        }
                    }
                });
            }
        });
        // The writers wrote eight times the tier: someone evicted.
        let s = c.stats();
        let t = &s.tiers[0];
        assert!(t.segments_evicted > 64, "{t:?}");
        assert!(s.movers.rounds > 0, "{:?}", s.movers);
        assert!(s.movers.busy_ns >= s.movers.blocked_ns, "{:?}", s.movers);
        assert!(t.free_low_water < t.segments as usize, "{t:?}");
        // Every key written last is there (what the movers copied stayed readable).
        for w in 0..2 {
            let key = format!("w{w}:19999");
            assert_eq!(
                c.get(key.as_bytes()).unwrap().unwrap().value(),
                &[31u8; 400]
            );
        }
        drop(movers);
        assert_eq!(
            c.stats().movers.threads,
            0,
            "stopped movers are not counted"
        );
    }

    #[test]
    fn the_default_is_one_mover_per_four_cores_within_bounds() {
        assert_eq!(default_movers(1), 1);
        assert_eq!(default_movers(2), 1);
        assert_eq!(default_movers(8), 2);
        assert_eq!(default_movers(16), 4);
        assert_eq!(default_movers(256), MAX_DEFAULT_MOVERS);
    }
}

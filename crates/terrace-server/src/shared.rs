//! What every connection shares: the cache (its pools, and which key prefixes go to
//! which), the server's settings and counters, and the memcached semantics the three
//! protocols have in common (expiry times, counted gets and stores, delayed flush), so
//! each protocol module only parses and formats.
//!
//! Invariants: every operation here counts itself under memcached's stat names exactly
//! once; an exptime that is already in the past never leaves the key's old value
//! readable (memcached stores the item expired; Terrace removes the key, which reads the
//! same).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use terrace_cache::{Cache, CacheError, Checked, FlashFetch, FlashRead, Guard, Pools, Store};

use crate::marks::Marks;
use crate::stats::{Counter, Counters, DetailOp, ListenFacts, RestartFacts};

/// memcached treats an exptime above this many seconds (30 days) as a Unix time.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// Settings the protocols need at run time.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest value accepted, bytes.
    pub max_value: usize,
    /// Longest key accepted, bytes (memcached: 250).
    pub max_key: usize,
}

/// Which key prefixes go to which named pool (`--pool NAME:PREFIX:SIZE`): the longest
/// matching prefix wins; a key that matches none goes to the default pool.
#[derive(Clone, Debug, Default)]
pub struct Routes {
    /// (prefix, position of the pool in `Pools::iter`), longest prefix first.
    prefixes: Vec<(Vec<u8>, usize)>,
}

impl Routes {
    /// Routes for `(prefix, pool position)` pairs.
    pub fn new(mut prefixes: Vec<(Vec<u8>, usize)>) -> Routes {
        prefixes.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        Routes { prefixes }
    }

    /// The position of the pool `key` goes to, if a prefix matches.
    pub fn pool_of(&self, key: &[u8]) -> Option<usize> {
        self.prefixes
            .iter()
            .find(|(prefix, _)| key.starts_with(prefix))
            .map(|&(_, position)| position)
    }
}

/// How a storage command conditions its write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreOp {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// Store only if the key's CAS is this.
    Cas(u64),
}

/// Which end of a value `append` and `prepend` add to, and which way `incr` and `decr`
/// move a number: the cache's own enums, so the protocols pass them straight through.
pub use terrace_cache::{Delta, Side};

/// A cache failure as the protocols report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Key empty, too long or with bytes a key cannot hold.
    BadKey,
    /// Value (or appended result) larger than the limit.
    TooLarge,
    /// No room could be made.
    OutOfMemory,
    /// incr/decr of a value that is not a number.
    NotANumber,
    /// Anything else (media error); logged.
    Internal,
}

impl Failure {
    pub fn of(e: &CacheError) -> Failure {
        match e {
            CacheError::Encode(terrace_cache::EncodeError::KeyTooLong { .. })
            | CacheError::Encode(terrace_cache::EncodeError::EmptyKey) => Failure::BadKey,
            CacheError::Encode(_) | CacheError::TooLarge { .. } => Failure::TooLarge,
            CacheError::NoSpace { .. } => Failure::OutOfMemory,
            CacheError::NotANumber => Failure::NotANumber,
            other => {
                tracing::warn!(error = %other, "cache operation failed");
                Failure::Internal
            }
        }
    }
}

/// The state every connection shares.
pub struct Shared {
    pub pools: Arc<Pools>,
    routes: Routes,
    pub limits: Limits,
    pub counters: Counters,
    pub started: Instant,
    /// Listener-level facts `stats` reports.
    pub max_connections: usize,
    pub threads: usize,
    /// Unix time at which a delayed `flush_all` takes effect (0: none pending).
    flush_at: AtomicU64,
    /// The meta protocol's stale and win marks.
    pub marks: Marks,
    /// The next CAS for a store whose item is already expired: counted down from
    /// `u64::MAX`, far above any CAS the engine hands out (a write sequence times the
    /// segment size, plus an offset), so it never matches a live item's.
    expired_cas: AtomicU64,
    /// Where the server listens (for `stats settings`); set by the server after `new`.
    pub listen: ListenFacts,
    /// What the start found in the tiers; set by the server after `new`.
    pub restart: RestartFacts,
    /// The workers' I/O engine (`io_uring` or `epoll`); set by the server after `new`.
    pub io_engine: &'static str,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("limits", &self.limits)
            .finish()
    }
}

/// Flash reads a request would wait for, by pool (see [`Shared::add_flash_fetch`]):
/// run it on a thread that may block, then handle the request.
#[derive(Debug, Default)]
pub struct Fetch {
    /// (pool position, `None` for the default pool; its reads).
    parts: Vec<(Option<usize>, FlashFetch)>,
}

impl Fetch {
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }
}

/// What an exptime means now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// Lives this many seconds (0: forever).
    Ttl(u32),
    /// Already expired: the write removes the key.
    Past,
}

impl Shared {
    pub fn new(
        pools: Arc<Pools>,
        routes: Routes,
        limits: Limits,
        max_connections: usize,
        threads: usize,
    ) -> Shared {
        Shared {
            pools,
            routes,
            limits,
            counters: Counters::new(),
            started: Instant::now(),
            max_connections,
            threads,
            flush_at: AtomicU64::new(0),
            marks: Marks::new(),
            expired_cas: AtomicU64::new(u64::MAX),
            listen: ListenFacts::default(),
            restart: RestartFacts::default(),
            io_engine: "epoll",
        }
    }

    /// The server version string.
    pub fn version(&self) -> &'static str {
        concat!("1.6.18-terrace-", env!("CARGO_PKG_VERSION"))
    }

    /// Unix seconds on the cache's clock.
    pub fn now(&self) -> u32 {
        self.pools.default_pool().now()
    }

    /// The pool `key` belongs to: the named pool of the longest prefix it starts with,
    /// else the default pool.
    pub fn cache(&self, key: &[u8]) -> &Cache {
        self.pool_cache(self.routes.pool_of(key))
    }

    /// The named pool at `position`, or the default pool.
    fn pool_cache(&self, position: Option<usize>) -> &Cache {
        position
            .and_then(|p| self.pools.at(p))
            .unwrap_or_else(|| self.pools.default_pool())
    }

    /// Whether any pool has a flash tier (whose reads a worker makes ahead of its gets).
    pub fn has_flash(&self) -> bool {
        self.pools.iter().any(|(_, c)| c.has_flash())
    }

    /// Adds to `fetch` the flash reads a lookup of `key` would wait for now.
    pub fn add_flash_fetch(&self, key: &[u8], fetch: &mut Fetch) {
        if !self.key_ok(key) {
            return;
        }
        let pool = self.routes.pool_of(key);
        if let Some(f) = self.pool_cache(pool).flash_fetch(key) {
            fetch.parts.push((pool, f));
        }
    }

    /// Runs `fetch`'s reads (waiting on the device): the request's lookups then find its
    /// items in DRAM.
    pub fn run_fetch(&self, fetch: &Fetch) {
        for (pool, f) in &fetch.parts {
            self.pool_cache(*pool).run_flash_fetch(f);
        }
    }

    /// `fetch`'s reads for a worker's own I/O engine to run, each with its pool (see
    /// `Cache::flash_reads`); their results go to [`finish_flash_read`](Self::finish_flash_read).
    pub fn flash_reads(&self, fetch: &Fetch) -> Vec<(Option<usize>, FlashRead)> {
        fetch
            .parts
            .iter()
            .flat_map(|(pool, f)| {
                self.pool_cache(*pool)
                    .flash_reads(f)
                    .into_iter()
                    .map(move |r| (*pool, r))
            })
            .collect()
    }

    /// Stages what a flash read of pool `pool` read, or returns the read still needed.
    pub fn finish_flash_read(
        &self,
        pool: Option<usize>,
        read: FlashRead,
        result: io::Result<usize>,
    ) -> Option<FlashRead> {
        self.pool_cache(pool).finish_flash_read(read, result)
    }

    /// memcached's exptime rules: 0 never expires; up to 30 days is relative; above is a
    /// Unix time; negative, or an absolute time not in the future, is already expired.
    pub fn expiry(&self, exptime: i64) -> Expiry {
        if exptime == 0 {
            return Expiry::Ttl(0);
        }
        if exptime < 0 {
            return Expiry::Past;
        }
        let ttl = if exptime > REALTIME_MAXDELTA {
            exptime - i64::from(self.now())
        } else {
            exptime
        };
        if ttl <= 0 {
            Expiry::Past
        } else {
            Expiry::Ttl(u32::try_from(ttl).unwrap_or(u32::MAX))
        }
    }

    /// A counted get (cmd_get, get_hits, get_misses, and `stats detail`).
    pub fn get(&self, key: &[u8]) -> Result<Option<Guard<'_>>, Failure> {
        let r = self.get_meta_bumping(key, true)?;
        self.counters
            .detail
            .record(key, DetailOp::Get { hit: r.is_some() });
        Ok(r)
    }

    /// [`get`](Self::get) without the `stats detail` tally (memcached does not count
    /// the meta commands there; the same holds for every `_meta` operation); without
    /// `bump` the read is not recorded as an access (meta `u`, memcached's "no LRU
    /// bump": the item stays unread for `h`, and the read does not count toward its
    /// promotion), counted the same.
    pub fn get_meta_bumping(&self, key: &[u8], bump: bool) -> Result<Option<Guard<'_>>, Failure> {
        self.counters.add(Counter::CmdGet, 1);
        let cache = self.cache(key);
        let r = if bump {
            cache.get(key)
        } else {
            cache.peek(key)
        }
        .map_err(|e| Failure::of(&e))?;
        self.counters.add(
            if r.is_some() {
                Counter::GetHits
            } else {
                Counter::GetMisses
            },
            1,
        );
        Ok(r)
    }

    /// Get-and-touch: gives a present key a new expiry, then reads it (counted as a touch
    /// and a get). The item keeps its CAS, and so its meta marks.
    pub fn gat(&self, key: &[u8], exptime: i64) -> Result<Option<Guard<'_>>, Failure> {
        let r = self.gat_meta_bumping(key, exptime, true)?;
        self.counters
            .detail
            .record(key, DetailOp::Get { hit: r.is_some() });
        Ok(r)
    }

    /// [`gat`](Self::gat) without the `stats detail` tally; without `bump` the read is
    /// not recorded as an access (as [`get_meta_bumping`](Self::get_meta_bumping)).
    pub fn gat_meta_bumping(
        &self,
        key: &[u8],
        exptime: i64,
        bump: bool,
    ) -> Result<Option<Guard<'_>>, Failure> {
        self.counters.add(Counter::CmdTouch, 1);
        let touched = match self.expiry(exptime) {
            Expiry::Ttl(ttl) => self
                .cache(key)
                .touch(key, ttl)
                .map_err(|e| Failure::of(&e))?,
            Expiry::Past => {
                // The item is returned once more, then gone (memcached returns it too).
                let hit = self.get_meta_bumping(key, bump)?;
                if hit.is_some() {
                    self.counters.add(Counter::TouchHits, 1);
                    let guard = hit;
                    let _ = self.cache(key).delete(key);
                    return Ok(guard);
                }
                self.counters.add(Counter::TouchMisses, 1);
                return Ok(None);
            }
        };
        self.counters.add(
            if touched {
                Counter::TouchHits
            } else {
                Counter::TouchMisses
            },
            1,
        );
        if !touched {
            self.counters.add(Counter::CmdGet, 1);
            self.counters.add(Counter::GetMisses, 1);
            return Ok(None);
        }
        self.get_meta_bumping(key, bump)
    }

    /// A storage command: `Store::Stored` carries the new CAS.
    pub fn store(
        &self,
        op: StoreOp,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: i64,
    ) -> Result<Store, Failure> {
        self.store_checked(op, key, value, flags, exptime, None)
    }

    /// [`store`](Self::store) without the `stats detail` tally.
    pub fn store_meta(
        &self,
        op: StoreOp,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: i64,
    ) -> Result<Store, Failure> {
        self.store_checked_meta(op, key, value, flags, exptime, None)
    }

    /// [`store`](Self::store), with append and prepend applied only to the item of CAS
    /// `if_cas` when one is given ([`Store::Exists`] otherwise; checked atomically with
    /// the write). Other operations ignore `if_cas` (`StoreOp::Cas` carries its own).
    pub fn store_checked(
        &self,
        op: StoreOp,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: i64,
        if_cas: Option<u64>,
    ) -> Result<Store, Failure> {
        self.counters.detail.record(key, DetailOp::Set);
        self.store_checked_meta(op, key, value, flags, exptime, if_cas)
    }

    /// [`store_checked`](Self::store_checked) without the `stats detail` tally.
    pub fn store_checked_meta(
        &self,
        op: StoreOp,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: i64,
        if_cas: Option<u64>,
    ) -> Result<Store, Failure> {
        self.counters.add(Counter::CmdSet, 1);
        let cache = self.cache(key);
        let fail = |e: CacheError| Failure::of(&e);
        let ttl = match self.expiry(exptime) {
            Expiry::Ttl(t) => t,
            Expiry::Past => return self.store_expired(op, key, value),
        };
        let r = match op {
            StoreOp::Set => Store::Stored {
                cas: cache.set(key, value, flags, ttl).map_err(fail)?,
            },
            StoreOp::Add => cache.add(key, value, flags, ttl).map_err(fail)?,
            StoreOp::Replace => cache.replace(key, value, flags, ttl).map_err(fail)?,
            StoreOp::Append => self.concat(key, value, Side::Back, if_cas)?,
            StoreOp::Prepend => self.concat(key, value, Side::Front, if_cas)?,
            StoreOp::Cas(cas) => {
                let r = cache.cas(key, value, flags, ttl, cas).map_err(fail)?;
                self.counters.add(
                    match r {
                        Store::Stored { .. } => Counter::CasHits,
                        Store::Exists => Counter::CasBadval,
                        _ => Counter::CasMisses,
                    },
                    1,
                );
                r
            }
        };
        if matches!(r, Store::Stored { .. }) {
            self.counters.add(Counter::TotalItems, 1);
        }
        Ok(r)
    }

    fn concat(
        &self,
        key: &[u8],
        data: &[u8],
        side: Side,
        if_cas: Option<u64>,
    ) -> Result<Store, Failure> {
        self.cache(key)
            .concat(key, data, side, if_cas)
            .map_err(|e| Failure::of(&e))
    }

    /// A store whose exptime is already past: the answer the condition gives, and the
    /// key ends up absent.
    fn store_expired(&self, op: StoreOp, key: &[u8], value: &[u8]) -> Result<Store, Failure> {
        if value.len() > self.limits.max_value {
            return Err(Failure::TooLarge);
        }
        let cache = self.cache(key);
        let present = cache
            .peek(key)
            .map_err(|e| Failure::of(&e))?
            .map(|g| g.cas());
        let r = match (op, present) {
            (StoreOp::Add, Some(_)) => Store::NotStored,
            (StoreOp::Replace | StoreOp::Append | StoreOp::Prepend, None) => Store::NotStored,
            (StoreOp::Cas(_), None) => Store::NotFound,
            (StoreOp::Cas(want), Some(have)) if want != have => Store::Exists,
            // As memcached, the store succeeds and has a CAS of its own, though nothing
            // can read it back.
            _ => Store::Stored {
                cas: self.expired_cas.fetch_sub(1, Ordering::Relaxed),
            },
        };
        if matches!(r, Store::Stored { .. }) {
            cache.delete(key).map_err(|e| Failure::of(&e))?;
        }
        Ok(r)
    }

    /// Counted delete: whether a live item was removed.
    pub fn delete(&self, key: &[u8]) -> Result<bool, Failure> {
        Ok(self.delete_checked(key, None)? == Checked::Done(()))
    }

    /// Counted delete of the item of CAS `if_cas` only, when one is given (compared
    /// atomically with the removal); a refusal counts as a delete miss.
    pub fn delete_checked(&self, key: &[u8], if_cas: Option<u64>) -> Result<Checked<()>, Failure> {
        self.counters.detail.record(key, DetailOp::Delete);
        self.delete_checked_meta(key, if_cas)
    }

    /// [`delete_checked`](Self::delete_checked) without the `stats detail` tally.
    pub fn delete_checked_meta(
        &self,
        key: &[u8],
        if_cas: Option<u64>,
    ) -> Result<Checked<()>, Failure> {
        let r = self
            .cache(key)
            .delete_checked(key, if_cas)
            .map_err(|e| Failure::of(&e))?;
        self.counters.add(
            if r == Checked::Done(()) {
                Counter::DeleteHits
            } else {
                Counter::DeleteMisses
            },
            1,
        );
        Ok(r)
    }

    /// Counted touch: whether the key was there.
    pub fn touch(&self, key: &[u8], exptime: i64) -> Result<bool, Failure> {
        self.counters.add(Counter::CmdTouch, 1);
        let hit = match self.expiry(exptime) {
            Expiry::Ttl(ttl) => self
                .cache(key)
                .touch(key, ttl)
                .map_err(|e| Failure::of(&e))?,
            Expiry::Past => self.cache(key).delete(key).map_err(|e| Failure::of(&e))?,
        };
        self.counters.add(
            if hit {
                Counter::TouchHits
            } else {
                Counter::TouchMisses
            },
            1,
        );
        Ok(hit)
    }

    /// Counted incr or decr: the new value, `None` on a miss.
    pub fn arith(&self, key: &[u8], amount: u64, way: Delta) -> Result<Option<u64>, Failure> {
        Ok(match self.arith_checked(key, amount, way, None)? {
            Checked::Done((value, _)) => Some(value),
            _ => None,
        })
    }

    /// Counted incr or decr of the item of CAS `if_cas` only, when one is given (checked
    /// atomically with the write): the new value and the new CAS. A refusal counts as a
    /// hit (the key was there).
    pub fn arith_checked(
        &self,
        key: &[u8],
        amount: u64,
        way: Delta,
        if_cas: Option<u64>,
    ) -> Result<Checked<(u64, u64)>, Failure> {
        let r = self
            .cache(key)
            .arith(key, amount, way, if_cas)
            .map_err(|e| Failure::of(&e))?;
        let counter = match (way, r != Checked::NotFound) {
            (Delta::Incr, true) => Counter::IncrHits,
            (Delta::Incr, false) => Counter::IncrMisses,
            (Delta::Decr, true) => Counter::DecrHits,
            (Delta::Decr, false) => Counter::DecrMisses,
        };
        self.counters.add(counter, 1);
        Ok(r)
    }

    /// `flush_all [delay]`: now, or once the delay has passed (checked by
    /// [`run_delayed_flush`](Self::run_delayed_flush), which the server calls every
    /// second). A later flush_all replaces a pending one.
    pub fn flush_all(&self, delay: i64) {
        self.counters.add(Counter::CmdFlush, 1);
        match self.expiry(delay) {
            Expiry::Ttl(0) | Expiry::Past => {
                self.flush_at.store(0, Ordering::Relaxed);
                self.pools.flush_all();
            }
            Expiry::Ttl(secs) => {
                let at = u64::from(self.now()) + u64::from(secs);
                self.flush_at.store(at, Ordering::Relaxed);
            }
        }
    }

    /// Carries out a delayed flush whose time has come; returns whether it did.
    pub fn run_delayed_flush(&self) -> bool {
        let at = self.flush_at.load(Ordering::Relaxed);
        if at == 0 || u64::from(self.now()) < at {
            return false;
        }
        if self
            .flush_at
            .compare_exchange(at, 0, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.pools.flush_all();
            return true;
        }
        false
    }

    /// Whether `key` is one the text protocols accept: 1..=max_key bytes. As in
    /// memcached, any byte but the space that separates tokens and the line's own `\n`
    /// may be in a key (load tools such as memcaslap send control bytes in keys).
    pub fn key_ok(&self, key: &[u8]) -> bool {
        !key.is_empty() && key.len() <= self.limits.max_key && !key.contains(&b' ')
    }
}

/// A small DRAM-only server state for the protocol modules' unit tests.
#[cfg(test)]
pub(crate) fn test_shared() -> Shared {
    use terrace_cache::{CacheConfig, TierConfig, TierSize};
    let mut config = CacheConfig::new(vec![TierConfig::dram(TierSize::Bytes(32 << 20))]);
    config.stripes = 2;
    let (pools, _) = Pools::open(config, &[]).expect("a 32 MiB DRAM cache opens");
    Shared::new(
        Arc::new(pools),
        Routes::default(),
        Limits {
            max_value: 1 << 20,
            max_key: 250,
        },
        1024,
        2,
    )
}

#[cfg(test)]
mod tests {
    use super::Routes;

    #[test]
    fn the_longest_matching_prefix_routes_a_key() {
        let routes = Routes::new(vec![
            (b"a".to_vec(), 1),
            (b"ab".to_vec(), 2),
            (b"b:".to_vec(), 3),
        ]);
        assert_eq!(routes.pool_of(b"abc"), Some(2));
        assert_eq!(routes.pool_of(b"ab"), Some(2));
        assert_eq!(routes.pool_of(b"ax"), Some(1));
        assert_eq!(routes.pool_of(b"b:1"), Some(3));
        assert_eq!(routes.pool_of(b"b"), None);
        assert_eq!(routes.pool_of(b""), None);
        assert_eq!(Routes::default().pool_of(b"abc"), None);
    }
}

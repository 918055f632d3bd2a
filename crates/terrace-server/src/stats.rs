//! Server counters and the `stats` report: memcached's stat names where memcached has
//! one (so existing dashboards and `memcached-tool` work), then Terrace's own per-tier
//! stats (`tier_<i>_<name>`) and, when named pools are configured, per-pool stats
//! (`pool_<name>_<stat>`); the same report rendered in Prometheus' text format (pools
//! and tiers as labels). Cache-wide figures are the sum over the pools.
//!
//! Counters are sharded by thread so two workers never write the same cache line on a
//! hit; a read sums the shards (each shard monotonic, so a sum never goes backwards by
//! more than the increments in flight).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::shared::Shared;

/// One counter, named after memcached's stat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    CmdGet,
    CmdSet,
    CmdFlush,
    CmdTouch,
    GetHits,
    GetMisses,
    DeleteHits,
    DeleteMisses,
    IncrHits,
    IncrMisses,
    DecrHits,
    DecrMisses,
    CasHits,
    CasMisses,
    CasBadval,
    TouchHits,
    TouchMisses,
    TotalItems,
    BytesRead,
    BytesWritten,
    TotalConnections,
    RejectedConnections,
    ProtocolErrors,
}

const COUNTERS: usize = Counter::ProtocolErrors as usize + 1;

const ALL: [Counter; COUNTERS] = [
    Counter::CmdGet,
    Counter::CmdSet,
    Counter::CmdFlush,
    Counter::CmdTouch,
    Counter::GetHits,
    Counter::GetMisses,
    Counter::DeleteHits,
    Counter::DeleteMisses,
    Counter::IncrHits,
    Counter::IncrMisses,
    Counter::DecrHits,
    Counter::DecrMisses,
    Counter::CasHits,
    Counter::CasMisses,
    Counter::CasBadval,
    Counter::TouchHits,
    Counter::TouchMisses,
    Counter::TotalItems,
    Counter::BytesRead,
    Counter::BytesWritten,
    Counter::TotalConnections,
    Counter::RejectedConnections,
    Counter::ProtocolErrors,
];

const NAMES: [&str; COUNTERS] = [
    "cmd_get",
    "cmd_set",
    "cmd_flush",
    "cmd_touch",
    "get_hits",
    "get_misses",
    "delete_hits",
    "delete_misses",
    "incr_hits",
    "incr_misses",
    "decr_hits",
    "decr_misses",
    "cas_hits",
    "cas_misses",
    "cas_badval",
    "touch_hits",
    "touch_misses",
    "total_items",
    "bytes_read",
    "bytes_written",
    "total_connections",
    "rejected_connections",
    "protocol_errors",
];

const SHARDS: usize = 16;

#[repr(align(128))]
struct Shard([AtomicU64; COUNTERS]);

/// Sharded monotonic counters plus the current connection gauge.
pub struct Counters {
    shards: Box<[Shard]>,
    /// Sums at the last `stats reset`, subtracted from every read.
    baseline: [AtomicU64; COUNTERS],
    pub curr_connections: AtomicUsize,
}

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
}

impl Counters {
    pub fn new() -> Counters {
        Counters {
            shards: (0..SHARDS)
                .map(|_| Shard(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
            baseline: std::array::from_fn(|_| AtomicU64::new(0)),
            curr_connections: AtomicUsize::new(0),
        }
    }

    pub fn add(&self, c: Counter, n: u64) {
        let shard = SHARD.with(|s| *s);
        self.shards[shard].0[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    fn total(&self, c: Counter) -> u64 {
        self.shards
            .iter()
            .map(|s| s.0[c as usize].load(Ordering::Relaxed))
            .sum()
    }

    /// The counter's value since the last [`reset`](Self::reset).
    pub fn get(&self, c: Counter) -> u64 {
        self.total(c)
            .saturating_sub(self.baseline[c as usize].load(Ordering::Relaxed))
    }

    /// `stats reset`: every counter reads 0 from now on (the connection gauge is kept).
    pub fn reset(&self) {
        for (c, base) in ALL.iter().zip(&self.baseline) {
            base.store(self.total(*c), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_order_agree() {
        for (i, c) in ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
        let c = Counters::new();
        c.add(Counter::GetHits, 3);
        assert_eq!(c.get(Counter::GetHits), 3);
        c.reset();
        assert_eq!(c.get(Counter::GetHits), 0);
        c.add(Counter::GetHits, 2);
        assert_eq!(c.get(Counter::GetHits), 2);
        assert_eq!(NAMES[Counter::GetHits as usize], "get_hits");
    }
}

impl Default for Counters {
    fn default() -> Self {
        Counters::new()
    }
}

/// A stat's value: memcached prints integers and a few strings.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Int(u64),
    Float(f64),
    Text(String),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Float(x) => write!(f, "{x:.6}"),
            Value::Text(s) => f.write_str(s),
        }
    }
}

/// User and system CPU seconds of this process.
fn rusage() -> (f64, f64) {
    let (user, system) = terrace_media::os::cpu_times();
    (user.as_secs_f64(), system.as_secs_f64())
}

/// The general `stats` report, in memcached's order where names overlap.
pub fn report(shared: &Shared) -> Vec<(String, Value)> {
    let per_pool = shared.pools.stats();
    let mut out = report_of(shared, &per_pool);
    for (name, stat, v) in pool_report(shared, &per_pool) {
        out.push((format!("pool_{name}_{stat}"), Value::Int(v)));
    }
    out
}

/// [`report`] from the pools' stats, taken once (each sweeps its pool's index), without
/// the per-pool lines ([`pool_report`]).
fn report_of(shared: &Shared, per_pool: &[(String, terrace_cache::Stats)]) -> Vec<(String, Value)> {
    let c = &shared.counters;
    let cache = terrace_cache::Stats::combined(per_pool.iter().map(|(_, s)| s));
    let segment_size = shared.pools.default_pool().segment_size() as u64;
    let (user, system) = rusage();
    let mut out: Vec<(String, Value)> = Vec::with_capacity(64);
    let mut put = |k: &str, v: Value| out.push((k.to_string(), v));
    put("pid", Value::Int(u64::from(std::process::id())));
    put("uptime", Value::Int(shared.started.elapsed().as_secs()));
    put("time", Value::Int(u64::from(shared.now())));
    put("version", Value::Text(shared.version().to_string()));
    put("libevent", Value::Text("tokio".to_string()));
    put("pointer_size", Value::Int(usize::BITS as u64));
    put("rusage_user", Value::Float(user));
    put("rusage_system", Value::Float(system));
    put("max_connections", Value::Int(shared.max_connections as u64));
    put(
        "curr_connections",
        Value::Int(c.curr_connections.load(Ordering::Relaxed) as u64),
    );
    for counter in [
        Counter::TotalConnections,
        Counter::RejectedConnections,
        Counter::CmdGet,
        Counter::CmdSet,
        Counter::CmdFlush,
        Counter::CmdTouch,
        Counter::GetHits,
        Counter::GetMisses,
    ] {
        put(NAMES[counter as usize], Value::Int(c.get(counter)));
    }
    put("get_expired", Value::Int(cache.expired));
    for counter in [
        Counter::DeleteMisses,
        Counter::DeleteHits,
        Counter::IncrMisses,
        Counter::IncrHits,
        Counter::DecrMisses,
        Counter::DecrHits,
        Counter::CasMisses,
        Counter::CasHits,
        Counter::CasBadval,
        Counter::TouchHits,
        Counter::TouchMisses,
        Counter::BytesRead,
        Counter::BytesWritten,
    ] {
        put(NAMES[counter as usize], Value::Int(c.get(counter)));
    }
    let capacity: u64 = cache
        .tiers
        .iter()
        .map(|t| u64::from(t.segments) * segment_size)
        .sum();
    put("limit_maxbytes", Value::Int(capacity));
    put("threads", Value::Int(shared.threads as u64));
    let used: u64 = cache
        .tiers
        .iter()
        .map(|t| u64::from(t.segments).saturating_sub(t.free_segments as u64))
        .sum::<u64>()
        * segment_size;
    put("bytes", Value::Int(used));
    put("curr_items", Value::Int(cache.items as u64));
    put("total_items", Value::Int(c.get(Counter::TotalItems)));
    // Items dropped by any tier's eviction (a tier above the last drops what it does not
    // demote), and index entries evicted for want of a slot.
    let evicted: u64 = cache.tiers.iter().map(|t| t.items_evicted).sum();
    put("evictions", Value::Int(evicted + cache.index_evictions));
    put("expired_unfetched", Value::Int(0));
    // Items whose space was taken back after they expired (a segment reclaimed when its
    // TTL passed, or evicted with expired items in it).
    let reclaimed: u64 = cache.tiers.iter().map(|t| t.items_expired).sum();
    put("reclaimed", Value::Int(reclaimed));
    put(
        "protocol_errors",
        Value::Int(c.get(Counter::ProtocolErrors)),
    );
    // Terrace's own.
    put("terrace_tiers", Value::Int(cache.tiers.len() as u64));
    put("terrace_demotions", Value::Int(cache.demotions));
    put("terrace_promotions", Value::Int(cache.promotions));
    put(
        "terrace_inline_evictions",
        Value::Int(cache.inline_evictions),
    );
    put(
        "terrace_background_evictions",
        Value::Int(cache.background_evictions),
    );
    put("terrace_index_evictions", Value::Int(cache.index_evictions));
    put("terrace_mover_errors", Value::Int(cache.mover_errors));
    put("terrace_persist_errors", Value::Int(cache.persist_errors));
    put(
        "terrace_index_bytes_per_item",
        Value::Float(cache.index_bytes_per_item),
    );
    put("terrace_segment_bytes", Value::Int(segment_size));
    for (i, t) in cache.tiers.iter().enumerate() {
        let seg = segment_size;
        let mut tier = |name: &str, v: u64| out.push((format!("tier_{i}_{name}"), Value::Int(v)));
        tier("bytes", u64::from(t.segments) * seg);
        tier("segments", u64::from(t.segments));
        tier("free_segments", t.free_segments as u64);
        tier("sealed_segments", t.sealed_segments as u64);
        tier("items", t.items);
        tier("live_bytes", t.live_bytes);
        tier("dead_bytes", t.dead_bytes);
        tier("hits", t.hits);
        tier("evicted_segments", t.segments_evicted);
        tier("evicted_items", t.items_evicted);
        tier("expired_items", t.items_expired);
        tier("demotions_in", t.demotions_in);
        tier("promotions_in", t.promotions_in);
        tier("inline_evictions", t.inline_evictions);
        tier("background_evictions", t.background_evictions);
        tier("cleaned_segments", t.segments_cleaned);
        tier("cleaned_items", t.items_cleaned);
    }
    out
}

/// Per-pool stats, as (pool, stat, value): what the pool holds and what happened in it;
/// none without named pools.
fn pool_report(
    shared: &Shared,
    per_pool: &[(String, terrace_cache::Stats)],
) -> Vec<(String, &'static str, u64)> {
    if per_pool.len() < 2 {
        return Vec::new();
    }
    let segment_size = shared.pools.default_pool().segment_size() as u64;
    let mut out = Vec::with_capacity(per_pool.len() * 15);
    for (name, s) in per_pool {
        let sum = |f: fn(&terrace_cache::TierStats) -> u64| s.tiers.iter().map(f).sum::<u64>();
        let segments = sum(|t| u64::from(t.segments));
        let free = sum(|t| t.free_segments as u64);
        for (stat, v) in [
            ("limit_maxbytes", segments * segment_size),
            ("bytes", segments.saturating_sub(free) * segment_size),
            ("curr_items", s.items as u64),
            ("live_bytes", sum(|t| t.live_bytes)),
            ("dead_bytes", sum(|t| t.dead_bytes)),
            ("get_hits", s.hits),
            ("get_misses", s.misses),
            ("get_expired", s.expired),
            ("evictions", sum(|t| t.items_evicted) + s.index_evictions),
            ("reclaimed", sum(|t| t.items_expired)),
            ("demotions", s.demotions),
            ("promotions", s.promotions),
            ("inline_evictions", s.inline_evictions),
            ("background_evictions", s.background_evictions),
        ] {
            out.push((name.clone(), stat, v));
        }
    }
    out
}

/// `stats settings`.
pub fn settings(shared: &Shared) -> Vec<(String, Value)> {
    vec![
        (
            "maxconns".to_string(),
            Value::Int(shared.max_connections as u64),
        ),
        ("num_threads".to_string(), Value::Int(shared.threads as u64)),
        (
            "item_size_max".to_string(),
            Value::Int(shared.limits.max_value as u64),
        ),
        (
            "key_size_max".to_string(),
            Value::Int(shared.limits.max_key as u64),
        ),
        ("cas_enabled".to_string(), Value::Text("yes".to_string())),
        ("evictions".to_string(), Value::Text("on".to_string())),
    ]
}

/// The report in Prometheus' text exposition format: every numeric stat as
/// `memcached_<name>` (a gauge; counters end in `_total` in Prometheus style only where
/// the memcached exporter does the same, which dashboards expect — so names are kept
/// as-is, prefixed), per-tier stats labelled `{tier="i"}`.
pub fn prometheus(shared: &Shared) -> String {
    let mut s = String::with_capacity(4096);
    let per_pool = shared.pools.stats();
    for (name, value) in report_of(shared, &per_pool) {
        let number = match value {
            Value::Int(n) => n as f64,
            Value::Float(x) => x,
            Value::Text(_) => continue,
        };
        if let Some(rest) = name.strip_prefix("tier_") {
            if let Some((tier, stat)) = rest.split_once('_') {
                let _ = writeln!(s, "terrace_tier_{stat}{{tier=\"{tier}\"}} {number}");
                continue;
            }
        }
        let _ = writeln!(s, "memcached_{name} {number}");
    }
    // Labelled, not in the names: pool names may contain '_'.
    for (pool, stat, v) in pool_report(shared, &per_pool) {
        let _ = writeln!(s, "terrace_pool_{stat}{{pool=\"{pool}\"}} {v}");
    }
    s
}

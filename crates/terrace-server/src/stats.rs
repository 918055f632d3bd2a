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
    /// `stats detail`'s per-prefix counters.
    pub detail: Detail,
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
            detail: Detail::default(),
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
    /// `stats reset`: every counter, and `stats detail`'s prefixes (as memcached).
    pub fn reset(&self) {
        for (c, base) in ALL.iter().zip(&self.baseline) {
            base.store(self.total(*c), Ordering::Relaxed);
        }
        self.detail.clear();
    }
}

/// What `stats detail` counts per key prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DetailOp {
    Get { hit: bool },
    Set,
    Delete,
}

/// memcached's `stats detail`: while on, the ascii and binary get, storage and delete
/// commands count themselves under their key's prefix — the bytes before the first
/// [`PREFIX_DELIMITER`]; a key without one is not counted. Off by default (memcached's
/// `-D` turns it on there). At most [`MAX_PREFIXES`] prefixes are kept: keys of further
/// ones are not counted, so a client cannot grow the table without bound.
#[derive(Debug, Default)]
pub struct Detail {
    on: std::sync::atomic::AtomicBool,
    /// Prefix → gets, hits, sets, deletes.
    prefixes: std::sync::Mutex<std::collections::BTreeMap<Vec<u8>, [u64; 4]>>,
}

/// memcached's default prefix delimiter.
pub const PREFIX_DELIMITER: u8 = b':';

/// Most prefixes `stats detail` keeps.
pub const MAX_PREFIXES: usize = 65_536;

impl Detail {
    pub fn set_on(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Counts `op` under `key`'s prefix, when detail is on and the key has one (as in
    /// memcached, a NUL byte before the delimiter ends the search).
    pub fn record(&self, key: &[u8], op: DetailOp) {
        if !self.is_on() {
            return;
        }
        let Some(end) = key
            .iter()
            .take_while(|&&b| b != 0)
            .position(|&b| b == PREFIX_DELIMITER)
        else {
            return;
        };
        let prefix = &key[..end];
        let mut prefixes = self.prefixes.lock().unwrap_or_else(|p| p.into_inner());
        // The prefix is copied only the first time it is seen.
        if !prefixes.contains_key(prefix) {
            if prefixes.len() >= MAX_PREFIXES {
                return;
            }
            prefixes.insert(prefix.to_vec(), [0; 4]);
        }
        let Some(counts) = prefixes.get_mut(prefix) else {
            return;
        };
        match op {
            DetailOp::Get { hit } => {
                counts[0] += 1;
                counts[1] += u64::from(hit);
            }
            DetailOp::Set => counts[2] += 1,
            DetailOp::Delete => counts[3] += 1,
        }
    }

    /// `stats detail dump`: one `PREFIX <p> get <n> hit <n> set <n> del <n>` line per
    /// prefix (in byte order; memcached's order is its hash table's), then `END`.
    pub fn dump(&self) -> Vec<u8> {
        let prefixes = self.prefixes.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(prefixes.len() * 48 + 5);
        for (prefix, [gets, hits, sets, deletes]) in prefixes.iter() {
            out.extend_from_slice(b"PREFIX ");
            out.extend_from_slice(prefix);
            let _ = write!(
                DumpWriter(&mut out),
                " get {gets} hit {hits} set {sets} del {deletes}\r\n"
            );
        }
        out.extend_from_slice(b"END\r\n");
        out
    }

    fn clear(&self) {
        self.prefixes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

/// `fmt::Write` into a byte buffer.
struct DumpWriter<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for DumpWriter<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// `stats detail <arg>` (ascii): `OK` for `on` and `off`, the dump for `dump`, else
/// memcached's usage error.
pub fn detail_text(shared: &Shared, arg: Option<&[u8]>) -> Vec<u8> {
    match arg {
        Some(b"on") => {
            shared.counters.detail.set_on(true);
            b"OK\r\n".to_vec()
        }
        Some(b"off") => {
            shared.counters.detail.set_on(false);
            b"OK\r\n".to_vec()
        }
        Some(b"dump") => shared.counters.detail.dump(),
        _ => b"CLIENT_ERROR usage: stats detail on|off|dump\r\n".to_vec(),
    }
}

/// The binary STAT of a key starting `detail` (`rest`: what follows): as memcached, the
/// stats to send — none for ` on` and ` off`, one `detailed` stat holding the dump for
/// ` dump` (each matched as a prefix) — or `None` (key not found) for anything else.
pub fn detail_binary(shared: &Shared, rest: &[u8]) -> Option<Vec<(String, Value)>> {
    let detail = &shared.counters.detail;
    if rest.starts_with(b" dump") {
        let dump = String::from_utf8_lossy(&detail.dump()).into_owned();
        Some(vec![("detailed".to_string(), Value::Text(dump))])
    } else if rest.starts_with(b" on") {
        detail.set_on(true);
        Some(Vec::new())
    } else if rest.starts_with(b" off") {
        detail.set_on(false);
        Some(Vec::new())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detail_keeps_at_most_max_prefixes() {
        let detail = Detail::default();
        detail.set_on(true);
        for i in 0..MAX_PREFIXES {
            detail.record(format!("{i}:k").as_bytes(), DetailOp::Set);
        }
        // A new prefix is not counted once the table is full; a known one still is.
        detail.record(b"new:k", DetailOp::Set);
        detail.record(b"0:k", DetailOp::Delete);
        let dump = String::from_utf8(detail.dump()).unwrap();
        assert_eq!(dump.lines().count(), MAX_PREFIXES + 1);
        assert!(!dump.contains("PREFIX new "));
        assert!(dump.starts_with("PREFIX 0 get 0 hit 0 set 1 del 1\r\n"));
    }

    #[test]
    fn detail_counts_per_prefix_only_while_on() {
        let shared = crate::shared::test_shared();
        let detail = &shared.counters.detail;
        detail.record(b"a:1", DetailOp::Set);
        assert_eq!(detail.dump(), b"END\r\n");
        assert_eq!(detail_text(&shared, Some(b"on")), b"OK\r\n");
        assert!(detail.is_on());
        detail.record(b"a:1", DetailOp::Set);
        detail.record(b"a:2", DetailOp::Get { hit: true });
        detail.record(b"a:3", DetailOp::Get { hit: false });
        detail.record(b"b::", DetailOp::Delete);
        // No delimiter, or a NUL before it: not counted.
        detail.record(b"plain", DetailOp::Set);
        detail.record(b"x\0:y", DetailOp::Set);
        assert_eq!(
            String::from_utf8(detail.dump()).unwrap(),
            "PREFIX a get 2 hit 1 set 1 del 0\r\nPREFIX b get 0 hit 0 set 0 del 1\r\nEND\r\n"
        );
        assert_eq!(
            detail_text(&shared, Some(b"dump")),
            detail.dump(),
            "stats detail dump"
        );
        assert_eq!(
            detail_text(&shared, None),
            b"CLIENT_ERROR usage: stats detail on|off|dump\r\n"
        );
        // Binary: prefixes of the key after "detail"; the dump as one stat.
        assert_eq!(detail_binary(&shared, b" offx").map(|r| r.len()), Some(0));
        assert!(!detail.is_on());
        assert_eq!(detail_binary(&shared, b" bogus"), None);
        let dump = detail_binary(&shared, b" dump").expect("a dump");
        assert_eq!(dump.len(), 1);
        assert_eq!(dump[0].0, "detailed");
        assert!(dump[0].1.to_string().starts_with("PREFIX a get 2"));
        // `stats reset` forgets the prefixes.
        shared.counters.reset();
        assert_eq!(detail.dump(), b"END\r\n");
    }

    #[test]
    fn settings_has_memcacheds_76_keys() {
        let shared = crate::shared::test_shared();
        let settings = settings(&shared);
        assert_eq!(settings.len(), 76);
        let get = |name: &str| {
            settings
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.to_string())
                .unwrap_or_else(|| panic!("no {name}"))
        };
        assert_eq!(get("maxbytes"), (32u64 << 20).to_string());
        assert_eq!(get("item_size_max"), "1048576");
        assert_eq!(get("flush_enabled"), "yes");
        assert_eq!(get("domain_socket"), "NULL");
        assert_eq!(get("detail_enabled"), "no");
        let facts = ListenFacts::new(Some("127.0.0.1:11311"), Some(std::path::Path::new("/s")));
        assert_eq!(facts.tcp_host.as_deref(), Some("127.0.0.1"));
        assert_eq!(facts.tcp_port, Some(11311));
        assert_eq!(facts.unix.as_deref(), Some("/s"));
    }

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
    put("libevent", Value::Text(shared.io_engine.to_string()));
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
    put("evictions", Value::Int(cache.evictions()));
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
    let movers = &cache.movers;
    put("terrace_movers", Value::Int(movers.threads as u64));
    put("terrace_mover_rounds", Value::Int(movers.rounds));
    put(
        "terrace_mover_busy_seconds",
        Value::Float(movers.busy_ns as f64 / 1e9),
    );
    put(
        "terrace_mover_blocked_seconds",
        Value::Float(movers.blocked_ns as f64 / 1e9),
    );
    put(
        "terrace_mover_skipped_contended",
        Value::Int(movers.skipped_contended),
    );
    put("terrace_persist_errors", Value::Int(cache.persist_errors));
    put(
        "terrace_index_bytes_per_item",
        Value::Float(cache.index_bytes_per_item),
    );
    put("terrace_segment_bytes", Value::Int(segment_size));
    put(
        "terrace_io_engine",
        Value::Text(shared.io_engine.to_string()),
    );
    put(
        "terrace_io_uring",
        Value::Int(u64::from(shared.io_engine == "io_uring")),
    );
    let restart = &shared.restart;
    put("terrace_restart_items", Value::Int(restart.items));
    put(
        "terrace_restart_items_from_saved_index",
        Value::Int(restart.items_from_saved_index),
    );
    put("terrace_restart_seconds", Value::Float(restart.seconds));
    put(
        "terrace_restart_saved_segments",
        Value::Int(restart.saved_segments),
    );
    put(
        "terrace_restart_scanned_segments",
        Value::Int(restart.scanned_segments),
    );
    put(
        "terrace_restart_dropped_segments",
        Value::Int(restart.dropped_segments),
    );
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
        tier("barred_evictions", t.barred_evictions);
        tier("free_low_water", t.free_low_water as u64);
        tier("cleaned_segments", t.segments_cleaned);
        tier("cleaned_items", t.items_cleaned);
        if let Some(f) = &t.flash {
            tier("flash_direct", u64::from(f.direct));
            tier("flash_emulated", u64::from(f.emulated));
            tier("flash_buffer_bytes", f.buffer_bytes);
            tier("flash_bytes_written", f.bytes_written);
            tier("flash_bytes_read", f.bytes_read);
            tier("flash_reads", f.reads);
            tier("flash_staged", f.staged);
            tier("flash_staged_used", f.staged_used);
            tier("flash_segments_written", f.segments_written);
            tier("flash_admitted", t.demotions_in);
            tier("flash_refused_no_room", f.refused_no_room);
            tier("flash_refused_budget", f.refused_budget);
            tier("flash_write_rate", f.write_rate.unwrap_or(0));
            tier("flash_reinserted", t.reinserted);
            tier("flash_replicas", f.replicas);
            tier("flash_replica_demotions", f.replica_demotions);
            tier("flash_kills_logged", f.kills_logged);
            tier("flash_write_errors", f.write_errors);
            tier("flash_read_errors", f.read_errors);
            if let Some(sets) = &f.sets {
                tier("flash_sets", sets.sets);
                tier("flash_set_items", sets.items);
                tier("flash_set_memory_bytes", sets.memory_bytes);
                tier("flash_set_log_segments", sets.log_segments);
                tier("flash_set_pages_written", sets.pages_written);
                tier("flash_set_page_reads", sets.page_reads);
                tier("flash_set_page_misses", sets.page_misses);
                tier("flash_set_hits", sets.hits);
                tier("flash_set_items_moved", sets.items_moved);
                tier("flash_set_below_threshold", sets.below_threshold);
                tier("flash_set_items_trimmed", sets.items_trimmed);
                tier("flash_set_kills", sets.kills);
                tier("flash_set_staged_used", sets.staged_used);
            }
        }
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
            ("evictions", s.evictions()),
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

/// `stats settings`: memcached 1.6.18's 76 keys, in its order. Where Terrace has the
/// setting, its value; where the key states a fact of Terrace's behaviour (no UDP, no
/// SASL, no TLS, flush allowed, no `stats cachedump`), that fact; the slab, LRU and
/// extstore tunables, which have no counterpart in Terrace, say memcached's defaults
/// (so tools that parse them find them; they change nothing).
pub fn settings(shared: &Shared) -> Vec<(String, Value)> {
    let int = |n: u64| Value::Int(n);
    let text = |s: &str| Value::Text(s.to_string());
    let listen = &shared.listen;
    let segment = shared.pools.default_pool().segment_size() as u64;
    let maxbytes: u64 = shared
        .pools
        .stats()
        .iter()
        .flat_map(|(_, s)| s.tiers.iter())
        .map(|t| u64::from(t.segments) * segment)
        .sum();
    let item_size_max = shared.limits.max_value as u64;
    let threads = shared.threads as u64;
    let yes_no = |b: bool| text(if b { "yes" } else { "no" });
    let pairs: Vec<(&str, Value)> = vec![
        ("maxbytes", int(maxbytes)),
        ("maxconns", int(shared.max_connections as u64)),
        ("tcpport", int(listen.tcp_port.map_or(0, u64::from))),
        ("udpport", int(0)),
        ("inter", text(listen.tcp_host.as_deref().unwrap_or("NULL"))),
        ("verbosity", int(0)),
        ("oldest", int(0)),
        ("evictions", text("on")),
        (
            "domain_socket",
            text(listen.unix.as_deref().unwrap_or("NULL")),
        ),
        ("umask", text(&listen.umask)),
        ("shutdown_command", text("no")),
        ("growth_factor", text("1.25")),
        ("chunk_size", int(48)),
        ("num_threads", int(threads)),
        ("num_threads_per_udp", int(threads)),
        (
            "stat_key_prefix",
            text(&char::from(PREFIX_DELIMITER).to_string()),
        ),
        ("detail_enabled", yes_no(shared.counters.detail.is_on())),
        ("reqs_per_event", int(20)),
        ("cas_enabled", text("yes")),
        ("tcp_backlog", int(1024)),
        ("binding_protocol", text("auto-negotiate")),
        ("auth_enabled_sasl", text("no")),
        ("auth_enabled_ascii", text("no")),
        ("item_size_max", int(item_size_max)),
        ("maxconns_fast", text("yes")),
        ("hashpower_init", int(0)),
        ("slab_reassign", text("yes")),
        ("slab_automove", int(1)),
        ("slab_automove_ratio", text("0.80")),
        ("slab_automove_window", int(30)),
        ("slab_chunk_max", int(item_size_max / 2)),
        ("lru_crawler", text("yes")),
        ("lru_crawler_sleep", int(100)),
        ("lru_crawler_tocrawl", int(0)),
        ("tail_repair_time", int(0)),
        ("flush_enabled", text("yes")),
        ("dump_enabled", text("no")),
        ("hash_algorithm", text("xxh3")),
        ("lru_maintainer_thread", text("yes")),
        ("lru_segmented", text("yes")),
        ("hot_lru_pct", int(20)),
        ("warm_lru_pct", int(40)),
        ("hot_max_factor", text("0.20")),
        ("warm_max_factor", text("2.00")),
        ("temp_lru", text("no")),
        ("temporary_ttl", int(61)),
        ("idle_timeout", int(0)),
        ("watcher_logbuf_size", int(262_144)),
        ("worker_logbuf_size", int(65_536)),
        ("read_buf_mem_limit", int(0)),
        ("track_sizes", text("no")),
        ("inline_ascii_response", text("no")),
        ("ext_item_size", int(512)),
        ("ext_item_age", int(u64::from(u32::MAX))),
        ("ext_low_ttl", int(0)),
        ("ext_recache_rate", int(2000)),
        ("ext_wbuf_size", int(4 << 20)),
        ("ext_compact_under", int(0)),
        ("ext_drop_under", int(0)),
        ("ext_max_sleep", int(1_000_000)),
        ("ext_max_frag", text("0.80")),
        ("slab_automove_freeratio", text("0.010")),
        ("ext_drop_unread", text("no")),
        ("ssl_enabled", text("no")),
        ("ssl_chain_cert", text("(null)")),
        ("ssl_key", text("(null)")),
        ("ssl_verify_mode", int(0)),
        ("ssl_keyformat", int(1)),
        ("ssl_ciphers", text("NULL")),
        ("ssl_ca_cert", text("NULL")),
        ("ssl_wbuf_size", int(16_384)),
        ("ssl_session_cache", text("no")),
        ("ssl_kernel_tls", text("no")),
        ("ssl_min_version", text("tlsv1.2")),
        ("num_napi_ids", text("(null)")),
        ("memory_file", text("(null)")),
    ];
    pairs
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect()
}

/// What the last start found in the tiers, all pools together, for `stats`: the cache
/// is open and whole before the server accepts its first connection, so these are
/// final when any client can read them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RestartFacts {
    /// Items indexed at open.
    pub items: u64,
    /// Of them, put back from a clean shutdown's saved index as it lay.
    pub items_from_saved_index: u64,
    /// Seconds the open took (pools opened one after another, summed).
    pub seconds: f64,
    /// Segments taken from the saved index, and scanned item by item.
    pub saved_segments: u64,
    pub scanned_segments: u64,
    /// Segments found damaged or misplaced and dropped.
    pub dropped_segments: u64,
}

impl RestartFacts {
    /// The facts of every pool's open together.
    pub fn of(reports: &[terrace_cache::RestartReport]) -> RestartFacts {
        let mut facts = RestartFacts::default();
        for r in reports {
            facts.items += r.items as u64;
            facts.items_from_saved_index += r.loaded_from_saved_index as u64;
            facts.seconds += r.duration.as_secs_f64();
            facts.saved_segments += r.from_saved_index as u64;
            facts.scanned_segments += r.scanned as u64;
            facts.dropped_segments += r.dropped.len() as u64;
        }
        facts
    }
}

/// Where the server listens, for `stats settings`.
#[derive(Clone, Debug)]
pub struct ListenFacts {
    /// The TCP host and port asked for (`--listen`).
    pub tcp_host: Option<String>,
    pub tcp_port: Option<u16>,
    /// The UNIX socket path (`--unix`).
    pub unix: Option<String>,
    /// memcached's `umask` stat: the permission bits a new socket gets, in octal.
    pub umask: String,
}

impl Default for ListenFacts {
    fn default() -> Self {
        ListenFacts {
            tcp_host: None,
            tcp_port: None,
            unix: None,
            umask: socket_mode(),
        }
    }
}

impl ListenFacts {
    /// From `--listen HOST:PORT` and `--unix PATH`.
    pub fn new(listen: Option<&str>, unix: Option<&std::path::Path>) -> ListenFacts {
        let (tcp_host, tcp_port) = match listen.and_then(|l| l.rsplit_once(':')) {
            Some((host, port)) => (
                Some(
                    host.trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_string(),
                ),
                port.parse().ok(),
            ),
            None => (None, None),
        };
        ListenFacts {
            tcp_host,
            tcp_port,
            unix: unix.map(|p| p.display().to_string()),
            umask: socket_mode(),
        }
    }
}

/// The mode bits a socket file is created with under this process's umask (Linux's
/// `/proc/self/status`), in octal as memcached prints its `umask` stat; memcached's
/// default, `700`, when it cannot be read.
fn socket_mode() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find(|l| l.starts_with("Umask:"))?;
            u32::from_str_radix(line.trim_start_matches("Umask:").trim(), 8).ok()
        })
        .map_or_else(|| "700".to_string(), |mask| format!("{:o}", 0o777 & !mask))
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

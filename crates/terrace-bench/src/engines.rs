//! The engines under test behind one small trait. Each is configured at the same byte
//! capacity, entries weighed as key + value bytes; moka and foyer with their best
//! policies (moka: TinyLFU admission with LRU eviction, its default; foyer: S3-FIFO).
//! foyer's hybrid cache and memcached-compatible servers implement the same trait in
//! their own modules (`hybrid`, `memcached`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};
use terrace_cache::{Cache, CacheConfig, ItemLimits, Movers};

use crate::args::{SizeRange, Tiers};
use crate::workload;

/// What a get found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Got {
    Miss,
    Hit,
    /// A hit whose value is not the one stored for that key.
    Wrong,
}

pub trait Engine: Send + Sync {
    /// Looks `key` (key number `id`, whose values are `len` bytes) up and checks a hit's
    /// value against the workload's.
    fn get(&self, key: &[u8], id: u64, len: usize) -> Result<Got>;
    fn set(&self, key: &[u8], value: &[u8]) -> Result<()>;
    /// Items held at the end of the run, if the engine can say.
    fn items(&self) -> Option<u64>;
    /// Bytes of metadata per item (index and headers), if the engine can say.
    fn metadata_bytes_per_item(&self) -> Option<f64>;
    /// Engine-specific counters for the JSON output.
    fn extra(&self) -> Value {
        Value::Null
    }
    /// The directory of the run's own files (a fresh one per run), whose page cache the
    /// sampler counts as the engine's memory; `None` for an engine without files.
    fn data_dir(&self) -> Option<&Path> {
        None
    }
    /// A restart after the run (`--restart`): stop as `mode` says, reopen, and check each
    /// of keys `0..keys` present before: a hit with its value, or (after a crash) a miss.
    /// An error for an engine without one (the command line refuses that before the run).
    fn restart(
        self: Box<Self>,
        _keys: u64,
        _sizes: SizeRange,
        _mode: RestartMode,
    ) -> Result<Value> {
        anyhow::bail!("this engine has no restart")
    }
}

/// Whether `value` is key `id`'s value of `len` bytes: [`Got::Hit`] or [`Got::Wrong`].
pub(crate) fn check(value: &[u8], id: u64, len: usize) -> Got {
    if workload::check_value(value, id, len) {
        Got::Hit
    } else {
        Got::Wrong
    }
}

pub struct Terrace {
    // Field order matters: the movers stop before the cache drops, and the cache drops
    // before its temporary directory is removed.
    movers: Option<Movers>,
    cache: Arc<Cache>,
    /// What it was opened with (a restart reopens the same).
    config: CacheConfig,
    mover_interval: Duration,
    /// Mean item header bytes for the workload's items (keys and values are fixed-size
    /// distributions, so this is computed once).
    header_bytes: f64,
    _tempdir: Option<tempfile::TempDir>,
}

pub struct TerraceOptions<'a> {
    pub capacity: u64,
    pub tiers: &'a Tiers,
    pub dir: Option<PathBuf>,
    pub max_value: u64,
    pub promote: Option<bool>,
    pub flash_sets: Option<terrace_cache::FlashSetsConfig>,
    pub expected_items: usize,
    pub mover_interval: Duration,
    /// Mover threads; 0: the cache's default.
    pub movers: usize,
    /// The movers' test-only delay after each eviction (`CacheConfig::mover_delay`).
    pub mover_delay: Option<Duration>,
    pub segment_size: Option<u64>,
    pub key_len: usize,
    pub mean_value: u64,
}

impl Terrace {
    pub fn open(o: TerraceOptions<'_>) -> Result<Terrace> {
        let has_file = o.tiers.has_file();
        let (dir, tempdir) = match (&o.dir, has_file) {
            (Some(d), true) => {
                // A run always starts cold: a fresh directory inside the one given, so
                // an earlier run's tier files are never reopened (and DIR is kept).
                let t = tempfile::Builder::new()
                    .prefix("terrace-bench.")
                    .tempdir_in(d)
                    .with_context(|| format!("cannot create a directory in {}", d.display()))?;
                (Some(t.path().to_path_buf()), Some(t))
            }
            (None, true) => {
                let base = std::path::Path::new("/dev/shm");
                let b = tempfile::Builder::new().prefix("terrace-bench.").to_owned();
                let t = if base.is_dir() {
                    b.tempdir_in(base)
                } else {
                    b.tempdir()
                }
                .context("cannot create a temporary directory for the file tier")?;
                (Some(t.path().to_path_buf()), Some(t))
            }
            (_, false) => (None, None),
        };
        let tiers = o.tiers.configs(&dir.clone().unwrap_or_default());
        let mut config = CacheConfig::new(tiers);
        config.total_bytes = Some(o.capacity);
        config.expected_items = Some(o.expected_items.max(1024));
        if let Some(size) = o.segment_size {
            if !size.is_power_of_two() {
                anyhow::bail!("--segment-size must be a power of two, not {size}");
            }
            config.segment_shift = Some(u8::try_from(size.trailing_zeros()).unwrap_or(u8::MAX));
        }
        let mut limits = ItemLimits::default();
        if o.max_value > u64::from(limits.max_value_len) {
            limits.max_value_len = u32::try_from(o.max_value)
                .context("--value-size MAX is too large for the cache (at most 4 GiB - 1)")?;
        }
        config.limits = limits;
        if let Some(promote) = o.promote {
            config.promote = promote;
        }
        config.flash_sets = o.flash_sets;
        config.movers = o.movers;
        config.mover_delay = o.mover_delay;
        let (cache, _report) =
            Cache::open(config.clone()).context("cannot open the Terrace cache")?;
        let cache = Arc::new(cache);
        let movers = Some(Cache::start_movers(&cache, o.mover_interval));
        let header_bytes =
            terrace_cache::ItemSpec::new(&vec![0u8; o.key_len], o.mean_value as usize).header_len()
                as f64;
        Ok(Terrace {
            movers,
            cache,
            config,
            mover_interval: o.mover_interval,
            header_bytes,
            _tempdir: tempdir,
        })
    }
}

impl Engine for Terrace {
    fn get(&self, key: &[u8], id: u64, len: usize) -> Result<Got> {
        Ok(match self.cache.get(key).context("terrace get")? {
            Some(g) => check(g.value(), id, len),
            None => Got::Miss,
        })
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.cache.set(key, value, 0, 0).context("terrace set")?;
        Ok(())
    }

    fn items(&self) -> Option<u64> {
        Some(self.cache.stats().items as u64)
    }

    fn metadata_bytes_per_item(&self) -> Option<f64> {
        let s = self.cache.stats();
        (s.items > 0).then_some(s.index_bytes_per_item + self.header_bytes)
    }

    fn extra(&self) -> Value {
        let s = self.cache.stats();
        json!({
            "index_bytes_per_item": s.index_bytes_per_item,
            "item_header_bytes": self.header_bytes,
            "sets": s.sets,
            "inline_evictions": s.inline_evictions,
            "background_evictions": s.background_evictions,
            "index_evictions": s.index_evictions,
            "demotions": s.demotions,
            "promotions": s.promotions,
            "reinsertions": s.reinsertions,
            "mover_errors": s.mover_errors,
            "movers": mover_stats_json(&s.movers),
            "tier_free_low_water": s.tiers.iter().map(|t| t.free_low_water).collect::<Vec<_>>(),
            "tier_barred_evictions": s.tiers.iter().map(|t| t.barred_evictions).collect::<Vec<_>>(),
            "movers_running": self.movers.as_ref().is_some_and(Movers::is_running),
            "segment_bytes": self.cache.segment_size(),
            "tier_hits": s.tiers.iter().map(|t| t.hits).collect::<Vec<_>>(),
            "tier_dead_bytes": s.tiers.iter().map(|t| t.dead_bytes).collect::<Vec<_>>(),
            "tier_items": s.tiers.iter().map(|t| t.items).collect::<Vec<_>>(),
            "tier_live_bytes": s.tiers.iter().map(|t| t.live_bytes).collect::<Vec<_>>(),
            "tier_free_segments": s.tiers.iter().map(|t| t.free_segments).collect::<Vec<_>>(),
            "tier_cleaned_segments": s.tiers.iter().map(|t| t.segments_cleaned).collect::<Vec<_>>(),
            "tier_cleaned_items": s.tiers.iter().map(|t| t.items_cleaned).collect::<Vec<_>>(),
            "tier_reinserted": s.tiers.iter().map(|t| t.reinserted).collect::<Vec<_>>(),
            // The flash tier's device counters (null without one).
            "flash": s.tiers.last().and_then(|t| t.flash.as_ref()).map(|f| json!({
                "direct": f.direct,
                "emulated": f.emulated,
                "buffer_bytes": f.buffer_bytes,
                "bytes_written": f.bytes_written,
                "bytes_read": f.bytes_read,
                "reads": f.reads,
                "segments_written": f.segments_written,
                "refused_no_room": f.refused_no_room,
                "refused_budget": f.refused_budget,
                "replicas": f.replicas,
                "replica_demotions": f.replica_demotions,
                "write_errors": f.write_errors,
                "read_errors": f.read_errors,
                "sets": f.sets.as_ref().map(set_stats_json),
            })),
        })
    }

    fn data_dir(&self) -> Option<&Path> {
        self._tempdir.as_ref().map(|t| t.path())
    }

    fn restart(self: Box<Self>, keys: u64, sizes: SizeRange, mode: RestartMode) -> Result<Value> {
        let Terrace {
            movers,
            cache,
            config,
            mover_interval,
            _tempdir,
            ..
        } = *self;
        drop(movers);
        let present = |cache: &Cache| -> Result<Vec<u64>> {
            let mut key = [0u8; workload::KEY_LEN];
            let mut found = Vec::new();
            for id in 0..keys {
                workload::key(id, &mut key);
                // A peek: the measurement must not raise the frequencies the shutdown
                // saves.
                if cache.peek(&key).context("terrace peek")?.is_some() {
                    found.push(id);
                }
            }
            Ok(found)
        };
        let before = present(&cache)?;
        let items_before = cache.stats().items;
        let cache = Arc::try_unwrap(cache)
            .map_err(|_| anyhow::anyhow!("the cache is still shared after the run"))?;
        let start = std::time::Instant::now();
        match mode {
            RestartMode::Clean => cache.shutdown().context("clean shutdown")?,
            RestartMode::Crash => drop(cache),
        }
        let shutdown_seconds = start.elapsed().as_secs_f64();
        let start = std::time::Instant::now();
        let (cache, report) = Cache::open(config).context("reopening the Terrace cache")?;
        let open_seconds = start.elapsed().as_secs_f64();
        let cache = Arc::new(cache);
        let _movers = Cache::start_movers(&cache, mover_interval);
        let (mut missing, mut wrong) = (0u64, 0u64);
        let mut key = [0u8; workload::KEY_LEN];
        for &id in &before {
            workload::key(id, &mut key);
            // A peek too: a get records a hit, and a hit on flash may ask for a
            // promotion, whose copy in tier 0 evicts keys this loop has not checked yet.
            match cache.peek(&key).context("terrace peek")? {
                None => missing += 1,
                Some(g) => {
                    let len = workload::value_len(id, sizes.min, sizes.max);
                    if check(g.value(), id, len) == Got::Wrong {
                        wrong += 1;
                    }
                }
            }
        }
        Ok(json!({
            "mode": mode.as_str(),
            "items_before": items_before,
            "keys_present_before": before.len(),
            "items_after_open": report.items,
            "missing_after": missing,
            "wrong_after": wrong,
            "index_full": report.index_full,
            "segments_from_saved_index": report.from_saved_index,
            "segments_scanned": report.scanned,
            "items_from_saved_index": report.loaded_from_saved_index,
            "conflicts": report.conflicts,
            "shutdown_seconds": shutdown_seconds,
            "open_seconds": open_seconds,
        }))
    }
}

/// The movers' counters in the run's JSON.
fn mover_stats_json(m: &terrace_cache::MoverStats) -> Value {
    json!({
        "threads": m.threads,
        "rounds": m.rounds,
        "busy_ns": m.busy_ns,
        "blocked_ns": m.blocked_ns,
        "skipped_contended": m.skipped_contended,
    })
}

/// How `--restart` stops the cache.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartMode {
    /// A clean shutdown (`Cache::shutdown`): the saved index and DRAM snapshots.
    Clean,
    /// Dropped without a shutdown, as a crash leaves it: the next open scans.
    Crash,
}

impl RestartMode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RestartMode::Clean => "clean",
            RestartMode::Crash => "crash",
        }
    }
}

type MokaCache = moka::sync::Cache<Box<[u8]>, Arc<[u8]>>;

/// moka's eviction policies (`--moka-policy`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MokaPolicy {
    /// TinyLFU admission over an LRU: moka's default and its best on the issue-5 workload.
    TinyLfu,
    Lru,
}

impl MokaPolicy {
    fn name(self) -> &'static str {
        match self {
            MokaPolicy::TinyLfu => "TinyLFU",
            MokaPolicy::Lru => "LRU",
        }
    }
}

pub struct Moka {
    cache: MokaCache,
    policy: MokaPolicy,
}

impl Moka {
    pub fn new(capacity: u64, policy: MokaPolicy) -> Moka {
        let cache = MokaCache::builder()
            .max_capacity(capacity)
            .weigher(|k, v| u32::try_from(k.len() + v.len()).unwrap_or(u32::MAX))
            .eviction_policy(match policy {
                MokaPolicy::TinyLfu => moka::policy::EvictionPolicy::tiny_lfu(),
                MokaPolicy::Lru => moka::policy::EvictionPolicy::lru(),
            })
            .build();
        Moka { cache, policy }
    }
}

impl Engine for Moka {
    fn get(&self, key: &[u8], id: u64, len: usize) -> Result<Got> {
        Ok(match self.cache.get(key) {
            Some(v) => check(&v, id, len),
            None => Got::Miss,
        })
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.cache.insert(key.into(), value.into());
        Ok(())
    }

    fn items(&self) -> Option<u64> {
        self.cache.run_pending_tasks();
        Some(self.cache.entry_count())
    }

    fn metadata_bytes_per_item(&self) -> Option<f64> {
        None
    }

    fn extra(&self) -> Value {
        json!({ "policy": self.policy.name(), "weighted_size": self.cache.weighted_size() })
    }
}

type FoyerCache = foyer_memory::Cache<Box<[u8]>, Box<[u8]>>;

/// foyer-memory's eviction policies (`--foyer-policy`), each with foyer's default
/// parameters.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoyerPolicy {
    /// foyer's best on the issue-5 workload (README).
    S3fifo,
    /// W-TinyLFU.
    Lfu,
    Lru,
    Sieve,
    Fifo,
}

impl FoyerPolicy {
    fn name(self) -> &'static str {
        match self {
            FoyerPolicy::S3fifo => "S3-FIFO",
            FoyerPolicy::Lfu => "W-TinyLFU",
            FoyerPolicy::Lru => "LRU",
            FoyerPolicy::Sieve => "SIEVE",
            FoyerPolicy::Fifo => "FIFO",
        }
    }

    fn config(self) -> foyer_memory::EvictionConfig {
        match self {
            FoyerPolicy::S3fifo => foyer_memory::S3FifoConfig::default().into(),
            FoyerPolicy::Lfu => foyer_memory::LfuConfig::default().into(),
            FoyerPolicy::Lru => foyer_memory::LruConfig::default().into(),
            FoyerPolicy::Sieve => foyer_memory::SieveConfig.into(),
            FoyerPolicy::Fifo => foyer_memory::FifoConfig::default().into(),
        }
    }
}

pub struct Foyer {
    cache: FoyerCache,
    policy: FoyerPolicy,
}

impl Foyer {
    pub fn new(capacity: u64, threads: usize, policy: FoyerPolicy) -> Result<Foyer> {
        let capacity = usize::try_from(capacity).context("--capacity too large")?;
        // foyer's default is 8 shards; more shards than threads only costs memory.
        let shards = (threads * 4).clamp(8, 64);
        let cache = foyer_memory::CacheBuilder::<Box<[u8]>, Box<[u8]>, _>::new(capacity)
            .with_shards(shards)
            .with_eviction_config(policy.config())
            .with_weighter(|k, v| k.len() + v.len())
            .build();
        Ok(Foyer { cache, policy })
    }
}

impl Engine for Foyer {
    fn get(&self, key: &[u8], id: u64, len: usize) -> Result<Got> {
        Ok(match self.cache.get(key) {
            Some(e) => check(e.value(), id, len),
            None => Got::Miss,
        })
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        // The returned handle is dropped at once, as a look-aside client would.
        drop(self.cache.insert(key.into(), value.into()));
        Ok(())
    }

    fn items(&self) -> Option<u64> {
        Some(self.cache.entries() as u64)
    }

    fn metadata_bytes_per_item(&self) -> Option<f64> {
        None
    }

    fn extra(&self) -> Value {
        json!({ "policy": self.policy.name(), "usage_bytes": self.cache.usage(), "shards": self.cache.shards() })
    }
}

/// The flash tier's sets in a run's JSON.
fn set_stats_json(s: &terrace_cache::SetStats) -> Value {
    json!({
        "sets": s.sets,
        "items": s.items,
        "memory_bytes": s.memory_bytes,
        "log_segments": s.log_segments,
        "pages_written": s.pages_written,
        "page_reads": s.page_reads,
        "page_misses": s.page_misses,
        "hits": s.hits,
        "items_moved": s.items_moved,
        "below_threshold": s.below_threshold,
        "items_trimmed": s.items_trimmed,
        "kills": s.kills,
    })
}

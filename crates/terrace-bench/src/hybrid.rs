//! `--engine foyer-hybrid`: foyer 0.22's `HybridCache` (memory cache over a disk cache),
//! the in-process flash anchor, configured as `flash.md` §4.1 says: foyer's defaults
//! except an `FsDevice` of `--flash` bytes with direct I/O, writes to disk when an entry
//! leaves memory (`WriteOnEviction`), S3-FIFO in memory with one shard per thread (at
//! least 8), entries weighed as key + value bytes, the synchronous `psync` I/O engine,
//! the block engine (16 MiB blocks unless `--foyer-block-size`) and quiet recovery.
//!
//! foyer's API is async; the benchmark's is not. The engine owns a 2-worker tokio
//! runtime: foyer is built on it (its background flushers and reclaimers run there), a
//! get is `block_on(cache.get(key))`, and a set (`insert`, synchronous in foyer) runs with
//! the runtime entered, since an insert that evicts hands the victim to the disk cache.
//!
//! Each run gets a fresh subdirectory of `--dir`, removed when the engine drops (after
//! the cache has closed). `extra()` reports foyer's own disk counters (bytes and I/Os
//! written and read), the gets served from disk (an entry's `Source::Disk`) and the
//! entries in memory; foyer exposes no count of the entries on disk, so `items()` is
//! `None`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{anyhow, Context, Result};
use foyer::{
    BlockEngineConfig, DeviceBuilder, FsDeviceBuilder, HybridCache, HybridCacheBuilder,
    HybridCachePolicy, PsyncIoEngineConfig, RecoverMode, S3FifoConfig, Source,
};
use serde_json::{json, Value};

use crate::args::SizeRange;
use crate::engines::{check, Engine, Got, RestartMode};
use crate::workload;

type Hybrid = HybridCache<Vec<u8>, Vec<u8>>;

/// What the cache is built from (a restart builds the same again).
#[derive(Clone, Debug)]
pub struct HybridOptions {
    pub memory: usize,
    pub flash: usize,
    pub shards: usize,
    pub block_size: Option<usize>,
}

pub struct FoyerHybrid {
    // Drop order: the cache (closed in `Drop`) before the runtime it runs on, and both
    // before the directory is removed.
    cache: Hybrid,
    rt: tokio::runtime::Runtime,
    options: HybridOptions,
    dir: PathBuf,
    disk_hits: AtomicU64,
    _tempdir: tempfile::TempDir,
}

fn build(rt: &tokio::runtime::Runtime, o: &HybridOptions, dir: &Path) -> Result<Hybrid> {
    rt.block_on(async {
        let device = FsDeviceBuilder::new(dir)
            .with_capacity(o.flash)
            .with_direct(true)
            .build()
            .map_err(|e| anyhow!("{e}"))
            .context("foyer: cannot build the disk device")?;
        let mut engine = BlockEngineConfig::new(device);
        if let Some(b) = o.block_size {
            engine = engine.with_block_size(b);
        }
        HybridCacheBuilder::new()
            .with_policy(HybridCachePolicy::WriteOnEviction)
            .memory(o.memory)
            .with_shards(o.shards)
            .with_eviction_config(S3FifoConfig::default())
            .with_weighter(|k: &Vec<u8>, v: &Vec<u8>| k.len() + v.len())
            .storage()
            .with_io_engine_config(PsyncIoEngineConfig::new())
            .with_engine_config(engine)
            .with_recover_mode(RecoverMode::Quiet)
            .build()
            .await
            .map_err(|e| anyhow!("{e}"))
            .context("foyer: cannot build the hybrid cache")
    })
}

impl FoyerHybrid {
    pub fn open(o: HybridOptions, parent: &Path) -> Result<FoyerHybrid> {
        // A run always starts cold: a fresh directory inside the one given.
        let tempdir = tempfile::Builder::new()
            .prefix("foyer-hybrid.")
            .tempdir_in(parent)
            .with_context(|| format!("cannot create a directory in {}", parent.display()))?;
        let dir = tempdir.path().to_path_buf();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("foyer")
            .enable_all()
            .build()
            .context("cannot start a tokio runtime for foyer")?;
        let cache = build(&rt, &o, &dir)?;
        Ok(FoyerHybrid {
            cache,
            rt,
            options: o,
            dir,
            disk_hits: AtomicU64::new(0),
            _tempdir: tempdir,
        })
    }

    /// Closes the cache (waits for its flushes; closing twice is a no-op).
    fn close(&self) -> Result<()> {
        self.rt
            .block_on(self.cache.close())
            .map_err(|e| anyhow!("{e}"))
            .context("foyer: closing the hybrid cache")
    }
}

impl Drop for FoyerHybrid {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            eprintln!("terrace-bench: {e:#}");
        }
    }
}

impl Engine for FoyerHybrid {
    fn get(&self, key: &[u8], id: u64, len: usize) -> Result<Got> {
        let got = self
            .rt
            .block_on(self.cache.get(key))
            .map_err(|e| anyhow!("{e}"))
            .context("foyer get")?;
        Ok(match got {
            Some(e) => {
                if e.source() == Source::Disk {
                    self.disk_hits.fetch_add(1, Ordering::Relaxed);
                }
                check(e.value(), id, len)
            }
            None => Got::Miss,
        })
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let _rt = self.rt.enter();
        // The returned handle is dropped at once, as a look-aside client would.
        drop(self.cache.insert(key.to_vec(), value.to_vec()));
        Ok(())
    }

    fn items(&self) -> Option<u64> {
        None
    }

    fn metadata_bytes_per_item(&self) -> Option<f64> {
        None
    }

    fn extra(&self) -> Value {
        let c = &self.cache;
        let s = c.statistics();
        json!({
            "policy": "S3-FIFO",
            "hybrid_policy": "WriteOnEviction",
            "io_engine": "psync",
            "direct": true,
            "memory_bytes": self.options.memory,
            "flash_bytes": self.options.flash,
            "shards": self.options.shards,
            "block_bytes": self.options.block_size.unwrap_or(16 << 20),
            "memory_entries": c.memory().entries(),
            "memory_usage_bytes": c.memory().usage(),
            "disk_hits": self.disk_hits.load(Ordering::Relaxed),
            "disk_write_bytes": s.disk_write_bytes(),
            "disk_read_bytes": s.disk_read_bytes(),
            "disk_write_ios": s.disk_write_ios(),
            "disk_read_ios": s.disk_read_ios(),
        })
    }

    fn data_dir(&self) -> Option<&Path> {
        Some(&self.dir)
    }

    fn restart(
        mut self: Box<Self>,
        keys: u64,
        sizes: SizeRange,
        mode: RestartMode,
    ) -> Result<Value> {
        if mode != RestartMode::Clean {
            anyhow::bail!("foyer-hybrid supports --restart clean only");
        }
        // Keys present before: foyer's `contains` (memory, or the disk index; it may
        // report a hash collision as present, which then shows as missing after).
        let mut key = [0u8; workload::KEY_LEN];
        let mut before = Vec::new();
        for id in 0..keys {
            workload::key(id, &mut key);
            if self.cache.contains(&key[..]) {
                before.push(id);
            }
        }
        let start = std::time::Instant::now();
        // foyer flushes its memory entries to disk on close (its default).
        self.close()?;
        let shutdown_seconds = start.elapsed().as_secs_f64();
        let start = std::time::Instant::now();
        self.cache = build(&self.rt, &self.options, &self.dir)?;
        let open_seconds = start.elapsed().as_secs_f64();
        let (mut missing, mut wrong) = (0u64, 0u64);
        for &id in &before {
            workload::key(id, &mut key);
            let len = workload::value_len(id, sizes.min, sizes.max);
            match self.get(&key, id, len)? {
                Got::Miss => missing += 1,
                Got::Wrong => wrong += 1,
                Got::Hit => {}
            }
        }
        Ok(json!({
            "mode": mode.as_str(),
            "keys_present_before": before.len(),
            "missing_after": missing,
            "wrong_after": wrong,
            "shutdown_seconds": shutdown_seconds,
            "open_seconds": open_seconds,
        }))
    }
}

//! `terrace-bench`: cachebench-style benchmarks of Terrace against other systems. A crate
//! of its own so that no Terrace library ever depends on a competitor.
//!
//! `terrace-bench cache --engine terrace|foyer|moka --capacity 256MiB [--tiers dram:1,file:3]
//! [--dir DIR] --keys N --zipf ALPHA --value-size MIN-MAX --ops N --threads T
//! --get-ratio R --json`
//!
//! Look-aside workload: every op draws a key from Zipf(ALPHA) over N keys; with
//! probability R it is a get, and a get that misses is followed by a set of that key
//! (timed as a set); otherwise it is a set. Each key's value size (uniform in MIN-MAX over
//! keys) and contents are derived from the key, and every hit's length and first 8 bytes
//! are checked. One JSON object is printed at the end.
//!
//! The flash-tier engines (`bench/flash-vs-anchors.sh` runs them all):
//! - `--engine terrace --capacity D+F --tiers dram:D,flash:F --dir DIR`: Terrace's own
//!   flash tier (sizes given in bytes win over `--capacity`).
//! - `--engine foyer-hybrid --capacity D --flash F [--dir DIR]`: foyer 0.22's
//!   `HybridCache`, D of memory over an F-byte disk cache in a fresh subdirectory of DIR
//!   (see the `hybrid` module).
//! - `--engine memcached --server HOST:PORT`: the same workload over memcached's meta
//!   protocol to memcached (with extstore) or `terrace serve` (see the `memcached`
//!   module); no `--capacity`, the server has its own.
//!
//! Every `cache` run samples a process while it runs (`--pid PID`, default this one; see
//! the `sampler` module): peak `VmRSS` plus the page cache of the engine's files
//! (`--pid-files`, default the run's directory), and the bytes `/proc/PID/io` says it
//! read and wrote, against the key + value bytes the run's sets sent.
//!
//! `terrace-bench net-fill|net-probe|net-stats --addr HOST:PORT ...`: clients of a
//! memcached-compatible server (`terrace serve`, memcached) for server-level benchmarks
//! such as `bench/restart-at-scale.sh`; see the `net` module.
//!
//! `terrace-bench map --engine terrace|redb [--dir DIR] --keys N --ops N`: the persistent
//! ordered map against redb; see the `map` module.
//!
//! Modules: `args` (parsers of the command line's values), `workload` (a key's bytes,
//! value size and contents, all derived from its id), `engines` (Terrace, foyer and moka
//! behind one trait), `hybrid` (foyer's hybrid cache), `memcached` (a server over the
//! meta protocol), `sampler` (memory and I/O from `/proc`), `windows` (the hit ratio per
//! window of operations), `net` (the network clients); this file runs the threads and
//! prints the report.

#![forbid(unsafe_code)]

mod args;
mod engines;
mod hybrid;
mod map;
mod memcached;
mod net;
mod sampler;
mod windows;
mod workload;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use hdrhistogram::Histogram;
use rand::rngs::Xoshiro256PlusPlus;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde_json::{json, Value};

use args::{SizeRange, Tiers};
use engines::{Engine, Got};

#[derive(Parser, Debug)]
#[command(
    name = "terrace-bench",
    version,
    about = "Benchmarks Terrace against other systems"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Look-aside cache workload (cachebench-style) against one engine.
    Cache(Box<CacheArgs>),
    /// Store items 0..N in a memcached-compatible server (keys `key:<id>`, values derived
    /// from the id), pipelined over several connections.
    NetFill(net::FillArgs),
    /// Time a (re)starting server's first connection and first hit, then read back the
    /// items `net-fill` stored and count hits, misses and wrong values.
    NetProbe(net::ProbeArgs),
    /// Print a server's `stats`, optionally once they stop changing.
    NetStats(net::StatsArgs),
    /// Persistent ordered map: Terrace's (terrace-collections) or redb's; put, get,
    /// 100-entry scans, bytes per entry, reopen to first get.
    Map(map::MapArgs),
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum EngineName {
    Terrace,
    Foyer,
    Moka,
    /// foyer's `HybridCache`: `--capacity` of memory over a `--flash` disk cache.
    FoyerHybrid,
    /// A memcached-compatible server (`--server`), over the meta protocol.
    Memcached,
}

impl EngineName {
    fn as_str(self) -> &'static str {
        match self {
            EngineName::Terrace => "terrace",
            EngineName::Foyer => "foyer",
            EngineName::Moka => "moka",
            EngineName::FoyerHybrid => "foyer-hybrid",
            EngineName::Memcached => "memcached",
        }
    }
}

#[derive(clap::Args, Debug)]
struct CacheArgs {
    #[arg(long, value_enum)]
    engine: EngineName,
    /// Total capacity (all tiers), e.g. 256MiB; foyer-hybrid: its memory. Not taken by
    /// memcached (the server has its own); needed by every other engine.
    #[arg(long, value_parser = args::parse_size)]
    capacity: Option<u64>,
    /// foyer-hybrid only (and needed there): bytes of its disk cache, e.g. 4GiB. Terrace
    /// takes its flash size from --tiers ...,flash:SIZE.
    #[arg(long, value_parser = args::parse_size)]
    flash: Option<u64>,
    /// foyer-hybrid: the block engine's block size (its unit of eviction and the largest
    /// entry it can hold); default foyer's 16 MiB.
    #[arg(long, value_parser = args::parse_size)]
    foyer_block_size: Option<u64>,
    /// memcached only (and needed there): the server, HOST:PORT.
    #[arg(long)]
    server: Option<String>,
    /// memcached: seconds a connect, request or reply may take before the run fails.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout_secs: u64,
    /// Process whose memory and I/O are sampled while the run goes (every 100 ms:
    /// VmRSS, /proc/PID/io, page cache of the engine's files); default this one.
    #[arg(long)]
    pid: Option<u32>,
    /// Files whose page-cache bytes count as the engine's DRAM: files, or directories
    /// (every file under them), comma-separated or repeated; default the run's own
    /// directory (terrace with a file or flash tier, foyer-hybrid), none for memcached.
    #[arg(long, value_delimiter = ',')]
    pid_files: Vec<PathBuf>,
    /// Terrace's tiers, fastest first: KIND:AMOUNT,... with KIND dram, file, numaN or
    /// flash (last only) and AMOUNT a ratio of --capacity (an integer) or a size (64MiB).
    #[arg(long, value_parser = args::parse_tiers, default_value = "dram:1")]
    tiers: Tiers,
    /// Directory for file tiers (a fresh subdirectory is made and removed); default a
    /// temporary directory on /dev/shm (foyer-hybrid: the system's temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Number of distinct keys (suffixes k, m: 2m = 2 000 000).
    #[arg(long, value_parser = args::parse_count)]
    keys: u64,
    /// Zipf exponent of key popularity (0 = uniform).
    #[arg(long, value_parser = args::parse_alpha, default_value = "0.99")]
    zipf: f64,
    /// Value sizes in bytes, MIN-MAX, uniform over keys.
    #[arg(long, value_parser = args::parse_range, default_value = "64-4096")]
    value_size: SizeRange,
    /// Total operations over all threads (suffixes k, m).
    #[arg(long, value_parser = args::parse_count)]
    ops: u64,
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: u16,
    /// Probability that an op is a get.
    #[arg(long, value_parser = args::parse_ratio, default_value = "0.9")]
    get_ratio: f64,
    /// Print only one JSON object on stdout (no progress bar).
    #[arg(long)]
    json: bool,
    /// RNG seed (each thread derives its own).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Terrace: items the index is sized for; default --capacity / mean item size.
    #[arg(long, value_parser = args::parse_count)]
    expected_items: Option<u64>,
    /// Terrace: segment size, a power of two (default: the cache's, 2 MiB for its default
    /// 1 MiB value limit).
    #[arg(long, value_parser = args::parse_size)]
    segment_size: Option<u64>,
    /// Terrace: mover threads [default: the cache's, one per four cores, 1 to 8].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
    movers: Option<u64>,
    /// Terrace, a test knob: each mover thread sleeps this long after every segment it
    /// evicts (a mover starved of CPU), microseconds.
    #[arg(long, hide = true)]
    mover_delay_us: Option<u64>,
    /// Terrace: mover thread polling interval, microseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    mover_interval_us: u64,
    /// Terrace: promote items read often in a lower tier into tier 0 [default: the
    /// cache's, on with a flash tier].
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    promote: Option<bool>,
    /// Terrace: put small items on the flash tier into sets taking this share of it
    /// (0.05..=0.95; Kangaroo's design: about a byte of DRAM per item). Off by default.
    #[arg(long)]
    flash_sets: Option<f64>,
    /// Terrace: the largest item (encoded) that goes into the flash sets.
    #[arg(long, default_value_t = terrace_cache::DEFAULT_SET_ITEM_MAX)]
    flash_set_item_max: usize,
    /// foyer's eviction policy (default S3-FIFO, its best on the issue-5 workload).
    #[arg(long, value_enum, default_value = "s3fifo")]
    foyer_policy: engines::FoyerPolicy,
    /// moka's eviction policy (default TinyLFU, its best on the issue-5 workload).
    #[arg(long, value_enum, default_value = "tiny-lfu")]
    moka_policy: engines::MokaPolicy,
    /// Also report the hit ratio of every window of this many operations (all threads
    /// together; suffixes k, m), as `windows` in the JSON: whether a run loses its hits
    /// in the warm-up or in steady state.
    #[arg(long, value_parser = args::parse_count)]
    window: Option<u64>,
    /// Terrace with a file or flash tier, or foyer-hybrid (clean only): after the run,
    /// stop, reopen, and check every key present before ("restart" in the JSON). `clean` (the default): a clean shutdown, after which
    /// every key must be a hit with its value. `crash`: the cache is dropped without one
    /// (the next open scans the file tiers; DRAM items are lost by design), and no key
    /// may come back with another value.
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "clean")]
    restart: Option<engines::RestartMode>,
}

/// One thread's results.
struct ThreadResult {
    gets: u64,
    hits: u64,
    wrong: u64,
    sets: u64,
    /// Key + value bytes of the sets.
    set_bytes: u64,
    get_ns: Histogram<u64>,
    set_ns: Histogram<u64>,
}

impl ThreadResult {
    fn empty() -> Result<ThreadResult> {
        Ok(ThreadResult {
            gets: 0,
            hits: 0,
            wrong: 0,
            sets: 0,
            set_bytes: 0,
            get_ns: histogram()?,
            set_ns: histogram()?,
        })
    }
}

fn histogram() -> Result<Histogram<u64>> {
    // 1 ns .. 100 s at 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).context("cannot create a histogram")
}

fn elapsed_ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// What every worker thread of one run reads: the engine under test, the arguments, the
/// key distribution, the progress counter, the stop flag and the latency windows.
struct RunContext<'a> {
    engine: &'a dyn Engine,
    args: &'a CacheArgs,
    zipf: Zipf<f64>,
    done: &'a AtomicU64,
    failed: &'a AtomicBool,
    windows: Option<&'a windows::Windows>,
}

fn run_thread(ctx: &RunContext<'_>, thread: u64, ops: u64) -> Result<ThreadResult> {
    let a = ctx.args;
    let mut rng = Xoshiro256PlusPlus::seed_from_u64(workload::mix(a.seed ^ workload::mix(thread)));
    let max = usize::try_from(a.value_size.max).context("--value-size too large")?;
    let mut buf = workload::filler(max);
    let mut key = [0u8; workload::KEY_LEN];
    let mut r = ThreadResult::empty()?;
    let mut pending = 0u64;
    // Gets and hits already added to the windows.
    let mut counted = (0u64, 0u64);
    let mut flush = |r: &ThreadResult, pending: u64| {
        let before = ctx.done.fetch_add(pending, Ordering::Relaxed);
        if let Some(w) = ctx.windows {
            w.batch(
                r.gets - counted.0,
                r.hits - counted.1,
                before,
                before + pending,
            );
            counted = (r.gets, r.hits);
        }
    };
    for _ in 0..ops {
        // Zipf yields ranks 1..=N as floats; rank 1 is the most popular key.
        let rank = ctx.zipf.sample(&mut rng) as u64;
        let id = rank.saturating_sub(1).min(a.keys - 1);
        workload::key(id, &mut key);
        let len = workload::value_len(id, a.value_size.min, a.value_size.max);
        let need_set = if rng.random_bool(a.get_ratio) {
            r.gets += 1;
            let t = Instant::now();
            let got = ctx.engine.get(&key, id, len)?;
            r.get_ns.saturating_record(elapsed_ns(t).max(1));
            match got {
                Got::Hit => {
                    r.hits += 1;
                    false
                }
                Got::Wrong => {
                    r.hits += 1;
                    r.wrong += 1;
                    false
                }
                Got::Miss => true,
            }
        } else {
            true
        };
        if need_set {
            workload::fill_value(&mut buf, id, len);
            r.sets += 1;
            r.set_bytes += (key.len() + len) as u64;
            let t = Instant::now();
            ctx.engine.set(&key, &buf[..len])?;
            r.set_ns.saturating_record(elapsed_ns(t).max(1));
        }
        pending += 1;
        if pending == 4096 {
            flush(&r, pending);
            pending = 0;
            if ctx.failed.load(Ordering::Relaxed) {
                break;
            }
        }
    }
    flush(&r, pending);
    Ok(r)
}

/// Peak resident set size of this process (`VmHWM`), in bytes.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line
        .trim_start_matches("VmHWM:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The arguments' combinations that make no sense, refused before anything opens.
/// Returns the capacity (`None` only for memcached, which takes none).
fn check_args(a: &CacheArgs) -> Result<Option<u64>> {
    let e = a.engine;
    let name = e.as_str();
    if e != EngineName::Terrace && a.tiers.to_string() != "dram:1" {
        bail!("--tiers applies to --engine terrace only");
    }
    match (e, a.flash) {
        (EngineName::FoyerHybrid, None) => bail!("--engine foyer-hybrid needs --flash SIZE"),
        (EngineName::FoyerHybrid, Some(_)) => {}
        (EngineName::Terrace, Some(_)) => bail!(
            "--flash applies to --engine foyer-hybrid only; terrace takes its flash tier from --tiers dram:SIZE,flash:SIZE"
        ),
        (_, Some(_)) => bail!("--flash applies to --engine foyer-hybrid only"),
        (_, None) => {}
    }
    if a.foyer_block_size.is_some() && e != EngineName::FoyerHybrid {
        bail!("--foyer-block-size applies to --engine foyer-hybrid only");
    }
    match (e, &a.server) {
        (EngineName::Memcached, None) => bail!("--engine memcached needs --server HOST:PORT"),
        (EngineName::Memcached, Some(_)) => {
            if a.capacity.is_some() {
                bail!("--engine memcached takes no --capacity (the server's memory is its own setting)");
            }
            if a.dir.is_some() {
                bail!(
                    "--engine memcached takes no --dir (name the server's files with --pid-files)"
                );
            }
        }
        (_, Some(_)) => bail!("--server applies to --engine memcached only"),
        (_, None) => {}
    }
    let restartable = match e {
        EngineName::Terrace => a.tiers.has_file(),
        EngineName::FoyerHybrid => a.restart != Some(engines::RestartMode::Crash),
        _ => false,
    };
    if a.restart.is_some() && !restartable {
        bail!(
            "--restart applies to --engine terrace with a file or flash tier (--tiers ...,file:N), or to foyer-hybrid (clean only)"
        );
    }
    if let Some(pid) = a.pid {
        if !std::path::Path::new(&format!("/proc/{pid}")).is_dir() {
            bail!("--pid {pid}: no such process");
        }
    }
    if e == EngineName::Memcached {
        return Ok(None);
    }
    match a.capacity {
        Some(c) => Ok(Some(c)),
        None => bail!("--engine {name} needs --capacity SIZE"),
    }
}

fn open_engine(a: &CacheArgs, capacity: Option<u64>) -> Result<Box<dyn Engine>> {
    let mean_value = (a.value_size.min + a.value_size.max) / 2;
    let need = || capacity.ok_or_else(|| anyhow::anyhow!("--capacity is needed"));
    Ok(match a.engine {
        EngineName::Terrace => {
            let capacity = need()?;
            // Size the index for the items the capacity holds at the mean item size
            // (key, value and a ~5-byte header), as a deployment would configure it.
            let mean_item = workload::KEY_LEN as u64 + mean_value + 5;
            let expected = a
                .expected_items
                .unwrap_or(capacity / mean_item.max(1))
                .min(a.keys.saturating_add(a.keys / 8));
            Box::new(engines::Terrace::open(engines::TerraceOptions {
                capacity,
                tiers: &a.tiers,
                dir: a.dir.clone(),
                max_value: a.value_size.max,
                expected_items: usize::try_from(expected).unwrap_or(usize::MAX),
                mover_interval: Duration::from_micros(a.mover_interval_us),
                movers: a.movers.map_or(0, |n| n as usize),
                mover_delay: a.mover_delay_us.map(Duration::from_micros),
                promote: a.promote,
                flash_sets: a.flash_sets.map(|share| terrace_cache::FlashSetsConfig {
                    share,
                    max_item: a.flash_set_item_max,
                }),
                segment_size: a.segment_size,
                key_len: workload::KEY_LEN,
                mean_value,
            })?)
        }
        EngineName::Moka => Box::new(engines::Moka::new(need()?, a.moka_policy)),
        EngineName::Foyer => Box::new(engines::Foyer::new(
            need()?,
            usize::from(a.threads),
            a.foyer_policy,
        )?),
        EngineName::FoyerHybrid => {
            let size = |v: u64, what: &str| {
                usize::try_from(v).with_context(|| format!("{what} is too large"))
            };
            let options = hybrid::HybridOptions {
                memory: size(need()?, "--capacity")?,
                flash: size(a.flash.unwrap_or_default(), "--flash")?,
                // As the memory-only foyer engine: more shards than threads only costs
                // memory, and foyer's default is 8.
                shards: (usize::from(a.threads) * 4).clamp(8, 64),
                block_size: a
                    .foyer_block_size
                    .map(|b| size(b, "--foyer-block-size"))
                    .transpose()?,
            };
            let parent = a.dir.clone().unwrap_or_else(std::env::temp_dir);
            Box::new(hybrid::FoyerHybrid::open(options, &parent)?)
        }
        EngineName::Memcached => Box::new(memcached::Memcached::connect(
            a.server.as_deref().unwrap_or_default(),
            Duration::from_secs(a.timeout_secs),
        )?),
    })
}

fn run(a: &CacheArgs) -> Result<Value> {
    let capacity = check_args(a)?;
    let zipf = Zipf::new(a.keys as f64, a.zipf)
        .map_err(|e| anyhow::anyhow!("bad Zipf parameters: {e}"))?;
    let engine = open_engine(a, capacity)?;
    let files = if a.pid_files.is_empty() {
        engine
            .data_dir()
            .map(|d| vec![d.to_path_buf()])
            .unwrap_or_default()
    } else {
        a.pid_files.clone()
    };
    let target = sampler::Target::new(a.pid, files);
    let sampling_done = AtomicBool::new(false);
    let threads = u64::from(a.threads);
    let done = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let windows = a.window.map(windows::Windows::new);
    let ctx = RunContext {
        engine: engine.as_ref(),
        args: a,
        zipf,
        done: &done,
        failed: &failed,
        windows: windows.as_ref(),
    };
    let bar = (!a.json && std::io::stdout().is_terminal()).then(|| {
        let pb = indicatif::ProgressBar::new(a.ops);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {elapsed_precise} [{wide_bar}] {human_pos}/{human_len} ops ({per_sec}, eta {eta})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });
    let mut sampler = sampler::Sampler::start(&target);
    let start = Instant::now();
    let results: Vec<Result<ThreadResult>> = std::thread::scope(|scope| {
        let sampling = scope.spawn(|| sampler.run(&sampling_done));
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let ops = a.ops / threads + u64::from(t < a.ops % threads);
                let ctx = &ctx;
                scope.spawn(move || {
                    let r = run_thread(ctx, t, ops);
                    if r.is_err() {
                        ctx.failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        if let Some(pb) = &bar {
            while !handles.iter().all(|h| h.is_finished()) {
                pb.set_position(done.load(Ordering::Relaxed));
                std::thread::sleep(Duration::from_millis(100));
            }
            pb.finish_and_clear();
        }
        let results = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a benchmark thread panicked")))
            })
            .collect();
        sampling_done.store(true, Ordering::Relaxed);
        if sampling.join().is_err() {
            eprintln!("terrace-bench: the sampler thread panicked");
        }
        results
    });
    let seconds = start.elapsed().as_secs_f64();
    let mut total = ThreadResult::empty()?;
    for r in results {
        let r = r?;
        total.gets += r.gets;
        total.hits += r.hits;
        total.wrong += r.wrong;
        total.sets += r.sets;
        total.set_bytes += r.set_bytes;
        total.get_ns.add(&r.get_ns).context("merging histograms")?;
        total.set_ns.add(&r.set_ns).context("merging histograms")?;
    }
    let ops = done.load(Ordering::Relaxed);
    let q = |h: &Histogram<u64>, p: f64| (!h.is_empty()).then(|| h.value_at_quantile(p));
    let tiers = match a.engine {
        EngineName::Terrace => a.tiers.to_string(),
        EngineName::FoyerHybrid => format!(
            "dram:{},flash:{}",
            size_str(capacity.unwrap_or_default()),
            size_str(a.flash.unwrap_or_default())
        ),
        EngineName::Memcached => format!("server:{}", a.server.as_deref().unwrap_or("")),
        _ => "dram".to_string(),
    };
    let sampled = sampler.finish(total.set_bytes);
    let out = json!({
        "engine": a.engine.as_str(),
        "tiers": tiers,
        "threads": a.threads,
        "ops": ops,
        "seconds": seconds,
        "ops_per_sec": ops as f64 / seconds.max(1e-9),
        "hit_ratio": if total.gets > 0 { Some(total.hits as f64 / total.gets as f64) } else { None },
        "get_p50_ns": q(&total.get_ns, 0.5),
        "get_p99_ns": q(&total.get_ns, 0.99),
        "get_p999_ns": q(&total.get_ns, 0.999),
        "set_p50_ns": q(&total.set_ns, 0.5),
        "set_p99_ns": q(&total.set_ns, 0.99),
        "set_p999_ns": q(&total.set_ns, 0.999),
        "peak_rss_bytes": peak_rss_bytes(),
        "items": engine.items(),
        "metadata_bytes_per_item": engine.metadata_bytes_per_item(),
        "gets": total.gets,
        "hits": total.hits,
        "sets": total.sets,
        "wrong_values": total.wrong,
        "capacity_bytes": capacity,
        "flash_bytes": a.flash,
        "keys": a.keys,
        "zipf": a.zipf,
        "value_size": a.value_size.to_string(),
        "get_ratio": a.get_ratio,
        "engine_stats": engine.extra(),
    });
    let mut out = out;
    if let (Value::Object(o), Value::Object(s)) = (&mut out, sampled) {
        o.extend(s);
    }
    if let Some(w) = &windows {
        out["windows"] = w.report(ops);
    }
    if let Some(mode) = a.restart {
        out["restart"] = engine.restart(a.keys, a.value_size, mode)?;
    } else {
        drop(engine);
    }
    if total.wrong > 0 {
        // Still print the numbers, then fail: a cache that returns wrong values has no
        // meaningful throughput.
        print_result(&out, a.json)?;
        bail!(
            "{} hits returned a value that is not the key's",
            total.wrong
        );
    }
    Ok(out)
}

/// A byte count as the command line writes it: `4GiB`, `256MiB`, or bytes.
fn size_str(b: u64) -> String {
    if b > 0 && b.is_multiple_of(1 << 30) {
        format!("{}GiB", b >> 30)
    } else if b > 0 && b.is_multiple_of(1 << 20) {
        format!("{}MiB", b >> 20)
    } else {
        format!("{b}B")
    }
}

fn print_result(out: &Value, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string(out)?);
    } else if let Value::Object(map) = out {
        for (k, v) in map {
            println!("{k:>24}: {v}");
        }
    }
    Ok(())
}

/// Runs a `net-*` command: prints its report, then fails if the run did.
fn run_net(outcome: Result<net::Outcome>, json: bool) -> Result<()> {
    let outcome = outcome?;
    print_result(&outcome.report, json)?;
    match outcome.failure {
        Some(why) => bail!("{why}"),
        None => Ok(()),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Cache(a) => run(a).and_then(|out| print_result(&out, a.json)),
        Command::NetFill(a) => run_net(net::fill(a), a.json),
        Command::NetProbe(a) => run_net(net::probe(a), a.json),
        Command::NetStats(a) => run_net(net::stats(a), a.json),
        Command::Map(a) => map::run(a).map(|out| println!("{out}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("terrace-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

//! `terrace serve`: flags → [`terrace_server::ServerConfig`] → the server, with logs on
//! stderr (text, or JSON lines with `--log-json`; level from `RUST_LOG`, default info).

use std::path::PathBuf;

use terrace_cache::spec::{parse_size, TierList};
use terrace_server::config::{IoChoice, Overrides, PoolDef, ServerConfig};

/// The flags of `terrace serve`; every one may also be set in the `--config` TOML file.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// TOML file with the same settings as these flags (flags win).
    #[arg(long)]
    config: Option<PathBuf>,
    /// TCP address to listen on [default: 127.0.0.1:11211; off when only --unix is given].
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// UNIX socket to listen on.
    #[arg(long, value_name = "PATH")]
    unix: Option<PathBuf>,
    /// Data directory of the file tiers, created if missing [default: terrace-data].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Tiers, fastest first: dram:SIZE, file:SIZE, numa:NODE:SIZE, flash:SIZE (last; a
    /// file in --dir, or flash:SIZE@PATH, a file or raw block device of its own), or
    /// ratios of --capacity (dram:1,file:3) [default: dram:64MiB,file:256MiB].
    #[arg(long, value_name = "SPEC", value_parser = parse_tiers)]
    tiers: Option<TierList>,
    /// Total capacity, needed when tiers are ratios (e.g. 1GiB).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    capacity: Option<u64>,
    /// Worker threads [default: the number of CPUs].
    #[arg(long, short = 't')]
    threads: Option<usize>,
    /// Largest value accepted (e.g. 1MiB, up to 1GiB) [default: 1MiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_item_size: Option<u64>,
    /// Simultaneous client connections [default: 1024].
    #[arg(long, short = 'c')]
    max_connections: Option<usize>,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Mover threads of the cache (per pool): they evict, demote, reinsert, clean and
    /// promote ahead of the writers [default: one per four cores, 1 to 8].
    #[arg(long, value_name = "N")]
    movers: Option<usize>,
    /// Logs as JSON lines.
    #[arg(long)]
    log_json: bool,
    /// Copy items read often in a lower tier up into the first one, in the background
    /// (worth it when the lower tiers are slower than DRAM: flash, PMem, CXL, far NUMA
    /// memory). An item promoted out of flash keeps its flash copy, which its demotion
    /// returns to [default: on with a flash tier, else off]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true")]
    promote: Option<bool>,
    /// The flash tier's write budget in bytes per second (e.g. 50MiB): what is over it
    /// stays off flash, counted in `stats` as tier_<i>_flash_refused_budget
    /// [default: no cap].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    flash_write_rate: Option<u64>,
    /// Keep small items (up to 320 bytes) on the flash tier in 4 KiB sets taking SHARE of
    /// it (0.05 to 0.95): about a byte of DRAM per item instead of an index entry's ten
    /// (Kangaroo's design) [default: off].
    #[arg(long, value_name = "SHARE")]
    flash_sets: Option<f64>,
    /// A named pool with its own quota (repeatable): keys starting with PREFIX live in it,
    /// within SIZE of the cache (a size such as 64MiB, or a share such as 25%); other keys
    /// go to the default pool, which gets the rest. The prefix may contain ':'
    /// (--pool users:user::25%).
    #[arg(long = "pool", value_name = "NAME:PREFIX:SIZE", value_parser = parse_pool)]
    pools: Vec<PoolDef>,
    /// Socket I/O of the workers: uring (one io_uring ring per worker, the system calls
    /// of all ready connections batched), epoll, or auto: io_uring where the kernel
    /// allows it, else epoll [default: auto].
    #[arg(long, value_name = "ENGINE", value_parser = parse_io)]
    io: Option<IoChoice>,
}

fn parse_io(s: &str) -> Result<IoChoice, String> {
    s.parse()
}

fn parse_pool(s: &str) -> Result<PoolDef, String> {
    s.parse()
}

fn parse_tiers(s: &str) -> Result<TierList, String> {
    s.parse()
}

pub fn run(args: ServeArgs) -> Result<(), String> {
    let config = ServerConfig::resolve(Overrides {
        config: args.config,
        listen: args.listen,
        unix: args.unix,
        dir: args.dir,
        tiers: args.tiers,
        capacity: args.capacity,
        threads: args.threads,
        movers: args.movers,
        max_item_size: args.max_item_size,
        max_connections: args.max_connections,
        metrics: args.metrics,
        log_json: args.log_json,
        promote: args.promote,
        flash_write_rate: args.flash_write_rate,
        flash_sets: args.flash_sets,
        pools: args.pools,
        io: args.io,
    })
    .map_err(|e| e.to_string())?;
    init_logs(config.log_json);
    tracing::info!(
        listen = %terrace_server::server::describe_listen(&config),
        tiers = %config.tiers,
        dir = %config.dir.display(),
        threads = config.threads,
        "starting"
    );
    terrace_server::run(config).map_err(|e| e.to_string())
}

pub fn init_logs(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only for a person watching; log files and collectors get plain text.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .with_writer(std::io::stderr);
    // A second initialisation (tests) is not an error worth stopping for.
    let _ = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

//! The server's lifecycle: open the cache (warm after a clean stop, recovered after a
//! crash), start the movers, listen on TCP and/or a UNIX socket (and the opt-in
//! Prometheus endpoint), serve until SIGTERM/SIGINT, then stop cleanly: close the
//! listeners and connections, stop the movers and save the index so the next start is
//! warm.
//!
//! Invariant: the cache is shut down (index saved) only after every connection task and
//! the movers have let go of it; if something still holds it, the stop is reported as
//! unclean (the next start scans the segments, which is safe, only slower).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use terrace_cache::{CacheConfig, ItemLimits, Medium, PoolConfig, Pools};
use terrace_media::Durability;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

use crate::config::{IoChoice, ServerConfig};
use crate::marks::{self, Marks};
use crate::shared::{Limits, Routes, Shared};
use crate::stats::{self, ListenFacts, RestartFacts};
use crate::uring;
use crate::workers::{Accepted, Engine, Workers};

/// How long the movers sleep between rounds (they also run when a writer runs low).
const MOVER_INTERVAL: Duration = Duration::from_millis(5);
/// How long the main loop's tasks (acceptors, metrics) get to end at shutdown.
const DRAIN: Duration = Duration::from_secs(2);

/// Why the server could not start, or did not stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot create the data directory {dir:?}: {source}")]
    DataDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot open the cache: {0}")]
    Cache(#[from] terrace_cache::CacheError),
    #[error("cannot listen on {what}: {source}")]
    Listen {
        what: String,
        source: std::io::Error,
    },
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
    #[error("clean shutdown failed, the next start will scan the tiers: {0}")]
    Shutdown(String),
}

/// Opens the cache the configuration describes, with its pools (the default pool first),
/// and the routes of key prefixes to pools; one recovery report per pool.
pub fn open_pools(
    config: &ServerConfig,
) -> Result<(Pools, Routes, Vec<terrace_cache::RestartReport>), ServeError> {
    if config.tiers.has_file() {
        std::fs::create_dir_all(&config.dir).map_err(|source| ServeError::DataDir {
            dir: config.dir.clone(),
            source,
        })?;
    }
    let mut cache_config = CacheConfig::new(config.tiers.configs(&config.dir));
    cache_config.total_bytes = config.capacity;
    cache_config.limits = ItemLimits {
        max_value_len: u32::try_from(config.max_item_size).unwrap_or(u32::MAX),
        ..ItemLimits::default()
    };
    cache_config.stripes = config.threads;
    cache_config.movers = config.movers.unwrap_or(0);
    if let Some(promote) = config.promote {
        cache_config.promote = promote;
    }
    cache_config.flash_write_rate = config.flash_write_rate;
    cache_config.flash_sets = config.flash_sets.map(terrace_cache::FlashSetsConfig::new);
    let named: Vec<PoolConfig> = config
        .pools
        .iter()
        .map(|p| PoolConfig {
            name: p.name.clone(),
            quota: p.quota,
        })
        .collect();
    let (pools, reports) = Pools::open(cache_config, &named)?;
    let routes = Routes::new(
        config
            .pools
            .iter()
            .filter_map(|p| Some((p.prefix.as_bytes().to_vec(), pools.position(&p.name)?)))
            .collect(),
    );
    Ok((pools, routes, reports))
}

/// Runs the server until SIGTERM or SIGINT; returns after a clean shutdown.
pub fn run(config: ServerConfig) -> Result<(), ServeError> {
    let (pools, routes, recovery) = open_pools(&config)?;
    for ((name, _), recovery) in pools.iter().zip(&recovery) {
        tracing::info!(
            pool = name,
            items = recovery.items,
            seconds = recovery.duration.as_secs_f64(),
            from_saved_index = recovery.loaded_from_saved_index,
            scanned_segments = recovery.scanned,
            dropped_segments = recovery.dropped.len(),
            "cache opened"
        );
        if !recovery.dropped.is_empty() {
            tracing::debug!(pool = name, dropped = ?recovery.dropped, "segments dropped at open");
        }
    }
    describe_tiers(&config, &pools);
    let movers = pools.start_movers(MOVER_INTERVAL);
    let pools = Arc::new(pools);
    let mut shared = Shared::new(
        Arc::clone(&pools),
        routes,
        Limits {
            max_value: usize::try_from(config.max_item_size).unwrap_or(usize::MAX),
            max_key: ItemLimits::default().max_key_len as usize,
        },
        config.max_connections,
        config.threads,
    );
    shared.listen = ListenFacts::new(config.listen.as_deref(), config.unix.as_deref());
    shared.restart = RestartFacts::of(&recovery);
    let engine = choose_engine(config.io)?;
    shared.io_engine = engine.name();
    let marks_file = config.dir.join(marks::FILE_NAME);
    if config.tiers.has_file() {
        match Marks::load(&marks_file) {
            Ok(marks) => shared.marks = marks,
            Err(e) => tracing::warn!(error = %e, "meta marks not restored"),
        }
    }
    let shared = Arc::new(shared);
    // The acceptor, signals, metrics and timers run here; connections on the workers.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .thread_name("terrace-main")
        .enable_io()
        .enable_time()
        .build()
        .map_err(ServeError::Runtime)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let workers =
        Workers::start(config.threads, engine, &shared, &stop_rx).map_err(ServeError::Runtime)?;
    let workers = Arc::new(workers);
    let served = runtime.block_on(serve_until_signal(
        &config,
        Arc::clone(&shared),
        Arc::clone(&workers),
        stop_tx,
        stop_rx,
    ));
    runtime.shutdown_timeout(DRAIN);
    match Arc::try_unwrap(workers) {
        Ok(workers) => workers.join(),
        Err(_) => tracing::warn!("an acceptor outlived the runtime"),
    }
    drop(movers);
    served?;
    // The items of the tiers survive a clean restart; so do their meta marks.
    if config.tiers.has_file() {
        match shared.marks.save(&marks_file) {
            Ok(n) => tracing::info!(marks = n, "meta marks saved"),
            Err(e) => tracing::warn!(error = %e, "meta marks not saved"),
        }
    }
    drop(shared);
    match Arc::try_unwrap(pools) {
        Ok(pools) => {
            pools.shutdown()?;
            tracing::info!("clean shutdown: index saved");
            Ok(())
        }
        Err(_) => Err(ServeError::Shutdown(
            "the cache is still in use by a connection".to_string(),
        )),
    }
}

/// The workers' I/O engine: io_uring unless the configuration says epoll, or the kernel
/// refuses io_uring and the configuration allows the fallback (said in the log).
fn choose_engine(wanted: IoChoice) -> Result<Engine, ServeError> {
    if wanted == IoChoice::Epoll {
        return Ok(Engine::Epoll);
    }
    match uring::probe() {
        Ok(()) => {
            tracing::info!("workers serve on io_uring");
            Ok(Engine::Uring)
        }
        Err(e) if wanted == IoChoice::Auto => {
            tracing::warn!(error = %e, "io_uring is not available; serving on epoll");
            Ok(Engine::Epoll)
        }
        Err(e) => Err(ServeError::Runtime(std::io::Error::new(
            e.kind(),
            format!("io_uring asked for (io = \"uring\") but not available: {e}"),
        ))),
    }
}

fn describe_tiers(config: &ServerConfig, pools: &Pools) {
    // Shapes only: counting items would sweep every index before the first connection.
    let per_pool: Vec<(&str, Vec<terrace_cache::TierStats>)> = pools
        .iter()
        .map(|(name, cache)| (name, cache.tier_overview()))
        .collect();
    let segment = pools.default_pool().segment_size() as u64;
    let tiers: Vec<(u32, Option<Durability>, bool)> = (0..config.tiers.configs(&config.dir).len())
        .map(|i| {
            let mut segments = 0;
            let (mut durability, mut flushed) = (None, false);
            for (_, t) in per_pool.iter().filter_map(|(n, ts)| Some((n, ts.get(i)?))) {
                segments += t.segments;
                durability = t.durability;
                flushed = t.flushed_at_shutdown;
            }
            (segments, durability, flushed)
        })
        .collect();
    for (i, (tier, &(segments, durability, flushed_at_shutdown))) in config
        .tiers
        .configs(&config.dir)
        .iter()
        .zip(&tiers)
        .enumerate()
    {
        let medium = match &tier.medium {
            Medium::Dram { .. } => "dram".to_string(),
            Medium::File { dir } => format!("file in {}", dir.display()),
            Medium::Numa { node } => format!("numa node {node}"),
            Medium::Flash {
                path: Some(path), ..
            } => format!("flash at {}", path.display()),
            Medium::Flash { dir, path: None } => format!("flash in {}", dir.display()),
        };
        let bytes = u64::from(segments) * segment;
        tracing::info!(tier = i, medium = %medium, bytes, durability = ?durability, "tier");
        let survives = match durability {
            Some(Durability::Power) if flushed_at_shutdown => {
                "survives a process crash, and a power loss after a clean stop"
            }
            Some(Durability::Power) => "survives a crash and a power loss",
            Some(Durability::Process) => "survives a process crash, not a power loss (tmpfs)",
            _ => "volatile",
        };
        println!(
            "terrace: tier {i}: {medium}, {} MiB, {survives}",
            bytes >> 20
        );
    }
    for (pool, (name, tiers)) in config.pools.iter().zip(per_pool.iter().skip(1)) {
        let sizes: Vec<String> = tiers
            .iter()
            .map(|t| format!("{} MiB", (u64::from(t.segments) * segment) >> 20))
            .collect();
        tracing::info!(pool = %name, prefix = %pool.prefix, "pool");
        println!(
            "terrace: pool {name}: keys starting with {:?}, tiers {}",
            pool.prefix,
            sizes.join(" + ")
        );
    }
}

async fn serve_until_signal(
    config: &ServerConfig,
    shared: Arc<Shared>,
    workers: Arc<Workers>,
    stop_tx: watch::Sender<bool>,
    stop_rx: watch::Receiver<bool>,
) -> Result<(), ServeError> {
    if let Some(addr) = &config.listen {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Listen {
                what: format!("tcp {addr}"),
                source,
            })?;
        let local = listener.local_addr().map_err(|source| ServeError::Listen {
            what: format!("tcp {addr}"),
            source,
        })?;
        announce("tcp", &local.to_string());
        tokio::spawn(accept_loop(
            Listener::Tcp(listener),
            Arc::clone(&shared),
            Arc::clone(&workers),
            stop_rx.clone(),
        ));
    }
    if let Some(path) = &config.unix {
        let listener = bind_unix(path)?;
        announce("unix", &path.display().to_string());
        tokio::spawn(accept_loop(
            Listener::Unix(listener),
            Arc::clone(&shared),
            Arc::clone(&workers),
            stop_rx.clone(),
        ));
    }
    if let Some(addr) = &config.metrics {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Listen {
                what: format!("metrics {addr}"),
                source,
            })?;
        if let Ok(local) = listener.local_addr() {
            announce("metrics", &format!("http://{local}/metrics"));
        }
        tokio::spawn(serve_metrics(
            listener,
            Arc::clone(&shared),
            stop_rx.clone(),
        ));
    }
    tokio::spawn(tick(Arc::clone(&shared), stop_rx.clone()));
    wait_for_signal().await;
    tracing::info!("stopping: closing connections, then saving the index");
    let _ = stop_tx.send(true);
    if let Some(path) = &config.unix {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Prints where the server listens, on stdout (one line each: scripts wait for it).
fn announce(kind: &str, address: &str) {
    tracing::info!(kind, address, "listening");
    println!("terrace: listening on {kind} {address}");
}

fn bind_unix(path: &std::path::Path) -> Result<UnixListener, ServeError> {
    use std::os::unix::fs::FileTypeExt;
    // A socket file left by an earlier run is replaced; any other file is not touched.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            let _ = std::fs::remove_file(path);
        }
    }
    UnixListener::bind(path).map_err(|source| ServeError::Listen {
        what: format!("unix {}", path.display()),
        source,
    })
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        _ => {
            tracing::error!("cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
}

/// A listening socket of either kind.
enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    /// The next connection, detached from this runtime so a worker can adopt it.
    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Listener::Tcp(l) => {
                let (stream, _peer) = l.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok(Accepted::Tcp(stream.into_std()?))
            }
            Listener::Unix(l) => Ok(Accepted::Unix(l.accept().await?.0.into_std()?)),
        }
    }
}

async fn accept_loop(
    listener: Listener,
    shared: Arc<Shared>,
    workers: Arc<Workers>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => return,
        };
        match accepted {
            Ok(connection) => workers.dispatch(&shared, connection).await,
            Err(e) => accept_failed(e).await,
        }
    }
}

/// Accept errors (out of file descriptors, mostly) are logged and retried after a pause
/// rather than spinning.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!(error = %e, "accept failed");
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// Once a second: a delayed `flush_all` whose time has come.
async fn tick(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = every.tick() => {
                if shared.run_delayed_flush() {
                    tracing::info!("delayed flush_all carried out");
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// The Prometheus endpoint: `GET /metrics` over HTTP/1.x, one response per connection.
async fn serve_metrics(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = stop.changed() => return,
        };
        let Ok((mut stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let mut head = Vec::with_capacity(1024);
            let read_head = async {
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
                    let n = stream.read(&mut buf).await.ok()?;
                    if n == 0 {
                        return None;
                    }
                    head.extend_from_slice(&buf[..n]);
                }
                Some(())
            };
            if tokio::time::timeout(Duration::from_secs(5), read_head)
                .await
                .ok()
                .flatten()
                .is_none()
            {
                return;
            }
            let response = if head.starts_with(b"GET /metrics ") || head.starts_with(b"GET / ") {
                let body = stats::prometheus(&shared);
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_string()
            };
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        });
    }
}

/// The address a configuration listens on, for messages.
pub fn describe_listen(config: &ServerConfig) -> String {
    match (&config.listen, &config.unix) {
        (Some(a), Some(u)) => format!("tcp {a} and unix {}", u.display()),
        (Some(a), None) => format!("tcp {a}"),
        (None, Some(u)) => format!("unix {}", u.display()),
        (None, None) => "nothing".to_string(),
    }
}

//! `terrace serve-volume` (flags → [`terrace_volume::ServiceConfig`] → the service until
//! SIGTERM or SIGINT, then a clean stop) and `terrace volume status|flush|mode|resize|
//! snapshot|metrics|replicas` (one command over the service's control socket).

use std::path::PathBuf;
use std::time::Duration;

use terrace_cache::spec::{parse_size, TierList};
use terrace_volume::nbd::Listen;
use terrace_volume::replication::ha::HaConfig;
use terrace_volume::replication::{AckLevel, ReplicationConfig, VolumeReplication};
use terrace_volume::{AckDurability, BackendSpec, Mode, Service, ServiceConfig, VolumeConfig};

/// The flags of `terrace serve-volume`.
#[derive(clap::Args, Debug)]
pub struct ServeVolumeArgs {
    /// The backend of a single volume: file:PATH (or a path; a file or block device),
    /// nbd+unix:///NAME?socket=PATH or nbd://HOST:PORT/NAME (any NBD server), or
    /// s3://BUCKET/PREFIX?size=SIZE[&endpoint=URL&region=R&chunk=SIZE&timeout=DURATION].
    #[arg(long, value_name = "URI", value_parser = parse_backend)]
    backend: Option<BackendSpec>,
    /// The single volume's export name.
    #[arg(long, default_value = "volume")]
    name: String,
    /// More volumes, each NAME=BACKEND (repeatable); all share the cache and the
    /// settings below (--volume-mode gives one its own mode).
    #[arg(long = "volume", value_name = "NAME=URI", value_parser = parse_volume)]
    volumes: Vec<(String, BackendSpec)>,
    /// Where to serve NBD: unix:PATH or tcp:HOST:PORT (repeatable)
    /// [default: unix:<dir>/nbd.sock].
    #[arg(long, value_name = "ADDR", value_parser = parse_listen)]
    listen: Vec<Listen>,
    /// The control socket `terrace volume` talks to [default: <dir>/control.sock].
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Directory of the write logs, the file tiers and the sockets, created if missing.
    #[arg(long, default_value = "terrace-volume-data")]
    dir: PathBuf,
    /// Write logs' directory (the persistent tier: a DAX or tmpfs mount, or a disk)
    /// [default: --dir].
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
    /// Bytes of each volume's write log (when created).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "1GiB")]
    log_size: u64,
    /// The cache's tiers for clean blocks, fastest first (as `terrace serve --tiers`).
    #[arg(long, value_name = "SPEC", value_parser = parse_tiers, default_value = "dram:256MiB")]
    tiers: TierList,
    /// write-through (backend, then the reply), write-back (the write log, then the
    /// reply; the backend later), write-around, read-only, or storage (the volume
    /// lives in the log, which compacts itself; the backend is written only by
    /// `terrace volume flush`).
    #[arg(long, default_value = "write-through", value_parser = parse_mode)]
    mode: Mode,
    /// One volume's mode, NAME=MODE, in place of --mode (repeatable).
    #[arg(long = "volume-mode", value_name = "NAME=MODE", value_parser = parse_volume_mode)]
    volume_modes: Vec<(String, Mode)>,
    /// When a write-back write is acknowledged: on-write (durable in the log) or
    /// on-flush (at the client's next FLUSH or with FUA).
    #[arg(long, default_value = "on-write", value_parser = parse_ack)]
    durability: AckDurability,
    /// Backend writes the write-back keeps in flight (a slow backend wants many: the
    /// write-back must outrun a client writing straight to it at any queue depth).
    #[arg(long, default_value_t = 64)]
    writeback_threads: usize,
    /// Start writing back when the log is this full (0..1) ...
    #[arg(long, default_value_t = 0.5)]
    high_watermark: f64,
    /// ... and go on until it is this empty.
    #[arg(long, default_value_t = 0.4)]
    low_watermark: f64,
    /// Connections to an NBD backend (its requests in flight: one per write-back thread).
    #[arg(long, default_value_t = 64)]
    backend_connections: usize,
    /// Writes of at least this size are large: not kept in the cache, and in write-back
    /// sent straight to the backend while the log is congested and holds no flush
    /// barrier (0 = no write is large).
    #[arg(long, value_name = "SIZE", value_parser = parse_size, default_value = "64KiB")]
    large_write: u64,
    /// Cache a block read from the backend on its N-th miss (promotion by hits; 1 caches
    /// every miss).
    #[arg(long, value_name = "N", default_value_t = 1)]
    promote_after: u32,
    /// Replicate every volume's write log to the secondary listening at HOST:PORT
    /// (repeatable: replicas = peers + 1). Only write-back and storage volumes keep
    /// data in the log; write-through data is in the backend before the reply.
    #[arg(long = "replica-peer", value_name = "HOST:PORT")]
    replica_peers: Vec<String>,
    /// Which secondaries in sync a write waits for: local, one, majority or all.
    #[arg(long, default_value = "all", value_parser = parse_ack_level)]
    ack_level: AckLevel,
    /// Copies (this one included) that must be in sync for a volume to take writes;
    /// below it writes are refused and reads go on.
    #[arg(long, default_value_t = 1)]
    min_replicas: usize,
    /// One volume's own replication, NAME=SETTINGS (repeatable), SETTINGS being any of
    /// replicas=N, ack-level=LEVEL, min-replicas=M joined by commas, e.g.
    /// db=ack-level=majority,min-replicas=2 or scratch=replicas=1 (not replicated);
    /// what it leaves out is the flags' above. Without --etcd a volume with N replicas
    /// streams to the first N-1 --replica-peer addresses; under --etcd every volume has
    /// 2 or more.
    #[arg(long = "volume-replication", value_name = "NAME=SETTINGS", value_parser = parse_volume_replication)]
    volume_replication: Vec<(String, VolumeReplication)>,
    /// This primary's epoch: higher than every earlier primary's of its volumes (a
    /// secondary that has seen a higher one refuses this primary).
    #[arg(long, default_value_t = 1)]
    epoch: u64,
    /// How long a write waits for a secondary in sync before cutting it off (ms).
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    replica_timeout_ms: u64,
    /// Keep copies of other primaries' volumes, served at HOST:PORT, in the write logs'
    /// directory (so this node takes a volume over by serving it from there). With
    /// no volume of its own the process is a secondary only.
    #[arg(long, value_name = "HOST:PORT")]
    replica_listen: Option<String>,
    /// Coordinate through etcd (ENDPOINT[,ENDPOINT…]): every node serves the same
    /// volumes; each is placed on --replicas nodes, led by one (elected, its epoch the
    /// election's revision) and failed over when that node is lost. Needs
    /// --replica-listen and --node. With ack `one` or `majority` a primary waits for a
    /// fixed set of secondaries (kept while in sync), the ones etcd names as able to lead.
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    etcd: Vec<String>,
    /// This node's name among the coordinated nodes.
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// This node's failure domain (copies go to distinct ones first) [default: --node].
    #[arg(long, value_name = "LABEL")]
    failure_domain: Option<String>,
    /// Copies of each coordinated volume, the primary's included.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Where other nodes reach this node's replica server [default: --replica-listen].
    #[arg(long, value_name = "HOST:PORT")]
    advertise_replica: Option<String>,
    /// The etcd lease a node holds its volumes by (ms): a lost primary's volumes move
    /// after about this long.
    #[arg(long, value_name = "MS", default_value_t = 3000)]
    lease_ttl_ms: u64,
    /// Under --etcd, serve volumes whose backend (NBD, S3) has no writer lock: nothing
    /// then keeps an earlier primary, paused past its lease, from writing an older block
    /// over a newer one there. Without it such a volume is refused (file and block
    /// device backends are fenced by a lock on them).
    #[arg(long, requires = "etcd")]
    unfenced_backends: bool,
    /// Logs as JSON lines.
    #[arg(long)]
    log_json: bool,
}

fn parse_ack_level(s: &str) -> Result<AckLevel, String> {
    s.parse()
}

fn parse_backend(s: &str) -> Result<BackendSpec, String> {
    s.parse()
}

fn parse_volume(s: &str) -> Result<(String, BackendSpec), String> {
    let (name, uri) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=BACKEND"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: an empty volume name"));
    }
    Ok((name.to_string(), uri.parse()?))
}

fn parse_listen(s: &str) -> Result<Listen, String> {
    if let Some(path) = s.strip_prefix("unix:") {
        Ok(Listen::Unix(PathBuf::from(path)))
    } else {
        let addr = s.strip_prefix("tcp:").unwrap_or(s);
        addr.parse()
            .map(Listen::Tcp)
            .map_err(|e| format!("{s:?}: expected unix:PATH or tcp:HOST:PORT ({e})"))
    }
}

fn parse_tiers(s: &str) -> Result<TierList, String> {
    s.parse()
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse()
}

fn parse_volume_mode(s: &str) -> Result<(String, Mode), String> {
    let (name, mode) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=MODE"))?;
    Ok((name.to_string(), mode.parse()?))
}

fn parse_volume_replication(s: &str) -> Result<(String, VolumeReplication), String> {
    let (name, settings) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=SETTINGS"))?;
    Ok((name.to_string(), settings.parse()?))
}

fn parse_ack(s: &str) -> Result<AckDurability, String> {
    s.parse()
}

pub fn serve(args: ServeVolumeArgs) -> Result<(), String> {
    crate::serve::init_logs(args.log_json);
    std::fs::create_dir_all(&args.dir)
        .map_err(|e| format!("creating {}: {e}", args.dir.display()))?;
    let log_dir = args.log_dir.clone().unwrap_or_else(|| args.dir.clone());
    std::fs::create_dir_all(&log_dir)
        .map_err(|e| format!("creating {}: {e}", log_dir.display()))?;
    let mut named = args.volumes.clone();
    if let Some(backend) = &args.backend {
        named.insert(0, (args.name.clone(), backend.clone()));
    }
    if named.is_empty() && args.replica_listen.is_none() {
        return Err(
            "give a volume (--backend URI and --name, or --volume NAME=URI), or \
             --replica-listen to keep other nodes' copies"
                .into(),
        );
    }
    let replication = (!args.replica_peers.is_empty()).then(|| ReplicationConfig {
        ack: args.ack_level,
        min_replicas: args.min_replicas,
        epoch: args.epoch,
        peer_timeout: Duration::from_millis(args.replica_timeout_ms.max(1)),
        ..ReplicationConfig::new(args.replica_peers.clone())
    });
    if let Some(r) = &replication {
        r.check().map_err(|e| e.to_string())?;
    }
    let ha = if args.etcd.is_empty() {
        None
    } else {
        if replication.is_some() {
            return Err("--etcd places the copies itself: drop --replica-peer".into());
        }
        let node = args.node.clone().ok_or("--etcd needs --node NAME")?;
        let listen = args
            .replica_listen
            .clone()
            .ok_or("--etcd needs --replica-listen HOST:PORT")?;
        let ha = HaConfig {
            endpoints: args.etcd.clone(),
            domain: args.failure_domain.clone().unwrap_or_else(|| node.clone()),
            node,
            replica_addr: args.advertise_replica.clone().unwrap_or(listen),
            replicas: args.replicas,
            lease_ttl: Duration::from_millis(args.lease_ttl_ms),
            prefix: "/terrace".into(),
            template: ReplicationConfig {
                ack: args.ack_level,
                min_replicas: args.min_replicas,
                peer_timeout: Duration::from_millis(args.replica_timeout_ms.max(1)),
                ..ReplicationConfig::new(Vec::new())
            },
            // The last one given for a volume counts (a later insert replaces).
            volumes: args.volume_replication.iter().cloned().collect(),
            unfenced_backends: args.unfenced_backends,
        };
        ha.check().map_err(|e| e.to_string())?;
        Some(ha)
    };
    if let Some((name, _)) = args
        .volume_modes
        .iter()
        .find(|(name, _)| !named.iter().any(|(n, _)| n == name))
    {
        return Err(format!("--volume-mode {name}=…: no volume named {name:?}"));
    }
    if let Some((name, _)) = args
        .volume_replication
        .iter()
        .find(|(name, _)| !named.iter().any(|(n, _)| n == name))
    {
        return Err(format!(
            "--volume-replication {name}=…: no volume named {name:?}"
        ));
    }
    // The last one given for a volume counts, as for --volume-mode.
    let own_replication = |name: &str| {
        args.volume_replication
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| *v)
            .unwrap_or_default()
    };
    let volumes = named
        .into_iter()
        .map(|(name, spec)| -> Result<_, String> {
            // The cache key prefix: from the name, so that a file tier kept across a
            // restart gives each volume back its own blocks whatever the flags' order.
            let id = crc32fast::hash(name.as_bytes());
            let mode = args
                .volume_modes
                .iter()
                .rev()
                .find(|(n, _)| *n == name)
                .map_or(args.mode, |(_, mode)| *mode);
            let config = VolumeConfig {
                mode,
                ack: args.durability,
                log_bytes: args.log_size,
                writeback_threads: args.writeback_threads,
                high_watermark: args.high_watermark,
                low_watermark: args.low_watermark,
                large_write: args.large_write,
                promote_after: args.promote_after,
                // Under etcd the coordinator replicates (`HaConfig::volumes`).
                replication: match &ha {
                    Some(_) => None,
                    None => {
                        ReplicationConfig::for_volume(replication.as_ref(), &own_replication(&name))
                            .map_err(|e| format!("volume {name:?}: {e}"))?
                    }
                },
                ..VolumeConfig::new(&name, id, log_dir.join(format!("{name}.log")))
            };
            Ok((config, spec))
        })
        .collect::<Result<_, String>>()?;
    let listen = if args.listen.is_empty() {
        vec![Listen::Unix(args.dir.join("nbd.sock"))]
    } else {
        args.listen
    };
    let config = ServiceConfig {
        listen,
        control: Some(
            args.control
                .unwrap_or_else(|| args.dir.join("control.sock")),
        ),
        metrics: args.metrics,
        tiers: args.tiers.configs(&args.dir),
        volumes,
        backend_connections: args.backend_connections,
        replica: args
            .replica_listen
            .clone()
            .map(|addr| (addr, log_dir.clone())),
        ha,
    };
    let service = Service::start(config).map_err(|e| e.to_string())?;
    wait_for_signal()?;
    tracing::info!("stopping");
    service.stop().map_err(|e| e.to_string())
}

/// Blocks until SIGTERM or SIGINT.
fn wait_for_signal() -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("starting the signal runtime: {e}"))?;
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
        let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        Ok(())
    })
}

/// How long `terrace volume` waits for a reply: status, metrics and replicas answer
/// from memory, so a server that takes long is stuck and the caller should hear so;
/// flush, mode, resize and snapshot may wait for a whole drain.
fn reply_timeout(command: &str) -> Duration {
    match command.split_whitespace().next() {
        Some("status" | "metrics" | "replicas") => Duration::from_secs(30),
        _ => Duration::from_secs(900),
    }
}

/// `terrace volume ...`: one control command.
pub fn control(socket: &std::path::Path, command: &str) -> Result<(), String> {
    let reply = terrace_volume::control::send(socket, command, reply_timeout(command))
        .map_err(|e| e.to_string())?;
    let (first, rest) = reply.split_once('\n').unwrap_or((reply.as_str(), ""));
    if first == "OK" {
        print!("{rest}");
        Ok(())
    } else {
        Err(first.strip_prefix("ERROR ").unwrap_or(first).to_string())
    }
}

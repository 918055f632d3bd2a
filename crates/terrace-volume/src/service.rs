//! [`Service`]: what `terrace serve-volume` runs — one cache (its tiers shared by every
//! volume, keys prefixed by volume id), the volumes with their backends and write logs,
//! an NBD server per listen address exporting all of them, and the control socket.
//!
//! Start order: cache and movers → backends → volumes (each recovers its log) → control
//! → NBD listeners. Stop is the reverse: the NBD servers finish their in-flight requests,
//! the volumes stop their write-back (dirty blocks stay in the logs), and the cache
//! saves its index so the next start is warm.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use terrace_cache::{Cache, CacheConfig, Movers, TierConfig};

use crate::backend::{Backend, FileBackend};
use crate::control::ControlServer;
use crate::error::VolumeError;
use crate::export::Export;
use crate::fence::FencedBackend;
use crate::metrics::MetricsServer;
use crate::nbd::{Listen, NbdBackend, NbdServer};
use crate::replication::ha::{Coordinator, HaConfig, Leadership};
use crate::replication::{ReplicaServer, ReplicationConfig};
use crate::s3::{S3Backend, S3Config};
use crate::volume::{Volume, VolumeConfig, VolumeList};

/// Where a volume's data lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackendSpec {
    /// A file or block device (`file:PATH`, or a bare path).
    File(PathBuf),
    /// An NBD server (`nbd+unix:///EXPORT?socket=PATH`, `nbd://HOST:PORT/EXPORT`).
    Nbd(String),
    /// Chunk objects in an S3 bucket (`s3://BUCKET/PREFIX?size=SIZE&…`: see
    /// [`S3Config::from_uri`]).
    S3(S3Config),
}

impl std::str::FromStr for BackendSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<BackendSpec, String> {
        if s.starts_with("nbd://") || s.starts_with("nbd+unix://") {
            Ok(BackendSpec::Nbd(s.to_string()))
        } else if s.starts_with("s3://") {
            S3Config::from_uri(s).map(BackendSpec::S3)
        } else if let Some(path) = s.strip_prefix("file:") {
            Ok(BackendSpec::File(PathBuf::from(path)))
        } else if s.contains("://") {
            Err(format!("{s:?}: backends are file:PATH, nbd+unix:///NAME?socket=PATH, nbd://HOST:PORT/NAME or s3://BUCKET/PREFIX?size=SIZE"))
        } else if s.is_empty() {
            Err("an empty backend".into())
        } else {
            Ok(BackendSpec::File(PathBuf::from(s)))
        }
    }
}

impl BackendSpec {
    /// Opens the backend; an NBD backend keeps `connections` connections.
    pub fn open(&self, connections: usize) -> Result<Arc<dyn Backend>, VolumeError> {
        Ok(match self {
            BackendSpec::File(path) => {
                Arc::new(
                    FileBackend::open(path).map_err(|source| VolumeError::Backend {
                        what: format!("opening {}", path.display()),
                        source,
                    })?,
                )
            }
            BackendSpec::Nbd(uri) => Arc::new(NbdBackend::connect(uri, connections)?),
            BackendSpec::S3(config) => Arc::new(S3Backend::open(config.clone())?),
        })
    }

    /// What kind of backend this is, in words.
    pub fn kind(&self) -> &'static str {
        match self {
            BackendSpec::File(_) => "a file or block device",
            BackendSpec::Nbd(_) => "an NBD server",
            BackendSpec::S3(_) => "S3",
        }
    }

    /// The file a primary locks to fence earlier ones from the backend ([`crate::fence`]):
    /// a file or block device's own path; NBD and S3 backends have none.
    pub fn lock_path(&self) -> Option<PathBuf> {
        match self {
            BackendSpec::File(path) => Some(path.clone()),
            BackendSpec::Nbd(_) | BackendSpec::S3(_) => None,
        }
    }
}

/// Everything [`Service::start`] needs.
pub struct ServiceConfig {
    pub listen: Vec<Listen>,
    pub control: Option<PathBuf>,
    /// Where to serve Prometheus over HTTP (`HOST:PORT`), if anywhere.
    pub metrics: Option<String>,
    /// The cache's tiers and their directory.
    pub tiers: Vec<TierConfig>,
    pub volumes: Vec<(VolumeConfig, BackendSpec)>,
    /// Connections per NBD backend (requests in flight to it).
    pub backend_connections: usize,
    /// Serve secondaries' copies of other nodes' volumes: where to listen (`HOST:PORT`)
    /// and the directory of the copies (the write logs' directory, so that this node
    /// can take a volume over by serving it with the copy as its log).
    pub replica: Option<(String, PathBuf)>,
    /// Coordinate through etcd: the volumes are opened on the node that leads them
    /// (their copies on the others), failing over when it is lost.
    pub ha: Option<HaConfig>,
}

/// A running `terrace serve-volume`.
pub struct Service {
    cache: Arc<Cache>,
    movers: Option<Movers>,
    volumes: VolumeList,
    servers: Arc<Mutex<Vec<NbdServer>>>,
    control: Option<ControlServer>,
    metrics: Option<MetricsServer>,
    replica: Option<Arc<ReplicaServer>>,
    coordinator: Option<Coordinator>,
}

impl Service {
    pub fn start(config: ServiceConfig) -> Result<Service, VolumeError> {
        if config.volumes.is_empty() && config.replica.is_none() {
            return Err(VolumeError::Config("no volume to serve".into()));
        }
        if config.listen.is_empty() && !config.volumes.is_empty() {
            return Err(VolumeError::Config("no address to listen on".into()));
        }
        let mut names: Vec<&str> = config
            .volumes
            .iter()
            .map(|(v, _)| v.name.as_str())
            .collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return Err(VolumeError::Config("two volumes share a name".into()));
        }
        let mut ids: Vec<u32> = config.volumes.iter().map(|(v, _)| v.id).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(VolumeError::Config(
                "two volumes share a cache id (rename one)".into(),
            ));
        }
        if let Some(ha) = &config.ha {
            ha.check()?;
            if config.replica.is_none() {
                return Err(VolumeError::Config(
                    "a coordinated node keeps copies: give it a replica listen address".into(),
                ));
            }
            let unfenced = config.volumes.iter().find(|(_, s)| s.lock_path().is_none());
            if let (Some((volume, spec)), false) = (unfenced, ha.unfenced_backends) {
                return Err(VolumeError::Config(format!(
                    "volume {:?}: its backend ({}) has no writer lock, so nothing would keep \
                     an earlier primary, paused past its lease, from writing an older block \
                     over a newer one there; accept that with --unfenced-backends",
                    volume.name,
                    spec.kind()
                )));
            }
        }
        let (cache, restart) = Cache::open(CacheConfig::new(config.tiers.clone()))?;
        tracing::info!(?restart, "cache opened");
        let cache = Arc::new(cache);
        let movers = Cache::start_movers(&cache, Duration::from_millis(100));
        let mut service = Service {
            cache,
            movers: Some(movers),
            volumes: VolumeList::default(),
            servers: Arc::new(Mutex::new(Vec::new())),
            control: None,
            metrics: None,
            replica: None,
            coordinator: None,
        };
        if let Err(e) = service.start_parts(config) {
            service.stop_quietly();
            return Err(e);
        }
        Ok(service)
    }

    /// Everything after the cache, in start order; on an error the caller stops what
    /// started.
    fn start_parts(&mut self, config: ServiceConfig) -> Result<(), VolumeError> {
        // A coordinated node opens its volumes when it comes to lead them.
        let opened_now = if config.ha.is_none() {
            config.volumes.clone()
        } else {
            Vec::new()
        };
        for (vc, spec) in opened_now {
            let backend = spec.open(config.backend_connections)?;
            let (volume, report) = Volume::open(vc, backend, Arc::clone(&self.cache))?;
            tracing::info!(volume = volume.name(), ?report, "volume recovered");
            self.volumes.push(volume);
        }
        if let Some((addr, dir)) = &config.replica {
            self.replica = Some(Arc::new(ReplicaServer::start(addr, dir)?));
        }
        if let Some(path) = &config.control {
            let replicas = self.replica.as_ref().map(|r| r.status_source());
            self.control = Some(ControlServer::start(path, self.volumes.clone(), replicas)?);
        }
        if let Some(addr) = &config.metrics {
            let m = MetricsServer::start(addr, self.volumes.clone())?;
            tracing::info!(addr = %m.local_addr(), "serving metrics");
            self.metrics = Some(m);
        }
        let exports: Vec<(String, Arc<dyn Export>)> = self
            .volumes
            .snapshot()
            .into_iter()
            .map(|v| (v.name().to_string(), v as Arc<dyn Export>))
            .collect();
        if !exports.is_empty() || config.ha.is_some() {
            for listen in &config.listen {
                let server = if exports.is_empty() {
                    NbdServer::start_empty(listen.clone())?
                } else {
                    NbdServer::start(listen.clone(), exports.clone())?
                };
                tracing::info!(%listen, "serving NBD");
                self.servers.lock().push(server);
            }
        }
        if let Some(ha) = config.ha {
            let names = config.volumes.iter().map(|(v, _)| v.name.clone()).collect();
            let node = Arc::new(CoordinatedNode {
                cache: Arc::clone(&self.cache),
                specs: config.volumes,
                backend_connections: config.backend_connections,
                volumes: self.volumes.clone(),
                servers: Arc::clone(&self.servers),
                replica: Arc::clone(self.replica.as_ref().expect("checked at start")),
                fences: Mutex::new(Vec::new()),
            });
            self.coordinator = Some(Coordinator::start(ha, names, node)?);
        }
        Ok(())
    }

    /// Where the metrics endpoint listens, if it does.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    /// The volumes served now.
    pub fn volumes(&self) -> Vec<Arc<Volume>> {
        self.volumes.snapshot()
    }

    /// The servers' URIs for `export` (tests connect through them).
    pub fn uris(&self, export: &str) -> Vec<String> {
        self.servers.lock().iter().map(|s| s.uri(export)).collect()
    }

    /// Where the replica server listens, if this node serves copies.
    pub fn replica_addr(&self) -> Option<std::net::SocketAddr> {
        self.replica.as_ref().map(|r| r.local_addr())
    }

    fn stop_quietly(&mut self) {
        // The coordinator first: it steps down from the volumes it leads.
        self.coordinator.take();
        if let Some(r) = self.replica.take() {
            r.stop();
        }
        for s in self.servers.lock().drain(..) {
            s.shutdown();
        }
        if let Some(c) = self.control.take() {
            c.shutdown();
        }
        if let Some(m) = self.metrics.take() {
            m.shutdown();
        }
        for v in self.volumes.snapshot() {
            v.close();
        }
        self.movers.take();
    }

    /// Stops cleanly (see the module docs).
    pub fn stop(mut self) -> Result<(), VolumeError> {
        self.stop_quietly();
        while let Some(v) = self.volumes.snapshot().first() {
            self.volumes.remove(v.name());
        }
        match Arc::try_unwrap(self.cache) {
            Ok(cache) => cache.shutdown()?,
            Err(_) => tracing::warn!("the cache is still shared at stop; its index is not saved"),
        }
        Ok(())
    }
}

/// What a coordinator asks of a node ([`Leadership`]): open a volume it now leads from
/// its copy, serve it; give it up.
struct CoordinatedNode {
    cache: Arc<Cache>,
    specs: Vec<(VolumeConfig, BackendSpec)>,
    backend_connections: usize,
    volumes: VolumeList,
    servers: Arc<Mutex<Vec<NbdServer>>>,
    replica: Arc<ReplicaServer>,
    /// The backends of the volumes led here, fenced (F1–F3 in [`crate::fence`]).
    fences: Mutex<Vec<(String, Arc<FencedBackend>)>>,
}

impl Leadership for CoordinatedNode {
    fn lead(
        &self,
        volume: &str,
        replication: ReplicationConfig,
        succeeding: bool,
    ) -> Result<(), String> {
        let (config, spec) = self
            .specs
            .iter()
            .find(|(c, _)| c.name == volume)
            .ok_or_else(|| format!("no volume named {volume:?} here"))?;
        if succeeding && !config.log_path.exists() {
            // H2: a new log would open as a fresh volume without the acknowledged writes.
            return Err(format!(
                "volume {volume} was led before and this node holds no copy of it ({} is \
                 missing): a node whose copy is in sync must lead",
                config.log_path.display()
            ));
        }
        self.replica.release(volume).map_err(|e| e.to_string())?;
        let opened = spec.open(self.backend_connections).and_then(|backend| {
            // F1: this term writes the backend only while it holds the writer lock.
            let lease = replication.lease.clone();
            let fence = Arc::new(FencedBackend::new(backend, spec.lock_path(), lease));
            // A cache key prefix of this term's own: clean blocks this node cached when
            // it led the volume before are stale (another primary wrote since).
            let id = crc32fast::hash(format!("{volume}\0{}", replication.epoch).as_bytes());
            let config = VolumeConfig {
                id,
                replication: Some(replication),
                ..config.clone()
            };
            let backend = Arc::clone(&fence) as Arc<dyn Backend>;
            let opened = Volume::open(config, backend, Arc::clone(&self.cache));
            if opened.is_err() {
                fence.release();
            }
            opened.map(|o| (o, fence))
        });
        let ((v, report), fence) = match opened {
            Ok(o) => o,
            Err(e) => {
                if let Err(e) = self.replica.reclaim(volume, None) {
                    tracing::warn!(volume, error = %e, "keeping a copy again");
                }
                return Err(e.to_string());
            }
        };
        tracing::info!(volume, ?report, "took the volume over");
        self.fences.lock().push((volume.to_string(), fence));
        self.volumes.push(Arc::clone(&v));
        for s in self.servers.lock().iter() {
            if let Err(e) = s.add_export(volume, Arc::clone(&v) as Arc<dyn Export>) {
                tracing::warn!(volume, error = %e, "exporting");
            }
        }
        Ok(())
    }

    fn step_down(&self, volume: &str) {
        for s in self.servers.lock().iter() {
            s.remove_export(volume);
        }
        let fence = {
            let mut fences = self.fences.lock();
            let at = fences.iter().position(|(name, _)| name == volume);
            at.map(|at| fences.swap_remove(at).1)
        };
        // F3, then F2: a writer waiting for the lock gives up so the volume can close;
        // the lock goes only once nothing of this term can write any more.
        if let Some(f) = &fence {
            f.abandon();
        }
        let mut led = None;
        if let Some(v) = self.volumes.remove(volume) {
            led = v.status().replication.map(|r| r.epoch);
            v.close();
        }
        if let Some(f) = fence {
            f.release();
        }
        if let Err(e) = self.replica.reclaim(volume, led) {
            tracing::warn!(volume, error = %e, "keeping a copy again");
        }
    }
}

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

use terrace_cache::{Cache, CacheConfig, Movers, TierConfig};

use crate::backend::{Backend, FileBackend};
use crate::control::ControlServer;
use crate::error::VolumeError;
use crate::export::Export;
use crate::metrics::MetricsServer;
use crate::nbd::{Listen, NbdBackend, NbdServer};
use crate::replication::ReplicaServer;
use crate::s3::{S3Backend, S3Config};
use crate::volume::{Volume, VolumeConfig};

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
}

/// A running `terrace serve-volume`.
pub struct Service {
    cache: Arc<Cache>,
    movers: Option<Movers>,
    volumes: Vec<Arc<Volume>>,
    servers: Vec<NbdServer>,
    control: Option<ControlServer>,
    metrics: Option<MetricsServer>,
    replica: Option<ReplicaServer>,
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
        let (cache, restart) = Cache::open(CacheConfig::new(config.tiers))?;
        tracing::info!(?restart, "cache opened");
        let cache = Arc::new(cache);
        let movers = Cache::start_movers(&cache, Duration::from_millis(100));
        let mut volumes = Vec::new();
        for (vc, spec) in config.volumes {
            let backend = spec.open(config.backend_connections)?;
            let (volume, report) = Volume::open(vc, backend, Arc::clone(&cache))?;
            tracing::info!(volume = volume.name(), ?report, "volume recovered");
            volumes.push(volume);
        }
        let mut service = Service {
            cache,
            movers: Some(movers),
            volumes,
            servers: Vec::new(),
            control: None,
            metrics: None,
            replica: None,
        };
        if let Some((addr, dir)) = &config.replica {
            match ReplicaServer::start(addr, dir) {
                Ok(r) => service.replica = Some(r),
                Err(e) => {
                    service.stop_quietly();
                    return Err(e);
                }
            }
        }
        if let Some(path) = &config.control {
            let replicas = service.replica.as_ref().map(ReplicaServer::status_source);
            service.control = Some(ControlServer::start(
                path,
                service.volumes.clone(),
                replicas,
            )?);
        }
        if let Some(addr) = &config.metrics {
            match MetricsServer::start(addr, service.volumes.clone()) {
                Ok(m) => {
                    tracing::info!(addr = %m.local_addr(), "serving metrics");
                    service.metrics = Some(m);
                }
                Err(e) => {
                    service.stop_quietly();
                    return Err(e);
                }
            }
        }
        if service.volumes.is_empty() {
            return Ok(service);
        }
        let exports: Vec<(String, Arc<dyn Export>)> = service
            .volumes
            .iter()
            .map(|v| (v.name().to_string(), Arc::clone(v) as Arc<dyn Export>))
            .collect();
        for listen in config.listen {
            match NbdServer::start(listen.clone(), exports.clone()) {
                Ok(server) => {
                    tracing::info!(%listen, uri = %server.uri(exports[0].0.as_str()), "serving NBD");
                    service.servers.push(server);
                }
                Err(e) => {
                    service.stop_quietly();
                    return Err(e);
                }
            }
        }
        Ok(service)
    }

    /// Where the metrics endpoint listens, if it does.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.as_ref().map(MetricsServer::local_addr)
    }

    pub fn volumes(&self) -> &[Arc<Volume>] {
        &self.volumes
    }

    /// The servers' URIs for `export` (tests connect through them).
    pub fn uris(&self, export: &str) -> Vec<String> {
        self.servers.iter().map(|s| s.uri(export)).collect()
    }

    /// Where the replica server listens, if this node serves copies.
    pub fn replica_addr(&self) -> Option<std::net::SocketAddr> {
        self.replica.as_ref().map(ReplicaServer::local_addr)
    }

    fn stop_quietly(&mut self) {
        if let Some(r) = self.replica.take() {
            r.stop();
        }
        for s in self.servers.drain(..) {
            s.shutdown();
        }
        if let Some(c) = self.control.take() {
            c.shutdown();
        }
        if let Some(m) = self.metrics.take() {
            m.shutdown();
        }
        for v in &self.volumes {
            v.close();
        }
        self.movers.take();
    }

    /// Stops cleanly (see the module docs).
    pub fn stop(mut self) -> Result<(), VolumeError> {
        self.stop_quietly();
        self.volumes.clear();
        match Arc::try_unwrap(self.cache) {
            Ok(cache) => cache.shutdown()?,
            Err(_) => tracing::warn!("the cache is still shared at stop; its index is not saved"),
        }
        Ok(())
    }
}

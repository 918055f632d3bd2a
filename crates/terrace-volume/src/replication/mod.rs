//! Replicated volumes: primary-copy replication of a volume's write log to secondaries
//! on other `terrace` processes, over TCP.
//!
//! A replicated volume's primary writes its log through [`ReplicatedStore`], which
//! streams every log write to each secondary's [`ReplicaServer`] and, on each sync,
//! waits for the secondaries its [`AckLevel`] asks for; so a write acknowledged from the
//! log is on `min_replicas` nodes or more. A secondary keeps a byte-for-byte copy of the
//! log (it opens as the volume's log on that node), so a node that takes a volume over
//! writes the old primary's dirty data back from its copy.
//!
//! # States (HDCS's names, with DRBD's and Ceph's meanings)
//! - **healthy**: every replica in sync.
//! - **degraded**: at least `min_replicas` copies in sync (this one included), not all;
//!   a dirty bitmap is kept per missing peer, and a returning peer is resynced from it.
//!   Writes go on.
//! - **read-only**: fewer than `min_replicas` copies in sync, or fenced by a newer
//!   primary (a secondary has seen a higher epoch): writes are refused, reads go on.
//! - **inconsistent**: a copy mid-resync — a state of a copy, not of the volume: the
//!   primary shows the peer *resyncing* and does not count it in sync, and the secondary
//!   records it (`terrace volume replicas`) so the copy is never taken over.
//! - **error**: the local log's medium failed.
//!
//! Epochs: each primary runs with one ([`ReplicationConfig::epoch`]) and every message
//! carries it; a secondary that has seen a newer one refuses the older primary, which
//! then acknowledges nothing more (fencing).

pub mod digest;
#[cfg(feature = "etcd")]
mod etcd;
pub mod ha;
pub mod primary;
pub mod replica;
pub mod wire;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub use primary::{ReplicatedStore, Replication};
pub use replica::{read_replica_state, replica_paths, ReplicaServer, ReplicaState};

use crate::error::VolumeError;

/// Which secondaries a sync waits for, of those in sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckLevel {
    /// None: the local log only (DRBD protocol A; Aerospike commit-to-master).
    Local,
    /// One secondary.
    One,
    /// A majority of all copies, this one included.
    Majority,
    /// Every secondary in sync (DRBD protocol C; HDCS's only level).
    All,
}

impl AckLevel {
    pub fn name(self) -> &'static str {
        match self {
            AckLevel::Local => "local",
            AckLevel::One => "one",
            AckLevel::Majority => "majority",
            AckLevel::All => "all",
        }
    }

    /// Acks from secondaries this level asks, with `replicas` copies in all.
    pub fn peers_needed(self, replicas: usize) -> usize {
        match self {
            AckLevel::Local => 0,
            AckLevel::One => 1,
            AckLevel::Majority => replicas / 2,
            AckLevel::All => replicas - 1,
        }
    }
}

impl std::str::FromStr for AckLevel {
    type Err = String;
    fn from_str(s: &str) -> Result<AckLevel, String> {
        match s {
            "local" => Ok(AckLevel::Local),
            "one" => Ok(AckLevel::One),
            "majority" => Ok(AckLevel::Majority),
            "all" => Ok(AckLevel::All),
            _ => Err(format!("{s:?}: expected local, one, majority or all")),
        }
    }
}

/// A replicated volume's health on its primary (see the module docs; *inconsistent* is
/// a copy's state, [`ReplicaState::consistent`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Degraded,
    ReadOnly,
    Error,
}

impl Health {
    pub fn name(self) -> &'static str {
        match self {
            Health::Healthy => "healthy",
            Health::Degraded => "degraded",
            Health::ReadOnly => "read-only",
            Health::Error => "error",
        }
    }

    /// The value of the `replication_state` gauge.
    pub fn code(self) -> u64 {
        match self {
            Health::Healthy => 0,
            Health::Degraded => 1,
            Health::ReadOnly => 2,
            Health::Error => 3,
        }
    }
}

/// How the primary sees one secondary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Not connected; writes are marked in its bitmap.
    Down,
    /// Connected, its copy being caught up (inconsistent until the resync ends).
    Resyncing,
    /// Connected, its copy whole, every write streamed to it.
    InSync,
}

impl LinkState {
    pub fn name(self) -> &'static str {
        match self {
            LinkState::Down => "down",
            LinkState::Resyncing => "resyncing",
            LinkState::InSync => "in-sync",
        }
    }
}

/// How to replicate a volume (on its primary).
#[derive(Clone, Debug)]
pub struct ReplicationConfig {
    /// The secondaries' replication addresses (`HOST:PORT`): `replicas - 1` of them.
    pub peers: Vec<String>,
    pub ack: AckLevel,
    /// Copies (this one included) that must be in sync for the volume to take writes.
    pub min_replicas: usize,
    /// This primary's epoch: at least every earlier primary's of the volume.
    pub epoch: u64,
    /// How long a sync waits for an in-sync peer's ack before cutting it off; also the
    /// connect and hello timeout.
    pub peer_timeout: Duration,
    /// The pause between attempts to reach a peer that is down.
    pub reconnect: Duration,
    /// The most units (of 256 KiB, then of 4 KiB) one DIGEST request of a comparison
    /// asks (P7 in `primary`); the copy hashes them all before it answers. Default
    /// [`primary::DIGEST_BATCH_UNITS`]; at most [`wire::MAX_DIGEST_UNITS`].
    pub digest_request_units: u64,
    /// Under a coordinator: the lease this primary holds the volume by. Once it has
    /// run out, no sync succeeds and no write is taken (another node may lead).
    pub lease: Option<LeaseWatch>,
    /// Under a coordinator: publishes the peers in sync (their addresses); called, and
    /// must succeed, before a sync counts without a peer it last published, so a node
    /// outside the published set (which may lack acknowledged writes) never leads.
    pub publish_in_sync: Option<InSyncPublisher>,
}

/// Until when a primary's lease holds, as a coordinator last renewed it.
#[derive(Clone, Debug)]
pub struct LeaseWatch(Arc<AtomicU64>);

fn clock_base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

impl LeaseWatch {
    /// A lease that has run out (none held yet).
    pub fn expired() -> LeaseWatch {
        LeaseWatch(Arc::new(AtomicU64::new(0)))
    }

    /// The lease holds until `until` (a renewal sent at `t` with a TTL holds until
    /// `t + TTL`: the server's expiry can only be later).
    pub fn hold_until(&self, until: Instant) {
        let ms = until.saturating_duration_since(clock_base()).as_millis() as u64;
        self.0.fetch_max(ms, Ordering::AcqRel);
    }

    /// The lease is gone (resigned, or the coordinator stopped).
    pub fn expire(&self) {
        self.0.store(0, Ordering::Release);
    }

    pub fn holds(&self) -> bool {
        let now = clock_base().elapsed().as_millis() as u64;
        now < self.0.load(Ordering::Acquire)
    }
}

/// Publishes the addresses of the peers in sync (see
/// [`ReplicationConfig::publish_in_sync`]).
pub type PublishFn = dyn Fn(&[String]) -> std::io::Result<()> + Send + Sync;

/// See [`ReplicationConfig::publish_in_sync`].
#[derive(Clone)]
pub struct InSyncPublisher(pub Arc<PublishFn>);

impl std::fmt::Debug for InSyncPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InSyncPublisher")
    }
}

impl ReplicationConfig {
    /// Defaults: ack `all`, `min_replicas` 1, epoch 1, a 2 s peer timeout, a retry every
    /// 200 ms.
    pub fn new(peers: Vec<String>) -> ReplicationConfig {
        ReplicationConfig {
            peers,
            ack: AckLevel::All,
            min_replicas: 1,
            epoch: 1,
            peer_timeout: Duration::from_secs(2),
            reconnect: Duration::from_millis(200),
            digest_request_units: primary::DIGEST_BATCH_UNITS,
            lease: None,
            publish_in_sync: None,
        }
    }

    pub fn check(&self) -> Result<(), VolumeError> {
        let replicas = self.peers.len() + 1;
        if self.peers.is_empty() {
            return Err(VolumeError::Config(
                "replication needs at least one peer".into(),
            ));
        }
        if self.min_replicas == 0 || self.min_replicas > replicas {
            return Err(VolumeError::Config(format!(
                "min-replicas {} with {replicas} replicas: it must be 1 to {replicas}",
                self.min_replicas
            )));
        }
        if self.epoch == 0 {
            return Err(VolumeError::Config(
                "epoch 0 is reserved; epochs start at 1".into(),
            ));
        }
        if self.peer_timeout.is_zero() {
            return Err(VolumeError::Config("a zero peer timeout".into()));
        }
        if !(1..=wire::MAX_DIGEST_UNITS).contains(&self.digest_request_units) {
            return Err(VolumeError::Config(format!(
                "{} units per digest request: it must be 1 to {}",
                self.digest_request_units,
                wire::MAX_DIGEST_UNITS
            )));
        }
        Ok(())
    }
}

/// One volume's own replication settings over its node's (Ceph's per-pool `size` and
/// `min_size`): `serve-volume --volume-replication NAME=SETTINGS`, SETTINGS being
/// `replicas=N,ack-level=L,min-replicas=M` (any of them, in any order; the keys are
/// the node-wide flags' names). A field left unset takes the node's value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumeReplication {
    /// Copies, this one included. Without a coordinator the volume streams to the first
    /// `replicas - 1` of the node's peers (1: not replicated).
    pub replicas: Option<usize>,
    pub ack: Option<AckLevel>,
    pub min_replicas: Option<usize>,
}

impl std::str::FromStr for VolumeReplication {
    type Err = String;
    fn from_str(s: &str) -> Result<VolumeReplication, String> {
        let mut v = VolumeReplication::default();
        for item in s.split(',') {
            let (key, value) = item.split_once('=').ok_or_else(|| {
                format!("{item:?}: expected replicas=N, ack-level=LEVEL or min-replicas=M")
            })?;
            let count = |what: &str| {
                value
                    .parse::<usize>()
                    .ok()
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| format!("{what}={value:?}: expected a count of 1 or more"))
            };
            match key {
                "replicas" => v.replicas = Some(count(key)?),
                "ack-level" => v.ack = Some(value.parse()?),
                "min-replicas" => v.min_replicas = Some(count(key)?),
                _ => {
                    return Err(format!(
                        "{key:?}: expected replicas, ack-level or min-replicas"
                    ))
                }
            }
        }
        Ok(v)
    }
}

impl ReplicationConfig {
    /// The replication of a volume whose own settings are `own`, on a node replicating
    /// with `node` (`None`: the node has no peers). `Ok(None)`: the volume is not
    /// replicated (`replicas=1`, or neither the node nor the volume asks for copies).
    /// The result is checked ([`ReplicationConfig::check`]).
    pub fn for_volume(
        node: Option<&ReplicationConfig>,
        own: &VolumeReplication,
    ) -> Result<Option<ReplicationConfig>, VolumeError> {
        let unreplicated = || {
            if own.ack.is_some() || own.min_replicas.is_some_and(|m| m > 1) {
                return Err(VolumeError::Config(
                    "ack-level or min-replicas for a volume that is not replicated".into(),
                ));
            }
            Ok(None)
        };
        let Some(node) = node else {
            return match own.replicas {
                None | Some(1) => unreplicated(),
                Some(n) => Err(VolumeError::Config(format!(
                    "replicas={n} for a volume of a node with no replica peer"
                ))),
            };
        };
        let mut config = node.clone();
        if let Some(n) = own.replicas {
            if n == 1 {
                return unreplicated();
            }
            if n - 1 > node.peers.len() {
                return Err(VolumeError::Config(format!(
                    "replicas={n} with {} replica peers",
                    node.peers.len()
                )));
            }
            config.peers.truncate(n - 1);
        }
        config.ack = own.ack.unwrap_or(config.ack);
        config.min_replicas = own.min_replicas.unwrap_or(config.min_replicas);
        config.check()?;
        Ok(Some(config))
    }
}

/// One secondary as the primary sees it.
#[derive(Clone, Debug)]
pub struct PeerStatus {
    pub addr: String,
    pub link: LinkState,
    /// Log bytes it may lack (marked in its bitmap).
    pub dirty_bytes: u64,
    pub queued_bytes: u64,
    pub bytes_sent: u64,
    /// Bytes sent by resyncs (bitmap extents), over all of them.
    pub bytes_resynced: u64,
    pub resyncs: u64,
    /// Resyncs of a copy that followed another stream (a failover, a restart of the
    /// primary, a lost copy): compared with the log by digest, what differs sent.
    pub compared_resyncs: u64,
    /// Bytes the comparisons' digests took (requests and answers).
    pub digest_bytes: u64,
    pub last_error: Option<String>,
}

/// A replicated volume's replication, for `status` and Prometheus.
#[derive(Clone, Debug)]
pub struct ReplicationStatus {
    pub health: Health,
    pub epoch: u64,
    pub ack: AckLevel,
    pub replicas: usize,
    pub min_replicas: usize,
    /// Copies in sync, this one included.
    pub in_sync: usize,
    /// State changes since the volume opened.
    pub transitions: u64,
    /// Syncs that had to wait for a peer's ack.
    pub syncs_waited: u64,
    pub fenced_by: Option<u64>,
    pub peers: Vec<PeerStatus>,
}

impl ReplicationStatus {
    /// The replication's Prometheus lines for volume `name`.
    pub fn prometheus(&self, name: &str) -> String {
        let st = self;
        let mut out = String::new();
        let mut gauge = |metric: &str, help: &str, labels: &str, value: u64| {
            out.push_str(&format!(
                "# HELP terrace_volume_{metric} {help}\n# TYPE terrace_volume_{metric} gauge\n\
                 terrace_volume_{metric}{{volume=\"{name}\"{labels}}} {value}\n"
            ));
        };
        gauge(
            "replication_state",
            "0 healthy, 1 degraded, 2 read-only, 3 error.",
            "",
            st.health.code(),
        );
        gauge("replication_epoch", "This primary's epoch.", "", st.epoch);
        gauge(
            "replication_in_sync",
            "Copies in sync, this one included.",
            "",
            st.in_sync as u64,
        );
        gauge(
            "replication_transitions",
            "Replication state changes since the volume opened.",
            "",
            st.transitions,
        );
        gauge(
            "replication_syncs_waited",
            "Log syncs that waited for a peer's ack.",
            "",
            st.syncs_waited,
        );
        for p in &st.peers {
            let peer = format!(",peer=\"{}\"", p.addr);
            gauge(
                "replication_peer_in_sync",
                "1 while the peer is in sync.",
                &peer,
                u64::from(p.link == LinkState::InSync),
            );
            gauge(
                "replication_peer_dirty_bytes",
                "Log bytes the peer may lack (its bitmap).",
                &peer,
                p.dirty_bytes,
            );
            gauge(
                "replication_peer_sent_bytes",
                "Log bytes sent to the peer.",
                &peer,
                p.bytes_sent,
            );
            gauge(
                "replication_peer_resynced_bytes",
                "Log bytes sent to the peer by resyncs.",
                &peer,
                p.bytes_resynced,
            );
            gauge(
                "replication_peer_digest_bytes",
                "Bytes of digests exchanged comparing the peer's copy before resyncs.",
                &peer,
                p.digest_bytes,
            );
        }
        out
    }

    /// `status` lines: the state, then one line per peer.
    pub fn text(&self) -> String {
        let mut out = format!(
            "  replication {}\n  replication_epoch {}\n  replication_ack {}\n  \
             replication_in_sync {} of {} (min {})\n  replication_transitions {}\n  \
             replication_syncs_waited {}\n",
            self.health.name(),
            self.epoch,
            self.ack.name(),
            self.in_sync,
            self.replicas,
            self.min_replicas,
            self.transitions,
            self.syncs_waited,
        );
        if let Some(e) = self.fenced_by {
            out.push_str(&format!("  replication_fenced_by_epoch {e}\n"));
        }
        for p in &self.peers {
            out.push_str(&format!(
                "  peer {} {} dirty_bytes {} queued_bytes {} sent_bytes {} resynced_bytes {} \
                 resyncs {} compared_resyncs {} digest_bytes {} last_error {}\n",
                p.addr,
                p.link.name(),
                p.dirty_bytes,
                p.queued_bytes,
                p.bytes_sent,
                p.bytes_resynced,
                p.resyncs,
                p.compared_resyncs,
                p.digest_bytes,
                p.last_error.as_deref().unwrap_or("none"),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volumes_settings_parse_and_override_the_nodes() {
        let own: VolumeReplication = "ack-level=one,replicas=2".parse().unwrap();
        assert_eq!(own.replicas, Some(2));
        assert_eq!(own.ack, Some(AckLevel::One));
        assert_eq!(own.min_replicas, None);
        for bad in [
            "",
            "replicas",
            "replicas=0",
            "copies=2",
            "ack-level=most",
            "min-replicas=x",
        ] {
            assert!(bad.parse::<VolumeReplication>().is_err(), "{bad:?} parsed");
        }

        let node = ReplicationConfig {
            min_replicas: 2,
            ..ReplicationConfig::new(vec!["b:1".into(), "c:1".into()])
        };
        let got = ReplicationConfig::for_volume(Some(&node), &own)
            .unwrap()
            .unwrap();
        assert_eq!(got.peers, ["b:1"], "the first replicas - 1 peers");
        assert_eq!((got.ack, got.min_replicas), (AckLevel::One, 2));
        let all = ReplicationConfig::for_volume(Some(&node), &VolumeReplication::default());
        assert_eq!(all.unwrap().unwrap().peers.len(), 2, "unset: the node's");
        let one = "replicas=1".parse().unwrap();
        assert!(ReplicationConfig::for_volume(Some(&node), &one)
            .unwrap()
            .is_none());
        assert!(ReplicationConfig::for_volume(None, &one).unwrap().is_none());
        for bad in [
            "replicas=4",                // more than the node's peers
            "replicas=2,min-replicas=3", // above replicas
            "replicas=1,ack-level=all",  // not replicated
        ] {
            let own = bad.parse().unwrap();
            assert!(
                ReplicationConfig::for_volume(Some(&node), &own).is_err(),
                "{bad} accepted"
            );
        }
        let two = "replicas=2".parse().unwrap();
        assert!(
            ReplicationConfig::for_volume(None, &two).is_err(),
            "no peer"
        );
    }
}

//! Failover through etcd: which nodes hold a volume, which one leads it, and the epoch
//! that fences the ones before. A [`Coordinator`] runs on every node (`serve-volume
//! --etcd`); decisions are etcd's (leases, elections, revisions), none are made here.
//! The etcd client is behind the cargo feature `etcd` (its build needs `protoc`); the
//! test suite turns it on, and a build without it refuses `--etcd`.
//!
//! # Keys (under `prefix`, default `/terrace`)
//! - `nodes/NODE` = `domain D\nreplica ADDR\n`, under the node's lease: the nodes alive.
//! - `volumes/V/placement` = a line `NODE DOMAIN ADDR` per copy, written once (a
//!   transaction that succeeds only if it is absent): the `replicas` nodes with the
//!   highest rendezvous hash of (V, NODE), distinct failure domains first.
//! - `volumes/V/election`: etcd's election for V; the leader key's creation revision is
//!   the primary's **epoch** (it only grows, so a later primary always fences an
//!   earlier one).
//! - `volumes/V/in_sync` = the nodes whose copies hold every acknowledged write (the
//!   primary and its peers in sync), written by the primary before it acknowledges a
//!   write without a peer it last named (P6 in `primary`).
//!
//! # Rules
//! - H1: a node campaigns for V only when it is in V's placement and, if `in_sync`
//!   exists, named in it; having won, it checks again and resigns if no longer named.
//!   So the new primary holds every acknowledged write (P6 in `primary`).
//! - H2: the winner writes `in_sync` = itself before it opens the volume (its peers
//!   must resync: their copies follow the old primary's stream); if it cannot open it
//!   (its copy was left mid-resync or lost, the backend is away), it puts the previous
//!   `in_sync` back before resigning, so the nodes named there may lead. A node named
//!   in `in_sync` whose files are gone (the node was rebuilt, its copy deleted) holds
//!   nothing: once `in_sync` exists, a winner without a log refuses (`succeeding`).
//!   Both writes are conditional on `in_sync`'s revision (what the winner read, then
//!   what it wrote): an operator's change in between — `etcdctl del` accepting a loss —
//!   stands, and the next campaign reads it.
//! - H3: a primary holds V only while its lease does: each renewal sent at `t` holds it
//!   until `t + TTL` (etcd's expiry is later), and past that the volume takes no write
//!   and no sync succeeds (`LeaseWatch`); the node steps down and campaigns anew.
//! - H4: with ack `one` or `majority` the primary waits for, and names in `in_sync`,
//!   a fixed set of peers (P8 in `primary`: PostgreSQL's `FIRST k`), not whichever
//!   answer first: a copy that may lack a write another acknowledged is never named.
//!   With ack `local` and `--min-replicas 1` only the primary is named, and a volume
//!   whose primary is lost waits for it.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{ReplicationConfig, VolumeReplication};
use crate::error::VolumeError;

#[cfg(feature = "etcd")]
pub use super::etcd::Coordinator;

/// Built without the `etcd` cargo feature: a coordinator cannot start.
#[cfg(not(feature = "etcd"))]
pub struct Coordinator;

#[cfg(not(feature = "etcd"))]
impl Coordinator {
    /// Refuses: this build has no etcd client.
    pub fn start(
        _config: HaConfig,
        _volumes: Vec<String>,
        _node: std::sync::Arc<dyn Leadership>,
    ) -> Result<Coordinator, VolumeError> {
        Err(VolumeError::Config(
            "this terrace was built without etcd support: build it with `--features etcd` \
             (etcd-client needs protoc, Debian's protobuf-compiler)"
                .into(),
        ))
    }
}

/// How a node joins the coordination.
#[derive(Clone, Debug)]
pub struct HaConfig {
    pub endpoints: Vec<String>,
    /// This node's name (unique among the nodes).
    pub node: String,
    /// Its failure domain (a rack, a host…): copies go to distinct ones first.
    pub domain: String,
    /// Where this node's replica server listens, as other nodes reach it.
    pub replica_addr: String,
    /// Copies per volume, this one included.
    pub replicas: usize,
    pub lease_ttl: Duration,
    pub prefix: String,
    /// The replication of the volumes this node leads (peers, epoch, lease and publisher
    /// are filled in per volume).
    pub template: ReplicationConfig,
    /// Volumes' own settings over `replicas` and the template's ack level and
    /// `min_replicas`. Every node should be given the same: a volume's placement takes
    /// the count of the node that places it first, and each primary waits as its own
    /// settings say.
    pub volumes: BTreeMap<String, VolumeReplication>,
    /// Serve volumes whose backend has no writer lock (NBD, S3): no fence keeps an
    /// earlier primary, paused past its lease, from writing an older block over a newer
    /// one there ([`crate::fence`]). Without it such a volume is refused.
    pub unfenced_backends: bool,
}

impl HaConfig {
    pub fn check(&self) -> Result<(), VolumeError> {
        if self.endpoints.is_empty() {
            return Err(VolumeError::Config("no etcd endpoint".into()));
        }
        if self.node.is_empty() || self.node.contains(char::is_whitespace) {
            return Err(VolumeError::Config(format!("node name {:?}", self.node)));
        }
        if self.domain.is_empty() || self.domain.contains(char::is_whitespace) {
            return Err(VolumeError::Config(format!(
                "failure domain {:?}",
                self.domain
            )));
        }
        let names = std::iter::once(None).chain(self.volumes.keys().map(Some));
        for name in names {
            let volume = name.map(String::as_str).unwrap_or_default();
            // Named as the static settings' errors name it (`volume "db": …`).
            let of = name.map_or(String::new(), |n| format!("volume {n:?}: "));
            let replicas = self.replicas_of(volume);
            if replicas < 2 {
                return Err(VolumeError::Config(format!(
                    "{of}a coordinated volume needs 2 or more replicas"
                )));
            }
            if self.template_of(volume).min_replicas > replicas {
                return Err(VolumeError::Config(format!(
                    "{of}min-replicas above replicas"
                )));
            }
        }
        if self.lease_ttl < Duration::from_secs(1) {
            return Err(VolumeError::Config("a lease TTL under 1 s".into()));
        }
        Ok(())
    }
}

impl HaConfig {
    /// Copies of `volume`, its primary's included.
    pub fn replicas_of(&self, volume: &str) -> usize {
        self.volumes
            .get(volume)
            .and_then(|v| v.replicas)
            .unwrap_or(self.replicas)
    }

    /// The replication `volume`'s primary runs with, before its peers, epoch, lease
    /// and publisher are filled in.
    pub fn template_of(&self, volume: &str) -> ReplicationConfig {
        let own = self.volumes.get(volume).copied().unwrap_or_default();
        ReplicationConfig {
            ack: own.ack.unwrap_or(self.template.ack),
            min_replicas: own.min_replicas.unwrap_or(self.template.min_replicas),
            ..self.template.clone()
        }
    }
}

/// What a coordinator asks of its node.
pub trait Leadership: Send + Sync {
    /// Open `volume` as its primary with `replication`, and serve it. `succeeding`:
    /// another primary led it before (etcd names the copies in sync), so this node
    /// takes over from its copy and must refuse if it has none (H2).
    fn lead(
        &self,
        volume: &str,
        replication: ReplicationConfig,
        succeeding: bool,
    ) -> Result<(), String>;
    /// Stop serving `volume` (the lease ran out, or the node stops).
    fn step_down(&self, volume: &str);
}

/// One copy's place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub node: String,
    pub domain: String,
    pub addr: String,
}

/// `volume`'s copies among `nodes` (name, domain, addr): the `replicas` highest
/// rendezvous scores, one per failure domain first, then the next highest.
pub fn place(volume: &str, nodes: &[Placed], replicas: usize) -> Vec<Placed> {
    let score = |n: &Placed| {
        let mut h = crc32fast::Hasher::new();
        h.update(volume.as_bytes());
        h.update(&[0]);
        h.update(n.node.as_bytes());
        let a = h.finalize() as u64;
        (a.wrapping_mul(0x9E37_79B9_7F4A_7C15)) ^ (a << 17)
    };
    let mut ranked: Vec<&Placed> = nodes.iter().collect();
    ranked.sort_by(|a, b| score(b).cmp(&score(a)).then(a.node.cmp(&b.node)));
    let mut chosen: Vec<Placed> = Vec::new();
    for n in &ranked {
        if chosen.len() < replicas && !chosen.iter().any(|c| c.domain == n.domain) {
            chosen.push((*n).clone());
        }
    }
    for n in &ranked {
        if chosen.len() < replicas && !chosen.iter().any(|c| c.node == n.node) {
            chosen.push((*n).clone());
        }
    }
    chosen
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) fn encode_placement(p: &[Placed]) -> String {
    p.iter()
        .map(|c| format!("{} {} {}\n", c.node, c.domain, c.addr))
        .collect()
}

#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) fn decode_placement(text: &str) -> Option<Vec<Placed>> {
    text.lines()
        .map(|l| {
            let mut w = l.split_whitespace();
            Some(Placed {
                node: w.next()?.to_string(),
                domain: w.next()?.to_string(),
                addr: w.next()?.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::AckLevel;

    fn node(n: &str, d: &str) -> Placed {
        Placed {
            node: n.into(),
            domain: d.into(),
            addr: format!("{n}:1"),
        }
    }

    #[test]
    fn a_volumes_own_settings_replace_the_nodes_and_are_checked() {
        let mut ha = HaConfig {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            node: "n1".into(),
            domain: "r1".into(),
            replica_addr: "127.0.0.1:7400".into(),
            replicas: 3,
            lease_ttl: Duration::from_secs(3),
            prefix: "/terrace".into(),
            template: ReplicationConfig {
                min_replicas: 2,
                ..ReplicationConfig::new(Vec::new())
            },
            volumes: BTreeMap::new(),
            unfenced_backends: false,
        };
        ha.volumes
            .insert("db".into(), "replicas=5,ack-level=one".parse().unwrap());
        ha.check().unwrap();
        assert_eq!((ha.replicas_of("db"), ha.replicas_of("other")), (5, 3));
        let (db, other) = (ha.template_of("db"), ha.template_of("other"));
        assert_eq!((db.ack, db.min_replicas), (AckLevel::One, 2));
        assert_eq!((other.ack, other.min_replicas), (AckLevel::All, 2));
        for bad in ["replicas=1", "replicas=2,min-replicas=3", "min-replicas=4"] {
            ha.volumes.insert("x".into(), bad.parse().unwrap());
            let e = ha.check().unwrap_err().to_string();
            assert!(e.contains("volume \"x\": "), "{bad}: {e}");
        }
    }

    #[test]
    fn placement_spreads_over_domains_and_is_the_same_everywhere() {
        let nodes = vec![
            node("a", "r1"),
            node("b", "r1"),
            node("c", "r2"),
            node("d", "r3"),
        ];
        for v in ["vol0", "vol1", "vol2", "x"] {
            let p = place(v, &nodes, 3);
            assert_eq!(p.len(), 3);
            let mut domains: Vec<_> = p.iter().map(|c| c.domain.clone()).collect();
            domains.sort();
            domains.dedup();
            assert_eq!(domains.len(), 3, "{v}: {p:?}");
            let mut reversed = nodes.clone();
            reversed.reverse();
            assert_eq!(place(v, &reversed, 3), p, "order of the node list matters");
            assert_eq!(decode_placement(&encode_placement(&p)).unwrap(), p);
        }
        // Fewer domains than copies: the rest fill in.
        assert_eq!(place("v", &nodes[..2], 2).len(), 2);
        assert!(decode_placement("a r1\n").is_none());
    }
}

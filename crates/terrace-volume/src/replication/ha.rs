//! Failover through etcd: which nodes hold a volume, which one leads it, and the epoch
//! that fences the ones before. A [`Coordinator`] runs on every node (`serve-volume
//! --etcd`); decisions are etcd's (leases, elections, revisions), none are made here.
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
//!   So with ack `all` the new primary holds every acknowledged write.
//! - H2: the winner writes `in_sync` = itself before it opens the volume (its peers
//!   must resync: their copies follow the old primary's stream).
//! - H3: a primary holds V only while its lease does: each renewal sent at `t` holds it
//!   until `t + TTL` (etcd's expiry is later), and past that the volume takes no write
//!   and no sync succeeds (`LeaseWatch`); the node steps down and campaigns anew.
//! - H4: with ack `one` or `majority` a new primary could lack a write that only
//!   another copy acknowledged; until primaries catch up from their peers on taking
//!   over, a coordinated volume must use ack `all` ([`HaConfig::check`]).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use tokio::sync::{watch, Notify};

use super::{AckLevel, InSyncPublisher, LeaseWatch, ReplicationConfig};
use crate::error::VolumeError;

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
        if self.replicas < 2 {
            return Err(VolumeError::Config(
                "a coordinated volume needs 2 or more replicas".into(),
            ));
        }
        if self.template.ack != AckLevel::All {
            return Err(VolumeError::Config(
                "with --etcd the ack level must be `all` (a new primary does not yet catch up \
                 from its peers)"
                    .into(),
            ));
        }
        if self.template.min_replicas > self.replicas {
            return Err(VolumeError::Config("min-replicas above replicas".into()));
        }
        if self.lease_ttl < Duration::from_secs(1) {
            return Err(VolumeError::Config("a lease TTL under 1 s".into()));
        }
        Ok(())
    }
}

/// What a coordinator asks of its node.
pub trait Leadership: Send + Sync {
    /// Open `volume` as its primary with `replication`, and serve it.
    fn lead(&self, volume: &str, replication: ReplicationConfig) -> Result<(), String>;
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

fn encode_placement(p: &[Placed]) -> String {
    p.iter()
        .map(|c| format!("{} {} {}\n", c.node, c.domain, c.addr))
        .collect()
}

fn decode_placement(text: &str) -> Option<Vec<Placed>> {
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

/// A running coordinator: a thread with an async runtime talking to etcd.
pub struct Coordinator {
    stop: Arc<Notify>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

struct Ctx {
    config: HaConfig,
    client: Client,
    lease: LeaseWatch,
    /// The lease now held (0: none), for campaigns and the node key.
    lease_id: watch::Receiver<i64>,
    node: Arc<dyn Leadership>,
    stop: Arc<Notify>,
    stopped: Arc<std::sync::atomic::AtomicBool>,
    handle: tokio::runtime::Handle,
}

impl Coordinator {
    /// Connects to etcd and starts coordinating `volumes` for `node`.
    pub fn start(
        config: HaConfig,
        volumes: Vec<String>,
        node: Arc<dyn Leadership>,
    ) -> Result<Coordinator, VolumeError> {
        config.check()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd")
            .enable_all()
            .build()
            .map_err(|e| VolumeError::Config(format!("starting the etcd runtime: {e}")))?;
        // No per-request timeout: a campaign blocks for as long as another node leads.
        // The calls that must not block are bounded with `within`; HTTP/2 pings find a
        // dead connection.
        let options = ConnectOptions::new()
            .with_connect_timeout(config.lease_ttl)
            .with_keep_alive(config.lease_ttl / 3, config.lease_ttl / 3)
            .with_keep_alive_while_idle(true);
        let client = runtime
            .block_on(Client::connect(&config.endpoints, Some(options)))
            .map_err(|e| VolumeError::Config(format!("etcd {:?}: {e}", config.endpoints)))?;
        let stop = Arc::new(Notify::new());
        let stopped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (lease_tx, lease_rx) = watch::channel(0i64);
        let ctx = Arc::new(Ctx {
            config,
            client,
            lease: LeaseWatch::expired(),
            lease_id: lease_rx,
            node,
            stop: Arc::clone(&stop),
            stopped: Arc::clone(&stopped),
            handle: runtime.handle().clone(),
        });
        let thread = std::thread::Builder::new()
            .name("coordinator".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let mut tasks = tokio::task::JoinSet::new();
                    tasks.spawn(Arc::clone(&ctx).keep_lease(lease_tx));
                    for v in volumes {
                        tasks.spawn(Arc::clone(&ctx).volume_task(v));
                    }
                    while tasks.join_next().await.is_some() {}
                });
            })
            .map_err(|e| VolumeError::Config(format!("spawning the coordinator: {e}")))?;
        Ok(Coordinator {
            stop,
            stopped,
            thread: Some(thread),
        })
    }

    /// Steps down from every volume led here and stops.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        self.stopped
            .store(true, std::sync::atomic::Ordering::Release);
        self.stop.notify_waiters();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// `f`, or an error after `limit`.
async fn within<T>(
    limit: Duration,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err(format!("etcd did not answer within {limit:?}")),
    }
}

impl Ctx {
    fn key(&self, rest: &str) -> String {
        format!("{}/{rest}", self.config.prefix)
    }

    fn stopping(&self) -> bool {
        self.stopped.load(std::sync::atomic::Ordering::Acquire)
    }

    async fn pause(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.stop.notified() => {}
        }
    }

    /// Holds a lease for the node (granted anew whenever it is lost), its `nodes/NODE`
    /// key under it, and `lease` up to date (H3).
    async fn keep_lease(self: Arc<Self>, lease_tx: watch::Sender<i64>) {
        let ttl = self.config.lease_ttl;
        let mut client = self.client.clone();
        while !self.stopping() {
            let granted_at = Instant::now();
            let id = match within(ttl, client.lease_grant(ttl.as_secs() as i64, None)).await {
                Ok(r) => r.id(),
                Err(e) => {
                    tracing::warn!(error = %e, "etcd: no lease");
                    self.pause(Duration::from_millis(300)).await;
                    continue;
                }
            };
            self.lease.hold_until(granted_at + ttl);
            let value = format!(
                "domain {}\nreplica {}\n",
                self.config.domain, self.config.replica_addr
            );
            let put = within(
                ttl,
                client.put(
                    self.key(&format!("nodes/{}", self.config.node)),
                    value,
                    Some(PutOptions::new().with_lease(id)),
                ),
            )
            .await;
            if let Err(e) = put {
                tracing::warn!(error = %e, "etcd: registering the node");
                self.pause(Duration::from_millis(300)).await;
                continue;
            }
            let _ = lease_tx.send(id);
            tracing::info!(node = %self.config.node, lease = id, "etcd: lease held");
            let Ok((mut keeper, mut stream)) = within(ttl, client.lease_keep_alive(id)).await
            else {
                continue;
            };
            loop {
                self.pause(ttl / 3).await;
                if self.stopping() {
                    break;
                }
                let sent = Instant::now();
                let renewed = tokio::time::timeout(ttl / 3, async {
                    keeper.keep_alive().await?;
                    stream.message().await
                })
                .await;
                match renewed {
                    Ok(Ok(Some(r))) if r.ttl() > 0 => self.lease.hold_until(sent + ttl),
                    other => {
                        if !self.lease.holds() {
                            tracing::warn!(?other, "etcd: the lease ran out");
                            let _ = lease_tx.send(0);
                            break;
                        }
                    }
                }
            }
        }
        // Stopping: the lease goes with us (the next node needs no TTL to wait out).
        self.lease.expire();
        let id = *lease_tx.borrow();
        if id != 0 {
            let _ = tokio::time::timeout(Duration::from_secs(1), client.lease_revoke(id)).await;
        }
    }

    /// The live nodes' places.
    async fn live_nodes(&self) -> Result<Vec<Placed>, String> {
        let prefix = self.key("nodes/");
        let mut client = self.client.clone();
        let options = GetOptions::new().with_prefix();
        let r = within(
            self.config.lease_ttl,
            client.get(prefix.clone(), Some(options)),
        )
        .await?;
        Ok(r.kvs()
            .iter()
            .filter_map(|kv| {
                let node = kv.key_str().ok()?.strip_prefix(&prefix)?.to_string();
                let text = kv.value_str().ok()?;
                let mut domain = None;
                let mut addr = None;
                for line in text.lines() {
                    match line.split_once(' ') {
                        Some(("domain", d)) => domain = Some(d.to_string()),
                        Some(("replica", a)) => addr = Some(a.to_string()),
                        _ => {}
                    }
                }
                Some(Placed {
                    node,
                    domain: domain?,
                    addr: addr?,
                })
            })
            .collect())
    }

    /// `volume`'s placement: the stored one, or one made from the live nodes once
    /// `replicas` are alive and stored if no other node stored one first.
    async fn placement(&self, volume: &str) -> Result<Vec<Placed>, String> {
        let key = self.key(&format!("volumes/{volume}/placement"));
        let mut client = self.client.clone();
        loop {
            let got = within(self.config.lease_ttl, client.get(key.clone(), None)).await?;
            if let Some(kv) = got.kvs().first() {
                let text = kv.value_str().map_err(|e| e.to_string())?;
                return decode_placement(text)
                    .ok_or_else(|| format!("{key}: garbled placement {text:?}"));
            }
            let nodes = self.live_nodes().await?;
            if nodes.len() < self.config.replicas {
                tracing::info!(
                    volume,
                    alive = nodes.len(),
                    "waiting for nodes to place the volume"
                );
                self.pause(Duration::from_millis(500)).await;
                if self.stopping() {
                    return Err("stopping".into());
                }
                continue;
            }
            let chosen = place(volume, &nodes, self.config.replicas);
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), encode_placement(&chosen), None)]);
            within(self.config.lease_ttl, client.txn(txn)).await?;
        }
    }

    /// Whether this node may lead `volume` (H1): named in `in_sync`, or none is.
    async fn eligible(&self, volume: &str) -> Result<bool, String> {
        let mut client = self.client.clone();
        let key = self.key(&format!("volumes/{volume}/in_sync"));
        let got = within(self.config.lease_ttl, client.get(key, None)).await?;
        Ok(match got.kvs().first() {
            None => true,
            Some(kv) => kv
                .value_str()
                .map(|v| v.split_whitespace().any(|n| n == self.config.node))
                .unwrap_or(false),
        })
    }

    async fn publish_in_sync(&self, volume: &str, nodes: &[String]) -> Result<(), String> {
        let mut client = self.client.clone();
        let key = self.key(&format!("volumes/{volume}/in_sync"));
        within(
            self.config.lease_ttl,
            client.put(key, nodes.join(" "), None),
        )
        .await
        .map(|_| ())
    }

    async fn volume_task(self: Arc<Self>, volume: String) {
        let placement = loop {
            match self.placement(&volume).await {
                Ok(p) => break p,
                Err(e) => {
                    if self.stopping() {
                        return;
                    }
                    tracing::warn!(volume, error = %e, "etcd: no placement yet");
                    self.pause(Duration::from_secs(1)).await;
                }
            }
        };
        if !placement.iter().any(|p| p.node == self.config.node) {
            tracing::info!(volume, ?placement, "the volume is placed on other nodes");
            return;
        }
        tracing::info!(volume, ?placement, "placed here");
        let election = self.key(&format!("volumes/{volume}/election"));
        let mut lease_rx = self.lease_id.clone();
        let mut client = self.client.clone();
        while !self.stopping() {
            let lease = *lease_rx.borrow_and_update();
            if lease == 0 || !self.lease.holds() {
                tokio::select! {
                    _ = lease_rx.changed() => {}
                    _ = self.stop.notified() => return,
                }
                continue;
            }
            match self.eligible(&volume).await {
                Ok(true) => {}
                Ok(false) => {
                    self.pause(Duration::from_millis(500)).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(volume, error = %e, "etcd: reading in_sync");
                    self.pause(Duration::from_millis(300)).await;
                    continue;
                }
            }
            let won = tokio::select! {
                r = client.campaign(election.clone(), self.config.node.clone(), lease) => r,
                _ = lease_rx.changed() => continue,
                _ = self.stop.notified() => return,
            };
            let leader = match won.map(|mut r| r.take_leader()) {
                Ok(Some(l)) => l,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(volume, error = %e, "etcd: campaign");
                    self.pause(Duration::from_millis(300)).await;
                    continue;
                }
            };
            let resign = |leader: etcd_client::LeaderKey| {
                let mut client = self.client.clone();
                async move {
                    let options = etcd_client::ResignOptions::new().with_leader(leader);
                    let _ =
                        tokio::time::timeout(Duration::from_secs(1), client.resign(Some(options)))
                            .await;
                }
            };
            if !matches!(self.eligible(&volume).await, Ok(true)) {
                resign(leader).await;
                self.pause(Duration::from_millis(500)).await;
                continue;
            }
            let epoch = leader.rev() as u64;
            // H2: this node alone holds every acknowledged write until its peers resync.
            if let Err(e) = self
                .publish_in_sync(&volume, std::slice::from_ref(&self.config.node))
                .await
            {
                tracing::warn!(volume, error = %e, "etcd: publishing in_sync");
                resign(leader).await;
                continue;
            }
            let replication = self.replication_for(&volume, &placement, epoch);
            let node = Arc::clone(&self.node);
            let name = volume.clone();
            let led = tokio::task::spawn_blocking(move || node.lead(&name, replication)).await;
            match led {
                Ok(Ok(())) => tracing::info!(volume, epoch, "leading"),
                Ok(Err(e)) => {
                    tracing::warn!(volume, error = %e, "cannot lead");
                    resign(leader).await;
                    self.pause(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(volume, error = %e, "cannot lead");
                    resign(leader).await;
                    continue;
                }
            }
            // Lead while the lease holds (H3).
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    _ = lease_rx.changed() => {}
                    _ = self.stop.notified() => {}
                }
                if self.stopping() || !self.lease.holds() || *lease_rx.borrow() != lease {
                    break;
                }
            }
            tracing::warn!(volume, epoch, stopping = self.stopping(), "stepping down");
            let node = Arc::clone(&self.node);
            let name = volume.clone();
            let _ = tokio::task::spawn_blocking(move || node.step_down(&name)).await;
            if self.stopping() {
                resign(leader).await;
                return;
            }
        }
    }

    /// The replication of `volume` led here with `epoch`.
    fn replication_for(
        self: &Arc<Self>,
        volume: &str,
        placement: &[Placed],
        epoch: u64,
    ) -> ReplicationConfig {
        let peers: Vec<&Placed> = placement
            .iter()
            .filter(|p| p.node != self.config.node)
            .collect();
        let names: Vec<(String, String)> = peers
            .iter()
            .map(|p| (p.addr.clone(), p.node.clone()))
            .collect();
        let ctx = Arc::clone(self);
        let volume = volume.to_string();
        let publish = move |addrs: &[String]| -> std::io::Result<()> {
            let mut nodes = vec![ctx.config.node.clone()];
            nodes.extend(
                addrs
                    .iter()
                    .filter_map(|a| names.iter().find(|(x, _)| x == a).map(|(_, n)| n.clone())),
            );
            ctx.handle
                .block_on(ctx.publish_in_sync(&volume, &nodes))
                .map_err(std::io::Error::other)
        };
        ReplicationConfig {
            peers: peers.iter().map(|p| p.addr.clone()).collect(),
            epoch,
            lease: Some(self.lease.clone()),
            publish_in_sync: Some(InSyncPublisher(Arc::new(publish))),
            ..self.config.template.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(n: &str, d: &str) -> Placed {
        Placed {
            node: n.into(),
            domain: d.into(),
            addr: format!("{n}:1"),
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

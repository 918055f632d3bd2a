//! The etcd side of [`super::ha`] (cargo feature `etcd`): a [`Coordinator`] thread with
//! an async runtime that holds the node's lease, places volumes, campaigns for them and
//! hands the ones it wins to the node ([`Leadership`]). The rules it keeps (H1–H4) are
//! in [`super::ha`].

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use tokio::sync::{watch, Notify};

use super::ha::{decode_placement, encode_placement, place, HaConfig, Leadership, Placed};
use super::{InSyncPublisher, LeaseWatch, ReplicationConfig};
use crate::error::VolumeError;

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
            let replicas = self.config.replicas_of(volume);
            if nodes.len() < replicas {
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
            let chosen = place(volume, &nodes, replicas);
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), encode_placement(&chosen), None)]);
            within(self.config.lease_ttl, client.txn(txn)).await?;
        }
    }

    /// `volume`'s `in_sync` value (`None`: never written, or deleted).
    async fn read_in_sync(&self, volume: &str) -> Result<Option<String>, String> {
        Ok(self.read_in_sync_at(volume).await?.0)
    }

    /// `volume`'s `in_sync` value and the revision it was last written at (0 when
    /// absent: what etcd compares a missing key's with).
    async fn read_in_sync_at(&self, volume: &str) -> Result<(Option<String>, i64), String> {
        let mut client = self.client.clone();
        let key = self.key(&format!("volumes/{volume}/in_sync"));
        let got = within(self.config.lease_ttl, client.get(key, None)).await?;
        Ok(match got.kvs().first() {
            Some(kv) => (
                Some(kv.value_str().unwrap_or_default().to_string()),
                kv.mod_revision(),
            ),
            None => (None, 0),
        })
    }

    /// Sets `in_sync` to `value` (`None` deletes it) only if it was last written at
    /// `revision` (H2): nobody else — an operator — changed it since. Returns the
    /// revision of the change, or `None` if it was not made.
    async fn swap_in_sync(
        &self,
        volume: &str,
        revision: i64,
        value: Option<String>,
    ) -> Result<Option<i64>, String> {
        let mut client = self.client.clone();
        let key = self.key(&format!("volumes/{volume}/in_sync"));
        let change = match value {
            Some(v) => TxnOp::put(key.clone(), v, None),
            None => TxnOp::delete(key.clone(), None),
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, revision)])
            .and_then([change]);
        let done = within(self.config.lease_ttl, client.txn(txn)).await?;
        if !done.succeeded() {
            return Ok(None);
        }
        let header = done
            .header()
            .ok_or("etcd answered a transaction without a header")?;
        Ok(Some(header.revision()))
    }

    /// Whether this node may lead `volume` (H1): named in `in_sync`, or none is.
    async fn eligible(&self, volume: &str) -> Result<bool, String> {
        Ok(match self.read_in_sync(volume).await? {
            None => true,
            Some(v) => v.split_whitespace().any(|n| n == self.config.node),
        })
    }

    /// Puts back the `in_sync` a failed takeover replaced with this node alone (H2), so
    /// the nodes it named may lead; `None` deletes it. Only if it still holds what the
    /// takeover wrote at `revision`: an operator's delete meanwhile stands.
    async fn restore_in_sync(&self, volume: &str, revision: i64, previous: Option<String>) {
        match self.swap_in_sync(volume, revision, previous).await {
            Ok(Some(_)) => {}
            Ok(None) => tracing::warn!(volume, "in_sync changed during the takeover; left as is"),
            Err(e) => tracing::warn!(volume, error = %e, "etcd: putting in_sync back"),
        }
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
            // Read again under leadership (H1); kept to be put back if the takeover fails.
            let (previous, read_at) = match self.read_in_sync_at(&volume).await {
                Ok((p, at))
                    if p.as_deref()
                        .is_none_or(|v| v.split_whitespace().any(|n| n == self.config.node)) =>
                {
                    (p, at)
                }
                _ => {
                    resign(leader).await;
                    self.pause(Duration::from_millis(500)).await;
                    continue;
                }
            };
            let epoch = leader.rev() as u64;
            // H2: this node alone holds every acknowledged write until its peers resync
            // — written only over what was read, so an operator's delete in between is
            // seen by the next campaign, not overwritten.
            let alone = Some(self.config.node.clone());
            let published_at = match self.swap_in_sync(&volume, read_at, alone).await {
                Ok(Some(at)) => at,
                Ok(None) => {
                    tracing::info!(volume, "in_sync changed since it was read; again");
                    resign(leader).await;
                    self.pause(Duration::from_millis(300)).await;
                    continue;
                }
                Err(e) => {
                    // The write may have been made (a timeout): if in_sync names this
                    // node alone at a newer revision, it is put back as it was read.
                    tracing::warn!(volume, error = %e, "etcd: publishing in_sync");
                    if let Ok((Some(now), at)) = self.read_in_sync_at(&volume).await {
                        if now == self.config.node && at != read_at {
                            self.restore_in_sync(&volume, at, previous).await;
                        }
                    }
                    resign(leader).await;
                    self.pause(Duration::from_millis(300)).await;
                    continue;
                }
            };
            let replication = self.replication_for(&volume, &placement, epoch);
            let node = Arc::clone(&self.node);
            let name = volume.clone();
            let succeeding = previous.is_some();
            let led =
                tokio::task::spawn_blocking(move || node.lead(&name, replication, succeeding))
                    .await;
            match led {
                Ok(Ok(())) => tracing::info!(volume, epoch, "leading"),
                Ok(Err(e)) => {
                    // Liveness: the nodes named before may lead instead (this one, too,
                    // if it was named: it retries after a pause).
                    tracing::warn!(volume, error = %e, "cannot lead");
                    self.restore_in_sync(&volume, published_at, previous).await;
                    resign(leader).await;
                    self.pause(Duration::from_secs(1)).await;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(volume, error = %e, "cannot lead");
                    self.restore_in_sync(&volume, published_at, previous).await;
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
        let replicas = self.config.replicas_of(volume);
        if placement.len() != replicas {
            tracing::warn!(
                volume,
                placed = placement.len(),
                replicas,
                "the stored placement has another number of copies than this node's \
                 settings (placement is fixed once made): it counts"
            );
        }
        let peers: Vec<&Placed> = placement
            .iter()
            .filter(|p| p.node != self.config.node)
            .collect();
        let names: Vec<(String, String)> = peers
            .iter()
            .map(|p| (p.addr.clone(), p.node.clone()))
            .collect();
        let template = self.config.template_of(volume);
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
            ..template
        }
    }
}

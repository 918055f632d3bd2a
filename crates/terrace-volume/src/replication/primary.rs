//! The primary's side of replication: [`ReplicatedStore`] is the [`LogStore`] a
//! replicated volume's write log writes through. Every write goes to the local store
//! and is streamed, in order, to each secondary ([`super::replica`]) at the same offset;
//! `sync` makes the local store durable and then waits for the secondaries the volume's
//! ack level asks for. The log above it does not know: group commit, records and
//! recovery are the log's, and a secondary's copy is a log a node can open.
//!
//! Below the volume this is DRBD's design applied to the write log: a secondary that
//! drops out is tracked in a per-peer *dirty bitmap* of the log's 4 KiB extents, and
//! when it returns only those extents are sent (resync). A secondary whose copy follows
//! another stream (a failover, this primary restarted, its copy was lost) has its copy
//! compared with the local log by digest ([`super::digest`]) and gets the extents that
//! differ.
//!
//! # Invariants
//! - P1 (order): a write reaches the local store before it is queued for any peer, and
//!   queueing happens under `Shared`'s lock, as does a resync's read of the local store;
//!   so a resync read of an extent either sees a write or precedes it in the peer's
//!   queue — a peer never ends up with an extent older than the local one.
//! - P2 (nothing forgotten): every byte range written since a peer's last ack is either
//!   in its `unacked` list (queued or sent, not acknowledged) or marked in its bitmap.
//!   When a connection ends, its `unacked` ranges are marked. Bits are cleared only
//!   when their extents are queued for the peer (and so enter `unacked`), or by a
//!   comparison (P7).
//! - P3 (acks): `sync` returns only when the local store is durable and, of the peers
//!   in sync, `need` have acknowledged a SYNC queued after every write before the call
//!   — `need = max(min(level, in-sync peers), min_replicas - 1)`. The SYNC is queued
//!   before the local store syncs, so a disk log's flush and the round trip (with the
//!   peer's flush) overlap, as DRBD's protocol C does. While fewer than
//!   `min_replicas` copies are in sync the volume takes no new writes (`accepts_writes`)
//!   and `sync` waits for a peer to come back.
//! - P4: a peer is *in sync* only after a resync's end is acknowledged (the copy is whole
//!   and durable there) and until its connection ends. A peer that does not ack within
//!   `peer_timeout` while a sync waits is cut off (its ranges marked, P2).
//! - P5 (fencing): a secondary that has seen a newer epoch fences this primary: every
//!   later `sync` fails, so the log refuses every later acknowledgement. Under a
//!   coordinator, so does a lease that ran out (checked last, before `sync` returns).
//! - P6 (published set): under a coordinator, `sync` returns only once the set it
//!   waited for — every peer in sync with ack `all`, the designated peers (P8) with a
//!   lower level — equals the set last published through `publish_in_sync`, and only
//!   after each of them acknowledged it. A peer cut off is unpublished before any
//!   acknowledgement goes without it, a peer added is published only once it holds every
//!   write so far; so every node in the published set holds every acknowledged write.
//! - P7 (comparison): a copy that follows another stream starts with every bit set. A
//!   comparison round clears a range's bits under the lock *before* reading the range
//!   locally, and marks again each unit whose hash differs from the copy's; the peer
//!   stays down meanwhile, so a write to the range after the clear marks it again, and
//!   one before it is in what was read (a write reaches the local store before its
//!   bits are marked, P1). The copy's hashes stay true until the resync: nothing but
//!   this connection's frames changes it from its welcome on (R2) and a DIGEST changes
//!   nothing (R6), and the copy syncs before it records this stream (R6), so what was
//!   found equal is durable before the bitmap stops marking it. So a bit left clear is
//!   an extent the copy holds as the local log does. A failed comparison sets every bit
//!   again.
//! - P8 (designated peers): under a coordinator, ack `one` and `majority` wait for a
//!   fixed set of `need` peers in sync — kept while they stay in sync, filled first from
//!   those that acknowledged the sync at hand (PostgreSQL's `FIRST k`), not for whichever
//!   `need` answer first (`ANY k`, as without a coordinator): then the published set
//!   names exactly copies that hold every acknowledged write, and a failover needs no
//!   comparison of how far each copy got. The other peers are streamed to as usual.
//!
//! Lock order: the log's locks (commit, tail) → `publishing` (a sync under a
//! coordinator) → `Shared` (leaf; nothing else is taken under it but the local store's
//! reads).

use std::collections::VecDeque;
use std::io::{self, BufReader, BufWriter, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::digest;
use super::wire::{
    read_hashes, watch_for_vanished_peer, Ack, DigestRequest, FrameHeader, FrameKind, Hello,
    Verdict, Welcome, ACK_BYTES, FRAME_HEADER,
};
use super::{
    AckLevel, Health, LeaseWatch, LinkState, PeerStatus, ReplicationConfig, ReplicationStatus,
};
use crate::log::LogStore;

/// The bitmap's unit: bytes of the log store per bit.
pub const EXTENT: u64 = 4096;
/// The most extents one resync frame carries.
const RESYNC_RUN: u64 = 64;
/// A peer with more than this queued is cut off (it resyncs when it can keep up).
const MAX_QUEUED_BYTES: u64 = 256 << 20;
/// The most units one DIGEST asks by default (8 bytes of answer each: 512 KiB;
/// [`ReplicationConfig::digest_request_units`]) ...
pub const DIGEST_BATCH_UNITS: u64 = 1 << 16;
/// ... and the most log bytes it makes the copy hash (its read timeout allows for that
/// much at 32 MiB/s; the copy holds its copy's lock while it hashes).
const DIGEST_BATCH_BYTES: u64 = 1 << 30;
/// The sender asks for an ack after this many bytes without one, so `unacked` stays
/// short when nothing syncs (acknowledge-on-flush volumes).
const SYNC_EVERY_BYTES: u64 = 16 << 20;

/// Extents of the log store a peer may lack.
struct Bitmap {
    words: Vec<u64>,
    extents: u64,
    set: u64,
    cursor: u64,
}

impl Bitmap {
    fn new(store_size: u64) -> Bitmap {
        let extents = store_size.div_ceil(EXTENT);
        Bitmap {
            words: vec![0; extents.div_ceil(64) as usize],
            extents,
            set: 0,
            cursor: 0,
        }
    }

    fn mark(&mut self, offset: u64, len: u64) {
        if len == 0 {
            return;
        }
        let first = offset / EXTENT;
        let last = ((offset + len - 1) / EXTENT).min(self.extents - 1);
        for e in first..=last {
            let (w, b) = ((e / 64) as usize, e % 64);
            if self.words[w] & (1 << b) == 0 {
                self.words[w] |= 1 << b;
                self.set += 1;
            }
        }
    }

    /// Clears the extents inside `offset..offset + len` (extent-aligned).
    fn clear(&mut self, offset: u64, len: u64) {
        let first = offset / EXTENT;
        let end = (offset + len).div_ceil(EXTENT).min(self.extents);
        for e in first..end {
            let (w, b) = ((e / 64) as usize, e % 64);
            if self.words[w] & (1 << b) != 0 {
                self.words[w] &= !(1 << b);
                self.set -= 1;
            }
        }
    }

    fn mark_all(&mut self) {
        self.mark(0, self.extents * EXTENT);
    }

    /// Clears and returns the next run of set extents (at most `RESYNC_RUN`), from the
    /// cursor on, wrapping once.
    fn take_run(&mut self) -> Option<(u64, u64)> {
        if self.set == 0 {
            return None;
        }
        let mut e = self.cursor % self.extents;
        loop {
            let w = (e / 64) as usize;
            let bits = self.words[w] >> (e % 64);
            if bits == 0 {
                e = (w as u64 + 1) * 64;
                if e >= self.extents {
                    e = 0;
                }
                continue;
            }
            e += bits.trailing_zeros() as u64;
            break;
        }
        let start = e;
        let mut n = 0;
        while n < RESYNC_RUN
            && e < self.extents
            && self.words[(e / 64) as usize] & (1 << (e % 64)) != 0
        {
            self.words[(e / 64) as usize] &= !(1 << (e % 64));
            self.set -= 1;
            n += 1;
            e += 1;
        }
        self.cursor = e;
        Some((start, n))
    }
}

/// `ranges` (first unit, units) cut into requests of at most `per_batch` units each, in
/// order.
fn digest_batches(ranges: &[(u64, u64)], per_batch: u64) -> Vec<Vec<(u64, u64)>> {
    let mut batches: Vec<Vec<(u64, u64)>> = vec![Vec::new()];
    let mut in_batch = 0;
    for &(mut first, mut n) in ranges {
        while n > 0 {
            if in_batch == per_batch {
                batches.push(Vec::new());
                in_batch = 0;
            }
            let take = n.min(per_batch - in_batch);
            if let Some(batch) = batches.last_mut() {
                batch.push((first, take));
            }
            in_batch += take;
            first += take;
            n -= take;
        }
    }
    batches.retain(|b| !b.is_empty());
    batches
}

/// For each peer: the connection and SYNC a sync waits on, and since when.
type SyncTargets = Vec<Option<(u64, u64, Instant)>>;

/// A frame waiting for the peer's sender.
struct Outgoing {
    header: FrameHeader,
    data: Option<Arc<Vec<u8>>>,
}

struct Peer {
    addr: String,
    link: LinkState,
    /// Connection number; a thread acting for an older one changes nothing.
    conn: u64,
    socket: Option<TcpStream>,
    queue: VecDeque<Outgoing>,
    queued_bytes: u64,
    next_seq: u64,
    acked: u64,
    /// Byte ranges queued or sent on this connection and not yet acknowledged (P2),
    /// with the frame that carried them.
    unacked: VecDeque<(u64, u64, u64)>,
    unsynced_bytes: u64,
    dirty: Bitmap,
    resync_end: Option<u64>,
    resync_started: Option<Instant>,
    bytes_sent: u64,
    bytes_resynced: u64,
    resyncs: u64,
    /// Resyncs of a copy that followed another stream, compared by digest.
    compared_resyncs: u64,
    /// Bytes of digest requests and answers.
    digest_bytes: u64,
    last_error: Option<String>,
}

impl Peer {
    fn enqueue(
        &mut self,
        kind: FrameKind,
        epoch: u64,
        offset: u64,
        data: Option<Arc<Vec<u8>>>,
    ) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        let len = data.as_ref().map_or(0, |d| d.len() as u64);
        if len > 0 {
            self.unacked.push_back((seq, offset, len));
            self.queued_bytes += len;
        }
        self.queue.push_back(Outgoing {
            header: FrameHeader {
                kind,
                epoch,
                seq,
                offset,
                len: len as u32,
            },
            data,
        });
        seq
    }

    /// Ends the current connection: what it had not acknowledged is marked (P2).
    fn disconnect(&mut self, why: String) {
        for (_, offset, len) in self.unacked.drain(..) {
            self.dirty.mark(offset, len);
        }
        self.queue.clear();
        self.queued_bytes = 0;
        self.unsynced_bytes = 0;
        self.resync_end = None;
        self.link = LinkState::Down;
        if let Some(s) = self.socket.take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        self.last_error = Some(why);
        self.conn += 1;
    }
}

struct Shared {
    peers: Vec<Peer>,
    /// Until the volume has opened, syncs are local (recovery writes the superblock
    /// before any peer can be in sync; every peer starts with a comparison to make).
    opening: bool,
    fenced_by: Option<u64>,
    failed: Option<String>,
    health: Health,
    transitions: u64,
    /// The peers in sync as last published (`publish_in_sync`), by index.
    published: Vec<bool>,
    /// The peers syncs wait for under a coordinator with ack `one` or `majority` (P8).
    designated: Vec<bool>,
}

/// The replication of one volume's write log, shared by its store, the volume (state,
/// write gate) and one sender and one ack reader thread per peer.
pub struct Replication {
    volume: String,
    config: ReplicationConfig,
    stream: u64,
    local: Box<dyn LogStore>,
    shared: Mutex<Shared>,
    /// Senders wait here for frames.
    work: Condvar,
    /// Syncs wait here for acks and link changes.
    acks: Condvar,
    stop: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    syncs_waited: AtomicU64,
    /// Held by a sync under a coordinator from before it reads the peers' state until
    /// it returns, so publications (P6) happen one at a time, in the order of the
    /// states they publish: two syncs can run at once (a superblock's beside a group
    /// commit's), and an older set published last would name a peer cut off since.
    publishing: Mutex<()>,
}

fn new_stream() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mixed = (nanos ^ ((std::process::id() as u64) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    // Neither 0 ("no stream") nor the lost or led streams (`replica::LOST_STREAM`,
    // `replica::LED_STREAM`).
    mixed.clamp(1, super::replica::LED_STREAM - 1)
}

impl Replication {
    /// Starts replicating `local` (the volume's own log store) to `config.peers`.
    pub fn start(
        volume: &str,
        config: ReplicationConfig,
        local: Box<dyn LogStore>,
    ) -> Result<Arc<Replication>, crate::error::VolumeError> {
        config.check()?;
        let size = local.size();
        let peers = config
            .peers
            .iter()
            .map(|addr| {
                let mut dirty = Bitmap::new(size);
                dirty.mark_all();
                Peer {
                    addr: addr.clone(),
                    link: LinkState::Down,
                    conn: 0,
                    socket: None,
                    queue: VecDeque::new(),
                    queued_bytes: 0,
                    next_seq: 1,
                    acked: 0,
                    unacked: VecDeque::new(),
                    unsynced_bytes: 0,
                    dirty,
                    resync_end: None,
                    resync_started: None,
                    bytes_sent: 0,
                    bytes_resynced: 0,
                    resyncs: 0,
                    compared_resyncs: 0,
                    digest_bytes: 0,
                    last_error: None,
                }
            })
            .collect();
        let replication = Arc::new(Replication {
            volume: volume.to_string(),
            stream: new_stream(),
            local,
            shared: Mutex::new(Shared {
                peers,
                opening: true,
                fenced_by: None,
                failed: None,
                health: Health::Healthy,
                transitions: 0,
                published: vec![false; config.peers.len()],
                designated: vec![false; config.peers.len()],
            }),
            work: Condvar::new(),
            acks: Condvar::new(),
            stop: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            syncs_waited: AtomicU64::new(0),
            publishing: Mutex::new(()),
            config,
        });
        {
            let mut s = replication.shared.lock();
            replication.publish(&mut s, "replication started".into());
        }
        for index in 0..replication.config.peers.len() {
            let r = Arc::clone(&replication);
            let t = std::thread::Builder::new()
                .name(format!("replicate-{index}"))
                .spawn(move || r.run_peer(index))
                .map_err(|e| {
                    crate::error::VolumeError::Config(format!("spawning a replication thread: {e}"))
                })?;
            replication.threads.lock().push(t);
        }
        Ok(replication)
    }

    /// The volume has opened: syncs wait for peers from now on.
    pub fn opened(&self) {
        self.shared.lock().opening = false;
    }

    /// Whether the volume may take writes now: healthy or degraded, and its lease (if
    /// it has one) holding.
    pub fn accepts_writes(&self) -> bool {
        self.lease_holds()
            && matches!(
                self.shared.lock().health,
                Health::Healthy | Health::Degraded
            )
    }

    /// Whether the lease this primary holds the volume by (if any) still holds.
    pub fn lease_holds(&self) -> bool {
        self.config.lease.as_ref().is_none_or(LeaseWatch::holds)
    }

    pub fn health(&self) -> Health {
        self.shared.lock().health
    }

    pub fn status(&self) -> ReplicationStatus {
        let s = self.shared.lock();
        // A primary whose lease ran out takes no write, whatever its links.
        let health = match s.health {
            Health::Healthy | Health::Degraded if !self.lease_holds() => Health::ReadOnly,
            h => h,
        };
        ReplicationStatus {
            health,
            epoch: self.config.epoch,
            ack: self.config.ack,
            replicas: self.config.peers.len() + 1,
            min_replicas: self.config.min_replicas,
            in_sync: 1 + s
                .peers
                .iter()
                .filter(|p| p.link == LinkState::InSync)
                .count(),
            transitions: s.transitions,
            syncs_waited: self.syncs_waited.load(Ordering::Relaxed),
            fenced_by: s.fenced_by,
            peers: s
                .peers
                .iter()
                .map(|p| PeerStatus {
                    addr: p.addr.clone(),
                    link: p.link,
                    dirty_bytes: p.dirty.set * EXTENT,
                    queued_bytes: p.queued_bytes,
                    bytes_sent: p.bytes_sent,
                    bytes_resynced: p.bytes_resynced,
                    resyncs: p.resyncs,
                    compared_resyncs: p.compared_resyncs,
                    digest_bytes: p.digest_bytes,
                    last_error: p.last_error.clone(),
                })
                .collect(),
        }
    }

    /// Works out the health, logging a change with its cause (`why`).
    fn publish(&self, s: &mut Shared, why: String) {
        let in_sync = 1 + s
            .peers
            .iter()
            .filter(|p| p.link == LinkState::InSync)
            .count();
        let health = if s.failed.is_some() {
            Health::Error
        } else if s.fenced_by.is_some() || in_sync < self.config.min_replicas {
            Health::ReadOnly
        } else if in_sync < s.peers.len() + 1 {
            Health::Degraded
        } else {
            Health::Healthy
        };
        if health != s.health || s.transitions == 0 {
            let from = (s.transitions > 0).then_some(s.health);
            s.health = health;
            s.transitions += 1;
            if matches!(health, Health::Healthy | Health::Degraded) {
                tracing::info!(volume = %self.volume, ?from, to = ?health, in_sync, cause = %why, "replication state");
            } else {
                tracing::warn!(volume = %self.volume, ?from, to = ?health, in_sync, cause = %why, "replication state");
            }
        }
        self.acks.notify_all();
    }

    /// Stops the peers' threads and ends their connections.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        {
            let mut s = self.shared.lock();
            for p in &mut s.peers {
                if let Some(sock) = &p.socket {
                    let _ = sock.shutdown(std::net::Shutdown::Both);
                }
            }
            self.work.notify_all();
            self.acks.notify_all();
        }
        let threads: Vec<_> = self.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
    }

    fn cut_off(&self, s: &mut Shared, index: usize, conn: u64, why: String) {
        let p = &mut s.peers[index];
        if p.conn != conn || p.link == LinkState::Down {
            return;
        }
        tracing::warn!(volume = %self.volume, peer = %p.addr, cause = %why, "replica link down");
        let addr = p.addr.clone();
        p.disconnect(why.clone());
        self.publish(s, format!("{addr}: {why}"));
        self.work.notify_all();
    }

    /// The sender thread of peer `index`: connect, resync, stream; again on failure.
    fn run_peer(self: Arc<Self>, index: usize) {
        let retry = self.config.reconnect;
        while !self.stop.load(Ordering::Acquire) {
            match self.connect(index) {
                Ok(Some((conn, socket, reader))) => {
                    if let Err(e) = self.stream_to(index, conn, socket, reader) {
                        let mut s = self.shared.lock();
                        self.cut_off(&mut s, index, conn, e.to_string());
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    let mut s = self.shared.lock();
                    s.peers[index].last_error = Some(e.to_string());
                }
            }
            if self.shared.lock().fenced_by.is_some() {
                return;
            }
            let until = Instant::now() + retry;
            while !self.stop.load(Ordering::Acquire) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20).min(retry));
            }
        }
    }

    /// Connects and greets peer `index`; on success it is resyncing, and this returns
    /// its connection number, the socket and the reader that read the welcome (and any
    /// digests): what it may have buffered beyond them is the peer's, for `read_acks`.
    #[allow(clippy::type_complexity)]
    fn connect(&self, index: usize) -> io::Result<Option<(u64, TcpStream, BufReader<TcpStream>)>> {
        let addr = self.config.peers[index].clone();
        let target = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::other(format!("{addr} resolves to nothing")))?;
        let socket = TcpStream::connect_timeout(&target, self.config.peer_timeout)?;
        socket.set_nodelay(true)?;
        watch_for_vanished_peer(&socket, self.config.peer_timeout)?;
        socket.set_read_timeout(Some(self.config.peer_timeout))?;
        let mut w = BufWriter::new(socket.try_clone()?);
        Hello {
            epoch: self.config.epoch,
            stream: self.stream,
            store_size: self.local.size(),
            volume: self.volume.clone(),
        }
        .write_to(&mut w)?;
        w.flush()?;
        let mut reader = BufReader::new(socket.try_clone()?);
        let welcome = Welcome::read_from(&mut reader)?;
        match welcome.verdict {
            Verdict::Proceed => {}
            Verdict::Fenced => {
                let mut s = self.shared.lock();
                s.fenced_by = Some(welcome.epoch);
                let why = format!("{addr} has epoch {}: {}", welcome.epoch, welcome.message);
                self.publish(&mut s, format!("fenced: {why}"));
                return Ok(None);
            }
            Verdict::Refused => {
                return Err(io::Error::other(format!(
                    "{addr} refused: {}",
                    welcome.message
                )));
            }
        }
        let epoch = self.config.epoch;
        let stream = self.stream;
        // Its copy follows another primary (or none): the bitmap means nothing, and a
        // comparison finds what differs (P7).
        let compared = if welcome.stream != stream {
            // Where `stop` can end it: a comparison may take a while.
            self.shared.lock().peers[index].socket = Some(socket.try_clone()?);
            Some(self.compare_copy(index, &mut w, &mut reader)?)
        } else {
            None
        };
        socket.set_read_timeout(None)?;
        let mut s = self.shared.lock();
        if self.stop.load(Ordering::Acquire) {
            return Ok(None);
        }
        let p = &mut s.peers[index];
        p.conn += 1;
        p.link = LinkState::Resyncing;
        p.socket = Some(socket.try_clone()?);
        p.queue.clear();
        p.queued_bytes = 0;
        p.next_seq = 1;
        p.acked = 0;
        p.unacked.clear();
        p.unsynced_bytes = 0;
        p.resync_end = None;
        p.resync_started = Some(Instant::now());
        p.resyncs += 1;
        if let Some(digest_bytes) = compared {
            p.compared_resyncs += 1;
            p.digest_bytes += digest_bytes;
        }
        p.enqueue(FrameKind::ResyncBegin, epoch, 0, None);
        let conn = p.conn;
        tracing::info!(
            volume = %self.volume, peer = %addr, dirty_bytes = p.dirty.set * EXTENT,
            compared = compared.is_some(), "replica connected, resyncing"
        );
        self.publish(&mut s, format!("{addr} connected"));
        self.work.notify_all();
        Ok(Some((conn, socket, reader)))
    }

    /// Compares peer `index`'s copy, which followed another stream, with the local
    /// store (P7); returns the bytes the digests took. Its bitmap is all set first and
    /// keeps only the extents found to differ, or written meanwhile. The peer is down
    /// throughout: every write marks its bitmap.
    fn compare_copy(
        &self,
        index: usize,
        w: &mut BufWriter<TcpStream>,
        r: &mut BufReader<TcpStream>,
    ) -> io::Result<u64> {
        self.shared.lock().peers[index].dirty.mark_all();
        let result = self.compare_rounds(index, w, r);
        if result.is_err() {
            // What was cleared held for this copy as it was; the next connection may
            // find it changed (another primary's stream): nothing is known.
            let mut s = self.shared.lock();
            s.peers[index].dirty.mark_all();
            s.peers[index].socket = None;
        }
        result
    }

    fn compare_rounds(
        &self,
        index: usize,
        w: &mut BufWriter<TcpStream>,
        r: &mut BufReader<TcpStream>,
    ) -> io::Result<u64> {
        let size = self.local.size();
        let chunks = size.div_ceil(digest::CHUNK);
        let mut bytes = 0;
        let (differing, sent) = self.compare_round(index, w, r, digest::CHUNK, &[(0, chunks)])?;
        bytes += sent;
        let extents_per_chunk = digest::CHUNK / EXTENT;
        let extents = size.div_ceil(EXTENT);
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for chunk in differing {
            let first = chunk * extents_per_chunk;
            let n = extents_per_chunk.min(extents - first);
            match ranges.last_mut() {
                Some((f, m)) if *f + *m == first => *m += n,
                _ => ranges.push((first, n)),
            }
        }
        if !ranges.is_empty() {
            bytes += self.compare_round(index, w, r, EXTENT, &ranges)?.1;
        }
        Ok(bytes)
    }

    /// One round of [`compare_copy`](Self::compare_copy) over `unit`-byte units in
    /// `ranges` (first unit, units), in requests of at most
    /// [`ReplicationConfig::digest_request_units`] units and [`DIGEST_BATCH_BYTES`] of
    /// log each: the copy answers a request once it has
    /// hashed it all, so each has its own read timeout. For each answer, range by range:
    /// clears the range's bits, reads it locally, marks again each unit whose hash
    /// differs (P7). Returns the units that differed and the bytes the round took.
    fn compare_round(
        &self,
        index: usize,
        w: &mut BufWriter<TcpStream>,
        r: &mut BufReader<TcpStream>,
        unit: u64,
        ranges: &[(u64, u64)],
    ) -> io::Result<(Vec<u64>, u64)> {
        let per_batch = self
            .config
            .digest_request_units
            .min(DIGEST_BATCH_BYTES / unit)
            .max(1);
        let mut differing = Vec::new();
        let mut bytes = 0;
        for batch in digest_batches(ranges, per_batch) {
            if self.stop.load(Ordering::Acquire) {
                return Err(io::Error::other("replication is stopping"));
            }
            bytes += self.compare_batch(index, w, r, unit, &batch, &mut differing)?;
        }
        Ok((differing, bytes))
    }

    /// One DIGEST request of [`compare_round`](Self::compare_round) and the comparison
    /// of its answer; adds the units that differ to `differing`, returns the bytes.
    fn compare_batch(
        &self,
        index: usize,
        w: &mut BufWriter<TcpStream>,
        r: &mut BufReader<TcpStream>,
        unit: u64,
        ranges: &[(u64, u64)],
        differing: &mut Vec<u64>,
    ) -> io::Result<u64> {
        let size = self.local.size();
        let asked: u64 = ranges.iter().map(|&(_, n)| n).sum();
        // The copy reads and hashes all of it before it answers: 32 MiB/s at the least.
        let hashing = Duration::from_secs((asked * unit).min(size) / (32 << 20));
        r.get_ref()
            .set_read_timeout(Some(self.config.peer_timeout + hashing))?;
        let request = DigestRequest {
            unit: unit as u32,
            ranges: ranges.to_vec(),
        }
        .encode();
        let header = FrameHeader {
            kind: FrameKind::Digest,
            epoch: self.config.epoch,
            seq: 0,
            offset: 0,
            len: request.len() as u32,
        };
        w.write_all(&header.encode())?;
        w.write_all(&request)?;
        w.flush()?;
        let hashes = match Ack::read_from(r)? {
            Ack::Digest { count } if count == asked => read_hashes(r, count)?,
            Ack::Digest { count } => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{count} hashes for {asked} units"),
                ))
            }
            Ack::Fenced { epoch } => {
                let mut s = self.shared.lock();
                s.fenced_by = Some(epoch);
                let addr = s.peers[index].addr.clone();
                self.publish(&mut s, format!("fenced: {addr} has epoch {epoch}"));
                return Err(fenced(epoch));
            }
            other => return Err(io::Error::other(format!("{other:?} answering a digest"))),
        };
        let mut theirs = hashes.iter();
        let mut buf = Vec::new();
        // Read a chunk's worth of units at a time (one unit when units are chunks).
        let per_read = (digest::CHUNK / unit).max(1);
        let spans = ranges.iter().flat_map(|&(first, n)| {
            (first..first + n)
                .step_by(per_read as usize)
                .map(move |f| (f, per_read.min(first + n - f)))
        });
        for (first, n) in spans {
            let start = first * unit;
            let len = (n * unit).min(size - start);
            // P7: cleared before the read, so a write from now on marks again.
            self.shared.lock().peers[index].dirty.clear(start, len);
            buf.resize(len as usize, 0);
            self.local.read_at(start, &mut buf)?;
            let mut marks = Vec::new();
            for (i, bytes) in buf.chunks(unit as usize).enumerate() {
                let ours = digest::hash_unit(bytes, self.stream);
                if theirs.next() != Some(&ours) {
                    differing.push(first + i as u64);
                    marks.push(start + i as u64 * unit);
                }
            }
            if !marks.is_empty() {
                let mut s = self.shared.lock();
                for offset in marks {
                    s.peers[index].dirty.mark(offset, unit);
                }
            }
        }
        Ok((FRAME_HEADER + request.len() + ACK_BYTES + 8 * hashes.len()) as u64)
    }

    /// Sends peer `index`'s frames and resync runs until the connection ends.
    fn stream_to(
        self: &Arc<Self>,
        index: usize,
        conn: u64,
        socket: TcpStream,
        acks: BufReader<TcpStream>,
    ) -> io::Result<()> {
        let reader = {
            let r = Arc::clone(self);
            std::thread::Builder::new()
                .name(format!("replica-acks-{index}"))
                .spawn(move || r.read_acks(index, conn, acks))?
        };
        let mut w = BufWriter::with_capacity(256 << 10, socket);
        let result = self.send_loop(index, conn, &mut w);
        if let Ok(sock) = w.get_ref().try_clone() {
            let _ = sock.shutdown(std::net::Shutdown::Both);
        }
        let _ = reader.join();
        result
    }

    fn send_loop(&self, index: usize, conn: u64, w: &mut BufWriter<TcpStream>) -> io::Result<()> {
        let epoch = self.config.epoch;
        let mut batch: Vec<Outgoing> = Vec::new();
        loop {
            {
                let mut s = self.shared.lock();
                loop {
                    if self.stop.load(Ordering::Acquire) {
                        return Ok(());
                    }
                    let p = &s.peers[index];
                    if p.conn != conn {
                        return Ok(());
                    }
                    let resync_step = p.link == LinkState::Resyncing && p.resync_end.is_none();
                    if !p.queue.is_empty() || resync_step {
                        break;
                    }
                    self.work.wait(&mut s);
                }
                let p = &mut s.peers[index];
                if p.link == LinkState::Resyncing && p.resync_end.is_none() {
                    match p.dirty.take_run() {
                        Some((first, n)) => {
                            // P1: read under the lock, queued before any later write.
                            let offset = first * EXTENT;
                            let len = (n * EXTENT).min(self.local.size() - offset);
                            let mut data = vec![0u8; len as usize];
                            if let Err(e) = self.local.read_at(offset, &mut data) {
                                p.dirty.mark(offset, len);
                                return Err(io::Error::other(format!(
                                    "reading the local log for a resync: {e}"
                                )));
                            }
                            p.bytes_resynced += len;
                            p.enqueue(FrameKind::Write, epoch, offset, Some(Arc::new(data)));
                        }
                        None => {
                            let seq = p.enqueue(FrameKind::ResyncEnd, epoch, 0, None);
                            p.resync_end = Some(seq);
                        }
                    }
                }
                let mut bytes = 0;
                while let Some(o) = p.queue.pop_front() {
                    bytes += o.header.len as u64;
                    batch.push(o);
                    if bytes >= 1 << 20 {
                        break;
                    }
                }
                p.queued_bytes -= bytes;
                p.bytes_sent += bytes;
                p.unsynced_bytes += bytes;
                if p.unsynced_bytes >= SYNC_EVERY_BYTES {
                    p.unsynced_bytes = 0;
                    let seq = p.next_seq;
                    p.next_seq += 1;
                    batch.push(Outgoing {
                        header: FrameHeader {
                            kind: FrameKind::Sync,
                            epoch,
                            seq,
                            offset: 0,
                            len: 0,
                        },
                        data: None,
                    });
                }
            }
            for o in batch.drain(..) {
                w.write_all(&o.header.encode())?;
                if let Some(d) = &o.data {
                    w.write_all(d)?;
                }
            }
            w.flush()?;
        }
    }

    fn read_acks(&self, index: usize, conn: u64, mut r: BufReader<TcpStream>) {
        loop {
            let ack = Ack::read_from(&mut r);
            let mut s = self.shared.lock();
            // Our own stop ends the connection: nothing to report.
            if s.peers[index].conn != conn || self.stop.load(Ordering::Acquire) {
                return;
            }
            match ack {
                Ok(Ack::Synced { seq }) => {
                    let p = &mut s.peers[index];
                    p.acked = p.acked.max(seq);
                    while p.unacked.front().is_some_and(|&(f, _, _)| f <= seq) {
                        p.unacked.pop_front();
                    }
                    if p.link == LinkState::Resyncing && p.resync_end.is_some_and(|e| e <= seq) {
                        p.link = LinkState::InSync;
                        let took = p.resync_started.map(|t| t.elapsed());
                        let addr = p.addr.clone();
                        tracing::info!(
                            volume = %self.volume, peer = %addr, ?took,
                            resynced_bytes = p.bytes_resynced, "replica in sync"
                        );
                        self.publish(&mut s, format!("{addr} resynced"));
                    }
                    self.acks.notify_all();
                }
                Ok(Ack::Fenced { epoch }) => {
                    s.fenced_by = Some(epoch);
                    let addr = s.peers[index].addr.clone();
                    self.cut_off(&mut s, index, conn, format!("fenced by epoch {epoch}"));
                    self.publish(&mut s, format!("fenced: {addr} has epoch {epoch}"));
                    return;
                }
                Ok(Ack::Digest { .. }) => {
                    let why = "a digest answer nothing asked".to_string();
                    self.cut_off(&mut s, index, conn, why);
                    return;
                }
                Err(e) => {
                    let why = if e.kind() == io::ErrorKind::UnexpectedEof {
                        "the replica closed the connection".to_string()
                    } else {
                        format!("reading acks: {e}")
                    };
                    self.cut_off(&mut s, index, conn, why);
                    return;
                }
            }
        }
    }

    /// After a local write of `parts` (joined) at `offset`: queue it for every
    /// connected peer, mark it for the others (P1, P2). The copy is made under the lock,
    /// once, when some peer is connected.
    fn replicate(&self, offset: u64, parts: &[&[u8]]) {
        let epoch = self.config.epoch;
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let mut s = self.shared.lock();
        let mut data: Option<Arc<Vec<u8>>> = None;
        let mut congested = Vec::new();
        for (i, p) in s.peers.iter_mut().enumerate() {
            if p.link == LinkState::Down {
                p.dirty.mark(offset, len);
                continue;
            }
            let d = data.get_or_insert_with(|| Arc::new(parts.concat()));
            p.enqueue(FrameKind::Write, epoch, offset, Some(Arc::clone(d)));
            if p.queued_bytes > MAX_QUEUED_BYTES {
                congested.push((i, p.conn));
            }
        }
        for (i, conn) in congested {
            self.cut_off(
                &mut s,
                i,
                conn,
                format!("over {MAX_QUEUED_BYTES} bytes queued"),
            );
        }
        self.work.notify_all();
    }

    /// Whether a sync waits for no peer: while the volume opens, or with ack `local`
    /// and no copy but this one required.
    fn sync_is_local(&self, s: &Shared) -> bool {
        s.opening || (self.config.ack == AckLevel::Local && self.config.min_replicas <= 1)
    }

    /// Queues a SYNC for each connected peer not yet asked on its current connection.
    fn ask_peers(&self, s: &mut Shared, targets: &mut SyncTargets) {
        let epoch = self.config.epoch;
        let mut asked = false;
        for (i, p) in s.peers.iter_mut().enumerate() {
            let current = targets[i].is_some_and(|(conn, _, _)| conn == p.conn);
            if p.link != LinkState::Down && !current {
                let seq = p.enqueue(FrameKind::Sync, epoch, 0, None);
                p.unsynced_bytes = 0;
                targets[i] = Some((p.conn, seq, Instant::now()));
                asked = true;
            }
        }
        if asked {
            self.work.notify_all();
        }
    }

    /// The first half of a sync (P3): the peers are asked before the local store
    /// syncs, so that the two overlap.
    fn ask_for_sync(&self) -> SyncTargets {
        let mut s = self.shared.lock();
        let mut targets = vec![None; s.peers.len()];
        if !self.sync_is_local(&s) {
            self.ask_peers(&mut s, &mut targets);
        }
        targets
    }

    /// The second half of a sync (P3), after the local store's: waits for the peers
    /// asked in `targets` (and asks those that connected since).
    fn wait_for_peers(&self, mut targets: SyncTargets) -> io::Result<()> {
        let _publishing = self
            .config
            .publish_in_sync
            .as_ref()
            .map(|_| self.publishing.lock());
        let mut s = self.shared.lock();
        if self.sync_is_local(&s) {
            if let Some(epoch) = s.fenced_by {
                return Err(fenced(epoch));
            }
            return self.check_lease();
        }
        let mut waited = false;
        loop {
            if let Some(epoch) = s.fenced_by {
                return Err(fenced(epoch));
            }
            if self.stop.load(Ordering::Acquire) {
                return Err(io::Error::other("replication is stopping"));
            }
            self.check_lease()?;
            self.ask_peers(&mut s, &mut targets);
            let in_sync_peers = s
                .peers
                .iter()
                .filter(|p| p.link == LinkState::InSync)
                .count();
            let acked: Vec<bool> = s
                .peers
                .iter()
                .zip(&targets)
                .map(|(p, t)| {
                    p.link == LinkState::InSync
                        && t.is_some_and(|(conn, seq, _)| conn == p.conn && p.acked >= seq)
                })
                .collect();
            let need = self
                .config
                .ack
                .peers_needed(self.config.peers.len() + 1)
                .min(in_sync_peers)
                .max(self.config.min_replicas - 1);
            // The peers this sync waits for: every one in sync, or under a coordinator
            // with a lower level the designated ones (P8); any `need` of them otherwise.
            let designate =
                self.config.publish_in_sync.is_some() && self.config.ack != AckLevel::All;
            let waited_for: Vec<bool> = if designate {
                designate_peers(&mut s, &acked, need)
            } else {
                s.peers
                    .iter()
                    .map(|p| p.link == LinkState::InSync)
                    .collect()
            };
            let enough = if designate {
                waited_for.iter().zip(&acked).all(|(&w, &a)| !w || a)
            } else {
                acked.iter().filter(|&&a| a).count() >= need
            };
            if in_sync_peers + 1 >= self.config.min_replicas && enough {
                // P6: a peer that left the published set's sync is unpublished first.
                let current = waited_for;
                match &self.config.publish_in_sync {
                    Some(publisher) if current != s.published => {
                        let addrs: Vec<String> = s
                            .peers
                            .iter()
                            .zip(&current)
                            .filter(|(_, &c)| c)
                            .map(|(p, _)| p.addr.clone())
                            .collect();
                        drop(s);
                        let published = (publisher.0)(&addrs);
                        s = self.shared.lock();
                        match published {
                            Ok(()) => s.published = current,
                            Err(e) => {
                                tracing::warn!(volume = %self.volume, error = %e, "publishing the peers in sync");
                                self.acks.wait_for(&mut s, Duration::from_millis(100));
                            }
                        }
                        continue;
                    }
                    _ => return self.check_lease(),
                }
            }
            if !waited {
                waited = true;
                self.syncs_waited.fetch_add(1, Ordering::Relaxed);
            }
            // A peer that keeps this sync waiting past the timeout is cut off (P4).
            let now = Instant::now();
            let mut late = Vec::new();
            for (i, p) in s.peers.iter().enumerate() {
                if let Some((conn, seq, since)) = targets[i] {
                    // Only a peer in sync is timed: a resyncing one counts for no ack.
                    if conn == p.conn
                        && p.link == LinkState::InSync
                        && p.acked < seq
                        && now.duration_since(since) >= self.config.peer_timeout
                    {
                        late.push((i, conn));
                    }
                }
            }
            for (i, conn) in late {
                let waited = self.config.peer_timeout;
                self.cut_off(&mut s, i, conn, format!("no ack within {waited:?}"));
            }
            self.acks.wait_for(&mut s, Duration::from_millis(50));
        }
    }
}

/// Keeps the designated peers (P8) at `need` of those in sync: drops the ones no longer
/// in sync, then fills from those that acknowledged the sync at hand (`acked`), then
/// from the others in sync, lowest index first; returns the set.
fn designate_peers(s: &mut Shared, acked: &[bool], need: usize) -> Vec<bool> {
    let in_sync: Vec<bool> = s
        .peers
        .iter()
        .map(|p| p.link == LinkState::InSync)
        .collect();
    for (d, &i) in s.designated.iter_mut().zip(&in_sync) {
        *d &= i;
    }
    let mut count = s.designated.iter().filter(|&&d| d).count();
    for prefer_acked in [true, false] {
        for i in 0..in_sync.len() {
            if count < need && in_sync[i] && !s.designated[i] && (acked[i] || !prefer_acked) {
                s.designated[i] = true;
                count += 1;
            }
        }
    }
    for i in (0..in_sync.len()).rev() {
        if count > need && s.designated[i] {
            s.designated[i] = false;
            count -= 1;
        }
    }
    s.designated.clone()
}

impl Replication {
    /// A sync of a primary whose lease ran out fails: another node may lead now.
    fn check_lease(&self) -> io::Result<()> {
        if self.lease_holds() {
            Ok(())
        } else {
            Err(io::Error::other(
                "the primary's lease ran out: another node may lead the volume",
            ))
        }
    }
}

fn fenced(epoch: u64) -> io::Error {
    io::Error::other(format!(
        "fenced: a newer primary (epoch {epoch}) holds the volume"
    ))
}

/// The log store of a replicated volume: the local store, replicated.
pub struct ReplicatedStore {
    replication: Arc<Replication>,
}

impl ReplicatedStore {
    pub fn new(replication: Arc<Replication>) -> ReplicatedStore {
        ReplicatedStore { replication }
    }

    fn local_failed(&self, what: &str, e: &io::Error) {
        let mut s = self.replication.shared.lock();
        s.failed = Some(format!("{what}: {e}"));
        self.replication
            .publish(&mut s, format!("local log {what} failed: {e}"));
    }
}

impl LogStore for ReplicatedStore {
    fn size(&self) -> u64 {
        self.replication.local.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.replication.local.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.replication
            .local
            .write_at(offset, data)
            .inspect_err(|e| self.local_failed("write", e))?;
        self.replication.replicate(offset, &[data]);
        Ok(())
    }
    fn write_parts_at(&self, offset: u64, head: &[u8], body: &[u8]) -> io::Result<()> {
        self.replication
            .local
            .write_parts_at(offset, head, body)
            .inspect_err(|e| self.local_failed("write", e))?;
        self.replication.replicate(offset, &[head, body]);
        Ok(())
    }
    fn sync(&self) -> io::Result<()> {
        let targets = self.replication.ask_for_sync();
        self.replication
            .local
            .sync()
            .inspect_err(|e| self.local_failed("sync", e))?;
        self.replication.wait_for_peers(targets)
    }
    fn sync_local(&self) -> io::Result<()> {
        self.replication
            .local
            .sync()
            .inspect_err(|e| self.local_failed("sync", e))
    }
    fn describe(&self) -> String {
        format!(
            "{} (replicated to {} peers)",
            self.replication.local.describe(),
            self.replication.config.peers.len()
        )
    }
    fn sync_is_free(&self) -> bool {
        self.replication.local.sync_is_free()
            && self.replication.config.ack == AckLevel::Local
            && self.replication.config.min_replicas <= 1
    }
    fn unlock(&self) {
        self.replication.local.unlock();
    }
}

impl Drop for ReplicatedStore {
    fn drop(&mut self) {
        self.replication.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_requests_are_cut_at_their_size_in_order() {
        assert_eq!(digest_batches(&[], 4), Vec::<Vec<(u64, u64)>>::new());
        assert_eq!(digest_batches(&[(0, 3)], 4), vec![vec![(0, 3)]]);
        assert_eq!(
            digest_batches(&[(0, 3), (10, 6), (20, 1)], 4),
            vec![vec![(0, 3), (10, 1)], vec![(11, 4)], vec![(15, 1), (20, 1)]]
        );
        let big = digest_batches(&[(0, 1 << 20)], DIGEST_BATCH_UNITS);
        assert_eq!(big.len(), 16);
        assert!(big
            .iter()
            .all(|b| b.iter().map(|r| r.1).sum::<u64>() == DIGEST_BATCH_UNITS));
    }

    #[test]
    fn bitmap_runs_cover_what_was_marked_once() {
        let mut b = Bitmap::new(1 << 20);
        assert_eq!(b.take_run(), None);
        b.mark(100, 10); // extent 0
        b.mark(EXTENT * 5 - 1, 2); // extents 4 and 5
        b.mark(EXTENT * 255, EXTENT * 10); // past the end: clipped
        assert_eq!(b.set, 4);
        let mut got = Vec::new();
        while let Some(run) = b.take_run() {
            got.push(run);
        }
        got.sort_unstable();
        assert_eq!(got, vec![(0, 1), (4, 2), (255, 1)]);
        assert_eq!(b.set, 0);
        b.mark_all();
        let mut total = 0;
        while let Some((_, n)) = b.take_run() {
            assert!(n <= RESYNC_RUN);
            total += n;
        }
        assert_eq!(total, 256);
        // A comparison clears whole extents, clipped at the end.
        b.mark_all();
        b.clear(EXTENT * 2, EXTENT * 3);
        b.clear(EXTENT * 254, EXTENT * 10);
        assert_eq!(b.set, 256 - 5);
        b.clear(EXTENT * 2, EXTENT);
        assert_eq!(b.set, 256 - 5, "clearing a clear extent changes nothing");
        assert_eq!(b.take_run(), Some((0, 2)));
        assert_eq!(b.take_run(), Some((5, RESYNC_RUN)));
    }
}

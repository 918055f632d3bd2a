//! The secondary's side of replication: [`ReplicaServer`] listens on TCP, takes a
//! primary's connection per volume, and applies its frames to a copy of the volume's
//! write log — `<dir>/<name>.log`, a [`FileLogStore`] of the primary's size, byte for
//! byte at the same offsets — so that the copy opens as a write log should this node
//! take the volume over. Beside it `<dir>/<name>.replica` records, durably: the highest
//! epoch seen, the primary stream the copy follows, and whether the copy is whole.
//!
//! # Invariants
//! - R1 (fencing): a hello or frame with an epoch below the recorded one is refused
//!   (`Fenced`, with the newer epoch) and applies nothing; a higher epoch is recorded
//!   durably before anything of it is applied.
//! - R2: one connection applies frames to a volume's copy at a time: a newer connection
//!   takes over (`session`), and an older one stops before its next frame (the check
//!   and the write are under `apply`).
//! - R3: the copy is recorded *not whole* before the first frame of a resync is
//!   applied, and whole again only after the resync's end is durable; a copy created
//!   afresh (missing, or of another size) follows no stream, so its primary compares
//!   it (P7 in `primary`) and sends every extent that differs.
//! - R4: an ack for frame `seq` is sent only after every frame through `seq` is applied
//!   and the copy synced.
//! - R5 (taking over): a node takes a volume over from its copy only when the copy is
//!   whole and its log file is there — or the copy never followed a primary. A copy
//!   that followed one and lost its file (deleted while the node was down) is recorded
//!   as following the lost stream [`LOST_STREAM`] when it is made again, not as new:
//!   an empty log would open as a fresh volume, without the writes its primary
//!   acknowledged.
//! - R6: a DIGEST frame reads the copy and changes nothing (not even its state): a
//!   primary comparing copies before a resync leaves the copy as it found it. Its
//!   hashing (up to a gigabyte, under `apply`) ends at the next unit once a newer
//!   session wants the copy, so a takeover's `release` does not wait for it. A
//!   RESYNC_BEGIN syncs the copy before it records the new stream, so the extents a
//!   comparison found equal are durable before the primary's bitmap stops marking them.
//! - R7 (led here): a volume opened from the copy (this node takes it over) records,
//!   before it writes, the copy as following [`LED_STREAM`] with its epoch; a copy's
//!   state is read again when the node gives the volume up ([`ReplicaServer::reclaim`]).
//!   So no primary — the old one back from a pause included — resyncs it from a bitmap
//!   that does not know what this node wrote while it led: the streams differ and the
//!   copy is compared (P7 in `primary`), and a primary older than the leader is fenced.

use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::Mutex;

use super::digest::hash_units;
use super::wire::{
    watch_for_vanished_peer, write_digest, Ack, DigestRequest, FrameHeader, FrameKind, Hello,
    Verdict, Welcome, FRAME_HEADER,
};
use crate::error::VolumeError;
use crate::log::{FileLogStore, LogStore};

/// What `<name>.replica` records.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaState {
    pub epoch: u64,
    pub stream: u64,
    pub consistent: bool,
}

/// How long a primary's connection may carry nothing before TCP probes whether the
/// primary is still there ([`watch_for_vanished_peer`]).
const PRIMARY_SILENCE: Duration = Duration::from_secs(2);

/// The stream a copy follows once its log was lost (R5): no primary's stream (a
/// primary never numbers its stream so), and not 0, which means "never followed one".
pub const LOST_STREAM: u64 = u64::MAX;

/// The stream a copy follows once this node led the volume from it (R7): no primary's.
pub const LED_STREAM: u64 = u64::MAX - 1;

impl ReplicaState {
    /// Why a node may not take the volume over from this copy, whose log is at
    /// `log_path` (R5); `None` when it may: the copy is whole and its log is there, or
    /// it never followed any primary (an empty copy of a volume nobody has written
    /// through a primary yet). A copy left mid-resync may lack acknowledged writes (R3).
    pub fn take_over_refusal(&self, log_path: &Path) -> Option<String> {
        if self.stream == 0 && !self.consistent {
            return None;
        }
        if !self.consistent {
            return Some("the copy was left mid-resync (not whole)".into());
        }
        match std::fs::metadata(log_path) {
            Ok(m) if m.is_file() && m.len() > 0 => None,
            Ok(_) => Some(format!("{} is empty", log_path.display())),
            Err(e) => Some(format!("{}: {e}", log_path.display())),
        }
    }

    fn encode(&self) -> String {
        format!(
            "epoch {}\nstream {}\nconsistent {}\n",
            self.epoch, self.stream, self.consistent as u8
        )
    }

    fn decode(text: &str) -> Option<ReplicaState> {
        let mut state = ReplicaState::default();
        let mut seen = 0;
        for line in text.lines() {
            let (key, value) = line.split_once(' ')?;
            let value: u64 = value.parse().ok()?;
            match key {
                "epoch" => state.epoch = value,
                "stream" => state.stream = value,
                "consistent" if value <= 1 => state.consistent = value == 1,
                _ => return None,
            }
            seen += 1;
        }
        (seen == 3).then_some(state)
    }
}

/// Where a replicated volume's copy and its state live in a secondary's directory.
pub fn replica_paths(dir: &Path, volume: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("{volume}.log")),
        dir.join(format!("{volume}.replica")),
    )
}

/// Reads a copy's state: `None` when there is none; an error when it is unreadable or
/// garbled (its epoch is then unknown, and guessing could un-fence a stale primary).
pub fn read_replica_state(path: &Path) -> Result<Option<ReplicaState>, VolumeError> {
    match std::fs::read_to_string(path) {
        Ok(text) => ReplicaState::decode(&text).map(Some).ok_or_else(|| {
            VolumeError::Config(format!("{}: not a replica state file", path.display()))
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(VolumeError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Writes `state` to `path` durably and atomically (a new file, synced, renamed over
/// the old one, the directory synced).
fn write_replica_state(path: &Path, state: &ReplicaState) -> io::Result<()> {
    let partial = path.with_extension("replica.partial");
    {
        let mut f = std::fs::File::create(&partial)?;
        f.write_all(state.encode().as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&partial, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// Records that the copy whose state is at `path` (now `state`) is taken over as the
/// volume's log by a primary of `epoch` (R7): it follows [`LED_STREAM`], is whole (it
/// is the primary's log), and has seen `epoch`.
pub fn record_led(path: &Path, state: ReplicaState, epoch: u64) -> io::Result<()> {
    let led = ReplicaState {
        epoch: state.epoch.max(epoch),
        stream: LED_STREAM,
        consistent: true,
    };
    if led == state {
        return Ok(());
    }
    write_replica_state(path, &led)
}

/// One volume's copy on this secondary.
struct VolumeCopy {
    state_path: PathBuf,
    log_path: PathBuf,
    /// The newest connection's number (R2).
    session: AtomicU64,
    /// The recorded epoch, for the per-frame check (R1) without the lock.
    epoch: AtomicU64,
    apply: Mutex<Applied>,
}

impl VolumeCopy {
    /// A copy at `log_path` whose recorded state is `state`; its log not open yet.
    fn new(state_path: PathBuf, log_path: PathBuf, state: ReplicaState) -> VolumeCopy {
        VolumeCopy {
            state_path,
            log_path,
            session: AtomicU64::new(0),
            epoch: AtomicU64::new(state.epoch),
            apply: Mutex::new(Applied {
                state,
                store: None,
                led: false,
                feeding: None,
                frames: 0,
                bytes: 0,
            }),
        }
    }

    /// Records `next` durably if it differs from what `a` holds (R1, R3).
    fn record(&self, a: &mut Applied, next: ReplicaState) -> io::Result<()> {
        if next != a.state {
            write_replica_state(&self.state_path, &next)?;
            a.state = next;
            self.epoch.store(next.epoch, Ordering::Release);
        }
        Ok(())
    }
}

struct Applied {
    state: ReplicaState,
    store: Option<FileLogStore>,
    /// This node serves the volume as its primary (see [`ReplicaServer::release`]):
    /// its copy is the volume's log, and no primary's stream is taken.
    led: bool,
    /// The connection applying a primary's frames now, if one is.
    feeding: Option<u64>,
    frames: u64,
    bytes: u64,
}

/// Marks connection `session` as the one feeding `copy` until dropped (unless a newer
/// one took over meanwhile).
struct Feeding<'a> {
    copy: &'a VolumeCopy,
    session: u64,
}

impl<'a> Feeding<'a> {
    fn start(copy: &'a VolumeCopy, session: u64) -> Feeding<'a> {
        copy.apply.lock().feeding = Some(session);
        Feeding { copy, session }
    }
}

impl Drop for Feeding<'_> {
    fn drop(&mut self) {
        let mut a = self.copy.apply.lock();
        if a.feeding == Some(self.session) {
            a.feeding = None;
        }
    }
}

/// A replica volume's counters for `status`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaCopyStatus {
    pub volume: String,
    pub state: ReplicaState,
    /// A primary's connection is applying frames to the copy now.
    pub primary_connected: bool,
    /// This node leads the volume: the copy is its log.
    pub led: bool,
    pub frames: u64,
    pub bytes: u64,
}

struct Shared {
    dir: PathBuf,
    copies: Mutex<HashMap<String, Arc<VolumeCopy>>>,
    /// Numbers connections; a copy's newest one applies frames (R2).
    sessions: AtomicU64,
    stop: AtomicBool,
    /// Every open connection (by number), so `stop` can end them.
    connections: Mutex<Vec<(u64, TcpStream)>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

/// A running secondary: `terrace serve-replica`.
pub struct ReplicaServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl ReplicaServer {
    /// Listens on `addr` and keeps copies in `dir` (created if missing).
    pub fn start(addr: &str, dir: &Path) -> Result<ReplicaServer, VolumeError> {
        std::fs::create_dir_all(dir).map_err(|source| VolumeError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        let listener = TcpListener::bind(addr)
            .map_err(|e| VolumeError::Config(format!("replica listen {addr}: {e}")))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| VolumeError::Config(format!("replica listen {addr}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| VolumeError::Config(format!("replica listen {addr}: {e}")))?;
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            copies: Mutex::new(HashMap::new()),
            sessions: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            connections: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
        });
        let accept_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("replica-accept".into())
            .spawn(move || accept_loop(listener, accept_shared))
            .map_err(|e| VolumeError::Config(format!("spawning the replica listener: {e}")))?;
        tracing::info!(%addr, dir = %dir.display(), "serving replicas");
        Ok(ReplicaServer {
            addr,
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every copy this server has taken a connection for since it started.
    pub fn status(&self) -> Vec<ReplicaCopyStatus> {
        self.status_source().status()
    }

    /// Hands `volume`'s copy to this node, which takes the volume over: the primary
    /// streaming to it is cut off, the copy's file closed (so a volume can open it as its
    /// log), and hellos for it refused until [`reclaim`](ReplicaServer::reclaim). Fails
    /// when the copy was left mid-resync (R3): it may lack acknowledged writes.
    pub fn release(&self, volume: &str) -> Result<(), VolumeError> {
        let copy = copy_for(&self.shared, volume)?;
        copy.session.store(
            self.shared.sessions.fetch_add(1, Ordering::AcqRel) + 1,
            Ordering::Release,
        );
        let mut a = copy.apply.lock();
        if let Some(why) = a.state.take_over_refusal(&copy.log_path) {
            return Err(VolumeError::Config(format!(
                "the copy of volume {volume} cannot be taken over: {why}"
            )));
        }
        a.led = true;
        a.store = None;
        Ok(())
    }

    /// `volume` is no longer led here: its log becomes a copy again, for the next
    /// primary's stream, which compares it (R7: its state, read again, follows
    /// [`LED_STREAM`] once the volume opened here). `led`: the epoch of the volume this
    /// node opened and closed, if it did (`None`: the takeover failed before).
    ///
    /// A state file that is missing or cannot be read is replaced: after a term here
    /// by R7's record again (the copy is the closed volume's own log: whole, at that
    /// epoch); after a failed takeover, when nothing is known of the copy, by a lost
    /// copy's state (R5: compared in full, not taken over before a resync). Either at
    /// the highest epoch known here, so an older primary stays fenced. Fails only if
    /// that cannot be recorded; the copy then stays led, refusing every primary.
    pub fn reclaim(&self, volume: &str, led: Option<u64>) -> Result<(), VolumeError> {
        let copy = copy_for(&self.shared, volume)?;
        let read = read_replica_state(&copy.state_path);
        let mut a = copy.apply.lock();
        let epoch = led.unwrap_or(0).max(a.state.epoch);
        let state = match (read, led) {
            (Ok(Some(state)), _) => state,
            (Ok(None), None) => ReplicaState {
                epoch,
                ..ReplicaState::default()
            },
            (unknown, led) => {
                if let Err(e) = unknown {
                    tracing::warn!(volume, error = %e, "the copy's state is unreadable");
                }
                let state = ReplicaState {
                    epoch,
                    stream: if led.is_some() {
                        LED_STREAM
                    } else {
                        LOST_STREAM
                    },
                    consistent: led.is_some(),
                };
                write_replica_state(&copy.state_path, &state).map_err(|source| {
                    VolumeError::Io {
                        path: copy.state_path.clone(),
                        source,
                    }
                })?;
                state
            }
        };
        a.state = state;
        copy.epoch.store(state.epoch, Ordering::Release);
        a.led = false;
        Ok(())
    }

    /// A handle that reads [`status`](ReplicaServer::status) (for the control socket).
    pub fn status_source(&self) -> ReplicaStatusSource {
        ReplicaStatusSource(Arc::clone(&self.shared))
    }

    /// Stops listening, ends every connection and waits for their threads (so the
    /// copies' files are closed when it returns).
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        for (_, c) in self.shared.connections.lock().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        let accept = self.thread.lock().take();
        if let Some(t) = accept {
            let _ = t.join();
        }
        for (_, c) in self.shared.connections.lock().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        let threads: Vec<_> = self.shared.threads.lock().drain(..).collect();
        for t in threads {
            let _ = t.join();
        }
        self.shared.copies.lock().clear();
    }
}

/// Reads a replica server's copies' states.
#[derive(Clone)]
pub struct ReplicaStatusSource(Arc<Shared>);

impl ReplicaStatusSource {
    pub fn status(&self) -> Vec<ReplicaCopyStatus> {
        let copies = self.0.copies.lock();
        let mut out: Vec<ReplicaCopyStatus> = copies
            .iter()
            .map(|(name, copy)| {
                let a = copy.apply.lock();
                ReplicaCopyStatus {
                    volume: name.clone(),
                    state: a.state,
                    primary_connected: a.feeding.is_some(),
                    led: a.led,
                    frames: a.frames,
                    bytes: a.bytes,
                }
            })
            .collect();
        out.sort_by(|a, b| a.volume.cmp(&b.volume));
        out
    }
}

impl Drop for ReplicaServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_nodelay(true);
                let id = shared.sessions.fetch_add(1, Ordering::AcqRel) + 1;
                match stream.try_clone() {
                    Ok(clone) => shared.connections.lock().push((id, clone)),
                    Err(e) => {
                        tracing::warn!(%peer, error = %e, "cannot keep a replication connection");
                        continue;
                    }
                }
                let conn_shared = Arc::clone(&shared);
                let spawned = std::thread::Builder::new()
                    .name("replica-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve_primary(id, stream, &conn_shared) {
                            if !conn_shared.stop.load(Ordering::Acquire) {
                                tracing::info!(%peer, error = %e, "replication connection ended");
                            }
                        }
                        // The kept clone would hold the connection open: end it.
                        let mut conns = conn_shared.connections.lock();
                        if let Some(at) = conns.iter().position(|(i, _)| *i == id) {
                            let (_, c) = conns.swap_remove(at);
                            let _ = c.shutdown(std::net::Shutdown::Both);
                        }
                    });
                match spawned {
                    Ok(t) => {
                        let mut threads = shared.threads.lock();
                        threads.retain(|t| !t.is_finished());
                        threads.push(t);
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot start a replication connection"),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!(error = %e, "replica accept failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn copy_for(shared: &Shared, volume: &str) -> Result<Arc<VolumeCopy>, VolumeError> {
    let mut copies = shared.copies.lock();
    if let Some(c) = copies.get(volume) {
        return Ok(Arc::clone(c));
    }
    let (log_path, state_path) = replica_paths(&shared.dir, volume);
    let state = read_replica_state(&state_path)?.unwrap_or_default();
    let copy = Arc::new(VolumeCopy::new(state_path, log_path, state));
    copies.insert(volume.to_string(), Arc::clone(&copy));
    Ok(copy)
}

/// Takes one primary's connection from its hello to its end.
fn serve_primary(session: u64, stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    // A primary may go quiet for as long as its volume is idle, but not vanish.
    watch_for_vanished_peer(&stream, PRIMARY_SILENCE)?;
    let mut reader = BufReader::with_capacity(256 << 10, stream.try_clone()?);
    let mut writer = BufWriter::new(stream.try_clone()?);
    let hello = Hello::read_from(&mut reader)?;
    let refuse = |writer: &mut BufWriter<TcpStream>, why: String| -> io::Result<()> {
        Welcome {
            verdict: Verdict::Refused,
            epoch: 0,
            stream: 0,
            consistent: false,
            message: why.clone(),
        }
        .write_to(writer)?;
        writer.flush()?;
        Err(io::Error::other(why))
    };
    let copy = match copy_for(shared, &hello.volume) {
        Ok(c) => c,
        Err(e) => return refuse(&mut writer, e.to_string()),
    };
    let welcome = {
        let mut a = copy.apply.lock();
        if a.led {
            drop(a);
            return refuse(
                &mut writer,
                format!("this node is the primary of volume {}", hello.volume),
            );
        }
        if hello.epoch < a.state.epoch {
            Welcome {
                verdict: Verdict::Fenced,
                epoch: a.state.epoch,
                stream: a.state.stream,
                consistent: a.state.consistent,
                message: format!(
                    "volume {} has epoch {}, newer than {}",
                    hello.volume, a.state.epoch, hello.epoch
                ),
            }
        } else {
            match open_copy(&copy, &mut a, &hello) {
                Ok(()) => {
                    // R2: from here on, older connections apply nothing.
                    copy.session.store(session, Ordering::Release);
                    Welcome {
                        verdict: Verdict::Proceed,
                        epoch: a.state.epoch,
                        stream: a.state.stream,
                        consistent: a.state.consistent,
                        message: String::new(),
                    }
                }
                Err(e) => {
                    drop(a);
                    return refuse(&mut writer, e.to_string());
                }
            }
        }
    };
    welcome.write_to(&mut writer)?;
    writer.flush()?;
    if welcome.verdict != Verdict::Proceed {
        return Ok(());
    }
    let _feeding = Feeding::start(&copy, session);
    tracing::info!(
        volume = %hello.volume, epoch = hello.epoch, stream = hello.stream,
        consistent = welcome.consistent, "primary connected"
    );
    // A primary may go quiet for as long as its volume is idle.
    reader.get_ref().set_read_timeout(None)?;
    let mut data = Vec::new();
    loop {
        let mut h = [0u8; FRAME_HEADER];
        reader.read_exact(&mut h)?;
        let frame = FrameHeader::decode(&h)?;
        data.resize(frame.len as usize, 0);
        reader.read_exact(&mut data)?;
        let newest = copy.epoch.load(Ordering::Acquire);
        if frame.epoch < newest {
            writer.write_all(&Ack::Fenced { epoch: newest }.encode())?;
            writer.flush()?;
            return Err(io::Error::other(format!(
                "fenced a frame of epoch {} (volume has {newest})",
                frame.epoch
            )));
        }
        let mut a = copy.apply.lock();
        if copy.session.load(Ordering::Acquire) != session {
            return Err(io::Error::other("a newer connection took the volume"));
        }
        if frame.kind == FrameKind::Digest {
            let hashes = digest_copy(&copy, session, &a, &hello, &data)?;
            drop(a);
            write_digest(&mut writer, &hashes)?;
            writer.flush()?;
            continue;
        }
        let ack = apply(&copy, &mut a, &hello, frame, &data)?;
        drop(a);
        if let Some(ack) = ack {
            writer.write_all(&ack.encode())?;
            writer.flush()?;
        }
    }
}

/// Records the hello's epoch, and opens (or makes) the copy at the primary's size.
fn open_copy(copy: &VolumeCopy, a: &mut Applied, hello: &Hello) -> Result<(), VolumeError> {
    let state_error = |source| VolumeError::Io {
        path: copy.state_path.clone(),
        source,
    };
    if hello.epoch > a.state.epoch {
        let next = ReplicaState {
            epoch: hello.epoch,
            ..a.state
        };
        copy.record(a, next).map_err(state_error)?;
    }
    if a.store
        .as_ref()
        .is_some_and(|s| s.size() == hello.store_size)
    {
        return Ok(());
    }
    a.store = None;
    let existing = std::fs::metadata(&copy.log_path).ok().map(|m| m.len());
    if existing != Some(hello.store_size) {
        // R3: a new copy (or one of another size) follows no stream — the lost one if
        // it had followed one (R5).
        if existing.is_some() {
            std::fs::remove_file(&copy.log_path).map_err(|source| VolumeError::Io {
                path: copy.log_path.clone(),
                source,
            })?;
        }
        let next = ReplicaState {
            stream: if a.state.stream == 0 { 0 } else { LOST_STREAM },
            consistent: false,
            ..a.state
        };
        copy.record(a, next).map_err(state_error)?;
    }
    a.store = Some(FileLogStore::open(&copy.log_path, hello.store_size)?);
    Ok(())
}

/// Answers a DIGEST: the hashes of the copy's units it asks (seeded with the
/// primary's stream; see [`super::digest`]). Reads only. Ends early once a newer
/// session — a takeover's `release`, which bumps it before it waits for the lock this
/// runs under — wants the copy.
fn digest_copy(
    copy: &VolumeCopy,
    session: u64,
    a: &Applied,
    hello: &Hello,
    request: &[u8],
) -> io::Result<Vec<u64>> {
    let store = a
        .store
        .as_ref()
        .ok_or_else(|| io::Error::other("the copy is not open"))?;
    let request = DigestRequest::decode(request, store.size())?;
    let abandoned = || copy.session.load(Ordering::Acquire) != session;
    hash_units(store, &request, hello.stream, &abandoned)
}

fn apply(
    copy: &VolumeCopy,
    a: &mut Applied,
    hello: &Hello,
    frame: FrameHeader,
    data: &[u8],
) -> io::Result<Option<Ack>> {
    let store = a
        .store
        .as_ref()
        .ok_or_else(|| io::Error::other("the copy is not open"))?;
    a.frames += 1;
    match frame.kind {
        FrameKind::Write => {
            let end = frame.offset.checked_add(data.len() as u64);
            if end.is_none_or(|end| end > store.size()) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "a write of {} bytes at {} past the copy's {} bytes",
                        data.len(),
                        frame.offset,
                        store.size()
                    ),
                ));
            }
            store.write_at(frame.offset, data)?;
            a.bytes += data.len() as u64;
            Ok(None)
        }
        FrameKind::Sync => {
            store.sync()?;
            Ok(Some(Ack::Synced { seq: frame.seq }))
        }
        FrameKind::ResyncBegin => {
            // R6: what a comparison found equal must be on disk before the copy says it
            // follows this stream — from then on a reconnection of this stream trusts
            // the primary's bitmap, which no longer marks those extents.
            store.sync()?;
            let next = ReplicaState {
                stream: hello.stream,
                consistent: false,
                ..a.state
            };
            copy.record(a, next)?;
            Ok(None)
        }
        FrameKind::Digest => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a DIGEST frame is answered, not applied",
        )),
        FrameKind::ResyncEnd => {
            store.sync()?;
            let next = ReplicaState {
                stream: hello.stream,
                consistent: true,
                ..a.state
            };
            copy.record(a, next)?;
            tracing::info!(volume = %hello.volume, "copy is whole again");
            Ok(Some(Ack::Synced { seq: frame.seq }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_files_round_trip_and_garbage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.replica");
        assert_eq!(read_replica_state(&path).unwrap(), None);
        let s = ReplicaState {
            epoch: 4,
            stream: 77,
            consistent: true,
        };
        write_replica_state(&path, &s).unwrap();
        assert_eq!(read_replica_state(&path).unwrap(), Some(s));
        std::fs::write(&path, "epoch 4\nstream x\n").unwrap();
        assert!(read_replica_state(&path).is_err());
        std::fs::write(&path, "epoch 4\nstream 1\n").unwrap();
        assert!(read_replica_state(&path).is_err());
    }

    /// R5: a copy that followed a stream and lost its log is made again as following
    /// the lost stream — compared and resent, never taken over — and a new one as
    /// following none.
    #[test]
    fn a_copy_made_again_follows_the_lost_stream() {
        let dir = tempfile::tempdir().unwrap();
        let (log_path, state_path) = replica_paths(dir.path(), "v");
        let hello = Hello {
            epoch: 5,
            stream: 1234,
            store_size: 1 << 20,
            volume: "v".into(),
        };
        let open = |state: ReplicaState| {
            write_replica_state(&state_path, &state).unwrap();
            let copy = VolumeCopy::new(state_path.clone(), log_path.clone(), state);
            open_copy(&copy, &mut copy.apply.lock(), &hello).unwrap();
            read_replica_state(&state_path).unwrap().unwrap()
        };
        let whole = ReplicaState {
            epoch: 4,
            stream: 77,
            consistent: true,
        };
        assert_eq!(whole.take_over_refusal(&log_path).map(|_| ()), Some(()));
        let made = open(whole);
        assert_eq!(
            (made.epoch, made.stream, made.consistent),
            (5, LOST_STREAM, false)
        );
        assert!(made.take_over_refusal(&log_path).is_some());
        assert!(log_path.exists());

        std::fs::remove_file(&log_path).unwrap();
        let made = open(ReplicaState::default());
        assert_eq!((made.epoch, made.stream, made.consistent), (5, 0, false));
        assert_eq!(made.take_over_refusal(&log_path), None);
    }

    /// A copy whose state file is garbled or gone when the node gives the volume up is
    /// not left led (refusing every primary): after a term here it is recorded whole
    /// as R7 had it, after a failed takeover as a lost copy — at the leader's epoch.
    #[test]
    fn a_garbled_state_at_reclaim_is_recorded_again() {
        let dir = tempfile::tempdir().unwrap();
        let (log_path, state_path) = replica_paths(dir.path(), "v");
        std::fs::write(&log_path, vec![0u8; 4096]).unwrap();
        let whole = ReplicaState {
            epoch: 4,
            stream: 77,
            consistent: true,
        };
        write_replica_state(&state_path, &whole).unwrap();
        let server = ReplicaServer::start("127.0.0.1:0", dir.path()).unwrap();
        let cases = [
            (Some(9), "epoch 9\nstr", (9, LED_STREAM, true)),
            (Some(10), "", (10, LED_STREAM, true)),
            (None, "garbage", (10, LOST_STREAM, false)),
        ];
        for (led, file, (epoch, stream, consistent)) in cases {
            server.release("v").unwrap();
            assert!(server.status()[0].led);
            if file.is_empty() {
                std::fs::remove_file(&state_path).unwrap();
            } else {
                std::fs::write(&state_path, file).unwrap();
            }
            server.reclaim("v", led).unwrap();
            let want = ReplicaState {
                epoch,
                stream,
                consistent,
            };
            let status = &server.status()[0];
            assert_eq!(
                (status.led, status.state),
                (false, want),
                "{led:?} {file:?}"
            );
            assert_eq!(read_replica_state(&state_path).unwrap(), Some(want));
            assert_eq!(want.take_over_refusal(&log_path).is_none(), consistent);
        }
        server.stop();
    }
}

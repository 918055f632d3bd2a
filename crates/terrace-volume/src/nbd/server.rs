//! [`NbdServer`]: serves named [`Export`]s over NBD on a UNIX or TCP socket.
//!
//! Threads: one accept thread; per connection, a reader thread that runs the handshake,
//! then parses requests (reading WRITE payloads) and hands them to up to
//! [`WORKERS_PER_CONNECTION`] worker threads, spawned as the queue needs them. Workers
//! call the export and write each reply whole under the connection's write lock, so
//! replies of concurrent requests never interleave and may leave out of order (the
//! protocol matches them by cookie). A request the export can serve from memory
//! ([`Export::read_cached`], [`Export::write_at_once`]) the reader answers itself; it
//! reads its input through a buffer and holds such replies back until it would wait for
//! input, so a burst of pipelined requests costs one read and one write.
//!
//! Invariants:
//! - At most [`MAX_IN_FLIGHT`] requests (and about [`MAX_IN_FLIGHT_BYTES`] of READ and
//!   WRITE payload) per connection are queued or running; the reader stops reading while
//!   the limit is reached, which pushes back on the client through the socket.
//! - A request reaches the export only after its command, flags and range were checked:
//!   a bad request gets an error reply; a bad frame (wrong magic, an oversized WRITE
//!   payload) closes that connection. Nothing a client sends panics or stops the server.
//! - On `NBD_CMD_DISC`, end of input or a protocol error, requests already in flight
//!   finish and are answered before the socket closes.
//! - [`NbdServer::shutdown`] (or drop) stops accepting, lets connections finish what is
//!   in flight, closes them, and joins the threads, all within a bounded time; threads
//!   stuck in the export past that are left detached and logged.
//!
//! Protocol (`doc/proto.md`): fixed newstyle only; options `NBD_OPT_GO`, `INFO`,
//! `EXPORT_NAME`, `LIST`, `ABORT` and `STRUCTURED_REPLY`; commands READ, WRITE, DISC,
//! FLUSH, TRIM and WRITE_ZEROES, with FUA. The first export is also the default ("").
//! Errors follow the spec's advice: EINVAL for a bad command, flags, length or a READ or
//! TRIM past the end; ENOSPC for a WRITE or WRITE_ZEROES past the end; EPERM for writes
//! to a read-only export.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};
use terrace_media::error::MediaError;

use super::buffers::{Buffer, BufferPool};
use super::proto::{self, RequestHeader};
use super::Stream;
use crate::error::{BlockError, VolumeError};
use crate::export::Export;

/// Worker threads per connection: how many of its requests run at once.
pub const WORKERS_PER_CONNECTION: usize = 16;
/// The reader's input buffer.
const READ_BUFFER: usize = 256 << 10;
/// Replies the reader holds back before it sends them anyway.
const DEFERRED_MAX: usize = 256 << 10;
/// Requests per connection queued or running before the reader stops reading.
pub const MAX_IN_FLIGHT: usize = 64;
/// READ and WRITE payload bytes per connection in flight before the reader stops reading
/// (one request is always admitted, whatever its size).
pub const MAX_IN_FLIGHT_BYTES: u64 = 256 << 20;
/// The largest option data accepted during the handshake (names are at most 4 KiB).
const MAX_OPTION_DATA: u32 = 64 << 10;
/// Options one connection may send before the server gives up on it.
const MAX_OPTIONS: usize = 1024;
/// How long a client may take to send each handshake message.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one reply may take to leave (a client that stops reading).
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// Shutdown: how long connections get to finish in-flight requests after their input
/// is closed, then how long after their sockets are closed both ways.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(2);
const SHUTDOWN_CLOSE: Duration = Duration::from_secs(1);
/// How long shutdown waits for the accept thread after waking it.
const SHUTDOWN_ACCEPT: Duration = Duration::from_secs(1);
/// The longest a blocked `accept` waits before looking for a shutdown: the fallback when
/// the wake-up connection cannot reach the socket (its path was removed or replaced).
const ACCEPT_POLL: Duration = Duration::from_millis(200);

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A UNIX socket at this path (a stale socket file there is replaced).
    Unix(PathBuf),
    /// A TCP address (port 0 picks a free port; see [`NbdServer::local_addr`]).
    Tcp(SocketAddr),
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
            Listen::Tcp(addr) => write!(f, "tcp:{addr}"),
        }
    }
}

/// A snapshot of a server's counters ([`NbdServer::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Connections accepted since start.
    pub connections_accepted: u64,
    /// Connections open now.
    pub connections_active: u64,
    /// Transmission requests received (every command, including bad ones and DISC).
    pub requests: u64,
    /// Bytes returned by successful READs.
    pub bytes_read: u64,
    /// Bytes stored by successful WRITEs (zeroing not counted).
    pub bytes_written: u64,
    /// Successful FLUSHes.
    pub flushes: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Connections closed because the client broke the protocol.
    pub protocol_errors: u64,
}

#[derive(Default)]
struct Counters {
    connections_accepted: AtomicU64,
    connections_active: AtomicU64,
    requests: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
    flushes: AtomicU64,
    errors: AtomicU64,
    protocol_errors: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, amount: u64) {
        counter.fetch_add(amount, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ServerStats {
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ServerStats {
            connections_accepted: get(&self.connections_accepted),
            connections_active: get(&self.connections_active),
            requests: get(&self.requests),
            bytes_read: get(&self.bytes_read),
            bytes_written: get(&self.bytes_written),
            flushes: get(&self.flushes),
            errors: get(&self.errors),
            protocol_errors: get(&self.protocol_errors),
        }
    }
}

#[derive(Clone)]
struct NamedExport {
    name: String,
    export: Arc<dyn Export>,
}

/// What the accept thread, the connections and the server handle share.
struct Shared {
    /// Changes while the server runs (a volume this node takes over, or gives up);
    /// a connection keeps the export it opened.
    exports: RwLock<Vec<NamedExport>>,
    stats: Counters,
    shutting_down: AtomicBool,
    /// A clone of every open connection's socket, so shutdown can close them.
    open_connections: Mutex<HashMap<u64, Stream>>,
    connection_threads: Mutex<Vec<JoinHandle<()>>>,
    next_connection_id: AtomicU64,
}

impl Shared {
    /// The export called `name`; "" is the first export.
    fn find(&self, name: &str) -> Option<NamedExport> {
        let exports = self.exports.read();
        if name.is_empty() {
            return exports.first().cloned();
        }
        exports.iter().find(|named| named.name == name).cloned()
    }
}

fn check_export_name(name: &str) -> Result<(), VolumeError> {
    if name.len() > proto::MAX_STRING {
        return Err(VolumeError::Config(format!(
            "NBD export name of {} bytes (the limit is {})",
            name.len(),
            proto::MAX_STRING
        )));
    }
    Ok(())
}

/// What a server is bound to, to wake its accept thread and clean up after it.
enum Bound {
    Unix { path: PathBuf, inode: (u64, u64) },
    Tcp(SocketAddr),
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    fn accept(&self) -> io::Result<(Stream, String)> {
        match self {
            Listener::Unix(listener) => {
                let (stream, _) = listener.accept()?;
                Ok((Stream::Unix(stream), "unix".to_owned()))
            }
            Listener::Tcp(listener) => {
                let (stream, peer) = listener.accept()?;
                stream.set_nodelay(true)?;
                Ok((Stream::Tcp(stream), peer.to_string()))
            }
        }
    }
}

/// An NBD server: an accept thread and one reader (plus workers) per connection.
/// Dropping it shuts it down like [`NbdServer::shutdown`].
pub struct NbdServer {
    shared: Arc<Shared>,
    accept_thread: Option<JoinHandle<()>>,
    bound: Bound,
}

impl NbdServer {
    /// Binds `listen` and starts accepting. `exports` are served by name; the first is
    /// also the default export (""). Names must be unique and at most 4096 bytes.
    pub fn start(
        listen: Listen,
        exports: Vec<(String, Arc<dyn Export>)>,
    ) -> Result<NbdServer, VolumeError> {
        if exports.is_empty() {
            return Err(VolumeError::Config(
                "an NBD server needs at least one export".into(),
            ));
        }
        NbdServer::start_with(listen, exports)
    }

    /// [`NbdServer::start`] with no export yet ([`NbdServer::add_export`] adds them):
    /// a node that serves the volumes it leads.
    pub fn start_empty(listen: Listen) -> Result<NbdServer, VolumeError> {
        NbdServer::start_with(listen, Vec::new())
    }

    /// Serves `export` as `name` from now on (connections opened before see it too).
    pub fn add_export(&self, name: &str, export: Arc<dyn Export>) -> Result<(), VolumeError> {
        check_export_name(name)?;
        let mut exports = self.shared.exports.write();
        if exports.iter().any(|named| named.name == name) {
            return Err(VolumeError::Config(format!(
                "NBD export {name:?} named twice"
            )));
        }
        exports.push(NamedExport {
            name: name.to_string(),
            export,
        });
        Ok(())
    }

    /// Stops offering `name` to new connections; whether it was offered.
    pub fn remove_export(&self, name: &str) -> bool {
        let mut exports = self.shared.exports.write();
        let before = exports.len();
        exports.retain(|named| named.name != name);
        exports.len() != before
    }

    fn start_with(
        listen: Listen,
        exports: Vec<(String, Arc<dyn Export>)>,
    ) -> Result<NbdServer, VolumeError> {
        for (index, (name, _)) in exports.iter().enumerate() {
            check_export_name(name)?;
            if exports[..index].iter().any(|(earlier, _)| earlier == name) {
                return Err(VolumeError::Config(format!(
                    "NBD export {name:?} named twice"
                )));
            }
        }
        let (listener, bound) = match &listen {
            Listen::Unix(path) => {
                let listener = bind_unix(path)?;
                let prepared = fs::metadata(path).and_then(|meta| {
                    let listener = bound_accept_unix(listener)?;
                    Ok((listener, (meta.dev(), meta.ino())))
                });
                let (listener, inode) = prepared.map_err(|source| {
                    let _ = fs::remove_file(path);
                    io_error(path, source)
                })?;
                let bound = Bound::Unix {
                    path: path.clone(),
                    inode,
                };
                (Listener::Unix(listener), bound)
            }
            Listen::Tcp(addr) => {
                let bind_error = |source| VolumeError::Backend {
                    what: format!("bind NBD {listen}"),
                    source,
                };
                let listener = TcpListener::bind(addr).map_err(bind_error)?;
                let local = listener.local_addr().map_err(bind_error)?;
                let listener = bound_accept_tcp(listener).map_err(bind_error)?;
                (Listener::Tcp(listener), Bound::Tcp(local))
            }
        };
        let shared = Arc::new(Shared {
            exports: RwLock::new(
                exports
                    .into_iter()
                    .map(|(name, export)| NamedExport { name, export })
                    .collect(),
            ),
            stats: Counters::default(),
            shutting_down: AtomicBool::new(false),
            open_connections: Mutex::new(HashMap::new()),
            connection_threads: Mutex::new(Vec::new()),
            next_connection_id: AtomicU64::new(1),
        });
        let accept_shared = Arc::clone(&shared);
        let accept_thread = thread::Builder::new()
            .name("nbd-accept".into())
            .spawn(move || accept_loop(listener, accept_shared))
            .map_err(|source| VolumeError::Backend {
                what: "spawn the NBD accept thread".into(),
                source,
            });
        let accept_thread = match accept_thread {
            Ok(handle) => handle,
            Err(error) => {
                if let Bound::Unix { path, .. } = &bound {
                    let _ = fs::remove_file(path);
                }
                return Err(error);
            }
        };
        tracing::debug!(listen = %listen, exports = shared.exports.read().len(), "nbd server listening");
        Ok(NbdServer {
            shared,
            accept_thread: Some(accept_thread),
            bound,
        })
    }

    /// The bound TCP address (with the real port when started on port 0); `None` for a
    /// UNIX socket.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self.bound {
            Bound::Tcp(addr) => Some(addr),
            Bound::Unix { .. } => None,
        }
    }

    /// The UNIX socket's path; `None` for TCP.
    pub fn socket_path(&self) -> Option<&Path> {
        match &self.bound {
            Bound::Unix { path, .. } => Some(path),
            Bound::Tcp(_) => None,
        }
    }

    /// An NBD URI for `export` on this server (`nbd+unix:///NAME?socket=PATH` or
    /// `nbd://HOST:PORT/NAME`), as `nbdinfo`, fio and [`NbdBackend`](super::NbdBackend)
    /// take it.
    pub fn uri(&self, export: &str) -> String {
        let name = percent_encode(export, false);
        match &self.bound {
            Bound::Unix { path, .. } => {
                let socket = percent_encode(&path.to_string_lossy(), true);
                format!("nbd+unix:///{name}?socket={socket}")
            }
            Bound::Tcp(addr) => format!("nbd://{}/{name}", connectable(*addr)),
        }
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> ServerStats {
        self.shared.stats.snapshot()
    }

    /// Stops accepting, finishes the requests in flight, closes every connection and
    /// joins the threads (bounded: a few seconds at most), and removes the UNIX socket.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let Some(accept_thread) = self.accept_thread.take() else {
            return;
        };
        self.shared.shutting_down.store(true, Ordering::SeqCst);
        self.wake_accept_thread();
        if !join_within(vec![accept_thread], Instant::now() + SHUTDOWN_ACCEPT) {
            tracing::warn!("nbd: the accept thread did not stop; left detached");
        }
        if let Bound::Unix { path, inode } = &self.bound {
            // Only our socket: another server may have replaced it since.
            let ours =
                fs::symlink_metadata(path).is_ok_and(|meta| (meta.dev(), meta.ino()) == *inode);
            if ours {
                let _ = fs::remove_file(path);
            }
        }
        // No connection can be added now. First close their input: readers stop, the
        // requests in flight finish and are answered; then close what is left both ways.
        for stream in self.shared.open_connections.lock().values() {
            stream.shutdown(Shutdown::Read);
        }
        let threads = std::mem::take(&mut *self.shared.connection_threads.lock());
        let deadline = Instant::now() + SHUTDOWN_DRAIN;
        while Instant::now() < deadline && !threads.iter().all(JoinHandle::is_finished) {
            thread::sleep(Duration::from_millis(5));
        }
        for stream in self.shared.open_connections.lock().values() {
            stream.shutdown(Shutdown::Both);
        }
        if !join_within(threads, Instant::now() + SHUTDOWN_CLOSE) {
            tracing::warn!("nbd: connection threads still busy in the export; left detached");
        }
        tracing::debug!("nbd server stopped");
    }

    /// Unblocks the accept thread's `accept` with a connection of our own.
    fn wake_accept_thread(&self) {
        let woken = match &self.bound {
            Bound::Unix { path, .. } => UnixStream::connect(path).map(drop),
            Bound::Tcp(addr) => {
                TcpStream::connect_timeout(&connectable(*addr), SHUTDOWN_ACCEPT).map(drop)
            }
        };
        if let Err(error) = woken {
            tracing::warn!(%error, "nbd: could not wake the accept thread");
        }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl fmt::Debug for NbdServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("NbdServer");
        match &self.bound {
            Bound::Unix { path, .. } => debug.field("socket", path),
            Bound::Tcp(addr) => debug.field("addr", addr),
        };
        debug
            .field("exports", &self.shared.exports.read().len())
            .finish()
    }
}

/// Joins `threads` if they all finish before `deadline`; returns whether they did (the
/// ones still running are detached).
fn join_within(threads: Vec<JoinHandle<()>>, deadline: Instant) -> bool {
    while Instant::now() < deadline && !threads.iter().all(JoinHandle::is_finished) {
        thread::sleep(Duration::from_millis(5));
    }
    let mut all_joined = true;
    for handle in threads {
        if handle.is_finished() {
            let _ = handle.join();
        } else {
            all_joined = false;
        }
    }
    all_joined
}

/// Loopback for a wildcard address: what a local client (or the waker) connects to.
fn connectable(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}

/// Percent-encodes what a URI path (or, with `in_query`, a query value) cannot hold.
fn percent_encode(text: &str, in_query: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        let plain = byte.is_ascii_alphanumeric()
            || matches!(byte, b'-' | b'.' | b'_' | b'~' | b'/')
            || (!in_query && matches!(byte, b':' | b'@'));
        if plain {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn io_error(path: &Path, source: io::Error) -> VolumeError {
    VolumeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Binds a UNIX socket, first removing a stale socket file (one nobody listens on). A
/// live socket or a file that is not a socket is an error, never removed.
fn bind_unix(path: &Path) -> Result<UnixListener, VolumeError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if UnixStream::connect(path).is_ok() {
                let source = io::Error::new(
                    io::ErrorKind::AddrInUse,
                    "a server is listening on this socket",
                );
                return Err(io_error(path, source));
            }
            tracing::debug!(path = %path.display(), "nbd: removing a stale socket");
            fs::remove_file(path).map_err(|source| io_error(path, source))?;
        }
        Ok(_) => {
            let source = io::Error::new(io::ErrorKind::AlreadyExists, "exists and is not a socket");
            return Err(io_error(path, source));
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(io_error(path, source)),
    }
    UnixListener::bind(path).map_err(|source| io_error(path, source))
}

/// Bounds a UNIX listener's `accept` by [`ACCEPT_POLL`] (`SO_RCVTIMEO`, which Linux
/// applies to `accept`). std sets that option only on streams, so the descriptor passes
/// through one.
fn bound_accept_unix(listener: UnixListener) -> io::Result<UnixListener> {
    let socket = UnixStream::from(OwnedFd::from(listener));
    socket.set_read_timeout(Some(ACCEPT_POLL))?;
    Ok(UnixListener::from(OwnedFd::from(socket)))
}

/// [`bound_accept_unix`] for TCP.
fn bound_accept_tcp(listener: TcpListener) -> io::Result<TcpListener> {
    let socket = TcpStream::from(OwnedFd::from(listener));
    socket.set_read_timeout(Some(ACCEPT_POLL))?;
    Ok(TcpListener::from(OwnedFd::from(socket)))
}

fn accept_loop(listener: Listener, shared: Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.shutting_down.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((stream, peer)) => spawn_connection(&shared, stream, peer),
            // The periodic wake-up of `ACCEPT_POLL`.
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) => {}
            Err(error) => {
                // Out of descriptors and the like: wait rather than spin.
                tracing::warn!(%error, "nbd: accept failed");
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

fn spawn_connection(shared: &Arc<Shared>, stream: Stream, peer: String) {
    let id = shared.next_connection_id.fetch_add(1, Ordering::Relaxed);
    let registered = match stream.try_clone() {
        Ok(clone) => clone,
        Err(error) => {
            tracing::warn!(connection = id, %error, "nbd: cannot clone the socket; closing");
            return;
        }
    };
    shared.open_connections.lock().insert(id, registered);
    let connection_shared = Arc::clone(shared);
    let spawned = thread::Builder::new()
        .name(format!("nbd-conn-{id}"))
        .spawn(move || serve_connection(connection_shared, id, stream, peer));
    match spawned {
        Ok(handle) => {
            let mut threads = shared.connection_threads.lock();
            // Reap the threads of closed connections.
            let (finished, running): (Vec<_>, Vec<_>) =
                threads.drain(..).partition(|handle| handle.is_finished());
            *threads = running;
            threads.push(handle);
            drop(threads);
            for handle in finished {
                let _ = handle.join();
            }
        }
        Err(error) => {
            tracing::warn!(connection = id, %error, "nbd: cannot spawn a connection thread");
            if let Some(stream) = shared.open_connections.lock().remove(&id) {
                stream.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Why a connection ended early.
enum ConnectionEnd {
    /// The socket failed or closed (the client went away, a timeout, a shutdown).
    Io(io::Error),
    /// The client broke the protocol; the connection is closed.
    Protocol(String),
}

impl From<io::Error> for ConnectionEnd {
    fn from(error: io::Error) -> Self {
        ConnectionEnd::Io(error)
    }
}

fn protocol(error: proto::ProtoError) -> ConnectionEnd {
    ConnectionEnd::Protocol(error.to_string())
}

fn serve_connection(shared: Arc<Shared>, id: u64, mut stream: Stream, peer: String) {
    Counters::add(&shared.stats.connections_accepted, 1);
    Counters::add(&shared.stats.connections_active, 1);
    tracing::debug!(connection = id, peer = %peer, "nbd: client connected");
    let result = handshake(&shared, &mut stream).and_then(|session| match session {
        Some(session) => transmission(&shared, id, session, stream.try_clone()?, &mut stream),
        None => Ok(()),
    });
    match result {
        Ok(()) => tracing::debug!(connection = id, "nbd: client disconnected"),
        Err(ConnectionEnd::Io(error)) => {
            tracing::debug!(connection = id, %error, "nbd: connection closed")
        }
        Err(ConnectionEnd::Protocol(what)) => {
            Counters::add(&shared.stats.protocol_errors, 1);
            tracing::warn!(connection = id, peer = %peer, "nbd: protocol error, closing: {what}");
        }
    }
    stream.shutdown(Shutdown::Both);
    shared.open_connections.lock().remove(&id);
    shared
        .stats
        .connections_active
        .fetch_sub(1, Ordering::Relaxed);
}

/// The export a client chose and how it will talk.
struct Session {
    export: Arc<dyn Export>,
    structured_replies: bool,
}

/// The transmission flags of `export`.
fn transmission_flags(export: &dyn Export, structured_replies: bool) -> u16 {
    let mut flags = proto::FLAG_HAS_FLAGS
        | proto::FLAG_SEND_FLUSH
        | proto::FLAG_SEND_FUA
        | proto::FLAG_SEND_TRIM
        | proto::FLAG_SEND_WRITE_ZEROES
        | proto::FLAG_CAN_MULTI_CONN;
    if export.is_read_only() {
        flags |= proto::FLAG_READ_ONLY;
    }
    if structured_replies {
        flags |= proto::FLAG_SEND_DF;
    }
    flags
}

fn send_option_reply(
    stream: &mut Stream,
    option: u32,
    reply_type: u32,
    data: &[u8],
) -> io::Result<()> {
    stream.write_all(&proto::encode_option_reply(option, reply_type, data))
}

/// Option haggling. `Ok(Some)` enters transmission; `Ok(None)` is a client's abort.
fn handshake(shared: &Shared, stream: &mut Stream) -> Result<Option<Session>, ConnectionEnd> {
    stream.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    stream.write_all(&proto::encode_greeting(
        proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES,
    ))?;
    let mut client_flags = [0; 4];
    stream.read_exact(&mut client_flags)?;
    let client_flags = u32::from_be_bytes(client_flags);
    if client_flags & proto::FLAG_C_FIXED_NEWSTYLE == 0 {
        return Err(ConnectionEnd::Protocol(format!(
            "client flags {client_flags:#x} lack NBD_FLAG_C_FIXED_NEWSTYLE"
        )));
    }
    if client_flags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
        return Err(ConnectionEnd::Protocol(format!(
            "unknown client flags {client_flags:#x}"
        )));
    }
    let no_zeroes = client_flags & proto::FLAG_C_NO_ZEROES != 0;
    let mut structured_replies = false;
    for _ in 0..MAX_OPTIONS {
        let mut header = [0; proto::OPTION_HEADER_LEN];
        stream.read_exact(&mut header)?;
        let header = proto::parse_option_header(&header).map_err(protocol)?;
        let option = header.option;
        if header.length > MAX_OPTION_DATA {
            // Skipping gigabytes is no better than closing: answer, then close.
            let message = format!(
                "option data of {} bytes (limit {MAX_OPTION_DATA})",
                header.length
            );
            let _ = send_option_reply(stream, option, proto::REP_ERR_TOO_BIG, message.as_bytes());
            return Err(ConnectionEnd::Protocol(message));
        }
        let mut data = vec![0; header.length as usize];
        stream.read_exact(&mut data)?;
        match option {
            proto::OPT_EXPORT_NAME => {
                let name = proto::parse_export_name(&data).map_err(protocol)?;
                // This option cannot carry an error: an unknown name ends the session.
                let Some(named) = shared.find(&name) else {
                    return Err(ConnectionEnd::Protocol(format!(
                        "NBD_OPT_EXPORT_NAME of unknown export {name:?}"
                    )));
                };
                let flags = transmission_flags(&*named.export, structured_replies);
                stream.write_all(&proto::encode_export_name_reply(
                    named.export.size(),
                    flags,
                    no_zeroes,
                ))?;
                return Ok(Some(Session {
                    export: Arc::clone(&named.export),
                    structured_replies,
                }));
            }
            proto::OPT_ABORT => {
                // The client may already have closed; the reply is a courtesy.
                let _ = send_option_reply(stream, option, proto::REP_ACK, &[]);
                return Ok(None);
            }
            proto::OPT_LIST => {
                if !data.is_empty() {
                    send_option_reply(
                        stream,
                        option,
                        proto::REP_ERR_INVALID,
                        b"NBD_OPT_LIST takes no data",
                    )?;
                    continue;
                }
                let exports = shared.exports.read().clone();
                for named in &exports {
                    send_option_reply(
                        stream,
                        option,
                        proto::REP_SERVER,
                        &proto::encode_rep_server(&named.name),
                    )?;
                }
                send_option_reply(stream, option, proto::REP_ACK, &[])?;
            }
            proto::OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    let message = b"NBD_OPT_STRUCTURED_REPLY takes no data";
                    send_option_reply(stream, option, proto::REP_ERR_INVALID, message)?;
                    continue;
                }
                structured_replies = true;
                send_option_reply(stream, option, proto::REP_ACK, &[])?;
            }
            proto::OPT_INFO | proto::OPT_GO => {
                let request = match proto::parse_info_request(&data) {
                    Ok(request) => request,
                    Err(error) => {
                        send_option_reply(
                            stream,
                            option,
                            proto::REP_ERR_INVALID,
                            error.to_string().as_bytes(),
                        )?;
                        continue;
                    }
                };
                let Some(named) = shared.find(&request.name) else {
                    let message = format!("no export named {:?}", request.name);
                    send_option_reply(stream, option, proto::REP_ERR_UNKNOWN, message.as_bytes())?;
                    continue;
                };
                let export = &named.export;
                let flags = transmission_flags(&**export, structured_replies);
                send_option_reply(
                    stream,
                    option,
                    proto::REP_INFO,
                    &proto::encode_info_export(export.size(), flags),
                )?;
                if request.info_types.contains(&proto::INFO_NAME) {
                    let info = proto::encode_info_string(proto::INFO_NAME, &named.name);
                    send_option_reply(stream, option, proto::REP_INFO, &info)?;
                }
                // Our constraints are the defaults, so sending them unasked is harmless.
                let block_size = proto::encode_info_block_size(
                    proto::MIN_BLOCK_SIZE,
                    proto::PREFERRED_BLOCK_SIZE,
                    proto::MAX_PAYLOAD,
                );
                send_option_reply(stream, option, proto::REP_INFO, &block_size)?;
                send_option_reply(stream, option, proto::REP_ACK, &[])?;
                if option == proto::OPT_GO {
                    return Ok(Some(Session {
                        export: Arc::clone(export),
                        structured_replies,
                    }));
                }
            }
            other => {
                let message = format!("option {other} is not supported");
                send_option_reply(stream, other, proto::REP_ERR_UNSUP, message.as_bytes())?;
            }
        }
    }
    Err(ConnectionEnd::Protocol(format!(
        "more than {MAX_OPTIONS} options"
    )))
}

/// One checked request waiting for (or in) a worker.
struct Job {
    header: RequestHeader,
    /// A WRITE's data.
    payload: Option<Buffer>,
    /// Bytes this request counts against [`MAX_IN_FLIGHT_BYTES`].
    cost: u64,
}

/// The requests of one connection that are queued or running.
#[derive(Default)]
struct Flight {
    queue: VecDeque<Job>,
    in_flight: usize,
    in_flight_bytes: u64,
    workers: usize,
    idle_workers: usize,
    /// Threads waiting on `slot_freed` (the reader for a slot, `finish` for the last
    /// request): a completion wakes them only when there are some.
    slot_waiters: usize,
    closing: bool,
}

impl Flight {
    /// Frees the slot of a request that has been answered.
    fn release(&mut self, cost: u64, slot_freed: &Condvar) {
        self.in_flight -= 1;
        self.in_flight_bytes -= cost;
        if self.slot_waiters > 0 {
            slot_freed.notify_all();
        }
    }
}

/// A connection in transmission: what its reader and workers share.
struct Connection {
    id: u64,
    shared: Arc<Shared>,
    export: Arc<dyn Export>,
    structured_replies: bool,
    /// The socket's write side; every reply is written whole while holding it.
    writer: Mutex<Stream>,
    flight: Mutex<Flight>,
    /// Signalled when a job is queued or the connection is closing.
    work_ready: Condvar,
    /// Signalled when a request completes.
    slot_freed: Condvar,
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// Replies the reader made itself (`read_at_once`, `write_at_once`), sent together
    /// before it next waits for input: one write for a burst of pipelined requests.
    /// Only the reader touches it.
    deferred: Mutex<Vec<u8>>,
    /// WRITE payloads and READ replies, kept between requests.
    buffers: BufferPool,
}

fn transmission(
    shared: &Arc<Shared>,
    id: u64,
    session: Session,
    writer: Stream,
    reader: &mut Stream,
) -> Result<(), ConnectionEnd> {
    // An idle client may stay as long as it likes; shutdown closes the socket.
    reader.set_read_timeout(None)?;
    let connection = Arc::new(Connection {
        id,
        shared: Arc::clone(shared),
        export: session.export,
        structured_replies: session.structured_replies,
        writer: Mutex::new(writer),
        flight: Mutex::new(Flight::default()),
        work_ready: Condvar::new(),
        slot_freed: Condvar::new(),
        workers: Mutex::new(Vec::new()),
        deferred: Mutex::new(Vec::new()),
        buffers: BufferPool::default(),
    });
    // Buffered: a burst of pipelined requests arrives in one read.
    let mut buffered = io::BufReader::with_capacity(READ_BUFFER, reader);
    let result = connection.read_requests(&mut buffered);
    connection.send_deferred();
    connection.finish();
    result
}

/// Reads a WRITE payload: what the reader has buffered, then — if at least
/// `DIRECT_READ_MIN` bytes are missing — the rest straight from the socket into
/// `payload` (through the buffer it would be copied twice; a small rest goes through
/// it, so one read still brings the requests behind it).
fn read_payload(reader: &mut io::BufReader<&mut Stream>, payload: &mut [u8]) -> io::Result<()> {
    use io::BufRead;
    const DIRECT_READ_MIN: usize = 32 << 10;
    let buffered = reader.buffer().len().min(payload.len());
    if payload.len() - buffered < DIRECT_READ_MIN {
        return reader.read_exact(payload);
    }
    payload[..buffered].copy_from_slice(&reader.buffer()[..buffered]);
    reader.consume(buffered);
    reader.get_mut().read_exact(&mut payload[buffered..])
}

impl Connection {
    /// The reader: parses requests until DISC, end of input or a protocol error.
    fn read_requests(
        self: &Arc<Self>,
        reader: &mut io::BufReader<&mut Stream>,
    ) -> Result<(), ConnectionEnd> {
        loop {
            let mut header = [0; proto::REQUEST_HEADER_LEN];
            if reader.buffer().len() < header.len() {
                self.send_deferred(); // the read below may wait
            }
            reader.read_exact(&mut header)?;
            let header = proto::parse_request(&header).map_err(protocol)?;
            Counters::add(&self.shared.stats.requests, 1);
            match header.command {
                proto::CMD_DISC => return Ok(()),
                proto::CMD_WRITE => {
                    if header.length > proto::MAX_PAYLOAD {
                        // The payload cannot be skipped safely: answer, then close.
                        let message = format!(
                            "WRITE of {} bytes exceeds the maximum payload",
                            header.length
                        );
                        self.send_error(&header, proto::EINVAL, &message);
                        return Err(ConnectionEnd::Protocol(message));
                    }
                    let cost = u64::from(header.length);
                    self.acquire(cost);
                    let mut payload = match self.buffers.take(0, header.length as usize) {
                        Ok(payload) => payload,
                        Err(error) => {
                            // The payload cannot be skipped safely: answer, then close.
                            self.release(cost);
                            let message = format!("no buffer for a WRITE payload: {error}");
                            self.send_error(&header, proto::ENOMEM, &message);
                            return Err(ConnectionEnd::Protocol(message));
                        }
                    };
                    if reader.buffer().len() < payload.data().len() {
                        self.send_deferred();
                    }
                    if let Err(error) = read_payload(reader, payload.data_mut()) {
                        self.release(cost);
                        return Err(error.into());
                    }
                    match self.check(&header) {
                        Ok(()) if self.write_at_once(&header, payload.data()) => {
                            self.release(cost);
                            self.buffers.give(payload);
                        }
                        Ok(()) => self.submit(Job {
                            header,
                            payload: Some(payload),
                            cost,
                        }),
                        Err((errno, message)) => {
                            self.release(cost);
                            self.buffers.give(payload);
                            self.send_error(&header, errno, &message);
                        }
                    }
                }
                _ => match self.check(&header) {
                    Ok(()) if header.command == proto::CMD_READ && self.read_at_once(&header) => {}
                    Ok(()) => {
                        let cost = if header.command == proto::CMD_READ {
                            u64::from(header.length)
                        } else {
                            0
                        };
                        self.acquire(cost);
                        self.submit(Job {
                            header,
                            payload: None,
                            cost,
                        });
                    }
                    Err((errno, message)) => self.send_error(&header, errno, &message),
                },
            }
        }
    }

    /// Checks a request's command, flags and range against the export.
    fn check(&self, header: &RequestHeader) -> Result<(), (u32, String)> {
        let command = proto::command_name(header.command);
        let allowed_flags = match header.command {
            proto::CMD_READ if self.structured_replies => proto::CMD_FLAG_FUA | proto::CMD_FLAG_DF,
            proto::CMD_READ | proto::CMD_WRITE | proto::CMD_FLUSH | proto::CMD_TRIM => {
                proto::CMD_FLAG_FUA
            }
            proto::CMD_WRITE_ZEROES => proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE,
            _ => return Err((proto::EINVAL, format!("{command} is not supported"))),
        };
        if header.flags & !allowed_flags != 0 {
            return Err((
                proto::EINVAL,
                format!("flags {:#x} are not valid for {command}", header.flags),
            ));
        }
        if header.command == proto::CMD_FLUSH {
            return Ok(());
        }
        let writes = header.command != proto::CMD_READ;
        if writes && self.export.is_read_only() {
            return Err((proto::EPERM, "the export is read-only".into()));
        }
        if header.length == 0 {
            return Err((proto::EINVAL, format!("{command} of length 0")));
        }
        if header.command == proto::CMD_READ && header.length > proto::MAX_PAYLOAD {
            return Err((
                proto::EINVAL,
                format!(
                    "READ of {} bytes exceeds the maximum payload",
                    header.length
                ),
            ));
        }
        let size = self.export.size();
        let end = header.offset.checked_add(u64::from(header.length));
        if end.is_none_or(|end| end > size) {
            let errno = match header.command {
                proto::CMD_WRITE | proto::CMD_WRITE_ZEROES => proto::ENOSPC,
                _ => proto::EINVAL,
            };
            let message = format!(
                "{command} of {} bytes at {} is past the end ({size} bytes)",
                header.length, header.offset
            );
            return Err((errno, message));
        }
        Ok(())
    }

    /// Takes an in-flight slot, waiting while the connection's limits are reached.
    fn acquire(&self, cost: u64) {
        let full = |f: &Flight| {
            f.in_flight >= MAX_IN_FLIGHT
                || (f.in_flight > 0 && f.in_flight_bytes + cost > MAX_IN_FLIGHT_BYTES)
        };
        let mut flight = self.flight.lock();
        if full(&flight) {
            // About to wait: the replies held back go first (never `deferred` under
            // `flight`).
            drop(flight);
            self.send_deferred();
            flight = self.flight.lock();
        }
        while full(&flight) {
            flight.slot_waiters += 1;
            self.slot_freed.wait(&mut flight);
            flight.slot_waiters -= 1;
        }
        flight.in_flight += 1;
        flight.in_flight_bytes += cost;
    }

    fn release(&self, cost: u64) {
        self.flight.lock().release(cost, &self.slot_freed);
    }

    /// Queues a job (its slot already taken), adding a worker if none is free.
    fn submit(self: &Arc<Self>, job: Job) {
        let mut flight = self.flight.lock();
        flight.queue.push_back(job);
        if flight.queue.len() <= flight.idle_workers || flight.workers >= WORKERS_PER_CONNECTION {
            self.work_ready.notify_one();
            return;
        }
        flight.workers += 1;
        drop(flight);
        let connection = Arc::clone(self);
        let spawned = thread::Builder::new()
            .name(format!("nbd-work-{}", self.id))
            .spawn(move || connection.work());
        match spawned {
            Ok(handle) => self.workers.lock().push(handle),
            Err(error) => {
                tracing::warn!(connection = self.id, %error, "nbd: cannot spawn a worker");
                let mut flight = self.flight.lock();
                flight.workers -= 1;
                if flight.workers == 0 {
                    // Nobody else would run it: run it here.
                    let job = flight.queue.pop_front();
                    drop(flight);
                    if let Some(job) = job {
                        self.run(job);
                    }
                }
            }
        }
    }

    /// A worker: runs queued jobs until the connection closes. It frees the slot of the
    /// job it answered and takes the next one under one lock.
    fn work(&self) {
        let mut answered: Option<u64> = None;
        loop {
            let job = {
                let mut flight = self.flight.lock();
                if let Some(cost) = answered.take() {
                    flight.release(cost, &self.slot_freed);
                }
                loop {
                    if let Some(job) = flight.queue.pop_front() {
                        break job;
                    }
                    if flight.closing {
                        flight.workers -= 1;
                        return;
                    }
                    flight.idle_workers += 1;
                    self.work_ready.wait(&mut flight);
                    flight.idle_workers -= 1;
                }
            };
            answered = Some(self.answer(job));
        }
    }

    /// Runs one job, answers it and frees its slot.
    fn run(&self, job: Job) {
        let cost = self.answer(job);
        self.release(cost);
    }

    /// Runs one job and answers it; its cost, for the caller to release.
    fn answer(&self, mut job: Job) -> u64 {
        self.execute(&job);
        if let Some(payload) = job.payload.take() {
            self.buffers.give(payload);
        }
        job.cost
    }

    fn execute(&self, job: &Job) {
        let header = job.header;
        let fua = header.flags & proto::CMD_FLAG_FUA != 0;
        let (offset, length) = (header.offset, u64::from(header.length));
        let stats = &self.shared.stats;
        let result = match header.command {
            proto::CMD_READ => return self.execute_read(&header),
            proto::CMD_WRITE => {
                let payload = job.payload.as_ref().map_or(&[][..], Buffer::data);
                self.export.write(offset, payload, fua).inspect(|()| {
                    Counters::add(&stats.bytes_written, length);
                })
            }
            proto::CMD_FLUSH => self
                .export
                .flush()
                .inspect(|()| Counters::add(&stats.flushes, 1)),
            proto::CMD_TRIM => self.export.trim(offset, length, fua),
            proto::CMD_WRITE_ZEROES => self.export.write_zeroes(offset, length, fua),
            _ => {
                // `check` lets no other command through.
                let message = format!("{} is not supported", proto::command_name(header.command));
                self.send_error(&header, proto::EINVAL, &message);
                return;
            }
        };
        match result {
            Ok(()) => self.send(&proto::encode_simple_reply(0, header.cookie)),
            Err(error) => self.export_failed(&header, &error),
        }
    }

    /// Answers a READ on the reader's own thread if the export can serve it from memory
    /// ([`Export::read_cached`]); false if it must go to a worker.
    fn read_at_once(&self, header: &RequestHeader) -> bool {
        let Ok(mut reply) = self.read_buffer(header) else {
            return false; // the worker answers the allocation failure
        };
        let answered = match self.export.read_cached(header.offset, reply.data_mut()) {
            None => false,
            Some(Ok(())) => {
                self.finish_read_reply(header, reply.framed_mut());
                self.defer(reply.framed());
                true
            }
            Some(Err(error)) => {
                self.export_failed(header, &error);
                true
            }
        };
        self.buffers.give(reply);
        answered
    }

    /// A buffer for a READ's reply: room for its header, then block-aligned data.
    fn read_buffer(&self, header: &RequestHeader) -> Result<Buffer, MediaError> {
        self.buffers
            .take(self.read_reply_prefix(), header.length as usize)
    }

    /// Answers a WRITE on the reader's own thread if the export can do it in memory
    /// ([`Export::write_at_once`]); false if it must go to a worker.
    fn write_at_once(&self, header: &RequestHeader, payload: &[u8]) -> bool {
        let fua = header.flags & proto::CMD_FLAG_FUA != 0;
        match self.export.write_at_once(header.offset, payload, fua) {
            None => false,
            Some(Ok(())) => {
                Counters::add(&self.shared.stats.bytes_written, u64::from(header.length));
                self.defer(&proto::encode_simple_reply(0, header.cookie));
                true
            }
            Some(Err(error)) => {
                self.export_failed(header, &error);
                true
            }
        }
    }

    fn read_reply_prefix(&self) -> usize {
        if self.structured_replies {
            proto::OFFSET_DATA_PREFIX_LEN
        } else {
            proto::SIMPLE_REPLY_LEN
        }
    }

    /// Reads into a buffer that already holds room for the reply header, so the whole
    /// reply leaves in one write.
    fn execute_read(&self, header: &RequestHeader) {
        let mut reply = match self.read_buffer(header) {
            Ok(reply) => reply,
            Err(error) => {
                let message = format!("no buffer for a READ reply: {error}");
                self.send_error(header, proto::ENOMEM, &message);
                return;
            }
        };
        match self.export.read(header.offset, reply.data_mut()) {
            Ok(()) => {
                self.finish_read_reply(header, reply.framed_mut());
                self.send(reply.framed());
            }
            Err(error) => self.export_failed(header, &error),
        }
        self.buffers.give(reply);
    }

    /// Fills in the reply header of a read's `reply` (data after the prefix).
    fn finish_read_reply(&self, header: &RequestHeader, reply: &mut [u8]) {
        let prefix = self.read_reply_prefix();
        if self.structured_replies {
            let mut chunk_prefix = [0; proto::OFFSET_DATA_PREFIX_LEN];
            proto::write_offset_data_prefix(
                &mut chunk_prefix,
                proto::REPLY_FLAG_DONE,
                header.cookie,
                header.offset,
                header.length,
            );
            reply[..prefix].copy_from_slice(&chunk_prefix);
        } else {
            reply[..prefix].copy_from_slice(&proto::encode_simple_reply(0, header.cookie));
        }
        Counters::add(&self.shared.stats.bytes_read, u64::from(header.length));
    }

    /// Adds a reply the reader made to those it sends before it next waits for input
    /// (at once past DEFERRED_MAX bytes).
    fn defer(&self, reply: &[u8]) {
        let mut deferred = self.deferred.lock();
        deferred.extend_from_slice(reply);
        if deferred.len() >= DEFERRED_MAX {
            self.send(&deferred);
            deferred.clear();
        }
    }

    /// Sends the replies the reader deferred.
    fn send_deferred(&self) {
        let mut deferred = self.deferred.lock();
        if !deferred.is_empty() {
            self.send(&deferred);
            deferred.clear();
        }
    }

    /// Answers a request the export failed (an I/O error, not a client mistake).
    fn export_failed(&self, header: &RequestHeader, error: &BlockError) {
        tracing::warn!(
            connection = self.id,
            command = %proto::command_name(header.command),
            offset = header.offset,
            length = header.length,
            "nbd: export failed: {error}"
        );
        self.send_error(header, error.errno(), &error.to_string());
    }

    /// Answers a request with `errno` (and, with structured replies, `message`).
    fn send_error(&self, header: &RequestHeader, errno: u32, message: &str) {
        Counters::add(&self.shared.stats.errors, 1);
        tracing::debug!(
            connection = self.id,
            command = %proto::command_name(header.command),
            offset = header.offset,
            length = header.length,
            errno,
            "nbd: request refused: {message}"
        );
        if self.structured_replies {
            self.send(&proto::encode_error_chunk(header.cookie, errno, message));
        } else {
            self.send(&proto::encode_simple_reply(errno, header.cookie));
        }
    }

    /// Writes one whole reply. A failure means the client is gone: the socket is closed
    /// so the reader stops too.
    fn send(&self, reply: &[u8]) {
        let mut writer = self.writer.lock();
        if let Err(error) = writer.write_all(reply) {
            tracing::debug!(connection = self.id, %error, "nbd: reply not sent; closing");
            writer.shutdown(Shutdown::Both);
        }
    }

    /// Waits for the requests in flight to be answered, then stops and joins the
    /// workers.
    fn finish(&self) {
        let mut flight = self.flight.lock();
        while flight.in_flight > 0 {
            flight.slot_waiters += 1;
            self.slot_freed.wait(&mut flight);
            flight.slot_waiters -= 1;
        }
        flight.closing = true;
        self.work_ready.notify_all();
        drop(flight);
        for handle in std::mem::take(&mut *self.workers.lock()) {
            let _ = handle.join();
        }
    }
}

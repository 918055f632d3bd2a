//! [`NbdBackend`]: a [`Backend`] over any NBD server (nbdkit, qemu-nbd, our own
//! [`NbdServer`](super::NbdServer)), through a pool of synchronous connections.
//!
//! Each connection negotiates fixed newstyle and `NBD_OPT_GO` (falling back to
//! `NBD_OPT_EXPORT_NAME` for servers without it) and uses simple replies. A request
//! checks a connection out of the pool, sends one request, reads its reply and returns
//! the connection, so as many requests run at once as the pool has connections.
//!
//! Invariants:
//! - A connection has at most one request outstanding; a reply whose magic or cookie is
//!   wrong breaks the connection rather than being trusted.
//! - READ and WRITE payloads never exceed the server's maximum (at most 32 MiB): larger
//!   requests are split.
//! - A connection that fails at the transport level is dropped; the request is retried
//!   once on a fresh connection, then fails. An error the server reports (an errno) is
//!   returned as `io::Error::from_raw_os_error` and the connection stays in use.
//! - Every socket read and write has a timeout, so a stuck server is an error, not a
//!   hang.
//! - `trim` must leave zeroes (the [`Backend`] contract) and `NBD_CMD_TRIM` does not
//!   promise that, so it is sent as `NBD_CMD_WRITE_ZEROES` without `NO_HOLE` (the server
//!   may punch a hole), or as written zeroes when the server lacks that command.
//! - `flush` goes to one connection when the server sets `CAN_MULTI_CONN`, else to every
//!   connection of the pool.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use super::proto::{self, Info, RequestHeader};
use super::Stream;
use crate::backend::{Backend, BLOCK_SIZE};
use crate::error::VolumeError;

/// The socket read/write timeout of [`NbdBackend::connect`].
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(60);
/// The most connections one backend opens.
pub const MAX_CONNECTIONS: usize = 256;
/// The largest option reply accepted during the handshake.
const MAX_OPTION_REPLY: u32 = 64 << 10;
/// The largest buffer of zeroes written at once when the server cannot zero.
const ZERO_CHUNK: usize = 4 << 20;

/// Where the server is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Unix(PathBuf),
    Tcp { host: String, port: u16 },
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Unix(path) => write!(f, "unix:{}", path.display()),
            Target::Tcp { host, port } if host.contains(':') => write!(f, "tcp:[{host}]:{port}"),
            Target::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
        }
    }
}

/// What the handshake learnt about the export.
#[derive(Debug, Clone, Copy)]
struct Negotiated {
    size: u64,
    transmission_flags: u16,
    /// The largest READ/WRITE payload to send.
    max_payload: u32,
}

/// One connection in transmission phase.
struct Connection {
    stream: Stream,
    next_cookie: u64,
}

/// Why a request failed.
enum Failure {
    /// The connection is unusable (closed, timed out, out of sync).
    Transport(io::Error),
    /// The server answered with this error; the connection is still good.
    Server(u32),
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Self {
        Failure::Transport(error)
    }
}

/// A backend over an NBD export, with a pool of connections.
pub struct NbdBackend {
    target: Target,
    export: String,
    io_timeout: Duration,
    negotiated: Negotiated,
    connections: usize,
    /// Idle connections; `None` is a slot whose connection broke, reopened when used.
    pool: Mutex<Vec<Option<Connection>>>,
    slot_returned: Condvar,
    /// Serialises flushes that gather every connection, so two never deadlock.
    flush_all: Mutex<()>,
}

/// A pool slot checked out by one request; dropping it returns the slot.
struct Checkout<'a> {
    backend: &'a NbdBackend,
    connection: Option<Connection>,
}

impl Drop for Checkout<'_> {
    fn drop(&mut self) {
        self.backend.pool.lock().push(self.connection.take());
        // All: a flush gathering every slot must not be starved by single requests.
        self.backend.slot_returned.notify_all();
    }
}

impl NbdBackend {
    /// Connects `connections` connections to the export at `uri`:
    /// `nbd+unix:///EXPORT?socket=PATH` or `nbd://HOST[:PORT]/EXPORT` (the export name may
    /// be empty; the port defaults to 10809). Socket timeouts are [`DEFAULT_IO_TIMEOUT`].
    pub fn connect(uri: &str, connections: usize) -> Result<NbdBackend, VolumeError> {
        NbdBackend::connect_with_timeout(uri, connections, DEFAULT_IO_TIMEOUT)
    }

    /// [`NbdBackend::connect`] with another socket read/write (and TCP connect) timeout.
    pub fn connect_with_timeout(
        uri: &str,
        connections: usize,
        io_timeout: Duration,
    ) -> Result<NbdBackend, VolumeError> {
        if connections == 0 || connections > MAX_CONNECTIONS {
            return Err(VolumeError::Config(format!(
                "NBD backend connections must be 1..={MAX_CONNECTIONS}, not {connections}"
            )));
        }
        if io_timeout.is_zero() {
            return Err(VolumeError::Config(
                "NBD backend timeout must not be zero".into(),
            ));
        }
        let (target, export) = parse_uri(uri)?;
        let backend_error = |source| VolumeError::Backend {
            what: format!("nbd connect {uri}"),
            source,
        };
        let (first, negotiated) =
            open_connection(&target, &export, io_timeout).map_err(backend_error)?;
        let mut pool = Vec::with_capacity(connections);
        pool.push(Some(first));
        for _ in 1..connections {
            let (connection, other) =
                open_connection(&target, &export, io_timeout).map_err(backend_error)?;
            if other.size != negotiated.size {
                return Err(backend_error(size_changed(negotiated.size, other.size)));
            }
            pool.push(Some(connection));
        }
        tracing::debug!(
            server = %target,
            export = %export,
            size = negotiated.size,
            flags = negotiated.transmission_flags,
            connections,
            "nbd backend connected"
        );
        if connections > 1 && negotiated.transmission_flags & proto::FLAG_CAN_MULTI_CONN == 0 {
            tracing::debug!(
                server = %target,
                "nbd: server lacks CAN_MULTI_CONN; flushes go to every connection"
            );
        }
        Ok(NbdBackend {
            target,
            export,
            io_timeout,
            negotiated,
            connections,
            pool: Mutex::new(pool),
            slot_returned: Condvar::new(),
            flush_all: Mutex::new(()),
        })
    }

    /// The transmission flags the server sent (`proto::FLAG_*`).
    pub fn transmission_flags(&self) -> u16 {
        self.negotiated.transmission_flags
    }

    /// Whether the server exports the device read-only.
    pub fn is_read_only(&self) -> bool {
        self.negotiated.transmission_flags & proto::FLAG_READ_ONLY != 0
    }

    /// Connections in the pool (the most requests in flight at once).
    pub fn connections(&self) -> usize {
        self.connections
    }

    fn has_flag(&self, flag: u16) -> bool {
        self.negotiated.transmission_flags & flag != 0
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        crate::backend::check_range(offset, len, self.negotiated.size, || "nbd export".into())
    }

    /// Takes a slot from the pool, preferring a live connection; waits if all are busy.
    fn checkout(&self) -> Checkout<'_> {
        let mut pool = self.pool.lock();
        while pool.is_empty() {
            self.slot_returned.wait(&mut pool);
        }
        let index = pool
            .iter()
            .rposition(Option::is_some)
            .unwrap_or(pool.len() - 1);
        let connection = pool.swap_remove(index);
        Checkout {
            backend: self,
            connection,
        }
    }

    /// Takes every slot of the pool, waiting for busy ones (callers hold `flush_all`).
    fn checkout_all(&self) -> Vec<Checkout<'_>> {
        let mut taken = Vec::with_capacity(self.connections);
        while taken.len() < self.connections {
            let mut pool = self.pool.lock();
            while pool.is_empty() {
                self.slot_returned.wait(&mut pool);
            }
            let slots: Vec<_> = pool.drain(..).collect();
            drop(pool);
            taken.extend(slots.into_iter().map(|connection| Checkout {
                backend: self,
                connection,
            }));
        }
        taken
    }

    /// Opens a replacement connection and checks it reaches the same export.
    fn reconnect(&self) -> io::Result<Connection> {
        let (connection, negotiated) =
            open_connection(&self.target, &self.export, self.io_timeout)?;
        if negotiated.size != self.negotiated.size {
            return Err(size_changed(self.negotiated.size, negotiated.size));
        }
        Ok(connection)
    }

    /// Runs `request` on the checked-out connection (opening one if the slot is empty);
    /// after a transport failure, once more on a fresh connection.
    fn with_connection<F>(
        &self,
        checkout: &mut Checkout<'_>,
        what: &str,
        mut request: F,
    ) -> io::Result<()>
    where
        F: FnMut(&mut Connection) -> Result<(), Failure>,
    {
        let mut reconnected = false;
        loop {
            let connection = match checkout.connection.take() {
                Some(connection) => connection,
                None => self.reconnect()?,
            };
            let connection = checkout.connection.insert(connection);
            match request(connection) {
                Ok(()) => return Ok(()),
                Err(Failure::Server(errno)) => {
                    return Err(io::Error::from_raw_os_error(errno as i32))
                }
                Err(Failure::Transport(error)) => {
                    checkout.connection = None;
                    if reconnected {
                        return Err(error);
                    }
                    reconnected = true;
                    tracing::warn!(
                        backend = %self.describe(),
                        %error,
                        "nbd: {what} failed; reconnecting"
                    );
                }
            }
        }
    }

    /// One request on any connection of the pool.
    fn on_any_connection<F>(&self, what: &str, request: F) -> io::Result<()>
    where
        F: FnMut(&mut Connection) -> Result<(), Failure>,
    {
        let mut checkout = self.checkout();
        self.with_connection(&mut checkout, what, request)
    }

    fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        let piece_len = u64::from(self.negotiated.max_payload);
        let mut done = 0;
        if self.has_flag(proto::FLAG_SEND_WRITE_ZEROES) {
            while done < len {
                let piece = (len - done).min(piece_len) as u32;
                self.on_any_connection("write zeroes", |connection| {
                    connection.request(proto::CMD_WRITE_ZEROES, offset + done, piece, &[], &mut [])
                })?;
                done += u64::from(piece);
            }
            return Ok(());
        }
        let zeroes = vec![0; (len.min(piece_len) as usize).min(ZERO_CHUNK)];
        while done < len {
            let piece = &zeroes[..(len - done).min(zeroes.len() as u64) as usize];
            self.write_at(offset + done, piece)?;
            done += piece.len() as u64;
        }
        Ok(())
    }
}

impl Backend for NbdBackend {
    fn size(&self) -> u64 {
        self.negotiated.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let mut piece_offset = offset;
        for piece in buf.chunks_mut(self.negotiated.max_payload as usize) {
            let len = piece.len() as u32;
            self.on_any_connection("read", |connection| {
                connection.request(proto::CMD_READ, piece_offset, len, &[], &mut *piece)
            })?;
            piece_offset += u64::from(len);
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.check_range(offset, data.len() as u64)?;
        let mut piece_offset = offset;
        for piece in data.chunks(self.negotiated.max_payload as usize) {
            let len = piece.len() as u32;
            self.on_any_connection("write", |connection| {
                connection.request(proto::CMD_WRITE, piece_offset, len, piece, &mut [])
            })?;
            piece_offset += u64::from(len);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let flush =
            |connection: &mut Connection| connection.request(proto::CMD_FLUSH, 0, 0, &[], &mut []);
        if self.has_flag(proto::FLAG_CAN_MULTI_CONN) || self.connections == 1 {
            return self.on_any_connection("flush", flush);
        }
        // Without CAN_MULTI_CONN a flush covers only its own connection's writes.
        let _one_at_a_time = self.flush_all.lock();
        let mut result = Ok(());
        for mut checkout in self.checkout_all() {
            if checkout.connection.is_none() {
                continue; // Nothing was written through a connection that is gone.
            }
            if let Err(error) = self.with_connection(&mut checkout, "flush", flush) {
                result = Err(error);
            }
        }
        result
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check_range(offset, len)?;
        self.zero(offset, len)
    }

    fn describe(&self) -> String {
        format!("nbd {} export {:?}", self.target, self.export)
    }
}

impl Drop for NbdBackend {
    fn drop(&mut self) {
        // A soft disconnect on each live connection (servers log hard ones).
        for connection in self.pool.get_mut().iter_mut().flatten() {
            let _ = connection
                .stream
                .set_write_timeout(Some(Duration::from_secs(1)));
            let disconnect = RequestHeader {
                flags: 0,
                command: proto::CMD_DISC,
                cookie: connection.next_cookie,
                offset: 0,
                length: 0,
            };
            let _ = connection
                .stream
                .write_all(&proto::encode_request(&disconnect));
        }
    }
}

impl fmt::Debug for NbdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NbdBackend")
            .field("target", &self.target)
            .field("export", &self.export)
            .field("size", &self.negotiated.size)
            .field("transmission_flags", &self.negotiated.transmission_flags)
            .field("connections", &self.connections)
            .finish()
    }
}

impl Connection {
    /// Sends one request and reads its simple reply; a READ's data lands in `read_into`
    /// (`length` bytes), a WRITE's comes from `payload`.
    fn request(
        &mut self,
        command: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
        read_into: &mut [u8],
    ) -> Result<(), Failure> {
        let cookie = self.next_cookie;
        self.next_cookie = self.next_cookie.wrapping_add(1);
        let header = proto::encode_request(&RequestHeader {
            flags: 0,
            command,
            cookie,
            offset,
            length,
        });
        if payload.is_empty() {
            self.stream.write_all(&header)?;
        } else if payload.len() <= 1 << 20 {
            // Small payloads leave with their header in one write (one TCP segment).
            let mut message = Vec::with_capacity(header.len() + payload.len());
            message.extend_from_slice(&header);
            message.extend_from_slice(payload);
            self.stream.write_all(&message)?;
        } else {
            self.stream.write_all(&header)?;
            self.stream.write_all(payload)?;
        }
        let mut reply = [0; proto::SIMPLE_REPLY_LEN];
        self.stream.read_exact(&mut reply)?;
        let reply = proto::parse_simple_reply(&reply).map_err(invalid_data)?;
        if reply.cookie != cookie {
            return Err(Failure::Transport(invalid_data(format!(
                "reply for cookie {}, expected {cookie}",
                reply.cookie
            ))));
        }
        if reply.error != 0 {
            return Err(Failure::Server(reply.error));
        }
        if command == proto::CMD_READ {
            self.stream.read_exact(read_into)?;
        }
        Ok(())
    }
}

fn invalid_data(error: impl ToString) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error.to_string())
}

fn size_changed(was: u64, now: u64) -> io::Error {
    invalid_data(format!(
        "the export's size changed from {was} to {now} bytes"
    ))
}

/// Connects and negotiates one connection.
fn open_connection(
    target: &Target,
    export: &str,
    io_timeout: Duration,
) -> io::Result<(Connection, Negotiated)> {
    let stream = match target {
        Target::Unix(path) => Stream::Unix(UnixStream::connect(path)?),
        Target::Tcp { host, port } => {
            let mut last_error = None;
            let mut connected = None;
            for addr in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&addr, io_timeout) {
                    Ok(stream) => {
                        connected = Some(stream);
                        break;
                    }
                    Err(error) => last_error = Some(error),
                }
            }
            let stream = match (connected, last_error) {
                (Some(stream), _) => stream,
                (None, Some(error)) => return Err(error),
                (None, None) => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{host} has no address"),
                    ))
                }
            };
            stream.set_nodelay(true)?;
            Stream::Tcp(stream)
        }
    };
    stream.set_read_timeout(Some(io_timeout))?;
    stream.set_write_timeout(Some(io_timeout))?;
    let mut connection = Connection {
        stream,
        next_cookie: 1,
    };
    let negotiated = negotiate(&mut connection.stream, export)?;
    Ok((connection, negotiated))
}

/// The client's side of fixed newstyle negotiation, ending in transmission phase.
fn negotiate(stream: &mut Stream, export: &str) -> io::Result<Negotiated> {
    let mut greeting = [0; proto::GREETING_LEN];
    stream.read_exact(&mut greeting)?;
    let handshake_flags = proto::parse_greeting(&greeting).map_err(invalid_data)?;
    if handshake_flags & proto::FLAG_FIXED_NEWSTYLE == 0 {
        return Err(invalid_data("the server does not speak fixed newstyle NBD"));
    }
    let no_zeroes = handshake_flags & proto::FLAG_NO_ZEROES != 0;
    let mut client_flags = proto::FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        client_flags |= proto::FLAG_C_NO_ZEROES;
    }
    stream.write_all(&client_flags.to_be_bytes())?;
    let go = proto::encode_info_request(export, &[proto::INFO_BLOCK_SIZE]);
    stream.write_all(&proto::encode_option(proto::OPT_GO, &go))?;
    let mut export_info = None;
    let mut block_size = None;
    loop {
        let mut header = [0; proto::OPTION_REPLY_HEADER_LEN];
        stream.read_exact(&mut header)?;
        let header = proto::parse_option_reply_header(&header).map_err(invalid_data)?;
        if header.option != proto::OPT_GO {
            return Err(invalid_data(format!(
                "a reply to option {} during NBD_OPT_GO",
                header.option
            )));
        }
        if header.length > MAX_OPTION_REPLY {
            return Err(invalid_data(format!(
                "an option reply of {} bytes",
                header.length
            )));
        }
        let mut data = vec![0; header.length as usize];
        stream.read_exact(&mut data)?;
        match header.reply_type {
            proto::REP_INFO => match proto::parse_info(&data).map_err(invalid_data)? {
                Info::Export {
                    size,
                    transmission_flags,
                } => export_info = Some((size, transmission_flags)),
                Info::BlockSize {
                    minimum,
                    preferred: _,
                    maximum,
                } => block_size = Some((minimum, maximum)),
                Info::Other(_) => {}
            },
            proto::REP_ACK => break,
            proto::REP_ERR_UNSUP => return export_name_fallback(stream, export, no_zeroes),
            reply_type if reply_type & proto::REP_FLAG_ERROR != 0 => {
                let message = String::from_utf8_lossy(&data);
                let kind = if reply_type == proto::REP_ERR_UNKNOWN {
                    io::ErrorKind::NotFound
                } else {
                    io::ErrorKind::ConnectionRefused
                };
                return Err(io::Error::new(
                    kind,
                    format!(
                        "the server refused export {export:?} (reply {reply_type:#x}): {message}"
                    ),
                ));
            }
            other => {
                return Err(invalid_data(format!(
                    "unexpected option reply type {other:#x}"
                )))
            }
        }
    }
    let Some((size, transmission_flags)) = export_info else {
        return Err(invalid_data("NBD_OPT_GO succeeded without NBD_INFO_EXPORT"));
    };
    let max_payload = match block_size {
        None => proto::MAX_PAYLOAD,
        Some((minimum, maximum)) => {
            let minimum = minimum.max(1);
            if !minimum.is_power_of_two() || minimum as usize > BLOCK_SIZE {
                return Err(invalid_data(format!(
                    "the server's minimum block size {minimum} exceeds {BLOCK_SIZE}"
                )));
            }
            let max_payload = maximum.min(proto::MAX_PAYLOAD);
            let max_payload = max_payload - max_payload % minimum;
            if max_payload == 0 {
                return Err(invalid_data(format!(
                    "the server's maximum payload {maximum} is unusable"
                )));
            }
            max_payload
        }
    };
    Ok(Negotiated {
        size,
        transmission_flags,
        max_payload,
    })
}

/// `NBD_OPT_EXPORT_NAME`, for servers that answered `NBD_OPT_GO` with `ERR_UNSUP`.
fn export_name_fallback(
    stream: &mut Stream,
    export: &str,
    no_zeroes: bool,
) -> io::Result<Negotiated> {
    stream.write_all(&proto::encode_option(
        proto::OPT_EXPORT_NAME,
        export.as_bytes(),
    ))?;
    let mut reply = vec![
        0;
        10 + if no_zeroes {
            0
        } else {
            proto::EXPORT_NAME_PADDING
        }
    ];
    stream.read_exact(&mut reply)?;
    let (size, transmission_flags) =
        proto::parse_export_name_reply(&reply).map_err(invalid_data)?;
    Ok(Negotiated {
        size,
        transmission_flags,
        max_payload: proto::MAX_PAYLOAD,
    })
}

fn config_error(uri: &str, what: &str) -> VolumeError {
    VolumeError::Config(format!("NBD URI {uri:?}: {what}"))
}

/// Splits an NBD URI into the server's address and the export name.
fn parse_uri(uri: &str) -> Result<(Target, String), VolumeError> {
    let (scheme, rest) = uri
        .split_once("://")
        .ok_or_else(|| config_error(uri, "not a URI"))?;
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(slash) => (&before_query[..slash], &before_query[slash + 1..]),
        None => (before_query, ""),
    };
    let export = percent_decode(path).ok_or_else(|| config_error(uri, "bad percent-encoding"))?;
    match scheme {
        "nbd+unix" => {
            if !authority.is_empty() {
                return Err(config_error(
                    uri,
                    "nbd+unix URIs have no host (nbd+unix:///EXPORT?socket=PATH)",
                ));
            }
            let socket = query
                .into_iter()
                .flat_map(|query| query.split('&'))
                .find_map(|pair| pair.strip_prefix("socket="))
                .ok_or_else(|| config_error(uri, "no socket=PATH"))?;
            let socket =
                percent_decode(socket).ok_or_else(|| config_error(uri, "bad percent-encoding"))?;
            if socket.is_empty() {
                return Err(config_error(uri, "empty socket path"));
            }
            Ok((Target::Unix(PathBuf::from(socket)), export))
        }
        "nbd" => {
            let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
                let (host, after) = bracketed
                    .split_once(']')
                    .ok_or_else(|| config_error(uri, "unclosed [ in the host"))?;
                (host, after.strip_prefix(':'))
            } else {
                match authority.rsplit_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (authority, None),
                }
            };
            if host.is_empty() {
                return Err(config_error(uri, "no host"));
            }
            let port = match port {
                None => 10809,
                Some(port) => port.parse().map_err(|_| config_error(uri, "bad port"))?,
            };
            Ok((
                Target::Tcp {
                    host: host.to_owned(),
                    port,
                },
                export,
            ))
        }
        "nbds" | "nbds+unix" => Err(config_error(uri, "TLS (nbds) is not supported")),
        _ => Err(config_error(
            uri,
            "the scheme must be nbd:// or nbd+unix://",
        )),
    }
}

/// Decodes `%XX` escapes; `None` for a malformed escape or bytes that are not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = bytes.get(index + 1..index + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(uri: &str) -> (Target, String) {
        parse_uri(uri).unwrap()
    }

    #[test]
    fn unix_uris() {
        assert_eq!(
            parse("nbd+unix:///?socket=/tmp/s"),
            (Target::Unix("/tmp/s".into()), String::new())
        );
        assert_eq!(
            parse("nbd+unix:///disk%201?socket=/tmp/a%20b&other=1"),
            (Target::Unix("/tmp/a b".into()), "disk 1".to_owned())
        );
        assert_eq!(parse("nbd+unix://?socket=/s").1, "");
        assert!(parse_uri("nbd+unix:///x").is_err());
        assert!(parse_uri("nbd+unix://host/x?socket=/s").is_err());
        assert!(parse_uri("nbd+unix:///x?socket=").is_err());
    }

    #[test]
    fn tcp_uris() {
        let tcp = |host: &str, port| Target::Tcp {
            host: host.to_owned(),
            port,
        };
        assert_eq!(
            parse("nbd://127.0.0.1:1234/vol"),
            (tcp("127.0.0.1", 1234), "vol".to_owned())
        );
        assert_eq!(
            parse("nbd://example.org"),
            (tcp("example.org", 10809), String::new())
        );
        assert_eq!(parse("nbd://[::1]:99/"), (tcp("::1", 99), String::new()));
        assert_eq!(
            parse("nbd://[::1]/a/b"),
            (tcp("::1", 10809), "a/b".to_owned())
        );
        assert!(parse_uri("nbd://:1/").is_err());
        assert!(parse_uri("nbd://h:port/").is_err());
        assert!(parse_uri("nbd://h:70000/").is_err());
        assert!(parse_uri("nbds://h/").is_err());
        assert!(parse_uri("http://h/").is_err());
        assert!(parse_uri("nbd:/h").is_err());
        assert!(parse_uri("nbd://h/%zz").is_err());
        assert!(parse_uri("nbd://h/%4").is_err());
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%2Fb%41").as_deref(), Some("a/bA"));
        assert_eq!(percent_decode("%c3%a9").as_deref(), Some("é"));
        assert_eq!(percent_decode("%ff"), None);
        assert_eq!(percent_decode("%"), None);
        assert_eq!(percent_decode("%+1"), None);
    }

    #[test]
    fn connect_refuses_bad_settings() {
        assert!(matches!(
            NbdBackend::connect("nbd://h/", 0),
            Err(VolumeError::Config(_))
        ));
        assert!(matches!(
            NbdBackend::connect("nbd://h/", MAX_CONNECTIONS + 1),
            Err(VolumeError::Config(_))
        ));
        assert!(matches!(
            NbdBackend::connect("bogus", 1),
            Err(VolumeError::Config(_))
        ));
        let missing = NbdBackend::connect("nbd+unix:///?socket=/nonexistent/terrace.sock", 1);
        assert!(matches!(missing, Err(VolumeError::Backend { .. })));
    }
}

//! NBD, the Network Block Device protocol (NetworkBlockDevice/nbd `doc/proto.md`), both
//! ways round:
//!
//! - [`server`]: [`NbdServer`] serves [`Export`](crate::Export)s on a UNIX or TCP socket,
//!   so fio's `nbd` engine, `nbdinfo`, `nbdcopy`, `nbdfuse`, qemu and the kernel client
//!   reach a volume unchanged.
//! - [`client`]: [`NbdBackend`] is a [`Backend`](crate::Backend) over any NBD server
//!   (nbdkit and its plugins and filters, qemu-nbd, another Terrace).
//! - [`proto`]: the wire format, pure encoders and parsers shared by both.
//! - `buffers`: the page-aligned request buffers a server connection keeps.
//!
//! Invariants: fixed newstyle negotiation only (no oldstyle, no TLS); no request or reply
//! payload exceeds [`proto::MAX_PAYLOAD`] (32 MiB); a peer's bad bytes end at most that
//! peer's connection — never a panic, never the server; every blocking socket call is
//! bounded by a timeout or ended by a shutdown of the socket.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::Duration;

mod buffers;
pub mod client;
pub mod proto;
pub mod server;

pub use client::NbdBackend;
pub use server::{Listen, NbdServer, ServerStats};

/// A connected socket of either family, so the protocol code is written once.
#[derive(Debug)]
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        match self {
            Stream::Unix(stream) => stream.try_clone().map(Stream::Unix),
            Stream::Tcp(stream) => stream.try_clone().map(Stream::Tcp),
        }
    }

    /// Shuts down one or both directions; errors (already closed) are ignored.
    pub(crate) fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(stream) => stream.shutdown(how),
            Stream::Tcp(stream) => stream.shutdown(how),
        };
    }

    pub(crate) fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(stream) => stream.set_read_timeout(timeout),
            Stream::Tcp(stream) => stream.set_read_timeout(timeout),
        }
    }

    pub(crate) fn set_write_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(stream) => stream.set_write_timeout(timeout),
            Stream::Tcp(stream) => stream.set_write_timeout(timeout),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(stream) => stream.read(buf),
            Stream::Tcp(stream) => stream.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(stream) => stream.write(buf),
            Stream::Tcp(stream) => stream.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

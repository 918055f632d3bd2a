//! One client connection: read, hand every complete request to its protocol, write the
//! replies in one go, repeat.
//!
//! Invariants (what keeps thousands of connections and hostile clients cheap):
//! - the input buffer holds at most one incomplete request: a command line
//!   ([`proto::MAX_LINE`]) or a body whose size the protocol vetted against the limits;
//!   swallowed bodies pass through a fixed-size read window, never buffered whole;
//! - replies are written when the input runs dry or the reply buffer passes
//!   `FLUSH_AT`, so pipelined and quiet requests share one `write`;
//! - an idle connection keeps at most `IDLE_KEEP` bytes of buffers;
//! - the loop awaits only on reads and writes, never while a request is being handled:
//!   at shutdown the worker drops the connection's task at one of those points, so no
//!   request is ever half-applied (a reply may be cut, the connection closes anyway).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::proto::{self, Protocol, Step};
use crate::shared::Shared;
use crate::stats::Counter;

/// Bytes asked of each read when no request size is known.
const READ_CHUNK: usize = 16 * 1024;
/// Replies are written out once this many bytes are pending.
const FLUSH_AT: usize = 256 * 1024;
/// Buffer capacity an idle connection may keep.
const IDLE_KEEP: usize = 64 * 1024;

/// Serves one connection until the client closes it, a protocol asks to close, or an
/// I/O error.
pub async fn serve<S>(shared: Arc<Shared>, mut stream: S)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if let Err(e) = serve_inner(&shared, &mut stream).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
    let _ = stream.shutdown().await;
}

async fn serve_inner<S>(shared: &Shared, stream: &mut S) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut input: Vec<u8> = Vec::new();
    let mut pos = 0usize;
    let mut out: Vec<u8> = Vec::new();
    let mut protocol: Option<Protocol> = None;
    // Bytes of a refused body still to be discarded as they arrive.
    let mut swallow = 0usize;
    // Size of the incomplete request at `pos`, when its protocol said.
    let mut need = 0usize;
    loop {
        // Handle every complete request buffered.
        let mut close = false;
        let mut incomplete = false;
        while pos < input.len() && swallow == 0 && out.len() < FLUSH_AT {
            let proto = *protocol.get_or_insert_with(|| Protocol::detect(input[pos]));
            match proto::handle(shared, proto, &input[pos..], &mut out) {
                Step::Done { consumed } => pos += consumed,
                Step::Swallow { consumed, skip } => {
                    pos += consumed;
                    let n = skip.min(input.len() - pos);
                    pos += n;
                    swallow = skip - n;
                }
                Step::NeedMore { total } => {
                    need = total.unwrap_or(0);
                    incomplete = true;
                    break;
                }
                Step::Close { consumed } => {
                    pos += consumed;
                    close = true;
                    break;
                }
                Step::Resume { prefix, consumed } => {
                    // The request's head moves up to just before its unhandled rest.
                    input.copy_within(pos..pos + prefix, pos + consumed - prefix);
                    pos += consumed - prefix;
                }
            }
        }
        // Requests still buffered and complete: only a full reply buffer stopped us.
        let more_buffered = !close && !incomplete && swallow == 0 && pos < input.len();
        if pos == input.len() {
            input.clear();
            pos = 0;
        } else if pos > 0 && !more_buffered {
            input.drain(..pos);
            pos = 0;
        }
        if !out.is_empty() {
            stream.write_all(&out).await?;
            shared.counters.add(Counter::BytesWritten, out.len() as u64);
            out.clear();
            if out.capacity() > IDLE_KEEP {
                out.shrink_to(IDLE_KEEP);
            }
        }
        if close {
            return Ok(());
        }
        if more_buffered {
            continue;
        }
        if input.is_empty() && input.capacity() > IDLE_KEEP {
            input.shrink_to(IDLE_KEEP);
        }
        let want = need.saturating_sub(input.len()).max(READ_CHUNK);
        // Discarded bytes only ever pass through one chunk of buffer.
        let want = if swallow > 0 { READ_CHUNK } else { want };
        input.reserve(want);
        let read = stream.read_buf(&mut input).await?;
        if read == 0 {
            return Ok(());
        }
        shared.counters.add(Counter::BytesRead, read as u64);
        if swallow > 0 {
            let n = swallow.min(input.len());
            input.drain(..n);
            swallow -= n;
        }
        need = 0;
    }
}

/// Counts a connection for as long as it lives (`curr_connections`).
pub struct Admitted {
    shared: Arc<Shared>,
}

impl Admitted {
    /// Admits a new connection unless `max_connections` are open.
    pub fn try_new(shared: &Arc<Shared>) -> Option<Admitted> {
        let c = &shared.counters.curr_connections;
        let mut now = c.load(Ordering::Relaxed);
        loop {
            if now >= shared.max_connections {
                shared.counters.add(Counter::RejectedConnections, 1);
                return None;
            }
            match c.compare_exchange_weak(now, now + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(seen) => now = seen,
            }
        }
        shared.counters.add(Counter::TotalConnections, 1);
        Some(Admitted {
            shared: Arc::clone(shared),
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.shared
            .counters
            .curr_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

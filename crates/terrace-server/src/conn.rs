//! One client connection: read, hand every complete request to its protocol, write the
//! replies in one go, repeat. [`Session`] is that loop's state without a socket; [`serve`]
//! drives it on a readiness-based (epoll) socket, `uring` on io_uring.
//!
//! Invariants (what keeps thousands of connections and hostile clients cheap):
//! - the input buffer holds at most one incomplete request: a command line
//!   ([`proto::MAX_LINE`]) or a body whose size the protocol vetted against the limits;
//!   swallowed bodies pass through a fixed-size read window, never buffered whole;
//! - replies are written when the input runs dry or the reply buffer passes
//!   `FLUSH_AT`, so pipelined and quiet requests share one `write`;
//! - an idle connection keeps at most `IDLE_KEEP` bytes of buffers;
//! - the loop awaits only on reads, writes and flash fetches, never while a request is
//!   being handled: at shutdown the worker drops the connection's task at one of those
//!   points, so no request is ever half-applied (a reply may be cut, the connection
//!   closes anyway);
//! - a get whose items wait on flash is not handled on the worker: with flash deferral
//!   on ([`Session::defer_flash_reads`]) the session stops before it and hands out a
//!   [`Fetch`] ([`Session::take_fetch`]); the loop has it read (here on a thread that
//!   may block; `uring` on its own ring) and calls [`Session::fetched`], and the
//!   request is then handled with its items in
//!   DRAM, reading flash inline only if they were dropped meanwhile (so every request is
//!   deferred at most once, and replies keep their order).

use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::proto::{self, PinBudget, Protocol, Replies, Step};
use crate::shared::{Fetch, Shared};
use crate::stats::Counter;

/// Bytes asked of each read when no request size is known.
pub const READ_CHUNK: usize = 16 * 1024;
/// Replies are written out once this many bytes are pending.
pub const FLUSH_AT: usize = 256 * 1024;
/// Buffer capacity an idle connection may keep.
pub const IDLE_KEEP: usize = 64 * 1024;

/// One connection's protocol state without its socket: the input and reply buffers and
/// what the protocol said about the bytes still to come. Both I/O paths (the readiness
/// loop below and `uring`) drive the same session, so they cannot differ in semantics.
///
/// Use: [`Session::handle_buffered`] after every read; write out [`Session::replies`]
/// (then [`Session::written`]); close when [`Session::closing`]; read again (into
/// [`Session::read_target`], then [`Session::received`]) unless [`Session::stalled`].
#[derive(Default)]
pub struct Session<'s> {
    input: Vec<u8>,
    /// Start of the unhandled input.
    pos: usize,
    out: Replies<'s>,
    protocol: Option<Protocol>,
    /// Bytes of a refused body still to be discarded as they arrive.
    swallow: usize,
    /// Size of the incomplete request at `pos`, when its protocol said.
    need: usize,
    close: bool,
    /// Complete requests are buffered but the reply buffer is full, or the next waits
    /// on a flash fetch.
    stalled: bool,
    /// Gets whose items are on flash are deferred to a fetch (see the module docs).
    defer_flash: bool,
    /// The fetch the next request waits for, until the loop takes it.
    fetch: Option<Fetch>,
    /// A fetch is running: nothing is handled until [`Session::fetched`].
    waiting: bool,
    /// The next request's fetch ran: it is handled without another.
    fetched: bool,
}

impl<'s> Session<'s> {
    /// A session whose replies reference large values in place within `budget` (see
    /// [`Replies`]).
    pub fn in_place(budget: std::sync::Arc<PinBudget>) -> Session<'s> {
        Session {
            out: Replies::in_place(budget),
            ..Session::default()
        }
    }

    /// Handles every complete request buffered, until the input runs dry or the replies
    /// pass [`FLUSH_AT`] (then [`Session::stalled`] is true until the replies are written
    /// and this is called again).
    pub fn handle_buffered(&mut self, shared: &'s Shared) {
        if self.waiting || self.fetch.is_some() {
            return;
        }
        let mut incomplete = false;
        let input = &mut self.input;
        let pos = &mut self.pos;
        while !self.close && *pos < input.len() && self.swallow == 0 && self.out.len() < FLUSH_AT {
            let proto = *self
                .protocol
                .get_or_insert_with(|| Protocol::detect(input[*pos]));
            if self.defer_flash && !std::mem::take(&mut self.fetched) {
                if let Some(fetch) = proto::flash_fetch(shared, proto, &input[*pos..]) {
                    self.fetch = Some(fetch);
                    break;
                }
            }
            match proto::handle(shared, proto, &input[*pos..], &mut self.out) {
                Step::Done { consumed } => *pos += consumed,
                Step::Swallow { consumed, skip } => {
                    *pos += consumed;
                    let n = skip.min(input.len() - *pos);
                    *pos += n;
                    self.swallow = skip - n;
                }
                Step::NeedMore { total } => {
                    self.need = total.unwrap_or(0);
                    incomplete = true;
                    break;
                }
                Step::Close { consumed } => {
                    *pos += consumed;
                    self.close = true;
                    break;
                }
                Step::Resume { prefix, consumed } => {
                    // The request's head moves up to just before its unhandled rest.
                    input.copy_within(*pos..*pos + prefix, *pos + consumed - prefix);
                    *pos += consumed - prefix;
                }
            }
        }
        // Requests still buffered and complete: only a full reply buffer stopped us.
        self.stalled = !self.close && !incomplete && self.swallow == 0 && *pos < input.len();
        if *pos == input.len() {
            input.clear();
            *pos = 0;
        } else if *pos > 0 && !self.stalled {
            input.drain(..*pos);
            *pos = 0;
        }
    }

    /// Defers gets whose items are on flash (see the module docs): the loop then runs
    /// every [`take_fetch`](Self::take_fetch) on a thread that may block.
    pub fn defer_flash_reads(&mut self) {
        self.defer_flash = true;
    }

    /// The fetch the next request waits for, if any: the session handles nothing more
    /// until [`fetched`](Self::fetched).
    pub fn take_fetch(&mut self) -> Option<Fetch> {
        let fetch = self.fetch.take()?;
        self.waiting = true;
        Some(fetch)
    }

    /// The fetch handed out ran: the request that waited for it is handled next.
    pub fn fetched(&mut self) {
        self.waiting = false;
        self.fetched = true;
    }

    /// Replies waiting to be written.
    pub fn replies(&mut self) -> &mut Replies<'s> {
        &mut self.out
    }

    /// The replies were written: counts them and empties the buffer (keeping at most
    /// [`IDLE_KEEP`] of capacity).
    pub fn written(&mut self, shared: &Shared) {
        shared
            .counters
            .add(Counter::BytesWritten, self.out.len() as u64);
        self.out.clear_keeping(IDLE_KEEP);
    }

    /// The protocol asked to close once the replies are written.
    pub fn closing(&self) -> bool {
        self.close
    }

    /// Complete requests wait for the replies to be written before they are handled.
    pub fn stalled(&self) -> bool {
        self.stalled
    }

    /// The input buffer with room reserved for the next read at its end (the read
    /// appends to it; then call [`Session::received`]).
    pub fn read_target(&mut self) -> &mut Vec<u8> {
        if self.input.is_empty() && self.input.capacity() > IDLE_KEEP {
            self.input.shrink_to(IDLE_KEEP);
        }
        // Discarded bytes only ever pass through one chunk of buffer.
        let want = if self.swallow > 0 {
            READ_CHUNK
        } else {
            self.need.saturating_sub(self.input.len()).max(READ_CHUNK)
        };
        self.input.reserve(want);
        &mut self.input
    }

    /// The input buffer as it is, for a completion-based read to extend by the bytes it
    /// wrote into the room [`Session::read_target`] reserved.
    pub fn input(&mut self) -> &mut Vec<u8> {
        &mut self.input
    }

    /// Moves the replies into `sending` (empty) to be written while more requests are
    /// handled, and counts them as written.
    pub fn hand_over_replies(&mut self, shared: &Shared, sending: &mut Replies<'s>) {
        debug_assert!(sending.is_empty());
        self.out.swap_contents(sending);
        shared
            .counters
            .add(Counter::BytesWritten, sending.len() as u64);
    }

    /// `n` bytes were appended to the input by a read.
    pub fn received(&mut self, shared: &Shared, n: usize) {
        shared.counters.add(Counter::BytesRead, n as u64);
        if self.swallow > 0 {
            let k = self.swallow.min(self.input.len());
            self.input.drain(..k);
            self.swallow -= k;
        }
        self.need = 0;
    }
}

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

async fn serve_inner<S>(shared: &Arc<Shared>, stream: &mut S) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut session = Session::default();
    if shared.has_flash() {
        session.defer_flash_reads();
    }
    loop {
        session.handle_buffered(shared);
        if !session.replies().is_empty() {
            stream.write_all(session.replies()).await?;
            session.written(shared);
        }
        if session.closing() {
            return Ok(());
        }
        if let Some(fetch) = session.take_fetch() {
            let on_pool = Arc::clone(shared);
            // The read waits on the device on the runtime's blocking pool; a failed
            // task only means the request reads flash inline.
            let _ = tokio::task::spawn_blocking(move || on_pool.run_fetch(&fetch)).await;
            session.fetched();
            continue;
        }
        if session.stalled() {
            continue;
        }
        let read = stream.read_buf(session.read_target()).await?;
        if read == 0 {
            return Ok(());
        }
        session.received(shared, read);
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

#[cfg(test)]
mod tests {
    use super::{Session, FLUSH_AT};
    use crate::proto::Replies;
    use crate::shared::test_shared;

    /// Feeds `bytes` to the session as one read.
    fn receive<'s>(session: &mut Session<'s>, shared: &'s crate::shared::Shared, bytes: &[u8]) {
        let input = session.read_target();
        input.extend_from_slice(bytes);
        session.received(shared, bytes.len());
        session.handle_buffered(shared);
    }

    #[test]
    fn a_full_reply_buffer_stalls_the_session_until_the_replies_are_handed_over() {
        let shared = test_shared();
        let mut session = Session::default();
        let value = vec![b'v'; 100_000];
        let mut set = b"set big 0 0 100000\r\n".to_vec();
        set.extend_from_slice(&value);
        set.extend_from_slice(b"\r\n");
        receive(&mut session, &shared, &set);
        assert_eq!(session.replies().as_slice(), b"STORED\r\n");
        let mut sending = Replies::default();
        session.hand_over_replies(&shared, &mut sending);
        assert_eq!(sending.as_slice(), b"STORED\r\n");
        // Ten gets of 100 kB: the replies pass FLUSH_AT after three.
        receive(&mut session, &shared, &b"get big\r\n".repeat(10));
        assert!(session.stalled());
        assert!(session.replies().len() >= FLUSH_AT);
        let mut all = Vec::new();
        let mut rounds = 0;
        loop {
            let mut sending = Replies::default();
            session.hand_over_replies(&shared, &mut sending);
            all.extend_from_slice(&sending);
            rounds += 1;
            if !session.stalled() {
                break;
            }
            session.handle_buffered(&shared);
        }
        assert!(rounds >= 3, "{rounds} rounds");
        let one = [b"VALUE big 0 100000\r\n".as_slice(), &value, b"\r\nEND\r\n"].concat();
        assert_eq!(all, one.repeat(10));
        assert!(!session.closing());
    }

    #[test]
    fn a_refused_body_is_swallowed_across_reads_and_the_next_request_served() {
        let shared = test_shared();
        let mut session = Session::default();
        // 2 MiB is over the 1 MiB limit: refused, and its body discarded as it comes.
        receive(&mut session, &shared, b"set k 0 0 2097152\r\n");
        assert!(session.replies().starts_with(b"SERVER_ERROR"));
        session.written(&shared);
        let chunk = vec![b'x'; 65536];
        for _ in 0..32 {
            receive(&mut session, &shared, &chunk);
            assert!(session.replies().is_empty());
        }
        receive(&mut session, &shared, b"\r\nget k\r\nquit\r\n");
        assert_eq!(session.replies().as_slice(), b"END\r\n");
        assert!(session.closing());
    }
}

//! The io_uring worker: one ring per worker thread serves all of its connections with
//! completion-based receives and sends, so one `io_uring_enter` carries the system calls
//! of every connection that was ready, where the readiness loop (`conn::serve`) makes a
//! `recv` and a `send` per request. On loopback most of a request's server CPU is the
//! socket path, and each `send` that wakes a client could switch the server out on its
//! way back to user space; batching the sends pays that once per batch.
//!
//! Each connection runs the same [`Session`] as the readiness loop, so the protocols
//! cannot tell the paths apart. One difference is the copy of large values: here a
//! `get` hit of [`IN_PLACE_MIN`](crate::proto::IN_PLACE_MIN) bytes or more is not copied
//! into the reply buffer but referenced where it lies in the cache (its segment pinned
//! by the hit's guard) and sent with a vectored `sendmsg`.
//!
//! Invariants (the memory safety of the ring rests on them):
//! - a connection has at most one receive and one send in flight. The receive writes
//!   into the spare capacity of the session's input buffer, the send reads the
//!   connection's `sending` buffer; neither buffer is touched, grown or freed while its
//!   operation is in flight (the session's input is handled only when no receive is);
//! - a reply that references values in the cache is sent with `MSG_DONTWAIT`, so the
//!   kernel never waits for the client with our pins: what it could not send at once is
//!   copied out (`Replies::flatten`) and sent the ordinary way; replies left waiting
//!   behind a send in flight are flattened too. A segment is pinned by a connection for
//!   at most one round of the ring, however slowly the client reads;
//! - a connection leaves the slab only when nothing of it is in flight, so a completion
//!   always finds its connection; a generation in each entry's user data keeps a late
//!   cancel from matching a later connection in the same slot;
//! - at stop every operation is cancelled and its completion awaited before a buffer is
//!   freed; if the kernel does not finish them in `STOP_WAIT`, the buffers are leaked
//!   rather than freed under it;
//! - the ring is created, submitted to and dropped on the worker thread alone
//!   (`IORING_SETUP_SINGLE_ISSUER`).
//!
//! Flash reads: a get whose items wait on flash stops its session ([`Session::take_fetch`]);
//! the worker reads them on its own ring (`IORING_OP_READ` into block-aligned buffers of
//! the worker's read slab, `O_DIRECT` where the flash file is), so the loop never waits
//! on the device and no other thread is woken. Each completion goes to the cache, which
//! stages the item (or asks for a longer read); when the last of a connection's reads is
//! back, the request is handled with its items in DRAM. A read's buffer belongs to the
//! slab, not the connection: a connection may leave with reads in flight, whose
//! completions then find it gone and only free their buffers.
//!
//! Back-pressure is the readiness loop's: no receive is armed while complete requests wait
//! for a full reply buffer to drain ([`Session::stalled`]), nor while a send that stopped
//! short (the client's socket is full) is still in flight, as the readiness loop does not
//! read while blocked in its write; so a client that sends without reading its replies
//! stops being read.

#![allow(unsafe_code)]

use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use io_uring::{opcode, types, IoUring};
use terrace_cache::FlashRead;

use crate::conn::{Admitted, Session, IDLE_KEEP};
use crate::proto::{PinBudget, Replies};
use crate::shared::{Fetch, Shared};
use crate::workers::Accepted;

/// Submission queue entries per ring, and completion queue entries: a connection has at
/// most two operations in flight, so a worker with up to 2,048 connections never
/// overflows its completion queue (beyond that the kernel keeps the overflow).
const RING_ENTRIES: u32 = 1024;
const COMPLETION_ENTRIES: u32 = 4096;
/// How long a stopping worker waits for cancelled operations to complete.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Pieces of one vectored send (below the kernel's `UIO_MAXIOV`); the rest goes next.
const MAX_PIECES: usize = 512;

/// Operation kinds, in the low byte of an entry's user data; above it the connection's
/// generation (24 bits) and slot (32 bits), see [`tag`].
const RECV: u64 = 1;
const SEND: u64 = 2;
const WAKE: u64 = 3;
const CANCEL: u64 = 4;
/// A flash read; the slot field of its user data is its place in the read slab.
const FLASH_READ: u64 = 5;

/// `IORING_RECVSEND_POLL_FIRST` (Linux 5.19): a receive waits for data before trying,
/// which saves a failed attempt when the next request has not come yet (the usual case
/// right after a reply). A kernel that refuses it fails the receive with `EINVAL`; the
/// worker then stops asking for it and receives again.
const RECVSEND_POLL_FIRST: u16 = 1;

/// Bounds of the time a worker with nothing to do yields the CPU before it sleeps (see
/// [`Spin`]).
const MIN_SPIN: Duration = Duration::from_micros(2);
const MAX_SPIN: Duration = Duration::from_micros(50);

/// How long a worker with nothing to do yields the CPU (`sched_yield`, so a client or
/// another worker on the same core runs meanwhile) before it sleeps in the kernel.
///
/// Why: a sleep and its wake-up cost the worker several times a request's CPU (measured
/// on the 2-core VM: at 2 workers, 15% of the server's CPU was in the sleep path, about
/// 13 µs per sleep against 3–5 µs per request), and under load the next completion comes
/// within microseconds. At low load spinning would be waste, so the budget adapts:
/// doubled (up to [`MAX_SPIN`]) when a completion came while yielding, halved (down to
/// [`MIN_SPIN`]) when none did and the worker slept after all.
struct Spin {
    budget: Duration,
}

impl Spin {
    fn budget(&self) -> Duration {
        self.budget
    }

    fn worked(&mut self) {
        self.budget = (self.budget * 2).min(MAX_SPIN);
    }

    fn failed(&mut self) {
        self.budget = (self.budget / 2).max(MIN_SPIN);
    }
}

/// How many values one worker may keep pinned for in-place sends: a quarter of the
/// smallest tier's segments, shared among the workers, at least one. With the smallest
/// tier allowed (8 segments) and one worker that is two segments, so a worker's own
/// `set` always finds segments its pins leave alone.
fn pin_budget(shared: &Shared) -> usize {
    let smallest = shared
        .pools
        .iter()
        .flat_map(|(_, cache)| cache.tier_overview())
        .map(|t| t.segments as usize)
        .min()
        .unwrap_or(0);
    (smallest / 4 / shared.threads.max(1)).max(1)
}

/// An entry's user data: the slot, the generation of the connection in it (so a late
/// cancel meant for an earlier connection in the slot matches nothing), the kind.
fn tag(slot: usize, generation: u32, kind: u64) -> u64 {
    ((slot as u64) << 32) | (u64::from(generation & 0xff_ffff) << 8) | kind
}

/// Why io_uring cannot serve here: the kernel lacks it, forbids it
/// (`kernel.io_uring_disabled`, a seccomp filter) or lacks an operation the worker uses.
pub fn probe() -> io::Result<()> {
    let ring = new_ring()?;
    if !ring.params().is_feature_ext_arg() {
        // The stop waits with a timeout (`IORING_ENTER_EXT_ARG`, Linux 5.11).
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the kernel's io_uring cannot wait with a timeout (Linux 5.11 or later needed)",
        ));
    }
    let mut probe = io_uring::Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    for (code, name) in [
        (opcode::Recv::CODE, "recv"),
        (opcode::Send::CODE, "send"),
        (opcode::SendMsg::CODE, "sendmsg"),
        (opcode::Read::CODE, "read"),
        (opcode::AsyncCancel::CODE, "async cancel"),
    ] {
        if !probe.is_supported(code) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("the kernel's io_uring lacks {name}"),
            ));
        }
    }
    Ok(())
}

/// A ring with the cheapest completion mode the kernel offers: completions are run only
/// when the worker asks for them (`DEFER_TASKRUN`, Linux 6.1), else cooperatively.
fn new_ring() -> io::Result<IoUring> {
    IoUring::builder()
        .setup_cqsize(COMPLETION_ENTRIES)
        .setup_single_issuer()
        .setup_defer_taskrun()
        .setup_taskrun_flag()
        .build(RING_ENTRIES)
        .or_else(|_| {
            IoUring::builder()
                .setup_cqsize(COMPLETION_ENTRIES)
                .setup_coop_taskrun()
                .setup_taskrun_flag()
                .build(RING_ENTRIES)
        })
        .or_else(|_| IoUring::builder().build(RING_ENTRIES))
}

/// The acceptor's side of a worker: new connections are queued here and the worker is
/// woken through a pipe its ring reads.
pub struct Handoff {
    queue: Mutex<Vec<(Accepted, Admitted)>>,
    wake: io::PipeWriter,
    /// A wake-up byte is in the pipe and unread: at most one ever is, so the acceptor's
    /// write never blocks on a full pipe.
    wake_pending: AtomicBool,
    stop: AtomicBool,
    /// The worker has ended (stopped, or its ring failed): connections handed to it now
    /// are closed at once rather than queued forever. Changed under the queue's lock.
    closed: AtomicBool,
}

impl Handoff {
    /// Queues a connection for the worker and wakes it.
    pub fn send(&self, accepted: Accepted, admitted: Admitted) {
        let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::SeqCst) {
            // Dropping them closes the socket and uncounts the connection.
            drop((accepted, admitted));
            return;
        }
        queue.push((accepted, admitted));
        drop(queue);
        self.wake_worker();
    }

    /// The worker ends: refuse what comes next, close what waits.
    fn close(&self) {
        let queued = {
            let mut queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            self.closed.store(true, Ordering::SeqCst);
            std::mem::take(&mut *queue)
        };
        drop(queued);
    }

    /// Asks the worker to close its connections and end.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.wake_worker();
    }

    fn wake_worker(&self) {
        if !self.wake_pending.swap(true, Ordering::SeqCst) {
            let _ = (&self.wake).write(&[1]);
        }
    }
}

/// Starts worker `index` on io_uring; returns once its ring exists (or why it could not).
pub fn start(index: usize, shared: &Arc<Shared>) -> io::Result<(Arc<Handoff>, JoinHandle<()>)> {
    let (reader, writer) = io::pipe()?;
    let handoff = Arc::new(Handoff {
        queue: Mutex::new(Vec::new()),
        wake: writer,
        wake_pending: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        closed: AtomicBool::new(false),
    });
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let shared = Arc::clone(shared);
    let theirs = Arc::clone(&handoff);
    let thread = std::thread::Builder::new()
        .name(format!("terrace-worker-{index}"))
        .spawn(move || {
            // The ring is made here: its single issuer is this thread.
            match new_ring() {
                Ok(ring) => {
                    let _ = ready_tx.send(Ok(()));
                    Worker::new(ring, &shared, theirs, reader).run();
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok((handoff, thread)),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(io::Error::other("io_uring worker ended at start")),
    }
}

/// One connection on a ring.
struct Conn<'s> {
    stream: Accepted,
    session: Session<'s>,
    /// Replies handed to the socket, `sent` of them sent so far.
    sending: Replies<'s>,
    sent: usize,
    /// The vectored send's message and pieces, while it is in flight.
    message: Box<libc::msghdr>,
    pieces: Vec<libc::iovec>,
    recv_in_flight: bool,
    send_in_flight: bool,
    /// The last send stopped short: the client is not reading, so neither is the server
    /// (as the readiness loop, blocked in its write) until the replies drain.
    send_blocked: bool,
    /// Told apart from earlier connections in the same slot (see [`tag`]).
    generation: u32,
    /// The client closed its side: no more receives, pending replies still go out.
    eof: bool,
    /// Flash reads of this connection's fetch still in flight.
    reads_in_flight: usize,
    /// The socket failed: nothing more is sent or received.
    broken: bool,
    _admitted: Admitted,
}

impl Conn<'_> {
    fn fd(&self) -> types::Fd {
        types::Fd(match &self.stream {
            Accepted::Tcp(s) => s.as_raw_fd(),
            Accepted::Unix(s) => s.as_raw_fd(),
        })
    }
}

struct Worker<'s> {
    ring: IoUring,
    shared: &'s Shared,
    handoff: Arc<Handoff>,
    wake: io::PipeReader,
    /// The pipe read's buffer (its contents do not matter).
    wake_buf: Box<[u8; 64]>,
    conns: Vec<Option<Conn<'s>>>,
    free: Vec<usize>,
    /// Entries pushed whose completion has not been seen.
    in_flight: usize,
    completions: Vec<(u64, i32)>,
    spin: Spin,
    /// `ioprio` of receives: [`RECVSEND_POLL_FIRST`] until the kernel refuses it.
    recv_ioprio: u16,
    /// Entries (counted in `in_flight`) that found the submission queue full, in order.
    backlog: Vec<io_uring::squeue::Entry>,
    /// Connections adopted so far (their generations).
    generations: u32,
    /// `stop` ran.
    stopped: bool,
    /// Values this worker's replies may reference in place at once.
    pin_budget: Arc<PinBudget>,
    /// Gets wait for their flash reads on this ring (a pool has a flash tier).
    defer_flash: bool,
    /// Flash reads in flight, by their place (see [`FLASH_READ`]), and free places.
    reads: Vec<Option<PendingRead>>,
    free_reads: Vec<usize>,
}

/// A flash read on the ring, and the connection (slot, generation) that waits for it.
struct PendingRead {
    slot: usize,
    generation: u32,
    pool: Option<usize>,
    read: FlashRead,
}

impl Drop for Worker<'_> {
    /// However the worker ends (asked to, its ring failing, or a panic unwinding), its
    /// operations are cancelled and awaited before its buffers go, and connections
    /// still handed to it are closed.
    fn drop(&mut self) {
        self.stop();
    }
}

impl<'s> Worker<'s> {
    fn new(ring: IoUring, shared: &'s Shared, handoff: Arc<Handoff>, wake: io::PipeReader) -> Self {
        Worker {
            ring,
            shared,
            handoff,
            wake,
            wake_buf: Box::new([0; 64]),
            conns: Vec::new(),
            free: Vec::new(),
            in_flight: 0,
            completions: Vec::with_capacity(256),
            spin: Spin { budget: MIN_SPIN },
            recv_ioprio: RECVSEND_POLL_FIRST,
            backlog: Vec::new(),
            generations: 0,
            stopped: false,
            pin_budget: PinBudget::new(pin_budget(shared)),
            defer_flash: shared.has_flash(),
            reads: Vec::new(),
            free_reads: Vec::new(),
        }
    }

    fn run(mut self) {
        let shared = self.shared;
        self.arm_wake();
        while !self.handoff.stop.load(Ordering::SeqCst) {
            match self.wait() {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // The completion queue is full: reaping it below makes room.
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
                Err(e) => {
                    tracing::error!(error = %e, "io_uring worker failed; its connections close");
                    break;
                }
            }
            self.reap(shared);
        }
        // `Drop` stops the worker, here or when a panic unwinds through `run`.
    }

    /// Submits what is queued and returns once a completion is ready: at once if one is,
    /// after yielding the CPU for up to the spin budget if one comes meanwhile, else
    /// asleep in the kernel until one comes.
    fn wait(&mut self) -> io::Result<()> {
        if !self.backlog.is_empty() {
            self.ring.submit()?;
            self.push_backlog();
        }
        if !self.ring.submission().is_empty() {
            self.ring.submit()?;
        }
        if self.ready() {
            return self.run_deferred();
        }
        let spin_start = Instant::now();
        let budget = self.spin.budget();
        loop {
            std::thread::yield_now();
            if self.ready() {
                self.spin.worked();
                return self.run_deferred();
            }
            if spin_start.elapsed() >= budget {
                break;
            }
        }
        self.spin.failed();
        self.ring.submit_and_wait(1).map(drop)
    }

    /// A completion is posted, or the kernel has deferred work to post one
    /// (`IORING_SQ_TASKRUN`, raised without a system call).
    fn ready(&mut self) -> bool {
        !self.ring.completion().is_empty() || self.ring.submission().taskrun()
    }

    /// Runs the kernel's deferred completions (if any) without sleeping.
    fn run_deferred(&mut self) -> io::Result<()> {
        if self.ring.submission().taskrun() {
            self.ring.submitter().submit_and_wait(0)?;
        }
        Ok(())
    }

    /// Takes every completion off the ring and acts on it.
    fn reap(&mut self, shared: &'s Shared) {
        let mut completions = std::mem::take(&mut self.completions);
        completions.extend(
            self.ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result())),
        );
        self.in_flight -= completions.len();
        for &(user_data, result) in &completions {
            let slot = (user_data >> 32) as usize;
            let generation = ((user_data >> 8) & 0xff_ffff) as u32;
            let current = self.conns.get(slot).and_then(Option::as_ref);
            if (user_data & 0xff == RECV || user_data & 0xff == SEND)
                && current.is_none_or(|c| c.generation & 0xff_ffff != generation)
            {
                // Cannot happen: a slot is freed only when nothing of it is in flight.
                debug_assert!(false, "a completion for a connection that is gone");
                continue;
            }
            match user_data & 0xff {
                RECV => self.received(shared, slot, result),
                SEND => self.sent(shared, slot, result),
                WAKE => self.woken(shared, result),
                FLASH_READ => self.flash_read_done(shared, slot, result),
                _ => {}
            }
        }
        completions.clear();
        self.completions = completions;
    }

    /// Queues an entry, submitting what is queued when the submission queue is full.
    ///
    /// # Safety
    /// Every buffer the entry names stays valid, and is not otherwise accessed, until its
    /// completion is reaped.
    unsafe fn push(&mut self, entry: io_uring::squeue::Entry) {
        self.in_flight += 1;
        if !self.backlog.is_empty() {
            // Behind what waits already: a cancel must never overtake its target.
            self.backlog.push(entry);
            return;
        }
        // SAFETY: the caller keeps the entry's buffers valid until completion.
        if unsafe { self.ring.submission().push(&entry) }.is_ok() {
            return;
        }
        // The submission queue is full: submitting empties it, unless the kernel is
        // busy (a full completion queue), in which case the entry waits for the next
        // round, after the completions are reaped.
        let _ = self.ring.submit();
        // SAFETY: as above.
        if unsafe { self.ring.submission().push(&entry) }.is_err() {
            self.backlog.push(entry);
        }
    }

    /// Moves entries that found the submission queue full into it, as room allows.
    fn push_backlog(&mut self) {
        while let Some(entry) = self.backlog.first() {
            // SAFETY: the entry was pushed by `push`, whose caller keeps its buffers
            // valid until its completion.
            if unsafe { self.ring.submission().push(entry) }.is_err() {
                break;
            }
            self.backlog.remove(0);
        }
    }

    fn arm_wake(&mut self) {
        let entry = opcode::Read::new(
            types::Fd(self.wake.as_raw_fd()),
            self.wake_buf.as_mut_ptr(),
            self.wake_buf.len() as u32,
        )
        .offset(u64::MAX)
        .build()
        .user_data(WAKE);
        // SAFETY: `wake_buf` is a heap buffer owned by the worker, freed only after the
        // stop has seen every completion; nothing else reads or writes it.
        unsafe { self.push(entry) };
    }

    /// The pipe was written: adopt the queued connections.
    fn woken(&mut self, shared: &'s Shared, result: i32) {
        if result < 0 && result != -libc::EINTR && result != -libc::EAGAIN {
            tracing::warn!(
                error = -result,
                "worker wake-up pipe read failed; reading again"
            );
        }
        // Cleared before the queue is taken: a connection queued after the take writes
        // a new wake-up.
        self.handoff.wake_pending.store(false, Ordering::SeqCst);
        let queued =
            std::mem::take(&mut *self.handoff.queue.lock().unwrap_or_else(|e| e.into_inner()));
        for (stream, admitted) in queued {
            let mut session = Session::in_place(Arc::clone(&self.pin_budget));
            if self.defer_flash {
                session.defer_flash_reads();
            }
            let conn = Conn {
                stream,
                session,
                sending: Replies::default(),
                sent: 0,
                // SAFETY: `msghdr` is plain data; all zeroes is an empty message.
                message: Box::new(unsafe { std::mem::zeroed() }),
                pieces: Vec::new(),
                recv_in_flight: false,
                send_in_flight: false,
                send_blocked: false,
                generation: self.generations,
                eof: false,
                reads_in_flight: 0,
                broken: false,
                _admitted: admitted,
            };
            self.generations = self.generations.wrapping_add(1);
            let slot = match self.free.pop() {
                Some(slot) => {
                    self.conns[slot] = Some(conn);
                    slot
                }
                None => {
                    self.conns.push(Some(conn));
                    self.conns.len() - 1
                }
            };
            self.drive(shared, slot);
        }
        self.arm_wake();
    }

    fn received(&mut self, shared: &'s Shared, slot: usize, result: i32) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        conn.recv_in_flight = false;
        match result {
            // Input that arrives after the socket failed is not acted on.
            n if n > 0 && conn.broken => {}
            n if n > 0 => {
                let input = conn.session.input();
                let len = input.len() + n as usize;
                debug_assert!(len <= input.capacity());
                // The receive was given the spare capacity from the old length on, untouched
                // since, and the kernel never reports more than the length it was given.
                // SAFETY: so the first `n` spare bytes are initialised.
                unsafe { input.set_len(len.min(input.capacity())) };
                conn.session.received(shared, n as usize);
                conn.session.handle_buffered(shared);
            }
            0 => conn.eof = true,
            e if e == -libc::EINTR || e == -libc::EAGAIN => {}
            e if e == -libc::EINVAL && self.recv_ioprio != 0 => {
                tracing::info!("the kernel refuses poll-first receives; receiving without");
                self.recv_ioprio = 0;
            }
            e => {
                tracing::debug!(error = -e, "connection ended with an error");
                conn.broken = true;
            }
        }
        self.drive(shared, slot);
    }

    fn sent(&mut self, shared: &'s Shared, slot: usize, result: i32) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        conn.send_in_flight = false;
        conn.pieces.clear();
        match result {
            n if n > 0 => {
                conn.sent += n as usize;
                conn.send_blocked = conn.sent < conn.sending.len();
                if conn.sent >= conn.sending.len() {
                    conn.sending.clear_keeping(IDLE_KEEP);
                    conn.sent = 0;
                } else {
                    // A vectored send stopped short (the socket is full): the rest is
                    // copied, and waits on the client without pinning anything.
                    conn.sending.flatten();
                }
            }
            e if e == -libc::EAGAIN && conn.sending.has_references() => {
                conn.send_blocked = true;
                conn.sending.flatten();
            }
            e if e == -libc::EINTR || e == -libc::EAGAIN => {}
            e => {
                if e != 0 {
                    tracing::debug!(error = -e, "connection ended with an error");
                }
                conn.broken = true;
            }
        }
        self.drive(shared, slot);
    }

    /// Starts whatever the connection can do next: a send of its replies, a receive, or
    /// its close.
    fn drive(&mut self, shared: &'s Shared, slot: usize) {
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if !conn.broken && !conn.send_in_flight {
            if conn.sending.is_empty() {
                if conn.session.replies().is_empty()
                    && conn.session.stalled()
                    && !conn.recv_in_flight
                {
                    conn.session.handle_buffered(shared);
                }
                if !conn.session.replies().is_empty() {
                    conn.session.hand_over_replies(shared, &mut conn.sending);
                    conn.sent = 0;
                }
            }
            if conn.sent < conn.sending.len() {
                let (fd, generation) = (conn.fd(), conn.generation);
                let entry = if conn.sending.has_references() {
                    // Values referenced in the cache: a vectored send that never waits
                    // for room (`MSG_DONTWAIT`), so their pins last until the next reap.
                    let (pieces, sending) = (&mut conn.pieces, &conn.sending);
                    sending.slices_from(conn.sent, |part| {
                        pieces.push(libc::iovec {
                            iov_base: part.as_ptr().cast_mut().cast(),
                            iov_len: part.len(),
                        });
                    });
                    conn.pieces.truncate(MAX_PIECES);
                    conn.message.msg_iov = conn.pieces.as_mut_ptr();
                    conn.message.msg_iovlen = conn.pieces.len();
                    opcode::SendMsg::new(fd, &*conn.message)
                        .flags((libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) as u32)
                        .build()
                } else {
                    let rest = &conn.sending[conn.sent..];
                    opcode::Send::new(fd, rest.as_ptr(), rest.len().min(u32::MAX as usize) as u32)
                        .flags(libc::MSG_NOSIGNAL)
                        .build()
                };
                conn.send_in_flight = true;
                // SAFETY: `sending` (and the guards pinning its referenced values), `message`
                // and `pieces` stay untouched in their slot until the completion (`sent`).
                unsafe { self.push(entry.user_data(tag(slot, generation, SEND))) };
            }
        }
        if let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) {
            // Replies left waiting for a send in flight must not pin their values.
            if conn.send_in_flight {
                conn.session.replies().flatten();
            }
            if let Some(fetch) = conn.session.take_fetch() {
                let generation = conn.generation;
                self.start_fetch(shared, slot, generation, fetch);
            }
        }
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let done = conn.broken
            || ((conn.eof || conn.session.closing())
                && conn.sending.is_empty()
                && conn.session.replies().is_empty());
        if done {
            if !conn.recv_in_flight && !conn.send_in_flight {
                self.conns[slot] = None;
                self.free.push(slot);
            } else if conn.recv_in_flight && !conn.eof {
                // Closing with a receive pending: cancel it; its completion closes.
                conn.eof = true;
                let entry = opcode::AsyncCancel::new(tag(slot, conn.generation, RECV))
                    .build()
                    .user_data(tag(slot, conn.generation, CANCEL));
                // SAFETY: a cancel names no buffer.
                unsafe { self.push(entry) };
            }
            return;
        }
        if !conn.recv_in_flight
            && !conn.eof
            && !conn.session.closing()
            && !conn.session.stalled()
            && (!conn.send_in_flight || !conn.send_blocked)
        {
            let fd = conn.fd();
            let spare = conn.session.read_target().spare_capacity_mut();
            let entry = opcode::Recv::new(
                fd,
                spare.as_mut_ptr().cast::<u8>(),
                spare.len().min(u32::MAX as usize) as u32,
            )
            .ioprio(self.recv_ioprio)
            .build()
            .user_data(tag(slot, conn.generation, RECV));
            conn.recv_in_flight = true;
            // SAFETY: the input buffer is not touched (grown, handled or freed) until
            // this receive's completion (`received`); the connection stays in its slot.
            unsafe { self.push(entry) };
        }
    }

    /// Starts the reads of a connection's flash fetch on the ring; with none left to do
    /// (its items were staged or moved meanwhile) the connection goes on at once.
    fn start_fetch(&mut self, shared: &'s Shared, slot: usize, generation: u32, fetch: Fetch) {
        let reads = shared.flash_reads(&fetch);
        if reads.is_empty() {
            if let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) {
                conn.session.fetched();
            }
            self.drive(shared, slot);
            return;
        }
        if let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) {
            conn.reads_in_flight += reads.len();
        }
        for (pool, read) in reads {
            let place = self.free_reads.pop().unwrap_or_else(|| {
                self.reads.push(None);
                self.reads.len() - 1
            });
            let pending = PendingRead {
                slot,
                generation,
                pool,
                read,
            };
            self.push_read(place, pending);
        }
    }

    /// Puts `pending` at `place` of the slab and submits its read.
    fn push_read(&mut self, place: usize, pending: PendingRead) {
        let read = &mut self.reads[place].insert(pending).read;
        let (fd, offset) = (read.fd(), read.file_offset());
        let buf = read.buffer();
        let entry = opcode::Read::new(
            types::Fd(fd),
            buf.as_mut_ptr(),
            buf.len().min(u32::MAX as usize) as u32,
        )
        .offset(offset)
        .build()
        .user_data(tag(place, 0, FLASH_READ));
        // SAFETY: the buffer is the slab entry's own allocation, untouched and kept until
        // this completion is reaped (`flash_read_done`), or leaked by a stop that times out.
        unsafe { self.push(entry) };
    }

    /// A flash read completed: the cache stages its item (or wants a longer read); the
    /// connection's request is handled once its last read is back.
    fn flash_read_done(&mut self, shared: &'s Shared, place: usize, result: i32) {
        let Some(mut pending) = self.reads.get_mut(place).and_then(Option::take) else {
            return;
        };
        let result = if result >= 0 {
            Ok(result as usize)
        } else {
            Err(io::Error::from_raw_os_error(-result))
        };
        // (Completions are reaped here only before a stop, which awaits its own.)
        if let Some(more) = shared.finish_flash_read(pending.pool, pending.read, result) {
            pending.read = more;
            self.push_read(place, pending);
            return;
        }
        let (slot, generation) = (pending.slot, pending.generation);
        self.free_reads.push(place);
        let Some(conn) = self.conns.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        if conn.generation != generation {
            return;
        }
        conn.reads_in_flight -= 1;
        if conn.reads_in_flight == 0 {
            conn.session.fetched();
            self.drive(shared, slot);
        }
    }

    /// Cancels everything in flight, waits for it, then drops the connections.
    fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        self.handoff.close();
        // Whatever still waits in the backlog once the ring takes what it can was never
        // submitted and holds no buffer of the kernel's.
        let _ = self.ring.submit();
        self.push_backlog();
        self.in_flight -= self.backlog.len();
        self.backlog.clear();
        // Each operation is cancelled by its user data, which every kernel with
        // io_uring's cancel (5.5) matches; the pipe read by its own.
        let mut cancels = vec![WAKE];
        for (slot, conn) in self.conns.iter().enumerate() {
            let Some(conn) = conn else { continue };
            if conn.recv_in_flight {
                cancels.push(tag(slot, conn.generation, RECV));
            }
            if conn.send_in_flight {
                cancels.push(tag(slot, conn.generation, SEND));
            }
        }
        for (place, read) in self.reads.iter().enumerate() {
            if read.is_some() {
                cancels.push(tag(place, 0, FLASH_READ));
            }
        }
        for target in cancels {
            let entry = opcode::AsyncCancel::new(target).build().user_data(CANCEL);
            // SAFETY: a cancel names no buffer.
            unsafe { self.push(entry) };
            if !self.backlog.is_empty() {
                let _ = self.ring.submit();
                self.push_backlog();
            }
        }
        let deadline = Instant::now() + STOP_WAIT;
        while self.in_flight > 0 && Instant::now() < deadline {
            let wait = types::Timespec::new().nsec(50_000_000);
            let args = types::SubmitArgs::new().timespec(&wait);
            let _ = self.ring.submitter().submit_with_args(1, &args);
            let mut n = 0;
            for _ in self.ring.completion() {
                n += 1;
            }
            self.in_flight -= n;
        }
        if self.in_flight > 0 {
            tracing::warn!(
                operations = self.in_flight,
                "io_uring operations outlived the stop; their buffers are leaked"
            );
            std::mem::forget(std::mem::take(&mut self.conns));
            std::mem::forget(std::mem::take(&mut self.reads));
            std::mem::forget(std::mem::replace(&mut self.wake_buf, Box::new([0; 64])));
        }
        self.conns.clear();
    }
}

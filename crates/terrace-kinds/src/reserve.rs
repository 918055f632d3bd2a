//! File-block reservation for file kinds, kept ahead of demand by a background thread.
//!
//! A sparse shared mapping turns a full file system into `SIGBUS` at first touch, so a file
//! kind hands out only bytes whose blocks are reserved (`fallocate`). Reserving is not free:
//! on tmpfs it allocates the pages (measured here: about 0.23 ms per MiB, more than the
//! whole cost of allocating the objects in those pages). So reservation runs ahead of the
//! allocator on a background thread, within a bounded headroom, and the allocating thread
//! only reserves itself when it outruns the reserver.
//!
//! Invariants:
//! - `[0, reserved)` of the region has blocks (reservation is contiguous from offset 0);
//! - `reserved <= wanted_end <= region length`, and `wanted_end` is at most `headroom`
//!   beyond the highest offset the allocator asked for (so at most `headroom` bytes are
//!   reserved and unused);
//! - one `fallocate` at a time per reservation (`lock`), one chunk per call, so an
//!   allocating thread waits at most one chunk for the background thread.
//!
//! After a failed reservation (full file system) the background thread stops for that
//! region; the allocating thread still tries the exact range it needs, and failing that
//! the allocation fails with out-of-memory.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};

use terrace_media::Region;

/// See the module docs.
pub(crate) struct Reservation {
    region: Arc<Region>,
    /// Step of one `fallocate` call.
    chunk: usize,
    /// Bytes kept reserved beyond the allocator's highest request (0: no reserving ahead).
    headroom: usize,
    reserved: AtomicUsize,
    wanted_end: AtomicUsize,
    exhausted: AtomicBool,
    /// Set while the reservation waits in the reserver's queue (queued at most once).
    queued: AtomicBool,
    lock: Mutex<()>,
}

impl Reservation {
    pub(crate) fn new(region: Arc<Region>, chunk: usize, headroom: usize) -> Arc<Reservation> {
        let reservation = Arc::new(Reservation {
            region,
            chunk,
            headroom,
            reserved: AtomicUsize::new(0),
            wanted_end: AtomicUsize::new(0),
            exhausted: AtomicBool::new(false),
            queued: AtomicBool::new(false),
            lock: Mutex::new(()),
        });
        reservation.want(0);
        reservation
    }

    /// Bytes reserved so far.
    pub(crate) fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    /// Ensures `[0, end)` is reserved, reserving synchronously what the background thread
    /// has not yet. False when the file system is full.
    pub(crate) fn ensure(self: &Arc<Self>, end: usize) -> bool {
        self.want(end);
        if end <= self.reserved() {
            return true;
        }
        let _one_at_a_time = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let start = self.reserved();
        if end <= start {
            return true;
        }
        let len = self.region.len();
        let chunk_end = end.div_ceil(self.chunk).saturating_mul(self.chunk).min(len);
        let reached = if self.region.reserve(start, chunk_end - start).is_ok() {
            chunk_end
        } else if self.region.reserve(start, end - start).is_ok() {
            // Nearly full: a whole chunk does not fit, the exact range does.
            self.exhausted.store(true, Ordering::Release);
            end
        } else {
            self.exhausted.store(true, Ordering::Release);
            return false;
        };
        self.reserved.store(reached, Ordering::Release);
        true
    }

    /// Records that the allocator reached `end` and wakes the reserver if the headroom
    /// shrank below half.
    fn want(self: &Arc<Self>, end: usize) {
        if self.headroom == 0 || self.exhausted.load(Ordering::Acquire) {
            return;
        }
        let target = end.saturating_add(self.headroom).min(self.region.len());
        let previous = self.wanted_end.fetch_max(target, Ordering::AcqRel);
        if target > previous
            && self.reserved() < target.saturating_sub(self.headroom / 2)
            && !self.queued.swap(true, Ordering::AcqRel)
        {
            reserver().enqueue(Arc::downgrade(self));
        }
    }

    /// Reserves one more chunk toward `wanted_end`; false when there is nothing to do.
    fn step(&self) -> bool {
        if self.exhausted.load(Ordering::Acquire) {
            return false;
        }
        let _one_at_a_time = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        let start = self.reserved();
        let target = self.wanted_end.load(Ordering::Acquire);
        if start >= target {
            return false;
        }
        let end = (start + self.chunk).min(self.region.len());
        if self.region.reserve(start, end - start).is_err() {
            self.exhausted.store(true, Ordering::Release);
            return false;
        }
        self.reserved.store(end, Ordering::Release);
        end < target
    }
}

/// The process-wide background reserver: one thread, started on first use, idle on a
/// condition variable when no reservation is behind.
struct Reserver {
    queue: Mutex<VecDeque<Weak<Reservation>>>,
    wake: Condvar,
}

fn reserver() -> &'static Reserver {
    static RESERVER: OnceLock<&'static Reserver> = OnceLock::new();
    RESERVER.get_or_init(|| {
        let reserver: &'static Reserver =
            Box::leak(Box::new(Reserver { queue: Mutex::new(VecDeque::new()), wake: Condvar::new() }));
        let started = std::thread::Builder::new()
            .name("terrace-reserver".into())
            .spawn(move || reserver.run());
        // Without a thread, requests only queue up (bounded by the number of live
        // reservations, each queued at most once) and `ensure` reserves synchronously.
        let _ = started;
        reserver
    })
}

impl Reserver {
    fn enqueue(&self, reservation: Weak<Reservation>) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        queue.push_back(reservation);
        self.wake.notify_one();
    }

    fn run(&self) {
        loop {
            let next = {
                let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
                loop {
                    if let Some(next) = queue.pop_front() {
                        break next;
                    }
                    queue = self.wake.wait(queue).unwrap_or_else(|p| p.into_inner());
                }
            };
            if let Some(reservation) = next.upgrade() {
                reservation.queued.store(false, Ordering::Release);
                while reservation.step() {}
            }
        }
    }
}

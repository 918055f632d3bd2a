//! File-block reservation for file kinds, kept ahead of demand by a background thread.
//!
//! A sparse shared mapping turns a full file system into `SIGBUS` at first touch, so a file
//! kind hands out only bytes whose blocks are reserved (`fallocate`). Reserving is not free:
//! on tmpfs it allocates the pages, which costs more than allocating the objects in those
//! pages (`docs/experiments.md`, "terrace-kinds"). So reservation runs ahead of the
//! allocator on a background thread, within a bounded headroom; an allocating thread that
//! outruns it reserves chunks itself, in parallel with the background thread (each claims
//! a different chunk), and waits only for a chunk someone else is still reserving.
//!
//! Invariants:
//! - `[0, reserved)` of the region has blocks; `reserved` only grows and is the contiguous
//!   prefix of finished chunks (chunks finish out of order; `finished` holds the others);
//! - every chunk below `claimed` is being reserved or finished, by exactly one claimant;
//! - the background thread never claims beyond `wanted_end`, which is at most `headroom`
//!   beyond the highest offset the allocator asked for (so at most `headroom` plus one
//!   chunk per claimant is reserved and unused).
//!
//! A failed chunk (full file system) stops the background thread for the region; the
//! allocating thread then tries the exact range it needs, and failing that the allocation
//! fails with out-of-memory.

use std::collections::{BTreeSet, VecDeque};
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
    /// Start of the first chunk nobody has claimed.
    claimed: AtomicUsize,
    reserved: AtomicUsize,
    wanted_end: AtomicUsize,
    exhausted: AtomicBool,
    /// Set while the reservation waits in the reserver's queue (queued at most once).
    queued: AtomicBool,
    /// Finished chunks above `reserved` (their start offsets), and the failure flag's
    /// companion: waiters sleep on `progress` until `reserved` moves or a claimant fails.
    finished: Mutex<BTreeSet<usize>>,
    progress: Condvar,
}

enum Claim {
    /// Reserved a chunk.
    Done,
    /// Nothing left to claim (all chunks up to the limit are claimed).
    Nothing,
    /// The file system refused the chunk.
    Failed,
}

impl Reservation {
    pub(crate) fn new(region: Arc<Region>, chunk: usize, headroom: usize) -> Arc<Reservation> {
        Arc::new(Reservation {
            region,
            chunk,
            headroom,
            claimed: AtomicUsize::new(0),
            reserved: AtomicUsize::new(0),
            wanted_end: AtomicUsize::new(0),
            exhausted: AtomicBool::new(false),
            queued: AtomicBool::new(false),
            finished: Mutex::new(BTreeSet::new()),
            progress: Condvar::new(),
        })
    }

    /// Stops reserving ahead: the space is being destroyed. The background thread drops
    /// its reference after at most the chunk it is working on.
    pub(crate) fn stop(&self) {
        self.exhausted.store(true, Ordering::Release);
    }

    /// Bytes reserved so far (the contiguous prefix).
    pub(crate) fn reserved(&self) -> usize {
        self.reserved.load(Ordering::Acquire)
    }

    /// Ensures `[0, end)` is reserved, reserving chunks itself while the background thread
    /// is behind. False when the file system is full.
    pub(crate) fn ensure(self: &Arc<Self>, end: usize) -> bool {
        self.want(end);
        loop {
            if end <= self.reserved() {
                return true;
            }
            if self.exhausted.load(Ordering::Acquire) {
                return self.reserve_exact(end);
            }
            match self.claim(end) {
                Claim::Done => continue,
                Claim::Failed => return self.reserve_exact(end),
                Claim::Nothing => self.wait_for_progress(end),
            }
        }
    }

    /// Reserves `[0, end)` at creation, on the calling thread, without moving the
    /// background target: the headroom starts out reserved and the reserver wakes only as
    /// use approaches its end. False when the file system is full.
    pub(crate) fn prefill(&self, end: usize) -> bool {
        while self.reserved() < end {
            match self.claim(end) {
                Claim::Done => {}
                Claim::Nothing => return self.reserved() >= end,
                Claim::Failed => return false,
            }
        }
        true
    }

    /// Claims the next chunk if it starts below `limit`, and reserves it.
    fn claim(&self, limit: usize) -> Claim {
        let len = self.region.len();
        let mut start = self.claimed.load(Ordering::Acquire);
        loop {
            if start >= limit.min(len) {
                return Claim::Nothing;
            }
            match self.claimed.compare_exchange_weak(
                start,
                start + self.chunk,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => start = now,
            }
        }
        let chunk_len = self.chunk.min(len - start);
        let ok = self.region.reserve(start, chunk_len).is_ok();
        let mut finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        if ok {
            finished.insert(start);
            // Advance the contiguous prefix over every finished chunk.
            let mut prefix = self.reserved.load(Ordering::Acquire);
            while finished.remove(&prefix) {
                prefix = (prefix + self.chunk).min(len);
            }
            self.reserved.store(prefix, Ordering::Release);
        } else {
            self.exhausted.store(true, Ordering::Release);
        }
        drop(finished);
        self.progress.notify_all();
        if ok {
            Claim::Done
        } else {
            Claim::Failed
        }
    }

    /// Sleeps until `reserved` reaches `end` or a claimant fails (chunks below `end` are
    /// all claimed by others).
    fn wait_for_progress(&self, end: usize) {
        let finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        if end <= self.reserved() || self.exhausted.load(Ordering::Acquire) {
            return;
        }
        drop(self.progress.wait(finished));
    }

    /// After a failed chunk: reserve exactly `[reserved, end)` once the other claimants
    /// are done. The prefix then ends exactly at `end`.
    fn reserve_exact(&self, end: usize) -> bool {
        let mut finished = self.finished.lock().unwrap_or_else(|p| p.into_inner());
        let start = self.reserved.load(Ordering::Acquire);
        if end <= start {
            return true;
        }
        if self.region.reserve(start, end - start).is_err() {
            return false;
        }
        finished.retain(|&chunk| chunk >= end);
        self.reserved.store(end, Ordering::Release);
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

    /// Background work: claims chunks up to `wanted_end`.
    fn run_ahead(&self) {
        while !self.exhausted.load(Ordering::Acquire) {
            match self.claim(self.wanted_end.load(Ordering::Acquire)) {
                Claim::Done => {}
                Claim::Nothing | Claim::Failed => return,
            }
        }
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
        let reserver: &'static Reserver = Box::leak(Box::new(Reserver {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
        }));
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
                reservation.run_ahead();
            }
        }
    }
}

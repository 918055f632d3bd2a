//! Fencing a coordinated volume's backend against an earlier primary. Epochs fence the
//! replication stream (a secondary refuses an older primary), but the backend is shared
//! and cannot check an epoch: an old primary paused between its lease check and a
//! write-back write would, once resumed, write an older block over what the new primary
//! wrote back. So a coordinated primary writes its backend only while it holds the
//! backend's **writer lock**, and gives the lock up only after its volume has closed.
//!
//! [`FencedBackend`] wraps a backend: every write, trim, flush, grow and snapshot first
//! takes the lock, waiting while another holds it; reads never wait. For a file or
//! block device the lock is `flock(LOCK_EX)` on it (advisory: every `terrace` takes it;
//! it holds between processes on one host and, on NFSv4, between clients). An NBD or S3
//! backend has no such lock: a coordinated node refuses to serve one unless told to
//! accept that (`HaConfig::unfenced_backends`), and then leaves it unfenced and logs so.
//!
//! # Invariants
//! - F1: a write reaches the backend only while this fence holds the lock.
//! - F2: the lock is let go only by [`FencedBackend::release`], which the node calls after
//!   the volume has closed (its write-back joined): a writer of the old term never writes
//!   after the next term's first write. So the backend sees the old primary's last
//!   writes (a stale one included) before any of the new primary's, which rewrites every
//!   block its log holds newer.
//! - F3: after [`FencedBackend::abandon`] (the node steps down), a writer still waiting for
//!   the lock gets an error instead of waiting for ever, so the volume can close.
//! - F4: a lock just taken is kept only if the primary's lease still holds, checked under
//!   it. A primary paused across whole terms — its lease long gone, the next primary
//!   done and its lock let go, the one after not yet writing — would otherwise take the
//!   free lock on resuming and write an older block over one a later term wrote back
//!   and no log holds any more. Once the lock is held, a lease that runs out is the
//!   volume's to notice (it writes nothing more back), and the lock orders whatever
//!   write was already under way before the next term's.
//!
//! The price (safety before liveness, as with any fence): while an old primary is paused
//! holding the lock, the new one takes writes into its log but writes nothing back until
//! the old one resumes and steps down, or dies.

use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::backend::Backend;
use crate::replication::LeaseWatch;

/// How often a writer tries the lock again while another holds it.
const RETRY: Duration = Duration::from_millis(20);

/// A backend whose writes wait for its writer lock (see the module docs).
pub struct FencedBackend {
    inner: Arc<dyn Backend>,
    /// The file to lock; `None`: the backend cannot be fenced.
    lock_path: Option<PathBuf>,
    /// The lease the primary holds the volume by (F4); `None`: none to check.
    lease: Option<LeaseWatch>,
    /// The open file whose `flock` is held, once taken.
    held: Mutex<Option<File>>,
    /// F3: stepped down; no more waiting.
    abandoned: AtomicBool,
    /// F2: given up; nothing more is written.
    released: AtomicBool,
}

impl FencedBackend {
    /// Wraps `inner`; `lock_path` is the file to lock (a file or block device backend's),
    /// `None` for a backend that has no lock; `lease` the primary's, checked when the lock
    /// is taken (F4).
    pub fn new(
        inner: Arc<dyn Backend>,
        lock_path: Option<PathBuf>,
        lease: Option<LeaseWatch>,
    ) -> FencedBackend {
        if lock_path.is_none() {
            tracing::warn!(
                backend = %inner.describe(),
                "this backend has no writer lock: an earlier primary is not fenced from it"
            );
        }
        FencedBackend {
            inner,
            lock_path,
            lease,
            held: Mutex::new(None),
            abandoned: AtomicBool::new(false),
            released: AtomicBool::new(false),
        }
    }

    /// Whether the writer lock is held (always, for a backend without one).
    pub fn holds(&self) -> bool {
        self.lock_path.is_none() || self.held.lock().is_some()
    }

    /// F3: the node steps down; writers waiting for the lock fail from now on.
    pub fn abandon(&self) {
        self.abandoned.store(true, Ordering::Release);
    }

    /// F2: lets the lock go (after the volume closed); every later write fails.
    pub fn release(&self) {
        self.abandoned.store(true, Ordering::Release);
        self.released.store(true, Ordering::Release);
        // Closing the file drops its flock.
        self.held.lock().take();
    }

    /// F1: returns once the lock is held; waits while another holds it.
    fn writer(&self) -> io::Result<()> {
        let Some(path) = &self.lock_path else {
            return Ok(());
        };
        let mut waited_since: Option<Instant> = None;
        loop {
            if self.released.load(Ordering::Acquire) {
                return Err(io::Error::other(
                    "the backend's writer lock was given up: this node no longer leads",
                ));
            }
            {
                let mut held = self.held.lock();
                if held.is_some() {
                    return Ok(());
                }
                let file = File::open(path)?;
                match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
                {
                    Ok(()) => {
                        if self.lease.as_ref().is_some_and(|l| !l.holds()) {
                            // F4: closing the file lets the lock go at once.
                            drop(file);
                            return Err(io::Error::other(
                                "the primary's lease ran out: not taking the backend's writer \
                                 lock (another node may lead)",
                            ));
                        }
                        if let Some(since) = waited_since {
                            tracing::info!(
                                backend = %self.inner.describe(), waited = ?since.elapsed(),
                                "took the backend's writer lock"
                            );
                        }
                        *held = Some(file);
                        return Ok(());
                    }
                    Err(rustix::io::Errno::WOULDBLOCK) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if self.abandoned.load(Ordering::Acquire) {
                return Err(io::Error::other(
                    "stepped down while an earlier primary held the backend's writer lock",
                ));
            }
            if waited_since.is_none() {
                waited_since = Some(Instant::now());
                tracing::warn!(
                    backend = %self.inner.describe(),
                    "an earlier primary holds the backend's writer lock: writing back waits"
                );
            }
            std::thread::sleep(RETRY);
        }
    }
}

impl Backend for FencedBackend {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.writer()?;
        self.inner.write_at(offset, data)
    }
    fn snapshot(&self, tag: &str) -> io::Result<String> {
        self.writer()?;
        self.inner.snapshot(tag)
    }
    fn grow(&self, new_size: u64) -> io::Result<()> {
        self.writer()?;
        self.inner.grow(new_size)
    }
    fn flush(&self) -> io::Result<()> {
        self.writer()?;
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.writer()?;
        self.inner.trim(offset, len)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::FileBackend;

    fn fenced(path: &std::path::Path) -> FencedBackend {
        let inner: Arc<dyn Backend> = Arc::new(FileBackend::open(path).unwrap());
        FencedBackend::new(inner, Some(path.to_path_buf()), None)
    }

    /// F1–F3: the new primary writes nothing while the old one holds the lock, and its
    /// write lands after the old one's last write; a writer waiting when its node steps
    /// down fails instead of waiting; a released fence writes nothing.
    #[test]
    fn the_next_primary_writes_only_after_the_old_one_lets_the_lock_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backend.img");
        File::create(&path).unwrap().set_len(1 << 20).unwrap();
        let old = fenced(&path);
        let new = Arc::new(fenced(&path));
        old.write_at(0, &[1u8; 4096]).unwrap();
        assert!(old.holds());

        let writer = {
            let new = Arc::clone(&new);
            std::thread::spawn(move || new.write_at(0, &[2u8; 4096]))
        };
        std::thread::sleep(Duration::from_millis(200));
        assert!(!writer.is_finished(), "the new primary wrote past the lock");
        assert!(!new.holds());
        // The old primary's stale write, resumed, still lands first.
        old.write_at(0, &[3u8; 4096]).unwrap();
        old.release();
        writer.join().unwrap().unwrap();
        let mut buf = [0u8; 4096];
        new.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, [2u8; 4096]);
        assert!(
            old.write_at(0, &[4u8; 4096]).is_err(),
            "a released fence wrote"
        );

        // Stepping down while waiting for the lock: the wait ends with an error.
        let third = Arc::new(fenced(&path));
        let waiting = {
            let third = Arc::clone(&third);
            std::thread::spawn(move || third.flush())
        };
        std::thread::sleep(Duration::from_millis(100));
        third.abandon();
        assert!(waiting.join().unwrap().is_err());
        // Reads never wait.
        third.read_at(0, &mut buf).unwrap();
        new.release();
    }

    /// F4: a primary whose lease ran out (paused across terms) does not take a free lock,
    /// and leaves it free for the node that leads now.
    #[test]
    fn a_primary_whose_lease_ran_out_does_not_take_a_free_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("backend.img");
        File::create(&path).unwrap().set_len(1 << 20).unwrap();
        let inner: Arc<dyn Backend> = Arc::new(FileBackend::open(&path).unwrap());
        let lease = LeaseWatch::expired();
        let stale = FencedBackend::new(inner, Some(path.clone()), Some(lease.clone()));
        let err = stale.write_at(0, &[1u8; 4096]).unwrap_err();
        assert!(err.to_string().contains("lease"), "{err}");
        assert!(!stale.holds());
        let current = fenced(&path);
        current.write_at(0, &[2u8; 4096]).unwrap();
        assert!(current.holds(), "the lock was left free");
        current.release();
        // With its lease renewed it takes the lock like any primary.
        lease.hold_until(Instant::now() + Duration::from_secs(5));
        stale.write_at(0, &[3u8; 4096]).unwrap();
        assert!(stale.holds());
        stale.release();
    }
}

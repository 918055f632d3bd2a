//! The flash I/O pool: a few threads that run flash fetches (`Shared::run_fetch`) for the
//! io_uring workers, whose loops must never wait on the device (the epoll workers use
//! their runtime's blocking pool instead). A worker hands a job over and goes on with
//! its other connections; the job reads, then wakes the worker, which handles the
//! request that waited (`Session::fetched`).
//!
//! Sized at [`THREADS_PER_WORKER`] per worker: enough reads in flight to keep a flash
//! device's queue busy while the workers' loops stay on their cores. Jobs wait in one
//! queue; the threads end when the pool is dropped, after the jobs queued.

use std::io;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Reading threads per worker thread.
pub const THREADS_PER_WORKER: usize = 4;
/// The most reading threads a pool has.
pub const MAX_THREADS: usize = 64;

type Job = Box<dyn FnOnce() + Send>;

pub struct FlashIo {
    queue: Mutex<Option<Sender<Job>>>,
    threads: Vec<JoinHandle<()>>,
}

impl FlashIo {
    /// A pool for `workers` workers.
    pub fn start(workers: usize) -> io::Result<Arc<FlashIo>> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let n = (workers * THREADS_PER_WORKER).clamp(1, MAX_THREADS);
        let threads = (0..n)
            .map(|i| {
                let rx = Arc::clone(&rx);
                std::thread::Builder::new()
                    .name(format!("terrace-flash-{i}"))
                    .spawn(move || run(&rx))
            })
            .collect::<io::Result<Vec<_>>>()?;
        Ok(Arc::new(FlashIo {
            queue: Mutex::new(Some(tx)),
            threads,
        }))
    }

    /// Queues `job`; gives it back if the pool has stopped (the caller runs it).
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        match queue.as_ref() {
            Some(tx) => tx.send(job).map_err(|e| e.0),
            None => Err(job),
        }
    }
}

fn run(rx: &Mutex<Receiver<Job>>) {
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|e| e.into_inner());
            rx.recv()
        };
        match job {
            Ok(job) => job(),
            // The pool was dropped and the queue is empty.
            Err(_) => return,
        }
    }
}

impl Drop for FlashIo {
    fn drop(&mut self) {
        drop(self.queue.lock().unwrap_or_else(|e| e.into_inner()).take());
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn every_job_runs_before_the_pool_is_gone() {
        let done = Arc::new(AtomicUsize::new(0));
        let pool = FlashIo::start(2).unwrap();
        for _ in 0..100 {
            let done = Arc::clone(&done);
            assert!(pool
                .submit(Box::new(move || {
                    done.fetch_add(1, Ordering::SeqCst);
                }))
                .is_ok());
        }
        drop(Arc::try_unwrap(pool).ok().expect("one owner"));
        assert_eq!(done.load(Ordering::SeqCst), 100);
    }
}

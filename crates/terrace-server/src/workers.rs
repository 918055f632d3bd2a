//! Worker threads, memcached's model: each worker runs its own single-threaded event
//! loop, and the acceptor hands each new connection to the next worker round-robin.
//! A worker's loop is an io_uring ring (`uring`) where the kernel allows it, else a
//! single-threaded tokio runtime over epoll (`conn::serve`); [`Engine`] says which.
//! A connection lives on one worker for its whole life, so serving it never wakes
//! another thread (a work-stealing runtime spent a futex wake-up per few requests),
//! except that an epoll worker's get of an item on flash is read on its runtime's
//! blocking pool (an io_uring worker reads it on its own ring), so that no worker's loop
//! waits on the device.
//!
//! Invariants: when `stop` turns true a worker drops every connection task (each is
//! waiting on a read or a write then, never in the middle of a request, see `conn`) and
//! ends; a connection is counted in `curr_connections` from admission until its task
//! ends, on whatever path (the count is a guard owned by the task).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::conn::{self, Admitted};
use crate::shared::Shared;
use crate::uring;

/// An accepted connection on its way to a worker.
pub enum Accepted {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

/// How the workers wait for and do socket I/O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// One io_uring ring per worker: the system calls of all ready connections in one
    /// `io_uring_enter`.
    Uring,
    /// A readiness loop per worker (tokio over epoll): a `recv` and a `send` per request.
    Epoll,
}

impl Engine {
    /// The engine's name in logs and `stats`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Uring => "io_uring",
            Engine::Epoll => "epoll",
        }
    }
}

/// A worker's end of the hand-off.
enum Handoff {
    Epoll(mpsc::UnboundedSender<(Accepted, Admitted)>),
    Uring(Arc<uring::Handoff>),
}

/// The worker threads and their hand-off channels.
pub struct Workers {
    handoffs: Vec<Handoff>,
    next: AtomicUsize,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// Starts `n` workers on `engine`; they and their connections end when `stop` turns
    /// true (epoll) or at [`Workers::join`] (both).
    pub fn start(
        n: usize,
        engine: Engine,
        shared: &Arc<Shared>,
        stop: &watch::Receiver<bool>,
    ) -> std::io::Result<Workers> {
        let mut handoffs = Vec::with_capacity(n);
        let mut threads = Vec::with_capacity(n);
        for i in 0..n {
            if engine == Engine::Uring {
                let (handoff, thread) = uring::start(i, shared)?;
                handoffs.push(Handoff::Uring(handoff));
                threads.push(thread);
                continue;
            }
            let (tx, rx) = mpsc::unbounded_channel();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()?;
            let shared = Arc::clone(shared);
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("terrace-worker-{i}"))
                .spawn(move || runtime.block_on(work(rx, shared, stop)))?;
            handoffs.push(Handoff::Epoll(tx));
            threads.push(thread);
        }
        Ok(Workers {
            handoffs,
            next: AtomicUsize::new(0),
            threads,
        })
    }

    /// Admits a connection (or refuses it over the limit) and hands it to a worker.
    pub async fn dispatch(&self, shared: &Arc<Shared>, accepted: Accepted) {
        let Some(admitted) = Admitted::try_new(shared) else {
            refuse(accepted).await;
            return;
        };
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.handoffs.len();
        match &self.handoffs[i] {
            // A worker that is gone drops the connection, which closes it.
            Handoff::Epoll(tx) => {
                let _ = tx.send((accepted, admitted));
            }
            Handoff::Uring(h) => h.send(accepted, admitted),
        }
    }

    /// Stops the workers and waits for them to end.
    pub fn join(self) {
        for h in &self.handoffs {
            if let Handoff::Uring(h) = h {
                h.stop();
            }
        }
        drop(self.handoffs);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

async fn work(
    mut handoff: mpsc::UnboundedReceiver<(Accepted, Admitted)>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            next = handoff.recv() => match next {
                Some((accepted, admitted)) => {
                    let shared = Arc::clone(&shared);
                    match accepted {
                        Accepted::Tcp(s) => {
                            if let Ok(s) = tokio::net::TcpStream::from_std(s) {
                                connections.spawn(serve_admitted(shared, s, admitted));
                            }
                        }
                        Accepted::Unix(s) => {
                            if let Ok(s) = tokio::net::UnixStream::from_std(s) {
                                connections.spawn(serve_admitted(shared, s, admitted));
                            }
                        }
                    }
                }
                None => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = stop.changed() => break,
        }
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

async fn serve_admitted<S>(shared: Arc<Shared>, stream: S, admitted: Admitted)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    conn::serve(shared, stream).await;
    drop(admitted);
}

/// Refuses a connection over the limit the way memcached does.
async fn refuse(accepted: Accepted) {
    const MESSAGE: &[u8] = b"ERROR Too many open connections\r\n";
    match accepted {
        Accepted::Tcp(s) => {
            if let Ok(mut s) = tokio::net::TcpStream::from_std(s) {
                let _ = s.write_all(MESSAGE).await;
                let _ = s.shutdown().await;
            }
        }
        Accepted::Unix(s) => {
            if let Ok(mut s) = tokio::net::UnixStream::from_std(s) {
                let _ = s.write_all(MESSAGE).await;
                let _ = s.shutdown().await;
            }
        }
    }
}

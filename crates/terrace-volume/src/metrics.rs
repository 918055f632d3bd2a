//! Prometheus over HTTP for `terrace serve-volume --metrics ADDR`: `GET /metrics` (or
//! `GET /`) answers every volume's Prometheus text (what `terrace volume metrics`
//! prints), anything else 404; one response per connection, then close.
//!
//! Bad input never holds a thread for long: a request head is read for at most 5 s and
//! 8 KiB, and each connection has its own thread.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::control::accept_loop;
use crate::error::VolumeError;
use crate::volume::{Volume, VolumeList};

const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
const HEAD_MAX: usize = 8 << 10;

/// A running metrics endpoint.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` (`HOST:PORT`; port 0 picks one) for `volumes`.
    pub fn start(addr: &str, volumes: VolumeList) -> Result<MetricsServer, VolumeError> {
        let bad = |what: String| VolumeError::Config(format!("metrics address {addr}: {what}"));
        let listener = TcpListener::bind(addr).map_err(|e| bad(e.to_string()))?;
        let local = listener.local_addr().map_err(|e| bad(e.to_string()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| bad(e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = accept_loop(
            "volume-metrics",
            Arc::clone(&stop),
            move || listener.accept().map(|(stream, _)| stream),
            move |stream| answer(stream, &volumes.snapshot()),
        )
        .map_err(|e| bad(e.to_string()))?;
        Ok(MetricsServer {
            addr: local,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting (answers in progress finish on their own).
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(mut stream: TcpStream, volumes: &[Arc<Volume>]) {
    let _ = stream.set_nonblocking(false);
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < HEAD_MAX {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return;
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let response = if head.starts_with(b"GET /metrics ") || head.starts_with(b"GET / ") {
        let body: String = volumes.iter().map(|v| v.status().prometheus()).collect();
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    } else {
        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_string()
    };
    let _ = stream.set_write_timeout(Some(HEAD_TIMEOUT));
    let _ = stream.write_all(response.as_bytes());
}

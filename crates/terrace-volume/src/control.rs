//! The control socket of `terrace serve-volume`: a UNIX socket that takes one command
//! line per connection, answers and closes — what `terrace volume status|flush|mode|
//! metrics` send. Commands:
//! - `status [NAME]`: one `key value` block per volume (present, dirty, log, hits…);
//! - `metrics`: every volume's Prometheus text;
//! - `flush [NAME]`: writes every dirty block back (waits, bounded);
//! - `mode NAME MODE`: switches a volume's mode while it runs;
//! - `resize NAME SIZE`: grows a volume while it runs (`10GiB`, or bytes);
//! - `snapshot NAME TAG`: writes a volume back and has its backend copy itself; answers
//!   where the snapshot is;
//! - `replicas`: the copies this node keeps for other nodes' primaries (whole or not,
//!   their epoch and stream).
//!
//! A reply's first line is `OK` or `ERROR <why>`. Bad input (an unknown command, a line
//! over 4 KiB, a client that never sends) gets an error or a timeout, never a stuck
//! thread: each connection has a 10 s read timeout.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::VolumeError;
use crate::replication::replica::ReplicaStatusSource;
use crate::volume::{Mode, Volume, VolumeList};

/// How long `flush` waits for a drain.
const FLUSH_WAIT: Duration = Duration::from_secs(600);

/// A running control socket.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Listens on `path` (a stale socket there is replaced) for `volumes`.
    /// `replicas`: the copies this node keeps for other primaries, if it serves any.
    pub fn start(
        path: &Path,
        volumes: VolumeList,
        replicas: Option<ReplicaStatusSource>,
    ) -> Result<ControlServer, VolumeError> {
        let io_err = |source| VolumeError::Io {
            path: path.to_path_buf(),
            source,
        };
        if path.exists() {
            // A socket someone still answers on belongs to a running server: refuse,
            // as the NBD listener does; a stale one is replaced, anything else kept.
            if UnixStream::connect(path).is_ok() {
                return Err(VolumeError::Config(format!(
                    "control socket {} is in use by a running server",
                    path.display()
                )));
            }
            use std::os::unix::fs::FileTypeExt;
            let is_socket = std::fs::symlink_metadata(path)
                .map_err(io_err)?
                .file_type()
                .is_socket();
            if !is_socket {
                return Err(VolumeError::Config(format!(
                    "{} exists and is not a socket",
                    path.display()
                )));
            }
            std::fs::remove_file(path).map_err(io_err)?;
        }
        let listener = UnixListener::bind(path).map_err(io_err)?;
        listener.set_nonblocking(true).map_err(io_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = accept_loop(
            "volume-control",
            Arc::clone(&stop),
            move || listener.accept().map(|(stream, _)| stream),
            move |stream| serve(stream, &volumes.snapshot(), replicas.as_ref()),
        )
        .map_err(io_err)?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    /// Stops accepting and removes the socket (commands in progress finish on their own).
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The accept thread of a non-blocking listener (the control socket, the metrics
/// endpoint): until `stop`, each connection `accept` returns is served on a thread of its
/// own (named `<name>-conn`); accept errors are logged and retried.
pub(crate) fn accept_loop<S, A, F>(
    name: &str,
    stop: Arc<AtomicBool>,
    mut accept: A,
    serve: F,
) -> std::io::Result<JoinHandle<()>>
where
    S: Send + 'static,
    A: FnMut() -> std::io::Result<S> + Send + 'static,
    F: Fn(S) + Send + Sync + 'static,
{
    let serve = Arc::new(serve);
    let conn_name = format!("{name}-conn");
    let what = name.to_string();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            while !stop.load(Ordering::Acquire) {
                match accept() {
                    Ok(stream) => {
                        let serve = Arc::clone(&serve);
                        let _ = std::thread::Builder::new()
                            .name(conn_name.clone())
                            .spawn(move || serve(stream));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(50))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "{what} accept");
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        })
}

fn serve(stream: UnixStream, volumes: &[Arc<Volume>], replicas: Option<&ReplicaStatusSource>) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let mut line = String::new();
    let reply = match BufReader::new((&stream).take(4096)).read_line(&mut line) {
        Ok(0) => return,
        Ok(_) if !line.ends_with('\n') && line.len() >= 4096 => {
            "ERROR command line longer than 4 KiB\n".to_string()
        }
        Ok(_) => answer(line.trim(), volumes, replicas),
        Err(e) => format!("ERROR reading the command: {e}\n"),
    };
    let mut stream = stream;
    let _ = stream.write_all(reply.as_bytes());
}

/// The reply to one command line.
pub fn answer(
    line: &str,
    volumes: &[Arc<Volume>],
    replicas: Option<&ReplicaStatusSource>,
) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let pick = |name: Option<&&str>| -> Result<Vec<&Arc<Volume>>, String> {
        match name {
            None => Ok(volumes.iter().collect()),
            Some(n) => volumes
                .iter()
                .find(|v| v.name() == *n)
                .map(|v| vec![v])
                .ok_or_else(|| format!("no volume named {n:?}")),
        }
    };
    let result: Result<String, String> = match words.first().copied() {
        Some("status") => pick(words.get(1)).map(|vs| vs.iter().map(|v| status_text(v)).collect()),
        Some("metrics") => Ok(volumes.iter().map(|v| v.status().prometheus()).collect()),
        Some("flush") => pick(words.get(1)).and_then(|vs| {
            for v in vs {
                v.drain(FLUSH_WAIT)
                    .map_err(|e| format!("{}: {e}", v.name()))?;
            }
            Ok(String::new())
        }),
        Some("mode") => match (words.get(1), words.get(2)) {
            (Some(name), Some(mode)) => mode.parse::<Mode>().and_then(|mode| {
                pick(Some(name)).map(|vs| {
                    vs[0].set_mode(mode);
                    String::new()
                })
            }),
            _ => Err(
                "usage: mode NAME write-through|write-back|write-around|read-only|storage".into(),
            ),
        },
        Some("resize") => match (words.get(1), words.get(2)) {
            (Some(name), Some(size)) => terrace_cache::spec::parse_size(size)
                .map_err(|e| format!("size {size:?}: {e}"))
                .and_then(|size| {
                    let vs = pick(Some(name))?;
                    vs[0].grow(size).map_err(|e| e.to_string())?;
                    Ok(String::new())
                }),
            _ => Err("usage: resize NAME SIZE".into()),
        },
        Some("snapshot") => match (words.get(1), words.get(2)) {
            (Some(name), Some(tag)) => pick(Some(name)).and_then(|vs| {
                vs[0]
                    .snapshot(tag, FLUSH_WAIT)
                    .map(|at| format!("{at}\n"))
                    .map_err(|e| e.to_string())
            }),
            _ => Err("usage: snapshot NAME TAG".into()),
        },
        Some("replicas") => Ok(replicas.map_or(String::new(), |r| {
            r.status()
                .iter()
                .map(|c| {
                    format!(
                        "copy {} {} epoch {} stream {} frames {} bytes {} {}\n",
                        c.volume,
                        if c.state.consistent {
                            "whole"
                        } else {
                            "inconsistent"
                        },
                        c.state.epoch,
                        c.state.stream,
                        c.frames,
                        c.bytes,
                        match (c.led, c.primary_connected) {
                            (true, _) => "led-here",
                            (false, true) => "primary-connected",
                            (false, false) => "no-primary",
                        }
                    )
                })
                .collect()
        })),
        Some(other) => Err(format!(
            "unknown command {other:?}: status, metrics, flush, mode, resize, snapshot, replicas"
        )),
        None => Err("empty command".into()),
    };
    match result {
        Ok(body) => format!("OK\n{body}"),
        Err(why) => format!("ERROR {why}\n"),
    }
}

fn status_text(v: &Volume) -> String {
    let s = v.status();
    format!(
        "volume {}\n  mode {}\n  ack {:?}\n  backend {}\n  size_bytes {}\n  present_bytes {}\n  \
         clean_bytes {}\n  dirty_bytes {}\n  allocated_bytes {}\n  \
         log_used_bytes {}\n  log_capacity_bytes {}\n  read_hit_blocks {}\n  read_miss_blocks {}\n  \
         read_dirty_blocks {}\n  read_bytes {}\n  written_bytes {}\n  written_back_bytes {}\n  \
         batches_written_back {}\n  backend_errors {}\n  cache_errors {}\n  overtaken_writes {}\n  bypassed_writes {}\n  \
         bypassed_bytes {}\n  batches_compacted {}\n  log_full_waits {}\n  flush {}\n  \
         last_error {}\n",
        s.name,
        s.mode.name(),
        s.ack,
        s.backend,
        s.size,
        s.present_bytes(),
        s.clean_bytes,
        s.dirty_bytes,
        s.allocated_bytes(),
        s.log.used,
        s.log.capacity,
        s.read_hit_blocks,
        s.read_miss_blocks,
        s.read_dirty_blocks,
        s.bytes_read,
        s.bytes_written,
        s.written_back_bytes,
        s.batches_written_back,
        s.backend_errors,
        s.cache_errors,
        s.overtaken_writes,
        s.bypassed_writes,
        s.bypassed_bytes,
        s.batches_compacted,
        s.log.full_waits,
        match s.flush {
            None => "idle".to_string(),
            Some(f) => format!(
                "writing back: {} bytes done, {} dirty at the start",
                f.written_back, f.dirty_at_start
            ),
        },
        s.last_error.as_deref().unwrap_or("none"),
    ) + &s.replication.map_or(String::new(), |r| r.text())
}

/// Sends one command to a control socket and returns the reply (the client side of
/// `terrace volume`).
pub fn send(path: &Path, command: &str, timeout: Duration) -> Result<String, VolumeError> {
    let io_err = |source| VolumeError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut stream = UnixStream::connect(path).map_err(io_err)?;
    stream.set_read_timeout(Some(timeout)).map_err(io_err)?;
    stream
        .write_all(format!("{command}\n").as_bytes())
        .map_err(io_err)?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).map_err(io_err)?;
    Ok(reply)
}

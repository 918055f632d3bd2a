//! `--engine memcached`: the look-aside workload against a memcached-compatible server
//! (memcached, with or without extstore, or `terrace serve`) over memcached's meta
//! protocol, so an out-of-process cache runs the very workload the in-process engines do.
//!
//! - A get is `mg <key> v` (`VA <len>` + data, or `EN`); every hit's value is checked with
//!   the workload's check, and a wrong one is [`Got::Wrong`].
//! - A set is a plain `ms <key> <len> T0` + data, awaiting its `HD`. A set the server
//!   refuses (`NS`, `SERVER_ERROR out of memory ...`) is counted (`sets_refused`) and the
//!   run goes on, as a look-aside client would; an I/O error, a timeout or a reply that
//!   makes no sense fails the run.
//! - Each benchmark thread uses one blocking connection at a time: connections live in a
//!   pool, a request takes one out (opening one if none is free) and puts it back after
//!   its reply, so there are never more connections than threads. A connection whose
//!   request failed is dropped, not reused.
//! - Every connection has connect, read and write timeouts: a dead or silent server
//!   fails the run, never hangs it.
//! - The server's `stats` are read once, on a fresh connection, after the run: `items()`
//!   is `curr_items`, `extra()` is every stat (numbers parsed where they parse) plus the
//!   refused sets.
//!
//! Keys: the workload's keys are `k` and 15 decimal digits ([`crate::workload::key`]): 16
//! printable ASCII bytes without spaces or control characters, valid memcached keys as
//! they are, so they are sent unencoded.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Map, Number, Value};

use crate::engines::{check, Engine, Got};
use crate::net::reply::{self, Replies, Stored};

/// One blocking connection: the socket to write requests on, a buffered reader of its
/// replies, and scratch buffers reused across requests.
struct Conn {
    stream: TcpStream,
    replies: Replies<TcpStream>,
    request: Vec<u8>,
    value: Vec<u8>,
}

impl Conn {
    fn open(addr: SocketAddr, timeout: Duration) -> Result<Conn> {
        let stream = crate::net::connect(addr, timeout)?;
        let reader = stream.try_clone().context("cannot clone a socket")?;
        Ok(Conn {
            stream,
            replies: Replies::new(reader),
            request: Vec::with_capacity(64),
            value: Vec::new(),
        })
    }

    fn send(&mut self) -> Result<()> {
        (&self.stream)
            .write_all(&self.request)
            .context("sending a request")
    }
}

pub struct Memcached {
    addr: SocketAddr,
    /// As given on the command line (for messages).
    server: String,
    timeout: Duration,
    pool: Mutex<Vec<Conn>>,
    refused: AtomicU64,
    first_refusal: Mutex<Option<String>>,
    /// The first few wrong values, described (what came back against what was expected),
    /// so that a server's wrong values can be told from a client's misreading.
    wrong: Mutex<Vec<String>>,
    /// The server's stats, read once after the run (or why they could not be).
    stats: OnceLock<Result<Vec<(String, String)>, String>>,
}

impl Memcached {
    /// Checks that the server answers (a `version`-free probe: one `mn`), so a wrong
    /// address fails before the run starts.
    pub fn connect(server: &str, timeout: Duration) -> Result<Memcached> {
        let addr = crate::net::resolve(server)?;
        let m = Memcached {
            addr,
            server: server.to_string(),
            timeout,
            pool: Mutex::new(Vec::new()),
            refused: AtomicU64::new(0),
            first_refusal: Mutex::new(None),
            wrong: Mutex::new(Vec::new()),
            stats: OnceLock::new(),
        };
        m.with_conn(|c| {
            c.request.clear();
            c.request.extend_from_slice(b"mn\r\n");
            c.send()?;
            match c.replies.sync() {
                Ok(reply::SyncReply::Synced) => Ok(()),
                Ok(other) => {
                    bail!("{server} answered {other:?} to mn (not a meta-protocol server?)")
                }
                Err(e) => Err(anyhow!(e)).context(format!("{server} does not answer mn")),
            }
        })?;
        Ok(m)
    }

    /// Runs `f` on a connection of the pool (a new one if none is free) and puts it back
    /// if `f` succeeded.
    fn with_conn<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        let taken = self
            .pool
            .lock()
            .map_err(|_| anyhow!("poisoned pool"))?
            .pop();
        let mut conn = match taken {
            Some(c) => c,
            None => Conn::open(self.addr, self.timeout)?,
        };
        let r = f(&mut conn)?;
        self.pool
            .lock()
            .map_err(|_| anyhow!("poisoned pool"))?
            .push(conn);
        Ok(r)
    }

    fn final_stats(&self) -> &Result<Vec<(String, String)>, String> {
        self.stats.get_or_init(|| {
            let stream =
                crate::net::connect(self.addr, self.timeout).map_err(|e| format!("{e:#}"))?;
            crate::net::read_stats(&stream).map_err(|e| format!("{e:#}"))
        })
    }
}

/// A stat's value as JSON: an integer or a float where it parses as one, else a string.
fn stat_value(v: &str) -> Value {
    if let Ok(n) = v.parse::<u64>() {
        Value::from(n)
    } else if let Ok(n) = v.parse::<i64>() {
        Value::from(n)
    } else if let Some(n) = v.parse::<f64>().ok().and_then(Number::from_f64) {
        Value::Number(n)
    } else {
        Value::String(v.to_string())
    }
}

/// Wrong values described in the JSON (`first_wrong`).
const WRONG_NOTED: usize = 8;

impl Memcached {
    /// Describes a wrong value of key `id` (expected `len` bytes): its length, and whether
    /// it starts with the key's tag.
    fn note_wrong(&self, key: &[u8], id: u64, len: usize, got: &[u8]) {
        let Ok(mut noted) = self.wrong.lock() else {
            return;
        };
        if noted.len() >= WRONG_NOTED {
            return;
        }
        let n = len.min(8);
        let mut tag = vec![0u8; n];
        crate::workload::fill_value(&mut tag, id, n);
        let tag_ok = got.starts_with(&tag);
        noted.push(format!(
            "{}: {} bytes back, {len} expected; first bytes {} the key's tag ({:02x?})",
            String::from_utf8_lossy(key),
            got.len(),
            if tag_ok { "match" } else { "do not match" },
            &got[..got.len().min(8)],
        ));
    }
}

impl Engine for Memcached {
    fn get(&self, key: &[u8], id: u64, len: usize) -> Result<Got> {
        debug_assert!(key.iter().all(|b| b.is_ascii_graphic()));
        self.with_conn(|c| {
            c.request.clear();
            c.request.extend_from_slice(b"mg ");
            c.request.extend_from_slice(key);
            c.request.extend_from_slice(b" v\r\n");
            c.send()?;
            let got = c.replies.meta_get(&mut c.value).with_context(|| {
                format!(
                    "reading {}'s reply to the get of {}",
                    self.server,
                    String::from_utf8_lossy(key)
                )
            })?;
            Ok(match got {
                reply::Got::Miss => Got::Miss,
                reply::Got::Hit => {
                    let verdict = check(&c.value, id, len);
                    if verdict == Got::Wrong {
                        self.note_wrong(key, id, len, &c.value);
                    }
                    verdict
                }
            })
        })
    }

    fn set(&self, key: &[u8], value: &[u8]) -> Result<()> {
        let stored = self.with_conn(|c| {
            c.request.clear();
            c.request.extend_from_slice(b"ms ");
            c.request.extend_from_slice(key);
            c.request.push(b' ');
            c.request
                .extend_from_slice(value.len().to_string().as_bytes());
            c.request.extend_from_slice(b" T0\r\n");
            c.request.extend_from_slice(value);
            c.request.extend_from_slice(b"\r\n");
            c.send()?;
            c.replies.meta_set().with_context(|| {
                format!(
                    "reading {}'s reply to the set of {}",
                    self.server,
                    String::from_utf8_lossy(key)
                )
            })
        })?;
        if let Stored::Refused(line) = stored {
            self.refused.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut first) = self.first_refusal.lock() {
                first.get_or_insert(line);
            }
        }
        Ok(())
    }

    fn items(&self) -> Option<u64> {
        let stats = self.final_stats().as_ref().ok()?;
        stats
            .iter()
            .find(|(k, _)| k == "curr_items")
            .and_then(|(_, v)| v.parse().ok())
    }

    fn metadata_bytes_per_item(&self) -> Option<f64> {
        None
    }

    fn extra(&self) -> Value {
        let stats = match self.final_stats() {
            Ok(s) => Value::Object(
                s.iter()
                    .map(|(k, v)| (k.clone(), stat_value(v)))
                    .collect::<Map<String, Value>>(),
            ),
            Err(e) => json!({ "error": e }),
        };
        json!({
            "server": self.server,
            "connections": self.pool.lock().map(|p| p.len()).ok(),
            "sets_refused": self.refused.load(Ordering::Relaxed),
            "first_refusal": self.first_refusal.lock().ok().and_then(|f| f.clone()),
            "first_wrong": self.wrong.lock().map(|w| w.clone()).unwrap_or_default(),
            "stats": stats,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload;

    #[test]
    fn stat_values_parse_where_they_can() {
        assert_eq!(stat_value("42"), json!(42));
        assert_eq!(stat_value("-3"), json!(-3));
        assert_eq!(stat_value("0.25"), json!(0.25));
        assert_eq!(stat_value("1.6.18"), json!("1.6.18"));
        assert_eq!(stat_value(""), json!(""));
    }

    #[test]
    fn workload_keys_are_valid_memcached_keys() {
        let mut key = [0u8; workload::KEY_LEN];
        for id in [0, 1, 999_999_999_999_999, u64::MAX] {
            workload::key(id, &mut key);
            assert!(key.iter().all(|b| b.is_ascii_graphic()), "{key:?}");
            assert!(key.len() <= 250);
        }
    }
}

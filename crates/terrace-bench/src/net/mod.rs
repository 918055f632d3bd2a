//! Server-level benchmark clients: `net-fill`, `net-probe` and `net-stats` speak
//! memcached's meta and text protocols over TCP to any memcached-compatible server
//! (`terrace serve`, memcached). `bench/restart-at-scale.sh` uses them to fill a server,
//! stop it, restart it and measure what comes back.
//!
//! - `net-fill` stores items `0..N` (keys and values from [`scheme`]) as pipelined quiet
//!   meta sets (`ms <key> <len> q`), each batch ended by `mn` so the replies say when the
//!   server has handled it; ids are split into contiguous ranges, one per connection.
//!   With `--touch`, each batch also reads its items back once (`mg <key>`), so a cache
//!   that keeps only items with a hit (Terrace's tier 0 demotes those, drops the rest)
//!   keeps them when they leave its first tier.
//! - `net-probe` times, from `--since` (the restart's exec) or its own start, the first
//!   accepted TCP connection and the first hit, then reads back all N items (or an evenly
//!   spaced sample) with pipelined `mg <key> v` and counts hits, misses and wrong values
//!   (`wrong` also counts any wrong value seen while looking for the first hit).
//! - `net-stats` prints the server's `stats`, optionally once they have stopped changing.
//!
//! Invariants: every connection has read and write timeouts, so a silent server fails a
//! run instead of hanging it; every reply is parsed by [`reply`] and anything unexpected
//! is an error naming the reply; a wrong value (a hit whose bytes are not the fill's for
//! that id) is never folded into hits or misses, and makes `net-probe` fail.
//!
//! Each connection uses two threads: one writes requests, one reads replies. Reading
//! while writing is what lets a pipeline of any length run without both sides blocking
//! on full socket buffers; on an error either side shuts the socket down so the other
//! returns at once.

pub mod reply;
pub mod scheme;

use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Map, Value};

use crate::args::parse_count;
use reply::{Got, Replies, SyncReply};

/// What a `net-*` command reports: its numbers, and why the run failed if it did (the
/// numbers are printed either way).
pub struct Outcome {
    pub report: Value,
    pub failure: Option<String>,
}

#[derive(clap::Args, Debug)]
pub struct FillArgs {
    /// Server address, HOST:PORT.
    #[arg(long)]
    addr: String,
    /// Items to store: ids 0..N (suffixes k, m).
    #[arg(long, value_parser = parse_count)]
    items: u64,
    /// Bytes per value.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=(1 << 20)))]
    value_size: u32,
    /// Connections, each on its own threads, each storing a contiguous range of ids.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=256))]
    connections: u16,
    /// Sets per pipelined batch (each batch ends with `mn`).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: u32,
    /// Read each batch's items once right after storing them (`mg <key>`, no value), so
    /// each has one hit.
    #[arg(long)]
    touch: bool,
    /// Seconds a connect, write or reply may take before the run fails.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout_secs: u64,
    /// Print only one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct ProbeArgs {
    /// Server address, HOST:PORT.
    #[arg(long)]
    addr: String,
    /// Items the fill stored: ids 0..N (suffixes k, m).
    #[arg(long, value_parser = parse_count)]
    items: u64,
    /// Check only this many ids, evenly spaced over 0..N (default: all N).
    #[arg(long, value_parser = parse_count)]
    sample: Option<u64>,
    /// Bytes per value, as the fill wrote them.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=(1 << 20)))]
    value_size: u32,
    /// Give up if no connection is accepted this many seconds after the time origin.
    #[arg(long, default_value_t = 120.0, value_parser = parse_secs)]
    wait_secs: f64,
    /// Give up looking for a first hit this many seconds after connecting (a server that
    /// came back empty has none); the check runs either way.
    #[arg(long, default_value_t = 10.0, value_parser = parse_secs)]
    hit_wait_secs: f64,
    /// Time origin, as seconds since the Unix epoch (`date +%s.%N` just before the
    /// server's exec); default: when this command starts.
    #[arg(long, value_parser = parse_secs)]
    since: Option<f64>,
    /// Connections for the check, each reading a contiguous share of the ids.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    connections: u16,
    /// Gets per pipelined batch.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: u32,
    /// Seconds a write or reply may take before the run fails.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout_secs: u64,
    /// Print only one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    /// Server address, HOST:PORT.
    #[arg(long)]
    addr: String,
    /// Poll `stats` until the item and tier counters are the same twice in a row
    /// (the server is idle: no sets, no moves between tiers), for at most this long.
    #[arg(long, value_parser = parse_secs)]
    settle_secs: Option<f64>,
    /// Milliseconds between two polls when settling.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    settle_interval_ms: u64,
    /// Seconds a connect or reply may take before the run fails.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout_secs: u64,
    /// Print only one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// A number of seconds: finite, non-negative.
fn parse_secs(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("{s:?}: expected a non-negative number of seconds")),
    }
}

pub(crate) fn resolve(addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .with_context(|| format!("bad address {addr:?} (expected HOST:PORT)"))?
        .next()
        .ok_or_else(|| anyhow!("address {addr:?} resolves to nothing"))
}

/// A connected socket with the run's timeouts on both directions.
pub(crate) fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&addr, timeout)
        .with_context(|| format!("cannot connect to {addr}"))?;
    prepare(&stream, timeout)?;
    Ok(stream)
}

fn prepare(stream: &TcpStream, timeout: Duration) -> Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    Ok(())
}

/// The share of `0..n` that connection `c` of `conns` handles: contiguous, sizes
/// differing by at most one, together covering `0..n` exactly once.
fn share(n: u64, conns: u64, c: u64) -> Range<u64> {
    let base = n / conns;
    let extra = n % conns;
    let start = c * base + c.min(extra);
    start..start + base + u64::from(c < extra)
}

/// Runs `write` (on this thread) and `read` (on another) over one socket; whichever
/// fails first shuts the socket down so the other returns. The reader's result wins
/// when both fail: it holds the server's reply, the writer only sees the broken pipe.
fn duplex<T: Send>(
    stream: &TcpStream,
    write: impl FnOnce(&TcpStream) -> Result<()>,
    read: impl FnOnce(Replies<TcpStream>) -> Result<T> + Send,
) -> Result<T> {
    let reader = stream.try_clone().context("cannot clone a socket")?;
    std::thread::scope(|s| {
        let handle = s.spawn(move || {
            let shut = reader.try_clone();
            let r = read(Replies::new(reader));
            if r.is_err() {
                if let Ok(sock) = shut {
                    let _ = sock.shutdown(Shutdown::Both);
                }
            }
            r
        });
        let w = write(stream);
        if w.is_err() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        let r = handle
            .join()
            .unwrap_or_else(|_| Err(anyhow!("a reader thread panicked")));
        match (w, r) {
            (_, Err(e)) => Err(e),
            (Err(e), Ok(_)) => Err(e),
            (Ok(()), Ok(t)) => Ok(t),
        }
    })
}

/// Runs `f` for each connection's share of `0..n` on its own thread and collects the
/// results in connection order.
fn per_connection<T: Send>(
    n: u64,
    conns: u16,
    f: impl Fn(Range<u64>) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    let conns = u64::from(conns);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..conns)
            .map(|c| {
                let f = &f;
                s.spawn(move || f(share(n, conns, c)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("a connection thread panicked")))
            })
            .collect()
    })
}

/// One connection's fill: requests that failed (sets, or with `--touch` also their gets),
/// the first failure's reply, and the touches that found their item.
struct FillPart {
    failed: u64,
    first_failure: Option<String>,
    touched: u64,
}

fn fill_range(addr: SocketAddr, ids: Range<u64>, a: &FillArgs) -> Result<FillPart> {
    let timeout = Duration::from_secs(a.timeout_secs);
    let stream = connect(addr, timeout)?;
    let batch = u64::from(a.batch);
    let batches = (ids.end - ids.start).div_ceil(batch);
    let len = a.value_size as usize;
    let write = |mut w: &TcpStream| -> Result<()> {
        let mut value = vec![0u8; len];
        let header = len.to_string();
        let mut buf = Vec::with_capacity(a.batch as usize * (len + 40) + 8);
        let mut id = ids.start;
        while id < ids.end {
            buf.clear();
            let end = ids.end.min(id + batch);
            for i in id..end {
                buf.extend_from_slice(b"ms ");
                scheme::push_key(&mut buf, i);
                buf.push(b' ');
                buf.extend_from_slice(header.as_bytes());
                buf.extend_from_slice(b" q\r\n");
                scheme::fill_value(&mut value, i);
                buf.extend_from_slice(&value);
                buf.extend_from_slice(b"\r\n");
            }
            if a.touch {
                for i in id..end {
                    buf.extend_from_slice(b"mg ");
                    scheme::push_key(&mut buf, i);
                    buf.extend_from_slice(b"\r\n");
                }
            }
            buf.extend_from_slice(b"mn\r\n");
            w.write_all(&buf).context("sending sets")?;
            id = end;
        }
        Ok(())
    };
    let read = |mut r: Replies<TcpStream>| -> Result<FillPart> {
        let mut part = FillPart {
            failed: 0,
            first_failure: None,
            touched: 0,
        };
        let mut synced = 0;
        while synced < batches {
            match r.sync().context("reading the replies to sets")? {
                SyncReply::Synced => synced += 1,
                SyncReply::Found if a.touch => part.touched += 1,
                SyncReply::NotFound if a.touch => {}
                SyncReply::Found | SyncReply::NotFound => {
                    bail!("the server answered a get this fill did not send")
                }
                SyncReply::Failed(line) => {
                    part.failed += 1;
                    part.first_failure.get_or_insert(line);
                }
            }
        }
        Ok(part)
    };
    duplex(&stream, write, read)
}

/// `net-fill`: stores items `0..N`; fails if any set failed.
pub fn fill(a: &FillArgs) -> Result<Outcome> {
    let addr = resolve(&a.addr)?;
    if u64::from(a.connections) > a.items {
        bail!(
            "--connections {} is more than --items {}",
            a.connections,
            a.items
        );
    }
    let start = Instant::now();
    let parts = per_connection(a.items, a.connections, |ids| fill_range(addr, ids, a))?;
    let seconds = start.elapsed().as_secs_f64();
    let failed: u64 = parts.iter().map(|p| p.failed).sum();
    let first_failure = parts.iter().find_map(|p| p.first_failure.clone());
    let touched: u64 = parts.iter().map(|p| p.touched).sum();
    let report = json!({
        "addr": a.addr,
        "items": a.items,
        "stored": a.items.saturating_sub(failed),
        "failed": failed,
        "first_failure": first_failure,
        "touched": a.touch.then_some(touched),
        "value_size": a.value_size,
        "connections": a.connections,
        "seconds": seconds,
        "items_per_sec": a.items as f64 / seconds.max(1e-9),
    });
    let failure = (failed > 0).then(|| {
        format!(
            "{failed} requests failed (of {} sets); the first answer was {:?}",
            a.items,
            first_failure.unwrap_or_default()
        )
    });
    Ok(Outcome { report, failure })
}

/// The id checked at position `i` of a sample of `s` ids evenly spaced over `0..n`.
fn sample_id(i: u64, s: u64, n: u64) -> u64 {
    if s >= n {
        i
    } else {
        // i < s <= n, so the product fits in u128 and the result is below n.
        ((u128::from(i) * u128::from(n)) / u128::from(s)) as u64
    }
}

/// Counts of one check.
#[derive(Default)]
struct Checked {
    hits: u64,
    misses: u64,
    wrong: u64,
    /// The first wrong value: its id and (the start of) the bytes read.
    first_wrong: Option<(u64, String)>,
}

impl Checked {
    fn add(&mut self, other: Checked) {
        self.hits += other.hits;
        self.misses += other.misses;
        self.wrong += other.wrong;
        if self.first_wrong.is_none() {
            self.first_wrong = other.first_wrong;
        }
    }

    /// Counts one `mg` answer for item `id`; `expected` is a scratch buffer of the
    /// value's length.
    fn count(&mut self, got: Got, id: u64, value: &[u8], expected: &mut [u8]) {
        match got {
            Got::Miss => self.misses += 1,
            Got::Hit => {
                scheme::fill_value(expected, id);
                if value == &expected[..] {
                    self.hits += 1;
                } else {
                    self.wrong += 1;
                    self.first_wrong.get_or_insert_with(|| {
                        let shown = String::from_utf8_lossy(&value[..value.len().min(64)]);
                        (id, format!("{} bytes: {shown:?}", value.len()))
                    });
                }
            }
        }
    }
}

/// Reads the items at sample positions `positions` on one new connection.
fn check_range(
    addr: SocketAddr,
    positions: Range<u64>,
    sample: u64,
    a: &ProbeArgs,
) -> Result<Checked> {
    let timeout = Duration::from_secs(a.timeout_secs);
    let stream = connect(addr, timeout)?;
    let len = a.value_size as usize;
    let batch = u64::from(a.batch);
    let write = |mut w: &TcpStream| -> Result<()> {
        let mut buf = Vec::with_capacity(a.batch as usize * 32);
        let mut p = positions.start;
        while p < positions.end {
            buf.clear();
            let end = positions.end.min(p + batch);
            for i in p..end {
                buf.extend_from_slice(b"mg ");
                scheme::push_key(&mut buf, sample_id(i, sample, a.items));
                buf.extend_from_slice(b" v\r\n");
            }
            w.write_all(&buf).context("sending gets")?;
            p = end;
        }
        Ok(())
    };
    let read = |mut r: Replies<TcpStream>| -> Result<Checked> {
        let mut c = Checked::default();
        let mut value = Vec::with_capacity(len + 2);
        let mut expected = vec![0u8; len];
        for i in positions.clone() {
            let id = sample_id(i, sample, a.items);
            let got = r
                .meta_get(&mut value)
                .with_context(|| format!("reading the reply to the get of key:{id}"))?;
            c.count(got, id, &value, &mut expected);
        }
        Ok(c)
    };
    duplex(&stream, write, read)
}

/// Elapsed time from the probe's origin.
struct Clock {
    origin: Instant,
}

impl Clock {
    fn new(since: Option<f64>) -> Result<Clock> {
        let now = Instant::now();
        let Some(since) = since else {
            return Ok(Clock { origin: now });
        };
        let epoch_now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .context("the system clock is before 1970")?
            .as_secs_f64();
        let ago = epoch_now - since;
        if ago < 0.0 {
            bail!("--since {since} is in the future (now is {epoch_now:.3})");
        }
        let origin = now
            .checked_sub(Duration::from_secs_f64(ago))
            .ok_or_else(|| anyhow!("--since {since} is too far in the past"))?;
        Ok(Clock { origin })
    }

    fn secs(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }
}

/// Polls until a connection is accepted, every millisecond, until `deadline` seconds
/// after the origin.
fn first_connection(addr: SocketAddr, clock: &Clock, deadline: f64) -> Result<TcpStream> {
    let mut last_error = None;
    while clock.secs() < deadline {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(100)) {
            Ok(s) => return Ok(s),
            Err(e) => last_error = Some(e),
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    Err(anyhow!(
        "no connection to {addr} within {deadline} s of the origin (last error: {})",
        last_error.map_or_else(|| "none".to_string(), |e| e.to_string())
    ))
}

/// Ids asked for in each round of the first-hit search: spread over `0..n`, shifted by
/// one each round so a few lost items cannot hide the rest.
const HIT_PROBES: u64 = 16;

/// Asks for a few filled items, again and again (every millisecond), until one is a hit
/// with the right value; `None` if none is by `deadline` seconds after the origin.
/// Wrong values seen on the way are counted in `wrong`.
fn first_hit(
    stream: &TcpStream,
    a: &ProbeArgs,
    clock: &Clock,
    deadline: f64,
    wrong: &mut Checked,
) -> Result<Option<f64>> {
    let mut replies = Replies::new(stream.try_clone()?);
    let mut w = stream;
    let mut value = Vec::new();
    let mut expected = vec![0u8; a.value_size as usize];
    let probes = HIT_PROBES.min(a.items);
    let mut buf = Vec::new();
    let mut round = 0u64;
    loop {
        buf.clear();
        let ids: Vec<u64> = (0..probes)
            .map(|i| (sample_id(i, probes, a.items) + round) % a.items)
            .collect();
        for &id in &ids {
            buf.extend_from_slice(b"mg ");
            scheme::push_key(&mut buf, id);
            buf.extend_from_slice(b" v\r\n");
        }
        w.write_all(&buf).context("sending gets")?;
        let mut hit = false;
        for &id in &ids {
            let got = replies
                .meta_get(&mut value)
                .with_context(|| format!("reading the reply to the get of key:{id}"))?;
            let mut c = Checked::default();
            c.count(got, id, &value, &mut expected);
            hit |= c.hits > 0;
            c.hits = 0;
            c.misses = 0;
            wrong.add(c);
        }
        if hit {
            return Ok(Some(clock.secs()));
        }
        if clock.secs() >= deadline {
            return Ok(None);
        }
        round += 1;
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(crate) fn read_stats(stream: &TcpStream) -> Result<Vec<(String, String)>> {
    let mut w = stream;
    w.write_all(b"stats\r\n").context("sending stats")?;
    Replies::new(stream.try_clone()?)
        .stats()
        .context("reading the reply to stats")
}

fn stat_u64(stats: &[(String, String)], name: &str) -> Option<u64> {
    stats
        .iter()
        .find(|(k, _)| k == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// `net-probe`: times the first connection and the first hit, then checks the items;
/// fails if any value read was wrong.
pub fn probe(a: &ProbeArgs) -> Result<Outcome> {
    let clock = Clock::new(a.since)?;
    let addr = resolve(&a.addr)?;
    let timeout = Duration::from_secs(a.timeout_secs);
    let stream = first_connection(addr, &clock, a.wait_secs)?;
    let connect_seconds = clock.secs();
    prepare(&stream, timeout)?;
    let mut checked = Checked::default();
    let first_hit_seconds = first_hit(
        &stream,
        a,
        &clock,
        connect_seconds + a.hit_wait_secs,
        &mut checked,
    )?;
    let sample = a.sample.unwrap_or(a.items).min(a.items);
    let conns = u16::try_from(u64::from(a.connections).min(sample)).unwrap_or(1);
    let check_start = Instant::now();
    for part in per_connection(sample, conns, |p| check_range(addr, p, sample, a))? {
        checked.add(part);
    }
    let check_seconds = check_start.elapsed().as_secs_f64();
    let stats = read_stats(&stream)?;
    let report = json!({
        "addr": a.addr,
        "items": a.items,
        "connect_seconds": connect_seconds,
        "first_hit_seconds": first_hit_seconds,
        "checked": sample,
        "hits": checked.hits,
        "misses": checked.misses,
        "wrong": checked.wrong,
        "first_wrong": checked.first_wrong.as_ref().map(|(id, v)| format!("key:{id}: {v}")),
        "check_seconds": check_seconds,
        "curr_items": stat_u64(&stats, "curr_items"),
        // What a Terrace server says about its own restart (absent elsewhere).
        "restart_stats": stats
            .iter()
            .filter(|(k, _)| k.starts_with("terrace_restart_"))
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<Map<String, Value>>(),
    });
    let failure = (checked.wrong > 0).then(|| {
        format!(
            "{} values read back were not the ones stored (first: {})",
            checked.wrong,
            report["first_wrong"].as_str().unwrap_or("?")
        )
    });
    Ok(Outcome { report, failure })
}

/// Whether a counter takes part in deciding that the server is idle: item counts and
/// the tiers' segment and movement counters, not hit counters (which reads move).
fn settles(name: &str) -> bool {
    matches!(name, "curr_items" | "total_items" | "bytes" | "evictions")
        || ((name.starts_with("tier_") || name.starts_with("terrace_")) && !name.ends_with("_hits"))
}

/// `net-stats`: the server's stats, after they settle if asked.
pub fn stats(a: &StatsArgs) -> Result<Outcome> {
    let addr = resolve(&a.addr)?;
    let stream = connect(addr, Duration::from_secs(a.timeout_secs))?;
    let start = Instant::now();
    let mut stats = read_stats(&stream)?;
    let mut settled = None;
    if let Some(limit) = a.settle_secs {
        let watched = |s: &[(String, String)]| -> Vec<(String, String)> {
            s.iter().filter(|(k, _)| settles(k)).cloned().collect()
        };
        let interval = Duration::from_millis(a.settle_interval_ms);
        settled = Some(false);
        while start.elapsed().as_secs_f64() < limit {
            std::thread::sleep(interval);
            let next = read_stats(&stream)?;
            let same = watched(&next) == watched(&stats);
            stats = next;
            if same {
                settled = Some(true);
                break;
            }
        }
    }
    let map: Map<String, Value> = stats
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    let report = json!({
        "addr": a.addr,
        "curr_items": stat_u64(&stats, "curr_items"),
        "settled": settled,
        "settle_seconds": settled.map(|_| start.elapsed().as_secs_f64()),
        "stats": map,
    });
    if settled == Some(false) {
        eprintln!(
            "terrace-bench: the stats of {} still changed after {} s",
            a.addr,
            a.settle_secs.unwrap_or_default()
        );
    }
    Ok(Outcome {
        report,
        failure: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_everything_once() {
        for (n, conns) in [(10u64, 3u64), (3, 3), (1_000_001, 7), (5, 1)] {
            let mut next = 0;
            for c in 0..conns {
                let r = share(n, conns, c);
                assert_eq!(r.start, next);
                assert!(r.end - r.start >= n / conns && r.end - r.start <= n / conns + 1);
                next = r.end;
            }
            assert_eq!(next, n);
        }
    }

    #[test]
    fn samples_are_spread_and_in_range() {
        assert_eq!(
            (0..4).map(|i| sample_id(i, 4, 100)).collect::<Vec<_>>(),
            [0, 25, 50, 75]
        );
        assert_eq!(
            (0..5).map(|i| sample_id(i, 5, 5)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
        let n = u64::MAX;
        assert!(sample_id(999, 1000, n) < n);
    }

    #[test]
    fn wrong_values_are_counted_apart() {
        let mut c = Checked::default();
        let mut expected = vec![0u8; 8];
        let mut good = vec![0u8; 8];
        scheme::fill_value(&mut good, 3);
        c.count(Got::Hit, 3, &good, &mut expected);
        c.count(Got::Hit, 4, &good, &mut expected);
        c.count(Got::Hit, 3, &good[..7], &mut expected);
        c.count(Got::Miss, 5, &[], &mut expected);
        assert_eq!((c.hits, c.misses, c.wrong), (1, 1, 2));
        assert_eq!(c.first_wrong.map(|(id, _)| id), Some(4));
    }

    #[test]
    fn settling_ignores_hit_counters() {
        assert!(settles("curr_items"));
        assert!(settles("tier_1_items"));
        assert!(settles("terrace_demotions"));
        assert!(!settles("tier_0_hits"));
        assert!(!settles("get_hits"));
        assert!(!settles("uptime"));
    }
}

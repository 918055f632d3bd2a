//! `terrace serve` across restarts, through the wire only:
//! - clean (SIGTERM) restart with `--tiers dram:8MiB,file:64MiB`: ~20 MiB of distinct keys
//!   (read back once, so the movers demote them to the file tier), some overwritten and
//!   some deleted; the server exits 0 and the next start with the same flags is warm (the
//!   saved index is used). Every key then reads as its last value or misses — never an
//!   older value, never a deleted key's — and at least every item the file tier held at
//!   shutdown is a hit: a clean shutdown keeps every item of the durable tiers, so hits
//!   ≥ (items demoted into tier 1) − (items evicted from it) − (index evictions) − (one
//!   per overwrite or delete issued, each of which kills at most one tier-1 item) — and
//!   with the DRAM tier's snapshot, every item there before (curr_items) is there after;
//! - SIGKILL restart, 5 rounds on the same data directory: writers do sets, overwrites,
//!   deletes and gets on a small key space for a random 0.3–1.5 s, remembering the last
//!   acknowledged value per key (a write in flight at the kill may or may not land); after
//!   the restart no key returns a value older than its last acknowledged one, nor a
//!   deleted key's value, nor a value that is not exactly one that was written.

mod common;

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{show, stat_u64, versioned_value, Conn};

const CLEAN_TIERS: &str = "dram:8MiB,file:64MiB";
/// 1 MiB segments, so that the 8 MiB DRAM tier has the 8 a tier needs.
const CLEAN_MAX_ITEM: &str = "512KiB";

/// The clean-restart tests' server arguments, data in `data`.
fn clean_args(data: &str) -> [&str; 6] {
    [
        "--tiers",
        CLEAN_TIERS,
        "--max-item-size",
        CLEAN_MAX_ITEM,
        "--dir",
        data,
    ]
}

/// What `stats` says the server's start found: segments taken from a clean shutdown's
/// saved index, and items indexed; the restart items must be what the cache holds before
/// anything is written.
fn restart_stats(c: &mut Conn) -> (u64, u64) {
    let stats = c.stats();
    let items = stat_u64(&stats, "terrace_restart_items");
    assert_eq!(items, stat_u64(&stats, "curr_items"), "{stats:?}");
    (stat_u64(&stats, "terrace_restart_saved_segments"), items)
}

/// Sets `keys` (pipelined) to their versions in `model`, then reads them back once (a hit
/// marks them for demotion instead of eviction).
fn write_and_touch(c: &mut Conn, keys: &[String], model: &HashMap<String, u64>, len: usize) {
    let mut req = Vec::new();
    for key in keys {
        let v = versioned_value(key, model[key], len);
        req.extend_from_slice(format!("set {key} 0 0 {}\r\n", v.len()).as_bytes());
        req.extend_from_slice(&v);
        req.extend_from_slice(b"\r\n");
    }
    c.send(&req);
    for key in keys {
        assert_eq!(c.line(), "STORED", "set {key}");
    }
    let hits = c.get_multi(keys);
    for key in keys {
        let v = hits
            .get(key)
            .unwrap_or_else(|| panic!("{key} missed right after its set"));
        assert!(
            *v == versioned_value(key, model[key], len),
            "{key} read back {}",
            show(v)
        );
    }
}

#[test]
fn clean_restart_is_warm_and_never_stale() {
    const KEYS: usize = 5000;
    const FILLER: usize = 1000;
    const LEN: usize = 4000;
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("data").display().to_string();
    let args = clean_args(&data);
    let mut server = common::start(dir.path(), &args);
    let mut c = server.connect();

    // key -> last version written; absent from `model` once deleted.
    let mut model: HashMap<String, u64> = HashMap::new();
    let mut deleted: HashSet<String> = HashSet::new();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("warm:{i}")).collect();
    for k in &keys {
        model.insert(k.clone(), 1);
    }
    for batch in keys.chunks(50) {
        write_and_touch(&mut c, batch, &model, LEN);
    }
    // Overwrite every 7th key (read back too, so some new versions reach the file tier),
    // delete every 11th.
    let mut mutations = 0u64;
    let overwrite: Vec<String> = keys.iter().step_by(7).cloned().collect();
    for k in &overwrite {
        model.insert(k.clone(), 2);
    }
    for batch in overwrite.chunks(50) {
        write_and_touch(&mut c, batch, &model, LEN);
        mutations += batch.len() as u64;
    }
    for k in keys.iter().step_by(11) {
        let r = c.cmd(&format!("delete {k}"));
        assert!(r == "DELETED" || r == "NOT_FOUND", "delete {k}: {r}");
        model.remove(k);
        deleted.insert(k.clone());
        mutations += 1;
    }
    // More distinct keys push the overwritten versions out of DRAM.
    let filler: Vec<String> = (0..FILLER).map(|i| format!("fill:{i}")).collect();
    for k in &filler {
        model.insert(k.clone(), 1);
    }
    for batch in filler.chunks(50) {
        write_and_touch(&mut c, batch, &model, LEN);
    }
    // Let the movers finish their round, then read what the file tier holds.
    std::thread::sleep(Duration::from_millis(200));
    let stats = c.stats();
    let demoted = stat_u64(&stats, "tier_1_demotions_in");
    let evicted = stat_u64(&stats, "tier_1_evicted_items");
    let index_evictions = stat_u64(&stats, "terrace_index_evictions");
    let items_before = stat_u64(&stats, "curr_items");
    let lower_bound = demoted.saturating_sub(evicted + index_evictions + mutations);
    eprintln!(
        "before SIGTERM: curr_items {items_before}, tier 1: {demoted} demoted in, {evicted} evicted; \
         index evictions {index_evictions}, overwrites+deletes {mutations}: at least {lower_bound} must survive"
    );
    let total = KEYS + FILLER;
    assert!(
        lower_bound as usize >= total / 2,
        "the test meant most of its {total} keys to reach the file tier, but only {demoted} were demoted \
         (the bound {lower_bound} would prove little)"
    );
    drop(c);

    let status = server.terminate();
    assert!(
        status.success(),
        "SIGTERM must end in a clean exit, got {status:?}\n{}",
        server.log_text()
    );
    assert!(
        server.log_text().contains("index saved"),
        "no clean shutdown logged\n{}",
        server.log_text()
    );
    drop(server);

    let mut server = common::start(dir.path(), &args);
    let log = std::fs::read_to_string(&server.log).expect("reading the server log");
    let mut c = server.connect();
    let (warm, _) = restart_stats(&mut c);
    assert!(
        warm > 0,
        "the restart after a clean shutdown must use the saved index, got {warm} segments\n{log}"
    );
    let items_after = stat_u64(&c.stats(), "curr_items");

    let mut hits = 0u64;
    let mut problems = Vec::new();
    let all: Vec<String> = keys.iter().chain(&filler).cloned().collect();
    for batch in all.chunks(100) {
        let got = c.get_multi(batch);
        for key in batch {
            let Some(v) = got.get(key) else { continue };
            hits += 1;
            match model.get(key) {
                None => problems.push(format!("{key} was deleted but returned {}", show(v))),
                Some(&ver) if *v != versioned_value(key, ver, LEN) => {
                    problems.push(format!("{key}: last version {ver}, got {}", show(v)))
                }
                Some(_) => {}
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} stale or wrong values after a clean restart:\n{}",
        problems.len(),
        problems.join("\n")
    );
    eprintln!(
        "after the restart: {hits} hits of {} keys, curr_items {items_after}",
        all.len()
    );
    assert!(
        hits >= lower_bound,
        "a clean restart lost file-tier items: {hits} hits, but at least {lower_bound} items were on the file tier at shutdown"
    );
    assert_eq!(
        hits, items_after,
        "every indexed item after the restart must be readable"
    );
    // The DRAM tier comes back from its snapshot: nothing was lost at all.
    assert_eq!(
        items_after, items_before,
        "a clean restart keeps every item, the DRAM tier's included"
    );
    assert!(deleted.iter().all(|k| !model.contains_key(k)));
    server.assert_alive("after the warm restart");

    // The saved index is good for one start only: overwrite and delete some of the
    // survivors, SIGKILL, and the next start (which must scan) returns none of the
    // values the saved index pointed at.
    let mut mutated = 0;
    for (i, k) in all.iter().enumerate().filter(|(i, _)| i % 5 == 0) {
        if i % 10 == 0 {
            model.insert(k.clone(), 3);
            write_and_touch(&mut c, std::slice::from_ref(k), &model, LEN);
        } else {
            let r = c.cmd(&format!("delete {k}"));
            assert!(r == "DELETED" || r == "NOT_FOUND", "delete {k}: {r}");
            model.remove(k);
        }
        mutated += 1;
    }
    drop(c);
    server.kill9();
    drop(server);
    let server = common::start(dir.path(), &args);
    let log = std::fs::read_to_string(&server.log).expect("reading the server log");
    let mut c = server.connect();
    assert_eq!(
        restart_stats(&mut c).0,
        0,
        "a start after SIGKILL must not use the saved index of an earlier clean stop\n{log}"
    );
    let mut problems = Vec::new();
    let mut hits = 0;
    for batch in all.chunks(100) {
        for (key, v) in c.get_multi(batch) {
            hits += 1;
            match model.get(&key) {
                None => problems.push(format!("{key} was deleted but returned {}", show(&v))),
                Some(&ver) if v != versioned_value(&key, ver, LEN) => {
                    problems.push(format!("{key}: last version {ver}, got {}", show(&v)))
                }
                Some(_) => {}
            }
        }
    }
    eprintln!("after {mutated} mutations, SIGKILL and a scanning restart: {hits} hits");
    assert!(
        problems.is_empty(),
        "{} stale values after warm start, mutations and SIGKILL:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn sigint_with_open_connections_is_a_clean_shutdown() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("data").display().to_string();
    let args = clean_args(&data);
    let mut server = common::start(dir.path(), &args);
    let mut c = server.connect();
    let mut model = HashMap::new();
    let keys: Vec<String> = (0..3000).map(|i| format!("int:{i}")).collect();
    for k in &keys {
        model.insert(k.clone(), 7);
    }
    for batch in keys.chunks(50) {
        write_and_touch(&mut c, batch, &model, 4000);
    }
    // Open at the signal: an idle connection, one in the middle of a value, one that
    // has not sent anything, and one with unread replies.
    let mut partial = server.connect();
    partial.send(b"set int:partial 0 0 1000\r\nonly part of it");
    let _silent = server.connect();
    let mut unread = server.connect();
    unread.send(format!("get{}\r\n", " int:1".repeat(1000)).as_bytes());
    std::thread::sleep(Duration::from_millis(200));
    let stopped = Instant::now();
    server.proc.signal(libc::SIGINT);
    let status = server
        .proc
        .wait_timeout(common::STOP_TIMEOUT)
        .unwrap_or_else(|| {
            panic!(
                "no exit within {:?} of SIGINT with open connections\n{}",
                common::STOP_TIMEOUT,
                server.log_text()
            )
        });
    eprintln!(
        "SIGINT with 4 open connections: exit {status:?} after {:?}",
        stopped.elapsed()
    );
    assert!(
        status.success(),
        "SIGINT must end in a clean exit, got {status:?}\n{}",
        server.log_text()
    );
    assert!(
        server.log_text().contains("index saved"),
        "no clean shutdown logged\n{}",
        server.log_text()
    );
    drop((c, partial, unread));
    drop(server);

    let server = common::start(dir.path(), &args);
    let log = std::fs::read_to_string(&server.log).expect("reading the server log");
    let mut c = server.connect();
    let (warm, _) = restart_stats(&mut c);
    assert!(
        warm > 0,
        "the restart after SIGINT must be warm, got {warm} saved segments\n{log}"
    );
    assert_eq!(
        c.get("int:partial"),
        None,
        "a value cut by the shutdown must not be stored"
    );
    let mut hits = 0;
    for batch in keys.chunks(100) {
        for (k, v) in c.get_multi(batch) {
            assert!(v == versioned_value(&k, 7, 4000), "{k}: {}", show(&v));
            hits += 1;
        }
    }
    eprintln!("after SIGINT and restart: {hits}/{} hits", keys.len());
    assert!(
        hits > keys.len() / 2,
        "only {hits} of {} keys survived a clean SIGINT shutdown",
        keys.len()
    );
}

/// What a writer knows of one key.
#[derive(Clone, Debug, Default)]
struct KeyState {
    /// Version of the last acknowledged write; `None`: absent (deleted, never written, or
    /// seen missing).
    acked: Option<u64>,
    /// Versions whose write was in flight at the kill (`None` in the set: a delete).
    in_flight: Vec<Option<u64>>,
}

fn kill_len(key: &str, version: u64) -> usize {
    let h = key.bytes().fold(version.wrapping_mul(31), |h, b| {
        h.wrapping_mul(131).wrapping_add(u64::from(b))
    });
    100 + (h % 16_000) as usize
}

/// What one writer did: the state of its keys, and how many operations it completed.
struct WriterEnd {
    state: HashMap<String, KeyState>,
    ops: usize,
}

/// One writer: sets, deletes and gets on its own keys until `stop` or a connection error
/// (the kill). Versions it writes start above `first_version`.
fn writer(
    port: u16,
    keys: Vec<String>,
    mut state: HashMap<String, KeyState>,
    first_version: u64,
    seed: u64,
    stop: Arc<AtomicBool>,
) -> WriterEnd {
    let mut rng = common::Rng::seeded(seed);
    let mut version = first_version;
    let mut ops = 0usize;
    let Ok(stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return WriterEnd { state, ops };
    };
    let mut c = Conn::from_tcp(stream);
    // A set is usually read back at once: the hit makes the movers demote the item to
    // the file tier instead of dropping it, so many keys' last values live there when
    // the server is killed.
    let mut reread: Option<String> = None;
    while !stop.load(Ordering::Relaxed) {
        let (key, roll) = match reread.take() {
            Some(k) => (k, 99),
            None => (
                keys[rng.range(0, keys.len() as u64) as usize].clone(),
                rng.range(0, 100),
            ),
        };
        let key = key.as_str();
        ops += 1;
        if roll < 60 {
            version += 1;
            let v = versioned_value(key, version, kill_len(key, version));
            let mut req = format!("set {key} 0 0 {}\r\n", v.len()).into_bytes();
            req.extend_from_slice(&v);
            req.extend_from_slice(b"\r\n");
            let s = state.get_mut(key).expect("own key");
            s.in_flight.push(Some(version));
            match c.try_send(&req).and_then(|_| c.try_line()) {
                Ok(r) if r == "STORED" => {
                    s.acked = Some(version);
                    s.in_flight.clear();
                }
                Ok(r) => panic!("set {key} answered {r:?} while the server ran"),
                Err(_) => break,
            }
            if rng.range(0, 100) < 70 {
                reread = Some(key.to_string());
            }
        } else if roll < 75 {
            let s = state.get_mut(key).expect("own key");
            s.in_flight.push(None);
            match c
                .try_send(format!("delete {key}\r\n").as_bytes())
                .and_then(|_| c.try_line())
            {
                Ok(r) if r == "DELETED" || r == "NOT_FOUND" => {
                    s.acked = None;
                    s.in_flight.clear();
                }
                Ok(r) => panic!("delete {key} answered {r:?} while the server ran"),
                Err(_) => break,
            }
        } else {
            let s = &state[key];
            let got = match c
                .try_send(format!("get {key}\r\n").as_bytes())
                .and_then(|_| c.try_read_items())
            {
                Ok(Ok(items)) => items,
                Ok(Err(line)) => panic!("get {key} answered {line:?} while the server ran"),
                Err(_) => break,
            };
            if let Some(item) = got.first() {
                // While the server runs, with one writer per key: exactly the last
                // acknowledged value, or a miss (evicted).
                let want = s.acked.map(|v| versioned_value(key, v, kill_len(key, v)));
                assert!(
                    want.as_deref() == Some(item.value.as_slice()),
                    "live get {key}: last acknowledged version {:?}, got {}",
                    s.acked,
                    show(&item.value)
                );
            }
        }
    }
    WriterEnd { state, ops }
}

#[test]
fn kill9_restarts_never_return_stale_values() {
    const ROUNDS: usize = 5;
    // About 8 MiB of live values over a 2 MiB DRAM tier: most keys live on the file tier.
    const KEYS: usize = 1000;
    const WRITERS: usize = 2;
    let dir = tempfile::tempdir().expect("temporary directory");
    let data = dir.path().join("data").display().to_string();
    // Small segments (128 KiB for 64 KiB items) so a second of traffic cycles DRAM many
    // times and demotes to the file tier.
    let args = [
        "--tiers",
        "dram:2MiB,file:16MiB",
        "--max-item-size",
        "64KiB",
        "--dir",
        data.as_str(),
    ];
    let mut rng = common::Rng::new("kill9");
    let keys: Vec<String> = (0..KEYS).map(|i| format!("k9:{i}")).collect();
    let mut state: HashMap<String, KeyState> = keys
        .iter()
        .map(|k| (k.clone(), KeyState::default()))
        .collect();
    // Versions never repeat across rounds: each writer takes a disjoint range per round.
    let mut next_version = 0u64;
    for round in 0..ROUNDS {
        let mut server = common::start(dir.path(), &args);
        let port = server.port();
        let stop = Arc::new(AtomicBool::new(false));
        let mut handles = Vec::new();
        for w in 0..WRITERS {
            let mine: Vec<String> = keys
                .iter()
                .enumerate()
                .filter(|(i, _)| i % WRITERS == w)
                .map(|(_, k)| k.clone())
                .collect();
            let my_state: HashMap<String, KeyState> =
                mine.iter().map(|k| (k.clone(), state[k].clone())).collect();
            let stop = Arc::clone(&stop);
            let start_version = next_version + (w as u64) * 1_000_000_000;
            let seed = rng.next_u64();
            handles.push(std::thread::spawn(move || {
                writer(port, mine, my_state, start_version, seed, stop)
            }));
        }
        next_version += WRITERS as u64 * 1_000_000_000;
        let run = Duration::from_millis(rng.range(300, 1500));
        std::thread::sleep(run);
        let killed_at = Instant::now();
        server.kill9();
        stop.store(true, Ordering::Relaxed);
        let mut ops = 0;
        for h in handles {
            let end = h.join().expect("a writer thread panicked");
            ops += end.ops;
            state.extend(end.state);
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(20),
            "writers took long to notice the kill"
        );
        let in_flight = state.values().filter(|s| !s.in_flight.is_empty()).count();
        drop(server);

        let server = common::start(dir.path(), &args);
        let mut c = server.connect();
        let mut hits = 0;
        let mut problems = Vec::new();
        for batch in keys.chunks(50) {
            let got = c.get_multi(batch);
            for key in batch {
                let s = state.get_mut(key).expect("every key has a state");
                let observed = match got.get(key) {
                    None => None,
                    Some(v) => {
                        hits += 1;
                        let ver = common::version_of(key, v);
                        let allowed: Vec<u64> = s
                            .acked
                            .iter()
                            .copied()
                            .chain(s.in_flight.iter().flatten().copied())
                            .collect();
                        match ver {
                            Some(ver)
                                if allowed.contains(&ver)
                                    && *v == versioned_value(key, ver, kill_len(key, ver)) => {}
                            _ => problems.push(format!(
                                "{key}: last acknowledged {:?}, in flight {:?}, got {}",
                                s.acked,
                                s.in_flight,
                                show(v)
                            )),
                        }
                        ver
                    }
                };
                // What a reader saw after the restart is the new truth.
                s.acked = observed;
                s.in_flight.clear();
            }
        }
        let log = std::fs::read_to_string(&server.log).unwrap_or_default();
        let recovery = log
            .lines()
            .find(|l| l.contains("cache opened"))
            .unwrap_or("")
            .to_string();
        eprintln!(
            "round {round}: killed after {run:?} and {ops} ops ({in_flight} writes in flight); after restart {hits}/{KEYS} hits; {}",
            recovery.find("RestartReport").map_or(recovery.as_str(), |at| &recovery[at..])
        );
        assert!(
            problems.is_empty(),
            "round {round}: {} stale, deleted or corrupt values after SIGKILL and restart:\n{}\n{}",
            problems.len(),
            problems.join("\n"),
            server.log_text()
        );
        drop(c);
        drop(server);
    }
    // The directory is still usable by a clean start and stop.
    let mut server = common::start(dir.path(), &args);
    server.assert_alive("after the SIGKILL rounds");
    let status = server.terminate();
    assert!(status.success(), "{status:?}\n{}", server.log_text());
    let _ = std::io::stderr().flush();
}

//! Replicated volumes, in one process over loopback: a primary `Volume` whose write log
//! streams to `ReplicaServer`s. What is checked: acknowledged writes are on the
//! secondaries' copies (a volume opened from a copy reads them back, with nothing written
//! back to the backend); a secondary that drops out leaves the volume degraded and
//! writable, and on return is resynced from its bitmap (bytes ≈ those written while it
//! was away), or compared by digest when it followed another primary (after a failover
//! the old primary and the other secondary get about what the new primary wrote since,
//! not the whole log; a lost copy gets every extent that is not zero); below
//! `min_replicas` writes are refused and reads go on, even while a written-back batch
//! waits to be released; a newer epoch fences the older primary; a copy left
//! mid-resync, or whose log is gone, is never taken over; garbage on the replication port
//! is refused.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use terrace_cache::{Cache, CacheConfig, TierConfig, TierSize};
use terrace_volume::replication::{AckLevel, Health, LinkState, ReplicaServer, ReplicationConfig};
use terrace_volume::{Backend, BlockError, Export, FileBackend, Mode, Volume, VolumeConfig};

const VOLUME: u64 = 16 << 20;
const LOG: u64 = 8 << 20;
const BS: usize = 4096;

fn cache() -> Arc<Cache> {
    let config = CacheConfig::new(vec![TierConfig::dram(TierSize::Bytes(16 << 20))]);
    Arc::new(Cache::open(config).unwrap().0)
}

fn backend(dir: &Path) -> Arc<dyn Backend> {
    let path = dir.join("backend.img");
    if !path.exists() {
        std::fs::File::create(&path)
            .unwrap()
            .set_len(VOLUME)
            .unwrap();
    }
    Arc::new(FileBackend::open(&path).unwrap())
}

/// A write-back volume that writes nothing back on its own (so what a copy holds is
/// all there is), replicated to `peers` when any.
fn config(log: PathBuf, replication: Option<ReplicationConfig>) -> VolumeConfig {
    VolumeConfig {
        mode: Mode::WriteBack,
        log_bytes: LOG,
        high_watermark: 1.0,
        low_watermark: 1.0,
        idle_writeback: Duration::from_secs(3600),
        replication,
        ..VolumeConfig::new("vol", 1, log)
    }
}

fn replicated(
    peers: &[&ReplicaServer],
    ack: AckLevel,
    min_replicas: usize,
    epoch: u64,
) -> ReplicationConfig {
    ReplicationConfig {
        ack,
        min_replicas,
        epoch,
        peer_timeout: Duration::from_secs(1),
        reconnect: Duration::from_millis(50),
        ..ReplicationConfig::new(peers.iter().map(|p| p.local_addr().to_string()).collect())
    }
}

/// A replicated volume whose log and backend are in `node`.
fn primary(node: &Path, replication: ReplicationConfig) -> Arc<Volume> {
    let log = node.join("vol.log");
    Volume::open(config(log, Some(replication)), backend(node), cache())
        .unwrap()
        .0
}

/// A loopback address nothing listens on (a peer that is down).
fn unused_addr() -> String {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().to_string()
}

/// A replica server started again at the address it had (first taken from port 0, so in
/// the ephemeral range): while it was down, a connection may have taken that port — a
/// primary's reconnect can even connect to itself there — until it is closed, so
/// binding is retried for a while.
fn restart_replica(addr: &str, dir: &Path) -> ReplicaServer {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ReplicaServer::start(addr, dir) {
            Ok(server) => return server,
            Err(e) if Instant::now() < deadline && e.to_string().contains("in use") => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("restarting the replica server at {addr}: {e}"),
        }
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn health(v: &Volume) -> Health {
    v.status().replication.unwrap().health
}

/// Writes `n` random blocks, each acknowledged; returns what each block now holds.
fn write_blocks(v: &Volume, rng: &mut common::Rng, n: usize, model: &mut [Option<Vec<u8>>]) {
    for _ in 0..n {
        let block = rng.below(VOLUME / BS as u64) as usize;
        let mut data = vec![0u8; BS];
        rng.fill(&mut data);
        v.write((block * BS) as u64, &data, false).unwrap();
        model[block] = Some(data);
    }
}

/// Opens a volume from the copy at `log` over `backend_dir`'s backend and checks that
/// every block reads as `model` says.
fn check_copy(log: PathBuf, backend_dir: &Path, model: &[Option<Vec<u8>>]) {
    let (v, report) = Volume::open(config(log, None), backend(backend_dir), cache()).unwrap();
    assert!(report.records > 0, "the copy holds the writes: {report:?}");
    let mut buf = vec![0u8; BS];
    for (block, want) in model.iter().enumerate() {
        if let Some(want) = want {
            v.read((block * BS) as u64, &mut buf).unwrap();
            assert!(buf == *want, "block {block} differs on the copy");
        }
    }
    v.close();
}

#[test]
fn acknowledged_writes_are_on_every_copy_with_nothing_written_back() {
    let nodes: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let r2 = ReplicaServer::start("127.0.0.1:0", nodes[2].path()).unwrap();
    let v = primary(
        nodes[0].path(),
        replicated(&[&r1, &r2], AckLevel::All, 2, 1),
    );
    wait_until("both copies in sync", || health(&v) == Health::Healthy);
    let mut model = vec![None; (VOLUME / BS as u64) as usize];
    let mut rng = common::Rng(0x5eed);
    write_blocks(&v, &mut rng, 300, &mut model);
    let st = v.status();
    assert_eq!(st.written_back_bytes, 0);
    let r = st.replication.unwrap();
    assert_eq!((r.in_sync, r.replicas), (3, 3));
    assert!(r.syncs_waited > 0, "an ack=all sync waits for its peers");
    // The primary stops at once: whatever was not acknowledged by both is not sent.
    drop(v);
    r1.stop();
    r2.stop();
    for node in &nodes[1..] {
        check_copy(node.path().join("vol.log"), nodes[0].path(), &model);
    }
}

#[test]
fn a_secondary_that_returns_is_resynced_from_its_bitmap() {
    let nodes: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let addr = r1.local_addr();
    let v = primary(nodes[0].path(), replicated(&[&r1], AckLevel::All, 1, 1));
    wait_until("the copy in sync", || health(&v) == Health::Healthy);
    let mut model = vec![None; (VOLUME / BS as u64) as usize];
    let mut rng = common::Rng(77);
    write_blocks(&v, &mut rng, 100, &mut model);

    r1.stop();
    wait_until("degraded", || health(&v) == Health::Degraded);
    let before = v.status().replication.unwrap().peers[0].clone();
    assert_eq!(before.link, LinkState::Down);
    assert_eq!(
        before.compared_resyncs, 1,
        "the first resync compares the copy made afresh"
    );
    // Writable while degraded.
    let outage_blocks = 400;
    write_blocks(&v, &mut rng, outage_blocks, &mut model);
    let outage_bytes = (outage_blocks * BS) as u64;
    assert!(v.status().replication.unwrap().peers[0].dirty_bytes >= outage_bytes);

    let r1 = restart_replica(&addr.to_string(), nodes[1].path());
    wait_until("healthy again", || health(&v) == Health::Healthy);
    let after = v.status().replication.unwrap().peers[0].clone();
    assert_eq!(
        after.compared_resyncs, 1,
        "caught up from the bitmap, not compared again"
    );
    let resynced = after.bytes_resynced - before.bytes_resynced;
    assert!(
        resynced as f64 <= 1.1 * outage_bytes as f64 && resynced >= outage_bytes,
        "resynced {resynced} bytes for {outage_bytes} written while away"
    );
    write_blocks(&v, &mut rng, 50, &mut model);
    drop(v);
    r1.stop();
    check_copy(nodes[1].path().join("vol.log"), nodes[0].path(), &model);
}

#[test]
fn below_min_replicas_writes_stop_and_reads_go_on() {
    let nodes: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let addr = r1.local_addr();
    let v = primary(nodes[0].path(), replicated(&[&r1], AckLevel::One, 2, 1));
    // Below min_replicas from the start: nothing is in sync yet.
    wait_until("healthy", || health(&v) == Health::Healthy);
    let data = vec![7u8; BS];
    v.write(0, &data, false).unwrap();

    r1.stop();
    wait_until("read-only", || health(&v) == Health::ReadOnly);
    assert!(matches!(
        v.write(BS as u64, &data, false),
        Err(BlockError::ReadOnly)
    ));
    let mut buf = vec![0u8; BS];
    v.read(0, &mut buf).unwrap();
    assert_eq!(buf, data);

    let r1 = restart_replica(&addr.to_string(), nodes[1].path());
    wait_until("healthy again", || health(&v) == Health::Healthy);
    v.write(BS as u64, &data, false).unwrap();
    let r = v.status().replication.unwrap();
    assert!(r.transitions >= 3, "healthy → read-only → healthy: {r:?}");
    drop(v);
    r1.stop();
}

/// Runs `f` on another thread and panics if it has not returned within 10 s (a call
/// that blocked): the blocked thread is left behind.
fn within_10s<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .unwrap_or_else(|_| panic!("{what} blocked for 10 s"))
}

/// A batch written back while the volume is read-only cannot be released (the head's
/// move waits for a copy in sync); meanwhile reads and status go on, and once a copy
/// returns the batch is released and the drain finishes. Once, the release held every
/// block's lock while it waited, and a read-only primary answered nothing.
#[test]
fn a_release_that_waits_for_a_copy_blocks_no_read() {
    let nodes: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let addr = r1.local_addr();
    let v = primary(nodes[0].path(), replicated(&[&r1], AckLevel::One, 2, 1));
    wait_until("healthy", || health(&v) == Health::Healthy);
    let mut rng = common::Rng(11);
    let mut model = vec![None; (VOLUME / BS as u64) as usize];
    write_blocks(&v, &mut rng, 200, &mut model);

    r1.stop();
    wait_until("read-only", || health(&v) == Health::ReadOnly);
    // The drain writes the batch back, then waits in the release.
    let drained = v.drain(Duration::from_secs(2));
    assert!(
        drained.is_err(),
        "a release needs a copy in sync: {drained:?}"
    );
    let (block, want) = model
        .iter()
        .enumerate()
        .find_map(|(b, d)| d.clone().map(|d| (b, d)))
        .unwrap();
    let reader = Arc::clone(&v);
    let got = within_10s("a read", move || {
        let mut buf = vec![0u8; BS];
        reader.read((block * BS) as u64, &mut buf).map(|()| buf)
    });
    assert!(got.unwrap() == want, "block {block}");
    let reader = Arc::clone(&v);
    let status = within_10s("status", move || reader.status());
    assert!(status.dirty_bytes > 0, "nothing released: {status:?}");

    let r1 = restart_replica(&addr.to_string(), nodes[1].path());
    wait_until("healthy again", || health(&v) == Health::Healthy);
    v.drain(Duration::from_secs(20)).unwrap();
    assert_eq!(v.status().dirty_bytes, 0);
    let mut buf = vec![0u8; BS];
    for (block, want) in model.iter().enumerate() {
        if let Some(want) = want {
            v.read((block * BS) as u64, &mut buf).unwrap();
            assert!(buf == *want, "block {block}");
        }
    }
    drop(v);
    r1.stop();
}

#[test]
fn a_newer_epoch_fences_the_older_primary() {
    let nodes: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    // Garbage on the port is refused; the server goes on.
    {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(r1.local_addr()).unwrap();
        s.write_all(b"GET / HTTP/1.0\r\n\r\n and some more bytes to fill a hello")
            .unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
    }
    let open = |node: &Path, epoch| {
        Volume::open(
            config(
                node.join("vol.log"),
                Some(replicated(&[&r1], AckLevel::All, 1, epoch)),
            ),
            backend(node),
            cache(),
        )
        .unwrap()
        .0
    };
    let old = open(nodes[0].path(), 1);
    wait_until("the old primary in sync", || {
        health(&old) == Health::Healthy
    });
    old.write(0, &[1u8; BS], false).unwrap();

    // A new primary (say, after a failover) takes the volume with epoch 2.
    let new = open(nodes[2].path(), 2);
    wait_until("the new primary in sync", || {
        health(&new) == Health::Healthy
    });
    new.write(0, &[2u8; BS], false).unwrap();

    // The old primary is refused from now on: it acknowledges nothing more.
    let _ = old.write(BS as u64, &[1u8; BS], false);
    wait_until("the old primary fenced", || {
        old.status().replication.unwrap().fenced_by == Some(2)
    });
    assert_eq!(health(&old), Health::ReadOnly);
    assert!(old.write(BS as u64, &[1u8; BS], false).is_err());
    let state =
        terrace_volume::replication::read_replica_state(&nodes[1].path().join("vol.replica"))
            .unwrap()
            .unwrap();
    assert_eq!(state.epoch, 2);
    new.write(BS as u64, &[2u8; BS], false).unwrap();
    drop(old);
    drop(new);
    r1.stop();
}

#[test]
fn a_lost_copy_is_made_again_and_never_taken_over_nor_one_mid_resync() {
    let nodes: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let addr = r1.local_addr();
    let v = primary(nodes[0].path(), replicated(&[&r1], AckLevel::All, 1, 3));
    wait_until("healthy", || health(&v) == Health::Healthy);
    let mut model = vec![None; (VOLUME / BS as u64) as usize];
    let mut rng = common::Rng(99);
    write_blocks(&v, &mut rng, 50, &mut model);
    r1.stop();
    wait_until("degraded", || health(&v) == Health::Degraded);
    // The secondary's copy is deleted while it is down.
    std::fs::remove_file(nodes[1].path().join("vol.log")).unwrap();
    write_blocks(&v, &mut rng, 50, &mut model);
    let r1 = restart_replica(&addr.to_string(), nodes[1].path());
    wait_until("healthy again", || health(&v) == Health::Healthy);
    let peer = v.status().replication.unwrap().peers[0].clone();
    assert_eq!(peer.compared_resyncs, 2, "the lost copy is compared again");
    drop(v);
    r1.stop();
    check_copy(nodes[1].path().join("vol.log"), nodes[0].path(), &model);

    // A copy whose state says a resync was under way is refused; so is a primary whose
    // epoch is older than the copy's.
    let refusal = |replication| {
        let copy = config(nodes[1].path().join("vol.log"), replication);
        match Volume::open(copy, backend(nodes[0].path()), cache()) {
            Ok(_) => panic!("the copy was taken over"),
            Err(e) => e.to_string(),
        }
    };
    let state = nodes[1].path().join("vol.replica");
    let text = std::fs::read_to_string(&state).unwrap();
    std::fs::write(&state, text.replace("consistent 1", "consistent 0")).unwrap();
    let err = refusal(None);
    assert!(err.contains("mid-resync"), "{err}");
    std::fs::write(&state, text).unwrap();
    let other = ReplicaServer::start("127.0.0.1:0", nodes[0].path()).unwrap();
    let err = refusal(Some(replicated(&[&other], AckLevel::All, 1, 2)));
    assert!(err.contains("older"), "{err}");
    other.stop();

    // A whole copy whose log is gone is not taken over either (R5): an empty log would
    // open as a fresh volume.
    std::fs::remove_file(nodes[1].path().join("vol.log")).unwrap();
    let err = refusal(None);
    assert!(err.contains("cannot be taken over"), "{err}");
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let err = r1
        .release("vol")
        .expect_err("a copy without its log is released");
    assert!(err.to_string().contains("cannot be taken over"), "{err}");
    r1.stop();
}

/// After a failover, the copies that followed the old primary — the other secondary's
/// and the old primary's own log, its node back — are compared by digest (P7): each
/// gets about what the new primary wrote while it was away (≤ 1.1×, digests counted),
/// not the whole log, and ends up holding every acknowledged write; writes go on while
/// the old primary's copy is compared.
#[test]
fn after_a_failover_the_old_copies_get_what_differs_not_the_whole_log() {
    let nodes: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let r2 = ReplicaServer::start("127.0.0.1:0", nodes[2].path()).unwrap();
    let old = primary(
        nodes[0].path(),
        replicated(&[&r1, &r2], AckLevel::All, 1, 1),
    );
    wait_until("healthy", || health(&old) == Health::Healthy);
    let mut model = vec![None; (VOLUME / BS as u64) as usize];
    let mut rng = common::Rng(0xfa11);
    write_blocks(&old, &mut rng, 300, &mut model);

    // The primary's node goes (its log's lock let go, as by its process's end); n1
    // takes the volume over from its copy (epoch 2), over the same backend, replicating
    // to n2 and to n0 (down for now).
    old.close();
    drop(old);
    r1.stop();
    let r0_addr = unused_addr();
    let rc = ReplicationConfig {
        ack: AckLevel::All,
        min_replicas: 1,
        epoch: 2,
        peer_timeout: Duration::from_secs(1),
        reconnect: Duration::from_millis(50),
        // Both rounds of each comparison cross many request boundaries.
        digest_request_units: 7,
        ..ReplicationConfig::new(vec![r2.local_addr().to_string(), r0_addr.clone()])
    };
    let log = nodes[1].path().join("vol.log");
    let new = Volume::open(config(log, Some(rc)), backend(nodes[0].path()), cache())
        .unwrap()
        .0;
    let peer = |v: &Volume, i: usize| v.status().replication.unwrap().peers[i].clone();
    wait_until("n2 in sync with the new primary", || {
        peer(&new, 0).link == LinkState::InSync
    });
    let n2 = peer(&new, 0);
    assert_eq!(n2.compared_resyncs, 1);
    assert!(
        n2.bytes_resynced + n2.digest_bytes <= 64 << 10,
        "n2 followed the old primary, which wrote nothing n1 lacks: {n2:?}"
    );

    // The new primary writes while the old primary's node is away.
    let outage_blocks = 400;
    write_blocks(&new, &mut rng, outage_blocks, &mut model);
    let mut outage_bytes = (outage_blocks * BS) as u64;
    // The old node returns, its log now a copy; writes go on while it is compared.
    let r0 = restart_replica(&r0_addr, nodes[0].path());
    let writer = {
        let new = Arc::clone(&new);
        let mut rng = common::Rng(0xbeef);
        std::thread::spawn(move || {
            let mut written = Vec::new();
            while written.len() < 150 && peer(&new, 1).link != LinkState::InSync {
                let block = rng.below(VOLUME / BS as u64) as usize;
                let mut data = vec![0u8; BS];
                rng.fill(&mut data);
                new.write((block * BS) as u64, &data, false).unwrap();
                written.push((block, data));
            }
            written
        })
    };
    wait_until("healthy", || health(&new) == Health::Healthy);
    for (block, data) in writer.join().unwrap() {
        model[block] = Some(data);
        outage_bytes += BS as u64;
    }
    let n0 = peer(&new, 1);
    assert_eq!(n0.compared_resyncs, 1);
    let sent = n0.bytes_resynced + n0.digest_bytes;
    assert!(
        sent as f64 <= 1.1 * outage_bytes as f64,
        "the old primary's copy got {sent} bytes for {outage_bytes} written while away: {n0:?}"
    );
    assert!(n0.bytes_resynced >= (outage_blocks * BS) as u64, "{n0:?}");
    write_blocks(&new, &mut rng, 50, &mut model);
    drop(new);
    r0.stop();
    r2.stop();
    for node in [0, 2] {
        check_copy(nodes[node].path().join("vol.log"), nodes[0].path(), &model);
    }
}

/// R7: a secondary that took the volume over and gave it up again does not take the
/// old primary's stream back. Its state records the leader's epoch, so the old primary
/// (paused, say, and still writing on its own) is fenced when it reconnects, instead of
/// resyncing the copy from a bitmap that knows nothing of what was written while the
/// copy led — which would overwrite those records.
#[test]
fn a_copy_that_led_fences_the_primary_before_it() {
    let nodes: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let old = primary(nodes[0].path(), replicated(&[&r1], AckLevel::All, 1, 1));
    wait_until("healthy", || health(&old) == Health::Healthy);
    let mut model = vec![None; (VOLUME / BS as u64) as usize];
    let mut rng = common::Rng(0x1ed);
    write_blocks(&old, &mut rng, 50, &mut model);

    // n1 leads for a while (epoch 2), from its copy, its own peer away.
    r1.release("vol").unwrap();
    let away = unused_addr();
    let rc = ReplicationConfig {
        epoch: 2,
        ..ReplicationConfig::new(vec![away])
    };
    let log = nodes[1].path().join("vol.log");
    let led = Volume::open(config(log, Some(rc)), backend(nodes[0].path()), cache())
        .unwrap()
        .0;
    write_blocks(&led, &mut rng, 50, &mut model);
    // Meanwhile the old primary, cut off from n1, writes on its own (degraded).
    let mut stale = model.clone();
    write_blocks(&old, &mut rng, 30, &mut stale);
    led.close();
    drop(led);
    r1.reclaim("vol", Some(2)).unwrap();

    // The old primary reconnects: fenced by the leader's epoch, it sends nothing.
    wait_until("the old primary fenced", || {
        old.status().replication.unwrap().fenced_by == Some(2)
    });
    let peer = old.status().replication.unwrap().peers[0].clone();
    assert_ne!(peer.link, LinkState::InSync, "{peer:?}");
    drop(old);
    r1.stop();
    check_copy(nodes[1].path().join("vol.log"), nodes[0].path(), &model);
}

/// With ack=local nothing waits for the secondary, so when it is stopped many writes are
/// in flight (queued, in socket buffers, unacknowledged); after it returns and resyncs,
/// its copy has every one of them.
#[test]
fn writes_in_flight_when_a_secondary_drops_reach_it_after_the_resync() {
    let nodes: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let addr = r1.local_addr();
    let v = primary(nodes[0].path(), replicated(&[&r1], AckLevel::Local, 1, 1));
    wait_until("healthy", || health(&v) == Health::Healthy);
    let mut model = vec![None; (VOLUME / BS as u64) as usize];
    let mut rng = common::Rng(4242);
    let mut r1 = r1;
    // Rounds with the stop at different moments of the stream; 1,600 writes in all, so
    // the log (8 MiB) never wraps and every record stays on the copy to be checked.
    for delay_ms in [1, 2, 4, 8] {
        let stopper = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(delay_ms));
            r1.stop();
        });
        write_blocks(&v, &mut rng, 400, &mut model);
        stopper.join().unwrap();
        wait_until("degraded", || health(&v) == Health::Degraded);
        r1 = restart_replica(&addr.to_string(), nodes[1].path());
        wait_until("healthy again", || health(&v) == Health::Healthy);
    }
    drop(v);
    r1.stop();
    check_copy(nodes[1].path().join("vol.log"), nodes[0].path(), &model);
}

/// P6: under a coordinator the primary publishes the peers in sync, and a write that
/// goes without a peer it last published waits until the smaller set is published —
/// so a node that may lack the write is never named as one that may lead.
#[test]
fn a_peer_cut_off_is_unpublished_before_a_write_goes_without_it() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;
    use terrace_volume::replication::InSyncPublisher;
    let nodes: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let r2 = ReplicaServer::start("127.0.0.1:0", nodes[2].path()).unwrap();
    let published: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let refuse = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (published, refuse) = (Arc::clone(&published), Arc::clone(&refuse));
        InSyncPublisher(Arc::new(move |peers: &[String]| {
            if refuse.load(Ordering::Acquire) {
                return Err(std::io::Error::other("etcd is away"));
            }
            published.lock().unwrap().push(peers.to_vec());
            Ok(())
        }))
    };
    let rc = ReplicationConfig {
        publish_in_sync: Some(publisher),
        ..replicated(&[&r1, &r2], AckLevel::All, 1, 1)
    };
    let v = primary(nodes[0].path(), rc);
    wait_until("healthy", || health(&v) == Health::Healthy);
    let data = vec![5u8; BS];
    v.write(0, &data, false).unwrap();
    let mut both = vec![r1.local_addr().to_string(), r2.local_addr().to_string()];
    both.sort();
    let last = |p: &Mutex<Vec<Vec<String>>>| {
        let mut l = p.lock().unwrap().last().cloned().unwrap_or_default();
        l.sort();
        l
    };
    assert_eq!(last(&published), both, "both peers published once in sync");

    // etcd is away when a peer drops: the write waits for the publication.
    refuse.store(true, Ordering::Release);
    let r2_addr = r2.local_addr().to_string();
    r2.stop();
    wait_until("degraded", || health(&v) == Health::Degraded);
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (v, done) = (Arc::clone(&v), Arc::clone(&done));
        std::thread::spawn(move || {
            v.write(BS as u64, &[6u8; BS], false).unwrap();
            done.store(true, Ordering::Release);
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !done.load(Ordering::Acquire),
        "a write went without {r2_addr} while it was still published"
    );
    refuse.store(false, Ordering::Release);
    writer.join().unwrap();
    assert_eq!(last(&published), vec![r1.local_addr().to_string()]);
    drop(v);
    r1.stop();
}

/// P8: under a coordinator, ack `one` waits for one designated peer and publishes only
/// it (with the primary): the other peer, streamed to but never waited for, may lag and
/// must not be named as able to lead. When the designated peer drops out, the other is
/// designated, and published only once it acknowledged — before any write goes on.
#[test]
fn with_ack_one_under_a_coordinator_one_designated_peer_is_published() {
    use std::sync::Mutex;
    use terrace_volume::replication::InSyncPublisher;
    let nodes: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let r1 = ReplicaServer::start("127.0.0.1:0", nodes[1].path()).unwrap();
    let r2 = ReplicaServer::start("127.0.0.1:0", nodes[2].path()).unwrap();
    let published: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let publisher = {
        let published = Arc::clone(&published);
        InSyncPublisher(Arc::new(move |peers: &[String]| {
            published.lock().unwrap().push(peers.to_vec());
            Ok(())
        }))
    };
    let rc = ReplicationConfig {
        publish_in_sync: Some(publisher),
        ..replicated(&[&r1, &r2], AckLevel::One, 2, 1)
    };
    let v = primary(nodes[0].path(), rc);
    wait_until("healthy", || health(&v) == Health::Healthy);
    let mut model = vec![None; (VOLUME / BS as u64) as usize];
    let mut rng = common::Rng(0xf1257);
    write_blocks(&v, &mut rng, 50, &mut model);
    let last = || {
        published
            .lock()
            .unwrap()
            .last()
            .cloned()
            .unwrap_or_default()
    };
    let first = last();
    assert_eq!(first.len(), 1, "one designated peer: {first:?}");
    let publications = published.lock().unwrap().len();
    write_blocks(&v, &mut rng, 50, &mut model);
    assert_eq!(
        published.lock().unwrap().len(),
        publications,
        "the designated peer is kept: no publication per write"
    );

    // The designated peer goes: the other is published before the next write returns,
    // and holds every acknowledged write.
    let (gone, other, other_dir) = if first[0] == r1.local_addr().to_string() {
        (r1, r2, nodes[2].path())
    } else {
        (r2, r1, nodes[1].path())
    };
    gone.stop();
    write_blocks(&v, &mut rng, 20, &mut model);
    assert_eq!(last(), vec![other.local_addr().to_string()]);
    drop(v);
    other.stop();
    check_copy(other_dir.join("vol.log"), nodes[0].path(), &model);
}

//! A whole `Service` (what `terrace serve-volume` runs) over a file backend: its control
//! socket (status, mode switches including storage, bad commands) and its Prometheus
//! endpoint over HTTP (the metrics, a 404, a client that never sends a request).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use terrace_cache::{TierConfig, TierSize};
use terrace_volume::control::send;
use terrace_volume::nbd::Listen;
use terrace_volume::nbd::NbdBackend;
use terrace_volume::{Backend, BackendSpec, Mode, Service, ServiceConfig, VolumeConfig};

fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn control_socket_and_metrics_endpoint_answer_and_refuse_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let backend = dir.path().join("disk.img");
    std::fs::File::create(&backend)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    let control = dir.path().join("control.sock");
    let config = ServiceConfig {
        listen: vec![Listen::Unix(dir.path().join("nbd.sock"))],
        control: Some(control.clone()),
        metrics: Some("127.0.0.1:0".into()),
        tiers: vec![TierConfig::dram(TierSize::Bytes(16 << 20))],
        volumes: vec![(
            VolumeConfig {
                log_bytes: 4 << 20,
                ..VolumeConfig::new("disk", 1, dir.path().join("disk.log"))
            },
            BackendSpec::File(backend),
        )],
        backend_connections: 1,
        replica: None,
        ha: None,
    };
    let service = Service::start(config).unwrap();
    let addr = service.metrics_addr().expect("a metrics endpoint");

    // A client that connects and sends nothing holds only its own thread.
    let _silent = TcpStream::connect(addr).unwrap();
    let started = Instant::now();
    let metrics = get(addr, "/metrics");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "not held up by the silent one"
    );
    assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
    assert!(
        metrics.contains("terrace_volume_size_bytes{volume=\"disk\"} 16777216"),
        "{metrics}"
    );
    assert!(metrics.contains("# TYPE terrace_volume_dirty_bytes gauge"));
    assert!(get(addr, "/nothing").starts_with("HTTP/1.1 404"));

    let wait = Duration::from_secs(10);
    let status = send(&control, "status", wait).unwrap();
    assert!(
        status.starts_with("OK\nvolume disk\n  mode write-through"),
        "{status}"
    );
    assert!(send(&control, "mode disk storage", wait)
        .unwrap()
        .starts_with("OK"));
    let status = send(&control, "status disk", wait).unwrap();
    assert!(status.contains("  mode storage\n"), "{status}");
    assert!(get(addr, "/metrics").contains("terrace_volume_batches_compacted{volume=\"disk\"} 0"));
    let refused = send(&control, "mode disk sideways", wait).unwrap();
    assert!(refused.starts_with("ERROR"), "{refused}");
    assert!(send(&control, "launch", wait).unwrap().starts_with("ERROR"));
    assert!(send(&control, "flush disk", wait)
        .unwrap()
        .starts_with("OK"));
    service.stop().unwrap();
    assert!(
        TcpStream::connect(addr).is_err(),
        "the endpoint is gone after stop"
    );
}

/// Each command gets an `ERROR` reply that says `why`.
fn assert_refused(control: &Path, commands: &[(&str, &str)]) {
    for (command, why) in commands {
        let reply = send(control, command, Duration::from_secs(60)).unwrap();
        assert!(
            reply.starts_with("ERROR") && reply.contains(why),
            "{command}: {reply}"
        );
    }
}

/// A service with one volume, `disk`, over `dir/disk.img` (created with `size` bytes if
/// missing), its control socket at `dir/control.sock` and NBD at `dir/nbd.sock`.
fn one_file_volume(dir: &Path, size: u64, mode: Mode, log_bytes: u64) -> ServiceConfig {
    let backend = dir.join("disk.img");
    if !backend.exists() {
        std::fs::File::create(&backend)
            .unwrap()
            .set_len(size)
            .unwrap();
    }
    ServiceConfig {
        listen: vec![Listen::Unix(dir.join("nbd.sock"))],
        control: Some(dir.join("control.sock")),
        metrics: None,
        tiers: vec![TierConfig::dram(TierSize::Bytes(16 << 20))],
        volumes: vec![(
            VolumeConfig {
                log_bytes,
                mode,
                ..VolumeConfig::new("disk", 1, dir.join("disk.log"))
            },
            BackendSpec::File(backend),
        )],
        backend_connections: 1,
        replica: None,
        ha: None,
    }
}

/// `resize`: a running write-back volume grows (its file too), new NBD connections see
/// the new size and can use the new blocks, data on both sides of the old end survives
/// a restart, and shrinking or a bad size is refused with the size unchanged.
#[test]
fn resize_grows_a_running_volume_that_keeps_its_size_after_a_restart() {
    const OLD: u64 = 16 << 20;
    const NEW: u64 = 24 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (backend, control) = (dir.path().join("disk.img"), dir.path().join("control.sock"));
    let config = || one_file_volume(dir.path(), OLD, Mode::WriteBack, 4 << 20);
    let service = Service::start(config()).unwrap();
    let uri = service.uris("disk")[0].clone();
    let before = NbdBackend::connect(&uri, 1).unwrap();
    assert_eq!(before.size(), OLD);
    before.write_at(OLD - 4096, &[7; 4096]).unwrap();

    assert_refused(
        &control,
        &[
            ("resize disk 8MiB", "shrinking"),
            ("resize disk 20000000", "multiple of 4096"),
            ("resize disk lots", "size"),
            ("resize nobody 32MiB", "no volume"),
            ("resize disk", "usage"),
        ],
    );
    let reply = send(&control, "resize disk 24MiB", Duration::from_secs(10)).unwrap();
    assert!(reply.starts_with("OK"), "{reply}");
    assert_eq!(std::fs::metadata(&backend).unwrap().len(), NEW);
    let status = send(&control, "status disk", Duration::from_secs(10)).unwrap();
    assert!(status.contains(&format!("size_bytes {NEW}")), "{status}");

    let after = NbdBackend::connect(&uri, 1).unwrap();
    assert_eq!(after.size(), NEW);
    let mut buf = vec![1; 4096];
    after.read_at(NEW - 4096, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "new blocks read as zeroes");
    after.write_at(NEW - 4096, &[9; 4096]).unwrap();
    after.flush().unwrap();
    drop((before, after));
    service.stop().unwrap();

    let service = Service::start(config()).unwrap();
    let again = NbdBackend::connect(&service.uris("disk")[0], 1).unwrap();
    assert_eq!(again.size(), NEW);
    for (at, stamp) in [(OLD - 4096, 7), (NEW - 4096, 9)] {
        again.read_at(at, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == stamp), "block at {at}");
    }
    drop(again);
    service.stop().unwrap();
}

/// `snapshot`: a storage volume (its backend written only at flush or snapshot) under
/// writers: the snapshot file holds every write acknowledged before the command, the
/// backend too, and writes after it change neither the snapshot nor its name's
/// availability; bad or repeated tags are refused.
#[test]
fn snapshot_copies_every_acknowledged_write_and_nothing_later() {
    const SIZE: u64 = 16 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (backend, control) = (dir.path().join("disk.img"), dir.path().join("control.sock"));
    let service =
        Service::start(one_file_volume(dir.path(), SIZE, Mode::Storage, 32 << 20)).unwrap();
    let client = NbdBackend::connect(&service.uris("disk")[0], 2).unwrap();
    for block in 0..200u64 {
        client
            .write_at(block * 4096, &[block as u8 + 1; 4096])
            .unwrap();
    }
    let on_backend = std::fs::read(&backend).unwrap();
    assert!(
        on_backend[..4096].iter().all(|&b| b == 0),
        "storage mode wrote the backend"
    );

    // Writers keep going while the snapshot is taken: the snapshot is one point in time,
    // so each of their blocks holds the stamp of one acknowledged round.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let uri = service.uris("disk")[0].clone();
        std::thread::spawn(move || {
            let client = NbdBackend::connect(&uri, 1).unwrap();
            let mut round = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                round = round.wrapping_add(1).max(1);
                for block in 1000..1016u64 {
                    client.write_at(block * 4096, &[round; 4096]).unwrap();
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let reply = send(
        &control,
        "snapshot disk before-upgrade",
        Duration::from_secs(60),
    )
    .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(reply.starts_with("OK\n"), "{reply}");
    let snapshot = dir.path().join("disk.img.snap-before-upgrade");
    assert_eq!(reply.lines().nth(1), Some(snapshot.to_str().unwrap()));
    let copy = std::fs::read(&snapshot).unwrap();
    assert_eq!(copy.len() as u64, SIZE);
    for block in 0..200usize {
        let data = &copy[block * 4096..(block + 1) * 4096];
        assert!(data.iter().all(|&b| b == block as u8 + 1), "block {block}");
    }
    let rounds: std::collections::BTreeSet<u8> =
        (1000..1016usize).map(|b| copy[b * 4096]).collect();
    assert!(
        rounds.len() <= 2,
        "the writer's 16 blocks come from at most two rounds (one in flight): {rounds:?}"
    );
    let backend_now = std::fs::read(&backend).unwrap();
    assert!(
        backend_now[..4096].iter().all(|&b| b == 1),
        "the snapshot drained the log"
    );

    client.write_at(0, &[0xEE; 4096]).unwrap();
    client.flush().unwrap();
    assert_eq!(std::fs::read(&snapshot).unwrap()[..4096], copy[..4096]);
    assert_refused(
        &control,
        &[
            ("snapshot disk before-upgrade", "exists"),
            ("snapshot disk ../escape", "tag"),
            ("snapshot disk .hidden", "tag"),
            ("snapshot nobody x", "no volume"),
            ("snapshot disk", "usage"),
        ],
    );
    drop(client);
    service.stop().unwrap();
}

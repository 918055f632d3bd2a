//! `S3Backend` against a real S3 server: moto's `moto_server` (PyPI `moto[s3]` with
//! `flask` and `flask-cors`), started by each test on a free loopback port and killed
//! when the test ends. Round trips across chunks, zeroes where nothing was written,
//! concurrent partial writes to one chunk, trims (a whole-chunk trim deletes the object),
//! reopening with the same and another size, ranges past the end, a stalled and a
//! stopped server (errors within a bounded time, then service again), and a write-back
//! volume over S3 whose data is read back from S3 alone.
//!
//! The server is `$TERRACE_MOTO_SERVER`, else `moto_server` on `PATH`, else
//! `/opt/terrace-s3/bin/moto_server` (where `.ci/run` installs it). Without it every
//! test fails and says how to install it: there is no skipping.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use terrace_cache::{Cache, CacheConfig, TierConfig, TierSize};
use terrace_volume::s3::S3Credentials;
use terrace_volume::{Backend, Export, Mode, S3Backend, S3Config, Volume, VolumeConfig};
use terrace_volume::{BackendSpec, BLOCK_SIZE};

mod common;
use common::Rng;

const BS: u64 = BLOCK_SIZE as u64;
const BUCKET: &str = "terrace";
const VENV: &str = "/opt/terrace-s3";

fn moto_server() -> PathBuf {
    if let Some(path) = std::env::var_os("TERRACE_MOTO_SERVER") {
        return PathBuf::from(path);
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("moto_server"))
        .chain([Path::new(VENV).join("bin/moto_server")])
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "moto_server (a local S3 server) is not installed. Install it with:\n  \
                 python3 -m venv {VENV} && {VENV}/bin/pip install 'moto[s3]==5.2.5' \
                 flask flask-cors\n(as .ci/run does), or point TERRACE_MOTO_SERVER at one"
            )
        })
}

/// A moto S3 server on loopback, killed when dropped.
struct S3Server {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl S3Server {
    fn start() -> S3Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut server = S3Server {
            child: None,
            port,
            dir: tempfile::tempdir().unwrap(),
        };
        server.launch();
        server
    }

    /// Starts moto on `self.port` (again, after `stop`: moto keeps everything in
    /// memory, so it comes back empty) and creates the bucket.
    fn launch(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("moto.log")).unwrap();
        let child = Command::new(moto_server())
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting moto_server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.create_bucket() {
                Ok(()) => return,
                Err(e) if Instant::now() > deadline => panic!(
                    "moto_server did not answer on port {} within 60 s ({e}); its log:\n{}",
                    self.port,
                    std::fs::read_to_string(self.dir.path().join("moto.log")).unwrap_or_default()
                ),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// `PUT /BUCKET`: creates the bucket.
    fn create_bucket(&self) -> io::Result<()> {
        self.put(&format!("/{BUCKET}"), b"")
    }

    /// `PUT path` with `body`, unsigned (moto takes it): a bucket, or an object put
    /// behind the backend's back.
    fn put(&self, path: &str, body: &[u8]) -> io::Result<()> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "PUT {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            self.port,
            body.len()
        )?;
        s.write_all(body)?;
        let mut reply = String::new();
        s.read_to_string(&mut reply)?;
        if reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200") {
            Ok(())
        } else {
            Err(io::Error::other(format!("PUT {path}: {reply:.200}")))
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid}");
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.signal("-CONT"); // a paused server dies of SIGKILL too, but be plain
        }
        self.stop();
    }
}

fn config(server: &S3Server, prefix: &str, size: u64, chunk: u64) -> S3Config {
    S3Config {
        endpoint: Some(server.endpoint()),
        region: Some("us-east-1".into()),
        chunk_size: chunk,
        timeout: Duration::from_secs(10),
        credentials: Some(S3Credentials {
            access_key_id: "test".into(),
            secret_access_key: "test".into(),
        }),
        ..S3Config::new(BUCKET, prefix, size)
    }
}

fn pattern(rng: &mut Rng, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.next() as u8).collect()
}

fn read(backend: &S3Backend, offset: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0xaa; len as usize];
    backend.read_at(offset, &mut buf).unwrap();
    buf
}

#[test]
fn ranges_across_chunks_round_trip_and_unwritten_ranges_read_as_zeroes() {
    let server = S3Server::start();
    let chunk = 64 << 10;
    let size = 16 * chunk + 8 * BS; // a short last chunk
    let backend = S3Backend::open(config(&server, "vols/rt", size, chunk)).unwrap();
    assert_eq!(backend.size(), size);
    assert_eq!(read(&backend, 0, size), vec![0; size as usize]);
    assert!(backend.stored_chunks().unwrap().is_empty());
    let mut model = vec![0u8; size as usize];
    let mut rng = Rng(0x5eed);
    let writes = [
        (BS, chunk + 3 * BS),                 // starts and ends inside chunks
        (3 * chunk - BS, 2 * chunk + 2 * BS), // partial, whole, whole, partial
        (6 * chunk, chunk),                   // exactly one chunk
        (12_345, 70_001),                     // not even block-aligned
        (16 * chunk, 8 * BS),                 // the whole short last chunk
        (size - BS, BS),
    ];
    for (offset, len) in writes {
        let data = pattern(&mut rng, len as usize);
        backend.write_at(offset, &data).unwrap();
        model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
    }
    backend.flush().unwrap();
    assert_eq!(read(&backend, 0, size), model, "the whole volume");
    // A write of whole chunks is one PUT each, with no GET.
    let before = backend.requests();
    let data = pattern(&mut rng, 2 * chunk as usize);
    backend.write_at(8 * chunk, &data).unwrap();
    model[(8 * chunk) as usize..(10 * chunk) as usize].copy_from_slice(&data);
    let after = backend.requests();
    assert_eq!((after.puts - before.puts, after.gets - before.gets), (2, 0));
    for _ in 0..50 {
        let offset = rng.below(size);
        let len = rng.below(size - offset).min(3 * chunk) + 1;
        let got = read(&backend, offset, len);
        assert!(
            got == model[offset as usize..(offset + len) as usize],
            "range {offset}+{len}"
        );
    }
    // Chunks 7 and 10..=15 were never written: no objects, zeroes.
    let stored = backend.stored_chunks().unwrap();
    assert_eq!(stored, vec![0, 1, 2, 3, 4, 5, 6, 8, 9, 16], "{stored:?}");
    assert_eq!(
        read(&backend, 10 * chunk, 4 * chunk),
        vec![0; 4 * chunk as usize]
    );
    assert_eq!(read(&backend, 7 * chunk, chunk), vec![0; chunk as usize]);
}

#[test]
fn concurrent_partial_writes_to_one_chunk_lose_nothing() {
    let server = S3Server::start();
    let chunk = 256 << 10; // 64 blocks
    let size = 2 * chunk;
    let backend = Arc::new(S3Backend::open(config(&server, "vols/conc", size, chunk)).unwrap());
    let threads = 64u64;
    let rounds = 3u8;
    std::thread::scope(|s| {
        for t in 0..threads {
            let backend = Arc::clone(&backend);
            s.spawn(move || {
                for round in 0..rounds {
                    // Block t of chunk 0, and a piece of 1 KiB of chunk 1 (not aligned).
                    let fill = (t as u8).wrapping_mul(7) ^ round;
                    backend.write_at(t * BS, &[fill; BLOCK_SIZE]).unwrap();
                    backend
                        .write_at(chunk + t * BS + 1000, &[fill.wrapping_add(1); 1024])
                        .unwrap();
                }
            });
        }
    });
    let requests = backend.requests();
    eprintln!("{} updates: {requests:?}", 2 * threads * u64::from(rounds));
    assert!(
        requests.merged_rounds > 0 && requests.puts < 2 * threads * u64::from(rounds),
        "updates waiting on one chunk go in one round"
    );
    let got = read(&backend, 0, size);
    for t in 0..threads {
        let fill = (t as u8).wrapping_mul(7) ^ (rounds - 1);
        let block = &got[(t * BS) as usize..((t + 1) * BS) as usize];
        assert!(
            block.iter().all(|&b| b == fill),
            "chunk 0 block {t} lost a write"
        );
        let piece = &got[(chunk + t * BS) as usize..(chunk + (t + 1) * BS) as usize];
        assert!(
            piece[..1000].iter().all(|&b| b == 0),
            "chunk 1 block {t} head"
        );
        assert!(
            piece[1000..2024].iter().all(|&b| b == fill.wrapping_add(1)),
            "chunk 1 block {t} lost a write"
        );
        assert!(
            piece[2024..].iter().all(|&b| b == 0),
            "chunk 1 block {t} tail"
        );
    }
}

#[test]
fn trims_read_as_zeroes_and_a_whole_chunk_trim_deletes_the_object() {
    let server = S3Server::start();
    let chunk = 64 << 10;
    let size = 6 * chunk;
    let backend = S3Backend::open(config(&server, "vols/trim", size, chunk)).unwrap();
    let mut rng = Rng(77);
    let mut model = pattern(&mut rng, size as usize);
    backend.write_at(0, &model).unwrap();
    assert_eq!(backend.stored_chunks().unwrap(), vec![0, 1, 2, 3, 4, 5]);
    let mut trim = |offset: u64, len: u64| {
        backend.trim(offset, len).unwrap();
        model[offset as usize..(offset + len) as usize].fill(0);
    };
    trim(chunk, chunk); // chunk 1, whole
    trim(2 * chunk + BS, 2 * BS); // inside chunk 2
    trim(4 * chunk - 3 * BS, chunk + 5 * BS); // end of 3, all of 4, start of 5
    assert_eq!(read(&backend, 0, size), model);
    assert_eq!(
        backend.stored_chunks().unwrap(),
        vec![0, 2, 3, 5],
        "whole-chunk trims delete the object; partial ones keep it"
    );
    // A partial trim that leaves a chunk all zeroes deletes it too.
    backend.trim(5 * chunk, chunk - BS).unwrap();
    backend.trim(6 * chunk - BS, BS).unwrap();
    model[(5 * chunk) as usize..].fill(0);
    assert_eq!(backend.stored_chunks().unwrap(), vec![0, 2, 3]);
    // Trimming nothing there is fine, and a write of zeroes stores nothing.
    backend.trim(chunk, 2 * BS).unwrap();
    backend
        .write_at(4 * chunk, &vec![0; chunk as usize])
        .unwrap();
    assert_eq!(backend.stored_chunks().unwrap(), vec![0, 2, 3]);
    assert_eq!(read(&backend, 0, size), model);
}

#[test]
fn reopening_sees_the_data_and_refuses_another_layout() {
    let server = S3Server::start();
    let chunk = 64 << 10;
    let size = 4 * chunk;
    let data = pattern(&mut Rng(9), (2 * chunk) as usize);
    {
        let backend = S3Backend::open(config(&server, "vols/reopen", size, chunk)).unwrap();
        backend.write_at(chunk / 2, &data).unwrap();
    }
    let backend = S3Backend::open(config(&server, "vols/reopen", size, chunk)).unwrap();
    assert_eq!(read(&backend, chunk / 2, 2 * chunk), data);
    drop(backend);
    for (other_size, other_chunk) in [(size * 2, chunk), (size, chunk * 2)] {
        let err = S3Backend::open(config(&server, "vols/reopen", other_size, other_chunk))
            .err()
            .expect("another layout is refused");
        let text = err.to_string();
        assert!(
            text.contains("refusing") && text.contains(&size.to_string()),
            "{text}"
        );
    }
    // A bucket that does not exist is an error, not a volume of zeroes.
    let err = S3Backend::open(S3Config {
        bucket: "no-such-bucket".into(),
        ..config(&server, "vols/reopen", size, chunk)
    })
    .err()
    .expect("no bucket, no volume")
    .to_string();
    eprintln!("{err}");
    assert!(err.contains("no-such-bucket"), "{err}");
    // Another prefix in the same bucket is another volume.
    let other = S3Backend::open(config(&server, "vols/reopen2", size * 2, chunk)).unwrap();
    assert_eq!(read(&other, 0, size * 2), vec![0; (size * 2) as usize]);
}

#[test]
fn requests_past_the_end_are_refused() {
    let server = S3Server::start();
    let size = 16 * BS;
    let backend = S3Backend::open(config(&server, "vols/range", size, 8 * BS)).unwrap();
    let mut buf = vec![0u8; BLOCK_SIZE];
    let errors = [
        backend.read_at(size, &mut buf).unwrap_err(),
        backend.read_at(size - 100, &mut buf).unwrap_err(),
        backend.write_at(size - BS + 1, &buf).unwrap_err(),
        backend.write_at(u64::MAX - 10, &buf).unwrap_err(),
        backend.trim(size, BS).unwrap_err(),
        backend.trim(0, size + 1).unwrap_err(),
    ];
    for e in errors {
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("s3 volume"), "{e}");
        assert!(e.to_string().contains("past the end"), "{e}");
    }
    assert!(
        backend.stored_chunks().unwrap().is_empty(),
        "nothing written"
    );
    // Ranges that end exactly at the end are fine.
    backend.write_at(size - BS, &buf).unwrap();
    backend.read_at(size - BS, &mut buf).unwrap();
}

#[test]
fn a_stalled_or_stopped_server_is_an_error_in_bounded_time_and_service_resumes() {
    let mut server = S3Server::start();
    let chunk = 64 << 10;
    let size = 4 * chunk;
    let timeout = Duration::from_secs(2);
    let backend = S3Backend::open(S3Config {
        timeout,
        ..config(&server, "vols/outage", size, chunk)
    })
    .unwrap();
    let data = vec![5u8; (chunk + 2 * BS) as usize];
    backend.write_at(BS, &data).unwrap();
    let bounded = |what: &str, started: Instant, result: io::Result<()>| {
        let e = result.expect_err(what);
        let took = started.elapsed();
        // A partial write is a GET and a PUT: two requests' worth, and some slack.
        assert!(
            took < 2 * timeout + Duration::from_secs(3),
            "{what} took {took:?}"
        );
        assert!(e.to_string().contains("s3 "), "{what}: {e}");
        assert!(
            e.to_string().contains("vols/outage/"),
            "{what} names the key: {e}"
        );
        eprintln!("{what}: {took:?}: {e}");
    };
    // Stalled: the kernel still accepts connections, nothing answers.
    server.signal("-STOP");
    let mut buf = vec![0u8; BLOCK_SIZE];
    let t = Instant::now();
    bounded(
        "read from a stalled server",
        t,
        backend.read_at(0, &mut buf),
    );
    let t = Instant::now();
    bounded("write to a stalled server", t, backend.write_at(0, &buf));
    let t = Instant::now();
    bounded(
        "trim on a stalled server",
        t,
        backend.trim(2 * chunk, chunk),
    );
    server.signal("-CONT");
    let mut got = vec![0u8; data.len()];
    backend.read_at(BS, &mut got).unwrap();
    assert!(got == data, "the data is back with the server");
    backend.write_at(3 * chunk, &[6u8; BLOCK_SIZE]).unwrap();
    // Stopped: connections are refused.
    server.stop();
    let t = Instant::now();
    bounded(
        "read from a stopped server",
        t,
        backend.read_at(0, &mut buf),
    );
    let t = Instant::now();
    bounded("write to a stopped server", t, backend.write_at(0, &buf));
    // Restarted (moto starts empty): the same backend works again.
    server.launch();
    backend.write_at(BS, &data).unwrap();
    backend.read_at(BS, &mut got).unwrap();
    assert!(got == data);
}

#[test]
fn a_write_back_volume_over_s3_drains_to_s3_and_reads_back_from_it() {
    let server = S3Server::start();
    let dir = tempfile::tempdir().unwrap();
    let chunk = 128 << 10;
    let size = 64 * chunk; // 8 MiB
    let s3 = config(&server, "vols/e2e", size, chunk);
    let open_volume = |mode: Mode| {
        let backend = Arc::new(S3Backend::open(s3.clone()).unwrap());
        let cache = CacheConfig {
            movers: 1,
            ..CacheConfig::new(vec![TierConfig::dram(TierSize::Bytes(16 << 20))])
        };
        let cache = Arc::new(Cache::open(cache).unwrap().0);
        let config = VolumeConfig {
            mode,
            log_bytes: 4 << 20,
            writeback_threads: 64,
            idle_writeback: Duration::from_millis(20),
            ..VolumeConfig::new("v", 1, dir.path().join("v.log"))
        };
        Volume::open(config, backend, cache).unwrap().0
    };
    let volume = open_volume(Mode::WriteBack);
    let mut rng = Rng(2024);
    let mut model = vec![0u8; size as usize];
    for i in 0..600u64 {
        let blocks = 1 + rng.below(40);
        let offset = rng.below(size / BS - blocks) * BS;
        let len = blocks * BS;
        if i % 10 == 9 {
            volume.write_zeroes(offset, len, false).unwrap();
            model[offset as usize..(offset + len) as usize].fill(0);
        } else {
            let data = pattern(&mut rng, len as usize);
            volume.write(offset, &data, false).unwrap();
            model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        }
    }
    volume.flush().unwrap();
    volume.drain(Duration::from_secs(120)).unwrap();
    assert_eq!(volume.status().dirty_bytes, 0);
    volume.close();
    drop(volume);
    // S3 alone holds the volume: read it through a fresh backend ...
    let backend = S3Backend::open(s3.clone()).unwrap();
    assert!(
        read(&backend, 0, size) == model,
        "S3 holds exactly what was written"
    );
    drop(backend);
    // ... and through a volume with a new, empty cache (and the drained log).
    let volume = open_volume(Mode::WriteThrough);
    let mut got = vec![0u8; size as usize];
    volume.read(0, &mut got).unwrap();
    assert!(got == model, "a cold volume reads the data back from S3");
    volume.close();
}

#[test]
fn the_backend_spec_parses_s3_uris_and_requires_a_size() {
    let spec: BackendSpec = "s3://bucket/vols/a?endpoint=http://127.0.0.1:9000&size=1GiB"
        .parse()
        .unwrap();
    let BackendSpec::S3(config) = spec else {
        panic!("{spec:?}")
    };
    assert_eq!(config.size, 1 << 30);
    assert_eq!(config.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
    let err = "s3://bucket/vols/a".parse::<BackendSpec>().unwrap_err();
    assert!(err.contains("needs its size"), "{err}");
}

/// Growing on S3: one PUT of the metadata object; the new chunks read as zeroes; the
/// volume reopens with its created or its grown size (at the grown one), not another;
/// one whose size is not whole chunks refuses. A snapshot is a copy made by the server
/// under `PREFIX.snap-TAG`, itself a volume, unchanged by later writes; a second with
/// the same tag is refused.
#[test]
fn a_volume_grows_and_snapshots_on_s3() {
    let server = S3Server::start();
    let chunk = 64 << 10;
    let size = 4 * chunk;
    let grown = 6 * chunk;
    let backend = S3Backend::open(config(&server, "vols/grow", size, chunk)).unwrap();
    let mut rng = Rng(5);
    let data = pattern(&mut rng, size as usize);
    backend.write_at(0, &data).unwrap();
    backend.grow(grown).unwrap();
    assert_eq!(backend.size(), grown);
    assert!(read(&backend, size, grown - size).iter().all(|&b| b == 0));
    backend
        .write_at(5 * chunk, &vec![7; chunk as usize])
        .unwrap();
    for configured in [size, grown] {
        let again = S3Backend::open(config(&server, "vols/grow", configured, chunk)).unwrap();
        assert_eq!(again.size(), grown);
        assert_eq!(read(&again, 0, size), data);
    }
    let other = S3Backend::open(config(&server, "vols/grow", 5 * chunk, chunk));
    assert!(other.is_err(), "another size is refused");

    let at = backend.snapshot("one").unwrap();
    assert_eq!(at, format!("s3://{BUCKET}/vols/grow.snap-one"));
    backend.write_at(0, &vec![9; BLOCK_SIZE]).unwrap();
    let snapshot = S3Backend::open(config(&server, "vols/grow.snap-one", size, chunk)).unwrap();
    assert_eq!(snapshot.size(), grown);
    assert_eq!(read(&snapshot, 0, size), data);
    assert!(read(&snapshot, 5 * chunk, chunk).iter().all(|&b| b == 7));
    let again = backend.snapshot("one").unwrap_err();
    assert_eq!(again.kind(), io::ErrorKind::AlreadyExists, "{again}");
    // An unfinished snapshot (chunk objects, no `volume` object) is cleared, not kept:
    // a stray chunk there would read as the volume's data.
    let stray = vec![0xEE; chunk as usize];
    server
        .put(
            &format!("/{BUCKET}/vols/grow.snap-two/0000000000000004"),
            &stray,
        )
        .unwrap();
    let source_chunks = backend.stored_chunks().unwrap();
    assert!(!source_chunks.contains(&4), "{source_chunks:?}");
    backend.snapshot("two").unwrap();
    let two = S3Backend::open(config(&server, "vols/grow.snap-two", size, chunk)).unwrap();
    assert_eq!(two.stored_chunks().unwrap(), source_chunks);
    assert!(read(&two, 4 * chunk, chunk).iter().all(|&b| b == 0));

    let ragged = S3Backend::open(config(&server, "vols/ragged", size + BS, chunk)).unwrap();
    let refused = ragged.grow(grown).unwrap_err();
    assert_eq!(refused.kind(), io::ErrorKind::Unsupported, "{refused}");
    assert_eq!(ragged.size(), size + BS);
}

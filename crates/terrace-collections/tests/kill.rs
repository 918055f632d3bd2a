//! Process-kill test: a child process appends keys to an ordered map and a hash map in a
//! pool file and replaces older ones with values of random length (inline and out of
//! line) until it is SIGKILLed at a random moment; the parent reopens the pool, whose
//! ordered map must hold keys `0..n` with no gap and whose hash map keys `0..m` with `m`
//! within one of `n` (the child writes the ordered map first), every value intact, both
//! checks passing and nothing unreachable. Repeated on the same file, so each round also
//! recovers over the earlier ones.

use std::process::Command;
use std::time::Duration;

use terrace_collections::{check, Collections, MapOptions};
use terrace_pool::Pool;

const LAYOUT: &str = "collections-kill";
const CHILD_ENV: &str = "TERRACE_COLLECTIONS_KILL_CHILD";
const READY: &str = "kill-child: working";

fn key(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

/// A value that names its key and checks itself: the key number, then a pattern.
fn value(i: u64, len: usize) -> Vec<u8> {
    let mut v = i.to_le_bytes().to_vec();
    v.extend((0..len).map(|j| (i as usize + j) as u8));
    v
}

fn intact(i: u64, v: &[u8]) -> bool {
    v.len() >= 8 && v[..8] == i.to_le_bytes() && v == value(i, v.len() - 8)
}

fn pool_dir() -> tempfile::TempDir {
    let dir = std::env::var_os("TERRACE_TEST_PMEM_DIR")
        .map_or_else(|| "/dev/shm".into(), std::path::PathBuf::from);
    tempfile::tempdir_in(dir).expect("a folder for the pool")
}

/// The child's endless work; only runs when the parent starts it.
#[test]
#[ignore = "run by a_killed_writer_leaves_a_consistent_map as a child process"]
fn kill_child_worker() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let pool = Pool::open(&path, LAYOUT).expect("child open");
    let colls = Collections::open(&pool).expect("directory");
    let map = colls
        .ordered_map("kill", MapOptions::create(8, 16))
        .expect("map");
    let hash = colls
        .hash_map("kill-hash", MapOptions::create(8, 16))
        .expect("hash map");
    let mut rng = std::process::id() as u64 | 1;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut n = map.len().expect("len");
    // The two maps are not updated together: a kill between an append to the ordered map
    // and the same append to the hash map leaves the hash map one key short. Finish that
    // append first, as a program keeping two maps in step would.
    if n > 0 && !hash.contains(&key(n - 1)).expect("contains") {
        let v = map.get(&key(n - 1)).expect("get").expect("the last key");
        hash.put(&key(n - 1), &v).expect("finish the append");
    }
    let mut announced = false;
    loop {
        let len = if next() % 4 == 0 {
            100 + next() % 400
        } else {
            next() % 9
        } as usize;
        map.put(&key(n), &value(n, len)).expect("append");
        hash.put(&key(n), &value(n, len)).expect("hash append");
        n += 1;
        let old = next() % n;
        let len = if next() % 3 == 0 {
            50 + next() % 200
        } else {
            next() % 9
        } as usize;
        map.put(&key(old), &value(old, len)).expect("replace");
        hash.put(&key(old), &value(old, len)).expect("hash replace");
        if !announced {
            println!("{READY}");
            announced = true;
        }
    }
}

#[test]
fn a_killed_writer_leaves_a_consistent_map() {
    let dir = pool_dir();
    let path = dir.path().join("pool");
    drop(Pool::create(&path, 256 << 20, LAYOUT).expect("create"));
    let exe = std::env::current_exe().expect("test binary");
    let mut rng = 7u64;
    for round in 0..5 {
        let mut child = Command::new(&exe)
            .args(["--exact", "kill_child_worker", "--ignored", "--nocapture"])
            .env(CHILD_ENV, &path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        let started = std::io::BufRead::lines(std::io::BufReader::new(stdout))
            .map_while(Result::ok)
            .any(|line| line == READY);
        assert!(
            started,
            "round {round}: the child ended before its first put"
        );
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis(100 + (rng >> 33) % 300));
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");

        let pool = Pool::open(&path, LAYOUT).expect("recovery");
        pool.check()
            .unwrap_or_else(|e| panic!("round {round}: pool check: {e}"));
        let report = check(&pool).unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert!(report.unreachable.is_empty(), "round {round}: {report:?}");
        let colls = Collections::open(&pool).expect("directory");
        let map = colls
            .ordered_map("kill", MapOptions::existing())
            .expect("map");
        let mut expected = 0u64;
        for entry in map.iter() {
            let (k, v) = entry.expect("scan");
            let i = u64::from_be_bytes(k.as_slice().try_into().expect("8-byte key"));
            assert_eq!(i, expected, "round {round}: a gap before key {i}");
            assert!(intact(i, &v), "round {round}: key {i} holds a torn value");
            expected += 1;
        }
        assert!(expected > 0, "round {round}: nothing survived");
        let hash = colls
            .hash_map("kill-hash", MapOptions::existing())
            .expect("hash map");
        let mut keys = Vec::new();
        for entry in hash.iter() {
            let (k, v) = entry.expect("hash scan");
            let i = u64::from_be_bytes(k.as_slice().try_into().expect("8-byte key"));
            assert!(
                intact(i, &v),
                "round {round}: hash key {i} holds a torn value"
            );
            keys.push(i);
        }
        keys.sort_unstable();
        let m = keys.len() as u64;
        assert!(
            keys.iter().enumerate().all(|(j, &i)| i == j as u64),
            "round {round}: a gap in the hash map"
        );
        assert!(
            m + 1 >= expected && m <= expected,
            "round {round}: hash map {m} keys, ordered {expected}"
        );
        eprintln!(
            "round {round}: {expected} keys, {} out-of-line values",
            report.blobs
        );
    }
}

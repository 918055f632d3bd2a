//! Process-kill tests: a child process works on a pool file (allocations, frees,
//! reallocs, transactions) and is SIGKILLed at a random moment; the parent reopens the
//! pool, which must recover to a consistent heap: `check` passes, the live objects are
//! exactly the published ones, and a transactional invariant holds. Repeated with the same
//! file, so recovery also runs over earlier recoveries.

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use terrace_pool::{HandleAt, Oid, Pool, PoolError};

mod common;

const LAYOUT: &str = "kill";
const SLOTS: u64 = 64;
const COUNT: u64 = SLOTS * 8;
const TWICE: u64 = COUNT + 8;
const ROOT_SIZE: u64 = TWICE + 8;
const CHILD_ENV: &str = "TERRACE_POOL_KILL_CHILD";
/// What the child prints once its first operation is done.
const READY: &str = "kill-child: working";

fn next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

/// The child's endless work; only runs when the parent starts it.
#[test]
#[ignore = "run by process_kill_recovers as a child process"]
fn kill_child_worker() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let pool = Pool::open(&path, LAYOUT).expect("child open");
    let root = pool.root(ROOT_SIZE).expect("root");
    let mut rng = std::process::id() as u64;
    let mut ready = false;
    loop {
        let i = next(&mut rng) % SLOTS;
        let slot = HandleAt::Word(root.offset() + i * 8);
        let size = [64u64, 700, 5000, 70_000, 200_000][(next(&mut rng) % 5) as usize];
        let full = pool.read_u64(root, i * 8).expect("slot") != 0;
        let r = match (next(&mut rng) % 4, full) {
            (0, false) => pool.alloc(size, 1, slot).map(|_| ()),
            (0, true) => pool.free(slot),
            (1, true) => pool.realloc(slot, size, 1).map(|_| ()),
            _ => pool.tx(|tx| {
                let c = pool.read_u64(root, COUNT)?;
                if let Some(o) = Oid::from_offset(pool.read_u64(root, i * 8)?) {
                    tx.write_u64(root, i * 8, 0)?;
                    tx.free(o)?;
                } else {
                    let o = tx.alloc(size, 1)?;
                    tx.write_u64(root, i * 8, o.offset())?;
                }
                tx.write_u64(root, COUNT, c + 1)?;
                tx.write_u64(root, TWICE, 2 * (c + 1))
            }),
        };
        match r {
            Ok(()) | Err(PoolError::OutOfSpace { .. }) => {}
            Err(e) => panic!("child: {e}"),
        }
        if !ready {
            // The parent starts its random wait only now: a slow start (an emulated
            // guest) must not turn a round into a kill before any work.
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "{READY}")
                .and_then(|()| out.flush())
                .expect("child stdout");
            ready = true;
        }
    }
}

#[test]
fn process_kill_recovers() {
    let dir = common::pool_dir();
    let path = dir.path().join("pool");
    let pool = Pool::create(&path, 8 << 20, LAYOUT).expect("create");
    pool.root(ROOT_SIZE).expect("root");
    drop(pool);
    let exe = std::env::current_exe().expect("test binary");
    let mut rng = 42u64;
    for round in 0..6 {
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
            "round {round}: the child ended before its first operation"
        );
        std::thread::sleep(Duration::from_millis(150 + next(&mut rng) % 250));
        child.kill().expect("SIGKILL");
        child.wait().expect("reap");
        let pool = Pool::open(&path, LAYOUT).expect("recovery");
        let report = pool
            .check()
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let root = pool.root(ROOT_SIZE).expect("root");
        let count = pool.read_u64(root, COUNT).expect("count");
        assert_eq!(pool.read_u64(root, TWICE).expect("twice"), 2 * count);
        let mut published = BTreeSet::new();
        for i in 0..SLOTS {
            let off = pool.read_u64(root, i * 8).expect("slot");
            if off != 0 {
                assert!(published.insert(off), "round {round}: shared object");
            }
        }
        let live: BTreeSet<u64> = pool
            .objects(None)
            .expect("objects")
            .iter()
            .map(|o| o.oid.offset())
            .collect();
        assert_eq!(live, published, "round {round}: leak or dangling handle");
        // The recovered pool persists on its medium's path (cache-line flushes on DAX).
        common::expect_dax_persists(&pool, || {
            pool.tx(|tx| {
                let c = pool.read_u64(root, COUNT)?;
                tx.write_u64(root, COUNT, c + 1)?;
                tx.write_u64(root, TWICE, 2 * (c + 1))
            })
        })
        .expect("a transaction after recovery");
        eprintln!(
            "round {round}: {} objects, {count} transactions committed so far",
            report.objects
        );
    }
}

//! C tests of the C ABI: compiles the programs in `tests/c/` against `include/*.h` and the
//! `libterrace.so` that this `cargo test` run built, runs each with a fresh scratch
//! directory on /dev/shm, and requires exit status 0 (printing the program's output
//! otherwise). One more test builds the memkind anchor benchmark
//! (`<workspace>/../shared/anchors/memkind_speed.c`) unchanged against Terrace's
//! `memkind.h` and checks its CSV output.
//!
//! Where the library is: `cargo test` builds this package's library with all its crate
//! types (cdylib and rlib) before the integration tests, into `<target>/<profile>/deps/`,
//! the directory of this test binary. Unlike `cargo build` it does not copy it up to
//! `<target>/<profile>/`, so a `libterrace.so` there may be stale; the copy next to this
//! binary is the one built from the current sources, and the only one used.
//!
//! Needs a C compiler as `cc` and a tmpfs on /dev/shm with room for the anchor benchmark
//! (it reserves 1 GiB of file blocks there at its peak).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{lib_dir, workspace};

/// A C program that runs longer than this is assumed hung (deadlock) and killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// Compiles one C file against the headers and libterrace.so into `out_dir`; panics with
/// the compiler's output if it fails (warnings are errors).
fn compile(source: &Path, out_dir: &Path) -> PathBuf {
    assert!(
        source.is_file(),
        "C source {} does not exist",
        source.display()
    );
    let include = workspace().join("include");
    let lib = lib_dir();
    let name = source
        .file_stem()
        .unwrap_or_else(|| panic!("{} has no file name", source.display()));
    let binary = out_dir.join(name);
    let mut cc = Command::new("cc");
    cc.args([
        "-std=c11",
        "-O1",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-D_GNU_SOURCE",
    ])
    .arg(format!("-I{}", include.display()))
    .arg(source)
    .arg(format!("-L{}", lib.display()))
    .args(["-lterrace", "-lpthread"])
    .arg(format!("-Wl,-rpath,{}", lib.display()))
    // DT_RPATH rather than DT_RUNPATH: it also applies to libterrace.so's own lookups.
    .arg("-Wl,--disable-new-dtags")
    .arg("-o")
    .arg(&binary);
    let output = cc
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `cc`: {e}"));
    assert!(
        output.status.success(),
        "compiling {} failed ({}):\n{:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        source.display(),
        output.status,
        cc,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    binary
}

/// A fresh scratch directory on /dev/shm (tmpfs), removed when dropped.
fn scratch_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("terrace-c-abi-")
        .tempdir_in("/dev/shm")
        .unwrap_or_else(|e| panic!("cannot create a scratch directory in /dev/shm: {e}"))
}

/// Runs `binary args…`, capturing its output; kills it after [`RUN_TIMEOUT`].
fn run(binary: &Path, args: &[std::ffi::OsString]) -> Output {
    let mut child = Command::new(binary)
        // cargo puts target/<profile> on LD_LIBRARY_PATH, which beats the binary's RUNPATH:
        // a libterrace.so left there by an earlier `cargo build` would be tested instead
        // of the one this run built.
        .env_remove("LD_LIBRARY_PATH")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    // Read both pipes on their own threads so a chatty program never blocks on a full pipe.
    let reader = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            bytes
        })
    };
    let stdout = reader(Box::new(child.stdout.take().expect("stdout is piped")));
    let stderr = reader(Box::new(child.stderr.take().expect("stderr is piped")));
    let started = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() > RUN_TIMEOUT => {
                let _ = child.kill();
                let status = child.wait().expect("cannot reap the killed program");
                eprintln!(
                    "{} did not finish within {RUN_TIMEOUT:?} and was killed",
                    binary.display()
                );
                break status;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("cannot wait for {}: {e}", binary.display()),
        }
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout reader panicked"),
        stderr: stderr.join().expect("stderr reader panicked"),
    }
}

/// Compiles `source`, runs it with a fresh /dev/shm scratch directory as its only
/// argument, requires success and returns its standard output.
fn compile_and_run(source: &Path) -> String {
    compile_and_run_with(source, |scratch| vec![scratch.into()])
}

/// As [`compile_and_run`], with the arguments made from the scratch directory by `args`.
fn compile_and_run_with(
    source: &Path,
    args: impl FnOnce(&Path) -> Vec<std::ffi::OsString>,
) -> String {
    let build =
        tempfile::tempdir().unwrap_or_else(|e| panic!("cannot create a build directory: {e}"));
    let binary = compile(source, build.path());
    let scratch = scratch_dir();
    let output = run(&binary, &args(scratch.path()));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} failed ({})\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        source.display(),
        output.status
    );
    // Shown with --nocapture: the programs report a few measurements on stderr.
    eprint!("{stderr}");
    stdout
}

fn c_test(name: &str) -> String {
    compile_and_run(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/c")
            .join(name),
    )
}

/// memkind.h: allocation functions, kind detection, error codes and messages, bad input,
/// statistics, configurations, destroyed handles.
#[test]
fn memkind_api() {
    let out = c_test("memkind_api.c");
    assert!(out.contains("memkind_api: ok"), "unexpected output: {out}");
}

/// terrace.h: kept and temporary file kinds, ordered and round-robin unified kinds,
/// realloc across kinds, NUMA kinds, statistics and the error conventions.
#[test]
fn terrace_api() {
    let out = c_test("terrace_api.c");
    assert!(out.contains("terrace_api: ok"), "unexpected output: {out}");
}

/// memkind's NUMA kinds, checked page by page against the kernel's placement; on a machine
/// with a CPU-less node (the guest of `tests/vm/run`, which sets
/// `TERRACE_EXPECT_CPU_LESS_NODE` to its number) `MEMKIND_DAX_KMEM` must land there.
#[test]
fn numa_kinds() {
    let out = c_test("numa_kinds.c");
    assert!(out.contains("numa_kinds: ok"), "unexpected output: {out}");
    if let Ok(node) = std::env::var("TERRACE_EXPECT_CPU_LESS_NODE") {
        assert!(
            out.contains(&format!("DAX_KMEM on node {node}\n")),
            "MEMKIND_DAX_KMEM is not on node {node}: {out}"
        );
    }
}

/// Four threads sharing a file kind and the default kind, freeing each other's objects.
#[test]
fn threads() {
    let out = c_test("threads.c");
    assert!(out.contains("threads: ok"), "unexpected output: {out}");
}

/// The memkind anchor benchmark builds unchanged against Terrace's memkind.h and runs:
/// a CSV header and one row per (size, kind) — pmem then dram for each of 5 sizes — with
/// positive object counts and timings.
#[test]
fn memkind_speed_anchor() {
    let anchor = workspace().join("../shared/anchors/memkind_speed.c");
    assert!(
        anchor.is_file(),
        "the memkind anchor benchmark is missing: looked for {}",
        anchor.display()
    );
    let out = compile_and_run(&anchor);
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.first().copied(),
        Some("kind,size,objects,malloc_ns,free_detect_ns"),
        "unexpected header in:\n{out}"
    );
    let rows = &lines[1..];
    assert_eq!(rows.len(), 10, "expected 10 CSV rows in:\n{out}");
    let sizes = [64u64, 512, 4096, 65536, 1048576];
    for (i, row) in rows.iter().enumerate() {
        let fields: Vec<&str> = row.split(',').collect();
        assert_eq!(fields.len(), 5, "row {row:?} does not have 5 fields");
        let kind = if i % 2 == 0 { "pmem" } else { "dram" };
        assert_eq!(fields[0], kind, "row {row:?}: expected kind {kind}");
        let size: u64 = fields[1]
            .parse()
            .unwrap_or_else(|e| panic!("row {row:?}: size is not a number: {e}"));
        assert_eq!(size, sizes[i / 2], "row {row:?}: unexpected size");
        for field in &fields[2..] {
            let value: f64 = field
                .parse()
                .unwrap_or_else(|e| panic!("row {row:?}: {field:?} is not a number: {e}"));
            assert!(
                value.is_finite() && value > 0.0,
                "row {row:?}: {field:?} is not a positive number"
            );
        }
        // The benchmark asks for 1 GiB per size (at most 4M objects); fewer means a
        // kind ran out of room.
        let wanted = ((1u64 << 30) / size).min(4_000_000);
        let objects: u64 = fields[2]
            .parse()
            .unwrap_or_else(|e| panic!("row {row:?}: objects is not an integer: {e}"));
        assert_eq!(objects, wanted, "row {row:?}: allocation stopped early");
    }
}

/// The libpmemobj-compatible API: pools, root, atomic allocation with publishing,
/// iteration, persistence helpers, function-level transactions, and bad input.
#[test]
fn pmemobj_api() {
    let out = c_test("pmemobj_api.c");
    assert!(out.contains("pmemobj_api: ok"), "unexpected output: {out}");
}

/// Custom allocation classes through pmemobj_ctl_set/get, pmemobj_xalloc and
/// pmemobj_tx_xalloc: registered, used, refused on bad input, and still there (with their
/// objects) after the pool is closed and reopened.
#[test]
fn pmemobj_classes() {
    let out = c_test("pmemobj_classes.c");
    assert!(
        out.contains("pmemobj_classes: ok"),
        "unexpected output: {out}"
    );
}

/// terrace_pool.h, the native pool API: root, allocation published into destinations in
/// and out of the pool, transactions that abort and commit, iteration by type, realloc,
/// custom classes, statistics, reopening (everything survived), check, and error paths
/// (missing file, wrong layout, double free).
#[test]
fn terrace_pool_api() {
    let out = c_test("terrace_pool_api.c");
    assert!(
        out.contains("terrace_pool_api: ok"),
        "unexpected output: {out}"
    );
}

/// Transactions by handle (terrace_pool_txn_*): commit and abort of stores, allocations
/// and frees, a failed operation aborting with its errno, NOWAIT's EAGAIN and close's EBUSY
/// while lanes are held, a transaction begun on one thread and committed on another, NULL
/// arguments, and reopening.
#[test]
fn terrace_pool_txn() {
    let out = c_test("terrace_pool_txn.c");
    assert!(
        out.contains("terrace_pool_txn: ok"),
        "unexpected output: {out}"
    );
}

/// terrace_collections.h: ordered maps (put, get with truncation, replace, remove,
/// length, cursors with every bound flag in both directions, out-of-line values), reopen,
/// EBUSY rules, named objects, destroy, bad arguments, readers during writes; arrays
/// (runs and words against a model, reopening, EBUSY, destroy).
#[test]
fn terrace_collections() {
    let out = c_test("terrace_collections.c");
    assert!(
        out.contains("terrace_collections: ok"),
        "unexpected output: {out}"
    );
}

/// terrace_cache.h, the tiered cache: every function with its errors and bad input, TTLs,
/// pinned guards (zero-copy, stable under overwrite, close refused with EBUSY while one
/// is out), two threads getting and setting at once, statistics, and a warm restart of a
/// DRAM + file cache (close, reopen the same directory: every item back).
#[test]
fn cache() {
    let out = c_test("cache.c");
    assert!(out.contains("cache: ok"), "unexpected output: {out}");
}

/// Parses an anchor's CSV output: the header, then rows of numbers.
fn csv_rows(out: &str, header: &str) -> Vec<Vec<f64>> {
    let mut lines = out
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with("single-thread"));
    assert_eq!(lines.next(), Some(header), "unexpected header in:\n{out}");
    lines
        .map(|row| {
            row.split(',')
                .map(|f| {
                    f.parse()
                        .unwrap_or_else(|e| panic!("{row:?}: {f:?} is not a number: {e}"))
                })
                .collect()
        })
        .collect()
}

fn anchor(name: &str) -> std::path::PathBuf {
    let path = workspace().join("../shared/anchors").join(name);
    assert!(
        path.is_file(),
        "the anchor {name} is missing: looked for {}",
        path.display()
    );
    path
}

/// PMDK's utilization anchor, unchanged, on a 256 MiB pool (its default is 1 GiB; smaller
/// pools leave too few 2 MiB slots for 97%): it must run to completion and fill at least
/// 97% of the pool at every object size (space, not speed: speed is measured by
/// bench/pool-vs-pmemobj.sh).
#[test]
fn pmemobj_util_anchor() {
    let out = compile_and_run_with(&anchor("pmemobj_util.c"), |scratch| {
        vec![
            scratch.join("util.pool").into(),
            (256u64 << 20).to_string().into(),
        ]
    });
    let rows = csv_rows(&out, "size,objects,utilization_pct,alloc_ns,free_ns");
    let sizes = [
        64.0, 512.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 2097152.0,
    ];
    assert_eq!(rows.len(), sizes.len(), "one row per size in:\n{out}");
    for (row, size) in rows.iter().zip(sizes) {
        assert_eq!(row[0], size);
        assert!(
            row[2] >= 97.0,
            "utilization {}% at {size} B (want >= 97%):\n{out}",
            row[2]
        );
    }
}

/// PMDK's multi-threaded anchor, unchanged: 4 threads fill a 64 MiB pool with 4-64 KiB
/// objects; the pool must end at least 97% full.
#[test]
fn pmemobj_mt_anchor() {
    let out = compile_and_run_with(&anchor("pmemobj_mt.c"), |scratch| {
        vec![
            scratch.join("mt.pool").into(),
            (64u64 << 20).to_string().into(),
            "4".into(),
        ]
    });
    let rows = csv_rows(&out, "threads,objects,utilization_pct,allocs_per_s");
    assert_eq!(rows.len(), 1, "one result row in:\n{out}");
    assert_eq!(rows[0][0], 4.0);
    assert!(
        rows[0][2] >= 97.0,
        "utilization {}% with 4 threads:\n{out}",
        rows[0][2]
    );
}

//! Runs the binary for each engine with tiny parameters and checks its JSON.

use std::process::Command;

use serde_json::Value;

const FIELDS: [&str; 16] = [
    "engine",
    "tiers",
    "threads",
    "ops",
    "seconds",
    "ops_per_sec",
    "hit_ratio",
    "get_p50_ns",
    "get_p99_ns",
    "get_p999_ns",
    "set_p50_ns",
    "set_p99_ns",
    "set_p999_ns",
    "peak_rss_bytes",
    "items",
    "metadata_bytes_per_item",
];

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_terrace-bench"))
        .args(args)
        .output()
        .expect("run terrace-bench")
}

fn run_json(engine: &str, capacity: &str, extra: &[&str]) -> Value {
    let mut args = vec![
        "cache",
        "--engine",
        engine,
        "--capacity",
        capacity,
        "--keys",
        "1000",
        "--zipf",
        "0.99",
        "--value-size",
        "64-4096",
        "--ops",
        "20000",
        "--threads",
        "2",
        "--get-ratio",
        "0.9",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = bench(&args);
    let stdout = String::from_utf8(out.stdout).expect("utf-8 stdout");
    assert!(
        out.status.success(),
        "{engine} {extra:?} failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Exactly one JSON object, nothing else, on stdout.
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    let v: Value = serde_json::from_str(&stdout).expect("stdout is one JSON object");
    for f in FIELDS {
        assert!(v.get(f).is_some(), "{engine}: field {f} missing in {v}");
    }
    assert_eq!(v["engine"], engine);
    assert_eq!(v["threads"], 2);
    assert_eq!(v["ops"], 20000);
    assert_eq!(v["wrong_values"], 0);
    let hit = v["hit_ratio"].as_f64().expect("hit_ratio is a number");
    assert!(hit > 0.0 && hit <= 1.0, "{engine}: hit_ratio {hit}");
    assert!(v["ops_per_sec"].as_f64().unwrap() > 0.0);
    for f in [
        "get_p50_ns",
        "get_p99_ns",
        "get_p999_ns",
        "set_p50_ns",
        "set_p99_ns",
        "set_p999_ns",
    ] {
        assert!(v[f].as_u64().unwrap() > 0, "{engine}: {f}");
    }
    assert!(v["get_p50_ns"].as_u64() <= v["get_p999_ns"].as_u64());
    assert!(v["peak_rss_bytes"].as_u64().unwrap() > 0);
    assert!(v["items"].as_u64().unwrap() > 0);
    v
}

#[test]
fn terrace_dram() {
    let v = run_json("terrace", "16MiB", &[]);
    assert_eq!(v["tiers"], "dram:1");
    assert!(v["metadata_bytes_per_item"].as_f64().unwrap() > 0.0);
}

#[test]
fn terrace_dram_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let v = run_json(
        "terrace",
        "64MiB",
        &["--tiers", "dram:1,file:3", "--dir", d],
    );
    assert_eq!(v["tiers"], "dram:1,file:3");
    // The run's own subdirectory is removed at exit; DIR itself is kept.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn windows_split_the_gets_and_end_at_the_run() {
    let v = run_json("terrace", "16MiB", &["--window", "5k"]);
    let windows = v["windows"].as_array().expect("windows is an array");
    assert!(windows.len() >= 2, "{v}");
    assert_eq!(windows.last().unwrap()["ops"], 20000);
    let gets: u64 = windows.iter().map(|w| w["gets"].as_u64().unwrap()).sum();
    assert_eq!(gets, v["gets"].as_u64().unwrap());
    for w in windows {
        let r = w["hit_ratio"].as_f64().expect("every window has gets");
        assert!((0.0..=1.0).contains(&r), "{w}");
    }
    // Without --window, no windows.
    assert!(run_json("foyer", "16MiB", &[]).get("windows").is_none());
}

#[test]
fn a_clean_restart_brings_back_every_key_with_its_value() {
    let v = run_json(
        "terrace",
        "64MiB",
        &["--tiers", "dram:1,file:3", "--restart"],
    );
    let r = &v["restart"];
    assert!(r["keys_present_before"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["missing_after"], 0, "{r}");
    assert_eq!(r["wrong_after"], 0, "{r}");
}

#[test]
fn moka() {
    let v = run_json("moka", "16MiB", &[]);
    assert!(v["metadata_bytes_per_item"].is_null());
    assert_eq!(v["engine_stats"]["policy"], "TinyLFU");
    let v = run_json("moka", "16MiB", &["--moka-policy", "lru"]);
    assert_eq!(v["engine_stats"]["policy"], "LRU");
}

#[test]
fn foyer() {
    let v = run_json("foyer", "16MiB", &[]);
    assert!(v["metadata_bytes_per_item"].is_null());
    assert_eq!(v["engine_stats"]["policy"], "S3-FIFO");
    for (arg, name) in [
        ("lfu", "W-TinyLFU"),
        ("lru", "LRU"),
        ("sieve", "SIEVE"),
        ("fifo", "FIFO"),
    ] {
        let v = run_json("foyer", "16MiB", &["--foyer-policy", arg]);
        assert_eq!(v["engine_stats"]["policy"], name);
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    // Each case: engine, capacity, keys, then the rest of the command line (10 ops).
    let cases: [(&str, &str, &str, &[&str]); 10] = [
        ("terrace", "12XB", "10", &[]),
        ("redis", "1MiB", "10", &[]),
        ("moka", "1MiB", "0", &[]),
        ("moka", "1MiB", "10", &["--value-size", "9-3"]),
        ("moka", "1MiB", "10", &["--get-ratio", "2"]),
        ("terrace", "16MiB", "10", &["--tiers", "ssd:1"]),
        ("terrace", "0", "10", &[]),
        (
            "terrace",
            "64MiB",
            "10",
            &[
                "--tiers",
                "dram:1,file:1",
                "--dir",
                "/nonexistent/terrace-bench",
            ],
        ),
        // --restart needs Terrace with a file tier.
        ("foyer", "16MiB", "10", &["--restart"]),
        ("terrace", "16MiB", "10", &["--restart"]),
    ];
    for (engine, capacity, keys, rest) in cases {
        let mut args = vec![
            "cache",
            "--engine",
            engine,
            "--capacity",
            capacity,
            "--keys",
            keys,
            "--ops",
            "10",
        ];
        args.extend_from_slice(rest);
        let out = bench(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
        assert!(!err.is_empty(), "{args:?}: no error message");
    }
}

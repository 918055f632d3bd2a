//! `terrace serve` against libmemcached's protocol conformance tool, memccapable (Debian
//! package libmemcached-tools): the ascii protocol and the binary protocol each on a
//! fresh server, every test memccapable has must pass. memccapable only speaks TCP
//! (`-h HOST -p PORT`, no UNIX socket option), so the UNIX listener is covered by
//! `serve_protocol.rs` instead.
//!
//! Skipped with a loud message when memccapable is not installed, unless
//! TERRACE_REQUIRE_TOOLS=1 (CI), which makes a missing tool a failure.

mod common;

use std::process::Command;
use std::time::Duration;

/// Runs memccapable with `mode` (`-a` ascii only, `-b` binary only) against a fresh
/// server and asserts that every test passed.
fn memccapable(mode: &str) {
    let Some(tool) = common::require_tool("memccapable", "libmemcached-tools") else {
        return;
    };
    let dir = tempfile::tempdir().expect("creating a temporary directory");
    let server = common::start(dir.path(), &[]);
    let mut cmd = Command::new(&tool);
    cmd.args([
        "-h",
        "127.0.0.1",
        "-p",
        &server.port().to_string(),
        "-t",
        "10",
        mode,
    ]);
    let out = common::run_with_timeout(cmd, Duration::from_secs(120));
    let report = format!("{}\n{}", out.text(), server.log_text());
    assert!(
        out.success() && out.stdout.contains("All tests passed"),
        "memccapable {mode} failed against terrace serve:\n{report}"
    );
    // A test that "passed" without running would print nothing else.
    assert!(
        out.stdout.matches("[pass]").count() >= 10,
        "memccapable {mode} ran too few tests:\n{report}"
    );
}

#[test]
fn memccapable_ascii_protocol() {
    memccapable("-a");
}

#[test]
fn memccapable_binary_protocol() {
    memccapable("-b");
}

/// memcaslap (the load tool the benchmark uses) for two seconds with data verification:
/// every set must be stored (its keys carry control bytes, which memcached accepts),
/// every verified get must return what was set, and nothing may come back as an error.
#[test]
fn memcaslap_load_is_served_without_errors() {
    let Some(tool) = common::require_tool("memcaslap", "libmemcached-tools") else {
        return;
    };
    let dir = tempfile::tempdir().expect("creating a temporary directory");
    let server = common::start(dir.path(), &[]);
    let mut cmd = Command::new(&tool);
    cmd.args([
        "-s",
        &format!("127.0.0.1:{}", server.port()),
        "-T",
        "1",
        "-c",
        "4",
        "-t",
        "2s",
        "--verify=0.2",
    ]);
    let out = common::run_with_timeout(cmd, Duration::from_secs(60));
    let report = format!("{}\n{}", out.text(), server.log_text());
    assert!(out.success(), "memcaslap failed:\n{report}");
    assert!(
        !out.text().contains("ERROR") && !out.text().contains("verify failed"),
        "memcaslap saw errors:\n{report}"
    );
    let stats = server.stats();
    let number = |name: &str| -> u64 {
        stats
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("stat {name} missing:\n{report}"))
    };
    assert!(number("cmd_set") > 100, "too few sets:\n{report}");
    assert!(number("curr_items") > 100, "sets did not store:\n{report}");
    assert!(number("get_hits") > 100, "gets did not hit:\n{report}");
}

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

//! The library as other runtimes load it: `dlopen` after program start from C and from
//! Python (ctypes) with no environment variable, and the Java binding's own test suite
//! (`bindings/java`, Maven) run against the `libterrace.so` this `cargo test` built.
//!
//! Where the library is: the directory of this test binary (`<target>/<profile>/deps/`),
//! as in `c_abi.rs`, whose module docs say why.
//!
//! Tools: `cc`, `python3`, and for the Java suite a JDK >= 22 (`JAVA_HOME` if it is one,
//! else the newest under /usr/lib/jvm) and Maven (`mvn`, which fetches its plugins from
//! Maven Central on a fresh machine). A missing tool skips its test with a message, unless
//! `TERRACE_REQUIRE_TOOLS=1` (CI), which makes it a failure.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

mod common;
use common::{lib_dir, workspace};

/// The `libterrace.so` built by this `cargo test` run, next to this test binary.
fn library() -> PathBuf {
    lib_dir().join("libterrace.so")
}

/// True when a missing tool must fail the test rather than skip it.
fn tools_required() -> bool {
    std::env::var("TERRACE_REQUIRE_TOOLS").as_deref() == Ok("1")
}

/// Skips (returns false) or fails when `tool` is missing, per [`tools_required`].
fn have(tool: &str, why: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            !tools_required(),
            "{tool} is required ({why}) but not installed"
        );
        eprintln!("skipped: {tool} is not installed ({why})");
    }
    found
}

/// Runs `command`, requiring success; returns its standard output.
fn run_ok(command: &mut Command) -> String {
    let output = command
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD")
        .env_remove("GLIBC_TUNABLES")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{command:?} failed ({})\n--- stdout ---\n{stdout}\n--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A C program that links nothing of Terrace dlopens the library, allocates and frees.
#[test]
fn c_dlopens_the_library_with_no_environment() {
    if !have("cc", "compiles the dlopen test") {
        return;
    }
    let build = tempfile::tempdir().expect("cannot create a build directory");
    let binary = build.path().join("dlopen");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/dlopen.c");
    run_ok(
        Command::new("cc")
            .args(["-std=c11", "-O1", "-Wall", "-Wextra", "-Werror"])
            .arg("-D_GNU_SOURCE")
            .arg(&source)
            .arg("-ldl")
            .arg("-o")
            .arg(&binary),
    );
    let out = run_ok(Command::new(&binary).arg(library()));
    assert!(out.contains("dlopen: ok"), "unexpected output: {out}");
}

/// The library asks for no static TLS block (`DF_STATIC_TLS`, which initial-exec TLS
/// models set): a process can only dlopen such a library while glibc's small surplus of
/// static TLS lasts, which a JVM or Python has used up.
#[test]
fn the_library_needs_no_static_tls() {
    if !have("readelf", "reads the library's dynamic section") {
        return;
    }
    let dynamic = run_ok(Command::new("readelf").arg("--dynamic").arg(library()));
    let flags: Vec<&str> = dynamic.lines().filter(|l| l.contains("(FLAGS)")).collect();
    assert!(
        flags.iter().all(|l| !l.contains("STATIC_TLS")),
        "libterrace.so is marked STATIC_TLS (an initial-exec TLS model crept back in): {flags:?}"
    );
}

/// Python's ctypes loads the library and allocates through it.
#[test]
fn python_ctypes_loads_the_library_with_no_environment() {
    if !have("python3", "loads the library with ctypes") {
        return;
    }
    let script = r#"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.terrace_kind_default.restype = ctypes.c_void_p
lib.terrace_malloc.restype = ctypes.c_void_p
lib.terrace_malloc.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
lib.terrace_free.argtypes = [ctypes.c_void_p]
p = lib.terrace_malloc(lib.terrace_kind_default(), 4096)
assert p, "terrace_malloc returned NULL"
ctypes.memset(p, 0x5A, 4096)
lib.terrace_free(p)
print("ctypes: ok")
"#;
    let out = run_ok(Command::new("python3").arg("-c").arg(script).arg(library()));
    assert!(out.contains("ctypes: ok"), "unexpected output: {out}");
}

/// The JDK used for the Java binding: `JAVA_HOME` when it is a JDK >= 22, else the
/// newest JDK >= 22 under /usr/lib/jvm. None if there is none.
fn jdk_22_or_newer() -> Option<PathBuf> {
    fn major(jdk: &Path) -> Option<u32> {
        // Every JDK since 9 has a `release` file with JAVA_VERSION="25.0.3" (or "1.8.0_x").
        let release = std::fs::read_to_string(jdk.join("release")).ok()?;
        let line = release
            .lines()
            .find_map(|l| l.strip_prefix("JAVA_VERSION="))?;
        let version = line.trim_matches('"');
        version.split(['.', '-', '+']).next()?.parse().ok()
    }
    let usable = |jdk: &Path| major(jdk).filter(|&m| m >= 22 && jdk.join("bin/javac").is_file());
    if let Some(home) = std::env::var_os("JAVA_HOME").map(PathBuf::from) {
        if usable(&home).is_some() {
            return Some(home);
        }
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/jvm")
        .ok()?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter_map(|path| usable(&path).map(|m| (m, path)))
        .collect();
    found.sort();
    found.pop().map(|(_, path)| path)
}

/// `bindings/java`'s JUnit suite (kinds, pool, cache, the JVM kill test) against this run's
/// library: `mvn verify` with the library directory and Maven's build directory passed in.
#[test]
fn java_binding_tests_pass() {
    let Some(jdk) = jdk_22_or_newer() else {
        assert!(
            !tools_required(),
            "the Java binding needs a JDK >= 22: none in JAVA_HOME nor under /usr/lib/jvm \
             (install a Temurin JDK there)"
        );
        eprintln!("skipped: no JDK >= 22 in JAVA_HOME or under /usr/lib/jvm");
        return;
    };
    if !have("mvn", "builds and tests the Java binding") {
        return;
    }
    let lib = library();
    let lib_dir = lib.parent().expect("the library has a directory");
    // Maven's output goes under cargo's target directory, beside this test binary's profile.
    let build_dir = lib_dir
        .parent()
        .expect("deps/ has a parent")
        .join("java-binding");
    let out = run_ok(
        Command::new("mvn")
            .current_dir(workspace().join("bindings/java"))
            .env("JAVA_HOME", &jdk)
            .args(["-B", "--no-transfer-progress", "verify"])
            .arg(format!("-Dterrace.lib.dir={}", lib_dir.display()))
            .arg(format!("-Dterrace.build.dir={}", build_dir.display())),
    );
    let summary: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("Tests run:") && !l.contains(" -- in "))
        .collect();
    eprintln!("{}", summary.join("\n"));
    let last = summary
        .last()
        .unwrap_or_else(|| panic!("no surefire summary in:\n{out}"));
    assert!(
        last.contains("Failures: 0, Errors: 0") && out.contains("BUILD SUCCESS"),
        "the Java suite did not pass:\n{out}"
    );
}

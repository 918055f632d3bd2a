//! The `terrace` command as a user runs it: pool create/info/check/stats, and `check`
//! naming injected corruption with a non-zero exit; `check` on collections (an
//! unreachable node found and swept, a corrupt node named); `info` on a directory;
//! `serve-volume` with a mode per volume.

mod common;

use std::os::unix::fs::FileExt;
use std::process::{Command, Output};

fn terrace(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_terrace"))
        .args(args)
        .output()
        .expect("cannot run the terrace binary")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn corrupt(path: &std::path::Path, offset: u64, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

#[test]
fn pool_commands_and_check_finding_corruption() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("cli.pool");
    let p = path.to_str().unwrap();
    let out = terrace(&[
        "pool", "create", p, "--size", "16777216", "--layout", "demo",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = terrace(&["pool", "create", p]);
    assert!(
        !out.status.success(),
        "creating over an existing pool must fail"
    );

    let out = terrace(&["pool", "info", p]);
    assert!(out.status.success(), "{}", text(&out));
    let info = text(&out);
    assert!(
        info.contains("\"demo\"") && info.contains("16 MiB"),
        "{info}"
    );
    let out = terrace(&["pool", "stats", p, "--layout", "demo"]);
    assert!(out.status.success(), "{}", text(&out));
    let out = terrace(&["pool", "check", p, "--layout", "demo"]);
    assert!(
        out.status.success() && text(&out).contains("consistent"),
        "{}",
        text(&out)
    );
    let out = terrace(&["pool", "check", p, "--layout", "other"]);
    assert!(!out.status.success(), "a layout mismatch is an error");

    // Page descriptor 5: reserved bits set. The descriptors start at the offset `info`
    // prints; each is 32 bytes.
    let meta: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("descriptors at offset "))
        .and_then(|v| v.trim().parse().ok())
        .expect("info prints the descriptors' offset");
    corrupt(&path, meta + 32 * 5, &[7; 8]);
    let out = terrace(&["pool", "check", p]);
    assert!(!out.status.success());
    let report = text(&out);
    assert!(
        report.contains("page 5") && report.contains("offset"),
        "{report}"
    );

    // A damaged header is named too.
    corrupt(&path, 20, b"XXXX");
    let out = terrace(&["pool", "check", p]);
    assert!(!out.status.success());
    assert!(text(&out).contains("checksum"), "{}", text(&out));

    // Not a pool at all.
    let foreign = dir.path().join("foreign");
    std::fs::write(&foreign, vec![1u8; 1 << 20]).unwrap();
    let out = terrace(&["pool", "check", foreign.to_str().unwrap()]);
    assert!(!out.status.success());
    let out = terrace(&["pool", "info", "/nonexistent/pool"]);
    assert!(!out.status.success());
}

#[test]
fn pool_check_finds_unreachable_and_corrupt_collection_nodes() {
    use terrace_collections::layout::{H_ROOT, LEAF_BITMAP, TYPE_LEAF};
    use terrace_collections::{Collections, MapOptions};
    use terrace_pool::{Backend, HandleAt, Pool};

    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = dir.path().join("coll.pool");
    let p = path.to_str().unwrap();
    let (stray, slot) = {
        let pool = Pool::create(&path, 16 << 20, "coll").unwrap();
        let colls = Collections::open(&pool).unwrap();
        let map = colls
            .ordered_map("index", MapOptions::create(16, 8))
            .unwrap();
        for i in 0..500u64 {
            map.put(&i.to_be_bytes(), &i.to_le_bytes()).unwrap();
        }
        // A leaf no name reaches, as a crash inside `destroy` leaves one.
        let stray = pool
            .zalloc(map.geometry().leaf_size(), TYPE_LEAF, HandleAt::None)
            .unwrap();
        // The first live slot of the map's leftmost leaf (the root is an inner node).
        let root = pool
            .backend()
            .load_u64(map.header().offset() + H_ROOT)
            .unwrap();
        let leaf = pool
            .backend()
            .load_u64(root + map.geometry().child_off(0))
            .unwrap();
        let bitmap = pool.backend().load_u64(leaf + LEAF_BITMAP).unwrap();
        (
            stray,
            leaf + map.geometry().slot_off(bitmap.trailing_zeros()),
        )
    };
    let out = terrace(&["pool", "check", p]);
    let report = text(&out);
    assert!(!out.status.success(), "{report}");
    assert!(
        report.contains(&format!("unreachable: {:#x}", stray.offset()))
            && report.contains("1 names, 1 maps (500 entries"),
        "{report}"
    );
    let out = terrace(&["pool", "check", p, "--sweep"]);
    assert!(
        out.status.success() && text(&out).contains("freed 1"),
        "{}",
        text(&out)
    );
    let out = terrace(&["pool", "check", p]);
    assert!(out.status.success(), "{}", text(&out));

    // A key length past the map's maximum in a live slot.
    corrupt(&path, slot, &[99]);
    let out = terrace(&["pool", "check", p]);
    let report = text(&out);
    assert!(!out.status.success(), "{report}");
    assert!(
        report.contains("collections inconsistent")
            && report.contains(&format!("offset {slot:#x}"))
            && report.contains("key of 99 bytes"),
        "{report}"
    );
}

#[test]
fn info_probes_a_directory() {
    let out = terrace(&["info", "--dir", "/dev/shm"]);
    assert!(out.status.success(), "{}", text(&out));
    let report = text(&out);
    assert!(
        report.contains("node 0") && report.contains("durability Process"),
        "{report}"
    );
    let out = terrace(&["info", "--dir", "/nonexistent/dir"]);
    assert!(!out.status.success());
}

/// `serve-volume --volume-replication` is refused, with the reason, for no such volume,
/// for settings that do not parse, and for copies the node has no peers for; under
/// `--etcd` a backend with no writer lock is refused unless `--unfenced-backends`.
#[test]
fn serve_volume_refuses_replication_settings_it_cannot_apply() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("a.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let volume = format!("a=file:{}", img.display());
    // Each must be refused at start: a server that serves instead is killed after 20 s.
    let refused = |args: &[&str]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_terrace"));
        cmd.args(args);
        common::run_with_timeout(cmd, std::time::Duration::from_secs(20))
    };
    for (settings, why) in [
        ("c=replicas=1", "no volume named \"c\""),
        ("a=copies=2", "expected replicas, ack-level or min-replicas"),
        (
            "a=replicas=2",
            "replicas=2 for a volume of a node with no replica peer",
        ),
        ("a=ack-level=one", "for a volume that is not replicated"),
    ] {
        let out = refused(&[
            "serve-volume",
            "--volume",
            &volume,
            "--volume-replication",
            settings,
            "--dir",
            dir.path().to_str().unwrap(),
        ]);
        assert!(
            !out.success() && out.text().contains(why),
            "{settings}: {}",
            out.text()
        );
    }
    // Under a coordinator, a backend no lock fences is served only when accepted (the
    // refusal comes before any etcd connection: none listens here).
    let coordinated = [
        "serve-volume",
        "--volume",
        "s=s3://bucket/v?size=4MiB&endpoint=http://127.0.0.1:9",
        "--etcd",
        "http://127.0.0.1:9",
        "--node",
        "n1",
        "--replica-listen",
        "127.0.0.1:0",
        "--dir",
        dir.path().to_str().unwrap(),
    ];
    let out = refused(&coordinated);
    assert!(
        !out.success()
            && out
                .text()
                .contains("volume \"s\": its backend (S3) has no writer lock")
            && out.text().contains("--unfenced-backends"),
        "{}",
        out.text()
    );
    let out = refused(&["serve-volume", "--volume", &volume, "--unfenced-backends"]);
    assert!(
        !out.success() && out.text().contains("--etcd"),
        "{}",
        out.text()
    );
}

/// `serve-volume --volume-mode NAME=MODE` gives one volume its own mode (the others keep
/// --mode), `terrace volume status` shows each, and a mode for no such volume is refused.
#[test]
fn serve_volume_takes_a_mode_per_volume() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b"] {
        std::fs::File::create(dir.path().join(format!("{name}.img")))
            .unwrap()
            .set_len(4 << 20)
            .unwrap();
    }
    let volume = |name: &str| {
        format!(
            "{name}=file:{}",
            dir.path().join(format!("{name}.img")).display()
        )
    };
    let control = dir.path().join("control.sock");
    let out = terrace(&[
        "serve-volume",
        "--volume",
        &volume("a"),
        "--volume-mode",
        "c=write-back",
        "--dir",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        !out.status.success() && text(&out).contains("no volume named \"c\""),
        "{}",
        text(&out)
    );

    let mut server = Command::new(env!("CARGO_BIN_EXE_terrace"))
        .args([
            "serve-volume",
            "--tiers",
            "dram:32MiB",
            "--log-size",
            "8MiB",
            "--mode",
            "write-back",
        ])
        .args(["--volume", &volume("a"), "--volume", &volume("b")])
        .args(["--volume-mode", "b=storage", "--dir"])
        .arg(dir.path())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&control).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "serve-volume did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let control = control.to_str().unwrap();
    let a = text(&terrace(&["volume", "status", "--control", control, "a"]));
    let b = text(&terrace(&["volume", "status", "--control", control, "b"]));
    let _ = server.kill();
    let _ = server.wait();
    assert!(a.contains("mode write-back"), "{a}");
    assert!(b.contains("mode storage"), "{b}");
}

//! Limits every kind honours: a full file system is an allocation failure (never
//! SIGBUS), a file system too full for a kind's first chunk fails its creation, and 1,000
//! file kinds work at once.
//!
//! The full-file-system tests mount a small tmpfs, which needs root. CI runs them as root
//! and sets TERRACE_REQUIRE_MOUNT=1, so there they cannot be skipped silently; elsewhere
//! they report that they were skipped.

use std::path::Path;
use std::process::Command;

use terrace_kinds::{detect_kind, free, FileKindOptions, Kind, KindError};

/// A tmpfs of `size` mounted on a fresh directory, unmounted on drop.
struct SmallFs {
    dir: tempfile::TempDir,
}

impl SmallFs {
    fn mount(size: &str) -> Option<SmallFs> {
        let dir = tempfile::tempdir().expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "terrace-test"])
            .arg(dir.path())
            .status();
        match status {
            Ok(s) if s.success() => Some(SmallFs { dir }),
            _ => {
                assert!(
                    std::env::var_os("TERRACE_REQUIRE_MOUNT").is_none(),
                    "TERRACE_REQUIRE_MOUNT is set but a tmpfs could not be mounted"
                );
                eprintln!("skipped: cannot mount a tmpfs (needs root)");
                None
            }
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn full_file_system_is_an_allocation_failure_not_sigbus() {
    let Some(fs) = SmallFs::mount("48m") else {
        return;
    };
    // The kind may grow to 256 MiB, the file system holds 48 MiB.
    let kind = Kind::create_file(&FileKindOptions::in_dir(fs.path(), 256 << 20)).unwrap();
    let mut blocks = Vec::new();
    let err = loop {
        match kind.malloc(1 << 20) {
            Ok(p) => {
                // Touch every page: a block handed out must be backed.
                // SAFETY: p is a live 1 MiB allocation.
                unsafe { p.as_ptr().write_bytes(0x5A, 1 << 20) };
                blocks.push(p);
            }
            Err(e) => break e,
        }
        assert!(blocks.len() < 100, "more memory than the file system holds");
    };
    assert!(matches!(err, KindError::OutOfMemory { .. }), "{err}");
    assert!(
        blocks.len() >= 30,
        "only {} MiB used of 48 MiB",
        blocks.len()
    );
    // Small allocations still fail cleanly or succeed; nothing crashes.
    let _ = kind.malloc(64);
    // Freeing makes room again.
    for p in blocks.drain(..) {
        // SAFETY: live, not used afterwards.
        unsafe { free(p.as_ptr()) };
    }
    let again = kind.malloc(1 << 20).expect("room after freeing");
    // SAFETY: live allocation.
    unsafe { again.as_ptr().write_bytes(1, 1 << 20) };
    kind.destroy().unwrap();
}

#[test]
fn file_system_too_full_for_the_first_chunk_fails_creation() {
    let Some(fs) = SmallFs::mount("8m") else {
        return;
    };
    // Leave about 1 MiB free: less than the first 2 MiB chunk of a 32 MiB kind.
    let filler = fs.path().join("filler");
    let file = std::fs::File::create(&filler).unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on an open descriptor.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, 7 << 20) };
    assert_eq!(rc, 0);
    let err = Kind::create_file(&FileKindOptions::in_dir(fs.path(), 32 << 20)).unwrap_err();
    assert!(
        matches!(
            err,
            KindError::Media(terrace_media::MediaError::NoSpace { .. })
        ),
        "{err}"
    );
    assert_eq!(err.errno(), libc::ENOSPC);
    drop(file);
    std::fs::remove_file(&filler).unwrap();
    // Room again: creation works.
    let kind = Kind::create_file(&FileKindOptions::in_dir(fs.path(), 32 << 20)).unwrap();
    kind.destroy().unwrap();
}

#[test]
fn a_thousand_file_kinds_at_once() {
    // On tmpfs: each kind reserves a 2 MiB lead, 2 GB in all (a disk-backed directory is
    // much slower: it writes the engine's metadata pages back).
    let dir = tempfile::tempdir_in("/dev/shm").unwrap();
    let kinds: Vec<Kind> = (0..1000)
        .map(|i| {
            Kind::create_file(&FileKindOptions::in_dir(dir.path(), 16 << 20))
                .unwrap_or_else(|e| panic!("kind {i}: {e}"))
        })
        .collect();
    let mut objects = Vec::new();
    for (i, &kind) in kinds.iter().enumerate() {
        for size in [64usize, 4096, 1 << 20] {
            let p = kind
                .malloc(size)
                .unwrap_or_else(|e| panic!("kind {i} size {size}: {e}"));
            // SAFETY: live allocation of `size` bytes.
            unsafe { p.as_ptr().write_bytes(i as u8, size) };
            objects.push((p, kind, i as u8, size));
        }
    }
    for &(p, kind, tag, size) in &objects {
        assert_eq!(detect_kind(p.as_ptr()), Some(kind));
        // SAFETY: live allocation of `size` bytes.
        let bytes = unsafe { std::slice::from_raw_parts(p.as_ptr(), size) };
        assert!(bytes.iter().all(|&b| b == tag));
    }
    for (p, ..) in objects {
        // SAFETY: live, not used afterwards.
        unsafe { free(p.as_ptr()) };
    }
    for kind in kinds {
        kind.destroy().unwrap();
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    // Slots are reused: another round fits too.
    let again: Vec<Kind> = (0..50)
        .map(|_| Kind::create_file(&FileKindOptions::in_dir(dir.path(), 16 << 20)).unwrap())
        .collect();
    for kind in again {
        kind.destroy().unwrap();
    }
}

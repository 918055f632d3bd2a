//! The boot mark: a small file (`terrace.boot`, beside the first file tier) naming the
//! system boot during which the cache last opened its tiers. A file tier on a disk-backed
//! file system is written through the page cache (`Region::persist_through_page_cache`):
//! every write survives a process crash, but after a power loss or an OS crash the disk
//! holds whatever pages the kernel happened to write back, in any order — items, commit
//! words and DEAD flips torn apart, so an overwritten or deleted value could come back.
//! Such a tier is therefore trusted after an unclean stop only within the same boot; a
//! clean shutdown flushes it (`Region::sync`) before it saves the index, which makes it
//! trustworthy across reboots.
//!
//! Format: the boot id's text (Linux's `/proc/sys/kernel/random/boot_id`), then
//! `crc32(text)` as 8 hex digits, on one line; written and synced at every open of a
//! cache with such a tier, before anything is written to the tiers.
//!
//! Invariant: when the mark names another boot than the current one and the stop before
//! was not clean, no segment of a page-cache tier written before this open is scanned.

use std::path::{Path, PathBuf};

use crate::error::CacheError;
use crate::synced::write_synced;

const FILE: &str = "terrace.boot";
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// The running system's boot id, if the kernel tells it.
pub fn current_boot_id() -> Option<String> {
    let id = std::fs::read_to_string(BOOT_ID).ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_string())
}

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// The boot id the mark in `dir` records; `None` when there is none, or it is unreadable
/// (a torn write: its checksum fails).
pub fn recorded(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path(dir)).ok()?;
    let (id, crc) = text.trim_end().rsplit_once(' ')?;
    (u32::from_str_radix(crc, 16).ok()? == crc32fast::hash(id.as_bytes())).then(|| id.to_string())
}

/// Records `boot_id` in `dir`'s mark, durably.
pub fn record(dir: &Path, boot_id: &str) -> Result<(), CacheError> {
    let path = path(dir);
    let line = format!("{boot_id} {:08x}\n", crc32fast::hash(boot_id.as_bytes()));
    write_synced(&path, line.as_bytes()).map_err(|source| CacheError::BootMark { path, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_boot_reads_back_and_a_torn_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(recorded(dir.path()), None);
        record(dir.path(), "boot-a").unwrap();
        assert_eq!(recorded(dir.path()).as_deref(), Some("boot-a"));
        record(dir.path(), "boot-b").unwrap();
        assert_eq!(recorded(dir.path()).as_deref(), Some("boot-b"));
        std::fs::write(path(dir.path()), "boot-b 0000\n").unwrap();
        assert_eq!(recorded(dir.path()), None);
        std::fs::write(path(dir.path()), "").unwrap();
        assert_eq!(recorded(dir.path()), None);
        assert!(current_boot_id().is_some_and(|id| id.len() >= 16));
    }
}

//! Small side files written whole and synced before they are relied on (the saved index,
//! the boot mark): truncate, write, `fsync`. A crash in between leaves a short or torn
//! file, which every reader detects by its checksum.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

/// Replaces `path`'s contents with `bytes`, durably.
pub fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

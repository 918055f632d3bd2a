//! Backends: the slow storage a volume caches, behind one trait ([`Backend`]) of byte-range
//! reads, writes, flushes and trims. The volume never knows which one it has.
//!
//! - [`FileBackend`]: a file or a block device, through `terrace-media`'s [`FlashFile`]
//!   (`O_DIRECT` where the file system allows it, `fdatasync` on flush).
//! - `NbdBackend` (`nbd/client.rs`): any NBD server — so every nbdkit plugin and filter
//!   (file, memory, `delay`, `error`, `pause`) is a backend.
//! - `S3Backend` (`s3.rs`): fixed-size chunk objects in an S3 bucket (AWS or any
//!   S3-compatible server).
//!
//! Contract: offsets and lengths handed to a backend are multiples of [`BLOCK_SIZE`] and
//! inside [`Backend::size`]; a write is durable only after a successful
//! [`Backend::flush`]; `trim` may discard, and a read of a trimmed range returns zeroes.

use std::io;
use std::path::{Path, PathBuf};

use parking_lot::RwLock;
use terrace_media::flash::{is_block_device, AlignedBuf, FlashFile};

/// The unit the volume caches, logs and writes back: 4 KiB.
pub const BLOCK_SIZE: usize = 4096;

/// Slow storage under a volume. Implementations are shared by many threads.
pub trait Backend: Send + Sync {
    /// Bytes the backend holds; the volume's size.
    fn size(&self) -> u64;
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Writes `data` at `offset` (durable after the next [`Backend::flush`]).
    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()>;
    /// Copies the backend as it is now (flushed; nothing writes meanwhile) to a snapshot
    /// named `tag`, durably, and says where it is. A backend that cannot says so
    /// (`Unsupported`); an existing snapshot of that name is refused (`AlreadyExists`).
    fn snapshot(&self, tag: &str) -> io::Result<String> {
        let _ = tag;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} cannot take snapshots", self.describe()),
        ))
    }
    /// Grows the backend to `new_size` bytes (a multiple of 4 KiB, more than now),
    /// durably: once it returns, a crash leaves the backend at least that large and the
    /// new bytes read as zeroes. A backend that cannot grow says so (`Unsupported`).
    fn grow(&self, new_size: u64) -> io::Result<()> {
        let _ = new_size;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("{} cannot grow", self.describe()),
        ))
    }
    /// Makes every completed write durable.
    fn flush(&self) -> io::Result<()>;
    /// Discards `len` bytes at `offset`; later reads of them return zeroes.
    fn trim(&self, offset: u64, len: u64) -> io::Result<()>;
    /// What the backend is, for logs and `status` ("file /path", "nbd unix:/sock").
    fn describe(&self) -> String;
}

/// A file or block device as a backend.
pub struct FileBackend {
    /// Replaced whole by [`Backend::grow`]; every I/O holds the read side.
    file: RwLock<FlashFile>,
    path: PathBuf,
}

impl FileBackend {
    /// Opens an existing file or block device; its size is the volume's.
    pub fn open(path: &Path) -> io::Result<FileBackend> {
        let size = match FlashFile::existing_size(path).map_err(io::Error::other)? {
            Some(size) if size > 0 => size,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{}: no such file, or empty", path.display()),
                ))
            }
        };
        if size % BLOCK_SIZE as u64 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: {size} bytes is not a multiple of {BLOCK_SIZE}",
                    path.display()
                ),
            ));
        }
        let file = FlashFile::open(path, size).map_err(io::Error::other)?;
        Ok(FileBackend {
            file: RwLock::new(file),
            path: path.to_path_buf(),
        })
    }

    /// Whether I/O bypasses the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.file.read().is_direct()
    }
}

/// The range check of a file backend: block-aligned and inside `file`.
fn check_file(file: &FlashFile, offset: u64, len: usize) -> io::Result<()> {
    let aligned = offset.is_multiple_of(BLOCK_SIZE as u64) && len.is_multiple_of(BLOCK_SIZE);
    if !aligned
        || offset
            .checked_add(len as u64)
            .is_none_or(|end| end > file.size())
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "backend range {offset}+{len} misaligned or past {}",
                file.size()
            ),
        ));
    }
    Ok(())
}

impl Backend for FileBackend {
    fn size(&self) -> u64 {
        self.file.read().size()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let file = self.file.read();
        check_file(&file, offset, buf.len())?;
        if !file.is_direct() || is_aligned_addr(buf.as_ptr()) {
            return file.read_at(offset, buf).map_err(io::Error::other);
        }
        let mut bounce = AlignedBuf::new(buf.len()).map_err(io::Error::other)?;
        file.read_at(offset, &mut bounce)
            .map_err(io::Error::other)?;
        buf.copy_from_slice(&bounce);
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let file = self.file.read();
        check_file(&file, offset, data.len())?;
        if !file.is_direct() || is_aligned_addr(data.as_ptr()) {
            return file.write_at(offset, data).map_err(io::Error::other);
        }
        let mut bounce = AlignedBuf::new(data.len()).map_err(io::Error::other)?;
        bounce.copy_from_slice(data);
        file.write_at(offset, &bounce).map_err(io::Error::other)
    }

    /// Reopens the file with the new size (`fallocate`, so the blocks are reserved; a
    /// block device must already have them) and syncs it, the size included.
    fn grow(&self, new_size: u64) -> io::Result<()> {
        let mut file = self.file.write();
        if new_size <= file.size() || !new_size.is_multiple_of(BLOCK_SIZE as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: cannot grow from {} to {new_size} bytes",
                    self.path.display(),
                    file.size()
                ),
            ));
        }
        let grown = FlashFile::open(&self.path, new_size).map_err(io::Error::other)?;
        std::fs::File::open(&self.path)
            .and_then(|f| f.sync_all())
            .map_err(|e| {
                io::Error::new(e.kind(), format!("syncing {}: {e}", self.path.display()))
            })?;
        *file = grown;
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        self.file.read().sync().map_err(io::Error::other)
    }

    /// A file beside this one, `<name>.snap-<tag>`: copied (`copy_file_range`, which
    /// shares the blocks where the file system can), synced, then renamed into place and
    /// the directory synced, so a crash leaves the whole snapshot or none (a partial copy
    /// is `<name>.snap-<tag>.partial`). Not for block devices.
    fn snapshot(&self, tag: &str) -> io::Result<String> {
        let _file = self.file.read();
        if is_block_device(&self.path) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("{} is a block device: no snapshots", self.path.display()),
            ));
        }
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(format!(".snap-{tag}"));
        let target = self.path.with_file_name(&name);
        name.push(".partial");
        let partial = self.path.with_file_name(&name);
        let at = |what: &str, path: &Path, e: io::Error| {
            io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
        };
        if target.exists() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", target.display()),
            ));
        }
        std::fs::copy(&self.path, &partial).map_err(|e| at("copying to", &partial, e))?;
        std::fs::File::open(&partial)
            .and_then(|f| f.sync_all())
            .map_err(|e| at("syncing", &partial, e))?;
        std::fs::rename(&partial, &target).map_err(|e| at("renaming", &partial, e))?;
        let dir = target.parent().filter(|d| !d.as_os_str().is_empty());
        std::fs::File::open(dir.unwrap_or(Path::new(".")))
            .and_then(|d| d.sync_all())
            .map_err(|e| at("syncing the directory of", &target, e))?;
        Ok(target.display().to_string())
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        let file = self.file.read();
        check_file(&file, offset, len as usize)?;
        file.punch(offset, len).map_err(io::Error::other)
    }

    fn describe(&self) -> String {
        let direct = if self.file.read().is_direct() {
            "O_DIRECT"
        } else {
            "buffered"
        };
        format!("file {} ({direct})", self.path.display())
    }
}

fn is_aligned_addr(ptr: *const u8) -> bool {
    (ptr as usize).is_multiple_of(BLOCK_SIZE)
}

/// The range check every backend makes: `[offset, offset + len)` inside `size`, else
/// `InvalidInput` naming the backend (`what`, called only then) — a clear error, never
/// a request past the end.
pub(crate) fn check_range(
    offset: u64,
    len: u64,
    size: u64,
    what: impl FnOnce() -> String,
) -> io::Result<()> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} range {offset}+{len} past the end ({size} bytes)",
                what()
            ),
        ));
    }
    Ok(())
}

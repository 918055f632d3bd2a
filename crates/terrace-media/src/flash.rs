//! Flash: a file used through block I/O (`pread`/`pwrite`), never mapped — the handle a
//! flash tier is to build on (no crate of the workspace uses it yet; the cache's tiers are
//! all mapped). `O_DIRECT` is used where the file system supports it
//! (bypassing the page cache, as a flash cache must); tmpfs and others fall back to
//! buffered I/O, and the handle says which.
//!
//! Invariants: with `O_DIRECT`, offsets, lengths and buffer addresses are multiples of
//! [`FlashFile::block_size`] — [`AlignedBuf`] provides such buffers and the I/O methods
//! check alignment instead of letting the kernel fail with `EINVAL`.

use std::alloc::{self, Layout};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::{MediaError, Result};

/// A block-I/O file of fixed size.
#[derive(Debug)]
pub struct FlashFile {
    file: File,
    path: PathBuf,
    size: u64,
    direct: bool,
}

/// Block size used for alignment (the logical block size of NVMe and most SSDs).
pub const BLOCK: usize = 4096;

impl FlashFile {
    /// Opens or creates `path` with `size` bytes (grown if smaller; blocks are reserved
    /// with `fallocate` so writes cannot hit a full file system later).
    pub fn open(path: &Path, size: u64) -> Result<FlashFile> {
        let open = |direct: bool| {
            let mut options = OpenOptions::new();
            options
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600);
            if direct {
                options.custom_flags(libc::O_DIRECT);
            }
            options.open(path)
        };
        let (file, direct) = match open(true) {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (
                open(false).map_err(|source| MediaError::Open {
                    path: path.into(),
                    source,
                })?,
                false,
            ),
            Err(source) => {
                return Err(MediaError::Open {
                    path: path.into(),
                    source,
                })
            }
        };
        if size == 0 || !size.is_multiple_of(BLOCK as u64) {
            return Err(MediaError::InvalidSize {
                size: size as usize,
                why: "flash size must be a non-zero multiple of the block size",
            });
        }
        use std::os::fd::AsFd;
        crate::os::fallocate(file.as_fd(), 0, 0, size).map_err(|source| {
            if source.raw_os_error() == Some(libc::ENOSPC) {
                MediaError::NoSpace {
                    path: path.into(),
                    offset: 0,
                    len: size,
                }
            } else {
                MediaError::Io {
                    op: "fallocate",
                    path: path.into(),
                    source,
                }
            }
        })?;
        Ok(FlashFile {
            file,
            path: path.into(),
            size,
            direct,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether the page cache is bypassed.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn block_size(&self) -> usize {
        BLOCK
    }

    fn check(&self, offset: u64, buf: &[u8]) -> Result<()> {
        let len = buf.len() as u64;
        let end = offset.checked_add(len);
        let aligned = offset.is_multiple_of(BLOCK as u64)
            && buf.len().is_multiple_of(BLOCK)
            && (buf.as_ptr() as usize).is_multiple_of(BLOCK);
        if end.is_none_or(|e| e > self.size) || (self.direct && !aligned) {
            return Err(MediaError::OutOfBounds {
                offset,
                len,
                size: self.size,
            });
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf)?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|source| MediaError::Io {
                op: "pread",
                path: self.path.clone(),
                source,
            })
    }

    /// Writes `buf` at `offset`.
    pub fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.check(offset, buf)?;
        self.file
            .write_all_at(buf, offset)
            .map_err(|source| MediaError::Io {
                op: "pwrite",
                path: self.path.clone(),
                source,
            })
    }

    /// Makes completed writes durable (`fdatasync`).
    pub fn sync(&self) -> Result<()> {
        self.file.sync_data().map_err(|source| MediaError::Io {
            op: "fdatasync",
            path: self.path.clone(),
            source,
        })
    }
}

/// A zeroed heap buffer aligned to [`BLOCK`], for `O_DIRECT` I/O.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl AlignedBuf {
    /// A buffer of `len` bytes (rounded up to a whole block, at least one); an error for a
    /// length no allocation can have.
    pub fn new(len: usize) -> Result<AlignedBuf> {
        let too_large = || MediaError::InvalidSize {
            size: len,
            why: "larger than any buffer can be",
        };
        let len = len
            .max(1)
            .div_ceil(BLOCK)
            .checked_mul(BLOCK)
            .ok_or_else(too_large)?;
        let layout = Layout::from_size_align(len, BLOCK).map_err(|_| too_large())?;
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            alloc::handle_alloc_error(layout);
        };
        Ok(AlignedBuf { ptr, len })
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len initialised (zeroed) bytes.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this exact layout.
        unsafe {
            alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, BLOCK),
            )
        }
    }
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads.
unsafe impl Sync for AlignedBuf {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bounds() {
        for dir in [std::env::temp_dir(), PathBuf::from("/dev/shm")] {
            let tmp = tempfile::tempdir_in(dir).unwrap();
            let flash = FlashFile::open(&tmp.path().join("flash"), 1 << 20).unwrap();
            let mut out = AlignedBuf::new(8192).unwrap();
            out[..5].copy_from_slice(b"hello");
            flash.write_at(4096, &out).unwrap();
            flash.sync().unwrap();
            let mut back = AlignedBuf::new(8192).unwrap();
            assert!(AlignedBuf::new(usize::MAX).is_err());
            flash.read_at(4096, &mut back).unwrap();
            assert_eq!(&back[..5], b"hello");
            assert!(matches!(
                flash.write_at((1 << 20) - 4096, &out),
                Err(MediaError::OutOfBounds { .. })
            ));
            assert!(matches!(
                flash.read_at(u64::MAX - 10, &mut back),
                Err(MediaError::OutOfBounds { .. })
            ));
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(FlashFile::open(&tmp.path().join("f"), 0).is_err());
        assert!(FlashFile::open(&tmp.path().join("g"), 1000).is_err());
        assert!(FlashFile::open(Path::new("/nonexistent/x"), 4096).is_err());
    }
}

//! Flash: a file used through block I/O (`pread`/`pwrite`), never mapped — what the
//! cache's flash tier (`terrace-cache`, `flash.rs`) reads and writes. `O_DIRECT` is used
//! where the file system supports it (bypassing the page cache, as a flash cache must);
//! where it refuses, the handle falls back to buffered I/O and says so
//! ([`FlashFile::is_direct`]). A file on tmpfs or ramfs is RAM whatever the flags say:
//! [`FlashFile::is_emulated`] tells, so that reports can label it.
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
    emulated: bool,
}

/// Whether `path` is a block device (a raw flash device rather than a file).
pub fn is_block_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

/// Block size used for alignment (the logical block size of NVMe and most SSDs).
pub const BLOCK: usize = 4096;

impl FlashFile {
    /// Opens or creates `path` with `size` bytes (grown if smaller; blocks are reserved
    /// with `fallocate` so writes cannot hit a full file system later). A block device
    /// is used as it is: its first `size` bytes, which it must have.
    pub fn open(path: &Path, size: u64) -> Result<FlashFile> {
        let device = is_block_device(path);
        let open = |direct: bool| {
            let mut options = OpenOptions::new();
            options.read(true).write(true);
            if !device {
                options.create(true).truncate(false).mode(0o600);
            }
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
        if device {
            use std::io::Seek;
            let have =
                (&file)
                    .seek(std::io::SeekFrom::End(0))
                    .map_err(|source| MediaError::Io {
                        op: "seek",
                        path: path.into(),
                        source,
                    })?;
            if have < size {
                return Err(MediaError::NoSpace {
                    path: path.into(),
                    offset: have,
                    len: size - have,
                });
            }
            return Ok(FlashFile {
                file,
                path: path.into(),
                size,
                direct,
                emulated: false,
            });
        }
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
        let emulated = matches!(
            crate::os::fs_type(file.as_fd()),
            Ok(t) if t == crate::os::TMPFS_MAGIC || t == crate::os::RAMFS_MAGIC
        );
        Ok(FlashFile {
            file,
            path: path.into(),
            size,
            direct,
            emulated,
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

    /// Whether the file lives in RAM (tmpfs, ramfs): a stand-in for flash, fast as
    /// memory, to be labelled as such.
    pub fn is_emulated(&self) -> bool {
        self.emulated
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The size of an existing file at `path`, or `None` when there is none.
    pub fn existing_size(path: &Path) -> Result<Option<u64>> {
        match std::fs::metadata(path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(MediaError::Open {
                path: path.into(),
                source,
            }),
        }
    }

    /// Gives the blocks of `[offset, offset + len)` back to the file system (a hole that
    /// reads as zeros; on an SSD the file system passes it on as a discard), or on a
    /// block device to the device (zeroed, by a discard where the device offers one).
    /// Block aligned.
    pub fn punch(&self, offset: u64, len: u64) -> Result<()> {
        if !offset.is_multiple_of(BLOCK as u64)
            || !len.is_multiple_of(BLOCK as u64)
            || offset.checked_add(len).is_none_or(|e| e > self.size)
        {
            return Err(MediaError::OutOfBounds {
                offset,
                len,
                size: self.size,
            });
        }
        use std::os::fd::AsFd;
        crate::os::punch_hole(self.file.as_fd(), offset, len).map_err(|source| MediaError::Io {
            op: "fallocate(PUNCH_HOLE)",
            path: self.path.clone(),
            source,
        })
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

    /// The file's descriptor, for reads an I/O engine of the caller's runs (io_uring):
    /// they must stay within [`size`](Self::size) and, where [`is_direct`](Self::is_direct),
    /// use [`AlignedBuf`]s at block-aligned offsets. Valid while the `FlashFile` lives.
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.file.as_raw_fd()
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

/// A zeroed buffer aligned to [`BLOCK`], for `O_DIRECT` I/O: from the heap, or, from
/// [`MAPPED_MIN`] bytes up, a mapping of its own, given back to the kernel when dropped
/// (the allocator would keep freed segment-sized chunks, so a cache that reads and
/// writes whole flash segments would hold megabytes of freed buffers).
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    mapped: bool,
}

/// The length from which an [`AlignedBuf`] is a mapping of its own.
pub const MAPPED_MIN: usize = 256 << 10;

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
        if len >= MAPPED_MIN {
            let ptr = crate::os::map_anonymous(len)
                .map_err(|source| MediaError::Map { size: len, source })?;
            return Ok(AlignedBuf {
                ptr,
                len,
                mapped: true,
            });
        }
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            alloc::handle_alloc_error(layout);
        };
        Ok(AlignedBuf {
            ptr,
            len,
            mapped: false,
        })
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
        if self.mapped {
            // SAFETY: mapped in `new` with this length, owned by this buffer alone, and
            // no borrow of it outlives `self`.
            unsafe { crate::os::unmap(self.ptr, self.len) };
            return;
        }
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
            let tmp = tempfile::tempdir_in(&dir).unwrap();
            let flash = FlashFile::open(&tmp.path().join("flash"), 1 << 20).unwrap();
            let mut out = AlignedBuf::new(8192).unwrap();
            out[..5].copy_from_slice(b"hello");
            flash.write_at(4096, &out).unwrap();
            flash.sync().unwrap();
            let mut back = AlignedBuf::new(8192).unwrap();
            assert!(AlignedBuf::new(usize::MAX).is_err());
            flash.read_at(4096, &mut back).unwrap();
            assert_eq!(&back[..5], b"hello");
            // A segment-sized buffer is a mapping of its own: zeroed, aligned, usable.
            let mut big = AlignedBuf::new(MAPPED_MIN + 1).unwrap();
            assert_eq!(big.len(), MAPPED_MIN + BLOCK);
            assert!(big.mapped && (big.as_ptr() as usize).is_multiple_of(BLOCK));
            assert!(big.iter().all(|&b| b == 0));
            big[MAPPED_MIN] = 7;
            flash.write_at(8192, &big).unwrap();
            let mut big_back = AlignedBuf::new(big.len()).unwrap();
            flash.read_at(8192, &mut big_back).unwrap();
            assert_eq!(big_back[MAPPED_MIN], 7);
            drop((big, big_back));
            if dir == Path::new("/dev/shm") {
                assert!(flash.is_emulated());
            }
            flash.punch(4096, 4096).unwrap();
            flash.read_at(4096, &mut back).unwrap();
            assert!(back.iter().all(|&b| b == 0));
            assert!(flash.punch(1, 4096).is_err());
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

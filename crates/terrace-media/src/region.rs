//! Regions: one mapped, contiguous address range on one medium.
//!
//! A [`Region`] owns its mapping (and, for file media, its file) and releases both on drop,
//! in O(1) calls: one `munmap`, one `close` (an unlinked file vanishes with its last
//! descriptor). Regions are what the layers above carve objects, runs and segments from.
//!
//! Invariants:
//! - `base` is aligned to [`GRANULE`] and `len` is a multiple of it, so a region can be
//!   registered whole in the [`registry`];
//! - a file region's file is at least `len` bytes long; blocks are guaranteed only for
//!   ranges passed to [`Region::reserve`] (a sparse shared mapping turns a full file system
//!   into `SIGBUS` at first touch, so users of file regions reserve before handing out);
//! - DAX is detected by trying `MAP_SYNC`, never by trusting the path.

use std::fs::{File, OpenOptions};
use std::io;
use std::num::NonZeroU32;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{MediaError, Result};
use crate::registry::GRANULE;
use crate::{numa, os, persist, registry};

/// What a write survives once persisted through [`Region::persist`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Durability {
    /// Nothing: the memory vanishes with the process (DRAM, NUMA nodes).
    None,
    /// A process crash, not a power loss (tmpfs and ramfs: the emulated persistent tier).
    Process,
    /// A power loss (DAX with cache-line flushes, or a disk-backed file after `msync`).
    Power,
}

/// The page size anonymous memory is mapped with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PageSize {
    /// The base page size.
    #[default]
    Base,
    /// Transparent huge pages, advised with `MADV_HUGEPAGE`; where the kernel does not
    /// offer them, the memory is mapped with base pages.
    Huge,
}

/// The medium a region lives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MediumKind {
    /// Anonymous memory.
    Dram,
    /// A shared file mapping.
    File,
    /// Anonymous memory bound to one NUMA node.
    Numa(u32),
}

/// Where a file region's file lives.
#[derive(Clone, Debug)]
pub enum FileLocation {
    /// A fresh, unlinked file in this directory: nothing is left behind on exit.
    TempIn(PathBuf),
    /// A named file, created if missing and kept after the region is dropped.
    Path(PathBuf),
    /// An existing file, mapped whole as it is: never created, never resized (its length
    /// must be a non-zero multiple of the registry granule). For reopening pools and tiers.
    Existing(PathBuf),
}

/// How to create a file region.
#[derive(Clone, Debug)]
pub struct FileOptions {
    pub location: FileLocation,
    /// Size of the mapping in bytes (rounded up to the registry granule). For
    /// `FileLocation::Path`, 0 means "the existing file's size".
    pub size: usize,
    /// Give freed ranges' blocks back to the file system (`FALLOC_FL_PUNCH_HOLE`). Off by
    /// default: punching costs as much as reserving again (memkind's `MEMKIND_HOG_MEMORY`
    /// lesson), and a file system without hole punching simply keeps the blocks.
    pub hole_punching: bool,
}

impl FileOptions {
    /// An unlinked file of `size` bytes in `dir`.
    pub fn temp_in(dir: impl Into<PathBuf>, size: usize) -> Self {
        FileOptions {
            location: FileLocation::TempIn(dir.into()),
            size,
            hole_punching: false,
        }
    }

    /// A kept file of `size` bytes at `path`.
    pub fn at_path(path: impl Into<PathBuf>, size: usize) -> Self {
        FileOptions {
            location: FileLocation::Path(path.into()),
            size,
            hole_punching: false,
        }
    }
}

#[derive(Debug)]
struct FileBacking {
    file: File,
    path: PathBuf,
    dax: bool,
    hole_punching: bool,
}

/// A mapped address range on one medium. See the module docs for its invariants.
#[derive(Debug)]
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    medium: MediumKind,
    durability: Durability,
    /// What [`Region::persist`] guarantees: `durability`, or less if the owner chose to
    /// rely on the page cache ([`Region::persist_through_page_cache`]).
    persist_level: Durability,
    file: Option<FileBacking>,
    /// An anonymous region's *image*: a file mapped privately over its first bytes
    /// ([`Region::map_image`]), read in place and copied page by page on first write.
    image: Option<Image>,
    registered: Option<NonZeroU32>,
    /// Bytes currently reserved in the backing file (statistics only).
    reserved: AtomicU64,
}

/// The file behind an anonymous region's image, kept open to give its pages back.
#[derive(Debug)]
struct Image {
    file: File,
    len: usize,
}

// SAFETY: a Region is an owned address range plus a file descriptor; the raw base pointer
// is only an address, and every mutation of the mapping's bytes is the caller's business
// (done through raw pointers under the caller's own synchronisation).
unsafe impl Send for Region {}
// SAFETY: as above; the methods taking &self only issue system calls or atomic updates.
unsafe impl Sync for Region {}

fn round_to_granule(size: usize) -> Result<usize> {
    if size == 0 {
        return Err(MediaError::InvalidSize {
            size,
            why: "a region cannot be empty",
        });
    }
    if size > isize::MAX as usize - GRANULE {
        return Err(MediaError::InvalidSize {
            size,
            why: "larger than the address space",
        });
    }
    Ok((size + GRANULE - 1) & !(GRANULE - 1))
}

impl Region {
    /// Anonymous memory of `size` bytes (rounded up to 2 MiB) with pages of size `pages`.
    /// Pages are committed on first touch.
    pub fn dram(size: usize, pages: PageSize) -> Result<Region> {
        let len = round_to_granule(size)?;
        let base = Self::map_anonymous(len)?;
        if pages == PageSize::Huge {
            // SAFETY: the mapping was just created and is owned here. Failure only means
            // the kernel does not offer THP; the memory still works.
            let _ = unsafe { os::madvise(base.as_ptr(), len, libc::MADV_HUGEPAGE) };
        }
        Ok(Region::anonymous(base, len, MediumKind::Dram))
    }

    /// Anonymous memory of `size` bytes bound to NUMA node `node` with `mbind`.
    pub fn numa(node: u32, size: usize) -> Result<Region> {
        let topology = numa::Topology::discover();
        match topology.node(node) {
            None => {
                return Err(MediaError::NoSuchNode {
                    node,
                    why: "not online".into(),
                });
            }
            Some(info) if !info.has_memory => {
                return Err(MediaError::NoSuchNode {
                    node,
                    why: "has no memory".into(),
                });
            }
            Some(_) => {}
        }
        let len = round_to_granule(size)?;
        let base = Self::map_anonymous(len)?;
        let region = Region::anonymous(base, len, MediumKind::Numa(node));
        // SAFETY: the mapping is anonymous and owned by `region`.
        unsafe { os::mbind_node(base.as_ptr(), len, node) }
            .map_err(|source| MediaError::Bind { node, source })?;
        Ok(region)
    }

    fn map_anonymous(len: usize) -> Result<NonNull<u8>> {
        let base = os::reserve_aligned(len, GRANULE)
            .map_err(|source| MediaError::Map { size: len, source })?;
        // SAFETY: `base..base+len` is the reservation just made.
        if let Err(source) = unsafe { os::map_anonymous_fixed(base, len) } {
            // SAFETY: the reservation is ours and unused.
            unsafe { os::unmap(base, len) };
            return Err(MediaError::Map { size: len, source });
        }
        Ok(base)
    }

    fn anonymous(base: NonNull<u8>, len: usize, medium: MediumKind) -> Region {
        Region {
            base,
            len,
            medium,
            durability: Durability::None,
            persist_level: Durability::None,
            file: None,
            image: None,
            registered: None,
            reserved: AtomicU64::new(0),
        }
    }

    /// A shared mapping of a file. On a DAX file system the mapping uses `MAP_SYNC` and
    /// [`persist`](Self::persist) flushes cache lines; elsewhere it uses `msync`.
    pub fn file(options: &FileOptions) -> Result<Region> {
        let (file, path, existing_len) = match &options.location {
            FileLocation::Existing(path) => {
                return Region::map_existing(path, options.hole_punching)
            }
            FileLocation::TempIn(dir) => (open_temp_in(dir)?, dir.clone(), 0),
            FileLocation::Path(path) => {
                let (file, len) = open_with_len(path, IfMissing::Create)?;
                (file, path.clone(), len)
            }
        };
        let wanted = if options.size == 0 {
            usize::try_from(existing_len).unwrap_or(usize::MAX)
        } else {
            options.size
        };
        let len = round_to_granule(wanted)?;
        if (len as u64) > existing_len {
            file.set_len(len as u64).map_err(|source| {
                if source.raw_os_error() == Some(libc::ENOSPC)
                    || source.raw_os_error() == Some(libc::EFBIG)
                {
                    MediaError::NoSpace {
                        path: path.clone(),
                        offset: 0,
                        len: len as u64,
                    }
                } else {
                    io_err("ftruncate", &path, source)
                }
            })?;
        }
        Region::map_file(file, path, len, options.hole_punching)
    }

    /// Maps an existing file whole, without creating or resizing it.
    fn map_existing(path: &Path, hole_punching: bool) -> Result<Region> {
        let (file, len) = open_with_len(path, IfMissing::Fail)?;
        if len == 0 || len % GRANULE as u64 != 0 || len > isize::MAX as u64 {
            return Err(MediaError::InvalidSize {
                size: usize::try_from(len).unwrap_or(usize::MAX),
                why: "an existing file must be a non-zero multiple of 2 MiB to be mapped whole",
            });
        }
        Region::map_file(file, path.to_path_buf(), len as usize, hole_punching)
    }

    /// Maps the first `len` bytes (a multiple of GRANULE) of an open file, trying
    /// `MAP_SYNC` first.
    fn map_file(file: File, path: PathBuf, len: usize, hole_punching: bool) -> Result<Region> {
        let tmpfs =
            matches!(os::fs_type(file.as_fd()), Ok(t) if t == os::TMPFS_MAGIC || t == 0x8584_58f6);
        // Decided before mapping over the reservation: a failed MAP_FIXED attempt may
        // leave a hole there (see `os::supports_map_sync`).
        let dax = os::supports_map_sync(file.as_fd());
        let base = os::reserve_aligned(len, GRANULE)
            .map_err(|source| MediaError::Map { size: len, source })?;
        let how = if dax {
            os::FileMap::SharedSync
        } else {
            os::FileMap::Shared
        };
        // SAFETY: `base..base+len` is the reservation just made; the file is open.
        if let Err(source) = unsafe { os::map_file_fixed(base, len, file.as_fd(), how) } {
            // The failed mapping may have unmapped part of the reservation, which another
            // thread may already use: leave the rest reserved rather than unmap it.
            return Err(MediaError::Map { size: len, source });
        }
        let durability = if tmpfs && !dax {
            Durability::Process
        } else {
            Durability::Power
        };
        Ok(Region {
            base,
            len,
            medium: MediumKind::File,
            durability,
            persist_level: durability,
            file: Some(FileBacking {
                file,
                path,
                dax,
                hole_punching,
            }),
            image: None,
            registered: None,
            reserved: AtomicU64::new(0),
        })
    }

    /// First byte of the region (aligned to [`GRANULE`]).
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Length in bytes (a multiple of [`GRANULE`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: regions are never empty. Present for API symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn medium(&self) -> MediumKind {
        self.medium
    }

    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// True when the file is on a DAX file system and mapped with `MAP_SYNC`.
    pub fn is_dax(&self) -> bool {
        self.file.as_ref().is_some_and(|f| f.dax)
    }

    /// The file's path, or its directory for an unlinked temporary file.
    pub fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(|f| f.path.as_path())
    }

    /// Bytes reserved in the backing file through [`reserve`](Self::reserve).
    pub fn reserved_bytes(&self) -> u64 {
        self.reserved.load(Ordering::Relaxed)
    }

    /// True when `addr` lies inside the region.
    pub fn contains(&self, addr: usize) -> bool {
        let start = self.base.as_ptr() as usize;
        addr >= start && addr - start < self.len
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(MediaError::OutOfBounds {
                offset: offset as u64,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    /// Guarantees backing blocks for `[offset, offset+len)`, so touching it cannot fault.
    /// A full file system is `Err(NoSpace)`, not a crash. No-op for anonymous memory.
    pub fn reserve(&self, offset: usize, len: usize) -> Result<()> {
        self.check_range(offset, len)?;
        let Some(backing) = &self.file else {
            return Ok(());
        };
        // A range already backed (a reopened file) is not asked for again: that walks
        // every page of it, most of a second for a large tier. Backed: the whole file
        // asked for and as many bytes allocated as it is long (tmpfs and others report
        // reserved but unwritten pages as holes, yet count them), or no hole in it.
        let end = offset as u64 + len as u64;
        let whole_file_allocated = || {
            use std::os::unix::fs::MetadataExt;
            backing.file.metadata().is_ok_and(|m| {
                offset == 0 && m.len() == end && m.blocks().saturating_mul(512) >= m.len()
            })
        };
        if len > 0
            && (whole_file_allocated()
                || os::first_hole(backing.file.as_fd(), offset as u64).is_ok_and(|h| h >= end))
        {
            self.reserved.fetch_add(len as u64, Ordering::Relaxed);
            return Ok(());
        }
        os::fallocate(backing.file.as_fd(), 0, offset as u64, len as u64).map_err(|source| {
            match source.raw_os_error() {
                Some(libc::ENOSPC) | Some(libc::EFBIG) | Some(libc::EDQUOT) => {
                    MediaError::NoSpace {
                        path: backing.path.clone(),
                        offset: offset as u64,
                        len: len as u64,
                    }
                }
                _ => io_err("fallocate", &backing.path, source),
            }
        })?;
        self.reserved.fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The ranges of a file-backed region that may hold written data, in order (what
    /// `SEEK_DATA`/`SEEK_HOLE` report; a hole reads as zero, so whatever lies outside
    /// them was never written, or was given back). `None` for anonymous memory or where
    /// the file system cannot say: then anything may hold data.
    pub fn data_ranges(&self) -> Option<Vec<std::ops::Range<usize>>> {
        let backing = self.file.as_ref()?;
        let fd = backing.file.as_fd();
        let mut ranges = Vec::new();
        let mut at = 0u64;
        while at < self.len as u64 {
            let Some(start) = os::next_data(fd, at).ok()? else {
                break;
            };
            let end = os::first_hole(fd, start).ok()?.max(start + 1);
            ranges.push(start as usize..(end as usize).min(self.len));
            at = end;
        }
        Some(ranges)
    }

    /// Asks the kernel to start reading `[offset, offset+len)` of a file-backed region
    /// into memory now (see [`os::will_need`]): for scans of a disk-backed file. A hint;
    /// a range outside the region or anonymous memory is left alone.
    pub fn will_need(&self, offset: usize, len: usize) {
        if self.file.is_none() || self.check_range(offset, len).is_err() {
            return;
        }
        os::will_need(self.base.as_ptr().wrapping_add(offset), len);
    }

    /// Maps the bytes of `file` under each of `ranges` (offsets in the file and in this
    /// region alike) privately over the same bytes of this anonymous region (volatile
    /// memory: DRAM, not a NUMA binding, which the file's pages would not follow): the
    /// region then reads the file's bytes there, without copying them, and a write copies
    /// only the page it lands on. The file is never written. The rest of the region stays
    /// anonymous (a hole of the file mapped privately would take a page of the file for
    /// every page touched). For putting a saved image of volatile memory back at once; see
    /// [`forget_image`](Self::forget_image) and [`drop_image`](Self::drop_image).
    pub fn map_image(&mut self, file: File, ranges: &[std::ops::Range<usize>]) -> Result<()> {
        let page = os::page_size();
        let fits = |r: &std::ops::Range<usize>| {
            r.start < r.end
                && r.end <= self.len
                && r.start.is_multiple_of(page)
                && r.end.is_multiple_of(page)
        };
        if self.file.is_some() || self.image.is_some() || !ranges.iter().all(fits) {
            return Err(MediaError::InvalidSize {
                size: ranges.iter().map(|r| r.end).max().unwrap_or(0),
                why: "an image maps whole pages of an anonymous region without one",
            });
        }
        let len = ranges.iter().map(|r| r.end).max().unwrap_or(0);
        // Recorded first, so that a failure part way is undone by `drop_image`.
        self.image = Some(Image { file, len });
        for r in ranges {
            let Some(image) = &self.image else {
                break;
            };
            // MAP_FIXED replaces just `r`; the file offset is the region offset, page-aligned.
            // SAFETY: `r` lies in this region's own anonymous mapping (checked by `fits`),
            // which `&mut self` shows nobody else uses.
            let mapped = unsafe {
                os::map_private_file_fixed(
                    self.base.add(r.start),
                    r.end - r.start,
                    image.file.as_fd(),
                    r.start as u64,
                )
            };
            if let Err(source) = mapped {
                let _ = self.drop_image();
                return Err(MediaError::Map {
                    size: r.end - r.start,
                    source,
                });
            }
        }
        Ok(())
    }

    /// Gives back the image's pages under `[offset, offset+len)` (the file's, by punching
    /// them out of it; pages already copied by a write stay): bytes there not yet written
    /// read as zero afterwards. For a range about to be rewritten, so that the image's
    /// copy of it does not stay in memory beside the new one. No-op without an image.
    pub fn forget_image(&self, offset: usize, len: usize) -> Result<()> {
        let Some(image) = &self.image else {
            return Ok(());
        };
        if offset >= image.len {
            return Ok(());
        }
        let len = len.min(image.len - offset);
        os::punch_hole(image.file.as_fd(), offset as u64, len as u64)
            .map_err(|source| MediaError::Map { size: len, source })
    }

    /// Replaces the image with fresh anonymous memory (zeros), as if it was never mapped.
    pub fn drop_image(&mut self) -> Result<()> {
        let Some(image) = self.image.take() else {
            return Ok(());
        };
        // SAFETY: the image covers the start of this region's own mapping; `&mut self`
        // shows nobody else uses it; MAP_FIXED replaces just that range.
        unsafe { os::map_anonymous_fixed(self.base, image.len) }.map_err(|source| MediaError::Map {
            size: image.len,
            source,
        })
    }

    /// Gives the memory behind `[offset, offset+len)` back: anonymous pages are dropped
    /// (they read as zero afterwards); file blocks are punched out only when hole punching
    /// was chosen. Returns whether anything was released (so the caller knows whether the
    /// range now reads as zero). The range must be page-aligned.
    pub fn release(&self, offset: usize, len: usize) -> Result<bool> {
        self.check_range(offset, len)?;
        match &self.file {
            None => {
                // Under an image, dropped pages would read the file again: out of it first.
                self.forget_image(offset, len)?;
                // SAFETY: the range lies in this region's anonymous mapping (checked above);
                // the caller no longer uses its contents.
                unsafe { os::madvise(self.base.as_ptr().add(offset), len, libc::MADV_DONTNEED) }
                    .map(|()| true)
                    .map_err(|source| MediaError::Map { size: len, source })
            }
            Some(backing) if backing.hole_punching => {
                match os::punch_hole(backing.file.as_fd(), offset as u64, len as u64) {
                    Ok(()) => {
                        self.reserved.fetch_sub(
                            (len as u64).min(self.reserved.load(Ordering::Relaxed)),
                            Ordering::Relaxed,
                        );
                        Ok(true)
                    }
                    // File systems without hole punching keep the blocks: not an error.
                    Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(false),
                    Err(source) => Err(io_err("punch hole", &backing.path, source)),
                }
            }
            Some(_) => Ok(false),
        }
    }

    /// Makes `[offset, offset+len)` durable to the region's [`persist_level`]: cache-line
    /// flushes and a fence on DAX, `msync` on disk-backed files (unless their owner chose
    /// [`persist_through_page_cache`]), and at process durability (tmpfs) only a compiler
    /// fence. A shared mapping's stores are in the page cache
    /// once executed; a process crash stops the program at a precise instruction, with every
    /// store before it executed (store buffers drain, they are not discarded) and none after
    /// it. So all a persist point must guarantee there is that the compiler keeps the stores
    /// before it in front of the stores after it. Nothing on anonymous memory.
    ///
    /// [`persist_level`]: Self::persist_level
    /// [`persist_through_page_cache`]: Self::persist_through_page_cache
    pub fn persist(&self, offset: usize, len: usize) -> Result<()> {
        self.check_range(offset, len)?;
        let Some(backing) = &self.file else {
            return Ok(());
        };
        // SAFETY: the range is inside the live mapping (checked above), which outlives
        // the call.
        unsafe {
            crate::persist_hook::call(&backing.path, offset, self.base.as_ptr().add(offset), len)
        };
        if self.persist_level == Durability::Process {
            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
            return Ok(());
        }
        // SAFETY: the range is inside the mapping (checked above).
        let addr = unsafe { self.base.as_ptr().add(offset) };
        if backing.dax {
            persist::flush_range(addr, len);
            persist::drain();
            Ok(())
        } else {
            persist::count_msync();
            // SAFETY: the range is inside the live mapping (checked above).
            unsafe { os::msync(addr, len) }.map_err(|source| io_err("msync", &backing.path, source))
        }
    }

    /// Makes [`persist`](Self::persist) guarantee only what a process crash needs (the
    /// page cache holds every executed store of a shared mapping) on a disk-backed file,
    /// where each persist would otherwise be a synchronous `msync`: for an owner that can
    /// lose the region's contents after a power loss (a cache) and calls
    /// [`sync`](Self::sync) before it relies on them surviving one. Nothing changes on
    /// DAX (cache-line flushes are cheap), tmpfs or anonymous memory. Returns whether the
    /// level was lowered.
    pub fn persist_through_page_cache(&mut self) -> bool {
        let disk = self
            .file
            .as_ref()
            .is_some_and(|b| !b.dax && self.durability == Durability::Power);
        if disk {
            self.persist_level = Durability::Process;
        }
        disk
    }

    /// What [`persist`](Self::persist) guarantees now.
    pub fn persist_level(&self) -> Durability {
        self.persist_level
    }

    /// Whether persisted stores survive only a process crash until [`sync`](Self::sync),
    /// short of what the medium could give: a disk-backed file written through the page
    /// cache ([`persist_through_page_cache`](Self::persist_through_page_cache)).
    pub fn is_page_cached(&self) -> bool {
        self.persist_level < self.durability
    }

    /// Makes every byte of the region durable to its medium's [`Durability`] (one
    /// `msync` of the whole mapping on a disk-backed file, nothing elsewhere: DAX persists
    /// are already flushed, tmpfs and DRAM have nothing further to reach).
    pub fn sync(&self) -> Result<()> {
        let Some(backing) = &self.file else {
            return Ok(());
        };
        if backing.dax || self.durability != Durability::Power {
            return Ok(());
        }
        persist::count_msync();
        // SAFETY: the whole live mapping.
        unsafe { os::msync(self.base.as_ptr(), self.len) }
            .map_err(|source| io_err("msync", &backing.path, source))
    }

    /// Records `tag` as this region's owner in the process-wide registry; unregistered
    /// again on drop.
    pub fn register(&mut self, tag: NonZeroU32) -> Result<()> {
        if let Some(old) = self.registered.take() {
            registry::unregister(self.base.as_ptr() as usize, self.len, old);
        }
        registry::register(self.base.as_ptr() as usize, self.len, tag)?;
        self.registered = Some(tag);
        Ok(())
    }

    /// Bytes the file system holding a file region can still give (None for anonymous).
    pub fn fs_available(&self) -> Option<u64> {
        self.file
            .as_ref()
            .and_then(|b| os::fs_available(b.file.as_fd()).ok())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Some(tag) = self.registered {
            registry::unregister(self.base.as_ptr() as usize, self.len, tag);
        }
        // SAFETY: the region owns its mapping; after drop nobody may use it (Region is the
        // only handle to the range).
        unsafe { os::unmap(self.base, self.len) };
    }
}

/// What [`open_with_len`] does when the file does not exist.
#[derive(Clone, Copy, PartialEq, Eq)]
enum IfMissing {
    /// Create it, mode 0600.
    Create,
    /// Fail with [`MediaError::Open`].
    Fail,
}

/// Opens `path` read-write and returns its length.
fn open_with_len(path: &Path, missing: IfMissing) -> Result<(File, u64)> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(missing == IfMissing::Create)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|source| MediaError::Open {
            path: path.to_path_buf(),
            source,
        })?;
    let len = file
        .metadata()
        .map_err(|source| io_err("stat", path, source))?
        .len();
    Ok((file, len))
}

fn io_err(op: &'static str, path: &Path, source: io::Error) -> MediaError {
    MediaError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Opens an unlinked file in `dir`: `O_TMPFILE` where the file system supports it, else a
/// uniquely named file unlinked at once.
fn open_temp_in(dir: &Path) -> Result<File> {
    let open_err = |source| MediaError::Open {
        path: dir.to_path_buf(),
        source,
    };
    match OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
    {
        Ok(file) => return Ok(file),
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EISDIR)
            ) => {}
        Err(e) => return Err(open_err(e)),
    }
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let name = format!(
            ".terrace-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(file) => {
                std::fs::remove_file(&path).map_err(open_err)?;
                return Ok(file);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(open_err(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry;

    #[test]
    fn dram_region_is_aligned_zeroed_and_writable() {
        let region = Region::dram(3 << 20, PageSize::Base).unwrap();
        assert_eq!(region.base().as_ptr() as usize % GRANULE, 0);
        assert_eq!(region.len(), 4 << 20);
        assert_eq!(region.durability(), Durability::None);
        let p = region.base().as_ptr();
        // SAFETY: inside the live mapping.
        unsafe {
            assert_eq!(*p.add(12345), 0);
            *p.add(12345) = 9;
        }
        assert!(region.release(0, 1 << 20).unwrap());
        // SAFETY: inside the live mapping; released pages read as zero.
        assert_eq!(unsafe { *p.add(12345) }, 0);
    }

    #[test]
    fn temp_file_region_leaves_nothing_behind_and_reports_tmpfs() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let region = Region::file(&FileOptions::temp_in(dir.path(), 8 << 20)).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert_eq!(region.durability(), Durability::Process);
        assert!(!region.is_dax());
        region.reserve(0, 4 << 20).unwrap();
        assert_eq!(region.reserved_bytes(), 4 << 20);
        // SAFETY: reserved range of the live mapping.
        unsafe { region.base().as_ptr().add(100).write(5) };
        region.persist(0, 4096).unwrap();
    }

    #[test]
    fn named_file_is_kept_and_reopened_with_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kept");
        {
            let region = Region::file(&FileOptions::at_path(&path, 2 << 20)).unwrap();
            region.reserve(0, 4096).unwrap();
            // SAFETY: reserved range of the live mapping.
            unsafe { region.base().as_ptr().write(0xAB) };
            region.persist(0, 1).unwrap();
            assert_eq!(region.durability(), Durability::Power);
        }
        let region = Region::file(&FileOptions::at_path(&path, 0)).unwrap();
        assert_eq!(region.len(), 2 << 20);
        // SAFETY: inside the live mapping.
        assert_eq!(unsafe { region.base().as_ptr().read() }, 0xAB);
    }

    #[test]
    fn an_owner_may_persist_a_disk_file_through_the_page_cache_and_sync_it_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cache");
        let mut region = Region::file(&FileOptions::at_path(&path, 2 << 20)).unwrap();
        assert_eq!(region.durability(), Durability::Power);
        assert!(!region.is_page_cached());
        assert!(region.persist_through_page_cache());
        assert_eq!(region.persist_level(), Durability::Process);
        assert!(region.is_page_cached());
        assert_eq!(
            region.durability(),
            Durability::Power,
            "the medium is unchanged"
        );
        region.reserve(0, 4096).unwrap();
        // SAFETY: reserved range of the live mapping.
        unsafe { region.base().as_ptr().write(0xCD) };
        region.persist(0, 1).unwrap();
        region.sync().unwrap();
        drop(region);
        let region = Region::file(&FileOptions::at_path(&path, 0)).unwrap();
        // SAFETY: inside the live mapping.
        assert_eq!(unsafe { region.base().as_ptr().read() }, 0xCD);
        // Elsewhere there is nothing to lower.
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let mut tmpfs = Region::file(&FileOptions::temp_in(shm.path(), 2 << 20)).unwrap();
        assert!(!tmpfs.persist_through_page_cache());
        assert!(!tmpfs.is_page_cached());
        tmpfs.sync().unwrap();
        let mut dram = Region::dram(GRANULE, PageSize::Base).unwrap();
        assert!(!dram.persist_through_page_cache());
        assert_eq!(dram.persist_level(), Durability::None);
        assert!(!dram.is_page_cached());
    }

    #[test]
    fn file_regions_mapped_while_other_threads_map_memory_stay_their_own() {
        // A file must not be mapped by trying MAP_SYNC over the reservation: on a file
        // system that supports MAP_SYNC only on DAX (ext4, xfs) that attempt fails after
        // the kernel has already unmapped the reservation, and another thread's mapping
        // could land in the hole before a plain MAP_FIXED mapping replaced it. DAX is
        // decided first (`os::supports_map_sync`); this test maps files while other
        // threads map memory.
        let dir = tempfile::tempdir().unwrap();
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let dir = dir.path().to_path_buf();
                std::thread::spawn(move || {
                    for i in 0..40u8 {
                        let tag = t * 64 + i;
                        let path = dir.join(format!("f{t}-{i}"));
                        let file = Region::file(&FileOptions::at_path(&path, GRANULE)).unwrap();
                        let dram = Region::dram(GRANULE, PageSize::Base).unwrap();
                        // SAFETY: inside the live mappings.
                        unsafe {
                            dram.base().as_ptr().write(0xEE);
                            file.base().as_ptr().write(tag);
                        }
                        // SAFETY: as above.
                        let (f, d) =
                            unsafe { (file.base().as_ptr().read(), dram.base().as_ptr().read()) };
                        assert_eq!((f, d), (tag, 0xEE), "mappings crossed");
                        drop(file);
                        let on_disk = std::fs::read(&path).unwrap();
                        assert_eq!(on_disk[0], tag, "{path:?} holds another region's bytes");
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    #[test]
    fn data_ranges_cover_what_was_written_even_in_reserved_space() {
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let region =
            Region::file(&FileOptions::at_path(dir.path().join("data"), 4 * GRANULE)).unwrap();
        region.reserve(0, region.len()).unwrap();
        let before = region.data_ranges().unwrap();
        let at = GRANULE + 12345;
        // SAFETY: inside the live shared mapping; nothing else uses it.
        unsafe { region.base().as_ptr().add(at).write(7) };
        let after = region.data_ranges().unwrap();
        assert!(after.iter().any(|r| r.contains(&at)), "{after:?}");
        // Reserved but never written: reported as a hole (tmpfs and ext4 both do).
        assert!(!before.iter().any(|r| r.contains(&at)), "{before:?}");
        assert!(Region::dram(GRANULE, PageSize::Base)
            .unwrap()
            .data_ranges()
            .is_none());
    }

    #[test]
    fn existing_files_are_mapped_as_they_are() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let path = dir.path().join("existing");
        let existing = |path: &std::path::Path| FileOptions {
            location: FileLocation::Existing(path.to_path_buf()),
            size: 0,
            hole_punching: false,
        };
        let missing = Region::file(&existing(&path));
        assert!(
            matches!(missing, Err(MediaError::Open { .. })),
            "never created"
        );
        assert!(!path.exists());
        std::fs::write(&path, vec![0u8; 3 << 20]).unwrap();
        let odd = Region::file(&existing(&path));
        assert!(matches!(odd, Err(MediaError::InvalidSize { .. })));
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            3 << 20,
            "never resized"
        );
        std::fs::write(&path, vec![7u8; 4 << 20]).unwrap();
        let region = Region::file(&existing(&path)).unwrap();
        assert_eq!(region.len(), 4 << 20);
        // SAFETY: inside the live mapping.
        let last = unsafe { region.base().as_ptr().add((4 << 20) - 1).read() };
        assert_eq!(last, 7);
    }

    #[test]
    fn missing_and_unwritable_directories_are_errors() {
        let err = Region::file(&FileOptions::temp_in("/nonexistent/terrace", 1 << 20)).unwrap_err();
        assert!(matches!(err, MediaError::Open { .. }), "{err}");
        // /sys refuses new files even to root.
        let err = Region::file(&FileOptions::temp_in("/sys", 1 << 20)).unwrap_err();
        assert!(matches!(err, MediaError::Open { .. }), "{err}");
        assert!(matches!(
            Region::file(&FileOptions::temp_in("/dev/shm", 0)),
            Err(MediaError::InvalidSize { .. })
        ));
        assert!(matches!(
            Region::dram(usize::MAX, PageSize::Base),
            Err(MediaError::InvalidSize { .. })
        ));
    }

    #[test]
    fn an_image_reads_in_place_copies_on_write_and_can_be_forgotten() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir_in("/dev/shm")
            .or_else(|_| tempfile::tempdir())
            .unwrap();
        let path = dir.path().join("image");
        let page = os::page_size();
        let pattern: Vec<u8> = (0..4 * page).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &pattern).unwrap();
        let mut region = Region::dram(GRANULE, PageSize::Base).unwrap();
        let file = File::options().read(true).write(true).open(&path).unwrap();
        // Pages 0, 1 and 3 from the file; page 2 stays anonymous.
        region
            .map_image(file, &[0..2 * page, 3 * page..4 * page])
            .unwrap();
        let at = |r: &Region, i: usize| {
            // SAFETY: i < 4 pages <= GRANULE: inside the region's live mapping.
            unsafe { r.base().as_ptr().add(i).read() }
        };
        let set = |r: &Region, i: usize, v: u8| {
            // SAFETY: as above; the test owns the region and no other view of it exists.
            unsafe { r.base().as_ptr().add(i).write(v) }
        };
        let imaged = |i: usize| i / page != 2;
        assert!(
            (0..pattern.len()).all(|i| at(&region, i) == if imaged(i) { pattern[i] } else { 0 })
        );
        assert_eq!(at(&region, pattern.len()), 0, "past the image: zeros");
        set(&region, 10, 0xEE);
        let mut on_file = vec![0u8; pattern.len()];
        File::open(&path)
            .unwrap()
            .read_exact_at(&mut on_file, 0)
            .unwrap();
        assert_eq!(on_file, pattern, "a write never reaches the file");
        // Forgetting the first two pages: the written page stays as written, the other
        // reads as zero; the rest of the image is still there.
        region.forget_image(0, 2 * page).unwrap();
        assert_eq!((at(&region, 10), at(&region, 11)), (0xEE, pattern[11]));
        assert_eq!(at(&region, page + 5), 0);
        assert_eq!(at(&region, 3 * page + 5), pattern[3 * page + 5]);
        // Released memory reads as zero, image or not.
        assert!(region.release(0, page).unwrap());
        assert_eq!(at(&region, 10), 0);
        region.drop_image().unwrap();
        assert!((0..pattern.len()).all(|i| at(&region, i) == 0));
        assert!(Region::dram(GRANULE, PageSize::Base)
            .unwrap()
            .map_image(
                File::open(&path).unwrap(),
                &[0..GRANULE, GRANULE..2 * GRANULE]
            )
            .is_err());
    }

    #[test]
    fn out_of_bounds_ranges_are_errors() {
        let region = Region::dram(GRANULE, PageSize::Base).unwrap();
        assert!(matches!(
            region.reserve(GRANULE, 1),
            Err(MediaError::OutOfBounds { .. })
        ));
        assert!(matches!(
            region.persist(usize::MAX, 2),
            Err(MediaError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn registered_region_is_found_and_forgotten_on_drop() {
        let mut region = Region::dram(GRANULE * 2, PageSize::Base).unwrap();
        let tag = NonZeroU32::new(77).unwrap();
        region.register(tag).unwrap();
        let inside = region.base().as_ptr() as usize + GRANULE + 5;
        assert_eq!(registry::lookup(inside), Some(tag));
        drop(region);
        assert_eq!(registry::lookup(inside), None);
    }

    #[test]
    fn numa_node_zero_binds_and_missing_node_is_an_error() {
        let region = Region::numa(0, GRANULE).unwrap();
        // SAFETY: inside the live mapping.
        unsafe { region.base().as_ptr().write(1) };
        assert_eq!(region.medium(), MediumKind::Numa(0));
        assert!(matches!(
            Region::numa(4000, GRANULE),
            Err(MediaError::NoSuchNode { .. })
        ));
    }
}

//! The operating-system interface of Terrace: every `mmap`, `fallocate`, `madvise`,
//! `mbind`, `statfs` and friends goes through here, so the rest of the media layer reads as
//! plain Rust and the OS surface is visible in one file (mimalloc's `prim.h` habit).
//!
//! Functions return `io::Error` from `errno`; callers attach the path or size.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// `MAP_SHARED_VALIDATE`: fail on unknown flags instead of ignoring them (needed so that
/// `MAP_SYNC` on a non-DAX file reports `EOPNOTSUPP` rather than silently mapping).
pub const MAP_SHARED_VALIDATE: libc::c_int = 0x03;
/// `MAP_SYNC`: page faults on a DAX mapping guarantee metadata durability, so cache-line
/// flushes alone make stores durable.
pub const MAP_SYNC: libc::c_int = 0x80000;
/// `statfs.f_type` of tmpfs.
pub const TMPFS_MAGIC: i64 = 0x0102_1994;
/// `statfs.f_type` of ramfs.
pub const RAMFS_MAGIC: i64 = 0x8584_58f6;

/// Seconds since the Unix epoch from the coarse real-time clock (`CLOCK_REALTIME_COARSE`:
/// the time of the last timer tick, a few milliseconds old at most, read without the
/// TSC, so cheaper than `SystemTime::now`). For second-granularity uses such as TTLs.
pub fn unix_seconds_coarse() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; clock_gettime writes only into it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    if rc == 0 {
        ts.tv_sec
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if size <= 0 {
        4096
    } else {
        size as usize
    }
}

/// Reserves `len` bytes of address space aligned to `align` (a power of two), with no
/// access and no backing. The caller maps over it with [`map_file_fixed`] or unmaps it.
pub fn reserve_aligned(len: usize, align: usize) -> io::Result<NonNull<u8>> {
    let padded = len
        .checked_add(align)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))?;
    // SAFETY: anonymous PROT_NONE mapping at a kernel-chosen address touches no existing
    // memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            padded,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let start = raw as usize;
    let aligned = (start + align - 1) & !(align - 1);
    let head = aligned - start;
    let tail = padded - head - len;
    // SAFETY: head and tail lie inside the mapping just created and are not used by anyone.
    unsafe {
        if head > 0 {
            libc::munmap(raw, head);
        }
        if tail > 0 {
            libc::munmap((aligned + len) as *mut libc::c_void, tail);
        }
    }
    NonNull::new(aligned as *mut u8).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// Maps anonymous read-write memory over `[addr, addr+len)`, which must be a reservation
/// owned by the caller.
///
/// # Safety
/// `addr..addr+len` must be address space owned by the caller (from [`reserve_aligned`]);
/// anything mapped there before is replaced.
pub unsafe fn map_anonymous_fixed(addr: NonNull<u8>, len: usize) -> io::Result<()> {
    // SAFETY: the caller owns the range (function contract); MAP_FIXED replaces only it.
    let raw = unsafe {
        libc::mmap(
            addr.as_ptr().cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Which shared mapping [`map_file_fixed`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileMap {
    /// `MAP_SHARED`: stores reach the file through the page cache.
    Shared,
    /// `MAP_SHARED_VALIDATE | MAP_SYNC`: DAX only (elsewhere the call fails with
    /// `EOPNOTSUPP` or `EINVAL`); cache-line flushes alone make stores durable.
    SharedSync,
}

/// Maps `len` bytes of `fd` from offset 0 shared and read-write over `[addr, addr+len)`,
/// as `how` says.
///
/// # Safety
/// As for [`map_anonymous_fixed`].
pub unsafe fn map_file_fixed(
    addr: NonNull<u8>,
    len: usize,
    fd: BorrowedFd<'_>,
    how: FileMap,
) -> io::Result<()> {
    let flags = match how {
        FileMap::SharedSync => MAP_SHARED_VALIDATE | MAP_SYNC | libc::MAP_FIXED,
        FileMap::Shared => libc::MAP_SHARED | libc::MAP_FIXED,
    };
    // SAFETY: the caller owns the range (function contract); the fd is open.
    let raw = unsafe {
        libc::mmap(
            addr.as_ptr().cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd.as_raw_fd(),
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Maps `len` bytes of `fd` from offset `offset` (page-aligned) *private* and read-write
/// over `[addr, addr+len)`: reads see the file's pages (shared with the page cache, nothing copied),
/// the first write to a page copies it into anonymous memory of this process, and the
/// file never changes.
///
/// # Safety
/// As for [`map_anonymous_fixed`].
pub unsafe fn map_private_file_fixed(
    addr: NonNull<u8>,
    len: usize,
    fd: BorrowedFd<'_>,
    offset: u64,
) -> io::Result<()> {
    // SAFETY: the caller owns the range (function contract); the fd is open.
    let raw = unsafe {
        libc::mmap(
            addr.as_ptr().cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            fd.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `fd` can be mapped with `MAP_SYNC` (a file on DAX), found by mapping its first
/// page at an address the kernel chooses and unmapping it again. The probe is needed
/// because a failed `MAP_FIXED` attempt is not harmless: on ext4 or xfs without DAX the
/// kernel refuses `MAP_SYNC` only after it has unmapped the target range, so a reservation
/// would be left as a hole another thread's mapping could land in.
pub fn supports_map_sync(fd: BorrowedFd<'_>) -> bool {
    let len = page_size();
    // SAFETY: a new mapping at a kernel-chosen address replaces nothing.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            MAP_SHARED_VALIDATE | MAP_SYNC,
            fd.as_raw_fd(),
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: the probe mapping just made, used by nobody.
    unsafe { libc::munmap(raw, len) };
    true
}

/// Maps `len` bytes of zeroed, private, read-write anonymous memory at an address the
/// kernel chooses (page aligned); give it back with [`unmap`].
pub fn map_anonymous(len: usize) -> io::Result<NonNull<u8>> {
    // SAFETY: a new anonymous mapping at a kernel-chosen address touches no existing
    // memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(raw.cast()).ok_or_else(|| io::Error::from_raw_os_error(libc::ENOMEM))
}

/// Unmaps `[addr, addr+len)`.
///
/// # Safety
/// Nothing may use the range afterwards.
pub unsafe fn unmap(addr: NonNull<u8>, len: usize) {
    // SAFETY: the caller gives up the range (function contract).
    unsafe {
        libc::munmap(addr.as_ptr().cast(), len);
    }
}

/// `fallocate(fd, mode, offset, len)`, retried on `EINTR`.
pub fn fallocate(fd: BorrowedFd<'_>, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    loop {
        // SAFETY: fallocate only reads its scalar arguments.
        let rc = unsafe {
            libc::fallocate(
                fd.as_raw_fd(),
                mode,
                offset as libc::off_t,
                len as libc::off_t,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// The offset of the first hole at or after `from` (`lseek(SEEK_HOLE)`; the file's size
/// when there is none). A file system may report allocated but unwritten blocks as a
/// hole, never the reverse.
pub fn first_hole(fd: BorrowedFd<'_>, from: u64) -> io::Result<u64> {
    // SAFETY: lseek only reads its scalar arguments; it moves the descriptor's offset,
    // which no caller relies on (all file I/O here is positioned or mapped).
    let at = unsafe { libc::lseek(fd.as_raw_fd(), from as libc::off_t, libc::SEEK_HOLE) };
    if at < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(at as u64)
}

/// The offset of the first data at or after `from` (`lseek(SEEK_DATA)`); `None` when
/// there is none before the end of the file (`ENXIO`). Reserved but unwritten blocks may
/// count as a hole.
pub fn next_data(fd: BorrowedFd<'_>, from: u64) -> io::Result<Option<u64>> {
    // SAFETY: lseek only reads its scalar arguments; it moves the descriptor's offset,
    // which no caller relies on (all file I/O here is positioned or mapped).
    let at = unsafe { libc::lseek(fd.as_raw_fd(), from as libc::off_t, libc::SEEK_DATA) };
    if at < 0 {
        let err = io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(err),
        };
    }
    Ok(Some(at as u64))
}

/// Deallocates the file blocks behind `[offset, offset+len)` keeping the file size.
pub fn punch_hole(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    fallocate(
        fd,
        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
        offset,
        len,
    )
}

/// Writes the dirty pages of `[offset, offset + len)` of a file and waits for them
/// (`sync_file_range`), then asks the kernel to drop them from the page cache
/// (`POSIX_FADV_DONTNEED`): for an append-only file that is read back rarely, whose pages
/// would otherwise hold DRAM for nothing. Not a durability point (no metadata, no device
/// flush); on tmpfs nothing is dropped (its pages are the file).
pub fn write_out_and_drop(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    let (off, n) = (offset as libc::off64_t, len as libc::off64_t);
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: plain system calls on a descriptor the caller keeps open; no memory is
    // passed.
    if unsafe { libc::sync_file_range(fd.as_raw_fd(), off, n, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    match unsafe { libc::posix_fadvise(fd.as_raw_fd(), off, n, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// `madvise(addr, len, advice)`.
///
/// # Safety
/// The range must be a mapping owned by the caller; advices such as `MADV_DONTNEED`
/// discard its contents.
pub unsafe fn madvise(addr: *mut u8, len: usize, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: the caller owns the range (function contract).
    if unsafe { libc::madvise(addr.cast(), len, advice) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks the kernel to start reading the pages covering `[addr, addr + len)` (part of a
/// file mapping) into memory now (`MADV_WILLNEED`), so that touching them later does not
/// wait for the disk page by page. Only the kernel sees the address, which may name
/// anything: a range that is not mapped is an error, ignored like every other (a hint);
/// anonymous memory is not affected.
pub fn will_need(addr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let page = page_size();
    let start = addr as usize & !(page - 1);
    let end = (addr as usize).saturating_add(len);
    // SAFETY: madvise(WILLNEED) reads no memory of this process and changes none; for an
    // address that is not mapped it fails with ENOMEM, which is ignored.
    let _ = unsafe { madvise(start as *mut u8, end - start, libc::MADV_WILLNEED) };
}

/// Hints the CPU to bring the cache line holding `addr` into its caches: for loops that
/// know which scattered lines they will touch a few iterations ahead. Never faults, even
/// for an address that is not mapped; a no-op on other architectures.
#[inline]
pub fn prefetch(addr: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 only hints the cache; it reads nothing architecturally and
    // cannot fault, whatever the address. SSE is part of the x86_64 baseline.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// `msync(addr, len, MS_SYNC)` on the pages covering the range.
///
/// # Safety
/// The range must lie in a live mapping.
pub unsafe fn msync(addr: *const u8, len: usize) -> io::Result<()> {
    let page = page_size();
    let start = addr as usize & !(page - 1);
    let end = addr as usize + len;
    // SAFETY: the rounded-down start is in the same mapping as addr (mappings are
    // page-aligned), and the caller guarantees the range is live.
    if unsafe { libc::msync(start as *mut libc::c_void, end - start, libc::MS_SYNC) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The file system type (`statfs.f_type`) holding the open file.
pub fn fs_type(fd: BorrowedFd<'_>) -> io::Result<i64> {
    // SAFETY: statfs is plain data; all-zero is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_type as i64)
}

/// Bytes available to an unprivileged writer on the file system holding the file.
pub fn fs_available(fd: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: statvfs is plain data; all-zero is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    if unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}

/// `mbind(addr, len, MPOL_BIND, {node}, ..)`: future page faults in the range take memory
/// from `node` only.
///
/// # Safety
/// The range must be an anonymous mapping owned by the caller.
pub unsafe fn mbind_node(addr: *mut u8, len: usize, node: u32) -> io::Result<()> {
    const MPOL_BIND: libc::c_long = 2;
    let bits = u64::BITS as usize;
    let words = node as usize / bits + 1;
    let mut mask = vec![0u64; words];
    mask[node as usize / bits] |= 1u64 << (node as usize % bits);
    // maxnode counts bits and the kernel ignores the last one.
    let maxnode = (words * bits + 1) as libc::c_ulong;
    // SAFETY: mask outlives the call and holds maxnode-1 bits; the caller owns the range.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            addr,
            len,
            MPOL_BIND,
            mask.as_ptr(),
            maxnode,
            0 as libc::c_ulong,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The NUMA node of the CPU this thread runs on (0 where the kernel cannot say).
pub fn current_node() -> u32 {
    let mut cpu: libc::c_uint = 0;
    let mut node: libc::c_uint = 0;
    // SAFETY: both out-pointers are valid; the third argument is unused by the kernel.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_getcpu,
            &mut cpu as *mut libc::c_uint,
            &mut node as *mut libc::c_uint,
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    if rc == 0 {
        node
    } else {
        0
    }
}

/// The CPU time this process has used so far, in user and in system mode
/// (`getrusage(RUSAGE_SELF)`); zero for both where the call fails.
pub fn cpu_times() -> (std::time::Duration, std::time::Duration) {
    let mut ru = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the pointed-to buffer, which is large
    // enough and lives for the call; all-zero bytes are a valid rusage if it fails.
    let ru = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, ru.as_mut_ptr());
        ru.assume_init()
    };
    let time = |t: libc::timeval| {
        std::time::Duration::new(
            t.tv_sec.max(0) as u64,
            (t.tv_usec.clamp(0, 999_999) * 1000) as u32,
        )
    };
    (time(ru.ru_utime), time(ru.ru_stime))
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_times_never_go_backwards() {
        let (user, system) = super::cpu_times();
        let mut x = 0u64;
        for i in 0..1_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let (user2, system2) = super::cpu_times();
        assert!(user2 >= user && system2 >= system);
        assert!(
            user2 + system2 > std::time::Duration::ZERO,
            "this process has run"
        );
    }

    #[test]
    fn the_coarse_clock_reads_the_wall_clock_to_the_second() {
        let fine = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap()
        };
        let before = fine();
        let coarse = super::unix_seconds_coarse();
        let after = fine();
        // A tick behind the fine clock at most, which can cross one second boundary.
        assert!(
            before - 1 <= coarse && coarse <= after,
            "{before} {coarse} {after}"
        );
    }
}

//! The native C API (`include/terrace.h`): kinds, allocation and statistics.
//!
//! Return convention: functions returning `int` give 0 on success or a positive errno
//! value (also stored in `errno`); functions returning pointers give NULL on failure with
//! `errno` set. `terrace_last_error()` explains the last failure on the calling thread.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::path::PathBuf;
use std::ptr::{self, NonNull};

use terrace_kinds::{FileKindOptions, FileLocation, Kind, KindError, PageSize, Strategy};

use crate::error;
use crate::handle::Handle;

/// `terrace_kind_create_file` flag: `path` names a file to create and keep, not a
/// directory for an unlinked temporary file.
pub const TERRACE_FILE_KEEP: c_uint = 1;
/// `terrace_kind_create_file` flag: punch freed memory out of the file.
pub const TERRACE_FILE_HOLE_PUNCH: c_uint = 2;
/// `terrace_kind_create_file` flag: reserve file blocks only on demand, never ahead.
pub const TERRACE_FILE_NO_RESERVE_AHEAD: c_uint = 4;

/// Statistics of a kind, in bytes (`terrace_kind_stats_t`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TerraceKindStats {
    pub allocated: u64,
    pub active: u64,
    pub resident: u64,
    pub capacity: u64,
    pub reserved: u64,
}

fn fail(err: &KindError) -> c_int {
    error::record(err)
}

/// Stores `kind`'s handle in `out`, or records `err`.
fn publish(result: Result<Kind, KindError>, out: *mut Handle) -> c_int {
    if out.is_null() {
        return fail(&KindError::NoSuchKind);
    }
    match result {
        Ok(kind) => {
            // SAFETY: out is non-null and, per the header, points to a writable handle.
            unsafe { out.write(Handle::of(kind)) };
            0
        }
        Err(e) => fail(&e),
    }
}

/// # Safety
/// `s` must be null or a NUL-terminated string.
pub(crate) unsafe fn path_arg(s: *const c_char) -> Result<PathBuf, KindError> {
    if s.is_null() {
        return Err(KindError::Media(terrace_media::MediaError::InvalidSize {
            size: 0,
            why: "path is NULL",
        }));
    }
    // SAFETY: non-null and NUL-terminated (contract).
    let text = unsafe { CStr::from_ptr(s) };
    use std::os::unix::ffi::OsStrExt;
    Ok(PathBuf::from(std::ffi::OsStr::from_bytes(text.to_bytes())))
}

/// The default DRAM kind.
#[no_mangle]
pub extern "C" fn terrace_kind_default() -> Handle {
    error::boundary("terrace_kind_default", Handle::NULL, || {
        Handle::of(Kind::DEFAULT)
    })
}

/// Creates a file kind of at most `max_size` bytes in directory `path` (see the
/// `TERRACE_FILE_*` flags).
///
/// # Safety
/// `path` must be a NUL-terminated string; `out` a writable handle.
#[no_mangle]
pub unsafe extern "C" fn terrace_kind_create_file(
    path: *const c_char,
    max_size: usize,
    flags: c_uint,
    out: *mut Handle,
) -> c_int {
    error::boundary("terrace_kind_create_file", error::PANIC_ERRNO, || {
        // SAFETY: forwarded contract.
        let result = unsafe { path_arg(path) }.and_then(|path| {
            let location = if flags & TERRACE_FILE_KEEP != 0 {
                FileLocation::Path(path)
            } else {
                FileLocation::TempIn(path)
            };
            Kind::create_file(&FileKindOptions {
                location,
                max_size,
                hole_punching: flags & TERRACE_FILE_HOLE_PUNCH != 0,
                reserve_ahead: (flags & TERRACE_FILE_NO_RESERVE_AHEAD != 0).then_some(0),
            })
        });
        publish(result, out)
    })
}

/// Creates a DRAM kind of its own (optionally on transparent huge pages).
///
/// # Safety
/// `out` must be a writable handle.
#[no_mangle]
pub unsafe extern "C" fn terrace_kind_create_dram(huge_pages: c_int, out: *mut Handle) -> c_int {
    error::boundary("terrace_kind_create_dram", error::PANIC_ERRNO, || {
        let pages = if huge_pages != 0 {
            PageSize::Huge
        } else {
            PageSize::Base
        };
        publish(Kind::create_dram(pages), out)
    })
}

/// Creates a kind on NUMA node `node`.
///
/// # Safety
/// `out` must be a writable handle.
#[no_mangle]
pub unsafe extern "C" fn terrace_kind_create_numa(node: c_uint, out: *mut Handle) -> c_int {
    error::boundary("terrace_kind_create_numa", error::PANIC_ERRNO, || {
        publish(Kind::create_numa(node), out)
    })
}

/// Creates a unified kind over `count` members: strategy 0 = round-robin, 1 = ordered,
/// 2 = NUMA-local.
///
/// # Safety
/// `members` must point to `count` handles; `out` must be a writable handle.
#[no_mangle]
pub unsafe extern "C" fn terrace_kind_create_unified(
    members: *const Handle,
    count: usize,
    strategy: c_int,
    out: *mut Handle,
) -> c_int {
    error::boundary("terrace_kind_create_unified", error::PANIC_ERRNO, || {
        let strategy = match strategy {
            0 => Strategy::RoundRobin,
            1 => Strategy::Ordered,
            2 => Strategy::NumaLocal,
            _ => {
                return fail(&KindError::Unsupported {
                    kind: "unified".into(),
                    why: "unknown strategy",
                })
            }
        };
        if members.is_null() || count == 0 {
            return fail(&KindError::EmptyUnified);
        }
        // SAFETY: members points to count handles (contract).
        let handles = unsafe { std::slice::from_raw_parts(members, count) };
        let kinds: Result<Vec<Kind>, KindError> = handles.iter().map(|h| h.kind()).collect();
        publish(kinds.and_then(|k| Kind::create_unified(&k, strategy)), out)
    })
}

/// Destroys a kind and everything allocated from it.
#[no_mangle]
pub extern "C" fn terrace_kind_destroy(kind: Handle) -> c_int {
    error::boundary("terrace_kind_destroy", error::PANIC_ERRNO, || {
        match kind.kind().and_then(|k| k.destroy()) {
            Ok(()) => 0,
            Err(e) => fail(&e),
        }
    })
}

fn pointer_result(result: Result<NonNull<u8>, KindError>) -> *mut c_void {
    match result {
        Ok(p) => p.as_ptr().cast(),
        Err(e) => {
            fail(&e);
            std::ptr::null_mut()
        }
    }
}

/// Allocates `size` bytes from `kind`; NULL with errno on failure (size 0 included).
#[no_mangle]
pub extern "C" fn terrace_malloc(kind: Handle, size: usize) -> *mut c_void {
    error::boundary("terrace_malloc", ptr::null_mut(), || {
        pointer_result(kind.kind().and_then(|k| k.malloc(size)))
    })
}

/// Allocates `count * size` zeroed bytes from `kind`.
#[no_mangle]
pub extern "C" fn terrace_calloc(kind: Handle, count: usize, size: usize) -> *mut c_void {
    error::boundary("terrace_calloc", ptr::null_mut(), || {
        pointer_result(kind.kind().and_then(|k| k.calloc(count, size)))
    })
}

/// Resizes `ptr` to `size` bytes in `kind` (or, if `kind` is NULL, in the kind owning
/// `ptr`). NULL `ptr` allocates; size 0 frees and returns NULL. On failure returns NULL and
/// leaves `ptr` untouched.
///
/// # Safety
/// `ptr` must be NULL or a live allocation from a kind.
#[no_mangle]
pub unsafe extern "C" fn terrace_realloc(
    kind: Handle,
    ptr: *mut c_void,
    size: usize,
) -> *mut c_void {
    error::boundary("terrace_realloc", ptr::null_mut(), || {
        let ptr = NonNull::new(ptr.cast::<u8>());
        let target = if kind == Handle::NULL {
            match ptr.and_then(|p| terrace_kinds::detect_kind(p.as_ptr())) {
                Some(k) => Ok(k),
                None => Err(KindError::NoSuchKind),
            }
        } else {
            kind.kind()
        };
        // SAFETY: forwarded contract.
        match target.and_then(|k| unsafe { k.realloc(ptr, size) }) {
            Ok(Some(p)) => p.as_ptr().cast(),
            Ok(None) => std::ptr::null_mut(),
            Err(e) => {
                fail(&e);
                std::ptr::null_mut()
            }
        }
    })
}

/// Allocates `size` bytes aligned to `alignment` into `*out`. Returns 0, EINVAL (bad
/// alignment or kind) or ENOMEM. Size 0 stores NULL and returns 0.
///
/// # Safety
/// `out` must be writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_posix_memalign(
    kind: Handle,
    out: *mut *mut c_void,
    alignment: usize,
    size: usize,
) -> c_int {
    error::boundary("terrace_posix_memalign", error::PANIC_ERRNO, || {
        if out.is_null() {
            return fail(&KindError::BadAlignment { align: alignment });
        }
        let result = kind
            .kind()
            .and_then(|k| match k.aligned_alloc(alignment, size) {
                Err(KindError::ZeroSize) => Ok(None),
                other => other.map(Some),
            });
        match result {
            Ok(p) => {
                // SAFETY: out is writable (contract).
                unsafe { out.write(p.map_or(std::ptr::null_mut(), |p| p.as_ptr().cast())) };
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// Frees `ptr` into its kind; does nothing for NULL or a pointer no kind owns.
///
/// # Safety
/// `ptr` must be NULL, foreign, or a live allocation from a kind.
#[no_mangle]
pub unsafe extern "C" fn terrace_free(ptr: *mut c_void) {
    error::boundary("terrace_free", (), || {
        // SAFETY: forwarded contract.
        unsafe { terrace_kinds::free(ptr.cast()) };
    })
}

/// Usable size of an allocation; 0 for NULL or a pointer no kind owns.
///
/// # Safety
/// As for `terrace_free`.
#[no_mangle]
pub unsafe extern "C" fn terrace_usable_size(ptr: *const c_void) -> usize {
    error::boundary("terrace_usable_size", 0, || {
        // SAFETY: forwarded contract.
        unsafe { terrace_kinds::usable_size(ptr.cast()) }
    })
}

/// The kind owning `ptr`, or NULL.
#[no_mangle]
pub extern "C" fn terrace_detect_kind(ptr: *const c_void) -> Handle {
    error::boundary("terrace_detect_kind", Handle::NULL, || {
        terrace_kinds::detect_kind(ptr.cast()).map_or(Handle::NULL, Handle::owner_of)
    })
}

/// Fills `*out` with the statistics of `kind`.
///
/// # Safety
/// `out` must be writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_kind_stats(kind: Handle, out: *mut TerraceKindStats) -> c_int {
    error::boundary("terrace_kind_stats", error::PANIC_ERRNO, || {
        if out.is_null() {
            return fail(&KindError::NoSuchKind);
        }
        match kind.kind().and_then(|k| k.stats()) {
            Ok(s) => {
                // SAFETY: out is writable (contract).
                unsafe {
                    out.write(TerraceKindStats {
                        allocated: s.allocated,
                        active: s.active,
                        resident: s.resident,
                        capacity: s.capacity,
                        reserved: s.reserved,
                    })
                };
                0
            }
            Err(e) => fail(&e),
        }
    })
}

/// The message of the last error on the calling thread ("" if none).
#[no_mangle]
pub extern "C" fn terrace_last_error() -> *const c_char {
    error::boundary("terrace_last_error", c"".as_ptr(), error::last_message)
}

//! The memkind-compatible subset (`include/memkind.h`): the functions, static kinds, error
//! codes and configuration calls typical memkind programs use (Hazelcast's off-heap store,
//! the PMem examples, `shared/anchors/memkind_speed.c`), with memkind's semantics:
//! - `memkind_malloc(kind, 0)` returns NULL; `memkind_realloc(kind, p, 0)` frees `p`;
//! - `memkind_free(kind, p)` ignores `kind` and finds the owner (memkind trusts it; a wrong
//!   kind there corrupts memkind's heap, here it cannot);
//! - creation calls return 0 or a negative `MEMKIND_ERROR_*` code.
//!
//! Differences, documented in the header: freeing a pointer no kind owns is a no-op; the
//! number of kinds is limited only by the engine's 4,095 arenas; `max_size == 0` for a PMem
//! kind means "what the file system has free now".

use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;

use terrace_kinds::{FileKindOptions, FileLocation, Kind, KindError};
use terrace_media::{FileOptions, MediaError, Region};

use crate::error;
use crate::handle::Handle;
use crate::native;
use terrace_kinds::Selection;

pub const MEMKIND_SUCCESS: c_int = 0;
pub const MEMKIND_ERROR_UNAVAILABLE: c_int = -1;
pub const MEMKIND_ERROR_MBIND: c_int = -2;
pub const MEMKIND_ERROR_MMAP: c_int = -3;
pub const MEMKIND_ERROR_MALLOC: c_int = -6;
pub const MEMKIND_ERROR_INVALID: c_int = -13;
pub const MEMKIND_ERROR_TOOMANY: c_int = -15;
pub const MEMKIND_ERROR_MEMTYPE_NOT_AVAILABLE: c_int = -20;
pub const MEMKIND_ERROR_OPERATION_FAILED: c_int = -21;
pub const MEMKIND_ERROR_ARENAS_CREATE: c_int = -22;
pub const MEMKIND_ERROR_RUNTIME: c_int = -255;

/// memkind's minimum PMem kind size.
pub const MEMKIND_PMEM_MIN_SIZE: usize = terrace_kinds::MIN_FILE_KIND_SIZE;

#[no_mangle]
pub static MEMKIND_DEFAULT: Handle = Handle::of(Kind::DEFAULT);
#[no_mangle]
pub static MEMKIND_REGULAR: Handle = Handle::selection(Selection::Regular);
#[no_mangle]
pub static MEMKIND_HIGHEST_CAPACITY: Handle = Handle::selection(Selection::HighestCapacity);
#[no_mangle]
pub static MEMKIND_HIGHEST_CAPACITY_LOCAL: Handle = Handle::selection(Selection::HighestCapacity);
#[no_mangle]
pub static MEMKIND_LOWEST_LATENCY_LOCAL: Handle = Handle::selection(Selection::LowestLatencyLocal);
#[no_mangle]
pub static MEMKIND_DAX_KMEM: Handle = Handle::selection(Selection::CpuLessMemory);
#[no_mangle]
pub static MEMKIND_DAX_KMEM_ALL: Handle = Handle::selection(Selection::CpuLessMemory);

/// The memkind error code for a kinds error (also recorded as the thread's last error).
fn code_of(err: &KindError) -> c_int {
    error::record(err);
    let code = memkind_code(err);
    error::tag_memkind_code(code);
    code
}

fn memkind_code(err: &KindError) -> c_int {
    match err {
        KindError::SizeTooSmall { .. }
        | KindError::BadAlignment { .. }
        | KindError::NoSuchKind
        | KindError::ZeroSize
        | KindError::EmptyUnified
        | KindError::Unsupported { .. } => MEMKIND_ERROR_INVALID,
        KindError::TooManyKinds { .. } => MEMKIND_ERROR_TOOMANY,
        KindError::OutOfMemory { .. } | KindError::TooLarge { .. } => MEMKIND_ERROR_MALLOC,
        KindError::Engine { .. } => MEMKIND_ERROR_ARENAS_CREATE,
        KindError::Media(media) => match media {
            MediaError::Open { .. } | MediaError::InvalidSize { .. } => MEMKIND_ERROR_INVALID,
            MediaError::Map { .. } | MediaError::NoSpace { .. } | MediaError::Io { .. } => {
                MEMKIND_ERROR_MMAP
            }
            MediaError::Bind { .. } => MEMKIND_ERROR_MBIND,
            MediaError::NoSuchNode { .. } => MEMKIND_ERROR_MEMTYPE_NOT_AVAILABLE,
            _ => MEMKIND_ERROR_RUNTIME,
        },
        _ => MEMKIND_ERROR_RUNTIME,
    }
}

/// memkind's memory usage policies.
pub const MEMKIND_MEM_USAGE_POLICY_DEFAULT: c_int = 0;
pub const MEMKIND_MEM_USAGE_POLICY_CONSERVATIVE: c_int = 1;

/// `struct memkind_config`: settings for `memkind_create_pmem_with_config`.
pub struct MemkindConfig {
    path: Option<std::path::PathBuf>,
    size: usize,
    policy: c_int,
}

fn create_pmem(
    dir: std::path::PathBuf,
    max_size: usize,
    conservative: bool,
) -> Result<Kind, KindError> {
    let max_size = if max_size == 0 {
        // memkind: 0 means "limited by the file system".
        let probe = Region::file(&FileOptions::temp_in(
            &dir,
            terrace_media::registry::GRANULE,
        ))?;
        let free = probe.fs_available().unwrap_or(0) as usize;
        free.min(1 << 40)
    } else {
        max_size
    };
    Kind::create_file(&FileKindOptions {
        location: FileLocation::TempIn(dir),
        max_size,
        hole_punching: conservative,
        reserve_ahead: None,
    })
}

/// # Safety
/// `dir` must be a NUL-terminated string and `kind` writable.
#[no_mangle]
pub unsafe extern "C" fn memkind_create_pmem(
    dir: *const c_char,
    max_size: usize,
    kind: *mut Handle,
) -> c_int {
    error::boundary("memkind_create_pmem", MEMKIND_ERROR_RUNTIME, || {
        if kind.is_null() {
            return MEMKIND_ERROR_INVALID;
        }
        // SAFETY: forwarded contract.
        match unsafe { native::path_arg(dir) }.and_then(|dir| create_pmem(dir, max_size, false)) {
            Ok(k) => {
                // SAFETY: kind is writable (contract).
                unsafe { kind.write(Handle::of(k)) };
                MEMKIND_SUCCESS
            }
            Err(e) => code_of(&e),
        }
    })
}

#[no_mangle]
pub extern "C" fn memkind_config_new() -> *mut MemkindConfig {
    error::boundary("memkind_config_new", ptr::null_mut(), || {
        Box::into_raw(Box::new(MemkindConfig {
            path: None,
            size: 0,
            policy: MEMKIND_MEM_USAGE_POLICY_DEFAULT,
        }))
    })
}

/// # Safety
/// `cfg` must come from `memkind_config_new` and not be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn memkind_config_delete(cfg: *mut MemkindConfig) {
    error::boundary("memkind_config_delete", (), || {
        if !cfg.is_null() {
            // SAFETY: created by Box::into_raw in memkind_config_new (contract).
            drop(unsafe { Box::from_raw(cfg) });
        }
    })
}

/// # Safety
/// `cfg` from `memkind_config_new`; `path` NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn memkind_config_set_path(cfg: *mut MemkindConfig, path: *const c_char) {
    error::boundary("memkind_config_set_path", (), || {
        // SAFETY: cfg is live or null (contract); path is NUL-terminated or null.
        if let (Some(cfg), Ok(path)) = (unsafe { cfg.as_mut() }, unsafe { native::path_arg(path) })
        {
            cfg.path = Some(path);
        }
    })
}

/// # Safety
/// `cfg` from `memkind_config_new`.
#[no_mangle]
pub unsafe extern "C" fn memkind_config_set_size(cfg: *mut MemkindConfig, size: usize) {
    error::boundary("memkind_config_set_size", (), || {
        // SAFETY: cfg is live or null (contract).
        if let Some(cfg) = unsafe { cfg.as_mut() } {
            cfg.size = size;
        }
    })
}

/// # Safety
/// `cfg` from `memkind_config_new`.
#[no_mangle]
pub unsafe extern "C" fn memkind_config_set_memory_usage_policy(
    cfg: *mut MemkindConfig,
    policy: c_int,
) {
    error::boundary("memkind_config_set_memory_usage_policy", (), || {
        // SAFETY: cfg is live or null (contract).
        if let Some(cfg) = unsafe { cfg.as_mut() } {
            cfg.policy = policy;
        }
    })
}

/// # Safety
/// `cfg` from `memkind_config_new`; `kind` writable.
#[no_mangle]
pub unsafe extern "C" fn memkind_create_pmem_with_config(
    cfg: *mut MemkindConfig,
    kind: *mut Handle,
) -> c_int {
    error::boundary(
        "memkind_create_pmem_with_config",
        MEMKIND_ERROR_RUNTIME,
        || {
            // SAFETY: cfg is live or null (contract).
            let Some(cfg) = (unsafe { cfg.as_ref() }) else {
                return MEMKIND_ERROR_INVALID;
            };
            let Some(path) = cfg.path.clone() else {
                return MEMKIND_ERROR_INVALID;
            };
            if kind.is_null() || !(0..=1).contains(&cfg.policy) {
                return MEMKIND_ERROR_INVALID;
            }
            match create_pmem(
                path,
                cfg.size,
                cfg.policy == MEMKIND_MEM_USAGE_POLICY_CONSERVATIVE,
            ) {
                Ok(k) => {
                    // SAFETY: kind is writable (contract).
                    unsafe { kind.write(Handle::of(k)) };
                    MEMKIND_SUCCESS
                }
                Err(e) => code_of(&e),
            }
        },
    )
}

/// 0 when `dir` is on a DAX file system (a `MAP_SYNC` mapping works there), else
/// `MEMKIND_ERROR_INVALID`.
///
/// # Safety
/// `dir` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn memkind_check_dax_path(dir: *const c_char) -> c_int {
    error::boundary("memkind_check_dax_path", MEMKIND_ERROR_RUNTIME, || {
        // SAFETY: forwarded contract.
        let probe = unsafe { native::path_arg(dir) }.and_then(|dir| {
            Ok(Region::file(&FileOptions::temp_in(
                dir,
                terrace_media::registry::GRANULE,
            ))?)
        });
        match probe {
            Ok(region) if region.is_dax() => MEMKIND_SUCCESS,
            Ok(_) => MEMKIND_ERROR_INVALID,
            Err(e) => {
                code_of(&e);
                MEMKIND_ERROR_INVALID
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn memkind_destroy_kind(kind: Handle) -> c_int {
    error::boundary("memkind_destroy_kind", MEMKIND_ERROR_RUNTIME, || match kind
        .kind()
        .and_then(|k| k.destroy())
    {
        Ok(()) => MEMKIND_SUCCESS,
        Err(e) => code_of(&e),
    })
}

/// 0 when the kind can serve allocations on this machine.
#[no_mangle]
pub extern "C" fn memkind_check_available(kind: Handle) -> c_int {
    error::boundary(
        "memkind_check_available",
        MEMKIND_ERROR_UNAVAILABLE,
        || match kind.kind() {
            Ok(k) if k.is_live() => MEMKIND_SUCCESS,
            _ => MEMKIND_ERROR_UNAVAILABLE,
        },
    )
}

#[no_mangle]
pub extern "C" fn memkind_malloc(kind: Handle, size: usize) -> *mut c_void {
    error::boundary("memkind_malloc", ptr::null_mut(), || {
        native::terrace_malloc(kind, size)
    })
}

#[no_mangle]
pub extern "C" fn memkind_calloc(kind: Handle, num: usize, size: usize) -> *mut c_void {
    error::boundary("memkind_calloc", ptr::null_mut(), || {
        native::terrace_calloc(kind, num, size)
    })
}

/// # Safety
/// `memptr` writable.
#[no_mangle]
pub unsafe extern "C" fn memkind_posix_memalign(
    kind: Handle,
    memptr: *mut *mut c_void,
    alignment: usize,
    size: usize,
) -> c_int {
    error::boundary("memkind_posix_memalign", error::PANIC_ERRNO, || {
        // SAFETY: forwarded contract.
        unsafe { native::terrace_posix_memalign(kind, memptr, alignment, size) }
    })
}

/// # Safety
/// `ptr` NULL or a live allocation from a kind.
#[no_mangle]
pub unsafe extern "C" fn memkind_realloc(
    kind: Handle,
    ptr: *mut c_void,
    size: usize,
) -> *mut c_void {
    error::boundary("memkind_realloc", ptr::null_mut(), || {
        // SAFETY: forwarded contract.
        unsafe { native::terrace_realloc(kind, ptr, size) }
    })
}

/// # Safety
/// `ptr` NULL, foreign, or a live allocation from a kind.
#[no_mangle]
pub unsafe extern "C" fn memkind_free(_kind: Handle, ptr: *mut c_void) {
    error::boundary("memkind_free", (), || {
        // SAFETY: forwarded contract.
        unsafe { native::terrace_free(ptr) }
    })
}

/// # Safety
/// As for `memkind_free`.
#[no_mangle]
pub unsafe extern "C" fn memkind_malloc_usable_size(_kind: Handle, ptr: *mut c_void) -> usize {
    error::boundary("memkind_malloc_usable_size", 0, || {
        // SAFETY: forwarded contract.
        unsafe { native::terrace_usable_size(ptr) }
    })
}

#[no_mangle]
pub extern "C" fn memkind_detect_kind(ptr: *mut c_void) -> Handle {
    error::boundary("memkind_detect_kind", Handle::NULL, || {
        native::terrace_detect_kind(ptr)
    })
}

/// Objects never need moving to reduce fragmentation here: always NULL.
#[no_mangle]
pub extern "C" fn memkind_defrag_reallocate(_kind: Handle, _ptr: *mut c_void) -> *mut c_void {
    error::boundary("memkind_defrag_reallocate", ptr::null_mut(), || {
        std::ptr::null_mut()
    })
}

/// Statistics are read fresh on every call; nothing to refresh.
#[no_mangle]
pub extern "C" fn memkind_update_cached_stats() -> c_int {
    error::boundary("memkind_update_cached_stats", MEMKIND_ERROR_RUNTIME, || {
        MEMKIND_SUCCESS
    })
}

pub const MEMKIND_STAT_TYPE_RESIDENT: c_int = 0;
pub const MEMKIND_STAT_TYPE_ACTIVE: c_int = 1;
pub const MEMKIND_STAT_TYPE_ALLOCATED: c_int = 2;

/// # Safety
/// `value` writable.
#[no_mangle]
pub unsafe extern "C" fn memkind_get_stat(kind: Handle, stat: c_int, value: *mut usize) -> c_int {
    error::boundary("memkind_get_stat", MEMKIND_ERROR_RUNTIME, || {
        if value.is_null() {
            return MEMKIND_ERROR_INVALID;
        }
        let stats = match kind.kind().and_then(|k| k.stats()) {
            Ok(s) => s,
            Err(e) => return code_of(&e),
        };
        let v = match stat {
            MEMKIND_STAT_TYPE_RESIDENT => stats.resident,
            MEMKIND_STAT_TYPE_ACTIVE => stats.active,
            MEMKIND_STAT_TYPE_ALLOCATED => stats.allocated,
            _ => return MEMKIND_ERROR_INVALID,
        };
        // SAFETY: value is writable (contract).
        unsafe { value.write(v as usize) };
        MEMKIND_SUCCESS
    })
}

/// memkind API level implemented (1.14.0), as `major * 1000000 + minor * 1000 + patch`.
#[no_mangle]
pub extern "C" fn memkind_get_version() -> c_int {
    error::boundary("memkind_get_version", 1_014_000, || 1_014_000)
}

/// Writes the text of a memkind error code into `msg`, NUL-terminated and truncated to
/// `size`; when the calling thread's last failure produced this code, its detail (which
/// path, which size) is appended.
///
/// # Safety
/// `msg` must hold `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn memkind_error_message(err: c_int, msg: *mut c_char, size: usize) {
    error::boundary("memkind_error_message", (), || {
        if msg.is_null() || size == 0 {
            return;
        }
        let base = match err {
            MEMKIND_SUCCESS => "<memkind> success",
            MEMKIND_ERROR_UNAVAILABLE => "<memkind> Requested memory kind is not available",
            MEMKIND_ERROR_MBIND => "<memkind> Call to mbind() failed",
            MEMKIND_ERROR_MMAP => "<memkind> Call to mmap() or fallocate() failed",
            MEMKIND_ERROR_MALLOC => "<memkind> Call to malloc() failed",
            MEMKIND_ERROR_INVALID => "<memkind> Invalid argument",
            MEMKIND_ERROR_TOOMANY => {
                "<memkind> Attempted to initialize more than maximum number of kinds"
            }
            MEMKIND_ERROR_MEMTYPE_NOT_AVAILABLE => {
                "<memkind> Requested memory type is not available"
            }
            MEMKIND_ERROR_OPERATION_FAILED => "<memkind> Operation failed",
            MEMKIND_ERROR_ARENAS_CREATE => "<memkind> Call to jemalloc's arenas.create() failed",
            _ => "<memkind> Undefined error number",
        };
        // SAFETY: last_message returns a NUL-terminated string owned by this thread.
        let detail = unsafe { CStr::from_ptr(error::last_message()) }.to_string_lossy();
        // Detail only when this thread's last error was recorded for this very code.
        let text =
            if detail.is_empty() || err == MEMKIND_SUCCESS || error::last_memkind_code() != err {
                base.to_string()
            } else {
                format!("{base}: {detail}")
            };
        let bytes = text.as_bytes();
        let n = bytes.len().min(size - 1);
        // SAFETY: msg holds size bytes (contract) and n < size.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), msg.cast::<u8>(), n);
            *msg.add(n) = 0;
        }
    })
}

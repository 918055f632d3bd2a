//! The native C API of the persistent pool (`include/terrace_pool.h`) over `terrace-pool`.
//!
//! - A `terrace_pool *` is the same leaked [`PoolHandle`] the libpmemobj shim uses
//!   ([`crate::pmemobj`]): opening, closing, the table of open pools and the per-thread
//!   transactions are shared with it, not duplicated.
//! - Objects are 64-bit pool offsets (0 is null). A `uint64_t *` destination inside the
//!   pool is published crash-atomically by the pool (`HandleAt::Word`); one in volatile
//!   memory is written after the call; NULL means the caller keeps the returned offset.
//! - Return convention (as `terrace.h`): functions returning `int` give 0 or a positive
//!   errno value (also stored in `errno`); functions returning an offset give 0, and
//!   functions returning a pointer NULL, with `errno` set. `terrace_last_error()` explains
//!   the last failure on the calling thread.
//! - No panic crosses the boundary: every entry point runs under [`error::boundary`]
//!   (directly or through `with_pool`); a panic is `EIO`, and the transaction entry
//!   points abort the thread's transaction (`pmemobj::tx_boundary`).

use std::ffi::{c_char, c_int, c_void};
use std::ptr;

use terrace_pool::{
    Backend, ClassDesc, ClassId, HandleAt, HeaderType, Oid, Pool, PoolError, RunSize,
};

use crate::error;
use crate::pmemobj::{self, fail, fail_with, in_tx, str_arg, PoolHandle};

/// `TERRACE_POOL_ANY_TYPE`: iterate over objects of every type (except the root's).
pub const TERRACE_POOL_ANY_TYPE: u64 = u64::MAX;

/// `struct terrace_pool_stats`, in bytes unless said otherwise.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TerracePoolStats {
    pub pool_size: u64,
    pub heap_bytes: u64,
    pub free_bytes: u64,
    pub allocated_bytes: u64,
    pub run_slack_bytes: u64,
    /// Number of runs (slabs of small objects).
    pub runs: u64,
    /// Number of extents (large objects).
    pub extents: u64,
}

/// # Safety
/// `pool` NULL or an open pool that stays open during the returned reference's use.
unsafe fn pool_arg<'a>(what: &str, pool: *mut PoolHandle) -> Result<&'a PoolHandle, c_int> {
    // SAFETY: contract.
    unsafe { pool.as_ref() }
        .ok_or_else(|| fail_with(libc::EINVAL, &format!("{what}: pool is NULL")))
}

/// Runs `f` on the pool behind `pool` under [`error::boundary`] (a panic is `EIO`), or fails with
/// `EINVAL` when `pool` is NULL: the preamble of every entry point taking a pool.
///
/// # Safety
/// `pool` NULL or an open pool that stays open for the call.
unsafe fn with_pool(
    what: &str,
    pool: *mut PoolHandle,
    f: impl FnOnce(&PoolHandle) -> c_int,
) -> c_int {
    error::boundary(what, libc::EIO, || {
        // SAFETY: contract.
        match unsafe { pool_arg(what, pool) } {
            Ok(h) => f(h),
            Err(code) => code,
        }
    })
}

fn oid_arg(what: &str, off: u64) -> Result<Oid, c_int> {
    Oid::from_offset(off).ok_or_else(|| fail_with(libc::EINVAL, &format!("{what}: offset is 0")))
}

/// Where a `uint64_t *` destination lives: inside `h`'s mapping (published by the pool,
/// `HandleAt::Word`) or not (`HandleAt::None`: written by us after the call).
fn dest_of(h: &PoolHandle, dest: *mut u64) -> HandleAt {
    let at = dest as usize;
    if !dest.is_null() && at >= h.base && at - h.base + 8 <= h.len {
        HandleAt::Word((at - h.base) as u64)
    } else {
        HandleAt::None
    }
}

/// Writes `off` to a volatile destination (an in-pool one was published by the pool).
///
/// # Safety
/// `dest` NULL or writable.
unsafe fn store_volatile(h: &PoolHandle, dest: *mut u64, off: u64) {
    if !dest.is_null() && matches!(dest_of(h, dest), HandleAt::None) {
        // SAFETY: writable (contract), outside the pool.
        unsafe { dest.write(off) };
    }
}

fn errno_result(r: Result<(), c_int>) -> c_int {
    r.err().unwrap_or(0)
}

// ---- pools -------------------------------------------------------------------------------

/// # Safety
/// `path` NUL-terminated; `layout` NUL-terminated or NULL (empty layout).
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_create(
    path: *const c_char,
    size: usize,
    layout: *const c_char,
) -> *mut PoolHandle {
    error::boundary("terrace_pool_create", ptr::null_mut(), || {
        // SAFETY: contract.
        let (Some(path), layout) = (unsafe { str_arg(path) }, unsafe { str_arg(layout) }) else {
            fail_with(
                libc::EINVAL,
                "terrace_pool_create: path is NULL or not UTF-8",
            );
            return ptr::null_mut();
        };
        match Pool::create(path, size as u64, layout.unwrap_or("")) {
            Ok(pool) => pmemobj::publish(pool),
            Err(e) => {
                fail(&e);
                ptr::null_mut()
            }
        }
    })
}

/// Opens `path` with layout `layout`, or any layout for NULL.
fn open_pool(path: &str, layout: Option<&str>) -> Result<Pool, PoolError> {
    match layout {
        Some(layout) => Pool::open(path, layout),
        None => Pool::open_any_layout(path),
    }
}

/// # Safety
/// `path` NUL-terminated; `layout` NUL-terminated or NULL (any layout).
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_open(
    path: *const c_char,
    layout: *const c_char,
) -> *mut PoolHandle {
    error::boundary("terrace_pool_open", ptr::null_mut(), || {
        // SAFETY: contract.
        let Some(path) = (unsafe { str_arg(path) }) else {
            fail_with(libc::EINVAL, "terrace_pool_open: path is NULL or not UTF-8");
            return ptr::null_mut();
        };
        // SAFETY: contract.
        match open_pool(path, unsafe { str_arg(layout) }) {
            Ok(pool) => pmemobj::publish(pool),
            Err(e) => {
                fail(&e);
                ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `pool` NULL or an open pool, not used afterwards (unless `EBUSY` was returned).
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_close(pool: *mut PoolHandle) -> c_int {
    error::boundary("terrace_pool_close", libc::EIO, || {
        // SAFETY: contract.
        let Some(h) = (unsafe { pool.as_ref() }) else {
            return 0;
        };
        if let Some(why) = h.busy() {
            return fail_with(
                libc::EBUSY,
                &format!("terrace_pool_close: {why}; it stays open"),
            );
        }
        // SAFETY: an open pool with no transaction, not used afterwards (contract).
        unsafe { pmemobj::pmemobj_close(pool) };
        0
    })
}

/// # Safety
/// `path` NUL-terminated; `layout` NUL-terminated or NULL (any layout).
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_check(path: *const c_char, layout: *const c_char) -> c_int {
    error::boundary("terrace_pool_check", libc::EIO, || {
        // SAFETY: contract.
        let Some(path) = (unsafe { str_arg(path) }) else {
            return fail_with(
                libc::EINVAL,
                "terrace_pool_check: path is NULL or not UTF-8",
            );
        };
        // SAFETY: contract.
        match open_pool(path, unsafe { str_arg(layout) }).and_then(|pool| pool.check()) {
            Ok(_) => 0,
            Err(e) => fail(&e),
        }
    })
}

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_root(pool: *mut PoolHandle, size: usize) -> u64 {
    error::boundary("terrace_pool_root", 0, || {
        // SAFETY: contract.
        let Ok(h) = (unsafe { pool_arg("terrace_pool_root", pool) }) else {
            return 0;
        };
        let size = if size == 0 {
            match h.pool.root_size() {
                Ok(0) => return 0,
                Ok(existing) => existing,
                Err(e) => {
                    fail(&e);
                    return 0;
                }
            }
        } else {
            size as u64
        };
        h.pool.root(size).map_or_else(
            |e| {
                fail(&e);
                0
            },
            Oid::offset,
        )
    })
}

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_root_size(pool: *mut PoolHandle) -> usize {
    error::boundary("terrace_pool_root_size", 0, || {
        // SAFETY: contract.
        let Ok(h) = (unsafe { pool_arg("terrace_pool_root_size", pool) }) else {
            return 0;
        };
        h.pool.root_size().unwrap_or_else(|e| {
            fail(&e);
            0
        }) as usize
    })
}

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_direct(pool: *mut PoolHandle, off: u64) -> *mut c_void {
    error::boundary("terrace_pool_direct", ptr::null_mut(), || {
        // SAFETY: contract.
        match unsafe { pool.as_ref() } {
            Some(h) if off != 0 && off < h.len as u64 => (h.base + off as usize) as *mut c_void,
            Some(_) if off == 0 => ptr::null_mut(),
            Some(_) => {
                fail_with(libc::EINVAL, "terrace_pool_direct: offset outside the pool");
                ptr::null_mut()
            }
            None => {
                fail_with(libc::EINVAL, "terrace_pool_direct: pool is NULL");
                ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_offset(pool: *mut PoolHandle, addr: *const c_void) -> u64 {
    error::boundary("terrace_pool_offset", 0, || {
        // SAFETY: contract.
        match unsafe { pool.as_ref() } {
            Some(h) if (addr as usize) >= h.base && (addr as usize) - h.base < h.len => {
                (addr as usize - h.base) as u64
            }
            _ => {
                fail_with(
                    libc::EINVAL,
                    "terrace_pool_offset: pool NULL or address outside it",
                );
                0
            }
        }
    })
}

// ---- atomic allocation -------------------------------------------------------------------

/// # Safety
/// `pool` an open pool; `dest` NULL or writable.
unsafe fn alloc_impl(
    what: &str,
    pool: *mut PoolHandle,
    class: Option<u8>,
    size: usize,
    type_num: u64,
    zero: bool,
    dest: *mut u64,
) -> u64 {
    error::boundary(what, 0, || {
        // SAFETY: contract.
        let Ok(h) = (unsafe { pool_arg(what, pool) }) else {
            return 0;
        };
        if size == 0 {
            fail_with(libc::EINVAL, &format!("{what}: size 0"));
            return 0;
        }
        let d = dest_of(h, dest);
        let init = |w: &terrace_pool::ObjectWriter<'_, _>| if zero { w.zero() } else { Ok(()) };
        let result = match class {
            None => h.pool.alloc_with(size as u64, type_num, d, init),
            Some(id) => ClassId::new(u32::from(id))
                .map_err(|_| PoolError::NoSuchClass { id: u32::from(id) })
                .and_then(|c| h.pool.alloc_in(c, size as u64, type_num, d, init)),
        };
        match result {
            Ok(oid) => {
                // SAFETY: dest NULL or writable (contract).
                unsafe { store_volatile(h, dest, oid.offset()) };
                oid.offset()
            }
            Err(e) => {
                fail(&e);
                0
            }
        }
    })
}

/// # Safety
/// `pool` an open pool; `dest` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_alloc(
    pool: *mut PoolHandle,
    size: usize,
    type_num: u64,
    dest: *mut u64,
) -> u64 {
    // SAFETY: forwarded contract.
    unsafe {
        alloc_impl(
            "terrace_pool_alloc",
            pool,
            None,
            size,
            type_num,
            false,
            dest,
        )
    }
}

/// # Safety
/// `pool` an open pool; `dest` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_zalloc(
    pool: *mut PoolHandle,
    size: usize,
    type_num: u64,
    dest: *mut u64,
) -> u64 {
    // SAFETY: forwarded contract.
    unsafe {
        alloc_impl(
            "terrace_pool_zalloc",
            pool,
            None,
            size,
            type_num,
            true,
            dest,
        )
    }
}

/// # Safety
/// `pool` an open pool; `dest` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_alloc_in_class(
    pool: *mut PoolHandle,
    class_id: u8,
    size: usize,
    type_num: u64,
    dest: *mut u64,
) -> u64 {
    // SAFETY: forwarded contract.
    unsafe {
        alloc_impl(
            "terrace_pool_alloc_in_class",
            pool,
            Some(class_id),
            size,
            type_num,
            false,
            dest,
        )
    }
}

/// # Safety
/// `pool` an open pool; `dest` readable and writable, holding 0 or an object of `pool`.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_realloc(
    pool: *mut PoolHandle,
    dest: *mut u64,
    size: usize,
    type_num: u64,
) -> c_int {
    const WHAT: &str = "terrace_pool_realloc";
    let run = |h: &PoolHandle| {
        if dest.is_null() || size == 0 {
            return fail_with(libc::EINVAL, &format!("{WHAT}: destination NULL or size 0"));
        }
        let result = match dest_of(h, dest) {
            d @ HandleAt::Word(_) => h.pool.realloc(d, size as u64, type_num),
            // SAFETY: readable (contract).
            _ => match Oid::from_offset(unsafe { dest.read() }) {
                None => h.pool.alloc(size as u64, type_num, HandleAt::None),
                Some(old) => pmemobj::move_object(&h.pool, old, size as u64, type_num),
            },
        };
        match result {
            Ok(oid) => {
                // SAFETY: writable (contract).
                unsafe { store_volatile(h, dest, oid.offset()) };
                0
            }
            Err(e) => fail(&e),
        }
    };
    // SAFETY: contract (`pool` is NULL or open for the whole call).
    unsafe { with_pool(WHAT, pool, run) }
}

/// # Safety
/// `pool` an open pool; `dest` NULL or readable and writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_free(pool: *mut PoolHandle, dest: *mut u64) -> c_int {
    const WHAT: &str = "terrace_pool_free";
    let run = |h: &PoolHandle| {
        if dest.is_null() {
            return 0;
        }
        let result = match dest_of(h, dest) {
            d @ HandleAt::Word(_) => h.pool.free(d),
            // SAFETY: readable (contract).
            _ => match Oid::from_offset(unsafe { dest.read() }) {
                None => Ok(()),
                Some(o) => h.pool.free_oid(o).map(|()| {
                    // SAFETY: writable (contract), outside the pool.
                    unsafe { dest.write(0) }
                }),
            },
        };
        errno_result(result.map_err(|e| fail(&e)))
    };
    // SAFETY: contract (`pool` is NULL or open for the whole call).
    unsafe { with_pool(WHAT, pool, run) }
}

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_free_off(pool: *mut PoolHandle, off: u64) -> c_int {
    const WHAT: &str = "terrace_pool_free_off";
    let run = |h: &PoolHandle| match Oid::from_offset(off) {
        None => 0,
        Some(o) => errno_result(h.pool.free_oid(o).map_err(|e| fail(&e))),
    };
    // SAFETY: contract (`pool` is NULL or open for the whole call).
    unsafe { with_pool(WHAT, pool, run) }
}

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_usable_size(pool: *mut PoolHandle, off: u64) -> usize {
    const WHAT: &str = "terrace_pool_usable_size";
    error::boundary(WHAT, 0, || {
        // SAFETY: contract.
        let (Ok(h), Ok(o)) = (unsafe { pool_arg(WHAT, pool) }, oid_arg(WHAT, off)) else {
            return 0;
        };
        h.pool.usable_size(o).unwrap_or_else(|e| {
            fail(&e);
            0
        }) as usize
    })
}

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_type_num(pool: *mut PoolHandle, off: u64) -> u64 {
    const WHAT: &str = "terrace_pool_type_num";
    error::boundary(WHAT, u64::MAX, || {
        // SAFETY: contract.
        let (Ok(h), Ok(o)) = (unsafe { pool_arg(WHAT, pool) }, oid_arg(WHAT, off)) else {
            return u64::MAX;
        };
        h.pool.type_of(o).unwrap_or_else(|e| {
            fail(&e);
            u64::MAX
        })
    })
}

// ---- iteration ---------------------------------------------------------------------------

fn objects_of(h: &PoolHandle, type_num: u64) -> Result<Vec<u64>, c_int> {
    let filter = (type_num != TERRACE_POOL_ANY_TYPE).then_some(type_num);
    let objects = h.pool.objects(filter).map_err(|e| fail(&e))?;
    let mut offsets: Vec<u64> = objects.iter().map(|o| o.oid.offset()).collect();
    offsets.sort_unstable();
    Ok(offsets)
}

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_first(pool: *mut PoolHandle, type_num: u64) -> u64 {
    const WHAT: &str = "terrace_pool_first";
    error::boundary(WHAT, 0, || {
        // SAFETY: contract.
        let Ok(h) = (unsafe { pool_arg(WHAT, pool) }) else {
            return 0;
        };
        let Ok(offsets) = objects_of(h, type_num) else {
            return 0;
        };
        let first = offsets.first().copied().unwrap_or(0);
        *h.native_iteration.lock().unwrap_or_else(|p| p.into_inner()) = offsets;
        first
    })
}

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_next(pool: *mut PoolHandle, off: u64) -> u64 {
    const WHAT: &str = "terrace_pool_next";
    error::boundary(WHAT, 0, || {
        // SAFETY: contract.
        let Ok(h) = (unsafe { pool_arg(WHAT, pool) }) else {
            return 0;
        };
        let offsets = h.native_iteration.lock().unwrap_or_else(|p| p.into_inner());
        let next = offsets.partition_point(|&o| o <= off);
        offsets.get(next).copied().unwrap_or(0)
    })
}

/// `int (*)(terrace_pool *, uint64_t off, void *arg)`.
pub type ForeachFn = Option<unsafe extern "C" fn(*mut PoolHandle, u64, *mut c_void) -> c_int>;

/// # Safety
/// `pool` an open pool; `callback` a valid function (it may allocate and free).
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_foreach(
    pool: *mut PoolHandle,
    type_num: u64,
    callback: ForeachFn,
    arg: *mut c_void,
) -> c_int {
    const WHAT: &str = "terrace_pool_foreach";
    let run = |h: &PoolHandle| {
        let Some(callback) = callback else {
            return fail_with(libc::EINVAL, &format!("{WHAT}: callback is NULL"));
        };
        let offsets = match objects_of(h, type_num) {
            Ok(o) => o,
            Err(code) => return code,
        };
        for off in offsets {
            // SAFETY: the caller's function with the caller's argument (contract).
            let r = unsafe { callback(pool, off, arg) };
            if r != 0 {
                return r;
            }
        }
        0
    };
    // SAFETY: contract (`pool` is NULL or open for the whole call).
    unsafe { with_pool(WHAT, pool, run) }
}

// ---- persistence and statistics ------------------------------------------------------------

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_persist(
    pool: *mut PoolHandle,
    addr: *const c_void,
    len: usize,
) -> c_int {
    const WHAT: &str = "terrace_pool_persist";
    let run = |h: &PoolHandle| {
        let at = addr as usize;
        let inside = at >= h.base
            && (at - h.base)
                .checked_add(len)
                .is_some_and(|end| end <= h.len);
        if !inside {
            return fail_with(libc::EINVAL, &format!("{WHAT}: range outside the pool"));
        }
        errno_result(
            h.pool
                .backend()
                .persist((at - h.base) as u64, len as u64)
                .map_err(|e| fail(&e)),
        )
    };
    // SAFETY: contract (`pool` is NULL or open for the whole call).
    unsafe { with_pool(WHAT, pool, run) }
}

/// # Safety
/// `pool` an open pool; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_stats(
    pool: *mut PoolHandle,
    out: *mut TerracePoolStats,
) -> c_int {
    const WHAT: &str = "terrace_pool_stats";
    let run = |h: &PoolHandle| {
        if out.is_null() {
            return fail_with(libc::EINVAL, &format!("{WHAT}: out is NULL"));
        }
        let s = h.pool.stats();
        let stats = TerracePoolStats {
            pool_size: h.pool.size(),
            heap_bytes: s.heap_bytes,
            free_bytes: s.free_bytes,
            allocated_bytes: s.allocated_bytes,
            run_slack_bytes: s.run_slack_bytes,
            runs: s.runs,
            extents: s.extents,
        };
        // SAFETY: non-null and writable (contract).
        unsafe { out.write(stats) };
        0
    };
    // SAFETY: contract (`pool` is NULL or open for the whole call).
    unsafe { with_pool(WHAT, pool, run) }
}

// ---- custom allocation classes -----------------------------------------------------------

/// # Safety
/// `pool` an open pool; `id_out` writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_register_class(
    pool: *mut PoolHandle,
    unit_size: usize,
    units_per_run: u32,
    id_out: *mut u8,
) -> c_int {
    const WHAT: &str = "terrace_pool_register_class";
    let run = |h: &PoolHandle| {
        if id_out.is_null() {
            return fail_with(libc::EINVAL, &format!("{WHAT}: id_out is NULL"));
        }
        let Ok(unit) = u32::try_from(unit_size) else {
            return fail_with(
                libc::EINVAL,
                &format!("{WHAT}: unit size {unit_size} too large"),
            );
        };
        let desc = ClassDesc {
            unit,
            run: if units_per_run == 0 {
                RunSize::Default
            } else {
                RunSize::Units(units_per_run)
            },
            alignment: 0,
            header: HeaderType::None,
        };
        match h.pool.register_class(&desc) {
            Ok(id) => {
                // SAFETY: non-null and writable (contract).
                unsafe { id_out.write(id.get()) };
                0
            }
            Err(e) => fail(&e),
        }
    };
    // SAFETY: contract (`pool` is NULL or open for the whole call).
    unsafe { with_pool(WHAT, pool, run) }
}

// ---- transactions ------------------------------------------------------------------------
//
// The thread's transaction is the libpmemobj shim's (one per thread, nesting flattened);
// each native call additionally checks that the transaction is on `pool`.

/// Fails with `EINVAL` (leaving any transaction alone) unless the calling thread's
/// transaction is on `pool`.
fn tx_is_on(what: &str, pool: *mut PoolHandle) -> Result<(), c_int> {
    match pmemobj::tx_pool() {
        Some(p) if ptr::eq(p, pool) => Ok(()),
        Some(_) => Err(fail_with(
            libc::EINVAL,
            &format!("{what}: the thread's transaction is on another pool"),
        )),
        None => Err(fail_with(
            libc::EINVAL,
            &format!("{what}: no transaction is active"),
        )),
    }
}

/// Runs `op` on the thread's transaction, which must be on `pool` (see `pmemobj::in_tx`:
/// a failure of `op` aborts the transaction).
fn in_pool_tx<T>(
    what: &str,
    pool: *mut PoolHandle,
    op: impl FnOnce(&mut terrace_pool::Tx<'static, terrace_pool::RegionBackend>) -> Result<T, PoolError>,
) -> Result<T, c_int> {
    tx_is_on(what, pool)?;
    in_tx(what, |tx, _| op(tx))
}

/// # Safety
/// `pool` an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_tx_begin(pool: *mut PoolHandle) -> c_int {
    error::boundary("terrace_pool_tx_begin", libc::EIO, || {
        if pool.is_null() {
            return fail_with(libc::EINVAL, "terrace_pool_tx_begin: pool is NULL");
        }
        // SAFETY: an open pool (contract); no setjmp buffer, no parameters.
        unsafe { pmemobj::pmemobj_tx_begin(pool, ptr::null_mut(), 0) }
    })
}

/// # Safety
/// `pool` the pool of the thread's transaction.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_tx_add_range(
    pool: *mut PoolHandle,
    off: u64,
    len: usize,
) -> c_int {
    pmemobj::tx_boundary("terrace_pool_tx_add_range", libc::EIO, || {
        errno_result(in_pool_tx("terrace_pool_tx_add_range", pool, |tx| {
            tx.add_range_direct(off, len as u64)
        }))
    })
}

fn tx_alloc_impl(what: &str, pool: *mut PoolHandle, size: usize, type_num: u64, zero: bool) -> u64 {
    pmemobj::tx_boundary(what, 0, || {
        in_pool_tx(what, pool, |tx| {
            if size == 0 {
                return Err(PoolError::InvalidArgument {
                    what: "size",
                    detail: "0".into(),
                });
            }
            if zero {
                tx.zalloc(size as u64, type_num)
            } else {
                tx.alloc(size as u64, type_num)
            }
        })
        .map_or(0, Oid::offset)
    })
}

/// # Safety
/// `pool` the pool of the thread's transaction.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_tx_alloc(
    pool: *mut PoolHandle,
    size: usize,
    type_num: u64,
) -> u64 {
    tx_alloc_impl("terrace_pool_tx_alloc", pool, size, type_num, false)
}

/// # Safety
/// `pool` the pool of the thread's transaction.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_tx_zalloc(
    pool: *mut PoolHandle,
    size: usize,
    type_num: u64,
) -> u64 {
    tx_alloc_impl("terrace_pool_tx_zalloc", pool, size, type_num, true)
}

/// # Safety
/// `pool` the pool of the thread's transaction.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_tx_free(pool: *mut PoolHandle, off: u64) -> c_int {
    pmemobj::tx_boundary("terrace_pool_tx_free", libc::EIO, || {
        if off == 0 {
            return 0;
        }
        errno_result(in_pool_tx("terrace_pool_tx_free", pool, |tx| {
            tx.free(Oid::from_offset(off).ok_or(PoolError::InvalidObject { offset: 0 })?)
        }))
    })
}

/// # Safety
/// `pool` the pool of the thread's transaction.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_tx_commit(pool: *mut PoolHandle) -> c_int {
    const WHAT: &str = "terrace_pool_tx_commit";
    error::boundary(WHAT, libc::EIO, || {
        if let Err(code) = tx_is_on(WHAT, pool) {
            return code;
        }
        // Commits a transaction in its work stage (the outermost commit makes the work
        // durable); one that an operation aborted is only ended, returning its errno.
        pmemobj::pmemobj_tx_commit();
        let code = pmemobj::pmemobj_tx_end();
        if code != 0 {
            error::set_errno(code);
        }
        code
    })
}

/// # Safety
/// `pool` the pool of the thread's transaction.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_tx_abort(pool: *mut PoolHandle) -> c_int {
    const WHAT: &str = "terrace_pool_tx_abort";
    error::boundary(WHAT, libc::EIO, || {
        if let Err(code) = tx_is_on(WHAT, pool) {
            return code;
        }
        pmemobj::pmemobj_tx_abort(libc::ECANCELED);
        pmemobj::pmemobj_tx_end();
        0
    })
}

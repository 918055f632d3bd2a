//! The libpmemobj-compatible subset (`include/libpmemobj.h`) over `terrace-pool`.
//!
//! - A `PMEMobjpool *` is a leaked [`PoolHandle`]; `pmemobj_close` reclaims it (and refuses
//!   to, leaking it, while a transaction on it is active on any thread).
//! - Open pools are listed in a process-wide table by `pool_uuid_lo` and address range, so
//!   `pmemobj_direct`, `pmemobj_free` and `pmemobj_oid` find a pool from an OID or a
//!   pointer; a per-thread cache of the last pool makes `pmemobj_direct` a few compares.
//! - A destination `PMEMoid *` inside a pool is published crash-atomically by the pool;
//!   one in volatile memory is written after the call, as libpmemobj does.
//! - Transactions: one per thread, held in a thread-local with the lane it locked;
//!   nesting is flattened (an inner abort aborts the outermost transaction).
//! - Custom allocation classes (`pmemobj_ctl_set`/`get` of `heap.alloc_class.*.desc`,
//!   `pmemobj_xalloc` and `pmemobj_tx_xalloc` with `POBJ_CLASS_ID`) are the pool's
//!   recorded classes: unlike libpmemobj's, they are still there after the pool is closed
//!   and reopened. Other ctl names fail with `EINVAL`.
//!
//! Errors set `errno` and the thread's message (`pmemobj_errormsg`); every entry point
//! runs under [`error::boundary`], so a panic is an error too (`EIO`), never an unwind.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock};

use terrace_pool::{
    Backend, ClassDesc, ClassId, Contents, HandleAt, HeaderType, Oid, Pool, PoolError,
    RegionBackend, RunSize, Tx,
};

use crate::error;

/// `PMEMoid`: `{pool_uuid_lo, off}`; `off == 0` is the null OID.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PMEMoid {
    pub pool_uuid_lo: u64,
    pub off: u64,
}

const OID_NULL: PMEMoid = PMEMoid {
    pool_uuid_lo: 0,
    off: 0,
};

/// What a `PMEMobjpool *` points to.
pub struct PoolHandle {
    /// The pool's named roots, opened by the first `terrace_omap_open` (or bind). Declared
    /// before `pool` so that it is dropped first: it borrows `pool` (see
    /// [`crate::collections`]).
    pub(crate) collections: crate::collections::LazyCollections,
    /// Maps and arrays open through `terrace_omap_open`, `terrace_hmap_open` and
    /// `terrace_array_open`; close refuses (`EBUSY`) while any is.
    pub(crate) open_maps: AtomicUsize,
    pub(crate) pool: Pool<RegionBackend>,
    uuid_lo: u64,
    pub(crate) base: usize,
    pub(crate) len: usize,
    /// Transactions on this pool that have begun and not ended, on any thread.
    pub(crate) active_txs: AtomicUsize,
    /// Offsets of live objects captured by `pmemobj_first`, for `pmemobj_next`.
    iteration: Mutex<Vec<u64>>,
    /// Offsets captured by `terrace_pool_first` (the native API), for `terrace_pool_next`.
    pub(crate) native_iteration: Mutex<Vec<u64>>,
}

/// A pool as the lookup table sees it.
#[derive(Clone, Copy)]
struct Entry {
    uuid_lo: u64,
    base: usize,
    len: usize,
    handle: *const PoolHandle,
}

// SAFETY: the handle pointer is only dereferenced while the pool is open (entries are
// removed under the table's write lock before the handle is freed).
unsafe impl Send for Entry {}
// SAFETY: as above.
unsafe impl Sync for Entry {}

static POOLS: RwLock<Vec<Entry>> = RwLock::new(Vec::new());
/// Bumped whenever a pool closes, so per-thread caches notice.
static EPOCH: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static LAST: std::cell::Cell<(usize, Option<Entry>)> = const { std::cell::Cell::new((usize::MAX, None)) };
    static TX: RefCell<Option<TxState>> = const { RefCell::new(None) };
}

fn find(pred: impl Fn(&Entry) -> bool) -> Option<Entry> {
    let epoch = EPOCH.load(Ordering::Acquire);
    if let Ok(Some(hit)) = LAST.try_with(|last| {
        let (seen, entry) = last.get();
        (seen == epoch)
            .then_some(entry)
            .flatten()
            .filter(|e| pred(e))
    }) {
        return Some(hit);
    }
    let pools = POOLS.read().unwrap_or_else(|p| p.into_inner());
    let found = pools.iter().find(|e| pred(e)).copied();
    if found.is_some() {
        let _ = LAST.try_with(|last| last.set((epoch, found)));
    }
    found
}

fn by_uuid(uuid_lo: u64) -> Option<Entry> {
    find(|e| e.uuid_lo == uuid_lo)
}

fn by_addr(addr: usize) -> Option<Entry> {
    find(|e| addr >= e.base && addr - e.base < e.len)
}

/// # Safety
/// `entry` must come from the table of open pools, and the pool must stay open while the
/// reference is used (the caller's obligation in C, as with libpmemobj).
unsafe fn handle<'a>(entry: &Entry) -> &'a PoolHandle {
    // SAFETY: see the function contract.
    unsafe { &*entry.handle }
}

fn errno_of(err: &PoolError) -> c_int {
    match err {
        PoolError::Exists { .. } => libc::EEXIST,
        PoolError::NotFound { .. } => libc::ENOENT,
        PoolError::OutOfSpace { .. } | PoolError::TxLogFull { .. } => libc::ENOMEM,
        PoolError::InvalidArgument { .. }
        | PoolError::OutOfBounds { .. }
        | PoolError::InvalidObject { .. }
        | PoolError::LayoutMismatch { .. }
        | PoolError::NotAPool { .. }
        | PoolError::SizeMismatch { .. }
        | PoolError::BadChecksum { .. }
        | PoolError::UnsupportedVersion { .. }
        | PoolError::Corrupt { .. }
        | PoolError::InvalidClass { .. }
        | PoolError::NoSuchClass { .. }
        | PoolError::ClassTableFull { .. } => libc::EINVAL,
        PoolError::ClassExists { .. } => libc::EEXIST,
        PoolError::FormatTooOld { .. } => libc::ENOTSUP,
        PoolError::TxAborted => libc::ECANCELED,
        PoolError::TxNotActive => libc::EINVAL,
        PoolError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        _ => libc::EIO,
    }
}

/// Records `err` as the thread's last error and returns its errno.
pub(crate) fn fail(err: &PoolError) -> c_int {
    let code = errno_of(err);
    error::record_message(&err.to_string());
    error::set_errno(code);
    code
}

pub(crate) use crate::error::{fail_with, str_arg};

impl PoolHandle {
    /// Why the pool cannot be closed now, if it cannot: a transaction holds a lane, or a
    /// map or array (which borrows the pool) is open.
    pub(crate) fn busy(&self) -> Option<&'static str> {
        if self.active_txs.load(Ordering::Acquire) != 0 || !self.pool.lanes_idle() {
            return Some("a transaction is active on this pool");
        }
        if self.open_maps.load(Ordering::Acquire) != 0 {
            return Some("a map or array of this pool is open");
        }
        None
    }
}

pub(crate) fn publish(pool: Pool<RegionBackend>) -> *mut PoolHandle {
    let base = pool.backend().address(0).map_or(0, |p| p.as_ptr() as usize);
    let handle = Box::into_raw(Box::new(PoolHandle {
        uuid_lo: pool.uuid_lo(),
        len: pool.size() as usize,
        base,
        collections: Default::default(),
        open_maps: AtomicUsize::new(0),
        pool,
        active_txs: AtomicUsize::new(0),
        iteration: Mutex::new(Vec::new()),
        native_iteration: Mutex::new(Vec::new()),
    }));
    // SAFETY: just created; published below and freed only by pmemobj_close.
    let h = unsafe { &*handle };
    POOLS
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .push(Entry {
            uuid_lo: h.uuid_lo,
            base: h.base,
            len: h.len,
            handle,
        });
    handle
}

/// # Safety
/// `path` and `layout` NUL-terminated (layout may be NULL).
#[no_mangle]
pub unsafe extern "C" fn pmemobj_create(
    path: *const c_char,
    layout: *const c_char,
    poolsize: usize,
    mode: libc::mode_t,
) -> *mut PoolHandle {
    error::boundary("pmemobj_create", ptr::null_mut(), || {
        // SAFETY: contract.
        let (Some(path), layout) = (unsafe { str_arg(path) }, unsafe { str_arg(layout) }) else {
            fail_with(libc::EINVAL, "pmemobj_create: path is NULL or not UTF-8");
            return ptr::null_mut();
        };
        if poolsize == 0 {
            fail_with(
                libc::EINVAL,
                "pmemobj_create: pool size 0 (opening existing files) is not supported",
            );
            return ptr::null_mut();
        }
        match Pool::create(path, poolsize as u64, layout.unwrap_or("")) {
            Ok(pool) => {
                use std::os::unix::fs::PermissionsExt;
                let _ =
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & 0o7777));
                publish(pool)
            }
            Err(e) => {
                fail(&e);
                ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `path` NUL-terminated; `layout` NUL-terminated or NULL (any layout).
#[no_mangle]
pub unsafe extern "C" fn pmemobj_open(
    path: *const c_char,
    layout: *const c_char,
) -> *mut PoolHandle {
    error::boundary("pmemobj_open", ptr::null_mut(), || {
        // SAFETY: contract.
        let Some(path) = (unsafe { str_arg(path) }) else {
            fail_with(libc::EINVAL, "pmemobj_open: path is NULL or not UTF-8");
            return ptr::null_mut();
        };
        // SAFETY: contract.
        let opened = match unsafe { str_arg(layout) } {
            Some(layout) => Pool::open(path, layout),
            None => Pool::open_any_layout(path),
        };
        match opened {
            Ok(pool) => publish(pool),
            Err(e) => {
                fail(&e);
                ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `pop` from `pmemobj_create`/`pmemobj_open`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_close(pop: *mut PoolHandle) {
    error::boundary("pmemobj_close", (), || {
        if pop.is_null() {
            return;
        }
        // SAFETY: pop is an open pool (contract).
        let h = unsafe { &*pop };
        if let Some(why) = h.busy() {
            fail_with(libc::EBUSY, &format!("pmemobj_close: {why}; it stays open"));
            return;
        }
        POOLS
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|e| e.handle != pop.cast_const());
        EPOCH.fetch_add(1, Ordering::AcqRel);
        // SAFETY: created by Box::into_raw in `publish`; no longer reachable from the table.
        drop(unsafe { Box::from_raw(pop) });
    })
}

/// 1 when the pool is consistent, 0 when not, -1 when it cannot be checked.
///
/// # Safety
/// `path` NUL-terminated; `layout` NUL-terminated or NULL.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_check(path: *const c_char, layout: *const c_char) -> c_int {
    error::boundary("pmemobj_check", -1, || {
        // SAFETY: contract.
        let Some(path) = (unsafe { str_arg(path) }) else {
            fail_with(libc::EINVAL, "pmemobj_check: path is NULL");
            return -1;
        };
        // SAFETY: contract.
        let opened = match unsafe { str_arg(layout) } {
            Some(layout) => Pool::open(path, layout),
            None => Pool::open_any_layout(path),
        };
        match opened.and_then(|pool| pool.check()) {
            Ok(_) => 1,
            Err(
                e @ (PoolError::Corrupt { .. }
                | PoolError::BadChecksum { .. }
                | PoolError::SizeMismatch { .. }),
            ) => {
                fail(&e);
                0
            }
            Err(e) => {
                fail(&e);
                -1
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_errormsg() -> *const c_char {
    error::boundary("pmemobj_errormsg", c"".as_ptr(), error::last_message)
}

fn oid_of(h: &PoolHandle, oid: Oid) -> PMEMoid {
    PMEMoid {
        pool_uuid_lo: h.uuid_lo,
        off: oid.offset(),
    }
}

/// # Safety
/// `pop` an open pool.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_root(pop: *mut PoolHandle, size: usize) -> PMEMoid {
    error::boundary("pmemobj_root", OID_NULL, || {
        // SAFETY: contract.
        let Some(h) = (unsafe { pop.as_ref() }) else {
            fail_with(libc::EINVAL, "pmemobj_root: pool is NULL");
            return OID_NULL;
        };
        if size == 0 {
            return match h.pool.root_size() {
                Ok(0) | Err(_) => OID_NULL,
                Ok(existing) => h.pool.root(existing).map_or(OID_NULL, |oid| oid_of(h, oid)),
            };
        }
        match h.pool.root(size as u64) {
            Ok(oid) => oid_of(h, oid),
            Err(e) => {
                fail(&e);
                OID_NULL
            }
        }
    })
}

/// # Safety
/// `pop` an open pool.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_root_size(pop: *mut PoolHandle) -> usize {
    error::boundary("pmemobj_root_size", 0, || {
        // SAFETY: contract.
        unsafe { pop.as_ref() }
            .and_then(|h| h.pool.root_size().ok())
            .unwrap_or(0) as usize
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_direct(oid: PMEMoid) -> *mut c_void {
    error::boundary("pmemobj_direct", ptr::null_mut(), || {
        if oid.off == 0 {
            return ptr::null_mut();
        }
        match by_uuid(oid.pool_uuid_lo) {
            Some(e) if (oid.off as usize) < e.len => (e.base + oid.off as usize) as *mut c_void,
            _ => ptr::null_mut(),
        }
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_oid(addr: *const c_void) -> PMEMoid {
    error::boundary("pmemobj_oid", OID_NULL, || match by_addr(addr as usize) {
        Some(e) => PMEMoid {
            pool_uuid_lo: e.uuid_lo,
            off: (addr as usize - e.base) as u64,
        },
        None => OID_NULL,
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_pool_by_oid(oid: PMEMoid) -> *mut PoolHandle {
    error::boundary("pmemobj_pool_by_oid", ptr::null_mut(), || {
        by_uuid(oid.pool_uuid_lo).map_or(ptr::null_mut(), |e| e.handle.cast_mut())
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_pool_by_ptr(addr: *const c_void) -> *mut PoolHandle {
    error::boundary("pmemobj_pool_by_ptr", ptr::null_mut(), || {
        by_addr(addr as usize).map_or(ptr::null_mut(), |e| e.handle.cast_mut())
    })
}

/// Where a `PMEMoid *` destination lives: inside `h` (published by the pool) or not.
fn dest_of(h: &PoolHandle, oidp: *mut PMEMoid) -> HandleAt {
    let at = oidp as usize;
    if !oidp.is_null() && at >= h.base && at - h.base + 16 <= h.len {
        HandleAt::Oid((at - h.base) as u64)
    } else {
        HandleAt::None
    }
}

type Constructor = Option<unsafe extern "C" fn(*mut PoolHandle, *mut c_void, *mut c_void) -> c_int>;

/// # Safety
/// `pop` an open pool; `oidp` NULL or writable; `constructor`, if any, a valid function
/// that initialises (and persists, as libpmemobj requires) the object.
#[allow(clippy::too_many_arguments)]
unsafe fn alloc_impl(
    pop: *mut PoolHandle,
    oidp: *mut PMEMoid,
    size: usize,
    type_num: u64,
    zero: bool,
    class: Option<ClassId>,
    constructor: Constructor,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: contract.
    let Some(h) = (unsafe { pop.as_ref() }) else {
        fail_with(libc::EINVAL, "pmemobj_alloc: pool is NULL");
        return -1;
    };
    if size == 0 {
        fail_with(libc::EINVAL, "pmemobj_alloc: size 0");
        return -1;
    }
    let dest = dest_of(h, oidp);
    let mut cancelled = false;
    let init = |w: &terrace_pool::ObjectWriter<'_, RegionBackend>| {
        if zero {
            w.zero()?;
        }
        if let (Some(constructor), Some(oid)) = (constructor, w.oid()) {
            let ptr = (h.base + oid.offset() as usize) as *mut c_void;
            // SAFETY: the constructor is the caller's function; ptr is the object's
            // start in the mapped pool.
            if unsafe { constructor(pop, ptr, arg) } != 0 {
                cancelled = true;
                return Err(PoolError::InvalidArgument {
                    what: "constructor",
                    detail: "returned non-zero: allocation cancelled".into(),
                });
            }
        }
        Ok(())
    };
    let result = match class {
        None => h.pool.alloc_with(size as u64, type_num, dest, init),
        Some(c) => h.pool.alloc_in(c, size as u64, type_num, dest, init),
    };
    match result {
        Ok(oid) => {
            if matches!(dest, HandleAt::None) && !oidp.is_null() {
                // SAFETY: oidp is writable (contract) and outside the pool.
                unsafe { oidp.write(oid_of(h, oid)) };
            }
            0
        }
        Err(e) => {
            fail(&e);
            if cancelled {
                error::set_errno(libc::ECANCELED);
            }
            -1
        }
    }
}

/// # Safety
/// See `alloc_impl`.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_alloc(
    pop: *mut PoolHandle,
    oidp: *mut PMEMoid,
    size: usize,
    type_num: u64,
    constructor: Constructor,
    arg: *mut c_void,
) -> c_int {
    error::boundary("pmemobj_alloc", -1, || {
        // SAFETY: forwarded contract.
        unsafe { alloc_impl(pop, oidp, size, type_num, false, None, constructor, arg) }
    })
}

/// # Safety
/// See `alloc_impl`.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_zalloc(
    pop: *mut PoolHandle,
    oidp: *mut PMEMoid,
    size: usize,
    type_num: u64,
) -> c_int {
    error::boundary("pmemobj_zalloc", -1, || {
        // SAFETY: forwarded contract.
        unsafe { alloc_impl(pop, oidp, size, type_num, true, None, None, ptr::null_mut()) }
    })
}

// ---- allocation classes and flags ----------------------------------------------------

/// `POBJ_FLAG_ZERO` / `POBJ_XALLOC_ZERO`.
const FLAG_ZERO: u64 = 1;
/// `POBJ_XALLOC_NO_FLUSH`: accepted; Terrace persists a transaction's objects at commit
/// regardless.
const FLAG_NO_FLUSH: u64 = 1 << 1;
/// `POBJ_XALLOC_NO_ABORT` (`POBJ_FLAG_TX_NO_ABORT`).
const FLAG_TX_NO_ABORT: u64 = 1 << 4;
/// `POBJ_XALLOC_CLASS_MASK`: `POBJ_CLASS_ID(id)` is `id << 48`.
const CLASS_MASK: u64 = 0xFFFF << 48;
/// `POBJ_XALLOC_ARENA_MASK`: accepted by `pmemobj_tx_xalloc` and ignored (threads own
/// runs; there are no arenas to choose).
const ARENA_MASK: u64 = 0xFFFF << 32;
/// `POBJ_XALLOC_VALID_FLAGS`.
const XALLOC_VALID: u64 = FLAG_ZERO | CLASS_MASK;
/// `POBJ_TX_XALLOC_VALID_FLAGS`.
const TX_XALLOC_VALID: u64 = FLAG_ZERO | FLAG_NO_FLUSH | ARENA_MASK | CLASS_MASK | FLAG_TX_NO_ABORT;

/// The class `POBJ_CLASS_ID` in `flags` names (`None` for 0: the built-in size classes).
fn class_of_flags(flags: u64) -> Result<Option<ClassId>, PoolError> {
    match (flags & CLASS_MASK) >> 48 {
        0 => Ok(None),
        id => ClassId::new(id as u32)
            .map(Some)
            .map_err(|_| PoolError::NoSuchClass { id: id as u32 }),
    }
}

/// `pmemobj_alloc` with flags: `POBJ_XALLOC_ZERO` and `POBJ_CLASS_ID(id)` (an object of
/// custom class `id`, one unit of it: `size` must be at most its unit).
///
/// # Safety
/// See `alloc_impl`.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_xalloc(
    pop: *mut PoolHandle,
    oidp: *mut PMEMoid,
    size: usize,
    type_num: u64,
    flags: u64,
    constructor: Constructor,
    arg: *mut c_void,
) -> c_int {
    error::boundary("pmemobj_xalloc", -1, || {
        if flags & !XALLOC_VALID != 0 {
            fail_with(
                libc::EINVAL,
                &format!("pmemobj_xalloc: unknown flags {:#x}", flags & !XALLOC_VALID),
            );
            return -1;
        }
        let class = match class_of_flags(flags) {
            Ok(c) => c,
            Err(e) => {
                fail(&e);
                return -1;
            }
        };
        let zero = flags & FLAG_ZERO != 0;
        // SAFETY: forwarded contract.
        unsafe { alloc_impl(pop, oidp, size, type_num, zero, class, constructor, arg) }
    })
}

/// libpmemobj's `struct pobj_alloc_class_desc`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PobjAllocClassDesc {
    pub unit_size: usize,
    pub alignment: usize,
    pub units_per_block: c_uint,
    /// `enum pobj_header_type`: 0 legacy, 1 compact, 2 none.
    pub header_type: c_int,
    pub class_id: c_uint,
}

/// The ctl entry points this pool has: `heap.alloc_class.new.desc` (write only) and
/// `heap.alloc_class.<id>.desc`.
enum CtlName {
    NewClass,
    Class(u64),
}

fn parse_ctl(name: &str) -> Option<CtlName> {
    let index = name
        .strip_prefix("heap.alloc_class.")?
        .strip_suffix(".desc")?;
    if index == "new" {
        return Some(CtlName::NewClass);
    }
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Too many digits for u64: out of range all the same.
    Some(CtlName::Class(index.parse().unwrap_or(u64::MAX)))
}

/// The class id of a `heap.alloc_class.<id>` index, or `ERANGE` as libpmemobj (ids are
/// below 255).
fn ctl_class_id(what: &str, id: u64) -> Result<u32, c_int> {
    if id >= 255 {
        return Err(fail_with(
            libc::ERANGE,
            &format!("{what}: class id {id} is outside 0..=254"),
        ));
    }
    Ok(id as u32)
}

/// # Safety
/// `pop` an open pool; `name` NUL-terminated; `arg` NULL or what the entry point takes.
unsafe fn ctl_args<'a>(
    what: &str,
    pop: *mut PoolHandle,
    name: *const c_char,
    arg: *mut c_void,
) -> Result<(&'a PoolHandle, CtlName, &'a mut PobjAllocClassDesc), c_int> {
    // SAFETY: contract.
    let Some(h) = (unsafe { pop.as_ref() }) else {
        return Err(fail_with(libc::EINVAL, &format!("{what}: pool is NULL")));
    };
    // SAFETY: contract.
    let Some(name) = (unsafe { str_arg(name) }) else {
        return Err(fail_with(libc::EINVAL, &format!("{what}: name is NULL")));
    };
    let Some(parsed) = parse_ctl(name) else {
        return Err(fail_with(
            libc::EINVAL,
            &format!("{what}: unknown ctl name {name:?}"),
        ));
    };
    // SAFETY: every entry point this pool has takes a `struct pobj_alloc_class_desc *`
    // (contract: the caller passes what the name's entry point takes).
    let Some(desc) = (unsafe { arg.cast::<PobjAllocClassDesc>().as_mut() }) else {
        return Err(fail_with(
            libc::EINVAL,
            &format!("{what}: {name}: argument is NULL"),
        ));
    };
    Ok((h, parsed, desc))
}

/// Sets a ctl value: `heap.alloc_class.new.desc` registers a class under the next free id
/// and `heap.alloc_class.<id>.desc` under `id`; both fill in `class_id` and the actual
/// `units_per_block`. The class is recorded in the pool (it survives reopening).
/// Returns 0, or -1 with `errno`: `EINVAL` (bad description, unknown name, no free id),
/// `EEXIST` (id taken), `ERANGE` (id above 254).
///
/// # Safety
/// `pop` an open pool; `name` NUL-terminated; `arg` a `struct pobj_alloc_class_desc *`.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_ctl_set(
    pop: *mut PoolHandle,
    name: *const c_char,
    arg: *mut c_void,
) -> c_int {
    error::boundary("pmemobj_ctl_set", -1, || {
        const WHAT: &str = "pmemobj_ctl_set";
        // SAFETY: forwarded contract.
        let (h, parsed, d) = match unsafe { ctl_args(WHAT, pop, name, arg) } {
            Ok(v) => v,
            Err(_) => return -1,
        };
        let id = match parsed {
            CtlName::NewClass => None,
            CtlName::Class(id) => match ctl_class_id(WHAT, id) {
                Ok(id) => Some(id),
                Err(_) => return -1,
            },
        };
        let bad = |detail: String| {
            fail(&PoolError::InvalidClass {
                field: "description",
                detail,
            });
            -1
        };
        let Some(header) = u32::try_from(d.header_type)
            .ok()
            .and_then(HeaderType::from_code)
        else {
            return bad(format!("unknown header type {}", d.header_type));
        };
        if d.units_per_block == 0 {
            return bad("units_per_block is 0".into());
        }
        let (Ok(unit), Ok(alignment)) = (u32::try_from(d.unit_size), u32::try_from(d.alignment))
        else {
            return bad(format!(
                "unit size {} or alignment {} out of range",
                d.unit_size, d.alignment
            ));
        };
        let desc = ClassDesc {
            unit,
            run: RunSize::Units(d.units_per_block),
            alignment,
            header,
        };
        let registered = match id {
            None => h.pool.register_class(&desc),
            Some(0) => {
                // Taken, as in libpmemobj (where a built-in class has id 0).
                fail_with(
                    libc::EEXIST,
                    "pmemobj_ctl_set: class id 0 stands for the built-in size classes",
                );
                return -1;
            }
            Some(id) => ClassId::new(id).and_then(|id| h.pool.register_class_as(id, &desc)),
        };
        match registered.map(|id| (id, h.pool.class(id))) {
            Ok((id, Some(c))) => {
                d.class_id = id.get() as c_uint;
                d.units_per_block = c.slots_per_run;
                0
            }
            Ok((_, None)) => {
                fail_with(libc::EIO, "pmemobj_ctl_set: registered class vanished");
                -1
            }
            Err(e) => {
                fail(&e);
                -1
            }
        }
    })
}

/// Reads a ctl value: `heap.alloc_class.<id>.desc` fills the description of custom
/// class `id` (`ENOENT` if none; `ERANGE` above 254). Other names fail with `EINVAL`.
///
/// # Safety
/// `pop` an open pool; `name` NUL-terminated; `arg` a `struct pobj_alloc_class_desc *`.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_ctl_get(
    pop: *mut PoolHandle,
    name: *const c_char,
    arg: *mut c_void,
) -> c_int {
    error::boundary("pmemobj_ctl_get", -1, || {
        const WHAT: &str = "pmemobj_ctl_get";
        // SAFETY: forwarded contract.
        let (h, parsed, d) = match unsafe { ctl_args(WHAT, pop, name, arg) } {
            Ok(v) => v,
            Err(_) => return -1,
        };
        let CtlName::Class(id) = parsed else {
            fail_with(
                libc::EINVAL,
                "pmemobj_ctl_get: heap.alloc_class.new.desc is write-only",
            );
            return -1;
        };
        let Ok(id) = ctl_class_id(WHAT, id) else {
            return -1;
        };
        let Some(c) = ClassId::new(id).ok().and_then(|id| h.pool.class(id)) else {
            fail_with(
                libc::ENOENT,
                &format!(
                    "pmemobj_ctl_get: allocation class {id} does not exist{}",
                    if id == 0 {
                        " (0 stands for the built-in size classes)"
                    } else {
                        ""
                    }
                ),
            );
            return -1;
        };
        *d = PobjAllocClassDesc {
            unit_size: c.unit as usize,
            alignment: c.alignment as usize,
            units_per_block: c.slots_per_run,
            header_type: c.header.code() as c_int,
            class_id: id,
        };
        0
    })
}

/// Runs a ctl entry point: this pool has none, so every name fails with `EINVAL`.
///
/// # Safety
/// `name` NUL-terminated or NULL.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_ctl_exec(
    _pop: *mut PoolHandle,
    name: *const c_char,
    _arg: *mut c_void,
) -> c_int {
    error::boundary("pmemobj_ctl_exec", -1, || {
        // SAFETY: contract.
        let name = unsafe { str_arg(name) }.unwrap_or("(null)");
        fail_with(
            libc::EINVAL,
            &format!("pmemobj_ctl_exec: unknown ctl name {name:?}"),
        );
        -1
    })
}

/// # Safety
/// `pop` an open pool; `oidp` writable, holding NULL or an object of `pop`.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_realloc(
    pop: *mut PoolHandle,
    oidp: *mut PMEMoid,
    size: usize,
    type_num: u64,
) -> c_int {
    error::boundary("pmemobj_realloc", -1, || {
        // SAFETY: contract.
        let (Some(h), false) = (unsafe { pop.as_ref() }, oidp.is_null()) else {
            fail_with(libc::EINVAL, "pmemobj_realloc: pool or destination is NULL");
            return -1;
        };
        // SAFETY: oidp is readable (contract).
        let current = unsafe { oidp.read() };
        if current.off == 0 {
            // SAFETY: forwarded contract.
            return unsafe {
                alloc_impl(
                    pop,
                    oidp,
                    size,
                    type_num,
                    false,
                    None,
                    None,
                    ptr::null_mut(),
                )
            };
        }
        if size == 0 {
            // SAFETY: forwarded contract.
            unsafe { pmemobj_free(oidp) };
            return 0;
        }
        let result = match dest_of(h, oidp) {
            dest @ HandleAt::Oid(_) => h.pool.realloc(dest, size as u64, type_num),
            _ => {
                // A volatile destination: move by hand (libpmemobj is not atomic here either).
                let Some(old) = Oid::from_offset(current.off) else {
                    return -1;
                };
                move_object(&h.pool, old, size as u64, type_num)
            }
        };
        match result {
            Ok(oid) => {
                if matches!(dest_of(h, oidp), HandleAt::None) {
                    // SAFETY: writable (contract), outside the pool.
                    unsafe { oidp.write(oid_of(h, oid)) };
                }
                0
            }
            Err(e) => {
                fail(&e);
                -1
            }
        }
    })
}

/// Moves `old` into a new object of `size` bytes and type `type_num` (contents kept up to
/// the smaller size) and frees `old`: a realloc whose handle lives outside the pool, so it
/// cannot be published atomically (libpmemobj is not atomic here either).
pub(crate) fn move_object(
    pool: &Pool<RegionBackend>,
    old: Oid,
    size: u64,
    type_num: u64,
) -> Result<Oid, PoolError> {
    pool.usable_size(old).and_then(|old_len| {
        let keep = old_len.min(size);
        let new = pool.alloc_with(size, type_num, HandleAt::None, |w| {
            let mut buf = vec![0u8; keep as usize];
            pool.read(old, 0, &mut buf)?;
            w.write(0, &buf)
        })?;
        pool.free_oid(old)?;
        Ok(new)
    })
}

/// # Safety
/// `oidp` NULL or readable/writable, holding NULL or an object of an open pool.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_free(oidp: *mut PMEMoid) {
    error::boundary("pmemobj_free", (), || {
        if oidp.is_null() {
            return;
        }
        // SAFETY: readable (contract).
        let oid = unsafe { oidp.read() };
        if oid.off == 0 {
            return;
        }
        let Some(entry) = by_uuid(oid.pool_uuid_lo) else {
            fail_with(libc::EINVAL, "pmemobj_free: the OID's pool is not open");
            return;
        };
        // SAFETY: the pool is open (it is in the table) and stays open during the call.
        let h = unsafe { handle(&entry) };
        let result = match dest_of(h, oidp) {
            dest @ HandleAt::Oid(_) => h.pool.free(dest),
            _ => match Oid::from_offset(oid.off) {
                Some(o) => h.pool.free_oid(o).map(|()| {
                    // SAFETY: writable (contract), outside the pool.
                    unsafe { oidp.write(OID_NULL) }
                }),
                None => Ok(()),
            },
        };
        if let Err(e) = result {
            fail(&e);
        }
    })
}

fn with_object<T>(
    oid: PMEMoid,
    missing: T,
    f: impl FnOnce(&PoolHandle, Oid) -> Result<T, PoolError>,
) -> T {
    let (Some(entry), Some(o)) = (by_uuid(oid.pool_uuid_lo), Oid::from_offset(oid.off)) else {
        return missing;
    };
    // SAFETY: the pool is open (it is in the table).
    let h = unsafe { handle(&entry) };
    f(h, o).unwrap_or_else(|e| {
        fail(&e);
        missing
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_alloc_usable_size(oid: PMEMoid) -> usize {
    error::boundary("pmemobj_alloc_usable_size", 0, || {
        with_object(oid, 0, |h, o| h.pool.usable_size(o)) as usize
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_type_num(oid: PMEMoid) -> u64 {
    error::boundary("pmemobj_type_num", u64::MAX, || {
        with_object(oid, u64::MAX, |h, o| h.pool.type_of(o))
    })
}

/// # Safety
/// `pop` an open pool.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_first(pop: *mut PoolHandle) -> PMEMoid {
    error::boundary("pmemobj_first", OID_NULL, || {
        // SAFETY: contract.
        let Some(h) = (unsafe { pop.as_ref() }) else {
            return OID_NULL;
        };
        match h.pool.objects(None) {
            Ok(objects) => {
                let mut offsets: Vec<u64> = objects.iter().map(|o| o.oid.offset()).collect();
                offsets.sort_unstable();
                let first = offsets.first().copied();
                *h.iteration.lock().unwrap_or_else(|p| p.into_inner()) = offsets;
                first.map_or(OID_NULL, |off| PMEMoid {
                    pool_uuid_lo: h.uuid_lo,
                    off,
                })
            }
            Err(e) => {
                fail(&e);
                OID_NULL
            }
        }
    })
}

/// The object after `oid` in the snapshot taken by the last `pmemobj_first` on its pool.
#[no_mangle]
pub extern "C" fn pmemobj_next(oid: PMEMoid) -> PMEMoid {
    error::boundary("pmemobj_next", OID_NULL, || {
        let Some(entry) = by_uuid(oid.pool_uuid_lo) else {
            return OID_NULL;
        };
        // SAFETY: the pool is open (it is in the table).
        let h = unsafe { handle(&entry) };
        let offsets = h.iteration.lock().unwrap_or_else(|p| p.into_inner());
        let next = offsets.partition_point(|&o| o <= oid.off);
        offsets.get(next).map_or(OID_NULL, |&off| PMEMoid {
            pool_uuid_lo: h.uuid_lo,
            off,
        })
    })
}

/// # Safety
/// `pop` an open pool; `[addr, addr+len)` inside it.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_persist(pop: *mut PoolHandle, addr: *const c_void, len: usize) {
    error::boundary("pmemobj_persist", (), || {
        // SAFETY: contract.
        let Some(h) = (unsafe { pop.as_ref() }) else {
            return;
        };
        let at = addr as usize;
        if at < h.base || at - h.base > h.len {
            fail_with(libc::EINVAL, "pmemobj_persist: address outside the pool");
            return;
        }
        if let Err(e) = h.pool.backend().persist((at - h.base) as u64, len as u64) {
            fail(&e);
        }
    })
}

/// # Safety
/// As for `pmemobj_persist`.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_flush(pop: *mut PoolHandle, addr: *const c_void, len: usize) {
    error::boundary("pmemobj_flush", (), || {
        // SAFETY: forwarded contract.
        unsafe { pmemobj_persist(pop, addr, len) }
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_drain(_pop: *mut PoolHandle) {
    error::boundary("pmemobj_drain", (), || {
        std::sync::atomic::fence(Ordering::SeqCst);
    })
}

/// # Safety
/// As for `pmemobj_persist`, and `src` readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_memcpy_persist(
    pop: *mut PoolHandle,
    dest: *mut c_void,
    src: *const c_void,
    len: usize,
) -> *mut c_void {
    error::boundary("pmemobj_memcpy_persist", dest, || {
        // SAFETY: both ranges valid for len bytes (contract); memmove tolerates overlap.
        unsafe {
            ptr::copy(src.cast::<u8>(), dest.cast::<u8>(), len);
            pmemobj_persist(pop, dest, len);
        }
        dest
    })
}

/// # Safety
/// As for `pmemobj_persist`.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_memset_persist(
    pop: *mut PoolHandle,
    dest: *mut c_void,
    c: c_int,
    len: usize,
) -> *mut c_void {
    error::boundary("pmemobj_memset_persist", dest, || {
        // SAFETY: dest valid for len bytes (contract).
        unsafe {
            ptr::write_bytes(dest.cast::<u8>(), c as u8, len);
            pmemobj_persist(pop, dest, len);
        }
        dest
    })
}

// ---- transactions ----------------------------------------------------------------------

const TX_STAGE_NONE: c_int = 0;
const TX_STAGE_WORK: c_int = 1;
const TX_STAGE_ONCOMMIT: c_int = 2;
const TX_STAGE_ONABORT: c_int = 3;

struct TxState {
    handle: &'static PoolHandle,
    /// The pool transaction; None once committed or aborted.
    tx: Option<Tx<'static, RegionBackend>>,
    depth: u32,
    stage: c_int,
    errnum: c_int,
}

/// Begins a transaction (or a nested one) on `pop`. Declared variadic in the header; the
/// first (and only supported) trailing parameter arrives as `param`, where x86-64 and
/// AArch64 Linux pass it for a variadic call.
///
/// # Safety
/// `pop` an open pool.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_tx_begin(
    pop: *mut PoolHandle,
    env: *mut c_void,
    param: c_int,
) -> c_int {
    error::boundary("pmemobj_tx_begin", error::PANIC_ERRNO, || {
        if !env.is_null() {
            return fail_with(
                libc::EINVAL,
                "pmemobj_tx_begin: setjmp-based transactions are not supported; pass NULL",
            );
        }
        if param != 0 {
            return fail_with(
                libc::EINVAL,
                "pmemobj_tx_begin: only TX_PARAM_NONE is supported",
            );
        }
        // SAFETY: contract: the pool outlives its transactions (pmemobj_close refuses while one
        // is active), so the reference may be held for the transaction's life.
        let Some(h) = (unsafe { pop.as_ref::<'static>() }) else {
            return fail_with(libc::EINVAL, "pmemobj_tx_begin: pool is NULL");
        };
        TX.with(|slot| {
            let mut slot = slot.borrow_mut();
            match slot.as_mut() {
                Some(state) => {
                    if !ptr::eq(state.handle, h) {
                        return fail_with(
                            libc::EINVAL,
                            "pmemobj_tx_begin: nested transaction on another pool",
                        );
                    }
                    if state.stage != TX_STAGE_WORK {
                        return fail_with(
                            libc::EINVAL,
                            "pmemobj_tx_begin: outer transaction is not in its work stage",
                        );
                    }
                    state.depth += 1;
                    0
                }
                None => match h.pool.begin() {
                    Ok(tx) => {
                        h.active_txs.fetch_add(1, Ordering::AcqRel);
                        *slot = Some(TxState {
                            handle: h,
                            tx: Some(tx),
                            depth: 1,
                            stage: TX_STAGE_WORK,
                            errnum: 0,
                        });
                        0
                    }
                    Err(e) => fail(&e),
                },
            }
        })
    })
}

/// The pool of the calling thread's transaction, if one is active.
pub(crate) fn tx_pool() -> Option<*const PoolHandle> {
    TX.try_with(|slot| slot.borrow().as_ref().map(|s| ptr::from_ref(s.handle)))
        .ok()
        .flatten()
}

#[no_mangle]
pub extern "C" fn pmemobj_tx_stage() -> c_int {
    error::boundary("pmemobj_tx_stage", TX_STAGE_NONE, || {
        TX.try_with(|slot| slot.borrow().as_ref().map_or(TX_STAGE_NONE, |s| s.stage))
            .unwrap_or(TX_STAGE_NONE)
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_tx_errno() -> c_int {
    error::boundary("pmemobj_tx_errno", error::PANIC_ERRNO, || {
        TX.try_with(|slot| slot.borrow().as_ref().map_or(0, |s| s.errnum))
            .unwrap_or(0)
    })
}

/// Aborts the thread's transaction with `errnum` (the pool rolls back at once).
fn abort_with(state: &mut TxState, errnum: c_int) {
    if let Some(tx) = state.tx.take() {
        if let Err(e) = tx.abort() {
            fail(&e);
        }
    }
    state.stage = TX_STAGE_ONABORT;
    if state.errnum == 0 {
        state.errnum = if errnum == 0 { libc::ECANCELED } else { errnum };
    }
}

/// [`error::boundary`] for an entry point that works in the thread's transaction: a panic
/// also aborts the transaction (rolled back at once), as any failure of such a call does.
pub(crate) fn tx_boundary<T>(what: &str, on_panic: T, body: impl FnOnce() -> T) -> T {
    error::boundary_then(what, on_panic, abort_after_panic, body)
}

/// Aborts the thread's transaction, if any, after a panic in one of its calls.
fn abort_after_panic() {
    let _ = TX.try_with(|slot| {
        if let Ok(mut slot) = slot.try_borrow_mut() {
            if let Some(state) = slot.as_mut() {
                abort_with(state, error::PANIC_ERRNO);
            }
        }
    });
}

/// Runs `op` on the active transaction in its work stage; a failure aborts the whole
/// (flattened) transaction, as libpmemobj does. Returns the errno (0 on success).
pub(crate) fn in_tx<T>(
    what: &str,
    op: impl FnOnce(&mut Tx<'static, RegionBackend>, &PoolHandle) -> Result<T, PoolError>,
) -> Result<T, c_int> {
    in_tx_with(what, true, op)
}

/// [`in_tx`]; with `abort` false a failure of `op` only sets `errno` and leaves the
/// transaction in its work stage (libpmemobj's `POBJ_FLAG_TX_NO_ABORT`).
fn in_tx_with<T>(
    what: &str,
    abort: bool,
    op: impl FnOnce(&mut Tx<'static, RegionBackend>, &PoolHandle) -> Result<T, PoolError>,
) -> Result<T, c_int> {
    TX.with(|slot| {
        let mut slot = slot.borrow_mut();
        let Some(state) = slot.as_mut() else {
            return Err(fail_with(
                libc::EINVAL,
                &format!("{what}: no transaction is active"),
            ));
        };
        if state.stage != TX_STAGE_WORK {
            return Err(fail_with(
                libc::EINVAL,
                &format!("{what}: transaction is not in its work stage"),
            ));
        }
        let handle = state.handle;
        let Some(tx) = state.tx.as_mut() else {
            return Err(fail_with(
                libc::EINVAL,
                &format!("{what}: transaction already ended"),
            ));
        };
        match op(tx, handle) {
            Ok(v) => Ok(v),
            Err(e) => {
                let code = fail(&e);
                if abort {
                    abort_with(state, code);
                }
                Err(code)
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_tx_add_range(oid: PMEMoid, off: u64, size: usize) -> c_int {
    tx_boundary("pmemobj_tx_add_range", error::PANIC_ERRNO, || {
        in_tx("pmemobj_tx_add_range", |tx, h| {
            if oid.pool_uuid_lo != h.uuid_lo {
                return Err(PoolError::InvalidArgument {
                    what: "OID",
                    detail: "belongs to another pool".into(),
                });
            }
            let o = Oid::from_offset(oid.off).ok_or(PoolError::InvalidObject { offset: 0 })?;
            tx.add_range(o, off, size as u64)
        })
        .err()
        .unwrap_or(0)
    })
}

/// # Safety
/// `ptr` points into the transaction's pool.
#[no_mangle]
pub unsafe extern "C" fn pmemobj_tx_add_range_direct(ptr: *const c_void, size: usize) -> c_int {
    tx_boundary("pmemobj_tx_add_range_direct", error::PANIC_ERRNO, || {
        in_tx("pmemobj_tx_add_range_direct", |tx, h| {
            let at = ptr as usize;
            if at < h.base || at - h.base >= h.len {
                return Err(PoolError::InvalidArgument {
                    what: "pointer",
                    detail: "outside the transaction's pool".into(),
                });
            }
            tx.add_range_direct((at - h.base) as u64, size as u64)
        })
        .err()
        .unwrap_or(0)
    })
}

fn tx_alloc_impl(size: usize, type_num: u64, zero: bool) -> PMEMoid {
    let r = in_tx("pmemobj_tx_alloc", |tx, h| {
        if size == 0 {
            return Err(PoolError::InvalidArgument {
                what: "size",
                detail: "0".into(),
            });
        }
        let oid = if zero {
            tx.zalloc(size as u64, type_num)?
        } else {
            tx.alloc(size as u64, type_num)?
        };
        Ok(oid_of(h, oid))
    });
    r.unwrap_or(OID_NULL)
}

#[no_mangle]
pub extern "C" fn pmemobj_tx_alloc(size: usize, type_num: u64) -> PMEMoid {
    tx_boundary("pmemobj_tx_alloc", OID_NULL, || {
        tx_alloc_impl(size, type_num, false)
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_tx_zalloc(size: usize, type_num: u64) -> PMEMoid {
    tx_boundary("pmemobj_tx_zalloc", OID_NULL, || {
        tx_alloc_impl(size, type_num, true)
    })
}

/// `pmemobj_tx_alloc` with flags: `POBJ_XALLOC_ZERO`, `POBJ_CLASS_ID(id)` (one unit of
/// custom class `id`), `POBJ_XALLOC_NO_ABORT` (a failure returns `OID_NULL` with `errno`
/// and leaves the transaction running), and `POBJ_XALLOC_NO_FLUSH` / `POBJ_ARENA_ID`,
/// accepted and without effect.
#[no_mangle]
pub extern "C" fn pmemobj_tx_xalloc(size: usize, type_num: u64, flags: u64) -> PMEMoid {
    tx_boundary("pmemobj_tx_xalloc", OID_NULL, || {
        let no_abort = flags & FLAG_TX_NO_ABORT != 0;
        in_tx_with("pmemobj_tx_xalloc", !no_abort, |tx, h| {
            if flags & !TX_XALLOC_VALID != 0 {
                return Err(PoolError::InvalidArgument {
                    what: "flags",
                    detail: format!("unknown flags {:#x}", flags & !TX_XALLOC_VALID),
                });
            }
            if size == 0 {
                return Err(PoolError::InvalidArgument {
                    what: "size",
                    detail: "0".into(),
                });
            }
            let class = class_of_flags(flags)?;
            let zero = flags & FLAG_ZERO != 0;
            let oid = if no_abort {
                let contents = if zero {
                    Contents::Zeroed
                } else {
                    Contents::Uninit
                };
                tx.alloc_no_abort(class, size as u64, type_num, contents)?
            } else {
                match (class, zero) {
                    (Some(c), true) => tx.zalloc_in(c, size as u64, type_num)?,
                    (Some(c), false) => tx.alloc_in(c, size as u64, type_num)?,
                    (None, true) => tx.zalloc(size as u64, type_num)?,
                    (None, false) => tx.alloc(size as u64, type_num)?,
                }
            };
            Ok(oid_of(h, oid))
        })
        .unwrap_or(OID_NULL)
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_tx_free(oid: PMEMoid) -> c_int {
    tx_boundary("pmemobj_tx_free", error::PANIC_ERRNO, || {
        if oid.off == 0 {
            return 0;
        }
        in_tx("pmemobj_tx_free", |tx, h| {
            if oid.pool_uuid_lo != h.uuid_lo {
                return Err(PoolError::InvalidArgument {
                    what: "OID",
                    detail: "belongs to another pool".into(),
                });
            }
            let o = Oid::from_offset(oid.off).ok_or(PoolError::InvalidObject { offset: 0 })?;
            tx.free(o)
        })
        .err()
        .unwrap_or(0)
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_tx_commit() {
    tx_boundary("pmemobj_tx_commit", (), || {
        let _ = TX.try_with(|slot| {
            let mut slot = slot.borrow_mut();
            let Some(state) = slot.as_mut() else {
                fail_with(libc::EINVAL, "pmemobj_tx_commit: no transaction is active");
                return;
            };
            if state.stage != TX_STAGE_WORK {
                return;
            }
            if state.depth > 1 {
                // Flattened: the outermost commit makes the work durable.
                state.stage = TX_STAGE_ONCOMMIT;
                return;
            }
            if let Some(tx) = state.tx.take() {
                match tx.commit() {
                    Ok(()) => state.stage = TX_STAGE_ONCOMMIT,
                    Err(e) => {
                        let code = fail(&e);
                        state.stage = TX_STAGE_ONABORT;
                        state.errnum = code;
                    }
                }
            }
        });
    })
}

#[no_mangle]
pub extern "C" fn pmemobj_tx_abort(errnum: c_int) {
    error::boundary("pmemobj_tx_abort", (), || {
        let _ = TX.try_with(|slot| {
            if let Some(state) = slot.borrow_mut().as_mut() {
                abort_with(state, errnum);
            }
        });
    })
}

/// Ends the innermost transaction; returns its errno (0 if it committed). A transaction
/// still in its work stage is aborted.
#[no_mangle]
pub extern "C" fn pmemobj_tx_end() -> c_int {
    error::boundary("pmemobj_tx_end", error::PANIC_ERRNO, || {
        TX.try_with(|slot| {
            let mut slot = slot.borrow_mut();
            let Some(state) = slot.as_mut() else {
                return fail_with(libc::EINVAL, "pmemobj_tx_end: no transaction is active");
            };
            if state.stage == TX_STAGE_WORK {
                abort_with(state, libc::ECANCELED);
            }
            let errnum = state.errnum;
            state.depth -= 1;
            if state.depth > 0 {
                // Back in the outer transaction: its work continues unless something aborted.
                state.stage = if state.errnum == 0 {
                    TX_STAGE_WORK
                } else {
                    TX_STAGE_ONABORT
                };
                return errnum;
            }
            if let Some(state) = slot.take() {
                state.handle.active_txs.fetch_sub(1, Ordering::AcqRel);
                drop(state);
            }
            if errnum != 0 {
                error::set_errno(errnum);
            }
            errnum
        })
        .unwrap_or(libc::EINVAL)
    })
}

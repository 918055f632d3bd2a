//! Persistent collections by handle (`include/terrace_collections.h`): ordered maps and
//! named objects in a pool's directory, over `terrace-collections`.
//!
//! Owns [`LazyCollections`] (a pool handle's directory, opened on first use),
//! [`OmapHandle`] (an open ordered map) and [`CursorHandle`] (a range cursor).
//!
//! Invariants:
//! - the directory and every map borrow their pool, which lives in its `PoolHandle` box:
//!   the borrow is made `'static` here, and holds because `terrace_pool_close` /
//!   `pmemobj_close` refuse (`EBUSY`) while a map of the pool is open (`open_maps`), and
//!   the handle drops its `collections` field before its `pool` field;
//! - a map handle is freed only by `terrace_omap_close`, which refuses (`EBUSY`) while a
//!   cursor over it is open (`cursors`), so a cursor's borrow of the map holds too;
//! - a handle is used by one thread at a time for cursors; a map handle may be used by
//!   any number of threads at once (readers take no lock, writers serialize inside);
//! - no panic crosses the boundary: every entry point runs under [`error::boundary`].

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void};
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use terrace_collections::{CollectionError, Collections, MapOptions, OrderedMap, Range};
use terrace_pool::{Oid, Pool, RegionBackend};

use crate::error::{self, fail_with, str_arg};
use crate::pmemobj::{fail, PoolHandle};

/// `terrace_omap_open`: create the map when the name is unbound.
pub const TERRACE_OMAP_CREATE: c_int = 1;
/// `terrace_omap_cursor_open`: walk from the high end down.
pub const TERRACE_OMAP_REVERSE: c_int = 1;
/// `terrace_omap_cursor_open`: the low bound is exclusive.
pub const TERRACE_OMAP_LO_EXCLUSIVE: c_int = 2;
/// `terrace_omap_cursor_open`: the high bound is inclusive.
pub const TERRACE_OMAP_HI_INCLUSIVE: c_int = 4;

type Dir = Collections<'static, RegionBackend>;

/// A pool handle's directory, opened by the first call that needs it.
#[derive(Default)]
pub struct LazyCollections {
    cell: OnceLock<Dir>,
    init: Mutex<()>,
}

/// The errno of a collection error other than a pool's (those keep the pool's mapping).
fn errno_of(err: &CollectionError) -> c_int {
    match err {
        CollectionError::NotFound { .. } => libc::ENOENT,
        CollectionError::WrongKind { .. } | CollectionError::AlreadyBound { .. } => libc::EEXIST,
        CollectionError::Busy { .. } => libc::EBUSY,
        _ => libc::EINVAL,
    }
}

fn fail_coll(what: &str, err: &CollectionError) -> c_int {
    match err {
        CollectionError::Pool(e) => fail(e),
        other => fail_with(errno_of(other), &format!("{what}: {other}")),
    }
}

/// The pool of `h` with the lifetime of its box (see the module docs).
fn static_pool(h: &PoolHandle) -> &'static Pool<RegionBackend> {
    let pool: *const Pool<RegionBackend> = &h.pool;
    // SAFETY: the pool lives in the handle's box until `pmemobj_close` frees it, which
    // refuses while a map is open and drops the directory (the only other holder of this
    // borrow) before the pool.
    unsafe { &*pool }
}

impl LazyCollections {
    fn get(&self, h: &PoolHandle) -> Result<&Dir, CollectionError> {
        if let Some(c) = self.cell.get() {
            return Ok(c);
        }
        let _init = self.init.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = self.cell.get() {
            return Ok(c);
        }
        let dir = Collections::open(static_pool(h))?;
        Ok(self.cell.get_or_init(|| dir))
    }
}

/// What a `terrace_omap *` points to.
pub struct OmapHandle {
    map: OrderedMap<'static, RegionBackend>,
    pool: *const PoolHandle,
    cursors: AtomicUsize,
}

/// What a `terrace_omap_cursor *` points to.
pub struct CursorHandle {
    range: Range<'static, 'static, RegionBackend>,
    map: *const OmapHandle,
}

/// `len` bytes at `p`; NULL is allowed for 0 bytes.
///
/// # Safety
/// `p` NULL or valid for `len` bytes for `'a`.
unsafe fn bytes<'a>(
    what: &str,
    name: &str,
    p: *const c_void,
    len: usize,
) -> Result<&'a [u8], c_int> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(fail_with(
            libc::EINVAL,
            &format!("{what}: {name} is NULL with length {len}"),
        ));
    }
    // SAFETY: non-null and valid for len bytes (contract).
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// # Safety
/// `map` NULL or a live map handle.
unsafe fn map_arg<'a>(what: &str, map: *const OmapHandle) -> Result<&'a OmapHandle, c_int> {
    // SAFETY: contract.
    unsafe { map.as_ref() }.ok_or_else(|| fail_with(libc::EINVAL, &format!("{what}: map is NULL")))
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
unsafe fn pool_and_name<'a>(
    what: &str,
    pool: *mut PoolHandle,
    name: *const c_char,
) -> Result<(&'a PoolHandle, &'a str), c_int> {
    // SAFETY: contract.
    let Some(h) = (unsafe { pool.as_ref() }) else {
        return Err(fail_with(libc::EINVAL, &format!("{what}: pool is NULL")));
    };
    // SAFETY: contract.
    let Some(name) = (unsafe { str_arg(name) }) else {
        return Err(fail_with(
            libc::EINVAL,
            &format!("{what}: name is NULL or not UTF-8"),
        ));
    };
    Ok((h, name))
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_open(
    pool: *mut PoolHandle,
    name: *const c_char,
    max_key: u32,
    inline_value: u32,
    flags: c_int,
) -> *mut OmapHandle {
    const WHAT: &str = "terrace_omap_open";
    error::boundary(WHAT, std::ptr::null_mut(), || {
        // SAFETY: contract.
        let Ok((h, name)) = (unsafe { pool_and_name(WHAT, pool, name) }) else {
            return std::ptr::null_mut();
        };
        if flags & !TERRACE_OMAP_CREATE != 0 {
            fail_with(libc::EINVAL, &format!("{WHAT}: unknown flags {flags:#x}"));
            return std::ptr::null_mut();
        }
        let opts = MapOptions {
            max_key,
            inline_value,
            create: flags & TERRACE_OMAP_CREATE != 0,
            shape: None,
        };
        let opened = h
            .collections
            .get(h)
            .and_then(|dir| dir.ordered_map(name, opts));
        match opened {
            Ok(map) => {
                h.open_maps.fetch_add(1, Ordering::AcqRel);
                Box::into_raw(Box::new(OmapHandle {
                    map,
                    pool: pool.cast_const(),
                    cursors: AtomicUsize::new(0),
                }))
            }
            Err(e) => {
                fail_coll(WHAT, &e);
                std::ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `map` NULL or a live map handle, not used after a successful close.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_close(map: *mut OmapHandle) -> c_int {
    const WHAT: &str = "terrace_omap_close";
    error::boundary(WHAT, libc::EIO, || {
        // SAFETY: contract.
        let Some(m) = (unsafe { map.as_ref() }) else {
            return 0;
        };
        if m.cursors.load(Ordering::Acquire) != 0 {
            return fail_with(
                libc::EBUSY,
                &format!("{WHAT}: a cursor over this map is open"),
            );
        }
        // SAFETY: created by Box::into_raw in terrace_omap_open; no cursor borrows it.
        let m = unsafe { Box::from_raw(map) };
        let pool = m.pool;
        drop(m);
        // SAFETY: the pool stays open while this map was (close refuses before).
        unsafe { &*pool }.open_maps.fetch_sub(1, Ordering::AcqRel);
        0
    })
}

/// # Safety
/// `map` NULL or a live map handle; `key` and `value` valid for their lengths.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_put(
    map: *mut OmapHandle,
    key: *const c_void,
    key_len: usize,
    value: *const c_void,
    value_len: usize,
) -> c_int {
    const WHAT: &str = "terrace_omap_put";
    error::boundary(WHAT, libc::EIO, || {
        // SAFETY: contract.
        let args = unsafe {
            map_arg(WHAT, map).and_then(|m| {
                Ok((
                    m,
                    bytes(WHAT, "key", key, key_len)?,
                    bytes(WHAT, "value", value, value_len)?,
                ))
            })
        };
        let (m, key, value) = match args {
            Ok(a) => a,
            Err(code) => return code,
        };
        match m.map.put(key, value) {
            Ok(_) => 0,
            Err(e) => fail_coll(WHAT, &e),
        }
    })
}

thread_local! {
    /// A get's value before it is copied out (reused: no allocation per call).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// # Safety
/// `map` NULL or a live map handle; `key` valid for `key_len` bytes; `buf` valid for
/// `cap` writable bytes (NULL when `cap` is 0).
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_get(
    map: *mut OmapHandle,
    key: *const c_void,
    key_len: usize,
    buf: *mut c_void,
    cap: usize,
) -> i64 {
    const WHAT: &str = "terrace_omap_get";
    error::boundary(WHAT, -1, || {
        // SAFETY: contract.
        let args =
            unsafe { map_arg(WHAT, map).and_then(|m| Ok((m, bytes(WHAT, "key", key, key_len)?))) };
        let Ok((m, key)) = args else {
            return -1;
        };
        if cap > 0 && buf.is_null() {
            fail_with(
                libc::EINVAL,
                &format!("{WHAT}: buf is NULL with capacity {cap}"),
            );
            return -1;
        }
        SCRATCH.with_borrow_mut(|out| match m.map.get_into(key, out) {
            Ok(true) => {
                let n = out.len().min(cap);
                if n > 0 {
                    // SAFETY: buf is valid for cap >= n bytes (contract) and is not `out`.
                    unsafe { std::ptr::copy_nonoverlapping(out.as_ptr(), buf.cast::<u8>(), n) };
                }
                out.len() as i64
            }
            Ok(false) => {
                fail_with(libc::ENOENT, &format!("{WHAT}: no such key"));
                -1
            }
            Err(e) => {
                fail_coll(WHAT, &e);
                -1
            }
        })
    })
}

/// # Safety
/// `map` NULL or a live map handle; `key` valid for `key_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_remove(
    map: *mut OmapHandle,
    key: *const c_void,
    key_len: usize,
) -> c_int {
    const WHAT: &str = "terrace_omap_remove";
    error::boundary(WHAT, libc::EIO, || {
        // SAFETY: contract.
        let args =
            unsafe { map_arg(WHAT, map).and_then(|m| Ok((m, bytes(WHAT, "key", key, key_len)?))) };
        let (m, key) = match args {
            Ok(a) => a,
            Err(code) => return code,
        };
        match m.map.remove(key) {
            Ok(true) => 0,
            Ok(false) => fail_with(libc::ENOENT, &format!("{WHAT}: no such key")),
            Err(e) => fail_coll(WHAT, &e),
        }
    })
}

/// # Safety
/// `map` NULL or a live map handle.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_len(map: *mut OmapHandle) -> u64 {
    const WHAT: &str = "terrace_omap_len";
    error::boundary(WHAT, u64::MAX, || {
        // SAFETY: contract.
        let Ok(m) = (unsafe { map_arg(WHAT, map) }) else {
            return u64::MAX;
        };
        m.map.len().unwrap_or_else(|e| {
            fail_coll(WHAT, &e);
            u64::MAX
        })
    })
}

/// # Safety
/// `map` NULL or a live map handle; `lo`, `hi` NULL (unbounded) or valid for their
/// lengths.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_cursor_open(
    map: *mut OmapHandle,
    lo: *const c_void,
    lo_len: usize,
    hi: *const c_void,
    hi_len: usize,
    flags: c_int,
) -> *mut CursorHandle {
    const WHAT: &str = "terrace_omap_cursor_open";
    error::boundary(WHAT, std::ptr::null_mut(), || {
        // SAFETY: contract.
        let Ok(m) = (unsafe { map_arg(WHAT, map) }) else {
            return std::ptr::null_mut();
        };
        let known = TERRACE_OMAP_REVERSE | TERRACE_OMAP_LO_EXCLUSIVE | TERRACE_OMAP_HI_INCLUSIVE;
        if flags & !known != 0 {
            fail_with(libc::EINVAL, &format!("{WHAT}: unknown flags {flags:#x}"));
            return std::ptr::null_mut();
        }
        // SAFETY: contract (NULL means unbounded whatever the length).
        let bound = |p: *const c_void, len: usize, inclusive: bool| unsafe {
            if p.is_null() {
                return Ok(Bound::Unbounded);
            }
            let k = bytes(WHAT, "bound", p, len)?;
            Ok::<_, c_int>(if inclusive {
                Bound::Included(k)
            } else {
                Bound::Excluded(k)
            })
        };
        let lo = bound(lo, lo_len, flags & TERRACE_OMAP_LO_EXCLUSIVE == 0);
        let hi = bound(hi, hi_len, flags & TERRACE_OMAP_HI_INCLUSIVE != 0);
        let (Ok(lo), Ok(hi)) = (lo, hi) else {
            return std::ptr::null_mut();
        };
        let map_ref: *const OrderedMap<'static, RegionBackend> = &m.map;
        // SAFETY: the map handle outlives the cursor: terrace_omap_close refuses while
        // `cursors` counts it (module docs).
        let map_static: &'static OrderedMap<'static, RegionBackend> = unsafe { &*map_ref };
        m.cursors.fetch_add(1, Ordering::AcqRel);
        Box::into_raw(Box::new(CursorHandle {
            range: map_static.range(lo, hi, flags & TERRACE_OMAP_REVERSE != 0),
            map: map.cast_const(),
        }))
    })
}

/// # Safety
/// `cursor` NULL or a live cursor used by no other thread; the buffers valid for their
/// capacities (NULL when 0); `key_len`, `value_len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_cursor_next(
    cursor: *mut CursorHandle,
    key: *mut c_void,
    key_cap: usize,
    key_len: *mut usize,
    value: *mut c_void,
    value_cap: usize,
    value_len: *mut usize,
) -> c_int {
    const WHAT: &str = "terrace_omap_cursor_next";
    error::boundary(WHAT, -1, || {
        // SAFETY: contract.
        let Some(c) = (unsafe { cursor.as_mut() }) else {
            fail_with(libc::EINVAL, &format!("{WHAT}: cursor is NULL"));
            return -1;
        };
        if (key_cap > 0 && key.is_null()) || (value_cap > 0 && value.is_null()) {
            fail_with(
                libc::EINVAL,
                &format!("{WHAT}: a buffer is NULL with a nonzero capacity"),
            );
            return -1;
        }
        match c.range.next_entry() {
            Ok(None) => 0,
            Ok(Some((k, v))) => {
                // SAFETY: each destination is valid for its capacity (contract); the
                // sources are the cursor's own buffers.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        k.as_ptr(),
                        key.cast::<u8>(),
                        k.len().min(key_cap),
                    );
                    std::ptr::copy_nonoverlapping(
                        v.as_ptr(),
                        value.cast::<u8>(),
                        v.len().min(value_cap),
                    );
                    if !key_len.is_null() {
                        *key_len = k.len();
                    }
                    if !value_len.is_null() {
                        *value_len = v.len();
                    }
                }
                1
            }
            Err(e) => {
                fail_coll(WHAT, &e);
                -1
            }
        }
    })
}

/// # Safety
/// `cursor` NULL or a live cursor, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_cursor_close(cursor: *mut CursorHandle) {
    error::boundary("terrace_omap_cursor_close", (), || {
        if cursor.is_null() {
            return;
        }
        // SAFETY: created by Box::into_raw in terrace_omap_cursor_open (contract).
        let c = unsafe { Box::from_raw(cursor) };
        let map = c.map;
        drop(c);
        // SAFETY: the map outlives its cursors (terrace_omap_close refuses before).
        unsafe { &*map }.cursors.fetch_sub(1, Ordering::AcqRel);
    })
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_destroy(pool: *mut PoolHandle, name: *const c_char) -> c_int {
    const WHAT: &str = "terrace_omap_destroy";
    error::boundary(WHAT, libc::EIO, || {
        // SAFETY: contract.
        let (h, name) = match unsafe { pool_and_name(WHAT, pool, name) } {
            Ok(a) => a,
            Err(code) => return code,
        };
        match h.collections.get(h).and_then(|dir| dir.destroy(name)) {
            Ok(()) => 0,
            Err(e) => fail_coll(WHAT, &e),
        }
    })
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_bind(
    pool: *mut PoolHandle,
    name: *const c_char,
    off: u64,
) -> c_int {
    const WHAT: &str = "terrace_pool_bind";
    error::boundary(WHAT, libc::EIO, || {
        // SAFETY: contract.
        let (h, name) = match unsafe { pool_and_name(WHAT, pool, name) } {
            Ok(a) => a,
            Err(code) => return code,
        };
        let Some(oid) = Oid::from_offset(off) else {
            return fail_with(
                libc::EINVAL,
                &format!("{WHAT}: offset 0 is the null object"),
            );
        };
        match h
            .collections
            .get(h)
            .and_then(|dir| dir.bind_object(name, oid))
        {
            Ok(()) => 0,
            Err(e) => fail_coll(WHAT, &e),
        }
    })
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_lookup(pool: *mut PoolHandle, name: *const c_char) -> u64 {
    const WHAT: &str = "terrace_pool_lookup";
    error::boundary(WHAT, 0, || {
        // SAFETY: contract.
        let Ok((h, name)) = (unsafe { pool_and_name(WHAT, pool, name) }) else {
            return 0;
        };
        match h.collections.get(h).and_then(|dir| dir.lookup(name)) {
            Ok(Some(b)) => b.oid.offset(),
            Ok(None) => {
                fail_with(libc::ENOENT, &format!("{WHAT}: {name:?} is not bound"));
                0
            }
            Err(e) => {
                fail_coll(WHAT, &e);
                0
            }
        }
    })
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_unbind(pool: *mut PoolHandle, name: *const c_char) -> u64 {
    const WHAT: &str = "terrace_pool_unbind";
    error::boundary(WHAT, 0, || {
        // SAFETY: contract.
        let Ok((h, name)) = (unsafe { pool_and_name(WHAT, pool, name) }) else {
            return 0;
        };
        match h.collections.get(h).and_then(|dir| dir.unbind_object(name)) {
            Ok(oid) => oid.offset(),
            Err(e) => {
                fail_coll(WHAT, &e);
                0
            }
        }
    })
}

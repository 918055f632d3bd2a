//! Persistent collections by handle (`include/terrace_collections.h`): ordered maps, hash
//! maps and named objects in a pool's directory, over `terrace-collections`.
//!
//! Owns [`LazyCollections`] (a pool handle's directory, opened on first use),
//! [`MapHandle`] (an open map of either kind: `terrace_omap *` and `terrace_hmap *`) and
//! [`CursorHandle`] (an ordered map's range cursor or a hash map's iterator). Each call
//! of the two map families has one implementation here, which the `terrace_omap_*` and
//! `terrace_hmap_*` entry points share.
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

use std::ffi::{c_char, c_int, c_void};
use std::ops::Bound;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use terrace_collections::{
    CollectionError, Collections, HashIter, HashMap, Kind, MapOptions, OrderedMap, Range,
};
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

pub(crate) type Dir = Collections<'static, RegionBackend>;

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

pub(crate) fn fail_coll(what: &str, err: &CollectionError) -> c_int {
    match err {
        CollectionError::Pool(e) => fail(e),
        other => fail_with(errno_of(other), &format!("{what}: {other}")),
    }
}

/// The pool of `h` with the lifetime of its box (see the module docs).
fn static_pool(h: &PoolHandle) -> &'static Pool<RegionBackend> {
    // The pool lives in the handle's box until `pmemobj_close` frees it, which refuses
    // while a map is open and drops the directory (this borrow's other holder) first.
    let pool: *const Pool<RegionBackend> = &h.pool;
    // SAFETY: the box outlives every holder of the borrow, as said just above.
    unsafe { &*pool }
}

impl LazyCollections {
    pub(crate) fn get(&self, h: &PoolHandle) -> Result<&Dir, CollectionError> {
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

/// An open map of either kind.
enum AnyMap {
    Ordered(OrderedMap<'static, RegionBackend>),
    Hash(HashMap<'static, RegionBackend>),
}

impl AnyMap {
    fn put(&self, key: &[u8], value: &[u8]) -> Result<bool, CollectionError> {
        match self {
            AnyMap::Ordered(m) => m.put(key, value),
            AnyMap::Hash(m) => m.put(key, value),
        }
    }

    fn get_to(&self, key: &[u8], buf: &mut [u8]) -> Result<Option<u64>, CollectionError> {
        match self {
            AnyMap::Ordered(m) => m.get_to(key, buf),
            AnyMap::Hash(m) => m.get_to(key, buf),
        }
    }

    fn remove(&self, key: &[u8]) -> Result<bool, CollectionError> {
        match self {
            AnyMap::Ordered(m) => m.remove(key),
            AnyMap::Hash(m) => m.remove(key),
        }
    }

    fn len(&self) -> Result<u64, CollectionError> {
        match self {
            AnyMap::Ordered(m) => m.len(),
            AnyMap::Hash(m) => m.len(),
        }
    }
}

/// What a `terrace_omap *` or `terrace_hmap *` points to.
pub struct MapHandle {
    map: AnyMap,
    pool: *const PoolHandle,
    cursors: AtomicUsize,
}

/// A cursor of either kind.
enum AnyCursor {
    Range(Range<'static, 'static, RegionBackend>),
    Hash(HashIter<'static, 'static, RegionBackend>),
}

/// What a `terrace_omap_cursor *` or `terrace_hmap_iter *` points to.
pub struct CursorHandle {
    cursor: AnyCursor,
    map: *const MapHandle,
}

/// `len` bytes at `p`; NULL is allowed for 0 bytes.
///
/// # Safety
/// `p` NULL or valid for `len` bytes for `'a`.
pub(crate) unsafe fn bytes<'a>(
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
unsafe fn map_arg<'a>(what: &str, map: *const MapHandle) -> Result<&'a MapHandle, c_int> {
    // SAFETY: contract.
    unsafe { map.as_ref() }.ok_or_else(|| fail_with(libc::EINVAL, &format!("{what}: map is NULL")))
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
pub(crate) unsafe fn pool_and_name<'a>(
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
unsafe fn map_open(
    what: &'static str,
    pool: *mut PoolHandle,
    name: *const c_char,
    max_key: u32,
    inline_value: u32,
    flags: c_int,
    kind: Kind,
) -> *mut MapHandle {
    error::boundary(what, std::ptr::null_mut(), || {
        // SAFETY: contract.
        let Ok((h, name)) = (unsafe { pool_and_name(what, pool, name) }) else {
            return std::ptr::null_mut();
        };
        if flags & !TERRACE_OMAP_CREATE != 0 {
            fail_with(libc::EINVAL, &format!("{what}: unknown flags {flags:#x}"));
            return std::ptr::null_mut();
        }
        let opts = MapOptions {
            max_key,
            inline_value,
            create: flags & TERRACE_OMAP_CREATE != 0,
            shape: None,
        };
        let opened = h.collections.get(h).and_then(|dir| match kind {
            Kind::HashMap => dir.hash_map(name, opts).map(AnyMap::Hash),
            _ => dir.ordered_map(name, opts).map(AnyMap::Ordered),
        });
        match opened {
            Ok(map) => {
                h.open_maps.fetch_add(1, Ordering::AcqRel);
                Box::into_raw(Box::new(MapHandle {
                    map,
                    pool: pool.cast_const(),
                    cursors: AtomicUsize::new(0),
                }))
            }
            Err(e) => {
                fail_coll(what, &e);
                std::ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `map` NULL or a live map handle, not used after a successful close.
unsafe fn map_close(what: &'static str, map: *mut MapHandle) -> c_int {
    error::boundary(what, libc::EIO, || {
        // SAFETY: contract.
        let Some(m) = (unsafe { map.as_ref() }) else {
            return 0;
        };
        if m.cursors.load(Ordering::Acquire) != 0 {
            return fail_with(
                libc::EBUSY,
                &format!("{what}: a cursor over this map is open"),
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
unsafe fn map_put(
    what: &'static str,
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
    value: *const c_void,
    value_len: usize,
) -> c_int {
    error::boundary(what, libc::EIO, || {
        // SAFETY: contract.
        let args = unsafe {
            map_arg(what, map).and_then(|m| {
                Ok((
                    m,
                    bytes(what, "key", key, key_len)?,
                    bytes(what, "value", value, value_len)?,
                ))
            })
        };
        let (m, key, value) = match args {
            Ok(a) => a,
            Err(code) => return code,
        };
        match m.map.put(key, value) {
            Ok(_) => 0,
            Err(e) => fail_coll(what, &e),
        }
    })
}

/// Copies up to `cap` bytes of `key`'s value into `buf`: the value's whole length, or the
/// errno of the failure (`ENOENT` when absent, with no message recorded: a miss is not an
/// error to describe; any other failure is recorded as usual).
///
/// # Safety
/// `map` NULL or a live map handle; `key` valid for `key_len` bytes; `buf` valid for
/// `cap` writable bytes (NULL when `cap` is 0).
unsafe fn map_lookup(
    what: &'static str,
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
    buf: *mut c_void,
    cap: usize,
) -> Result<u64, c_int> {
    // SAFETY: contract.
    let (m, key) =
        unsafe { map_arg(what, map).and_then(|m| Ok((m, bytes(what, "key", key, key_len)?))) }?;
    if cap > 0 && buf.is_null() {
        return Err(fail_with(
            libc::EINVAL,
            &format!("{what}: buf is NULL with capacity {cap}"),
        ));
    }
    let out: &mut [u8] = if cap == 0 {
        &mut []
    } else {
        // SAFETY: non-null and valid for cap writable bytes (contract).
        unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), cap) }
    };
    match m.map.get_to(key, out) {
        Ok(Some(len)) => Ok(len),
        Ok(None) => Err(libc::ENOENT),
        Err(e) => Err(fail_coll(what, &e)),
    }
}

/// `terrace_omap_get` / `terrace_hmap_get`: the length, or -1 with errno.
///
/// # Safety
/// As [`map_lookup`].
unsafe fn map_get(
    what: &'static str,
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
    buf: *mut c_void,
    cap: usize,
) -> i64 {
    error::boundary(what, -1, || {
        // SAFETY: the caller's contract is map_lookup's.
        match unsafe { map_lookup(what, map, key, key_len, buf, cap) } {
            Ok(len) => len as i64,
            Err(libc::ENOENT) => {
                fail_with(libc::ENOENT, &format!("{what}: no such key"));
                -1
            }
            Err(_) => -1,
        }
    })
}

/// `terrace_omap_find` / `terrace_hmap_find`: the length, or a negative errno (errno is
/// not the channel, so a binding need not capture it).
///
/// # Safety
/// As [`map_lookup`].
unsafe fn map_find(
    what: &'static str,
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
    buf: *mut c_void,
    cap: usize,
) -> i64 {
    error::boundary(what, -(libc::EIO as i64), || {
        // SAFETY: the caller's contract is map_lookup's.
        match unsafe { map_lookup(what, map, key, key_len, buf, cap) } {
            Ok(len) => len as i64,
            Err(code) => -(code as i64),
        }
    })
}

/// # Safety
/// `map` NULL or a live map handle; `key` valid for `key_len` bytes.
unsafe fn map_remove(
    what: &'static str,
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
) -> c_int {
    error::boundary(what, libc::EIO, || {
        // SAFETY: contract.
        let args =
            unsafe { map_arg(what, map).and_then(|m| Ok((m, bytes(what, "key", key, key_len)?))) };
        let (m, key) = match args {
            Ok(a) => a,
            Err(code) => return code,
        };
        match m.map.remove(key) {
            Ok(true) => 0,
            Ok(false) => fail_with(libc::ENOENT, &format!("{what}: no such key")),
            Err(e) => fail_coll(what, &e),
        }
    })
}

/// # Safety
/// `map` NULL or a live map handle.
unsafe fn map_len(what: &'static str, map: *mut MapHandle) -> u64 {
    error::boundary(what, u64::MAX, || {
        // SAFETY: contract.
        let Ok(m) = (unsafe { map_arg(what, map) }) else {
            return u64::MAX;
        };
        m.map.len().unwrap_or_else(|e| {
            fail_coll(what, &e);
            u64::MAX
        })
    })
}

/// # Safety
/// `map` NULL or a live map handle; `lo`, `hi` NULL (unbounded) or valid for their
/// lengths.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_cursor_open(
    map: *mut MapHandle,
    lo: *const c_void,
    lo_len: usize,
    hi: *const c_void,
    hi_len: usize,
    flags: c_int,
) -> *mut CursorHandle {
    let what = "terrace_omap_cursor_open";
    error::boundary(what, std::ptr::null_mut(), || {
        // SAFETY: contract.
        let Ok(m) = (unsafe { map_arg(what, map) }) else {
            return std::ptr::null_mut();
        };
        let known = TERRACE_OMAP_REVERSE | TERRACE_OMAP_LO_EXCLUSIVE | TERRACE_OMAP_HI_INCLUSIVE;
        if flags & !known != 0 {
            fail_with(libc::EINVAL, &format!("{what}: unknown flags {flags:#x}"));
            return std::ptr::null_mut();
        }
        // SAFETY: contract (NULL means unbounded whatever the length).
        let bound = |p: *const c_void, len: usize, inclusive: bool| unsafe {
            if p.is_null() {
                return Ok(Bound::Unbounded);
            }
            let k = bytes(what, "bound", p, len)?;
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
        let AnyMap::Ordered(ordered) = &m.map else {
            fail_with(
                libc::EINVAL,
                &format!("{what}: a hash map has no key order (terrace_hmap_iter_open)"),
            );
            return std::ptr::null_mut();
        };
        let map_ref: *const OrderedMap<'static, RegionBackend> = ordered;
        // SAFETY: the map handle outlives the cursor: terrace_omap_close refuses while
        // `cursors` counts it (module docs).
        let map_static: &'static OrderedMap<'static, RegionBackend> = unsafe { &*map_ref };
        m.cursors.fetch_add(1, Ordering::AcqRel);
        Box::into_raw(Box::new(CursorHandle {
            cursor: AnyCursor::Range(map_static.range(lo, hi, flags & TERRACE_OMAP_REVERSE != 0)),
            map: map.cast_const(),
        }))
    })
}

/// # Safety
/// `cursor` NULL or a live cursor used by no other thread; the buffers valid for their
/// capacities (NULL when 0); `key_len`, `value_len` NULL or writable.
#[allow(clippy::too_many_arguments)] // the C signature plus the entry point's name
unsafe fn map_cursor_next(
    what: &'static str,
    cursor: *mut CursorHandle,
    key: *mut c_void,
    key_cap: usize,
    key_len: *mut usize,
    value: *mut c_void,
    value_cap: usize,
    value_len: *mut usize,
) -> c_int {
    error::boundary(what, -1, || {
        // SAFETY: contract.
        let Some(c) = (unsafe { cursor.as_mut() }) else {
            fail_with(libc::EINVAL, &format!("{what}: cursor is NULL"));
            return -1;
        };
        if (key_cap > 0 && key.is_null()) || (value_cap > 0 && value.is_null()) {
            fail_with(
                libc::EINVAL,
                &format!("{what}: a buffer is NULL with a nonzero capacity"),
            );
            return -1;
        }
        let next = match &mut c.cursor {
            AnyCursor::Range(r) => r.next_entry(),
            AnyCursor::Hash(h) => h.next_entry(),
        };
        match next {
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
                fail_coll(what, &e);
                -1
            }
        }
    })
}

/// # Safety
/// `cursor` NULL or a live cursor, not used afterwards.
unsafe fn map_cursor_close(what: &'static str, cursor: *mut CursorHandle) {
    error::boundary(what, (), || {
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
unsafe fn map_destroy(what: &'static str, pool: *mut PoolHandle, name: *const c_char) -> c_int {
    error::boundary(what, libc::EIO, || {
        // SAFETY: contract.
        let (h, name) = match unsafe { pool_and_name(what, pool, name) } {
            Ok(a) => a,
            Err(code) => return code,
        };
        match h.collections.get(h).and_then(|dir| dir.destroy_map(name)) {
            Ok(()) => 0,
            Err(e) => fail_coll(what, &e),
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
    let what = "terrace_pool_bind";
    error::boundary(what, libc::EIO, || {
        // SAFETY: contract.
        let (h, name) = match unsafe { pool_and_name(what, pool, name) } {
            Ok(a) => a,
            Err(code) => return code,
        };
        let Some(oid) = Oid::from_offset(off) else {
            return fail_with(
                libc::EINVAL,
                &format!("{what}: offset 0 is the null object"),
            );
        };
        match h
            .collections
            .get(h)
            .and_then(|dir| dir.bind_object(name, oid))
        {
            Ok(()) => 0,
            Err(e) => fail_coll(what, &e),
        }
    })
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_lookup(pool: *mut PoolHandle, name: *const c_char) -> u64 {
    let what = "terrace_pool_lookup";
    error::boundary(what, 0, || {
        // SAFETY: contract.
        let Ok((h, name)) = (unsafe { pool_and_name(what, pool, name) }) else {
            return 0;
        };
        match h.collections.get(h).and_then(|dir| dir.lookup(name)) {
            Ok(Some(b)) => b.oid.offset(),
            Ok(None) => {
                fail_with(libc::ENOENT, &format!("{what}: {name:?} is not bound"));
                0
            }
            Err(e) => {
                fail_coll(what, &e);
                0
            }
        }
    })
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_unbind(pool: *mut PoolHandle, name: *const c_char) -> u64 {
    let what = "terrace_pool_unbind";
    error::boundary(what, 0, || {
        // SAFETY: contract.
        let Ok((h, name)) = (unsafe { pool_and_name(what, pool, name) }) else {
            return 0;
        };
        match h.collections.get(h).and_then(|dir| dir.unbind_object(name)) {
            Ok(oid) => oid.offset(),
            Err(e) => {
                fail_coll(what, &e);
                0
            }
        }
    })
}

// ---- the entry points: ordered maps (terrace_omap_*) and hash maps (terrace_hmap_*) ----

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_open(
    pool: *mut PoolHandle,
    name: *const c_char,
    max_key: u32,
    inline_value: u32,
    flags: c_int,
) -> *mut MapHandle {
    // SAFETY: the caller's contract is map_open's.
    unsafe {
        map_open(
            "terrace_omap_open",
            pool,
            name,
            max_key,
            inline_value,
            flags,
            Kind::OrderedMap,
        )
    }
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_open(
    pool: *mut PoolHandle,
    name: *const c_char,
    max_key: u32,
    inline_value: u32,
    flags: c_int,
) -> *mut MapHandle {
    // SAFETY: the caller's contract is map_open's.
    unsafe {
        map_open(
            "terrace_hmap_open",
            pool,
            name,
            max_key,
            inline_value,
            flags,
            Kind::HashMap,
        )
    }
}

/// # Safety
/// `map` NULL or a live map handle, not used after a successful close.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_close(map: *mut MapHandle) -> c_int {
    // SAFETY: the caller's contract is map_close's.
    unsafe { map_close("terrace_omap_close", map) }
}

/// # Safety
/// `map` NULL or a live map handle, not used after a successful close.
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_close(map: *mut MapHandle) -> c_int {
    // SAFETY: the caller's contract is map_close's.
    unsafe { map_close("terrace_hmap_close", map) }
}

/// # Safety
/// `map` NULL or a live map handle; `key` and `value` valid for their lengths.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_put(
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
    value: *const c_void,
    value_len: usize,
) -> c_int {
    // SAFETY: the caller's contract is map_put's.
    unsafe { map_put("terrace_omap_put", map, key, key_len, value, value_len) }
}

/// # Safety
/// `map` NULL or a live map handle; `key` and `value` valid for their lengths.
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_put(
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
    value: *const c_void,
    value_len: usize,
) -> c_int {
    // SAFETY: the caller's contract is map_put's.
    unsafe { map_put("terrace_hmap_put", map, key, key_len, value, value_len) }
}

/// # Safety
/// `map` NULL or a live map handle; `key` valid for `key_len` bytes; `buf` valid for
/// `cap` writable bytes (NULL when `cap` is 0).
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_get(
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
    buf: *mut c_void,
    cap: usize,
) -> i64 {
    // SAFETY: the caller's contract is map_get's.
    unsafe { map_get("terrace_omap_get", map, key, key_len, buf, cap) }
}

/// # Safety
/// `map` NULL or a live map handle; `key` valid for `key_len` bytes; `buf` valid for
/// `cap` writable bytes (NULL when `cap` is 0).
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_get(
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
    buf: *mut c_void,
    cap: usize,
) -> i64 {
    // SAFETY: the caller's contract is map_get's.
    unsafe { map_get("terrace_hmap_get", map, key, key_len, buf, cap) }
}

/// # Safety
/// `map` NULL or a live map handle; `key` valid for `key_len` bytes; `buf` valid for
/// `cap` writable bytes (NULL when `cap` is 0).
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_find(
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
    buf: *mut c_void,
    cap: usize,
) -> i64 {
    // SAFETY: the caller's contract is map_find's.
    unsafe { map_find("terrace_omap_find", map, key, key_len, buf, cap) }
}

/// # Safety
/// `map` NULL or a live map handle; `key` valid for `key_len` bytes; `buf` valid for
/// `cap` writable bytes (NULL when `cap` is 0).
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_find(
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
    buf: *mut c_void,
    cap: usize,
) -> i64 {
    // SAFETY: the caller's contract is map_find's.
    unsafe { map_find("terrace_hmap_find", map, key, key_len, buf, cap) }
}

/// # Safety
/// `map` NULL or a live map handle; `key` valid for `key_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_remove(
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
) -> c_int {
    // SAFETY: the caller's contract is map_remove's.
    unsafe { map_remove("terrace_omap_remove", map, key, key_len) }
}

/// # Safety
/// `map` NULL or a live map handle; `key` valid for `key_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_remove(
    map: *mut MapHandle,
    key: *const c_void,
    key_len: usize,
) -> c_int {
    // SAFETY: the caller's contract is map_remove's.
    unsafe { map_remove("terrace_hmap_remove", map, key, key_len) }
}

/// # Safety
/// `map` NULL or a live map handle.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_len(map: *mut MapHandle) -> u64 {
    // SAFETY: the caller's contract is map_len's.
    unsafe { map_len("terrace_omap_len", map) }
}

/// # Safety
/// `map` NULL or a live map handle.
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_len(map: *mut MapHandle) -> u64 {
    // SAFETY: the caller's contract is map_len's.
    unsafe { map_len("terrace_hmap_len", map) }
}

/// # Safety
/// `map` NULL or a live map handle.
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_iter_open(map: *mut MapHandle) -> *mut CursorHandle {
    let what = "terrace_hmap_iter_open";
    error::boundary(what, std::ptr::null_mut(), || {
        // SAFETY: contract.
        let Ok(m) = (unsafe { map_arg(what, map) }) else {
            return std::ptr::null_mut();
        };
        let AnyMap::Hash(hash) = &m.map else {
            fail_with(
                libc::EINVAL,
                &format!("{what}: an ordered map iterates with terrace_omap_cursor_open"),
            );
            return std::ptr::null_mut();
        };
        let map_ref: *const HashMap<'static, RegionBackend> = hash;
        // SAFETY: the map handle outlives the iterator: terrace_hmap_close refuses while
        // `cursors` counts it (module docs).
        let map_static: &'static HashMap<'static, RegionBackend> = unsafe { &*map_ref };
        m.cursors.fetch_add(1, Ordering::AcqRel);
        Box::into_raw(Box::new(CursorHandle {
            cursor: AnyCursor::Hash(map_static.iter()),
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
    // SAFETY: the caller's contract is map_cursor_next's.
    unsafe {
        map_cursor_next(
            "terrace_omap_cursor_next",
            cursor,
            key,
            key_cap,
            key_len,
            value,
            value_cap,
            value_len,
        )
    }
}

/// # Safety
/// As [`terrace_omap_cursor_next`].
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_iter_next(
    cursor: *mut CursorHandle,
    key: *mut c_void,
    key_cap: usize,
    key_len: *mut usize,
    value: *mut c_void,
    value_cap: usize,
    value_len: *mut usize,
) -> c_int {
    // SAFETY: the caller's contract is map_cursor_next's.
    unsafe {
        map_cursor_next(
            "terrace_hmap_iter_next",
            cursor,
            key,
            key_cap,
            key_len,
            value,
            value_cap,
            value_len,
        )
    }
}

/// # Safety
/// `cursor` NULL or a live cursor, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_cursor_close(cursor: *mut CursorHandle) {
    // SAFETY: the caller's contract is map_cursor_close's.
    unsafe { map_cursor_close("terrace_omap_cursor_close", cursor) }
}

/// # Safety
/// `cursor` NULL or a live cursor, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_iter_close(cursor: *mut CursorHandle) {
    // SAFETY: the caller's contract is map_cursor_close's.
    unsafe { map_cursor_close("terrace_hmap_iter_close", cursor) }
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_omap_destroy(pool: *mut PoolHandle, name: *const c_char) -> c_int {
    // SAFETY: the caller's contract is map_destroy's.
    unsafe { map_destroy("terrace_omap_destroy", pool, name) }
}

/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_hmap_destroy(pool: *mut PoolHandle, name: *const c_char) -> c_int {
    // SAFETY: the caller's contract is map_destroy's.
    unsafe { map_destroy("terrace_hmap_destroy", pool, name) }
}

//! Persistent arrays by handle (`terrace_array_*` in `include/terrace_collections.h`), over
//! `terrace_collections::PersistentArray`.
//!
//! Owns [`ArrayHandle`] (what a `terrace_array *` points to).
//!
//! Invariants (as the maps' in [`crate::collections`]):
//! - an array borrows its pool, which lives in its `PoolHandle` box: the pool handle's
//!   `open_maps` counts open arrays too, so `terrace_pool_close` / `pmemobj_close` refuse
//!   (`EBUSY`) while one is open;
//! - any number of threads may use one handle at once (readers take no lock, writers
//!   serialize inside); `terrace_array_close` must not overlap another call on the handle;
//! - no panic crosses the boundary: every entry point runs under [`error::boundary`].

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::Ordering;

use terrace_collections::{ArrayOptions, CollectionError, Kind, PersistentArray};
use terrace_pool::RegionBackend;

use crate::collections::{bytes, fail_coll, pool_and_name};
use crate::error::{self, fail_with};
use crate::pmemobj::PoolHandle;

/// `terrace_array_open`: create the array (zeroed) when the name is unbound.
pub const TERRACE_ARRAY_CREATE: c_int = 1;

/// What a `terrace_array *` points to.
pub struct ArrayHandle {
    array: PersistentArray<'static, RegionBackend>,
    pool: *const PoolHandle,
}

/// # Safety
/// `array` NULL or a live array handle.
unsafe fn array_arg<'a>(what: &str, array: *const ArrayHandle) -> Result<&'a ArrayHandle, c_int> {
    // SAFETY: contract.
    unsafe { array.as_ref() }
        .ok_or_else(|| fail_with(libc::EINVAL, &format!("{what}: array is NULL")))
}

fn errno_or_zero<T>(what: &str, r: Result<T, CollectionError>) -> c_int {
    match r {
        Ok(_) => 0,
        Err(e) => fail_coll(what, &e),
    }
}

/// Opens the array bound to `name`; with `TERRACE_ARRAY_CREATE`, creates (zeroed) and
/// binds it when the name is unbound. `length` and `element_size`: the sizes to create
/// with, or 0 or the array's own when opening an existing one.
///
/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_array_open(
    pool: *mut PoolHandle,
    name: *const c_char,
    length: u64,
    element_size: u32,
    flags: c_int,
) -> *mut ArrayHandle {
    let what = "terrace_array_open";
    error::boundary(what, std::ptr::null_mut(), || {
        // SAFETY: contract.
        let Ok((h, name)) = (unsafe { pool_and_name(what, pool, name) }) else {
            return std::ptr::null_mut();
        };
        if flags & !TERRACE_ARRAY_CREATE != 0 {
            fail_with(libc::EINVAL, &format!("{what}: unknown flags {flags:#x}"));
            return std::ptr::null_mut();
        }
        let opts = ArrayOptions {
            length,
            element_size,
            create: flags & TERRACE_ARRAY_CREATE != 0,
        };
        match h.collections.get(h).and_then(|dir| dir.array(name, opts)) {
            Ok(array) => {
                h.open_maps.fetch_add(1, Ordering::AcqRel);
                Box::into_raw(Box::new(ArrayHandle {
                    array,
                    pool: pool.cast_const(),
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
/// `array` NULL or a live array handle, not used after this call.
#[no_mangle]
pub unsafe extern "C" fn terrace_array_close(array: *mut ArrayHandle) -> c_int {
    error::boundary("terrace_array_close", libc::EIO, || {
        if array.is_null() {
            return 0;
        }
        // SAFETY: created by Box::into_raw in terrace_array_open (contract).
        let a = unsafe { Box::from_raw(array) };
        let pool = a.pool;
        drop(a);
        // SAFETY: the pool stays open while this array was (its close refuses before).
        unsafe { &*pool }.open_maps.fetch_sub(1, Ordering::AcqRel);
        0
    })
}

/// Elements in the array; 0 with errno EINVAL for NULL.
///
/// # Safety
/// `array` NULL or a live array handle.
#[no_mangle]
pub unsafe extern "C" fn terrace_array_len(array: *const ArrayHandle) -> u64 {
    let what = "terrace_array_len";
    error::boundary(what, 0, || {
        // SAFETY: contract.
        unsafe { array_arg(what, array) }.map_or(0, |a| a.array.len())
    })
}

/// Bytes per element; 0 with errno EINVAL for NULL.
///
/// # Safety
/// `array` NULL or a live array handle.
#[no_mangle]
pub unsafe extern "C" fn terrace_array_element_size(array: *const ArrayHandle) -> u32 {
    let what = "terrace_array_element_size";
    error::boundary(what, 0, || {
        // SAFETY: contract.
        unsafe { array_arg(what, array) }.map_or(0, |a| a.array.element_size())
    })
}

/// Copies `len` bytes (whole elements) from element `index` on into `buf`.
///
/// # Safety
/// `array` NULL or a live array handle; `buf` valid for `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn terrace_array_get(
    array: *const ArrayHandle,
    index: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    let what = "terrace_array_get";
    error::boundary(what, libc::EIO, || {
        // SAFETY: contract.
        let a = match unsafe { array_arg(what, array) } {
            Ok(a) => &a.array,
            Err(code) => return code,
        };
        if buf.is_null() && len > 0 {
            return fail_with(
                libc::EINVAL,
                &format!("{what}: buf is NULL with length {len}"),
            );
        }
        if len == 8 && a.element_size() == 8 {
            return match a.get_u64(index) {
                Ok(word) => {
                    // SAFETY: buf is valid for 8 writable bytes (contract), maybe unaligned.
                    unsafe { buf.cast::<[u8; 8]>().write_unaligned(word.to_le_bytes()) };
                    0
                }
                Err(e) => fail_coll(what, &e),
            };
        }
        let out: &mut [u8] = if len == 0 {
            &mut []
        } else {
            // SAFETY: non-null and valid for len writable bytes (contract).
            unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) }
        };
        errno_or_zero(what, a.get_range(index, out))
    })
}

/// Writes `len` bytes (whole elements) from element `index` on; crash-atomic (one
/// element of 8 bytes by one atomic store, anything else in one transaction).
///
/// # Safety
/// `array` NULL or a live array handle; `data` valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn terrace_array_set(
    array: *const ArrayHandle,
    index: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    let what = "terrace_array_set";
    error::boundary(what, libc::EIO, || {
        // SAFETY: contract.
        let args = unsafe {
            array_arg(what, array).and_then(|a| Ok((&a.array, bytes(what, "data", data, len)?)))
        };
        let (a, data) = match args {
            Ok(x) => x,
            Err(code) => return code,
        };
        if data.len() == a.element_size() as usize {
            errno_or_zero(what, a.set(index, data))
        } else {
            errno_or_zero(what, a.set_range(index, data))
        }
    })
}

/// Unbinds the array bound to `name` and frees it. ENOENT when unbound, EEXIST when the
/// name is bound to something else, EBUSY while it is open in this process.
///
/// # Safety
/// `pool` NULL or an open pool; `name` NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn terrace_array_destroy(
    pool: *mut PoolHandle,
    name: *const c_char,
) -> c_int {
    let what = "terrace_array_destroy";
    error::boundary(what, libc::EIO, || {
        // SAFETY: contract.
        let (h, name) = match unsafe { pool_and_name(what, pool, name) } {
            Ok(a) => a,
            Err(code) => return code,
        };
        let done = h
            .collections
            .get(h)
            .and_then(|dir| dir.destroy_kind(name, Kind::Array));
        errno_or_zero(what, done)
    })
}

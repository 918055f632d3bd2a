//! The C API of the tiered cache (`include/terrace_cache.h`) over `terrace-cache`.
//!
//! - A `terrace_cache *` is a leaked [`CacheHandle`]: the [`Cache`] in an `Arc` (shared
//!   with its mover thread), the movers, and the count of outstanding pinned guards.
//! - A `terrace_cache_guard *` is a leaked [`GuardHandle`]: a [`Guard`] whose borrow of
//!   the cache is extended to `'static`, plus the handle it counts against.
//! - Invariant: while a cache's guard count is non-zero its handle and cache stay alive:
//!   [`terrace_cache_close`] refuses with `EBUSY` and frees nothing. Every guard handed
//!   out incremented the count before it was published; [`terrace_cache_release`] drops
//!   the guard before decrementing. This is what makes the `'static` guard sound.
//! - Return convention (as `terrace.h`): functions returning `int` give 0 or a positive
//!   errno value (also stored in `errno`); pointer-returning ones NULL with `errno` set;
//!   `terrace_last_error()` explains the last failure on the calling thread. Misses and
//!   unmet conditions are errno values too (`ENOENT`, `EEXIST`), but set no message.
//! - No panic crosses the boundary: every entry point runs under [`error::boundary`].

use std::ffi::{c_char, c_int, c_void};
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use terrace_cache::spec::parse_tiers;
use terrace_cache::{Cache, CacheConfig, CacheError, EncodeError, Guard, Movers, Store};
use terrace_media::MediaError;

use crate::error::{self, fail_with, str_arg};

/// How often the mover thread frees segments ahead of writers (as `terrace serve`).
const MOVER_INTERVAL: Duration = Duration::from_millis(5);

/// `TERRACE_CACHE_MAX_TIERS`: the tiers [`TerraceCacheStats`] reports one by one.
pub const TERRACE_CACHE_MAX_TIERS: usize = 8;

/// An open cache (`terrace_cache`).
pub struct CacheHandle {
    cache: Arc<Cache>,
    /// The mover thread; it holds a clone of `cache`, so it is stopped before close.
    movers: Option<Movers>,
    /// Pinned guards handed out and not yet released.
    guards: AtomicUsize,
}

/// A pinned hit (`terrace_cache_guard`).
pub struct GuardHandle {
    /// Declared first: dropped before anything else of the handle.
    guard: Guard<'static>,
    owner: *const CacheHandle,
}

/// `struct terrace_cache_tier_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TerraceCacheTierStats {
    pub items: u64,
    pub live_bytes: u64,
    pub dead_bytes: u64,
    pub segments: u64,
    pub free_segments: u64,
    pub hits: u64,
    pub items_evicted: u64,
}

/// `struct terrace_cache_stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TerraceCacheStats {
    pub items: u64,
    pub bytes: u64,
    pub hits: u64,
    pub misses: u64,
    pub sets: u64,
    pub deletes: u64,
    pub expired: u64,
    pub evictions: u64,
    pub demotions: u64,
    pub promotions: u64,
    pub tier_count: u32,
    pub tiers: [TerraceCacheTierStats; TERRACE_CACHE_MAX_TIERS],
}

/// A failure without a message (a miss, an unmet condition): `errno` only.
fn quiet(code: c_int) -> c_int {
    error::set_errno(code);
    code
}

fn media_errno(e: &MediaError) -> c_int {
    match e {
        MediaError::InvalidSize { .. } | MediaError::NoSuchNode { .. } => libc::EINVAL,
        MediaError::Map { .. } => libc::ENOMEM,
        MediaError::NoSpace { .. } => libc::ENOSPC,
        MediaError::Open { source, .. } | MediaError::Io { source, .. } => {
            source.raw_os_error().unwrap_or(libc::EIO)
        }
        _ => libc::EIO,
    }
}

/// The errno value of a cache error.
fn cache_errno(e: &CacheError) -> c_int {
    match e {
        CacheError::Config { .. }
        | CacheError::TierTooSmall { .. }
        | CacheError::TierFileSize { .. }
        | CacheError::Pool { .. }
        | CacheError::NotANumber => libc::EINVAL,
        CacheError::TierDir { .. } => libc::ENOENT,
        CacheError::Encode(EncodeError::ValueTooLong { .. }) | CacheError::TooLarge { .. } => {
            libc::E2BIG
        }
        CacheError::Encode(_) => libc::EINVAL,
        CacheError::Index(terrace_cache::IndexError::Memory { .. }) => libc::ENOMEM,
        CacheError::Index(_) => libc::EINVAL,
        CacheError::NoSpace { .. } => libc::ENOSPC,
        CacheError::Media(m) => media_errno(m),
        _ => libc::EIO,
    }
}

/// Records `e` for entry point `what`; returns its errno value.
fn fail_cache(what: &str, e: &CacheError) -> c_int {
    fail_with(cache_errno(e), &format!("{what}: {e}"))
}

/// `len` bytes at `p` (NULL allowed only for `len` 0).
///
/// # Safety
/// `p` readable for `len` bytes, or NULL.
unsafe fn bytes_arg<'a>(p: *const c_void, len: usize) -> Option<&'a [u8]> {
    if len == 0 {
        return Some(&[]);
    }
    if p.is_null() || len > isize::MAX as usize {
        return None;
    }
    // SAFETY: non-NULL and readable for len bytes (contract).
    Some(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) })
}

/// Runs `f` on the cache and key of an entry point under [`error::boundary`]; `EINVAL`
/// for a NULL cache or a NULL key (an empty or too long key is refused by the cache, also
/// with `EINVAL`).
///
/// # Safety
/// `c` NULL or an open cache for the call; `key` readable for `klen` bytes or NULL.
unsafe fn with_key(
    what: &str,
    c: *const CacheHandle,
    key: *const c_void,
    klen: usize,
    f: impl FnOnce(&CacheHandle, &[u8]) -> c_int,
) -> c_int {
    error::boundary(what, libc::EIO, || {
        // SAFETY: contract.
        let Some(h) = (unsafe { c.as_ref() }) else {
            return fail_with(libc::EINVAL, &format!("{what}: cache is NULL"));
        };
        // SAFETY: contract.
        match unsafe { bytes_arg(key, klen) } {
            Some(k) if !k.is_empty() => f(h, k),
            _ => fail_with(
                libc::EINVAL,
                &format!("{what}: key is NULL or empty (klen {klen})"),
            ),
        }
    })
}

/// Writes `v` to `out` unless NULL.
///
/// # Safety
/// `out` NULL or writable.
unsafe fn put<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: writable (contract).
        unsafe { out.write(v) };
    }
}

// ---- open, close ---------------------------------------------------------------------

/// # Safety
/// `tiers` NUL-terminated; `dir` NUL-terminated or NULL.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_open(
    tiers: *const c_char,
    dir: *const c_char,
    capacity: u64,
) -> *mut CacheHandle {
    const WHAT: &str = "terrace_cache_open";
    error::boundary(WHAT, ptr::null_mut(), || {
        // SAFETY: contract.
        let Some(spec) = (unsafe { str_arg(tiers) }) else {
            fail_with(libc::EINVAL, &format!("{WHAT}: tiers is NULL or not UTF-8"));
            return ptr::null_mut();
        };
        let list = match parse_tiers(spec) {
            Ok(list) => list,
            Err(why) => {
                fail_with(libc::EINVAL, &format!("{WHAT}: tiers {why}"));
                return ptr::null_mut();
            }
        };
        // SAFETY: contract.
        let dir = unsafe { str_arg(dir) };
        if dir.is_none() && list.has_file() {
            fail_with(
                libc::EINVAL,
                &format!("{WHAT}: a file tier needs a directory (dir is NULL or not UTF-8)"),
            );
            return ptr::null_mut();
        }
        if list.has_ratio() && capacity == 0 {
            fail_with(
                libc::EINVAL,
                &format!("{WHAT}: tier sizes are ratios, so capacity must not be 0"),
            );
            return ptr::null_mut();
        }
        let dir = Path::new(dir.unwrap_or("."));
        if list.has_file() {
            if let Err(e) = std::fs::create_dir_all(dir) {
                fail_with(
                    e.raw_os_error().unwrap_or(libc::EIO),
                    &format!("{WHAT}: cannot create {}: {e}", dir.display()),
                );
                return ptr::null_mut();
            }
        }
        let mut config = CacheConfig::new(list.configs(dir));
        config.total_bytes = (capacity != 0).then_some(capacity);
        match Cache::open(config) {
            Ok((cache, _)) => {
                let cache = Arc::new(cache);
                let movers = Some(Cache::start_movers(&cache, MOVER_INTERVAL));
                Box::into_raw(Box::new(CacheHandle {
                    cache,
                    movers,
                    guards: AtomicUsize::new(0),
                }))
            }
            Err(e) => {
                fail_cache(WHAT, &e);
                ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `c` NULL or an open cache, not used afterwards unless `EBUSY` was returned, and not
/// used by other threads during the call.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_close(c: *mut CacheHandle) -> c_int {
    const WHAT: &str = "terrace_cache_close";
    error::boundary(WHAT, libc::EIO, || {
        // SAFETY: contract.
        let Some(h) = (unsafe { c.as_ref() }) else {
            return 0;
        };
        let pinned = h.guards.load(Ordering::Acquire);
        if pinned != 0 {
            return fail_with(
                libc::EBUSY,
                &format!("{WHAT}: {pinned} pinned guard(s) not released; the cache stays open"),
            );
        }
        // SAFETY: leaked by terrace_cache_open, no guard borrows it (count 0), and the
        // caller does not use it again (contract).
        let mut h = unsafe { Box::from_raw(c) };
        drop(h.movers.take());
        match Arc::try_unwrap(h.cache) {
            Ok(cache) => match cache.shutdown() {
                Ok(()) => 0,
                Err(e) => fail_cache(WHAT, &e),
            },
            // Only the movers held a clone, and they were joined.
            Err(_) => fail_with(libc::EIO, &format!("{WHAT}: the cache is still shared")),
        }
    })
}

// ---- reads -----------------------------------------------------------------------------

/// # Safety
/// `c` an open cache; `key` readable for `klen` bytes; `buf` writable for `cap` bytes (or
/// NULL with `cap` 0); `value_len`, `flags`, `cas` NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn terrace_cache_get(
    c: *const CacheHandle,
    key: *const c_void,
    klen: usize,
    buf: *mut c_void,
    cap: usize,
    value_len: *mut usize,
    flags: *mut u32,
    cas: *mut u64,
) -> c_int {
    const WHAT: &str = "terrace_cache_get";
    let f = |h: &CacheHandle, k: &[u8]| match h.cache.get(k) {
        Ok(Some(g)) => {
            let v = g.value();
            // SAFETY: NULL or writable (contract).
            unsafe {
                put(value_len, v.len());
                put(flags, g.client_flags());
                put(cas, g.cas());
            }
            if v.len() > cap {
                return fail_with(
                    libc::ENOSPC,
                    &format!("{WHAT}: value of {} bytes, buffer of {cap}", v.len()),
                );
            }
            if !v.is_empty() {
                if buf.is_null() {
                    return fail_with(libc::EINVAL, &format!("{WHAT}: buf is NULL"));
                }
                // SAFETY: buf writable for cap >= v.len() bytes (contract); the
                // segment's bytes and the caller's buffer do not overlap.
                unsafe { ptr::copy_nonoverlapping(v.as_ptr(), buf.cast::<u8>(), v.len()) };
            }
            0
        }
        Ok(None) => quiet(libc::ENOENT),
        Err(e) => fail_cache(WHAT, &e),
    };
    // SAFETY: forwarded contract.
    unsafe { with_key(WHAT, c, key, klen, f) }
}

/// # Safety
/// `c` an open cache; `key` readable for `klen` bytes; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_pin(
    c: *const CacheHandle,
    key: *const c_void,
    klen: usize,
    out: *mut *mut GuardHandle,
) -> c_int {
    const WHAT: &str = "terrace_cache_pin";
    let f = |h: &CacheHandle, k: &[u8]| match h.cache.get(k) {
        Ok(Some(g)) => {
            // Counted before the guard escapes: close sees it from now on.
            h.guards.fetch_add(1, Ordering::AcqRel);
            // The guard borrows `*h.cache`, a heap allocation that lives as long as the
            // handle `h`. The handle is freed only by terrace_cache_close, which refuses
            // (EBUSY, freeing nothing) while `h.guards` is non-zero; the count was raised
            // above and is lowered by terrace_cache_release only after this guard is
            // dropped. So the extended lifetime is never observed past the cache's life.
            // SAFETY: the cache outlives the guard (argued just above): only the lifetime
            // parameter changes, the layout is the same type's.
            let g: Guard<'static> = unsafe { std::mem::transmute::<Guard<'_>, _>(g) };
            let handle = Box::new(GuardHandle {
                guard: g,
                owner: ptr::from_ref(h),
            });
            // SAFETY: out writable (contract).
            unsafe { out.write(Box::into_raw(handle)) };
            0
        }
        Ok(None) => quiet(libc::ENOENT),
        Err(e) => fail_cache(WHAT, &e),
    };
    error::boundary(WHAT, libc::EIO, || {
        if out.is_null() {
            return fail_with(libc::EINVAL, &format!("{WHAT}: out is NULL"));
        }
        // SAFETY: out writable (contract).
        unsafe { out.write(ptr::null_mut()) };
        // SAFETY: forwarded contract.
        unsafe { with_key(WHAT, c, key, klen, f) }
    })
}

/// # Safety
/// `g` NULL or an unreleased guard; `len` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_guard_value(
    g: *const GuardHandle,
    len: *mut usize,
) -> *const c_void {
    const WHAT: &str = "terrace_cache_guard_value";
    error::boundary(WHAT, ptr::null(), || {
        // SAFETY: contract.
        let Some(g) = (unsafe { g.as_ref() }) else {
            fail_with(libc::EINVAL, &format!("{WHAT}: guard is NULL"));
            // SAFETY: NULL or writable (contract).
            unsafe { put(len, 0) };
            return ptr::null();
        };
        let v = g.guard.value();
        // SAFETY: NULL or writable (contract).
        unsafe { put(len, v.len()) };
        v.as_ptr().cast()
    })
}

/// `field` of the unreleased guard `g`, or 0 with `EINVAL` for NULL: the preamble of the
/// guard accessors.
///
/// # Safety
/// `g` NULL or an unreleased guard.
unsafe fn guard_field<T: Default>(
    what: &str,
    g: *const GuardHandle,
    field: impl FnOnce(&GuardHandle) -> T,
) -> T {
    error::boundary(what, T::default(), || {
        // SAFETY: contract.
        unsafe { g.as_ref() }.map_or_else(
            || {
                fail_with(libc::EINVAL, &format!("{what}: guard is NULL"));
                T::default()
            },
            field,
        )
    })
}

/// # Safety
/// `g` NULL or an unreleased guard.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_guard_flags(g: *const GuardHandle) -> u32 {
    // SAFETY: forwarded contract.
    unsafe { guard_field("terrace_cache_guard_flags", g, |g| g.guard.client_flags()) }
}

/// # Safety
/// `g` NULL or an unreleased guard.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_guard_cas(g: *const GuardHandle) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { guard_field("terrace_cache_guard_cas", g, |g| g.guard.cas()) }
}

/// # Safety
/// `g` NULL or an unreleased guard, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_release(g: *mut GuardHandle) {
    error::boundary("terrace_cache_release", (), || {
        if g.is_null() {
            return;
        }
        // SAFETY: leaked by terrace_cache_pin and not released before (contract).
        let g = unsafe { Box::from_raw(g) };
        let owner = g.owner;
        // The pin goes first; only then may close see the count drop.
        drop(g);
        // SAFETY: the owner is alive: its count includes this guard until the line below.
        unsafe { &*owner }.guards.fetch_sub(1, Ordering::AcqRel);
    })
}

// ---- writes ----------------------------------------------------------------------------

/// How a store is conditioned.
#[derive(Clone, Copy)]
enum Mode {
    Set,
    Add,
    Replace,
    Cas(u64),
}

/// # Safety
/// `c` an open cache; `key`/`value` readable for `klen`/`vlen` bytes; `cas_out` NULL or
/// writable.
#[allow(clippy::too_many_arguments)]
unsafe fn store(
    what: &str,
    mode: Mode,
    c: *const CacheHandle,
    key: *const c_void,
    klen: usize,
    value: *const c_void,
    vlen: usize,
    flags: u32,
    ttl: u32,
    cas_out: *mut u64,
) -> c_int {
    let f = |h: &CacheHandle, k: &[u8]| {
        // SAFETY: contract.
        let Some(v) = (unsafe { bytes_arg(value, vlen) }) else {
            return fail_with(
                libc::EINVAL,
                &format!("{what}: value is NULL (vlen {vlen})"),
            );
        };
        let r = match mode {
            Mode::Set => h
                .cache
                .set(k, v, flags, ttl)
                .map(|cas| Store::Stored { cas }),
            Mode::Add => h.cache.add(k, v, flags, ttl),
            Mode::Replace => h.cache.replace(k, v, flags, ttl),
            Mode::Cas(want) => h.cache.cas(k, v, flags, ttl, want),
        };
        match r {
            Ok(Store::Stored { cas }) => {
                // SAFETY: NULL or writable (contract).
                unsafe { put(cas_out, cas) };
                0
            }
            Ok(Store::NotStored) if matches!(mode, Mode::Add) => quiet(libc::EEXIST),
            Ok(Store::NotStored | Store::NotFound) => quiet(libc::ENOENT),
            Ok(Store::Exists) => quiet(libc::EEXIST),
            Err(e) => fail_cache(what, &e),
        }
    };
    // SAFETY: forwarded contract.
    unsafe { with_key(what, c, key, klen, f) }
}

/// Defines `terrace_cache_set`, `_add` and `_replace`: [`store`] in their [`Mode`].
macro_rules! store_entry_point {
    ($name:ident, $mode:expr) => {
        /// # Safety
        /// `c` an open cache; `key`/`value` readable for `klen`/`vlen` bytes; `cas_out`
        /// NULL or writable.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name(
            c: *const CacheHandle,
            key: *const c_void,
            klen: usize,
            value: *const c_void,
            vlen: usize,
            flags: u32,
            ttl: u32,
            cas_out: *mut u64,
        ) -> c_int {
            let what = stringify!($name);
            // SAFETY: forwarded contract.
            unsafe { store(what, $mode, c, key, klen, value, vlen, flags, ttl, cas_out) }
        }
    };
}

store_entry_point!(terrace_cache_set, Mode::Set);
store_entry_point!(terrace_cache_add, Mode::Add);
store_entry_point!(terrace_cache_replace, Mode::Replace);

/// # Safety
/// As [`terrace_cache_set`].
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn terrace_cache_cas(
    c: *const CacheHandle,
    key: *const c_void,
    klen: usize,
    value: *const c_void,
    vlen: usize,
    flags: u32,
    ttl: u32,
    cas: u64,
    cas_out: *mut u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe {
        store(
            "terrace_cache_cas",
            Mode::Cas(cas),
            c,
            key,
            klen,
            value,
            vlen,
            flags,
            ttl,
            cas_out,
        )
    }
}

/// # Safety
/// `c` an open cache; `key` readable for `klen` bytes.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_delete(
    c: *const CacheHandle,
    key: *const c_void,
    klen: usize,
) -> c_int {
    const WHAT: &str = "terrace_cache_delete";
    let f = |h: &CacheHandle, k: &[u8]| match h.cache.delete(k) {
        Ok(true) => 0,
        Ok(false) => quiet(libc::ENOENT),
        Err(e) => fail_cache(WHAT, &e),
    };
    // SAFETY: forwarded contract.
    unsafe { with_key(WHAT, c, key, klen, f) }
}

/// # Safety
/// `c` an open cache; `key` readable for `klen` bytes.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_touch(
    c: *const CacheHandle,
    key: *const c_void,
    klen: usize,
    ttl: u32,
) -> c_int {
    const WHAT: &str = "terrace_cache_touch";
    let f = |h: &CacheHandle, k: &[u8]| match h.cache.touch(k, ttl) {
        Ok(true) => 0,
        Ok(false) => quiet(libc::ENOENT),
        Err(e) => fail_cache(WHAT, &e),
    };
    // SAFETY: forwarded contract.
    unsafe { with_key(WHAT, c, key, klen, f) }
}

/// # Safety
/// `c` an open cache; `key` readable for `klen` bytes; `out` NULL or writable.
unsafe fn arith(
    what: &str,
    incr: bool,
    c: *const CacheHandle,
    key: *const c_void,
    klen: usize,
    delta: u64,
    out: *mut u64,
) -> c_int {
    let f = |h: &CacheHandle, k: &[u8]| {
        let r = if incr {
            h.cache.incr(k, delta)
        } else {
            h.cache.decr(k, delta)
        };
        match r {
            Ok(Some(v)) => {
                // SAFETY: NULL or writable (contract).
                unsafe { put(out, v) };
                0
            }
            Ok(None) => quiet(libc::ENOENT),
            Err(e) => fail_cache(what, &e),
        }
    };
    // SAFETY: forwarded contract.
    unsafe { with_key(what, c, key, klen, f) }
}

/// # Safety
/// `c` an open cache; `key` readable for `klen` bytes; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_incr(
    c: *const CacheHandle,
    key: *const c_void,
    klen: usize,
    delta: u64,
    out: *mut u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { arith("terrace_cache_incr", true, c, key, klen, delta, out) }
}

/// # Safety
/// `c` an open cache; `key` readable for `klen` bytes; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_decr(
    c: *const CacheHandle,
    key: *const c_void,
    klen: usize,
    delta: u64,
    out: *mut u64,
) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { arith("terrace_cache_decr", false, c, key, klen, delta, out) }
}

/// # Safety
/// `c` NULL or an open cache.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_flush_all(c: *const CacheHandle) -> c_int {
    error::boundary("terrace_cache_flush_all", libc::EIO, || {
        // SAFETY: contract.
        match unsafe { c.as_ref() } {
            Some(h) => {
                h.cache.flush_all();
                0
            }
            None => fail_with(libc::EINVAL, "terrace_cache_flush_all: cache is NULL"),
        }
    })
}

/// # Safety
/// `c` NULL or an open cache; `out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn terrace_cache_stats(
    c: *const CacheHandle,
    out: *mut TerraceCacheStats,
) -> c_int {
    error::boundary("terrace_cache_stats", libc::EIO, || {
        // SAFETY: contract.
        let (Some(h), false) = (unsafe { c.as_ref() }, out.is_null()) else {
            return fail_with(libc::EINVAL, "terrace_cache_stats: cache or out is NULL");
        };
        let s = h.cache.stats();
        let mut st = TerraceCacheStats {
            items: s.items as u64,
            bytes: s.tiers.iter().map(|t| t.live_bytes).sum(),
            hits: s.hits,
            misses: s.misses,
            sets: s.sets,
            deletes: s.deletes,
            expired: s.expired,
            evictions: s.evictions(),
            demotions: s.demotions,
            promotions: s.promotions,
            tier_count: s.tiers.len() as u32,
            ..TerraceCacheStats::default()
        };
        for (out, t) in st.tiers.iter_mut().zip(&s.tiers) {
            *out = TerraceCacheTierStats {
                items: t.items,
                live_bytes: t.live_bytes,
                dead_bytes: t.dead_bytes,
                segments: u64::from(t.segments),
                free_segments: t.free_segments as u64,
                hits: t.hits,
                items_evicted: t.items_evicted,
            };
        }
        // SAFETY: writable (contract).
        unsafe { out.write(st) };
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open_dram() -> *mut CacheHandle {
        // SAFETY: NUL-terminated literals.
        let c = unsafe { terrace_cache_open(c"dram:16MiB".as_ptr(), ptr::null(), 0) };
        assert!(!c.is_null());
        c
    }

    #[test]
    fn errors_map_to_errno() {
        assert_eq!(cache_errno(&CacheError::NotANumber), libc::EINVAL);
        assert_eq!(cache_errno(&CacheError::NoSpace { tier: 0 }), libc::ENOSPC);
        assert_eq!(
            cache_errno(&CacheError::Encode(EncodeError::KeyTooLong {
                len: 300,
                max: 250
            })),
            libc::EINVAL
        );
        assert_eq!(
            cache_errno(&CacheError::Encode(EncodeError::ValueTooLong {
                len: 9,
                max: 1
            })),
            libc::E2BIG
        );
    }

    #[test]
    fn guards_are_counted_and_block_close() {
        let c = open_dram();
        let k = b"key";
        // SAFETY: c is open; the buffers are valid for their lengths.
        unsafe {
            assert_eq!(
                terrace_cache_set(
                    c,
                    k.as_ptr().cast(),
                    3,
                    b"v".as_ptr().cast(),
                    1,
                    0,
                    0,
                    ptr::null_mut()
                ),
                0
            );
            let mut g = ptr::null_mut();
            assert_eq!(terrace_cache_pin(c, k.as_ptr().cast(), 3, &mut g), 0);
            assert_eq!((*c).guards.load(Ordering::Relaxed), 1);
            assert_eq!(terrace_cache_close(c), libc::EBUSY);
            let mut len = 0;
            let v = terrace_cache_guard_value(g, &mut len);
            assert_eq!(std::slice::from_raw_parts(v.cast::<u8>(), len), b"v");
            terrace_cache_release(g);
            assert_eq!((*c).guards.load(Ordering::Relaxed), 0);
            assert_eq!(terrace_cache_close(c), 0);
        }
    }

    #[test]
    fn bad_tiers_are_einval() {
        for spec in [c"", c"ssd:1", c"dram:1"] {
            // SAFETY: NUL-terminated literals.
            let c = unsafe { terrace_cache_open(spec.as_ptr(), ptr::null(), 0) };
            assert!(c.is_null(), "{spec:?}");
        }
        // A file tier without a directory.
        // SAFETY: NUL-terminated literal.
        let c = unsafe { terrace_cache_open(c"file:16MiB".as_ptr(), ptr::null(), 0) };
        assert!(c.is_null());
    }
}

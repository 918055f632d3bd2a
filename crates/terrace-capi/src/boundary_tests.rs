//! Every `extern "C"` entry point turns a panic into its documented error value.
//!
//! Each case arms a panic ([`crate::error::inject`]) that the entry point's boundary fires
//! before anything else, then checks the return value, `errno` and the thread's message.
//! The arguments are never looked at (the panic comes first), so NULL is passed for every
//! pointer. A second test checks that the table names every entry point in the sources.

use std::collections::BTreeSet;
use std::ffi::{c_void, CStr};
use std::ptr;

use crate::arrays::*;
use crate::cache::*;
use crate::collections::*;
use crate::error::{self, inject, PANIC_ERRNO};
use crate::handle::Handle;
use crate::memkind::*;
use crate::native::*;
use crate::pmemobj::*;
use crate::pool::*;
use crate::txn::*;

const OID_NULL: PMEMoid = PMEMoid {
    pool_uuid_lo: 0,
    off: 0,
};

type Case = (&'static str, Box<dyn Fn() -> bool>);

/// `case!(f(args) => expected)`: calling `f` with a panic armed returns `expected`.
/// `case!(f(args) =~ predicate)`: the value returned satisfies `predicate`.
macro_rules! case {
    ($f:ident ( $($arg:expr),* ) => $expected:expr) => {
        case!($f($($arg),*) =~ |got| got == $expected)
    };
    ($f:ident ( $($arg:expr),* ) =~ $pred:expr) => {
        (
            stringify!($f),
            Box::new(move || {
                #[allow(unused_unsafe)]
                // SAFETY: the armed panic fires before any argument is used.
                let got = unsafe { $f($($arg),*) };
                #[allow(clippy::redundant_closure_call)]
                ($pred)(got)
            }) as Box<dyn Fn() -> bool>,
        )
    };
}

fn empty(s: *const std::ffi::c_char) -> bool {
    // SAFETY: the entry points return NUL-terminated strings.
    unsafe { CStr::from_ptr(s) }.is_empty()
}

fn cases() -> Vec<Case> {
    let null = ptr::null_mut::<c_void>();
    let pool = ptr::null_mut::<PoolHandle>();
    let cache = ptr::null_mut::<CacheHandle>();
    vec![
        // terrace.h
        case!(terrace_kind_default() => Handle::NULL),
        case!(terrace_kind_create_file(ptr::null(), 0, 0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_kind_create_dram(0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_kind_create_numa(0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_kind_create_unified(ptr::null(), 0, 0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_kind_destroy(Handle::NULL) => PANIC_ERRNO),
        case!(terrace_kind_stats(Handle::NULL, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_malloc(Handle::NULL, 8) => null),
        case!(terrace_calloc(Handle::NULL, 1, 8) => null),
        case!(terrace_realloc(Handle::NULL, null, 8) => null),
        case!(terrace_posix_memalign(Handle::NULL, ptr::null_mut(), 8, 8) => PANIC_ERRNO),
        case!(terrace_free(null) => ()),
        case!(terrace_usable_size(null) => 0),
        case!(terrace_detect_kind(null) => Handle::NULL),
        case!(terrace_last_error() =~ empty),
        // memkind.h
        case!(memkind_create_pmem(ptr::null(), 0, ptr::null_mut()) => MEMKIND_ERROR_RUNTIME),
        case!(memkind_config_new() =~ |p: *mut MemkindConfig| p.is_null()),
        case!(memkind_config_delete(ptr::null_mut()) => ()),
        case!(memkind_config_set_path(ptr::null_mut(), ptr::null()) => ()),
        case!(memkind_config_set_size(ptr::null_mut(), 0) => ()),
        case!(memkind_config_set_memory_usage_policy(ptr::null_mut(), 0) => ()),
        case!(memkind_create_pmem_with_config(ptr::null_mut(), ptr::null_mut()) => MEMKIND_ERROR_RUNTIME),
        case!(memkind_check_dax_path(ptr::null()) => MEMKIND_ERROR_RUNTIME),
        case!(memkind_destroy_kind(Handle::NULL) => MEMKIND_ERROR_RUNTIME),
        case!(memkind_check_available(Handle::NULL) => MEMKIND_ERROR_UNAVAILABLE),
        case!(memkind_malloc(Handle::NULL, 8) => null),
        case!(memkind_calloc(Handle::NULL, 1, 8) => null),
        case!(memkind_posix_memalign(Handle::NULL, ptr::null_mut(), 8, 8) => PANIC_ERRNO),
        case!(memkind_realloc(Handle::NULL, null, 8) => null),
        case!(memkind_free(Handle::NULL, null) => ()),
        case!(memkind_malloc_usable_size(Handle::NULL, null) => 0),
        case!(memkind_detect_kind(null) => Handle::NULL),
        case!(memkind_defrag_reallocate(Handle::NULL, null) => null),
        case!(memkind_update_cached_stats() => MEMKIND_ERROR_RUNTIME),
        case!(memkind_get_stat(Handle::NULL, 0, ptr::null_mut()) => MEMKIND_ERROR_RUNTIME),
        case!(memkind_get_version() => 1_014_000),
        case!(memkind_error_message(0, ptr::null_mut(), 0) => ()),
        // libpmemobj.h
        case!(pmemobj_create(ptr::null(), ptr::null(), 0, 0) => pool),
        case!(pmemobj_open(ptr::null(), ptr::null()) => pool),
        case!(pmemobj_close(pool) => ()),
        case!(pmemobj_check(ptr::null(), ptr::null()) => -1),
        case!(pmemobj_errormsg() =~ empty),
        case!(pmemobj_root(pool, 0) => OID_NULL),
        case!(pmemobj_root_size(pool) => 0),
        case!(pmemobj_direct(OID_NULL) => null),
        case!(pmemobj_oid(null) => OID_NULL),
        case!(pmemobj_pool_by_oid(OID_NULL) => pool),
        case!(pmemobj_pool_by_ptr(null) => pool),
        case!(pmemobj_alloc(pool, ptr::null_mut(), 8, 0, None, null) => -1),
        case!(pmemobj_zalloc(pool, ptr::null_mut(), 8, 0) => -1),
        case!(pmemobj_xalloc(pool, ptr::null_mut(), 8, 0, 0, None, null) => -1),
        case!(pmemobj_ctl_set(pool, ptr::null(), null) => -1),
        case!(pmemobj_ctl_get(pool, ptr::null(), null) => -1),
        case!(pmemobj_ctl_exec(pool, ptr::null(), null) => -1),
        case!(pmemobj_realloc(pool, ptr::null_mut(), 8, 0) => -1),
        case!(pmemobj_free(ptr::null_mut()) => ()),
        case!(pmemobj_alloc_usable_size(OID_NULL) => 0),
        case!(pmemobj_type_num(OID_NULL) => u64::MAX),
        case!(pmemobj_first(pool) => OID_NULL),
        case!(pmemobj_next(OID_NULL) => OID_NULL),
        case!(pmemobj_persist(pool, ptr::null(), 0) => ()),
        case!(pmemobj_flush(pool, ptr::null(), 0) => ()),
        case!(pmemobj_drain(pool) => ()),
        case!(pmemobj_memcpy_persist(pool, null, ptr::null(), 0) => null),
        case!(pmemobj_memset_persist(pool, null, 0, 0) => null),
        case!(pmemobj_tx_begin(pool, null, 0) => PANIC_ERRNO),
        case!(pmemobj_tx_stage() => 0),
        case!(pmemobj_tx_errno() => PANIC_ERRNO),
        case!(pmemobj_tx_add_range(OID_NULL, 0, 0) => PANIC_ERRNO),
        case!(pmemobj_tx_add_range_direct(ptr::null(), 0) => PANIC_ERRNO),
        case!(pmemobj_tx_alloc(8, 0) => OID_NULL),
        case!(pmemobj_tx_zalloc(8, 0) => OID_NULL),
        case!(pmemobj_tx_xalloc(8, 0, 0) => OID_NULL),
        case!(pmemobj_tx_free(OID_NULL) => PANIC_ERRNO),
        case!(pmemobj_tx_commit() => ()),
        case!(pmemobj_tx_abort(0) => ()),
        case!(pmemobj_tx_end() => PANIC_ERRNO),
        // terrace_pool.h
        case!(terrace_pool_create(ptr::null(), 0, ptr::null()) => pool),
        case!(terrace_pool_open(ptr::null(), ptr::null()) => pool),
        case!(terrace_pool_close(pool) => PANIC_ERRNO),
        case!(terrace_pool_check(ptr::null(), ptr::null()) => PANIC_ERRNO),
        case!(terrace_pool_root(pool, 0) => 0),
        case!(terrace_pool_root_size(pool) => 0),
        case!(terrace_pool_direct(pool, 0) => null),
        case!(terrace_pool_offset(pool, ptr::null()) => 0),
        case!(terrace_pool_alloc(pool, 8, 0, ptr::null_mut()) => 0),
        case!(terrace_pool_zalloc(pool, 8, 0, ptr::null_mut()) => 0),
        case!(terrace_pool_alloc_in_class(pool, 1, 8, 0, ptr::null_mut()) => 0),
        case!(terrace_pool_realloc(pool, ptr::null_mut(), 8, 0) => PANIC_ERRNO),
        case!(terrace_pool_free(pool, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_pool_free_off(pool, 0) => PANIC_ERRNO),
        case!(terrace_pool_usable_size(pool, 0) => 0),
        case!(terrace_pool_type_num(pool, 0) => u64::MAX),
        case!(terrace_pool_first(pool, 0) => 0),
        case!(terrace_pool_next(pool, 0) => 0),
        case!(terrace_pool_foreach(pool, 0, None, null) => PANIC_ERRNO),
        case!(terrace_pool_persist(pool, ptr::null(), 0) => PANIC_ERRNO),
        case!(terrace_pool_stats(pool, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_pool_register_class(pool, 8, 0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_pool_tx_begin(pool) => PANIC_ERRNO),
        case!(terrace_pool_tx_add_range(pool, 0, 0) => PANIC_ERRNO),
        case!(terrace_pool_tx_alloc(pool, 8, 0) => 0),
        case!(terrace_pool_tx_zalloc(pool, 8, 0) => 0),
        case!(terrace_pool_tx_free(pool, 0) => PANIC_ERRNO),
        case!(terrace_pool_tx_commit(pool) => PANIC_ERRNO),
        case!(terrace_pool_tx_abort(pool) => PANIC_ERRNO),
        case!(terrace_pool_txn_begin(pool, 0) =~ |t: *mut Txn| t.is_null()),
        case!(terrace_pool_txn_add_range(ptr::null_mut(), 0, 0) => PANIC_ERRNO),
        case!(terrace_pool_txn_alloc(ptr::null_mut(), 8, 0, 0) => 0),
        case!(terrace_pool_txn_alloc_in_class(ptr::null_mut(), 1, 8, 0, 0) => 0),
        case!(terrace_pool_txn_free(ptr::null_mut(), 0) => PANIC_ERRNO),
        case!(terrace_pool_txn_commit(ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_pool_txn_abort(ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_pool_persist_mode(pool) => -1),
        // terrace_collections.h
        case!(terrace_omap_open(pool, ptr::null(), 0, 0, 0) =~ |m: *mut MapHandle| m.is_null()),
        case!(terrace_omap_close(ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_omap_put(ptr::null_mut(), null, 0, null, 0) => PANIC_ERRNO),
        case!(terrace_omap_get(ptr::null_mut(), null, 0, ptr::null_mut(), 0) => -1),
        case!(terrace_omap_find(ptr::null_mut(), null, 0, ptr::null_mut(), 0) => -(PANIC_ERRNO as i64)),
        case!(terrace_omap_remove(ptr::null_mut(), null, 0) => PANIC_ERRNO),
        case!(terrace_omap_len(ptr::null_mut()) => u64::MAX),
        case!(terrace_omap_cursor_open(ptr::null_mut(), null, 0, null, 0, 0) =~ |c: *mut CursorHandle| c.is_null()),
        case!(terrace_omap_cursor_next(ptr::null_mut(), ptr::null_mut(), 0, ptr::null_mut(), ptr::null_mut(), 0, ptr::null_mut()) => -1),
        case!(terrace_omap_cursor_close(ptr::null_mut()) => ()),
        case!(terrace_omap_destroy(pool, ptr::null()) => PANIC_ERRNO),
        case!(terrace_hmap_open(pool, ptr::null(), 0, 0, 0) =~ |m: *mut MapHandle| m.is_null()),
        case!(terrace_hmap_close(ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_hmap_put(ptr::null_mut(), null, 0, null, 0) => PANIC_ERRNO),
        case!(terrace_hmap_get(ptr::null_mut(), null, 0, ptr::null_mut(), 0) => -1),
        case!(terrace_hmap_find(ptr::null_mut(), null, 0, ptr::null_mut(), 0) => -(PANIC_ERRNO as i64)),
        case!(terrace_hmap_remove(ptr::null_mut(), null, 0) => PANIC_ERRNO),
        case!(terrace_hmap_len(ptr::null_mut()) => u64::MAX),
        case!(terrace_hmap_iter_open(ptr::null_mut()) =~ |c: *mut CursorHandle| c.is_null()),
        case!(terrace_hmap_iter_next(ptr::null_mut(), ptr::null_mut(), 0, ptr::null_mut(), ptr::null_mut(), 0, ptr::null_mut()) => -1),
        case!(terrace_hmap_iter_close(ptr::null_mut()) => ()),
        case!(terrace_hmap_destroy(pool, ptr::null()) => PANIC_ERRNO),
        case!(terrace_array_open(pool, ptr::null(), 0, 0, 0) =~ |a: *mut ArrayHandle| a.is_null()),
        case!(terrace_array_close(ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_array_len(ptr::null()) => 0),
        case!(terrace_array_element_size(ptr::null()) => 0),
        case!(terrace_array_get(ptr::null(), 0, null, 0) => PANIC_ERRNO),
        case!(terrace_array_set(ptr::null(), 0, null, 0) => PANIC_ERRNO),
        case!(terrace_array_destroy(pool, ptr::null()) => PANIC_ERRNO),
        case!(terrace_pool_bind(pool, ptr::null(), 0) => PANIC_ERRNO),
        case!(terrace_pool_lookup(pool, ptr::null()) => 0),
        case!(terrace_pool_unbind(pool, ptr::null()) => 0),
        // terrace_cache.h
        case!(terrace_cache_open(ptr::null(), ptr::null(), 0) => cache),
        case!(terrace_cache_close(cache) => PANIC_ERRNO),
        case!(terrace_cache_get(cache, ptr::null(), 0, null, 0, ptr::null_mut(), ptr::null_mut(), ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_cache_pin(cache, ptr::null(), 0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_cache_guard_value(ptr::null(), ptr::null_mut()) =~ |p: *const c_void| p.is_null()),
        case!(terrace_cache_guard_flags(ptr::null()) => 0),
        case!(terrace_cache_guard_cas(ptr::null()) => 0),
        case!(terrace_cache_release(ptr::null_mut()) => ()),
        case!(terrace_cache_set(cache, ptr::null(), 0, ptr::null(), 0, 0, 0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_cache_add(cache, ptr::null(), 0, ptr::null(), 0, 0, 0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_cache_replace(cache, ptr::null(), 0, ptr::null(), 0, 0, 0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_cache_cas(cache, ptr::null(), 0, ptr::null(), 0, 0, 0, 0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_cache_delete(cache, ptr::null(), 0) => PANIC_ERRNO),
        case!(terrace_cache_touch(cache, ptr::null(), 0, 0) => PANIC_ERRNO),
        case!(terrace_cache_incr(cache, ptr::null(), 0, 0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_cache_decr(cache, ptr::null(), 0, 0, ptr::null_mut()) => PANIC_ERRNO),
        case!(terrace_cache_flush_all(cache) => PANIC_ERRNO),
        case!(terrace_cache_stats(cache, ptr::null_mut()) => PANIC_ERRNO),
    ]
}

/// Hides the injected panics' messages (other tests' panics still print).
fn quiet_injected_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let text = info.payload().downcast_ref::<String>();
        if !text.is_some_and(|t| t.starts_with("injected panic in ")) {
            default(info);
        }
    }));
}

#[test]
fn a_panic_in_any_entry_point_becomes_its_error_value() {
    quiet_injected_panics();
    let mut wrong = Vec::new();
    for (name, call) in cases() {
        error::set_errno(0);
        inject::arm();
        let value_ok = call();
        let fired = inject::fired();
        // SAFETY: errno's slot is always valid for this thread.
        let errno = unsafe { *libc::__errno_location() };
        // SAFETY: last_message returns this thread's NUL-terminated message.
        let message = unsafe { CStr::from_ptr(error::last_message()) }.to_string_lossy();
        let reported = message.contains("internal error (panic: injected panic in ");
        if !(fired && value_ok && errno == PANIC_ERRNO && reported) {
            wrong.push(format!(
                "{name}: fired {fired}, value ok {value_ok}, errno {errno}, message {message:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The entry points the sources define: every `extern "C" fn` with a name, and those the
/// cache's `store_entry_point!` defines.
fn defined() -> BTreeSet<String> {
    let sources = [
        include_str!("native.rs"),
        include_str!("memkind.rs"),
        include_str!("pmemobj.rs"),
        include_str!("pool.rs"),
        include_str!("cache.rs"),
        include_str!("txn.rs"),
        include_str!("collections.rs"),
        include_str!("arrays.rs"),
    ];
    let mut names = BTreeSet::new();
    for line in sources.iter().flat_map(|s| s.lines()) {
        // `extern "C" fn name(`, or a macro that defines one: `store_entry_point!(name, `.
        let rest = line
            .split_once("extern \"C\" fn ")
            .or_else(|| line.trim_start().split_once("store_entry_point!("))
            .map(|(_, rest)| rest);
        if let Some(rest) = rest {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.insert(name);
            }
        }
    }
    names
}

#[test]
fn the_table_names_every_entry_point() {
    let tested: BTreeSet<String> = cases().iter().map(|(n, _)| n.to_string()).collect();
    let defined = defined();
    assert!(
        defined.len() > 100,
        "found only {} entry points",
        defined.len()
    );
    let untested: Vec<_> = defined.difference(&tested).collect();
    let unknown: Vec<_> = tested.difference(&defined).collect();
    assert!(
        untested.is_empty() && unknown.is_empty(),
        "untested {untested:?}, unknown {unknown:?}"
    );
}

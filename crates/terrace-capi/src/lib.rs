//! terrace-capi: the one crate with `extern "C"`. It builds `libterrace.so`, whose
//! functions are declared in `include/terrace.h` (the native API) and
//! `include/memkind.h` (a memkind-compatible subset, so memkind programs recompile
//! unchanged against Terrace) and `include/libpmemobj.h` (the libpmemobj-compatible subset
//! over the persistent pool) and `include/terrace_pool.h` (the native pool API, [`pool`])
//! and `include/terrace_cache.h` (the tiered cache, [`cache`]) and
//! `include/terrace_collections.h` (ordered maps, hash maps and named roots,
//! [`collections`]; arrays, [`arrays`]).
//!
//! Conventions shared by both APIs:
//! - a kind handle (`terrace_kind_t`, `memkind_t`) is an opaque, never-dereferenced
//!   pointer-sized value encoding the kind's slot and generation ([`handle`]); a handle of
//!   a destroyed kind is detected and refused, not followed;
//! - functions never panic across the boundary: bad input is an error code plus `errno`,
//!   and the message of the last error on this thread is kept ([`error`]); every entry
//!   point runs under [`error::boundary`], so a panic (a bug) is the error value its
//!   header documents, with `errno` `EIO`, never an unwind into C;
//! - freeing a pointer no kind owns (foreign, or from a destroyed kind) does nothing.
//!
//! Modules: [`cache`] (`terrace_cache.h`), [`collections`] and [`arrays`]
//! (`terrace_collections.h`), [`native`] (`terrace.h`), [`memkind`]
//! (`memkind.h`), [`pmemobj`] (`libpmemobj.h`), [`pool`] (`terrace_pool.h`), [`handle`]
//! (kind handles), [`error`] (the thread's last error, `errno`, the panic boundary).

pub mod arrays;
pub mod cache;
pub mod collections;
pub mod error;
pub mod handle;
pub mod memkind;
pub mod native;
pub mod pmemobj;
pub mod pool;
pub mod txn;

#[cfg(test)]
mod boundary_tests;

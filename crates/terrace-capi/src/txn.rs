//! Transactions by handle (`terrace_pool_txn_*` in `include/terrace_pool.h`): a
//! transaction the caller holds as a pointer instead of the calling thread's.
//!
//! Owns [`Txn`], one pool transaction ([`terrace_pool::Tx`]) on the heap, returned to the
//! caller at begin and freed by commit or abort. Bindings use it where the thread-bound
//! API (`terrace_pool_tx_*`, libpmemobj's) cannot serve: a JVM virtual thread may begin on
//! one carrier thread and commit on another, and a binding that keeps the transaction
//! itself pays no thread-local lookup per call.
//!
//! Invariants:
//! - a `Txn` is live from `terrace_pool_txn_begin` to its `terrace_pool_txn_commit` or
//!   `terrace_pool_txn_abort`, which free it whatever they return; it holds one of its
//!   pool's lanes for exactly that time, so `terrace_pool_close` (which refuses with
//!   `EBUSY` while a lane is claimed, [`terrace_pool::Pool::lanes_idle`]) cannot free the
//!   pool under it. Counting it in `active_txs` as well would cost two more atomic
//!   operations per transaction;
//! - a `Txn` is used by one thread at a time (the caller's contract, as for any handle);
//! - the first failing operation aborts the transaction, as libpmemobj's do: the pool
//!   transaction refuses every later operation (`ECANCELED`), and commit rolls it back
//!   and returns that first errno. Nesting is the caller's (a binding counts levels).
//! - no panic crosses the boundary: a panic is `EIO` and aborts the transaction too.

use std::ffi::c_int;

use terrace_pool::{ClassId, Durability, Oid, PoolError, RegionBackend, Tx};

use crate::error;
use crate::pmemobj::{fail, fail_with, PoolHandle};

/// `terrace_pool_txn_begin` flag: fail with `EAGAIN` instead of waiting for a free lane.
pub const TERRACE_POOL_TXN_NOWAIT: c_int = 1;
/// `terrace_pool_txn_alloc` flag: zero-fill the new object.
pub const TERRACE_POOL_TXN_ZERO: c_int = 1;

/// `terrace_pool_persist_mode`: a persist point is a fence (tmpfs: process-durable).
pub const TERRACE_POOL_PERSIST_FENCE: c_int = 0;
/// `terrace_pool_persist_mode`: cache-line flushes and a fence (DAX).
pub const TERRACE_POOL_PERSIST_FLUSH: c_int = 1;
/// `terrace_pool_persist_mode`: `msync`, which waits for the file system.
pub const TERRACE_POOL_PERSIST_MSYNC: c_int = 2;

/// `terrace_pool_txn`: see the module docs.
pub struct Txn {
    tx: Tx<'static, RegionBackend>,
    /// errno of the first failed operation (0: none).
    errnum: c_int,
}

impl Txn {
    /// Records a failed operation's error (the pool transaction has already marked
    /// itself failed) and returns its errno.
    fn failed(&mut self, err: &PoolError) -> c_int {
        let code = fail(err);
        if self.errnum == 0 {
            self.errnum = code;
        }
        code
    }

    /// Ends the transaction and frees its lane: commits it (`commit`, and no operation
    /// failed) or rolls it back. A commit of a failed transaction returns that failure's
    /// errno; an abort returns 0 unless the rollback itself failed.
    fn end(self, commit: bool) -> c_int {
        let Txn { tx, errnum } = self;
        if commit && errnum == 0 {
            return tx.commit().err().map_or(0, |e| fail(&e));
        }
        let rolled_back = tx.abort().err().map_or(0, |e| fail(&e));
        if commit {
            error::set_errno(errnum);
            errnum
        } else {
            rolled_back
        }
    }
}

fn abort_after_panic(txn: *mut Txn) {
    // SAFETY: the caller's live handle (contract of the entry point that panicked); the
    // panic unwound out of the `&mut` borrow that entry point held.
    if let Some(t) = unsafe { txn.as_mut() } {
        if t.errnum == 0 {
            t.errnum = error::PANIC_ERRNO;
        }
    }
}

/// Runs `op` on the live transaction `txn` under the boundary; a failure of `op` aborts
/// the transaction (see the module docs) and is returned as its errno.
///
/// # Safety
/// `txn` NULL or a live transaction used by no other thread during the call.
unsafe fn with_txn<T>(
    what: &str,
    txn: *mut Txn,
    op: impl FnOnce(&mut Tx<'static, RegionBackend>) -> Result<T, PoolError>,
) -> Result<T, c_int> {
    error::boundary_then(
        what,
        Err(error::PANIC_ERRNO),
        || abort_after_panic(txn),
        || {
            // SAFETY: contract.
            let Some(t) = (unsafe { txn.as_mut() }) else {
                return Err(fail_with(
                    libc::EINVAL,
                    &format!("{what}: transaction is NULL"),
                ));
            };
            if t.errnum != 0 {
                return Err(fail_with(
                    libc::ECANCELED,
                    &format!("{what}: the transaction was aborted by an earlier failure"),
                ));
            }
            op(&mut t.tx).map_err(|e| t.failed(&e))
        },
    )
}

fn size_arg(size: usize) -> Result<u64, PoolError> {
    if size == 0 {
        return Err(PoolError::InvalidArgument {
            what: "size",
            detail: "0".into(),
        });
    }
    Ok(size as u64)
}

fn oid_arg(off: u64) -> Result<Oid, PoolError> {
    Oid::from_offset(off).ok_or(PoolError::InvalidObject { offset: 0 })
}

/// # Safety
/// `pool` NULL or an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_txn_begin(pool: *mut PoolHandle, flags: c_int) -> *mut Txn {
    const WHAT: &str = "terrace_pool_txn_begin";
    error::boundary(WHAT, std::ptr::null_mut(), || {
        // SAFETY: contract: an open pool; close refuses while the transaction is live, so
        // the reference may be held for its life.
        let Some(handle) = (unsafe { pool.as_ref::<'static>() }) else {
            fail_with(libc::EINVAL, &format!("{WHAT}: pool is NULL"));
            return std::ptr::null_mut();
        };
        if flags & !TERRACE_POOL_TXN_NOWAIT != 0 {
            fail_with(libc::EINVAL, &format!("{WHAT}: unknown flags {flags:#x}"));
            return std::ptr::null_mut();
        }
        let begun = if flags & TERRACE_POOL_TXN_NOWAIT != 0 {
            handle.pool.try_begin()
        } else {
            handle.pool.begin().map(Some)
        };
        match begun {
            Ok(Some(tx)) => Box::into_raw(Box::new(Txn { tx, errnum: 0 })),
            Ok(None) => {
                fail_with(libc::EAGAIN, &format!("{WHAT}: every lane is busy"));
                std::ptr::null_mut()
            }
            Err(e) => {
                fail(&e);
                std::ptr::null_mut()
            }
        }
    })
}

/// # Safety
/// `txn` NULL or a live transaction.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_txn_add_range(txn: *mut Txn, off: u64, len: usize) -> c_int {
    const WHAT: &str = "terrace_pool_txn_add_range";
    // SAFETY: forwarded contract.
    let r = unsafe { with_txn(WHAT, txn, |tx| tx.add_range_direct(off, len as u64)) };
    r.err().unwrap_or(0)
}

/// Allocates in the transaction: in custom class `class_id` if given, zero-filled with
/// `TERRACE_POOL_TXN_ZERO`. 0 on error (which aborts the transaction).
///
/// # Safety
/// `txn` NULL or a live transaction.
unsafe fn alloc_impl(
    what: &str,
    txn: *mut Txn,
    class_id: Option<u8>,
    size: usize,
    type_num: u64,
    flags: c_int,
) -> u64 {
    // SAFETY: forwarded contract.
    unsafe {
        with_txn(what, txn, |tx| {
            if flags & !TERRACE_POOL_TXN_ZERO != 0 {
                return Err(PoolError::InvalidArgument {
                    what: "flags",
                    detail: format!("{flags:#x}: unknown"),
                });
            }
            let size = size_arg(size)?;
            let zero = flags & TERRACE_POOL_TXN_ZERO != 0;
            let oid = match class_id.map(|id| ClassId::new(u32::from(id))).transpose()? {
                None if zero => tx.zalloc(size, type_num)?,
                None => tx.alloc(size, type_num)?,
                Some(class) if zero => tx.zalloc_in(class, size, type_num)?,
                Some(class) => tx.alloc_in(class, size, type_num)?,
            };
            Ok(oid.offset())
        })
    }
    .unwrap_or(0)
}

/// # Safety
/// `txn` NULL or a live transaction.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_txn_alloc(
    txn: *mut Txn,
    size: usize,
    type_num: u64,
    flags: c_int,
) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { alloc_impl("terrace_pool_txn_alloc", txn, None, size, type_num, flags) }
}

/// # Safety
/// `txn` NULL or a live transaction.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_txn_alloc_in_class(
    txn: *mut Txn,
    class_id: u8,
    size: usize,
    type_num: u64,
    flags: c_int,
) -> u64 {
    const WHAT: &str = "terrace_pool_txn_alloc_in_class";
    // SAFETY: forwarded contract.
    unsafe { alloc_impl(WHAT, txn, Some(class_id), size, type_num, flags) }
}

/// # Safety
/// `txn` NULL or a live transaction.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_txn_free(txn: *mut Txn, off: u64) -> c_int {
    const WHAT: &str = "terrace_pool_txn_free";
    if off == 0 && !txn.is_null() {
        return 0;
    }
    // SAFETY: forwarded contract.
    let r = unsafe { with_txn(WHAT, txn, |tx| tx.free(oid_arg(off)?)) };
    r.err().unwrap_or(0)
}

/// Commits (`commit`) or aborts the live transaction `txn` and frees it.
///
/// # Safety
/// `txn` NULL or a live transaction; it is freed.
unsafe fn end(what: &str, txn: *mut Txn, commit: bool) -> c_int {
    error::boundary(what, libc::EIO, || {
        if txn.is_null() {
            return fail_with(libc::EINVAL, &format!("{what}: transaction is NULL"));
        }
        // SAFETY: a live transaction from `terrace_pool_txn_begin` (contract), freed once,
        // here.
        let t = unsafe { Box::from_raw(txn) };
        t.end(commit)
    })
}

/// # Safety
/// `txn` NULL or a live transaction; it is freed.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_txn_commit(txn: *mut Txn) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { end("terrace_pool_txn_commit", txn, true) }
}

/// # Safety
/// `txn` NULL or a live transaction; it is freed.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_txn_abort(txn: *mut Txn) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { end("terrace_pool_txn_abort", txn, false) }
}

/// # Safety
/// `pool` NULL or an open pool.
#[no_mangle]
pub unsafe extern "C" fn terrace_pool_persist_mode(pool: *mut PoolHandle) -> c_int {
    const WHAT: &str = "terrace_pool_persist_mode";
    error::boundary(WHAT, -1, || {
        // SAFETY: contract.
        let Some(handle) = (unsafe { pool.as_ref() }) else {
            fail_with(libc::EINVAL, &format!("{WHAT}: pool is NULL"));
            return -1;
        };
        let region = handle.pool.backend().region();
        match (region.persist_level(), region.is_dax()) {
            (Durability::Power, true) => TERRACE_POOL_PERSIST_FLUSH,
            (Durability::Power, false) => TERRACE_POOL_PERSIST_MSYNC,
            _ => TERRACE_POOL_PERSIST_FENCE,
        }
    })
}

//! Transactions: undo-logged writes plus allocations and frees that take effect at commit.
//!
//! Owns the transaction state ([`Tx`]): the lane held for the whole transaction, the
//! snapshots taken, the blocks reserved and the frees pending. Protocol and crash
//! argument: `docs/pool-format.md`, "Transactions".
//!
//! Invariants while a `Tx` is active:
//! - every byte written through [`Tx::write`] outside this transaction's new objects lies
//!   in a range whose snapshot is durable in the lane's undo log (generation `gen`), and
//!   the lane's undo state word is `gen << 1 | 1` durably before the first snapshot;
//! - allocations are volatile reservations and frees are pending tickets; neither touches
//!   the medium before commit, so an abort or a crash only has to restore snapshots;
//! - dropping an active `Tx` (an early return, a `?`, a panic unwinding) aborts it.

use crate::backend::Backend;
use crate::class::ClassId;
use crate::error::{PoolError, Result};
use crate::heap::{Freeable, Freeing, Reserved};
use crate::log::{self, Entries, RedoEntry};
use crate::pool::{LaneClaim, Oid, Pool, ROOT_TYPE};

/// What a new object holds before its first write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contents {
    /// Whatever the medium held there (`alloc`).
    Uninit,
    /// Zeros (`zalloc`).
    Zeroed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TxPhase {
    Active,
    /// An operation failed or a nested transaction aborted: commit will abort.
    Failed,
    Done,
}

/// An active transaction. See the module docs.
pub struct Tx<'p, B: Backend> {
    pool: &'p Pool<B>,
    lane: LaneClaim<'p>,
    gen: u64,
    undo_active: bool,
    tail: u64,
    // Inline room for a typical transaction's work, so beginning and committing one
    // allocates nothing on the process heap.
    snapshots: Vec<(u64, u64)>,
    allocs: Vec<Reserved>,
    frees: Vec<Freeing>,
    depth: u32,
    state: TxPhase,
}

impl<B: Backend> Pool<B> {
    /// Begins a transaction on a free lane (waiting while every lane is busy).
    pub fn begin(&self) -> Result<Tx<'_, B>> {
        self.ensure_healthy()?;
        Ok(self.tx_on(self.lane()))
    }

    /// Begins a transaction if a lane is free now; `Ok(None)` when every lane is busy.
    /// A caller that must not wait (a JVM thread in a critical native call) uses this and
    /// falls back to [`Pool::begin`] where waiting is allowed.
    pub fn try_begin(&self) -> Result<Option<Tx<'_, B>>> {
        self.ensure_healthy()?;
        Ok(self.try_lane().map(|lane| self.tx_on(lane)))
    }

    fn tx_on<'p>(&'p self, lane: LaneClaim<'p>) -> Tx<'p, B> {
        let gen = lane.gen();
        Tx {
            pool: self,
            lane,
            gen,
            undo_active: false,
            tail: log::UNDO_FIRST,
            snapshots: Vec::new(),
            allocs: Vec::new(),
            frees: Vec::new(),
            depth: 0,
            state: TxPhase::Active,
        }
    }

    /// Runs `f` in a transaction: commits if it returns `Ok`, aborts if it returns `Err`
    /// (that error is returned) or panics (the panic continues after the rollback).
    pub fn tx<T>(&self, f: impl FnOnce(&mut Tx<'_, B>) -> Result<T>) -> Result<T> {
        let mut tx = self.begin()?;
        match f(&mut tx) {
            Ok(v) => {
                tx.commit()?;
                Ok(v)
            }
            Err(e) => {
                tx.abort()?;
                Err(e)
            }
        }
    }
}

impl<'p, B: Backend> Tx<'p, B> {
    fn fail<T>(&mut self, r: Result<T>) -> Result<T> {
        if r.is_err() {
            self.state = TxPhase::Failed;
        }
        r
    }

    fn check_active(&self) -> Result<()> {
        match self.state {
            TxPhase::Active => Ok(()),
            TxPhase::Failed => Err(PoolError::TxAborted),
            TxPhase::Done => Err(PoolError::TxNotActive),
        }
    }

    fn is_fresh(&self, off: u64, len: u64) -> bool {
        self.allocs
            .iter()
            .any(|r| off >= r.off && off + len <= r.off + r.usable)
    }

    fn snapshot(&mut self, off: u64, len: u64) -> Result<()> {
        self.check_active()?;
        let geo = self.pool.geo;
        if off < geo.heap_off || off.checked_add(len).is_none_or(|e| e > geo.heap_end()) {
            return Err(PoolError::OutOfBounds {
                offset: off,
                len,
                what: "the heap",
                limit: geo.heap_end(),
            });
        }
        if len == 0
            || self.is_fresh(off, len)
            || self
                .snapshots
                .iter()
                .any(|&(s, l)| off >= s && off + len <= s + l)
        {
            return Ok(());
        }
        let b = &self.pool.backend;
        let lane_off = self.lane.off();
        if !self.undo_active {
            let gen = self.gen + 1;
            let state = log::undo_state_off(lane_off);
            b.store_u64(state, gen << 1 | 1)?;
            b.persist(state, 8)?;
            self.gen = gen;
            self.lane.set_gen(gen);
            self.undo_active = true;
        }
        log::undo_append(b, lane_off, self.gen, &mut self.tail, off, len)?;
        self.snapshots.push((off, len));
        Ok(())
    }

    /// Snapshots `[offset, offset+len)` of an object so that it can be written and is
    /// restored if the transaction does not commit.
    pub fn add_range(&mut self, oid: Oid, offset: u64, len: u64) -> Result<()> {
        let r = self.pool.object_range(oid, offset, len);
        let r = r.and_then(|at| self.snapshot(at, len));
        self.fail(r)
    }

    /// Snapshots a heap range given by pool offset (`pmemobj_tx_add_range_direct`).
    pub fn add_range_direct(&mut self, off: u64, len: u64) -> Result<()> {
        let r = self.snapshot(off, len);
        self.fail(r)
    }

    /// Writes object bytes transactionally: snapshots them first (unless the object was
    /// allocated by this transaction), persisted at commit.
    pub fn write(&mut self, oid: Oid, offset: u64, data: &[u8]) -> Result<()> {
        let r = (|| {
            let at = self.pool.object_range(oid, offset, data.len() as u64)?;
            self.snapshot(at, data.len() as u64)?;
            self.pool.backend.write(at, data)
        })();
        self.fail(r)
    }

    /// Writes a little-endian u64 transactionally.
    pub fn write_u64(&mut self, oid: Oid, offset: u64, value: u64) -> Result<()> {
        self.write(oid, offset, &value.to_le_bytes())
    }

    /// Reads object bytes (sees this transaction's writes).
    pub fn read(&self, oid: Oid, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.pool.read(oid, offset, buf)
    }

    /// Allocates an object that exists only if the transaction commits. Its contents are
    /// persisted at commit.
    pub fn alloc(&mut self, size: u64, type_num: u64) -> Result<Oid> {
        self.alloc_impl(None, size, type_num)
    }

    /// [`Tx::alloc`] in custom class `class` (`pmemobj_tx_xalloc` with
    /// `POBJ_CLASS_ID`): one unit of the class, so `size` must be 1 to its unit.
    pub fn alloc_in(&mut self, class: ClassId, size: u64, type_num: u64) -> Result<Oid> {
        self.alloc_impl(Some(class), size, type_num)
    }

    /// [`Tx::alloc_in`], zero-filled.
    pub fn zalloc_in(&mut self, class: ClassId, size: u64, type_num: u64) -> Result<Oid> {
        let oid = self.alloc_in(class, size, type_num)?;
        self.zero_new(oid)
    }

    /// [`Tx::alloc`] (in `class`, if given; zero-filled for [`Contents::Zeroed`]) whose
    /// refusal — an unknown class, a size the class does not serve, no space — leaves the
    /// transaction active (libpmemobj's `POBJ_XALLOC_NO_ABORT`): a refused reservation
    /// changed nothing. A failure after the reservation (the medium failing while zeroing) still
    /// fails the transaction.
    pub fn alloc_no_abort(
        &mut self,
        class: Option<ClassId>,
        size: u64,
        type_num: u64,
        contents: Contents,
    ) -> Result<Oid> {
        self.check_active()?;
        if type_num == ROOT_TYPE {
            return Err(PoolError::InvalidArgument {
                what: "type number",
                detail: "u64::MAX is reserved for the root object".into(),
            });
        }
        let r = match class {
            None => self.pool.reserve(size, type_num)?,
            Some(c) => self.pool.reserve_in(c, size, type_num)?,
        };
        let Some(oid) = Oid::from_offset(r.off) else {
            self.pool.cancel(&r);
            return Err(PoolError::InvalidObject { offset: 0 });
        };
        self.allocs.push(r);
        match contents {
            Contents::Zeroed => self.zero_new(oid),
            Contents::Uninit => Ok(oid),
        }
    }

    fn alloc_impl(&mut self, class: Option<ClassId>, size: u64, type_num: u64) -> Result<Oid> {
        let r = (|| {
            self.check_active()?;
            if type_num == ROOT_TYPE {
                return Err(PoolError::InvalidArgument {
                    what: "type number",
                    detail: "u64::MAX is reserved for the root object".into(),
                });
            }
            let r = match class {
                None => self.pool.reserve(size, type_num)?,
                Some(c) => self.pool.reserve_in(c, size, type_num)?,
            };
            let oid = Oid::from_offset(r.off).ok_or(PoolError::InvalidObject { offset: 0 })?;
            self.allocs.push(r);
            Ok(oid)
        })();
        self.fail(r)
    }

    /// [`Tx::alloc`], zero-filled.
    pub fn zalloc(&mut self, size: u64, type_num: u64) -> Result<Oid> {
        let oid = self.alloc(size, type_num)?;
        self.zero_new(oid)
    }

    /// Zeroes an object this transaction just allocated.
    fn zero_new(&mut self, oid: Oid) -> Result<Oid> {
        let usable = self.pool.usable_size(oid);
        let r = usable.and_then(|u| self.pool.backend.fill(oid.offset(), u, 0));
        self.fail(r)?;
        Ok(oid)
    }

    /// Frees an object when the transaction commits (at once if this transaction
    /// allocated it).
    pub fn free(&mut self, oid: Oid) -> Result<()> {
        let r = (|| {
            self.check_active()?;
            if let Some(i) = self.allocs.iter().position(|r| r.off == oid.offset()) {
                let r = self.allocs.swap_remove(i);
                self.pool.cancel(&r);
                return Ok(());
            }
            let f = self.pool.heap.begin_free(oid.offset(), Freeable::NotRoot)?;
            self.frees.push(f);
            Ok(())
        })();
        self.fail(r)
    }

    /// Runs `f` as a nested transaction, flattened into this one: its work commits with
    /// the outermost transaction, and its failure aborts the outermost one.
    pub fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.check_active()?;
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        self.fail(r)
    }

    /// Nesting depth (0 for the outermost transaction).
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Commits: persists snapshotted ranges and new objects, then one redo log makes the
    /// allocations, frees and the end of the undo log durable together (the commit
    /// point). A failed transaction is aborted instead and `TxAborted` returned.
    pub fn commit(mut self) -> Result<()> {
        if self.state == TxPhase::Failed {
            self.rollback()?;
            return Err(PoolError::TxAborted);
        }
        self.check_active()?;
        let pool = self.pool;
        let r = (|| {
            for &(off, len) in &self.snapshots {
                pool.backend.persist(off, len)?;
            }
            for r in &self.allocs {
                pool.backend.persist(r.off, r.usable)?;
            }
            let mut entries = Entries::new();
            for r in &self.allocs {
                pool.heap.alloc_entries(r, &mut entries);
            }
            for f in &self.frees {
                pool.heap.free_entries(f, &mut entries);
            }
            if self.undo_active {
                entries.push(RedoEntry::set(
                    log::undo_state_off(self.lane.off()),
                    self.gen << 1,
                ));
            }
            pool.commit_entries(self.lane.off(), &entries)
        })();
        if let Err(e) = r {
            if matches!(e, PoolError::TxLogFull { .. }) {
                self.rollback()?;
            } else {
                pool.poison();
                self.state = TxPhase::Done;
            }
            return Err(e);
        }
        self.state = TxPhase::Done;
        self.allocs.clear();
        let mut done = Ok(());
        for f in self.frees.drain(..) {
            let r = pool.free_done(f);
            done = done.and(r);
        }
        done
    }

    /// Aborts: restores every snapshot, drops the reservations and pending frees.
    pub fn abort(mut self) -> Result<()> {
        self.rollback()
    }

    fn rollback(&mut self) -> Result<()> {
        if self.state == TxPhase::Done {
            return Ok(());
        }
        self.state = TxPhase::Done;
        let pool = self.pool;
        if self.undo_active {
            if let Err(e) = log::undo_rollback(&pool.backend, self.lane.off(), &pool.geo) {
                pool.poison();
                return Err(e);
            }
            self.undo_active = false;
        }
        for r in self.allocs.drain(..) {
            pool.cancel(&r);
        }
        for f in self.frees.drain(..) {
            pool.heap.free_cancel(f);
        }
        Ok(())
    }
}

impl<B: Backend> Drop for Tx<'_, B> {
    fn drop(&mut self) {
        // An unfinished transaction (early return, panic) aborts; a failure to roll back
        // has already poisoned the pool, and recovery at the next open rolls back.
        let _ = self.rollback();
    }
}

//! How readers and writers of one collection meet: [`Seqlocks`] (sequence counters that
//! lock-free readers validate against) and [`OpenGuard`] (a collection is open at most
//! once per process, so its writer lock and counters are the only ones).
//!
//! Invariants: a page's bitmap word changes only between two increments of its stripe
//! counter (odd while changing, [`Seqlocks::commit_word`]); everything a transaction
//! changes changes while `structure` is odd ([`Seqlocks::structural`]). A reader's result
//! is used only if both counters were even and unchanged around its reads
//! ([`Seqlocks::read_consistent`]); reads in between may see torn bytes and are never
//! trusted. The counters are volatile: they start at 0 at every open.

use std::collections::HashSet;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use terrace_pool::{Backend, Pool, Tx};

use crate::error::{CollectionError, Result};

/// Stripe counters readers validate pages against (a page maps to one by its offset).
const STRIPES: usize = 512;

/// Collections open in this process, by (pool uuid, header offset).
static OPEN: Mutex<Option<HashSet<(u64, u64)>>> = Mutex::new(None);

/// Registration of one open collection; dropping it unregisters.
pub(crate) struct OpenGuard(u64, u64);

impl OpenGuard {
    /// Registers the collection at `header`; `Busy` when this process has it open.
    pub(crate) fn register(uuid: u64, header: u64) -> Result<OpenGuard> {
        let mut open = OPEN.lock();
        if !open.get_or_insert_with(HashSet::new).insert((uuid, header)) {
            return Err(CollectionError::Busy { offset: header });
        }
        Ok(OpenGuard(uuid, header))
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        if let Some(set) = OPEN.lock().as_mut() {
            set.remove(&(self.0, self.1));
        }
    }
}

/// Where a reader's attempt ended.
pub(crate) enum Attempt<T> {
    Done(T),
    Retry,
}

pub(crate) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

/// The counters of one open collection; see the module docs.
pub(crate) struct Seqlocks {
    structure: AtomicU64,
    stripes: Box<[AtomicU64]>,
}

impl Default for Seqlocks {
    fn default() -> Self {
        Seqlocks {
            structure: AtomicU64::new(0),
            stripes: (0..STRIPES).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl Seqlocks {
    pub(crate) fn stripe(&self, page: u64) -> &AtomicU64 {
        &self.stripes[(page >> 6) as usize % STRIPES]
    }

    /// The stripe counter of `page` if no writer is changing it now.
    pub(crate) fn page_version(&self, page: u64) -> Option<u64> {
        let v = self.stripe(page).load(Ordering::Acquire);
        (v & 1 == 0).then_some(v)
    }

    /// Runs a reader's attempt until it saw a consistent state: `f` returns the page it
    /// validated against (0: none), that page's version and its result. An error counts
    /// only if nothing changed under it.
    pub(crate) fn read_consistent<T>(
        &self,
        mut f: impl FnMut() -> Result<(u64, u64, Attempt<T>)>,
    ) -> Result<T> {
        let mut spins = 0;
        loop {
            let s1 = self.structure.load(Ordering::Acquire);
            if s1 & 1 == 0 {
                let r = f();
                fence(Ordering::Acquire);
                let same = self.structure.load(Ordering::Relaxed) == s1;
                match r {
                    Ok((page, v1, Attempt::Done(value))) => {
                        if same && (page == 0 || self.stripe(page).load(Ordering::Relaxed) == v1) {
                            return Ok(value);
                        }
                    }
                    Ok((_, _, Attempt::Retry)) => {}
                    Err(e) if same => return Err(e),
                    Err(_) => {}
                }
            }
            backoff(&mut spins);
        }
    }

    /// Stores `word` at `at` (a page's bitmap word; the page is `page`) with the page's
    /// stripe odd around the store, then persists it: the commit point of a single-page
    /// update.
    pub(crate) fn commit_word<B: Backend>(
        &self,
        b: &B,
        page: u64,
        at: u64,
        word: u64,
    ) -> Result<()> {
        let stripe = self.stripe(page);
        let v = stripe.load(Ordering::Relaxed);
        stripe.store(v + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let stored = b.store_u64(at, word);
        stripe.store(v + 2, Ordering::Release);
        stored?;
        b.persist(at, 8)?;
        Ok(())
    }

    /// Runs `f` in one pool transaction with `structure` odd (readers wait), committing
    /// it when `f` succeeds; an error aborts it. The transaction's lane is taken before
    /// `structure` turns odd: waiting for a lane can take as long as some other
    /// transaction holds one (a program's, between its calls), and readers must not wait
    /// on that, only on the writer's own work. The abort of a failed `f` (its undo) runs
    /// while `structure` is still odd.
    pub(crate) fn structural<'p, B: Backend, T>(
        &self,
        pool: &'p Pool<B>,
        f: impl FnOnce(&mut Tx<'p, B>) -> Result<T>,
    ) -> Result<T> {
        let mut tx = pool.begin()?;
        let s = self.structure.load(Ordering::Relaxed);
        self.structure.store(s + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        let r = (move || {
            let v = f(&mut tx)?;
            tx.commit()?;
            Ok(v)
        })();
        self.structure.store(s + 2, Ordering::Release);
        r
    }
}

/// An open collection's entry count, which nothing persistent keeps: counted on the first
/// request (with the collection's writer lock held, so no writer changes it meanwhile),
/// then kept by the writers' [`LazyCount::record`].
#[derive(Default)]
pub(crate) struct LazyCount {
    len: AtomicU64,
    counted: AtomicBool,
}

impl LazyCount {
    /// The count; the first call takes `writer` and runs `count`.
    pub(crate) fn get<G>(
        &self,
        writer: &Mutex<G>,
        count: impl FnOnce() -> Result<u64>,
    ) -> Result<u64> {
        if !self.counted.load(Ordering::Acquire) {
            let _w = writer.lock();
            if !self.counted.load(Ordering::Relaxed) {
                self.len.store(count()?, Ordering::Relaxed);
                self.counted.store(true, Ordering::Release);
            }
        }
        Ok(self.len.load(Ordering::Relaxed))
    }

    /// A writer's change (writer lock held): an entry added, removed, or neither.
    pub(crate) fn record(&self, added: bool, removed: bool) {
        if self.counted.load(Ordering::Relaxed) && added != removed {
            if added {
                self.len.fetch_add(1, Ordering::Relaxed);
            } else {
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

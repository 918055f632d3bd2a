//! The crash-image suite: random sequences of alloc / free / realloc / root growth /
//! transactions (committed, aborted, failed, panicking) / custom class registration and
//! allocation in custom classes (atomic, caller-published and transactional) run on the
//! recording backend;
//! then, for every persist point, the exact durable image and a torn variant (a random
//! subset of the lines still dirty at that moment also written back) are opened and
//! checked: recovery succeeds, `check` passes, the root's slots equal the state before or
//! after the operation in flight (after, once its last persist completed), every published
//! object is live with its contents (and in the class it was allocated in), the live
//! objects are exactly the published ones (no leak, no double allocation), and the
//! registered classes are exactly those before or after the operation: a class is either
//! fully registered, with the description it was registered with, or absent.
//!
//! Allocations and frees publish through the pool (`HandleAt::Word`: redo-logged commits) or
//! through the caller (`HandleAt::None`, then a durable 8-byte store of the handle: the
//! single-word commits that need no log). The latter have a window where the object is
//! live but not published; then exactly that object may also be live, and if it was just
//! allocated it must already hold its contents.

use std::collections::BTreeSet;
use std::time::Instant;

mod common;

use terrace_pool::{
    AllocClass, Backend, ClassDesc, ClassId, HandleAt, HeaderType, Oid, Pool, PoolError,
    RecordingBackend,
};

const LAYOUT: &str = "crash-suite";
const SLOTS: u64 = 24;
/// Root: SLOTS handle words, a transaction counter, then SLOTS content seeds.
const COUNTER: u64 = SLOTS * 8;
const SEEDS: u64 = COUNTER + 8;
const ROOT_SIZE: u64 = SEEDS + SLOTS * 8;
const CHECKED: u64 = 192;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn pattern(seed: u64, len: u64) -> Vec<u8> {
    (0..len)
        .map(|k| (seed.wrapping_mul(31).wrapping_add(k * 7) >> 3) as u8 ^ seed as u8)
        .collect()
}

/// What the root says: root offset, slot handles, counter, seeds; the registered classes
/// and the class of each published object.
#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    root: u64,
    slots: Vec<u64>,
    counter: u64,
    seeds: Vec<u64>,
    classes: Vec<AllocClass>,
    slot_classes: Vec<Option<ClassId>>,
}

fn read_state<B: Backend>(pool: &Pool<B>) -> Result<State, PoolError> {
    let root = pool.root(ROOT_SIZE)?;
    let mut slots = Vec::new();
    let mut seeds = Vec::new();
    let mut slot_classes = Vec::new();
    for i in 0..SLOTS {
        let slot = pool.read_u64(root, i * 8)?;
        slots.push(slot);
        slot_classes.push(match Oid::from_offset(slot) {
            Some(oid) => pool.class_of(oid)?,
            None => None,
        });
        // A seed matters only for a published slot (it is written before publishing).
        seeds.push(if slot == 0 {
            0
        } else {
            pool.read_u64(root, SEEDS + i * 8)?
        });
    }
    Ok(State {
        root: root.offset(),
        slots,
        counter: pool.read_u64(root, COUNTER)?,
        seeds,
        classes: pool.classes(),
        slot_classes,
    })
}

/// Classes the sequences register (in order, up to all of them): small and odd units,
/// short runs (so runs are carved and released often), chosen ids and the next free one.
fn class_desc(n: usize) -> (Option<u32>, ClassDesc) {
    match n {
        0 => (None, ClassDesc::new(16).run_pages(1)),
        1 => (Some(200), ClassDesc::new(136).units_per_run(40)),
        2 => (
            None,
            ClassDesc::new(4096)
                .run_pages(2)
                .alignment(4096)
                .header(HeaderType::Compact),
        ),
        3 => (Some(9), ClassDesc::new(40).units_per_run(100)),
        _ => (None, ClassDesc::new(1000).units_per_run(5)),
    }
}
const SUITE_CLASSES: usize = 5;

const SIZES: [u64; 10] = [64, 80, 200, 512, 1500, 4096, 9000, 40_000, 150_000, 300_000];

/// Operations that changed the pool, by kind (to show what the suite exercised).
#[derive(Debug, Default)]
struct Counts {
    alloc: usize,
    free: usize,
    realloc: usize,
    tx_commit: usize,
    tx_rolled_back: usize,
    tx_rewrite: usize,
    root_growth: usize,
    alloc_unpublished: usize,
    free_unpublished: usize,
    class_register: usize,
    class_alloc: usize,
    class_alloc_unpublished: usize,
    class_tx_alloc: usize,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.alloc += o.alloc;
        self.free += o.free;
        self.realloc += o.realloc;
        self.tx_commit += o.tx_commit;
        self.tx_rolled_back += o.tx_rolled_back;
        self.tx_rewrite += o.tx_rewrite;
        self.root_growth += o.root_growth;
        self.alloc_unpublished += o.alloc_unpublished;
        self.free_unpublished += o.free_unpublished;
        self.class_register += o.class_register;
        self.class_alloc += o.class_alloc;
        self.class_alloc_unpublished += o.class_alloc_unpublished;
        self.class_tx_alloc += o.class_tx_alloc;
    }
}

/// An object an operation holds outside the pool for a while: live in the images taken
/// then without being published. `seed`: it was just allocated with this seed's pattern.
#[derive(Clone, Copy, Debug)]
struct Leak {
    off: u64,
    seed: Option<u64>,
}

struct Run {
    counts: Counts,
    pool: Pool<RecordingBackend>,
    rng: Rng,
    next_seed: u64,
    /// The current operation's unpublished object, if it has one.
    leak: Option<Leak>,
}

/// Which root slots [`Run::pick`] chooses from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum RootSlot {
    Full,
    Empty,
}

impl Run {
    fn root(&self) -> Oid {
        self.pool.root(ROOT_SIZE).expect("root")
    }

    fn slot(&self, i: u64) -> HandleAt {
        HandleAt::Word(self.root().offset() + i * 8)
    }

    /// A random slot of the root that holds a handle (`RootSlot::Full`) or none (`RootSlot::Empty`).
    fn pick(&mut self, want: RootSlot) -> Option<u64> {
        let root = self.root();
        let start = self.rng.below(SLOTS);
        (0..SLOTS).map(|k| (start + k) % SLOTS).find(|&i| {
            let full = self.pool.read_u64(root, i * 8).expect("slot") != 0;
            full == (want == RootSlot::Full)
        })
    }

    /// A registered class and a size it serves, if any class is registered.
    fn pick_class(&mut self) -> Option<(ClassId, u64)> {
        let classes = self.pool.classes();
        if classes.is_empty() {
            return None;
        }
        let c = classes[self.rng.below(classes.len() as u64) as usize];
        let unit = c.unit as u64;
        let size = unit - self.rng.below(unit.min(24));
        Some((c.id.expect("custom"), size))
    }

    fn set_seed_durable(&self, i: u64, seed: u64) {
        // Seeds are written before the publishing operation, so they are durable
        // whichever state a crash leaves (they only matter for published slots).
        let root = self.root();
        self.pool
            .write_durable(root, SEEDS + i * 8, &seed.to_le_bytes())
            .expect("seed");
    }

    fn op(&mut self) {
        let size = SIZES[self.rng.below(SIZES.len() as u64) as usize];
        let seed = self.next_seed;
        self.next_seed += 1;
        match self.rng.below(19) {
            0..=3 => {
                let Some(i) = self.pick(RootSlot::Empty) else {
                    return;
                };
                self.set_seed_durable(i, seed);
                let data = pattern(seed, CHECKED.min(size));
                let r = self
                    .pool
                    .alloc_with(size, 1 + size % 3, self.slot(i), |w| w.write(0, &data));
                match r {
                    Ok(_) => self.counts.alloc += 1,
                    Err(PoolError::OutOfSpace { .. }) => {}
                    Err(e) => panic!("alloc: {e}"),
                }
            }
            4..=5 => {
                let Some(i) = self.pick(RootSlot::Full) else {
                    return;
                };
                self.pool.free(self.slot(i)).expect("free");
                self.counts.free += 1;
            }
            6 => {
                let Some(i) = self.pick(RootSlot::Full) else {
                    return;
                };
                // Contents are checked over 64 bytes: a smaller (custom-class) object
                // would leave only its prefix of the pattern in the new one.
                let old = Oid::from_offset(self.pool.read_u64(self.root(), i * 8).expect("slot"));
                if old.is_some_and(|o| self.pool.usable_size(o).expect("live") < 64) {
                    return;
                }
                match self.pool.realloc(self.slot(i), size, 1 + size % 3) {
                    Ok(_) => self.counts.realloc += 1,
                    Err(PoolError::OutOfSpace { .. }) => {}
                    Err(e) => panic!("realloc: {e}"),
                }
            }
            7..=9 => {
                let how = self.rng.below(6);
                self.tx(size, seed, how)
            }
            10 => {
                // Rewrite a published object's contents and its seed in one transaction.
                let Some(i) = self.pick(RootSlot::Full) else {
                    return;
                };
                let root = self.root();
                let obj = Oid::from_offset(self.pool.read_u64(root, i * 8).expect("slot"))
                    .expect("non-null");
                let len = CHECKED.min(self.pool.usable_size(obj).expect("live"));
                self.pool
                    .tx(|tx| {
                        tx.write(obj, 0, &pattern(seed, len))?;
                        tx.write_u64(root, SEEDS + i * 8, seed)
                    })
                    .expect("tx rewrite");
                self.counts.tx_rewrite += 1;
            }
            12 | 13 => {
                // Allocate with the handle held by the caller, then publish it by hand.
                let Some(i) = self.pick(RootSlot::Empty) else {
                    return;
                };
                self.set_seed_durable(i, seed);
                let data = pattern(seed, CHECKED.min(size));
                let r = self
                    .pool
                    .alloc_with(size, 1 + size % 3, HandleAt::None, |w| w.write(0, &data));
                match r {
                    Ok(oid) => {
                        self.leak = Some(Leak {
                            off: oid.offset(),
                            seed: Some(seed),
                        });
                        let root = self.root();
                        self.pool
                            .write_durable(root, i * 8, &oid.offset().to_le_bytes())
                            .expect("publish");
                        self.counts.alloc_unpublished += 1;
                    }
                    Err(PoolError::OutOfSpace { .. }) => {}
                    Err(e) => panic!("alloc: {e}"),
                }
            }
            14 => {
                // Unpublish by hand, then free by handle.
                let Some(i) = self.pick(RootSlot::Full) else {
                    return;
                };
                let root = self.root();
                let off = self.pool.read_u64(root, i * 8).expect("slot");
                self.leak = Some(Leak { off, seed: None });
                self.pool
                    .write_durable(root, i * 8, &0u64.to_le_bytes())
                    .expect("unpublish");
                self.pool
                    .free_oid(Oid::from_offset(off).expect("non-null"))
                    .expect("free");
                self.counts.free_unpublished += 1;
            }
            15 => {
                // Register the next class of the list (by chosen id or the next free).
                let n = self.pool.classes().len();
                if n >= SUITE_CLASSES {
                    return;
                }
                let (want, desc) = class_desc(n);
                let got = match want {
                    Some(id) => self
                        .pool
                        .register_class_as(ClassId::new(id).expect("id"), &desc),
                    None => self.pool.register_class(&desc),
                };
                got.expect("register");
                self.counts.class_register += 1;
            }
            16 | 17 => {
                // Allocate in a custom class, published by the pool.
                let Some(i) = self.pick(RootSlot::Empty) else {
                    return;
                };
                let Some((class, size)) = self.pick_class() else {
                    return;
                };
                self.set_seed_durable(i, seed);
                // The object is a whole unit: the checked prefix covers more than `size`.
                let r = self
                    .pool
                    .alloc_in(class, size, 1 + size % 3, self.slot(i), |w| {
                        w.write(0, &pattern(seed, CHECKED.min(w.usable())))
                    });
                match r {
                    Ok(_) => self.counts.class_alloc += 1,
                    Err(PoolError::OutOfSpace { .. }) => {}
                    Err(e) => panic!("alloc in class: {e}"),
                }
            }
            18 => {
                // Allocate in a custom class keeping the handle, then publish by hand.
                let Some(i) = self.pick(RootSlot::Empty) else {
                    return;
                };
                let Some((class, size)) = self.pick_class() else {
                    return;
                };
                self.set_seed_durable(i, seed);
                let r = self
                    .pool
                    .alloc_in(class, size, 1 + size % 3, HandleAt::None, |w| {
                        w.write(0, &pattern(seed, CHECKED.min(w.usable())))
                    });
                match r {
                    Ok(oid) => {
                        self.leak = Some(Leak {
                            off: oid.offset(),
                            seed: Some(seed),
                        });
                        let root = self.root();
                        self.pool
                            .write_durable(root, i * 8, &oid.offset().to_le_bytes())
                            .expect("publish");
                        self.counts.class_alloc_unpublished += 1;
                    }
                    Err(PoolError::OutOfSpace { .. }) => {}
                    Err(e) => panic!("alloc in class: {e}"),
                }
            }
            _ => {
                if self.rng.below(8) == 0 {
                    let bigger = self.pool.root_size().expect("root size") + 512;
                    self.pool.root(bigger).expect("root growth");
                    self.counts.root_growth += 1;
                }
            }
        }
    }

    /// A transaction freeing one slot, allocating another and bumping the counter;
    /// `how`: 0..=2 commit, 3 abort, 4 fail inside a nested transaction, 5 panic.
    fn tx(&mut self, size: u64, seed: u64, how: u64) {
        let full = self.pick(RootSlot::Full);
        let empty = self.pick(RootSlot::Empty);
        // Half of the transactions that allocate do it in a custom class.
        let class = if self.rng.below(2) == 0 {
            self.pick_class()
        } else {
            None
        };
        let size = class.map_or(size, |(_, s)| s);
        let root = self.root();
        let pool = &self.pool;
        let body = |tx: &mut terrace_pool::Tx<'_, RecordingBackend>| -> Result<(), PoolError> {
            if let Some(a) = full {
                let obj = Oid::from_offset(pool.read_u64(root, a * 8)?).expect("non-null");
                tx.write_u64(root, a * 8, 0)?;
                tx.free(obj)?;
            }
            if let Some(b) = empty {
                let obj = match class {
                    Some((c, _)) => tx.alloc_in(c, size, 1 + size % 3)?,
                    None => tx.alloc(size, 1 + size % 3)?,
                };
                let len = CHECKED.min(pool.usable_size(obj)?);
                tx.write(obj, 0, &pattern(seed, len))?;
                tx.write_u64(root, SEEDS + b * 8, seed)?;
                tx.write_u64(root, b * 8, obj.offset())?;
            }
            let c = pool.read_u64(root, COUNTER)?;
            tx.write_u64(root, COUNTER, c + 1)?;
            match how {
                3 => Err(PoolError::TxAborted),
                4 => tx.nested(|_| Err(PoolError::InvalidObject { offset: 1 })),
                5 => panic!("deliberate panic inside a transaction"),
                _ => Ok(()),
            }
        };
        if how == 5 {
            let quiet = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.tx(body)));
            std::panic::set_hook(quiet);
            assert!(r.is_err());
            self.counts.tx_rolled_back += 1;
            return;
        }
        match pool.tx(body) {
            Ok(()) => {
                assert!(how <= 2);
                self.counts.tx_commit += 1;
                if class.is_some() && empty.is_some() {
                    self.counts.class_tx_alloc += 1;
                }
            }
            Err(PoolError::OutOfSpace { .. }) => {}
            Err(_) if how >= 3 => self.counts.tx_rolled_back += 1,
            Err(e) => panic!("tx: {e}"),
        }
    }
}

fn check_contents<B: Backend>(pool: &Pool<B>, oid: Oid, seed: u64, what: &str) {
    let usable = pool
        .usable_size(oid)
        .unwrap_or_else(|e| panic!("{what}: object {:#x} not live: {e}", oid.offset()));
    let len = CHECKED.min(usable);
    let mut buf = vec![0u8; len as usize];
    pool.read(oid, 0, &mut buf).expect("read");
    let want = pattern(seed, len);
    let n = want.len().min(buf.len());
    // Contents are checked over the bytes the writer produced (a realloc to a
    // smaller class keeps a prefix; the rest of the pattern is only in `want`).
    let written = n.min(CHECKED as usize);
    assert_eq!(
        &buf[..written.min(64)],
        &want[..written.min(64)],
        "{what}: contents"
    );
}

/// Opens a crash image and checks it against the states allowed at that point (and the
/// operation's unpublished object, which may be live too). With `TERRACE_TEST_PMEM_DIR`
/// set, the image is written to a file there and opened as a pool file (on a DAX mount,
/// recovery then persists through `MAP_SYNC` and cache-line flushes); else it is opened
/// in memory.
fn verify(image: Vec<u8>, allowed: &[&State], leak: Option<Leak>, what: &str) {
    if std::env::var_os("TERRACE_TEST_PMEM_DIR").is_none() {
        let pool = Pool::open_on(RecordingBackend::from_image(image), LAYOUT)
            .unwrap_or_else(|e| panic!("{what}: recovery failed: {e}"));
        return verify_pool(&pool, allowed, leak, what);
    }
    thread_local! {
        static IMAGE_DIR: tempfile::TempDir = common::pool_dir();
    }
    let path = IMAGE_DIR.with(|d| d.path().join("image.pool"));
    std::fs::write(&path, &image).unwrap_or_else(|e| panic!("{what}: writing the image: {e}"));
    let before = terrace_media::persist::thread_counts();
    let pool = Pool::open(&path, LAYOUT).unwrap_or_else(|e| panic!("{what}: recovery failed: {e}"));
    common::expect_dax_persists(&pool, || verify_pool(&pool, allowed, leak, what));
    if common::dax_required() {
        let after = terrace_media::persist::thread_counts();
        assert_eq!(after.msyncs, before.msyncs, "{what}: recovery used msync");
    }
}

fn verify_pool<B: Backend>(pool: &Pool<B>, allowed: &[&State], leak: Option<Leak>, what: &str) {
    pool.check()
        .unwrap_or_else(|e| panic!("{what}: check failed: {e}"));
    let state = read_state(pool).unwrap_or_else(|e| panic!("{what}: root: {e}"));
    let Some(expected) = allowed.iter().find(|s| ***s == state) else {
        panic!("{what}: recovered state {state:?} is none of {allowed:?}");
    };
    let mut published = BTreeSet::new();
    for (i, &off) in expected.slots.iter().enumerate() {
        let Some(oid) = Oid::from_offset(off) else {
            continue;
        };
        assert!(
            published.insert(off),
            "{what}: slot {i} shares object {off:#x}"
        );
        check_contents(pool, oid, expected.seeds[i], &format!("{what}: slot {i}"));
    }
    let live: BTreeSet<u64> = pool
        .objects(None)
        .expect("objects")
        .iter()
        .map(|o| o.oid.offset())
        .collect();
    let mut expected_live = published.clone();
    if let Some(l) = leak {
        if live.contains(&l.off) && expected_live.insert(l.off) {
            if let (Some(seed), Some(oid)) = (l.seed, Oid::from_offset(l.off)) {
                check_contents(pool, oid, seed, &format!("{what}: unpublished object"));
            }
        }
    }
    assert_eq!(
        live, expected_live,
        "{what}: live objects differ from published ones"
    );
    // The recovered heap works: allocate and free once, in a size class and in every
    // registered class.
    let oid = pool
        .alloc(100, 9, HandleAt::None)
        .expect("alloc after recovery");
    pool.free_oid(oid).expect("free after recovery");
    for c in &expected.classes {
        let id = c.id.expect("custom");
        match pool.alloc_in(id, c.unit as u64, 9, HandleAt::None, |_| Ok(())) {
            Ok(oid) => {
                assert_eq!(pool.class_of(oid).expect("live"), Some(id), "{what}");
                pool.free_oid(oid).expect("free in class after recovery");
            }
            Err(PoolError::OutOfSpace { .. }) => {}
            Err(e) => panic!("{what}: alloc in class {id} after recovery: {e}"),
        }
    }
}

fn run_sequence(seed: u64, ops: usize, torn_variants: u64) -> (usize, Counts) {
    let backend = RecordingBackend::new(4 << 20);
    let pool = Pool::create_on(backend, LAYOUT, 2).expect("create");
    pool.root(ROOT_SIZE).expect("root");
    let mut run = Run {
        counts: Counts::default(),
        pool,
        rng: Rng(seed),
        next_seed: 1,
        leak: None,
    };
    run.pool.backend().start_recording();
    let mut states = vec![read_state(&run.pool).expect("state")];
    let mut ends = Vec::new();
    let mut leaks = Vec::new();
    for _ in 0..ops {
        run.op();
        leaks.push(run.leak.take());
        states.push(read_state(&run.pool).expect("state"));
        ends.push(run.pool.backend().recorded_points());
        run.pool.check().expect("live check");
    }
    let recording = run.pool.backend().take_recording();
    let points = recording.points();
    eprintln!("seq {seed}: {points} persist points from {:?}", run.counts);
    let op_of = |k: usize| ends.partition_point(|&e| e <= k);
    let mut prev: Option<Vec<u8>> = None;
    recording.for_each_image(|k, image| {
        let i = op_of(k);
        let (pre, post) = (&states[i], &states[i + 1]);
        let last = ends[i] == k + 1;
        let allowed: Vec<&State> = if last { vec![post] } else { vec![pre, post] };
        verify(
            image.to_vec(),
            &allowed,
            leaks[i],
            &format!("seq {seed} point {k} (op {i})"),
        );
        let before = prev.as_deref().unwrap_or(&recording.base);
        for v in 0..torn_variants {
            let torn = recording.torn_image(before, k, seed ^ (k as u64) << 8 ^ v);
            verify(
                torn,
                &[pre, post],
                leaks[i],
                &format!("seq {seed} point {k} torn {v}"),
            );
        }
        prev = Some(image.to_vec());
    });
    (points, run.counts)
}

#[test]
fn every_persist_point_recovers() {
    let start = Instant::now();
    let mut total = 0;
    let mut counts = Counts::default();
    for seed in [1u64, 2, 3, 4] {
        let (points, c) = run_sequence(seed, 120, 1);
        total += points;
        counts.add(&c);
    }
    eprintln!(
        "crash suite: {total} persist points (each exact + torn), {counts:?}, {:?}",
        start.elapsed()
    );
    assert!(total >= 1000, "only {total} persist points");
    assert!(
        counts.alloc > 0
            && counts.free > 0
            && counts.realloc > 0
            && counts.tx_commit > 0
            && counts.tx_rolled_back > 0
            && counts.alloc_unpublished > 0
            && counts.free_unpublished > 0
            && counts.class_register > 0
            && counts.class_alloc > 0
            && counts.class_alloc_unpublished > 0
            && counts.class_tx_alloc > 0,
        "an operation kind was never exercised: {counts:?}"
    );
}

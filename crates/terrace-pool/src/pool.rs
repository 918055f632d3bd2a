//! The pool: create, open (validation and recovery), close, check, the root object, and
//! the crash-atomic allocation operations (alloc / zalloc / realloc / free with publish).
//!
//! Owns the backend, the decoded header, the lanes and the heap, and the registration of
//! custom allocation classes (the class table). Every operation that changes persistent
//! allocation state commits atomically (`docs/pool-format.md`, "Commit protocol"): one
//! word by a single-word commit, more through a lane's redo log; volatile heap changes
//! follow the rules in the `heap` module.
//!
//! Invariants: after `open` returns, every lane's redo header is 0 and every undo state is
//! idle (recovery ran), the volatile heap equals the persistent descriptors, and its
//! class table equals the persistent one (loaded and validated before any allocation);
//! afterwards a class enters the volatile table only after its entry is durable.

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::Read;
use std::num::NonZeroU64;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use terrace_media::{Durability, FileLocation, FileOptions, Region};

use crate::backend::{Backend, RegionBackend};
use crate::class::{self, AllocClass, ClassDesc, ClassId};
use crate::error::{corrupt, PoolError, Result};
use crate::format::{
    self, ClassEntry, Geometry, PoolHeader, CLASS_SLOTS, CLASS_TABLE_VERSION, DIRECTORY_WORD,
    FORMAT_VERSION, HEADER_LEN, KIND_RUN, LANES_OFF, POOL_ALIGN, ROOT_OFF_WORD, ROOT_SIZE_WORD,
    STATE_OFF,
};
use crate::heap::{self, ClassTable, Freeable, Freeing, Heap, HeapStats, Reserved};
use crate::log::{self, Entries, RedoEntry};

/// The type number of the root object (never handed to user allocations).
pub const ROOT_TYPE: u64 = u64::MAX;

/// A handle to a persistent object: its offset from the start of the pool (relocatable:
/// valid wherever the pool is mapped next time). Never zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Oid(NonZeroU64);

impl Oid {
    /// The handle for a pool offset (`None` for 0, the null handle).
    #[inline]
    pub fn from_offset(off: u64) -> Option<Oid> {
        NonZeroU64::new(off).map(Oid)
    }
    #[inline]
    pub fn offset(self) -> u64 {
        self.0.get()
    }
}

/// Where an allocation's handle is published (atomically with the allocation), and from
/// where a free takes the handle it clears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandleAt {
    /// Nowhere: the caller keeps the returned handle (it leaks if the process crashes
    /// before the caller stores it somewhere persistent).
    None,
    /// A little-endian u64 holding the object's offset, at this pool offset.
    Word(u64),
    /// A 16-byte `PMEMoid` `{pool_uuid_lo, off}` at this pool offset.
    Oid(u64),
}

/// A live object found by iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Object {
    pub oid: Oid,
    pub type_num: u64,
    pub usable: u64,
    /// The custom class whose run holds it (`None`: a built-in size class or an extent).
    pub class: Option<ClassId>,
}

/// What [`Pool::check`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub objects: u64,
    pub runs: u64,
    pub extents: u64,
    pub free_pages: u64,
    pub allocated_bytes: u64,
    /// Custom classes registered (the class table's entries, all valid).
    pub classes: u64,
    /// Runs of custom classes (included in `runs`).
    pub custom_runs: u64,
}

/// One lane: a redo area and an undo area used by one operation or transaction at a time.
///
/// Invariant: `gen` is read and written only by the holder of the lane's [`LaneClaim`]
/// (claiming and releasing `busy` are Acquire/Release, which orders those accesses), so
/// the relaxed accesses to it never race. A claim is not tied to the thread that took it:
/// a transaction may begin on one thread and commit on another (a JVM virtual thread that
/// moved between carrier threads).
///
/// Each lane has a cache line of its own: lanes are claimed (a locked compare-exchange)
/// by different threads, which must not contend for one line.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Lane {
    off: u64,
    /// Generation of the last transaction that used the undo area.
    gen: AtomicU64,
    busy: AtomicBool,
}

/// The exclusive use of one lane; dropping it frees the lane.
#[derive(Debug)]
pub(crate) struct LaneClaim<'p> {
    lane: &'p Lane,
}

impl LaneClaim<'_> {
    /// Pool offset of the lane's area.
    pub(crate) fn off(&self) -> u64 {
        self.lane.off
    }

    /// Generation of the last transaction that used the undo area.
    pub(crate) fn gen(&self) -> u64 {
        self.lane.gen.load(Ordering::Relaxed)
    }

    pub(crate) fn set_gen(&self, gen: u64) {
        self.lane.gen.store(gen, Ordering::Relaxed);
    }
}

impl Drop for LaneClaim<'_> {
    fn drop(&mut self) {
        self.lane.busy.store(false, Ordering::Release);
    }
}

/// A persistent pool. See the crate docs.
#[derive(Debug)]
pub struct Pool<B: Backend = RegionBackend> {
    pub(crate) backend: B,
    header: PoolHeader,
    pub(crate) geo: Geometry,
    pub(crate) heap: Heap,
    lanes: Vec<Lane>,
    root_lock: Mutex<()>,
    /// Serialises class registrations (choosing an id and committing its entry).
    class_lock: Mutex<()>,
    poisoned: AtomicBool,
    path: Option<PathBuf>,
}

fn new_uuid() -> [u8; 16] {
    let mut out = [0u8; 16];
    for half in out.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0),
        );
        h.write_u32(std::process::id());
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

fn io_err(op: &'static str, path: &Path, source: std::io::Error) -> PoolError {
    PoolError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

impl Pool<RegionBackend> {
    /// Creates a pool file of `size` bytes (rounded up to 2 MiB) with a layout name. The
    /// file must not exist; all its blocks are reserved, so a full file system fails here
    /// and never later.
    pub fn create(path: impl AsRef<Path>, size: u64, layout: &str) -> Result<Self> {
        let path = path.as_ref();
        format::check_layout(layout)?;
        let size = size.div_ceil(POOL_ALIGN).max(1) * POOL_ALIGN;
        Geometry::compute(size, Geometry::default_lanes(size))?;
        if path.symlink_metadata().is_ok() {
            return Err(PoolError::Exists {
                path: path.to_path_buf(),
            });
        }
        let made = (|| {
            let region = Region::file(&FileOptions::at_path(path, size as usize))?;
            region.reserve(0, size as usize)?;
            let backend = RegionBackend::new(region, size)?;
            let mut pool = Pool::create_on(backend, layout, Geometry::default_lanes(size))?;
            pool.path = Some(path.to_path_buf());
            Ok(pool)
        })();
        if made.is_err() {
            let _ = std::fs::remove_file(path);
        }
        made
    }

    /// Opens a pool file created with `layout`. A missing, foreign, truncated or corrupt
    /// file is a typed error; the file is not modified unless it is a valid pool (then
    /// recovery may roll interrupted operations forward or back).
    pub fn open(path: impl AsRef<Path>, layout: &str) -> Result<Self> {
        Pool::open_with(path.as_ref(), Some(layout))
    }

    /// Opens a pool file whatever its layout name (libpmemobj's `pmemobj_open(path, NULL)`);
    /// every other check of [`Pool::open`] applies.
    pub fn open_any_layout(path: impl AsRef<Path>) -> Result<Self> {
        Pool::open_with(path.as_ref(), None)
    }

    fn open_with(path: &Path, layout: Option<&str>) -> Result<Self> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(PoolError::NotFound {
                    path: path.to_path_buf(),
                })
            }
            Err(e) => return Err(io_err("stat", path, e)),
        };
        if !meta.is_file() {
            return Err(PoolError::NotAPool {
                why: "not a regular file",
            });
        }
        let file_len = meta.len();
        let mut head = vec![0u8; HEADER_LEN as usize];
        let mut file = File::open(path).map_err(|e| io_err("open", path, e))?;
        let mut got = 0;
        while got < head.len() {
            match file.read(&mut head[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err("read", path, e)),
            }
        }
        let header = PoolHeader::decode(&head[..got])?;
        check_layout_matches(&header, layout)?;
        if header.geometry.pool_size != file_len {
            return Err(PoolError::SizeMismatch {
                header: header.geometry.pool_size,
                file: file_len,
            });
        }
        // Mapped as it is: never created, never resized (its length was just checked to be
        // the pool size).
        let region = Region::file(&FileOptions {
            location: FileLocation::Existing(path.to_path_buf()),
            size: 0,
            hole_punching: false,
        })?;
        let backend = RegionBackend::new(region, file_len)?;
        let mut pool = Pool::open_on_with(backend, layout)?;
        pool.path = Some(path.to_path_buf());
        Ok(pool)
    }

    /// The pool file's path.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Opens (recovering as `open` does) and checks a pool file: `terrace pool check`.
    pub fn check_file(path: impl AsRef<Path>, layout: &str) -> Result<CheckReport> {
        Pool::open(path, layout)?.check()
    }
}

/// Reads and validates the class table of a pool of format `version`: every entry is 0
/// or a well-formed, usable class; entries 0 and 255 are 0, and a pool older than the
/// class table has none. A bad entry is `Corrupt` naming its id and offset.
fn read_class_table<B: Backend>(b: &B, version: u32) -> Result<ClassTable> {
    let mut table: ClassTable = [None; CLASS_SLOTS];
    for (id, slot) in table.iter_mut().enumerate() {
        let id = id as u8;
        let off = format::class_entry_off(id);
        let word = b.load_u64(off)?;
        if word == 0 {
            continue;
        }
        let bad = |why: &str| corrupt(format!("class table entry {id} ({word:#018x}): {why}"), off);
        if version < CLASS_TABLE_VERSION {
            return Err(bad(&format!(
                "set in a format version {version} pool, which has no class table"
            )));
        }
        if ClassId::new(id as u32).is_err() {
            return Err(bad("this entry is reserved and must be zero"));
        }
        let entry = ClassEntry::decode(id, word)
            .map_err(&bad)?
            .ok_or_else(|| bad("empty"))?;
        class::validate(&entry).map_err(|why| bad(&why))?;
        *slot = Some(entry);
    }
    Ok(table)
}

fn check_layout_matches(header: &PoolHeader, layout: Option<&str>) -> Result<()> {
    let Some(layout) = layout else {
        return Ok(());
    };
    if header.layout != layout {
        return Err(PoolError::LayoutMismatch {
            expected: layout.to_string(),
            found: header.layout.clone(),
        });
    }
    Ok(())
}

impl<B: Backend> Pool<B> {
    /// Formats `backend` (all of it) as a new pool with `lanes` lanes and opens it.
    ///
    /// Protocol: zero the state block, lanes and descriptors and persist them; only then
    /// write and persist the header. A crash before the header is durable leaves a file
    /// without magic, which `open` reports as `NotAPool`.
    pub fn create_on(backend: B, layout: &str, lanes: u32) -> Result<Self> {
        format::check_layout(layout)?;
        let geo = Geometry::compute(backend.len(), lanes)?;
        backend.fill(STATE_OFF, geo.heap_off - STATE_OFF, 0)?;
        backend.persist(STATE_OFF, geo.heap_off - STATE_OFF)?;
        let header = PoolHeader {
            version: FORMAT_VERSION,
            uuid: new_uuid(),
            layout: layout.to_string(),
            geometry: geo,
            created_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0),
        };
        backend.write(0, &header.encode())?;
        backend.persist(0, HEADER_LEN)?;
        Pool::open_on(backend, layout)
    }

    /// Opens the pool in `backend`: validates the header, recovers every lane (replay
    /// complete redo logs, then roll back active undo logs), loads and validates the
    /// class table, validates the page descriptors against it and rebuilds the volatile
    /// heap.
    pub fn open_on(backend: B, layout: &str) -> Result<Self> {
        Pool::open_on_with(backend, Some(layout))
    }

    fn open_on_with(backend: B, layout: Option<&str>) -> Result<Self> {
        let len = backend.len();
        let mut head = vec![0u8; (HEADER_LEN).min(len) as usize];
        backend.read(0, &mut head)?;
        let header = PoolHeader::decode(&head)?;
        check_layout_matches(&header, layout)?;
        let geo = header.geometry;
        if geo.pool_size != len {
            return Err(PoolError::SizeMismatch {
                header: geo.pool_size,
                file: len,
            });
        }
        debug_assert_eq!(geo.lanes_off, LANES_OFF);
        let mut lanes = Vec::with_capacity(geo.lane_count as usize);
        for l in 0..geo.lane_count {
            let off = geo.lane_off(l);
            log::redo_recover(&backend, off, &geo)?;
            log::undo_rollback(&backend, off, &geo)?;
            let gen = backend.load_u64(log::undo_state_off(off))? >> 1;
            lanes.push(Lane {
                off,
                gen: AtomicU64::new(gen),
                busy: AtomicBool::new(false),
            });
        }
        let root_off = backend.load_u64(ROOT_OFF_WORD)?;
        let root_size = backend.load_u64(ROOT_SIZE_WORD)?;
        if (root_off == 0) != (root_size == 0) {
            return Err(corrupt(
                format!("root offset {root_off:#x} with root size {root_size}"),
                ROOT_OFF_WORD,
            ));
        }
        let classes = read_class_table(&backend, header.version)?;
        let (spans, _free) = heap::scan(&backend, &geo, &classes)?;
        let heap = Heap::load(geo, &classes, &spans);
        Ok(Pool {
            backend,
            header,
            geo,
            heap,
            lanes,
            root_lock: Mutex::new(()),
            class_lock: Mutex::new(()),
            poisoned: AtomicBool::new(false),
            path: None,
        })
    }

    /// Closes the pool. Everything acknowledged is already durable; this only unmaps.
    pub fn close(self) {}

    /// The backend (for tests and tools).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Gives the backend back (e.g. a recording backend after a test).
    pub fn into_backend(self) -> B {
        self.backend
    }

    /// The decoded header (for `terrace pool info`).
    pub fn header(&self) -> &PoolHeader {
        &self.header
    }

    pub fn layout(&self) -> &str {
        &self.header.layout
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.header.uuid
    }

    /// The low 64 bits of the uuid (`PMEMoid.pool_uuid_lo`).
    pub fn uuid_lo(&self) -> u64 {
        self.header.uuid_lo()
    }

    pub fn size(&self) -> u64 {
        self.geo.pool_size
    }

    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// What a persisted write survives on this pool's medium.
    pub fn durability(&self) -> Durability {
        self.backend.durability()
    }

    pub fn stats(&self) -> HeapStats {
        self.heap.stats()
    }

    #[inline(always)]
    pub(crate) fn ensure_healthy(&self) -> Result<()> {
        if self.poisoned.load(Ordering::Acquire) {
            return Err(PoolError::Poisoned);
        }
        Ok(())
    }

    /// Records that a persistence step failed midway: the pool refuses further work.
    pub(crate) fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// Whether no lane is claimed now: no transaction is open (each holds its lane until
    /// it ends) and no atomic operation is running. A caller that must not close the pool
    /// under a live transaction checks this, with the thread that could begin one kept out.
    pub fn lanes_idle(&self) -> bool {
        self.lanes.iter().all(|l| !l.busy.load(Ordering::Acquire))
    }

    /// Takes a free lane, preferring the thread's own; waits (yielding) while all are
    /// busy. It never blocks on one particular lane, so a thread that holds a lane for a
    /// transaction and allocates outside it cannot wait for itself.
    pub(crate) fn lane(&self) -> LaneClaim<'_> {
        loop {
            if let Some(claim) = self.try_lane() {
                return claim;
            }
            std::thread::yield_now();
        }
    }

    /// Takes a free lane, preferring the thread's own; `None` when every lane is busy.
    pub(crate) fn try_lane(&self) -> Option<LaneClaim<'_>> {
        let n = self.lanes.len();
        let start = heap::thread_slot() % n;
        (0..n).find_map(|k| {
            let lane = &self.lanes[(start + k) % n];
            let taken = !lane.busy.load(Ordering::Relaxed)
                && lane
                    .busy
                    .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok();
            // `then`, not `then_some`: a claim built for a lane not taken would free it on drop.
            taken.then(|| LaneClaim { lane })
        })
    }

    /// Runs a redo commit; a failure poisons the pool (the medium's state is unknown).
    pub(crate) fn commit_entries(&self, lane_off: u64, entries: &[RedoEntry]) -> Result<()> {
        log::redo_commit(&self.backend, lane_off, entries).inspect_err(|e| {
            if !matches!(e, PoolError::TxLogFull { .. }) {
                self.poison();
            }
        })
    }

    /// Commits `entries` atomically: a single word update directly (no lane), more through
    /// a lane's redo log.
    #[inline(always)]
    pub(crate) fn commit(&self, entries: &[RedoEntry]) -> Result<()> {
        if let [e] = entries {
            return log::apply_one(&self.backend, e).inspect_err(|_| self.poison());
        }
        self.commit_logged(entries)
    }

    #[inline(never)]
    fn commit_logged(&self, entries: &[RedoEntry]) -> Result<()> {
        let lane = self.lane();
        self.commit_entries(lane.off(), entries)
    }

    /// Passes a heap result through, poisoning the pool when the medium failed under it
    /// (a descriptor or release write whose durable state is then unknown).
    #[inline(always)]
    pub(crate) fn heap_result<T>(&self, r: Result<T>) -> Result<T> {
        if let Err(PoolError::Media(_) | PoolError::Io { .. }) = &r {
            self.poison();
        }
        r
    }

    /// Reserves a block in the volatile heap (see `Heap::reserve`).
    #[inline]
    pub(crate) fn reserve(&self, size: u64, type_num: u64) -> Result<Reserved> {
        self.heap_result(self.heap.reserve(&self.backend, size, type_num))
    }

    /// Reserves a slot of custom class `class` (see `Heap::reserve_in`).
    #[inline]
    pub(crate) fn reserve_in(&self, class: ClassId, size: u64, type_num: u64) -> Result<Reserved> {
        self.heap_result(self.heap.reserve_in(&self.backend, class, size, type_num))
    }

    /// Registers a custom allocation class under the lowest free id and returns the id
    /// (libpmemobj's `heap.alloc_class.new.desc`). The class is recorded in the pool: it
    /// is there after close and reopen, and so are objects allocated in it.
    ///
    /// Crash-atomic: the class's table entry is one aligned word, written and persisted
    /// (a single-word commit) before the class can be used; after a crash the class is
    /// registered completely or not at all.
    ///
    /// ```
    /// use terrace_pool::{ClassDesc, HandleAt, Pool, RecordingBackend};
    /// # fn main() -> terrace_pool::Result<()> {
    /// let pool = Pool::create_on(RecordingBackend::new(4 << 20), "example", 2)?;
    /// let class = pool.register_class(&ClassDesc::new(48).units_per_run(500))?;
    /// let obj = pool.alloc_in(class, 40, 1, HandleAt::None, |w| w.write(0, b"node"))?;
    /// assert_eq!(pool.usable_size(obj)?, 48);
    /// // Reopened, the pool still has the class, and the object in it.
    /// let image = pool.into_backend().volatile_image();
    /// let pool = Pool::open_on(RecordingBackend::from_image(image), "example")?;
    /// assert_eq!(pool.class(class).map(|c| c.unit), Some(48));
    /// assert_eq!(pool.class_of(obj)?, Some(class));
    /// # Ok(()) }
    /// ```
    pub fn register_class(&self, desc: &ClassDesc) -> Result<ClassId> {
        self.register(None, desc)
    }

    /// Registers a custom allocation class under `id` (libpmemobj's
    /// `heap.alloc_class.<id>.desc`); `ClassExists` if the id is taken.
    pub fn register_class_as(&self, id: ClassId, desc: &ClassDesc) -> Result<ClassId> {
        self.register(Some(id), desc)
    }

    fn register(&self, id: Option<ClassId>, desc: &ClassDesc) -> Result<ClassId> {
        self.ensure_healthy()?;
        if self.header.version < CLASS_TABLE_VERSION {
            return Err(PoolError::FormatTooOld {
                found: self.header.version,
                needed: CLASS_TABLE_VERSION,
                feature: "custom allocation classes",
            });
        }
        let entry = class::resolve(desc)?;
        let _guard = self.class_lock.lock().unwrap_or_else(|e| e.into_inner());
        let id = match id {
            Some(id) if self.heap.class_entry(id).is_some() => {
                return Err(PoolError::ClassExists { id: id.get() })
            }
            Some(id) => id,
            None => ClassId::all()
                .find(|&id| self.heap.class_entry(id).is_none())
                .ok_or(PoolError::ClassTableFull {
                    max: class::MAX_CUSTOM_CLASSES,
                })?,
        };
        let word = entry.encode(id.get());
        // The commit point: once this persist returns the class is durable. Only then is
        // it usable, so no run of the class can reach the medium before its entry.
        log::apply_one(
            &self.backend,
            &RedoEntry::set(format::class_entry_off(id.get()), word),
        )
        .inspect_err(|_| self.poison())?;
        self.heap.add_class(id, &entry);
        Ok(id)
    }

    /// Custom class `id`, if it is registered.
    pub fn class(&self, id: ClassId) -> Option<AllocClass> {
        self.heap.class_entry(id).map(|e| class::describe(id, &e))
    }

    /// Every registered custom class, by id (the built-in size classes are
    /// [`class::builtin_classes`]).
    pub fn classes(&self) -> Vec<AllocClass> {
        ClassId::all().filter_map(|id| self.class(id)).collect()
    }

    /// The custom class holding the live object `oid` (`None`: a built-in size class or
    /// an extent).
    pub fn class_of(&self, oid: Oid) -> Result<Option<ClassId>> {
        self.heap.class_of(oid.offset())
    }

    /// Gives back a reservation that will not be committed.
    pub(crate) fn cancel(&self, r: &Reserved) {
        let _ = self.heap_result(self.heap.cancel(&self.backend, r));
    }

    /// A free is durable: its block becomes available.
    #[inline]
    pub(crate) fn free_done(&self, f: Freeing) -> Result<()> {
        self.heap_result(self.heap.free_done(&self.backend, f))
    }

    #[inline(always)]
    fn check_dest(&self, dest: HandleAt) -> Result<()> {
        let (at, len) = match dest {
            HandleAt::None => return Ok(()),
            HandleAt::Word(at) => (at, 8),
            HandleAt::Oid(at) => (at, 16),
        };
        if at % 8 != 0 || at < self.geo.heap_off || at.saturating_add(len) > self.geo.heap_end() {
            return Err(PoolError::InvalidArgument {
                what: "destination",
                detail: format!("{at:#x}: must be 8-byte aligned inside the heap"),
            });
        }
        Ok(())
    }

    #[inline(always)]
    pub(crate) fn publish_entries(&self, dest: HandleAt, off: Option<u64>, out: &mut Entries) {
        match dest {
            HandleAt::None => {}
            HandleAt::Word(at) => out.push(RedoEntry::set(at, off.unwrap_or(0))),
            HandleAt::Oid(at) => {
                out.push(RedoEntry::set(at, off.map_or(0, |_| self.uuid_lo())));
                out.push(RedoEntry::set(at + 8, off.unwrap_or(0)));
            }
        }
    }

    /// The handle stored at `dest` (0 → `None`).
    pub fn load_dest(&self, dest: HandleAt) -> Result<Option<Oid>> {
        self.check_dest(dest)?;
        Ok(match dest {
            HandleAt::None => None,
            HandleAt::Word(at) => Oid::from_offset(self.backend.load_u64(at)?),
            HandleAt::Oid(at) => Oid::from_offset(self.backend.load_u64(at + 8)?),
        })
    }

    /// Allocates `size` bytes of type `type_num`, lets `init` fill them (its writes are
    /// persisted), and publishes the handle to `dest`, atomically: after a crash the
    /// object is allocated and published, or neither.
    pub fn alloc_with(
        &self,
        size: u64,
        type_num: u64,
        dest: HandleAt,
        init: impl FnOnce(&ObjectWriter<'_, B>) -> Result<()>,
    ) -> Result<Oid> {
        self.alloc_impl(None, size, type_num, dest, init)
    }

    /// [`Pool::alloc_with`] in custom class `class` (libpmemobj's `pmemobj_xalloc` with
    /// `POBJ_CLASS_ID`): the object is one unit of the class, so `size` must be 1 to the
    /// class's unit (`NoSuchClass` if the class is not registered).
    pub fn alloc_in(
        &self,
        class: ClassId,
        size: u64,
        type_num: u64,
        dest: HandleAt,
        init: impl FnOnce(&ObjectWriter<'_, B>) -> Result<()>,
    ) -> Result<Oid> {
        self.alloc_impl(Some(class), size, type_num, dest, init)
    }

    #[inline(always)]
    fn alloc_impl(
        &self,
        class: Option<ClassId>,
        size: u64,
        type_num: u64,
        dest: HandleAt,
        init: impl FnOnce(&ObjectWriter<'_, B>) -> Result<()>,
    ) -> Result<Oid> {
        self.ensure_healthy()?;
        self.check_dest(dest)?;
        if type_num == ROOT_TYPE {
            return Err(PoolError::InvalidArgument {
                what: "type number",
                detail: "u64::MAX is reserved for the root object".into(),
            });
        }
        let r = match class {
            None => self.reserve(size, type_num)?,
            Some(c) => self.reserve_in(c, size, type_num)?,
        };
        match self.finish_alloc(&r, dest, init, None, &[]) {
            Ok(oid) => Ok(oid),
            Err(e) => {
                self.cancel(&r);
                Err(e)
            }
        }
    }

    fn finish_alloc(
        &self,
        r: &Reserved,
        dest: HandleAt,
        init: impl FnOnce(&ObjectWriter<'_, B>) -> Result<()>,
        freeing: Option<&Freeing>,
        extra: &[RedoEntry],
    ) -> Result<Oid> {
        let Some(oid) = Oid::from_offset(r.off) else {
            return Err(PoolError::InvalidObject { offset: 0 });
        };
        let writer = ObjectWriter {
            pool: self,
            off: r.off,
            usable: r.usable,
            dirty_start: AtomicU64::new(u64::MAX),
            dirty_end: AtomicU64::new(0),
        };
        init(&writer)?;
        writer.persist()?;
        let mut entries = Entries::new();
        self.heap.alloc_entries(r, &mut entries);
        if let Some(f) = freeing {
            self.heap.free_entries(f, &mut entries);
        }
        self.publish_entries(dest, Some(r.off), &mut entries);
        entries.extend_from_slice(extra);
        self.commit(&entries)?;
        Ok(oid)
    }

    /// Finishes a move (realloc, root growth): the new object `r` is committed together
    /// with freeing the old one (`f`); on failure both are cancelled and the old object
    /// stays live.
    fn finish_move(
        &self,
        r: &Reserved,
        dest: HandleAt,
        init: impl FnOnce(&ObjectWriter<'_, B>) -> Result<()>,
        f: Freeing,
        extra: &[RedoEntry],
    ) -> Result<Oid> {
        match self.finish_alloc(r, dest, init, Some(&f), extra) {
            Ok(oid) => {
                self.free_done(f)?;
                Ok(oid)
            }
            Err(e) => {
                self.heap.free_cancel(f);
                self.cancel(r);
                Err(e)
            }
        }
    }

    /// Allocates without initialising (contents are whatever the medium held).
    pub fn alloc(&self, size: u64, type_num: u64, dest: HandleAt) -> Result<Oid> {
        self.alloc_with(size, type_num, dest, |_| Ok(()))
    }

    /// Allocates zero-filled memory.
    pub fn zalloc(&self, size: u64, type_num: u64, dest: HandleAt) -> Result<Oid> {
        self.alloc_with(size, type_num, dest, |w| w.zero())
    }

    /// Frees the object whose handle is at `dest` and clears `dest`, atomically. A null
    /// handle is a no-op.
    pub fn free(&self, dest: HandleAt) -> Result<()> {
        self.ensure_healthy()?;
        let Some(oid) = self.load_dest(dest)? else {
            return Ok(());
        };
        self.free_published(oid, dest)
    }

    /// Frees `oid`, whose handle the caller holds outside the pool.
    pub fn free_oid(&self, oid: Oid) -> Result<()> {
        self.ensure_healthy()?;
        self.free_published(oid, HandleAt::None)
    }

    fn free_published(&self, oid: Oid, dest: HandleAt) -> Result<()> {
        let Some(f) = self.heap.try_begin_free(oid.offset(), Freeable::NotRoot) else {
            return Err(self.heap.free_error(oid.offset(), Freeable::NotRoot));
        };
        let mut entries = Entries::new();
        self.heap.free_entries(&f, &mut entries);
        self.publish_entries(dest, None, &mut entries);
        match self.commit(&entries) {
            Ok(()) => self.free_done(f),
            Err(e) => {
                self.heap.free_cancel(f);
                Err(e)
            }
        }
    }

    /// Resizes the object whose handle is at `dest` to `size` bytes of type `type_num`:
    /// a new object gets the old contents (up to the smaller size) and replaces the old
    /// one in `dest`, atomically. A null handle allocates; a fitting object (same class
    /// and type) is returned unchanged. The new object is in a built-in size class: an
    /// object of a custom class that does not fit moves out of it (as the size class of
    /// `size` decides, libpmemobj's `pmemobj_realloc` has no class either).
    pub fn realloc(&self, dest: HandleAt, size: u64, type_num: u64) -> Result<Oid> {
        self.ensure_healthy()?;
        let Some(old) = self.load_dest(dest)? else {
            return self.alloc(size, type_num, dest);
        };
        let info = self.heap.object(old.offset())?;
        if info.type_num == ROOT_TYPE || type_num == ROOT_TYPE {
            return Err(PoolError::InvalidArgument {
                what: "object",
                detail: "use root() to resize the root object".into(),
            });
        }
        let fits = match crate::class::unit_for(size) {
            Some(unit) => unit as u64 == info.usable,
            None => crate::class::extent_pages(size) * format::PAGE == info.usable,
        };
        if fits && info.type_num == type_num {
            return Ok(old);
        }
        self.move_object(old, info.usable, size, type_num, dest, &[])
    }

    fn move_object(
        &self,
        old: Oid,
        old_usable: u64,
        size: u64,
        type_num: u64,
        dest: HandleAt,
        extra: &[RedoEntry],
    ) -> Result<Oid> {
        let r = self.reserve(size, type_num)?;
        let f = match self.heap.begin_free(old.offset(), Freeable::NotRoot) {
            Ok(f) => f,
            Err(e) => {
                self.cancel(&r);
                return Err(e);
            }
        };
        let keep = old_usable.min(size);
        let copy = |w: &ObjectWriter<'_, B>| {
            let mut buf = vec![0u8; 64 * 1024];
            let mut done = 0;
            while done < keep {
                let n = (keep - done).min(buf.len() as u64) as usize;
                self.backend.read(old.offset() + done, &mut buf[..n])?;
                w.write(done, &buf[..n])?;
                done += n as u64;
            }
            if w.usable > keep {
                w.fill(keep, w.usable - keep, 0)?;
            }
            Ok(())
        };
        self.finish_move(&r, dest, copy, f, extra)
    }

    /// The root object, at least `size` bytes: allocated zeroed on first request, grown
    /// (contents kept, the rest zeroed) when a larger size is asked for; atomically.
    pub fn root(&self, size: u64) -> Result<Oid> {
        self.ensure_healthy()?;
        let _guard = self.root_lock.lock().unwrap_or_else(|e| e.into_inner());
        let off = self.backend.load_u64(ROOT_OFF_WORD)?;
        let have = self.backend.load_u64(ROOT_SIZE_WORD)?;
        if let Some(oid) = Oid::from_offset(off) {
            if size <= have {
                return Ok(oid);
            }
        }
        if size == 0 {
            return Err(PoolError::InvalidArgument {
                what: "root size",
                detail: "0 bytes".into(),
            });
        }
        // The root words change in the same redo log as the root's allocation.
        let extra = [RedoEntry::set(ROOT_SIZE_WORD, size)];
        match Oid::from_offset(off) {
            None => {
                let r = self.reserve(size, ROOT_TYPE)?;
                let mut extra = extra.to_vec();
                extra.push(RedoEntry::set(ROOT_OFF_WORD, r.off));
                self.finish_alloc(&r, HandleAt::None, |w| w.zero(), None, &extra)
                    .inspect_err(|_| self.cancel(&r))
            }
            Some(old) => {
                let usable = self.heap.object(old.offset())?.usable;
                let r = self.reserve(size, ROOT_TYPE)?;
                let f = match self.heap.begin_free(old.offset(), Freeable::RootToo) {
                    Ok(f) => f,
                    Err(e) => {
                        self.cancel(&r);
                        return Err(e);
                    }
                };
                let mut extra = extra.to_vec();
                extra.push(RedoEntry::set(ROOT_OFF_WORD, r.off));
                let copy = |w: &ObjectWriter<'_, B>| {
                    let mut buf = vec![0u8; have.min(usable) as usize];
                    self.backend.read(old.offset(), &mut buf)?;
                    w.write(0, &buf)?;
                    w.fill(buf.len() as u64, w.usable - buf.len() as u64, 0)
                };
                self.finish_move(&r, HandleAt::None, copy, f, &extra)
            }
        }
    }

    /// The directory object (named roots, kept by `terrace-collections`), if one was
    /// created. See "State block" in `docs/pool-format.md`.
    pub fn directory(&self) -> Result<Option<Oid>> {
        Ok(Oid::from_offset(self.backend.load_u64(DIRECTORY_WORD)?))
    }

    /// Allocates the directory object, initialised by `init`, and sets the directory word
    /// in the same redo log: after a crash both happened or neither. Once only: an
    /// `InvalidArgument` error when the pool already has a directory.
    pub fn create_directory(
        &self,
        size: u64,
        type_num: u64,
        init: impl FnOnce(&ObjectWriter<'_, B>) -> Result<()>,
    ) -> Result<Oid> {
        self.ensure_healthy()?;
        let _guard = self.root_lock.lock().unwrap_or_else(|e| e.into_inner());
        if self.directory()?.is_some() {
            return Err(PoolError::InvalidArgument {
                what: "directory",
                detail: "the pool already has one".into(),
            });
        }
        let r = self.reserve(size, type_num)?;
        let extra = [RedoEntry::set(DIRECTORY_WORD, r.off)];
        self.finish_alloc(&r, HandleAt::None, init, None, &extra)
            .inspect_err(|_| self.cancel(&r))
    }

    /// The root object's requested size (0 if there is none yet).
    pub fn root_size(&self) -> Result<u64> {
        self.backend.load_u64(ROOT_SIZE_WORD)
    }

    /// Usable bytes of a live object (its slot or extent size).
    pub fn usable_size(&self, oid: Oid) -> Result<u64> {
        Ok(self.heap.object(oid.offset())?.usable)
    }

    /// Type number of a live object.
    pub fn type_of(&self, oid: Oid) -> Result<u64> {
        Ok(self.heap.object(oid.offset())?.type_num)
    }

    /// The pool offset of `[offset, offset+len)` inside object `oid`, bounds-checked
    /// against its usable size.
    pub(crate) fn object_range(&self, oid: Oid, offset: u64, len: u64) -> Result<u64> {
        let usable = self.usable_size(oid)?;
        match offset.checked_add(len) {
            Some(end) if end <= usable => Ok(oid.offset() + offset),
            _ => Err(PoolError::OutOfBounds {
                offset,
                len,
                what: "the object",
                limit: usable,
            }),
        }
    }

    /// Reads object bytes (bounds-checked against the object's size).
    pub fn read(&self, oid: Oid, offset: u64, buf: &mut [u8]) -> Result<()> {
        let at = self.object_range(oid, offset, buf.len() as u64)?;
        self.backend.read(at, buf)
    }

    /// Writes object bytes without persisting them ("raw" mode: call [`Pool::persist`]).
    pub fn write(&self, oid: Oid, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.object_range(oid, offset, data.len() as u64)?;
        self.backend.write(at, data)
    }

    /// Writes object bytes and persists them ("durable" mode).
    pub fn write_durable(&self, oid: Oid, offset: u64, data: &[u8]) -> Result<()> {
        self.write(oid, offset, data)?;
        self.persist(oid, offset, data.len() as u64)
    }

    /// Persists a range of an object.
    pub fn persist(&self, oid: Oid, offset: u64, len: u64) -> Result<()> {
        let at = self.object_range(oid, offset, len)?;
        self.backend.persist(at, len)
    }

    /// Reads the u64 at `offset` inside an object.
    pub fn read_u64(&self, oid: Oid, offset: u64) -> Result<u64> {
        let mut b = [0u8; 8];
        self.read(oid, offset, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// The address of an object in this process (`pmemobj_direct`); `None` on simulated
    /// backends. Valid while the pool is open.
    pub fn direct(&self, oid: Oid) -> Option<NonNull<u8>> {
        self.backend.address(oid.offset())
    }

    /// Every durably allocated object of type `type_num` (or of every type except the
    /// root's, for `None`), in address order, read from the page descriptors.
    pub fn objects(&self, type_num: Option<u64>) -> Result<Vec<Object>> {
        let (spans, _) = heap::scan(&self.backend, &self.geo, &self.heap.class_table())?;
        let mut out = Vec::new();
        for s in spans {
            let wanted = match type_num {
                Some(t) => s.type_num == t,
                None => s.type_num != ROOT_TYPE,
            };
            if !wanted {
                continue;
            }
            let base = self.geo.page_addr(s.head as u64);
            let class = ClassId::new(s.class as u32).ok();
            if s.kind == KIND_RUN {
                for (w, &word) in s.bits.iter().enumerate() {
                    let mut word = word;
                    while word != 0 {
                        let idx = w as u64 * 64 + word.trailing_zeros() as u64;
                        word &= word - 1;
                        if let Some(oid) = Oid::from_offset(base + idx * s.unit as u64) {
                            out.push(Object {
                                oid,
                                type_num: s.type_num,
                                usable: s.unit as u64,
                                class,
                            });
                        }
                    }
                }
            } else if let Some(oid) = Oid::from_offset(base) {
                out.push(Object {
                    oid,
                    type_num: s.type_num,
                    usable: s.pages as u64 * format::PAGE,
                    class: None,
                });
            }
        }
        Ok(out)
    }

    /// Verifies every invariant of the pool: header, idle lanes, the class table, page
    /// descriptors (against the class table), the root, and that the volatile heap agrees
    /// with the medium. Call with no operation or transaction in flight. The first
    /// violation is returned as `Corrupt`.
    pub fn check(&self) -> Result<CheckReport> {
        let mut head = vec![0u8; HEADER_LEN as usize];
        self.backend.read(0, &mut head)?;
        let header = PoolHeader::decode(&head)?;
        if header != self.header {
            return Err(corrupt("header changed since open", 0));
        }
        for l in 0..self.geo.lane_count {
            let off = self.geo.lane_off(l);
            if self.backend.load_u64(off)? != 0 {
                return Err(corrupt(format!("lane {l} has a pending redo log"), off));
            }
            let undo = log::undo_state_off(off);
            if self.backend.load_u64(undo)? & 1 != 0 {
                return Err(corrupt(format!("lane {l} has an active undo log"), undo));
            }
        }
        let classes = read_class_table(&self.backend, self.header.version)?;
        for id in ClassId::all() {
            let (durable, volatile) = (classes[id.get() as usize], self.heap.class_entry(id));
            if durable != volatile {
                return Err(corrupt(
                    format!(
                        "class table entry {id} is {durable:?} on the medium, {volatile:?} in memory"
                    ),
                    format::class_entry_off(id.get()),
                ));
            }
        }
        let (spans, free_pages) = heap::scan(&self.backend, &self.geo, &classes)?;
        let mut report = CheckReport {
            free_pages,
            classes: classes.iter().flatten().count() as u64,
            ..CheckReport::default()
        };
        let root_off = self.backend.load_u64(ROOT_OFF_WORD)?;
        let root_size = self.backend.load_u64(ROOT_SIZE_WORD)?;
        let mut root_found = root_off == 0;
        for s in &spans {
            let base = self.geo.page_addr(s.head as u64);
            if s.kind == KIND_RUN {
                report.runs += 1;
                report.custom_runs += (s.class != 0) as u64;
                let n: u64 = s.bits.iter().map(|w| w.count_ones() as u64).sum();
                report.objects += n;
                report.allocated_bytes += n * s.unit as u64;
                if root_off >= base && root_off < base + s.pages as u64 * format::PAGE {
                    let rel = root_off - base;
                    let idx = rel / s.unit as u64;
                    root_found = rel.is_multiple_of(s.unit as u64)
                        && s.bits[idx as usize / 64] & (1 << (idx % 64)) != 0
                        && s.type_num == ROOT_TYPE
                        && root_size <= s.unit as u64;
                }
            } else {
                report.extents += 1;
                report.objects += 1;
                report.allocated_bytes += s.pages as u64 * format::PAGE;
                if root_off == base {
                    root_found =
                        s.type_num == ROOT_TYPE && root_size <= s.pages as u64 * format::PAGE;
                }
            }
            if s.type_num == ROOT_TYPE
                && (root_off < base || root_off >= base + s.pages as u64 * format::PAGE)
            {
                let live = s.kind != KIND_RUN || s.bits.iter().any(|&w| w != 0);
                if live {
                    return Err(corrupt(
                        format!("a root-typed object at page {} is not the root", s.head),
                        self.geo.meta(s.head as u64),
                    ));
                }
            }
        }
        if !root_found {
            return Err(corrupt(
                format!("root {root_off:#x} ({root_size} bytes) is not a live root object"),
                ROOT_OFF_WORD,
            ));
        }
        let dir_off = self.backend.load_u64(DIRECTORY_WORD)?;
        if dir_off != 0 && self.heap.object(dir_off).is_err() {
            return Err(corrupt(
                format!("directory {dir_off:#x} is not a live object"),
                DIRECTORY_WORD,
            ));
        }
        self.heap
            .verify_against(&spans, free_pages)
            .map_err(|what| {
                corrupt(
                    format!("volatile heap disagrees: {what}"),
                    self.geo.meta_off,
                )
            })?;
        Ok(report)
    }
}

/// Bounded writes into an object being initialised (before it is published); the
/// written range is persisted before the allocation commits.
pub struct ObjectWriter<'p, B: Backend> {
    pool: &'p Pool<B>,
    off: u64,
    usable: u64,
    /// The written range `[dirty_start, dirty_end)` (empty while start >= end).
    dirty_start: AtomicU64,
    dirty_end: AtomicU64,
}

impl<B: Backend> ObjectWriter<'_, B> {
    /// Usable bytes of the object.
    pub fn usable(&self) -> u64 {
        self.usable
    }

    /// The object's handle.
    pub fn oid(&self) -> Option<Oid> {
        Oid::from_offset(self.off)
    }

    fn range(&self, offset: u64, len: u64) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.usable => {
                self.dirty_start.fetch_min(offset, Ordering::Relaxed);
                self.dirty_end.fetch_max(end, Ordering::Relaxed);
                Ok(self.off + offset)
            }
            _ => Err(PoolError::OutOfBounds {
                offset,
                len,
                what: "the object",
                limit: self.usable,
            }),
        }
    }

    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let at = self.range(offset, data.len() as u64)?;
        self.pool.backend.write(at, data)
    }

    pub fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<()> {
        let at = self.range(offset, len)?;
        self.pool.backend.fill(at, len, byte)
    }

    pub fn zero(&self) -> Result<()> {
        self.fill(0, self.usable, 0)
    }

    fn persist(&self) -> Result<()> {
        let (s, e) = (
            self.dirty_start.load(Ordering::Relaxed),
            self.dirty_end.load(Ordering::Relaxed),
        );
        if e > s {
            self.pool.backend.persist(self.off + s, e - s)
        } else {
            Ok(())
        }
    }
}

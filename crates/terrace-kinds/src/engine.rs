//! The allocation engine: jemalloc, bound to a kind's [`Space`](crate::space::Space)
//! through extent hooks — the way memkind itself works, minus its limits.
//!
//! # Why jemalloc
//! The kinds layer must not hand-write a general-purpose malloc. Of the proven engines,
//! jemalloc (5.3, built from source by `tikv-jemalloc-sys`, symbols prefixed so the
//! process's own malloc is untouched) fits best:
//! - *extent hooks* call back whenever an arena needs more memory, asks to commit a range
//!   or offers to purge one. That is exactly where a file kind must reserve file blocks
//!   (`fallocate` on commit, in large chunks) so a full file system becomes an allocation
//!   failure instead of `SIGBUS`; mimalloc's arena API instead takes a whole pre-committed
//!   range up front, which on tmpfs means paying for the kind's maximum size at creation;
//! - up to 4,095 arenas (mimalloc 2 manages about a hundred), each with its own hooks;
//! - explicit thread caches (`tcache.create`) make the fast path a few nanoseconds.
//!
//! # One explicit tcache per (thread, kind)
//! jemalloc's implicit thread cache is shared by all arenas: an object freed into it could
//! be handed out again by a `mallocx` naming another arena, i.e. from the wrong medium. So
//! every kind uses explicit caches, one per thread that touches it ([`crate::tcache`]), and
//! every free goes to the cache of the object's own kind (found through the registry).
//!
//! # Hooks
//! Each kind slot embeds its `extent_hooks_t` as its first field, so a hook finds its slot
//! from the hooks pointer alone (also during `arenas.create`, before the arena index is
//! known). Hooks run under the slot's space lock (its place in the lock order:
//! `docs/concurrency.md`, "terrace-kinds").
//! - `alloc`: bump address space from the space, always committed (file blocks
//!   reserved); a full file system fails the allocation; a request for a given address
//!   (in-place growth) succeeds only at the space's bump end;
//! - `commit`: nothing to do (everything handed out is committed);
//! - `decommit`: refused (memory stays committed and is reused);
//! - `purge_forced`: `MADV_DONTNEED` on anonymous memory, hole punching on files only
//!   when the kind asked for it, otherwise refused;
//! - `purge_lazy`: the same, except on files without hole punching, where it succeeds and
//!   keeps the contents (see [`create_arena`] for why);
//! - `dalloc`: refused (jemalloc keeps the range as "retained" and reuses it);
//! - `destroy`: nothing — the space unmaps its regions when the kind is destroyed;
//! - `split`/`merge`: always allowed (a kind's space is contiguous per region).
//!
//! A hook is called from C, so no panic may leave it: the hooks that run code do so under
//! [`terrace_media::ffi::boundary`], a panic becoming the hook's failure value (jemalloc
//! handles those as it handles a full medium); the others only return a constant.

use std::ffi::{c_int, c_uint, c_void, CString};
use std::ptr;

use terrace_media::ffi;
use tikv_jemalloc_sys as je;

use crate::error::{KindError, Result};
use crate::slots::Slot;
use crate::space::Space;

/// jemalloc's start-up options (its weak `malloc_conf` symbol, prefixed as the crate
/// builds it):
/// - `lg_extent_max_active_fit:48` — by default jemalloc refuses to carve a request from
///   a free extent more than 64× its size. Kinds never give memory back (decay is off
///   unless hole punching is asked for), so freed slabs coalesce into large free extents;
///   with the default those are never reused for smaller requests and a file kind would
///   reserve fresh file blocks instead. 48 is "no limit" (64 would be an undefined shift
///   in jemalloc).
/// - `slab_sizes:1-4096:16` — slabs of 64 KiB for size classes up to 4 KiB (jemalloc's
///   default is 1–4 pages). Every slab is an extent taken from and returned to the kind's
///   space; with the eager coalescing kinds rely on (see [`create_arena`]) small slabs
///   make that traffic the dominant cost of a malloc. Tail waste is under 2% per slab for
///   every class up to 4 KiB.
/// - `retain:false` — with `retain` (jemalloc's Linux default) every range the alloc hook
///   returns becomes a "head" extent that never merges with its neighbours, and jemalloc
///   grows by geometric steps whose leftovers are then stranded. Kinds never unmap anyway
///   (the dalloc hook refuses), so without `retain` the hook is asked for exactly what is
///   needed, successive ranges are contiguous, and they merge.
///
/// What each option changed when it was chosen: `docs/experiments.md`, "terrace-kinds".
#[used]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: ConfString =
    ConfString(c"retain:false,lg_extent_max_active_fit:48,slab_sizes:1-4096:16".as_ptr());

#[repr(transparent)]
struct ConfString(*const std::ffi::c_char);
// SAFETY: points at an immutable static C string.
unsafe impl Sync for ConfString {}

/// Reads a jemalloc control value.
pub(crate) fn read<T: Copy + Default>(name: &str) -> Result<T> {
    let cname = CString::new(name).map_err(|_| engine_err(name, libc::EINVAL))?;
    let mut value = T::default();
    let mut len = std::mem::size_of::<T>();
    // SAFETY: value/len describe a writable buffer of exactly size_of::<T>() bytes and T is
    // plain data of the type jemalloc documents for `name` (callers pick T accordingly).
    let rc = unsafe {
        je::mallctl(
            cname.as_ptr(),
            (&mut value as *mut T).cast(),
            &mut len,
            ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        return Err(engine_err(name, rc));
    }
    Ok(value)
}

/// Writes a jemalloc control value.
pub(crate) fn write<T: Copy>(name: &str, mut value: T) -> Result<()> {
    let cname = CString::new(name).map_err(|_| engine_err(name, libc::EINVAL))?;
    // SAFETY: value is a readable T of the type jemalloc documents for `name`.
    let rc = unsafe {
        je::mallctl(
            cname.as_ptr(),
            ptr::null_mut(),
            ptr::null_mut(),
            (&mut value as *mut T).cast(),
            std::mem::size_of::<T>(),
        )
    };
    if rc != 0 {
        return Err(engine_err(name, rc));
    }
    Ok(())
}

/// Runs a jemalloc control that takes no value (e.g. `arena.<i>.destroy`).
pub(crate) fn run(name: &str) -> Result<()> {
    let cname = CString::new(name).map_err(|_| engine_err(name, libc::EINVAL))?;
    // SAFETY: no buffers are passed.
    let rc = unsafe {
        je::mallctl(
            cname.as_ptr(),
            ptr::null_mut(),
            ptr::null_mut(),
            ptr::null_mut(),
            0,
        )
    };
    if rc != 0 {
        return Err(engine_err(name, rc));
    }
    Ok(())
}

fn engine_err(what: &str, code: c_int) -> KindError {
    KindError::Engine {
        what: what.to_string(),
        code,
    }
}

/// Dirty-page decay of arenas that never give memory back (see [`create_arena`]).
const DIRTY_DECAY_MS: isize = 1000;

/// What an arena does with memory its objects no longer use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FreedMemory {
    /// Purged through the hooks (given back to the space) as jemalloc's decay decides.
    Purged,
    /// Kept, contents and file blocks alike, for reuse (file kinds without hole punching).
    Kept,
}

/// Creates an arena whose memory comes from `slot`'s space through its hooks.
pub(crate) fn create_arena(slot: &'static Slot, freed: FreedMemory) -> Result<u32> {
    let mut arena: c_uint = 0;
    let mut len = std::mem::size_of::<c_uint>();
    let mut hooks = slot.hooks_ptr();
    // SAFETY: arena/len describe a writable c_uint; the new value is a pointer to the
    // slot's hooks, which live in a static for the rest of the process.
    let rc = unsafe {
        je::mallctl(
            c"arenas.create".as_ptr(),
            (&mut arena as *mut c_uint).cast(),
            &mut len,
            (&mut hooks as *mut *mut je::extent_hooks_t).cast(),
            std::mem::size_of::<*mut je::extent_hooks_t>(),
        )
    };
    match rc {
        0 => {}
        libc::EAGAIN | libc::EFAULT => {
            return Err(KindError::TooManyKinds {
                why: "jemalloc arena limit reached",
            })
        }
        libc::ENOMEM => {
            return Err(KindError::OutOfMemory {
                kind: "new kind".into(),
                size: 0,
            })
        }
        code => return Err(engine_err("arenas.create", code)),
    }
    if freed == FreedMemory::Kept {
        // Memory is never given back. Freed extents decay from "dirty" to "muzzy" within
        // about a second (the lazy purge hook keeps the contents and succeeds): jemalloc
        // coalesces muzzy extents eagerly, but dirty extents smaller than 16 KiB only while
        // purging, and without any decay such fragments are never reused for larger
        // requests — the kind would reserve fresh file blocks instead. A decay of 0 is
        // worse: jemalloc then purges "fully", to retained extents that never merge across
        // growth steps. With 64 KiB slabs (see MALLOC_CONF) most extents are large and
        // coalesce eagerly anyway, so the decay can be slow enough to stay off the hot
        // path (`docs/experiments.md`, "terrace-kinds"). Muzzy extents are never
        // force-purged.
        write(&format!("arena.{arena}.dirty_decay_ms"), DIRTY_DECAY_MS)?;
        write(&format!("arena.{arena}.muzzy_decay_ms"), -1isize)?;
    }
    Ok(arena)
}

/// Destroys an arena and every allocation in it. All explicit caches that hold its objects
/// must have been destroyed first.
pub(crate) fn destroy_arena(arena: u32) -> Result<()> {
    run(&format!("arena.{arena}.destroy"))
}

/// Creates an explicit thread cache; `None` when jemalloc has no more.
pub(crate) fn tcache_create() -> Option<u32> {
    read::<c_uint>("tcache.create").ok()
}

/// Returns the objects held by an explicit thread cache to their arenas.
pub(crate) fn tcache_flush(tcache: u32) {
    let _ = write("tcache.flush", tcache as c_uint);
}

/// Flushes and destroys an explicit thread cache.
pub(crate) fn tcache_destroy(tcache: u32) {
    let _ = write("tcache.destroy", tcache as c_uint);
}

/// Refreshes jemalloc's statistics snapshot.
pub(crate) fn refresh_stats() {
    let _ = write("epoch", 1u64);
}

/// The hooks every kind arena uses; the slot is found from the hooks pointer.
pub(crate) const HOOKS: je::extent_hooks_t = je::extent_hooks_t {
    alloc: Some(hook_alloc),
    dalloc: Some(hook_dalloc),
    destroy: Some(hook_destroy),
    commit: Some(hook_commit),
    decommit: Some(hook_decommit),
    purge_lazy: Some(hook_purge_lazy),
    purge_forced: Some(hook_purge_forced),
    split: Some(hook_split),
    merge: Some(hook_merge),
};

/// # Safety
/// `hooks` must be a pointer handed to jemalloc by [`create_arena`].
unsafe fn slot_of(hooks: *mut je::extent_hooks_t) -> &'static Slot {
    // SAFETY: per the contract, hooks points at the first field of a static Slot (repr(C)).
    unsafe { Slot::from_hooks(hooks) }
}

/// Runs `f` on the space behind `hooks` (under its lock), or returns `absent` when the
/// slot has none (a kind being torn down).
///
/// # Safety
/// `hooks` must be a pointer handed to jemalloc by [`create_arena`].
unsafe fn with_space<R>(
    hooks: *mut je::extent_hooks_t,
    absent: R,
    f: impl FnOnce(&mut Space) -> R,
) -> R {
    // SAFETY: forwarded contract.
    let slot = unsafe { slot_of(hooks) };
    let mut space = slot.lock_space();
    match space.as_mut() {
        Some(space) => f(space),
        None => absent,
    }
}

unsafe extern "C" fn hook_alloc(
    hooks: *mut je::extent_hooks_t,
    new_addr: *mut c_void,
    size: usize,
    alignment: usize,
    zero: *mut bool,
    commit: *mut bool,
    _arena: c_uint,
) -> *mut c_void {
    // A panic is a failed allocation (NULL): jemalloc reports it as out of memory.
    ffi::boundary(ptr::null_mut(), || {
        // Always hand out committed (reserved) memory: jemalloc never coalesces extents whose
        // commit state differs, so a mix of committed and uncommitted extents fragments the
        // kind and makes it reserve fresh blocks instead of reusing freed ones. jemalloc asks
        // for exactly what it needs (no `retain`), so nothing is reserved beyond use except
        // the space's own headroom.
        // SAFETY: jemalloc calls hooks with the pointer given at arena creation.
        let handed = unsafe {
            with_space(hooks, None, |space| {
                // jemalloc names an address only to grow a block in place: possible exactly
                // when the block ends where the space's never-used part begins.
                if new_addr.is_null() {
                    space.alloc(size, alignment)
                } else {
                    space.alloc_at(new_addr.cast(), size)
                }
            })
        };
        match handed {
            Some(addr) => {
                // SAFETY: valid out-pointers (jemalloc's contract). Fresh space is zero-filled
                // and committed.
                unsafe {
                    *zero = true;
                    *commit = true;
                }
                addr.cast()
            }
            None => ptr::null_mut(),
        }
    })
}

unsafe extern "C" fn hook_commit(
    _hooks: *mut je::extent_hooks_t,
    _addr: *mut c_void,
    _size: usize,
    _offset: usize,
    _length: usize,
    _arena: c_uint,
) -> bool {
    // Everything handed out is committed and decommitting is refused, so jemalloc only
    // asks to commit committed memory: success.
    false
}

unsafe extern "C" fn hook_purge_forced(
    hooks: *mut je::extent_hooks_t,
    addr: *mut c_void,
    _size: usize,
    offset: usize,
    length: usize,
    _arena: c_uint,
) -> bool {
    // A panic is "not purged" (true): jemalloc keeps the pages as they are.
    ffi::boundary(true, || {
        let at = addr.cast::<u8>().wrapping_add(offset);
        // SAFETY: jemalloc calls hooks with the pointer given at arena creation. jemalloc's
        // convention: false = purged.
        !unsafe { with_space(hooks, false, |space| space.purge(at, length)) }
    })
}

unsafe extern "C" fn hook_purge_lazy(
    hooks: *mut je::extent_hooks_t,
    addr: *mut c_void,
    _size: usize,
    offset: usize,
    length: usize,
    _arena: c_uint,
) -> bool {
    // A panic is "not purged" (true): jemalloc keeps the pages as they are.
    ffi::boundary(true, || {
        let at = addr.cast::<u8>().wrapping_add(offset);
        // SAFETY: as in hook_purge_forced.
        !unsafe { with_space(hooks, false, |space| space.purge_lazy(at, length)) }
    })
}

unsafe extern "C" fn hook_dalloc(
    _hooks: *mut je::extent_hooks_t,
    _addr: *mut c_void,
    _size: usize,
    _committed: bool,
    _arena: c_uint,
) -> bool {
    true
}

unsafe extern "C" fn hook_destroy(
    _hooks: *mut je::extent_hooks_t,
    _addr: *mut c_void,
    _size: usize,
    _committed: bool,
    _arena: c_uint,
) {
}

unsafe extern "C" fn hook_decommit(
    _hooks: *mut je::extent_hooks_t,
    _addr: *mut c_void,
    _size: usize,
    _offset: usize,
    _length: usize,
    _arena: c_uint,
) -> bool {
    true
}

unsafe extern "C" fn hook_split(
    _hooks: *mut je::extent_hooks_t,
    _addr: *mut c_void,
    _size: usize,
    _size_a: usize,
    _size_b: usize,
    _committed: bool,
    _arena: c_uint,
) -> bool {
    false
}

unsafe extern "C" fn hook_merge(
    _hooks: *mut je::extent_hooks_t,
    _addr_a: *mut c_void,
    _size_a: usize,
    _addr_b: *mut c_void,
    _size_b: usize,
    _committed: bool,
    _arena: c_uint,
) -> bool {
    false
}

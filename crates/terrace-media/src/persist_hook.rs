//! Test support for crash-image tests: a function, installed once per process, that every
//! [`Region::persist`](crate::Region::persist) of a file-backed region calls — at every
//! durability, before it makes the range durable — with the file's path, the offset and
//! the bytes persisted. A test keeps a shadow of each file's durable image from it: the
//! bytes as they were at each persist, and nothing stored since that was not persisted,
//! which is what a power loss just after that persist would leave. None is installed in
//! production; each persist then pays one atomic load.
//!
//! The bytes are read from the mapping one atomic byte load at a time (other threads may
//! store into the region meanwhile; a test that wants exact images persists from one
//! thread).

use std::path::Path;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// What a hook is given: the region's file, the offset in it, the bytes persisted.
pub type Hook = fn(&Path, usize, &[u8]);

static HOOK: OnceLock<Hook> = OnceLock::new();

/// Installs `hook` for the rest of the process; false if one was installed already (it
/// stays). A hook that records only some threads' persists keeps its state
/// thread-local.
pub fn install(hook: Hook) -> bool {
    HOOK.set(hook).is_ok()
}

/// Calls the hook, if one is installed, with the `len` bytes at `ptr` (offset `offset` of
/// `path`).
///
/// # Safety
/// `ptr..ptr + len` must be inside a live mapping for the whole call.
pub(crate) unsafe fn call(path: &Path, offset: usize, ptr: *const u8, len: usize) {
    let Some(hook) = HOOK.get() else {
        return;
    };
    let bytes: Vec<u8> = (0..len)
        .map(|i| {
            // SAFETY: inside the live mapping (the caller's contract); other threads may
            // store to these bytes, so they are read atomically.
            unsafe { AtomicU8::from_ptr(ptr.add(i).cast_mut()) }.load(Ordering::Relaxed)
        })
        .collect();
    hook(path, offset, &bytes);
}

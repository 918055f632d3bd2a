//! Making stores durable: cache-line flush instructions for DAX mappings, chosen once at
//! run time from CPUID (`clwb` > `clflushopt` > `clflush`), and the fence that orders them.
//!
//! Invariant: after [`flush_range`] followed by [`drain`], every cache line overlapping the
//! range has been written back to the memory controller (the persistence domain on ADR
//! platforms). Non-DAX files use `msync` instead, through [`crate::Region::persist`].

use std::cell::Cell;
use std::sync::OnceLock;

/// Size of a CPU cache line, the unit of flushing.
pub const CACHE_LINE: usize = 64;

/// The cache-line write-back instruction this CPU offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlushInstruction {
    /// Write back without evicting (best: the line stays cached).
    Clwb,
    /// Optimised flush: evicts, but flushes run in parallel.
    ClflushOpt,
    /// Legacy serialising flush.
    Clflush,
    /// No flush instruction (not x86-64): fall back to a full fence only.
    None,
}

/// The best flush instruction available, detected once.
pub fn flush_instruction() -> FlushInstruction {
    static DETECTED: OnceLock<FlushInstruction> = OnceLock::new();
    *DETECTED.get_or_init(detect)
}

// The cpuid intrinsics are `unsafe fn`s at the workspace's rust-version and safe in newer
// Rust: the blocks keep the rust-version building, and newer compilers find them unused.
#[cfg(target_arch = "x86_64")]
#[allow(unused_unsafe)]
fn detect() -> FlushInstruction {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // SAFETY: cpuid exists on every x86-64 CPU; leaf 0 reads no memory.
    let max_leaf = unsafe { __cpuid(0) }.eax;
    if max_leaf >= 7 {
        // SAFETY: as above; leaf 7 exists (the maximum leaf was checked).
        let leaf7 = unsafe { __cpuid_count(7, 0) };
        if leaf7.ebx & (1 << 24) != 0 {
            return FlushInstruction::Clwb;
        }
        if leaf7.ebx & (1 << 23) != 0 {
            return FlushInstruction::ClflushOpt;
        }
    }
    FlushInstruction::Clflush
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> FlushInstruction {
    FlushInstruction::None
}

/// How the calling thread has made stores durable so far: cache lines flushed by
/// [`flush_range`] and `msync` calls made by [`crate::Region::persist`] and
/// [`crate::Region::sync`]. Per thread, so that counting costs no shared cache line; tests
/// read it to prove which persist path a region took (DAX flushes, not `msync`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PersistCounts {
    /// Cache lines written back with the [`FlushInstruction`] in use.
    pub flushed_lines: u64,
    /// `msync` calls on disk-backed file mappings.
    pub msyncs: u64,
}

thread_local! {
    static COUNTS: Cell<PersistCounts> = const {
        Cell::new(PersistCounts { flushed_lines: 0, msyncs: 0 })
    };
}

/// The calling thread's [`PersistCounts`].
pub fn thread_counts() -> PersistCounts {
    COUNTS.with(Cell::get)
}

pub(crate) fn count_msync() {
    COUNTS.with(|c| {
        let mut counts = c.get();
        counts.msyncs += 1;
        c.set(counts);
    });
}

/// Writes back every cache line overlapping `[addr, addr+len)`. Follow with [`drain`].
///
/// Flushing is harmless on any readable memory, DAX or not; it only guarantees durability
/// on a DAX mapping made with `MAP_SYNC`.
pub fn flush_range(addr: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let instr = flush_instruction();
    let mut line = addr as usize & !(CACHE_LINE - 1);
    let end = addr as usize + len;
    let mut lines = 0;
    while line < end {
        flush_line(instr, line as *const u8);
        line += CACHE_LINE;
        lines += 1;
    }
    COUNTS.with(|c| {
        let mut counts = c.get();
        counts.flushed_lines += lines;
        c.set(counts);
    });
}

#[cfg(target_arch = "x86_64")]
fn flush_line(instr: FlushInstruction, line: *const u8) {
    // The instruction chosen was reported by CPUID; flushes have no effect on
    // Rust-visible state.
    // SAFETY: the flush instructions take any address and never fault on mapped memory.
    unsafe {
        match instr {
            FlushInstruction::Clwb => {
                std::arch::asm!("clwb [{0}]", in(reg) line, options(nostack, preserves_flags))
            }
            FlushInstruction::ClflushOpt => {
                std::arch::asm!("clflushopt [{0}]", in(reg) line, options(nostack, preserves_flags))
            }
            FlushInstruction::Clflush | FlushInstruction::None => {
                std::arch::x86_64::_mm_clflush(line)
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn flush_line(_instr: FlushInstruction, _line: *const u8) {}

/// Orders earlier flushes before later stores (`sfence` on x86-64).
pub fn drain() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: sfence has no preconditions.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
    #[cfg(not(target_arch = "x86_64"))]
    std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_is_stable_and_flush_is_harmless() {
        let first = flush_instruction();
        assert_eq!(first, flush_instruction());
        let data = vec![7u8; 1000];
        let before = thread_counts();
        flush_range(data.as_ptr().wrapping_add(3), 997);
        drain();
        assert!(data.iter().all(|&b| b == 7));
        // 3..1000 spans the lines of bytes 0..1023 relative to an aligned start, or one
        // more when the vector is not line-aligned.
        let lines = thread_counts().flushed_lines - before.flushed_lines;
        assert!((16..=17).contains(&lines), "{lines} lines flushed");
        assert_eq!(thread_counts().msyncs, before.msyncs);
    }
}

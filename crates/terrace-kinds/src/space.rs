//! Space: the address ranges one kind's engine arena draws memory from, and the policy of
//! growing them.
//!
//! - DRAM and NUMA spaces grow by mapping further regions of at least [`DRAM_CHUNK`]
//!   (address space only: pages are committed by the kernel on first touch).
//! - A file space is one region of the kind's maximum size, mapped at creation. Address
//!   space is handed to the engine by bumping an offset; *file blocks* are reserved
//!   (`fallocate`) only when the engine commits a range, in chunks (see [`MAX_RESERVE_CHUNK`]), so a
//!   full file system surfaces as a failed commit (an allocation returning NULL), never as
//!   `SIGBUS` at first touch, and the cost of reserving is paid once per chunk rather than
//!   once per object.
//!
//! Invariants:
//! - every byte handed out lies in a region registered under the kind's tag;
//! - in a file space, every committed byte lies in a reserved chunk;
//! - `handed_out <= capacity`.

use std::num::NonZeroU32;

use terrace_media::{FileOptions, MediumKind, Region};

use crate::error::Result;

/// Minimum address-space step of DRAM and NUMA spaces.
pub const DRAM_CHUNK: usize = 1 << 30;
/// File blocks are reserved in chunks of a sixteenth of the file, clamped to
/// `[MIN_RESERVE_CHUNK, MAX_RESERVE_CHUNK]` (the last chunk may be shorter): large steps
/// amortise the `fallocate` calls, and small kinds do not reserve far beyond their use.
pub const MAX_RESERVE_CHUNK: usize = 64 << 20;
/// See [`MAX_RESERVE_CHUNK`].
pub const MIN_RESERVE_CHUNK: usize = 2 << 20;

fn reserve_chunk_for(len: usize) -> usize {
    (len / 16).clamp(MIN_RESERVE_CHUNK, MAX_RESERVE_CHUNK).next_power_of_two()
}

/// The medium a space lives on.
#[derive(Clone, Debug)]
pub enum SpaceMedium {
    Dram { huge_pages: bool },
    Numa { node: u32 },
    File(FileOptions),
}

struct Piece {
    region: Region,
    /// Offset of the first byte never handed out.
    bump: usize,
    /// Reservation chunk size of this piece (a power of two).
    chunk: usize,
    /// One bit per chunk: set when its blocks are reserved (file spaces only).
    reserved: Vec<u64>,
}

/// See the module docs.
pub struct Space {
    medium: SpaceMedium,
    tag: NonZeroU32,
    pieces: Vec<Piece>,
    capacity: usize,
    handed_out: usize,
}

impl Space {
    /// Creates a space and maps its first region, so a bad directory, a missing node or a
    /// too-large file surfaces here rather than at the first allocation.
    pub fn new(medium: SpaceMedium, capacity: usize, tag: NonZeroU32) -> Result<Space> {
        let mut space = Space { medium, tag, pieces: Vec::new(), capacity, handed_out: 0 };
        let first = match &space.medium {
            SpaceMedium::File(options) => options.size,
            _ => DRAM_CHUNK.min(capacity),
        };
        space.map_piece(first)?;
        if let SpaceMedium::File(_) = space.medium {
            space.capacity = space.pieces[0].region.len();
        }
        Ok(space)
    }

    fn map_piece(&mut self, size: usize) -> Result<()> {
        let mut region = match &self.medium {
            SpaceMedium::Dram { huge_pages } => Region::dram(size, *huge_pages)?,
            SpaceMedium::Numa { node } => Region::numa(*node, size)?,
            SpaceMedium::File(options) => Region::file(options)?,
        };
        region.register(self.tag)?;
        let chunk = reserve_chunk_for(region.len());
        let chunks = region.len().div_ceil(chunk);
        let reserved = if region.medium() == MediumKind::File {
            vec![0u64; chunks.div_ceil(64)]
        } else {
            Vec::new()
        };
        self.pieces.push(Piece { region, bump: 0, chunk, reserved });
        Ok(())
    }

    /// The most bytes this space will hand out.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// File bytes reserved with `fallocate` (0 for anonymous spaces).
    pub fn reserved_bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.region.reserved_bytes()).sum()
    }

    /// The medium of this space's regions.
    pub fn medium(&self) -> &SpaceMedium {
        &self.medium
    }

    /// The regions of this space (for diagnostics and durability queries).
    pub fn regions(&self) -> impl Iterator<Item = &Region> {
        self.pieces.iter().map(|p| &p.region)
    }

    /// Hands out `size` bytes aligned to `align` (both multiples of the page size). With
    /// `commit` the range is usable on return (file blocks reserved); without, the engine
    /// will call [`commit`](Self::commit) before using it. Returns the address and whether
    /// the memory is known to be zero, or `None` when the space is exhausted (or the file
    /// system is full).
    pub fn alloc(&mut self, size: usize, align: usize, commit: bool) -> Option<(*mut u8, bool)> {
        let align = align.max(1);
        if !align.is_power_of_two() || size == 0 {
            return None;
        }
        let (index, offset) = match self.fit(size, align) {
            Some(found) => found,
            None => {
                if matches!(self.medium, SpaceMedium::File(_)) {
                    return None;
                }
                let remaining = self.capacity.checked_sub(self.handed_out)?;
                let want = size.checked_add(align)?.max(DRAM_CHUNK).min(remaining);
                if want < size {
                    return None;
                }
                self.map_piece(want).ok()?;
                self.fit(size, align)?
            }
        };
        let piece = &mut self.pieces[index];
        let skipped = offset - piece.bump;
        if commit && !reserve_chunks(piece, offset, size) {
            return None;
        }
        piece.bump = offset + size;
        self.handed_out += skipped + size;
        // SAFETY: offset + size <= region length (checked by `fit`).
        let addr = unsafe { piece.region.base().as_ptr().add(offset) };
        Some((addr, true))
    }

    /// The piece and offset where `size` bytes aligned to `align` fit in the current piece.
    fn fit(&self, size: usize, align: usize) -> Option<(usize, usize)> {
        let index = self.pieces.len().checked_sub(1)?;
        let piece = &self.pieces[index];
        let base = piece.region.base().as_ptr() as usize;
        let start = (base + piece.bump).checked_add(align - 1)? & !(align - 1);
        let offset = start - base;
        let end = offset.checked_add(size)?;
        let grows_by = end - piece.bump;
        if end > piece.region.len() || self.handed_out + grows_by > self.capacity {
            return None;
        }
        Some((index, offset))
    }

    fn piece_of(&self, addr: *mut u8, len: usize) -> Option<(usize, usize)> {
        let at = addr as usize;
        self.pieces.iter().enumerate().find_map(|(i, p)| {
            let base = p.region.base().as_ptr() as usize;
            (at >= base && at + len <= base + p.region.len()).then_some((i, at - base))
        })
    }

    /// Makes `[addr, addr+len)` usable: reserves file blocks for it. False on failure (full
    /// file system), in which case the engine treats the allocation as failed.
    pub fn commit(&mut self, addr: *mut u8, len: usize) -> bool {
        let Some((index, offset)) = self.piece_of(addr, len) else {
            return false;
        };
        reserve_chunks(&mut self.pieces[index], offset, len)
    }

    /// Lazy purge: the engine no longer needs the contents of `[addr, addr+len)` but may
    /// reuse the range without committing it again. On a file space without hole punching
    /// the contents simply stay (a lazy purge allows that) and this succeeds at once; that
    /// is what lets freed file memory coalesce and be reused. Elsewhere it releases.
    pub fn purge_lazy(&self, addr: *mut u8, len: usize) -> bool {
        match &self.medium {
            SpaceMedium::File(options) if !options.hole_punching => true,
            _ => self.purge(addr, len),
        }
    }

    /// Gives the pages of `[addr, addr+len)` back to the medium, if the medium does that
    /// (anonymous memory always; files only with hole punching). True when released.
    pub fn purge(&self, addr: *mut u8, len: usize) -> bool {
        let Some((index, offset)) = self.piece_of(addr, len) else {
            return false;
        };
        matches!(self.pieces[index].region.release(offset, len), Ok(true))
    }
}

/// Reserves the file chunks covering `[offset, offset+len)` of `piece` (no-op for
/// anonymous memory). False when the file system is full.
fn reserve_chunks(piece: &mut Piece, offset: usize, len: usize) -> bool {
    if piece.reserved.is_empty() || len == 0 {
        return true;
    }
    let first = offset / piece.chunk;
    let last = (offset + len - 1) / piece.chunk;
    for chunk in first..=last {
        let (word, bit) = (chunk / 64, 1u64 << (chunk % 64));
        if piece.reserved[word] & bit != 0 {
            continue;
        }
        let start = chunk * piece.chunk;
        let chunk_len = piece.chunk.min(piece.region.len() - start);
        if piece.region.reserve(start, chunk_len).is_err() {
            // A chunk can fail on a nearly full file system while the exact range still
            // fits: reserve just what is asked for (not recorded as a whole chunk).
            let lo = offset.max(start);
            let hi = (offset + len).min(start + chunk_len);
            if piece.region.reserve(lo, hi - lo).is_err() {
                return false;
            }
            continue;
        }
        piece.reserved[word] |= bit;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> NonZeroU32 {
        NonZeroU32::new(0xF00D).unwrap()
    }

    #[test]
    fn file_space_reserves_in_chunks_and_stops_at_capacity() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let mut space =
            Space::new(SpaceMedium::File(FileOptions::temp_in(dir.path(), 128 << 20)), 0, tag())
                .unwrap();
        assert_eq!(space.capacity(), 128 << 20);
        let (a, zero) = space.alloc(1 << 20, 4096, false).unwrap();
        assert!(zero);
        assert_eq!(space.reserved_bytes(), 0, "nothing reserved before commit");
        assert!(space.commit(a, 4096));
        assert_eq!(space.reserved_bytes(), reserve_chunk_for(128 << 20) as u64);
        let (b, _) = space.alloc(2 << 20, 2 << 20, true).unwrap();
        assert_eq!(b as usize % (2 << 20), 0);
        assert!(space.alloc(200 << 20, 4096, false).is_none());
        // SAFETY: committed range of the space.
        unsafe { b.write(1) };
    }

    #[test]
    fn dram_space_grows_by_new_regions_up_to_capacity() {
        let mut space = Space::new(SpaceMedium::Dram { huge_pages: false }, 3 << 30, tag()).unwrap();
        assert!(space.alloc(DRAM_CHUNK - 4096, 4096, true).is_some());
        let (p, _) = space.alloc(1 << 30, 4096, true).unwrap();
        assert_eq!(space.regions().count(), 2);
        // SAFETY: handed-out, committed anonymous memory.
        unsafe { p.write(3) };
        assert!(space.alloc(2 << 30, 4096, true).is_none(), "over capacity");
    }
}

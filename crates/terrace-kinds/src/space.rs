//! Space: the address ranges one kind's engine arena draws memory from, and the policy of
//! growing them.
//!
//! - DRAM and NUMA spaces grow by mapping further regions of at least [`DRAM_CHUNK`]
//!   (address space only: pages are committed by the kernel on first touch).
//! - A file space is one region of the kind's maximum size, mapped at creation. Address
//!   space is handed to the engine by bumping an offset, and only bytes whose file blocks
//!   are reserved are handed out ([`crate::reserve`]), so a full file system is a failed
//!   allocation, never `SIGBUS` at first touch.
//!
//! Invariants:
//! - every byte handed out lies in a region registered under the kind's tag;
//! - in a file space, every byte handed out is reserved;
//! - `handed_out <= capacity`.

use std::num::NonZeroU32;
use std::sync::Arc;

use terrace_media::{FileOptions, MediaError, PageSize, Region};

use crate::error::Result;
use crate::reserve::Reservation;

/// Minimum address-space step of DRAM and NUMA spaces.
pub const DRAM_CHUNK: usize = 1 << 30;
/// Largest single `fallocate` step of a file space.
pub const MAX_RESERVE_CHUNK: usize = 64 << 20;
/// Smallest single `fallocate` step of a file space.
pub const MIN_RESERVE_CHUNK: usize = 2 << 20;

/// Reservation step for a file of `len` bytes: a sixteenth of it within
/// `[MIN_RESERVE_CHUNK, MAX_RESERVE_CHUNK]`, so small kinds do not reserve far beyond use.
fn reserve_chunk_for(len: usize) -> usize {
    (len / 16).clamp(MIN_RESERVE_CHUNK, MAX_RESERVE_CHUNK)
}

/// Default headroom reserved ahead of use: an eighth of the file, at most 512 MiB.
pub(crate) fn default_headroom(len: usize) -> usize {
    (len / 8).min(512 << 20)
}

/// Bytes of a file space reserved at creation: the headroom (a kind keeps `headroom`
/// bytes reserved ahead of its use from the start), at least one chunk. Early allocations
/// then never wait for `fallocate` (on tmpfs it allocates the pages: slow), and a file
/// system too full for the first chunk fails the creation instead of the first
/// allocations.
fn initial_lead(len: usize, headroom: usize) -> usize {
    headroom.max(reserve_chunk_for(len)).min(len)
}

/// The medium a space lives on.
#[derive(Clone, Debug)]
pub enum SpaceMedium {
    Dram {
        pages: PageSize,
    },
    Numa {
        node: u32,
    },
    /// A file, with the bytes to keep reserved ahead of use.
    File {
        options: FileOptions,
        headroom: usize,
    },
}

struct Piece {
    region: Arc<Region>,
    /// Offset of the first byte never handed out.
    bump: usize,
    /// File spaces only.
    reservation: Option<Arc<Reservation>>,
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
        let mut space = Space {
            medium,
            tag,
            pieces: Vec::new(),
            capacity,
            handed_out: 0,
        };
        let first = match &space.medium {
            SpaceMedium::File { options, .. } => options.size,
            _ => DRAM_CHUNK.min(capacity),
        };
        space.map_piece(first)?;
        if let SpaceMedium::File { .. } = space.medium {
            space.capacity = space.pieces[0].region.len();
        }
        Ok(space)
    }

    fn map_piece(&mut self, size: usize) -> Result<()> {
        let (mut region, headroom) = match &self.medium {
            SpaceMedium::Dram { pages } => (Region::dram(size, *pages)?, None),
            SpaceMedium::Numa { node } => (Region::numa(*node, size)?, None),
            SpaceMedium::File { options, headroom } => (Region::file(options)?, Some(*headroom)),
        };
        region.register(self.tag)?;
        let region = Arc::new(region);
        let reservation = match headroom {
            None => None,
            Some(headroom) => {
                let len = region.len();
                let chunk = reserve_chunk_for(len);
                let reservation = Reservation::new(region.clone(), chunk, headroom);
                if !reservation.prefill(initial_lead(len, headroom)) {
                    let path = region.path().map(|p| p.to_path_buf()).unwrap_or_default();
                    return Err(MediaError::NoSpace {
                        path,
                        offset: 0,
                        len: chunk as u64,
                    }
                    .into());
                }
                Some(reservation)
            }
        };
        self.pieces.push(Piece {
            region,
            bump: 0,
            reservation,
        });
        Ok(())
    }

    /// The most bytes this space will hand out.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// File bytes reserved so far (0 for anonymous spaces).
    pub fn reserved_bytes(&self) -> u64 {
        self.pieces
            .iter()
            .filter_map(|p| p.reservation.as_ref())
            .map(|r| r.reserved() as u64)
            .sum()
    }

    /// The medium of this space's regions.
    pub fn medium(&self) -> &SpaceMedium {
        &self.medium
    }

    /// The regions of this space (for diagnostics and durability queries).
    pub fn regions(&self) -> impl Iterator<Item = &Region> {
        self.pieces.iter().map(|p| p.region.as_ref())
    }

    /// Hands out `size` bytes aligned to `align`, usable at once (file blocks reserved).
    /// Returns the address, or `None` when the space is exhausted or the file system full.
    /// Fresh address space always reads as zero.
    pub fn alloc(&mut self, size: usize, align: usize) -> Option<*mut u8> {
        let align = align.max(1);
        if !align.is_power_of_two() || size == 0 {
            return None;
        }
        let (index, offset) = match self.fit(size, align) {
            Some(found) => found,
            None => {
                if matches!(self.medium, SpaceMedium::File { .. }) {
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
        if let Some(reservation) = &piece.reservation {
            if !reservation.ensure(offset + size) {
                return None;
            }
        }
        self.handed_out += offset + size - piece.bump;
        piece.bump = offset + size;
        // SAFETY: offset + size <= region length (checked by `fit`).
        Some(unsafe { piece.region.base().as_ptr().add(offset) })
    }

    /// Hands out `size` bytes starting exactly at `addr`, which must be where the current
    /// piece's never-used space begins (jemalloc asks for this to grow a block in place).
    /// None otherwise, or when the space is exhausted.
    pub fn alloc_at(&mut self, addr: *mut u8, size: usize) -> Option<*mut u8> {
        let piece = self.pieces.last()?;
        let base = piece.region.base().as_ptr() as usize;
        if size == 0 || addr as usize != base + piece.bump {
            return None;
        }
        let (index, offset) = self.fit(size, 1)?;
        debug_assert_eq!(base + offset, addr as usize);
        let piece = &mut self.pieces[index];
        if let Some(reservation) = &piece.reservation {
            if !reservation.ensure(offset + size) {
                return None;
            }
        }
        self.handed_out += size;
        piece.bump = offset + size;
        Some(addr)
    }

    /// The piece and offset where `size` bytes aligned to `align` fit in the current piece.
    fn fit(&self, size: usize, align: usize) -> Option<(usize, usize)> {
        let index = self.pieces.len().checked_sub(1)?;
        let piece = &self.pieces[index];
        let base = piece.region.base().as_ptr() as usize;
        let start = (base + piece.bump).checked_add(align - 1)? & !(align - 1);
        let offset = start - base;
        let end = offset.checked_add(size)?;
        if end > piece.region.len() || self.handed_out + (end - piece.bump) > self.capacity {
            return None;
        }
        Some((index, offset))
    }

    fn piece_of(&self, addr: *mut u8, len: usize) -> Option<(usize, usize)> {
        let at = addr as usize;
        self.pieces.iter().enumerate().find_map(|(i, p)| {
            let base = p.region.base().as_ptr() as usize;
            (at >= base && at + len <= base + p.region.len()).then(|| (i, at - base))
        })
    }

    /// Gives the pages of `[addr, addr+len)` back to the medium, if the medium does that
    /// (anonymous memory always; files only with hole punching). True when released: the
    /// range then reads as zero.
    pub fn purge(&self, addr: *mut u8, len: usize) -> bool {
        let Some((index, offset)) = self.piece_of(addr, len) else {
            return false;
        };
        matches!(self.pieces[index].region.release(offset, len), Ok(true))
    }

    /// Lazy purge: the engine no longer needs the contents of `[addr, addr+len)` but keeps
    /// the range. A file space without hole punching keeps the contents (a lazy purge
    /// allows that) and succeeds: that moves freed extents to jemalloc's eagerly coalesced
    /// "muzzy" state, where they are reused. Elsewhere this releases the pages.
    pub fn purge_lazy(&self, addr: *mut u8, len: usize) -> bool {
        match &self.medium {
            SpaceMedium::File { options, .. } if !options.hole_punching => true,
            _ => self.purge(addr, len),
        }
    }
}

impl Drop for Space {
    /// Forgets the regions in the registry at once, even if the background reserver still
    /// holds one for an instant: from here on no address of this kind is found, and the
    /// kind's slot may be reused safely.
    fn drop(&mut self) {
        for piece in &self.pieces {
            let base = piece.region.base().as_ptr() as usize;
            terrace_media::registry::unregister(base, piece.region.len(), self.tag);
            if let Some(reservation) = &piece.reservation {
                reservation.stop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag() -> NonZeroU32 {
        NonZeroU32::new(0xF00D).unwrap()
    }

    fn file_space(dir: &std::path::Path, size: usize, headroom: usize) -> Space {
        let medium = SpaceMedium::File {
            options: FileOptions::temp_in(dir, size),
            headroom,
        };
        Space::new(medium, 0, tag()).unwrap()
    }

    #[test]
    fn file_space_reserves_what_it_hands_out_and_stops_at_capacity() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let mut space = file_space(dir.path(), 128 << 20, 0);
        assert_eq!(space.capacity(), 128 << 20);
        let chunk = reserve_chunk_for(128 << 20) as u64;
        assert_eq!(
            space.reserved_bytes(),
            chunk,
            "one chunk is reserved at creation"
        );
        let a = space.alloc(1 << 20, 4096).unwrap();
        assert_eq!(space.reserved_bytes(), chunk);
        space.alloc(chunk as usize, 4096).unwrap();
        assert_eq!(
            space.reserved_bytes(),
            2 * chunk,
            "reserved on demand past the first chunk"
        );
        let b = space.alloc(2 << 20, 2 << 20).unwrap();
        assert_eq!(b as usize % (2 << 20), 0);
        assert!(space.alloc(200 << 20, 4096).is_none());
        // SAFETY: handed-out, reserved ranges of the space.
        unsafe {
            a.write(1);
            b.write(1);
        }
    }

    #[test]
    fn background_reserver_gets_ahead_within_headroom() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let mut space = file_space(dir.path(), 256 << 20, 32 << 20);
        space.alloc(4096, 4096).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while space.reserved_bytes() < 32 << 20 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let reserved = space.reserved_bytes();
        assert!(
            reserved >= 32 << 20,
            "reserver did not get ahead: {reserved}"
        );
        assert!(
            reserved <= (32 << 20) + reserve_chunk_for(256 << 20) as u64,
            "beyond headroom: {reserved}"
        );
    }

    #[test]
    fn alloc_at_extends_only_at_the_bump_end() {
        let dir = tempfile::tempdir_in("/dev/shm").unwrap();
        let mut space = file_space(dir.path(), 64 << 20, 0);
        let a = space.alloc(1 << 20, 4096).unwrap();
        let end = a.wrapping_add(1 << 20);
        assert!(space.alloc_at(a, 4096).is_none(), "not at the bump end");
        assert_eq!(space.alloc_at(end, 1 << 20), Some(end));
        assert!(space.alloc_at(end, 4096).is_none(), "the end moved");
        assert!(
            space
                .alloc_at(end.wrapping_add(1 << 20), 100 << 20)
                .is_none(),
            "over capacity"
        );
    }

    #[test]
    fn dram_space_grows_by_new_regions_up_to_capacity() {
        let mut space = Space::new(
            SpaceMedium::Dram {
                pages: PageSize::Base,
            },
            3 << 30,
            tag(),
        )
        .unwrap();
        assert!(space.alloc(DRAM_CHUNK - 4096, 4096).is_some());
        let p = space.alloc(1 << 30, 4096).unwrap();
        assert_eq!(space.regions().count(), 2);
        // SAFETY: handed-out anonymous memory.
        unsafe { p.write(3) };
        assert!(space.alloc(2 << 30, 4096).is_none(), "over capacity");
        // Purging an address in the second region must look past the first one (a lookup
        // that subtracted before comparing overflowed here in debug builds).
        assert!(space.purge(p, 4096));
        assert!(!space.purge(std::ptr::null_mut::<u8>().wrapping_add(4096), 4096));
    }
}

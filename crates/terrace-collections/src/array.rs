//! The persistent array: a fixed number of fixed-size elements in one pool object, bound
//! by name in the directory (PCJ's `PersistentArray` and `PersistentLongArray`, LLPL's
//! arrays laid out in one block, with the crash safety done for the caller).
//!
//! Owns [`PersistentArray`] (an open array: its writer lock and the counter readers
//! validate against) and its layout: an object of type [`TYPE_ARRAY`] holding
//! `magic: u64, length: u64, element_size: u64`, zeros to [`ARRAY_HEADER`] bytes, then
//! `length` elements of `element_size` bytes. An array is created zeroed and bound in one
//! transaction, and never changes size.
//!
//! Invariants:
//! - writers hold `writer`; readers take no lock;
//! - an element of 8 bytes (they start at multiples of 8: the header is 64 bytes) changes
//!   by one atomic 8-byte store, then a persist: an aligned 8-byte store never tears, so
//!   after a crash it holds the old or the new value, with no log; readers load it
//!   atomically;
//! - every other write (an element of another size, or a run of elements) is one pool
//!   transaction that snapshots the bytes first, made while `structure` is odd: after a
//!   crash the run is all old or all new, and a reader copies only while no such write is
//!   under way (it retries otherwise), so it never returns a torn element;
//! - lock order: an array's `writer`, then a pool lane.

use parking_lot::Mutex;
use terrace_pool::{Backend, Oid, Pool, Tx};

use crate::error::{CollectionError, Result};
use crate::layout::TYPE_ARRAY;
use crate::sync::{Attempt, OpenGuard, Seqlocks};

/// Header: magic.
pub const ARRAY_MAGIC: u64 = u64::from_le_bytes(*b"TRCARRY1");
/// Header word offsets: magic, length (elements), element size (bytes).
pub const A_MAGIC: u64 = 0;
pub const A_LENGTH: u64 = 8;
pub const A_ELEMENT: u64 = 16;
/// Bytes before the first element.
pub const ARRAY_HEADER: u64 = 64;
/// Largest element.
pub const MAX_ELEMENT: u32 = 4096;
/// Most bytes one [`PersistentArray::set_range`] writes (its transaction snapshots them
/// all; a pool lane's undo log holds some tens of KiB).
pub const MAX_RANGE_BYTES: usize = 16 << 10;

/// An array's sizes, checked: `length * element_size` plus the header fits in `pool_size`.
pub(crate) fn array_bytes(length: u64, element_size: u32, pool_size: u64) -> Result<u64> {
    let bad = |detail: String| CollectionError::InvalidArgument {
        what: "array sizes",
        detail,
    };
    if element_size == 0 || element_size > MAX_ELEMENT {
        return Err(bad(format!(
            "element size {element_size} is outside 1..={MAX_ELEMENT}"
        )));
    }
    if length == 0 {
        return Err(bad("length 0".into()));
    }
    length
        .checked_mul(element_size as u64)
        .and_then(|n| n.checked_add(ARRAY_HEADER))
        .filter(|&n| n <= pool_size)
        .ok_or_else(|| {
            bad(format!(
                "{length} elements of {element_size} bytes do not fit a pool of {pool_size} bytes"
            ))
        })
}

/// Creates a zeroed array in `tx`; the caller binds it in the same transaction.
pub(crate) fn create_array<B: Backend>(
    tx: &mut Tx<'_, B>,
    pool_size: u64,
    length: u64,
    element_size: u32,
) -> Result<Oid> {
    let bytes = array_bytes(length, element_size, pool_size)?;
    let oid = tx.zalloc(bytes, TYPE_ARRAY)?;
    let mut head = [0u8; 24];
    head[..8].copy_from_slice(&ARRAY_MAGIC.to_le_bytes());
    head[8..16].copy_from_slice(&length.to_le_bytes());
    head[16..].copy_from_slice(&(element_size as u64).to_le_bytes());
    tx.write(oid, 0, &head)?;
    Ok(oid)
}

/// The length and element size of the array at `header`, validated (magic, sizes, and
/// that the object holds them: `usable` is its usable size).
pub(crate) fn read_array_header<B: Backend>(
    pool: &Pool<B>,
    header: u64,
    usable: u64,
) -> Result<(u64, u32)> {
    let b = pool.backend();
    if b.load_u64(header + A_MAGIC)? != ARRAY_MAGIC {
        return Err(CollectionError::corrupt(header, "not an array header"));
    }
    let length = b.load_u64(header + A_LENGTH)?;
    let element = b.load_u64(header + A_ELEMENT)?;
    let element = u32::try_from(element).unwrap_or(0);
    let bytes = array_bytes(length, element, pool.size())
        .map_err(|e| CollectionError::corrupt(header, e.to_string()))?;
    if bytes > usable {
        return Err(CollectionError::corrupt(
            header,
            format!("{length} elements of {element} bytes in an object of {usable} bytes"),
        ));
    }
    Ok((length, element))
}

/// An open persistent array. See the module docs.
pub struct PersistentArray<'p, B: Backend> {
    pool: &'p Pool<B>,
    header: u64,
    length: u64,
    element: u32,
    writer: Mutex<()>,
    seq: Seqlocks,
    _open: OpenGuard,
}

impl<'p, B: Backend> PersistentArray<'p, B> {
    /// Opens the array whose header is at `header` (validated). `Busy` when this process
    /// already has it open.
    pub(crate) fn attach(pool: &'p Pool<B>, header: u64) -> Result<Self> {
        let oid = Oid::from_offset(header)
            .ok_or_else(|| CollectionError::corrupt(header, "an array at offset 0"))?;
        if pool.type_of(oid)? != TYPE_ARRAY {
            return Err(CollectionError::corrupt(
                header,
                "the object is not an array",
            ));
        }
        let (length, element) = read_array_header(pool, header, pool.usable_size(oid)?)?;
        let open = OpenGuard::register(pool.uuid_lo(), header)?;
        Ok(PersistentArray {
            pool,
            header,
            length,
            element,
            writer: Mutex::new(()),
            seq: Seqlocks::default(),
            _open: open,
        })
    }

    /// The pool offset of the array's object (what the directory binds).
    pub fn header(&self) -> Oid {
        Oid::from_offset(self.header).expect("an array is never at offset 0")
    }

    /// Elements in the array (fixed at creation).
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Never true: an array has at least one element.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Bytes per element (fixed at creation).
    pub fn element_size(&self) -> u32 {
        self.element
    }

    /// The offset of `count` elements from `first`, checked against the length; `bytes`
    /// is the caller's buffer length, which must be `count` whole elements.
    fn span(&self, first: u64, bytes: usize) -> Result<u64> {
        let e = self.element as u64;
        if bytes == 0 || !(bytes as u64).is_multiple_of(e) {
            return Err(CollectionError::InvalidArgument {
                what: "buffer",
                detail: format!("{bytes} bytes is not a whole number of {e}-byte elements"),
            });
        }
        let count = bytes as u64 / e;
        if first >= self.length || count > self.length - first {
            return Err(CollectionError::InvalidArgument {
                what: "index",
                detail: format!(
                    "elements {first}..{} are outside 0..{}",
                    first.saturating_add(count),
                    self.length
                ),
            });
        }
        Ok(self.header + ARRAY_HEADER + first * e)
    }

    /// Copies elements `first..` into `out` (a whole number of elements). The copy is
    /// consistent with every multi-byte write ([`PersistentArray::set_range`] and sets of
    /// elements other than 8 bytes): it holds each such write whole or not at all.
    pub fn get_range(&self, first: u64, out: &mut [u8]) -> Result<()> {
        let at = self.span(first, out.len())?;
        let b = self.pool.backend();
        self.seq.read_consistent(|| {
            b.read(at, out)?;
            Ok((0, 0, Attempt::Done(())))
        })
    }

    /// Copies element `i` into `out` (exactly one element).
    pub fn get(&self, i: u64, out: &mut [u8]) -> Result<()> {
        self.require_one(out.len())?;
        self.get_range(i, out)
    }

    /// Element `i` of an array of 8-byte elements, as a little-endian u64 (one atomic
    /// load).
    pub fn get_u64(&self, i: u64) -> Result<u64> {
        self.require_one(8)?;
        Ok(self.pool.backend().load_u64(self.span(i, 8)?)?)
    }

    fn require_one(&self, bytes: usize) -> Result<()> {
        if bytes != self.element as usize {
            return Err(CollectionError::InvalidArgument {
                what: "element",
                detail: format!(
                    "{bytes} bytes given, the array's elements are {} bytes",
                    self.element
                ),
            });
        }
        Ok(())
    }

    /// Sets element `i` to `value` (exactly one element); crash-atomic.
    pub fn set(&self, i: u64, value: &[u8]) -> Result<()> {
        self.require_one(value.len())?;
        if value.len() == 8 {
            let word = u64::from_le_bytes(value.try_into().expect("8 bytes"));
            return self.set_u64(i, word);
        }
        self.set_range(i, value)
    }

    /// Sets element `i` of an array of 8-byte elements: one atomic store and a persist.
    pub fn set_u64(&self, i: u64, value: u64) -> Result<()> {
        self.require_one(8)?;
        let at = self.span(i, 8)?;
        let b = self.pool.backend();
        let _w = self.writer.lock();
        b.store_u64(at, value)?;
        b.persist(at, 8)?;
        Ok(())
    }

    /// Sets the elements from `first` to `data` (a whole number of elements, at most
    /// [`MAX_RANGE_BYTES`]) in one transaction: after a crash all of them hold the new
    /// bytes or none does.
    pub fn set_range(&self, first: u64, data: &[u8]) -> Result<()> {
        let at = self.span(first, data.len())?;
        if data.len() > MAX_RANGE_BYTES {
            return Err(CollectionError::InvalidArgument {
                what: "range",
                detail: format!(
                    "{} bytes; one write takes at most {MAX_RANGE_BYTES}",
                    data.len()
                ),
            });
        }
        let _w = self.writer.lock();
        self.seq.structural(self.pool, |tx| {
            tx.add_range_direct(at, data.len() as u64)?;
            self.pool.backend().write(at, data)?;
            Ok(())
        })
    }
}

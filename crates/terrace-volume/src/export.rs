//! [`Export`]: what the NBD front end serves — a block device of `size` bytes with reads,
//! writes, flushes, trims and zeroing, callable from many connections at once. A
//! [`Volume`](crate::Volume) is one; [`MemoryExport`] is a RAM disk for tests and tools.
//!
//! Contract (NBD's, `doc/proto.md`): ranges are byte ranges inside `size` (the front end
//! checks them before calling); a completed `flush` makes every write completed before it
//! durable, whichever connection sent it (so the server may advertise `CAN_MULTI_CONN`);
//! `fua` makes that one write durable before it completes; after `trim` or
//! `write_zeroes` the range reads as zeroes.

use parking_lot::RwLock;

use crate::error::BlockError;

/// A block device the NBD server exports.
pub trait Export: Send + Sync {
    /// Bytes in the export.
    fn size(&self) -> u64;
    /// Whether writes are refused (`NBD_FLAG_READ_ONLY` at the handshake).
    fn is_read_only(&self) -> bool;
    /// Reads `buf.len()` bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError>;
    /// [`read`](Export::read) if it can be served at once, from memory, without waiting
    /// on slow storage; `None` otherwise (and `buf` is to be ignored). The front end
    /// answers such reads on the thread that parsed them, skipping a hand-off to a
    /// worker. The default never can.
    fn read_cached(&self, _offset: u64, _buf: &mut [u8]) -> Option<Result<(), BlockError>> {
        None
    }
    /// Writes `data` at `offset`; with `fua`, durable on return.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), BlockError>;
    /// [`write`](Export::write) if it can be done at once, in memory (a write log on
    /// tmpfs), without waiting on slow storage; `None` otherwise, with nothing written.
    /// The default never can.
    fn write_at_once(
        &self,
        _offset: u64,
        _data: &[u8],
        _fua: bool,
    ) -> Option<Result<(), BlockError>> {
        None
    }
    /// Makes every completed write durable.
    fn flush(&self) -> Result<(), BlockError>;
    /// Discards `len` bytes at `offset`; they read as zeroes afterwards.
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), BlockError>;
    /// Writes `len` zero bytes at `offset`.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), BlockError>;
}

/// A RAM disk: the simplest correct [`Export`] (volatile, so flush and fua are no-ops;
/// every read and write can be done at once, so the NBD reader does them itself).
pub struct MemoryExport {
    bytes: RwLock<Vec<u8>>,
    read_only: bool,
}

impl MemoryExport {
    /// A zeroed RAM disk of `size` bytes.
    pub fn new(size: u64, read_only: bool) -> MemoryExport {
        MemoryExport {
            bytes: RwLock::new(vec![0; size as usize]),
            read_only,
        }
    }

    fn range(&self, offset: u64, len: u64) -> Result<std::ops::Range<usize>, BlockError> {
        let size = self.size();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(offset as usize..end as usize),
            _ => Err(BlockError::OutOfRange { offset, len, size }),
        }
    }
}

impl Export for MemoryExport {
    fn size(&self) -> u64 {
        self.bytes.read().len() as u64
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let range = self.range(offset, buf.len() as u64)?;
        buf.copy_from_slice(&self.bytes.read()[range]);
        Ok(())
    }

    fn read_cached(&self, offset: u64, buf: &mut [u8]) -> Option<Result<(), BlockError>> {
        Some(self.read(offset, buf))
    }

    fn write_at_once(&self, offset: u64, data: &[u8], fua: bool) -> Option<Result<(), BlockError>> {
        Some(self.write(offset, data, fua))
    }

    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), BlockError> {
        if self.read_only {
            return Err(BlockError::ReadOnly);
        }
        let range = self.range(offset, data.len() as u64)?;
        self.bytes.write()[range].copy_from_slice(data);
        Ok(())
    }

    fn flush(&self) -> Result<(), BlockError> {
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), BlockError> {
        self.write_zeroes(offset, len, fua)
    }

    fn write_zeroes(&self, offset: u64, len: u64, _fua: bool) -> Result<(), BlockError> {
        if self.read_only {
            return Err(BlockError::ReadOnly);
        }
        let range = self.range(offset, len)?;
        self.bytes.write()[range].fill(0);
        Ok(())
    }
}

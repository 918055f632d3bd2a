//! Comparing a secondary's copy with the primary's log by digest. A copy that followed
//! another primary's stream — the old primary coming back after a failover, a
//! secondary that stayed with it, any copy after the primary restarted — differs from
//! the new primary's log only where one of them wrote after they parted: the writes
//! since, and whatever the old primary wrote that never reached the new one. Comparing
//! hashes finds those extents, so the resync sends them and not the whole log.
//!
//! Two rounds, each a DIGEST frame and its answer ([`super::wire::DigestRequest`]): a
//! hash per [`CHUNK`] of the whole store, then a hash per extent of the chunks that
//! differed. Hashes are xxh3-64 seeded with the primary's stream, so two different
//! contents that happened to collide under one seed do not under the next primary's.
//!
//! This module hashes; the primary's bitmap bookkeeping around it (which bits a
//! comparison may clear, and when) is in [`super::primary`] (P7).

use std::io;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::wire::DigestRequest;
use crate::log::LogStore;

/// The first round's unit: 64 extents of 4 KiB. 8 bytes of answer per 256 KiB of log
/// (32 KiB for a 1 GiB log); the second round asks 512 bytes per chunk that differed.
pub const CHUNK: u64 = 256 << 10;

/// The hash of one unit's bytes.
pub fn hash_unit(bytes: &[u8], seed: u64) -> u64 {
    xxh3_64_with_seed(bytes, seed)
}

/// The bytes of unit `index` of `unit` bytes in a store of `size` bytes (the last one
/// cut at the end).
pub fn unit_span(index: u64, unit: u64, size: u64) -> (u64, u64) {
    let offset = index * unit;
    (offset, unit.min(size.saturating_sub(offset)))
}

/// Hashes every unit `request` asks of `store`, in order (the copy's side). A request
/// may cover a gigabyte: `abandoned` is asked before each unit, and true ends the
/// hashing with an error (the copy is wanted elsewhere: a takeover waits for no more
/// than one unit).
pub fn hash_units(
    store: &dyn LogStore,
    request: &DigestRequest,
    seed: u64,
    abandoned: &dyn Fn() -> bool,
) -> io::Result<Vec<u64>> {
    let unit = request.unit as u64;
    let mut hashes = Vec::with_capacity(request.units() as usize);
    let mut buf = vec![0u8; unit as usize];
    for &(first, n) in &request.ranges {
        for index in first..first + n {
            if abandoned() {
                return Err(io::Error::other("hashing abandoned: the copy is wanted"));
            }
            let (offset, len) = unit_span(index, unit, store.size());
            let bytes = &mut buf[..len as usize];
            store.read_at(offset, bytes)?;
            hashes.push(hash_unit(bytes, seed));
        }
    }
    Ok(hashes)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bytes(Vec<u8>);

    impl LogStore for Bytes {
        fn size(&self) -> u64 {
            self.0.len() as u64
        }
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            let at = offset as usize;
            buf.copy_from_slice(&self.0[at..at + buf.len()]);
            Ok(())
        }
        fn write_at(&self, _: u64, _: &[u8]) -> io::Result<()> {
            unreachable!("hashing writes nothing")
        }
        fn sync(&self) -> io::Result<()> {
            Ok(())
        }
        fn describe(&self) -> String {
            "bytes".into()
        }
    }

    #[test]
    fn units_hash_their_own_bytes_and_the_last_is_cut_at_the_end() {
        let mut bytes = vec![0u8; 10 * 4096 + 100];
        bytes[5 * 4096 + 7] = 1;
        let store = Bytes(bytes.clone());
        let request = DigestRequest {
            unit: 4096,
            ranges: vec![(4, 2), (10, 1)],
        };
        let got = hash_units(&store, &request, 9, &|| false).unwrap();
        assert_eq!(
            got,
            vec![
                hash_unit(&bytes[4 * 4096..5 * 4096], 9),
                hash_unit(&bytes[5 * 4096..6 * 4096], 9),
                hash_unit(&bytes[10 * 4096..], 9),
            ]
        );
        assert_ne!(got[0], got[1], "one byte changes the hash");
        assert_ne!(hash_unit(&bytes[..4096], 9), hash_unit(&bytes[..4096], 10));
        assert_eq!(unit_span(10, 4096, bytes.len() as u64), (10 * 4096, 100));

        let asked = std::cell::Cell::new(0);
        let stop_at_two = || {
            asked.set(asked.get() + 1);
            asked.get() > 2
        };
        assert!(hash_units(&store, &request, 9, &stop_at_two).is_err());
        assert_eq!(asked.get(), 3, "asked before each unit, ended at once");
    }
}

//! A simulated medium for crash tests: [`RecordingBackend`] keeps the volatile image (what
//! loads see) apart from the durable image (what survives a crash), tracks dirty cache
//! lines, and while recording keeps one [`PersistEvent`] per `persist` call, so that a
//! [`Recording`] can rebuild the durable image at every persist point, and variants where
//! an arbitrary subset of the lines still dirty at that moment also reached the medium.
//!
//! Invariants: `volatile.len() == durable.len()`; a line is in `dirty` iff it was stored
//! since it was last persisted; `durable` changes only in `persist` (and in
//! [`RecordingBackend::from_image`]).
//!
//! Model of a crash "at persist point k": every persist call before k completed; call k
//! was under way, so any subset of the lines it covers, and of the other lines dirty at
//! that moment, may have been written back. The exact image at k (call k completed, no
//! other dirty line written back) is the common case; [`Recording::torn_image`] gives the
//! others.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard};

use terrace_media::Durability;

use crate::backend::Backend;
use crate::error::{PoolError, Result};

/// The unit in which a medium writes back: one CPU cache line.
pub const LINE: u64 = 64;

type CacheLine = (u64, [u8; LINE as usize]);

/// What one persist call did: the lines it made durable (with their contents), and the
/// other lines that were dirty at that moment (with the contents they would have had on
/// the medium had they been written back then).
#[derive(Clone, Debug, Default)]
pub struct PersistEvent {
    pub persisted: Vec<CacheLine>,
    pub pending: Vec<CacheLine>,
}

/// The durable image at the start of recording plus every persist since.
#[derive(Clone, Debug)]
pub struct Recording {
    pub base: Vec<u8>,
    pub events: Vec<PersistEvent>,
}

#[derive(Debug)]
struct Recorder {
    volatile: Vec<u8>,
    durable: Vec<u8>,
    dirty: BTreeSet<u64>,
    recording: Option<Recording>,
}

/// A simulated medium; see the module docs.
#[derive(Debug)]
pub struct RecordingBackend {
    inner: Mutex<Recorder>,
    len: u64,
}

fn line_of(image: &[u8], line: u64) -> [u8; LINE as usize] {
    let mut out = [0u8; LINE as usize];
    let start = line as usize;
    let end = (start + LINE as usize).min(image.len());
    out[..end - start].copy_from_slice(&image[start..end]);
    out
}

fn apply_line(image: &mut [u8], (off, bytes): &CacheLine) {
    let start = *off as usize;
    let end = (start + LINE as usize).min(image.len());
    image[start..end].copy_from_slice(&bytes[..end - start]);
}

impl RecordingBackend {
    /// A zero-filled medium of `len` bytes (a fresh file), nothing dirty.
    pub fn new(len: u64) -> RecordingBackend {
        Self::from_image(vec![0; len as usize])
    }

    /// A medium whose durable and volatile images are both `image` (a crash image being
    /// reopened).
    pub fn from_image(image: Vec<u8>) -> RecordingBackend {
        let len = image.len() as u64;
        RecordingBackend {
            inner: Mutex::new(Recorder {
                durable: image.clone(),
                volatile: image,
                dirty: BTreeSet::new(),
                recording: None,
            }),
            len,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Recorder> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn range(&self, offset: u64, len: u64) -> Result<(usize, usize)> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok((offset as usize, end as usize)),
            _ => Err(PoolError::OutOfBounds {
                offset,
                len,
                what: "the pool",
                limit: self.len,
            }),
        }
    }

    fn word(&self, offset: u64) -> Result<usize> {
        if !offset.is_multiple_of(8) {
            return Err(PoolError::InvalidArgument {
                what: "word offset",
                detail: format!("{offset:#x} is not 8-byte aligned"),
            });
        }
        Ok(self.range(offset, 8)?.0)
    }

    /// Starts keeping persist events (the current durable image is the base).
    pub fn start_recording(&self) {
        let mut r = self.lock();
        r.recording = Some(Recording {
            base: r.durable.clone(),
            events: Vec::new(),
        });
    }

    /// Stops recording and returns what was recorded (empty if it never started).
    pub fn take_recording(&self) -> Recording {
        let mut r = self.lock();
        r.recording.take().unwrap_or_else(|| Recording {
            base: r.durable.clone(),
            events: Vec::new(),
        })
    }

    /// Persist points recorded so far (0 when not recording).
    pub fn recorded_points(&self) -> usize {
        self.lock().recording.as_ref().map_or(0, |r| r.events.len())
    }

    /// A copy of what would survive a crash now (no dirty line written back).
    pub fn durable_image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// A copy of what loads see now.
    pub fn volatile_image(&self) -> Vec<u8> {
        self.lock().volatile.clone()
    }

    /// Number of lines stored but not persisted.
    pub fn dirty_lines(&self) -> usize {
        self.lock().dirty.len()
    }

    fn mark_dirty(r: &mut Recorder, start: usize, end: usize) {
        if end > start {
            let first = start as u64 / LINE;
            let last = (end as u64 - 1) / LINE;
            for l in first..=last {
                r.dirty.insert(l * LINE);
            }
        }
    }
}

impl Backend for RecordingBackend {
    fn len(&self) -> u64 {
        self.len
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let (s, e) = self.range(offset, buf.len() as u64)?;
        buf.copy_from_slice(&self.lock().volatile[s..e]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        let (s, e) = self.range(offset, data.len() as u64)?;
        let mut r = self.lock();
        r.volatile[s..e].copy_from_slice(data);
        Self::mark_dirty(&mut r, s, e);
        Ok(())
    }
    fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<()> {
        let (s, e) = self.range(offset, len)?;
        let mut r = self.lock();
        r.volatile[s..e].fill(byte);
        Self::mark_dirty(&mut r, s, e);
        Ok(())
    }
    fn load_u64(&self, offset: u64) -> Result<u64> {
        let s = self.word(offset)?;
        let r = self.lock();
        let mut b = [0u8; 8];
        b.copy_from_slice(&r.volatile[s..s + 8]);
        Ok(u64::from_le_bytes(b))
    }
    fn store_u64(&self, offset: u64, value: u64) -> Result<()> {
        self.write(offset, &value.to_le_bytes())?;
        Ok(())
    }
    fn fetch_or_u64(&self, offset: u64, mask: u64) -> Result<u64> {
        let s = self.word(offset)?;
        let mut r = self.lock();
        let mut b = [0u8; 8];
        b.copy_from_slice(&r.volatile[s..s + 8]);
        let old = u64::from_le_bytes(b);
        r.volatile[s..s + 8].copy_from_slice(&(old | mask).to_le_bytes());
        Self::mark_dirty(&mut r, s, s + 8);
        Ok(old)
    }
    fn fetch_and_u64(&self, offset: u64, mask: u64) -> Result<u64> {
        let s = self.word(offset)?;
        let mut r = self.lock();
        let mut b = [0u8; 8];
        b.copy_from_slice(&r.volatile[s..s + 8]);
        let old = u64::from_le_bytes(b);
        r.volatile[s..s + 8].copy_from_slice(&(old & mask).to_le_bytes());
        Self::mark_dirty(&mut r, s, s + 8);
        Ok(old)
    }
    fn persist(&self, offset: u64, len: u64) -> Result<()> {
        let (s, e) = self.range(offset, len)?;
        if e == s {
            return Ok(());
        }
        let mut r = self.lock();
        let first = s as u64 / LINE * LINE;
        let mut persisted = Vec::new();
        let mut line = first;
        while line < e as u64 {
            if r.dirty.remove(&line) {
                let bytes = line_of(&r.volatile, line);
                apply_line(&mut r.durable, &(line, bytes));
                persisted.push((line, bytes));
            }
            line += LINE;
        }
        if r.recording.is_some() {
            let pending: Vec<CacheLine> = r
                .dirty
                .iter()
                .map(|&l| (l, line_of(&r.volatile, l)))
                .collect();
            if let Some(rec) = r.recording.as_mut() {
                rec.events.push(PersistEvent { persisted, pending });
            }
        }
        Ok(())
    }
    fn durability(&self) -> Durability {
        Durability::Process
    }
}

impl Recording {
    /// Number of persist points recorded.
    pub fn points(&self) -> usize {
        self.events.len()
    }

    /// Calls `f(k, image)` with the exact durable image after persist point `k`, for every
    /// `k` in order (built incrementally, one copy of the image).
    pub fn for_each_image(&self, mut f: impl FnMut(usize, &[u8])) {
        let mut image = self.base.clone();
        for (k, event) in self.events.iter().enumerate() {
            for line in &event.persisted {
                apply_line(&mut image, line);
            }
            f(k, &image);
        }
    }

    /// The image of a crash *during* persist point `k`, given the exact image `before`
    /// after point `k - 1` (or the base): a subset of the lines point `k` was writing
    /// back and of the other dirty lines reached the medium, chosen by the bits of `seed`
    /// (a splitmix64 stream).
    pub fn torn_image(&self, before: &[u8], k: usize, seed: u64) -> Vec<u8> {
        let mut image = before.to_vec();
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        if let Some(event) = self.events.get(k) {
            for line in event.persisted.iter().chain(event.pending.iter()) {
                if next() & 1 == 1 {
                    apply_line(&mut image, line);
                }
            }
        }
        image
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durable_image_changes_only_on_persist_and_events_are_recorded() {
        let b = RecordingBackend::new(4096);
        b.start_recording();
        b.write(10, &[1, 2, 3]).unwrap();
        b.store_u64(128, 7).unwrap();
        assert_eq!(b.durable_image()[10], 0);
        assert_eq!(b.dirty_lines(), 2);
        b.persist(0, 64).unwrap();
        assert_eq!(b.durable_image()[10], 1);
        assert_eq!(b.durable_image()[128], 0);
        b.persist(128, 8).unwrap();
        assert_eq!(b.dirty_lines(), 0);
        let rec = b.take_recording();
        assert_eq!(rec.points(), 2);
        assert_eq!(rec.events[0].pending.len(), 1);
        let mut seen = Vec::new();
        rec.for_each_image(|k, img| seen.push((k, img[10], img[128])));
        assert_eq!(seen, vec![(0, 1, 0), (1, 1, 7)]);
        // Some seed writes back the pending line during point 0.
        let torn: Vec<u8> = (0..64)
            .map(|s| rec.torn_image(&rec.base, 0, s)[128])
            .collect();
        assert!(torn.contains(&7) && torn.contains(&0));
        assert!(b.persist(4090, 10).is_err());
        assert!(b.load_u64(3).is_err());
    }
}

//! What the collections' integration tests share: a small deterministic generator
//! (splitmix64), so every run of a test sees the same operations, and the check of one
//! crash image.

#![allow(dead_code)] // each test file uses its own part

use terrace_pool::{Pool, Recording, RecordingBackend};

/// Recovers a crash image and checks it: the pool opens and its check passes, the
/// collections' check passes with nothing unreachable, and the state `read` finds in it
/// is one of `allowed`.
pub fn verify_image<M: PartialEq>(
    image: Vec<u8>,
    layout: &str,
    allowed: &[&M],
    what: &str,
    read: impl Fn(&Pool<RecordingBackend>, &str) -> M,
) {
    let pool = Pool::open_on(RecordingBackend::from_image(image), layout)
        .unwrap_or_else(|e| panic!("{what}: recovery: {e}"));
    pool.check()
        .unwrap_or_else(|e| panic!("{what}: pool check: {e}"));
    let report = terrace_collections::check(&pool)
        .unwrap_or_else(|e| panic!("{what}: collections check: {e}"));
    assert!(
        report.unreachable.is_empty(),
        "{what}: unreachable {:?}",
        report.unreachable
    );
    let state = read(&pool, what);
    assert!(
        allowed.contains(&&state),
        "{what}: none of the allowed states"
    );
}

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Checks every persist point of `recording` with `verify`: the exact durable image there,
/// and a torn one (the lines still dirty written back at random, seeded with `seed` and the
/// point), each against the states before and after the operation in flight. `states[i]`
/// is the state before operation `i` and `states[i + 1]` after it; `ends[i]` is how many
/// persist points had been recorded when operation `i` returned, so the exact image at an
/// operation's last point must be the state after it. `label` names the run in messages.
pub fn check_every_point<M: PartialEq>(
    recording: &Recording,
    states: &[M],
    ends: &[usize],
    label: &str,
    seed: u64,
    verify: impl Fn(Vec<u8>, &[&M], &str),
) {
    let op_of = |k: usize| ends.partition_point(|&e| e <= k);
    let mut prev: Option<Vec<u8>> = None;
    recording.for_each_image(|k, image| {
        let i = op_of(k);
        let (pre, post) = (&states[i], &states[i + 1]);
        let allowed: Vec<&M> = if ends[i] == k + 1 {
            vec![post]
        } else {
            vec![pre, post]
        };
        verify(
            image.to_vec(),
            &allowed,
            &format!("{label}point {k} (op {i})"),
        );
        let before = prev.as_deref().unwrap_or(&recording.base);
        let torn = recording.torn_image(before, k, seed << 32 ^ k as u64);
        verify(torn, &[pre, post], &format!("{label}point {k} torn"));
        prev = Some(image.to_vec());
    });
}

/// Checks a `get_to` into a buffer of `cap` bytes against the model's value `want`: the
/// whole length comes back, and as much of the value as fits.
pub fn check_get_to(
    want: Option<&Vec<u8>>,
    cap: usize,
    get_to: impl FnOnce(&mut [u8]) -> Option<u64>,
) {
    let mut buf = vec![0u8; cap];
    assert_eq!(get_to(&mut buf), want.map(|v| v.len() as u64));
    if let Some(v) = want {
        let n = v.len().min(cap);
        assert_eq!(buf[..n], v[..n]);
    }
}

//! The look-aside workload's keys and values. Everything about key `id` is derived from
//! `id` alone: its key bytes, its value size (uniform in `MIN..=MAX` over keys) and its
//! value's first 8 bytes, so any hit can be checked cheaply and every set of a key writes
//! the same value.

/// Key bytes are `k` and the id as 15 decimal digits: 16 bytes, fixed length.
pub const KEY_LEN: usize = 16;

pub fn key(id: u64, out: &mut [u8; KEY_LEN]) {
    out[0] = b'k';
    let mut n = id;
    for b in out[1..].iter_mut().rev() {
        *b = b'0' + (n % 10) as u8;
        n /= 10;
    }
}

/// SplitMix64's finaliser: a cheap bijective mix.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The value size of key `id`.
pub fn value_len(id: u64, min: u64, max: u64) -> usize {
    let span = max - min + 1;
    (min + mix(id ^ 0x5151_5151_5151_5151) % span) as usize
}

/// Writes key `id`'s value (of `len` bytes) into `buf[..len]`: the 8 bytes of `mix(id)`
/// (as many as fit) then whatever `buf` held (a fixed filler pattern).
pub fn fill_value(buf: &mut [u8], id: u64, len: usize) {
    let tag = mix(id).to_le_bytes();
    let n = len.min(8);
    buf[..n].copy_from_slice(&tag[..n]);
}

/// The filler a value buffer starts with.
pub fn filler(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Whether `value` is key `id`'s value of `len` bytes (length and first 8 bytes).
pub fn check_value(value: &[u8], id: u64, len: usize) -> bool {
    let tag = mix(id).to_le_bytes();
    let n = len.min(8);
    value.len() == len && value[..n] == tag[..n]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_fixed_length_and_distinct() {
        let mut a = [0u8; KEY_LEN];
        let mut b = [0u8; KEY_LEN];
        key(0, &mut a);
        assert_eq!(&a, b"k000000000000000");
        key(1_234_567, &mut b);
        assert_eq!(&b, b"k000000001234567");
    }

    #[test]
    fn values_check() {
        let mut buf = filler(100);
        for id in [0u64, 1, 99, 1 << 40] {
            let len = value_len(id, 3, 100);
            assert!((3..=100).contains(&len));
            fill_value(&mut buf, id, len);
            assert!(check_value(&buf[..len], id, len));
            assert!(!check_value(&buf[..len], id + 1, len) || len < 8);
            if len > 3 {
                assert!(!check_value(&buf[..len - 1], id, len));
            }
        }
    }
}

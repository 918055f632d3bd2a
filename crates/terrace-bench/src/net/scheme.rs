//! The keys and values `net-fill` writes and `net-probe` checks. Everything about item
//! `id` is derived from `id` alone, so a reader needs only the id to know what must come
//! back:
//!
//! - key: `key:` and the id in decimal, no padding (`key:0`, `key:1234567`);
//! - value: `len` bytes, the 16 lowercase hex digits of `mix(id ^ SALT)` (lowest nibble
//!   first) repeated, so every byte depends on the id and a value is printable.
//!
//! Invariant: `value(id, len)` is a pure function; a value equal to it for the same `id`
//! and `len` is what the fill stored, and anything else read back is wrong.

use crate::workload::mix;

/// Keeps these values apart from the look-aside workload's, which also start from `mix`.
const SALT: u64 = 0x7e57_0f11_7e57_0f11;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends item `id`'s key to `out`.
pub fn push_key(out: &mut Vec<u8>, id: u64) {
    out.extend_from_slice(b"key:");
    let mut digits = [0u8; 20];
    let mut n = id;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// Writes item `id`'s value into `out` (its length is the value's).
pub fn fill_value(out: &mut [u8], id: u64) {
    let tag = mix(id ^ SALT);
    for (i, b) in out.iter_mut().enumerate() {
        *b = HEX[((tag >> ((i % 16) * 4)) & 0xf) as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        let mut k = Vec::new();
        push_key(&mut k, 0);
        assert_eq!(k, b"key:0");
        k.clear();
        push_key(&mut k, 1_234_567);
        assert_eq!(k, b"key:1234567");
        k.clear();
        push_key(&mut k, u64::MAX);
        assert_eq!(k, b"key:18446744073709551615");
    }

    #[test]
    fn values_differ_by_id_and_are_printable() {
        let mut a = [0u8; 100];
        let mut b = [0u8; 100];
        fill_value(&mut a, 7);
        fill_value(&mut b, 7);
        assert_eq!(a, b);
        assert!(a.iter().all(|c| c.is_ascii_hexdigit()));
        fill_value(&mut b, 8);
        assert_ne!(a, b);
        // A value one byte short is not a prefix-equal match of the full one.
        let mut short = [0u8; 99];
        fill_value(&mut short, 7);
        assert_eq!(&a[..99], &short[..]);
        assert_ne!(&a[..], &short[..]);
    }
}

//! Decimal numbers as memcached reads them: the C `strtoull` scan its `safe_strto*`
//! helpers share ([`strto`], [`strtoull`], which the protocol parsers build on too), and
//! the number [`Cache::arith`](super::Cache::arith) reads from a value and the value it
//! writes back, by memcached's `do_add_delta` rules (so every protocol's incr/decr agrees
//! with memcached's byte for byte):
//! - the stored number is read as `safe_strtoull` reads it: leading C white space, an
//!   optional sign, decimal digits, then the end of the value, white space or a NUL (the
//!   rest is ignored); no digits, other junk after them, or more than `u64::MAX` is not a
//!   number, and so is a `-` whose result has the top bit set (`-0` reads as 0);
//! - the new number is written over the old value when it is not longer, padded with
//!   spaces to the old length (memcached's in-place rewrite); otherwise the value is the
//!   bare digits.

/// What C's `strtoull`/`strtoll` (base 10) scan at the start of `b`, as memcached's
/// `safe_strto*` helpers check it: leading C white space, an optional sign, decimal
/// digits, then the end, white space or a NUL (the rest is ignored). `None`: no digits,
/// other junk after them, or a magnitude over `u64::MAX` (`ERANGE`). The sign and the
/// magnitude; the protocol parsers build their 32- and 64-bit readers on this.
pub fn strto(b: &[u8]) -> Option<(bool, u64)> {
    let mut i = b.iter().take_while(|&&c| is_c_space(c)).count();
    let mut negative = false;
    if let Some(&sign @ (b'+' | b'-')) = b.get(i) {
        negative = sign == b'-';
        i += 1;
    }
    let digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    match b.get(i + digits) {
        Some(&c) if c != 0 && !is_c_space(c) => return None,
        _ => {}
    }
    let mut n: u64 = 0;
    for &c in &b[i..i + digits] {
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    Some((negative, n))
}

/// memcached's `safe_strtoull`: [`strto`], a minus sign negating modulo 2^64 and
/// refused only when the result has its top bit set (`-0` is 0,
/// `-18446744073709551615` is 1, `-1` is refused).
pub fn strtoull(b: &[u8]) -> Option<u64> {
    match strto(b)? {
        (false, n) => Some(n),
        (true, n) => Some(n.wrapping_neg()).filter(|&v| (v as i64) >= 0),
    }
}

/// The value that holds `n` after an incr/decr of an `old_len`-byte value: the digits,
/// padded with spaces to `old_len` when they fit in it.
pub(super) fn rewrite(n: u64, old_len: usize) -> Vec<u8> {
    let mut text = n.to_string().into_bytes();
    if text.len() <= old_len {
        text.resize(old_len, b' ');
    }
    text
}

/// C's `isspace` in the C locale.
fn is_c_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_strtoull_reads() {
        for (value, want) in [
            (&b"100"[..], Some(100)),
            (b"10 x", Some(10)),
            (b" 10", Some(10)),
            (b"\t\n10\r", Some(10)),
            (b"+10", Some(10)),
            (b"5\0junk", Some(5)),
            (b"-0", Some(0)),
            (b"-18446744073709551615", Some(1)),
            (b"18446744073709551615", Some(u64::MAX)),
            (b"18446744073709551616", None),
            (b"-1", None),
            (b"10x", None),
            (b"x10", None),
            (b"", None),
            (b"   ", None),
            (b"+", None),
            (b"+ 1", None),
        ] {
            assert_eq!(
                strtoull(value),
                want,
                "{:?}",
                String::from_utf8_lossy(value)
            );
        }
    }

    #[test]
    fn rewrites_in_place_when_the_number_fits() {
        assert_eq!(rewrite(5, 3), b"5  ");
        assert_eq!(rewrite(11, 4), b"11  ");
        assert_eq!(rewrite(100, 3), b"100");
        assert_eq!(rewrite(1000, 3), b"1000");
        assert_eq!(rewrite(0, 0), b"0");
    }
}

//! Parsers for the command line's values: ranges (`64-4096`), ratios, counts; byte
//! sizes and tier lists come from `terrace_cache::spec`. They return errors, never panic,
//! so clap reports bad input as a usage error.

use std::fmt;

pub use terrace_cache::spec::parse_size;

/// An inclusive range of value sizes, `MIN-MAX` (each a size as [`parse_size`] takes) or
/// a single size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeRange {
    pub min: u64,
    pub max: u64,
}

impl fmt::Display for SizeRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.min, self.max)
    }
}

pub fn parse_range(s: &str) -> Result<SizeRange, String> {
    let (min, max) = match s.split_once('-') {
        Some((a, b)) => (parse_size(a)?, parse_size(b)?),
        None => {
            let v = parse_size(s)?;
            (v, v)
        }
    };
    if min == 0 {
        return Err(format!("{s:?}: values must be at least 1 byte"));
    }
    if min > max {
        return Err(format!("{s:?}: MIN is larger than MAX"));
    }
    Ok(SizeRange { min, max })
}

pub use terrace_cache::spec::{parse_tiers, TierList as Tiers};

/// A probability in `[0, 1]`.
pub fn parse_ratio(s: &str) -> Result<f64, String> {
    let r: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: expected a number in [0, 1]"))?;
    if (0.0..=1.0).contains(&r) {
        Ok(r)
    } else {
        Err(format!("{s:?}: expected a number in [0, 1]"))
    }
}

/// A Zipf exponent: finite and non-negative (0 is uniform).
pub fn parse_alpha(s: &str) -> Result<f64, String> {
    let a: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: expected a non-negative number"))?;
    if a.is_finite() && a >= 0.0 {
        Ok(a)
    } else {
        Err(format!("{s:?}: expected a finite non-negative number"))
    }
}

/// A count of at least 1, with optional `k`/`m`/`g` decimal suffixes (`10m` = 10 000 000)
/// and `_` separators.
pub fn parse_count(s: &str) -> Result<u64, String> {
    let t: String = s.trim().chars().filter(|&c| c != '_').collect();
    let lower = t.to_ascii_lowercase();
    let (num, mul) = match lower.as_bytes().last() {
        Some(b'k') => (&lower[..lower.len() - 1], 1_000u64),
        Some(b'm') => (&lower[..lower.len() - 1], 1_000_000),
        Some(b'g') => (&lower[..lower.len() - 1], 1_000_000_000),
        _ => (lower.as_str(), 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a positive integer (suffixes k, m, g)"))?;
    let n = n
        .checked_mul(mul)
        .ok_or_else(|| format!("{s:?}: out of range"))?;
    if n == 0 {
        return Err(format!("{s:?}: must be at least 1"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("64-4096"), Ok(SizeRange { min: 64, max: 4096 }));
        assert_eq!(
            parse_range("1KiB-1MiB"),
            Ok(SizeRange {
                min: 1024,
                max: 1 << 20
            })
        );
        assert_eq!(parse_range("100"), Ok(SizeRange { min: 100, max: 100 }));
        for bad in ["4096-64", "0-10", "a-b", "-", "10-", "-10", "1-2-3"] {
            assert!(parse_range(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ratios_alphas_counts() {
        assert_eq!(parse_ratio("0.9"), Ok(0.9));
        assert!(parse_ratio("1.1").is_err());
        assert!(parse_ratio("NaN").is_err());
        assert!(parse_ratio("x").is_err());
        assert_eq!(parse_alpha("0.99"), Ok(0.99));
        assert_eq!(parse_alpha("0"), Ok(0.0));
        assert!(parse_alpha("-1").is_err());
        assert!(parse_alpha("inf").is_err());
        assert_eq!(parse_count("2000000"), Ok(2_000_000));
        assert_eq!(parse_count("10m"), Ok(10_000_000));
        assert_eq!(parse_count("2_000k"), Ok(2_000_000));
        for bad in ["0", "", "-5", "1.5m", "m", "99999999999999g"] {
            assert!(parse_count(bad).is_err(), "{bad:?}");
        }
    }
}

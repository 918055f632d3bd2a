//! Parsers for the command line's values: byte sizes (`256MiB`), ranges (`64-4096`) and
//! tier lists (`dram:1,file:3`). They return errors, never panic, so clap reports bad
//! input as a usage error.

use std::fmt;

/// Parses a byte size: a decimal integer with an optional unit, `B`, `K`/`KB`/`KiB`,
/// `M`/`MB`/`MiB`, `G`/`GB`/`GiB`, `T`/`TB`/`TiB` (case-insensitive; all units are powers
/// of 1024, as memory sizes are). `256MiB`, `1g`, `4096`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(format!(
            "{s:?}: expected a number with an optional unit, e.g. 256MiB"
        ));
    }
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: number out of range"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "{s:?}: unknown unit {other:?} (use B, KiB, MiB, GiB, TiB)"
            ))
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{s:?}: size overflows 64 bits"))
}

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

/// Where one tier lives, as given on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TierKind {
    Dram,
    File,
    Numa(u32),
}

/// One tier's size: a share of `--capacity`, or explicit bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierAmount {
    Ratio(u32),
    Bytes(u64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierSpec {
    pub kind: TierKind,
    pub amount: TierAmount,
}

/// A tier list, fastest first: `KIND:AMOUNT[,KIND:AMOUNT...]` where KIND is `dram`,
/// `file` or `numaN` (NUMA node N), and AMOUNT a ratio (a bare integer, a share of
/// `--capacity`) or a size with a unit (`64MiB`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiers(pub Vec<TierSpec>);

impl fmt::Display for Tiers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match t.kind {
                TierKind::Dram => f.write_str("dram")?,
                TierKind::File => f.write_str("file")?,
                TierKind::Numa(n) => write!(f, "numa{n}")?,
            }
            match t.amount {
                TierAmount::Ratio(r) => write!(f, ":{r}")?,
                TierAmount::Bytes(b) => write!(f, ":{b}B")?,
            }
        }
        Ok(())
    }
}

pub fn parse_tiers(s: &str) -> Result<Tiers, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        let (kind, amount) = part
            .split_once(':')
            .ok_or_else(|| format!("{part:?}: expected KIND:AMOUNT, e.g. dram:1 or file:3"))?;
        let kind = match kind.trim().to_ascii_lowercase().as_str() {
            "dram" => TierKind::Dram,
            "file" => TierKind::File,
            k => match k.strip_prefix("numa") {
                Some(n) => TierKind::Numa(
                    n.parse()
                        .map_err(|_| format!("{part:?}: NUMA tier is numaN, N the node"))?,
                ),
                None => return Err(format!("{part:?}: tier kind must be dram, file or numaN")),
            },
        };
        let amount = amount.trim();
        let amount = if !amount.is_empty() && amount.bytes().all(|b| b.is_ascii_digit()) {
            let r: u32 = amount
                .parse()
                .map_err(|_| format!("{part:?}: ratio out of range"))?;
            if r == 0 {
                return Err(format!("{part:?}: a tier's ratio must be at least 1"));
            }
            TierAmount::Ratio(r)
        } else {
            let b = parse_size(amount)?;
            if b == 0 {
                return Err(format!("{part:?}: a tier's size must be at least 1 byte"));
            }
            TierAmount::Bytes(b)
        };
        out.push(TierSpec { kind, amount });
    }
    Ok(Tiers(out))
}

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
    fn sizes() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("256mib"), Ok(256 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64 KiB"), Ok(64 << 10));
        assert_eq!(parse_size("2TB"), Ok(2 << 40));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in [
            "",
            "MiB",
            "-1",
            "1.5GiB",
            "12XB",
            "99999999999999999999",
            "16777216TiB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

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
    fn tiers() {
        let t = parse_tiers("dram:1,file:3").unwrap();
        assert_eq!(
            t.0,
            vec![
                TierSpec {
                    kind: TierKind::Dram,
                    amount: TierAmount::Ratio(1)
                },
                TierSpec {
                    kind: TierKind::File,
                    amount: TierAmount::Ratio(3)
                },
            ]
        );
        assert_eq!(t.to_string(), "dram:1,file:3");
        let t = parse_tiers("dram:64MiB,numa1:2").unwrap();
        assert_eq!(t.0[0].amount, TierAmount::Bytes(64 << 20));
        assert_eq!(t.0[1].kind, TierKind::Numa(1));
        for bad in [
            "", "dram", "dram:0", "ssd:1", "numa:1", "numax:1", "dram:1,", "file:0B", "dram:-1",
        ] {
            assert!(parse_tiers(bad).is_err(), "{bad:?}");
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

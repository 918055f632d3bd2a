//! Text forms of a cache's configuration, shared by every front end (`terrace serve`'s
//! flags and config file, `terrace-bench`): byte sizes (`256MiB`) and tier lists
//! (`dram:64MiB,file:1GiB,numa:1:8GiB`, or ratios `dram:1,file:3` as CacheLib's `ratio`;
//! a flash tier may name its own file or block device: `flash:1TiB@/dev/nvme0n1`).
//! Parsers return a message naming the bad part, never panic.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::tier::{TierConfig, TierSize};

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

/// Where one tier of a list lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierKind {
    Dram,
    /// A file in the configured data directory.
    File,
    Numa(u32),
    /// Flash: a file in the data directory (or at `TierSpec::path`) read with block
    /// I/O; the last tier only.
    Flash,
}

/// One tier of a list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierSpec {
    pub kind: TierKind,
    pub size: TierSize,
    /// A flash tier's own file or block device (`flash:AMOUNT@PATH`); `None`: a file
    /// in the data directory.
    pub path: Option<PathBuf>,
}

/// A tier list, fastest first: `KIND:AMOUNT[,KIND:AMOUNT...]` where KIND is `dram`,
/// `file`, `numa:N` or `numaN` (NUMA node N), or `flash` (last only), and AMOUNT a ratio
/// (a bare integer, a share of the total capacity) or a size with a unit (`64MiB`). A
/// flash tier may end with `@PATH`, a file or raw block device of its own (its first
/// AMOUNT bytes are used); its kill log stays in the data directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierList(pub Vec<TierSpec>);

impl TierList {
    /// The cache's tier configurations, file tiers in `dir`.
    pub fn configs(&self, dir: &Path) -> Vec<TierConfig> {
        self.0
            .iter()
            .map(|t| match t.kind {
                TierKind::Dram => TierConfig::dram(t.size),
                TierKind::File => TierConfig::file(dir, t.size),
                TierKind::Numa(n) => TierConfig::numa(n, t.size),
                TierKind::Flash => match &t.path {
                    Some(path) => TierConfig::flash_at(dir, path, t.size),
                    None => TierConfig::flash(dir, t.size),
                },
            })
            .collect()
    }

    /// Whether any tier's size is a ratio (then a total capacity is needed).
    pub fn has_ratio(&self) -> bool {
        self.0.iter().any(|t| matches!(t.size, TierSize::Ratio(_)))
    }

    /// Whether any tier keeps files in the data directory (a file or flash tier).
    pub fn has_file(&self) -> bool {
        self.0
            .iter()
            .any(|t| matches!(t.kind, TierKind::File | TierKind::Flash))
    }

    /// Whether the list has a flash tier (always its last).
    pub fn has_flash(&self) -> bool {
        self.0.iter().any(|t| t.kind == TierKind::Flash)
    }
}

impl fmt::Display for TierList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match t.kind {
                TierKind::Dram => f.write_str("dram")?,
                TierKind::File => f.write_str("file")?,
                TierKind::Numa(n) => write!(f, "numa:{n}")?,
                TierKind::Flash => f.write_str("flash")?,
            }
            match t.size {
                TierSize::Ratio(r) => write!(f, ":{r}")?,
                TierSize::Bytes(b) if b % (1 << 30) == 0 => write!(f, ":{}GiB", b >> 30)?,
                TierSize::Bytes(b) if b % (1 << 20) == 0 => write!(f, ":{}MiB", b >> 20)?,
                TierSize::Bytes(b) => write!(f, ":{b}B")?,
            }
            if let Some(path) = &t.path {
                write!(f, "@{}", path.display())?;
            }
        }
        Ok(())
    }
}

impl std::str::FromStr for TierList {
    type Err = String;

    fn from_str(s: &str) -> Result<TierList, String> {
        parse_tiers(s)
    }
}

pub fn parse_tiers(s: &str) -> Result<TierList, String> {
    let mut out = Vec::new();
    for part in s.split(',') {
        let (part, path) = match part.trim().split_once('@') {
            Some((tier, path)) if !path.trim().is_empty() => {
                (tier.trim(), Some(PathBuf::from(path.trim())))
            }
            Some(_) => return Err(format!("{part:?}: expected a path after @")),
            None => (part.trim(), None),
        };
        let fields: Vec<&str> = part.split(':').map(str::trim).collect();
        let (kind, amount) = match fields.as_slice() {
            [kind, amount] => (kind.to_ascii_lowercase(), *amount),
            [numa, node, amount] if numa.eq_ignore_ascii_case("numa") => {
                (format!("numa{node}"), *amount)
            }
            _ => {
                return Err(format!(
                    "{part:?}: expected KIND:AMOUNT, e.g. dram:64MiB, file:3 or numa:1:8GiB"
                ))
            }
        };
        let kind = match kind.as_str() {
            "dram" => TierKind::Dram,
            "file" => TierKind::File,
            "flash" => TierKind::Flash,
            k => match k.strip_prefix("numa") {
                Some(n) => TierKind::Numa(
                    n.parse()
                        .map_err(|_| format!("{part:?}: a NUMA tier is numa:N:AMOUNT"))?,
                ),
                None => {
                    return Err(format!(
                        "{part:?}: tier kind must be dram, file, numa or flash"
                    ))
                }
            },
        };
        let size = if !amount.is_empty() && amount.bytes().all(|b| b.is_ascii_digit()) {
            let r: u32 = amount
                .parse()
                .map_err(|_| format!("{part:?}: ratio out of range"))?;
            if r == 0 {
                return Err(format!("{part:?}: a tier's ratio must be at least 1"));
            }
            TierSize::Ratio(r)
        } else {
            let b = parse_size(amount)?;
            if b == 0 {
                return Err(format!("{part:?}: a tier's size must be at least 1 byte"));
            }
            TierSize::Bytes(b)
        };
        if path.is_some() && kind != TierKind::Flash {
            return Err(format!(
                "{part:?}: only a flash tier may name a path of its own (flash:AMOUNT@PATH)"
            ));
        }
        out.push(TierSpec { kind, size, path });
    }
    if out[..out.len() - 1]
        .iter()
        .any(|t| t.kind == TierKind::Flash)
    {
        return Err(format!("{s:?}: a flash tier must be the last"));
    }
    if out.len() == 1 && out[0].kind == TierKind::Flash {
        return Err(format!("{s:?}: a flash tier needs a memory tier above it"));
    }
    Ok(TierList(out))
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
    fn tiers() {
        let t = parse_tiers("dram:1,file:3").unwrap();
        assert_eq!(
            t.0,
            vec![
                TierSpec {
                    kind: TierKind::Dram,
                    size: TierSize::Ratio(1),
                    path: None,
                },
                TierSpec {
                    kind: TierKind::File,
                    size: TierSize::Ratio(3),
                    path: None,
                },
            ]
        );
        assert_eq!(t.to_string(), "dram:1,file:3");
        assert!(t.has_ratio() && t.has_file());
        let t = parse_tiers("dram:64MiB,numa1:2,numa:3:8GiB").unwrap();
        assert_eq!(t.0[0].size, TierSize::Bytes(64 << 20));
        assert_eq!(t.0[1].kind, TierKind::Numa(1));
        assert_eq!(t.0[2].kind, TierKind::Numa(3));
        assert_eq!(t.0[2].size, TierSize::Bytes(8 << 30));
        assert_eq!(t.to_string(), "dram:64MiB,numa:1:2,numa:3:8GiB");
        assert_eq!(parse_tiers(&t.to_string()), Ok(t));
        let t = parse_tiers("dram:1GiB,file:16GiB,flash:1TiB").unwrap();
        assert_eq!(t.0[2].kind, TierKind::Flash);
        assert_eq!(t.to_string(), "dram:1GiB,file:16GiB,flash:1024GiB");
        assert!(t.has_file());
        let t = parse_tiers("dram:1GiB, flash:64GiB @ /dev/nvme0n1").unwrap();
        assert_eq!(t.0[1].path.as_deref(), Some(Path::new("/dev/nvme0n1")));
        assert_eq!(t.to_string(), "dram:1GiB,flash:64GiB@/dev/nvme0n1");
        assert_eq!(parse_tiers(&t.to_string()), Ok(t.clone()));
        let configs = t.configs(Path::new("/var/lib/terrace"));
        assert_eq!(
            configs[1].medium,
            crate::tier::Medium::Flash {
                dir: "/var/lib/terrace".into(),
                path: Some("/dev/nvme0n1".into()),
            }
        );
        for bad in [
            "flash:1GiB",
            "flash:1GiB,dram:1GiB",
            "dram:1,flash:1,file:1",
            "dram:1@/tmp/x,flash:1",
            "dram:1,file:1@/tmp/x",
            "dram:1,flash:1@",
        ] {
            assert!(parse_tiers(bad).is_err(), "{bad:?}");
        }
        for bad in [
            "", "dram", "dram:0", "ssd:1", "numa:1", "numax:1", "dram:1,", "file:0B", "dram:-1",
            "numa:x:1", "dram:1:2",
        ] {
            assert!(parse_tiers(bad).is_err(), "{bad:?}");
        }
    }
}

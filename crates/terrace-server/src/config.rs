//! `terrace serve`'s settings: defaults that serve (127.0.0.1:11211, a DRAM tier plus a
//! file tier in `./terrace-data`), a TOML file with the same keys as the flags, and the
//! flags on top (a flag beats the file, the file beats the default). Pools are the
//! `--pool NAME:PREFIX:SIZE` flags or the file's `[[pool]]` tables (`name`, `prefix`,
//! `size`); pools given as flags replace the file's.
//!
//! Invariant: a [`ServerConfig`] that passed [`ServerConfig::validate`] opens a cache or
//! fails with an error naming the setting; nothing later re-checks these values.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use terrace_cache::pools::check_pool_name;
use terrace_cache::spec::{parse_size, TierList};
use terrace_cache::PoolQuota;

/// Default TCP address, memcached's.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:11211";
/// Default tiers: memcached's 64 MiB of DRAM, then a file tier four times larger.
pub const DEFAULT_TIERS: &str = "dram:64MiB,file:256MiB";
/// Default data directory for file tiers (created).
pub const DEFAULT_DIR: &str = "terrace-data";

/// Every setting of the server.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerConfig {
    /// TCP address; `None` with a UNIX socket given (memcached's `-s` turns TCP off).
    pub listen: Option<String>,
    /// UNIX socket path.
    pub unix: Option<PathBuf>,
    /// Data directory of the file tiers (and the saved index).
    pub dir: PathBuf,
    pub tiers: TierList,
    /// Total capacity when tiers are given as ratios.
    pub capacity: Option<u64>,
    /// Worker threads.
    pub threads: usize,
    /// The cache's mover threads (per pool); `None`: the cache's default, one per four
    /// cores (`terrace_cache::default_movers`).
    pub movers: Option<usize>,
    /// Largest value accepted.
    pub max_item_size: u64,
    pub max_connections: usize,
    /// Prometheus metrics endpoint (`ADDR`, served at `/metrics`); off when `None`.
    pub metrics: Option<String>,
    /// Logs as JSON lines instead of text.
    pub log_json: bool,
    /// Promote items read often in a lower tier into the first (see `terrace-cache`);
    /// `None`: the cache's default (on with a flash tier).
    pub promote: Option<bool>,
    /// The flash tier's write budget, bytes per second (`None`: no cap).
    pub flash_write_rate: Option<u64>,
    /// The share of the flash tier that holds small items in sets (`None`: none; see
    /// `terrace_cache::FlashSetsConfig`).
    pub flash_sets: Option<f64>,
    /// Named pools, each with the key prefix that routes keys to it; keys that match no
    /// prefix go to the default pool, which gets the space the named pools leave.
    pub pools: Vec<PoolDef>,
    /// The workers' socket I/O: io_uring, epoll, or io_uring where the kernel allows it.
    pub io: IoChoice,
}

/// Which socket I/O engine the workers use (`io = "auto" | "uring" | "epoll"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoChoice {
    /// io_uring where the kernel allows it, else epoll (said in the log and `stats`).
    #[default]
    Auto,
    /// io_uring, or the server does not start.
    Uring,
    /// epoll (a readiness loop per worker).
    Epoll,
}

impl std::str::FromStr for IoChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<IoChoice, String> {
        match s {
            "auto" => Ok(IoChoice::Auto),
            "uring" | "io_uring" => Ok(IoChoice::Uring),
            "epoll" => Ok(IoChoice::Epoll),
            _ => Err(format!("io {s:?}: expected auto, uring or epoll")),
        }
    }
}

/// A named pool: keys starting with `prefix` live in it, within its quota of the cache.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolDef {
    pub name: String,
    pub prefix: String,
    pub quota: PoolQuota,
}

/// A pool quota: `25%` of the cache, or a size (`64MiB`).
pub fn parse_quota(s: &str) -> Result<PoolQuota, String> {
    match s.trim().strip_suffix('%') {
        Some(p) => match p.trim().parse::<f64>() {
            Ok(p) if p > 0.0 && p < 100.0 => Ok(PoolQuota::Percent(p)),
            _ => Err(format!(
                "pool size {s:?}: a percentage is more than 0 and less than 100"
            )),
        },
        None => parse_size(s).map(PoolQuota::Bytes),
    }
}

impl std::str::FromStr for PoolDef {
    type Err = String;

    /// `NAME:PREFIX:SIZE`; the prefix may itself contain `:` (`users:user::25%`).
    fn from_str(s: &str) -> Result<PoolDef, String> {
        let malformed =
            || format!("pool {s:?}: expected NAME:PREFIX:SIZE (e.g. sessions:sess::25%)");
        let (name, rest) = s.split_once(':').ok_or_else(malformed)?;
        let (prefix, size) = rest.rsplit_once(':').ok_or_else(malformed)?;
        Ok(PoolDef {
            name: name.to_string(),
            prefix: prefix.to_string(),
            quota: parse_quota(size)?,
        })
    }
}

impl std::fmt::Display for PoolDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.quota {
            PoolQuota::Percent(p) => write!(f, "{}:{}:{p}%", self.name, self.prefix),
            PoolQuota::Bytes(b) => write!(f, "{}:{}:{b}", self.name, self.prefix),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: Some(DEFAULT_LISTEN.to_string()),
            unix: None,
            dir: PathBuf::from(DEFAULT_DIR),
            tiers: DEFAULT_TIERS.parse().unwrap_or(TierList(Vec::new())),
            capacity: None,
            threads: std::thread::available_parallelism().map_or(4, |n| n.get()),
            movers: None,
            max_item_size: 1 << 20,
            max_connections: 1024,
            metrics: None,
            log_json: false,
            promote: None,
            flash_write_rate: None,
            flash_sets: None,
            pools: Vec::new(),
            io: IoChoice::Auto,
        }
    }
}

/// Why the settings cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path:?}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path:?}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{setting}: {message}")]
    Invalid {
        setting: &'static str,
        message: String,
    },
}

/// A size in the config file: an integer of bytes or a string with a unit (`"64MiB"`).
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

impl Size {
    fn bytes(&self, setting: &'static str) -> Result<u64, ConfigError> {
        match self {
            Size::Bytes(b) => Ok(*b),
            Size::Text(s) => {
                parse_size(s).map_err(|message| ConfigError::Invalid { setting, message })
            }
        }
    }
}

/// The config file: every key optional, named as the long flags (`max-item-size` or
/// `max_item_size`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct FileConfig {
    #[serde(alias = "listen_addr")]
    listen: Option<String>,
    unix: Option<PathBuf>,
    dir: Option<PathBuf>,
    tiers: Option<String>,
    capacity: Option<Size>,
    threads: Option<usize>,
    movers: Option<usize>,
    #[serde(alias = "max_item_size")]
    max_item_size: Option<Size>,
    #[serde(alias = "max_connections")]
    max_connections: Option<usize>,
    metrics: Option<String>,
    #[serde(alias = "log_json")]
    log_json: Option<bool>,
    promote: Option<bool>,
    /// Bytes per second: an integer or a size with a unit (`"50MiB"`).
    #[serde(alias = "flash_write_rate")]
    flash_write_rate: Option<Size>,
    /// A share of the flash tier, 0.05 to 0.95.
    #[serde(alias = "flash_sets")]
    flash_sets: Option<f64>,
    /// `auto`, `uring` or `epoll`.
    io: Option<String>,
    /// `[[pool]]` tables.
    pool: Option<Vec<FilePool>>,
}

/// One `[[pool]]` table of the config file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePool {
    name: String,
    prefix: String,
    /// Bytes, a size with a unit (`"64MiB"`) or a percentage (`"25%"`).
    size: Size,
}

/// Settings given on the command line (each `None` when the flag was absent).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub listen: Option<String>,
    pub unix: Option<PathBuf>,
    pub dir: Option<PathBuf>,
    pub tiers: Option<TierList>,
    pub capacity: Option<u64>,
    pub threads: Option<usize>,
    pub movers: Option<usize>,
    pub max_item_size: Option<u64>,
    pub max_connections: Option<usize>,
    pub metrics: Option<String>,
    pub log_json: bool,
    pub promote: Option<bool>,
    pub flash_write_rate: Option<u64>,
    pub flash_sets: Option<f64>,
    /// Replace the config file's pools when not empty.
    pub pools: Vec<PoolDef>,
    pub io: Option<IoChoice>,
}

impl ServerConfig {
    /// Defaults, then the config file (if any), then the flags; validated.
    pub fn resolve(flags: Overrides) -> Result<ServerConfig, ConfigError> {
        let mut c = ServerConfig::default();
        if let Some(path) = &flags.config {
            c.apply_file(path)?;
        }
        if flags.unix.is_some() && flags.listen.is_none() {
            c.listen = None;
        }
        if let Some(v) = flags.listen {
            c.listen = Some(v);
        }
        if let Some(v) = flags.unix {
            c.unix = Some(v);
        }
        if let Some(v) = flags.dir {
            c.dir = v;
        }
        if let Some(v) = flags.tiers {
            c.tiers = v;
        }
        if let Some(v) = flags.capacity {
            c.capacity = Some(v);
        }
        if let Some(v) = flags.threads {
            c.threads = v;
        }
        if let Some(v) = flags.movers {
            c.movers = Some(v);
        }
        if let Some(v) = flags.max_item_size {
            c.max_item_size = v;
        }
        if let Some(v) = flags.max_connections {
            c.max_connections = v;
        }
        if let Some(v) = flags.metrics {
            c.metrics = Some(v);
        }
        c.log_json |= flags.log_json;
        if let Some(v) = flags.promote {
            c.promote = Some(v);
        }
        if let Some(v) = flags.flash_write_rate {
            c.flash_write_rate = Some(v);
        }
        if let Some(v) = flags.flash_sets {
            c.flash_sets = Some(v);
        }
        if !flags.pools.is_empty() {
            c.pools = flags.pools;
        }
        if let Some(v) = flags.io {
            c.io = v;
        }
        c.validate()?;
        Ok(c)
    }

    fn apply_file(&mut self, path: &Path) -> Result<(), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.apply_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    /// Applies a config file's text.
    pub fn apply_toml(&mut self, text: &str) -> Result<(), ConfigError> {
        let f: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.to_string(),
        })?;
        if f.unix.is_some() && f.listen.is_none() {
            self.listen = None;
        }
        if let Some(v) = f.listen {
            self.listen = Some(v);
        }
        if let Some(v) = f.unix {
            self.unix = Some(v);
        }
        if let Some(v) = f.dir {
            self.dir = v;
        }
        if let Some(v) = f.tiers {
            self.tiers = v.parse().map_err(|message| ConfigError::Invalid {
                setting: "tiers",
                message,
            })?;
        }
        if let Some(v) = f.capacity {
            self.capacity = Some(v.bytes("capacity")?);
        }
        if let Some(v) = f.threads {
            self.threads = v;
        }
        if let Some(v) = f.movers {
            self.movers = Some(v);
        }
        if let Some(v) = f.max_item_size {
            self.max_item_size = v.bytes("max-item-size")?;
        }
        if let Some(v) = f.max_connections {
            self.max_connections = v;
        }
        if let Some(v) = f.metrics {
            self.metrics = Some(v);
        }
        if let Some(v) = f.log_json {
            self.log_json = v;
        }
        if let Some(v) = f.promote {
            self.promote = Some(v);
        }
        if let Some(v) = f.flash_write_rate {
            self.flash_write_rate = Some(v.bytes("flash-write-rate")?);
        }
        if let Some(v) = f.flash_sets {
            self.flash_sets = Some(v);
        }
        if let Some(v) = f.io {
            self.io = v.parse().map_err(|message| ConfigError::Invalid {
                setting: "io",
                message,
            })?;
        }
        if let Some(pools) = f.pool {
            self.pools = pools
                .into_iter()
                .map(|p| {
                    let quota = match p.size {
                        Size::Bytes(b) => Ok(PoolQuota::Bytes(b)),
                        Size::Text(t) => parse_quota(&t),
                    }
                    .map_err(|message| ConfigError::Invalid {
                        setting: "pool",
                        message,
                    })?;
                    Ok(PoolDef {
                        name: p.name,
                        prefix: p.prefix,
                        quota,
                    })
                })
                .collect::<Result<_, ConfigError>>()?;
        }
        Ok(())
    }

    /// Checks what can be checked before opening anything.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |setting, message: &str| {
            Err(ConfigError::Invalid {
                setting,
                message: message.to_string(),
            })
        };
        if self.listen.is_none() && self.unix.is_none() {
            return invalid(
                "listen",
                "no TCP address and no UNIX socket: nothing to serve",
            );
        }
        if self.tiers.0.is_empty() {
            return invalid("tiers", "at least one tier is needed");
        }
        if self.tiers.has_ratio() && self.capacity.is_none() {
            return invalid("capacity", "tiers given as ratios need a total capacity");
        }
        if self.threads == 0 || self.threads > 1024 {
            return invalid("threads", "must be between 1 and 1024");
        }
        if self.movers.is_some_and(|m| m == 0 || m > 256) {
            return invalid("movers", "must be between 1 and 256");
        }
        if self.max_item_size == 0 || self.max_item_size > 1 << 30 {
            return invalid("max-item-size", "must be between 1 byte and 1 GiB");
        }
        if self.max_connections == 0 {
            return invalid("max-connections", "must be at least 1");
        }
        if let Some(rate) = self.flash_write_rate {
            if rate == 0 {
                return invalid("flash-write-rate", "must be at least 1 byte per second");
            }
            if !self.tiers.has_flash() {
                return invalid(
                    "flash-write-rate",
                    "needs a flash tier (--tiers ...,flash:SIZE)",
                );
            }
        }
        if let Some(share) = self.flash_sets {
            if !(0.05..=0.95).contains(&share) {
                return invalid("flash-sets", "must be a share between 0.05 and 0.95");
            }
            if !self.tiers.has_flash() {
                return invalid("flash-sets", "needs a flash tier (--tiers ...,flash:SIZE)");
            }
        }
        for (i, pool) in self.pools.iter().enumerate() {
            if let Err(e) = check_pool_name(&pool.name) {
                return invalid("pool", &e.to_string());
            }
            let prefix = pool.prefix.as_bytes();
            if prefix.is_empty()
                || prefix.len() > 250
                || prefix
                    .iter()
                    .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
            {
                return invalid(
                    "pool",
                    &format!(
                        "pool {:?}: a prefix is 1 to 250 bytes of a key, no spaces or control \
                         characters",
                        pool.name
                    ),
                );
            }
            if let Some(other) = self.pools[..i]
                .iter()
                .find(|p| p.name == pool.name || p.prefix == pool.prefix)
            {
                return invalid(
                    "pool",
                    &format!(
                        "pools {:?} and {:?} share a name or a prefix",
                        other.name, pool.name
                    ),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use terrace_cache::TierSize;

    #[test]
    fn defaults_serve() {
        let c = ServerConfig::resolve(Overrides::default()).unwrap();
        assert_eq!(c.listen.as_deref(), Some(DEFAULT_LISTEN));
        assert_eq!(c.dir, PathBuf::from(DEFAULT_DIR));
        assert_eq!(c.tiers.to_string(), DEFAULT_TIERS);
        assert!(c.tiers.has_file());
        assert_eq!(c.promote, None, "the cache's default: on with a flash tier");
    }

    #[test]
    fn file_then_flags() {
        let mut c = ServerConfig::default();
        c.apply_toml(
            "listen = \"127.0.0.1:9\"\ntiers = \"dram:1,file:3\"\ncapacity = \"1GiB\"\n\
             max-item-size = 2097152\nthreads = 3\nmax_connections = 10\npromote = true\n",
        )
        .unwrap();
        assert_eq!(c.promote, Some(true));
        assert_eq!(c.listen.as_deref(), Some("127.0.0.1:9"));
        assert_eq!(c.capacity, Some(1 << 30));
        assert_eq!(c.max_item_size, 2 << 20);
        assert_eq!(c.threads, 3);
        assert_eq!(c.max_connections, 10);
        assert_eq!(c.tiers.0[1].size, TierSize::Ratio(3));
        c.validate().unwrap();

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(
            &path,
            "threads = 3\nunix = \"/tmp/x.sock\"\npromote = true\nmovers = 2\n",
        )
        .unwrap();
        let c = ServerConfig::resolve(Overrides {
            config: Some(path.clone()),
            ..Overrides::default()
        })
        .unwrap();
        assert_eq!(c.movers, Some(2), "the file's movers");
        let c = ServerConfig::resolve(Overrides {
            config: Some(path),
            threads: Some(5),
            movers: Some(6),
            promote: Some(false),
            ..Overrides::default()
        })
        .unwrap();
        assert_eq!(c.threads, 5);
        assert_eq!(c.movers, Some(6), "--movers over the file's");
        assert_eq!(c.promote, Some(false), "--promote=false over the file's");
        assert_eq!(c.listen, None, "a UNIX socket alone turns TCP off");
        assert_eq!(c.unix, Some(PathBuf::from("/tmp/x.sock")));
    }

    #[test]
    fn pools_from_the_file_and_the_flags() {
        let mut c = ServerConfig::default();
        c.apply_toml(
            "[[pool]]\nname = \"sessions\"\nprefix = \"sess:\"\nsize = \"25%\"\n\
             [[pool]]\nname = \"users\"\nprefix = \"user:\"\nsize = \"64MiB\"\n",
        )
        .unwrap();
        assert_eq!(
            c.pools,
            [
                PoolDef {
                    name: "sessions".into(),
                    prefix: "sess:".into(),
                    quota: PoolQuota::Percent(25.0)
                },
                PoolDef {
                    name: "users".into(),
                    prefix: "user:".into(),
                    quota: PoolQuota::Bytes(64 << 20)
                },
            ]
        );
        c.validate().unwrap();
        let flag: PoolDef = "users:user::12.5%".parse().unwrap();
        assert_eq!(flag.prefix, "user:");
        assert_eq!(flag.quota, PoolQuota::Percent(12.5));
        assert_eq!(flag.to_string().parse::<PoolDef>().unwrap(), flag);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(
            &path,
            "[[pool]]\nname = \"a\"\nprefix = \"a:\"\nsize = 4194304\n",
        )
        .unwrap();
        let c = ServerConfig::resolve(Overrides {
            config: Some(path.clone()),
            ..Overrides::default()
        })
        .unwrap();
        assert_eq!(c.pools[0].quota, PoolQuota::Bytes(4 << 20));
        let c = ServerConfig::resolve(Overrides {
            config: Some(path),
            pools: vec![flag.clone()],
            ..Overrides::default()
        })
        .unwrap();
        assert_eq!(c.pools, [flag], "flags replace the file's pools");
    }

    #[test]
    fn bad_pools_are_named() {
        for (spec, why) in [
            ("nosize", "NAME:PREFIX:SIZE"),
            ("a:b", "NAME:PREFIX:SIZE"),
            ("a:b:0%", "percentage"),
            ("a:b:100%", "percentage"),
            ("a:b:lots", "expected a number"),
            ("a:b:64XB", "unknown unit"),
        ] {
            let e = spec.parse::<PoolDef>().unwrap_err();
            assert!(e.contains(why), "{spec}: {e}");
        }
        for (pools, why) in [
            ("default:d:10%", "default"),
            ("a b:x:10%", "letters"),
            ("a::10%", "prefix"),
            ("a:x y:10%", "prefix"),
            ("a:x:10%,a:y:10%", "share"),
            ("a:x:10%,b:x:10%", "share"),
        ] {
            let e = ServerConfig::resolve(Overrides {
                pools: pools.split(',').map(|p| p.parse().unwrap()).collect(),
                ..Overrides::default()
            })
            .unwrap_err()
            .to_string();
            assert!(e.starts_with("pool:") && e.contains(why), "{pools}: {e}");
        }
        let e = ServerConfig::default()
            .apply_toml("[[pool]]\nname = \"a\"\nprefix = \"a\"\nsize = \"150%\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("pool:"), "{e}");
    }

    #[test]
    fn bad_settings_are_named() {
        let mut c = ServerConfig::default();
        let e = c.apply_toml("bogus = 1\n").unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
        let e = c.apply_toml("tiers = \"ssd:1\"\n").unwrap_err().to_string();
        assert!(e.starts_with("tiers:"), "{e}");
        let e = c
            .apply_toml("max-item-size = \"1XB\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("max-item-size:"), "{e}");
        let mut c = ServerConfig::default();
        c.apply_toml("tiers = \"dram:1,file:1\"\n").unwrap();
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("capacity:"));
        let e = ServerConfig::resolve(Overrides {
            config: Some(PathBuf::from("/nonexistent/terrace.toml")),
            ..Overrides::default()
        })
        .unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        let e = ServerConfig::resolve(Overrides {
            threads: Some(0),
            ..Overrides::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("threads:"));
        let e = ServerConfig::resolve(Overrides {
            movers: Some(0),
            ..Overrides::default()
        })
        .unwrap_err();
        assert!(e.to_string().starts_with("movers:"));
        assert_eq!(ServerConfig::default().movers, None, "the cache's default");
    }

    #[test]
    fn flash_sets_need_a_flash_tier_and_a_share_in_range() {
        let mut c = ServerConfig::default();
        c.apply_toml("tiers = \"dram:64MiB,flash:1GiB\"\nflash-sets = 0.8\n")
            .unwrap();
        assert_eq!(c.flash_sets, Some(0.8));
        c.validate().unwrap();
        for (tiers, share) in [("dram:64MiB,flash:1GiB", 0.99), ("dram:64MiB", 0.5)] {
            let e = ServerConfig::resolve(Overrides {
                tiers: Some(tiers.parse().unwrap()),
                flash_sets: Some(share),
                ..Overrides::default()
            })
            .unwrap_err()
            .to_string();
            assert!(e.starts_with("flash-sets:"), "{e}");
        }
    }

    #[test]
    fn a_flash_write_rate_needs_a_flash_tier() {
        let mut c = ServerConfig::default();
        c.apply_toml("tiers = \"dram:64MiB,flash:1GiB\"\nflash-write-rate = \"50MiB\"\n")
            .unwrap();
        assert_eq!(c.flash_write_rate, Some(50 << 20));
        c.validate().unwrap();
        let e = ServerConfig::resolve(Overrides {
            flash_write_rate: Some(1 << 20),
            ..Overrides::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("flash-write-rate:"), "{e}");
        let e = ServerConfig::default()
            .apply_toml("flash-write-rate = \"fast\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("flash-write-rate:"), "{e}");
    }
}

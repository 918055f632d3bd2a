//! `terrace serve`'s settings: defaults that serve (127.0.0.1:11211, a DRAM tier plus a
//! file tier in `./terrace-data`), a TOML file with the same keys as the flags, and the
//! flags on top (a flag beats the file, the file beats the default).
//!
//! Invariant: a [`ServerConfig`] that passed [`ServerConfig::validate`] opens a cache or
//! fails with an error naming the setting; nothing later re-checks these values.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use terrace_cache::spec::{parse_size, TierList};

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
    /// Largest value accepted.
    pub max_item_size: u64,
    pub max_connections: usize,
    /// Prometheus metrics endpoint (`ADDR`, served at `/metrics`); off when `None`.
    pub metrics: Option<String>,
    /// Logs as JSON lines instead of text.
    pub log_json: bool,
    /// Promote items read often in a lower tier into the first (see `terrace-cache`).
    pub promote: bool,
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
            max_item_size: 1 << 20,
            max_connections: 1024,
            metrics: None,
            log_json: false,
            promote: false,
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
    #[serde(alias = "max_item_size")]
    max_item_size: Option<Size>,
    #[serde(alias = "max_connections")]
    max_connections: Option<usize>,
    metrics: Option<String>,
    #[serde(alias = "log_json")]
    log_json: Option<bool>,
    promote: Option<bool>,
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
    pub max_item_size: Option<u64>,
    pub max_connections: Option<usize>,
    pub metrics: Option<String>,
    pub log_json: bool,
    pub promote: bool,
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
        c.promote |= flags.promote;
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
            self.promote = v;
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
        if self.max_item_size == 0 || self.max_item_size > 1 << 30 {
            return invalid("max-item-size", "must be between 1 byte and 1 GiB");
        }
        if self.max_connections == 0 {
            return invalid("max-connections", "must be at least 1");
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
    }

    #[test]
    fn file_then_flags() {
        let mut c = ServerConfig::default();
        c.apply_toml(
            "listen = \"127.0.0.1:9\"\ntiers = \"dram:1,file:3\"\ncapacity = \"1GiB\"\n\
             max-item-size = 2097152\nthreads = 3\nmax_connections = 10\npromote = true\n",
        )
        .unwrap();
        assert!(c.promote);
        assert_eq!(c.listen.as_deref(), Some("127.0.0.1:9"));
        assert_eq!(c.capacity, Some(1 << 30));
        assert_eq!(c.max_item_size, 2 << 20);
        assert_eq!(c.threads, 3);
        assert_eq!(c.max_connections, 10);
        assert_eq!(c.tiers.0[1].size, TierSize::Ratio(3));
        c.validate().unwrap();

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(&path, "threads = 3\nunix = \"/tmp/x.sock\"\n").unwrap();
        let c = ServerConfig::resolve(Overrides {
            config: Some(path),
            threads: Some(5),
            ..Overrides::default()
        })
        .unwrap();
        assert_eq!(c.threads, 5);
        assert_eq!(c.listen, None, "a UNIX socket alone turns TCP off");
        assert_eq!(c.unix, Some(PathBuf::from("/tmp/x.sock")));
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
    }
}

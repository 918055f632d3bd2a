//! `terrace-bench map`: Terrace's persistent ordered map (terrace-collections) against
//! redb, an embedded persistent B-tree store, on the same directory (issue 19).
//!
//! Phases, one engine per run: put `--keys` random keys (`--key-size` bytes, values of
//! `--value-size` bytes), each put durable on return (redb: one write transaction per put
//! unless `--batch`, committed with its default immediate durability); get `--ops`
//! random present keys (each value checked); `--ops / 100` scans of 100 entries forward
//! from a random present key; the bytes the store uses per entry (Terrace: heap pages in
//! use; redb: the file's length); then close, reopen, and time until the first get
//! returned. One JSON object is printed.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use redb::ReadableDatabase;
use serde_json::{json, Value};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapEngine {
    Terrace,
    Redb,
}

#[derive(clap::Args, Debug)]
pub struct MapArgs {
    #[arg(long, value_enum)]
    engine: MapEngine,
    /// Directory for the pool or database file (tmpfs: /dev/shm).
    #[arg(long, default_value = "/dev/shm")]
    dir: PathBuf,
    /// Keys to put.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Gets (and ops/100 scans) after the puts.
    #[arg(long, default_value_t = 1_000_000)]
    ops: u64,
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(8..=255))]
    key_size: u32,
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(8..=4096))]
    value_size: u32,
    /// redb: puts per write transaction (1: each put durable).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    batch: u32,
    #[arg(long, default_value_t = 42)]
    seed: u64,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn key_of(id: u64, size: usize) -> Vec<u8> {
    // Random-looking, unique: a bijective mix of the id, repeated to the size.
    let mut r = Rng(id);
    let mut k = Vec::with_capacity(size);
    k.extend_from_slice(&r.next().to_be_bytes());
    k.extend_from_slice(&id.to_be_bytes());
    while k.len() < size {
        k.extend_from_slice(&r.next().to_be_bytes());
    }
    k.truncate(size);
    k
}

fn value_of(id: u64, size: usize) -> Vec<u8> {
    let mut v = id.to_le_bytes().to_vec();
    v.resize(size, (id % 251) as u8);
    v
}

/// One engine behind the phases.
trait Store {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()>;
    fn flush(&mut self) -> Result<()>;
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool>;
    /// Visits up to `n` entries from `from` ascending; returns how many.
    fn scan(&mut self, from: &[u8], n: usize) -> Result<usize>;
    fn bytes_used(&mut self) -> Result<u64>;
}

struct Terrace {
    map: terrace_collections::OrderedMap<'static, terrace_pool::RegionBackend>,
    pool: &'static terrace_pool::Pool,
}

const LAYOUT: &str = "terrace-bench-map";

impl Terrace {
    fn open(path: &std::path::Path, create: Option<(u64, u32, u32)>) -> Result<Terrace> {
        let pool = match create {
            Some((size, _, _)) => terrace_pool::Pool::create(path, size, LAYOUT)?,
            None => terrace_pool::Pool::open(path, LAYOUT)?,
        };
        // Leaked for the run's length (the benchmark process ends after it).
        let pool: &'static terrace_pool::Pool = Box::leak(Box::new(pool));
        // The directory is needed only to find (or create) the map.
        let colls = terrace_collections::Collections::open(pool)?;
        let opts = match create {
            Some((_, k, v)) => terrace_collections::MapOptions::create(k, v),
            None => terrace_collections::MapOptions::existing(),
        };
        let map = colls.ordered_map("bench", opts)?;
        Ok(Terrace { map, pool })
    }
}

impl Store for Terrace {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.map.put(key, value)?;
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        Ok(self.map.get_into(key, out)?)
    }
    fn scan(&mut self, from: &[u8], n: usize) -> Result<usize> {
        let mut seen = 0;
        let mut range = self.map.range(
            std::ops::Bound::Included(from),
            std::ops::Bound::Unbounded,
            false,
        );
        while seen < n {
            match range.next_entry()? {
                Some(e) => std::hint::black_box(e),
                None => break,
            };
            seen += 1;
        }
        Ok(seen)
    }
    fn bytes_used(&mut self) -> Result<u64> {
        let s = self.pool.stats();
        Ok(s.heap_bytes - s.free_bytes)
    }
}

const TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("bench");

struct Redb {
    db: redb::Database,
    path: PathBuf,
    batch: u32,
    pending: Option<redb::WriteTransaction>,
    in_batch: u32,
}

impl Store for Redb {
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if self.pending.is_none() {
            self.pending = Some(self.db.begin_write()?);
        }
        let txn = self.pending.as_ref().expect("just set");
        txn.open_table(TABLE)?.insert(key, value)?;
        self.in_batch += 1;
        if self.in_batch >= self.batch {
            self.flush()?;
        }
        Ok(())
    }
    fn flush(&mut self) -> Result<()> {
        if let Some(txn) = self.pending.take() {
            txn.commit()?;
        }
        self.in_batch = 0;
        Ok(())
    }
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(TABLE)?;
        match table.get(key)? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(v.value());
                Ok(true)
            }
            None => Ok(false),
        }
    }
    fn scan(&mut self, from: &[u8], n: usize) -> Result<usize> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(TABLE)?;
        let mut seen = 0;
        for e in table.range(from..)?.take(n) {
            let (k, v) = e?;
            std::hint::black_box((k.value(), v.value()));
            seen += 1;
        }
        Ok(seen)
    }
    fn bytes_used(&mut self) -> Result<u64> {
        Ok(std::fs::metadata(&self.path)?.len())
    }
}

fn ns_per(start: Instant, n: u64) -> f64 {
    start.elapsed().as_nanos() as f64 / n.max(1) as f64
}

pub fn run(a: &MapArgs) -> Result<Value> {
    ensure!(a.keys > 0, "--keys must be positive");
    let dir =
        tempfile::tempdir_in(&a.dir).with_context(|| format!("a folder in {}", a.dir.display()))?;
    let (ks, vs) = (a.key_size as usize, a.value_size as usize);
    let path = dir.path().join("store");
    let open = |create: bool| -> Result<Box<dyn Store>> {
        Ok(match a.engine {
            MapEngine::Terrace => {
                // Room for the entries at several times their raw size, plus slack.
                let size = (a.keys * (ks + vs) as u64 * 4 + (64 << 20)).next_multiple_of(2 << 20);
                let create = create.then_some((size, a.key_size, a.value_size.min(254)));
                Box::new(Terrace::open(&path, create)?)
            }
            MapEngine::Redb => {
                let db = if create {
                    redb::Database::create(&path)?
                } else {
                    redb::Database::open(&path)?
                };
                Box::new(Redb {
                    db,
                    path: path.clone(),
                    batch: a.batch,
                    pending: None,
                    in_batch: 0,
                })
            }
        })
    };
    let mut store = open(true)?;
    let start = Instant::now();
    for id in 0..a.keys {
        store.put(&key_of(id, ks), &value_of(id, vs))?;
    }
    store.flush()?;
    let put_ns = ns_per(start, a.keys);

    let mut rng = Rng(a.seed);
    let ids: Vec<u64> = (0..a.ops).map(|_| rng.next() % a.keys).collect();
    let keys: Vec<Vec<u8>> = ids.iter().map(|&id| key_of(id, ks)).collect();
    let mut out = Vec::new();
    let start = Instant::now();
    for (id, k) in ids.iter().zip(&keys) {
        if !store.get(k, &mut out)? || out[..8] != id.to_le_bytes() {
            bail!("get of id {id} returned a wrong value");
        }
    }
    let get_ns = ns_per(start, a.ops);

    let scans = (a.ops / 100).max(1);
    let start = Instant::now();
    let mut visited = 0;
    for k in keys.iter().take(scans as usize) {
        visited += store.scan(k, 100)?;
    }
    let scan_ns = ns_per(start, scans);
    let bytes = store.bytes_used()?;
    drop(store);

    let start = Instant::now();
    let mut store = open(false)?;
    let first = key_of(ids[0], ks);
    ensure!(
        store.get(&first, &mut out)?,
        "the first get after reopen missed"
    );
    let reopen_ms = start.elapsed().as_secs_f64() * 1e3;

    Ok(json!({
        "engine": format!("{:?}", a.engine).to_lowercase(),
        "keys": a.keys,
        "key_size": ks,
        "value_size": vs,
        "batch": a.batch,
        "put_ns": put_ns,
        "get_ns": get_ns,
        "scan100_ns": scan_ns,
        "scan_entries": visited,
        "bytes_per_entry": bytes as f64 / a.keys as f64,
        "raw_bytes_per_entry": ks + vs,
        "reopen_first_get_ms": reopen_ms,
    }))
}

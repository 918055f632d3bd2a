//! `terrace`: a thin command line over the Terrace crates.
//!
//! - `terrace info [--dir DIR]`: what the media layer sees on this machine — NUMA nodes
//!   (CPU-less ones are PMem/CXL), HMAT attributes, the cache-flush instruction, and for a
//!   directory whether it is DAX, what a persisted write there survives and how much room
//!   it has.
//! - `terrace bench kinds [--dir DIR] [--max-size BYTES]`: allocation speed of a file kind
//!   (the persistent/CXL tier emulated by a file in DIR) against the DRAM kind, over the
//!   sizes memkind's own anchor uses.
//!
//! - `terrace pool create|info|check|stats PATH`: persistent pools (see `pool.rs`).
//!
//! - `terrace serve [FLAGS]`: the memcached-compatible tiered cache server (see
//!   `serve.rs` and the terrace-server crate).
//!
//! Modules: one per subcommand — `info`, `bench` (`bench kinds`), `pool`, `serve`; this
//! file only parses the command line and dispatches.

#![forbid(unsafe_code)]

mod bench;
mod info;
mod pool;
mod serve;
mod volume;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "terrace",
    version,
    about = "Tiered-memory engine: heaps, pools and caches over DRAM, PMem/CXL and flash"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the tiered cache over memcached's protocols (ascii, meta, binary).
    Serve(Box<serve::ServeArgs>),
    /// Serve cached block volumes over NBD: Terrace's tiers in front of a file, a block
    /// device, any NBD server or S3, in write-through, write-back, write-around,
    /// read-only or storage mode.
    ServeVolume(Box<volume::ServeVolumeArgs>),
    /// Ask a running serve-volume: status, flush, mode, resize, snapshot, metrics, replicas.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Show the memory media this machine offers.
    Info {
        /// Also probe this directory as a file tier (DAX? durability? free space?).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Run a benchmark.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Create, inspect and check persistent pools.
    #[command(subcommand)]
    Pool(PoolCommand),
}

#[derive(Subcommand)]
enum VolumeCommand {
    /// Each volume's mode, dirty and log bytes, hits and misses, write-back progress.
    Status {
        #[arg(long, default_value = "terrace-volume-data/control.sock")]
        control: PathBuf,
        /// One volume [default: all].
        name: Option<String>,
    },
    /// Write every dirty block back to the backend; returns when done.
    Flush {
        #[arg(long, default_value = "terrace-volume-data/control.sock")]
        control: PathBuf,
        name: Option<String>,
    },
    /// Switch a volume's mode while it runs.
    Mode {
        #[arg(long, default_value = "terrace-volume-data/control.sock")]
        control: PathBuf,
        name: String,
        /// write-through, write-back, write-around, read-only or storage.
        mode: String,
    },
    /// Grow a volume while it runs (clients that connect afterwards see the new size).
    Resize {
        #[arg(long, default_value = "terrace-volume-data/control.sock")]
        control: PathBuf,
        name: String,
        /// The new size: 10GiB, 512MiB, or bytes; larger than now.
        size: String,
    },
    /// Write a volume back and copy its backend as it is now (a file backend gets
    /// `<file>.snap-<TAG>` beside it); prints where the snapshot is.
    Snapshot {
        #[arg(long, default_value = "terrace-volume-data/control.sock")]
        control: PathBuf,
        name: String,
        /// 1 to 64 of A-Z a-z 0-9 - _ . (not first).
        tag: String,
    },
    /// Every volume's counters as Prometheus text.
    Metrics {
        #[arg(long, default_value = "terrace-volume-data/control.sock")]
        control: PathBuf,
    },
    /// The copies of other nodes' volumes this node keeps (--replica-listen): whole or
    /// not, epoch, stream.
    Replicas {
        #[arg(long, default_value = "terrace-volume-data/control.sock")]
        control: PathBuf,
    },
}

#[derive(Subcommand)]
enum PoolCommand {
    /// Create a pool file.
    Create {
        path: PathBuf,
        /// Size in bytes (rounded up to 2 MiB).
        #[arg(long, default_value_t = 64 << 20)]
        size: u64,
        /// Layout name recorded in the pool (at most 63 bytes).
        #[arg(long, default_value = "terrace")]
        layout: String,
    },
    /// Show the header, geometry and fill of a pool.
    Info {
        path: PathBuf,
        /// Require this layout name (default: accept any).
        #[arg(long)]
        layout: Option<String>,
    },
    /// Verify every invariant of the heap and of every named collection, and list the
    /// collections' objects no name reaches; exits non-zero naming what is broken and
    /// where, or when unreachable objects remain.
    Check {
        path: PathBuf,
        #[arg(long)]
        layout: Option<String>,
        /// Free the unreachable objects (each free is crash-atomic).
        #[arg(long)]
        sweep: bool,
    },
    /// Allocated, free and per-class occupancy.
    Stats {
        path: PathBuf,
        #[arg(long)]
        layout: Option<String>,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// File kind against DRAM kind: malloc and free (kind detected) per size.
    Kinds {
        /// Directory of the file kind (a tmpfs such as /dev/shm emulates PMem).
        #[arg(long, default_value = "/dev/shm")]
        dir: PathBuf,
        /// Maximum size of the file kind in bytes.
        #[arg(long, default_value_t = 4 << 30)]
        max_size: usize,
        /// Bytes allocated per size (objects = min(this / size, 4,000,000)).
        #[arg(long, default_value_t = 1 << 30)]
        volume: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::ServeVolume(args) => volume::serve(*args),
        Command::Volume(VolumeCommand::Status { control, name }) => {
            volume::control(&control, &format!("status {}", name.unwrap_or_default()))
        }
        Command::Volume(VolumeCommand::Flush { control, name }) => {
            volume::control(&control, &format!("flush {}", name.unwrap_or_default()))
        }
        Command::Volume(VolumeCommand::Mode {
            control,
            name,
            mode,
        }) => volume::control(&control, &format!("mode {name} {mode}")),
        Command::Volume(VolumeCommand::Resize {
            control,
            name,
            size,
        }) => volume::control(&control, &format!("resize {name} {size}")),
        Command::Volume(VolumeCommand::Snapshot { control, name, tag }) => {
            volume::control(&control, &format!("snapshot {name} {tag}"))
        }
        Command::Volume(VolumeCommand::Metrics { control }) => volume::control(&control, "metrics"),
        Command::Volume(VolumeCommand::Replicas { control }) => {
            volume::control(&control, "replicas")
        }
        Command::Info { dir } => info::run(dir.as_deref()),
        Command::Bench(BenchCommand::Kinds {
            dir,
            max_size,
            volume,
        }) => bench::kinds(&dir, max_size, volume),
        Command::Pool(PoolCommand::Create { path, size, layout }) => {
            pool::create(&path, size, &layout)
        }
        Command::Pool(PoolCommand::Info { path, layout }) => pool::info(&path, layout.as_deref()),
        Command::Pool(PoolCommand::Check {
            path,
            layout,
            sweep,
        }) => pool::check(&path, layout.as_deref(), sweep),
        Command::Pool(PoolCommand::Stats { path, layout }) => pool::stats(&path, layout.as_deref()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("terrace: {message}");
            ExitCode::FAILURE
        }
    }
}

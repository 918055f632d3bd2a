//! What a `cache` run costs the machine, sampled from `/proc` while it runs (`--pid`,
//! default this process): every 100 ms the process's `VmRSS` (`/proc/PID/status`) and
//! the page-cache bytes of the engine's files, and `/proc/PID/io` `read_bytes` /
//! `write_bytes` at the start and the end.
//!
//! - The engine's files: every regular file under the paths given (`--pid-files`, or the
//!   run's own directory for the engines that have one), listed again at every sample so
//!   files created during the run count. Their page-cache bytes come from util-linux's
//!   `fincore` (`mincore(2)` would need `unsafe`); a `fincore` that takes longer than
//!   [`SLOW_FINCORE`] is asked at most once a second, its last answer standing in between.
//! - `peak_dram_bytes` is the largest sum of a sample's `VmRSS` and page-cache bytes: a
//!   buffered engine's page cache is DRAM it uses, whoever is billed for it.
//! - Nothing here fails a run: a file that cannot be read (another user's `/proc/PID/io`,
//!   a missing `fincore`) makes its figure `null`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Time between two samples.
pub const INTERVAL: Duration = Duration::from_millis(100);
/// A `fincore` slower than this is asked at most once per [`SLOW_INTERVAL`].
pub const SLOW_FINCORE: Duration = Duration::from_millis(20);
const SLOW_INTERVAL: Duration = Duration::from_secs(1);

/// The process and files to watch.
pub struct Target {
    /// `/proc/<pid>`, or `/proc/self`.
    proc_dir: PathBuf,
    pub pid: Option<u32>,
    files: Vec<PathBuf>,
}

impl Target {
    pub fn new(pid: Option<u32>, files: Vec<PathBuf>) -> Target {
        let proc_dir = match pid {
            Some(p) => PathBuf::from(format!("/proc/{p}")),
            None => PathBuf::from("/proc/self"),
        };
        Target {
            proc_dir,
            pid,
            files,
        }
    }

    /// `VmRSS` in bytes.
    fn rss(&self) -> Option<u64> {
        let status = std::fs::read_to_string(self.proc_dir.join("status")).ok()?;
        kib_field(&status, "VmRSS:")
    }

    /// `(read_bytes, write_bytes)` of `/proc/PID/io`.
    fn io(&self) -> Option<(u64, u64)> {
        let io = std::fs::read_to_string(self.proc_dir.join("io")).ok()?;
        let field = |name: &str| -> Option<u64> {
            io.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().parse().ok())
        };
        Some((field("read_bytes:")?, field("write_bytes:")?))
    }
}

/// A `Name:   123 kB` line of `/proc/PID/status`, in bytes.
fn kib_field(status: &str, name: &str) -> Option<u64> {
    let v = status.lines().find_map(|l| l.strip_prefix(name))?;
    let kb: u64 = v.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// Every regular file under `paths` (a path that is a file is itself), recursively.
fn list_files(paths: &[PathBuf]) -> Vec<PathBuf> {
    fn walk(p: &Path, out: &mut Vec<PathBuf>, depth: u32) {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return;
        };
        if meta.is_file() {
            out.push(p.to_path_buf());
        } else if meta.is_dir() && depth < 16 {
            if let Ok(entries) = std::fs::read_dir(p) {
                for e in entries.flatten() {
                    walk(&e.path(), out, depth + 1);
                }
            }
        }
    }
    let mut out = Vec::new();
    for p in paths {
        walk(p, &mut out, 0);
    }
    out
}

/// Page-cache bytes of `files` (their sum) per `fincore`, or `None` if it cannot say.
/// No files is zero bytes.
fn page_cache(files: &[PathBuf]) -> Option<u64> {
    if files.is_empty() {
        return Some(0);
    }
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--raw", "-o", "RES"])
        .args(files)
        .output()
        .ok()?;
    // A file removed between the listing and the call makes fincore fail for it alone
    // (and exit non-zero); the others' lines still count.
    let text = String::from_utf8_lossy(&out.stdout);
    let mut sum = 0u64;
    let mut any = false;
    for line in text.lines() {
        if let Ok(v) = line.trim().parse::<u64>() {
            sum += v;
            any = true;
        }
    }
    (any || out.status.success()).then_some(sum)
}

/// The peaks seen so far.
#[derive(Default)]
struct Peaks {
    rss: Option<u64>,
    page_cache: Option<u64>,
    dram: Option<u64>,
    samples: u64,
    fincore_calls: u64,
    fincore_failed: bool,
}

fn max_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// A sampler running on its own thread between [`Sampler::start`] and [`Sampler::finish`].
pub struct Sampler<'a> {
    target: &'a Target,
    io_before: Option<(u64, u64)>,
    peaks: Peaks,
    /// The last page-cache figure and when it was taken, and whether `fincore` is slow.
    last_fincore: Option<(Instant, Option<u64>)>,
    slow: bool,
}

impl<'a> Sampler<'a> {
    pub fn start(target: &'a Target) -> Sampler<'a> {
        let mut s = Sampler {
            target,
            io_before: target.io(),
            peaks: Peaks::default(),
            last_fincore: None,
            slow: false,
        };
        s.sample();
        s
    }

    /// One sample: RSS now, and the page cache (now, or the last figure if `fincore` is
    /// slow and was asked less than a second ago).
    fn sample(&mut self) {
        let rss = self.target.rss();
        let files_watched = !self.target.files.is_empty();
        let cache = if !files_watched {
            None
        } else {
            match self.last_fincore {
                Some((at, v)) if self.slow && at.elapsed() < SLOW_INTERVAL => v,
                _ => {
                    let t = Instant::now();
                    let v = page_cache(&list_files(&self.target.files));
                    self.slow = t.elapsed() > SLOW_FINCORE;
                    self.last_fincore = Some((Instant::now(), v));
                    self.peaks.fincore_calls += 1;
                    self.peaks.fincore_failed |= v.is_none();
                    v
                }
            }
        };
        let p = &mut self.peaks;
        p.samples += 1;
        p.rss = max_opt(p.rss, rss);
        p.page_cache = max_opt(p.page_cache, cache);
        let dram = rss.map(|r| r + cache.unwrap_or(0));
        p.dram = max_opt(p.dram, dram);
    }

    /// Samples every [`INTERVAL`] until `stop` is set; then one last sample.
    pub fn run(&mut self, stop: &AtomicBool) {
        let mut next = Instant::now() + INTERVAL;
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now < next {
                // Short sleeps, so the end of a run is not delayed by a whole interval.
                std::thread::sleep((next - now).min(Duration::from_millis(10)));
                continue;
            }
            self.sample();
            next += INTERVAL;
            if next < Instant::now() {
                next = Instant::now() + INTERVAL;
            }
        }
        self.sample();
    }

    /// The report, given the bytes (keys + values) the run's sets sent.
    pub fn finish(self, inserted_bytes: u64) -> Value {
        let io_after = self.target.io();
        let delta = match (self.io_before, io_after) {
            (Some(b), Some(a)) => Some((a.0.saturating_sub(b.0), a.1.saturating_sub(b.1))),
            _ => None,
        };
        let write = delta.map(|d| d.1);
        let p = self.peaks;
        if p.fincore_failed {
            eprintln!(
                "terrace-bench: fincore (util-linux) failed or is missing: page-cache bytes not counted"
            );
        }
        json!({
            "sampled_pid": self.target.pid,
            "samples": p.samples,
            "files_watched": self.target.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
            "fincore_calls": p.fincore_calls,
            "peak_dram_bytes": p.dram,
            "peak_rss_sampled_bytes": p.rss,
            "peak_page_cache_bytes": if self.target.files.is_empty() { None } else { p.page_cache },
            "device_read_bytes": delta.map(|d| d.0),
            "device_write_bytes": write,
            "inserted_bytes": inserted_bytes,
            "device_write_per_inserted": write.filter(|_| inserted_bytes > 0).map(|w| w as f64 / inserted_bytes as f64),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_parse() {
        let s = "Name:\tx\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n";
        assert_eq!(kib_field(s, "VmRSS:"), Some(1 << 20));
        assert_eq!(kib_field(s, "VmSwap:"), None);
    }

    #[test]
    fn this_process_is_sampled() {
        let t = Target::new(None, Vec::new());
        assert!(t.rss().unwrap() > 0);
        let stop = AtomicBool::new(true);
        let mut s = Sampler::start(&t);
        s.run(&stop);
        let r = s.finish(100);
        assert!(r["peak_rss_sampled_bytes"].as_u64().unwrap() > 0);
        assert_eq!(r["peak_dram_bytes"], r["peak_rss_sampled_bytes"]);
        assert!(r["peak_page_cache_bytes"].is_null());
        assert_eq!(r["inserted_bytes"], 100);
    }

    #[test]
    fn files_are_listed_and_measured() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a"), vec![1u8; 8192]).unwrap();
        std::fs::write(dir.path().join("b"), b"x").unwrap();
        let files = list_files(&[dir.path().to_path_buf()]);
        assert_eq!(files.len(), 2);
        // Freshly written, so in the page cache (unless fincore is missing, or the
        // directory is on a file system without one).
        if let Some(bytes) = page_cache(&files) {
            assert!(bytes <= 3 * 4096 + 8192, "{bytes}");
        }
        assert_eq!(page_cache(&[]), Some(0));
    }
}

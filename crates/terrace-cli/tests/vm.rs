//! The DAX and NUMA paths, proved on a guest kernel with real ones: `MAP_SYNC` mappings on
//! an ext4 file system mounted `-o dax` on an emulated NVDIMM, cache-line flushes, and a
//! CPU-less NUMA node with HMAT attributes (what CXL memory and PMem onlined as system RAM
//! look like to Linux).
//!
//! `the_guest_boots_and_its_dax_and_numa_tests_pass` runs on the host: it boots the guest
//! of `tests/vm/run` (KVM, or TCG where `/dev/kvm` runs no guest), which runs
//! `tests/vm/guest-tests.sh`: the `guest_*` tests below and the pool's file, crash-image and
//! kill tests on the DAX mount. It skips, saying so, where `/dev/kvm` is missing; where it
//! is present and `TERRACE_REQUIRE_TOOLS=1` (CI), a missing tool fails it.
//!
//! The `guest_*` tests are ignored on the host, as they need the guest's DAX mount and its
//! node 1. They assert the path taken, not just success: `sf` (synchronous faults, that is
//! `MAP_SYNC`) in the mapping's `VmFlags`, cache lines counted by `terrace_media::persist`,
//! pages counted per node in `/proc/PID/numa_maps`.
//!
//! The guest (set in `tests/vm/run`): node 0 has both CPUs and 1.5 GiB; node 1 has 2.5 GiB
//! and no CPU, read latency 250 ns and bandwidth 10 GB/s against node 0's 80 ns and 20 GB/s.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use terrace_kinds::{FileKindOptions, Kind, KindMedium};
use terrace_media::numa::Topology;
use terrace_media::persist::{flush_instruction, thread_counts, FlushInstruction};
use terrace_media::{Durability, FileOptions, Region};

const GUEST_ONLY: &str = "runs inside the guest of tests/vm/run";
const CPU_LESS_NODE: u32 = 1;

// ---------------------------------------------------------------------------------------
// The host side

#[test]
fn the_guest_boots_and_its_dax_and_numa_tests_pass() {
    if !Path::new("/dev/kvm").exists() {
        eprintln!("*** SKIPPED: /dev/kvm is missing: the DAX and NUMA guest cannot boot here.");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let required = std::env::var("TERRACE_REQUIRE_TOOLS").as_deref() == Ok("1");
    let out = root.join("target/vm");
    let finished = common::run_with_timeout(
        {
            let mut cmd = Command::new("bash");
            cmd.arg(root.join("tests/vm/run"))
                .current_dir(&root)
                .env("TERRACE_VM_OUT", &out)
                .env("TERRACE_REQUIRE_VM", if required { "1" } else { "0" });
            cmd
        },
        // Longer than the script's own bounds (the listing build, the KVM probe and
        // TERRACE_VM_TIMEOUT): the script, not this, stops the guest.
        Duration::from_secs(3600),
    );
    let text = finished.text();
    eprintln!("{text}");
    assert!(finished.success(), "the guest's tests failed:\n{text}");
    if text.contains("tests/vm/run: skipped") {
        return;
    }
    // The guest script's own summary: every step ran and passed.
    let summary = std::fs::read_to_string(out.join("summary.txt")).expect("guest summary");
    for step in [
        "dax mount",
        "info",
        "guest tests",
        "memkind numa kinds",
        "pool file tests",
        "pool classes",
        "pool crash images",
        "pool kill",
    ] {
        assert!(
            summary.lines().any(|l| l == format!("passed: {step}")),
            "{step} did not pass in the guest:\n{summary}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The guest side

/// The DAX mount the guest script made.
fn dax_dir() -> PathBuf {
    std::env::var_os("TERRACE_VM_DAX_DIR")
        .map(PathBuf::from)
        .expect("TERRACE_VM_DAX_DIR: these tests run inside the guest of tests/vm/run")
}

/// The start of the mapping holding `addr` in `/proc/PID/FILE` (`maps` or `smaps`), with
/// its lines: the range line, then (in `smaps`) its details up to the next mapping.
fn mapping_of(pid: u32, file: &str, addr: usize) -> (usize, Vec<String>) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).expect(file);
    let range_of = |line: &str| {
        let (a, b) = line.split_whitespace().next()?.split_once('-')?;
        Some((
            usize::from_str_radix(a, 16).ok()?,
            usize::from_str_radix(b, 16).ok()?,
        ))
    };
    let mut found: Option<(usize, Vec<String>)> = None;
    for line in text.lines() {
        match (range_of(line), found.as_mut()) {
            (Some(_), Some(_)) => break,
            (Some((start, end)), None) if start <= addr && addr < end => {
                found = Some((start, vec![line.to_string()]));
            }
            (None, Some(f)) => f.1.push(line.to_string()),
            _ => {}
        }
    }
    found.unwrap_or_else(|| panic!("no mapping of {addr:#x} in /proc/{pid}/{file}"))
}

/// The `VmFlags` of the mapping holding `addr` in this process.
fn vm_flags(addr: usize) -> Vec<String> {
    let (_, lines) = mapping_of(std::process::id(), "smaps", addr);
    lines
        .iter()
        .find_map(|l| l.strip_prefix("VmFlags:"))
        .expect("VmFlags in smaps")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Pages per node of the mapping starting at `start` in process `pid`, and its policy.
fn numa_pages(pid: u32, start: usize) -> (String, BTreeMap<u32, u64>) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/numa_maps")).expect("numa_maps");
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&format!("{start:x}")))
        .unwrap_or_else(|| panic!("no numa_maps line at {start:x}:\n{text}"));
    let mut fields = line.split_whitespace().skip(1);
    let policy = fields.next().unwrap_or("").to_string();
    let pages = fields
        .filter_map(|f| {
            let (node, n) = f.strip_prefix('N')?.split_once('=')?;
            Some((node.parse().ok()?, n.parse().ok()?))
        })
        .collect();
    (policy, pages)
}

/// Pages per node of the mapping holding `addr` in this process.
fn numa_pages_at(addr: usize) -> (String, BTreeMap<u32, u64>) {
    let (start, _) = mapping_of(std::process::id(), "maps", addr);
    numa_pages(std::process::id(), start)
}

/// Writes every page of `[ptr, ptr+len)`, so that each is placed.
///
/// # Safety
/// `[ptr, ptr+len)` must be writable memory the caller owns, not used by another thread.
unsafe fn touch(ptr: *mut u8, len: usize) {
    // SAFETY: the caller's contract above.
    unsafe { std::ptr::write_bytes(ptr, 0x5a, len) };
}

/// The flush instruction this CPU offers, read from `/proc/cpuinfo` (independently of
/// `terrace_media`'s CPUID probe, which it checks).
fn expected_flush_instruction() -> FlushInstruction {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags"))
        .expect("a flags line")
        .split_whitespace()
        .collect();
    if flags.contains(&"clwb") {
        FlushInstruction::Clwb
    } else if flags.contains(&"clflushopt") {
        FlushInstruction::ClflushOpt
    } else {
        FlushInstruction::Clflush
    }
}

#[test]
#[ignore = "runs inside the guest of tests/vm/run"]
fn guest_info_reports_dax_flush_and_the_cpu_less_node() {
    let dir = dax_dir();
    let out = Command::new(common::terrace_bin())
        .args(["info", "--dir"])
        .arg(&dir)
        .output()
        .expect("terrace info");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    eprintln!("{text}");
    for wanted in [
        "node 0: DRAM".to_string(),
        "node 1: CPU-less (PMem/CXL)".into(),
        "read latency 250 ns".into(),
        "read bandwidth 10240 MB/s".into(),
        "write latency 250 ns, write bandwidth 10240 MB/s (HMAT, from nodes [0])".into(),
        format!("cache-line flush: {:?}", expected_flush_instruction()),
        format!("{}: DAX yes (MAP_SYNC), durability Power", dir.display()),
    ] {
        assert!(text.contains(&wanted), "{wanted:?} missing in:\n{text}");
    }
}

#[test]
#[ignore = "runs inside the guest of tests/vm/run"]
fn guest_file_region_maps_with_map_sync_and_persists_by_flushing() {
    assert_eq!(
        flush_instruction(),
        expected_flush_instruction(),
        "{GUEST_ONLY}"
    );
    assert_ne!(flush_instruction(), FlushInstruction::None);
    let region = Region::file(&FileOptions::temp_in(dax_dir(), 4 << 20)).expect("DAX region");
    assert!(region.is_dax(), "MAP_SYNC was refused on the DAX mount");
    assert_eq!(region.durability(), Durability::Power);
    let base = region.base().as_ptr();
    assert!(
        vm_flags(base as usize).iter().any(|f| f == "sf"),
        "the mapping has no synchronous faults (MAP_SYNC)"
    );
    // SAFETY: the region's first MiB, owned here.
    unsafe { touch(base, 1 << 20) };
    let before = thread_counts();
    region.persist(0, 1 << 20).expect("persist");
    region.sync().expect("sync");
    let after = thread_counts();
    assert_eq!(after.flushed_lines - before.flushed_lines, (1 << 20) / 64);
    assert_eq!(after.msyncs, before.msyncs, "persisted with msync");

    // For contrast, tmpfs in the same guest: no MAP_SYNC, and a persist there is only a
    // compiler fence (process durability): neither a flush nor an msync.
    let shm = Region::file(&FileOptions::temp_in("/dev/shm", 4 << 20)).expect("tmpfs region");
    assert!(!shm.is_dax());
    assert_eq!(shm.durability(), Durability::Process);
    assert!(!vm_flags(shm.base().as_ptr() as usize)
        .iter()
        .any(|f| f == "sf"));
    let before = thread_counts();
    shm.persist(0, 1 << 20).expect("persist on tmpfs");
    assert_eq!(thread_counts(), before);
}

#[test]
#[ignore = "runs inside the guest of tests/vm/run"]
fn guest_file_kind_on_dax_is_power_durable_and_mapped_sync() {
    let kind = Kind::create_file(&FileKindOptions::in_dir(dax_dir(), 256 << 20)).expect("kind");
    assert_eq!(kind.medium(), Some(KindMedium::File));
    assert_eq!(kind.durability(), Some(Durability::Power));
    let ptr = kind.malloc(1 << 20).expect("malloc").as_ptr();
    // SAFETY: just allocated, 1 MiB, owned here.
    unsafe { touch(ptr, 1 << 20) };
    assert!(
        vm_flags(ptr as usize).iter().any(|f| f == "sf"),
        "the file kind's memory is not mapped with MAP_SYNC"
    );
    // SAFETY: allocated above by this kind, freed once.
    assert!(unsafe { terrace_kinds::free(ptr) });
    kind.destroy().expect("destroy");
}

#[test]
#[ignore = "runs inside the guest of tests/vm/run"]
fn guest_topology_sees_the_cpu_less_node_and_selects_by_hmat() {
    let topology = Topology::discover();
    let node1 = topology.node(CPU_LESS_NODE).expect("node 1");
    assert!(node1.is_cpu_less(), "{node1:?}");
    assert_eq!(topology.cpu_less(), vec![CPU_LESS_NODE]);
    assert_eq!(node1.access.read_latency_ns, Some(250));
    assert_eq!(node1.access.write_latency_ns, Some(250));
    assert_eq!(node1.access.read_bandwidth_mbps, Some(10240));
    assert!(!topology.node(0).expect("node 0").is_cpu_less());
    // HMAT covers both nodes as seen from node 0, so it is what ranks them.
    assert_eq!(node1.initiators, vec![0]);
    assert_eq!(topology.latency_from(0, 0), Some(80));
    assert_eq!(topology.latency_from(0, CPU_LESS_NODE), Some(250));
    assert_eq!(topology.lowest_latency_local(0), Some(0));
    assert_eq!(topology.by_proximity(0), vec![0, CPU_LESS_NODE]);
    assert_eq!(topology.highest_capacity(0), Some(CPU_LESS_NODE));
}

/// Allocates `len` bytes of `kind`, writes them, and returns the pages per node of their
/// mapping with its policy.
fn placed(kind: Kind, len: usize) -> (String, BTreeMap<u32, u64>) {
    let ptr = kind.malloc(len).expect("malloc").as_ptr();
    // SAFETY: just allocated, `len` bytes, owned here.
    unsafe { touch(ptr, len) };
    let where_ = numa_pages_at(ptr as usize);
    // SAFETY: allocated above, freed once.
    unsafe { terrace_kinds::free(ptr) };
    where_
}

#[test]
#[ignore = "runs inside the guest of tests/vm/run"]
fn guest_numa_kinds_place_their_pages_on_their_node() {
    const LEN: usize = 8 << 20;
    let pages = (LEN / 4096) as u64;
    let on_node = |what: &str, (policy, nodes): (String, BTreeMap<u32, u64>), node: u32| {
        assert!(
            policy.contains(&format!("bind:{node}")),
            "{what}: policy {policy}"
        );
        assert!(
            nodes.get(&node).copied().unwrap_or(0) >= pages,
            "{what}: {nodes:?} pages per node, wanted {pages} on node {node}"
        );
        let elsewhere: u64 = nodes.iter().filter(|(n, _)| **n != node).map(|e| e.1).sum();
        assert_eq!(elsewhere, 0, "{what}: pages off node {node}: {nodes:?}");
    };
    on_node(
        "create_numa(1)",
        placed(Kind::create_numa(CPU_LESS_NODE).expect("kind"), LEN),
        CPU_LESS_NODE,
    );
    on_node(
        "MEMKIND_DAX_KMEM",
        placed(Kind::cpu_less_memory().expect("kind"), LEN),
        CPU_LESS_NODE,
    );
    on_node(
        "MEMKIND_HIGHEST_CAPACITY",
        placed(Kind::highest_capacity().expect("kind"), LEN),
        CPU_LESS_NODE,
    );
    // The test threads run on node 0's CPUs (node 1 has none), so the nearest node is 0.
    on_node(
        "MEMKIND_LOWEST_LATENCY_LOCAL",
        placed(Kind::lowest_latency_local().expect("kind"), LEN),
        0,
    );
    on_node(
        "MEMKIND_REGULAR",
        placed(Kind::regular().expect("kind"), LEN),
        0,
    );

    let region = Region::numa(CPU_LESS_NODE, LEN).expect("region on node 1");
    // SAFETY: the region is LEN bytes long and owned here.
    unsafe { touch(region.base().as_ptr(), LEN) };
    let (policy, nodes) = numa_pages_at(region.base().as_ptr() as usize);
    assert!(policy.contains("bind:1"), "{policy}");
    assert_eq!(nodes.get(&1).copied(), Some(pages), "{nodes:?}");
}

#[test]
#[ignore = "runs inside the guest of tests/vm/run"]
fn guest_serve_with_a_numa_tier_keeps_values_on_node_1() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let mut server = common::start(dir.path(), &["--tiers", "dram:16MiB,numa:1:128MiB"]);
    let value = |i: usize| -> Vec<u8> { (0..10_000).map(|k| (i * 31 + k) as u8).collect() };
    let mut conn = server.connect();
    // 60 MB: most of it must leave the 16 MiB DRAM tier.
    const KEYS: usize = 6000;
    // Read once right after it is stored: tier 0 is the probation queue, which demotes
    // items with a hit and drops large ones that have none.
    for i in 0..KEYS {
        assert_eq!(conn.set(&format!("key{i}"), &value(i)), "STORED");
        assert_eq!(conn.get(&format!("key{i}")).as_deref(), Some(&value(i)[..]));
    }
    let stats = server.stats();
    let numa_items: u64 = stats["tier_1_items"].parse().expect("tier_1_items");
    assert!(
        numa_items > (KEYS / 2) as u64,
        "only {numa_items} items on node 1"
    );
    let demoted: u64 = stats["tier_1_demotions_in"].parse().expect("demotions");
    assert_eq!(
        demoted, numa_items,
        "items reached node 1 other than by demotion"
    );
    for i in 0..KEYS {
        assert_eq!(
            conn.get(&format!("key{i}")).as_deref(),
            Some(&value(i)[..]),
            "key{i}"
        );
    }
    // The tier's memory: a mapping bound to node 1 holding at least the items' pages.
    let text = std::fs::read_to_string(format!("/proc/{}/numa_maps", server.pid()))
        .expect("the server's numa_maps");
    // Pages on `node` summed over the mappings bound to node 1.
    let bound_pages_on = |node: u32| -> u64 {
        let field = format!("N{node}=");
        text.lines()
            .filter(|l| l.contains("bind:1"))
            .flat_map(|l| l.split_whitespace())
            .filter_map(|f| f.strip_prefix(field.as_str())?.parse::<u64>().ok())
            .sum()
    };
    let on_node1 = bound_pages_on(1);
    let off_node1 = bound_pages_on(0);
    assert!(
        on_node1 * 4096 >= numa_items * 10_000,
        "{on_node1} pages on node 1 for {numa_items} items of 10 kB"
    );
    assert_eq!(off_node1, 0, "pages of the node-1 tier on node 0");
    assert!(server.terminate().success());
}

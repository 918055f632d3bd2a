//! `terrace info`: report the media layer's view of the machine.

use std::path::Path;

use terrace_media::numa::Topology;
use terrace_media::persist::flush_instruction;
use terrace_media::{FileOptions, Region};

pub fn run(dir: Option<&Path>) -> Result<(), String> {
    let topology = Topology::discover();
    println!("NUMA nodes:");
    for node in topology.nodes() {
        let role = if node.is_cpu_less() {
            "CPU-less (PMem/CXL)"
        } else {
            "DRAM"
        };
        let latency = node
            .access
            .read_latency_ns
            .map_or(String::new(), |l| format!(", read latency {l} ns"));
        let bandwidth = node
            .access
            .read_bandwidth_mbps
            .map_or(String::new(), |b| format!(", read bandwidth {b} MB/s"));
        let write_latency = node
            .access
            .write_latency_ns
            .map_or(String::new(), |l| format!(", write latency {l} ns"));
        let write_bandwidth = node
            .access
            .write_bandwidth_mbps
            .map_or(String::new(), |b| format!(", write bandwidth {b} MB/s"));
        // HMAT's attributes are measured from these nodes' CPUs.
        let initiators = if node.initiators.is_empty() {
            String::new()
        } else {
            format!(" (HMAT, from nodes {:?})", node.initiators)
        };
        println!(
            "  node {}: {role}, {} MiB, cpus {:?}{latency}{bandwidth}{write_latency}{write_bandwidth}{initiators}",
            node.id,
            node.mem_total >> 20,
            node.cpus
        );
    }
    println!("cache-line flush: {:?}", flush_instruction());
    if let Some(dir) = dir {
        let probe = Region::file(&FileOptions::temp_in(dir, terrace_media::registry::GRANULE))
            .map_err(|e| format!("cannot use {} as a file tier: {e}", dir.display()))?;
        println!(
            "{}: DAX {}, durability {:?}, {} MiB free",
            dir.display(),
            if probe.is_dax() {
                "yes (MAP_SYNC)"
            } else {
                "no"
            },
            probe.durability(),
            probe.fs_available().unwrap_or(0) >> 20
        );
    }
    Ok(())
}

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
        let access = &node.access;
        let hmat: String = [
            ("read latency", access.read_latency_ns, "ns"),
            ("read bandwidth", access.read_bandwidth_mbps, "MB/s"),
            ("write latency", access.write_latency_ns, "ns"),
            ("write bandwidth", access.write_bandwidth_mbps, "MB/s"),
        ]
        .iter()
        .filter_map(|(what, value, unit)| Some(format!(", {what} {} {unit}", (*value)?)))
        .collect();
        // HMAT's attributes are measured from these nodes' CPUs.
        let initiators = if node.initiators.is_empty() {
            String::new()
        } else {
            format!(" (HMAT, from nodes {:?})", node.initiators)
        };
        println!(
            "  node {}: {role}, {} MiB, cpus {:?}{hmat}{initiators}",
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

//! NUMA topology, read from `/sys/devices/system/node`: which nodes exist, which have CPUs
//! (DRAM next to cores) and which are CPU-less (persistent or CXL memory onlined as
//! "kmem"), their capacity, the distance matrix, and HMAT access attributes (latency and
//! bandwidth from `access0/initiators`, and which nodes those initiators are) where the
//! firmware provides them.
//!
//! Proximity ranks by HMAT read latency when the firmware gives it for every memory node
//! as seen from the asking node (that node is among each one's `access0` initiators), as
//! memkind's `MEMKIND_LOWEST_LATENCY_LOCAL` and Linux's memory tiering do; otherwise by
//! the distance matrix (SLIT), which HMAT latency then only breaks ties in.
//!
//! Discovery is plain file parsing from a root directory, so tests feed it a fake tree; a
//! missing or unreadable tree yields a single node 0 (a machine without NUMA support).

use std::fs;
use std::path::{Path, PathBuf};

/// HMAT access attributes of a memory node as seen from its nearest initiators.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessAttributes {
    /// Read latency in nanoseconds.
    pub read_latency_ns: Option<u64>,
    /// Write latency in nanoseconds.
    pub write_latency_ns: Option<u64>,
    /// Read bandwidth in MB/s.
    pub read_bandwidth_mbps: Option<u64>,
    /// Write bandwidth in MB/s.
    pub write_bandwidth_mbps: Option<u64>,
}

/// One NUMA node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeInfo {
    pub id: u32,
    /// CPUs local to the node (empty for CPU-less memory nodes).
    pub cpus: Vec<u32>,
    /// Whether the node has any memory.
    pub has_memory: bool,
    /// Total memory in bytes (`MemTotal` of the node's meminfo).
    pub mem_total: u64,
    /// Distances to every node, indexed by node id order of `Topology::nodes`.
    pub distances: Vec<u32>,
    /// HMAT attributes, when the platform reports them.
    pub access: AccessAttributes,
    /// The nodes whose CPUs `access` is measured from (`access0/initiators/nodeN`).
    pub initiators: Vec<u32>,
}

impl NodeInfo {
    /// A memory node without CPUs: persistent memory or CXL memory onlined as RAM.
    pub fn is_cpu_less(&self) -> bool {
        self.cpus.is_empty() && self.has_memory
    }
}

/// The machine's NUMA nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    nodes: Vec<NodeInfo>,
}

const SYSFS_NODES: &str = "/sys/devices/system/node";

impl Topology {
    /// Reads the running machine's topology.
    pub fn discover() -> Topology {
        Topology::from_root(Path::new(SYSFS_NODES))
    }

    /// Reads a topology from a sysfs-shaped directory (`nodeN/` subdirectories).
    pub fn from_root(root: &Path) -> Topology {
        let mut ids: Vec<u32> = fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
            .collect();
        ids.sort_unstable();
        let nodes: Vec<NodeInfo> = ids.iter().map(|&id| read_node(root, id)).collect();
        if nodes.is_empty() {
            return Topology {
                nodes: vec![NodeInfo {
                    id: 0,
                    cpus: (0..std::thread::available_parallelism().map_or(1, |n| n.get()) as u32)
                        .collect(),
                    has_memory: true,
                    mem_total: 0,
                    distances: vec![10],
                    access: AccessAttributes::default(),
                    initiators: Vec::new(),
                }],
            };
        }
        Topology { nodes }
    }

    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    pub fn node(&self, id: u32) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.id == id)
    }

    fn distance(&self, from: u32, to: u32) -> u32 {
        let Some(index) = self.nodes.iter().position(|n| n.id == to) else {
            return u32::MAX;
        };
        self.node(from)
            .and_then(|n| n.distances.get(index).copied())
            .unwrap_or(if from == to { 10 } else { 20 })
    }

    /// The HMAT read latency of node `to` as seen from node `from`: known only when
    /// `from` is one of `to`'s `access0` initiators.
    pub fn latency_from(&self, from: u32, to: u32) -> Option<u64> {
        let node = self.node(to)?;
        node.access
            .read_latency_ns
            .filter(|_| node.initiators.contains(&from))
    }

    /// Memory nodes ordered nearest first as seen from `from`: by HMAT read latency when
    /// it is known from `from` for every memory node, else by distance with HMAT latency
    /// breaking ties (see the module docs).
    pub fn by_proximity(&self, from: u32) -> Vec<u32> {
        let mut memory: Vec<&NodeInfo> = self.nodes.iter().filter(|n| n.has_memory).collect();
        let hmat = memory
            .iter()
            .all(|n| self.latency_from(from, n.id).is_some());
        memory.sort_by_key(|n| {
            let latency = if hmat {
                self.latency_from(from, n.id).unwrap_or(u64::MAX)
            } else if n.id == from {
                0
            } else {
                n.access.read_latency_ns.unwrap_or(u64::MAX)
            };
            let distance = if hmat { 0 } else { self.distance(from, n.id) };
            (distance, latency, n.id)
        });
        memory.iter().map(|n| n.id).collect()
    }

    /// The memory node with the lowest latency from `from` (memkind's
    /// `MEMKIND_LOWEST_LATENCY_LOCAL`).
    pub fn lowest_latency_local(&self, from: u32) -> Option<u32> {
        self.by_proximity(from).first().copied()
    }

    /// The memory node with the most capacity, nearest first on ties (memkind's
    /// `MEMKIND_HIGHEST_CAPACITY`).
    pub fn highest_capacity(&self, from: u32) -> Option<u32> {
        let order = self.by_proximity(from);
        order.iter().copied().max_by_key(|&id| {
            let rank = order.len() - order.iter().position(|&o| o == id).unwrap_or(0);
            (self.node(id).map_or(0, |n| n.mem_total), rank)
        })
    }

    /// CPU-less memory nodes (PMem/CXL as system RAM; memkind's `MEMKIND_DAX_KMEM`).
    pub fn cpu_less(&self) -> Vec<u32> {
        self.nodes
            .iter()
            .filter(|n| n.is_cpu_less())
            .map(|n| n.id)
            .collect()
    }
}

fn read_node(root: &Path, id: u32) -> NodeInfo {
    let dir = root.join(format!("node{id}"));
    let cpus = read_trimmed(&dir.join("cpulist"))
        .map(|s| parse_cpu_list(&s))
        .unwrap_or_default();
    let mem_total = read_trimmed(&dir.join("meminfo"))
        .and_then(|s| {
            s.lines().find_map(|line| {
                let rest = line.split("MemTotal:").nth(1)?;
                let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
                Some(kib * 1024)
            })
        })
        .unwrap_or(0);
    let distances = read_trimmed(&dir.join("distance"))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|d| d.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let access_dir: PathBuf = dir.join("access0").join("initiators");
    let attr = |name: &str| read_trimmed(&access_dir.join(name)).and_then(|s| s.parse().ok());
    let mut initiators: Vec<u32> = fs::read_dir(&access_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("node")?.parse().ok())
        .collect();
    initiators.sort_unstable();
    NodeInfo {
        id,
        cpus,
        has_memory: mem_total > 0 || !dir.join("meminfo").exists(),
        mem_total,
        distances,
        access: AccessAttributes {
            read_latency_ns: attr("read_latency"),
            write_latency_ns: attr("write_latency"),
            read_bandwidth_mbps: attr("read_bandwidth"),
            write_bandwidth_mbps: attr("write_bandwidth"),
        },
        initiators,
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Parses a kernel CPU list such as `0-3,8,10-11`. Malformed parts are skipped.
pub fn parse_cpu_list(text: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u32>(), b.parse::<u32>()) {
                    if b >= a && b - a < 1 << 16 {
                        cpus.extend(a..=b);
                    }
                }
            }
            None => cpus.extend(part.parse::<u32>().ok()),
        }
    }
    cpus
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    /// Writes node `id`'s `cpulist`, `meminfo` and `distance` files as sysfs has them.
    fn write_node(root: &Path, id: u32, cpus: &str, mem_kib: u64, distances: &str) {
        write(root, &format!("node{id}/cpulist"), &format!("{cpus}\n"));
        write(
            root,
            &format!("node{id}/meminfo"),
            &format!("Node {id} MemTotal:       {mem_kib} kB\n"),
        );
        write(
            root,
            &format!("node{id}/distance"),
            &format!("{distances}\n"),
        );
    }

    /// Two sockets with DRAM plus one CPU-less CXL node with more capacity.
    fn fake_tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write_node(root, 0, "0-3", 16384, "10 21 17");
        write_node(root, 1, "4-7", 16384, "21 10 28");
        write_node(root, 2, "", 65536, "17 28 10");
        write(root, "node2/access0/initiators/read_latency", "250\n");
        write(root, "node2/access0/initiators/read_bandwidth", "30000\n");
        dir
    }

    #[test]
    fn discovers_cpu_less_nodes_capacity_and_hmat() {
        let tree = fake_tree();
        let topo = Topology::from_root(tree.path());
        assert_eq!(topo.nodes().len(), 3);
        assert_eq!(topo.cpu_less(), vec![2]);
        assert_eq!(topo.node(2).unwrap().access.read_latency_ns, Some(250));
        assert_eq!(topo.node(0).unwrap().cpus, vec![0, 1, 2, 3]);
        assert_eq!(topo.lowest_latency_local(1), Some(1));
        assert_eq!(topo.by_proximity(0), vec![0, 2, 1]);
        assert_eq!(topo.highest_capacity(0), Some(2));
    }

    /// HMAT ranks where it covers every memory node from the asking one, even against
    /// the distance matrix; where it does not, distance ranks.
    #[test]
    fn hmat_latency_ranks_before_distance_when_it_covers_every_node() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write_node(root, 0, "0-1", 16384, "10 20 30");
        write_node(root, 1, "", 16384, "20 10 30");
        write_node(root, 2, "", 16384, "30 30 10");
        for (node, latency) in [(0, 90), (1, 400), (2, 150)] {
            write(
                root,
                &format!("node{node}/access0/initiators/read_latency"),
                &format!("{latency}\n"),
            );
            fs::create_dir_all(root.join(format!("node{node}/access0/initiators/node0"))).unwrap();
        }
        let topo = Topology::from_root(root);
        assert_eq!(topo.node(1).unwrap().initiators, vec![0]);
        assert_eq!(topo.latency_from(0, 2), Some(150));
        assert_eq!(topo.latency_from(1, 2), None, "node 1 is not an initiator");
        // By SLIT node 1 (20) comes before node 2 (30); by HMAT node 2 (150 ns) first.
        assert_eq!(topo.by_proximity(0), vec![0, 2, 1]);
        // Without node 2's attributes from node 0, distance decides again.
        fs::remove_dir_all(root.join("node2/access0")).unwrap();
        assert_eq!(Topology::from_root(root).by_proximity(0), vec![0, 1, 2]);
    }

    #[test]
    fn missing_tree_is_one_node() {
        let topo = Topology::from_root(Path::new("/nonexistent/nodes"));
        assert_eq!(topo.nodes().len(), 1);
        assert_eq!(topo.lowest_latency_local(0), Some(0));
        assert!(topo.cpu_less().is_empty());
    }

    #[test]
    fn cpu_lists_parse_and_garbage_is_skipped() {
        assert_eq!(parse_cpu_list("0-2,5,7-8"), vec![0, 1, 2, 5, 7, 8]);
        assert_eq!(parse_cpu_list("x,3-1,4"), vec![4]);
        assert_eq!(parse_cpu_list(""), Vec::<u32>::new());
    }

    #[test]
    fn this_machine_has_node_zero() {
        let topo = Topology::discover();
        assert!(topo.node(0).is_some());
    }
}

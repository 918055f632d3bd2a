//! Unified kinds: one kind over several member kinds, with a strategy choosing which member
//! serves an allocation and overflow to the others before reporting out of memory
//! (Hazelcast's lesson: a full PMem kind must not fail while DRAM still has room).
//!
//! A unified kind owns no memory: objects belong to the member that served them, so free,
//! usable size and kind detection go through the registry like any other object.
//!
//! Strategies:
//! - `RoundRobin`: successive allocations start at successive members;
//! - `Ordered`: always the first member with room (tiering by preference);
//! - `NumaLocal`: members nearest the calling thread's NUMA node first (DRAM kinds count
//!   as local, file kinds as farthest).

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use terrace_media::numa::Topology;

use crate::error::{KindError, Result};
use crate::kind::{Kind, KindMedium};

/// How a unified kind picks the member that serves an allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    RoundRobin,
    Ordered,
    NumaLocal,
}

pub(crate) struct Unified {
    pub(crate) members: Vec<Kind>,
    strategy: Strategy,
    next: AtomicUsize,
    /// For NumaLocal: per node id, member indices nearest first.
    node_order: Vec<Vec<usize>>,
    /// CPU number → node id.
    cpu_node: Vec<u32>,
}

impl Unified {
    pub(crate) fn new(members: Vec<Kind>, strategy: Strategy) -> Unified {
        let topology = Topology::discover();
        let max_node = topology.nodes().iter().map(|n| n.id).max().unwrap_or(0) as usize;
        let mut cpu_node = Vec::new();
        for node in topology.nodes() {
            for &cpu in &node.cpus {
                if cpu_node.len() <= cpu as usize {
                    cpu_node.resize(cpu as usize + 1, 0);
                }
                cpu_node[cpu as usize] = node.id;
            }
        }
        let node_order = (0..=max_node as u32)
            .map(|from| {
                let proximity = topology.by_proximity(from);
                let mut order: Vec<usize> = (0..members.len()).collect();
                order.sort_by_key(|&i| {
                    let rank = match members[i].medium() {
                        Some(KindMedium::Dram) => 0,
                        Some(KindMedium::Numa(node)) => {
                            1 + proximity
                                .iter()
                                .position(|&n| n == node)
                                .unwrap_or(proximity.len())
                        }
                        _ => usize::MAX,
                    };
                    (rank, i)
                });
                order
            })
            .collect();
        Unified {
            members,
            strategy,
            next: AtomicUsize::new(0),
            node_order,
            cpu_node,
        }
    }

    pub(crate) fn strategy(&self) -> Strategy {
        self.strategy
    }

    /// Tries members in strategy order until one serves the request.
    pub(crate) fn alloc(
        &self,
        mut attempt: impl FnMut(Kind) -> Result<NonNull<u8>>,
        size: usize,
        name: impl FnOnce() -> String,
    ) -> Result<NonNull<u8>> {
        let n = self.members.len();
        let start = match self.strategy {
            Strategy::RoundRobin => self.next.fetch_add(1, Ordering::Relaxed) % n,
            _ => 0,
        };
        let local = match self.strategy {
            Strategy::NumaLocal => {
                // SAFETY: sched_getcpu has no preconditions.
                let cpu = unsafe { libc::sched_getcpu() };
                let node = self.cpu_node.get(cpu.max(0) as usize).copied().unwrap_or(0);
                self.node_order.get(node as usize)
            }
            _ => None,
        };
        for i in 0..n {
            let member = match local {
                Some(order) => self.members[order[i]],
                None => self.members[(start + i) % n],
            };
            match attempt(member) {
                Ok(p) => return Ok(p),
                Err(KindError::OutOfMemory { .. })
                | Err(KindError::TooLarge { .. })
                | Err(KindError::NoSuchKind) => continue,
                Err(other) => return Err(other),
            }
        }
        Err(KindError::OutOfMemory { kind: name(), size })
    }
}

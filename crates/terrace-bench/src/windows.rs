//! The hit ratio per window of operations (`--window`): where a run wins or loses its
//! hits, in the warm-up or in steady state. Threads add their gets and hits in batches,
//! so a window's edges are exact to a batch (a few thousand operations per thread);
//! the last window may be shorter than the others.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};

/// Counts of the whole run at a moment: operations done, gets, hits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Edge {
    ops: u64,
    gets: u64,
    hits: u64,
}

pub struct Windows {
    size: u64,
    gets: AtomicU64,
    hits: AtomicU64,
    /// The counts each time a batch crossed a multiple of `size` operations.
    edges: Mutex<Vec<Edge>>,
}

impl Windows {
    /// Windows of `size` operations (at least 1).
    pub fn new(size: u64) -> Windows {
        Windows {
            size: size.max(1),
            gets: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            edges: Mutex::new(Vec::new()),
        }
    }

    /// Adds one thread's batch of `gets` and `hits`, which took the run's operations
    /// done from `before` to `after`.
    pub fn batch(&self, gets: u64, hits: u64, before: u64, after: u64) {
        let gets = self.gets.fetch_add(gets, Ordering::Relaxed) + gets;
        let hits = self.hits.fetch_add(hits, Ordering::Relaxed) + hits;
        if before / self.size != after / self.size {
            let edge = Edge {
                ops: after,
                gets,
                hits,
            };
            self.edges
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(edge);
        }
    }

    /// The windows of a run that did `ops` operations in all: `[{"ops": end, "gets": n,
    /// "hit_ratio": r}, ...]` (`hit_ratio` null in a window without gets).
    pub fn report(&self, ops: u64) -> Value {
        let mut edges = self
            .edges
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        edges.sort_by_key(|e| e.ops);
        let end = Edge {
            ops,
            gets: self.gets.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
        };
        // The run's final counts close the last window, even where a thread crossed the
        // last edge before another had added its last batch.
        match edges.last_mut() {
            Some(last) if last.ops >= end.ops => *last = end,
            _ => edges.push(end),
        }
        let mut previous = Edge::default();
        let mut out = Vec::with_capacity(edges.len());
        for edge in edges {
            // Two threads crossing edges at once may read the counts out of order: never
            // go back, so that the windows' gets add up to the run's.
            let edge = Edge {
                ops: edge.ops,
                gets: edge.gets.max(previous.gets),
                hits: edge.hits.max(previous.hits),
            };
            let gets = edge.gets - previous.gets;
            let hits = edge.hits - previous.hits;
            let ratio = (gets > 0).then(|| hits as f64 / gets as f64);
            out.push(json!({ "ops": edge.ops, "gets": gets, "hit_ratio": ratio }));
            previous = edge;
        }
        Value::Array(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_window_has_the_hit_ratio_of_its_own_gets() {
        let w = Windows::new(100);
        // Two threads' batches of 40 operations (30 gets each): the first window's gets
        // all hit, the second's none, the third (short) half.
        w.batch(30, 30, 0, 40);
        w.batch(30, 30, 40, 80);
        w.batch(30, 30, 80, 120); // crosses 100
        w.batch(30, 0, 120, 160);
        w.batch(30, 0, 160, 200); // reaches 200
        w.batch(10, 5, 200, 210);
        let r = w.report(210);
        let windows = r.as_array().unwrap();
        assert_eq!(windows.len(), 3, "{r}");
        assert_eq!(windows[0]["ops"], 120);
        assert_eq!(windows[0]["hit_ratio"], 1.0);
        assert_eq!(windows[1]["ops"], 200);
        assert_eq!(windows[1]["gets"], 60);
        assert_eq!(windows[1]["hit_ratio"], 0.0);
        assert_eq!(windows[2]["ops"], 210);
        assert_eq!(windows[2]["hit_ratio"], 0.5);
    }

    #[test]
    fn counts_read_out_of_order_or_short_of_the_end_still_add_up() {
        let w = Windows::new(100);
        w.batch(110, 55, 0, 300);
        // The thread that crossed 100 read the counts late (105 gets), the one that
        // crossed 200 early (100), and the one that reached 300, the end, before the last
        // batch was added (108).
        let edge = |ops, gets| Edge {
            ops,
            gets,
            hits: gets / 2,
        };
        *w.edges.lock().unwrap() = vec![edge(200, 100), edge(100, 105), edge(300, 108)];
        let r = w.report(300);
        let windows = r.as_array().unwrap();
        let gets: Vec<u64> = windows
            .iter()
            .map(|w| w["gets"].as_u64().unwrap())
            .collect();
        assert_eq!(gets, [105, 0, 5], "{r}");
        assert_eq!(windows.last().unwrap()["ops"], 300);
    }

    #[test]
    fn a_window_without_gets_has_no_ratio_and_the_end_is_not_repeated() {
        let w = Windows::new(10);
        w.batch(0, 0, 0, 10);
        let r = w.report(10);
        assert_eq!(r.as_array().unwrap().len(), 1, "{r}");
        assert!(r[0]["hit_ratio"].is_null());
    }
}

//! Restart work spread over the machine's cores (loading the saved index, restoring DRAM
//! snapshots, scanning segments after a crash): everything here runs before the cache is
//! shared, on scoped threads that end before the call returns.
//!
//! Invariant: [`map_parts`] returns one result per part, in part order, and runs every
//! part exactly once — on the calling thread when another cannot be started, so a
//! restart never fails for want of threads. A panic in a part is resumed on the caller.

use std::num::NonZeroUsize;

use parking_lot::Mutex;

/// Threads restart work uses: one per core the process may run on.
pub fn workers() -> usize {
    std::thread::available_parallelism().map_or(1, NonZeroUsize::get)
}

/// Threads for restart work that waits on memory rather than computes: first touches of
/// fresh pages, whose cost in a virtual machine is partly the host's, overlap better with
/// more threads than cores.
pub fn fault_workers() -> usize {
    workers().max(4) * 2
}

/// Deals `items` round-robin into at most [`workers`] parts (so that work clustered in
/// one place of the list is still shared) and runs `work` on each part, each on its own
/// thread; returns the results in part order.
pub fn map_parts<T: Send, R: Send>(items: Vec<T>, work: impl Fn(Vec<T>) -> R + Sync) -> Vec<R> {
    map_parts_on(workers(), items, work)
}

/// [`map_parts`] on at most `threads` threads.
pub fn map_parts_on<T: Send, R: Send>(
    threads: usize,
    items: Vec<T>,
    work: impl Fn(Vec<T>) -> R + Sync,
) -> Vec<R> {
    let count = threads.min(items.len()).max(1);
    let mut parts: Vec<Vec<T>> = (0..count).map(|_| Vec::new()).collect();
    for (i, item) in items.into_iter().enumerate() {
        parts[i % count].push(item);
    }
    if count == 1 {
        return parts.into_iter().map(&work).collect();
    }
    // Each part is taken exactly once: by its thread, or by the caller if that thread
    // could not start.
    let parts: Vec<Mutex<Option<Vec<T>>>> =
        parts.into_iter().map(|p| Mutex::new(Some(p))).collect();
    let run = |i: usize| parts[i].lock().take().map(&work);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..count)
            .map(|i| {
                std::thread::Builder::new()
                    .name("terrace-restart".to_string())
                    .spawn_scoped(scope, move || run(i))
                    .ok()
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(i, handle)| {
                let result = match handle {
                    Some(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                    None => run(i),
                };
                result.expect("every part runs exactly once")
            })
            .collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_is_worked_once_and_results_keep_part_order() {
        for n in [0usize, 1, 2, 3, 17, 1000] {
            let results = map_parts((0..n).collect(), |part: Vec<usize>| part);
            let mut seen: Vec<usize> = results.iter().flatten().copied().collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>());
            // Round-robin: part i holds the items congruent to i.
            for (i, part) in results.iter().enumerate() {
                assert!(part.iter().all(|&x| x % results.len() == i));
            }
        }
    }
}

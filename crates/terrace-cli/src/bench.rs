//! `terrace bench kinds`: the size sweep of memkind's speed anchor, run in-process on a
//! file kind and on the DRAM kind. For the comparison with memkind itself in the same run,
//! use `bench/kinds-vs-memkind.sh` (it builds memkind's anchor against both libraries).

use std::path::Path;
use std::time::Instant;

use terrace_kinds::{Allocation, FileKindOptions, Kind};

const SIZES: [usize; 5] = [64, 512, 4096, 65536, 1 << 20];

fn sweep(kind: Kind, size: usize, count: usize) -> Result<(f64, f64), String> {
    let mut objects: Vec<Allocation> = Vec::with_capacity(count);
    let start = Instant::now();
    for _ in 0..count {
        let object = Allocation::new(kind, size)
            .map_err(|e| format!("{} after {} objects: {e}", kind.name(), objects.len()))?;
        objects.push(object);
    }
    let allocated = start.elapsed();
    let start = Instant::now();
    drop(objects);
    let freed = start.elapsed();
    Ok((
        allocated.as_nanos() as f64 / count as f64,
        freed.as_nanos() as f64 / count as f64,
    ))
}

pub fn kinds(dir: &Path, max_size: usize, volume: usize) -> Result<(), String> {
    let file = Kind::create_file(&FileKindOptions::in_dir(dir, max_size))
        .map_err(|e| format!("cannot create a file kind in {}: {e}", dir.display()))?;
    println!("| size | objects | file kind malloc ns | DRAM kind malloc ns | file kind free ns | DRAM kind free ns |");
    println!("|---|---|---|---|---|---|");
    for size in SIZES {
        let count = (volume / size).clamp(1, 4_000_000);
        let (file_malloc, file_free) = sweep(file, size, count)?;
        let (dram_malloc, dram_free) = sweep(Kind::DEFAULT, size, count)?;
        println!("| {size} | {count} | {file_malloc:.0} | {dram_malloc:.0} | {file_free:.0} | {dram_free:.0} |");
    }
    let stats = file.stats().map_err(|e| e.to_string())?;
    println!(
        "file kind: {} MiB reserved of {} MiB capacity",
        stats.reserved >> 20,
        stats.capacity >> 20
    );
    file.destroy().map_err(|e| e.to_string())?;
    Ok(())
}

//! `terrace pool create|info|check|stats PATH`: persistent pools from the command line.
//!
//! - `create` makes a pool file of a given size and layout name;
//! - `info` shows the header and geometry (like `pmempool info -H`) and the fill per size
//!   class;
//! - `check` opens the pool (which recovers interrupted operations), verifies every
//!   invariant and exits non-zero naming what is broken and where;
//! - `stats` shows allocated, free and per-class occupancy.

use std::path::Path;

use terrace_pool::Pool;

/// Layout name used when none is given (`pmemobj_open` with a NULL layout accepts any).
fn open(path: &Path, layout: Option<&str>) -> Result<Pool, String> {
    match layout {
        Some(layout) => Pool::open(path, layout),
        None => Pool::open_any_layout(path),
    }
    .map_err(|e| format!("{}: {e}", path.display()))
}

pub fn create(path: &Path, size: u64, layout: &str) -> Result<(), String> {
    let pool = Pool::create(path, size, layout).map_err(|e| format!("{}: {e}", path.display()))?;
    println!(
        "created {} ({} MiB, layout {:?}, {:?} durability)",
        path.display(),
        pool.size() >> 20,
        pool.layout(),
        pool.durability()
    );
    Ok(())
}

pub fn info(path: &Path, layout: Option<&str>) -> Result<(), String> {
    let pool = open(path, layout)?;
    let header = pool.header();
    let geo = pool.geometry();
    let uuid: String = header.uuid.iter().map(|b| format!("{b:02x}")).collect();
    println!("pool        {}", path.display());
    println!("layout      {:?}", header.layout);
    println!("uuid        {uuid}");
    println!(
        "size        {} bytes ({} MiB)",
        geo.pool_size,
        geo.pool_size >> 20
    );
    println!("durability  {:?}", pool.durability());
    println!("lanes       {} at offset {}", geo.lane_count, geo.lanes_off);
    println!("descriptors at offset {}", geo.meta_off);
    println!(
        "heap        {} pages of 4 KiB at offset {}",
        geo.page_count, geo.heap_off
    );
    println!("root        {} bytes", pool.root_size().unwrap_or(0));
    print_stats(&pool);
    Ok(())
}

pub fn check(path: &Path, layout: Option<&str>) -> Result<(), String> {
    let pool = open(path, layout)?;
    let report = pool
        .check()
        .map_err(|e| format!("{}: inconsistent: {e}", path.display()))?;
    println!(
        "{}: consistent ({} objects, {} runs, {} extents, {} free pages, {} bytes allocated)",
        path.display(),
        report.objects,
        report.runs,
        report.extents,
        report.free_pages,
        report.allocated_bytes
    );
    Ok(())
}

pub fn stats(path: &Path, layout: Option<&str>) -> Result<(), String> {
    let pool = open(path, layout)?;
    print_stats(&pool);
    Ok(())
}

fn print_stats(pool: &Pool) {
    let s = pool.stats();
    let pct = |part: u64| {
        if s.heap_bytes == 0 {
            0.0
        } else {
            100.0 * part as f64 / s.heap_bytes as f64
        }
    };
    println!(
        "heap        {} bytes: {} allocated ({:.1}%), {} free ({:.1}%), {} in run slack",
        s.heap_bytes,
        s.allocated_bytes,
        pct(s.allocated_bytes),
        s.free_bytes,
        pct(s.free_bytes),
        s.run_slack_bytes
    );
    println!("runs        {}   extents {}", s.runs, s.extents);
    if !s.classes.is_empty() {
        println!("| unit | runs | slots | used | fill |");
        println!("|---|---|---|---|---|");
        for (unit, (runs, slots, used)) in &s.classes {
            let fill = if *slots == 0 {
                0.0
            } else {
                100.0 * *used as f64 / *slots as f64
            };
            println!("| {unit} | {runs} | {slots} | {used} | {fill:.1}% |");
        }
    }
}

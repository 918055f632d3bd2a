//! `terrace pool create|info|check|stats PATH`: persistent pools from the command line.
//!
//! - `create` makes a pool file of a given size and layout name;
//! - `info` shows the header and geometry (like `pmempool info -H`), the allocation
//!   classes (built-in size classes, and the custom classes recorded in the pool) and the
//!   fill per class;
//! - `check` opens the pool (which recovers interrupted operations), verifies every
//!   invariant (class table included) and exits non-zero naming what is broken and where;
//! - `stats` shows allocated, free and per-class occupancy.

use std::path::Path;

use terrace_pool::class::builtin_classes;
use terrace_pool::{HeaderType, Pool};

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
    println!("format      version {}", header.version);
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
    print_classes(&pool);
    print_stats(&pool);
    Ok(())
}

/// The built-in size classes (as ranges of units with one step each) and the custom
/// classes recorded in the pool.
fn print_classes(pool: &Pool) {
    let builtin = builtin_classes();
    println!(
        "built-in classes  {} (larger objects are whole-page extents)",
        builtin.len()
    );
    // (first unit, last unit, step, classes)
    let mut ranges: Vec<(u32, u32, u32, usize)> = Vec::new();
    for pair in builtin.windows(2) {
        let (unit, next) = (pair[0].unit, pair[1].unit);
        match ranges.last_mut() {
            Some(r) if r.1 == unit && r.2 == next - unit => {
                r.1 = next;
                r.3 += 1;
            }
            _ => ranges.push((unit, next, next - unit, 2)),
        }
    }
    // A range's first unit ends the one before: show it only once.
    let mut prev_last = 0;
    for (first, last, step, n) in ranges {
        let (first, n) = if first == prev_last {
            (first + step, n - 1)
        } else {
            (first, n)
        };
        println!("  {first}..{last} B in steps of {step} ({n} classes)");
        prev_last = last;
    }
    let custom = pool.classes();
    if custom.is_empty() {
        println!("custom classes    none");
        return;
    }
    println!("custom classes    {} (recorded in the pool)", custom.len());
    println!("| id | unit | run pages | slots per run | alignment | header |");
    println!("|---|---|---|---|---|---|");
    for c in custom {
        let header = match c.header {
            HeaderType::Legacy => "legacy",
            HeaderType::Compact => "compact",
            HeaderType::None => "none",
        };
        println!(
            "| {} | {} | {} | {} | {} | {header} |",
            c.id.map_or(0, |id| id.get()),
            c.unit,
            c.run_pages,
            c.slots_per_run,
            c.alignment
        );
    }
}

pub fn check(path: &Path, layout: Option<&str>, sweep: bool) -> Result<(), String> {
    let pool = open(path, layout)?;
    let report = pool
        .check()
        .map_err(|e| format!("{}: inconsistent: {e}", path.display()))?;
    println!(
        "{}: consistent ({} objects, {} runs, {} extents, {} free pages, {} bytes allocated, \
         {} custom classes)",
        path.display(),
        report.objects,
        report.runs,
        report.extents,
        report.free_pages,
        report.allocated_bytes,
        report.classes
    );
    let colls = terrace_collections::check(&pool)
        .map_err(|e| format!("{}: collections inconsistent: {e}", path.display()))?;
    println!(
        "collections: {} names, {} maps ({} entries, {} pages, {} inner nodes, \
         {} out-of-line values), {} arrays; {} program objects no name binds",
        colls.bindings,
        colls
            .maps
            .saturating_sub(pool.directory().ok().flatten().is_some() as u64),
        colls.entries,
        colls.leaves,
        colls.inner_nodes,
        colls.blobs,
        colls.arrays,
        colls.untracked
    );
    if colls.unreachable.is_empty() {
        return Ok(());
    }
    for oid in &colls.unreachable {
        let type_num = pool.type_of(*oid).unwrap_or(0);
        println!("unreachable: {:#x} (type {type_num:#x})", oid.offset());
    }
    if sweep {
        let freed = terrace_collections::sweep(&pool, &colls)
            .map_err(|e| format!("{}: sweep: {e}", path.display()))?;
        println!("swept: freed {freed} unreachable objects");
        return Ok(());
    }
    Err(format!(
        "{}: {} collection objects no name reaches (free them with --sweep)",
        path.display(),
        colls.unreachable.len()
    ))
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
    if !s.custom_classes.is_empty() {
        println!("| custom class | runs | slots | used | fill |");
        println!("|---|---|---|---|---|");
        for (id, (runs, slots, used)) in &s.custom_classes {
            let fill = if *slots == 0 {
                0.0
            } else {
                100.0 * *used as f64 / *slots as f64
            };
            println!("| {id} | {runs} | {slots} | {used} | {fill:.1}% |");
        }
    }
}

use std::time::Instant;
use terrace_kinds::{free, FileKindOptions, Kind};
fn main() {
    let args: Vec<String> = std::env::args().collect();
    let size: usize = args[1].parse().unwrap();
    let kind = if args[2] == "file" {
        Kind::create_file(&FileKindOptions::in_dir("/dev/shm", 4 << 30)).unwrap()
    } else {
        Kind::DEFAULT
    };
    let rounds: usize = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(3);
    let n = ((1usize << 30) / size).min(4_000_000);
    for _ in 0..rounds {
        let mut ptrs = Vec::with_capacity(n);
        let t0 = Instant::now();
        for _ in 0..n {
            ptrs.push(kind.malloc(size).unwrap());
        }
        let t1 = Instant::now();
        for p in ptrs {
            unsafe {
                free(p.as_ptr());
            }
        }
        let t2 = Instant::now();
        println!(
            "{size},{:.0},{:.0}",
            (t1 - t0).as_nanos() as f64 / n as f64,
            (t2 - t1).as_nanos() as f64 / n as f64
        );
    }
}

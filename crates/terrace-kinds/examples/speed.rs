use std::time::Instant;
use terrace_kinds::{free, FileKindOptions, Kind};
fn main() {
    let file = Kind::create_file(&FileKindOptions::in_dir("/dev/shm", 4 << 30)).unwrap();
    for &size in &[64usize, 512, 4096, 65536, 1 << 20] {
        let n = ((1usize << 30) / size).min(4_000_000);
        for (name, kind) in [("file", file), ("dram", Kind::DEFAULT)] {
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
            if name == "file" {
                eprintln!(
                    "   pages {:?} reserved {}",
                    kind.engine_pages().unwrap().map(|v| v >> 20),
                    kind.stats().unwrap().reserved >> 20
                );
            }
            println!(
                "{name},{size},{n},{:.0},{:.0}",
                (t1 - t0).as_nanos() as f64 / n as f64,
                (t2 - t1).as_nanos() as f64 / n as f64
            );
        }
    }
    println!("{:?}", file.stats().unwrap());
}

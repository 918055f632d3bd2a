#!/usr/bin/env bash
# Runs PMDK's own anchors (shared/anchors/pmemobj_util.c and pmemobj_mt.c), unchanged,
# against real libpmemobj (with PMEM_IS_PMEM_FORCE=1, as its users benchmark it) and
# against Terrace's libterrace in one run, alternating RUNS times, and prints the medians
# side by side with the ratios the persistent-pool issue asks about.
#
#   bench/pool-vs-pmemobj.sh [DIR]      DIR: where the pool files live (default /dev/shm)
#   RUNS=5 POOL_BYTES=1073741824 THREADS=4 bench/pool-vs-pmemobj.sh
#
# Needs: cc, libpmemobj-dev (Debian), python3. ANCHORS overrides the anchors directory.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
anchors=${ANCHORS:-$root/../shared/anchors}
dir=${1:-/dev/shm}
runs=${RUNS:-3}
pool_bytes=${POOL_BYTES:-1073741824}
threads=${THREADS:-4}
out=$root/target/bench/pool
mkdir -p "$out"
rm -f "$out"/*.csv

cargo build --release --quiet -p terrace-capi
for anchor in pmemobj_util pmemobj_mt; do
  cc -O2 "$anchors/$anchor.c" -o "$out/$anchor.pmdk" -lpmemobj -lpthread
  cc -O2 -I"$root/include" "$anchors/$anchor.c" -o "$out/$anchor.terrace" \
     -L"$root/target/release" -lterrace -lpthread -Wl,-rpath,"$root/target/release"
done

for i in $(seq "$runs"); do
  PMEM_IS_PMEM_FORCE=1 "$out/pmemobj_util.pmdk" "$dir/bench-util.pool" "$pool_bytes" > "$out/util.pmdk.$i.csv"
  "$out/pmemobj_util.terrace" "$dir/bench-util.pool" "$pool_bytes" > "$out/util.terrace.$i.csv"
  PMEM_IS_PMEM_FORCE=1 "$out/pmemobj_mt.pmdk" "$dir/bench-mt.pool" "$pool_bytes" "$threads" > "$out/mt.pmdk.$i.csv"
  "$out/pmemobj_mt.terrace" "$dir/bench-mt.pool" "$pool_bytes" "$threads" > "$out/mt.terrace.$i.csv"
done
python3 "$root/bench/summarize_pool.py" "$out" "$runs"

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
# STAGE=build only builds (into target/bench/pool), STAGE=run only runs what was built (for
# a machine that cannot build, such as the guest of tests/vm/bench); OUT sets where the
# CSVs go (default: beside the binaries). PMDK_FORCE=0 leaves PMEM_IS_PMEM_FORCE unset, so
# libpmemobj finds out itself whether DIR is persistent memory (on a real DAX mount).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
anchors=${ANCHORS:-$root/../shared/anchors}
dir=${1:-/dev/shm}
runs=${RUNS:-3}
pool_bytes=${POOL_BYTES:-1073741824}
threads=${THREADS:-4}
stage=${STAGE:-all}
bin=$root/target/bench/pool
out=${OUT:-$bin}

if [ "$stage" != run ]; then
  mkdir -p "$bin"
  cargo build --release --quiet -p terrace-capi
  for anchor in pmemobj_util pmemobj_mt; do
    cc -O2 "$anchors/$anchor.c" -o "$bin/$anchor.pmdk" -lpmemobj -lpthread
    cc -O2 -I"$root/include" "$anchors/$anchor.c" -o "$bin/$anchor.terrace" \
       -L"$root/target/release" -lterrace -lpthread -Wl,-rpath,"$root/target/release"
  done
fi
[ "$stage" != build ] || exit 0

force=()
[ "${PMDK_FORCE:-1}" = 0 ] || force=(env PMEM_IS_PMEM_FORCE=1)
mkdir -p "$out"
rm -f "$out"/*.csv
for i in $(seq "$runs"); do
  "${force[@]}" "$bin/pmemobj_util.pmdk" "$dir/bench-util.pool" "$pool_bytes" > "$out/util.pmdk.$i.csv"
  "$bin/pmemobj_util.terrace" "$dir/bench-util.pool" "$pool_bytes" > "$out/util.terrace.$i.csv"
  "${force[@]}" "$bin/pmemobj_mt.pmdk" "$dir/bench-mt.pool" "$pool_bytes" "$threads" > "$out/mt.pmdk.$i.csv"
  "$bin/pmemobj_mt.terrace" "$dir/bench-mt.pool" "$pool_bytes" "$threads" > "$out/mt.terrace.$i.csv"
done
PMDK_FORCE=${PMDK_FORCE:-1} python3 "$root/bench/summarize_pool.py" "$out" "$runs"

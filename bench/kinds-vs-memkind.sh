#!/usr/bin/env bash
# Runs memkind's own speed anchor (shared/anchors/memkind_speed.c), unchanged, against real
# libmemkind and against Terrace's libterrace in one run, alternating RUNS times, and prints
# the medians side by side with the ratios the foundation issue asks about.
#
#   bench/kinds-vs-memkind.sh [DIR]        DIR: where file kinds live (default /dev/shm)
#   RUNS=7 bench/kinds-vs-memkind.sh       more alternations for a noisy machine
#
# Needs: cc, libmemkind-dev (Debian), python3. ANCHORS overrides the anchors directory.
# STAGE=build only builds (into target/bench/kinds), STAGE=run only runs what was built
# (for a machine that cannot build, such as the guest of tests/vm/bench); OUT sets where
# the CSVs go (default: beside the binaries).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
anchors=${ANCHORS:-$root/../shared/anchors}
dir=${1:-/dev/shm}
runs=${RUNS:-5}
stage=${STAGE:-all}
bin=$root/target/bench/kinds
out=${OUT:-$bin}

if [ "$stage" != run ]; then
  mkdir -p "$bin"
  cargo build --release --quiet -p terrace-capi
  cc -O2 "$anchors/memkind_speed.c" -o "$bin/memkind_speed.memkind" -lmemkind
  cc -O2 -I"$root/include" "$anchors/memkind_speed.c" -o "$bin/memkind_speed.terrace" \
     -L"$root/target/release" -lterrace -Wl,-rpath,"$root/target/release"
fi
[ "$stage" != build ] || exit 0

mkdir -p "$out"
rm -f "$out"/*.csv
for i in $(seq "$runs"); do
  "$bin/memkind_speed.memkind" "$dir" > "$out/memkind.$i.csv"
  "$bin/memkind_speed.terrace" "$dir" > "$out/terrace.$i.csv"
done
python3 "$root/bench/summarize_kinds.py" "$out" "$runs"

#!/usr/bin/env bash
# Runs inside the guest of tests/vm/run (started by tests/vm/bench, which built the
# binaries): the kinds and pool anchors, Terrace against memkind and libpmemobj, with
# their files on ext4 mounted -o dax on the NVDIMM. libpmemobj runs without
# PMEM_IS_PMEM_FORCE: it sees the DAX mapping itself. Results: $TERRACE_VM_OUT/bench.txt.
set -uo pipefail
source tests/vm/guest-lib.sh

step "dax mount" make_dax
step "kinds vs memkind" bash -o pipefail -c "STAGE=run OUT='$out/kinds' RUNS=${RUNS:-3} \
  bench/kinds-vs-memkind.sh $dax | tee -a '$out/bench.txt'"
step "pool vs pmemobj" bash -o pipefail -c "STAGE=run OUT='$out/pool' RUNS=${RUNS:-3} PMDK_FORCE=0 \
  POOL_BYTES=${POOL_BYTES:-1073741824} THREADS=${THREADS:-4} \
  bench/pool-vs-pmemobj.sh $dax | tee -a '$out/bench.txt'"
finish

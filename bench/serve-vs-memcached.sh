#!/usr/bin/env bash
# terrace serve against memcached, same load, same memory, same run: memcaslap (from
# libmemcached-tools) drives each server in turn, alternating RUNS times, and the
# medians and their ratio are printed. Both servers listen on loopback only.
#
# Scenarios (each: memcached -m CAP -t THREADS vs terrace serve --threads THREADS):
#   dram      Terrace with one DRAM tier of CAP
#   file3of4  Terrace with tiers dram:1,file:3 of FILE_CAP (file tier in DIR), memcached
#             with -m FILE_CAP: a run writes about FILE_CAP of values, so three quarters
#             of the data sits in the file tier (the script prints the share it measured)
#   multiget  as dram, memcaslap --division=10 (gets of 10 keys at once)
#   large     as dram, 16 KiB values (memcaslap -X 16384)
#
# Usage: bench/serve-vs-memcached.sh [DIR]     (DIR: file tier directory, default /dev/shm)
# Env:   RUNS (3), SECS (10), CAP_MIB (512), FILE_CAP_MIB (96), THREADS (2), CONC (32),
#        SCENARIOS
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${1:-/dev/shm}
RUNS=${RUNS:-3}
SECS=${SECS:-10}
CAP_MIB=${CAP_MIB:-512}
FILE_CAP_MIB=${FILE_CAP_MIB:-96}
THREADS=${THREADS:-2}
CONC=${CONC:-32}
SCENARIOS=${SCENARIOS:-"dram file3of4 multiget large"}
MC_PORT=${MC_PORT:-21211}
TR_PORT=${TR_PORT:-21212}

for tool in memcached memcaslap; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install memcached libmemcached-tools" >&2; exit 1; }
done
cargo build --release -q -p terrace-cli
TERRACE=${CARGO_TARGET_DIR:-target}/release/terrace

WORK=$(mktemp -d "$DIR/terrace-serve-bench.XXXXXX")
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

wait_port() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "server on port $1 did not start" >&2
  return 1
}

start_memcached() {
  local cap=$1 user=()
  [ "$(id -u)" = 0 ] && user=(-u nobody)
  memcached "${user[@]}" -l 127.0.0.1 -p "$MC_PORT" -U 0 -m "$cap" -t "$THREADS" -c 4096 &
  PIDS+=($!)
  wait_port "$MC_PORT"
}

start_terrace() {
  local tiers=$1 cap=$2
  rm -rf "$WORK/data"
  "$TERRACE" serve --listen "127.0.0.1:$TR_PORT" --threads "$THREADS" --dir "$WORK/data" \
    --tiers "$tiers" --capacity "${cap}MiB" --max-connections 4096 >/dev/null 2>"$WORK/terrace.log" &
  PIDS+=($!)
  wait_port "$TR_PORT"
}

stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}

# One memcaslap run; prints its TPS. A run in which the server answered any request with
# an error is not a measurement: it stops the script (a server that refuses every set
# would look fast).
load() {
  local port=$1; shift
  memcaslap -s "127.0.0.1:$port" -T "$THREADS" -c "$CONC" -t "${SECS}s" "$@" >"$WORK/load.out" 2>&1
  if grep -q "ERROR" "$WORK/load.out"; then
    echo "server on port $port answered with errors:" >&2
    grep -m 5 "ERROR" "$WORK/load.out" >&2
    exit 1
  fi
  awk '/^Run time:/ { for (i = 1; i <= NF; i++) if ($i == "TPS:") print $(i + 1) }' "$WORK/load.out" | tail -1
}

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else print v[int((NR + 1) / 2)] }'; }

# A tier-1 share of the items, from terrace's stats (how much of the data the file tier held).
file_share() {
  local stats
  stats=$(exec 3<>"/dev/tcp/127.0.0.1/$TR_PORT"; printf 'stats\r\nquit\r\n' >&3; cat <&3)
  echo "$stats" | tr -d '\r' | awk '
    /^STAT tier_0_segments / { s0 = $3 } /^STAT tier_0_free_segments / { f0 = $3 }
    /^STAT tier_1_segments / { s1 = $3 } /^STAT tier_1_free_segments / { f1 = $3 }
    END { u0 = s0 - f0; u1 = s1 - f1; if (u0 + u1 > 0) printf "%.2f", u1 / (u0 + u1); else print "-" }'
}

printf '%-10s %-28s %12s %12s %7s %s\n' scenario load memcached terrace ratio "file-tier share"
for scenario in $SCENARIOS; do
  args=(); tiers="dram:1"; cap=$CAP_MIB
  case $scenario in
    dram) ;;
    file3of4) tiers="dram:1,file:3"; cap=$FILE_CAP_MIB ;;
    multiget) args=(--division=10) ;;
    large) args=(-X 16384) ;;
    *) echo "unknown scenario $scenario" >&2; exit 1 ;;
  esac
  mc=(); tr=(); share=-
  for _ in $(seq "$RUNS"); do
    start_memcached "$cap"
    mc+=("$(load "$MC_PORT" "${args[@]}")")
    stop_all
    start_terrace "$tiers" "$cap"
    tr+=("$(load "$TR_PORT" "${args[@]}")")
    [ "$scenario" = file3of4 ] && share=$(file_share)
    stop_all
  done
  m=$(printf '%s\n' "${mc[@]}" | median)
  t=$(printf '%s\n' "${tr[@]}" | median)
  ratio=$(awk -v a="$t" -v b="$m" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')
  printf '%-10s %-28s %12s %12s %7s %s\n' "$scenario" "-T $THREADS -c $CONC ${args[*]:-}" "$m" "$t" "$ratio" "$share"
  echo "  runs memcached: ${mc[*]}   terrace: ${tr[*]}"
done

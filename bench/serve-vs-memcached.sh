#!/usr/bin/env bash
# terrace serve against memcached, same load, same memory, same run: memcaslap (from
# libmemcached-tools) drives each server in turn, alternating RUNS times, and the
# medians and their ratios are printed. Both servers listen on loopback only.
#
# Two figures per server:
#   ops/s          memcaslap's throughput. On a machine whose cores the client shares
#                  with the server this mostly measures who leaves the client more CPU.
#   CPU s / M req  the server's own CPU time (user + system, from /proc/PID/stat, all its
#                  threads) per million memcaslap operations served. It does not depend
#                  on who else uses the cores, so it holds on a shared 2-core machine.
#
# Scenarios (each: memcached -m CAP -t THREADS vs terrace serve --threads THREADS;
# memcaslap's default mix of 90% gets and 10% sets):
#   dram      Terrace with one DRAM tier of CAP, 1 KiB values (memcaslap's default)
#   small     as dram, 64-byte values (memcaslap -X 64)
#   multiget  as dram, memcaslap --division=10 (gets of 10 keys at once)
#   large     as dram, 16 KiB values (memcaslap -X 16384)
#   file3of4  Terrace with tiers dram:1,file:3 of FILE_CAP (file tier in DIR), memcached
#             with -m FILE_CAP: a run writes about FILE_CAP of values, so three quarters
#             of the data sits in the file tier (the script prints the share it measured)
#
# Usage: bench/serve-vs-memcached.sh [DIR]     (DIR: file tier directory, default /dev/shm)
# Env:   RUNS (3), SECS (10), CAP_MIB (512), FILE_CAP_MIB (96), THREADS ("2": a list such
#        as "1 2 4" sweeps the server's worker threads), CONC (32), CLIENT_THREADS (2),
#        SCENARIOS, TERRACE_ARGS (extra flags for terrace serve)
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${1:-/dev/shm}
RUNS=${RUNS:-3}
SECS=${SECS:-10}
CAP_MIB=${CAP_MIB:-512}
FILE_CAP_MIB=${FILE_CAP_MIB:-96}
THREADS=${THREADS:-2}
CONC=${CONC:-32}
CLIENT_THREADS=${CLIENT_THREADS:-2}
SCENARIOS=${SCENARIOS:-"dram small multiget large file3of4"}
TERRACE_ARGS=${TERRACE_ARGS:-}
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
  local cap=$1 threads=$2 user=()
  [ "$(id -u)" = 0 ] && user=(-u nobody)
  memcached "${user[@]}" -l 127.0.0.1 -p "$MC_PORT" -U 0 -m "$cap" -t "$threads" -c 4096 &
  PIDS+=($!)
  wait_port "$MC_PORT"
}

start_terrace() {
  local tiers=$1 cap=$2 threads=$3
  rm -rf "$WORK/data"
  # shellcheck disable=SC2086
  "$TERRACE" serve --listen "127.0.0.1:$TR_PORT" --threads "$threads" --dir "$WORK/data" $TERRACE_ARGS \
    --tiers "$tiers" --capacity "${cap}MiB" --max-connections 4096 >/dev/null 2>"$WORK/terrace.log" &
  PIDS+=($!)
  wait_port "$TR_PORT"
}

stop_all() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  PIDS=()
}

# One memcaslap run against the server PID on PORT; prints "TPS CPU": memcaslap's
# throughput and the server's CPU seconds per million operations. A run in which the
# server answered any request with an error is not a measurement: it stops the script (a
# server that refuses every set would look fast).
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
load() {
  local port=$1 pid=$2; shift 2
  local before after
  before=$(cpu_ticks "$pid")
  memcaslap -s "127.0.0.1:$port" -T "$CLIENT_THREADS" -c "$CONC" -t "${SECS}s" "$@" >"$WORK/load.out" 2>&1
  after=$(cpu_ticks "$pid")
  if grep -q "ERROR" "$WORK/load.out"; then
    echo "server on port $port answered with errors:" >&2
    grep -m 5 "ERROR" "$WORK/load.out" >&2
    exit 1
  fi
  awk -v ticks=$((after - before)) -v hz="$(getconf CLK_TCK)" '
    /^Run time:/ { for (i = 1; i <= NF; i++) { if ($i == "TPS:") tps = $(i + 1); if ($i == "Ops:") ops = $(i + 1) } }
    END { if (ops > 0) printf "%s %.3f\n", tps, ticks / hz / ops * 1e6; else print "0 0" }' "$WORK/load.out"
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

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

printf '%-9s %3s %-18s %9s %9s %6s   %8s %8s %6s  %s\n' scenario thr load \
  "mc ops/s" "tr ops/s" ratio "mc CPU" "tr CPU" ratio "file-tier share"
printf '%-9s %3s %-18s %9s %9s %6s   %8s %8s %6s\n' "" "" "" "" "" "" "s/M req" "s/M req" ""
for scenario in $SCENARIOS; do
  args=(); tiers="dram:1"; cap=$CAP_MIB
  case $scenario in
    dram) ;;
    small) args=(-X 64) ;;
    file3of4) tiers="dram:1,file:3"; cap=$FILE_CAP_MIB ;;
    multiget) args=(--division=10) ;;
    large) args=(-X 16384) ;;
    *) echo "unknown scenario $scenario" >&2; exit 1 ;;
  esac
  for threads in $THREADS; do
    mc=(); tr=(); mc_cpu=(); tr_cpu=(); share=-
    for _ in $(seq "$RUNS"); do
      start_memcached "$cap" "$threads"
      read -r tps cpu < <(load "$MC_PORT" "${PIDS[0]}" "${args[@]}")
      mc+=("$tps"); mc_cpu+=("$cpu")
      stop_all
      start_terrace "$tiers" "$cap" "$threads"
      read -r tps cpu < <(load "$TR_PORT" "${PIDS[0]}" "${args[@]}")
      tr+=("$tps"); tr_cpu+=("$cpu")
      [ "$scenario" = file3of4 ] && share=$(file_share)
      stop_all
    done
    m=$(printf '%s\n' "${mc[@]}" | median); t=$(printf '%s\n' "${tr[@]}" | median)
    mcpu=$(printf '%s\n' "${mc_cpu[@]}" | median); tcpu=$(printf '%s\n' "${tr_cpu[@]}" | median)
    printf '%-9s %3s %-18s %9s %9s %6s   %8s %8s %6s  %s\n' "$scenario" "$threads" \
      "-T $CLIENT_THREADS -c $CONC ${args[*]:-}" "$m" "$t" "$(ratio "$t" "$m")" \
      "$mcpu" "$tcpu" "$(ratio "$tcpu" "$mcpu")" "$share"
    echo "  runs memcached: ${mc[*]} (CPU ${mc_cpu[*]})   terrace: ${tr[*]} (CPU ${tr_cpu[*]})"
  done
done

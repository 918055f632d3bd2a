#!/usr/bin/env bash
# Where the CPU goes while memcaslap drives memcached and then terrace serve (same load,
# same run): a system-wide `perf record` in the middle of each run, reported as the share
# of all samples taken by the client, the server's kernel side and the server's user
# side. It backs the README's explanation of why the single-get ratio is bounded on a
# machine whose load generator shares the server's cores.
#
# Usage: bench/serve-cpu-split.sh            (needs perf: apt-get install linux-perf)
# Env:   SECS (12), THREADS (2), CONC (32), CAP_MIB (512)
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${SECS:-12}
THREADS=${THREADS:-2}
CONC=${CONC:-32}
CAP_MIB=${CAP_MIB:-512}
MC_PORT=${MC_PORT:-21211}
TR_PORT=${TR_PORT:-21212}
for tool in memcached memcaslap perf; do
  command -v "$tool" >/dev/null || { echo "$tool not found" >&2; exit 1; }
done
cargo build --release -q -p terrace-cli
TERRACE=${CARGO_TARGET_DIR:-target}/release/terrace
WORK=$(mktemp -d)
PID=
cleanup() { [ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

measure() {  # name port
  local name=$1 port=$2
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
  memcaslap -s "127.0.0.1:$port" -T "$THREADS" -c "$CONC" -t "${SECS}s" >"$WORK/$name.caslap" 2>&1 &
  local load=$!
  sleep 2
  perf record -q -a -o "$WORK/$name.data" -- sleep $((SECS - 4)) 2>/dev/null
  wait "$load"
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
  perf report -i "$WORK/$name.data" --no-children --sort comm,dso -g none --stdio 2>/dev/null |
    awk -v name="$name" '
      /^ *[0-9.]+%/ {
        share = $1 + 0; comm = $2; dso = $NF
        if (comm ~ /^memcaslap/) client += share
        else if (comm ~ /^(mc-|memcached|terrace)/) { if (dso ~ /kernel/) sk += share; else su += share }
      }
      END { printf "%-10s client %5.1f%%   server kernel %5.1f%%   server user %5.1f%%   server %5.1f%%\n", name, client, sk, su, sk + su }'
  grep -o "TPS: [0-9]*" "$WORK/$name.caslap" | sed "s/^/           memcaslap /"
}

user=(); [ "$(id -u)" = 0 ] && user=(-u nobody)
memcached "${user[@]}" -l 127.0.0.1 -p "$MC_PORT" -U 0 -m "$CAP_MIB" -t "$THREADS" -c 4096 & PID=$!
measure memcached "$MC_PORT"
"$TERRACE" serve --listen "127.0.0.1:$TR_PORT" --threads "$THREADS" --dir "$WORK/data" \
  --tiers dram:1 --capacity "${CAP_MIB}MiB" --max-connections 4096 >/dev/null 2>&1 & PID=$!
measure terrace "$TR_PORT"

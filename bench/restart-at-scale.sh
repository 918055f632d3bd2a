#!/usr/bin/env bash
# How fast a server comes back after a stop, and what it brings back, at scale.
#
# For each N in SIZES and each mode in MODES, `terrace serve` (TIERS of CAP, file tier
# in DIR) is filled with N items of VALUE_SIZE bytes by `terrace-bench net-fill` (keys
# key:<id>, values derived from the id; with TOUCH=1 each item is also read once right
# after it is stored: Terrace's first tier demotes only items that had a hit and drops
# the others, so without it a fill-only load never reaches the file tier), left to go
# idle (`net-stats --settle-secs`), then stopped:
#   clean   SIGTERM; "stop s" is the time until the process has exited (it saves its
#           index on the way out)
#   crash   SIGKILL; the DRAM tier's items are lost by design (it is volatile), so items
#           back counts what the file tier kept: reported, not a failure (with the
#           default CAP, 2 GiB of DRAM holds all of 10M items of 100 B, so nothing
#           comes back; CAP=2GiB puts most of 10M items in the file tier)
# and restarted with the same flags, while `net-probe` measures from the restart's exec
# the first accepted connection and the first hit, then reads every item back (or SAMPLE
# of them): items back = hits / N, and any wrong value (a hit whose bytes are not the
# ones stored) fails the script.
#
# The same for memcached's restartable mode (`-e FILE`, item memory in a file on MC_DIR,
# which must be tmpfs or DAX; -m of CAP). Its documented graceful stop is SIGUSR1: it
# writes FILE.meta and exits, and a restart with the same -m and item settings reuses
# the memory. A restart within the same wall-clock second as the stop is refused by
# memcached (it wants a positive time since the stop), so the script waits for the next
# second before restarting memcached; the timings start at the exec either way. A
# memcached that discarded its state is reported as EMPTY.
#
# Usage: bench/restart-at-scale.sh [DIR]     (DIR: file tier directory, default /dev/shm)
# Env:   SIZES ("1000000 10000000"), MODES ("clean crash"), MC_MODES ("clean"; "" skips
#        memcached), THREADS (2), CAP (8GiB), TIERS (dram:1,file:3), TOUCH (1),
#        VALUE_SIZE (100), CONNS (2: fill and check
#        connections), SAMPLE (all N), WAIT (300: seconds any start, stop or connect may
#        take), HIT_WAIT (10: seconds after connecting to look for a first hit), SETTLE
#        (60), PORT (21311), MC_DIR (/dev/shm), RESULTS (a file: one JSON row per run),
#        SKIP_BUILD (1: use the binaries already in the target directory), KEEP_LOGS (1:
#        keep the servers' logs; they are kept anyway when the script fails)
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${1:-/dev/shm}
SIZES=${SIZES:-"1000000 10000000"}
MODES=${MODES-"clean crash"}
MC_MODES=${MC_MODES-"clean"}
THREADS=${THREADS:-2}
CAP=${CAP:-8GiB}
TIERS=${TIERS:-dram:1,file:3}
TOUCH=${TOUCH:-1}
VALUE_SIZE=${VALUE_SIZE:-100}
CONNS=${CONNS:-2}
SAMPLE=${SAMPLE:-}
WAIT=${WAIT:-300}
HIT_WAIT=${HIT_WAIT:-10}
SETTLE=${SETTLE:-60}
PORT=${PORT:-21311}
MC_DIR=${MC_DIR:-/dev/shm}
RESULTS=${RESULTS:-}

for tool in memcached jq; do
  command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install memcached jq" >&2; exit 1; }
done
case $CAP in
  *GiB) CAP_MIB=$((${CAP%GiB} * 1024)) ;;
  *MiB) CAP_MIB=${CAP%MiB} ;;
  *) echo "CAP must be a number of GiB or MiB (8GiB, 512MiB), not $CAP" >&2; exit 1 ;;
esac
TARGET=${CARGO_TARGET_DIR:-target}
[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p terrace-cli -p terrace-bench
TERRACE=$TARGET/release/terrace
BENCH=$TARGET/release/terrace-bench
ADDR=127.0.0.1:$PORT
TOUCH_ARG=()
[ "$TOUCH" = 1 ] && TOUCH_ARG=(--touch)

# Timings mean little while another server works on this machine.
if pgrep -x terrace >/dev/null || pgrep -x memcached >/dev/null; then
  echo "warning: another terrace or memcached process is running:" \
    "$(pgrep -x -d ' ' terrace) $(pgrep -x -d ' ' memcached)" >&2
fi
WORK=$(mktemp -d "$DIR/terrace-restart-bench.XXXXXX")
MC_WORK=$(mktemp -d "$MC_DIR/terrace-restart-mc.XXXXXX")
# memcached drops to nobody when started as root; it opens its memory file after that.
MC_USER=()
if [ "$(id -u)" = 0 ]; then MC_USER=(-u nobody); chown nobody "$MC_WORK"; fi
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/terrace-restart-logs.XXXXXX")
SERVER=
cleanup() {
  local rc=$?
  if [ -n "$SERVER" ]; then kill -KILL "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  rm -rf "$WORK" "$MC_WORK"
  if [ "$rc" != 0 ] || [ "${KEEP_LOGS:-0}" = 1 ]; then
    echo "logs of the servers: $LOGS" >&2
  else
    rm -rf "$LOGS"
  fi
}
trap cleanup EXIT

# Seconds between two $EPOCHREALTIME readings.
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b - a }'; }

# Whether the server process $SERVER still runs (not exited, not a zombie).
alive() {
  local state
  state=$(awk '{ print $3 }' "/proc/$SERVER/stat" 2>/dev/null || echo gone)
  [ "$state" != gone ] && [ "$state" != Z ]
}

# Waits until the server process $SERVER has exited (at most WAIT seconds), reaps it.
wait_exit() {
  local start=$EPOCHREALTIME
  while :; do
    alive || break
    if awk -v a="$start" -v b="$EPOCHREALTIME" -v w="$WAIT" 'BEGIN { exit !(b - a > w) }'; then
      echo "server $SERVER did not exit within $WAIT s" >&2
      return 1
    fi
    sleep 0.002
  done
  wait "$SERVER" 2>/dev/null || true
  SERVER=
}

# Waits for the server to accept connections (at most WAIT seconds).
wait_port() {
  local start=$EPOCHREALTIME
  until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
    if ! alive; then echo "the server exited while starting" >&2; return 1; fi
    if awk -v a="$start" -v b="$EPOCHREALTIME" -v w="$WAIT" 'BEGIN { exit !(b - a > w) }'; then
      echo "server on port $PORT did not start within $WAIT s" >&2
      return 1
    fi
    sleep 0.01
  done
  if ! alive; then echo "the server exited while starting" >&2; return 1; fi
}

start_server() {
  local server=$1 log=$2
  # Anything else listening on the port would answer in the server's place.
  if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
    echo "port $PORT is already in use; set PORT to a free one" >&2
    exit 1
  fi
  case $server in
    terrace)
      "$TERRACE" serve --listen "$ADDR" --threads "$THREADS" --tiers "$TIERS" \
        --capacity "$CAP" --dir "$WORK/data" --max-connections 4096 >>"$log" 2>&1 &
      ;;
    memcached)
      memcached "${MC_USER[@]}" -l 127.0.0.1 -p "$PORT" -U 0 -m "$CAP_MIB" -t "$THREADS" \
        -c 4096 -e "$MC_WORK/memcached.mem" >>"$log" 2>&1 &
      ;;
  esac
  SERVER=$!
}

# Stops $SERVER the way MODE says; STOP_SECS: the seconds until it exited.
STOP_SECS=
stop_server() {
  local server=$1 mode=$2 sig start
  case $server/$mode in
    */crash) sig=KILL ;;
    terrace/clean) sig=TERM ;;
    memcached/clean) sig=USR1 ;;
  esac
  start=$EPOCHREALTIME
  kill "-$sig" "$SERVER"
  wait_exit
  STOP_SECS=$(secs "$start" "$EPOCHREALTIME")
}

ROWS=()
FAILED=0
run() {
  local server=$1 n=$2 mode=$3 tag="$1-$2-$3" fill settle before stop t0 probe rc back note=""
  local log=$LOGS/$tag.log
  rm -rf "$WORK/data" "$MC_WORK"/memcached.mem*
  echo "== $server N=$n $mode" >&2
  start_server "$server" "$log"
  wait_port
  fill=$("$BENCH" net-fill --addr "$ADDR" --items "$n" --value-size "$VALUE_SIZE" \
    --connections "$CONNS" --timeout-secs "$WAIT" ${TOUCH_ARG[@]+"${TOUCH_ARG[@]}"} --json)
  settle=$("$BENCH" net-stats --addr "$ADDR" --settle-secs "$SETTLE" --json)
  before=$(jq -r '.curr_items' <<<"$settle")
  stop_server "$server" "$mode"
  stop=$STOP_SECS
  # memcached refuses to reuse its memory within the second it stopped in.
  [ "$server" = memcached ] && sleep "$(awk -v t="$EPOCHREALTIME" 'BEGIN { printf "%.3f", int(t) + 1.01 - t }')"
  echo "-- restart" >>"$log"
  t0=$EPOCHREALTIME
  start_server "$server" "$log"
  rc=0
  probe=$("$BENCH" net-probe --addr "$ADDR" --items "$n" ${SAMPLE:+--sample "$SAMPLE"} \
    --value-size "$VALUE_SIZE" --since "$t0" --wait-secs "$WAIT" --hit-wait-secs "$HIT_WAIT" \
    --connections "$CONNS" --timeout-secs "$WAIT" --json) || rc=$?
  if [ -z "$probe" ]; then
    echo "net-probe failed (exit $rc) against $server N=$n $mode; see $log" >&2
    exit 1
  fi
  stop_server "$server" clean
  if [ "$(jq -r '.wrong' <<<"$probe")" != 0 ]; then
    echo "!!! $server N=$n $mode: WRONG VALUES read back: $(jq -c '{wrong, first_wrong}' <<<"$probe")" >&2
    FAILED=1
  fi
  back=$(jq -r '.hits' <<<"$probe")
  if [ "$back" = 0 ] && [ "$(jq -r '.curr_items' <<<"$probe")" = 0 ]; then
    note="EMPTY: came back with no items"
    [ "$server" = memcached ] && note="EMPTY: memcached discarded its state ($(sed -n '/^-- restart/,$p' "$log" | grep '^\[restart\]' | tr '\n' ' ' || true))"
    echo "$server N=$n $mode: $note" >&2
  fi
  # What the server said about its restart (terrace: its "cache opened" log line).
  local said row
  said=$(sed -n '/^-- restart/,$p' "$log" | grep -o -e 'cache opened.*' -e '^\[restart\].*' | tr '\n' ' ' || true)
  [ -n "$said" ] && echo "  $server: $said" >&2
  row=$(jq -c -n --arg server "$server" --argjson n "$n" --arg mode "$mode" --arg note "$note" --arg said "$said" \
    --argjson fill "$fill" --argjson before "$before" --argjson stop "$stop" --argjson probe "$probe" \
    '{server: $server, n: $n, mode: $mode, fill_seconds: $fill.seconds,
      items_before: $before, stop_seconds: $stop, connect_seconds: $probe.connect_seconds,
      first_hit_seconds: $probe.first_hit_seconds, checked: $probe.checked,
      items_back: $probe.hits, misses: $probe.misses, wrong: $probe.wrong,
      curr_items_after: $probe.curr_items, check_seconds: $probe.check_seconds, note: $note,
      server_open_seconds: ($probe.restart_stats.terrace_restart_seconds // null | if . == null then null else tonumber end),
      restart_stats: $probe.restart_stats, server_said: $said}')
  ROWS+=("$row")
  [ -n "$RESULTS" ] && echo "$row" >>"$RESULTS"
  echo "$row" >&2
}

for n in $SIZES; do
  for mode in $MODES; do run terrace "$n" "$mode"; done
  for mode in $MC_MODES; do run memcached "$n" "$mode"; done
done

echo
echo "| server | N | mode | fill s | items before | stop s | open s | connect s | first hit s | items back | wrong | curr_items after |"
echo "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
for row in "${ROWS[@]}"; do
  jq -r '"| \(.server) | \(.n) | \(.mode) | \(.fill_seconds * 1000 | round / 1000) | \(.items_before) | \(.stop_seconds) | \(if .server_open_seconds == null then "-" else (.server_open_seconds * 1000 | round / 1000 | tostring) end) | \(.connect_seconds * 1000 | round / 1000) | \(if .first_hit_seconds == null then "none" else (.first_hit_seconds * 1000 | round / 1000 | tostring) end) | \(.items_back)/\(.checked) (\(if .checked > 0 then (.items_back * 1000 / .checked | round / 10) else 0 end)%) | \(.wrong) | \(.curr_items_after)\(if .note != "" then " " + .note else "" end) |"' <<<"$row"
done
echo
echo "DIR=$DIR CAP=$CAP TIERS=$TIERS THREADS=$THREADS VALUE_SIZE=$VALUE_SIZE CONNS=$CONNS TOUCH=$TOUCH;"
echo "connect and first hit: seconds from the restart's exec; open: the server's own restart time"
echo "(terrace_restart_seconds in its stats); items back: hits among the items checked"
if [ "$FAILED" != 0 ]; then
  echo "FAILED: some server returned wrong values (see above)" >&2
  exit 1
fi

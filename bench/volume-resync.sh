#!/usr/bin/env bash
# What a replicated volume's primary sends a secondary whose copy followed another
# stream — after a failover, or a restart of the primary — and how long the volume takes
# to be healthy again. On loopback: a secondary (`serve-volume --replica-listen`) and a
# primary (write-back, ack all, its log LOG_SIZE on LOGDIR); fio's nbd engine writes
# WRITE bytes of 4 KiB random writes; the primary is killed (-9) and started again with
# a new epoch (a new stream), and the run records:
#   first    time to healthy, and bytes sent, when the primary first starts (a new copy)
#   restart  the same after the kill: the copy holds everything but what the restart
#            itself wrote
# for BIN and, when given, for OLD_BIN (a build before copies were compared by digest,
# which sends the whole log to any copy that followed another stream), in one run.
#
# Usage: bench/volume-resync.sh                (LOG_SIZE=1GiB WRITE=256m; about a minute)
#        OLD_BIN=/path/to/old/terrace BIN=target/release/terrace bench/volume-resync.sh
# Env: BIN OLD_BIN LOG_SIZE WRITE SIZE DIR LOGDIR PORT
# Needs: fio with the nbd engine, a build of terrace (release, built here if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

LOG_SIZE=${LOG_SIZE:-1GiB}
WRITE=${WRITE:-256m}
SIZE=${SIZE:-1g}
DIR=${DIR:-/var/tmp/terrace-resync-bench}
LOGDIR=${LOGDIR:-/dev/shm/terrace-resync-bench}
PORT=${PORT:-7741}
BIN=${BIN:-target/release/terrace}
OLD_BIN=${OLD_BIN:-}

command -v fio >/dev/null || { echo "fio is missing" >&2; exit 1; }
[ -x "$BIN" ] || cargo build --release -p terrace-cli >&2
BIN=$(realpath "$BIN")

pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]:-}"; do if [ -n "$p" ]; then kill -9 "$p" 2>/dev/null || true; fi; done
  wait 2>/dev/null || true
  if [ "$rc" != 0 ]; then
    for f in "$DIR"/*.log; do [ -f "$f" ] && { echo "--- $f" >&2; tail -n 20 "$f" >&2; }; done
  fi
  rm -rf "$LOGDIR" "$DIR"/*.img "$DIR"/p "$DIR"/s
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() { echo "error: $*" >&2; exit 1; }
wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; die "no socket $1"; }
now() { date +%s.%N; }

start_primary() { # bin epoch
  "$1" serve-volume --backend "file:$DIR/vol.img" --mode write-back --dir "$DIR/p" \
    --log-dir "$LOGDIR/p" --listen "unix:$DIR/p/nbd.sock" \
    --replica-peer "127.0.0.1:$PORT" --ack-level all --min-replicas 1 --epoch "$2" \
    --log-size "$LOG_SIZE" </dev/null >/dev/null 2>>"$DIR/primary.log" &
  ppid=$!; pids+=($ppid)
  wait_sock "$DIR/p/control.sock"
}

# Waits until healthy with nothing queued; prints "seconds sent_bytes" (resynced plus
# digest bytes, the digests where the build has them) since `t0`.
wait_healthy() { # bin t0
  local s
  for _ in $(seq 1200); do
    s=$("$1" volume status --control "$DIR/p/control.sock" 2>/dev/null || true)
    if grep -q '^  replication healthy$' <<< "$s" && ! grep -q 'queued_bytes [1-9]' <<< "$s"; then
      local t1 resynced digest
      t1=$(now)
      resynced=$(grep -o 'resynced_bytes [0-9]*' <<< "$s" | awk '{print $2}' || true)
      digest=$(grep -o 'digest_bytes [0-9]*' <<< "$s" | awk '{print $2}' || true)
      echo "$(awk "BEGIN { print $t1 - $2 }") $(( resynced + ${digest:-0} ))"
      return 0
    fi
    sleep 0.05
  done
  echo "$s" >&2
  die "not healthy within 60 s"
}

run_build() { # label bin
  local label=$1 bin=$2 t0 first restart
  rm -rf "$DIR/p" "$DIR/s" "$LOGDIR"; mkdir -p "$DIR/p" "$DIR/s" "$LOGDIR/p" "$LOGDIR/s"
  rm -f "$DIR/vol.img"; fallocate -l 2G "$DIR/vol.img"
  "$bin" serve-volume --replica-listen "127.0.0.1:$PORT" --dir "$DIR/s" \
    --log-dir "$LOGDIR/s" </dev/null >/dev/null 2>>"$DIR/secondary.log" &
  pids+=($!)
  sleep 0.5
  t0=$(now); start_primary "$bin" 1
  first=$(wait_healthy "$bin" "$t0")
  fio --name=fill --ioengine=nbd --uri="nbd+unix:///volume?socket=$DIR/p/nbd.sock" \
    --rw=randwrite --bs=4k --iodepth=16 --size="$SIZE" --io_size="$WRITE" \
    --output-format=terse >/dev/null
  wait_healthy "$bin" "$(now)" >/dev/null
  kill -9 "$ppid"; wait "$ppid" 2>/dev/null || true
  t0=$(now); start_primary "$bin" 2
  restart=$(wait_healthy "$bin" "$t0")
  kill -9 "$ppid" "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; pids=()
  read -r f_s f_b <<< "$first"
  read -r r_s r_b <<< "$restart"
  printf '| %s | %.2f | %s | %.2f | %s |\n' "$label" "$f_s" "$f_b" "$r_s" "$r_b"
}

rm -rf "$DIR"; mkdir -p "$DIR"
echo "log $LOG_SIZE on $LOGDIR, $WRITE written at random over $SIZE before the restart"
echo
echo "| build | first: s to healthy | bytes sent | restart: s to healthy | bytes sent |"
echo "|---|---|---|---|---|"
run_build "this ($(basename "$BIN"))" "$BIN"
if [ -n "$OLD_BIN" ]; then
  run_build "before ($(basename "$OLD_BIN"))" "$(realpath "$OLD_BIN")"
fi

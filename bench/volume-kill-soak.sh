#!/usr/bin/env bash
# Kill soak of terrace serve-volume (issue 23's "zero errors in every mode over >= 20
# rounds"): per round, a zeroed backend file, the server in MODE over it, fio
# (ioengine=nbd) writing random 4 KiB blocks with verify=crc32c; fio's trigger saves which
# writes were acknowledged and kill -9s the server 1 to 3 s in; the server restarts and
# fio verifies every acknowledged write. The same rounds against nbdkit's cache filter
# (cache=writeback, in front of the same kind of backend) are the negative control: it
# acknowledges writes it has not made durable, and must fail.
#
# Caveat: fio 3.33 (Debian 12) records only the last iodepth completions in its verify
# state, so a write the server completes after 16 later ones is verified as if it had
# been acknowledged: a round can fail without a lost write (one in four or so against
# terrace serve-volume, whose 16 workers complete out of order). fio >= 3.37 records the
# writes in flight. The suite's tests/volume_kill.rs records acknowledgements itself.
#
# Usage: bench/volume-kill-soak.sh                  (ROUNDS=20, every mode + the control)
#        ROUNDS=5 MODES="write-back" bench/volume-kill-soak.sh
# Prints one line per round and a summary; exits non-zero if a Terrace round failed
# or the control never failed.
set -uo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-20}
MODES=${MODES:-"write-back write-back:on-flush write-through write-around"}
CONTROL=${CONTROL:-1}
SIZE=${SIZE:-1g}
DIR=${DIR:-/var/tmp/terrace-kill-soak}
LOGDIR=${LOGDIR:-/dev/shm/terrace-kill-soak}
BIN=${BIN:-target/release/terrace}
[ -x "$BIN" ] || cargo build --release -p terrace-cli >&2

wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; return 1; }

start_terrace() { # mode[:durability]
  local mode=${1%%:*} ack=on-write
  [[ $1 == *:* ]] && ack=${1#*:}
  rm -f "$DIR/nbd.sock"
  "$BIN" serve-volume --backend "file:$DIR/backend.img" --mode "$mode" --durability "$ack" \
    --tiers dram:64MiB --dir "$DIR" --log-dir "$LOGDIR" --log-size 256MiB \
    --listen "unix:$DIR/nbd.sock" </dev/null >/dev/null 2>>"$DIR/server.log" &
  echo $! > "$DIR/server.pid"
  wait_sock "$DIR/nbd.sock"
}

start_nbdkit() {
  rm -f "$DIR/nbd.sock"
  nbdkit -U "$DIR/nbd.sock" -P "$DIR/server.pid" --filter=cache file "$DIR/backend.img" \
    cache=writeback </dev/null >/dev/null
  wait_sock "$DIR/nbd.sock"
}

fio_job() {
  local uri="nbd+unix:///volume?socket=$DIR/nbd.sock"
  [ "$target" = nbdkit ] && uri="nbd+unix:///?socket=$DIR/nbd.sock"
  (cd "$DIR" && fio --name=soak --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k \
    --iodepth=16 --verify=crc32c --size="$SIZE" "$@")
}

one_round() { # target round
  rm -rf "$DIR" "$LOGDIR"; mkdir -p "$DIR" "$LOGDIR"
  truncate -s "$SIZE" "$DIR/backend.img"
  if [ "$target" = nbdkit ]; then start_nbdkit; else start_terrace "$target"; fi
  local pid; pid=$(cat "$DIR/server.pid")
  local at=$(( 1 + $2 % 3 ))
  fio_job --verify_state_save=1 --do_verify=0 --trigger-timeout="$at" \
    --trigger="kill -9 $pid" > "$DIR/write.txt" 2>&1
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then echo "the run ended before the kill" >&2; kill -9 "$pid"; return 2; fi
  if [ "$target" = nbdkit ]; then start_nbdkit; else start_terrace "$target"; fi
  fio_job --verify_only=1 --verify_state_load=1 > "$DIR/verify.txt" 2>&1
  local rc=$?
  kill "$(cat "$DIR/server.pid")" 2>/dev/null
  sleep 0.5
  if [ $rc -eq 0 ] && ! grep -q "verify: bad" "$DIR/verify.txt"; then return 0; fi
  # Keep what a failed round left, for whoever looks into it.
  local keep="${DIR}-failed/$target-$2"
  mkdir -p "$keep" && cp "$DIR"/*.txt "$DIR"/*.log "$DIR"/*.state "$keep"/ 2>/dev/null
  echo "round kept in $keep" >&2
  return 1
}

declare -A failed
targets="$MODES"
[ "$CONTROL" = 1 ] && targets="$targets nbdkit"
for target in $targets; do
  failed[$target]=0
  for round in $(seq "$ROUNDS"); do
    if one_round "$target" "$round"; then r=ok; else r=FAILED; failed[$target]=$(( failed[$target] + 1 )); fi
    echo "$target round $round: $r"
  done
done

echo
echo "| target | rounds | rounds with lost or wrong writes |"
echo "|---|---|---|"
status=0
for target in $targets; do
  echo "| $target | $ROUNDS | ${failed[$target]} |"
  if [ "$target" = nbdkit ]; then
    [ "${failed[$target]}" -gt 0 ] || { echo "the negative control never failed: the test has no teeth" >&2; status=1; }
  else
    [ "${failed[$target]}" -eq 0 ] || status=1
  fi
done
exit $status

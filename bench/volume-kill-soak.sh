#!/usr/bin/env bash
# Kill soak of terrace serve-volume (issue 23's "zero errors in every mode over >= 20
# rounds"). Per round: a zeroed backend file, the server in MODE over it, fio (ioengine=nbd)
# writing random 4 KiB blocks with verify=crc32c as 16 jobs, each with its own NBD
# connection, its own 1/16 of the volume (offset_increment) and iodepth=1; the server is
# kill -9ed at a random moment 0.5 to 3 s in, while every job is writing. Each job's
# write fails, the job ends, and fio saves its verify state at exit (verify_state_save,
# one file per job: <aux-path>/local-soak-<job>-verify.state). The server restarts and
# fio (verify_only, verify_state_load) reads back every write that was acknowledged.
#
# Why iodepth=1 per job: fio 3.33's verify state records a job's writes issued and its
# last iodepth completions, and checks the last iodepth writes issued only if they are
# among those completions. With one write in flight per job, completion order is issue
# order and the state is exact: every acknowledged write is verified, the one in flight
# at the kill is not. (With iodepth=16 against a server that completes out of order, a
# write completed before 16 later ones was verified as if acknowledged: false failures.)
# Each round also checks that fio verified, per job, all its writes but the one in flight.
#
# write-back:on-flush (--durability on-flush: a write must survive once a FLUSH after it
# completed) runs fio with --fsync=1: the nbd engine sends NBD_CMD_FLUSH after every write
# (it has no FUA), so every acknowledged write was flushed — except perhaps each job's
# last, whose flush may have been in flight at the kill. fio verifies that one too, which
# is stricter than on-flush promises; a kill -9 cannot tell them apart, as the log is
# written (pwrite) before the reply and the page cache survives the process.
#
# nbdkit's cache filter (cache=writeback) over the same kind of backend, the same rounds
# without flushes, is the negative control: it acknowledges writes it holds only in its
# temporary file, and must fail.
#
# Usage: bench/volume-kill-soak.sh                  (ROUNDS=20, every mode + the control)
#        ROUNDS=5 MODES="write-back" CONTROL=0 bench/volume-kill-soak.sh
#        SEED=1234 ...                              (the kill moments, reproducibly)
# Prints one line per round and a summary; exits non-zero if a Terrace round failed
# or the control never failed. A failed round's files (fio's output and states, the
# server's log, the backend and write log as they were after the kill) are kept in
# $DIR-failed/<target>-<round>/.
set -uo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-20}
MODES=${MODES:-"write-back write-back:on-flush write-through write-around"}
CONTROL=${CONTROL:-1}
SIZE_MIB=${SIZE_MIB:-1024}
JOBS=${JOBS:-16}
DIR=${DIR:-/var/tmp/terrace-kill-soak}
LOGDIR=${LOGDIR:-/dev/shm/terrace-kill-soak}
BIN=${BIN:-target/release/terrace}
SEED=${SEED:-$$}
RANDOM=$SEED
[ -x "$BIN" ] || cargo build --release -p terrace-cli >&2
for tool in fio nbdkit python3; do
  command -v $tool >/dev/null || { echo "$tool is missing" >&2; exit 1; }
done

wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; return 1; }
# Waits up to $2 tenths of a second for process $1 to end; 1 if it did not.
wait_gone() { for _ in $(seq "$2"); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; return 1; }

start_terrace() { # mode[:durability]
  local mode=${1%%:*} ack=on-write
  [[ $1 == *:* ]] && ack=${1#*:}
  rm -f "$DIR/nbd.sock"
  "$BIN" serve-volume --backend "file:$DIR/backend.img" --mode "$mode" --durability "$ack" \
    --tiers dram:64MiB --dir "$DIR" --log-dir "$LOGDIR" --log-size 256MiB \
    --listen "unix:$DIR/nbd.sock" </dev/null >/dev/null 2>>"$DIR/server.log" &
  echo $! > "$DIR/server.pid"
  disown
  wait_sock "$DIR/nbd.sock"
}

start_nbdkit() {
  rm -f "$DIR/nbd.sock"
  nbdkit -U "$DIR/nbd.sock" -P "$DIR/server.pid" --filter=cache file "$DIR/backend.img" \
    cache=writeback </dev/null >/dev/null 2>>"$DIR/server.log"
  wait_sock "$DIR/nbd.sock"
}

start_server() { if [ "$target" = nbdkit ]; then start_nbdkit; else start_terrace "$target"; fi; }

fio_job() { # phase, fio's options...
  local uri="nbd+unix:///volume?socket=$DIR/nbd.sock" phase=$1; shift
  [ "$target" = nbdkit ] && uri="nbd+unix:///?socket=$DIR/nbd.sock"
  local extra=()
  [[ $target == *:on-flush ]] && extra=(--fsync=1)
  fio --name=soak --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=1 \
    --numjobs="$JOBS" --size=$(( SIZE_MIB / JOBS ))m --offset_increment=$(( SIZE_MIB / JOBS ))m \
    --verify=crc32c --aux-path="$DIR/state" --output-format=json \
    --output="$DIR/$phase.json" "${extra[@]}" "$@" > "$DIR/$phase.txt" 2>&1
}

# Per job: writes issued in the write phase, blocks verified, the verify phase's error.
# Prints "verified acked" and fails if a job verified fewer than its writes issued but one.
check_counts() {
  python3 - "$DIR/write.json" "$DIR/verify.json" <<'EOF'
import json, sys
w = json.load(open(sys.argv[1]))["jobs"]
v = json.load(open(sys.argv[2]))["jobs"]
ok = len(w) == len(v)
issued = verified = 0
for a, b in zip(w, v):
    i, r = a["write"]["total_ios"], b["read"]["total_ios"]
    issued += i; verified += r
    if b["error"] or r < i - 1 or r > i:
        ok = False
print(f"verified {verified} of {issued} writes issued")
sys.exit(0 if ok else 1)
EOF
}

keep_round() { # round why
  local keep="${DIR}-failed/$target-$1"
  rm -rf "$keep"; mkdir -p "$keep"
  cp -r "$DIR"/*.txt "$DIR"/*.json "$DIR"/*.log "$DIR/state" "$DIR/crash" "$keep"/ 2>/dev/null
  [ -d "$LOGDIR-crash" ] && cp -r --sparse=always "$LOGDIR-crash" "$keep/crash/log"
  echo "$2" > "$keep/why"
  echo "  $2; round kept in $keep" >&2
}

one_round() { # round; sets $detail
  detail=""; local t0=$SECONDS
  rm -rf "$DIR" "$LOGDIR" "$LOGDIR-crash"; mkdir -p "$DIR/state" "$DIR/crash" "$LOGDIR"
  truncate -s "${SIZE_MIB}M" "$DIR/backend.img"
  start_server || { detail="the server did not start"; return 2; }
  local pid; pid=$(cat "$DIR/server.pid")
  local at_ms=$(( 500 + RANDOM % 2500 ))
  fio_job write --do_verify=0 &
  local fio=$!
  sleep "$(printf '%d.%03d' $(( at_ms / 1000 )) $(( at_ms % 1000 )))"
  if ! kill -0 "$fio" 2>/dev/null; then
    detail="fio ended before the kill at ${at_ms} ms"; kill -9 "$pid"; return 2
  fi
  kill -9 "$pid"
  wait_gone "$pid" 100 || { detail="the server outlived kill -9"; return 2; }
  # Every job's write fails and it ends; if one hangs, the round says so.
  local waited=0
  while kill -0 "$fio" 2>/dev/null && [ $waited -lt 300 ]; do sleep 0.1; waited=$(( waited + 1 )); done
  if kill -0 "$fio" 2>/dev/null; then kill -9 "$fio"; detail="fio hung after the kill"; return 2; fi
  wait "$fio"
  local states; states=$(ls "$DIR/state" | grep -c 'verify\.state$')
  [ "$states" -eq "$JOBS" ] || { detail="$states of $JOBS verify states saved"; keep_round "$1" "$detail"; return 1; }
  # The volume as the kill left it, for whoever looks into a failure.
  cp --sparse=always "$DIR/backend.img" "$DIR/crash/" && cp -r "$LOGDIR" "$LOGDIR-crash"
  start_server || { detail="the server did not restart"; keep_round "$1" "$detail"; return 1; }
  local t1=$SECONDS
  fio_job verify --verify_only=1 --verify_state_load=1
  local rc=$? t2=$SECONDS
  local counts; counts=$(check_counts); local crc=$?
  kill "$(cat "$DIR/server.pid")" 2>/dev/null
  wait_gone "$(cat "$DIR/server.pid")" 200 || kill -9 "$(cat "$DIR/server.pid")" 2>/dev/null
  local bad; bad=$(grep -c "verify: bad" "$DIR/verify.txt")
  detail="kill at ${at_ms} ms, $counts; $(( t1 - t0 ))+$(( t2 - t1 ))+$(( SECONDS - t2 )) s"
  if [ $rc -eq 0 ] && [ $crc -eq 0 ] && [ "$bad" -eq 0 ]; then return 0; fi
  detail="$detail, fio rc $rc, $bad bad blocks"
  keep_round "$1" "$detail"
  return 1
}

declare -A failed invalid
targets="$MODES"
[ "$CONTROL" = 1 ] && targets="$targets nbdkit"
echo "# $(date -u +%FT%TZ) seed $SEED, $ROUNDS rounds, ${SIZE_MIB} MiB, $JOBS jobs at iodepth 1, $(fio --version)"
for target in $targets; do
  failed[$target]=0; invalid[$target]=0
  for round in $(seq "$ROUNDS"); do
    one_round "$round"
    case $? in
      0) r=ok ;;
      1) r=FAILED; failed[$target]=$(( failed[$target] + 1 )) ;;
      *) r=INVALID; invalid[$target]=$(( invalid[$target] + 1 )) ;;
    esac
    echo "$target round $round: $r ($detail)"
  done
done
rm -rf "$LOGDIR" "$LOGDIR-crash"

echo
echo "| target | rounds | rounds with lost or wrong writes | rounds not run to a kill |"
echo "|---|---|---|---|"
status=0
for target in $targets; do
  echo "| $target | $ROUNDS | ${failed[$target]} | ${invalid[$target]} |"
  if [ "$target" = nbdkit ]; then
    [ "${failed[$target]}" -gt 0 ] || { echo "the negative control never failed: the test has no teeth" >&2; status=1; }
  else
    [ "${failed[$target]}" -eq 0 ] && [ "${invalid[$target]}" -eq 0 ] || status=1
  fi
done
exit $status

#!/usr/bin/env bash
# What replicating a volume's write log costs: terrace serve-volume in write-back, its
# log on LOGDIR (the persistent tier; /dev/shm emulates it), streaming the log to 0, 1
# or 2 secondaries (`--replica-listen`, their copies on LOGDIR too) across network
# namespaces over veth:
#   NS-1 (the primary and fio) --veth-- NS-2 (secondary 1)
#        \--veth-- NS-3 (secondary 2)
# Configurations: replicas 1 (no peers); replicas 2, ack local/one/all; replicas 3, ack
# local/one/majority/all (all with --min-replicas 1). Each one gets a fresh backend image
# (IMG_SIZE on DIR), fresh secondaries and a fresh primary, and waits (HEALTHY_WAIT s)
# for `replication healthy` (each new copy is first compared with the log). Then
# fio's nbd engine writes 4 KiB at random over the first SIZE of the volume, RUNTIME s:
#   qd1    iodepth 1, 1 job       (IOPS, completion latency p50 / p99)
#   qd64   iodepth 16, 4 jobs     (IOPS)
# CPU: utime+stime of the primary and of each secondary (/proc/PID/stat), before each
# fio job and after it once every peer has drained (no bytes queued, healthy again; with
# ack local a secondary may still be applying writes when fio ends), per 1000 writes.
# RUNS rounds of all the configurations; the table shows medians, then the ratios
# p50(replicas 2, all) / p50(replicas 2, local) and p50(replicas 2, all) / p50(replicas 1).
#
# On a small VM an idle CPU's wakeup dominates the unreplicated QD1 latency (a busy
# machine shows it several times lower): look at the load, and use RUNS=3 for ratios.
#
# Usage: bench/volume-replication.sh                 (RUNTIME=15 RUNS=1: about 6-8 minutes)
#        RUNTIME=10 BIN=/path/to/terrace OUT=summary.json bench/volume-replication.sh
#        CONFIGS="1:local 2:all" bench/volume-replication.sh   (a subset)
#        LOGDIR=/var/tmp/terrace-repl-logs bench/volume-replication.sh   (logs on disk, an
#          SSD tier's case: the local flush and the round trip overlap)
# Env: RUNTIME RUNS SIZE IMG_SIZE LOG_SIZE TIERS CONFIGS DIR LOGDIR NS PORT
#      HEALTHY_WAIT STOP_WAIT BIN OUT (a JSON summary; raw rows always go to $DIR/results.jsonl).
# Needs: root (ip netns), iproute2, fio with the nbd engine (3.33), /usr/bin/python3, a
# release build of terrace (built here if missing). Server logs: $DIR/*.log (kept).
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-15}
RUNS=${RUNS:-1}
SIZE=${SIZE:-1g}
IMG_SIZE=${IMG_SIZE:-2G}
LOG_SIZE=${LOG_SIZE:-1GiB}
TIERS=${TIERS:-dram:256MiB}
CONFIGS=${CONFIGS:-"1:local 2:local 2:one 2:all 3:local 3:one 3:majority 3:all"}
DIR=${DIR:-/var/tmp/terrace-repl-bench}
LOGDIR=${LOGDIR:-/dev/shm/terrace-repl-bench}
NS=${NS:-trb}            # namespaces ${NS}1 (primary, fio), ${NS}2 and ${NS}3
PORT=${PORT:-7701}
HEALTHY_WAIT=${HEALTHY_WAIT:-60}
STOP_WAIT=${STOP_WAIT:-30}
BIN=${BIN:-target/release/terrace}
OUT=${OUT:-}
PY=/usr/bin/python3

[ "$(id -u)" = 0 ] || { echo "needs root (ip netns)" >&2; exit 1; }
for tool in fio ip ss fallocate $PY; do
  command -v $tool >/dev/null || { echo "$tool is missing" >&2; exit 1; }
done
[ -x "$BIN" ] || cargo build --release -p terrace-cli >&2
BIN=$(realpath "$BIN")
TICKS=$(getconf CLK_TCK)

pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]:-}"; do if [ -n "$p" ]; then kill "$p" 2>/dev/null || true; fi; done
  for p in "${pids[@]:-}"; do
    [ -n "$p" ] || continue
    for _ in $(seq 50); do gone "$p" && break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  if [ "$rc" != 0 ]; then
    for f in "$DIR"/*.log; do
      [ -f "$f" ] || continue
      echo "--- tail of $f" >&2; tail -n 30 "$f" >&2
    done
  fi
  if [ -n "${rm_pid:-}" ]; then wait "$rm_pid" 2>/dev/null || true; fi
  for n in 1 2 3; do ip netns del "$NS$n" 2>/dev/null || true; done
  # The logs and images hold gigabytes of tmpfs memory and disk: gone with the run.
  rm -rf "$LOGDIR" "$DIR"/*.img "$DIR"/p "$DIR"/s2 "$DIR"/s3
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

rm -rf "$DIR" "$LOGDIR"; mkdir -p "$DIR" "$LOGDIR"
RAW=$DIR/results.jsonl
: > "$RAW"

# Network: NS-1 joined to NS-2 and NS-3 by a veth pair each, 10.77.{2,3}.0/24.
for n in 1 2 3; do
  ip netns del "$NS$n" 2>/dev/null || true
  ip netns add "$NS$n"
  ip -n "$NS$n" link set lo up
done
for n in 2 3; do
  ip link add "${NS}1-$n" netns "${NS}1" type veth peer name "${NS}$n-1" netns "$NS$n"
  ip -n "${NS}1" addr add "10.77.$n.1/24" dev "${NS}1-$n"
  ip -n "$NS$n" addr add "10.77.$n.2/24" dev "${NS}$n-1"
  ip -n "${NS}1" link set "${NS}1-$n" up
  ip -n "$NS$n" link set "${NS}$n-1" up
done
if command -v ping >/dev/null; then
  for n in 2 3; do
    ip netns exec "${NS}1" ping -c1 -W2 "10.77.$n.2" >/dev/null \
      || { echo "no route from ${NS}1 to 10.77.$n.2" >&2; exit 1; }
  done
fi

die() { echo "error: $*" >&2; exit 1; }
wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; die "no socket $1"; }
wait_listen() { # ns port
  for _ in $(seq 300); do
    [ -n "$(ip netns exec "$1" ss -Hltn "sport = :$2")" ] && return 0; sleep 0.1
  done
  die "nothing listens on :$2 in $1"
}
gone() { # pid: exited (a zombie counts: it is reaped by stop_pid's wait)
  local st; st=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  st=${st##*) }; [ "${st:0:1}" = Z ]
}
stop_pid() {
  kill "$1" 2>/dev/null || true
  for _ in $(seq "$(( STOP_WAIT * 10 ))"); do gone "$1" && break; sleep 0.1; done
  gone "$1" || { echo "pid $1 still up ${STOP_WAIT}s after SIGTERM: SIGKILL" >&2; kill -9 "$1" 2>/dev/null || true; }
  wait "$1" 2>/dev/null || true
  local keep=() p
  for p in "${pids[@]:-}"; do if [ -n "$p" ] && [ "$p" != "$1" ]; then keep+=("$p"); fi; done
  pids=("${keep[@]:-}")
}
alive() { if gone "$1"; then die "process $1 ($2) exited"; fi; }
cpu_ticks() { # pid: utime+stime of all its threads, in clock ticks
  local s; s=$(cat "/proc/$1/stat") || die "no /proc/$1"
  s=${s##*) }   # past the command name
  read -r -a f <<< "$s"
  echo $(( f[11] + f[12] ))
}
status() { "$BIN" volume status --control "$DIR/p/control.sock" 2>&1 || true; }
# Waits for every peer to be in sync with nothing queued (a no-op unreplicated).
wait_healthy() { # what
  local s
  [ "$replicas" = 1 ] && return 0
  local t0=$SECONDS
  for _ in $(seq $(( HEALTHY_WAIT * 5 ))); do
    alive "$ppid" primary
    s=$(status)
    if grep -q '^  replication healthy$' <<< "$s" && ! grep -q 'queued_bytes [1-9]' <<< "$s"; then
      echo "  replicas $replicas ack $ack: healthy ($1) after $(( SECONDS - t0 ))s" >&2
      return 0
    fi
    sleep 0.2
  done
  echo "$s" >&2
  die "replicas $replicas ack $ack: not healthy within ${HEALTHY_WAIT}s ($1)"
}

rm_pid=
start_config() { # replicas ack
  rm -rf "$LOGDIR"/node* "$DIR/p" "$DIR/s2" "$DIR/s3"
  # Deleting a written image takes seconds (online discard on ext4): in the background,
  # while the servers start and resync, done before fio starts (wait_rm).
  if [ -f "$DIR/vol.img" ]; then
    mv "$DIR/vol.img" "$DIR/old.img"
    rm -f "$DIR/old.img" & rm_pid=$!
  fi
  mkdir -p "$DIR/p" "$LOGDIR/node1"
  fallocate -l "$IMG_SIZE" "$DIR/vol.img"
  peers=(); spids=()
  for n in $(seq 2 "$1"); do
    mkdir -p "$DIR/s$n" "$LOGDIR/node$n"
    ip netns exec "$NS$n" "$BIN" serve-volume --replica-listen "10.77.$n.2:$PORT" \
      --dir "$DIR/s$n" --log-dir "$LOGDIR/node$n" \
      </dev/null >/dev/null 2>>"$DIR/secondary$n.log" &
    spids+=($!); pids+=($!)
    peers+=(--replica-peer "10.77.$n.2:$PORT")
  done
  for n in $(seq 2 "$1"); do wait_listen "$NS$n" "$PORT"; done
  echo "=== replicas $1 ack $2 ($(date -u +%T))" >> "$DIR/primary.log"
  ip netns exec "${NS}1" "$BIN" serve-volume --backend "file:$DIR/vol.img" --mode write-back \
    --dir "$DIR/p" --log-dir "$LOGDIR/node1" --listen "unix:$DIR/p/nbd.sock" \
    "${peers[@]}" --ack-level "$2" --min-replicas 1 --epoch 1 \
    --tiers "$TIERS" --log-size "$LOG_SIZE" </dev/null >/dev/null 2>>"$DIR/primary.log" &
  ppid=$!; pids+=($ppid)
  wait_sock "$DIR/p/nbd.sock"
  wait_sock "$DIR/p/control.sock"
}

stop_config() {
  stop_pid "$ppid"
  for p in "${spids[@]:-}"; do if [ -n "$p" ]; then stop_pid "$p"; fi; done
}

run_job() { # name iodepth numjobs round
  local json=$DIR/r$replicas-$ack-$1-$4.json t0 t1 s0=() s1=() p t
  if [ -n "$rm_pid" ]; then wait "$rm_pid" || true; rm_pid=; fi
  wait_healthy "before $1"
  t0=$(cpu_ticks "$ppid")
  for p in "${spids[@]:-}"; do if [ -n "$p" ]; then s0+=("$(cpu_ticks "$p")"); fi; done
  ip netns exec "${NS}1" fio --name="$1" --ioengine=nbd \
    --uri="nbd+unix:///volume?socket=$DIR/p/nbd.sock" --rw=randwrite --bs=4k \
    --iodepth="$2" --numjobs="$3" --group_reporting --offset=0 --size="$SIZE" \
    --norandommap --randrepeat=0 --time_based --runtime="$RUNTIME" \
    --percentile_list=50:99 --output-format=json --output="$json" \
    || die "fio failed (replicas $replicas ack $ack $1)"
  wait_healthy "after $1"
  t1=$(cpu_ticks "$ppid")
  for p in "${spids[@]:-}"; do if [ -n "$p" ]; then s1+=("$(cpu_ticks "$p")"); fi; done
  local sec=()
  for i in "${!s1[@]}"; do sec+=($(( s1[i] - s0[i] ))); done
  $PY - "$json" "$replicas" "$ack" "$1" "$4" "$TICKS" "$(( t1 - t0 ))" "${sec[@]}" \
    "$(status | grep -E '^  (replication |peer )' | tr '\n' ';' || true)" >> "$RAW" <<'EOF'
import json, sys
path, replicas, ack, job, rnd, ticks, prim = sys.argv[1:8]
sec, st = sys.argv[8:-1], sys.argv[-1]
ticks = int(ticks)
jobs = json.load(open(path))["jobs"]
w = [j["write"] for j in jobs]
ios = sum(x["total_ios"] for x in w)
pct = w[0]["clat_ns"].get("percentile", {})
k = 1000.0 / ios if ios else float("nan")
print(json.dumps({"replicas": int(replicas), "ack": ack, "job": job, "round": int(rnd),
    "iops": sum(x["iops"] for x in w), "writes": ios,
    "p50_us": pct.get("50.000000", 0) / 1e3, "p99_us": pct.get("99.000000", 0) / 1e3,
    "mean_us": w[0]["clat_ns"]["mean"] / 1e3,
    "primary_cpu_s_per_1k": int(prim) / ticks * k,
    "secondary_cpu_s_per_1k": [int(s) / ticks * k for s in sec],
    "errors": sum(j["error"] for j in jobs), "load1": float(open("/proc/loadavg").read().split()[0]),
    "status": st}))
EOF
  tail -1 "$RAW" | cut -c1-400 >&2
}

echo "# $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); \
runtime ${RUNTIME}s, runs $RUNS, size $SIZE, log $LOG_SIZE, $("$BIN" --version 2>/dev/null || echo terrace)" >&2
for round in $(seq "$RUNS"); do
  for c in $CONFIGS; do
    replicas=${c%%:*}; ack=${c#*:}
    start_config "$replicas" "$ack"
    run_job qd1 1 1 "$round"
    run_job qd64 16 4 "$round"
    alive "$ppid" primary
    stop_config
  done
done

$PY - "$RAW" "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = sys.argv[2]
def med(r, a, job, key):
    v = [x[key] for x in rows if x["replicas"] == r and x["ack"] == a and x["job"] == job]
    return statistics.median(v) if v else None
def med_sec(r, a, job):
    v = [x["secondary_cpu_s_per_1k"] for x in rows
         if x["replicas"] == r and x["ack"] == a and x["job"] == job]
    return [statistics.median(c) for c in zip(*v)] if v else []
configs = []
for x in rows:
    if (x["replicas"], x["ack"]) not in configs:
        configs.append((x["replicas"], x["ack"]))
summary = []
print("| replicas | ack | QD1 IOPS | p50 µs | p99 µs | QD64 IOPS | primary CPU s/1k writes (QD1 / QD64) | secondaries CPU s/1k writes, each (QD1 / QD64) |")
print("|---|---|---|---|---|---|---|---|")
def fmt(v):
    return "–" if not v else " + ".join(f"{c:.3f}" for c in v)
for r, a in configs:
    s = {"replicas": r, "ack": a, "runs": len([x for x in rows if x["replicas"] == r
         and x["ack"] == a and x["job"] == "qd1"])}
    for job in ["qd1", "qd64"]:
        s[job] = {k: med(r, a, job, k) for k in
                  ["iops", "p50_us", "p99_us", "mean_us", "primary_cpu_s_per_1k", "errors"]}
        s[job]["secondary_cpu_s_per_1k"] = med_sec(r, a, job)
    summary.append(s)
    q1, q64 = s["qd1"], s["qd64"]
    print(f"| {r} | {a} | {q1['iops']:,.0f} | {q1['p50_us']:,.1f} | {q1['p99_us']:,.1f} | "
          f"{q64['iops']:,.0f} | {q1['primary_cpu_s_per_1k']:.3f} / {q64['primary_cpu_s_per_1k']:.3f} | "
          f"{fmt(q1['secondary_cpu_s_per_1k'])} / {fmt(q64['secondary_cpu_s_per_1k'])} |")
p50 = lambda r, a: med(r, a, "qd1", "p50_us")
ratios = {}
if p50(2, "all") and p50(2, "local"):
    ratios["p50_r2_all_over_r2_local"] = p50(2, "all") / p50(2, "local")
r1 = [a for (r, a) in configs if r == 1]
if p50(2, "all") and r1 and p50(1, r1[0]):
    ratios["p50_r2_all_over_r1"] = p50(2, "all") / p50(1, r1[0])
if ratios:
    print("\n" + "; ".join([
        f"p50(replicas 2, ack all) / p50(replicas 2, ack local) = {ratios['p50_r2_all_over_r2_local']:.2f}×"
        if "p50_r2_all_over_r2_local" in ratios else "",
        f"p50(replicas 2, ack all) / p50(replicas 1) = {ratios['p50_r2_all_over_r1']:.2f}×"
        if "p50_r2_all_over_r1" in ratios else ""]).strip("; "))
errs = sum(x["errors"] for x in rows)
if errs:
    print(f"\nfio reported {errs} errors (see {sys.argv[1]})")
if out:
    json.dump({"rows": summary, "ratios": ratios}, open(out, "w"), indent=1)
EOF

#!/usr/bin/env bash
# Terrace's cached volumes against the anchors that run on this machine, in one run
# (shared/research/volumes.md §6): HDCS's fio jobs over NBD, 4 KiB, QD16, against
#   backend   the slow backend alone: nbdkit's file plugin over a file on disk behind its
#             delay filter (RDELAY reads, WDELAY writes: "Ceph-like", HDCS's baseline)
#   nbdkit    nbdkit's cache filter (cache=writeback, cache-on-read) in front of it
#   terrace   terrace serve-volume in front of it (--backend nbd+unix://...), the write log
#             on LOGDIR (the persistent tier; /dev/shm emulates it), clean blocks in DRAM
# Each target, fresh, is warmed by one pass of 64 KiB random reads over the whole volume
# (random, so Terrace's sequential cutoff does not skip it; nbdkit's cache needs it before
# writes too, as it caches 64 KiB blocks), then runs RUNTIME seconds of randread; then
# the same, fresh and warmed, with RUNTIME seconds of randwrite. Targets alternate within each of
# RUNS rounds; the table shows medians and ratios to the backend of the same run.
# Terrace runs write-back acknowledged on write (durable in the log before the reply);
# nbdkit's cache acknowledges writes in its page-cached temporary file (lost on kill -9).
#
# Usage: bench/volume-vs-anchors.sh            (SIZE=1g RUNTIME=30 RUNS=3 by default;
#        about 18 minutes)
#        SIZE=256m RUNTIME=10 RUNS=1 bench/volume-vs-anchors.sh   (a quick look)
# Needs: fio, nbdkit (Debian), a release build of terrace (built here if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

SIZE=${SIZE:-1g}
RUNTIME=${RUNTIME:-30}
RUNS=${RUNS:-3}
RDELAY=${RDELAY:-2ms}
WDELAY=${WDELAY:-3ms}
QD=${QD:-16}
DIR=${DIR:-/var/tmp/terrace-volume-bench}
LOGDIR=${LOGDIR:-/dev/shm/terrace-volume-bench}
TARGETS=${TARGETS:-"backend nbdkit terrace"}
OUT=${OUT:-$DIR/results.jsonl}
BIN=${BIN:-target/release/terrace}

for tool in fio nbdkit; do
  command -v $tool >/dev/null || { echo "$tool is missing (apt-get install $tool)" >&2; exit 1; }
done
[ -x "$BIN" ] || cargo build --release -p terrace-cli >&2

rm -rf "$DIR" "$LOGDIR"; mkdir -p "$DIR" "$LOGDIR"
: > "$OUT"
VOL=$DIR/vol.img
truncate -s "$SIZE" "$VOL"
# Real blocks on disk, not a sparse file's holes.
fio --name=fill --filename="$VOL" --rw=write --bs=1M --direct=1 --size="$SIZE" \
  --output=/dev/null
BYTES=$(stat -c %s "$VOL")
# The volume's cache holds it whole (HDCS's "cache ratio 100%"), plus room for the
# engine's own segments.
CACHE_MIB=$(( BYTES / 1048576 * 5 / 4 + 64 ))
# The write log holds the whole randwrite burst, and the write-back waits until it is
# 90% full: nbdkit's cache, likewise, keeps every dirty block in its file until a flush.
# (The sustained case, a log kept full, is bench/volume-sweeps.sh's QD sweep.)
LOG_MIB=${LOG_MIB:-$(( BYTES / 1048576 * 8 ))}

pids=()
cleanup() { for p in "${pids[@]:-}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$LOGDIR"; }
trap cleanup EXIT

wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1" >&2; exit 1; }

start_backend() {
  rm -f "$DIR/be.sock"
  nbdkit -U "$DIR/be.sock" -P "$DIR/be.pid" --filter=delay file "$VOL" \
    rdelay="$RDELAY" wdelay="$WDELAY" </dev/null >/dev/null
  wait_sock "$DIR/be.sock"
}

# Starts target $1; prints its NBD URI.
start_target() {
  case $1 in
    backend) echo "nbd+unix:///?socket=$DIR/be.sock" ;;
    nbdkit)
      rm -f "$DIR/anchor.sock"
      nbdkit -U "$DIR/anchor.sock" -P "$DIR/anchor.pid" --filter=cache nbd \
        socket="$DIR/be.sock" cache=writeback cache-on-read=true </dev/null >/dev/null
      wait_sock "$DIR/anchor.sock"
      echo "nbd+unix:///?socket=$DIR/anchor.sock" ;;
    terrace)
      rm -rf "$DIR/t" "$LOGDIR"/*; mkdir -p "$DIR/t"
      "$BIN" serve-volume --backend "nbd+unix:///?socket=$DIR/be.sock" --mode write-back \
        --tiers "dram:${CACHE_MIB}MiB" --dir "$DIR/t" --log-dir "$LOGDIR" \
        --log-size "${LOG_MIB}MiB" --high-watermark 0.9 --low-watermark 0.8 \
        --listen "unix:$DIR/t.sock" </dev/null >/dev/null \
        2>"$DIR/t/server.log" &
      echo $! > "$DIR/t.pid"
      wait_sock "$DIR/t.sock"
      echo "nbd+unix:///volume?socket=$DIR/t.sock" ;;
  esac
}

stop_pid() { kill "$1" 2>/dev/null || true; for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; kill -9 "$1" 2>/dev/null || true; }

stop_target() {
  case $1 in
    backend) ;;
    nbdkit) stop_pid "$(cat "$DIR/anchor.pid")" ;;
    terrace) stop_pid "$(cat "$DIR/t.pid")" ;;
  esac
}

run_fio() { # target rw round uri
  local json=$DIR/$1-$2-$3.json
  fio --name="$2" --ioengine=nbd --uri="$4" --rw="$2" --bs=4k --iodepth="$QD" \
    --size="$SIZE" --norandommap --randrepeat=0 --time_based --runtime="$RUNTIME" \
    --percentile_list=50:99:99.9:99.99 --output-format=json --output="$json"
  python3 - "$json" "$1" "$2" "$3" >> "$OUT" <<'EOF'
import json, sys
path, target, rw, rnd = sys.argv[1:]
job = json.load(open(path))["jobs"][0]
side = job["read"] if rw.endswith("read") else job["write"]
pct = side["clat_ns"].get("percentile", {})
print(json.dumps({"target": target, "rw": rw, "round": int(rnd), "iops": side["iops"],
    "mean_us": side["clat_ns"]["mean"] / 1e3,
    "p50_us": pct.get("50.000000", 0) / 1e3, "p99_us": pct.get("99.000000", 0) / 1e3,
    "p9999_us": pct.get("99.990000", 0) / 1e3, "errors": job["error"]}))
EOF
}

warm() { # uri
  fio --name=warm --ioengine=nbd --uri="$1" --rw=randread --bs=64k --iodepth="$QD" \
    --size="$SIZE" --output=/dev/null
}

echo "# $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); size $SIZE, \
runtime ${RUNTIME}s, QD $QD, backend delay r=$RDELAY w=$WDELAY" >&2
start_backend
pids+=("$(cat "$DIR/be.pid")")
for round in $(seq "$RUNS"); do
  for t in $TARGETS; do
    for rw in randread randwrite; do
      uri=$(start_target "$t")
      warm "$uri"
      run_fio "$t" "$rw" "$round" "$uri"
      stop_target "$t"
      tail -1 "$OUT" >&2
    done
  done
done

# The logs hold gigabytes of tmpfs memory: gone with the run.
rm -rf "$LOGDIR"

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(t, rw, k):
    v = [r[k] for r in rows if r["target"] == t and r["rw"] == rw]
    return statistics.median(v) if v else None
print("| target | randread IOPS | × backend | p50 / p99 / p99.99 µs | randwrite IOPS | × backend | mean µs | p99 / p99.99 µs |")
print("|---|---|---|---|---|---|---|---|")
for t in ["backend", "nbdkit", "terrace"]:
    ri, wi = med(t, "randread", "iops"), med(t, "randwrite", "iops")
    if ri is None:
        continue
    rb = med("backend", "randread", "iops") or float("nan")
    wb = med("backend", "randwrite", "iops") or float("nan")
    print(f"| {t} | {ri:,.0f} | {ri/rb:.2f}× | {med(t,'randread','p50_us'):,.0f} / "
          f"{med(t,'randread','p99_us'):,.0f} / {med(t,'randread','p9999_us'):,.0f} | "
          f"{wi:,.0f} | {wi/wb:.2f}× | {med(t,'randwrite','mean_us'):,.0f} | "
          f"{med(t,'randwrite','p99_us'):,.0f} / {med(t,'randwrite','p9999_us'):,.0f} |")
for rw in ["randread", "randwrite"]:
    a, t = med("nbdkit", rw, "iops"), med("terrace", rw, "iops")
    if a and t:
        print(f"\nterrace / nbdkit cache, {rw}: {t/a:.2f}×")
EOF

#!/usr/bin/env bash
# The rest of issue 23's volume benchmark (shared/research/volumes.md §6), one run:
#   qd     4 KiB randwrite at queue depths 1 4 16 32 64 128 against the delayed backend
#          alone and against terrace serve-volume in write-back whose write log is kept
#          full of dirty blocks (a small log, filled before each measurement): with the
#          log full, writes go at the pace of the write-back, which must never be slower
#          than the backend alone (Ceph's PWL is, above QD 32).
#   multi  64 KiB randwrite, QD16 per volume, over 1 and 4 volumes: fio straight on the
#          backing files (libaio, O_DIRECT) against the same files behind one terrace
#          serve-volume (--volume x4, write-back, logs on LOGDIR).
# Same conventions as bench/volume-vs-anchors.sh (alternating targets, medians of RUNS,
# ratios to the baseline of the same run).
#
# Usage: bench/volume-sweeps.sh                  (STAGES="qd multi" RUNTIME=20 RUNS=1)
set -euo pipefail
cd "$(dirname "$0")/.."

STAGES=${STAGES:-"qd multi"}
RUNTIME=${RUNTIME:-20}
RUNS=${RUNS:-1}
QDS=${QDS:-"1 4 16 32 64 128"}
SIZE=${SIZE:-1g}
RDELAY=${RDELAY:-2ms}
WDELAY=${WDELAY:-3ms}
FULL_LOG=${FULL_LOG:-128MiB}
DIR=${DIR:-/var/tmp/terrace-volume-sweeps}
LOGDIR=${LOGDIR:-/dev/shm/terrace-volume-sweeps}
BIN=${BIN:-target/release/terrace}
OUT=${OUT:-$DIR/results.jsonl}

for tool in fio nbdkit; do
  command -v $tool >/dev/null || { echo "$tool is missing (apt-get install $tool)" >&2; exit 1; }
done
[ -x "$BIN" ] || cargo build --release -p terrace-cli >&2
rm -rf "$DIR" "$LOGDIR"; mkdir -p "$DIR" "$LOGDIR"
: > "$OUT"

wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1" >&2; exit 1; }
stop_pid() { kill "$1" 2>/dev/null || true; for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; kill -9 "$1" 2>/dev/null || true; }

record() { # json-file target stage qd volumes round
  python3 - "$@" >> "$OUT" <<'EOF'
import json, sys
path, target, stage, qd, vols, rnd = sys.argv[1:]
jobs = json.load(open(path))["jobs"]
iops = sum(j["write"]["iops"] for j in jobs)
bw = sum(j["write"]["bw_bytes"] for j in jobs)
mean = sum(j["write"]["clat_ns"]["mean"] for j in jobs) / len(jobs) / 1e3
print(json.dumps({"stage": stage, "target": target, "qd": int(qd), "volumes": int(vols),
    "round": int(rnd), "iops": iops, "mb_s": bw / 1e6, "mean_us": mean,
    "errors": sum(j["error"] for j in jobs)}))
EOF
  tail -1 "$OUT" >&2
}

if [[ " $STAGES " == *" qd "* ]]; then
  VOL=$DIR/vol.img
  truncate -s "$SIZE" "$VOL"
  fio --name=fill --filename="$VOL" --rw=write --bs=1M --direct=1 --size="$SIZE" --output=/dev/null
  rm -f "$DIR/be.sock"
  nbdkit -U "$DIR/be.sock" -P "$DIR/be.pid" --filter=delay file "$VOL" \
    rdelay="$RDELAY" wdelay="$WDELAY" </dev/null >/dev/null
  wait_sock "$DIR/be.sock"
  for round in $(seq "$RUNS"); do
    for qd in $QDS; do
      for t in backend terrace; do
        if [ $t = backend ]; then
          uri="nbd+unix:///?socket=$DIR/be.sock"
        else
          rm -rf "$DIR/t" "$LOGDIR"/*; mkdir -p "$DIR/t"
          "$BIN" serve-volume --backend "nbd+unix:///?socket=$DIR/be.sock" --mode write-back \
            --tiers dram:256MiB --dir "$DIR/t" --log-dir "$LOGDIR" --log-size "$FULL_LOG" \
            --listen "unix:$DIR/t.sock" </dev/null >/dev/null 2>"$DIR/t/server.log" &
          tpid=$!
          wait_sock "$DIR/t.sock"
          uri="nbd+unix:///volume?socket=$DIR/t.sock"
          # Fill the log with dirty blocks first (it stays full: writes outrun the
          # write-back).
          fio --name=fill --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=16 \
            --size="$SIZE" --norandommap --randrepeat=0 --time_based --runtime=5 --output=/dev/null
        fi
        fio --name=qd --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth="$qd" \
          --size="$SIZE" --norandommap --randrepeat=0 --time_based --runtime="$RUNTIME" \
          --output-format=json --output="$DIR/qd-$t-$qd.json"
        record "$DIR/qd-$t-$qd.json" "$t" qd "$qd" 1 "$round"
        [ $t = terrace ] && stop_pid "$tpid"
      done
    done
  done
  stop_pid "$(cat "$DIR/be.pid")"
fi

if [[ " $STAGES " == *" multi "* ]]; then
  for v in 1 2 3 4; do
    truncate -s "$SIZE" "$DIR/m$v.img"
    fio --name=fill --filename="$DIR/m$v.img" --rw=write --bs=1M --direct=1 --size="$SIZE" \
      --output=/dev/null
  done
  for round in $(seq "$RUNS"); do
    for n in 1 4; do
      for t in direct terrace; do
        args=()
        if [ $t = direct ]; then
          for v in $(seq "$n"); do
            args+=(--name="v$v" --filename="$DIR/m$v.img" --ioengine=libaio --direct=1)
          done
        else
          rm -rf "$DIR/t" "$LOGDIR"/*; mkdir -p "$DIR/t"
          vols=()
          for v in $(seq "$n"); do vols+=(--volume "m$v=file:$DIR/m$v.img"); done
          "$BIN" serve-volume "${vols[@]}" --mode write-back --tiers dram:256MiB \
            --dir "$DIR/t" --log-dir "$LOGDIR" --log-size 2GiB \
            --listen "unix:$DIR/t.sock" </dev/null >/dev/null 2>"$DIR/t/server.log" &
          tpid=$!
          wait_sock "$DIR/t.sock"
          for v in $(seq "$n"); do
            args+=(--name="v$v" --ioengine=nbd --uri="nbd+unix:///m$v?socket=$DIR/t.sock")
          done
        fi
        fio --rw=randwrite --bs=64k --iodepth=16 --size="$SIZE" --norandommap --randrepeat=0 \
          --time_based --runtime="$RUNTIME" --output-format=json \
          --output="$DIR/multi-$t-$n.json" "${args[@]}"
        record "$DIR/multi-$t-$n.json" "$t" multi 16 "$n" "$round"
        [ $t = terrace ] && stop_pid "$tpid"
      done
    done
  done
fi

# The logs hold gigabytes of tmpfs memory: gone with the run.
rm -rf "$LOGDIR"

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(stage, t, key, **kw):
    v = [r[key] for r in rows if r["stage"] == stage and r["target"] == t
         and all(r[k] == x for k, x in kw.items())]
    return statistics.median(v) if v else None
qds = sorted({r["qd"] for r in rows if r["stage"] == "qd"})
if qds:
    print("| QD | backend IOPS | terrace (log full) IOPS | × backend |")
    print("|---|---|---|---|")
    for q in qds:
        b, t = med("qd", "backend", "iops", qd=q), med("qd", "terrace", "iops", qd=q)
        if b and t:
            print(f"| {q} | {b:,.0f} | {t:,.0f} | {t/b:.2f}× |")
ns = sorted({r["volumes"] for r in rows if r["stage"] == "multi"})
if ns:
    print("\n| volumes | fio on the files, MB/s | terrace, MB/s | × files |")
    print("|---|---|---|---|")
    for n in ns:
        d, t = med("multi", "direct", "mb_s", volumes=n), med("multi", "terrace", "mb_s", volumes=n)
        if d and t:
            print(f"| {n} | {d:,.0f} | {t:,.0f} | {t/d:.2f}× |")
EOF

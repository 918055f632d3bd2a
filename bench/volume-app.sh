#!/usr/bin/env bash
# An application over a volume (issue 23's "application run"): ext4 on nbdfuse + a loop
# device, fio writing random 4 KiB blocks of a file in it with an fsync after each
# (psync, one job: a database's commit pattern), RUNTIME seconds, against
#   backend   the slow backend alone: nbdkit's file plugin behind its delay filter
#             (RDELAY reads, WDELAY writes), as in bench/volume-vs-anchors.sh
#   terrace   terrace serve-volume write-back (acknowledged on write, its log on LOGDIR)
#             in front of that same delayed backend
# Each target gets a fresh copy of one prepared image (mkfs.ext4, and fio's file laid
# out, written straight to the file, not through the delay), and a fresh mount (cold
# page cache). Targets alternate within each of RUNS rounds; the table shows medians.
# The file system has 4 KiB blocks (-b 4096; mkfs.ext4 picks 1 KiB below 512 MiB): a
# write smaller than the volume's 4 KiB block is a read-modify-write, and the read of a
# block not cached goes to the backend (with 1 KiB blocks, ~11 ms per fsync, not ~0.5).
#
# Usage: bench/volume-app.sh                 (SIZE_MIB=1024 FILE_MIB=256 RUNTIME=20 RUNS=3)
#        RUNS=1 bench/volume-app.sh
# Needs root, /dev/fuse, loop devices, nbdfuse (libnbd-bin), nbdkit, fio, e2fsprogs.
set -uo pipefail
cd "$(dirname "$0")/.."

SIZE_MIB=${SIZE_MIB:-1024}
FILE_MIB=${FILE_MIB:-256}
RUNTIME=${RUNTIME:-20}
RUNS=${RUNS:-3}
RDELAY=${RDELAY:-2ms}
WDELAY=${WDELAY:-3ms}
TARGETS=${TARGETS:-"backend terrace"}
DIR=${DIR:-/var/tmp/terrace-volume-app}
LOGDIR=${LOGDIR:-/dev/shm/terrace-volume-app}
BIN=${BIN:-target/release/terrace}
OUT=${OUT:-$DIR/results.jsonl}
[ -x "$BIN" ] || cargo build --release -p terrace-cli >&2
for tool in fio nbdkit nbdfuse losetup mkfs.ext4 python3; do
  command -v $tool >/dev/null || { echo "$tool is missing" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "needs root (losetup, mount)" >&2; exit 1; }

FUSE=$DIR/fuse MNT=$DIR/mnt LOOP=""
is_mounted() { awk -v p="$1" '$5 == p { found = 1 } END { exit !found }' /proc/self/mountinfo; }
wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1" >&2; exit 1; }
stop_pid() { kill "$1" 2>/dev/null; for _ in $(seq 300); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; kill -9 "$1" 2>/dev/null; }

detach() {
  is_mounted "$MNT" && { timeout 120 umount "$MNT" || umount -l "$MNT"; }
  [ -n "$LOOP" ] && { timeout 30 losetup -d "$LOOP"; LOOP=""; }
  is_mounted "$FUSE" && { timeout 60 umount "$FUSE" || umount -l "$FUSE"; }
  [ -s "$DIR/nbdfuse.pid" ] && stop_pid "$(cat "$DIR/nbdfuse.pid")"
  rm -f "$DIR/nbdfuse.pid"
}
stop_all() {
  detach
  for p in t be; do [ -s "$DIR/$p.pid" ] && stop_pid "$(cat "$DIR/$p.pid")"; rm -f "$DIR/$p.pid"; done
}
trap 'stop_all; rm -rf "$LOGDIR"' EXIT

for d in "$MNT" "$FUSE"; do is_mounted "$d" && umount -l "$d"; done
rm -rf "$DIR" "$LOGDIR"; mkdir -p "$DIR" "$MNT" "$FUSE" "$LOGDIR"
: > "$OUT"

# The prepared image: a file system with fio's file written in full.
truncate -s "${SIZE_MIB}M" "$DIR/template.img"
mkfs.ext4 -q -F -b 4096 "$DIR/template.img"
mount -o loop "$DIR/template.img" "$MNT"
fio --name=layout --filename="$MNT/app.dat" --rw=write --bs=1m --size="${FILE_MIB}m" \
  --output=/dev/null
umount "$MNT"

start_target() { # target; prints the URI to attach
  cp --sparse=always "$DIR/template.img" "$DIR/vol.img"
  rm -f "$DIR/be.sock"
  nbdkit -U "$DIR/be.sock" -P "$DIR/be.pid" --filter=delay file "$DIR/vol.img" \
    rdelay="$RDELAY" wdelay="$WDELAY" </dev/null >/dev/null
  wait_sock "$DIR/be.sock"
  case $1 in
    backend) echo "nbd+unix:///?socket=$DIR/be.sock" ;;
    terrace)
      rm -rf "$DIR/t" "$LOGDIR"/*; mkdir -p "$DIR/t"
      "$BIN" serve-volume --backend "nbd+unix:///?socket=$DIR/be.sock" --mode write-back \
        --tiers "dram:$(( SIZE_MIB * 5 / 4 + 64 ))MiB" --dir "$DIR/t" --log-dir "$LOGDIR" \
        --log-size 1GiB --listen "unix:$DIR/t.sock" </dev/null >/dev/null \
        2>"$DIR/t/server.log" &
      echo $! > "$DIR/t.pid"
      disown
      wait_sock "$DIR/t.sock"
      echo "nbd+unix:///volume?socket=$DIR/t.sock" ;;
  esac
}

attach() { # uri
  nbdfuse -P "$DIR/nbdfuse.pid" "$FUSE" "$1" </dev/null >>"$DIR/nbdfuse.log" 2>&1 &
  disown
  for _ in $(seq 100); do [ -s "$DIR/nbdfuse.pid" ] && break; sleep 0.1; done
  LOOP=$(losetup -f --show "$FUSE/nbd") && mount "$LOOP" "$MNT"
}

echo "# $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); ext4 on \
nbdfuse + loop, ${SIZE_MIB} MiB, a ${FILE_MIB} MiB file, ${RUNTIME}s, backend delay \
r=$RDELAY w=$WDELAY" >&2
for round in $(seq "$RUNS"); do
  for t in $TARGETS; do
    uri=$(start_target "$t")
    attach "$uri" || { echo "attaching $t failed" >&2; exit 1; }
    json=$DIR/$t-$round.json
    fio --name=app --filename="$MNT/app.dat" --ioengine=psync --rw=randwrite --bs=4k \
      --size="${FILE_MIB}m" --fsync=1 --time_based --runtime="$RUNTIME" \
      --output-format=json --output="$json"
    python3 - "$json" "$t" "$round" >> "$OUT" <<'EOF'
import json, sys
path, target, rnd = sys.argv[1:]
job = json.load(open(path))["jobs"][0]
w, s = job["write"], job["sync"]
print(json.dumps({"target": target, "round": int(rnd), "iops": w["iops"],
    "write_us": w["clat_ns"]["mean"] / 1e3, "fsync_us": s["lat_ns"]["mean"] / 1e3,
    "fsync_p99_us": s["lat_ns"].get("percentile", {}).get("99.000000", 0) / 1e3,
    "errors": job["error"]}))
EOF
    tail -1 "$OUT" >&2
    stop_all
  done
done

python3 - "$OUT" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(t, k):
    v = [r[k] for r in rows if r["target"] == t]
    return statistics.median(v) if v else None
print("| target | fsync'd 4 KiB writes/s | × backend | write µs | fsync µs (mean / p99) |")
print("|---|---|---|---|---|")
b = med("backend", "iops") or float("nan")
for t in ["backend", "terrace"]:
    if med(t, "iops") is None:
        continue
    print(f"| {t} | {med(t,'iops'):,.0f} | {med(t,'iops')/b:.2f}× | {med(t,'write_us'):,.0f} | "
          f"{med(t,'fsync_us'):,.0f} / {med(t,'fsync_p99_us'):,.0f} |")
EOF

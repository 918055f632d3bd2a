#!/usr/bin/env bash
# ext4 on a write-back volume, kill -9 of the server under writers, ROUNDS times (issue
# 23: "an ext4 on a write-back volume passes fsck -n after every kill round").
#
# A zeroed backend file; terrace serve-volume over it in MODE (write-back, its log on
# LOGDIR); nbdfuse exposes the export as a file, losetup makes it a block device;
# mkfs.ext4 once. Per round: mount; two writers run — fio (psync, 4 KiB random
# overwrites of 4 files with --fsync=1) and a file writer that replaces files whole
# (write a temporary, fsync, rename over the name, fsync the directory, up to 256 KiB,
# some deleted) and records each replacement it started and each that returned in a log
# outside the volume; at a random moment 1 to 4 s in, kill -9 of the server. Then the
# teardown, each step bounded: the writers are killed, the file system unmounted (lazily if
# it does not go), the loop device detached, the FUSE mount unmounted. The server
# restarts, nbdfuse and losetup attach again, and:
#   1. mount (the kernel replays the journal, as after any crash) — must succeed;
#   2. every file the writer saw replaced (fsync and the directory's fsync returned) holds
#      that content, or the replacement in flight at the kill;
#   3. umount, then `fsck.ext4 -n -f` — must exit 0 (nothing to fix).
# fsck -n straight after the crash would report the journal as needing recovery (it
# does not replay it read-only) and the inconsistencies the journal resolves; the check
# is on the file system as the next mount sees it.
#
# Usage: bench/volume-ext4-kill.sh                    (ROUNDS=20, write-back)
#        ROUNDS=3 MODE=write-back:on-flush bench/volume-ext4-kill.sh
#        ROUNDS=5 TARGET=nbdkit-unsafe bench/volume-ext4-kill.sh
# TARGET=nbdkit-unsafe is the negative control: nbdkit's cache filter with cache=unsafe
# (flushes ignored, so fsync promises nothing) loses fsynced files to a kill -9.
# Needs root, /dev/fuse, loop devices, nbdfuse (libnbd-bin), fio, e2fsprogs.
# Prints one line per round and a summary; exits non-zero if a round failed. Failed
# rounds' logs are kept in $DIR-failed/<round>/; the volume stays in $DIR.
set -uo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-20}
MODE=${MODE:-write-back}
TARGET=${TARGET:-terrace}
SIZE_MIB=${SIZE_MIB:-512}
DIR=${DIR:-/var/tmp/terrace-ext4-kill}
LOGDIR=${LOGDIR:-/dev/shm/terrace-ext4-kill}
BIN=${BIN:-target/release/terrace}
SEED=${SEED:-$$}
RANDOM=$SEED
[ -x "$BIN" ] || cargo build --release -p terrace-cli >&2
for tool in fio nbdfuse losetup mkfs.ext4 fsck.ext4 python3; do
  command -v $tool >/dev/null || { echo "$tool is missing" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "needs root (losetup, mount)" >&2; exit 1; }

FUSE=$DIR/fuse MNT=$DIR/mnt
URI="nbd+unix:///volume?socket=$DIR/nbd.sock"
[ "$TARGET" = nbdkit-unsafe ] && URI="nbd+unix:///?socket=$DIR/nbd.sock"
LOOP=""

wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; return 1; }
# Waits up to $2 tenths of a second for process $1 to end; 1 if it did not.
wait_gone() { for _ in $(seq "$2"); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; return 1; }

start_server() {
  if [ "$TARGET" = nbdkit-unsafe ]; then
    rm -f "$DIR/nbd.sock"
    nbdkit -U "$DIR/nbd.sock" -P "$DIR/server.pid" --filter=cache file "$DIR/backend.img" \
      cache=unsafe </dev/null >/dev/null 2>>"$DIR/server.log"
    wait_sock "$DIR/nbd.sock"; return
  fi
  local mode=${MODE%%:*} ack=on-write
  [[ $MODE == *:* ]] && ack=${MODE#*:}
  rm -f "$DIR/nbd.sock"
  "$BIN" serve-volume --backend "file:$DIR/backend.img" --mode "$mode" --durability "$ack" \
    --tiers dram:64MiB --dir "$DIR" --log-dir "$LOGDIR" --log-size 256MiB \
    --listen "unix:$DIR/nbd.sock" </dev/null >/dev/null 2>>"$DIR/server.log" &
  echo $! > "$DIR/server.pid"
  disown
  wait_sock "$DIR/nbd.sock"
}

# mountpoint(1) stats the path, which fails on a FUSE mount whose daemon died.
is_mounted() { awk -v p="$1" '$5 == p { found = 1 } END { exit !found }' /proc/self/mountinfo; }

attach() { # nbdfuse + losetup; sets LOOP
  rm -f "$DIR/nbdfuse.pid"
  is_mounted "$FUSE" && { echo "$FUSE is still mounted" >&2; return 1; }
  mkdir -p "$FUSE" && [ -d "$FUSE" ] || return 1
  nbdfuse -P "$DIR/nbdfuse.pid" "$FUSE" "$URI" </dev/null >>"$DIR/nbdfuse.log" 2>&1 &
  disown
  for _ in $(seq 100); do [ -s "$DIR/nbdfuse.pid" ] && break; sleep 0.1; done
  [ -s "$DIR/nbdfuse.pid" ] || { echo "nbdfuse did not start" >&2; return 1; }
  LOOP=$(timeout 30 losetup -f --show "$FUSE/nbd") || { echo "losetup failed" >&2; return 1; }
}

detach() { # every step bounded; returns 1 if something had to be forced
  local forced=0
  if is_mounted "$MNT"; then
    timeout 30 umount "$MNT" 2>/dev/null || { umount -l "$MNT"; forced=1; }
  fi
  if [ -n "$LOOP" ]; then
    timeout 30 losetup -d "$LOOP" 2>/dev/null || forced=1
    LOOP=""
  fi
  # nbdfuse 1.14 dies of an assertion when its server goes: its mount is then
  # disconnected, and only a lazy unmount takes it away.
  if is_mounted "$FUSE"; then
    timeout 30 umount "$FUSE" 2>/dev/null || timeout 30 umount -l "$FUSE" || forced=1
  fi
  local pid; pid=$(cat "$DIR/nbdfuse.pid" 2>/dev/null)
  if [ -n "$pid" ] && ! wait_gone "$pid" 100; then kill -9 "$pid"; forced=1; fi
  return $forced
}

# The file writer: replaces files whole, logging "start NAME SHA" before and "done NAME SHA"
# once the file's and the directory's fsync returned ("gone NAME" for a delete).
cat > "/tmp/terrace-ext4-writer.$$.py" <<'EOF'
import hashlib, os, random, sys
mnt, acklog = sys.argv[1:3]
d = os.path.join(mnt, "w")
os.makedirs(d, exist_ok=True)
ack = open(acklog, "a", buffering=1)
dfd = os.open(d, os.O_RDONLY)
rng = random.Random()
while True:
    name = f"f{rng.randrange(256)}"
    path = os.path.join(d, name)
    if rng.random() < 0.1:
        ack.write(f"start {name} gone\n")
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.fsync(dfd)
        ack.write(f"done {name} gone\n")
        continue
    data = os.urandom(rng.choice([4096, 16384, 65536, 262144]) - rng.randrange(4096))
    h = hashlib.sha256(data).hexdigest()
    ack.write(f"start {name} {h}\n")
    with open(path + ".tmp", "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.rename(path + ".tmp", path)
    os.fsync(dfd)
    ack.write(f"done {name} {h}\n")
EOF
# The check: each file holds its last replacement that returned or the one after it.
cat > "/tmp/terrace-ext4-check.$$.py" <<'EOF'
import hashlib, os, sys
mnt, acklog = sys.argv[1:3]
last, pending = {}, {}
for line in open(acklog):
    parts = line.split()
    if len(parts) != 3:
        continue  # a line cut by the kill
    what, name, h = parts
    if what == "start":
        pending[name] = h
    else:
        last[name] = h
        pending.pop(name, None)
bad = checked = 0
for name in set(last) | set(pending):
    path = os.path.join(mnt, "w", name)
    try:
        got = hashlib.sha256(open(path, "rb").read()).hexdigest()
    except FileNotFoundError:
        got = "gone"
    ok = {last.get(name, "gone"), pending.get(name)}
    checked += 1
    if got not in ok:
        bad += 1
        print(f"{name}: holds {got[:12]}, acknowledged {last.get(name, 'gone')[:12]}, "
              f"in flight {str(pending.get(name))[:12]}", file=sys.stderr)
print(f"{checked - bad} of {checked} files as acknowledged")
sys.exit(1 if bad else 0)
EOF
cleanup() {
  [ -n "${wpids:-}" ] && kill -9 $wpids 2>/dev/null
  detach
  [ -s "$DIR/server.pid" ] && kill "$(cat "$DIR/server.pid")" 2>/dev/null
  rm -f "/tmp/terrace-ext4-writer.$$.py" "/tmp/terrace-ext4-check.$$.py"
}
trap cleanup EXIT

keep_round() { # round why
  local keep="${DIR}-failed/$1"
  rm -rf "$keep"; mkdir -p "$keep"
  cp "$DIR"/*.log "$DIR"/*.txt "$keep"/ 2>/dev/null
  echo "$2" > "$keep/why"
  echo "  $2; logs kept in $keep" >&2
}

for d in "$MNT" "$FUSE"; do is_mounted "$d" && umount -l "$d"; done
rm -rf "$DIR" "$LOGDIR"; mkdir -p "$DIR" "$MNT" "$LOGDIR"
truncate -s "${SIZE_MIB}M" "$DIR/backend.img"
: > "$DIR/acks.log"
name="$MODE"; [ "$TARGET" = nbdkit-unsafe ] && name="nbdkit cache=unsafe"
echo "# $(date -u +%FT%TZ) seed $SEED, $ROUNDS rounds, ext4 on $name, ${SIZE_MIB} MiB, $(uname -r)"
start_server || { echo "the server did not start" >&2; exit 1; }
attach || exit 1
mkfs.ext4 -q -F "$LOOP" || { echo "mkfs.ext4 failed" >&2; exit 1; }

failed=0 ran=0
for round in $(seq "$ROUNDS"); do
  ran=$round
  t0=$SECONDS detail=""
  if ! timeout 60 mount "$LOOP" "$MNT"; then
    detail="mount failed"; keep_round "$round" "$detail"; failed=$(( failed + 1 ))
    echo "round $round: FAILED ($detail)"; break
  fi
  mkdir -p "$MNT/fio"
  fio --name=app --directory="$MNT/fio" --ioengine=psync --rw=randwrite --bs=4k \
    --size=64m --nrfiles=4 --fsync=1 --time_based --runtime=600 \
    >"$DIR/fio.txt" 2>&1 &
  wpids="$!"
  python3 "/tmp/terrace-ext4-writer.$$.py" "$MNT" "$DIR/acks.log" 2>"$DIR/writer.txt" &
  wpids="$wpids $!"
  at_ms=$(( 1000 + RANDOM % 3000 ))
  sleep "$(printf '%d.%03d' $(( at_ms / 1000 )) $(( at_ms % 1000 )))"
  pid=$(cat "$DIR/server.pid")
  running=0; for w in $wpids; do kill -0 "$w" 2>/dev/null && running=$(( running + 1 )); done
  kill -9 "$pid"
  wait_gone "$pid" 100
  kill -9 $wpids 2>/dev/null
  for w in $wpids; do wait_gone "$w" 300 || detail="a writer outlived kill -9 (D state?); "; done
  wpids=""
  detach || detail="${detail}teardown forced; "
  done_before=$(grep -c '^done' "$DIR/acks.log")
  start_server || { detail="${detail}the server did not restart"; keep_round "$round" "$detail"; failed=$(( failed + 1 )); echo "round $round: FAILED ($detail)"; break; }
  attach || { detail="${detail}attach failed"; keep_round "$round" "$detail"; failed=$(( failed + 1 )); echo "round $round: FAILED ($detail)"; break; }
  r=ok
  journal="clean"
  timeout 60 dumpe2fs -h "$LOOP" 2>/dev/null | grep -q needs_recovery && journal="replayed"
  if ! timeout 120 mount "$LOOP" "$MNT" 2>"$DIR/mount.txt"; then
    r=FAILED; detail="${detail}mount after the kill failed: $(head -1 "$DIR/mount.txt" | cut -c1-120)"
  else
    files=$(python3 "/tmp/terrace-ext4-check.$$.py" "$MNT" "$DIR/acks.log" 2>"$DIR/check.txt") || r=FAILED
    detail="${detail}$files"
    timeout 60 umount "$MNT" || { r=FAILED; detail="$detail, umount failed"; umount -l "$MNT"; }
  fi
  timeout 300 fsck.ext4 -n -f "$LOOP" >"$DIR/fsck.txt" 2>&1
  frc=$?
  [ $frc -eq 0 ] || r=FAILED
  detail="kill at ${at_ms} ms with $running writers, journal $journal, ${detail}, fsck -n -f rc $frc, $done_before replacements done so far; $(( SECONDS - t0 )) s"
  echo "round $round: $r ($detail)"
  if [ $r != ok ]; then failed=$(( failed + 1 )); keep_round "$round" "$detail"; fi
done

echo
echo "| file system | rounds | rounds failed (mount, acknowledged files or fsck -n -f) |"
echo "|---|---|---|"
echo "| ext4 on $name | $ran | $failed |"
[ $failed -eq 0 ]

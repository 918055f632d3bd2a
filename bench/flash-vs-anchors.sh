#!/usr/bin/env bash
# Terrace's flash tier against the flash-cache anchors that run on this machine, in one
# run, on the workloads of docs' flash plan (shared/research/flash.md §4.2-§4.3):
#   terrace        Terrace in process: --tiers dram:D,flash:F (--capacity D+F; sizes in
#                  bytes win over --capacity, so the tiers are exactly D and F)
#   foyer-hybrid   foyer 0.22 HybridCache in process: D of memory over an F-byte disk
#                  cache (direct I/O, WriteOnEviction, S3-FIFO, psync, block engine)
#   memcached      memcached 1.6 + extstore (-m D, ext_path=...:F), over loopback
#   terrace-serve  terrace serve --tiers dram:D,flash:F, over loopback, same client
#   terrace-same-memory  Terrace in process again, its DRAM tier grown (or cut) so that its
#                  peak DRAM is just under the lowest anchor's of the same run (flash.md's
#                  equal-budget rule: hit ratios compare at no more measured DRAM); runs
#                  after the anchors
# Every engine gets its own fresh directory under DIR, the same flash size on the same
# file system, the same DRAM knob D; keys are 16 bytes, look-aside, 90% gets, 2 threads.
#
# Workloads (KEYS and OPS divided by SCALE, and so is the flash size F; D is not):
#   W1 mixed   values 64-4096 B,       4,000,000 keys, zipf 0.99, D 256 MiB, F 4 GiB, 20M ops
#   W2 tiny    values 16-256 B,       20,000,000 keys, zipf 0.9,  D 128 MiB, F 2 GiB, 20M ops
#   W3 large   values 16 KiB-256 KiB,    200,000 keys, zipf 0.8,  D 256 MiB, F 8 GiB,  2M ops
#
# Measured per run (terrace-bench cache's JSON, one line per engine run in OUT, tagged
# with "workload" and "run"): hit ratio, ops/s, get latency, and from /proc while it runs
# (--pid: the server for the remote engines) peak DRAM = VmRSS + page cache of the
# engine's files (fincore), device bytes written (/proc/PID/io) per key+value byte the
# client set. Before each engine run the page cache is dropped if this user may
# (/proc/sys/vm/drop_caches).
#
# Prints one Markdown table per workload. Columns:
#   steady hit           the hit ratio of the gets after the first quarter of the ops (the
#                        warm-up; flash.md §4.4 reports metrics per steady-state window)
#   DRAM B / flash item  (peak DRAM - D - the engine's baseline: its peak DRAM over 1000
#                        ops, run just before) / items on flash; items on flash from the engine:
#                        Terrace the flash tier's item count, memcached
#                        extstore_objects_used; foyer does not say (blank)
#   dev W / ins B        device bytes written / key + value bytes inserted
#   flash live           live bytes on flash / F (Terrace tier live bytes, memcached
#                        extstore_bytes_used); "?" where the engine reports 0 live bytes
#                        with items on flash (it does not count them)
#   flash hits           share of hits served from flash (Terrace tier hits, foyer
#                        entries whose source is the disk, memcached get_extstore)
#   drops                items dropped on the way to flash or refused: Terrace the flash
#                        tier's refused_no_room + refused_budget, memcached evictions,
#                        plus any set a server refused; foyer does not say (blank)
#
# Usage: bench/flash-vs-anchors.sh [extra terrace-bench cache args...]
# Environment:
#   WORKLOADS  default "W1 W2 W3"
#   SCALE      divides keys, ops and flash size (default 1; SCALE=4 is the reduced run,
#              SCALE=64 a smoke test of a few seconds per engine)
#   DRAM_SCALE divides the DRAM knob D too (default 1). With SCALE=64 alone W1's data
#              (~130 MB) fits in D and flash is not used; SCALE=64 DRAM_SCALE=8 (D 32 MiB,
#              flash 64 MiB) exercises it. Terrace needs a D of 11 segments (22 MiB: 8,
#              and 3 for the flash buffers it counts in D).
#   DIR        where the engines' files go, default /var/tmp/tb (not tmpfs: a flash
#              benchmark on RAM measures memcpy)
#   ENGINES    default "terrace foyer-hybrid memcached terrace-serve"
#   RUNS       repeat everything N times, engine order reversed on even runs (default 1)
#   OUT        the JSON lines, default $TMPDIR/terrace-bench-flash-<date>.jsonl
#   THREADS    client threads (default 2); server worker threads are 2
#   RESTART    1 (default): the in-process Terrace run ends with a clean shutdown and reopen
#              (--restart clean): open time per million items and the share of keys that
#              still hit, printed under the table; crash: dropped without a shutdown
#              instead (the kill log and written segments survive, DRAM and buffers do
#              not); 0 skips it
#   FIO=1      also measure the device ceiling once (fio: 4 KiB random reads QD1 psync and
#              QD32 io_uring, 1 MiB sequential writes; direct I/O on a 1 GiB file in DIR)
#   MC_PORT, TR_PORT  loopback ports of memcached and terrace serve (21211, 21212)
#   CARGO_TARGET_DIR  as for cargo (the release binaries are built there)
# memcached: with a small flash size (SCALE), extstore's page size is cut from its
# default 64 MiB so that the file has at least 16 pages (at least 4 MiB, a multiple of
# its write buffer; the table's notes say so).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

WORKLOADS=${WORKLOADS:-W1 W2 W3}
SCALE=${SCALE:-1}
DRAM_SCALE=${DRAM_SCALE:-1}
DIR=${DIR:-/var/tmp/tb}
ENGINES=${ENGINES:-terrace foyer-hybrid memcached terrace-serve terrace-same-memory}
RUNS=${RUNS:-1}
THREADS=${THREADS:-2}
FIO=${FIO:-0}
RESTART=${RESTART:-1}
MC_PORT=${MC_PORT:-21211}
TR_PORT=${TR_PORT:-21212}
OUT=${OUT:-${TMPDIR:-/tmp}/terrace-bench-flash-$(date -u +%Y%m%dT%H%M%SZ).jsonl}

for v in "$SCALE" "$DRAM_SCALE"; do
    case "$v" in '' | *[!0-9]* | 0) echo "SCALE and DRAM_SCALE must be positive integers" >&2; exit 2 ;; esac
done

for e in $ENGINES; do
    case "$e" in
        terrace | foyer-hybrid | terrace-same-memory) ;;
        memcached) command -v memcached >/dev/null || { echo "memcached not found: apt-get install memcached" >&2; exit 1; } ;;
        terrace-serve) ;;
        *) echo "unknown engine: $e" >&2; exit 2 ;;
    esac
done

# Both packages in one build, whichever engines run: building terrace-bench alone
# unifies its dependencies' features differently and rebuilds it (a minute or more).
cargo build --release --quiet -p terrace-bench -p terrace-cli
target="${CARGO_TARGET_DIR:-$root/target}/release"
bench="$target/terrace-bench"
terrace="$target/terrace"

mkdir -p "$DIR" "$(dirname "$OUT")"
if [ "$(stat -f -c %T "$DIR")" = tmpfs ]; then
    echo "warning: $DIR is on tmpfs: the 'flash' is RAM here" >&2
fi
: >"$OUT"

PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$DIR/mc" "$DIR/serve" "$DIR/fio"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_port() {
    local port=$1 pid=$2
    for _ in $(seq 200); do
        kill -0 "$pid" 2>/dev/null || { echo "the server on port $port exited" >&2; return 1; }
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "the server on port $port did not start" >&2
    return 1
}

stop_server() {
    local pid=$1
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    PIDS=()
}

drop_caches() {
    sync
    # -w is true for root even where /proc/sys is read-only: try, and go on if refused.
    if [ -w /proc/sys/vm/drop_caches ]; then
        echo 1 2>/dev/null >/proc/sys/vm/drop_caches || true
    fi
}

EXTRA=("$@")

# The DRAM tier (MiB, a multiple of 2) that puts Terrace's peak DRAM just under the lowest
# anchor's in workload $1, run $2: its first run's tier plus the difference, less a
# segment. Fails when the first Terrace run or every anchor is missing.
same_memory_dram() {
    python3 - "$OUT" "$1" "$2" <<'PY'
import json, sys
out, w, run = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = [json.loads(l) for l in open(out) if l.strip()]
rows = [r for r in rows if r["workload"] == w and r["run"] == run and r.get("peak_dram_bytes")]
t = next(r for r in rows if r["label"] == "terrace")
anchors = [r["peak_dram_bytes"] for r in rows if r["label"] in ("foyer-hybrid", "memcached")]
dram = t["knob_dram_bytes"] + min(anchors) - t["peak_dram_bytes"] - (2 << 20)
print(max(dram >> 21, 8) * 2)
PY
}

# Adds the run's labels to terrace-bench's JSON line.
tag() {
    python3 -c '
import json, sys
w, label, run, d, f, notes = sys.argv[1:7]
r = json.loads(sys.stdin.read())
r.update({"workload": w, "label": label, "run": int(run), "knob_dram_bytes": int(d),
          "knob_flash_bytes": int(f), "scale": sys.argv[7], "notes": notes,
          "baseline_dram_bytes": int(sys.argv[8])})
print(json.dumps(r))' "$@"
}

# One terrace-bench run of engine E on workload W, its JSON line tagged and kept. A run
# that fails (an engine error, a wrong value) is reported and the others go on.
bench_run() {
    local W=$1 e=$2 run=$3 notes=$4
    shift 4
    # The engine's baseline: its peak DRAM over a run of 1000 ops on 1000 keys (the
    # process, its threads and empty structures; DRAM tiers are not touched yet).
    local base
    base=$("$bench" cache "$@" --keys 1000 --ops 1000 --threads "$THREADS" --json 2>/dev/null |
        python3 -c 'import json, sys; print(json.loads(sys.stdin.read()).get("peak_dram_bytes") or 0)' ||
        echo 0)
    echo "+ [$W run $run] terrace-bench cache $* ${work[*]} ${EXTRA[*]}" >&2
    if ! "$bench" cache "$@" "${work[@]}" "${EXTRA[@]}" |
        tag "$W" "$e" "$run" "$dbytes" "$fbytes" "$notes" "$SCALE/$DRAM_SCALE" "$base" >>"$OUT"; then
        echo "warning: the $e run of $W (run $run) failed; going on" >&2
    fi
}

if [ "$FIO" = 1 ]; then
    if command -v fio >/dev/null; then
        fio_out="${OUT%.jsonl}.fio"
        common_fio=(--filename="$DIR/fio" --size=1G --direct=1 --output-format=json)
        echo "+ fio device ceiling in $DIR" >&2
        fio --name=rr1 "${common_fio[@]}" --rw=randread --bs=4k --ioengine=psync --runtime=10 --time_based >"$fio_out-rr1.json"
        fio --name=rr32 "${common_fio[@]}" --rw=randread --bs=4k --ioengine=io_uring --iodepth=32 --runtime=10 --time_based >"$fio_out-rr32.json"
        fio --name=sw "${common_fio[@]}" --rw=write --bs=1M --ioengine=psync >"$fio_out-sw.json"
        rm -f "$DIR/fio"
    else
        echo "FIO=1 but fio is not installed: no device ceiling" >&2
    fi
fi

for run in $(seq "$RUNS"); do
    order=$ENGINES
    if [ $((run % 2)) = 0 ]; then
        order=$(echo "$ENGINES" | tr ' ' '\n' | tac | tr '\n' ' ')
    fi
    for W in $WORKLOADS; do
        case "$W" in
            W1) VALUES=64-4096; KEYS=4000000; ZIPF=0.99; D=256; F=4096; OPS=20000000; EXT_ITEM= ;;
            W2) VALUES=16-256; KEYS=20000000; ZIPF=0.9; D=128; F=2048; OPS=20000000; EXT_ITEM=,ext_item_size=64 ;;
            W3) VALUES=16KiB-256KiB; KEYS=200000; ZIPF=0.8; D=256; F=8192; OPS=2000000; EXT_ITEM= ;;
            *) echo "unknown workload: $W" >&2; exit 2 ;;
        esac
        KEYS=$((KEYS / SCALE)); OPS=$((OPS / SCALE)); F=$((F / SCALE)); D=$((D / DRAM_SCALE))
        [ "$KEYS" -ge 1 ] && [ "$OPS" -ge 1 ] && [ "$F" -ge 1 ] && [ "$D" -ge 1 ] ||
            { echo "SCALE $SCALE or DRAM_SCALE $DRAM_SCALE is too large" >&2; exit 2; }
        dbytes=$((D << 20)); fbytes=$((F << 20))
        # Four windows: the first (warm-up) is reported apart from the other three.
        work=(--keys "$KEYS" --zipf "$ZIPF" --value-size "$VALUES" --ops "$OPS"
              --threads "$THREADS" --get-ratio 0.9 --json --window "$((OPS / 4))")
        for e in $order; do
            drop_caches
            notes=""
            case "$e" in
                terrace)
                    rm -rf "${DIR:?}/terrace"; mkdir -p "$DIR/terrace"
                    args=(--engine terrace --capacity "$((D + F))MiB" --tiers "dram:${D}MiB,flash:${F}MiB" --dir "$DIR/terrace")
                    case "$RESTART" in
                        0) ;;
                        crash) args+=(--restart crash) ;;
                        *) args+=(--restart clean) ;;
                    esac
                    bench_run "$W" "$e" "$run" "$notes" "${args[@]}"
                    rm -rf "${DIR:?}/terrace" ;;
                terrace-same-memory)
                    if ! D2=$(same_memory_dram "$W" "$run"); then
                        echo "warning: no terrace and anchor rows for $W run $run: $e skipped" >&2
                        continue
                    fi
                    notes="DRAM tier ${D2} MiB"
                    rm -rf "${DIR:?}/terrace"; mkdir -p "$DIR/terrace"
                    args=(--engine terrace --capacity "$((D2 + F))MiB" --tiers "dram:${D2}MiB,flash:${F}MiB" --dir "$DIR/terrace")
                    dbytes=$((D2 << 20))
                    bench_run "$W" "$e" "$run" "$notes" "${args[@]}"
                    dbytes=$((D << 20))
                    rm -rf "${DIR:?}/terrace" ;;
                foyer-hybrid)
                    rm -rf "${DIR:?}/foyer"; mkdir -p "$DIR/foyer"
                    args=(--engine foyer-hybrid --capacity "${D}MiB" --flash "${F}MiB" --dir "$DIR/foyer")
                    bench_run "$W" "$e" "$run" "$notes" "${args[@]}"
                    rm -rf "${DIR:?}/foyer" ;;
                memcached)
                    rm -rf "${DIR:?}/mc"
                    user=()
                    if [ "$(id -u)" = 0 ]; then
                        install -d -o nobody "$DIR/mc"
                        user=(-u nobody)
                    else
                        mkdir -p "$DIR/mc"
                    fi
                    # At least 16 extstore pages where it can (its default page is 64 MiB;
                    # a page must be a multiple of its 4 MiB write buffer).
                    page=""
                    if [ $((F / 64)) -lt 16 ]; then
                        p=$((F / 16 / 4 * 4)); [ "$p" -ge 4 ] || p=4
                        page="ext_page_size=$p,"
                        notes="ext_page_size=${p}MiB"
                    fi
                    mc=(memcached "${user[@]}" -l 127.0.0.1 -p "$MC_PORT" -U 0 -t 2 -c 1024 -m "$D"
                        -o "${page}ext_path=$DIR/mc/extstore:${F}M,ext_threads=2$EXT_ITEM")
                    echo "+ [$W run $run] ${mc[*]}" >&2
                    "${mc[@]}" &
                    pid=$!; PIDS=("$pid")
                    wait_port "$MC_PORT" "$pid"
                    args=(--engine memcached --server "127.0.0.1:$MC_PORT" --pid "$pid" --pid-files "$DIR/mc")
                    bench_run "$W" "$e" "$run" "$notes" "${args[@]}"
                    stop_server "$pid"
                    rm -rf "${DIR:?}/mc" ;;
                terrace-serve)
                    rm -rf "${DIR:?}/serve"
                    srv=("$terrace" serve --listen "127.0.0.1:$TR_PORT" --threads 2
                         --tiers "dram:${D}MiB,flash:${F}MiB" --dir "$DIR/serve")
                    echo "+ [$W run $run] ${srv[*]}" >&2
                    "${srv[@]}" >/dev/null 2>"$DIR/serve.log" &
                    pid=$!; PIDS=("$pid")
                    wait_port "$TR_PORT" "$pid" || { cat "$DIR/serve.log" >&2; exit 1; }
                    args=(--engine memcached --server "127.0.0.1:$TR_PORT" --pid "$pid" --pid-files "$DIR/serve")
                    bench_run "$W" "$e" "$run" "$notes" "${args[@]}"
                    stop_server "$pid"
                    rm -rf "${DIR:?}/serve" "$DIR/serve.log" ;;
            esac
        done
    done
done

echo "results: $OUT" >&2
python3 - "$OUT" <<'EOF'
import glob, json, sys

out = sys.argv[1]
rows = [json.loads(l) for l in open(out) if l.strip()]

for f in sorted(glob.glob(out[: -len(".jsonl")] + ".fio-*.json") if out.endswith(".jsonl") else []):
    try:
        j = json.load(open(f))["jobs"][0]
        rd, wr = j["read"], j["write"]
        if rd["io_bytes"]:
            pct = rd["clat_ns"].get("percentile", {})
            print(f"fio {j['jobname']}: {rd['iops']:.0f} read IOPS, p99 {pct.get('99.000000', 0) / 1e3:.0f} µs")
        if wr["io_bytes"]:
            print(f"fio {j['jobname']}: {wr['bw_bytes'] / 2**30:.2f} GiB/s written")
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"fio {f}: unreadable ({e})")


def stats_of(r):
    """The server's stats (remote engines), else {}."""
    st = r.get("engine_stats") or {}
    return st.get("stats") or {} if isinstance(st, dict) else {}


def last_tier(s):
    """The index of the last tier_N_ of a terrace serve's stats."""
    tiers = [int(k.split("_")[1]) for k in s if k.startswith("tier_") and k.split("_")[1].isdigit()]
    return max(tiers) if tiers else None


def flash_facts(r):
    """(items on flash, live bytes on flash, hits from flash, drops), each None if unknown."""
    st = r.get("engine_stats") or {}
    label = r.get("label")
    refused = st.get("sets_refused", 0) if isinstance(st, dict) else 0
    if label in ("terrace", "terrace-same-memory"):
        fl = st.get("flash") or {}
        drops = None
        if fl:
            drops = fl.get("refused_no_room", 0) + fl.get("refused_budget", 0)
        last = lambda k: (st.get(k) or [None])[-1]
        return last("tier_items"), last("tier_live_bytes"), last("tier_hits"), drops
    if label == "foyer-hybrid":
        return None, None, st.get("disk_hits"), None
    s = stats_of(r)
    if label == "memcached":
        return (s.get("extstore_objects_used"), s.get("extstore_bytes_used"), s.get("get_extstore"),
                (s.get("evictions") or 0) + refused)
    if label == "terrace-serve":
        t = last_tier(s)
        if t is None:
            return None, None, None, refused
        g = lambda k: s.get(f"tier_{t}_{k}")
        drops = (g("flash_refused_no_room") or 0) + (g("flash_refused_budget") or 0) + refused
        return g("items"), g("live_bytes"), g("hits"), drops
    return None, None, None, None


def f(v, fmt):
    return "" if v is None else fmt.format(v)


def steady_hit(r):
    """The hit ratio of the gets after the first quarter of the ops (the warm-up)."""
    ws = [w for w in (r.get("windows") or [])[1:] if w.get("gets")]
    gets = sum(w["gets"] for w in ws)
    return sum(w["gets"] * w["hit_ratio"] for w in ws) / gets if gets else None


hdr = ["engine", "run", "hit ratio", "steady hit", "ops/s", "get p99 µs", "get p99.9 µs", "peak DRAM MiB",
       "DRAM B / flash item", "flash items", "dev W / ins B", "flash live", "flash hits", "drops", "wrong"]
for w in sorted({r["workload"] for r in rows}):
    ws = [r for r in rows if r["workload"] == w]
    r0 = ws[0]
    print()
    print(f"### {w}: values {r0['value_size']} B, {r0['keys']} keys, zipf {r0['zipf']}, "
          f"DRAM {r0['knob_dram_bytes'] >> 20} MiB : flash {r0['knob_flash_bytes'] >> 20} MiB, "
          f"{r0['ops']} ops, {r0['threads']} threads (SCALE/DRAM_SCALE {r0['scale']})")
    print()
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    notes = []
    for r in ws:
        items, live, fhits, drops = flash_facts(r)
        dram = r.get("peak_dram_bytes")
        per_item = None
        if dram is not None and items:
            base = r.get("baseline_dram_bytes") or 0
            per_item = max(dram - r["knob_dram_bytes"] - base, 0) / items
        if live == 0 and items:
            share = "?"
        else:
            share = f(None if live is None else live / r["knob_flash_bytes"], "{:.1%}")
        hits = r.get("hits") or 0
        us = lambda k: None if r.get(k) is None else r[k] / 1e3
        print("| " + " | ".join([
            r["label"], str(r["run"]), f(r.get("hit_ratio"), "{:.4f}"), f(steady_hit(r), "{:.4f}"),
            f(r.get("ops_per_sec"), "{:.0f}"),
            f(us("get_p99_ns"), "{:.0f}"), f(us("get_p999_ns"), "{:.0f}"),
            f(None if dram is None else dram / 2**20, "{:.0f}"), f(per_item, "{:.1f}"), f(items, "{}"),
            f(r.get("device_write_per_inserted"), "{:.2f}"), share,
            f(None if fhits is None or not hits else fhits / hits, "{:.1%}"), f(drops, "{}"),
            str(r.get("wrong_values")),
        ]) + " |")
        if r.get("notes"):
            notes.append(f"{r['label']}: {r['notes']}")
        rs = r.get("restart")
        if rs and rs.get("items_after_open"):
            before = rs.get("keys_present_before") or 0
            kept = 1 - rs.get("missing_after", 0) / before if before else None
            notes.append(
                f"{r['label']} run {r['run']}: {rs['mode']} restart opened {rs['items_after_open']} items in "
                f"{rs['open_seconds']:.3f} s ({rs['open_seconds'] / rs['items_after_open'] * 1e6:.3f} s per "
                f"million), {f(kept, '{:.2%}')} of {before} keys present before hit after, "
                f"{rs.get('wrong_after')} wrong"
                + ("" if rs["mode"] != "crash" or not items else
                   f"; {rs['items_after_open'] / items:.1%} of the {items} flash items kept "
                   "(DRAM items are lost in a crash by design)"))
    for n in notes:
        print(f"- {n}")
EOF

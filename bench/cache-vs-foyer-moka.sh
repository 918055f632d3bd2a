#!/usr/bin/env bash
# Terrace's cache against foyer and moka, in one run, on issue 5's "Done when" workload:
#   --capacity 256MiB --keys 2000000 --zipf 0.99 --value-size 64-4096 --ops 10000000
#   --threads 2 --get-ratio 0.9
# for terrace (dram:1), terrace (dram:1,file:3, the file tier on /dev/shm), foyer and moka;
# then terrace again at the same memory as the leaner of foyer and moka ("terrace-same-
# memory"): foyer and moka count only key + value bytes against --capacity, Terrace its
# whole segment space (item headers and dead copies too), so this run gives Terrace the
# segment space that brings its peak RSS just under theirs (their lower peak RSS, less
# what Terrace's first run used beyond its segments, less one 2 MiB segment).
# Each engine runs in its own process, so peak RSS is per engine. Prints a Markdown table
# per thread count (ratios against terrace dram:1 at that count, the movers' counters)
# and keeps the raw JSON lines.
#
# Usage: bench/cache-vs-foyer-moka.sh [extra terrace-bench args...]
# Environment overrides (for a quicker, reduced run):
#   CAPACITY KEYS ZIPF VALUE_SIZE OPS GET_RATIO  the workload (defaults above); OPS is
#             the run length
#   THREADS   thread counts to sweep, e.g. "2 4 8 16" (default 2): every engine at each
#   ENGINES   which runs, default "terrace terrace-tiered foyer moka"
#   TIER_DIR  directory of the file tier, default /dev/shm
#   OUT       where the JSON lines go, default $TMPDIR/terrace-bench-cache-<date>.jsonl
#   CARGO_TARGET_DIR  as for cargo (the release binary is built there)
# Examples: a reduced run, and issue 16's sweep on a many-core machine:
#   CAPACITY=64MiB KEYS=500000 OPS=2000000 bench/cache-vs-foyer-moka.sh
#   THREADS="2 4 8 16" ENGINES="terrace foyer moka" bench/cache-vs-foyer-moka.sh
#   THREADS=16 OPS=50000000 ENGINES="terrace foyer" bench/cache-vs-foyer-moka.sh
# BIN names a terrace-bench binary to run instead of building one (a machine without
# the toolchain).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

CAPACITY=${CAPACITY:-256MiB}
KEYS=${KEYS:-2000000}
ZIPF=${ZIPF:-0.99}
VALUE_SIZE=${VALUE_SIZE:-64-4096}
OPS=${OPS:-10000000}
THREADS=${THREADS:-2}
GET_RATIO=${GET_RATIO:-0.9}
ENGINES=${ENGINES:-terrace terrace-tiered foyer moka terrace-same-memory}
TIER_DIR=${TIER_DIR:-/dev/shm}
OUT=${OUT:-${TMPDIR:-/tmp}/terrace-bench-cache-$(date -u +%Y%m%dT%H%M%SZ).jsonl}

if [[ -z "${BIN:-}" ]]; then
    cargo build --release --quiet -p terrace-bench
    BIN="${CARGO_TARGET_DIR:-$root/target}/release/terrace-bench"
fi
bin=$BIN
mkdir -p "$(dirname "$OUT")"
: >"$OUT"

# The segment space that puts Terrace's peak RSS just under foyer's and moka's (see
# above), from the runs at $1 threads.
same_memory_capacity() {
    python3 - "$OUT" "$1" <<'PY'
import json, sys
rows = [r for r in (json.loads(l) for l in open(sys.argv[1]) if l.strip())
        if r["threads"] == int(sys.argv[2])]
t = next(r for r in rows if r["engine"] == "terrace" and r["tiers"] == "dram:1")
others = [r["peak_rss_bytes"] for r in rows if r["engine"] in ("foyer", "moka")]
seg = 2 << 20
room = min(others) - (t["peak_rss_bytes"] - t["capacity_bytes"]) - seg
print(f"{max(room // seg, 1) * 2}MiB")
PY
}

for threads in $THREADS; do
    common=(--keys "$KEYS" --zipf "$ZIPF" --value-size "$VALUE_SIZE"
            --ops "$OPS" --threads "$threads" --get-ratio "$GET_RATIO" --json)
    for e in $ENGINES; do
        case "$e" in
            terrace) args=(--engine terrace --tiers dram:1) ;;
            terrace-same-memory)
                cap=$(same_memory_capacity "$threads")
                echo "+ terrace at the same memory as foyer and moka: --capacity $cap" >&2
                echo "+ terrace-bench cache --engine terrace --tiers dram:1 --capacity $cap ${common[*]} $*" >&2
                "$bin" cache --engine terrace --tiers dram:1 --capacity "$cap" "${common[@]}" "$@" >>"$OUT"
                continue ;;
            terrace-tiered) args=(--engine terrace --tiers dram:1,file:3 --dir "$TIER_DIR") ;;
            foyer | moka) args=(--engine "$e") ;;
            *) echo "unknown engine run: $e" >&2; exit 2 ;;
        esac
        echo "+ terrace-bench cache ${args[*]} --capacity $CAPACITY ${common[*]} $*" >&2
        "$bin" cache "${args[@]}" --capacity "$CAPACITY" "${common[@]}" "$@" >>"$OUT"
    done
done

echo "command: terrace-bench cache --engine E --capacity $CAPACITY --keys $KEYS --zipf $ZIPF --value-size $VALUE_SIZE --ops $OPS --threads T --get-ratio $GET_RATIO --json $* (T: $THREADS)" >&2
echo "results: $OUT" >&2
python3 - "$OUT" <<'EOF'
import json, sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]

def num(v, fmt="{:.0f}"):
    return "–" if v is None else fmt.format(v)

def mib(v):
    return "–" if v is None else f"{v / 2**20:.0f}"

hdr = ["engine", "tiers", "capacity MiB", "ops/s", "× terrace", "hit ratio", "get p50/p99/p99.9 ns",
       "set p50/p99/p99.9 ns", "peak RSS MiB", "items", "meta B/item", "inline evict %",
       "movers: busy/blocked s", "free low water"]
for threads in sorted({r["threads"] for r in rows}):
    group = [r for r in rows if r["threads"] == threads]
    base = next((r for r in group if r["engine"] == "terrace" and r["tiers"] == "dram:1"), None)
    print(f"\n{threads} threads\n")
    print("| " + " | ".join(hdr) + " |")
    print("|" + "---|" * len(hdr))
    for r in group:
        ratio = "–" if not base else f"{r['ops_per_sec'] / base['ops_per_sec']:.2f}"
        st = r.get("engine_stats") or {}
        st = st if isinstance(st, dict) else {}
        inline = "–"
        if "inline_evictions" in st and st.get("sets"):
            inline = f"{100 * st['inline_evictions'] / st['sets']:.3f}"
        movers = st.get("movers") or {}
        busy = "–"
        if movers:
            busy = f"{movers['threads']}: {movers['busy_ns'] / 1e9:.2f}/{movers['blocked_ns'] / 1e9:.2f}"
        low = st.get("tier_free_low_water")
        print("| " + " | ".join([
            r["engine"], r["tiers"], mib(r.get("capacity_bytes")), num(r["ops_per_sec"]), ratio, num(r["hit_ratio"], "{:.4f}"),
            f"{num(r['get_p50_ns'])}/{num(r['get_p99_ns'])}/{num(r['get_p999_ns'])}",
            f"{num(r['set_p50_ns'])}/{num(r['set_p99_ns'])}/{num(r['set_p999_ns'])}",
            mib(r["peak_rss_bytes"]), num(r["items"]), num(r["metadata_bytes_per_item"], "{:.1f}"),
            inline, busy, "–" if low is None else ",".join(map(str, low)),
        ]) + " |")
EOF

"""Summarises bench/bindings-vs-anchors.sh: the medians over RUNS of each JMH score and of
the one-shot measurements, and the ratios of Terrace's Java binding against each anchor,
with the issue's target beside each ratio (met / MISSED / n/a where a side did not run)."""
import glob
import json
import os
import statistics
import sys
from collections import defaultdict

# OUT may name several directories, joined by ':' (suites run apart, summarised together)
outs, runs = sys.argv[1].split(":"), int(sys.argv[2])
score = defaultdict(list)       # (bench, params...) -> [score]
p99 = defaultdict(list)
alloc_norm = defaultdict(list)
errors = []


def key(rec):
    bench = rec["benchmark"].rsplit(".", 2)[-2] + "." + rec["benchmark"].rsplit(".", 1)[-1]
    params = rec.get("params", {})
    return (bench, params.get("engine"), params.get("size"), params.get("state"),
            rec.get("threads", 1))


for path in sorted(p for out in outs for p in glob.glob(f"{out}/*.json")):
    try:
        recs = json.load(open(path))
        if not isinstance(recs, list):
            raise ValueError
    except ValueError:
        errors.append(f"{os.path.basename(path)}: not JSON")
        continue
    for rec in recs:
        k = key(rec)
        pm = rec["primaryMetric"]
        score[k].append(pm["score"])
        if "99.0" in pm.get("scorePercentiles", {}) and rec["mode"] == "sample":
            p99[k].append(pm["scorePercentiles"]["99.0"])
        sec = rec.get("secondaryMetrics", {}).get("gc.alloc.rate.norm")
        if sec:
            alloc_norm[k].append(sec["score"])

oneshot = defaultdict(list)
oneshot_err = {}
for path in sorted(p for out in outs for p in glob.glob(f"{out}/*.jsonl")):
    for line in open(path):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        k = (r["kind"], r["engine"], r.get("size"))
        if "error" in r:
            oneshot_err[k] = r["error"]
        elif r["kind"] == "util":
            oneshot[k].append(r["utilization"])
        elif r["kind"] in ("reopen", "fill"):
            oneshot[k].append(r["ms"])
            if r["kind"] == "reopen" and not r.get("first_get_ok", True):
                oneshot_err[k] = "first get returned a wrong value"
        elif r["kind"] == "bytes":
            oneshot[("bytes", r["engine"], "allocated")].append(r["allocated_per_entry"])
            oneshot[("bytes", r["engine"], "used")].append(r["used_per_entry"])
        else:
            oneshot[k].append(r["heap_delta_bytes"])


def med(d, k):
    return statistics.median(d[k]) if d.get(k) else None


def fmt(v, unit=""):
    if v is None:
        return "—"
    if v >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:.3g}{unit}"


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


verdicts = []


def verdict(name, r, ok):
    if r is None:
        verdicts.append((name, "n/a"))
        return "n/a"
    v = "met" if ok(r) else "MISSED"
    verdicts.append((name, v))
    return v


def rfmt(r):
    return "—" if r is None else f"{r:.2f}×"


SIZES = ["64", "512", "4096", "65536", "1048576", "4194304"]
ENG_A = ["terrace-file", "terrace-dram", "memkind-dram", "memkind-pmem", "memkind-pmem-hog",
         "unsafe", "arena"]
print(f"## A. Allocator: alloc+free pair, ns/op (median of {runs} run(s))")
print("| size | " + " | ".join(ENG_A) + " | file / memkind DRAM (≤ 1.5× at 64 B–4 KiB) "
      "| memkind pmem / file (info: pairs reuse the block) | Terrace DRAM / Unsafe (A2: ≤ 1.2× to 4 KiB, ≤ 1.0× above) |")
print("|---" * (len(ENG_A) + 4) + "|")
for s in SIZES:
    v = {e: med(score, ("AllocBench.allocFree", e, s, None, 1)) for e in ENG_A}
    r1 = ratio(v["terrace-file"], v["memkind-dram"])
    r2 = ratio(v["memkind-pmem"], v["terrace-file"])
    r3 = ratio(v["terrace-dram"], v["unsafe"])
    c1 = verdict(f"A pair {s} file/memkind-dram", r1, lambda r: r <= 1.5) if int(s) <= 4096 else ""
    c2 = ""  # a pair reuses the block just freed: the target is judged on the batches below
    lim = 1.2 if int(s) <= 4096 else 1.0
    c3 = verdict(f"A2 pair {s} dram/unsafe", r3, lambda r: r <= lim)
    print(f"| {s} | " + " | ".join(fmt(v[e]) for e in ENG_A)
          + f" | {rfmt(r1)} {c1} | {rfmt(r2)} {c2} | {rfmt(r3)} {c3} |")

ENG_B = ["terrace-file", "terrace-dram", "memkind-dram", "memkind-pmem", "memkind-pmem-hog"]
print()
print("## A. Allocator: batches of 256 allocations then 256 frees, ns per alloc+free (single shots)")
print("| state | size | " + " | ".join(ENG_B) + " | memkind pmem / file (≥ 20×) "
      "| memkind pmem, HOG / file | file / memkind DRAM |")
print("|---" * (len(ENG_B) + 5) + "|")
for st in ("cold", "warm"):
    for s in ("65536", "1048576"):
        v = {e: med(score, ("AllocBatchBench.allocThenFree", e, s, st, 1)) for e in ENG_B}
        r2 = ratio(v["memkind-pmem"], v["terrace-file"])
        rh = ratio(v["memkind-pmem-hog"], v["terrace-file"])
        rd = ratio(v["terrace-file"], v["memkind-dram"])
        c2 = verdict(f"A batch {st} {s} memkind-pmem/file", r2, lambda r: r >= 20)
        print(f"| {st} | {s} | " + " | ".join(fmt(v[e]) for e in ENG_B)
              + f" | {rfmt(r2)} {c2} | {rfmt(rh)} | {rfmt(rd)} |")

print()
print("## B. Persistent heap vs LLPL 1.2.0 (ns/op)")
print("| operation | Terrace | LLPL | LLPL / Terrace | target |")
print("|---|---|---|---|---|")
for bench, label, target, ok, invert in (
        ("PoolBench.txAlloc", "tx: allocateMemoryBlock(100) + copyFromArray, one tx each", "≥ 10×", lambda r: r >= 10, False),
        ("PoolBench.durableSet", "durable setLong (PersistentHeap)", "≥ 3×", lambda r: r >= 3, False),
        ("PoolBench.setFlush", "setLong + flush(off, 8) (Heap)", "≥ 3×", lambda r: r >= 3, False),
        ("PoolBench.handleRead", "memoryBlockFromHandle + getLong", "≥ 1.0× (no slower)", lambda r: r >= 1.0, False)):
    t = med(score, (bench, "terrace", None, None, 1))
    l = med(score, (bench, "llpl", None, None, 1))
    r = ratio(l, t)
    c = verdict(f"B {bench}", r, ok)
    print(f"| {label} | {fmt(t)} | {fmt(l)} | {rfmt(r)} | {target} {c} |")
print()
print("Utilization, fill to failure of a 256 MiB pool: objects × size / pool file size")
print("| size | Terrace | LLPL (compact blocks) | target ≥ 97% |")
print("|---|---|---|---|")
for s in (64, 256, 4096, 65536, 1048576):
    t = med(oneshot, ("util", "terrace", s))
    l = med(oneshot, ("util", "llpl", s))
    c = verdict(f"B util {s}", t, lambda r: r >= 0.97)
    te = oneshot_err.get(("util", "terrace", s))
    print(f"| {s} | {'—' if t is None else f'{t:.1%}'}{' (' + te[:60] + ')' if te and t is None else ''} "
          f"| {'—' if l is None else f'{l:.1%}'} | {c} |")

ENG_C = ["terrace", "ohc", "chronicle", "mapdb", "caffeine"]
threads = sorted({k[4] for k in score if k[0] == "CacheBench.mixed"})
print()
print("## C. Off-heap cache: 90/10 get/set ops/s, get p99 (ns), Java heap allocated per op (B)")
print("| threads | metric | " + " | ".join(ENG_C) + " | Terrace / OHC | Terrace / Chronicle | target |")
print("|---" * (len(ENG_C) + 5) + "|")
for t in threads:
    ops = {e: med(score, ("CacheBench.mixed", e, None, None, t)) for e in ENG_C}
    r1, r2 = ratio(ops["terrace"], ops["ohc"]), ratio(ops["terrace"], ops["chronicle"])
    c = ""
    if t == 2:
        c = (verdict("C ops/s vs OHC t2", r1, lambda r: r >= 2) + ", "
             + verdict("C ops/s vs Chronicle t2", r2, lambda r: r >= 2))
    print(f"| {t} | ops/s | " + " | ".join(fmt(ops[e]) for e in ENG_C)
          + f" | {rfmt(r1)} | {rfmt(r2)} | ≥ 2× at 2 threads {c} |")
    lat = {e: med(p99, ("CacheBench.get", e, None, None, t)) for e in ENG_C}
    r1, r2 = ratio(lat["terrace"], lat["ohc"]), ratio(lat["terrace"], lat["chronicle"])
    c = ""
    if t == 2:
        c = (verdict("C p99 vs OHC t2", r1, lambda r: r <= 1) + ", "
             + verdict("C p99 vs Chronicle t2", r2, lambda r: r <= 1))
    print(f"| {t} | get p99 ns | " + " | ".join(fmt(lat[e]) for e in ENG_C)
          + f" | {rfmt(r1)} | {rfmt(r2)} | ≤ 1.0× {c} |")
    an = {e: med(alloc_norm, ("CacheBench.mixed", e, None, None, t)) for e in ENG_C}
    print(f"| {t} | heap B/op (mixed) | " + " | ".join(fmt(an[e]) for e in ENG_C) + " | | | |")
heap = {e: med(oneshot, ("heap", e, None)) for e in ENG_C}
print("| — | Java heap held after fill (MiB) | "
      + " | ".join("—" if heap[e] is None else f"{heap[e] / 2**20:.1f}" for e in ENG_C)
      + " | | | values off the heap |")

ENG_D = ["terrace", "llpl", "skiplist", "mapdb"]
if any(k[0].startswith("MapBench.") for k in score) or any(k[0] in ("reopen", "bytes") for k in oneshot):
    print()
    print(f"## D. Persistent ordered map vs LLPL 1.2.0 ConcurrentLongART, ns/op (median of {runs} run(s))")
    print("| operation | " + " | ".join(ENG_D) + " | LLPL / Terrace | target |")
    print("|---" * (len(ENG_D) + 3) + "|")
    for bench, label in (("MapBench.put", "put (new random 16 B key)"),
                         ("MapBench.get", "get (random hit, key from an array)"),
                         ("MapBench.getMade", "get (random hit, key made)"),
                         ("MapBench.scan100", "scan100 (100 entries from a random key)")):
        v = {e: med(score, (bench, e, None, None, 1)) for e in ENG_D}
        r = ratio(v["llpl"], v["terrace"])
        c = verdict(f"D {bench} llpl/terrace", r, lambda r: r >= 2)
        print(f"| {label} | " + " | ".join(fmt(v[e]) for e in ENG_D)
              + f" | {rfmt(r)} | ≥ 2× {c} |")
    print()
    print("Reopen of a heap holding the one-shot's keys (1M by default) until the first get returns, "
          "by heap size (a Terrace pool opens slower the larger it is)")
    print("| heap MiB | Terrace (ms) | LLPL (ms) | LLPL / Terrace | fill ms, Terrace / LLPL (info) |")
    print("|---|---|---|---|---|")
    sizes = sorted({k[2] for k in list(oneshot) + list(oneshot_err)
                    if k[0] in ("reopen", "fill") and k[2] is not None})
    for sz in sizes:
        ro = {e: med(oneshot, ("reopen", e, sz)) for e in ("terrace", "llpl")}
        fi = {e: med(oneshot, ("fill", e, sz)) for e in ("terrace", "llpl")}
        err = {e: oneshot_err.get(("reopen", e, sz)) for e in ("terrace", "llpl")}
        cell = {e: fmt(ro[e]) + (" (" + err[e][:50] + ")" if err[e] else "") for e in ro}
        print(f"| {sz} | {cell['terrace']} | {cell['llpl']} | {rfmt(ratio(ro['llpl'], ro['terrace']))} "
              f"| {fmt(fi['terrace'])} / {fmt(fi['llpl'])} |")
    ba = med(oneshot, ("bytes", "terrace", "allocated"))
    bu = med(oneshot, ("bytes", "terrace", "used"))
    print()
    print("Terrace pool bytes per entry (16 B keys, 8 B values): "
          f"{fmt(ba)} allocated (objects), {fmt(bu)} used (heap pages not free)")

print()
missed = [n for n, v in verdicts if v == "MISSED"]
na = [n for n, v in verdicts if v == "n/a"]
print(f"targets: {sum(v == 'met' for _, v in verdicts)} met, {len(missed)} missed, {len(na)} not measured")
if missed:
    print("missed: " + "; ".join(missed))
if na:
    print("not measured: " + "; ".join(na))
for e in errors:
    print("error: " + e)
for k, e in sorted(oneshot_err.items(), key=str):
    print(f"one-shot error {k}: {e[:160]}")

"""Summarises alternating pmemobj_util / pmemobj_mt runs of libpmemobj and Terrace:
medians, utilization and the speed ratios the persistent-pool issue sets targets for."""
import csv
import os
import statistics
import sys
from collections import defaultdict

out, runs = sys.argv[1], int(sys.argv[2])


def rows(name):
    with open(name) as f:
        return [r for r in csv.DictReader(line for line in f if not line.startswith("single-thread"))]


util = defaultdict(list)  # (lib, size) -> rows
mt = defaultdict(list)    # lib -> rows
for lib in ("pmdk", "terrace"):
    for i in range(1, runs + 1):
        for r in rows(f"{out}/util.{lib}.{i}.csv"):
            util[(lib, int(r["size"]))].append(r)
        mt[lib].extend(rows(f"{out}/mt.{lib}.{i}.csv"))


def med(rs, col):
    return statistics.median(float(r[col]) for r in rs)


failures = []
forced = os.environ.get("PMDK_FORCE", "1") != "0"
how = "with PMEM_IS_PMEM_FORCE=1" if forced else "on its own persistent-memory detection"
print(f"pmemobj_util, median of {runs} alternating runs (libpmemobj {how})")
print("| size | libpmemobj utilization | Terrace utilization | libpmemobj alloc ns | Terrace alloc ns "
      "| alloc speed-up | libpmemobj free ns | Terrace free ns |")
print("|---|---|---|---|---|---|---|---|")
for size in sorted({k[1] for k in util}):
    p, t = util[("pmdk", size)], util[("terrace", size)]
    speedup = med(p, "alloc_ns") / med(t, "alloc_ns")
    tu = med(t, "utilization_pct")
    print(f"| {size} | {med(p, 'utilization_pct'):.1f}% | {tu:.1f}% | {med(p, 'alloc_ns'):.0f} "
          f"| {med(t, 'alloc_ns'):.0f} | {speedup:.1f}× | {med(p, 'free_ns'):.0f} | {med(t, 'free_ns'):.0f} |")
    if tu < 97:
        failures.append(f"utilization {tu:.1f}% at {size} B")
    if speedup < 10:
        failures.append(f"alloc only {speedup:.1f}x at {size} B")
print()
p, t = mt["pmdk"], mt["terrace"]
rate = med(t, "allocs_per_s") / med(p, "allocs_per_s")
print("pmemobj_mt (4-64 KiB objects until the pool is full)")
print("| threads | libpmemobj utilization | Terrace utilization | libpmemobj allocs/s | Terrace allocs/s | ratio |")
print("|---|---|---|---|---|---|")
print(f"| {p[0]['threads']} | {med(p, 'utilization_pct'):.1f}% | {med(t, 'utilization_pct'):.1f}% "
      f"| {med(p, 'allocs_per_s'):.0f} | {med(t, 'allocs_per_s'):.0f} | {rate:.1f}× |")
if med(t, "utilization_pct") < 97:
    failures.append("multi-threaded utilization below 97%")
if rate < 10:
    failures.append(f"multi-threaded allocation rate only {rate:.1f}x")
print()
print("targets (>= 97% utilization everywhere; >= 10x libpmemobj's allocation speed): "
      + ("all met" if not failures else "missed: " + "; ".join(failures)))

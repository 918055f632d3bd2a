"""Summarises alternating memkind_speed runs: medians per (library, kind, size) and the
ratios of Terrace's file kind against memkind's DRAM and file kinds."""
import csv
import statistics
import sys
from collections import defaultdict

out, runs = sys.argv[1], int(sys.argv[2])
samples = defaultdict(list)  # (lib, kind, size) -> [(malloc, free)]
for lib in ("memkind", "terrace"):
    for i in range(1, runs + 1):
        with open(f"{out}/{lib}.{i}.csv") as f:
            for row in csv.DictReader(f):
                samples[(lib, row["kind"], int(row["size"]))].append(
                    (float(row["malloc_ns"]), float(row["free_detect_ns"])))


def med(lib, kind, size, col):
    return statistics.median(s[col] for s in samples[(lib, kind, size)])


sizes = sorted({k[2] for k in samples})
print(f"memkind_speed, median of {runs} alternating runs (ns per operation)")
print("| size | memkind file malloc | memkind DRAM malloc | Terrace file malloc | Terrace DRAM malloc "
      "| Terrace file / memkind DRAM malloc | memkind DRAM free | Terrace file free "
      "| Terrace file / memkind DRAM free | memkind file / Terrace file malloc |")
print("|---|---|---|---|---|---|---|---|---|---|")
failures = []
for size in sizes:
    mf, md = med("memkind", "pmem", size, 0), med("memkind", "dram", size, 0)
    tf, td = med("terrace", "pmem", size, 0), med("terrace", "dram", size, 0)
    mdf, tff = med("memkind", "dram", size, 1), med("terrace", "pmem", size, 1)
    print(f"| {size} | {mf:.0f} | {md:.0f} | {tf:.0f} | {td:.0f} | {tf / md:.2f}× | {mdf:.0f} | {tff:.0f} "
          f"| {tff / mdf:.2f}× | {mf / tf:.1f}× |")
    if tf / md > 1.5:
        failures.append(f"{size} B malloc {tf / md:.2f}× memkind DRAM")
    if tff / mdf > 1.5:
        failures.append(f"{size} B free {tff / mdf:.2f}× memkind DRAM")
    if size >= 65536 and mf / tf < 20:
        failures.append(f"{size} B only {mf / tf:.1f}× faster than memkind's file kind")
print()
print("targets (file kind within 1.5x of memkind DRAM; >= 20x memkind file at 64 KiB and 1 MiB): "
      + ("all met" if not failures else "missed: " + "; ".join(failures)))

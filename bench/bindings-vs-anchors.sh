#!/usr/bin/env bash
# Runs the JMH suites of bench/java (issue 18): Terrace's Java binding (dev.terrace:terrace)
# against its anchors in the same JMH runs, with the same JVM flags for every engine:
#   A  allocator: kinds vs memkind 1.14 (through FFM, as Hazelcast's MemkindHeap calls it),
#      Unsafe and Arena (pairs), and kinds vs memkind in batches (cold and warm kinds);
#   B  persistent heap vs LLPL 1.2.0 (libpmemobj with PMEM_IS_PMEM_FORCE=1), and a one-shot
#      pool utilization fill to failure;
#   C  off-heap cache vs OHC 0.7.4, Chronicle Map, MapDB 3.1.0 and Caffeine 3.3.1 at each
#      of THREADS, with -prof gc, and a one-shot Java heap held after a fill;
#   D  persistent ordered map (ConcurrentLongIndex) vs LLPL 1.2.0's ConcurrentLongART
#      (libpmemobj, PMEM_IS_PMEM_FORCE=1), ConcurrentSkipListMap and MapDB 3.1.0's file-backed
#      treeMap: put, get, scan100 over KEYS entries; and a one-shot reopen of a heap holding
#      REOPEN_KEYS keys until the first get returns (terrace, llpl), with the terrace pool's
#      bytes per entry.
# RUNS repeats every suite (each run is every engine, one after the other); the summary
# gives the medians over runs and the ratios next to the issue's targets.
#
#   bench/bindings-vs-anchors.sh [DIR]         DIR: heaps and file kinds (default /dev/shm)
#   RUNS=3 JMH="-f 2 -wi 3 -w 2s -i 5 -r 2s" SUITES="A C" bench/bindings-vs-anchors.sh
#
# Settings (env): RUNS (1), SUITES ("A B C D"), JMH (options of the timed suites, default
# "-f 1 -wi 2 -w 1s -i 3 -r 1s": about 12 minutes on 2 cores), BATCH_JMH (suite A's single
# shots, "-f 1 -wi 5 -i 15"), THREADS ("1 2"), KEYS (200000), CAPACITY_MIB (64),
# VALUE_SIZE (100), MAP_JMH (suite D's options, default "-f 1 -wi 3 -w 2s -i 5 -r 2s": LLPL's
# tree needs the longer warmup, its get measured 1.8 us after two 1 s warmups, 0.47 us after
# three of 2 s; about 5 minutes), REOPEN_KEYS (1000000), EXTRA (more JMH options for every
# suite, e.g. "-p size=64,4096").
# STAGE=build only builds, STAGE=run only runs what was built; OUT sets where the JSON and
# logs go (default bench/out/bindings, replaced each run); the summary script also takes
# several such directories joined by ":" (suites run apart with SUITES and OUT).
#
# Needs: cargo, a JDK >= 22 (JAVA_HOME, or the newest under /usr/lib/jvm), Maven with
# Maven Central, python3, and Debian's libmemkind0, libpmemobj1 and libpmempool1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-/dev/shm}
runs=${RUNS:-1}
stage=${STAGE:-all}
suites=${SUITES:-A B C D}
jmh=${JMH:--f 1 -wi 2 -w 1s -i 3 -r 1s}
batch_jmh=${BATCH_JMH:--f 1 -wi 5 -i 15}
threads=${THREADS:-1 2}
keys=${KEYS:-200000}
capacity=${CAPACITY_MIB:-64}
value_size=${VALUE_SIZE:-100}
map_jmh=${MAP_JMH:--f 1 -wi 3 -w 2s -i 5 -r 2s}
reopen_keys=${REOPEN_KEYS:-1000000}
extra=${EXTRA:-}
out=${OUT:-$root/bench/out/bindings}
module=$root/bench/java

JAVA_HOME=$("$root/bindings/java/find-jdk") || exit 1
export JAVA_HOME PATH=$JAVA_HOME/bin:$PATH

if [ "$stage" != run ]; then
  (cd "$root" && cargo build --release --quiet -p terrace-capi)
  mvn -B -f "$root/bindings/java" -q install -DskipTests -Dterrace.build.dir=target-bench \
      -Dterrace.lib.dir="$root/target/release"
  mvn -B -f "$module" -q package
  mvn -B -f "$module" -q dependency:build-classpath -Dmdep.outputFile="$module/target/classpath.txt"
fi
[ "$stage" != build ] || exit 0

# Chronicle Map needs these on JDK 17+; every engine gets them, so the runs compare.
flags=(--enable-native-access=ALL-UNNAMED --sun-misc-unsafe-memory-access=allow
  --add-exports=java.base/jdk.internal.ref=ALL-UNNAMED
  --add-exports=java.base/sun.nio.ch=ALL-UNNAMED
  --add-exports=jdk.unsupported/sun.misc=ALL-UNNAMED
  --add-exports=jdk.compiler/com.sun.tools.javac.file=ALL-UNNAMED
  --add-exports=java.base/jdk.internal.misc=ALL-UNNAMED
  --add-opens=jdk.compiler/com.sun.tools.javac=ALL-UNNAMED
  --add-opens=java.base/java.lang=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED
  --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED
  --add-opens=java.base/java.nio=ALL-UNNAMED
  -Dchronicle.analytics.disable=true -Xms2g -Xmx2g -Dbench.dir="$dir")
cp="$module/target/classes:$(cat "$module/target/classpath.txt")"
# LLPL's libpmemobj treats /dev/shm as persistent memory only when forced, as PMDK's users
# benchmark it; the variable means nothing to the other engines.
export PMEM_IS_PMEM_FORCE=1
jvm() { java "${flags[@]}" -cp "$cp" "$@"; }
# JMH forks inherit these JVM flags (no -jvmArgs given); each result's jvmArgs shows them.
bench() { local name=$1; shift; jvm org.openjdk.jmh.Main "$@" $extra -rf json -rff "$out/$name.json" > "$out/$name.log" 2>&1 ||
          echo "warning: $name failed (see $out/$name.log)"; }

rm -rf "$out"
mkdir -p "$out"
{ java -version 2>&1; echo; mvn -B -v 2>/dev/null | sed -n 1p; uname -srm; nproc; } > "$out/env.txt"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/env.txt"
for i in $(seq "$runs"); do
  for s in $suites; do
    echo "run $i, suite $s: $(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/env.txt"
    case $s in
      A) bench "alloc.$i" 'AllocBench' $jmh
         bench "batch.$i" 'AllocBatchBench' $batch_jmh ;;
      B) bench "pool.$i" 'PoolBench' $jmh
         jvm dev.terrace.bench.OneShot util > "$out/util.$i.jsonl" 2> "$out/util.$i.log" ||
           echo "warning: util failed" ;;
      C) for t in $threads; do
           bench "cache.t$t.$i" 'CacheBench' $jmh -t "$t" -prof gc \
             -p keys="$keys" -p capacityMiB="$capacity" -p valueSize="$value_size"
         done
         jvm -Dbench.keys="$keys" -Dbench.capacityMiB="$capacity" -Dbench.valueSize="$value_size" \
           dev.terrace.bench.OneShot heap > "$out/heap.$i.jsonl" 2> "$out/heap.$i.log" ||
           echo "warning: heap failed" ;;
      D) bench "map.$i" 'MapBench' $map_jmh -p keys="$keys" -p dir="$dir"
         jvm -Dbench.reopenKeys="$reopen_keys" dev.terrace.bench.OneShot reopen \
           > "$out/reopen.$i.jsonl" 2> "$out/reopen.$i.log" || echo "warning: reopen failed" ;;
    esac
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/env.txt"
head -1 "$out/env.txt"
grep '^load' "$out/env.txt"
python3 "$root/bench/summarize_bindings.py" "$out" "$runs" | tee "$out/summary.md"

#!/usr/bin/env bash
# Fault soak of replicated volumes under etcd (issue 24's ">= 100 randomized fault
# rounds"). Runs terrace-cli's `fault_rounds_keep_every_history_linearizable` test with
# TERRACE_FAULT_ROUNDS rounds, each a random one of: the primary's node lost (its links
# cut with what they carried, kill -9, files deleted, restarted empty), a secondary
# killed and restarted, the primary stopped (SIGSTOP) for 6.5 s (over twice the 3 s
# lease), the primary cut off from etcd for 6.5 s, a secondary's copy deleted while it
# is down and then the primary's node lost while the third node is cut off from etcd
# (the two nodes left named in sync hold no data and must not lead), the primary's wall
# clock stepped by up to an hour either way (libfaketime). Three etcd members and three
# nodes on loopback, relays between them (crates/terrace-cli/tests/volume_replication.rs).
# Sixteen writers and a reader record every operation with its start and end; after each
# round every block is read from the new primary and the whole history is checked per
# block (one writer per block, so a read must return a value no lower than the last
# write acknowledged before it began, written by a write begun before it ended, and
# reads never go back in time); no epoch may be led by two nodes.
#
# Usage: bench/volume-replication-soak.sh          (ROUNDS=100; about 8-11 s a round; the
#        test profile, which the workspace optimizes)
#        TERRACE_FAULT_SEED=N bench/volume-replication-soak.sh   (replays a run's faults and
#        timings; every run prints its seed)
#        ACK=one bench/volume-replication-soak.sh   (the volume's ack level, given with
#        --volume-replication; default all.
#        Below all, the fault that loses a copy and then the primary is left out: see
#        fault_rounds in the test)
# Needs etcd (Debian etcd-server), libfaketime and, to build, protoc (protobuf-compiler
# and libprotobuf-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-100}
ACK=${ACK:-all}
LOG=${LOG:-/var/tmp/terrace-replication-soak.log}
echo "== $ROUNDS random fault rounds, ack $ACK (log: $LOG)"
start=$(date +%s)
if TERRACE_FAULT_ROUNDS=$ROUNDS TERRACE_FAULT_ACK=$ACK TERRACE_REQUIRE_TOOLS=1 cargo test -q \
  -p terrace-cli --test volume_replication fault_rounds -- --nocapture >"$LOG" 2>&1; then
  result=passed
else
  result=FAILED
fi
grep -E '^round [0-9]+:' "$LOG" | sed -E 's/^round [0-9]+: (.*) \(n[0-9] → n[0-9]\).*/\1/' |
  sort | uniq -c | sed 's/^/  /'
grep -m1 -o 'TERRACE_FAULT_SEED=[0-9]*' "$LOG" | sed 's/^/replay with: /' || true
echo "rounds done: $(grep -cE '^round [0-9]+:' "$LOG") of $ROUNDS, $(( $(date +%s) - start )) s"
echo "result: $result"
[ "$result" = passed ] || { tail -40 "$LOG"; exit 1; }

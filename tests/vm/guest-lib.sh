# Sourced by the guest scripts of tests/vm: the DAX mount and step bookkeeping.
# Each step's outcome goes to $TERRACE_VM_OUT/summary.txt ("passed: STEP" or
# "FAILED: STEP") and counts in $failed.
out=${TERRACE_VM_OUT:?set by the guest init}
# What tests/vm/run handed over (TERRACE_VM_PASS).
[ -f "$out/env" ] && set -a && source "$out/env" && set +a
summary=$out/summary.txt
: > "$summary"
failed=0
dax=/run/terrace-dax

step() { # NAME COMMAND...
  local name=$1
  shift
  echo "=== guest: $name"
  local start=$SECONDS
  if "$@"; then
    echo "passed: $name" >> "$summary"
    echo "=== guest: $name passed in $((SECONDS - start)) s"
  else
    echo "FAILED: $name" >> "$summary"
    echo "=== guest: $name FAILED after $((SECONDS - start)) s"
    failed=$((failed + 1))
  fi
}

# The label-less NVDIMM shows up as a raw namespace: make it fsdax (struct pages for it
# kept in DRAM: --map=mem, which ext4's DAX needs) and mount ext4 on it with -o dax.
make_dax() {
  ndctl create-namespace --force --reconfig=namespace0.0 --mode=fsdax --map=mem >/dev/null &&
    mkfs.ext4 -q -F -b 4096 /dev/pmem0 &&
    mkdir -p "$dax" &&
    mount -o dax /dev/pmem0 "$dax" &&
    grep -E " $dax .*dax" /proc/mounts
}

# Runs a Rust test executable (ARGS…) and requires its summary to say that exactly
# COUNT tests passed: a filter that matches nothing must not pass.
tests_pass() { # COUNT EXECUTABLE ARGS...
  local count=$1 log
  shift
  log=$(mktemp)
  "$@" 2>&1 | tee "$log"
  local status=${PIPESTATUS[0]}
  if [ "$status" -eq 0 ] && ! grep -q "^test result: ok. $count passed" "$log"; then
    echo "guest: expected $count tests to pass in $1" >&2
    status=1
  fi
  rm -f "$log"
  return "$status"
}

# The executable cargo built for PACKAGE:KIND:TARGET (listed by tests/vm/run).
bin() {
  local path
  path=$(awk -v k="$1" '$1 == k {print $2; exit}' "$out/binaries.txt")
  [ -n "$path" ] || { echo "guest: no executable $1 in binaries.txt" >&2; return 1; }
  echo "$path"
}

finish() {
  echo "=== guest summary"
  cat "$summary"
  exit "$failed"
}

#!/usr/bin/env bash
# Runs inside the guest of tests/vm/run, from the checkout's root: mounts ext4 with -o dax
# on the NVDIMM, then runs the tests that prove the DAX and NUMA paths
# (crates/terrace-cli/tests/vm.rs, the C ABI's NUMA kinds) and the pool's file,
# crash-image and kill tests with their pool files on that mount, requiring the DAX
# persist path (TERRACE_TEST_REQUIRE_DAX). Exit status: the number of failed steps.
set -uo pipefail
source tests/vm/guest-lib.sh

step "dax mount" make_dax
terrace=$(bin terrace-cli:bin:terrace)
step "info" bash -o pipefail -c "'$terrace' info --dir $dax | tee '$out/info.txt'"

export TERRACE_VM_DAX_DIR=$dax
step "guest tests" tests_pass "$(grep -c '^fn guest_' crates/terrace-cli/tests/vm.rs)" \
  "$(bin terrace-cli:test:vm)" --ignored --test-threads=1 guest_
step "memkind numa kinds" tests_pass 1 env TERRACE_EXPECT_CPU_LESS_NODE=1 \
  "$(bin terrace-capi:test:c_abi)" --exact numa_kinds

export TERRACE_TEST_PMEM_DIR=$dax TERRACE_TEST_REQUIRE_DAX=1
step "pool file tests" tests_pass "$(grep -c '^#\[test\]' crates/terrace-pool/tests/pool.rs)" \
  "$(bin terrace-pool:test:pool)" --test-threads=1
step "pool classes" tests_pass "$(grep -c '^#\[test\]' crates/terrace-pool/tests/classes.rs)" \
  "$(bin terrace-pool:test:classes)" --test-threads=1
step "pool crash images" tests_pass 1 "$(bin terrace-pool:test:crash)" --test-threads=2
step "pool kill" tests_pass 1 "$(bin terrace-pool:test:kill)" --exact process_kill_recovers
finish

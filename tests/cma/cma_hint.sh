#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# cma_hint.sh NO_CMA CONFORMANCE: when the kernel refuses cross-memory
# attach, shm says so once per peer (HIXL_LOG=info) and names the fix:
# Yama's ptrace_scope and HIXL_SHM_PTRACER / PR_SET_PTRACER, or a
# container's seccomp profile; ENOSYS names the kernel option.  The data
# checks of the conformance case still pass (owner copies).
set -euo pipefail
no_cma=$1 conformance=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$out"; exit 1; }

HIXL_LOG=info HIXL_TEST_REGIONS=heap "$no_cma" "$conformance" shm put_get >"$out" 2>&1 ||
  fail "put_get under EPERM: exit status $?"
line=$(grep -m1 'shm: process_vm_[a-z]* into peer .*Operation not permitted' "$out") ||
  fail "no line about the refused process_vm_readv/writev"
for want in "through its control thread" "kernel.yama.ptrace_scope" "HIXL_SHM_PTRACER=1" \
  "PR_SET_PTRACER" "seccomp" "hixl_mem_alloc memory is mapped"; do
  grep -qF "$want" <<<"$line" || fail "the EPERM line does not name: $want"
done
# Said once per peer, not once per transfer.
n=$(grep -c 'shm: process_vm_[a-z]* into peer ' "$out")
peers=$(grep -o 'into peer [^ ]*' "$out" | sort -u | wc -l)
[ "$n" -eq "$peers" ] || fail "$n lines for $peers peers"

HIXL_LOG=info HIXL_TEST_REGIONS=heap "$no_cma" --enosys "$conformance" shm put_get >"$out" 2>&1 ||
  fail "put_get under ENOSYS: exit status $?"
line=$(grep -m1 'shm: process_vm_[a-z]* into peer .*Function not implemented' "$out") ||
  fail "no line about process_vm_readv/writev missing"
grep -qF "CONFIG_CROSS_MEMORY_ATTACH" <<<"$line" || fail "the ENOSYS line does not name the kernel option"
echo "cma hint: OK ($n line(s) for $peers peer(s))"

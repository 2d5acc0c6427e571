#!/usr/bin/env bash
# hixl-info as a doctor (docs/observability.md#hixl-info-as-a-doctor), on
# this machine: each section is there; what it says about RDMA agrees with
# /sys/class/infiniband; a context that can only advertise a loopback
# address is a warning with the fix, not a failure; the exit status is 0
# when nothing needed is wrong; the device backends (the one in use, and
# CUDA's and Ascend's libraries, found or not) and libfabric's providers
# (each one in fi_info -l where that is installed; the one hixl would take;
# FI_PROVIDER and HIXL_FABRIC_PROVIDER obeyed).  (The rxe guest checks the
# RDMA half: tests/rxe/suite.sh, case doctor.)  Usage: hixl_info_doctor.sh
# HIXL_INFO [NO_CMA]
set -u
info=$1
# The defaults are what is checked; the cases below set these themselves.
unset HIXL_FABRIC_PROVIDER FI_PROVIDER
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$out"; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT

"$info" >"$out" 2>&1 || fail "exit status $? on this machine"
for want in "a context advertises" "transports offered:" "verbs (RDMA)" "RLIMIT_MEMLOCK" \
            "process_vm_readv between sibling processes" "/dev/shm:" "problem(s)" \
            "device backends" "fabric (libfabric)"; do
  grep -qF "$want" "$out" || fail "no line with \"$want\""
done
if [ -d /sys/class/infiniband ] && [ -n "$(ls /sys/class/infiniband)" ]; then
  for d in /sys/class/infiniband/*; do
    grep -q "^\[.*\] $(basename "$d") port" "$out" || fail "device $(basename "$d") not listed"
  done
else
  grep -qF "no RDMA device: verbs is not offered" "$out" || fail "no RDMA device not said"
fi

# Device backends: the one the library chose, and a line for each runtime.
backend=$(sed -n 's/^\[.*\] device memory: backend \([a-z]*\),.*/\1/p' "$out")
[ -n "$backend" ] || fail "no device memory line"
grep -q "^\[.*\] backend in use: $backend (" "$out" || fail "the backend in use is not $backend"
grep -qE '^\[(ok  |note|warn)\] CUDA: [^ ]*libcuda\.so\.1[ ,]' "$out" || fail "no CUDA driver line"
grep -qE '^\[(ok  |note)\] CUDA runtime: ' "$out" || fail "no CUDA runtime line"
grep -qE '^\[(ok  |note|warn)\] Ascend: [^ ]*libascendcl\.so' "$out" || fail "no Ascend line"
if [ -z "${LD_LIBRARY_PATH:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
  grep -qF "[note] CUDA: libcuda.so.1 not found (" "$out" || fail "a missing libcuda.so.1 not said"
fi

# libfabric: when this build and this machine have it, its providers, and
# the one fabric.c's preference list (or HIXL_FABRIC_PROVIDER) takes.
if grep -q '^\[ok  \] libfabric [0-9]*\.[0-9]* ' "$out"; then
  provs=$(sed -n 's/^\[ok  \] provider \([^:]*\): domains .*/\1/p' "$out")
  [ -n "$provs" ] || grep -q "no libfabric provider offers" "$out" || fail "no provider lines"
  if command -v fi_info >/dev/null; then
    listed=$(fi_info -l 2>/dev/null)
    for p in $provs; do
      for part in ${p//;/ }; do
        grep -q "^$part:" <<<"$listed" || fail "provider $p: $part is not in fi_info -l"
      done
    done
  fi
  pick=""
  for p in efa cxi "verbs;ofi_rxm" "tcp;ofi_rxm" tcp shm; do
    if grep -qxF "$p" <<<"$provs"; then pick=$p; break; fi
  done
  if [ -n "$pick" ]; then
    grep -qF "[ok  ] fabric would use $pick (the first offered" "$out" || fail "fabric would not use $pick"
  fi
  if grep -qxF shm <<<"$provs"; then
    FI_PROVIDER=shm "$info" >"$out" 2>&1 || fail "FI_PROVIDER=shm: exit status $?"
    [ "$(grep -c '^\[ok  \] provider ' "$out")" -eq 1 ] || fail "FI_PROVIDER=shm: not one provider"
    grep -qF "[ok  ] fabric would use shm (" "$out" || fail "FI_PROVIDER=shm: fabric would not use shm"
    HIXL_FABRIC_PROVIDER=shm "$info" >"$out" 2>&1 || fail "HIXL_FABRIC_PROVIDER=shm: exit status $?"
    grep -qF "[ok  ] fabric would use shm, as HIXL_FABRIC_PROVIDER says" "$out" ||
      fail "HIXL_FABRIC_PROVIDER=shm not obeyed"
  fi
  HIXL_FABRIC_PROVIDER=nosuch "$info" >"$out" 2>&1
  [ $? -eq 1 ] || fail "HIXL_FABRIC_PROVIDER=nosuch did not exit 1"
  grep -qF "[FAIL] HIXL_FABRIC_PROVIDER=nosuch is not among them" "$out" ||
    fail "HIXL_FABRIC_PROVIDER=nosuch not a FAIL"
  FI_PROVIDER=nosuch "$info" >"$out" 2>&1 || fail "FI_PROVIDER=nosuch: exit status $?"
  grep -q '^\[\(warn\|note\)\] no libfabric provider offers .*FI_PROVIDER=nosuch' "$out" ||
    fail "FI_PROVIDER=nosuch: no providers not said"
  grep -qF "fix: FI_PROVIDER limits" "$out" || fail "FI_PROVIDER=nosuch: no fix"
else
  grep -qE '^\[(note|warn)\] (libfabric\.so\.1 not found|this build has no fabric)' "$out" ||
    fail "neither libfabric's version nor why not"
fi

# RLIMIT_MEMLOCK: 1 MiB with CAP_IPC_LOCK (root here) is fine; without it
# (dropped from the bounding set, so the exec'd doctor lacks it) it is a
# note where there is no RDMA device (the guest's doctor case checks the
# FAIL where there is one).
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null && command -v prlimit >/dev/null; then
  prlimit --memlock=1048576:1048576 "$info" >"$out" 2>&1 || fail "memlock 1 MiB as root: exit $?"
  grep -qF "[ok  ] RLIMIT_MEMLOCK is 1024 KiB, but this process has CAP_IPC_LOCK" "$out" ||
    fail "memlock 1 MiB with CAP_IPC_LOCK not said"
  prlimit --memlock=1048576:1048576 setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock \
    "$info" >"$out" 2>&1
  st=$?
  if grep -qF "no RDMA device: verbs is not offered" "$out"; then
    [ $st -eq 0 ] || fail "memlock 1 MiB without RDMA: exit $st"
    grep -qF "[note] RLIMIT_MEMLOCK is 1024 KiB (only RDMA registration pins memory" "$out" ||
      fail "memlock 1 MiB without CAP_IPC_LOCK: no note"
  else
    [ $st -eq 1 ] || fail "memlock 1 MiB with RDMA: exit $st, not 1"
    grep -qF "[FAIL] RLIMIT_MEMLOCK is 1024 KiB" "$out" || fail "memlock 1 MiB with RDMA: no FAIL"
  fi
fi
# CMA refused (NO_CMA: tests/cma/no-cma, a seccomp filter making
# process_vm_readv fail with EPERM, as Yama or a container would): a warning
# that names the fixes, not a failure.
if [ -n "${2:-}" ]; then
  "$2" "$info" >"$out" 2>&1 || fail "under no-cma: exit status $?"
  grep -qF "[warn] process_vm_readv between sibling processes is refused (EPERM" "$out" ||
    fail "refused CMA not warned"
  grep -qF "HIXL_SHM_PTRACER=1" "$out" || fail "refused CMA: no HIXL_SHM_PTRACER fix"
  grep -qF "seccomp profile" "$out" || fail "refused CMA: no seccomp fix"
fi

HIXL_LISTEN=127.0.0.1:0 "$info" >"$out" 2>&1 || fail "a loopback address failed the run"
grep -q '^\[warn\] a context advertises 127.0.0.1:' "$out" || fail "loopback address not warned"
grep -qF "HIXL_LISTEN=<its address>" "$out" || fail "no fix for the loopback address"

"$info" --bogus >"$out" 2>&1
[ $? -eq 2 ] || fail "a bad option did not exit 2"
echo "ok"

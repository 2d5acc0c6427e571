#!/usr/bin/env bash
# hixl-info as a doctor (docs/observability.md#hixl-info-as-a-doctor), on
# this machine: each section is there; what it says about RDMA agrees with
# /sys/class/infiniband; a context that can only advertise a loopback
# address is a warning with the fix, not a failure; the exit status is 0
# when nothing needed is wrong.  (The rxe guest checks the RDMA half:
# tests/rxe/suite.sh, case doctor.)  Usage: hixl_info_doctor.sh HIXL_INFO
set -u
info=$1
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$out"; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT

"$info" >"$out" 2>&1 || fail "exit status $? on this machine"
for want in "a context advertises" "transports offered:" "verbs (RDMA)" "RLIMIT_MEMLOCK" \
            "process_vm_readv between sibling processes" "/dev/shm:" "problem(s)"; do
  grep -qF "$want" "$out" || fail "no line with \"$want\""
done
if [ -d /sys/class/infiniband ] && [ -n "$(ls /sys/class/infiniband)" ]; then
  for d in /sys/class/infiniband/*; do
    grep -q "^\[.*\] $(basename "$d") port" "$out" || fail "device $(basename "$d") not listed"
  done
else
  grep -qF "no RDMA device: verbs is not offered" "$out" || fail "no RDMA device not said"
fi

HIXL_LISTEN=127.0.0.1:0 "$info" >"$out" 2>&1 || fail "a loopback address failed the run"
grep -q '^\[warn\] a context advertises 127.0.0.1:' "$out" || fail "loopback address not warned"
grep -qF "HIXL_LISTEN=<its address>" "$out" || fail "no fix for the loopback address"

"$info" --bogus >"$out" 2>&1
[ $? -eq 2 ] || fail "a bad option did not exit 2"
echo "ok"

#!/usr/bin/env bash
# The soak harness's checks see what they claim to (bench/soak.c): for each
# --inject kind, a short run without faults must FAIL with errors counted by
# that check and by no other; and the same run without injection must PASS.
# Usage: selftest.sh HIXL_SOAK [TRANSPORT]
set -u
soak=$1
transport=${2:-shm}
fail=0
run() {
  "$soak" --transport "$transport" --duration 6 --no-faults --seed 7 --quiet "$@" 2>/dev/null
}
out=$(run)
rc=$?
if [ $rc -ne 0 ] || ! grep -q '^PASS' <<<"$out"; then
  echo "FAIL: a clean run did not pass (rc $rc)"
  echo "$out"
  fail=1
fi
check() { # inject kind, the "errors:" field that must be > 0, one that may be
  local kind=$1 field=$2 also=${3:-none} out rc line n others
  out=$(run --inject "$kind")
  rc=$?
  line=$(grep '^errors:' <<<"$out")
  n=$(sed -n "s/.*$field \([0-9]*\).*/\1/p" <<<"$line")
  # Every other counter of the line must stay 0.
  others=$(sed -e "s/$field [0-9]*//" -e "s/$also [0-9]*//" <<<"$line" | grep -oE '[0-9]+' |
    grep -vc '^0$')
  if [ $rc -ne 1 ] || ! grep -q '^FAIL' <<<"$out" || [ "${n:-0}" -eq 0 ] || [ "$others" -ne 0 ]; then
    echo "FAIL: --inject $kind: rc $rc, '$field' ${n:-missing}, other counters non-zero: $others"
    echo "$out"
    fail=1
  else
    echo "ok: --inject $kind caught: $field $n"
  fi
}
# A broken block is seen by the initiator's reads, and by the target when
# a batch that notifies names it.
check block verify notifications
check notif notifications
check lock invariants
check faa atomics
exit $fail

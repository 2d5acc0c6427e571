#!/usr/bin/env bash
# hixl-perf over verbs beside perftest on the same rxe pair, in the same
# guest boot; prints both and the ratio.  Run it through the Soft-RoCE guest:
#   tests/rxe/rxe-run --share "$PWD" -- bench/verbs-vs-perftest.sh build
# Data flows rxe0 (10.77.0.1) -> rxe1 (10.77.0.2) for both.  Every figure is
# the median of ROUNDS runs, perftest and hixl alternating, because an
# emulated machine drifts by 20% between runs: only the ratio means much.
set -u
build=${1:-build}
rounds=${ROUNDS:-3}
uname -r; cat /sys/devices/system/clocksource/clocksource0/current_clocksource
perf=$build/tools/hixl-perf
export HIXL_TRANSPORTS=verbs HIXL_NET_DEV=rxe0 HIXL_PERF_TARGET_NET_DEV=rxe1
n=300
# Each run is bounded: perftest's single 1 MiB READs can stall on Soft-RoCE
# (the responder's burst overruns the receiving backlog; see docs/verbs.md),
# and a stalled run reports nothing rather than hanging the bench.
pt() { # perftest client against a server on rxe1; prints its result line
  local tool=$1; shift
  timeout 60 "$tool" -d rxe1 -x 1 -F "$@" >/tmp/srv.log 2>&1 &
  sleep 1
  timeout 50 "$tool" -d rxe0 -x 1 -F "$@" 10.77.0.2 2>/dev/null |
    awk '$1 ~ /^[0-9]+$/ && NF >= 4 {print; exit}'
  wait
}
hx() { timeout 120 "$perf" "$@" | awk '$1 ~ /^[0-9]+$/ {print; exit}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
median() { # of the runs that reported; "-" when none did
  tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print NR ? v[int((NR+1)/2)] : "-"}'
}

# name | perftest command (field) | hixl command (field, scale)
rows=(
  "write bandwidth 64 KiB (MB/s)|ib_write_bw -s 65536 -n $n|4|-t put -s 65536 -n $n|5|1000"
  "write bandwidth 1 MiB (MB/s)|ib_write_bw -s 1048576 -n 40|4|-t put -s 1048576 -n 40|5|1000"
  "read bandwidth 64 KiB (MB/s)|ib_read_bw -s 65536 -n $n|4|-t get -s 65536 -n $n|5|1000"
  "read bandwidth 1 MiB (MB/s)|ib_read_bw -s 1048576 -n 40|4|-t get -s 1048576 -n 40|5|1000"
  "8 B put ping-pong, polled (us)|ib_write_lat -s 8 -n 1000|5|-t putpoll -s 8 -n 1000|3|1"
  "8 B put_imm ping-pong vs send (us)|ib_send_lat -s 8 -n 1000|5|-t pingpong -s 8 -n 1000|3|1"
  "fetch-and-add latency (us)|ib_atomic_lat -n 1000|5|-t faa -n 1000|3|1"
  "compare-and-swap latency (us)|ib_atomic_lat -A CMP_AND_SWAP -n 1000|5|-t cas -n 1000|3|1"
)
printf '%-40s %10s %10s %8s   (median of %d)\n' "measure (rxe0 -> rxe1, same boot)" perftest hixl \
  "hixl/pt" "$rounds"
for row in "${rows[@]}"; do
  IFS='|' read -r name pcmd pf hcmd hf scale <<<"$row"
  ps="" hs=""
  for ((r = 0; r < rounds; r++)); do
    # shellcheck disable=SC2086
    ps="$ps $(pt $pcmd | awk -v f="$pf" 'NF {print $f}')"
    # shellcheck disable=SC2086
    hs="$hs $(hx $hcmd | awk -v f="$hf" -v s="$scale" 'NF {print $f * s}')"
  done
  p=$(echo "$ps" | median)
  h=$(echo "$hs" | median)
  printf '%-40s %10s %10s %8s\n' "$name" "$p" "$h" "$(ratio "$h" "$p")"
done
echo "(bandwidth: perftest BW average vs hixl back to back, both from registered buffers;"
echo " latency, half a ping-pong round trip: ib_write_lat vs hixl-perf -t putpoll (a put each"
echo " way, each side spinning on the last word of its own memory), ib_send_lat vs -t pingpong"
echo " (a put_imm each way, seen by the target as a receive completion, like a send);"
echo " ib_atomic_lat and hixl faa/cas: one atomic and its completion)"

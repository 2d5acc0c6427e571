#!/usr/bin/env bash
# hixl-perf over verbs beside perftest on the same rxe pair, in the same
# guest boot; prints both and the ratio.  Run it through the Soft-RoCE guest:
#   tests/rxe/rxe-run --share "$PWD" -- bench/verbs-vs-perftest.sh build
# Data flows rxe0 (10.77.0.1) -> rxe1 (10.77.0.2) for both.
set -u
build=${1:-build}
perf=$build/tools/hixl-perf
export HIXL_TRANSPORTS=verbs HIXL_NET_DEV=rxe0 HIXL_PERF_TARGET_NET_DEV=rxe1
size=65536
n=300
pt() { # perftest client against a server on rxe1; prints its result line
  local tool=$1; shift
  "$tool" -d rxe1 -x 1 -F "$@" >/tmp/srv.log 2>&1 &
  sleep 1
  "$tool" -d rxe0 -x 1 -F "$@" 10.77.0.2 2>/dev/null | awk '$1 ~ /^[0-9]+$/ && NF >= 4 {print; exit}'
  wait
}
hx() { "$perf" "$@" | awk '$1 ~ /^[0-9]+$/ {print; exit}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }

wb=$(pt ib_write_bw -s $size -n $n | awk '{print $4}')         # MB/s average
hb=$(hx -t put -s $size -n $n | awk '{print $5 * 1000}')      # GB/s -> MB/s
rb=$(pt ib_read_bw -s $size -n $n | awk '{print $4}')
gb=$(hx -t get -s $size -n $n | awk '{print $5 * 1000}')
wl=$(pt ib_write_lat -s 8 -n 1000 | awk '{print $5}')          # t_typical (us)
hl=$(hx -t put -s 8 -n 1000 | awk '{print $3}')               # p50 (us)
al=$(pt ib_atomic_lat -n 1000 | awk '{print $5}')
hal=$(hx -t faa -n 1000 | awk '{print $3}')

printf '%-34s %12s %12s %8s\n' "measure (rxe0 -> rxe1, same boot)" perftest hixl "hixl/pt"
printf '%-34s %12s %12s %8s\n' "write bandwidth 64 KiB (MB/s)" "$wb" "$hb" "$(ratio "$hb" "$wb")"
printf '%-34s %12s %12s %8s\n' "read bandwidth 64 KiB (MB/s)" "$rb" "$gb" "$(ratio "$gb" "$rb")"
printf '%-34s %12s %12s %8s\n' "write latency 8 B (us)" "$wl" "$hl" "$(ratio "$hl" "$wl")"
printf '%-34s %12s %12s %8s\n' "fetch-and-add latency (us)" "$al" "$hal" "$(ratio "$hal" "$al")"
echo "(perftest latency: t_typical, half round trip for ib_write_lat; hixl: p50 of one op"
echo " including its completion; bandwidth: perftest BW average vs hixl back to back)"

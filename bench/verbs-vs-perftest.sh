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
wb1=$(pt ib_write_bw -s 1048576 -n 40 | awk '{print $4}')
hb1=$(hx -t put -s 1048576 -n 40 | awk '{print $5 * 1000}')
rb=$(pt ib_read_bw -s $size -n $n | awk '{print $4}')
gb=$(hx -t get -s $size -n $n | awk '{print $5 * 1000}')
rb1=$(pt ib_read_bw -s 1048576 -n 40 | awk '{print $4}')
gb1=$(hx -t get -s 1048576 -n 40 | awk '{print $5 * 1000}')
wl=$(pt ib_write_lat -s 8 -n 1000 | awk '{print $5}')          # t_typical (us): half RTT
hpl=$(hx -t pingpong -s 8 -n 1000 | awk '{print $3}')         # p50 (us): half RTT
hl=$(hx -t put -s 8 -n 1000 | awk '{print $3}')               # p50 (us): put + its ACK
al=$(pt ib_atomic_lat -n 1000 | awk '{print $5}')
hal=$(hx -t faa -n 1000 | awk '{print $3}')

printf '%-40s %10s %10s %8s\n' "measure (rxe0 -> rxe1, same boot)" perftest hixl "hixl/pt"
printf '%-40s %10s %10s %8s\n' "write bandwidth 64 KiB (MB/s)" "$wb" "$hb" "$(ratio "$hb" "$wb")"
printf '%-40s %10s %10s %8s\n' "write bandwidth 1 MiB (MB/s)" "$wb1" "$hb1" "$(ratio "$hb1" "$wb1")"
printf '%-40s %10s %10s %8s\n' "read bandwidth 64 KiB (MB/s)" "$rb" "$gb" "$(ratio "$gb" "$rb")"
printf '%-40s %10s %10s %8s\n' "read bandwidth 1 MiB (MB/s)" "$rb1" "$gb1" "$(ratio "$gb1" "$rb1")"
printf '%-40s %10s %10s %8s\n' "8 B ping-pong half round trip (us)" "$wl" "$hpl" "$(ratio "$hpl" "$wl")"
printf '%-40s %10s %10s %8s\n' "8 B put + completion vs 2 x half RTT" "$(awk -v a="$wl" 'BEGIN{print 2*a}')" "$hl" "$(ratio "$hl" "$(awk -v a="$wl" 'BEGIN{print 2*a}')")"
printf '%-40s %10s %10s %8s\n' "fetch-and-add latency (us)" "$al" "$hal" "$(ratio "$hal" "$al")"
echo "(perftest: ib_write_lat t_typical is half a ping-pong round trip, as is hixl-perf"
echo " -t pingpong (put_imm each way); ib_atomic_lat and hixl faa: one atomic and its"
echo " completion; bandwidth: perftest BW average vs hixl back to back, registered buffers)"

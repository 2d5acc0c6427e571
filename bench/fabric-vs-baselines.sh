#!/usr/bin/env bash
# hixl over the fabric transport (libfabric tcp;ofi_rxm) between two hosts
# (network namespaces joined by a veth pair), beside libfabric's own
# fi_pingpong with the same provider and UCX's ucx_perftest over tcp, in the
# same run.  Debian packages no fabtests (no fi_rma_bw), so the baselines
# are fi_pingpong (two-sided messages, one at a time) and UCX.
#   tests/netns/netns-run -- bench/fabric-vs-baselines.sh build
# Each figure is the median of ROUNDS runs, the tools alternating; only
# ratios mean much on this noisy machine.  Needs libfabric-bin and ucx-utils.
set -u
build=${1:-build}
rounds=${ROUNDS:-3}
read -r -a hosts <<<"$HIXL_NETNS_HOSTS"
h2=${hosts[1]}
addr2=$HIXL_NETNS_ADDR_2
dev1=$(ip -o link | awk -F': ' '/hxh/{print $2}' | cut -d@ -f1)
dev2=$(ip netns exec "$h2" ip -o link | awk -F': ' '/hxh/{print $2}' | cut -d@ -f1)
prov="tcp;ofi_rxm"
export HIXL_TRANSPORTS=fabric HIXL_FABRIC_PROVIDER=$prov

hx() { # hixl-perf client against a server on host 2; prints its result row
  local out=/tmp/fb-hs.$$
  ip netns exec "$h2" env HIXL_TRANSPORTS=fabric HIXL_FABRIC_PROVIDER="$prov" \
    timeout 120 "$build/tools/hixl-perf" --server >"$out" 2>&1 &
  local a=""
  for _ in $(seq 100); do
    a=$(sed -n 's/^hixl-perf server: \([^ ]*\).*/\1/p' "$out"); [ -n "$a" ] && break; sleep 0.1
  done
  timeout 100 "$build/tools/hixl-perf" --client "$a" "$@" | awk '$1 ~ /^[0-9]+$/ {print; exit}'
  wait
  rm -f "$out"
}
fp() { # fi_pingpong SIZE: MB/s and usec/xfer
  ip netns exec "$h2" timeout 60 fi_pingpong -p "$prov" -e rdm -I "$2" -S "$1" >/dev/null 2>&1 &
  sleep 0.5
  timeout 50 fi_pingpong -p "$prov" -e rdm -I "$2" -S "$1" "$addr2" 2>/dev/null |
    awk '$1 ~ /^[0-9]/ && NF >= 8 {print; exit}'
  wait
}
ux() { # ucx_perftest client: the Final line
  ip netns exec "$h2" env UCX_TLS=tcp UCX_NET_DEVICES="$dev2" timeout 60 ucx_perftest \
    >/dev/null 2>&1 &
  sleep 0.7
  UCX_TLS=tcp UCX_NET_DEVICES="$dev1" timeout 50 ucx_perftest "$addr2" "$@" 2>/dev/null |
    awk '/^Final:/ {print; exit}'
  wait
}
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{v[NR]=$1} END {print NR ? v[int((NR+1)/2)] : "-"}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0 && a != "-") printf "%.2f", a / b; else print "-" }'; }

declare -A S
add() { S[$1]="${S[$1]:-} $2"; }
for ((r = 0; r < rounds; r++)); do
  add hx_put64k "$(hx -t put -s 64k -n 2000 --bw | awk '{print $5 * 1000}')"
  add hx_put1m "$(hx -t put -s 1m -n 300 --bw | awk '{print $5 * 1000}')"
  add hx_get1m "$(hx -t get -s 1m -n 300 --bw | awk '{print $5 * 1000}')"
  add hx_lat "$(hx -t putpoll -s 8 -n 3000 | awk '{print $3}')"
  add hx_pp "$(hx -t pingpong -s 8 -n 3000 | awk '{print $3}')"
  add fp_1m "$(fp 1048576 500 | awk '{print $6}')"
  add fp_64k "$(fp 65536 2000 | awk '{print $6}')"
  add fp_lat "$(fp 8 3000 | awk '{print $7}')"
  add ux_put64k "$(ux -t ucp_put_bw -s 65536 -n 2000 | awk '{print $6 * 1.048576}')"
  add ux_put1m "$(ux -t ucp_put_bw -s 1048576 -n 300 | awk '{print $6 * 1.048576}')"
  add ux_get1m "$(ux -t ucp_get -s 1048576 -n 300 | awk '{print $6 * 1.048576}')"
  add ux_lat "$(ux -t ucp_put_lat -s 8 -n 3000 | awk '{print $3}')"
  add ux_tag "$(ux -t tag_lat -s 8 -n 3000 | awk '{print $3}')"
done
m() { echo "${S[$1]:-}" | median; }
printf '%-34s %10s %12s %8s %10s %8s   (median of %d; %s between namespaces)\n' \
  measure hixl fi_pingpong ratio "UCX tcp" ratio "$rounds" "$prov"
row() { # name hixl-key fp-key ux-key higher-is-better
  local h f u
  h=$(m "$2"); f=$([ -n "$3" ] && m "$3" || echo -); u=$([ -n "$4" ] && m "$4" || echo -)
  if [ "$5" = 1 ]; then
    printf '%-34s %10s %12s %8s %10s %8s\n' "$1" "$h" "$f" "$(ratio "$h" "$f")" "$u" "$(ratio "$h" "$u")"
  else # latency: baseline / hixl would read upside down; print hixl / baseline
    printf '%-34s %10s %12s %8s %10s %8s\n' "$1" "$h" "$f" "$(ratio "$h" "$f")" "$u" "$(ratio "$h" "$u")"
  fi
}
row "put 64 KiB (MB/s)" hx_put64k fp_64k ux_put64k 1
row "put 1 MiB (MB/s)" hx_put1m fp_1m ux_put1m 1
row "get 1 MiB (MB/s)" hx_get1m "" ux_get1m 1
row "8 B put, polled, half RTT (us)" hx_lat fp_lat ux_lat 0
row "8 B put_imm ping-pong, half (us)" hx_pp fp_lat ux_tag 0
echo "(bandwidth: hixl-perf -w 64 window vs fi_pingpong's one-at-a-time messages and"
echo " ucx_perftest ucp_put_bw / ucp_get; latency columns are hixl / baseline, lower is better:"
echo " putpoll vs fi_pingpong's usec/xfer and ucp_put_lat; pingpong vs fi_pingpong and tag_lat)"

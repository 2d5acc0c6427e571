#!/usr/bin/env bash
# Runs inside tests/netns/netns-run (host 1; the harness's targets on host 2):
# hixl across two "hosts" (network namespaces joined by a veth pair through a
# bridge) over the fabric transport, with the tcp provider (tcp;ofi_rxm),
# then the shm provider inside one namespace.  Usage: suite.sh BUILD_DIR
set -u
build=$1
fail=0
run() {
  local name=$1
  shift
  local t0
  t0=$(date +%s)
  if "$@" >"/tmp/netns-${name////_}.log" 2>&1; then
    echo "ok   netns/$name ($(( $(date +%s) - t0 )) s)"
  else
    echo "FAIL netns/$name ($(( $(date +%s) - t0 )) s)"
    tail -n 30 "/tmp/netns-${name////_}.log"
    fail=1
  fi
}
read -r -a hosts <<<"$HIXL_NETNS_HOSTS"
# The two hosts really are apart: different network namespaces, and host 2's
# address is not one of ours.
# shellcheck disable=SC2317 # called through run ("$@")
apart() {
  [ "$(readlink /proc/self/ns/net)" != "$(ip netns exec "${hosts[1]}" readlink /proc/self/ns/net)" ] &&
    ! ip -o addr | grep -q " $HIXL_NETNS_ADDR_2/"
}
run apart apart
# shm refuses another host, saying why; with fabric allowed too it falls back.
run choice "$build/tests/conformance" shm choice
export HIXL_TRANSPORTS=fabric HIXL_FABRIC_PROVIDER="tcp;ofi_rxm"
for c in put_get batch notif_order faa cas_lock fence connect_churn remap flood choice; do
  run "fabric-tcp/$c" "$build/tests/conformance" fabric "$c"
done
run fabric-tcp/badinput "$build/tests/badinput" fabric
run fabric-tcp/peer_death "$build/tests/peer_death" fabric
for c in dirs batch notif atomic badinput; do
  run "fabric-tcp/device-$c" env HIXL_DEVICE=emulated "$build/tests/device" fabric "$c"
done
# hixl-perf: the target on host 2, the initiator here.
# shellcheck disable=SC2317 # called through run ("$@")
perf_pair() {
  local out=/tmp/netns-perf-server.out
  # Emptied before the server starts: the loop below must not read an
  # earlier run's address while the background job has not yet opened
  # the file (seen on a busy machine: the client went to a dead port and
  # the wait below hung on a server that never got its client).
  : >"$out"
  ip netns exec "${hosts[1]}" "$build/tools/hixl-perf" --server >"$out" 2>&1 &
  local spid=$!
  local addr=""
  for _ in $(seq 1 100); do
    addr=$(sed -n 's/^hixl-perf server: \([^ ]*\).*/\1/p' "$out")
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { kill "$spid"; return 1; }
  "$build/tools/hixl-perf" --client "$addr" "$@"
  local rc=$?
  [ "$rc" -eq 0 ] || kill "$spid" 2>/dev/null # no client will come for it
  wait "$spid" || rc=1
  return "$rc"
}
run fabric-tcp/hixl-perf-put perf_pair --quick -t put
run fabric-tcp/hixl-perf-get perf_pair --quick -t get
run fabric-tcp/hixl-perf-faa perf_pair --quick -t faa
# The examples with their ranks on both hosts: ps_train's rank 0 (the
# parameter server and rendezvous) on host 2, workers here.
# shellcheck disable=SC2317 # called through run ("$@")
ps_train() {
  local port=$((20000 + RANDOM % 20000))
  ip netns exec "${hosts[1]}" env RANK=0 WORLD_SIZE=3 MASTER_ADDR="$HIXL_NETNS_ADDR_2" \
    MASTER_PORT="$port" "$build/examples/hixl-ps-train" --params 4096 --steps 8 &
  local p0=$!
  RANK=1 WORLD_SIZE=3 MASTER_ADDR="$HIXL_NETNS_ADDR_2" MASTER_PORT=$port \
    "$build/examples/hixl-ps-train" --params 4096 --steps 8 &
  local p1=$!
  RANK=2 WORLD_SIZE=3 MASTER_ADDR="$HIXL_NETNS_ADDR_2" MASTER_PORT=$port \
    "$build/examples/hixl-ps-train" --params 4096 --steps 8
  local rc=$?
  wait "$p0" || rc=1
  wait "$p1" || rc=1
  return "$rc"
}
run fabric-tcp/ps_train ps_train
# shellcheck disable=SC2317 # called through run ("$@")
kv() {
  local out=/tmp/netns-kv-decode.out
  ip netns exec "${hosts[1]}" "$build/examples/hixl-kv-transfer" --role decode --requests 12 \
    --seq-len 16:160 --blocks 128 >"$out" 2>&1 &
  local dpid=$!
  local addr=""
  for _ in $(seq 1 100); do
    addr=$(sed -n 's/^decode listening at \(.*\)$/\1/p' "$out")
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || { kill "$dpid"; cat "$out"; return 1; }
  "$build/examples/hixl-kv-transfer" --role prefill --connect "$addr" --requests 12 \
    --seq-len 16:160 --blocks 128
  local rc=$?
  wait "$dpid" || rc=1
  cat "$out"
  return "$rc"
}
run fabric-tcp/kv_transfer kv
# The shm provider: one host (both sides here).
unset HIXL_TEST_TARGET_NETNS
export HIXL_FABRIC_PROVIDER=shm HIXL_TEST_LISTEN=127.0.0.1:0
for c in put_get batch notif_order faa fence flood; do
  run "fabric-shm/$c" "$build/tests/conformance" fabric "$c"
done
exit "$fail"

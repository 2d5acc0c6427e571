#!/usr/bin/env bash
# Runs inside the rxe-run guest: the conformance suite (also with 4 QPs per
# peer, with QPs connected by librdmacm, and with the event-mode progress
# thread), the bad-input matrix, the
# 4-rank world, the peer-death test and the examples over the verbs transport,
# initiator on rxe0 and target on rxe1, and hostile peers (tests/hostile).
# Usage: suite.sh BUILD_DIR [CASE...]: conformance cases, and hostile/NAME
# for hostile ones (control-slowloris, control-cap, control-emfile,
# verbs_data, verbs_data:CASE); a list of hostile cases alone runs only them.
set -u
build=$1
shift
export HIXL_TRANSPORTS=verbs HIXL_NET_DEV=rxe0 HIXL_TEST_TARGET_NET_DEV=rxe1
cases=""
hostile=""
doctor=0
for c in "$@"; do
  case $c in
    hostile/*) hostile="$hostile ${c#hostile/}" ;;
    doctor) doctor=1 ;;
    *) cases="$cases $c" ;;
  esac
done
if [ $# -eq 0 ]; then
  cases="put_get batch notif_order faa cas_lock fence connect_churn remap flood sleep bounce_shared qp_budget qp_lazy qp_lru memlock pin_budget wait_budget qp_rate"
  hostile="control-slowloris control-cap control-emfile verbs_data"
  doctor=1
fi
fail=0
run() {
  local name=$1
  shift
  local t0
  t0=$(date +%s)
  if "$@" >"/tmp/$name.log" 2>&1; then
    echo "ok   verbs/$name ($(( $(date +%s) - t0 )) s)"
  else
    echo "FAIL verbs/$name ($(( $(date +%s) - t0 )) s)"
    tail -n 30 "/tmp/$name.log"
    fail=1
  fi
}
ibv_devinfo -d rxe0 | grep -E "state|active_mtu" | head -2
# The fabric itself: an RC ping-pong rxe1 -> rxe0 that must cross the wire.
# shellcheck disable=SC2317 # called through run ("$@")
pp() {
  ibv_rc_pingpong -d rxe0 -g 1 -n 200 >/tmp/pp.log 2>&1 &
  sleep 1
  ibv_rc_pingpong -d rxe1 -g 1 -n 200 10.77.0.1 && wait $! &&
    [ "$(cat /sys/class/net/veth0/statistics/rx_packets)" -ge 400 ]
}
run pingpong pp
# hixl-info as a doctor where there is RDMA (docs/observability.md): both
# Soft-RoCE devices with an active port and a RoCE v2 IPv4 GID, the port
# verbs would use (HIXL_NET_DEV=rxe0), exit 0; a HIXL_NET_DEV that names no
# active port is a problem (exit 1) that says so.
# shellcheck disable=SC2317 # called through run ("$@")
doctor_check() {
  local o=/tmp/doctor.out
  if ! "$build/tools/hixl-info" >"$o" 2>&1; then cat "$o"; return 1; fi
  cat "$o"
  grep -Eq '^\[ok  \] rxe0 port 1: 4: ACTIVE, Ethernet, GID index [0-9]+ 0000:0000:0000:0000:0000:ffff:' "$o" || return 1
  grep -Eq '^\[ok  \] rxe1 port 1: 4: ACTIVE' "$o" || return 1
  grep -q 'verbs would use rxe0 port 1' "$o" || return 1
  if HIXL_NET_DEV=nosuch "$build/tools/hixl-info" >"$o" 2>&1; then cat "$o"; return 1; fi
  grep -q '^\[FAIL\] HIXL_NET_DEV=nosuch names no active port' "$o" || { cat "$o"; return 1; }
  # Where there is RDMA, a 1 MiB RLIMIT_MEMLOCK without CAP_IPC_LOCK (out of
  # the bounding set, so the exec'd doctor lacks it) is a FAIL with the fix.
  if command -v setpriv >/dev/null && command -v prlimit >/dev/null; then
    if prlimit --memlock=1048576:1048576 setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock \
      "$build/tools/hixl-info" >"$o" 2>&1; then cat "$o"; return 1; fi
    grep -q '^\[FAIL\] RLIMIT_MEMLOCK is 1024 KiB: a verbs context cannot even pin' "$o" ||
      { cat "$o"; return 1; }
    grep -qF 'fix: ulimit -l unlimited' "$o" || { cat "$o"; return 1; }
  else
    echo "doctor: memlock FAIL not checked (no setpriv/prlimit in the guest)"
  fi
}
if [ $doctor -eq 1 ]; then run doctor doctor_check; fi
for c in $cases; do
  run "$c" "$build/tests/conformance" verbs "$c"
done
if [ $# -eq 0 ]; then
  # Four QPs per peer: striped transfers and batches, notifications still in
  # order behind their data.
  for c in batch notif_order flood bounce_shared; do
    run "$c+4qps" env HIXL_VERBS_QPS=4 "$build/tests/conformance" verbs "$c"
  done
  # QPs made in the handshake (HIXL_VERBS_LAZY=0; the default makes them
  # on first use, docs/scale.md "Lazy QPs").
  for c in put_get batch notif_order faa fence flood; do
    run "$c+eager" env HIXL_VERBS_LAZY=0 "$build/tests/conformance" verbs "$c"
  done
  run "batch+eager+4qps" env HIXL_VERBS_LAZY=0 HIXL_VERBS_QPS=4 "$build/tests/conformance" verbs batch
  # QPs connected by librdmacm instead of in-band (one QP, then four).
  for c in put_get connect_churn; do
    run "$c+rdmacm" env HIXL_VERBS_CM=rdmacm "$build/tests/conformance" verbs "$c"
  done
  run "batch+rdmacm+4qps" env HIXL_VERBS_CM=rdmacm HIXL_VERBS_QPS=4 \
    "$build/tests/conformance" verbs batch
  # The registration cache's monitor descheduled for 200 ms after reading an
  # unmap event: a lookup must still never use the old registration.
  run "remap+slow_monitor" env HIXL_VERBS_RCACHE_TEST_DELAY_US=200000 \
    "$build/tests/conformance" verbs remap
  # Every wait mode (docs/waiting.md): pure spinning and sleeping at once.
  for m in spin sleep; do
    for c in notif_order fence; do
      run "$c+wait=$m" env HIXL_WAIT=$m "$build/tests/conformance" verbs "$c"
    done
  done
  run "sleep+wait=sleep" env HIXL_WAIT=sleep "$build/tests/conformance" verbs sleep
  # The progress thread in event mode (sleeps on the send CQ's channel).
  for c in fence flood; do
    run "$c+event_progress" env HIXL_PROGRESS_THREAD=2 "$build/tests/conformance" verbs "$c"
  done
fi
# Hostile peers (issue 13; tests/hostile, docs/testing.md).  The control-port
# floods of control_flood.c against a verbs-only target on rxe1 and a
# legitimate verbs peer on rxe0 (hostile_verbs_flood: the same program,
# transports swapped at link time); verbs_data: attackers with QPs of their
# own that never finish the handshake, and an authenticated one with forged
# NIC keys (every case checks the target stays up, serves a legitimate peer
# meanwhile and keeps its protected bytes).
for h in $hostile; do
  case $h in
    control-*)
      run "hostile-$h" env HIXL_HOSTILE_TRANSPORTS=verbs "$build/tests/hostile/hostile_verbs_flood" \
        "${h#control-}" "$(dirname "$0")/../fuzz/seeds_wire/hello.bin" ;;
    verbs_data) run "hostile-$h" "$build/tests/hostile/hostile_verbs_data" ;;
    verbs_data:*) run "hostile-$h" "$build/tests/hostile/hostile_verbs_data" "${h#verbs_data:}" ;;
    *) echo "FAIL hostile/$h: no such case"; fail=1 ;;
  esac
done
# Only hostile cases asked for: nothing else.
[ -n "$cases" ] || exit $fail
# Device memory (emulated backend) over verbs: registered through its NIC
# view (the peer-memory path) on both sides; staged through bounce buffers on
# our side while the target's NIC reaches its own; and with no NIC access to
# device memory anywhere (device regions refused at unpack, staging here).
for c in dirs batch notif atomic badinput; do
  run "device-$c" env HIXL_DEVICE=emulated "$build/tests/device" verbs "$c"
done
for c in dirs batch atomic; do
  run "device-$c+staged" env HIXL_DEVICE=emulated HIXL_DEVICE_RDMA=0 \
    HIXL_TEST_TARGET_DEVICE_RDMA=1 "$build/tests/device" verbs "$c"
done
run "device-dirs+no_rdma" env HIXL_DEVICE=emulated HIXL_DEVICE_RDMA=0 \
  "$build/tests/device" verbs dirs
run world "$build/tests/conformance" verbs world  # 4 ranks, all on rxe0
# The same with room for one QP per rank: every rank talks to 3 others, all
# full at once, asking each other across (QP_WAIT, idle pairs reclaimed).
run world+budget1 env HIXL_VERBS_MAX_QPS=1 "$build/tests/conformance" verbs world
# A rank killed and started again joins the running world (lazy QPs to the
# newcomer, the old rank's pairs lost).
run world_elastic "$build/tests/conformance" verbs world_elastic
run badinput "$build/tests/badinput" verbs
run peer_death "$build/tests/peer_death" verbs
# hixl-perf over verbs (target on rxe1): the tests the shm suite runs, and
# the two-host roles.
for t in "put_imm" "put_batch -b 16" "get_batch -b 16" "putpoll -s 64" "cas"; do
  # shellcheck disable=SC2086
  run "hixl-perf-${t%% *}" env HIXL_PERF_TARGET_NET_DEV=rxe1 "$build/tools/hixl-perf" --quick -t $t
done
run hixl-perf-server-client "$(dirname "$0")/../tools/perf_server_client.sh" "$build/tools/hixl-perf"
# A notification's wake-up from sleep and the idle cost over verbs (its
# figures in the log; docs/waiting.md).
run wake_lat env HIXL_TRANSPORTS=verbs "$build/tests/hixl-wake-lat" --quick && cat /tmp/wake_lat.log
# The soak harness over verbs (bench/soak.c, docs/reliability.md):
# initiators on rxe0, targets on rxe1, killed and stopped for a minute.
# With a 10 s timeout: the guest runs about 170x slower than the host, and
# with a 3 s one a heartbeat thread starved for a second turned a 1.8 s
# stop into a legitimate 3 s of silence (a loss the soak calls false).
run soak "$build/tests/hixl-soak" --transport verbs --duration 60 --timeout-ms 10000 --quiet \
  --env-target HIXL_NET_DEV=rxe1 && tail -n 14 /tmp/soak.log
run demo "$build/examples/hixl-demo"
run ps_train "$build/examples/hixl-ps-train" --launch 3 --params 4096 --steps 8
run kv_transfer "$build/examples/hixl-kv-transfer" --requests 12 --seq-len 16:160 --blocks 128
exit $fail

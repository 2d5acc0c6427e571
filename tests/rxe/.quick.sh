#!/bin/bash
cd /work/main
export HIXL_TRANSPORTS=verbs HIXL_NET_DEV=rxe0 HIXL_TEST_TARGET_NET_DEV=rxe1
for i in 1 2; do
  /opt/bin/ip neigh
  t0=$(date +%s)
  HIXL_VERBS_CM=rdmacm timeout 300 gbuild/tests/conformance verbs connect_churn > /tmp/q.log 2>&1 && echo "ok churn+rdmacm $(( $(date +%s) - t0 ))s" || { echo "FAIL churn+rdmacm $(( $(date +%s) - t0 ))s"; tail -5 /tmp/q.log; }
done
rping -s -a 10.77.0.2 -C 3 -v & sleep 1; rping -c -a 10.77.0.2 -I 10.77.0.1 -C 3 -v; wait

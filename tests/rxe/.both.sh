#!/bin/bash
cd /work/main
export HIXL_TRANSPORTS=verbs HIXL_NET_DEV=rxe0 HIXL_TEST_TARGET_NET_DEV=rxe1
t0=$(date +%s)
HIXL_VERBS_CM=rdmacm timeout 300 gbuild/tests/conformance verbs connect_churn > /tmp/q.log 2>&1 && echo "ok first-thing churn+rdmacm $(( $(date +%s) - t0 ))s" || { echo "FAIL churn+rdmacm"; tail -5 /tmp/q.log; }
bench/verbs-vs-perftest.sh gbuild
tests/rxe/suite.sh gbuild

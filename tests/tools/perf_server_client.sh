#!/usr/bin/env bash
# hixl-perf's two-host roles on one host: a --server, then a --client that
# runs several tests against it (put_batch, pingpong, putpoll, faa) one
# server session each.  Both must exit 0 (the client checks its numbers and
# that the data moved; the server that it was told to stop).
set -euo pipefail
perf=$1
out=$(mktemp)
trap 'rm -f "$out"; kill "$spid" 2>/dev/null || true' EXIT
for t in "put_batch -b 16" "pingpong" "putpoll -s 64" "faa"; do
  : >"$out"
  "$perf" --server --region 8m >"$out" &
  spid=$!
  for _ in $(seq 200); do
    grep -q "hixl-perf server:" "$out" && break
    sleep 0.05
  done
  addr=$(awk '/hixl-perf server:/ {print $3; exit}' "$out")
  [ -n "$addr" ] || { echo "the server printed no address"; cat "$out"; exit 1; }
  # shellcheck disable=SC2086
  "$perf" --client "$addr" --quick -t $t
  wait "$spid" || { echo "the server failed"; exit 1; }
done
echo "server/client: ok"

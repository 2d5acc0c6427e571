#!/usr/bin/env bash
# One-sided vs two-sided parameter server, end to end (examples/ps_train.c,
# `hixl-ps-train --launch 4`): RUNS runs per row, medians of the ratios the
# program prints from each run (one-sided / two-sided, same run), on a quiet
# machine and beside two busy processes (`yes > /dev/null`), at the default
# model size and at 4,000,000 parameters; and each side's waiting waste, the
# step time over the work (workers' compute + update + data movement, see
# print_step in ps_train.c).  docs/performance.md has a table.
#
# Usage: bench/ps_train_table.sh BUILD_DIR [RUNS]
set -euo pipefail
build=${1:?usage: $0 BUILD_DIR [RUNS]}
runs=${2:-5}
exe="$build/examples/hixl-ps-train"
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
row() { # label, load (0/2), args...
  local label=$1 load=$2
  shift 2
  local pids=() move=() steps=() os=() ts=() ow=() tw=()
  for ((i = 0; i < load; i++)); do
    yes >/dev/null &
    pids+=($!)
  done
  for ((r = 0; r < runs; r++)); do
    out=$("$exe" --launch 4 "$@" 2>&1)
    line=$(grep "one-sided / two-sided" <<<"$out")
    move+=("$(sed -E 's/.*data movement ([0-9.]+)x.*/\1/' <<<"$line")")
    steps+=("$(sed -E 's/.*whole steps ([0-9.]+)x.*/\1/' <<<"$line")")
    os+=("$(sed -nE 's/^one-sided: [0-9.]+ s, ([0-9.]+) ms\/step.*/\1/p' <<<"$out")")
    ts+=("$(sed -nE 's/^two-sided[^:]*: [0-9.]+ s, ([0-9.]+) ms\/step.*/\1/p' <<<"$out")")
    ow+=("$(sed -nE 's/^one-sided step:.*\((-?[0-9.]+)% over the work\)/\1/p' <<<"$out")")
    tw+=("$(sed -nE 's/^two-sided step:.*\((-?[0-9.]+)% over the work\)/\1/p' <<<"$out")")
  done
  for p in "${pids[@]}"; do kill "$p"; done
  wait 2>/dev/null || true
  printf '| %-34s | %8s | %8s | %8s | %8s | %8s | %8s |\n' "$label" \
    "$(printf '%s\n' "${os[@]}" | median)" "$(printf '%s\n' "${ts[@]}" | median)" \
    "$(printf '%s\n' "${steps[@]}" | median)x" "$(printf '%s\n' "${move[@]}" | median)x" \
    "$(printf '%s\n' "${ow[@]}" | median)%" "$(printf '%s\n' "${tw[@]}" | median)%"
}
echo "hixl-ps-train --launch 4, $runs runs per row, medians (HIXL_WAIT=${HIXL_WAIT:-adaptive})"
printf '| %-34s | %8s | %8s | %8s | %8s | %8s | %8s |\n' "case" "1s ms" "2s ms" "steps" "data" \
  "1s wait" "2s wait"
echo "|---|---|---|---|---|---|---|"
row "default size, quiet" 0
row "default size, 2 busy processes" 2
row "4,000,000 params, quiet" 0 --params 4000000
row "4,000,000 params, 2 busy processes" 2 --params 4000000

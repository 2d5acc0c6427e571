#!/usr/bin/env bash
# One command on a fresh Debian machine: install what is missing, build, and
# run the whole test suite:
#   0. lint (scripts/lint.sh): every C/C++ file against .clang-format, every
#      shell script (*.sh and sh/bash shebangs) through shellcheck;
#   1. gcc, warnings as errors (every suite runs two tests at a time,
#      docs/testing.md; rxe and netns alone): unit, conformance (self, shm,
#      fabric on one host), device memory, bad input, peer death, header,
#      tools, examples, the Python package (pytest, Debian's
#      /usr/bin/python3), torchrun; the two-host suite in network
#      namespaces (fabric; root); then the Soft-RoCE guest (verbs);
#   2. the same suite under ASan + UBSan; then a minute of the soak harness
#      per transport (shm, fabric) in that build;
#   3. clang, warnings as errors, the suite again; then under ThreadSanitizer;
#   4. install into a staging prefix and build out-of-tree programs with
#      pkg-config against it; import the Python package installed there and
#      the one pip builds through meson-python;
#   5. a short libFuzzer run of every parser of peer bytes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
out=${HIXL_TEST_BUILD:-build-test}
# Each step prints when it starts (UTC), so a slow one shows in CI's log:
# the whole must stay under an hour (CI allows 90 minutes).
step() { printf '\n=== %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }

step "lint"
scripts/lint.sh

step "gcc build + suite"
rm -rf "$out/gcc" && meson setup "$out/gcc" -Dwerror=true >/dev/null
ninja -C "$out/gcc" >/dev/null
meson test -C "$out/gcc" --print-errorlogs --num-processes 2 --no-suite rxe

step "verbs on Soft-RoCE (qemu guest, one boot)"
meson test -C "$out/gcc" --print-errorlogs --suite rxe

step "ASan + UBSan suite"
rm -rf "$out/asan" && meson setup "$out/asan" -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false \
  >/dev/null
ninja -C "$out/asan" >/dev/null
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C "$out/asan" --print-errorlogs --num-processes 2 --timeout-multiplier 3 \
  --no-suite rxe --no-suite netns

# The soak harness (bench/soak.c, docs/reliability.md), short: a minute
# per transport of kills, stops and restarts with every byte checked, under
# ASan so that LeakSanitizer checks every process that exits at the end.
# Its seed is printed; a failure prints the command that replays it.
step "soak, short (ASan + LSan): shm and fabric, 60 s each"
for t in shm fabric; do
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "$out/asan/tests/hixl-soak" --transport "$t" --duration 60 --quiet
done

step "clang build + suite"
rm -rf "$out/clang" && CC=clang CXX=clang++ meson setup "$out/clang" -Dwerror=true -Dfuzz=true >/dev/null
ninja -C "$out/clang" >/dev/null
meson test -C "$out/clang" --print-errorlogs --num-processes 2 --no-suite rxe --no-suite netns

step "ThreadSanitizer suite (clang)"
rm -rf "$out/tsan" && CC=clang CXX=clang++ meson setup "$out/tsan" -Db_sanitize=thread \
  -Db_lundef=false >/dev/null
ninja -C "$out/tsan" >/dev/null
# Not the fabric suite: there the provider's own threads write region memory
# with recvmsg for a peer process, and the target reads it after a command
# that peer sent over a pipe; TSan sees the write and the read but not the
# order another process imposed, and reports a race on every put (the same
# data moves checked in every other build; docs/testing.md).  Nor does TSan
# see libfabric's own synchronization (not built with TSan), so its threads
# reading buffers handed over by fi_writemsg look racy too.
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
meson test -C "$out/tsan" --print-errorlogs --num-processes 2 --timeout-multiplier 3 \
  --no-suite rxe --no-suite netns --no-suite fabric

step "install + pkg-config consumer"
tests/install/check.sh "$out/gcc"

step "fuzz (30 s per parser)"
for f in wire rkey; do
  fz="$out/clang/tests/fuzz_$f"
  [ -x "$fz" ] || { echo "fuzz_$f was not built"; exit 1; }
  corpus=$(mktemp -d)
  if ! "$fz" -max_total_time=30 "$corpus" "tests/fuzz/seeds_$f" >"$corpus.log" 2>&1; then
    tail -n 40 "$corpus.log"
    echo "fuzz_$f failed"
    exit 1
  fi
  grep -E "DONE" "$corpus.log" | tail -n 1
  rm -rf "$corpus" "$corpus.log"
done
echo
echo "all tests passed ($(date -u +%H:%M:%S))"

#!/usr/bin/env bash
# The CUDA check, for a machine with an NVIDIA GPU (the project's `device`
# tool lends one to some sessions).  Run from the repository root with a
# build made here (the GPU machine has no compiler packages or network):
#
#   run(command="tests/device/cuda-check.sh build", carry=["build"])
#
# libhixl finds libcuda.so.1 at run time; cmocka is carried along in
# build/carry-libs (copied there by this script's --prepare step, run here
# before the call).  Results go to $OUT (or ./cuda-check-out): every case's
# log and hixl-perf's JSON, for docs/device.md.
set -u
if [ "${1:-}" = "--prepare" ]; then
  build=${2:-build}
  mkdir -p "$build/carry-libs"
  cp -L "$(ldconfig -p | awk '/libcmocka.so.0 /{print $NF; exit}')" "$build/carry-libs/"
  echo "prepared $build/carry-libs"; exit 0
fi
build=${1:-build}
out=${OUT:-cuda-check-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/$build/carry-libs:$PWD/$build${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HIXL_DEVICE=cuda
nvidia-smi -L > "$out/gpu.txt" 2>&1
"$build/tools/hixl-info" > "$out/hixl-info.txt" 2>&1
cat "$out/gpu.txt" "$out/hixl-info.txt"
fail=0
for tp in self shm; do
  for c in badinput atomic notif batch dirs; do
    t0=$(date +%s)
    if timeout 300 "$build/tests/device" "$tp" "$c" > "$out/$tp-$c.log" 2>&1; then r=ok; else r=FAIL; fail=1; fi
    echo "$r $tp/device-$c ($(( $(date +%s) - t0 )) s)"
    [ $r = ok ] || tail -n 5 "$out/$tp-$c.log"
  done
done
# D2D, H2D, D2H over shm beside cuMemcpy (hixl_mem_copy) in the same run.
for m in device host,device device,host; do
  for t in put get; do
    timeout 300 "$build/tools/hixl-perf" -t "$t" --mem "$m" --transport shm --max 64m \
      --json "$out/perf-$t-${m/,/+}.json" > "$out/perf-$t-${m/,/+}.txt" 2>&1 || fail=1
    tail -n 6 "$out/perf-$t-${m/,/+}.txt"
  done
done
exit $fail

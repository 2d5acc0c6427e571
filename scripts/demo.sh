#!/usr/bin/env bash
# One command on a fresh Debian machine: install what is missing, build, and
# run the demo (two processes over shared memory).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -f build/build.ninja ] || meson setup build --buildtype=release >/dev/null
ninja -C build >/dev/null
exec build/examples/hixl-demo

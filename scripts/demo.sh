#!/usr/bin/env bash
# One command on a fresh Debian machine: install what is missing, build, and
# run the parameter-server example: a PS and 3 workers over shared memory,
# one-sided against two-sided, checked bit for bit against a
# single-process run (docs/examples.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
[ -f build/build.ninja ] || meson setup build --buildtype=release >/dev/null
ninja -C build >/dev/null
exec build/examples/hixl-ps-train --launch 4

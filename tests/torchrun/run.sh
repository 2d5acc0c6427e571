#!/bin/sh
# SPDX-License-Identifier: MIT
# Runs a tests/torchrun case with Debian's Python, which has torch (the
# python3 first on PATH may not).  Exit 77 (skipped) only when no Python
# here can import torch.distributed.
#   run.sh CASE BUILD_DIR SOURCE_DIR
py=${HIXL_TORCH_PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import torch.distributed' >/dev/null 2>&1; then
  echo "SKIP: $py cannot import torch.distributed"
  exit 77
fi
exec "$py" "$3/tests/torchrun/torchrun_test.py" "$@"

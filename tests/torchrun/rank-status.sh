#!/bin/sh
# SPDX-License-Identifier: MIT
# torchrun --no_python entry point: run the program with the rank's
# environment, leave its exit status in DIR/rank-$RANK.status, exit with it.
#   rank-status.sh DIR PROGRAM ARGS...
dir=$1
shift
"$@"
rc=$?
echo "$rc" > "$dir/rank-$RANK.status"
exit "$rc"

#!/usr/bin/env bash
# Install into a staging prefix, then build an out-of-tree C program and a
# C++ one against it with pkg-config only, and run them.
set -euo pipefail
build=${1:?usage: check.sh BUILD_DIR}
src=$(cd "$(dirname "$0")" && pwd)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
meson install -C "$build" --destdir "$stage" --quiet
prefix=$(meson introspect "$build" --buildoptions | python3 -c \
  'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="prefix"][0])')
libdir=$(meson introspect "$build" --buildoptions | python3 -c \
  'import json,sys; print([o["value"] for o in json.load(sys.stdin) if o["name"]=="libdir"][0])')
root=$stage$prefix
export PKG_CONFIG_PATH=$root/$libdir/pkgconfig
# The .pc file names the final prefix; point pkg-config at the staging root.
export PKG_CONFIG_SYSROOT_DIR=$stage
# pkg-config prints its flags as one space-separated line: split on purpose.
# shellcheck disable=SC2046
cc -std=c11 -Wall -Werror "$src/consumer.c" -o "$stage/consumer" $(pkg-config --cflags --libs hixl)
# shellcheck disable=SC2046 # as above
c++ -x c++ -Wall -Werror "$src/consumer.c" -o "$stage/consumer_cxx" $(pkg-config --cflags --libs hixl)
# Static: the archive plus what `pkg-config --static` says it needs (-libverbs
# when the verbs transport is built).  Flags split on purpose, as above.
# shellcheck disable=SC2046
cc -std=c11 "$src/consumer.c" -o "$stage/consumer_static" $(pkg-config --cflags hixl) \
  "$root/$libdir/libhixl.a" $(pkg-config --static --libs hixl | sed 's/-lhixl\b//')
LD_LIBRARY_PATH=$root/$libdir "$stage/consumer"
LD_LIBRARY_PATH=$root/$libdir "$stage/consumer_cxx"
"$stage/consumer_static"
test -x "$root/bin/hixl-perf" && test -x "$root/bin/hixl-info"
test -f "$root/include/hixl.h"

# Python (docs/python.md).  Debian's interpreter: the one with numpy/torch.
py=/usr/bin/python3
selftest='
import hixl, numpy as np
with hixl.Context() as c:
    r = c.alloc(4096); r.publish("r")
    me = c.connect(c.address); rr = me.lookup("r")
    me.put(np.arange(4, dtype=np.uint32), rr, 8)
    assert r.numpy(np.uint32)[2:6].tolist() == [0, 1, 2, 3]
print("python package ok:", hixl.__file__)'
if [ -x "$py" ] && "$py" -c 'import numpy' 2>/dev/null; then
  # meson install put the package (extension + .py files) under the prefix.
  ext=$(find "$root" -name '_hixl*.so' | head -n 1)
  test -n "$ext" || { echo "meson install did not install the Python package"; exit 1; }
  (cd "$stage" && PYTHONPATH=$(dirname "$(dirname "$ext")") "$py" -c "$selftest")
  # pip, through meson-python, without a package index (--no-build-isolation:
  # Debian's meson, ninja and python3-mesonpy; --target: no system install).
  env -u PKG_CONFIG_SYSROOT_DIR -u PKG_CONFIG_PATH "$py" -m pip install --quiet --no-build-isolation --no-index --no-deps \
    --target "$stage/pip" "$src/../.." >"$stage/pip.log" 2>&1 || { grep -v "^ *\[[0-9]*/[0-9]*\]" "$stage/pip.log" | tail -n 40; exit 1; }
  (cd "$stage" && PYTHONPATH=$stage/pip "$py" -c "$selftest")
  rm -rf "$src/../../.mesonpy-"*
fi
echo "install check: ok"

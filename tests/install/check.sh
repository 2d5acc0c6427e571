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
cc -std=c11 -Wall -Werror "$src/consumer.c" -o "$stage/consumer" $(pkg-config --cflags --libs hixl)
c++ -x c++ -Wall -Werror "$src/consumer.c" -o "$stage/consumer_cxx" $(pkg-config --cflags --libs hixl)
# Static: the archive plus what `pkg-config --static` says it needs (-libverbs
# when the verbs transport is built).
cc -std=c11 "$src/consumer.c" -o "$stage/consumer_static" $(pkg-config --cflags hixl) \
  "$root/$libdir/libhixl.a" $(pkg-config --static --libs hixl | sed 's/-lhixl\b//')
LD_LIBRARY_PATH=$root/$libdir "$stage/consumer"
LD_LIBRARY_PATH=$root/$libdir "$stage/consumer_cxx"
"$stage/consumer_static"
test -x "$root/bin/hixl-perf" && test -x "$root/bin/hixl-info"
test -f "$root/include/hixl.h"
echo "install check: ok"

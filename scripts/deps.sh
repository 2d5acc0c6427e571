#!/usr/bin/env bash
# Install what hixl needs to build and test, from Debian's archive, if missing.
set -euo pipefail
pkgs=(meson ninja-build gcc g++ pkg-config libcmocka-dev python3 clang
      nettle-dev  # HMAC-SHA256: control-plane authentication, region table tags
      libgnutls28-dev  # optional TLS on the control connections (HIXL_TLS=1)
      libunistring-dev  # named by gnutls.pc for static links (the install check's static consumer)
      # Soft-RoCE in a qemu guest (tests/rxe/rxe-run) and the verbs transport:
      qemu-system-x86 busybox-static cpio kmod xz-utils ibverbs-providers ibverbs-utils
      rdmacm-utils perftest libibverbs-dev librdmacm-dev
      # the fabric transport, and network namespaces for its two-host tests:
      libfabric-dev iproute2
      # the Python package (python/hixl), its tests, examples and torchrun:
      python3-dev python3-numpy python3-torch python3-pytest python3-mesonpy python3-pip
      patchelf   # meson-python sets the wheel's RPATH with it
      # the lint step (scripts/lint.sh): C style and shell scripts
      clang-format shellcheck
      # the metrics endpoint's test scrapes it and checks it with promtool
      prometheus curl)
# libclang-rt provides libFuzzer and the sanitizer runtimes for clang.
if apt-cache show libclang-rt-14-dev >/dev/null 2>&1; then pkgs+=(libclang-rt-14-dev); fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq || true
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

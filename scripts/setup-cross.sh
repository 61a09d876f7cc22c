#!/usr/bin/env bash
# Installs what cross-building mcp-run-python for another Linux architecture needs on a Debian or
# Ubuntu x86_64 machine (aarch64, docs/platforms.md), and is quick when all is already there. Sourced by
# scripts/build-wheel.sh --target ARCH, which then builds with the variables it exports.
#
# Why multiarch rather than a debootstrapped sysroot: Debian's arm64 JavaScriptCore and its
# whole dependency closure are `Multi-Arch: same`, so they install beside the amd64 ones (57
# packages, ~37 MB to download, 17 s here); Debian's cross gcc searches
# /usr/lib/aarch64-linux-gnu itself, so no --sysroot is needed; and scripts/repair_wheel.py
# finds the libraries to bundle in the same directory. A sysroot would take minutes of
# emulated package setup for the same files.
#
#   . scripts/setup-cross.sh aarch64
set -euo pipefail

cross_arch=${1:?usage: . scripts/setup-cross.sh aarch64}
case "$cross_arch" in
  aarch64) debian_arch=arm64 triplet=aarch64-linux-gnu rust_target=aarch64-unknown-linux-gnu ;;
  *) echo "setup-cross: no cross build for $cross_arch (aarch64 only)" >&2; return 2 2>/dev/null || exit 2 ;;
esac

SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
if ! dpkg --print-foreign-architectures | grep -qx "$debian_arch"; then
  echo "setup-cross: adding the $debian_arch architecture to dpkg" >&2
  $SUDO dpkg --add-architecture "$debian_arch"
  $SUDO apt-get update -qq
fi
need_apt=()
command -v "$triplet-gcc" >/dev/null || need_apt+=("gcc-$triplet")
# The library the wheel bundles (scripts/repair_wheel.py); not linked, so no headers.
dpkg -s "libjavascriptcoregtk-4.1-0:$debian_arch" >/dev/null 2>&1 \
  || need_apt+=("libjavascriptcoregtk-4.1-0:$debian_arch")
command -v "$triplet-pkg-config" >/dev/null || need_apt+=("pkgconf:$debian_arch")
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup-cross: installing ${need_apt[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
rustup target list --installed | grep -qx "$rust_target" || rustup target add "$rust_target"

# cargo's and the cc and pkg-config crates' variables for the target (their documented names).
target_var=$(echo "$rust_target" | tr 'a-z-' 'A-Z_')
export "CARGO_TARGET_${target_var}_LINKER=$triplet-gcc"
export "CC_${rust_target//-/_}=$triplet-gcc"
export "AR_${rust_target//-/_}=$triplet-ar"
export "PKG_CONFIG_${rust_target//-/_}=$triplet-pkg-config"
export CROSS_RUST_TARGET=$rust_target

#!/usr/bin/env bash
# The aarch64 suite (aarch64, docs/platforms.md), which scripts/test.sh runs in the background beside the x86_64
# suites (most of its time is emulation, on a machine whose other suites wait on processes):
# cross-builds the aarch64 wheel (the dev profile, as the x86_64 wheel test's) and an aarch64
# build with the `escape-test` feature, then runs tests/aarch64 on an emulated arm64 machine.
# test.sh runs scripts/setup-cross.sh and scripts/setup-emulation.sh first, so that here they
# find everything installed and no apt-get runs beside test.sh's own. Alone, it installs what
# they install, and needs test.sh's .venv (pytest).
#
#   scripts/test-aarch64.sh [pytest options]
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || { echo "test-aarch64: no .venv; run scripts/test.sh once" >&2; exit 1; }
scripts/setup-emulation.sh

# A target directory of its own: test.sh builds the x86_64 side at the same time, and a cross
# build also locks the host's directory (its build scripts and proc macros run there).
export CARGO_TARGET_DIR=target/aarch64-build
wheel=$(scripts/build-wheel.sh --dev --target aarch64 | tail -n 1)
. scripts/setup-cross.sh aarch64
# Shares the wheel's build directory: only this crate is rebuilt with the feature. Stripped, as
# the wheel's binary is, so the guest's initramfs stays small.
cargo build --quiet --target "$CROSS_RUST_TARGET" --features escape-test
escape=target/aarch64-escape-test/mcp-run-python
mkdir -p "$(dirname "$escape")"
aarch64-linux-gnu-strip -o "$escape" "$CARGO_TARGET_DIR/$CROSS_RUST_TARGET/debug/mcp-run-python"
MCP_RUN_PYTHON_AARCH64_WHEEL="$PWD/$wheel" MCP_RUN_PYTHON_AARCH64_ESCAPE="$PWD/$escape" \
  .venv/bin/python -m pytest -q -p no:cacheprovider tests/aarch64 "$@"

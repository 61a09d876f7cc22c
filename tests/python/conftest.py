"""Shared helpers: start the real binary and talk to it with the real Python `mcp` client."""

import contextlib
import datetime
import json
import os
import pathlib
import sys

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ.get("MCP_RUN_PYTHON_BIN") or str(ROOT / "target" / "debug" / "mcp-run-python")
LOCK = json.loads((ROOT / "pyodide-assets" / "pyodide-lock.json").read_text())
# One download cache for the whole run, so each PyPI file is fetched once.
SHARED_CACHE = os.environ.get("MCP_RUN_PYTHON_TEST_CACHE") or str(ROOT / "target" / "test-cache")
CALL_TIMEOUT = 300


@pytest.fixture
def anyio_backend():
    return "asyncio"


def server_env():
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if "RUST_LOG" in os.environ:
        env["RUST_LOG"] = os.environ["RUST_LOG"]
    return env


@contextlib.asynccontextmanager
async def mcp_session(*args, errlog=None, cache_dir=SHARED_CACHE):
    """An initialized MCP session with `mcp-run-python stdio <args>`."""
    params = StdioServerParameters(
        command=BINARY,
        args=["stdio", "--cache-dir", cache_dir, *args],
        env=server_env(),
    )
    async with stdio_client(params, errlog=errlog or sys.stderr) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def run(session, code, **global_variables):
    """Calls run_python_code and returns the one text content."""
    arguments = {"python_code": code}
    if global_variables:
        arguments["global_variables"] = global_variables
    result = await session.call_tool("run_python_code", arguments, read_timeout_seconds=datetime.timedelta(seconds=CALL_TIMEOUT))
    assert not result.isError, result
    assert len(result.content) == 1
    return result.content[0].text


@contextlib.contextmanager
def http_server(mode, *args, cache_dir=SHARED_CACHE):
    """`mcp-run-python <mode>` on a free local port; yields its base URL. On exit it is sent
    SIGTERM and must stop cleanly."""
    import socket
    import subprocess
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [BINARY, mode, "--port", str(port), "--cache-dir", cache_dir, *args],
        env=server_env(),
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"{mode} server did not start")
            time.sleep(0.1)
    try:
        url = ServerURL(f"http://127.0.0.1:{port}")
        url.pid = proc.pid
        yield url
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
        assert code == 0, f"server exited with {code} after SIGTERM"


class ServerURL(str):
    """A server's base URL that also knows the server's process id."""

    pid: int


def child_pids(pid, state_filter=lambda state: state != "Z"):
    """Live child processes of `pid` (zombies excluded), from /proc."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[1] == str(pid) and state_filter(fields[0]):
            children.append(int(entry))
    return children


def zombie_pids(pid):
    """Children of `pid` that exited but were never reaped."""
    return child_pids(pid, lambda state: state == "Z")


def rss_bytes(pid):
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

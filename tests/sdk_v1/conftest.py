"""Shared helpers: start the real binary and talk to it with the real Python `mcp` client."""

import contextlib
import datetime
import json
import os
import pathlib
import sys

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

# Starting the binary is shared with tests/sdk_v2 (tests/shared/real_binary.py).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "shared"))
from real_binary import (  # noqa: E402, F401 (re-exported to the tests)
    RUNTIME_DIR,
    BINARY, CALL_TIMEOUT, ROOT, SHARED_CACHE, http_server, server_env,
    children_of, forked_for, is_zygote, stop_new_zygote_services, stop_zygote_services, zygote_service_pids,
    zygote_services_stopped_after, settled,
    zygote_services, wait_for_ready_zygote_service,
)

LOCK = json.loads((ROOT / "pyodide-assets" / "pyodide-lock.json").read_text())


@pytest.fixture(scope="session", autouse=True)
def zygote_services_stopped():
    """Every zygote service the run's fronts started ends with the run, even when a test
    failed: those in the run's runtime directory, and any other that was not there before."""
    with zygote_services_stopped_after():
        yield


@pytest.fixture
def anyio_backend():
    return "asyncio"


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


@contextlib.asynccontextmanager
async def forked_session(*args):
    """[`mcp_session`] whose interpreters are forked from a ready zygote service (a session
    started first brings the service up), as every session's are once the host is warm:
    checkpoints need it (checkpoints, docs/architecture.md §3.4)."""
    async with mcp_session(*args) as warming:
        await run(warming, "1")
        await anyio.to_thread.run_sync(wait_for_ready_zygote_service)
    async with mcp_session(*args) as session:
        yield session


async def run(session, code, **global_variables):
    """Calls run_python_code and returns its text content (the first item; with --stateful,
    images and links to written files may follow it)."""
    arguments = {"python_code": code}
    if global_variables:
        arguments["global_variables"] = global_variables
    result = await session.call_tool("run_python_code", arguments, read_timeout_seconds=datetime.timedelta(seconds=CALL_TIMEOUT))
    assert not result.isError, result
    assert result.content[0].type == "text" and all(c.type != "text" for c in result.content[1:]), result
    return result.content[0].text


def zygote_pids(pid):
    """The zygotes among the children of `pid`."""
    return [kid for kid in direct_child_pids(pid) if is_zygote(kid)]


def child_pids(pid, state_filter=lambda state: state != "Z"):
    """The worker processes of server `pid` (zombies excluded), from /proc: its children but
    the zygote, the zygote's children (the interpreters it forked), and the interpreters the
    host's zygote service forked for it (children of a service's zygote whose standard input is
    a pipe that `pid` holds the other end of; read as root, since workers are not dumpable)."""
    workers = []
    services = zygote_service_pids()
    for kid, state in children_of(pid):
        if is_zygote(kid):
            workers.extend(k for k, s in children_of(kid) if state_filter(s))
        elif state_filter(state) and kid not in services:
            # A zygote service this server started stays its child until the server ends.
            workers.append(kid)
    return workers + forked_for(pid, state_filter)


def direct_child_pids(pid, state_filter=lambda state: state != "Z"):
    """Live child processes of `pid` (zombies excluded), from /proc."""
    return [kid for kid, state in children_of(pid) if state_filter(state)]



def zombie_pids(pid):
    """Children of `pid` that exited but were never reaped."""
    return child_pids(pid, lambda state: state == "Z")


def rss_bytes(pid):
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

"""The front never loads the engine (issue 49; docs/architecture.md §2.1): the process that serves
MCP, over stdio and over HTTP, maps no JavaScriptCore, ICU or GLib while it serves calls, and
neither does the zygote service; only the processes that run JavaScript do (the zygote, the
interpreters it forks, and booted workers). Checked in `/proc/<pid>/maps`, as root (workers are
not dumpable)."""

import os

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from conftest import (
    children_of, direct_child_pids, forked_for, forked_session, http_server, is_zygote, run,
    zygote_service_pids,
)

pytestmark = pytest.mark.anyio

# Path fragments of the engine's library and of the libraries it alone brings.
ENGINE_LIBRARIES = ("libjavascriptcoregtk", "libicuuc", "libicui18n", "libicudata", "libglib-2.0",
                    "libgobject-2.0", "libgmodule-2.0", "libstdc++")


def engine_mappings(pid):
    """The engine libraries `pid` maps (path fragments of `ENGINE_LIBRARIES` found)."""
    with open(f"/proc/{pid}/maps") as f:
        maps = f.read()
    return {name for name in ENGINE_LIBRARIES if name in maps}


def stdio_front_pid():
    """The `stdio` front this test process started (the `mcp` client's child)."""
    (pid,) = [pid for pid in direct_child_pids(os.getpid()) if is_front(pid, b"stdio")]
    return pid


def is_front(pid, mode):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[1:2] == [mode]
    except OSError:
        return False


async def test_stdio_front_and_zygote_service_map_no_engine():
    # A session whose interpreters the zygote service forks.
    async with forked_session() as session:
        assert (await run(session, "1 + 1")).endswith("<return_value>\n2\n</return_value>")
        front = stdio_front_pid()
        assert engine_mappings(front) == set(), "the stdio front maps the engine"
        services = zygote_service_pids()
        assert services
        for service in services:
            assert engine_mappings(service) == set(), "the zygote service maps the engine"
        # The check sees the engine where it is: in the zygote and its interpreters.
        zygotes = [pid for service in services for pid, _ in children_of(service) if is_zygote(pid)]
        assert zygotes and all("libjavascriptcoregtk" in engine_mappings(z) for z in zygotes)
        workers = forked_for(front)
        assert workers and all("libjavascriptcoregtk" in engine_mappings(w) for w in workers)


async def test_http_front_maps_no_engine_beside_its_booted_workers():
    with http_server("streamable-http", "--no-zygote") as base:
        async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                assert (await run(session, "print('hi')")).startswith("<status>success</status>")
                assert engine_mappings(base.pid) == set(), "the HTTP front maps the engine"
                workers = direct_child_pids(base.pid)
                assert workers and all("libjavascriptcoregtk" in engine_mappings(w) for w in workers)

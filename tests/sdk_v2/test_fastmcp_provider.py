"""FastMCP's `CodeMode` on our `SandboxProvider` (pysrc/mcp_run_python/fastmcp.py, code mode,
docs/architecture.md §11), with this run's binary: each `execute` runs in a new sandbox, which
the provider made ahead after the run before and destroys once the result is back, so that a
run waits for neither. The sandbox made ahead is as fresh as one made at the run: nothing of
the run before is in it."""

import asyncio

import pytest
from fastmcp import Client, FastMCP

from conftest import BINARY, SHARED_CACHE
from test_code_mode import ROOT

pytestmark = pytest.mark.anyio

# The binary's own options for every provider here: the suite's cache.
CACHE_ARGS = ["--cache-dir", SHARED_CACHE]

# A snippet that leaves a global behind, and one that looks for it.
LEAVES = 'globals()["left_behind"] = await call_tool("add", {"a": 40, "b": 2})\nreturn "left"'
LOOKS = 'return "left_behind" in globals()'


@pytest.fixture
def provider_module(monkeypatch):
    """`mcp_run_python.fastmcp` from pysrc/, its binary this run's."""
    monkeypatch.syspath_prepend(str(ROOT / "pysrc"))
    monkeypatch.setenv("MCP_RUN_PYTHON_BIN", BINARY)
    from mcp_run_python import fastmcp

    return fastmcp


def server(provider) -> FastMCP:
    from fastmcp.experimental.transforms.code_mode import CodeMode

    mcp = FastMCP("adder", transforms=[CodeMode(sandbox_provider=provider)])

    @mcp.tool
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        return a + b

    return mcp


def the_server(provider):
    """The provider's one binary (its runs' external functions all have the same names), with
    the handles of the sandboxes its runs took recorded in `taken`."""
    (served,) = provider._servers.values()
    if not hasattr(served, "taken"):
        served.taken = []
        take = served.take_sandbox

        async def recorded(session):
            sandbox_id = await take(session)
            served.taken.append(sandbox_id)
            return sandbox_id

        served.take_sandbox = recorded
    return served


async def execute(client, code):
    result = await client.call_tool("execute", {"code": code})
    return result.content[0].text


async def is_live(served, sandbox_id):
    """Whether the binary still has the sandbox `sandbox_id` (a call in it is answered)."""
    answer = await served.session.call_tool("run_python_code", {"python_code": "1", "sandbox_id": sandbox_id})
    return not answer.get("isError")


async def background_done(served):
    await asyncio.gather(*list(served.background))
    if served.ahead is not None:
        await served.ahead[1]


async def first_run(provider, client):
    """Runs a first snippet, and waits for what it left in the background: the provider's
    server and the sandbox made ahead for the next run."""
    await execute(client, "return 1")
    served = the_server(provider)
    await background_done(served)
    return served, await served.ahead[1]


async def test_each_run_takes_a_fresh_sandbox_made_ahead_and_its_own_is_destroyed(provider_module):
    async with provider_module.SandboxProvider(extra_args=CACHE_ARGS) as provider:
        async with Client(server(provider)) as client:
            # The first run makes its sandbox itself (nothing was made ahead yet).
            served, made_ahead = await first_run(provider, client)
            assert await is_live(served, made_ahead)

            assert await execute(client, LEAVES) == "left"
            assert served.taken == [made_ahead], "the run did not take the sandbox made ahead"
            await background_done(served)
            assert not await is_live(served, made_ahead), "the run's sandbox outlived its result"

            # The next run's sandbox was made after that run: none of its globals are there.
            assert await execute(client, LOOKS) == "false"
            assert len(served.taken) == 2 and served.taken[1] != made_ahead, served.taken


async def test_a_sandbox_made_ahead_too_long_ago_is_destroyed_not_taken(provider_module, monkeypatch):
    monkeypatch.setattr(provider_module, "AHEAD_FRESH_SECONDS", 0.0)
    async with provider_module.SandboxProvider(extra_args=CACHE_ARGS) as provider:
        async with Client(server(provider)) as client:
            served, stale = await first_run(provider, client)
            await asyncio.sleep(0.01)
            assert await execute(client, LOOKS) == "false"
            assert served.taken and served.taken[-1] != stale, served.taken
            await background_done(served)
            assert not await is_live(served, stale), "the stale sandbox was left behind"


@pytest.mark.parametrize("option", ["--hibernate-after=1", "--max-sandboxes=4"])
async def test_no_sandbox_is_made_ahead_under_options_that_could_end_it_first(provider_module, option):
    async with provider_module.SandboxProvider(extra_args=[*CACHE_ARGS, option]) as provider:
        async with Client(server(provider)) as client:
            assert await execute(client, LEAVES) == "left"
            served = the_server(provider)
            await background_done(served)
            assert served.ahead is None
            assert await execute(client, LOOKS) == "false"

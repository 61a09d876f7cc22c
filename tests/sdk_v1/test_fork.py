"""`fork_sandbox` (checkpoints, docs/architecture.md §3.4) through the `mcp` 1.x client over stdio (2025-11-25): a new
sandbox that starts as a copy of another as its last completed call left it (globals, imports,
files), then goes its own way; a sandbox with a call in flight is forked after that call; a
fork at `--max-sandboxes` and a fork of a state that cannot be captured are refused with a tool
error, and nothing is made. Forks need forked interpreters (`forked_session`): their state is
the source's checkpoint. Also `code_sandbox(stateful=True)` and `await sandbox.fork()`.
Today's clients (fastmcp 4, sessionless HTTP, another principal) are in
tests/sdk_v2/test_fork.py."""

import asyncio
import json
import re

import anyio
import pytest

from adversary import return_value, status_of
from conftest import (BINARY, ROOT, SHARED_CACHE, forked_session, run,
                      stop_zygote_services, wait_for_ready_zygote_service)

# The sandbox helpers of test_sandboxes.py, which the fork tests share.
from test_sandboxes import create, in_sandbox, state_of, tool  # noqa: E402

pytestmark = pytest.mark.anyio

HANDLE = re.compile(r"sbx_[A-Za-z0-9_-]{22}")
UNKNOWN = "sbx_" + "A" * 22
GONE = "does not exist or has expired"
FULL = "the server holds its limit of 1 sandboxes (--max-sandboxes)"


async def fork(session, sandbox_id=None):
    """fork_sandbox of `sandbox_id` (the session's own when None): the new handle."""
    arguments = {} if sandbox_id is None else {"sandbox_id": sandbox_id}
    made = await tool(session, "fork_sandbox", **arguments)
    assert not made.isError, made
    new = made.structuredContent["sandbox_id"]
    assert HANDLE.fullmatch(new) and new != sandbox_id and new in made.content[0].text, made
    return new


async def test_a_fork_starts_as_a_copy_and_then_goes_its_own_way():
    async with forked_session("--stateful") as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        forking = tools["fork_sandbox"]
        assert forking.annotations.readOnlyHint is False and forking.annotations.destructiveHint is False
        assert forking.annotations.idempotentHint is False and forking.annotations.openWorldHint is False
        assert forking.inputSchema["properties"]["sandbox_id"]["x-mcp-header"] == "Sandbox-Id"
        assert "required" not in forking.inputSchema and forking.outputSchema["required"] == ["sandbox_id"]
        assert "in flight is forked after that call" in forking.description

        a = await create(session)
        text = await in_sandbox(session, "import json, decimal, random\nx = 41\ndef double(n):\n    return n * 2\n"
                                         "open('notes.txt', 'w').write('from a')\nrandom.random()", a)
        assert status_of(text) == "success" and state_of(text) is None, text
        uploaded = await tool(session, "upload_file", name="data/in.csv", text="t\n3\n", sandbox_id=a)
        assert not uploaded.isError, uploaded

        b = await fork(session, a)
        text = await in_sandbox(session, "x += 1\n(x, double(x), json.dumps(str(decimal.Decimal('1.5'))), "
                                         "open('notes.txt').read(), open('data/in.csv').read())", b)
        assert status_of(text) == "success", text
        state = state_of(text)
        assert state.startswith("forked: this sandbox started as a copy of another sandbox as its last "
                                "completed call left it"), text
        assert "notes.txt" in state and "data/in.csv" in state and a not in text, text
        assert json.loads(return_value(text)) == [42, 84, '"1.5"', "from a", "t\n3\n"], text
        # The source is as it was, and the two go their own ways from here.
        text = await in_sandbox(session, "x", a)
        assert return_value(text) == "41" and state_of(text) is None, text
        await in_sandbox(session, "open('only_b.txt', 'w').write('b')\ny = 'b'", b)
        assert "NameError" in await in_sandbox(session, "y", a)
        assert return_value(await in_sandbox(session, "import os\nos.path.exists('only_b.txt')", a)) == "false"
        listed = await tool(session, "list_sandbox_files", sandbox_id=b)
        assert {f["path"] for f in listed.structuredContent["files"]} == {"notes.txt", "data/in.csv", "only_b.txt"}
        # `random` is reseeded in the copy, as after `os.fork`.
        draws = [await in_sandbox(session, "random.random()", s) for s in (a, b)]
        assert return_value(draws[0]) != return_value(draws[1]), draws
        assert "<state>" not in await in_sandbox(session, "x", b)

        # A fork of a fork, and a fork of the session's own sandbox (no sandbox_id).
        c = await fork(session, b)
        text = await in_sandbox(session, "(x, y)", c)
        assert json.loads(return_value(text)) == [42, "b"] and state_of(text).startswith("forked:"), text
        await run(session, "mine = 'default'")
        d = await fork(session)
        assert return_value(await in_sandbox(session, "mine", d)) == "default"

        unknown = await tool(session, "fork_sandbox", sandbox_id=UNKNOWN)
        assert unknown.isError and GONE in unknown.content[0].text, unknown


async def test_a_sandbox_with_a_call_in_flight_is_forked_after_that_call():
    async with forked_session("--stateful") as session:
        a = await create(session)
        await in_sandbox(session, "step = 'before'", a)
        busy = asyncio.create_task(in_sandbox(session, "import time\ntime.sleep(2)\nstep = 'after'\nstep", a))
        await asyncio.sleep(0.5)
        b = await fork(session, a)
        assert return_value(await busy) == "after"
        assert return_value(await in_sandbox(session, "step", b)) == "after"


async def test_a_sandbox_that_never_ran_code_is_forked_as_its_files():
    async with forked_session("--stateful") as session:
        a = await create(session)
        assert not (await tool(session, "upload_file", name="in.txt", text="hello", sandbox_id=a)).isError
        made = await tool(session, "fork_sandbox", sandbox_id=a)
        assert not made.isError and "no interpreter state to copy" in made.content[0].text, made
        b = made.structuredContent["sandbox_id"]
        text = await in_sandbox(session, "open('in.txt').read()", b)
        assert return_value(text) == "hello" and state_of(text).startswith("forked:"), text


async def test_a_fork_at_the_cap_is_refused_with_the_words_of_create_sandbox():
    """`--max-sandboxes 1`, held by the session's own sandbox, which is the fork's source and so
    in flight (never the one to give way): the fork is refused as create_sandbox is while that
    sandbox runs a call, and the source goes on."""
    async with forked_session("--stateful", "--max-sandboxes", "1") as session:
        await run(session, "x = 1")
        refused = await tool(session, "fork_sandbox")
        assert refused.isError and FULL in refused.content[0].text, refused
        busy = asyncio.create_task(run(session, "import time\ntime.sleep(3)\nx"))
        await asyncio.sleep(1)
        created = await tool(session, "create_sandbox")
        assert created.isError and created.content[0].text == refused.content[0].text, created
        assert return_value(await busy) == "1"


async def test_a_state_that_cannot_be_captured_is_not_forked():
    """Python holding a JavaScript object cannot be checkpointed by its memory (checkpoints, docs/architecture.md §3.4, part 4):
    the fork is refused with why; once the object is gone it forks."""
    async with forked_session("--stateful") as session:
        a = await create(session)
        text = await in_sandbox(session, "import js\no = js.Object.new()\nx = 1", a)
        assert state_of(text).startswith("not saved:"), text
        refused = await tool(session, "fork_sandbox", sandbox_id=a)
        words = refused.content[0].text
        assert refused.isError and "not forked and nothing was made" in words and "JavaScript object" in words, refused
        assert a not in words
        await in_sandbox(session, "del o", a)
        b = await fork(session, a)
        assert return_value(await in_sandbox(session, "x + 1", b)) == "2"


async def test_code_sandbox_forks(monkeypatch):
    """`code_sandbox(stateful=True)` and `await sandbox.fork()` (the package from pysrc/, with
    this run's binary and cache)."""
    monkeypatch.syspath_prepend(str(ROOT / "pysrc"))
    monkeypatch.setenv("MCP_RUN_PYTHON_BIN", BINARY)
    from mcp_run_python import code_sandbox

    # The server gets the `mcp` client's default environment, without XDG_RUNTIME_DIR: its
    # zygote service lives under the cache directory, whose service must be ready for forks,
    # and is stopped at the end (other tests count the services they see there).
    args = ["--cache-dir", SHARED_CACHE]
    try:
        await forks_through_code_sandbox(code_sandbox, args)
    finally:
        await anyio.to_thread.run_sync(lambda: stop_zygote_services(runtime_dir=""))


async def forks_through_code_sandbox(code_sandbox, args):
    async with code_sandbox(stateful=True, extra_args=args) as warming:
        assert (await warming.eval("1"))["return_value"] == 1
        await anyio.to_thread.run_sync(lambda: wait_for_ready_zygote_service(runtime_dir=""))
    async with code_sandbox(stateful=True, extra_args=args) as sandbox:
        assert await sandbox.eval("x = 41") == {"status": "success", "output": [], "return_value": None}
        copy = await sandbox.fork()
        assert copy.sandbox_id != sandbox.sandbox_id and copy.sandbox_id.startswith("sbx_")
        forked = await copy.eval("x += 1\nx")
        assert forked["return_value"] == 42 and forked["state"].startswith("forked:"), forked
        assert await sandbox.eval("x") == {"status": "success", "output": [], "return_value": 41}
        await sandbox.eval("import js\no = js.Object.new()")
        with pytest.raises(ValueError, match="JavaScript object"):
            await sandbox.fork()
    async with code_sandbox() as stateless:
        with pytest.raises(ValueError, match="stateful"):
            await stateless.fork()

"""Sandboxes (sandboxes, docs/architecture.md §3.1) through the `mcp` 1.x client and raw HTTP: the `Mcp-Param-Sandbox-Id`
header must agree with the body (SEP-2243), sandboxes reached by handle expire when idle and
give way at `--max-sandboxes`, and an interpreter killed between calls is replaced with a note.
Today's clients (fastmcp 4, PydanticAI 2.x) are in tests/sdk_v2/test_sandboxes.py."""

import asyncio
import datetime
import os
import re
import signal

import httpx
import pytest

from adversary import http_server, return_value, status_of
from conftest import BINARY, CALL_TIMEOUT, child_pids, direct_child_pids, forked_session, mcp_session, run, settled
from raw_http import ACCEPT, rpc_result, start_session

pytestmark = pytest.mark.anyio

GONE = "does not exist or has expired"
UNKNOWN = "sbx_" + "A" * 22
OTHER = "sbx_" + "B" * 22
TIMEOUT = datetime.timedelta(seconds=CALL_TIMEOUT)
# What a 2026-07-28 request carries in `_meta` instead of an `initialize` (SEP-2575).
MODERN_META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
               "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
               "io.modelcontextprotocol/clientCapabilities": {}}


def state_of(text):
    found = re.search(r"^<state>(.*)</state>$", text, re.MULTILINE)
    return found and found[1]


def call(id_, sandbox_id, meta=None):
    params = {"name": "run_python_code", "arguments": {"python_code": "1", "sandbox_id": sandbox_id}}
    if meta:
        params["_meta"] = meta
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call", "params": params}


async def tool(session, tool_name, **arguments):
    """Calls `tool_name` (its arguments may include one called `name`, as upload_file's)."""
    return await session.call_tool(tool_name, arguments, read_timeout_seconds=TIMEOUT)


async def in_sandbox(session, code, sandbox_id):
    """run_python_code in `sandbox_id`: the result's text (a tool error fails the test)."""
    result = await tool(session, "run_python_code", python_code=code, sandbox_id=sandbox_id)
    assert not result.isError, result
    return result.content[0].text


async def create(session):
    made = await tool(session, "create_sandbox")
    assert not made.isError, made
    return made.structuredContent["sandbox_id"]


async def test_a_header_that_disagrees_with_the_body_is_refused(tmp_path):
    """SEP-2243: a load balancer routes on `Mcp-Param-Sandbox-Id`, so a request whose header and
    body disagree gets HTTP 400 with HeaderMismatch (-32020): checked by rmcp for 2026-07-28
    requests, by the server for a 2025-11-25 session's."""
    with http_server("streamable_http", "--stateful", stderr_path=tmp_path / "server.log") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as http:
            modern = {**ACCEPT, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
                      "Mcp-Name": "run_python_code"}
            r = await http.post(f"{base}/mcp", json=call(7, UNKNOWN, MODERN_META),
                                headers={**modern, "Mcp-Param-Sandbox-Id": OTHER})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == -32020 and r.json()["id"] == 7, r.text
            # Agreeing: the request goes through (and the unknown handle is a tool error).
            r = await http.post(f"{base}/mcp", json=call(8, UNKNOWN, MODERN_META),
                                headers={**modern, "Mcp-Param-Sandbox-Id": UNKNOWN})
            answer = rpc_result(r)["result"]
            assert r.status_code == 200 and answer["isError"] and GONE in answer["content"][0]["text"], r.text

            session = await start_session(http, base)
            r = await http.post(f"{base}/mcp", json=call(9, UNKNOWN), headers={**session, "Mcp-Param-Sandbox-Id": OTHER})
            assert r.status_code == 400 and r.json()["error"]["code"] == -32020, r.text
            assert "does not match" in r.json()["error"]["message"], r.text
            r = await http.post(f"{base}/mcp", json=call(10, UNKNOWN), headers=session)
            assert r.status_code == 200 and GONE in rpc_result(r)["result"]["content"][0]["text"], r.text


async def test_a_sessionless_server_keeps_sandboxes_too(tmp_path):
    """`streamable-http-stateless --stateful`: no request has a session, and state lives in the
    sandbox that the first answer names."""
    with http_server("streamable-http-stateless", "--stateful", stderr_path=tmp_path / "server.log") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as http:
            first = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "run_python_code", "arguments": {"python_code": "x = 41"}}}
            r = await http.post(f"{base}/mcp", json=first, headers={**ACCEPT, "MCP-Protocol-Version": "2025-11-25"})
            structured = rpc_result(r)["result"]["structuredContent"]
            assert structured["state"].startswith("new:"), structured
            second = call(2, structured["sandbox_id"])
            second["params"]["arguments"]["python_code"] = "x + 1"
            r = await http.post(f"{base}/mcp", json=second, headers={**ACCEPT, "MCP-Protocol-Version": "2025-11-25"})
            assert rpc_result(r)["result"]["structuredContent"]["return_value"] == 42, r.text


async def test_a_session_keeps_its_own_sandbox_and_names_it():
    """A 2025-11-25 session (stdio, `mcp` 1.x): calls without a handle share the session's
    sandbox, whose handle every result names; it is listed as resources, and create_sandbox
    makes others beside it."""
    async with mcp_session("--stateful") as session:
        text = await run(session, "x = 1\nopen('mine.txt', 'w').write('x')")
        default = re.search(r"<sandbox_id>(sbx_[\w-]{22})</sandbox_id>", text)[1]
        assert state_of(text) is None, text
        other = await create(session)
        assert other != default
        assert "NameError" in await in_sandbox(session, "x", other)
        assert return_value(await in_sandbox(session, "x + 1", default)) == "2"
        assert return_value(await run(session, "x + 2")) == "3"
        listed = [str(r.uri) for r in (await session.list_resources()).resources]
        assert listed == [f"sandbox://{default}/mine.txt"], listed
        files = await tool(session, "list_sandbox_files", sandbox_id=other)
        assert files.structuredContent == {"sandbox_id": other, "files": []}, files


async def test_an_idle_sandbox_expires_but_the_sessions_own_does_not():
    async with mcp_session("--stateful", "--sandbox-idle-timeout", "2") as session:
        sandbox = await create(session)
        await in_sandbox(session, "x = 1", sandbox)
        await run(session, "y = 1")
        await asyncio.sleep(4)
        gone = await tool(session, "run_python_code", python_code="x", sandbox_id=sandbox)
        assert gone.isError and GONE in gone.content[0].text, gone
        assert return_value(await run(session, "y")) == "1"


async def test_at_the_cap_the_least_recently_used_idle_sandbox_gives_way():
    """`--max-sandboxes 3` without hibernation (`--hibernate-after 0`): a new sandbox takes the
    place of the least recently used one that has nothing in flight; one with a call running is
    never the one to go. (With hibernation the idle one hibernates instead:
    tests/sdk_v2/test_checkpoints.py.)"""
    async with mcp_session("--stateful", "--max-sandboxes", "3", "--workers", "2",
                           "--hibernate-after", "0") as session:
        a, b, c = [await create(session) for _ in range(3)]
        for sandbox in (a, b, c):
            await in_sandbox(session, f"me = {sandbox!r}", sandbox)
        d = await create(session)
        await in_sandbox(session, f"me = {d!r}", d)
        gone = await tool(session, "run_python_code", python_code="me", sandbox_id=a)
        assert gone.isError and GONE in gone.content[0].text, gone
        # b is now the least recently used, but busy: c gives way instead.
        busy = asyncio.create_task(in_sandbox(session, "import time\ntime.sleep(4)\nme", b))
        await asyncio.sleep(1.5)
        await create(session)
        assert return_value(await busy) == b
        gone = await tool(session, "run_python_code", python_code="me", sandbox_id=c)
        assert gone.isError and GONE in gone.content[0].text, gone
        assert return_value(await in_sandbox(session, "me", d)) == d


def stdio_server_pid():
    """The pid of the one stdio server this test process started."""
    (pid,) = [p for p in direct_child_pids(os.getpid())
              if open(f"/proc/{p}/cmdline", "rb").read().startswith(BINARY.encode())]
    return pid


async def test_an_interpreter_killed_between_calls_comes_back_from_its_checkpoint():
    """SIGKILL of an idle sandbox's interpreter (as the OOM killer would): the next call runs
    in a new interpreter with the variables, functions and imports of the last completed call
    (checkpoints, docs/architecture.md §3.4: its checkpoint, kept by the front without --state-dir), and says so and why."""
    async with forked_session("--stateful") as session:
        await run(session, "import json, decimal\nx = 41\ndef f(n):\n    return n * 2\n"
                           "open('kept.txt', 'w').write('kept')")
        (worker,) = child_pids(stdio_server_pid())
        await settled(worker)
        os.kill(worker, signal.SIGKILL)
        await asyncio.sleep(0.5)
        text = await run(session, "x + 1, f(21), json.dumps(str(decimal.Decimal('1.5') * 2)), "
                                  "open('kept.txt').read()")
        assert status_of(text) == "success", text
        state = state_of(text)
        assert state.startswith("restored:") and "killed from outside" in state, text
        assert "restored: kept.txt" in state, text
        assert return_value(text) == '[\n  42,\n  42,\n  "\\"3.0\\"",\n  "kept"\n]', text
        # The restored interpreter goes on as any other: new state, new imports, and its own
        # next checkpoint.
        text = await run(session, "import statistics\ny = statistics.mean([x, 43])\ny")
        assert return_value(text) == "42", text
        (worker,) = child_pids(stdio_server_pid())
        await settled(worker)
        os.kill(worker, signal.SIGKILL)
        await asyncio.sleep(0.5)
        assert return_value(await run(session, "x + y")) == "83"


async def test_an_idle_sandbox_hibernates_and_its_next_call_resumes_it():
    """--hibernate-after (checkpoints, docs/architecture.md §3.4): an idle sandbox's interpreter is freed and its state kept
    on disk; the next call resumes it with its variables, imports and files, saying nothing
    (nothing was lost), and the sandbox hibernates again when idle."""
    async with forked_session("--stateful", "--hibernate-after", "1") as session:
        await run(session, "import json\nx = 41\nopen('kept.txt', 'w').write('kept')")
        server = stdio_server_pid()
        assert len(child_pids(server)) == 1
        await wait_until(lambda: not child_pids(server), what="the idle interpreter to be freed")
        text = await run(session, "import sys\n[x + 1, 'json' in sys.modules, open('kept.txt').read()]")
        assert return_value(text) == '[\n  42,\n  true,\n  "kept"\n]', text
        assert state_of(text) is None, text
        await wait_until(lambda: not child_pids(server), what="a second hibernation")
        assert return_value(await run(session, "x")) == "41"


async def wait_until(condition, what, timeout=20):
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_state_that_cannot_be_captured_is_said_and_only_the_files_come_back():
    """A sandbox whose Python holds a JavaScript object cannot be checkpointed by its memory
    (checkpoints, docs/architecture.md §3.4, part 4): the call's answer says so, and after a SIGKILL the next call says the
    state is new, with the files."""
    async with forked_session("--stateful") as session:
        text = await run(session, "import js\no = js.Object.new()\nx = 1\n"
                                   "open('kept.txt', 'w').write('kept')")
        assert state_of(text).startswith("not saved:") and "JavaScript object" in state_of(text), text
        (worker,) = child_pids(stdio_server_pid())
        await settled(worker)
        os.kill(worker, signal.SIGKILL)
        await asyncio.sleep(0.5)
        text = await run(session, "'x' in globals(), open('kept.txt').read()")
        assert state_of(text).startswith("new:"), text
        assert return_value(text) == '[\n  false,\n  "kept"\n]', text

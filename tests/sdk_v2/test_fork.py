"""`fork_sandbox` (checkpoints, docs/architecture.md §3.4) for today's clients: fastmcp 4's `Client` against `streamable-http
--stateful` (MCP 2026-07-28, sessionless requests, state in handles). A fork starts as a copy of
its source as the source's last completed call left it and then goes its own way, and its
answer names the new sandbox in the `Sandbox-Id` response header, for a load balancer's stick
table; with `--state-dir` another replica continues it. Another principal's handle cannot be
forked: tests/sdk_v2/test_auth.py."""

import json
import os
import re
import signal
import urllib.error
import urllib.request

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from conftest import CALL_TIMEOUT, INIT_TIMEOUT, TOOL, http_server, warm_zygote_service

pytestmark = pytest.mark.anyio

HANDLE = re.compile(r"sbx_[A-Za-z0-9_-]{22}")
RAW_VERSION = "2026-07-28"
RAW_META = {"io.modelcontextprotocol/protocolVersion": RAW_VERSION,
            "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.fixture(scope="module")
def base():
    # Every interpreter of the server forked from a ready zygote service: forks need it.
    warm_zygote_service("--stateful", "--workers", "2")
    with http_server("streamable-http", "--stateful", "--workers", "2") as url:
        yield url


def client_for(base):
    return Client(StreamableHttpTransport(f"{base}/mcp"), init_timeout=INIT_TIMEOUT, timeout=CALL_TIMEOUT)


async def run(client, code, sandbox_id):
    result = await client.call_tool(TOOL, {"python_code": code, "sandbox_id": sandbox_id})
    assert not result.is_error, result
    return result.structured_content


def post(base, message, headers=None):
    """(status, headers, body text) of a raw JSON-RPC POST to /mcp (MCP 2026-07-28, sessionless)."""
    message = {**message, "params": {**message.get("params", {}), "_meta": RAW_META}}
    routing = {"Mcp-Method": message["method"]}
    if message["method"] == "tools/call":
        routing["Mcp-Name"] = message["params"]["name"]
    request = urllib.request.Request(
        f"{base}/mcp", data=json.dumps(message).encode(), method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                 "MCP-Protocol-Version": RAW_VERSION, **routing, **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


async def test_a_fork_starts_as_a_copy_and_then_goes_its_own_way(base):
    async with client_for(base) as client:
        assert client.protocol_version == RAW_VERSION
        tools = {t.name: t for t in await client.list_tools()}
        assert tools["fork_sandbox"].input_schema["properties"]["sandbox_id"]["x-mcp-header"] == "Sandbox-Id"
        source = (await client.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
        await run(client, "import json\nx = 41\nopen('notes.txt', 'w').write('from the source')", source)

        made = await client.call_tool("fork_sandbox", {"sandbox_id": source})
        assert not made.is_error, made
        fork = made.structured_content["sandbox_id"]
        assert HANDLE.fullmatch(fork) and fork != source and fork in made.content[0].text, made

        forked = await run(client, "x += 1\njson.dumps([x, open('notes.txt').read()])", fork)
        assert forked["return_value"] == '[42, "from the source"]', forked
        assert forked["sandbox_id"] == fork and forked["state"].startswith("forked:"), forked
        assert source not in forked["state"], forked
        kept = await run(client, "x", source)
        assert kept["return_value"] == 41 and "state" not in kept, kept
        await run(client, "y = 'fork only'", fork)
        missing = await client.call_tool(TOOL, {"python_code": "y", "sandbox_id": source}, raise_on_error=False)
        assert missing.structured_content["status"] == "run-error" and "NameError" in missing.content[0].text

        # Forked again, the fork carries its own state on.
        again = (await client.call_tool("fork_sandbox", {"sandbox_id": fork})).structured_content["sandbox_id"]
        assert (await run(client, "(x, y)", again))["return_value"] == [42, "fork only"]


def forks(base, how):
    """The server's count of forks whose copy got its interpreter state `how`."""
    sample = f'mcp_run_python_sandbox_forks_total{{interpreter="{how}"}} '
    with urllib.request.urlopen(f"{base}/metrics", timeout=CALL_TIMEOUT) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(sample):
                return float(line.split()[1])
    return 0.0


async def test_a_fork_takes_the_source_s_interpreter_and_the_source_resumes_quietly(base):
    """The source's interpreter holds exactly the state a fork starts from: the copy takes it
    (its first call restores nothing) and the source resumes its checkpoint into a new one,
    saying nothing, since nothing was lost. Twice in a row, and with `random` reseeded."""
    async with client_for(base) as client:
        source = (await client.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
        await run(client, "import random\nx = 41\nopen('f.txt', 'w').write('kept')", source)
        before = forks(base, "handed_over")
        first = (await client.call_tool("fork_sandbox", {"sandbox_id": source})).structured_content["sandbox_id"]
        assert forks(base, "handed_over") == before + 1
        copied = await run(client, "[x + 1, open('f.txt').read(), random.random()]", first)
        assert copied["return_value"][:2] == [42, "kept"], copied
        assert copied["state"].startswith("forked:") and "f.txt" in copied["state"], copied
        kept = await run(client, "[x, open('f.txt').read(), random.random()]", source)
        assert kept["return_value"][:2] == [41, "kept"] and "state" not in kept, kept
        assert kept["return_value"][2] != copied["return_value"][2], "random is reseeded in the copy"
        second = (await client.call_tool("fork_sandbox", {"sandbox_id": source})).structured_content["sandbox_id"]
        assert (await run(client, "x", second))["return_value"] == 41
        assert (await run(client, "x", source))["return_value"] == 41


async def test_the_answer_names_the_new_sandbox_in_a_response_header(base):
    status, headers, body = post(base, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                        "params": {"name": "create_sandbox", "arguments": {}}})
    assert status == 200, body
    source = headers["Sandbox-Id"]
    assert source in body, body
    status, headers, body = post(base, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                        "params": {"name": "fork_sandbox", "arguments": {"sandbox_id": source}}},
                                 {"Mcp-Param-Sandbox-Id": source})
    assert status == 200, body
    fork = headers["Sandbox-Id"]
    assert HANDLE.fullmatch(fork) and fork != source and fork in body, body
    # The header must agree with the body's `sandbox_id`, the source's.
    status, _, body = post(base, {"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                                  "params": {"name": "fork_sandbox", "arguments": {"sandbox_id": source}}},
                           {"Mcp-Param-Sandbox-Id": fork})
    assert status == 400 and json.loads(body)["error"]["code"] == -32020, body


async def test_a_fork_is_saved_to_the_state_directory_with_its_state(tmp_path):
    """With `--state-dir` the fork is saved as create_sandbox's sandboxes are, its interpreter
    state included: after the replica that made it is SIGKILLed, another one continues it."""
    args = ("--stateful", "--workers", "1", "--state-dir", str(tmp_path))
    warm_zygote_service(*args)
    with http_server("streamable-http", *args, may_be_killed=True) as a:
        async with client_for(a) as on_a:
            await on_a.list_tools()
            source = (await on_a.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
            await run(on_a, "import json\nx = 41\nopen('n.txt', 'w').write('kept')", source)
            fork = (await on_a.call_tool("fork_sandbox", {"sandbox_id": source})).structured_content["sandbox_id"]
        os.kill(a.pid, signal.SIGKILL)
    with http_server("streamable-http", *args) as b:
        async with client_for(b) as on_b:
            await on_b.list_tools()
            moved = await run(on_b, "x += 1\njson.dumps([x, open('n.txt').read()])", fork)
            assert moved["return_value"] == '[42, "kept"]', moved
            assert moved["state"].startswith("restored:") and "are back" in moved["state"], moved
            assert (await run(on_b, "x", source))["return_value"] == 41

"""A call's notifications come before its result, on every transport (issue 48;
src/server/transport/request_streams.rs): its output lines (`notifications/message`) and its
progress (`notifications/progress`) travel on the request's own stream, so a client that stops
reading at the result has them all.

Over streamable HTTP with a session, rmcp sent the lines on the session's `GET` stream, which
raced the result on the POST's: the raw test reads the POST's stream alone, so it fails on the
old route whatever the timing."""

import contextlib
import json

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

from conftest import BINARY, CALL_TIMEOUT, SHARED_CACHE, http_server, server_env
from raw_http import SSE_DATA_PREFIX, start_session

pytestmark = pytest.mark.anyio

# Lines printed around a pause longer than the progress interval (2 s), so that a progress
# notification falls between them.
CODE = "import time\nprint('one')\ntime.sleep(2.5)\nprint('two')\n3"
LINES = ["one", "two"]


def messages_of(sse_text):
    """The JSON-RPC messages of an SSE body, in order."""
    return [json.loads(line.removeprefix(SSE_DATA_PREFIX)) for line in sse_text.splitlines()
            if line.startswith(SSE_DATA_PREFIX + "{")]


@pytest.mark.parametrize("flags", [[], ["--stateful"]])
async def test_the_lines_and_progress_come_on_the_requests_stream_before_its_result(flags):
    with http_server("streamable-http", *flags) as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as http:
            headers = await start_session(http, base)
            r = await http.post(f"{base}/mcp", headers=headers, json={
                "jsonrpc": "2.0", "id": 2, "method": "logging/setLevel", "params": {"level": "info"}})
            assert r.status_code == 200, r.text
            r = await http.post(f"{base}/mcp", headers=headers, json={
                "jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
                    "name": "run_python_code", "arguments": {"python_code": CODE},
                    "_meta": {"progressToken": "p"}}})
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r
    messages = messages_of(r.text)
    assert messages[-1].get("id") == 3 and "result" in messages[-1], messages
    kinds = [m.get("method") for m in messages[:-1]]
    lines = [m["params"]["data"] for m in messages if m.get("method") == "notifications/message"]
    assert lines == LINES, messages
    first, second = kinds.index("notifications/message"), len(kinds) - 1 - kinds[::-1].index("notifications/message")
    assert "notifications/progress" in kinds[first:second], kinds


@contextlib.asynccontextmanager
async def streams(mode, base):
    """The read and write streams of an `mcp` client connection over `mode`."""
    if mode == "stdio":
        params = StdioServerParameters(command=BINARY, args=["stdio", "--cache-dir", SHARED_CACHE], env=server_env())
        async with stdio_client(params) as (read, write):
            yield read, write
    elif mode == "sse":
        async with sse_client(f"{base}/sse", sse_read_timeout=CALL_TIMEOUT) as (read, write):
            yield read, write
    else:
        async with streamablehttp_client(f"{base}/mcp", sse_read_timeout=CALL_TIMEOUT) as (read, write, _):
            yield read, write


@pytest.mark.parametrize("mode", ["stdio", "streamable-http", "sse"])
async def test_a_client_has_every_line_when_the_call_returns(mode):
    lines = []

    async def on_message(message):
        if isinstance(message, types.ServerNotification) and isinstance(message.root, types.LoggingMessageNotification):
            lines.append(message.root.params.data)

    with contextlib.ExitStack() as stack:
        base = None if mode == "stdio" else stack.enter_context(http_server(mode))
        async with streams(mode, base) as (read, write):
            async with ClientSession(read, write, message_handler=on_message) as session:
                await session.initialize()
                await session.set_logging_level("info")
                await session.call_tool("run_python_code", {"python_code": CODE})
                assert lines == LINES

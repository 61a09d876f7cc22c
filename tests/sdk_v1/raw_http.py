"""JSON-RPC over raw HTTP (httpx, no MCP client), shared by test_http.py and test_dropin_http.py:
the headers, messages and response parsing that the tests of what clients must not be able to
break start from."""

import contextlib
import json

# What the streamable HTTP transport requires of a POST (MCP spec: both media types accepted).
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
PROTOCOL = "2025-06-18"
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
# How a server-sent event's data line starts (the JSON-RPC message follows).
SSE_DATA_PREFIX = "data: "


def call_message(id_, code):
    """A `tools/call` request of run_python_code with `code`."""
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call",
            "params": {"name": "run_python_code", "arguments": {"python_code": code}}}


def rpc_result(response):
    """The JSON-RPC message of a JSON or SSE response."""
    if response.headers["content-type"].startswith("application/json"):
        return response.json()
    for line in response.text.splitlines():
        if line.startswith(SSE_DATA_PREFIX + "{"):
            return json.loads(line.removeprefix(SSE_DATA_PREFIX))
    raise AssertionError(response.text)


async def start_session(client, base):
    """A stateful streamable-HTTP session started by hand: its headers for later requests."""
    r = await client.post(f"{base}/mcp", json=INIT, headers=ACCEPT)
    assert r.status_code == 200, r.text
    headers = {**ACCEPT, "Mcp-Session-Id": r.headers["mcp-session-id"], "Mcp-Protocol-Version": PROTOCOL}
    r = await client.post(f"{base}/mcp", json=INITIALIZED, headers=headers)
    assert r.status_code == 202 and r.content == b"", r
    return headers


@contextlib.asynccontextmanager
async def sse_session_by_hand(client, base):
    """A legacy SSE session started by hand (stream opened, `initialize` and `initialized`
    POSTed): yields its message endpoint (a full URL) and the stream's line iterator."""
    async with client.stream("GET", f"{base}/sse") as stream:
        lines = stream.aiter_lines()
        endpoint = None
        async for line in lines:
            if line.startswith(SSE_DATA_PREFIX + "/messages"):
                endpoint = f"{base}{line.removeprefix(SSE_DATA_PREFIX)}"
                break
        assert endpoint, "the stream ended before its endpoint event"
        for message in (INIT, INITIALIZED):
            r = await client.post(endpoint, json=message)
            assert r.status_code == 202, r.text
        yield endpoint, lines


async def sse_message(lines, id_):
    """The JSON-RPC message with `id_` from an SSE stream's lines, or None if the stream ends
    before it."""
    async for line in lines:
        if line.startswith(SSE_DATA_PREFIX + "{"):
            message = json.loads(line.removeprefix(SSE_DATA_PREFIX))
            if message.get("id") == id_:
                return message
    return None

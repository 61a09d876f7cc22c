"""JSON-RPC over raw HTTP (httpx, no MCP client), shared by test_http.py and test_dropin_http.py:
the headers, messages and response parsing that the tests of what clients must not be able to
break start from."""

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

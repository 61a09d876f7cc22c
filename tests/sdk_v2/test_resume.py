"""Resumable streams (README "Running many replicas"; MCP spec 2025-11-25, streamable HTTP, "Resumability and
Redelivery"): a raw-HTTP client that drops its SSE stream mid-call and reconnects with
`Last-Event-ID` gets the call's result, for a sessionless 2026-07-28 request and for a
2025-11-25 session."""

import json
import socket
import time
import urllib.request


from conftest import CALL_TIMEOUT, TOOL, http_server

# Seconds the call runs: long enough to drop the stream while it runs.
CALL_SECONDS = 2
MODERN = "2026-07-28"
META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}
CODE = f"import time\ntime.sleep({CALL_SECONDS})\n'resumed'"


def events(response):
    """The SSE events of `response` as (id, data) pairs, read as they come."""
    event_id, data = None, []
    for raw in response:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("id:"):
            event_id = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "":
            if event_id is not None or data:
                yield event_id, "\n".join(data)
            event_id, data = None, []


def start_call(base, headers, message):
    request = urllib.request.Request(
        f"{base}/mcp", data=json.dumps(message).encode(), method="POST",
        headers={"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
    return urllib.request.urlopen(request, timeout=CALL_TIMEOUT)


def first_event_id_then_drop(response):
    """Reads the stream's first event with an id (the priming event), then drops the connection."""
    for event_id, _ in events(response):
        if event_id:
            break
    # Shut the socket down under the reader: the server sees the client go away mid-call.
    response.fp.raw._sock.shutdown(socket.SHUT_RDWR)
    response.close()
    return event_id


def resume(base, headers, last_event_id):
    request = urllib.request.Request(f"{base}/mcp", method="GET", headers={
        "Accept": "text/event-stream", "Last-Event-ID": last_event_id, **headers})
    deadline = time.monotonic() + CALL_TIMEOUT
    while time.monotonic() < deadline:
        # A replay is what was stored so far: poll until the result is there (the server's
        # `retry` hint says how often).
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as r:
            for event_id, data in events(r):
                if data:
                    message = json.loads(data)
                    if message.get("id") == 5:
                        return message
                if event_id:
                    last_event_id = event_id
                    request.headers["Last-event-id"] = last_event_id
        time.sleep(0.5)
    raise AssertionError("the result never came")


def test_a_sessionless_call_is_resumed_after_its_stream_drops():
    with http_server("streamable-http", "--workers", "1") as base:
        headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": TOOL}
        call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                "params": {"name": TOOL, "arguments": {"python_code": CODE}, "_meta": META}}
        last = first_event_id_then_drop(start_call(base, headers, call))
        assert last, "the stream's first event carries an id"
        result = resume(base, {"MCP-Protocol-Version": MODERN}, last)
        assert "resumed" in result["result"]["content"][0]["text"], result


def test_a_session_call_is_resumed_after_its_stream_drops():
    with http_server("streamable-http", "--workers", "1") as base:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "raw", "version": "1"}}}
        with start_call(base, {}, init) as r:
            session = r.headers["Mcp-Session-Id"]
            r.read()
        headers = {"Mcp-Session-Id": session, "MCP-Protocol-Version": "2025-11-25"}
        with start_call(base, headers, {"jsonrpc": "2.0", "method": "notifications/initialized"}) as r:
            r.read()
        call = {"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                "params": {"name": TOOL, "arguments": {"python_code": CODE}}}
        last = first_event_id_then_drop(start_call(base, headers, call))
        assert last
        result = resume(base, headers, last)
        assert "resumed" in result["result"]["content"][0]["text"], result



"""The drop-in (README "Differences from the Deno original") through the real binary: HTTP status codes (DELETE ends a
session with 200), DNS-rebinding protection (Origin and Host), tools answered on stdio without
`initialize`, and one wording per failure whatever the transport."""

import json
import logging
import queue
import socket
import subprocess
import threading

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from conftest import BINARY, CALL_TIMEOUT, SHARED_CACHE, http_server, server_env
from raw_http import ACCEPT, INIT, INITIALIZED, PROTOCOL, call_message, rpc_result, start_session

# Bytes that are not JSON, and JSON that is not a JSON-RPC message (`method` must be a string).
NOT_JSON = b"{not json"
NOT_A_MESSAGE = b'{"jsonrpc":"2.0","id":7,"method":5}'

# The exact errors of src/server/errors.rs.
PARSE_ERROR = {"code": -32700, "message": "Parse error: key must be a string at line 1 column 2"}
SESSION_REQUIRED = {"code": -32600, "message": "Bad Request: a session id is required"}
UNKNOWN_SESSION = {"code": -32001, "message": "Session not found: it has ended (closed, or idle longer than the server's --session-idle-timeout; its interpreter and any state are gone) or never existed; start a new session"}
FORBIDDEN_ORIGIN = {"code": -32000, "message": "Forbidden: the Origin header is not allowed (DNS-rebinding protection; see --allow-origin)"}
FORBIDDEN_HOST = {"code": -32000, "message": "Forbidden: the Host header is not allowed (DNS-rebinding protection; see --allow-host)"}
MAX_CODE_SIZE = 1000
# `max_body_bytes` in src/server/transport/http.rs: twice the code cap plus 64 KiB.
MAX_BODY = 2 * MAX_CODE_SIZE + 64 * 1024
TOO_LARGE = {"code": -32600, "message": f"Invalid Request: the message is larger than {MAX_BODY} bytes"}
SESSIONS_FULL = {"code": -32000, "message": "the server has reached its limit of 1 live sessions (--max-sessions); "
                                            "close a session or try again later"}


def error_of(response, status, id_=None):
    """The JSON-RPC error of an HTTP refusal, after checking its status and envelope."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert body["jsonrpc"] == "2.0" and body["id"] == id_, body
    return body["error"]


async def open_sse(client, base):
    """An open SSE stream and its message endpoint."""
    stream = client.stream("GET", f"{base}/sse")
    response = await stream.__aenter__()
    assert response.status_code == 200
    lines = response.aiter_lines()
    assert await anext(lines) == "event: endpoint"
    endpoint = (await anext(lines)).removeprefix("data: ")
    # The line iterator is kept with the stream: dropping it would close the response.
    stream.lines = lines
    return stream, endpoint


class StdioPipe:
    """`mcp-run-python stdio` over raw pipes: lines in, JSON-RPC messages out."""

    def __init__(self, *args):
        self.proc = subprocess.Popen(
            [BINARY, "stdio", "--cache-dir", SHARED_CACHE, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=server_env(),
        )
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, data):
        if isinstance(data, dict):
            data = json.dumps(data).encode()
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def receive(self, timeout=CALL_TIMEOUT):
        line = self.lines.get(timeout=timeout)
        assert line is not None, "the server closed stdout"
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# Item 5: DELETE ends a session with 200, and the `mcp` client no longer logs a failure.
@pytest.mark.anyio
async def test_delete_ends_a_session_with_200(caplog):
    with http_server("streamable_http", "--workers", "1") as base:
        with caplog.at_level(logging.DEBUG, logger="mcp.client.streamable_http"):
            async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    assert (await session.list_tools()).tools[0].name == "run_python_code"
        failures = [r.getMessage() for r in caplog.records if "Session termination failed" in r.getMessage()]
        assert failures == []

        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            headers = await start_session(client, base)
            r = await client.delete(f"{base}/mcp", headers=headers)
            assert r.status_code == 200 and r.content == b"", r
            # The session is gone: the same id is now unknown (404), for DELETE as for POST.
            assert error_of(await client.delete(f"{base}/mcp", headers=headers), 404) == UNKNOWN_SESSION
            r = await client.post(f"{base}/mcp", json=call_message(2, "1"), headers=headers)
            assert error_of(r, 404) == UNKNOWN_SESSION
            # No session id at all is 400.
            no_id = {k: v for k, v in headers.items() if k != "Mcp-Session-Id"}
            assert error_of(await client.delete(f"{base}/mcp", headers=no_id), 400) == SESSION_REQUIRED
            r = await client.get(f"{base}/mcp", headers={**no_id, "Accept": "text/event-stream"})
            assert error_of(r, 400) == SESSION_REQUIRED


# Item 5: the other status codes of /mcp, /sse and /messages, each with a JSON-RPC error body.
@pytest.mark.anyio
async def test_every_refusal_has_the_spec_status_and_a_json_rpc_body():
    with http_server("streamable_http", "--workers", "1") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            headers = await start_session(client, base)
            r = await client.put(f"{base}/mcp", headers=headers)
            assert error_of(r, 405) == {"code": -32000, "message": "Method Not Allowed: this endpoint accepts GET, POST, DELETE"}
            assert r.headers["allow"] == "GET, POST, DELETE"
            r = await client.post(f"{base}/mcp", json=call_message(3, "1"), headers={**headers, "Accept": "application/json"})
            assert error_of(r, 406) == {"code": -32000, "message": "Not Acceptable: Client must accept both application/json and text/event-stream"}
            r = await client.get(f"{base}/mcp", headers={**headers, "Accept": "application/json"})
            assert error_of(r, 406) == {"code": -32000, "message": "Not Acceptable: Client must accept text/event-stream"}
            r = await client.post(f"{base}/mcp", content=json.dumps(call_message(4, "1")), headers={**headers, "Content-Type": "text/plain"})
            assert error_of(r, 415) == {"code": -32000, "message": "Unsupported Media Type: Content-Type must be application/json"}
            # JSON that is no JSON-RPC message is a bad request (not rmcp's 415), answering its id.
            error = error_of(await client.post(f"{base}/mcp", content=NOT_A_MESSAGE, headers=headers), 400, 7)
            assert error["code"] == -32600 and error["message"].startswith("Invalid Request: ")
            r = await client.post(f"{base}/mcp", json=[call_message(5, "1")], headers=headers)
            assert error_of(r, 400)["code"] == -32600
            r = await client.post(f"{base}/mcp", json=call_message(6, "1"), headers={**headers, "Mcp-Protocol-Version": "1999-01-01"})
            assert error_of(r, 400) == {"code": -32600, "message": "Bad Request: Unsupported MCP-Protocol-Version: 1999-01-01"}
            # Notifications and responses are accepted with 202 and no body.
            r = await client.post(f"{base}/mcp", json={"jsonrpc": "2.0", "method": "notifications/cancelled",
                                                       "params": {"requestId": 99}}, headers=headers)
            assert r.status_code == 202 and r.content == b""
            r = await client.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 123, "result": {}}, headers=headers)
            assert r.status_code == 202 and r.content == b""
            r = await client.get(f"{base}/elsewhere")
            assert error_of(r, 404) == {"code": -32000, "message": "Not Found: the MCP endpoint is /mcp"}

    with http_server("streamable_http_stateless", "--workers", "1") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            for method in ("GET", "DELETE"):
                r = await client.request(method, f"{base}/mcp", headers=ACCEPT)
                assert error_of(r, 405) == {"code": -32000, "message": "Method Not Allowed: this endpoint accepts POST"}
                assert r.headers["allow"] == "POST"
            r = await client.post(f"{base}/mcp", json=INITIALIZED, headers=ACCEPT)
            assert r.status_code == 202 and r.content == b""

    with http_server("sse", "--workers", "1") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            r = await client.post(f"{base}/sse")
            assert error_of(r, 405) == {"code": -32000, "message": "Method Not Allowed: this endpoint accepts GET,HEAD"}
            assert r.headers["allow"] == "GET,HEAD"
            r = await client.get(f"{base}/messages")
            assert error_of(r, 405) == {"code": -32000, "message": "Method Not Allowed: this endpoint accepts POST"}
            assert error_of(await client.post(f"{base}/messages", json=INIT), 400) == SESSION_REQUIRED
            r = await client.post(f"{base}/messages?session_id=nope", json=INIT)
            assert error_of(r, 404) == UNKNOWN_SESSION
            r = await client.get(f"{base}/mcp")
            assert error_of(r, 404) == {"code": -32000, "message": "Not Found: the MCP endpoints are /sse and /messages"}
            stream, endpoint = await open_sse(client, base)
            try:
                r = await client.post(f"{base}{endpoint}", json=INIT)
                assert r.status_code == 202 and r.content == b""
            finally:
                await stream.__aexit__(None, None, None)


def answer_to_a_withheld_body(base, path):
    """The status and headers of the answer to a POST of `path` whose body is announced
    (Content-Length) but never sent: whatever is answered before the body was read."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                     f"Accept: application/json, text/event-stream\r\nContent-Length: 100\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            assert chunk, head
            head += chunk
    status, *lines = head.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
    return int(status.split()[1]), {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}


# An answer given before the request's body was read is followed by hyper closing the
# connection; it must say so, or a keep-alive client sends its next request down a connection
# that is going away ("Server disconnected without sending a response", a race on whether the
# body came in the same TCP segment as the headers).
def test_answers_before_the_body_is_read_say_connection_close():
    with http_server("sse", "--workers", "1") as base:
        for path, status in (("/messages?session_id=nope", 404), ("/messages", 400), ("/elsewhere", 404)):
            got, headers = answer_to_a_withheld_body(base, path)
            assert (got, headers.get("connection")) == (status, "close"), path
    with http_server("streamable_http", "--workers", "1") as base:
        got, headers = answer_to_a_withheld_body(base, "/elsewhere")
        assert (got, headers.get("connection")) == (404, "close")


# Item 6: DNS-rebinding protection on every endpoint of every HTTP mode.
@pytest.mark.anyio
async def test_foreign_origins_and_hosts_get_403():
    evil_origin = {"Origin": "http://evil.example"}
    evil_host = {"Host": "evil.example:3001"}
    with http_server("streamable_http", "--workers", "1") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            for bad, expected in ((evil_origin, FORBIDDEN_ORIGIN), ({"Origin": "null"}, FORBIDDEN_ORIGIN),
                                  (evil_host, FORBIDDEN_HOST)):
                r = await client.post(f"{base}/mcp", json=INIT, headers={**ACCEPT, **bad})
                assert error_of(r, 403) == expected
                assert "mcp-session-id" not in r.headers
            headers = await start_session(client, base)
            for method in ("GET", "POST", "DELETE"):
                for bad, expected in ((evil_origin, FORBIDDEN_ORIGIN), (evil_host, FORBIDDEN_HOST)):
                    r = await client.request(method, f"{base}/mcp", json=call_message(2, "1"), headers={**headers, **bad})
                    assert error_of(r, 403) == expected, method
                    # The refused body is never read: the connection is closed, and said so.
                    assert r.headers.get("connection") == "close", method
            # Loopback origins pass: a page served by this machine may talk to it.
            for ok in ("http://localhost:5173", "http://127.0.0.1:8000", "https://[::1]"):
                r = await client.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"},
                                      headers={**headers, "Origin": ok})
                assert r.status_code == 200, (ok, r.text)
                assert rpc_result(r)["result"]["tools"][0]["name"] == "run_python_code"
                # CORS: the page may read the answer and the session id it must send back.
                assert r.headers["access-control-allow-origin"] == ok, r.headers
                assert "mcp-session-id" in r.headers["access-control-expose-headers"].lower(), r.headers
            r = await client.post(f"{base}/mcp", json=INIT, headers={**ACCEPT, "Host": "localhost"})
            assert r.status_code == 200

    with http_server("streamable_http_stateless", "--workers", "1",
                     "--allow-origin", "https://app.example,null", "--allow-host", "mcp.example") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            tools = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
            for ok in ({"Origin": "https://app.example"}, {"Origin": "null"}, {"Host": "mcp.example:3001"}):
                r = await client.post(f"{base}/mcp", json=tools, headers={**ACCEPT, **ok})
                assert r.status_code == 200, (ok, r.text)
            r = await client.post(f"{base}/mcp", json=tools, headers={**ACCEPT, "Origin": "https://app.example:8443"})
            assert error_of(r, 403) == FORBIDDEN_ORIGIN
            r = await client.post(f"{base}/mcp", json=tools, headers={**ACCEPT, **evil_host})
            assert error_of(r, 403) == FORBIDDEN_HOST
            # A browser page at an --allow-origin origin: its CORS preflight is answered, and it
            # may read the answers.
            preflight = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST",
                         "Access-Control-Request-Headers": "content-type, mcp-protocol-version"}
            r = await client.options(f"{base}/mcp", headers=preflight)
            assert r.status_code == 200, r.text
            assert r.headers["access-control-allow-origin"] == "https://app.example", r.headers
            assert "POST" in r.headers["access-control-allow-methods"], r.headers
            assert "mcp-protocol-version" in r.headers["access-control-allow-headers"].lower(), r.headers
            r = await client.post(f"{base}/mcp", json=tools, headers={**ACCEPT, "Origin": "https://app.example"})
            assert r.headers["access-control-allow-origin"] == "https://app.example", r.headers
            # Another origin is refused before CORS, and learns nothing from a preflight.
            r = await client.options(f"{base}/mcp", headers={**preflight, "Origin": "https://app.example:8443"})
            assert error_of(r, 403) == FORBIDDEN_ORIGIN
            assert "access-control-allow-origin" not in r.headers
            # A request that is not from a browser page carries no Origin and gets no CORS header.
            r = await client.post(f"{base}/mcp", json=tools, headers=ACCEPT)
            assert r.status_code == 200 and "access-control-allow-origin" not in r.headers

    with http_server("sse", "--workers", "1") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            for bad, expected in ((evil_origin, FORBIDDEN_ORIGIN), (evil_host, FORBIDDEN_HOST)):
                assert error_of(await client.get(f"{base}/sse", headers=bad), 403) == expected
            stream, endpoint = await open_sse(client, base)
            try:
                for bad, expected in ((evil_origin, FORBIDDEN_ORIGIN), (evil_host, FORBIDDEN_HOST)):
                    r = await client.post(f"{base}{endpoint}", json=INIT, headers=bad)
                    assert error_of(r, 403) == expected
                r = await client.post(f"{base}{endpoint}", json=INIT, headers={"Origin": "http://localhost:3000"})
                assert r.status_code == 202
            finally:
                await stream.__aexit__(None, None, None)


# Item 8: tools/list and tools/call on stdio without `initialize`, answered in order.
def test_stdio_answers_tools_without_initialize():
    pipe = StdioPipe("--workers", "1")
    try:
        pipe.send({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        pipe.send(call_message(2, "print('no handshake')\n6 * 7"))
        listed = pipe.receive()
        assert listed["id"] == 1, listed
        assert [t["name"] for t in listed["result"]["tools"]] == ["run_python_code"]
        called = pipe.receive()
        assert called["id"] == 2, called
        assert called["result"]["content"][0]["text"] == (
            "<status>success</status>\n<output>\nno handshake\n</output>\n<return_value>\n42\n</return_value>")
        # The session goes on as any other: a later ping is answered with its own id.
        pipe.send({"jsonrpc": "2.0", "id": "p", "method": "ping"})
        assert pipe.receive(timeout=60) == {"jsonrpc": "2.0", "id": "p", "result": {}}
    finally:
        pipe.close()


# Item 9: the same failure gets the same JSON-RPC error on stdio, streamable HTTP and SSE.
@pytest.mark.anyio
async def test_one_wording_per_failure_on_every_transport():
    too_large_body = json.dumps(call_message(9, "x" * MAX_BODY)).encode()

    pipe = StdioPipe("--workers", "1", "--max-code-size", str(MAX_CODE_SIZE))
    try:
        pipe.send(NOT_JSON)
        stdio_parse = pipe.receive(timeout=60)
        pipe.send(NOT_A_MESSAGE)
        stdio_invalid = pipe.receive(timeout=60)
        pipe.send(too_large_body)
        stdio_too_large = pipe.receive(timeout=60)
        # The TypeScript SDK writes the id last: it is read from the message's last bytes.
        id_last = call_message(9, "x" * MAX_BODY)
        id_last = {**{k: v for k, v in id_last.items() if k != "id"}, "id": "ts-10"}
        pipe.send(id_last)
        stdio_id_last = pipe.receive(timeout=60)
    finally:
        pipe.close()
    assert stdio_parse == {"jsonrpc": "2.0", "id": None, "error": PARSE_ERROR}
    assert stdio_invalid["id"] == 7 and stdio_invalid["error"]["code"] == -32600
    # Too large to parse, yet answered with its own id (read from the message's first bytes).
    assert stdio_too_large == {"jsonrpc": "2.0", "id": 9, "error": TOO_LARGE}
    assert stdio_id_last == {"jsonrpc": "2.0", "id": "ts-10", "error": TOO_LARGE}

    args = ("--workers", "1", "--max-code-size", str(MAX_CODE_SIZE), "--max-sessions", "1")
    with http_server("streamable_http", *args) as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            headers = await start_session(client, base)
            assert error_of(await client.post(f"{base}/mcp", content=NOT_JSON, headers=headers), 400) == PARSE_ERROR
            assert error_of(await client.post(f"{base}/mcp", content=NOT_A_MESSAGE, headers=headers), 400, 7) == stdio_invalid["error"]
            assert error_of(await client.post(f"{base}/mcp", content=too_large_body, headers=headers), 413, 9) == TOO_LARGE
            r = await client.post(f"{base}/mcp", json=call_message(2, "1"), headers={**headers, "Mcp-Session-Id": "nope"})
            assert error_of(r, 404) == UNKNOWN_SESSION
            no_id = {k: v for k, v in headers.items() if k != "Mcp-Session-Id"}
            assert error_of(await client.post(f"{base}/mcp", json=call_message(3, "1"), headers=no_id), 400) == SESSION_REQUIRED
            assert error_of(await client.post(f"{base}/mcp", json=INIT, headers=ACCEPT), 503) == SESSIONS_FULL

    with http_server("sse", *args) as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            stream, endpoint = await open_sse(client, base)
            try:
                url = f"{base}{endpoint}"
                assert error_of(await client.post(url, content=NOT_JSON), 400) == PARSE_ERROR
                assert error_of(await client.post(url, content=NOT_A_MESSAGE), 400, 7) == stdio_invalid["error"]
                assert error_of(await client.post(url, content=too_large_body), 413, 9) == TOO_LARGE
                assert error_of(await client.post(f"{base}/messages?session_id=nope", json=INIT), 404) == UNKNOWN_SESSION
                assert error_of(await client.post(f"{base}/messages", json=INIT), 400) == SESSION_REQUIRED
                assert error_of(await client.get(f"{base}/sse"), 503) == SESSIONS_FULL
            finally:
                await stream.__aexit__(None, None, None)

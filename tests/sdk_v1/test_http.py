"""Streamable HTTP (stateful and stateless) and legacy SSE with the real Python `mcp` client,
plus raw HTTP for what clients must not be able to break."""

import datetime
import json

import anyio
import httpx
import pytest
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamablehttp_client

from conftest import CALL_TIMEOUT, http_server, run
from raw_http import ACCEPT, INIT, INITIALIZED, PROTOCOL, call_message, rpc_result

pytestmark = pytest.mark.anyio


async def check_session(session):
    tools = await session.list_tools()
    assert [t.name for t in tools.tools] == ["run_python_code"]
    text = await run(session, "print('over http')\n[1, 2]")
    assert text == "<status>success</status>\n<output>\nover http\n</output>\n<return_value>\n[\n  1,\n  2\n]\n</return_value>"


async def test_streamable_http_and_sse_with_the_mcp_client():
    with http_server("streamable_http", "--workers", "1") as base:
        async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await check_session(session)
    with http_server("sse", "--workers", "1") as base:
        async with sse_client(f"{base}/sse", sse_read_timeout=CALL_TIMEOUT) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await check_session(session)
    with http_server("streamable_http_stateless", "--workers", "1") as base:
        async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await check_session(session)


async def test_stateless_calls_need_no_session():
    with http_server("streamable_http_stateless", "--workers", "1") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            for i, code in enumerate(["1 + 1", "'two calls'"]):
                r = await client.post(f"{base}/mcp", json=call_message(i + 1, code), headers=ACCEPT)
                assert r.status_code == 200, r.text
                assert "mcp-session-id" not in r.headers
                text = rpc_result(r)["result"]["content"][0]["text"]
                assert text.startswith("<status>success</status>\n<return_value>\n")
            assert "two calls" in text


async def test_session_lifecycle_and_bad_input():
    with http_server("streamable_http", "--workers", "1", "--max-code-size", "1000") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            r = await client.post(f"{base}/mcp", json=INIT, headers=ACCEPT)
            assert r.status_code == 200
            sid = r.headers["mcp-session-id"]
            headers = {**ACCEPT, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": PROTOCOL}
            r = await client.post(f"{base}/mcp", json=INITIALIZED, headers=headers)
            assert r.status_code == 202

            async def expect(response, status, code):
                assert response.status_code == status, response.text
                body = response.json()
                assert body["jsonrpc"] == "2.0" and body["error"]["code"] == code, body

            assert (await client.get(f"{base}/nope")).status_code == 404
            assert (await client.put(f"{base}/mcp", headers=headers)).status_code == 405
            await expect(await client.post(f"{base}/mcp", json=call_message(2, "1"), headers=ACCEPT), 400, -32600)
            await expect(await client.post(f"{base}/mcp", content=b'{"jsonrpc":', headers=headers), 400, -32700)
            await expect(await client.post(f"{base}/mcp", content=b"x" * 5_000_000, headers=headers), 413, -32600)
            # An unknown session id is 404 (MCP spec: the client must start a new session).
            await expect(await client.post(f"{base}/mcp", json=call_message(3, "1"), headers={**headers, "Mcp-Session-Id": "nope"}), 404, -32001)
            # Code over the cap is an MCP error inside a normal response.
            r = await client.post(f"{base}/mcp", json=call_message(4, "x" * 1001), headers=headers)
            assert "more than the limit" in rpc_result(r)["error"]["message"]

            # GET /mcp opens the server-to-client event stream of the session.
            async with client.stream("GET", f"{base}/mcp", headers={**headers, "Accept": "text/event-stream"}) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")

            # The session still works, and DELETE ends it.
            r = await client.post(f"{base}/mcp", json=call_message(5, "6 * 7"), headers=headers)
            assert rpc_result(r)["result"]["content"][0]["text"].endswith("<return_value>\n42\n</return_value>")
            assert (await client.delete(f"{base}/mcp", headers=headers)).status_code in (200, 202, 204)
            r = await client.post(f"{base}/mcp", json=call_message(6, "1"), headers=headers)
            assert r.status_code == 404

    with http_server("sse", "--workers", "1") as base:
        async with httpx.AsyncClient(timeout=CALL_TIMEOUT) as client:
            assert (await client.post(f"{base}/sse")).status_code == 405
            assert (await client.get(f"{base}/messages")).status_code == 405
            r = await client.post(f"{base}/messages", json=INIT)
            assert r.status_code == 400 and r.json()["error"]["code"] == -32600
            r = await client.post(f"{base}/messages?session_id=nope", json=INIT)
            assert r.status_code == 404 and r.json()["error"]["code"] == -32001
            async with client.stream("GET", f"{base}/sse") as stream:
                lines = stream.aiter_lines()
                assert await anext(lines) == "event: endpoint"
                endpoint = (await anext(lines)).removeprefix("data: ")
                r = await client.post(f"{base}{endpoint}", content=b"{not json")
                assert r.status_code == 400 and r.json()["error"]["code"] == -32700
                r = await client.post(f"{base}{endpoint}", json=INIT)
                assert r.status_code == 202
                async for line in lines:
                    if line.startswith("data: "):
                        assert json.loads(line[6:])["result"]["serverInfo"]["name"] == "mcp-run-python"
                        break


async def test_eight_concurrent_clients():
    with http_server("streamable_http", "--workers", "2") as base:
        async def client(n):
            async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    for i in range(25):
                        text = await run(session, f"print({n})\n{n} * 1000 + {i}")
                        assert text == f"<status>success</status>\n<output>\n{n}\n</output>\n<return_value>\n{n * 1000 + i}\n</return_value>"

        async with anyio.create_task_group() as tg:
            for n in range(8):
                tg.start_soon(client, n)


async def test_a_client_that_leaves_mid_call_does_not_wedge_the_queue():
    with http_server("streamable_http", "--workers", "1") as base:
        async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                assert await run(session, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"
        # This client gives up after one second of a three-second call and disconnects.
        with pytest.raises(Exception):
            async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    await session.call_tool(
                        "run_python_code", {"python_code": "import time\ntime.sleep(3)"},
                        read_timeout_seconds=datetime.timedelta(seconds=1),
                    )
        async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                assert await run(session, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"

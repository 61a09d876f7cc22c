"""Long runs as tasks (README "Long runs: tasks"): the MCP tasks extension (`io.modelcontextprotocol/tasks`,
SEP-2663) through fastmcp with fastmcp-tasks, the real binary over streamable HTTP and stdio.

The server runs with `--timeout 2` and `--task-timeout 120`: a call of a client that declared
the extension (every fastmcp `Client` once `fastmcp_tasks` is imported) gets the task limit and,
past a second, becomes a task; any other client's call keeps `--timeout` and runs as before."""

import asyncio
import json
import os
import signal
import time
import urllib.request

import fastmcp_tasks  # noqa: F401 (registers the tasks extension on every fastmcp Client)
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from fastmcp.exceptions import ToolError
from fastmcp_tasks import call_tool_task
from fastmcp_tasks.client_models import (
    ClientGetTaskResult,
    GetTaskRequest,
    GetTaskRequestParams,
)
from mcp.shared.exceptions import MCPError

from conftest import BINARY, CALL_TIMEOUT, INIT_TIMEOUT, SHARED_CACHE, http_server

pytestmark = pytest.mark.anyio

TOOL = "run_python_code"
PLAIN_TIMEOUT = "2"
TASK_TIMEOUT = "120"
LIMITS = ["--timeout", PLAIN_TIMEOUT, "--task-timeout", TASK_TIMEOUT]
# The issue's long run: 20 seconds, far past --timeout.
LONG_RUN = "import time\nfor i in range(4):\n    time.sleep(5)\n    print('step', i)\n'finished'"
# Seconds a cancelled task has to show `cancelled`.
CANCEL_WITHIN = 15
# Seconds between two polls of a test's own.
POLL = 0.5
PROTOCOL = "2026-07-28"
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
NO_SUCH_TASK = "it does not exist, or it expired, or it is not yours"


@pytest.fixture(scope="module")
def url():
    with http_server("streamable-http", "--workers", "2", *LIMITS) as base:
        yield f"{base}/mcp"


async def poll_until(session, task_id, done, within=CALL_TIMEOUT):
    """`tasks/get` on `session` until `done(task)`; the last task seen."""
    deadline = time.monotonic() + within
    while True:
        request = GetTaskRequest(params=GetTaskRequestParams(task_id=task_id))
        task = await session.send_request(request, ClientGetTaskResult)
        if done(task) or time.monotonic() > deadline:
            return task
        await asyncio.sleep(POLL)


def text_of(result):
    return result.content[0].text


async def test_a_long_run_becomes_a_task_polled_to_its_result(url):
    async with Client(url, timeout=CALL_TIMEOUT, init_timeout=INIT_TIMEOUT) as client:
        task = await call_tool_task(client, TOOL, {"python_code": LONG_RUN})
        assert task.task_id.startswith("task_"), task.task_id
        status = await task.status()
        assert status.status == "working", status
        assert status.poll_interval_ms and status.ttl_ms, status
        result = await task.result()
        text = text_of(result)
        assert "<status>success</status>" in text, text
        assert "step 3" in text and "finished" in text, text
        # Polled again after the end, the result is kept.
        again = await task.status()
        assert again.status == "completed", again


async def test_a_quick_call_answers_at_once(url):
    async with Client(url, timeout=CALL_TIMEOUT, init_timeout=INIT_TIMEOUT) as client:
        result = await client.call_tool(TOOL, {"python_code": "1 + 1"})
        assert "<return_value>\n2\n</return_value>" in text_of(result)
        with pytest.raises(ToolError, match="did not run as a task"):
            await call_tool_task(client, TOOL, {"python_code": "2 + 2"})


async def test_a_task_outlives_its_connection(url):
    async with Client(url, timeout=CALL_TIMEOUT, init_timeout=INIT_TIMEOUT) as client:
        code = "import time\ntime.sleep(6)\n'still here'"
        task = await call_tool_task(client, TOOL, {"python_code": code})
        task_id = task.task_id
    # The connection is gone; a new one polls the same task to its end.
    async with Client(url, timeout=CALL_TIMEOUT, init_timeout=INIT_TIMEOUT) as client:
        task = await poll_until(client.session, task_id, lambda t: t.status != "working")
        assert task.status == "completed", task
        assert "still here" in json.dumps(task.result), task


async def test_cancel_stops_the_interpreter(url):
    async with Client(url, timeout=CALL_TIMEOUT, init_timeout=INIT_TIMEOUT) as client:
        code = "import time\nwhile True:\n    time.sleep(0.1)"
        task = await call_tool_task(client, TOOL, {"python_code": code})
        await task.cancel()
        status = await poll_until(
            client.session, task.task_id, lambda t: t.status != "working", CANCEL_WITHIN
        )
        assert status.status == "cancelled", status
        # Cancelling a task that has ended is acknowledged again (idempotent).
        await task.cancel()
        result = await client.call_tool(TOOL, {"python_code": "'after'"})
        assert "after" in text_of(result)


def raw_call(url, method, params, declare=False, extra_headers=None):
    """One 2026-07-28 request without any client library: its JSON-RPC answer."""
    capabilities = {"extensions": {TASKS_EXTENSION: {}}} if declare else {}
    meta = {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": capabilities,
    }
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {**params, "_meta": meta}}
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": method,
        **(extra_headers or {}),
    }
    if method == "tools/call":
        headers["Mcp-Name"] = params["name"]
    request = urllib.request.Request(url, json.dumps(body).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=CALL_TIMEOUT) as response:
            text = response.read().decode()
            task_header = response.headers.get("Task-Id")
    except urllib.error.HTTPError as e:
        text, task_header = e.read().decode(), None
    for line in text.splitlines():
        if line.startswith("data:") and '"id"' in line:
            text = line[len("data:"):]
    return json.loads(text), task_header


def test_a_client_without_the_extension_keeps_timeout_and_gets_32021(url):
    slow = {"name": TOOL, "arguments": {"python_code": "import time\ntime.sleep(4)\n'slept'"}}
    answer, header = raw_call(url, "tools/call", slow)
    assert header is None
    text = answer["result"]["content"][0]["text"]
    assert "<status>" in text and "slept" not in text, text
    assert f"{PLAIN_TIMEOUT} s" in text, text
    answer, _ = raw_call(url, "tasks/get", {"taskId": "task_" + "0" * 32})
    assert answer["error"]["code"] == -32021, answer
    # The same call from a client that declares the extension becomes a task, named in the
    # `Task-Id` header before it runs (for a load balancer), and `tasks/get` without `Mcp-Name`
    # (as fastmcp-tasks 4.1.4 sends it) is answered.
    answer, header = raw_call(url, "tools/call", slow, declare=True)
    task = answer["result"]
    assert task["resultType"] == "task" and task["taskId"] == header, answer
    answer, _ = raw_call(url, "tasks/get", {"taskId": header}, declare=True)
    assert answer["result"]["status"] in ("working", "completed"), answer
    # A mismatched Mcp-Name is refused (SEP-2243), not silently corrected.
    answer, _ = raw_call(url, "tasks/get", {"taskId": header}, declare=True,
                         extra_headers={"Mcp-Name": "task_" + "1" * 32})
    assert answer["error"]["code"] == -32020, answer


async def test_unknown_and_malformed_task_ids_are_refused_with_their_id(url):
    async with Client(url, timeout=CALL_TIMEOUT, init_timeout=INIT_TIMEOUT) as client:
        for task_id in ["task_" + "a" * 32, "garbage", "../../etc/passwd"]:
            with pytest.raises(MCPError) as refused:
                await client.session.send_request(
                    GetTaskRequest(params=GetTaskRequestParams(task_id=task_id)),
                    ClientGetTaskResult,
                )
            assert refused.value.error.code == -32602, refused.value
            assert NO_SUCH_TASK in refused.value.error.message


async def test_over_stdio(tmp_path):
    transport = StdioTransport(
        BINARY, ["stdio", "--workers", "1", "--cache-dir", SHARED_CACHE, *LIMITS]
    )
    async with Client(transport, timeout=CALL_TIMEOUT, init_timeout=INIT_TIMEOUT) as client:
        code = "import time\ntime.sleep(4)\n'over stdio'"
        task = await call_tool_task(client, TOOL, {"python_code": code})
        result = await task.result()
        assert "over stdio" in text_of(result)


# Authentication: a task belongs to the principal that made it.
AUDIENCE = "https://mcp.test/mcp"
ISSUER = "https://issuer.test"
KID = "test-key"
TOKEN_LIFETIME = 600


@pytest.fixture(scope="module")
def authenticated(tmp_path_factory):
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    public.update({"kid": KID, "alg": "RS256", "use": "sig"})
    jwks = tmp_path_factory.mktemp("keys") / "jwks.json"
    jwks.write_text(json.dumps({"keys": [public]}))
    args = ["--workers", "1", *LIMITS, "--auth-jwks", str(jwks), "--auth-audience", AUDIENCE,
            "--auth-server", ISSUER]
    with http_server("streamable-http", *args) as base:
        yield f"{base}/mcp", key


def client_as(url, key, sub):
    now = int(time.time())
    claims = {"iss": ISSUER, "sub": sub, "aud": AUDIENCE, "iat": now, "exp": now + TOKEN_LIFETIME}
    token = jwt.encode(claims, key, algorithm="RS256", headers={"kid": KID})
    transport = StreamableHttpTransport(url, headers={"Authorization": f"Bearer {token}"})
    return Client(transport, timeout=CALL_TIMEOUT, init_timeout=INIT_TIMEOUT)


async def test_another_principal_cannot_see_or_cancel_a_task(authenticated):
    url, key = authenticated
    async with client_as(url, key, "alice") as alice, client_as(url, key, "bob") as bob:
        code = "import time\ntime.sleep(4)\n'alice only'"
        task = await call_tool_task(alice, TOOL, {"python_code": code})
        for send in (
            lambda: bob.session.send_request(
                GetTaskRequest(params=GetTaskRequestParams(task_id=task.task_id)),
                ClientGetTaskResult,
            ),
        ):
            with pytest.raises(MCPError) as refused:
                await send()
            assert refused.value.error.code == -32602
            assert NO_SUCH_TASK in refused.value.error.message
        result = await task.result()
        assert "alice only" in text_of(result)


def test_a_malformed_tasks_request_is_refused_with_its_id_and_why(url):
    task_id = "task_" + "a" * 32
    for params, why in [
        ({"taskId": task_id}, "missing field `inputResponses`"),
        ({"taskId": task_id, "inputResponses": 3}, "expected a map"),
        ({"taskId": 5, "inputResponses": {}}, "expected a string"),
    ]:
        answer, _ = raw_call(url, "tasks/update", params, declare=True,
                             extra_headers={"Mcp-Name": str(params["taskId"])})
        assert answer["id"] == 7 and answer["error"]["code"] == -32602, answer
        assert why in answer["error"]["message"], answer


def test_a_draining_replica_still_answers_for_its_tasks():
    """After SIGTERM new work is refused, but the tasks the drain waits for are still polled
    to their end (a load balancer keeps sending their `tasks/get` here)."""
    with http_server("streamable-http", "--workers", "1", *LIMITS, "--drain-timeout", "60") as base:
        url = f"{base}/mcp"
        code = {"name": TOOL, "arguments": {"python_code": "import time\ntime.sleep(5)\n'drained'"}}
        answer, task_id = raw_call(url, "tools/call", code, declare=True)
        assert answer["result"]["resultType"] == "task", answer
        os.kill(base.pid, signal.SIGTERM)
        time.sleep(POLL)
        refused, _ = raw_call(url, "tools/call", code, declare=True)
        assert "drain" in refused["error"]["message"], refused
        deadline = time.monotonic() + CALL_TIMEOUT
        while True:
            answer, _ = raw_call(url, "tasks/get", {"taskId": task_id}, declare=True)
            if answer["result"]["status"] != "working" or time.monotonic() > deadline:
                break
            time.sleep(POLL)
        assert answer["result"]["status"] == "completed", answer
        assert "drained" in json.dumps(answer["result"]["result"]), answer


def test_past_max_tasks_a_long_call_runs_as_a_plain_call():
    with http_server("streamable-http", "--workers", "1", *LIMITS, "--max-tasks", "1") as base:
        url = f"{base}/mcp"
        code = {"name": TOOL, "arguments": {"python_code": "import time\ntime.sleep(2)\n'kept'"}}
        first, _ = raw_call(url, "tools/call", code, declare=True)
        assert first["result"]["resultType"] == "task", first
        # The first task's result is kept (--task-ttl): no room for a second task.
        second, _ = raw_call(url, "tools/call", code, declare=True)
        assert second["result"].get("resultType") != "task", second
        assert "kept" in second["result"]["content"][0]["text"], second


def run_python_code_counts(base):
    """`run_python_code`'s call counts by status, from the server's /metrics."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=CALL_TIMEOUT) as r:
        lines = r.read().decode().splitlines()
    counts = {}
    for line in lines:
        if line.startswith("mcp_run_python_tool_calls_total{") and f'tool="{TOOL}"' in line:
            counts[line.split('status="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
    return counts


async def test_a_call_is_counted_by_how_its_run_ended_task_or_not():
    """A call that becomes a task is counted once, when its run ends, by how it ended; one
    answered at once, by how it ended (issue 48)."""
    with http_server("streamable-http", "--workers", "1", *LIMITS) as base:
        async with Client(f"{base}/mcp", timeout=CALL_TIMEOUT, init_timeout=INIT_TIMEOUT) as client:
            task = await call_tool_task(client, TOOL, {"python_code": LONG_RUN + "\n1 / 0"})
            result = await task.result()
            assert "ZeroDivisionError" in text_of(result), text_of(result)
            quick = await client.call_tool(TOOL, {"python_code": "1 / 0"}, raise_on_error=False)
            assert "ZeroDivisionError" in text_of(quick), text_of(quick)
            await client.call_tool(TOOL, {"python_code": "1 + 1"})
        assert run_python_code_counts(base) == {"run-error": 2, "success": 1}, run_python_code_counts(base)
        made = [line for line in urllib.request.urlopen(f"{base}/metrics", timeout=CALL_TIMEOUT).read().decode().splitlines()
                if line.startswith(f'mcp_run_python_tasks_total{{tool="{TOOL}"}}')]
        assert made and made[0].endswith(" 1"), made

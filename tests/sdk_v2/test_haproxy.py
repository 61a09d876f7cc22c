"""Three replicas of the real binary behind a real HAProxy with the shipped deploy/haproxy.cfg
(README "Running many replicas"), loopback only: today's clients (fastmcp 4, MCP 2026-07-28, no sessions) reach their
sandbox's replica through `Mcp-Param-Sandbox-Id` and the `Sandbox-Id` response header the
balancer learns from; sandbox-less calls spread over every replica; a replica that drains
(SIGTERM) or crashes (SIGKILL) mid-run hands its sandboxes to the others through the shared
state directory, and no call gets a wrong answer. Tasks (SEP-2663), over raw HTTP: a task's
`tasks/get` reaches the replica that runs it, by `Mcp-Name` or, without it, by the body's
`taskId`; once that replica is gone another one answers from the state directory: the saved
result, or `failed` for a task cut by the crash. The 1.x clients' session affinity is in
tests/sdk_v1/test_haproxy_sessions.py."""

import asyncio
import contextlib
import json
import re
import signal
import sys
import time

import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from conftest import INIT_TIMEOUT, TOOL

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "shared"))
from replicas import cluster, status_of, wait_ready  # noqa: E402

pytestmark = pytest.mark.anyio

AGENTS = 24
CALLS = 10
SPREAD_CALLS = 60
# Each replica serves at least this share of the sandbox-less calls.
MIN_SHARE = 0.2
# Seconds one call through the balancer may take before the test calls it lost (a call cut by a
# crash must fail, not hang).
CALL_TIMEOUT = 60
# Seconds after the run's start at which a replica is stopped, so that calls are in flight.
STOP_AFTER = 1.0
# Seconds a draining replica has to turn /readyz to 503.
READYZ_TURNS = 2.0
# Seconds a drained replica has to exit by itself.
DRAIN_EXIT = 60

# One call: a counter kept in a file and one kept in a global: both survive a replica, the
# global in the interpreter's checkpoint (checkpoints, docs/architecture.md §3.4; the replicas share the host's zygote).
COUNT = """\
import os
n = int(open('n').read()) if os.path.exists('n') else 0
n += 1
open('n', 'w').write(str(n))
g = globals().get('g', 0) + 1
[n, g]
"""
HANDLE = re.compile(r"sbx_[A-Za-z0-9_-]{22}")


def client_for(base):
    return Client(StreamableHttpTransport(f"{base}/mcp"), init_timeout=INIT_TIMEOUT, timeout=CALL_TIMEOUT)


def calls_served(replica):
    """run_python_code calls a replica answered, by its /metrics."""
    total = 0.0
    for line in replica.metrics().splitlines():
        if line.startswith('mcp_run_python_tool_calls_total{') and f'tool="{TOOL}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def restored(replica):
    for line in replica.metrics().splitlines():
        if line.startswith("mcp_run_python_sandboxes_restored_total"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class Agent:
    """One client with its sandbox and the counter it expects next."""

    def __init__(self, client):
        self.client = client
        self.sandbox = None
        self.n = 0
        self.errors = []
        self.notes = []

    async def __aenter__(self):
        await self.client.__aenter__()
        return self

    async def __aexit__(self, *exc):
        """Closes the client. fastmcp re-raises, as its session closes, the transport error of a
        call the crash cut ("Server disconnected without sending a response"), which `call`
        has already recorded: expected for an agent whose call was cut, a failure otherwise."""
        try:
            return await self.client.__aexit__(*exc)
        except Exception as e:  # noqa: BLE001 (fastmcp raises the transport's own class)
            if exc[0] is None and self.errors and "Server disconnected" in str(e):
                return False
            raise

    async def create(self):
        made = await self.client.call_tool("create_sandbox", {})
        self.sandbox = made.structured_content["sandbox_id"]
        assert HANDLE.fullmatch(self.sandbox)

    async def call(self):
        """One counting call; returns [n, g], or None when the call failed (a crash cut it)."""
        try:
            result = await self.client.call_tool(
                TOOL, {"python_code": COUNT, "sandbox_id": self.sandbox}, raise_on_error=False)
        except Exception as e:  # noqa: BLE001 (a cut call surfaces as the transport's error)
            self.errors.append(repr(e))
            return None
        assert not result.is_error, result
        answer = result.structured_content
        assert answer["status"] == "success", answer
        if "state" in answer:
            self.notes.append(answer["state"])
        return answer["return_value"]

    async def run(self, calls, strict_globals):
        for _ in range(calls):
            got = await self.call()
            if got is None:
                continue
            n, g = got
            # After a failed call, its effect may or may not have been saved before the crash.
            allowed = {self.n + 1, self.n + 2} if self.errors else {self.n + 1}
            assert n in allowed, (self.sandbox[:10], n, self.n, self.errors, self.notes)
            if strict_globals:
                assert g == n, (self.sandbox[:10], n, g, self.notes)
            self.n = n


async def run_all(agents, calls, strict_globals=False):
    await asyncio.gather(*(a.run(calls, strict_globals) for a in agents))


async def test_three_replicas_behind_haproxy(warm_zygote):
    with cluster(3, "--workers", "2") as (base, replicas):
        await asyncio.to_thread(wait_ready, replicas)
        # The replicas' metrics are for the operators' scraper, not for clients of the balancer.
        assert status_of(f"{base}/metrics") == 404
        clients = [client_for(base) for _ in range(AGENTS)]
        async with contextlib.AsyncExitStack() as stack:
            agents = [await stack.enter_async_context(Agent(c)) for c in clients]
            await asyncio.gather(*(c.list_tools() for c in clients))

            # Affinity: every sandbox's calls reach the replica that holds its globals.
            await asyncio.gather(*(a.create() for a in agents))
            await run_all(agents, CALLS, strict_globals=True)
            assert all(a.n == CALLS and not a.notes for a in agents), [(a.n, a.notes) for a in agents]
            held = [calls_served(r) for r in replicas]
            assert all(h > 0 for h in held), f"sandboxes on every replica: {held}"

            # Spread: sandbox-less calls go to every replica, each at least MIN_SHARE of them.
            await asyncio.to_thread(wait_ready, replicas)
            before = [calls_served(r) for r in replicas]
            for _ in range(SPREAD_CALLS):
                answer = await clients[0].call_tool(TOOL, {"python_code": "1"})
                assert answer.structured_content["return_value"] == 1
            served = [calls_served(r) - b for r, b in zip(replicas, before)]
            assert sum(served) == SPREAD_CALLS, served
            assert all(s >= MIN_SHARE * SPREAD_CALLS for s in served), served

            # Drain: replica 1 gets SIGTERM mid-run; it turns unready at once, its calls in flight
            # finish, and its sandboxes continue elsewhere with their files and globals.
            drained = replicas[0]
            run = asyncio.create_task(run_all(agents, CALLS, strict_globals=True))
            await asyncio.sleep(STOP_AFTER)
            drained.signal(signal.SIGTERM)
            deadline = time.monotonic() + READYZ_TURNS
            while status_of(f"{drained.base}/readyz") not in (503, None):
                assert time.monotonic() < deadline, "a draining replica's /readyz did not turn 503"
                await asyncio.sleep(0.05)
            await run
            failed = [(a.n, a.errors) for a in agents if a.n != 2 * CALLS or a.errors]
            assert not failed, failed
            moved = [a for a in agents if any("restored" in note for note in a.notes)]
            assert moved, "replica 1 held sandboxes, which moved"
            assert await asyncio.to_thread(drained.proc.wait, DRAIN_EXIT) == 0
            assert sum(restored(r) for r in replicas[1:]) >= len(moved)

            # Crash: replica 2 gets SIGKILL mid-run; the files and globals of completed calls
            # come back together (a save the crash cut leaves the record of the one before it,
            # and every file that record names), calls in flight fail with an error, later calls
            # continue in order.
            crashed = replicas[1]
            run = asyncio.create_task(run_all(agents, CALLS, strict_globals=True))
            await asyncio.sleep(STOP_AFTER)
            crashed.signal(signal.SIGKILL)
            await run
            for a in agents:
                assert a.n >= 3 * CALLS - len(a.errors), (a.n, a.errors)
            survivor = replicas[2]
            assert calls_served(survivor) > 0
            after_crash = [a for a in agents if a.notes and "restored" in a.notes[-1]]
            assert after_crash, "replica 2 held sandboxes, which moved"


# --- Tasks (SEP-2663) ---------------------------------------------------------------------------
# Raw 2026-07-28 requests: sessionless, each says in `_meta` who it is and that it takes tasks.
PROTOCOL = "2026-07-28"
TASKS_META = {"io.modelcontextprotocol/protocolVersion": PROTOCOL,
              "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "1"},
              "io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}
TASK_ID = re.compile(r"task_[0-9a-f]{32}")
# Seconds a task's code runs: several polls (pollIntervalMs 500) while it works.
TASK_SECONDS = 6
# Seconds a task may take to complete, polls included, before the test gives up.
TASK_DEADLINE = 60
# Seconds HAProxy has to write a request's log line once the client has its answer.
LOG_DEADLINE = 10
# One line of HAProxy's log (deploy/haproxy.cfg: option httplog and its captures): the server
# that answered, the request's captured headers (Mcp-Param-Sandbox-Id, Mcp-Session-Id,
# Mcp-Method) and the response's (Sandbox-Id, Task-Id).
LOG_LINE = re.compile(r' mcp(?:_alive)?/(r\d+) .*\{([^}]*)\} \{([^}]*)\} "POST /mcp ')


def answer_of(response):
    """The JSON-RPC answer in `response`, plain JSON or the data of an SSE event."""
    assert response.status_code == 200, (response.status_code, response.text)
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    for line in response.text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            message = json.loads(line[5:])
            if "id" in message:
                return message
    raise AssertionError(f"no answer in {response.text!r}")


async def rpc(http, base, method, params, name=None):
    """(response headers, result) of one raw request through `base`; `name` is its `Mcp-Name`
    (left out when None)."""
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": PROTOCOL, "Mcp-Method": method}
    if name is not None:
        headers["Mcp-Name"] = name
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": TASKS_META}}
    response = await http.post(f"{base}/mcp", json=body, headers=headers)
    message = answer_of(response)
    assert "result" in message, message
    return response.headers, message["result"]


async def start_task(http, base, seconds, value):
    """Starts a run_python_code task that sleeps `seconds` then returns `value`; its id."""
    code = f"import time\ntime.sleep({seconds})\n{value!r}"
    headers, result = await rpc(http, base, "tools/call",
                                {"name": TOOL, "arguments": {"python_code": code}}, name=TOOL)
    assert result["resultType"] == "task" and result["status"] == "working", result
    task_id = result["taskId"]
    assert TASK_ID.fullmatch(task_id) and headers["Task-Id"] == task_id, (headers, result)
    return task_id


async def get_task(http, base, task_id, named):
    """`tasks/get` of `task_id` through `base`, with `Mcp-Name` or (`named` false) without."""
    _, task = await rpc(http, base, "tasks/get", {"taskId": task_id}, name=task_id if named else None)
    assert task["taskId"] == task_id, task
    return task


async def poll_to_the_end(http, base, task_id, named):
    """Polls `task_id` until it ends; (the statuses seen, number of polls, the last answer)."""
    deadline = time.monotonic() + TASK_DEADLINE
    seen = []
    while True:
        task = await get_task(http, base, task_id, named)
        seen.append(task["status"])
        if task["status"] != "working":
            return seen, task
        assert time.monotonic() < deadline, f"task still working after {TASK_DEADLINE} s"
        await asyncio.sleep(task.get("pollIntervalMs", 500) / 1000)


class ProxyLog:
    """HAProxy's log (the cluster writes it beside the replicas' logs): which replica answered
    each POST /mcp, by its captured headers."""

    def __init__(self, replicas):
        self.path = replicas[0].log.parent / "haproxy.log"

    def lines(self):
        """(server, request captures, response captures) of every POST logged so far."""
        found = []
        for line in self.path.read_text(errors="replace").splitlines():
            match = LOG_LINE.search(line)
            if match:
                server, request, response = match.groups()
                found.append((server, request.split("|"), response.split("|")))
        return found

    def method_lines(self, method):
        return [(server, response) for server, request, response in self.lines() if request[2] == method]

    async def servers_of(self, method, first, count):
        """The servers of the `count` `method` lines from the `first`-th on, once all are logged."""
        deadline = time.monotonic() + LOG_DEADLINE
        while len(lines := self.method_lines(method)) < first + count:
            assert time.monotonic() < deadline, (method, first, count, lines)
            await asyncio.sleep(0.1)
        assert len(lines) == first + count, (method, first, count, lines)
        return [server for server, _ in lines[first:]]

    async def runner_of(self, task_id):
        """The server that answered the tools/call naming `task_id` in its Task-Id header (the
        log keeps its first 10 characters, unique among this test's few tasks)."""
        deadline = time.monotonic() + LOG_DEADLINE
        while True:
            servers = [s for s, response in self.method_lines("tools/call") if response[1] == task_id[:10]]
            if servers:
                assert len(servers) == 1, servers
                return servers[0]
            assert time.monotonic() < deadline, f"no log line names {task_id[:10]}"
            await asyncio.sleep(0.1)


def tasks_made(replica):
    """run_python_code calls a replica answered as a task, by its /metrics."""
    total = 0.0
    for line in replica.metrics().splitlines():
        if line.startswith("mcp_run_python_tasks_total{") and f'tool="{TOOL}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


async def follow_task(http, base, log, replicas, named, value):
    """Starts a task through `base`, polls it to its end, and checks that every poll reached the
    replica that runs it (by HAProxy's log, and that replica's /metrics); (the task's id, its
    replica, its final answer)."""
    before = [tasks_made(r) for r in replicas]
    polls_before = len(log.method_lines("tasks/get"))
    task_id = await start_task(http, base, TASK_SECONDS, value)
    runner = await log.runner_of(task_id)
    made = [tasks_made(r) - b for r, b in zip(replicas, before)]
    assert made == [1.0 if f"r{i + 1}" == runner else 0.0 for i in range(len(replicas))], (runner, made)

    seen, task = await poll_to_the_end(http, base, task_id, named)
    assert seen[0] == "working" and seen[-1] == "completed", seen
    answer = task["result"]["structuredContent"]
    assert answer["status"] == "success" and answer["return_value"] == value, task
    # Every poll went to the task's replica (balanced, they would spread over all three).
    servers = await log.servers_of("tasks/get", polls_before, len(seen))
    assert servers == [runner] * len(seen), (runner, servers)
    return task_id, runner, task


async def test_tasks_reach_their_replica_and_outlive_it():
    with cluster(3, "--workers", "2") as (base, replicas):
        await asyncio.to_thread(wait_ready, replicas)
        log = ProxyLog(replicas)
        by_name = {f"r{i + 1}": r for i, r in enumerate(replicas)}
        async with httpx2.AsyncClient(timeout=CALL_TIMEOUT) as http:
            # Polled with Mcp-Name (the extension's routing header), then without it (routed by
            # the body's params.taskId).
            named_id, named_runner, named_end = await follow_task(http, base, log, replicas, True, "named")
            await follow_task(http, base, log, replicas, False, "from the body")

            # The replica that ran the first task dies: another one answers from the state
            # directory, with the same result.
            by_name[named_runner].signal(signal.SIGKILL)
            await asyncio.to_thread(by_name[named_runner].proc.wait, DRAIN_EXIT)
            polls_before = len(log.method_lines("tasks/get"))
            task = await get_task(http, base, named_id, named=True)
            assert task["status"] == "completed" and task["result"] == named_end["result"], (task, named_end)
            (server,) = await log.servers_of("tasks/get", polls_before, 1)
            assert server != named_runner, server

            # A task whose replica dies while it runs: another replica finds its runner gone
            # (no end saved, the lock free) and says it failed, knowing nothing of its end.
            cut_id = await start_task(http, base, 10 * TASK_SECONDS, "never")
            cut_runner = await log.runner_of(cut_id)
            assert cut_runner != named_runner
            assert (await get_task(http, base, cut_id, named=True))["status"] == "working"
            by_name[cut_runner].signal(signal.SIGKILL)
            await asyncio.to_thread(by_name[cut_runner].proc.wait, DRAIN_EXIT)
            polls_before = len(log.method_lines("tasks/get"))
            task = await get_task(http, base, cut_id, named=True)
            assert task["status"] == "failed", task
            assert "nothing is known of its end" in task["error"]["message"], task
            (server,) = await log.servers_of("tasks/get", polls_before, 1)
            assert server not in (named_runner, cut_runner), server

"""Three replicas of the real binary behind a real HAProxy with the shipped deploy/haproxy.cfg
(issue 27), loopback only: today's clients (fastmcp 4, MCP 2026-07-28, no sessions) reach their
sandbox's replica through `Mcp-Param-Sandbox-Id` and the `Sandbox-Id` response header the
balancer learns from; sandbox-less calls spread over every replica; a replica that drains
(SIGTERM) or crashes (SIGKILL) mid-run hands its sandboxes to the others through the shared
state directory, and no call gets a wrong answer. The 1.x clients' session affinity is in
tests/python/test_haproxy_sessions.py."""

import asyncio
import contextlib
import re
import signal
import sys
import time

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

# One call: a counter kept in a file (files survive a replica) and one kept in a global (globals
# survive only on the replica that holds the sandbox).
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


async def test_three_replicas_behind_haproxy():
    with cluster(3, "--workers", "2") as (base, replicas):
        await asyncio.to_thread(wait_ready, replicas)
        # The replicas' metrics are for the operators' scraper, not for clients of the balancer.
        assert status_of(f"{base}/metrics") == 404
        clients = [client_for(base) for _ in range(AGENTS)]
        async with contextlib.AsyncExitStack() as stack:
            for c in clients:
                await stack.enter_async_context(c)
            agents = [Agent(c) for c in clients]
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
            # finish, and its sandboxes continue elsewhere with their files.
            drained = replicas[0]
            run = asyncio.create_task(run_all(agents, CALLS))
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

            # Crash: replica 2 gets SIGKILL mid-run; files of completed calls come back, calls in
            # flight fail with an error, later calls continue in order.
            crashed = replicas[1]
            run = asyncio.create_task(run_all(agents, CALLS))
            await asyncio.sleep(STOP_AFTER)
            crashed.signal(signal.SIGKILL)
            await run
            for a in agents:
                assert a.n >= 3 * CALLS - len(a.errors), (a.n, a.errors)
            survivor = replicas[2]
            assert calls_served(survivor) > 0
            after_crash = [a for a in agents if a.notes and "restored" in a.notes[-1]]
            assert after_crash, "replica 2 held sandboxes, which moved"

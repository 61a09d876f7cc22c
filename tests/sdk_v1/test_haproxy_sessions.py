"""The seed's line of clients (`mcp` 1.x, protocol 2025-11-25 with sessions) through three replicas
behind a real HAProxy with the shipped deploy/haproxy.cfg (README "Running many replicas"): every request of a session
carries `Mcp-Session-Id`, which the balancer learned from the `initialize` answer, so it reaches
the replica that holds the session and its default sandbox. The same run for today's clients is
tests/sdk_v2/test_haproxy.py."""

import asyncio
import contextlib
import datetime
import pathlib
import sys

import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from conftest import CALL_TIMEOUT

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "shared"))
from replicas import cluster, wait_ready  # noqa: E402

SESSIONS = 12
CALLS = 10
# A global counter: it counts on only if every call of the session reaches the same interpreter.
COUNT = "g = globals().get('g', 0) + 1\ng"


async def count_in_a_session(base):
    async with contextlib.AsyncExitStack() as stack:
        read, write, _ = await stack.enter_async_context(streamablehttp_client(f"{base}/mcp"))
        session = await stack.enter_async_context(
            ClientSession(read, write, read_timeout_seconds=datetime.timedelta(seconds=CALL_TIMEOUT)))
        await session.initialize()
        answers = []
        for _ in range(CALLS):
            result = await session.call_tool("run_python_code", {"python_code": COUNT})
            answers.append(result.structuredContent["return_value"])
        return answers


@pytest.mark.anyio
async def test_sessions_stick_to_their_replica():
    with cluster(3, "--workers", "2") as (base, replicas):
        await asyncio.to_thread(wait_ready, replicas)
        results = await asyncio.gather(*(count_in_a_session(base) for _ in range(SESSIONS)))
        assert all(r == list(range(1, CALLS + 1)) for r in results), results
        served = []
        for replica in replicas:
            metrics = replica.metrics()
            served.append(sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                              if line.startswith("mcp_run_python_tool_calls_total{")))
        # Every call was counted once, on the replica of its session; sessions went to every
        # replica (how evenly is tests/sdk_v2/test_haproxy.py's spread check).
        assert sum(served) == SESSIONS * CALLS and all(s > 0 for s in served), served

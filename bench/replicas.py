"""Benchmark (README "Running many replicas"): one replica against three behind HAProxy (deploy/haproxy.cfg), both
through the balancer, in one run: calls/s of `AGENTS` concurrent agents that each work in a
sandbox of their own (sessionless MCP 2026-07-28 calls, the handle in `Mcp-Param-Sandbox-Id`),
and sandboxes per GiB (proportional set size of every replica's processes, with `--sandboxes`
idle sandboxes live), as ratios of three replicas to one.

The 2-core caveat: all three replicas share the same two cores here, so three replicas cannot
run more calls at once than one; the ratio measures what the balancer and the extra processes
cost, not what three machines would give (there, calls/s grows with the replicas' cores).

    MCP_RUN_PYTHON_BIN=target/release/mcp-run-python .venv/bin/python bench/replicas.py [--sandboxes 60]
"""

import argparse
import asyncio
import os
import pathlib
import sys
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("MCP_RUN_PYTHON_BIN", str(ROOT / "target" / "release" / "mcp-run-python"))
sys.path.insert(0, str(ROOT / "tests" / "shared"))
from replicas import cluster  # noqa: E402

from interpreters import descendants, pss_kib  # noqa: E402
from sandboxes import Sessionless  # noqa: E402

# Concurrent agents, each with its own sandbox.
AGENTS = 12
# Timed calls per agent.
CALLS = 40
# Each replica runs this many calls at once.
WORKERS = "2"


class Endpoint:
    """What `Sessionless` needs of a server: its MCP URL."""

    def __init__(self, base):
        self.base = f"{base}/mcp"


async def calls_per_second(base):
    """Calls/s of `AGENTS` agents each running `CALLS` trivial calls in its own sandbox."""
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=AGENTS * 2)) as http:
        agents = [Sessionless(Endpoint(base), http) for _ in range(AGENTS)]
        sandboxes = await asyncio.gather(*(a.create_and_run() for a in agents))

        async def work(agent, sandbox):
            for _ in range(CALLS):
                result = await agent.tool("run_python_code", {"python_code": "1 + 1", "sandbox_id": sandbox})
                assert result["return_value"] == 2, result

        started = time.perf_counter()
        await asyncio.gather(*(work(a, s) for a, s in zip(agents, sandboxes)))
        return AGENTS * CALLS / (time.perf_counter() - started)


async def sandboxes_per_gib(base, replicas, count):
    """Idle sandboxes per GiB of PSS over every replica's processes, with `count` live."""
    async with httpx.AsyncClient(timeout=300) as http:
        agent = Sessionless(Endpoint(base), http)
        for _ in range(count):
            await agent.create_and_run()
    await asyncio.sleep(2)
    kib = sum(pss_kib(p) for r in replicas for p in [r.proc.pid, *descendants(r.proc.pid)])
    return count / (kib / (1 << 20))


async def measure(n, sandboxes):
    with cluster(n, "--workers", WORKERS, "--max-sandboxes", str(sandboxes + AGENTS + 50)) as (base, replicas):
        rate = await calls_per_second(base)
        density = await sandboxes_per_gib(base, replicas, sandboxes)
    return rate, density


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sandboxes", type=int, default=60)
    args = parser.parse_args()
    one_rate, one_density = await measure(1, args.sandboxes)
    three_rate, three_density = await measure(3, args.sandboxes)
    print(f"calls/s, {AGENTS} agents x {CALLS} calls through HAProxy: one replica {one_rate:.0f}, "
          f"three {three_rate:.0f} (three / one: {three_rate / one_rate:.2f}; 2 cores shared by all)")
    print(f"idle sandboxes per GiB of PSS with {args.sandboxes} live: one replica {one_density:.0f}, "
          f"three {three_density:.0f} (three / one: {three_density / one_density:.2f})")


if __name__ == "__main__":
    asyncio.run(main())

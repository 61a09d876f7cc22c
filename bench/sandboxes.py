"""Benchmark (docs/architecture.md §3.1): what a sandbox costs, in one run, as ratios to Node + Pyodide restoring
Pyodide's own memory snapshot (one interpreter in one Node process: the plain way to give each
agent a Python of its own).

- create -> first result: `create_sandbox`, then `run_python_code` in it, over sessionless
  MCP 2026-07-28 requests (no `initialize`, no `Mcp-Session-Id`; the handle travels in
  `sandbox_id` and `Mcp-Param-Sandbox-Id`), p50 and p95, against Node's start -> first
  `print(1)` result, and against Monty (PyPI `pydantic-monty`, when installed): a REPL session
  checked out of its warm worker pool and its first snippet run (the same job, for a Python
  subset without packages);
- memory: proportional set size (PSS) per idle sandbox with 300 live, each after one call
  (the server's every process: front, zygote, interpreters, spares, divided by the sandboxes),
  against one Node + Pyodide process's PSS after its first calls.

    .venv/bin/python bench/sandboxes.py [--binary target/release/mcp-run-python] [--sandboxes 300]
"""

import argparse
import asyncio
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from interpreters import ZYGOTE_READY, Http, node_run, pss_kib, server_processes
from throughput import percentile, settle

ROOT = pathlib.Path(__file__).resolve().parents[1]

# What a 2026-07-28 request carries instead of an `initialize` (SEP-2575).
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}
# Create -> first result runs timed, after the zygote is ready.
LATENCY_RUNS = 50
# Pause between two timed runs, so that a spare can be forked again, as between real agents
# (seconds).
BETWEEN_RUNS = 0.05


class Sessionless:
    """Sessionless 2026-07-28 tool calls on a `streamable-http --stateful` server."""

    def __init__(self, server, http):
        self.server = server
        self.http = http
        self.next_id = 0

    async def tool(self, name, arguments):
        """The structured result of tool `name`."""
        self.next_id += 1
        headers = {**Http.HEADERS, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call",
                   "Mcp-Name": name}
        if "sandbox_id" in arguments:
            headers["Mcp-Param-Sandbox-Id"] = arguments["sandbox_id"]
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                   "params": {"name": name, "arguments": arguments, "_meta": META}}
        r = await self.http.post(self.server.base, json=message, headers=headers)
        for line in r.text.splitlines():
            if line.startswith("data: {"):
                result = json.loads(line.removeprefix("data: "))["result"]
                assert not result.get("isError"), result
                return result["structuredContent"]
        raise AssertionError(r.text)

    async def create_and_run(self):
        """A new sandbox's handle, after one trivial call in it."""
        sandbox = (await self.tool("create_sandbox", {}))["sandbox_id"]
        result = await self.tool("run_python_code", {"python_code": "1 + 1", "sandbox_id": sandbox})
        assert result["return_value"] == 2, result
        return sandbox


async def ours(binary, cache, sandboxes):
    """Create -> first result latencies (s), and PSS (MiB) per sandbox and of the whole server
    with `sandboxes` live."""
    server = Http(binary, cache, "--stateful", "--max-sandboxes", str(sandboxes + LATENCY_RUNS + 10))
    async with httpx.AsyncClient(timeout=300) as http:
        client = Sessionless(server, http)
        await client.create_and_run()
        await server.wait_for(ZYGOTE_READY)
        await settle(server.proc.pid)
        latencies = []
        for _ in range(LATENCY_RUNS):
            t = time.perf_counter()
            await client.create_and_run()
            latencies.append(time.perf_counter() - t)
            await asyncio.sleep(BETWEEN_RUNS)
        # The latency runs' sandboxes go, so that exactly `sandboxes` are live.
        server.close()
    server = Http(binary, cache, "--stateful", "--max-sandboxes", str(sandboxes + 10))
    async with httpx.AsyncClient(timeout=300) as http:
        client = Sessionless(server, http)
        live = [await client.create_and_run()]
        await server.wait_for(ZYGOTE_READY)
        while len(live) < sandboxes:
            live.append(await client.create_and_run())
        await settle(server.proc.pid)
        pids = server_processes(server.proc.pid)
        total = sum(pss_kib(p) for p in pids) / 1024
        # Every sandbox is still alive.
        for sandbox in live[:5]:
            await client.tool("run_python_code", {"python_code": "1", "sandbox_id": sandbox})
    server.close()
    return latencies, total / sandboxes, total, len(pids)


def monty_latencies(runs):
    """Monty: checkout of a REPL session from a warm pool -> its first result (s), or `None`
    when `pydantic_monty` is not installed."""
    try:
        import pydantic_monty
    except ImportError:
        return None
    times = []
    with pydantic_monty.Monty() as pool:
        with pool.checkout() as session:
            session.feed_run("1 + 1")
        for _ in range(runs):
            t = time.perf_counter()
            with pool.checkout() as session:
                assert session.feed_run("1 + 1") == 2
            times.append(time.perf_counter() - t)
    return times


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    parser.add_argument("--sandboxes", type=int, default=300)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as scratch:
        snapshot = str(pathlib.Path(scratch) / "node.snapshot")
        node_run("--make", snapshot)
        baseline = node_run("--load", snapshot)
        node_cold_ms, node_pss_mib = baseline["cold_ms"], baseline["pss_kib"] / 1024
        # The servers start this bench's own zygote service (its socket lives in the runtime
        # directory), which is stopped at the end, also on failure: none is left running.
        runtime = pathlib.Path(scratch) / "runtime"
        runtime.mkdir(mode=0o700)
        os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        try:
            latencies, per_sandbox, total, processes = await ours(args.binary, cache, args.sandboxes)
        finally:
            stopped = subprocess.run([args.binary, "zygote", "stop", "--cache-dir", cache],
                                     capture_output=True, text=True)
            if stopped.returncode != 0:
                print(f"sandboxes: `zygote stop` failed: {stopped.stdout}{stopped.stderr}", file=sys.stderr)
    p50 = statistics.median(latencies) * 1000
    p95 = percentile(latencies, 95) * 1000
    print(f"create -> first result: p50 {p50:.1f} ms, p95 {p95:.1f} ms "
          f"(Node + Pyodide from its snapshot, start -> first result: {node_cold_ms:.0f} ms; "
          f"ratio {p50 / node_cold_ms:.3f})")
    monty = monty_latencies(LATENCY_RUNS)
    if monty:
        monty_p50 = statistics.median(monty) * 1000
        print(f"Monty, session checkout -> first result: p50 {monty_p50:.2f} ms (ours / Monty: {p50 / monty_p50:.0f})")
    print(f"memory with {args.sandboxes} idle sandboxes: {per_sandbox:.1f} MiB PSS each, {total:.0f} MiB in all "
          f"over {processes} processes (one Node + Pyodide process: {node_pss_mib:.0f} MiB; "
          f"ratio {per_sandbox / node_pss_mib:.3f})")


if __name__ == "__main__":
    asyncio.run(main())

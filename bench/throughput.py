"""Benchmark (README "Benchmarks"): requests per second and p50/p99 latency of a trivial call (`1 + 1`)
over stdio and over streamable HTTP, with 1 and 8 concurrent clients, in one run. Clients speak
raw JSON-RPC (stdio pipes, httpx) so that client libraries do not dominate the figures.

    .venv/bin/python bench/throughput.py [--binary target/release/mcp-run-python] [--calls 200]
"""

import argparse
import asyncio
import json
import os
import pathlib
import socket
import statistics
import subprocess
import tempfile
import time

import httpx

ROOT = pathlib.Path(__file__).resolve().parents[1]
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
CALL = {"name": "run_python_code", "arguments": {"python_code": "1 + 1"}}


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


# The server is idle once its process tree used less than this much CPU (seconds) over one
# settling interval (seconds); measuring earlier times spare interpreters booting, not calls.
IDLE_CPU = 0.01
SETTLE_INTERVAL = 0.5
SETTLE_LIMIT = 60


def tree_cpu(pid):
    """CPU seconds used so far by `pid` and its live descendants (from /proc)."""
    total, ticks = 0.0, os.sysconf("SC_CLK_TCK")
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
        for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
            for child in (task / "children").read_text().split():
                total += tree_cpu(int(child))
    except (FileNotFoundError, ProcessLookupError):
        pass
    return total


async def settle(pid):
    """Waits until the server stops using CPU: a new session's first call takes a spare
    interpreter and the server boots a replacement (about a second of CPU on both cores),
    which would otherwise land in the measurement."""
    before = tree_cpu(pid)
    for _ in range(int(SETTLE_LIMIT / SETTLE_INTERVAL)):
        await asyncio.sleep(SETTLE_INTERVAL)
        now = tree_cpu(pid)
        if now - before < IDLE_CPU:
            return
        before = now


def report(label, latencies, elapsed):
    print(f"{label:<34}{len(latencies) / elapsed:>9.1f}{statistics.median(latencies) * 1000:>10.2f}"
          f"{percentile(latencies, 99) * 1000:>10.2f}")


async def stdio_bench(binary, cache, clients, calls, workers):
    proc = await asyncio.create_subprocess_exec(
        binary, "stdio", "--workers", str(workers), "--cache-dir", cache,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, limit=1 << 24)
    waiters, next_id = {}, [0]

    async def reader():
        while line := await proc.stdout.readline():
            msg = json.loads(line)
            if "id" in msg and msg["id"] in waiters:
                waiters.pop(msg["id"]).set_result(msg)

    async def request(method, params):
        next_id[0] += 1
        fut = asyncio.get_running_loop().create_future()
        waiters[next_id[0]] = fut
        proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": next_id[0], "method": method, "params": params}) + "\n").encode())
        await proc.stdin.drain()
        return await fut

    task = asyncio.create_task(reader())
    await request("initialize", INIT)
    proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    for _ in range(workers * 3):  # warm: every worker booted
        await request("tools/call", CALL)
    await settle(proc.pid)
    latencies = []

    async def client(n):
        for _ in range(n):
            t = time.perf_counter()
            await request("tools/call", CALL)
            latencies.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(client(calls // clients) for _ in range(clients)))
    elapsed = time.perf_counter() - start
    proc.stdin.close()
    await proc.wait()
    task.cancel()
    return latencies, elapsed


async def http_bench(base, pid, clients, calls):
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    async def session(http):
        r = await http.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT}, headers=headers)
        h = {**headers, "Mcp-Session-Id": r.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-06-18"}
        await http.post(f"{base}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h)
        return h

    latencies = []
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as http:
        sessions = [await session(http) for _ in range(clients)]
        for h in sessions:
            for _ in range(3):
                await http.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": CALL}, headers=h)
        await settle(pid)

        async def client(h, n):
            for i in range(n):
                t = time.perf_counter()
                r = await http.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": i + 2, "method": "tools/call", "params": CALL}, headers=h)
                assert "<return_value>" in r.text, r.text
                latencies.append(time.perf_counter() - t)

        start = time.perf_counter()
        await asyncio.gather(*(client(h, calls // clients) for h in sessions))
        return latencies, time.perf_counter() - start


def start_http(binary, cache, workers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "streamable_http", "--port", str(port), "--workers", str(workers), "--cache-dir", cache],
                            stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    raise SystemExit("server did not start")


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    cache = tempfile.mkdtemp()
    print(f"trivial call `1 + 1`, {args.calls} calls, --workers {args.workers}")
    print(f"{'transport':<34}{'req/s':>9}{'p50 ms':>10}{'p99 ms':>10}")
    for clients in (1, 8):
        report(f"stdio, {clients} concurrent", *await stdio_bench(args.binary, cache, clients, args.calls, args.workers))
    proc, base = start_http(args.binary, cache, args.workers)
    try:
        for clients in (1, 8):
            report(f"streamable HTTP, {clients} client(s)", *await http_bench(base, proc.pid, clients, args.calls))
    finally:
        proc.terminate()
        proc.wait()


if __name__ == "__main__":
    asyncio.run(main())

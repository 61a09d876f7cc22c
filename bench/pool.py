"""Benchmark (README "Benchmarks"): the pool scales and heals. In one run:
(a) throughput of a CPU-bound call (`sum(range(10**6))`) from 8 concurrent requests with
    --workers 1 and --workers 2 (their ratio shows the scaling), and
(b) the time from a worker's death (`os._exit(1)`) to the next call's answer on a replacement.

    python3 bench/pool.py [--binary target/release/mcp-run-python] [--calls 40]
"""

import argparse
import asyncio
import json
import pathlib
import subprocess
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}


class Server:
    def __init__(self, proc):
        self.proc, self.waiters, self.next_id = proc, {}, 0
        self.task = asyncio.create_task(self.reader())

    @classmethod
    async def start(cls, binary, cache, *args):
        proc = await asyncio.create_subprocess_exec(
            binary, "stdio", "--cache-dir", cache, *args,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, limit=1 << 24)
        server = cls(proc)
        await server.request("initialize", INIT)
        proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        return server

    async def reader(self):
        while line := await self.proc.stdout.readline():
            msg = json.loads(line)
            if msg.get("id") in self.waiters:
                self.waiters.pop(msg["id"]).set_result(msg)

    async def request(self, method, params):
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiters[self.next_id] = fut
        line = json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}) + "\n"
        self.proc.stdin.write(line.encode())
        await self.proc.stdin.drain()
        return await fut

    async def call(self, code):
        r = await self.request("tools/call", {"name": "run_python_code", "arguments": {"python_code": code}})
        return r["result"]["content"][0]["text"]

    async def close(self):
        self.proc.stdin.close()
        await self.proc.wait()
        self.task.cancel()


async def throughput(binary, cache, workers, calls):
    server = await Server.start(binary, cache, "--workers", str(workers))
    await asyncio.gather(*(server.call("1") for _ in range(workers * 2)))  # every worker booted
    start = time.perf_counter()
    results = await asyncio.gather(*(server.call("sum(range(10**6))") for _ in range(calls)))
    elapsed = time.perf_counter() - start
    assert all("499999500000" in r for r in results)
    await server.close()
    return calls / elapsed


async def replacement(binary, cache):
    server = await Server.start(binary, cache, "--workers", "1")
    await server.call("1")
    text = await server.call("import os\nos._exit(1)")
    assert "exit(1)" in text, text
    died = time.perf_counter()
    assert "<return_value>\n2\n" in await server.call("1 + 1")
    ready = time.perf_counter() - died
    await server.close()
    return ready


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args()
    cache = tempfile.mkdtemp()
    one = await throughput(args.binary, cache, 1, args.calls)
    two = await throughput(args.binary, cache, 2, args.calls)
    print(f"CPU-bound sum(range(10**6)), {args.calls} calls, 8 in flight:")
    print(f"  --workers 1: {one:6.1f} calls/s")
    print(f"  --workers 2: {two:6.1f} calls/s   (ratio {two / one:.2f})")
    times = [await replacement(args.binary, cache) for _ in range(3)]
    print(f"worker death -> next call answered by a replacement: {min(times):.2f} s min, "
          f"{sorted(times)[1]:.2f} s median of 3")


if __name__ == "__main__":
    asyncio.run(main())

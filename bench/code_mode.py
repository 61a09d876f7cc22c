"""Benchmark (docs/architecture.md §11): code mode against tool calls one at a time, in one run.

The job: 100 calls of the reference server's `get-sum` (`@modelcontextprotocol/server-everything`,
stdio, from tests/ts/node_modules), and the sum of their answers.

- baseline: the client calls the upstream tool 100 times itself, as a model without code mode
  does; every answer goes back to the model;
- code mode: one `run_python_code` call whose code makes the 100 calls through `import
  mcp_tools` and returns the total; only that answer goes back to the model.

Reported: wall time of each, and the bytes of tool results that would enter the model's context
(the text of every result), each as the ratio code mode / baseline. Both run over stdio with the
same client (fastmcp's), after a warm-up call each.

    .venv-current/bin/python bench/code_mode.py [--binary target/release/mcp-run-python] [--calls 100]
"""

import argparse
import asyncio
import json
import pathlib
import tempfile
import time

from fastmcp import Client
from fastmcp.client.transports import StdioTransport

ROOT = pathlib.Path(__file__).resolve().parents[1]
EVERYTHING = ROOT / "tests" / "ts" / "node_modules" / ".bin" / "mcp-server-everything"
# Generous: a debug build's first interpreter boots in seconds.
TIMEOUT = 600


def result_bytes(result):
    """Bytes of a tool result's content as a model would get it (its text blocks)."""
    return sum(len(block.text.encode()) for block in result.content if hasattr(block, "text"))


async def baseline(calls):
    """`calls` tool calls from the client; (seconds, bytes to the model, total)."""
    async with Client(StdioTransport(str(EVERYTHING), ["stdio"]), timeout=TIMEOUT) as client:
        await client.call_tool("get-sum", {"a": 0, "b": 0})
        started = time.perf_counter()
        sent, total = 0, 0
        for i in range(calls):
            result = await client.call_tool("get-sum", {"a": i, "b": 1})
            sent += result_bytes(result)
            total += int(result.content[0].text.rsplit(" ", 1)[1].rstrip("."))
        return time.perf_counter() - started, sent, total


async def code_mode(binary, calls):
    """One `run_python_code` call making `calls` upstream calls; (seconds, bytes, total)."""
    with tempfile.TemporaryDirectory() as tmp:
        config = pathlib.Path(tmp) / "tools.json"
        config.write_text(json.dumps({"mcpServers": {"everything": {"command": str(EVERYTHING), "args": ["stdio"]}}}))
        args = ["stdio", "--tools-config", str(config), "--workers", "1"]
        async with Client(StdioTransport(binary, args), timeout=TIMEOUT) as client:
            await client.call_tool("run_python_code", {"python_code": "import mcp_tools\nawait mcp_tools.everything.get_sum(a=0, b=0)"})
            code = f"""
import mcp_tools
total = 0
for i in range({calls}):
    text = await mcp_tools.everything.get_sum(a=i, b=1)
    total += int(text.rsplit(" ", 1)[1].rstrip("."))
total
"""
            started = time.perf_counter()
            result = await client.call_tool("run_python_code", {"python_code": code})
            elapsed = time.perf_counter() - started
            text = result.content[0].text
            total = int(text.split("<return_value>\n", 1)[1].split("\n", 1)[0])
            return elapsed, result_bytes(result), total


async def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    parser.add_argument("--calls", type=int, default=100)
    options = parser.parse_args()
    base_s, base_bytes, base_total = await baseline(options.calls)
    ours_s, ours_bytes, ours_total = await code_mode(options.binary, options.calls)
    assert base_total == ours_total, (base_total, ours_total)
    print(f"{options.calls} calls of get-sum (server-everything, stdio); both totals {ours_total}")
    print(f"  one at a time from the client: {base_s * 1000:8.1f} ms, {base_bytes:6d} bytes to the model")
    print(f"  code mode, one call:           {ours_s * 1000:8.1f} ms, {ours_bytes:6d} bytes to the model")
    print(f"  ratio code mode / baseline:    wall {ours_s / base_s:.2f}x, bytes {ours_bytes / base_bytes:.3f}x")


if __name__ == "__main__":
    asyncio.run(main())

"""Benchmark (issue 49's table; docs/architecture.md §11): FastMCP's `CodeMode` on our
`SandboxProvider` against its default, Monty's (`MontySandboxProvider`), in one run and one
server: the wall time of one `execute` call whose snippet makes 20 `call_tool` calls, and of one
that makes none, each a p50 over the same number of rounds, and the ratio of ours to Monty's.

Both providers serve the same FastMCP server (one `add` tool) through fastmcp's in-memory
`Client`, so what differs is the sandbox alone: Monty runs the snippet in this process; ours
makes a sandbox in `mcp-run-python stdio --stateful` (started at the first run, kept), runs the
snippet there, its `call_tool` reaching back over the provider's socket, and destroys it.

Run: `.venv-current/bin/python bench/fastmcp_code_mode.py [--rounds 30]` (the venv
`scripts/test.sh` makes for today's clients: fastmcp 4 and `pydantic-monty`). The binary is
`MCP_RUN_PYTHON_BIN`, else `target/release/mcp-run-python` (`scripts/run.sh` builds it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / 'pysrc'))
os.environ.setdefault('MCP_RUN_PYTHON_BIN', str(ROOT / 'target' / 'release' / 'mcp-run-python'))

from fastmcp import Client, FastMCP  # noqa: E402
from fastmcp.experimental.transforms.code_mode import CodeMode, MontySandboxProvider  # noqa: E402

from mcp_run_python.fastmcp import SandboxProvider  # noqa: E402

# The two snippets: 20 tool calls, and none.
TOOL_CALLS = 20
WITH_CALLS = f"""
total = 0
for i in range({TOOL_CALLS}):
    total += (await call_tool("add", {{"a": i, "b": 1}}))["result"]
return total
"""
WITHOUT_CALLS = "return 1 + 1"
EXPECTED = {WITH_CALLS: sum(range(1, TOOL_CALLS + 1)), WITHOUT_CALLS: 2}
# Runs of each snippet before the timed ones: ours starts its binary and forks its spares there.
WARM_UP = 5


def server(provider) -> FastMCP:
    mcp = FastMCP('bench', transforms=[CodeMode(sandbox_provider=provider)])

    @mcp.tool
    def add(a: int, b: int) -> int:
        """Adds two integers."""
        return a + b

    return mcp


async def p50(client: Client, code: str, rounds: int) -> float:
    """The p50 wall time of `execute(code)` in ms, after the warm-up runs."""
    times = []
    for i in range(WARM_UP + rounds):
        started = time.perf_counter()
        result = await client.call_tool('execute', {'code': code})
        elapsed = time.perf_counter() - started
        assert result.content[0].text == str(EXPECTED[code]), result
        if i >= WARM_UP:
            times.append(elapsed * 1000)
    return statistics.median(times)


async def measure(provider, rounds: int) -> dict[str, float]:
    async with Client(server(provider)) as client:
        return {code: await p50(client, code, rounds) for code in (WITH_CALLS, WITHOUT_CALLS)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=30)
    rounds = parser.parse_args().rounds
    monty = await measure(MontySandboxProvider(), rounds)
    async with SandboxProvider() as provider:
        ours = await measure(provider, rounds)
    print(f'FastMCP CodeMode, one `execute` call, p50 of {rounds} (binary {os.environ["MCP_RUN_PYTHON_BIN"]}):')
    for code, label in ((WITH_CALLS, f'{TOOL_CALLS} tool calls'), (WITHOUT_CALLS, '0 tool calls')):
        print(f'  {label:13s} Monty {monty[code]:7.2f} ms  ours {ours[code]:7.2f} ms  ({ours[code] / monty[code]:.1f}×)')


if __name__ == '__main__':
    asyncio.run(main())

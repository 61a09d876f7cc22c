"""Benchmark (docs/architecture.md §3.2): what the operating-system wall costs, measured in one run with
`--confinement default` (every layer on) against `--confinement off`: cold start from the memory
snapshot (process start -> first result over stdio), warm trivial call p50/p99, and a CPU-bound
Python loop. Reported as ratios on/off.

    python3 bench/confinement.py [--binary target/release/mcp-run-python] [--runs 3]
"""

import pathlib
import statistics
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from startup import Stdio, parse_args  # noqa: E402

CPU_LOOP = "sum(i * i for i in range(2_000_000))"


def measure(binary, cache, mode):
    t0 = time.perf_counter()
    s = Stdio(binary, "--workers", "1", "--cache-dir", cache, "--confinement", mode)
    s.initialize()
    s.call("print(1)")
    cold = time.perf_counter() - t0
    warm = []
    for _ in range(200):
        t = time.perf_counter()
        s.call("1 + 1")
        warm.append(time.perf_counter() - t)
    cpu = []
    for _ in range(5):
        t = time.perf_counter()
        s.call(CPU_LOOP)
        cpu.append(time.perf_counter() - t)
    s.close()
    warm.sort()
    return {"cold": cold * 1000, "p50": statistics.median(warm) * 1000,
            "p99": warm[int(0.99 * (len(warm) - 1))] * 1000, "cpu": statistics.median(cpu) * 1000}


def main():
    args = parse_args()
    cache = tempfile.mkdtemp()
    measure(args.binary, cache, "default")  # makes the memory snapshot
    runs = {mode: [] for mode in ("default", "off")}
    for _ in range(args.runs):  # interleaved, so that drift hits both alike
        for mode in runs:
            runs[mode].append(measure(args.binary, cache, mode))
    print(f"{'measure (ms, median of runs)':<36}{'on':>10}{'off':>10}{'on/off':>9}")
    for key, label in [("cold", "cold start -> first result"), ("p50", "warm call p50 (stdio)"),
                       ("p99", "warm call p99 (stdio)"), ("cpu", "CPU loop (2e6 iterations)")]:
        on = statistics.median(r[key] for r in runs["default"])
        off = statistics.median(r[key] for r in runs["off"])
        print(f"{label:<36}{on:>10.2f}{off:>10.2f}{on / off:>9.2f}")


if __name__ == "__main__":
    main()

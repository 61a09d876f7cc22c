"""Benchmark (README "Benchmarks"): cold start and warm call latency of mcp-run-python over stdio, against a
plain Pyodide boot in Node (same machine, same run). Prints a table with ratios.

    python3 bench/startup.py [--binary target/release/mcp-run-python] [--runs 3]
"""

import argparse
import json
import pathlib
import shutil
import statistics
import subprocess
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Runs of each measurement by default; the tables report their median, which one outlying run
# among three does not decide.
DEFAULT_RUNS = 3


class Stdio:
    """Raw JSON-RPC over the server's stdin/stdout (no client library in the measurement)."""

    def __init__(self, binary, *args):
        self.proc = subprocess.Popen(
            [binary, "stdio", *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        self.next_id = 0

    def request(self, method, params):
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        while True:
            reply = json.loads(self.proc.stdout.readline())
            if reply.get("id") == self.next_id:
                return reply

    def notify(self, method):
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method}) + "\n")
        self.proc.stdin.flush()

    def initialize(self):
        self.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                    "clientInfo": {"name": "bench", "version": "1"}})
        self.notify("notifications/initialized")

    def call(self, code):
        r = self.request("tools/call", {"name": "run_python_code", "arguments": {"python_code": code}})
        return r["result"]["content"][0]["text"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


def ours(binary, cache, *extra):
    t0 = time.perf_counter()
    s = Stdio(binary, "--workers", "1", "--cache-dir", cache, *extra)
    s.initialize()
    text = s.call("print(1)")
    cold = time.perf_counter() - t0
    assert "<output>\n1\n</output>" in text, text
    warm = []
    for _ in range(50):
        t = time.perf_counter()
        s.call("print(1)")
        warm.append(time.perf_counter() - t)
    s.close()
    return cold * 1000, statistics.median(warm) * 1000


def node_baseline():
    node = shutil.which("node")
    if not node:
        return None
    t0 = int(time.time() * 1000)
    out = subprocess.run([node, str(ROOT / "bench" / "node_baseline.js"), str(ROOT / "pyodide-assets"), str(t0)],
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(out.stderr)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    return data["cold_ms"], data["warm_median_ms"]


def parse_args():
    """`--binary` and `--runs`, shared with bench/confinement.py so that both take the same options."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    ap.add_argument("--runs", type=int, default=DEFAULT_RUNS)
    return ap.parse_args()


def main():
    args = parse_args()
    cache = tempfile.mkdtemp()
    plain_runs = [ours(args.binary, cache, "--no-snapshot") for _ in range(args.runs)]
    ours(args.binary, cache)  # makes the memory snapshot
    ours_runs = [ours(args.binary, cache) for _ in range(args.runs)]
    node_runs = [r for r in (node_baseline() for _ in range(args.runs)) if r]
    plain = statistics.median(r[0] for r in plain_runs)
    cold = statistics.median(r[0] for r in ours_runs)
    warm = statistics.median(r[1] for r in ours_runs + plain_runs)
    print(f"{'measure':<48}{'ms':>10}")
    print(f"{'(a) ours, plain boot: start -> print(1) result':<48}{plain:>10.0f}")
    print(f"{'(a) ours, from snapshot: start -> print(1)':<48}{cold:>10.0f}")
    print(f"{'(b) ours: warm call, median of 50':<48}{warm:>10.2f}")
    if node_runs:
        ncold = statistics.median(r[0] for r in node_runs)
        nwarm = statistics.median(r[1] for r in node_runs)
        print(f"{'(c) Node + Pyodide: start -> print(1)':<48}{ncold:>10.0f}")
        print(f"{'    Node + Pyodide: runPython, median of 50':<48}{nwarm:>10.2f}")
        print(f"ratio cold start ours/Node: plain boot {plain / ncold:.2f}, from snapshot {cold / ncold:.2f}")
        print(f"ratio warm call ours (full MCP round trip)/Node runPython: {warm / nwarm:.1f}")
    else:
        print("(c) Node is not installed: no baseline")


if __name__ == "__main__":
    main()

"""Soak (issue 48): many calls through the real binary, with both cores kept busy by a second
load, counting every call whose answer is not the expected one. A rare engine trap of a booted
interpreter ("Out of bounds memory access" at `callMain`, or while installing `--deps` at boot)
once lost a call; the front now boots another for it and says so in a `<note>`, which this
counts as a retry.

Three parts, each over stdio with the `mcp` client:
1. forked calls: one front with `--isolation call`, so that every call runs in a fresh
   interpreter forked from the zygote service (waited for first), with varied code: imports,
   allocation, exceptions, deep recursion, asyncio, output;
2. booted fronts: fronts with `--no-zygote`, each booting its interpreter from the memory
   snapshot and answering one call; every `--deps-every`th installs `--deps httpx` at boot;
3. warm calls: one front, one interpreter, call after call.

Everything runs in a runtime directory of its own (its zygote services are stopped at the end)
and a cache directory of its own (`--cache-dir`, default `target/soak-cache`; the first run
downloads httpx's wheels). Prints each part's calls, wrong answers and retries, and writes them
as JSON beside (`--json`).

    .venv/bin/python bench/soak.py [--binary target/release/mcp-run-python] [--forked-calls 1000]
        [--fronts 50] [--warm-calls 2000] [--deps-every 5] [--no-load]
"""

import argparse
import asyncio
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = pathlib.Path(__file__).resolve().parents[1]
CALL_TIMEOUT = datetime.timedelta(seconds=300)
# Seconds the zygote service may take to be ready for the forked part.
SERVICE_READY_TIMEOUT = 300

# The forked part's code, in turn: (code, a test of the result's text).
VARIED = [
    ("import json, re, math\nmath.factorial(20)", lambda t: "<return_value>\n2432902008176640000\n" in t),
    ("len(bytearray(b'\\x01') * (64 << 20))", lambda t: "<return_value>\n67108864\n" in t),
    ("raise ValueError('soak')", lambda t: t.startswith("<status>run-error</status>") and "ValueError: soak" in t),
    ("def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\nf(10 ** 5)",
     lambda t: t.startswith("<status>run-error</status>") and "RecursionError" in t),
    ("def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\nf(500)", lambda t: "<return_value>\n500\n" in t),
    ("import asyncio\nasync def g(i):\n    await asyncio.sleep(0)\n    return i\n"
     "sum(await asyncio.gather(*(g(i) for i in range(100))))", lambda t: "<return_value>\n4950\n" in t),
    ("for i in range(3):\n    print('line', i)\n'done'",
     lambda t: "<output>\nline 0\nline 1\nline 2\n</output>" in t and "<return_value>\ndone\n" in t),
    ("import collections, itertools, functools\nsum(itertools.islice(itertools.count(), 1000))",
     lambda t: "<return_value>\n499500\n" in t),
]


class Tally:
    """A part's counts: calls, answers that were not the expected one (with the first few), and
    retries (results with a `<note>` of a stand-in interpreter)."""

    def __init__(self, name):
        self.name, self.calls, self.wrong, self.retries, self.examples = name, 0, 0, 0, []

    def check(self, text, expected):
        self.calls += 1
        if "<note>" in text:
            self.retries += 1
        if not expected(text):
            self.wrong += 1
            if len(self.examples) < 5:
                self.examples.append(text[:400])

    def fail(self, error):
        self.calls += 1
        self.wrong += 1
        if len(self.examples) < 5:
            self.examples.append(f"no answer: {error!r}"[:400])

    def summary(self):
        return {"part": self.name, "calls": self.calls, "wrong": self.wrong, "retries": self.retries,
                "examples": self.examples}


def params(args, env, *flags):
    return StdioServerParameters(command=args.binary, args=["stdio", "--cache-dir", args.cache_dir, *flags], env=env)


async def call(session, code):
    result = await session.call_tool("run_python_code", {"python_code": code}, read_timeout_seconds=CALL_TIMEOUT)
    return result.content[0].text


async def forked_calls(args, env, tally):
    """Part 1: `--forked-calls` calls, each in a fresh interpreter forked from the service."""
    async with stdio_client(params(args, env, "--isolation", "call")) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await call(session, "1")
            wait_for_ready_service(args, env)
            for i in range(args.forked_calls):
                code, expected = VARIED[i % len(VARIED)]
                try:
                    tally.check(await call(session, code), expected)
                except Exception as e:  # noqa: BLE001 - every failure is counted
                    tally.fail(e)


async def booted_fronts(args, env, tally):
    """Part 2: `--fronts` fronts that boot their interpreter from the snapshot."""
    for i in range(args.fronts):
        flags = ["--no-zygote"]
        if args.deps_every and i % args.deps_every == 0:
            flags += ["--deps", "httpx"]
            code, expected = "import httpx\nhttpx.__name__", lambda t: "<return_value>\nhttpx\n" in t
        else:
            code, expected = "1 + 1", lambda t: "<return_value>\n2\n" in t
        try:
            async with stdio_client(params(args, env, *flags)) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    tally.check(await call(session, code), expected)
        except Exception as e:  # noqa: BLE001 - every failure is counted
            tally.fail(e)


async def warm_calls(args, env, tally):
    """Part 3: `--warm-calls` calls in one interpreter."""
    async with stdio_client(params(args, env)) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for i in range(args.warm_calls):
                try:
                    text = await call(session, f"x = {i}\nx * 2")
                    tally.check(text, lambda t, i=i: f"<return_value>\n{2 * i}\n" in t)
                except Exception as e:  # noqa: BLE001 - every failure is counted
                    tally.fail(e)


def wait_for_ready_service(args, env):
    deadline = time.monotonic() + SERVICE_READY_TIMEOUT
    while time.monotonic() < deadline:
        done = subprocess.run([args.binary, "zygote", "status", "--cache-dir", args.cache_dir], env=env,
                              capture_output=True, text=True)
        if " ready" in done.stdout and " warming up" not in done.stdout:
            return
        time.sleep(0.5)
    raise SystemExit(f"no zygote service became ready in {SERVICE_READY_TIMEOUT} s")


def start_load(cores):
    """A second load: one busy process per core, at the same priority as the soak."""
    return [subprocess.Popen([sys.executable, "-c", "while True:\n    pass"]) for _ in range(cores)]


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    parser.add_argument("--cache-dir", default=str(ROOT / "target" / "soak-cache"))
    parser.add_argument("--forked-calls", type=int, default=1000)
    parser.add_argument("--fronts", type=int, default=50)
    parser.add_argument("--warm-calls", type=int, default=2000)
    parser.add_argument("--deps-every", type=int, default=5)
    parser.add_argument("--no-load", action="store_true")
    parser.add_argument("--json", default=str(ROOT / "target" / "soak.json"))
    args = parser.parse_args()
    runtime = tempfile.mkdtemp(prefix="mcp-run-python-soak-")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "XDG_RUNTIME_DIR": runtime}
    load = [] if args.no_load else start_load(os.cpu_count() or 1)
    tallies = [Tally("forked calls"), Tally("booted fronts"), Tally("warm calls")]
    started = time.monotonic()
    try:
        await forked_calls(args, env, tallies[0])
        await booted_fronts(args, env, tallies[1])
        await warm_calls(args, env, tallies[2])
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
        subprocess.run([args.binary, "zygote", "stop", "--cache-dir", args.cache_dir], env=env, capture_output=True)
    took = time.monotonic() - started
    report = {"binary": args.binary, "load": not args.no_load, "seconds": round(took),
              "parts": [t.summary() for t in tallies]}
    for t in tallies:
        print(f"{t.name:>14}: {t.calls} calls, {t.wrong} wrong, {t.retries} retried")
    print(f"{'total':>14}: {sum(t.calls for t in tallies)} calls, {sum(t.wrong for t in tallies)} wrong, "
          f"{sum(t.retries for t in tallies)} retried, {took:.0f} s{'' if args.no_load else ', both cores loaded'}")
    for t in tallies:
        for example in t.examples:
            print(f"--- {t.name}: {example}")
    pathlib.Path(args.json).write_text(json.dumps(report, indent=2))
    sys.exit(1 if any(t.wrong for t in tallies) else 0)


if __name__ == "__main__":
    asyncio.run(main())

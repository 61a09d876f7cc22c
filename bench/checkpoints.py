"""Benchmark (checkpoints, docs/architecture.md §3.4): what keeping a sandbox's interpreter state costs, in one run, as ratios to
Monty (PyPI `pydantic-monty`), whose `session.dump()` / `load_session()` are its checkpoint,
restore and fork. Every server is `streamable-http --stateful --workers 1`, spoken to over
sessionless MCP 2026-07-28 requests (bench/sandboxes.py's `Sessionless`, each request on one bare
keep-alive connection: httpx adds ~2.5 ms of client time per request), and every sandbox is made
once the zygote is ready, so that its interpreter is forked (a booted one is not checkpointed).
The front's debug line for each checkpoint ("checkpoint of N changed page(s) in X µs; K KiB
kept") says what the checkpoints inside the timed calls cost: only that module's debug lines are
switched on (RUST_LOG), not all of `--verbose`.

1. checkpoint per call: in a sandbox holding `import json` and `data = random.randbytes(100 *
   1024)`, warm calls `x = x + 1` (each changes well under 1 MiB), p50/p95, with `--stateful`
   (the checkpoint kept by the front) and with `--stateful --state-dir DIR` (also written
   there, sealed: a chain of the whole image and per-call deltas), in alternating rounds; the difference of the p50s (target:
   <= 2 ms) and the front's checkpoint time, against Monty's `dump()` of the same session; for
   reference, a warm call without `--stateful` (an MCP session's interpreter: no checkpoint);
2. resume after hibernation (`--hibernate-after 1`): sandboxes as in 1, each hibernated (the
   metric `mcp_run_python_sandboxes_hibernated` counts them all), then the first call `x` in
   each, p50/p95 (target: p50 <= 30 ms), against Monty's checkout of a fresh session ->
   `load_session()` of the dump -> result of `x`;
3. fork (when `tools/list` has `fork_sandbox`; skipped with a message otherwise): `fork_sandbox`
   -> the result of `len(data)` in the copy, of a sandbox that imported json re collections
   datetime decimal statistics csv and holds 10 MiB (target: p50 <= 10 ms), and of the small
   sandbox of 1, against Monty's `dump()` -> fresh session -> `load_session()` -> result;
4. 10,000 idle sandboxes: `--max-sandboxes 50 --hibernate-after 1 --sandbox-idle-timeout 0`,
   each made by `create_sandbox` and one call `import json, random; data = random.randbytes(100
   * 1024)` (the cap hibernates the older ones as new ones come); then the front's RSS, the PSS
   of the server's every process (front, zygote, spares), the bytes of `<cache dir>/hibernated/`
   (`du -sb`), the hibernation metrics and the time (targets: < 1 GiB RSS, < 5 GiB disk); 20
   random sandboxes of the older half must still give `len(data) == 102400`. Past
   `--idle-budget` seconds it stops making sandboxes and extrapolates to 10,000, saying so.
   Against the bytes of Monty dumps of as many such sessions.

Each server keeps a zygote of its own (`--no-shared-zygote`: its child, so that the PSS counts
it and no other front's, and so that no other program on the host that stops the zygote
services started during its own run, as the test suites' run-wide cleanup does, ends it
mid-measure); `--shared-zygote` forks from a per-host service instead, this bench's own (a
temporary XDG_RUNTIME_DIR, 0700). The servers share a `--cache-dir` (temporary unless given);
every server is stopped, and then any service (`zygote stop`), also on failure. Nothing is
asserted about times; it prints a Markdown table.

    cargo build --release
    .venv-bench/bin/python bench/checkpoints.py [--binary target/release/mcp-run-python]
        [--cache-dir DIR] [--calls 100] [--rounds 3] [--resumes 40] [--forks 40]
        [--idle-sandboxes 10000] [--idle-budget 1500] [--measures 1,2,3,4] [--shared-zygote]

(`.venv-bench` is made by bench/startup_table.py and has pydantic-monty and httpx.)

One run (release build at af72eec, 2-core machine shared with other builds and test runs,
2026-11-27; each figure a p50 unless said, × Monty's in the same run):
- a warm call `x = x + 1` with `--stateful`: 3.3 ms (p95 5.2), of which the checkpoint 2.1 ms
  (134 changed pages; 2.1 MiB kept), against 0.46 ms without `--stateful`; Monty's `dump()`
  0.075 ms (28× for the checkpoint);
- `--state-dir` added 17 ms (pooled; rounds 21, 14 and 4.7 ms, with other programs' disk writes
  in the first two) while each call sealed the whole image again and flushed three files. Once
  a call writes only a delta of the pages it changed and flushes only the ownership record
  (release build at 3de5b48, quieter machine): 3.6 ms with `--stateful`, 5.0 ms with
  `--state-dir`, 1.37 ms more (rounds 0.97, 1.24, 2.08 ms): target 2 ms met; the front's save
  0.87 ms (p95 3.5), sealing the delta 0.32 ms of it; the chain 361 KiB;
- resume after hibernation: 24 ms (p95 39; 116× Monty's 0.21 ms checkout -> load -> result),
  target 30 ms met; 229 KiB on disk a sandbox (1.9× Monty's 120 KiB dump); once a restore sends
  the pages from where the front holds them (a later build): 21.6 ms (p95 24.9), the checkpoint
  after the call 6.8 ms of it;
- fork of the 10 MiB sandbox -> result in the copy: 135 ms (p95 283; 10× Monty's 13 ms), target
  10 ms missed: `fork_sandbox` itself takes 4.8 ms, the copy's first call restores 37.8 MiB of
  changed pages (the 10 MiB, and what `randbytes` made and freed on the way); the small
  sandbox: 22 ms (115×). Once the copy takes the source's interpreter (a later release build):
  18.2 ms (p95 22.2; 0.8× Monty's 22.7 ms in that run), `fork_sandbox` 2.1 ms and the copy's
  checkpoint after its first call 10.2 ms of it; the small sandbox 16.4 ms;
- 10,000 idle sandboxes in 544 s (54 ms each; Monty 3.6 s): the front's RSS 133 MiB, the
  server's PSS 329 MiB (3 processes), 2,220 MiB in `hibernated/` (2.2× Monty's 1,032 MiB of
  dumps): both targets met; 20 random older ones resumed (p50 23 ms) with their 102,400 bytes.

Measures 1–3 again once the kernel says which pages a call wrote (release build at 468dd8c,
`--measures 1,2,3 --forks 40 --resumes 40`): a warm call 1.22 ms with `--stateful` (p95 1.95;
the checkpoint 0.34 ms, 133 pages), 2.03 ms with `--state-dir` (0.81 ms more; the save 0.67 ms,
sealing 0.25 ms; the chain 334 KiB); resume after hibernation 15.6 ms (p95 18.8); fork of the
10 MiB sandbox -> result in the copy 9.45 ms (p95 13.9; 0.4× Monty's 24.8 ms), `fork_sandbox`
1.89 ms and the copy's checkpoint 1.43 ms of it; the small sandbox 8.24 ms. Measure 4 was not
run again (hibernated workers end; what the front keeps is unchanged).
"""

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import httpx

from interpreters import ZYGOTE_READY, Connection, Http, descendants, pss_kib
from sandboxes import META, Sessionless
from throughput import IDLE_CPU, SETTLE_INTERVAL, SETTLE_LIMIT, percentile, settle, tree_cpu

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The sandbox of measures 1 and 2: `import json` and 100 KiB of data, and a counter.
SMALL = "import json, random\ndata = random.randbytes(100 * 1024)\nx = 0"
# The sandbox of measure 3: a few stdlib modules and 10 MiB.
BIG_IMPORTS = ["json", "re", "collections", "datetime", "decimal", "statistics", "csv"]
BIG = f"import {', '.join(BIG_IMPORTS)}, random\ndata = random.randbytes(10 << 20)"
# Monty has no `statistics` module: its big session imports the others.
MONTY_BIG = BIG.replace(" statistics,", "")
# The one call of each of the idle sandboxes of measure 4.
IDLE = "import json, random\ndata = random.randbytes(100 * 1024)"
# Calls before the timed ones, in each round of measure 1.
WARM_UP = 20
# The front's debug line for each checkpoint (src/server/call/checkpoints.rs).
CHECKPOINT_LINE = re.compile(r"checkpoint of (\d+) changed page\(s\) in (\d+) µs; (\d+) KiB kept")
# The front's debug line for each save to a state directory: µs in all, µs sealing.
SAVE_LINE = re.compile(r"saved to the state directory in (\d+) µs \(its checkpoint file sealed in (\d+) µs\)")
# The front's default log filter plus the checkpoint and state-directory modules' debug lines.
RUST_LOG = ("warn,mcp_run_python=info,mcp_run_python::server::call::checkpoints=debug,"
            "mcp_run_python::sandbox::registry=debug")
# How long the sandboxes may take to hibernate (seconds).
HIBERNATE_WAIT = 120
# How long a server may take to stop before it is killed (seconds).
STOP_WAIT = 60
MIB = 1 << 20
# Arguments every server gets besides its own (`--no-shared-zygote` unless --shared-zygote).
COMMON = []


# --- the server ------------------------------------------------------------------------------

class Bare:
    """httpx's `post` as `Sessionless` uses it, over one bare keep-alive connection
    (interpreters.Connection), so that the client's time stays out of the latencies."""

    def __init__(self, connection):
        self.connection = connection

    async def post(self, url, json, headers):
        status, text = await self.connection.post("/mcp", json, headers)
        return SimpleNamespace(status_code=status, text=text)


class Started(Http):
    """interpreters.Http, whose process is killed when it never starts listening."""

    def __init__(self, *args):
        try:
            super().__init__(*args)
        except BaseException:
            if hasattr(self, "proc"):
                self.proc.kill()
                self.proc.wait()
            raise


class Server:
    """One `streamable-http --stateful --workers 1` server (interpreters.Http) with a
    `Sessionless` client on a bare connection; stopped on leaving, whatever happens."""

    def __init__(self, binary, cache, *args):
        self.binary, self.cache, self.args = binary, cache, args

    async def __aenter__(self):
        self.http = Started(self.binary, self.cache, "--stateful", "--workers", "1", *COMMON, *self.args)
        try:
            self.connection = await Connection.open(self.http.port)
            self.client = Sessionless(self.http, Bare(self.connection))
            self.httpx = httpx.AsyncClient(timeout=300)
            # A first call, then the zygote: every sandbox made from now on is forked. The
            # first sandbox goes, so that the metrics count the measured ones only.
            first = await self.create()
            await self.run(first, "1")
            await self.destroy(first)
            await self.http.wait_for(ZYGOTE_READY)
            self.service = service_pid(self.binary, self.cache)
            await self.settle()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(self, *_):
        with contextlib.suppress(Exception):
            self.connection.close()
        with contextlib.suppress(Exception):
            await self.httpx.aclose()
        self.stop()

    def stop(self):
        proc = self.http.proc
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    async def settle(self):
        """throughput.settle over the front's tree and the zygote service's (whose zygote forks
        the workers): waits until they stop using CPU (a spare forked, a state written)."""
        def cpu():
            return tree_cpu(self.http.proc.pid) + (tree_cpu(self.service) if self.service else 0)

        before = cpu()
        for _ in range(int(SETTLE_LIMIT / SETTLE_INTERVAL)):
            await asyncio.sleep(SETTLE_INTERVAL)
            now = cpu()
            if now - before < IDLE_CPU:
                return
            before = now

    async def create(self):
        return (await self.client.tool("create_sandbox", {}))["sandbox_id"]

    async def destroy(self, sandbox):
        """destroy_sandbox (its answer is text only: `Sessionless.tool` checks it is no error,
        then finds no structured content)."""
        with contextlib.suppress(KeyError):
            await self.client.tool("destroy_sandbox", {"sandbox_id": sandbox})

    async def run(self, sandbox, code):
        return await self.client.tool("run_python_code", {"python_code": code, "sandbox_id": sandbox})

    async def tools(self):
        """The names `tools/list` gives (sessionless)."""
        headers = {**Http.HEADERS, "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/list"}
        message = {"jsonrpc": "2.0", "id": 0, "method": "tools/list", "params": {"_meta": META}}
        r = await self.httpx.post(self.http.base, json=message, headers=headers)
        for line in r.text.splitlines():
            if line.startswith("data: {") or line.startswith("{"):
                return [t["name"] for t in json.loads(line.removeprefix("data: "))["result"]["tools"]]
        raise AssertionError(r.text)

    async def metrics(self):
        """Every sample of /metrics, by its name with labels."""
        r = await self.httpx.get(f"http://127.0.0.1:{self.http.port}/metrics")
        samples = {}
        for line in r.text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    async def wait_metric(self, sample, wanted, timeout=HIBERNATE_WAIT):
        """Waits until the metric `sample` is `wanted` (polled every 0.1 s)."""
        deadline = time.monotonic() + timeout
        while (await self.metrics()).get(sample, 0) != wanted:
            if time.monotonic() > deadline:
                raise SystemExit(f"{sample} did not reach {wanted} in {timeout} s "
                                 f"(it is {(await self.metrics()).get(sample, 0)})")
            await asyncio.sleep(0.1)

    def log_size(self):
        return pathlib.Path(self.http.log.name).stat().st_size

    def checkpoints_since(self, offset, line=CHECKPOINT_LINE):
        """(changed pages, µs, KiB kept) of each checkpoint the front logged past `offset` (or
        the numbers of each `line`)."""
        with open(self.http.log.name, "rb") as log:
            log.seek(offset)
            text = log.read().decode(errors="replace")
        return [tuple(map(int, m.groups())) for m in line.finditer(text)]


def zygote(binary, action, cache):
    return subprocess.run([binary, "zygote", action, "--cache-dir", cache], capture_output=True, text=True,
                          timeout=60)


def service_pid(binary, cache):
    """This bench's zygote service's pid, or None."""
    found = re.search(r"pid (\d+)", zygote(binary, "status", cache).stdout)
    return int(found.group(1)) if found else None


def rss_kib(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def disk_bytes(path):
    """`du -sb` of `path` (0 when it is not there)."""
    if not pathlib.Path(path).exists():
        return 0
    return int(subprocess.run(["du", "-sb", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def p50(values):
    return percentile(values, 50)


def p95(values):
    return percentile(values, 95)


def ms(seconds):
    return seconds * 1000


# --- 1. checkpoint per call ------------------------------------------------------------------

async def checkpoint_round(binary, cache, calls, state_dir=None):
    """Latencies (s) of `calls` warm `x = x + 1` calls, and the front's checkpoint lines for them
    (pages, µs, KiB kept), and with a state directory the size of its checkpoint files (bytes)
    and the front's save lines (µs in all, µs sealing)."""
    args = ["--state-dir", state_dir] if state_dir else []
    async with Server(binary, cache, *args) as server:
        sandbox = await server.create()
        await server.run(sandbox, SMALL)
        for _ in range(WARM_UP):
            await server.run(sandbox, "x = x + 1")
        await server.settle()
        before = server.log_size()
        times = []
        for _ in range(calls):
            t = time.perf_counter()
            await server.run(sandbox, "x = x + 1")
            times.append(time.perf_counter() - t)
        assert (await server.run(sandbox, "x"))["return_value"] == WARM_UP + calls
        lines = server.checkpoints_since(before)
        saves = server.checkpoints_since(before, SAVE_LINE)
        files = list(pathlib.Path(state_dir).rglob("checkpoint-*.bin")) if state_dir else []
        size = sum(f.stat().st_size for f in files)
    return times, lines[:calls], (size, saves[:calls])


async def no_checkpoint_round(binary, cache, calls):
    """Latencies (s) of `calls` warm calls `x = 1` (without `--stateful` a call's globals are its
    own, so no `x` is left for `x = x + 1`) in an MCP session's interpreter of a server without
    `--stateful` (no checkpoint), over a bare connection (interpreters.Http)."""
    server = Started(binary, cache, "--workers", "1", *COMMON)
    try:
        async with httpx.AsyncClient(timeout=300) as http:
            await server.call(http, await server.session(http))
            await server.wait_for(ZYGOTE_READY)
            h = await server.session(http)
            await server.call(http, h, SMALL)
            conn = await Connection.open(server.port)
            for _ in range(WARM_UP):
                await server.raw_call(conn, h, "x = 1")
            await settle(server.proc.pid)
            times = [await server.raw_call(conn, h, "x = 1") for _ in range(calls)]
            conn.close()
    finally:
        server.close()
    return times


async def checkpoints(binary, cache, calls, rounds):
    """Measure 1, in alternating rounds without and with a state directory (and, for
    reference, without `--stateful`)."""
    memory, directory, lines, sizes, sessions = [], [], {False: [], True: []}, [], []
    for _ in range(rounds):
        sessions.append(await no_checkpoint_round(binary, cache, calls))
        times, seen, _ = await checkpoint_round(binary, cache, calls)
        memory.append(times)
        lines[False] += seen
        with tempfile.TemporaryDirectory(prefix="mrp-state-") as state_dir:
            times, seen, size = await checkpoint_round(binary, cache, calls, state_dir)
        directory.append(times)
        lines[True] += seen
        sizes.append(size)
    return memory, directory, lines, sizes, sessions


# --- 2. resume after hibernation -------------------------------------------------------------

async def resumes(binary, cache, count):
    """Measure 2: the first call's latency (s) in each of `count` hibernated sandboxes, the
    hibernated bytes per sandbox, and the checkpoint the front took after each of those calls."""
    async with Server(binary, cache, "--hibernate-after", "1", "--max-sandboxes", str(count + 10)) as server:
        sandboxes = []
        for _ in range(count):
            sandbox = await server.create()
            await server.run(sandbox, SMALL)
            sandboxes.append(sandbox)
        await server.wait_metric("mcp_run_python_sandboxes_hibernated", count)
        await server.wait_metric('mcp_run_python_interpreters{state="idle"}', 0)
        per_sandbox = (await server.metrics())["mcp_run_python_hibernated_bytes"] / count
        times, lines = [], []
        for sandbox in sandboxes:
            await server.settle()
            before = server.log_size()
            t = time.perf_counter()
            result = await server.run(sandbox, "x")
            times.append(time.perf_counter() - t)
            assert result.get("return_value") == 0 and "state" not in result, result
            lines += server.checkpoints_since(before)[:1]
            # It hibernates again before the next one is timed.
            await server.wait_metric("mcp_run_python_sandboxes_hibernated", count)
    return times, per_sandbox, lines


# --- 3. fork ---------------------------------------------------------------------------------

async def forks(binary, cache, count):
    """Measure 3: for the big and the small sandbox, the latencies (s) of `fork_sandbox` alone
    and of `fork_sandbox` -> the first result in the copy; None when the server has no
    `fork_sandbox`."""
    async with Server(binary, cache, "--max-sandboxes", "20", "--hibernate-after", "0") as server:
        if "fork_sandbox" not in await server.tools():
            return None
        found = {}
        for label, code, length in (("big", BIG, 10 << 20), ("small", SMALL, 100 * 1024)):
            source = await server.create()
            before = server.log_size()
            await server.run(source, code)
            kept = server.checkpoints_since(before)[0][2]
            fork_only, to_result, lines = [], [], []
            for i in range(count + 3):
                await server.settle()
                before = server.log_size()
                t = time.perf_counter()
                copy = (await server.client.tool("fork_sandbox", {"sandbox_id": source}))["sandbox_id"]
                forked = time.perf_counter()
                result = await server.run(copy, "len(data)")
                done = time.perf_counter()
                assert result["return_value"] == length, result
                if i >= 3:  # the first three warm up
                    fork_only.append(forked - t)
                    to_result.append(done - t)
                    lines += server.checkpoints_since(before)[:1]
                await server.destroy(copy)
            await server.destroy(source)
            found[label] = fork_only, to_result, lines, kept
    return found


# --- 4. 10,000 idle sandboxes ----------------------------------------------------------------

def server_pids(front, service):
    """The front, its descendants, and this bench's zygote service with its descendants (its
    zygote and the workers it forked)."""
    pids = [front, *descendants(front)]
    if service:
        pids += [service, *descendants(service)]
    return list(dict.fromkeys(pids))


async def idle_sandboxes(binary, cache, wanted, budget):
    """Measure 4 (see the module's documentation)."""
    args = ["--max-sandboxes", "50", "--hibernate-after", "1", "--sandbox-idle-timeout", "0"]
    async with Server(binary, cache, *args) as server:
        front = server.http.proc.pid
        rss_before = rss_kib(front)
        made, started = [], time.perf_counter()
        while len(made) < wanted and time.perf_counter() - started < budget:
            sandbox = await server.create()
            await server.run(sandbox, IDLE)
            made.append(sandbox)
            if len(made) % 1000 == 0:
                print(f"checkpoints: {len(made)} sandboxes in {time.perf_counter() - started:.0f} s, "
                      f"front RSS {rss_kib(front) / 1024:.0f} MiB", file=sys.stderr)
        elapsed = time.perf_counter() - started
        # The last ones hibernate too (--hibernate-after 1).
        await server.wait_metric("mcp_run_python_sandboxes_hibernated", len(made))
        await server.settle()
        samples = await server.metrics()
        pids = server_pids(front, server.service)
        found = {
            "made": len(made), "seconds": elapsed, "rss_before_kib": rss_before, "rss_kib": rss_kib(front),
            "pss_kib": sum(pss_kib(p) for p in pids), "front_pss_kib": pss_kib(front), "processes": len(pids),
            "spare": samples.get('mcp_run_python_interpreters{state="spare"}', 0),
            "idle": samples.get('mcp_run_python_interpreters{state="idle"}', 0),
            "disk": disk_bytes(pathlib.Path(cache) / "hibernated"),
            "hibernated": samples.get("mcp_run_python_sandboxes_hibernated", 0),
            "hibernated_bytes": samples.get("mcp_run_python_hibernated_bytes", 0),
            "hibernations": samples.get("mcp_run_python_hibernations_total", 0),
            "sandboxes": samples.get("mcp_run_python_sandboxes", 0),
        }
        checked, resumed = random.sample(made[:len(made) // 2], min(20, len(made) // 2)), []
        for sandbox in checked:
            await server.settle()
            t = time.perf_counter()
            result = await server.run(sandbox, "len(data)")
            resumed.append(time.perf_counter() - t)
            assert result["return_value"] == 102400, result
        found["checked"], found["resumed"] = len(checked), resumed
    return found


# --- Monty -----------------------------------------------------------------------------------

def monty(calls, count, idle):
    """Monty's figures: dump of the small session, checkout + load + `x`, dump + checkout + load
    + `len(data)` of the big and small sessions, and the bytes of `idle` dumps."""
    import pydantic_monty

    found = {}
    with pydantic_monty.Monty() as pool:
        with pool.checkout() as session:
            session.feed_run(SMALL)
            warm, dumps = [], []
            for i in range(WARM_UP + calls):
                t = time.perf_counter()
                session.feed_run("x = x + 1")
                t1 = time.perf_counter()
                dump = session.dump()
                if i >= WARM_UP:
                    warm.append(t1 - t)
                    dumps.append(time.perf_counter() - t1)
            small = session.dump()
        found["warm"], found["dump"], found["small_bytes"] = warm, dumps, len(small)

        def load(image, code, expected):
            """Checkout -> load_session -> result of `code` (s), and load -> result (s)."""
            t = time.perf_counter()
            with pool.checkout() as fresh:
                t1 = time.perf_counter()
                fresh.load_session(image)
                assert fresh.feed_run(code) == expected
                t2 = time.perf_counter()
            return t2 - t, t2 - t1

        load(small, "x", WARM_UP + calls)
        runs = [load(small, "x", WARM_UP + calls) for _ in range(count)]
        found["resume"], found["load"] = [r[0] for r in runs], [r[1] for r in runs]

        for label, code, length in (("big", MONTY_BIG, 10 << 20), ("small", SMALL, 100 * 1024)):
            with pool.checkout() as session:
                session.feed_run(code)
                times = []
                for i in range(count + 3):
                    t = time.perf_counter()
                    image = session.dump()
                    with pool.checkout() as fresh:
                        fresh.load_session(image)
                        assert fresh.feed_run("len(data)") == length
                        done = time.perf_counter()
                    if i >= 3:
                        times.append(done - t)
                found[f"fork_{label}"] = times
                found[f"{label}_dump_bytes"] = len(image)

        total, t = 0, time.perf_counter()
        for _ in range(idle):
            with pool.checkout() as session:
                session.feed_run(IDLE)
                total += len(session.dump())
        found["idle_bytes"], found["idle_seconds"] = total, time.perf_counter() - t
    return found


# --- the table -------------------------------------------------------------------------------

def pooled(rounds):
    return [t for r in rounds for t in r]


def report(args, measures, c, r, f, i, m):
    rows = []

    def row(label, ours, theirs=None, unit="ms", note=""):
        ratio = f"{ours / theirs:.1f}×" if theirs else ""
        theirs_text = f"{theirs:.3f} {unit}" if theirs is not None else ""
        rows.append(f"| {label} | {ours:.2f} {unit} | {theirs_text} | {ratio} | {note} |")

    monty_dump = ms(p50(m["dump"]))
    if c:
        memory, directory, lines, sizes, sessions = c
        mem50, dir50 = ms(p50(pooled(memory))), ms(p50(pooled(directory)))
        n = len(pooled(memory))
        row(f"1. for reference: warm call `x = 1` without `--stateful` (a session's interpreter, no "
            f"checkpoint): p50 (n={n})", ms(p50(pooled(sessions))), ms(p50(m["warm"])),
            note=f"p95 {ms(p95(pooled(sessions))):.2f} ms; per round "
                 f"{', '.join(f'{ms(p50(t)):.2f}' for t in sessions)} ms")
        row(f"1. warm call `x = x + 1`, `--stateful`: p50 (n={n})", mem50, ms(p50(m["warm"])),
            note=f"p95 {ms(p95(pooled(memory))):.2f} ms; per round "
                 f"{', '.join(f'{ms(p50(t)):.2f}' for t in memory)} ms; Monty: its `feed_run`")
        row(f"1. the same, `--stateful --state-dir`: p50 (n={n})", dir50, ms(p50(m["warm"])),
            note=f"p95 {ms(p95(pooled(directory))):.2f} ms; per round "
                 f"{', '.join(f'{ms(p50(t)):.2f}' for t in directory)} ms")
        row("1. `--state-dir` minus without: difference of the p50s (target ≤ 2 ms)", dir50 - mem50, monty_dump,
            note=f"per round {', '.join(f'{ms(p50(d) - p50(t)):.2f}' for t, d in zip(memory, directory))} ms; "
                 f"Monty: its `dump()`, p50 ({m['small_bytes'] / 1024:.0f} KiB)")
        for state_dir in (False, True):
            seen = lines[state_dir]
            if seen:
                us = [line[1] / 1000 for line in seen]
                row(f"1. the front's checkpoint ({'with' if state_dir else 'without'} `--state-dir`), "
                    "from its log: p50", p50(us), monty_dump,
                    note=f"p95 {p95(us):.2f} ms; {p50([line[0] for line in seen])} changed pages p50, "
                         f"{p50([line[2] for line in seen])} KiB kept")
        saves = [save for _, round_saves in sizes for save in round_saves]
        if saves:
            row("1. the front's save to the state directory (seal, write, record), from its log: p50",
                p50([s[0] / 1000 for s in saves]), monty_dump,
                note=f"p95 {p95([s[0] / 1000 for s in saves]):.2f} ms; of it sealing the checkpoint "
                     f"file p50 {p50([s[1] / 1000 for s in saves]):.2f} ms")
        sizes = [size for size, _ in sizes]
        if any(sizes):
            rows.append(f"| 1. checkpoint files in the state directory (a chain) | {max(sizes) / 1024:.0f} KiB | "
                        f"{m['small_bytes'] / 1024:.0f} KiB | {max(sizes) / m['small_bytes']:.1f}× "
                        "| Monty: its dump |")
    if r:
        times, per_sandbox, seen = r
        row(f"2. resume after hibernation → result of `x`: p50 (n={len(times)}; target ≤ 30 ms)", ms(p50(times)),
            ms(p50(m["resume"])),
            note=f"p95 {ms(p95(times)):.2f} ms; of it the checkpoint after the call (front's log) p50 "
                 f"{p50([line[1] for line in seen]) / 1000:.2f} ms; Monty: checkout → `load_session()` → `x` "
                 f"(load → `x` alone {ms(p50(m['load'])):.3f} ms)")
        rows.append(f"| 2. hibernated state per sandbox (`hibernated_bytes` / sandboxes) "
                    f"| {per_sandbox / 1024:.0f} KiB | {m['small_bytes'] / 1024:.0f} KiB "
                    f"| {per_sandbox / m['small_bytes']:.1f}× | Monty: its dump |")
    if "3" in measures and f is None:
        rows.append("| 3. fork | skipped: `tools/list` has no `fork_sandbox` in this binary | | | |")
    elif f:
        for label, name in (("big", "10 MiB + 7 stdlib modules"), ("small", "100 KiB, `import json`")):
            fork_only, to_result, seen, kept = f[label]
            row(f"3. fork ({name}) → result of `len(data)` in the copy: p50 (n={len(to_result)}"
                f"{'; target ≤ 10 ms' if label == 'big' else ''})",
                ms(p50(to_result)), ms(p50(m[f"fork_{label}"])),
                note=f"p95 {ms(p95(to_result)):.2f} ms; `fork_sandbox` alone p50 {ms(p50(fork_only)):.2f} ms; "
                     f"the copy's checkpoint after its first call p50 {p50([line[1] for line in seen]) / 1000:.2f} ms; "
                     f"the source's checkpoint keeps {kept / 1024:.1f} MiB; "
                     f"Monty: `dump()` → checkout → `load_session()` → result "
                     f"({m[f'{label}_dump_bytes'] / MIB:.2f} MiB dump)")
    if i:
        scale = args.idle_sandboxes / i["made"]
        extrapolated = "" if i["made"] >= args.idle_sandboxes else \
            f" (only {i['made']} made in the budget: × {scale:.2f} extrapolated)"
        rss = i["rss_before_kib"] + (i["rss_kib"] - i["rss_before_kib"]) * scale
        rows.append(f"| 4. {args.idle_sandboxes} idle sandboxes: the front's RSS (target < 1 GiB){extrapolated} | "
                    f"{rss / 1024:.0f} MiB | | | {i['rss_before_kib'] / 1024:.0f} MiB before the first; measured "
                    f"{i['rss_kib'] / 1024:.0f} MiB with {i['made']} |")
        rows.append(f"| 4. the whole server's PSS ({i['processes']} processes: the front, the zygote, "
                    f"{i['spare']:.0f} spare and {i['idle']:.0f} awake interpreter(s)) "
                    f"| {i['pss_kib'] / 1024:.0f} MiB | | | "
                    f"the front's {i['front_pss_kib'] / 1024:.0f} MiB; measured with {i['made']} |")
        disk = i["disk"] * scale
        monty_disk = m["idle_bytes"] / args.idle_monty * args.idle_sandboxes
        rows.append(f"| 4. `du -sb <cache>/hibernated/` (target < 5 GiB) | {disk / MIB:.0f} MiB "
                    f"| {monty_disk / MIB:.0f} MiB | {disk / monty_disk:.1f}× "
                    f"| {i['disk'] / i['made'] / 1024:.0f} KiB a sandbox; Monty: {args.idle_monty} dumps of such "
                    f"sessions, {m['idle_bytes'] / args.idle_monty / 1024:.0f} KiB each |")
        rows.append(f"| 4. metrics: hibernated sandboxes / bytes / hibernations | {i['hibernated']:.0f} / "
                    f"{i['hibernated_bytes'] / MIB:.0f} MiB / {i['hibernations']:.0f} | | | "
                    f"`mcp_run_python_sandboxes` {i['sandboxes']:.0f} |")
        rows.append(f"| 4. time to make them ({i['made']} × `create_sandbox` + one call) | {i['seconds']:.0f} s | "
                    f"{m['idle_seconds']:.1f} s | {i['seconds'] / m['idle_seconds']:.0f}× | "
                    f"{ms(i['seconds'] / i['made']):.1f} ms a sandbox; Monty: checkout, the call, `dump()` |")
        row(f"4. {i['checked']} random older sandboxes: resume → `len(data) == 102400`: p50", ms(p50(i["resumed"])),
            note=f"max {ms(max(i['resumed'])):.2f} ms; all {i['checked']} gave 102400")
    return "\n".join(["| measure | ours | Monty 1.4 | ours / Monty | notes |", "|---|---|---|---|---|", *rows])


async def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    parser.add_argument("--cache-dir", help="the servers' cache (default: a temporary one)")
    parser.add_argument("--calls", type=int, default=100, help="timed calls per round of measure 1")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of measure 1, each without and with --state-dir")
    parser.add_argument("--resumes", type=int, default=40)
    parser.add_argument("--forks", type=int, default=40)
    parser.add_argument("--idle-sandboxes", type=int, default=10000)
    parser.add_argument("--idle-budget", type=float, default=1500, help="seconds for making the idle sandboxes")
    parser.add_argument("--measures", default="1,2,3,4", help="which measures to run (comma-separated)")
    parser.add_argument("--shared-zygote", action="store_true",
                        help="fork from a per-host zygote service (the default of the server) rather than a zygote "
                             "of each server's own")
    args = parser.parse_args()
    if not args.shared_zygote:
        COMMON.append("--no-shared-zygote")
    os.environ["RUST_LOG"] = RUST_LOG  # one debug line per checkpoint
    measures = set(args.measures.split(","))
    args.idle_monty = args.idle_sandboxes if "4" in measures else 0
    binary = str(pathlib.Path(args.binary).resolve())
    scratch = tempfile.mkdtemp(prefix="mrp-checkpoints-")
    os.chmod(scratch, 0o700)
    runtime = os.path.join(scratch, "runtime")
    os.mkdir(runtime, 0o700)
    cache = args.cache_dir or os.path.join(scratch, "cache")
    os.environ["XDG_RUNTIME_DIR"] = runtime  # the servers start this bench's own service
    started = time.perf_counter()
    try:
        m = monty(args.calls * args.rounds, args.resumes, args.idle_monty)
        print(f"checkpoints: Monty done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        c = r = f = i = None
        if "1" in measures:
            c = await checkpoints(binary, cache, args.calls, args.rounds)
            print(f"checkpoints: 1 done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        if "2" in measures:
            r = await resumes(binary, cache, args.resumes)
            print(f"checkpoints: 2 done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        if "3" in measures:
            f = await forks(binary, cache, args.forks)
            done = "skipped: this binary's tools/list has no fork_sandbox" if f is None else "done"
            print(f"checkpoints: 3 {done} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        if "4" in measures:
            i = await idle_sandboxes(binary, cache, args.idle_sandboxes, args.idle_budget)
            print(f"checkpoints: 4 done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    finally:
        stopped = zygote(binary, "stop", cache)
        if zygote(binary, "status", cache).returncode != 1:
            print(f"checkpoints: a zygote service may still run: {stopped.stdout}{stopped.stderr}", file=sys.stderr)
        shutil.rmtree(scratch, ignore_errors=True)
    print(report(args, measures, c, r, f, i, m))


if __name__ == "__main__":
    asyncio.run(main())

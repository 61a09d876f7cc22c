"""Benchmark (the zygote, docs/architecture.md §3): what a new interpreter costs, in one run, as ratios to Node + Pyodide
restoring Pyodide's own memory snapshot (the fastest way Node starts Pyodide).

- cold start (process start -> first `print(1)` result): Node plain and from its snapshot; ours
  plain, and from our snapshot;
- a fresh interpreter per call (`--isolation call`), request -> result: restored from the
  snapshot (`--no-zygote`), forked from the zygote with no spare ready (`--spares 0`), and
  taken from a spare forked ahead (the default);
- warm calls, p50 and p99: stdio, and streamable HTTP with one client (through a bare
  HTTP/1.1 connection, and through httpx, which adds its own ~2.5 ms per request);
- throughput of a trivial call with 8 HTTP sessions: `--isolation session|call|shared`, 1 and 2
  workers;
- memory: 300 live HTTP sessions, each after one call: proportional set size (PSS) per
  session, and of the whole server.

    .venv/bin/python bench/interpreters.py [--binary target/release/mcp-run-python] [--quick]
"""

import argparse
import asyncio
import json
import pathlib
import shutil
import socket
import statistics
import subprocess
import tempfile
import time

import httpx

from throughput import CALL, INIT, percentile, settle

ROOT = pathlib.Path(__file__).resolve().parents[1]

# The line the server logs once its zygote forks interpreters.
ZYGOTE_READY = "the zygote is ready"
# How long a zygote may take to become ready (seconds): boot, warm-up, ~10 s for its engine
# threads to end.
ZYGOTE_WAIT = 120
# Calls after which an interpreter booted from the snapshot has compiled its per-call code in the
# engine's optimizing WebAssembly tier (a function entered once per call tiers up after ~3,300).
STEADY_AFTER = 5000
# Calls each session of a throughput run makes before the timed ones (the same for every
# isolation mode, so that each is timed warm).
THROUGHPUT_WARM_UP = 50


async def wait_for_log(path, line, timeout):
    """Waits until the server's log at `path` holds `line` (checked every 0.1 s)."""
    for _ in range(int(timeout * 10)):
        if line in pathlib.Path(path).read_text():
            return
        await asyncio.sleep(0.1)
    raise SystemExit(f"the server never logged {line!r}")


def node_run(mode=None, snapshot=None):
    """One run of Node + Pyodide (node_baseline.js): its JSON report, with `cold_ms` (start ->
    first print(1) result), `warm_median_ms` and `pss_kib` (its memory after the runs)."""
    args = [shutil.which("node") or "node", str(ROOT / "bench" / "node_baseline.js"), str(ROOT / "pyodide-assets"),
            str(int(time.time() * 1000))]
    if mode:
        args += [mode, snapshot]
    out = subprocess.run(args, capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def node(mode=None, snapshot=None):
    """Node + Pyodide: start -> first print(1) result (ms), and runPython's warm median (ms)."""
    data = node_run(mode, snapshot)
    return data["cold_ms"], data["warm_median_ms"]


class Stdio:
    """Raw JSON-RPC over the server's pipes; stderr goes to a file that `wait_for` reads."""

    @classmethod
    async def start(cls, binary, cache, *args):
        self = cls()
        self.t0 = time.perf_counter()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log")
        self.proc = await asyncio.create_subprocess_exec(
            binary, "stdio", "--cache-dir", cache, *args,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, limit=1 << 24)
        self.next_id = 0
        await self.request("initialize", INIT)
        self.proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        return self

    async def request(self, method, params):
        self.next_id += 1
        msg = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write((json.dumps(msg) + "\n").encode())
        await self.proc.stdin.drain()
        while True:
            reply = json.loads(await self.proc.stdout.readline())
            if reply.get("id") == self.next_id:
                return reply

    async def call(self, code="1 + 1"):
        t = time.perf_counter()
        reply = await self.request("tools/call", {"name": "run_python_code", "arguments": {"python_code": code}})
        text = reply["result"]["content"][0]["text"]
        assert "<status>success</status>" in text, text
        return time.perf_counter() - t

    async def wait_for(self, line, timeout=ZYGOTE_WAIT):
        await wait_for_log(self.log.name, line, timeout)

    async def close(self):
        self.proc.stdin.close()
        await self.proc.wait()


async def cold(binary, cache, *args):
    """Ours: process start -> first print(1) result (ms)."""
    s = await Stdio.start(binary, cache, *args)
    await s.call("print(1)")
    ms = (time.perf_counter() - s.t0) * 1000
    await s.close()
    return ms


async def fresh(binary, cache, calls, *args, zygote=True):
    """Latencies (s) of trivial calls over stdio with `--isolation call` and `args`."""
    s = await Stdio.start(binary, cache, "--isolation", "call", *args)
    await s.call()
    if zygote:
        await s.wait_for(ZYGOTE_READY)
    await settle(s.proc.pid)
    times = []
    for _ in range(calls):
        times.append(await s.call())
        # Lets a spare be forked again between calls, as between the calls of real clients.
        await asyncio.sleep(0.02)
    await s.close()
    return times


async def warm_stdio(binary, cache, calls, steady_after=STEADY_AFTER):
    """Latencies (s) of `calls` warm calls over stdio: from the 4th call of the session's
    interpreter (restored from the snapshot: stdio has no zygote), and again after
    `steady_after` more, once the engine has compiled the per-call code in its optimizing
    tier."""
    s = await Stdio.start(binary, cache)
    for _ in range(3):
        await s.call()
    await settle(s.proc.pid)
    early = [await s.call() for _ in range(calls)]
    for _ in range(steady_after):
        await s.call()
    await settle(s.proc.pid)
    steady = [await s.call() for _ in range(calls)]
    await s.close()
    return early, steady


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Connection:
    """One keep-alive HTTP/1.1 connection, requests written and responses read here: httpx
    spends about 2.5 ms of client time per request on the 2-core machine (a 404 takes 2.6 ms
    through it and 0.12 ms through curl), which would hide the server's own latency."""

    @classmethod
    async def open(cls, port):
        self = cls()
        self.port = port
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 24)
        return self

    async def post(self, path, message, headers):
        """(status, body text) of a POST of `message` as JSON; the body is read whole (a JSON
        body, or an event stream until the server ends it)."""
        body = json.dumps(message).encode()
        head = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", f"Content-Length: {len(body)}",
                *(f"{k}: {v}" for k, v in headers.items())]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        status = int((await self.reader.readline()).split()[1])
        fields = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            fields[name.strip().lower()] = value.strip()
        if fields.get("transfer-encoding") == "chunked":
            chunks = []
            while size := int((await self.reader.readline()).split(b";")[0], 16):
                chunks.append((await self.reader.readexactly(size + 2))[:-2])
            await self.reader.readexactly(2)
            data = b"".join(chunks)
        else:
            data = await self.reader.readexactly(int(fields.get("content-length", 0)))
        return status, data.decode()

    def close(self):
        self.writer.close()


class Http:
    """A streamable-HTTP server and raw JSON-RPC sessions on it."""

    HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

    def __init__(self, binary, cache, *args):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log")
        self.proc = subprocess.Popen([binary, "streamable-http", "--port", str(self.port), "--cache-dir", cache, *args],
                                     stderr=self.log)
        self.base = f"http://127.0.0.1:{self.port}/mcp"
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("the server did not start")

    async def session(self, http):
        r = await http.post(self.base, json={"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT},
                            headers=self.HEADERS)
        h = {**self.HEADERS, "Mcp-Session-Id": r.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-06-18"}
        await http.post(self.base, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h)
        return h

    async def call(self, http, h, code="1 + 1"):
        t = time.perf_counter()
        r = await http.post(self.base, json={"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                             "params": {**CALL, "arguments": {"python_code": code}}}, headers=h)
        assert "<status>success</status>" in r.text, r.text
        return time.perf_counter() - t

    async def raw_call(self, conn, h, code="1 + 1"):
        """`call` through a bare [`Connection`]."""
        t = time.perf_counter()
        status, text = await conn.post("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                                "params": {**CALL, "arguments": {"python_code": code}}}, h)
        assert status == 200 and "<status>success</status>" in text, text
        return time.perf_counter() - t

    async def wait_for(self, line, timeout=ZYGOTE_WAIT):
        await wait_for_log(self.log.name, line, timeout)

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


async def warm_http(binary, cache, calls):
    """Latencies (s) of warm calls of one session: through a bare connection, and through httpx.
    The session opens once the zygote is ready, as a session does but in a server's first
    seconds: its interpreter is forked, with the zygote's compiled code."""
    server = Http(binary, cache)
    async with httpx.AsyncClient(timeout=300) as http:
        await server.call(http, await server.session(http))
        await server.wait_for(ZYGOTE_READY)
        h = await server.session(http)
        for _ in range(3):
            await server.call(http, h)
        await settle(server.proc.pid)
        conn = await Connection.open(server.port)
        bare = [await server.raw_call(conn, h) for _ in range(calls)]
        conn.close()
        through_httpx = [await server.call(http, h) for _ in range(calls)]
    server.close()
    return bare, through_httpx


async def throughput(binary, cache, isolation, workers, calls, clients=8):
    """Trivial calls per second with `clients` HTTP sessions, each on its own bare connection."""
    server = Http(binary, cache, "--isolation", isolation, "--workers", str(workers))
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as http:
        # Sessions open once the zygote is ready, so that every interpreter is forked (one
        # booted before then compiles its code anew for thousands of calls; a shared one gives
        # way to a fork at its next call).
        await server.call(http, await server.session(http))
        await server.wait_for(ZYGOTE_READY)
        sessions = [await server.session(http) for _ in range(clients)]
        connections = [await Connection.open(server.port) for _ in sessions]
        for conn, h in zip(connections, sessions):
            for _ in range(THROUGHPUT_WARM_UP):
                await server.raw_call(conn, h)
        await settle(server.proc.pid)


        async def client(conn, h):
            for _ in range(calls // clients):
                await server.raw_call(conn, h)

        start = time.perf_counter()
        await asyncio.gather(*(client(c, h) for c, h in zip(connections, sessions)))
        elapsed = time.perf_counter() - start
        for conn in connections:
            conn.close()
    server.close()
    return calls // clients * clients / elapsed


def pss_kib(pid):
    """Proportional set size of `pid` (KiB), from /proc/PID/smaps_rollup."""
    for line in pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def zygote_services():
    """Every zygote service process on the host (`zygote-service` in its command line): a
    front's workers are forked by the host's service, not by the front (README, "The zygote
    service")."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"zygote-service" in (entry / "cmdline").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def server_processes(pid):
    """A server and every process that works for it: its descendants, and each zygote service
    with its descendants (its zygote, and the workers it forked: on a machine where only the
    measured server runs, they are all the server's)."""
    pids = [pid, *descendants(pid)]
    for service in zygote_services():
        pids += [service, *descendants(service)]
    return list(dict.fromkeys(pids))


def descendants(pid):
    kids = []
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        for kid in (task / "children").read_text().split():
            kids.append(int(kid))
            kids.extend(descendants(int(kid)))
    return kids


async def memory(binary, cache, sessions):
    """PSS (MiB) per live session and of the whole server, with `sessions` sessions open."""
    server = Http(binary, cache, "--max-sessions", str(sessions + 10))
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as http:
        first = await server.session(http)
        await server.call(http, first)
        await server.wait_for(ZYGOTE_READY)
        open_ = [first]
        for _ in range(sessions - 1):
            h = await server.session(http)
            await server.call(http, h)
            open_.append(h)
        await settle(server.proc.pid)
        pids = server_processes(server.proc.pid)
        total = sum(pss_kib(p) for p in pids) / 1024
        # Every session is still alive: one more call on each of the first ones.
        for h in open_[:5]:
            await server.call(http, h)
    server.close()
    # The server's processes: the front, the zygote, one interpreter per session, spares.
    return total / sessions, total, len(pids)


def ms(seconds):
    return seconds * 1000


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    ap.add_argument("--quick", action="store_true", help="fewer runs and calls (a smoke test)")
    args = ap.parse_args()
    runs, calls, sessions = (1, 20, 20) if args.quick else (3, 100, 300)
    cache = tempfile.mkdtemp()
    snap = pathlib.Path(cache) / "node-snapshot.bin"

    node_plain = statistics.median(node()[0] for _ in range(runs))
    node(mode="--make", snapshot=str(snap))
    node_snap_runs = [node("--load", str(snap)) for _ in range(runs)]
    base = statistics.median(r[0] for r in node_snap_runs)
    node_warm = statistics.median(r[1] for r in node_snap_runs)
    plain = statistics.median([await cold(args.binary, cache, "--no-snapshot") for _ in range(runs)])
    await cold(args.binary, cache)  # makes our snapshot
    restored = statistics.median([await cold(args.binary, cache) for _ in range(runs)])

    restore_call = await fresh(args.binary, cache, max(5, calls // 10), "--no-zygote", "--spares", "0", zygote=False)
    forked = await fresh(args.binary, cache, calls, "--spares", "0")
    spare = await fresh(args.binary, cache, calls)
    stdio, stdio_steady = await warm_stdio(args.binary, cache, calls * 10)
    http, http_httpx = await warm_http(args.binary, cache, calls * 10)

    def row(label, value, unit="ms"):
        print(f"{label:<64}{value:>10.2f} {unit:<6}{value / base:>8.3f}")

    print(f"{'measure':<64}{'value':>10} {'':<6}{'/ Node+snapshot start':>8}")
    row("Node + Pyodide, plain boot: start -> print(1)", node_plain)
    row("Node + Pyodide snapshot (_loadSnapshot): start -> print(1)", base)
    row("ours, plain boot (--no-snapshot): start -> print(1)", plain)
    row("ours, from our snapshot: start -> print(1)", restored)
    row("fresh interpreter per call, restored (--no-zygote): p50", ms(statistics.median(restore_call)))
    row("fresh interpreter per call, forked, no spare: p50", ms(statistics.median(forked)))
    row("fresh interpreter per call, forked, no spare: p99", ms(percentile(forked, 99)))
    row("fresh interpreter per call, from a forked spare: p50", ms(statistics.median(spare)))
    row("warm call, stdio, calls 4 on: p50", ms(statistics.median(stdio)))
    row("warm call, stdio, calls 4 on: p99", ms(percentile(stdio, 99)))
    row(f"warm call, stdio, after {STEADY_AFTER} more: p50", ms(statistics.median(stdio_steady)))
    row(f"warm call, stdio, after {STEADY_AFTER} more: p99", ms(percentile(stdio_steady, 99)))
    row("warm call, streamable HTTP, 1 client: p50", ms(statistics.median(http)))
    row("warm call, streamable HTTP, 1 client: p99", ms(percentile(http, 99)))
    row("warm call, streamable HTTP, 1 client through httpx: p50", ms(statistics.median(http_httpx)))
    row("Node runPython('print(1)'), warm median", node_warm)

    print("\nthroughput, trivial call, 8 HTTP sessions (calls/s):")
    rates = {}
    for workers in (1, 2):
        for isolation in ("session", "call", "shared"):
            rates[isolation, workers] = await throughput(args.binary, cache, isolation, workers, calls * 20)
            print(f"  --isolation {isolation:<8} --workers {workers}: {rates[isolation, workers]:8.1f}")
    print(f"  call / shared with 2 workers: {rates['call', 2] / rates['shared', 2]:.2f}")

    per, total, procs = await memory(args.binary, cache, sessions)
    print(f"\nmemory: {sessions} live HTTP sessions after one call each: {per:.1f} MiB PSS per session, "
          f"{total:.0f} MiB PSS for the whole server ({procs} processes)")


if __name__ == "__main__":
    asyncio.run(main())

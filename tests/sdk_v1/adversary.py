"""Helpers for the adversarial and chaos suites: servers whose stderr is captured, raw JSON-RPC
over stdio and HTTP, bounded calls, process inspection (peak RSS, idle children, SIGSTOP), and
the attack snippets that more than one test uses."""

import contextlib
import datetime
import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time

import anyio
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamablehttp_client

from conftest import BINARY, SHARED_CACHE, child_pids, server_env

ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
PROTOCOL = "2025-06-18"
INIT_PARAMS = {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "adversary", "version": "1"}}
TWO = "<status>success</status>\n<return_value>\n2\n</return_value>"


# --------------------------------------------------------------------------------------------
# Results


def status_of(text):
    """The `<status>` of an XML result."""
    assert text.startswith("<status>"), text[:300]
    return text.split("<status>", 1)[1].split("</status>", 1)[0]


def section(text, name):
    """The body of section `name` of an XML result, or None."""
    start = f"<{name}>\n"
    if start not in text:
        return None
    return text.split(start, 1)[1].rsplit(f"\n</{name}>", 1)[0]


def return_value(text):
    return section(text, "return_value")


async def call(session, code, limit=60, **global_variables):
    """run_python_code on `session`; fails the test if no answer comes within `limit` seconds.
    Returns the one text content."""
    arguments = {"python_code": code}
    if global_variables:
        arguments["global_variables"] = global_variables
    with anyio.fail_after(limit):
        result = await session.call_tool(
            "run_python_code", arguments, read_timeout_seconds=datetime.timedelta(seconds=limit + 5)
        )
    assert not result.isError, result
    assert len(result.content) == 1, result
    return result.content[0].text


async def answered_within(session, code, limit):
    """Like `call`, but returns (text, seconds it took)."""
    started = time.monotonic()
    text = await call(session, code, limit=limit)
    return text, time.monotonic() - started


# --------------------------------------------------------------------------------------------
# Processes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vm_hwm(pid):
    """Peak resident memory (bytes) of `pid`, from VmHWM in /proc/PID/status."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def reset_peak_rss(pid):
    """Resets VmHWM of `pid` to its current RSS (Linux: `5` into /proc/PID/clear_refs), so that
    a later vm_hwm() is the peak since now. Returns the current RSS."""
    with open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")
    return vm_hwm(pid)


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def wait_idle_children(pid, at_least=1, timeout=120, quiet=1.0):
    """Waits until `pid` has at least `at_least` live children and none of them used CPU for
    `quiet` seconds (booted workers block on their stdin). Returns their pids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = child_pids(pid)
        if len(kids) >= at_least:
            try:
                before = {k: cpu_ticks(k) for k in kids}
                time.sleep(quiet)
                after = {k: cpu_ticks(k) for k in kids}
            except OSError:
                continue
            if before == after and set(child_pids(pid)) == set(kids):
                return kids
        else:
            time.sleep(0.2)
    raise AssertionError(f"children of {pid} never became idle: {child_pids(pid)}")


async def wait_until(predicate, timeout, step=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await anyio.sleep(step)
    return predicate()


class Stopped:
    """Processes this test SIGSTOPped; on exit they are killed (by pid), so that nothing stays
    stopped when the test ends."""

    def __init__(self):
        self.pids = []

    def stop(self, pids):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
                self.pids.append(pid)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def stdio_server_pid():
    """The pid of the `mcp-run-python stdio` process this test process started last."""
    mine = []
    for pid in child_pids(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if argv[0] == BINARY.encode() and b"stdio" in argv:
            mine.append(pid)
    assert mine, "no stdio server found among this process's children"
    return max(mine)


class HttpServer(str):
    """Base URL of a running HTTP-mode server; `.pid`, `.proc`, `.stderr_path`."""

    pid: int
    proc: subprocess.Popen
    stderr_path: str

    def stderr_text(self):
        with open(self.stderr_path, "rb") as f:
            return f.read().decode("utf-8", "replace")


@contextlib.contextmanager
def http_server(mode, *args, stderr_path, start_timeout=60):
    """`mcp-run-python <mode> <args>` on a free local port with its stderr in `stderr_path`;
    yields its base URL (an HttpServer). On exit it gets SIGTERM, then SIGKILL; exit status is
    not checked (other suites check clean shutdown)."""
    port = free_port()
    err = open(stderr_path, "wb")
    proc = subprocess.Popen(
        [BINARY, mode, "--port", str(port), "--cache-dir", SHARED_CACHE, *args],
        env=server_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
    )
    deadline = time.monotonic() + start_timeout
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None:
                    err.flush()
                    with open(stderr_path, "rb") as f:
                        raise AssertionError(
                            f"{mode} {' '.join(args)}: the server exited with {proc.returncode}: "
                            + f.read().decode("utf-8", "replace")[-2000:]
                        )
                if time.monotonic() > deadline:
                    raise AssertionError(f"{mode} server did not start")
                time.sleep(0.1)
        url = HttpServer(f"http://127.0.0.1:{port}")
        url.pid = proc.pid
        url.proc = proc
        url.stderr_path = str(stderr_path)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        err.close()


@contextlib.asynccontextmanager
async def http_session(base):
    """An initialized streamable-HTTP MCP session at `base`/mcp."""
    async with streamablehttp_client(f"{base}/mcp", sse_read_timeout=600) as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


@contextlib.asynccontextmanager
async def sse_session(base):
    """An initialized legacy-SSE MCP session at `base`/sse."""
    async with sse_client(f"{base}/sse", sse_read_timeout=600) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


# --------------------------------------------------------------------------------------------
# Raw JSON-RPC


class RawStdio:
    """`mcp-run-python stdio` driven with raw JSON-RPC lines (bytes in, parsed messages out)."""

    def __init__(self, *args, stderr_path):
        self.err = open(stderr_path, "wb")
        self.proc = subprocess.Popen(
            [BINARY, "stdio", "--cache-dir", SHARED_CACHE, *args],
            env=server_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err,
        )
        self.messages = queue.Queue()
        self.seen = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.messages.put(json.loads(line))
            except ValueError:
                self.messages.put({"unparsable": line.decode("utf-8", "replace")})
        self.messages.put(None)

    def send_bytes(self, data):
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def send(self, message):
        self.send_bytes(json.dumps(message).encode() + b"\n")

    def next(self, timeout):
        """The next message (None at EOF); raises queue.Empty after `timeout` seconds."""
        message = self.messages.get(timeout=timeout)
        if message is not None:
            self.seen.append(message)
        return message

    def wait_for(self, predicate, timeout):
        """The first message received so far, or read until then, that matches (fails at EOF
        or after `timeout`)."""
        for message in self.seen:
            if predicate(message):
                return message
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no matching message within {timeout} s; saw {self.seen[-5:]}")
            try:
                message = self.next(left)
            except queue.Empty:
                continue
            if message is None:
                raise AssertionError(f"the server closed stdout (exit {self.proc.poll()}); saw {self.seen[-5:]}")
            if predicate(message):
                return message

    def response(self, id_, timeout):
        return self.wait_for(lambda m: m.get("id") == id_ and ("result" in m or "error" in m), timeout)

    def initialize(self):
        self.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": INIT_PARAMS})
        assert "result" in self.response(0, 60)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def call(self, id_, code):
        self.send(call_message(id_, code))

    def close(self):
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def call_message(id_, code):
    return {"jsonrpc": "2.0", "id": id_, "method": "tools/call",
            "params": {"name": "run_python_code", "arguments": {"python_code": code}}}


def rpc_message(response):
    """The JSON-RPC message of a JSON or SSE HTTP response."""
    if response.headers.get("content-type", "").startswith("application/json"):
        return response.json()
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            return json.loads(line[6:])
    raise AssertionError(response.text)


async def raw_initialize(client, base):
    """POST initialize without a session id; returns the response (and sends `initialized` when
    a session was granted)."""
    r = await client.post(f"{base}/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT_PARAMS}, headers=ACCEPT)
    sid = r.headers.get("mcp-session-id")
    if r.status_code == 200 and sid:
        await client.post(
            f"{base}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"},
            headers={**ACCEPT, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": PROTOCOL},
        )
    return r


# --------------------------------------------------------------------------------------------
# Attack snippets


def forge_code(tag):
    """The old answer-forging attack: a second `__mcp.run` whose answer the front would take
    for the next call's answer; it returns `FORGED-<tag>` itself."""
    return (
        "import js, asyncio\n"
        "js.__mcp.run(\"'decoy'\", '{}', 1000)\n"
        "await asyncio.sleep(0.3)\n"
        f"'FORGED-{tag}'"
    )


def tagged_code(tag):
    return f"print({tag!r})\n{tag!r}"


def tagged_result(tag):
    return f"<status>success</status>\n<output>\n{tag}\n</output>\n<return_value>\n{tag}\n</return_value>"


# Finds the runner's functions however it is reachable (today `sys.modules['_mcp_runner']`; once
# sealed, only through the garbage collector) and replaces them, and their module globals, with
# `replacement`. Returns how many places were poisoned.
POISON_RUNNER = """
import gc, sys, types

def _runner_function(o, name):
    if not isinstance(o, types.FunctionType) or o.__name__ != name:
        return False
    g = o.__globals__
    return (o.__module__ == '_mcp_runner' or g.get('__name__') == '_mcp_runner'
            or o.__code__.co_filename.endswith('_mcp_runner.py'))

def poison(name, replacement):
    hits = 0
    for o in gc.get_objects():
        if _runner_function(o, name):
            g = o.__globals__
            for key, value in list(g.items()):
                if value is o:
                    g[key] = replacement
                    hits += 1
            o.__code__ = replacement.__code__
            hits += 1
    module = sys.modules.get('_mcp_runner')
    if module is not None and hasattr(module, name):
        setattr(module, name, replacement)
        hits += 1
    return hits
"""

HANG = "def _hang(*args, **kwargs):\n    while True:\n        pass\n"

POISONED_SCANNER = POISON_RUNNER + HANG + "poison('find_imports', _hang)"

# An audit hook that loops forever on the first `compile` of source text that carries the
# trigger word (the next call's code: whoever scans or compiles it hangs).
TRIGGER = "TRIGGER" + "-THE-TRAP"
AUDIT_HOOK_TRAP = f"""
import sys
_WORD = 'TRIGGER' + '-THE-TRAP'
def _hook(event, args):
    if event == 'compile' and args:
        source = args[0]
        if isinstance(source, bytes):
            source = source.decode('utf-8', 'replace')
        if isinstance(source, str) and _WORD in source:
            while True:
                pass
sys.addaudithook(_hook)
'hook planted'
"""

# A finalizer on an object in a reference cycle that loops forever once it is collected more
# than half a second after it was planted (i.e. in any later call on the same interpreter);
# collected earlier, it plants a new cycle, and a new one is planted at the start of every
# collection, so one is always waiting for the collector.
GC_FINALIZER_TRAP = """
import gc, time
_ARMED_AT = time.monotonic() + 0.5

class _Trap:
    def __del__(self):
        if time.monotonic() > _ARMED_AT:
            while True:
                pass
        _plant()

def _plant(phase='start', info=None):
    if phase == 'start':
        a = _Trap()
        a.me = a

gc.callbacks.append(_plant)
_plant()
'trap planted'
"""

# Innocent code that makes the collector work hard (it finds any pending finalizer).
ALLOCATE = "x = [[] for _ in range(200_000)]\nlen(x)"

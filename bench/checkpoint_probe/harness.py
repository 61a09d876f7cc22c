"""Throw-away harness for the checkpoint measurements (docs/checkpoint-research.md): a
`streamable-http --stateful --no-shared-zygote` server, sessionless tool calls, and the host's
view of a worker (its WebAssembly memory read through /proc/PID/mem, which needs root: workers
are not dumpable)."""

import hashlib
import json
import os
import pathlib
import re
import socket
import subprocess
import tempfile
import time

import httpx

BINARY = os.environ.get("MCP_BINARY", "/work/main/target/debug/mcp-run-python")
CACHE = os.environ.get("MCP_CACHE", os.path.expanduser("~/.cache/mcp-run-python"))
META = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "probe", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json",
           "MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call"}
PAGE = 4096


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.proc = subprocess.Popen([BINARY, "streamable-http", "--port", str(self.port), "--cache-dir", CACHE,
                                      "--stateful", "--no-shared-zygote", *args], stderr=self.log)
        self.base = f"http://127.0.0.1:{self.port}/mcp"
        self.http = httpx.Client(timeout=300)
        self.n = 0
        for _ in range(600):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)

    def wait_zygote(self, timeout=180):
        end = time.time() + timeout
        while time.time() < end:
            if "the zygote is ready" in pathlib.Path(self.log.name).read_text():
                return
            time.sleep(0.2)
        raise SystemExit("no zygote")

    def tool(self, name, arguments):
        self.n += 1
        h = dict(HEADERS, **{"Mcp-Name": name})
        if "sandbox_id" in arguments:
            h["Mcp-Param-Sandbox-Id"] = arguments["sandbox_id"]
        msg = {"jsonrpc": "2.0", "id": self.n, "method": "tools/call",
               "params": {"name": name, "arguments": arguments, "_meta": META}}
        r = self.http.post(self.base, json=msg, headers=h)
        for line in r.text.splitlines():
            if line.startswith("data: {"):
                return json.loads(line.removeprefix("data: "))["result"]
        return json.loads(r.text)["result"]

    def create(self):
        return self.tool("create_sandbox", {})["structuredContent"]["sandbox_id"]

    def run(self, sandbox, code):
        t = time.perf_counter()
        r = self.tool("run_python_code", {"python_code": code, "sandbox_id": sandbox})
        return r, time.perf_counter() - t

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)


def children(pid):
    out = []
    for p in pathlib.Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                st = (p / "stat").read_text()
            except OSError:
                continue
            ppid = int(st[st.rindex(")") + 2:].split()[1])
            if ppid == pid:
                out.append(int(p.name))
    return out


def descendants(pid):
    out = []
    for c in children(pid):
        out.append(c)
        out.extend(descendants(c))
    return out


def cmdline(pid):
    return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")


def wasm_regions(pid):
    """Mappings of at least 4 GiB: JSC's WebAssembly fast-memory reservations."""
    out = []
    for line in pathlib.Path(f"/proc/{pid}/maps").read_text().splitlines():
        a, b = (int(x, 16) for x in line.split()[0].split("-"))
        if b - a >= 4 << 30:
            out.append((a, b, line))
    return out


def read_mem(pid, addr, n):
    with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
        f.seek(addr)
        return f.read(n)


def write_mem(pid, addr, data):
    with open(f"/proc/{pid}/mem", "r+b", buffering=0) as f:
        f.seek(addr)
        return f.write(data)


def page_hashes(data):
    return [hashlib.blake2b(data[i:i + PAGE], digest_size=8).digest() for i in range(0, len(data), PAGE)]


def diff_pages(a, b):
    """Pages (indexes) that differ between two hash lists; pages beyond the shorter count."""
    n = min(len(a), len(b))
    d = [i for i in range(n) if a[i] != b[i]]
    return d + list(range(n, max(len(a), len(b))))

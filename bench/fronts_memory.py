"""Benchmark: the memory of N concurrent stdio fronts (`mcp-run-python stdio`, the process an MCP
client such as PydanticAI's `MCPServerStdio` starts per agent run), each after one call
(`run_python_code` of `1 + 1`, over raw JSON-RPC on its pipes: `initialize`,
`notifications/initialized`, `tools/call`), as proportional set size (PSS, from
/proc/PID/smaps_rollup) summed over every process they need, in two configurations in one run:

(a) the per-host zygote service warm: the N fronts, their workers (forks of the service's
    zygote, its children), the service process and its zygote;
(b) `--no-shared-zygote`: the N fronts and their workers (each front restores its own
    interpreter from the memory snapshot in the cache: its children, `__worker` in argv);

against Monty (PyPI `pydantic-monty`) in the same run: N worker pools (`pydantic_monty.Monty()`),
each with one session checked out after one `feed_run('1 + 1')`: the pools' `monty subprocess`
workers plus what the pools add to this process's own PSS (measured before and after). Results
are totals, per-front shares and ratios ((a)/(b), and each to Monty); nothing is asserted.

The bench gives the fronts a fresh XDG_RUNTIME_DIR (0700) and a `--cache-dir` of its own, both
temporary, so that it starts and owns its own service: one untimed front makes the memory
snapshot and starts the service, then `mcp-run-python zygote status` is polled until it says
`ready` (up to 120 s). (a) runs first; its fronts are closed and the service stopped
(`zygote stop`) before (b), so that no process of (a) shares pages with (b)'s. Every front is
killed and the service stopped at the end, whatever happens.

It runs in `.venv-bench` (made or remade by the bootstrap below with bench/startup_table.py's
pins, then this script runs again in it):

    cargo build --release
    python3 bench/fronts_memory.py [--binary target/release/mcp-run-python] [--fronts 10]

It prints a Markdown table and one line of JSON; the fronts' logs stay in the temporary directory
and the tail of one is printed if a front fails.
"""

import argparse
import asyncio
import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from startup_table import REQUIREMENTS, VENV  # noqa: E402 (stdlib-only at import)

INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}
# How long the service may take to become ready after its first use (seconds).
SERVICE_WAIT = 120
# How long a front may take to start and answer its first call (seconds): ten fronts restoring
# their interpreters at once share two cores in (b).
CALL_WAIT = 300
# Memory is read once the processes stop using CPU (spares forked, engine threads ended): every
# SETTLE_INTERVAL seconds until the tree used less than IDLE_CPU seconds of CPU in one, at most
# SETTLE_LIMIT seconds.
SETTLE_INTERVAL, IDLE_CPU, SETTLE_LIMIT = 1.0, 0.05, 60
MIB = 1024


def ensure_venv():
    """Runs this script again in `.venv-bench`, made (or remade when REQUIREMENTS change) first
    (the bootstrap of bench/startup_table.py, which re-executes its own file)."""
    if pathlib.Path(sys.prefix).resolve() == VENV.resolve():
        return
    python, stamp = VENV / "bin" / "python", VENV / ".requirements"
    wanted = "\n".join(REQUIREMENTS) + "\n"
    if not python.exists() or not stamp.exists() or stamp.read_text() != wanted:
        print(f"fronts_memory: installing {' '.join(REQUIREMENTS)} into {VENV.name}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *REQUIREMENTS],
                       check=True)
        stamp.write_text(wanted)
    os.execv(str(python), [str(python), str(pathlib.Path(__file__).resolve()), *sys.argv[1:]])


# --- processes -------------------------------------------------------------------------------

def pss_kib(pid):
    """Proportional set size of `pid` (KiB), from /proc/PID/smaps_rollup; 0 once it is gone."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def pss_parts_kib(pid):
    """Pss_Anon, Pss_File and Pss_Shmem of `pid` (KiB)."""
    parts = {"anon": 0, "file": 0, "shmem": 0}
    try:
        for line in pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key = line.split(":")[0].removeprefix("Pss_").lower()
            if line.startswith("Pss_") and key in parts:
                parts[key] = int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return parts


def children(pid):
    kids = []
    try:
        for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
            kids.extend(int(k) for k in (task / "children").read_text().split())
    except (FileNotFoundError, ProcessLookupError):
        pass
    return kids


def descendants(pid):
    out = []
    for kid in children(pid):
        out.append(kid)
        out.extend(descendants(kid))
    return out


def argv(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError):
        return []


def cpu_seconds(pids):
    total = 0
    for pid in pids:
        try:
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


async def settle(pids_of):
    """Waits until the processes `pids_of()` names stop using CPU."""
    before = cpu_seconds(pids_of())
    deadline = time.monotonic() + SETTLE_LIMIT
    while time.monotonic() < deadline:
        await asyncio.sleep(SETTLE_INTERVAL)
        now = cpu_seconds(pids_of())
        if now - before < IDLE_CPU:
            return
        before = now


def mib(pids):
    return sum(pss_kib(p) for p in pids) / MIB


def parts_mib(pids):
    """Anonymous, file-backed and shared-memory PSS of `pids` (MiB), for the JSON line."""
    total = {"anon": 0, "file": 0, "shmem": 0}
    for pid in pids:
        for key, kib in pss_parts_kib(pid).items():
            total[key] += kib
    return {key: round(kib / MIB, 1) for key, kib in total.items()}


# --- fronts ----------------------------------------------------------------------------------

class Front:
    """One `mcp-run-python stdio` spoken to over raw JSON-RPC; stderr goes to `log`."""

    @classmethod
    async def start(cls, binary, args, env, log):
        self = cls()
        self.log = log
        self.proc = await asyncio.create_subprocess_exec(
            binary, "stdio", *args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "w"),
            env=env, limit=1 << 24)
        self.next_id = 0
        return self

    async def request(self, method, params):
        self.next_id += 1
        message = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        await self.proc.stdin.drain()
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                tail = pathlib.Path(self.log).read_text()[-2000:]
                raise SystemExit(f"a front ended before answering {method}; its log ends:\n{tail}")
            reply = json.loads(line)
            if reply.get("id") == self.next_id:
                return reply

    async def one_call(self):
        """`initialize`, `notifications/initialized`, then `1 + 1`."""
        await self.request("initialize", INIT)
        self.proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        reply = await self.request("tools/call", {"name": "run_python_code",
                                                  "arguments": {"python_code": "1 + 1"}})
        text = reply["result"]["content"][0]["text"]
        assert "<status>success</status>" in text and "2" in text, text

    async def close(self):
        """Closes its stdin (how a client ends it); killed if still there after 10 s."""
        if self.proc.returncode is not None:
            return
        try:
            self.proc.stdin.close()
            await asyncio.wait_for(self.proc.wait(), 10)
        except (asyncio.TimeoutError, BrokenPipeError, ConnectionResetError):
            self.kill()
            await self.proc.wait()

    def kill(self):
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass


async def start_fronts(count, binary, args, env, logs, live):
    """`count` fronts, each after its one call (started at once)."""
    fronts = []
    for i in range(count):
        front = await Front.start(binary, args, env, os.path.join(logs, f"front-{len(live)}.log"))
        live.append(front)
        fronts.append(front)
    await asyncio.wait_for(asyncio.gather(*(f.one_call() for f in fronts)), CALL_WAIT)
    return fronts


# --- the service -----------------------------------------------------------------------------

def zygote(binary, action, cache, env):
    return subprocess.run([binary, "zygote", action, "--cache-dir", cache], capture_output=True, text=True,
                          env=env, timeout=60)


async def wait_ready(binary, cache, env):
    """The service's pid, once `zygote status` says it is ready."""
    deadline = time.monotonic() + SERVICE_WAIT
    while True:
        status = zygote(binary, "status", cache, env)
        if status.returncode == 0 and "ready" in status.stdout and "warming up" not in status.stdout:
            return int(re.search(r"pid (\d+)", status.stdout).group(1))
        if time.monotonic() > deadline:
            raise SystemExit(f"the zygote service was not ready within {SERVICE_WAIT} s: "
                             f"{status.stdout}{status.stderr}")
        await asyncio.sleep(0.25)


def service_zygote(service):
    """The service's zygote: its child with `--control-fd=` in its argv."""
    found = [kid for kid in children(service) if any(a.startswith("--control-fd=") for a in argv(kid))]
    if len(found) != 1:
        raise SystemExit(f"expected one zygote among the service's children, found {found}")
    return found[0]


def stop_service(binary, cache, env, service):
    """`zygote stop`, then waits (up to 10 s) until `zygote status` finds none and the service's
    process tree (`service`: its pid, or None) has ended; SIGKILLs whatever of it is left."""
    tree = {pid: argv(pid) for pid in ([service, *descendants(service)] if service else [])}

    def left():
        return [pid for pid, seen in tree.items() if seen and argv(pid) == seen]  # not a reused pid

    zygote(binary, "stop", cache, env)
    deadline = time.monotonic() + 10
    while (zygote(binary, "status", cache, env).returncode != 1 or left()) and time.monotonic() < deadline:
        time.sleep(0.25)
    for pid in left():
        print(f"fronts_memory: killing {pid} ({' '.join(tree[pid][:1])} ... {tree[pid][-1]}), "
              "left 10 s after `zygote stop`", file=sys.stderr)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


# --- the two configurations ------------------------------------------------------------------

async def shared(binary, count, cache, env, logs, live, state):
    """(a): PSS (MiB) of fronts, workers, service + zygote with the service warm; the service's
    pid goes into `state["service"]` as soon as it is known."""
    args = ["--cache-dir", cache]
    [first] = await start_fronts(1, binary, args, env, logs, live)
    service = state["service"] = await wait_ready(binary, cache, env)
    await first.close()
    fronts = await start_fronts(count, binary, args, env, logs, live)
    service_zygote_pid = service_zygote(service)

    def everything():
        return [f.proc.pid for f in fronts] + [service, *descendants(service)] + \
            [d for f in fronts for d in descendants(f.proc.pid)]

    await settle(everything)
    fronts_pids = [f.proc.pid for f in fronts]
    own = [d for f in fronts for d in descendants(f.proc.pid)]
    workers = descendants(service_zygote_pid)
    other = [d for d in descendants(service) if d != service_zygote_pid and d not in workers]
    result = {"fronts": mib(fronts_pids), "workers": mib(workers + own),
              "service": mib([service, service_zygote_pid] + other),
              "processes": len(fronts_pids) + len(workers) + len(own) + 2 + len(other),
              "workers_count": len(workers) + len(own), "front_children": len(own),
              "parts": {"fronts": parts_mib(fronts_pids), "workers": parts_mib(workers + own),
                        "service": parts_mib([service, service_zygote_pid] + other)}}
    result["total"] = result["fronts"] + result["workers"] + result["service"]
    for front in fronts:
        await front.close()
    return result


async def own(binary, count, cache, env, logs, live):
    """(b): PSS (MiB) of fronts and their workers with `--no-shared-zygote`."""
    fronts = await start_fronts(count, binary, ["--cache-dir", cache, "--no-shared-zygote"], env, logs, live)

    def everything():
        return [f.proc.pid for f in fronts] + [d for f in fronts for d in descendants(f.proc.pid)]

    await settle(everything)
    fronts_pids = [f.proc.pid for f in fronts]
    workers = [d for f in fronts for d in descendants(f.proc.pid)]
    result = {"fronts": mib(fronts_pids), "workers": mib(workers), "service": 0.0,
              "processes": len(fronts_pids) + len(workers), "workers_count": len(workers),
              "worker_argv_ok": all("__worker" in argv(w) for w in workers),
              "parts": {"fronts": parts_mib(fronts_pids), "workers": parts_mib(workers)}}
    result["total"] = result["fronts"] + result["workers"]
    for front in fronts:
        await front.close()
    return result


# --- Monty -----------------------------------------------------------------------------------

def monty(count):
    """N Monty pools, each with one session checked out after one run: PSS (MiB) of their worker
    subprocesses, and what they add to this process's own PSS."""
    import pydantic_monty

    me = os.getpid()
    before = pss_kib(me)
    with contextlib.ExitStack() as stack:
        for _ in range(count):
            pool = stack.enter_context(pydantic_monty.Monty())
            session = stack.enter_context(pool.checkout())
            assert session.feed_run("1 + 1") == 2
        time.sleep(1)
        workers = descendants(me)
        result = {"workers": mib(workers), "host": max(0, pss_kib(me) - before) / MIB, "processes": len(workers)}
    result["total"] = result["workers"] + result["host"]
    return result


# --- the table -------------------------------------------------------------------------------

def table(a, b, m, count):
    def row(label, r, note=""):
        return (f"| {label} | {r['total']:.0f} MiB | {r['total'] / count:.1f} MiB | {r['total'] / m['total']:.1f}× "
                f"| {note} |")

    return "\n".join([
        f"| {count} stdio fronts, each after one call | total PSS | per front | × Monty | breakdown |",
        "|---|---|---|---|---|",
        row("(a) zygote service warm", a,
            f"fronts {a['fronts']:.0f}, workers {a['workers']:.0f} ({a['workers_count']}), "
            f"service + zygote {a['service']:.0f} MiB; {a['processes']} processes"),
        row("(b) `--no-shared-zygote`", b,
            f"fronts {b['fronts']:.0f}, workers {b['workers']:.0f} ({b['workers_count']}) MiB; "
            f"{b['processes']} processes"),
        row(f"Monty: {count} pools, one session each", m,
            f"pool workers {m['workers']:.1f} ({m['processes']}), in this process {m['host']:.1f} MiB"),
        "",
        f"(a)/(b) = {a['total'] / b['total']:.2f}×",
    ])


async def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    parser.add_argument("--fronts", type=int, default=10)
    options = parser.parse_args()
    binary = str(pathlib.Path(options.binary).resolve())
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"no binary at {binary}: build it with `cargo build --release`, or pass --binary")
    count = options.fronts

    m = monty(count)
    scratch = tempfile.mkdtemp(prefix="mrp-fronts-")
    os.chmod(scratch, 0o700)
    runtime, cache, logs = (os.path.join(scratch, name) for name in ("runtime", "cache", "logs"))
    for d in (runtime, cache, logs):
        os.mkdir(d, 0o700)
    env = {**os.environ, "XDG_RUNTIME_DIR": runtime}
    live, state = [], {"service": None}
    started = time.perf_counter()
    try:
        a = await shared(binary, count, cache, env, logs, live, state)
        stop_service(binary, cache, env, state.pop("service"))
        state["service"] = None
        b = await own(binary, count, cache, env, logs, live)
        if zygote(binary, "status", cache, env).returncode != 1:
            raise SystemExit("a zygote service runs after (b): the fronts did not honour --no-shared-zygote")
    finally:
        for front in live:
            front.kill()
        for front in live:
            with contextlib.suppress(Exception):
                await front.proc.wait()
        stop_service(binary, cache, env, state["service"])
        if zygote(binary, "status", cache, env).returncode != 1:
            print("fronts_memory: a zygote service is still running", file=sys.stderr)
        shutil.rmtree(scratch, ignore_errors=True)
    print(table(a, b, m, count))
    print(json.dumps({"fronts": count, "shared": a, "own": b, "monty": m,
                      "shared_over_own": a["total"] / b["total"],
                      "seconds": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    ensure_venv()
    asyncio.run(main())

"""The per-host zygote service (the zygote service, docs/architecture.md §3.3) through the real binary: a second stdio front forks from
the service the first one started (and a PydanticAI agent run works through it), another uid is
refused, a SIGKILLed front leaves no worker, another binary or other `--deps` get a service of
their own, a stale socket file is replaced, two fronts racing make one service, a service killed
mid-use costs no call, `zygote stop` ends it, and it ends by itself when idle.

Each test has a runtime directory (`$XDG_RUNTIME_DIR`) of its own, so that it sees only its own
services, and stops them at the end even when it fails."""

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time

import pytest
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPServerStdio

from conftest import (BINARY, CALL_TIMEOUT, SHARED_CACHE, server_env, stop_zygote_services,
                      zygote_services)
from test_pydantic_ai import EXPECTED, CODE, model_that_runs

pytestmark = pytest.mark.anyio

# A debug build's service boots, warms up 5,000 calls and waits ~10 s for its engine threads.
READY_TIMEOUT = 180
# Seconds a front may take to start the service after its first boot (a process start).
SERVICE_START_TIMEOUT = 10
# How soon a service must notice a front's end and kill its workers (the bound: 1 s),
# plus the time `zygote status` takes to start a process and ask.
WORKER_GONE_TIMEOUT = 1.0
POLL = 0.05
NOBODY = 65534


@pytest.fixture
def runtime_dir():
    """A private runtime directory whose services are stopped at the end."""
    path = pathlib.Path(tempfile.mkdtemp(prefix="mcp-run-python-zygote-test-"))
    try:
        yield path
    finally:
        stop_zygote_services(path)
        assert live_services(path) == [], "a zygote service outlived its test"
        shutil.rmtree(path, ignore_errors=True)


def cmdline(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def ppid(pid):
    try:
        stat_line = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat_line.rsplit(")", 1)[1].split()[1])


def live_services(runtime_dir):
    """Pids of the service processes whose socket is in `runtime_dir` (from /proc), leaving out
    a service's child between its fork and its `exec`."""
    needle = str(runtime_dir).encode()
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            args = cmdline(entry.name)
            state = ""
            with contextlib.suppress(OSError):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if b"zygote-service" in args and any(needle in a for a in args) and state != "Z":
                found.append(int(entry.name))
    # A child the service forked keeps its command line until its `exec`: not a service.
    return sorted(pid for pid in found if ppid(pid) not in found)


def children(pid):
    return [int(p.name) for p in pathlib.Path("/proc").iterdir()
            if p.name.isdigit() and ppid(p.name) == pid and not is_zombie(p.name)]


def is_zombie(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def service_workers(service_pid):
    """The workers the service's zygote forked (its zygote is its child with a control socket)."""
    zygotes = [k for k in children(service_pid) if any(a.startswith(b"--control-fd=") for a in cmdline(k))]
    return [w for z in zygotes for w in children(z)]


def wait_until(check, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL)


def listed_services(runtime_dir):
    """The lines of `zygote status` for `runtime_dir`, or None while it lists no service."""
    code, lines = zygote_services(runtime_dir)
    return lines if code == 0 else None


def wait_ready(runtime_dir, timeout=READY_TIMEOUT):
    def ready():
        lines = listed_services(runtime_dir)
        return lines and any(", ready," in line for line in lines) and lines
    return wait_until(ready, timeout, "the zygote service to be ready")


class Front:
    """`mcp-run-python stdio` over raw pipes (so that a test can SIGKILL it), initialized."""

    def __init__(self, runtime_dir, *args, binary=BINARY, stderr=None, initialize=True):
        self.proc = subprocess.Popen(
            [binary, "stdio", "--cache-dir", SHARED_CACHE, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
            env=server_env(runtime_dir),
        )
        self.next_id = 1
        if initialize:
            self.initialize()

    def initialize(self):
        self.request("initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                    "clientInfo": {"name": "zygote-test", "version": "1"}})
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, message):
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def start_call(self, code):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": "tools/call",
                   "params": {"name": "run_python_code", "arguments": {"python_code": code}}})

    def request(self, method, params):
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            line = self.proc.stdout.readline()
            assert line, "the front closed its output"
            reply = json.loads(line)
            if reply.get("id") == self.next_id:
                return reply

    def run(self, code):
        reply = self.request("tools/call", {"name": "run_python_code", "arguments": {"python_code": code}})
        return reply["result"]["content"][0]["text"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def front(runtime_dir, *args, **kwargs):
    f = Front(runtime_dir, *args, **kwargs)
    try:
        yield f
    finally:
        f.close()


def one_service(runtime_dir):
    code, lines = zygote_services(runtime_dir)
    assert code == 0 and len(lines) == 1, lines
    return int(lines[0].split("pid ", 1)[1].split(",", 1)[0])


async def test_a_second_front_forks_from_the_first_ones_service_and_an_agent_runs_through_it(runtime_dir, tmp_path):
    with front(runtime_dir) as first:
        # The first front serves its first call at once, booting its own interpreter, and
        # starts the service after that boot.
        assert "<return_value>\n2\n</return_value>" in first.run("1 + 1")
        wait_until(lambda: live_services(runtime_dir), SERVICE_START_TIMEOUT, "the first front to start the service")
    lines = wait_ready(runtime_dir)
    service = one_service(runtime_dir)
    log = tmp_path / "second.log"
    with open(log, "wb") as errlog, front(runtime_dir, stderr=errlog) as second:
        assert "<return_value>\n3\n</return_value>" in second.run("1 + 2")
        # Its worker is the service zygote's child, not the front's.
        workers = service_workers(service)
        assert len(workers) == 1, workers
        assert children(second.proc.pid) == [], "the second front started a worker of its own"
        code, lines = zygote_services(runtime_dir)
        assert ", 1 fronts, 1 workers," in lines[0], lines
    text = log.read_text()
    assert "the zygote is ready (the zygote service at" in text, text
    assert "forked from the zygote in" in text, text

    server = MCPServerStdio(BINARY, args=["stdio", "--cache-dir", SHARED_CACHE],
                            env=server_env(runtime_dir), timeout=30, read_timeout=CALL_TIMEOUT)
    agent = Agent(model_that_runs(CODE), toolsets=[server])
    async with agent:
        result = await agent.run("What is the sum of the numbers below ten?")
    assert result.output == f"tool said: {EXPECTED}"
    assert one_service(runtime_dir) == service, "the agent's front started another service"


def test_the_first_front_starts_the_service_after_its_first_boot_and_a_front_meanwhile_answers(runtime_dir, tmp_path):
    """With no service running, a front boots its first interpreter before it starts one, so
    that the service's boot and warm-up do not slow that first call (issue 49); a front that
    comes while the service warms up answers from an interpreter of its own."""
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    with open(first_log, "wb") as errlog, front(runtime_dir, stderr=errlog) as first:
        assert "<return_value>\n2\n</return_value>" in first.run("1 + 1")
        (service,) = wait_until(lambda: live_services(runtime_dir), SERVICE_START_TIMEOUT,
                                "the first front to start the service")
        # Its process runs a moment before its socket listens, and `zygote status` finds it.
        lines = wait_until(lambda: listed_services(runtime_dir), SERVICE_START_TIMEOUT,
                           "the started service to listen")
        assert ", ready," not in lines[0], f"the service was ready too soon for this test: {lines}"
        with open(second_log, "wb") as errlog2, front(runtime_dir, stderr=errlog2) as second:
            assert "<return_value>\n3\n</return_value>" in second.run("1 + 2")
            assert children(second.proc.pid), "the second front's first call did not run in its own interpreter"
        assert live_services(runtime_dir) == [service], "the second front started another service"
    text = first_log.read_text()
    booted = text.index("sandbox worker ready")
    started = text.index("started the zygote service")
    assert booted < started, text
    assert "started the zygote service" not in second_log.read_text()
    wait_ready(runtime_dir)


def test_a_peer_of_another_uid_is_refused(runtime_dir):
    with front(runtime_dir) as f:
        f.run("1")
    sock = wait_until(lambda: list((runtime_dir / "mcp-run-python").glob("*.sock")), 30, "the socket")[0]
    log = sock.with_suffix(".log")
    probe = ("import socket, sys\n"
             "s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n"
             "try:\n    s.connect(sys.argv[1])\nexcept OSError as e:\n    print('connect', e.errno); sys.exit()\n"
             "s.settimeout(5)\nprint('got', len(s.recv(65536)))\n")
    # The system's Python: one under root's home (pyenv) is out of another user's reach.
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                 "/usr/bin/python3", "-c", probe, str(sock)]
    os.chmod(runtime_dir, 0o711)
    # The directory (0700) keeps another user from even reaching the socket.
    done = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "connect 13", done
    # Opened up by mistake, the service still refuses the peer by its uid, and logs it.
    os.chmod(sock.parent, 0o711)
    os.chmod(sock, 0o777)
    done = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "got 0", done
    assert wait_until(lambda: f"refused a connection from uid {NOBODY}" in log.read_text(), 10, "the refusal in the log")
    os.chmod(sock.parent, 0o700)


def test_a_sigkilled_front_leaves_no_worker_of_its_own(runtime_dir):
    with front(runtime_dir) as f:
        f.run("1")
    wait_ready(runtime_dir)
    service = one_service(runtime_dir)
    f = Front(runtime_dir)
    try:
        f.run("1")
        f.start_call("while True:\n    pass")
        workers = wait_until(lambda: service_workers(service), 10, "a forked worker")
        assert len(workers) == 1, workers
        time.sleep(0.5)
        f.proc.send_signal(signal.SIGKILL)
        f.proc.wait()
        killed = time.monotonic()
        wait_until(lambda: not any(os.path.exists(f"/proc/{w}") and not is_zombie(w) for w in workers),
                   WORKER_GONE_TIMEOUT, "the dead front's worker to end")
        assert time.monotonic() - killed <= WORKER_GONE_TIMEOUT
    finally:
        f.close()
    code, lines = zygote_services(runtime_dir)
    assert ", 0 fronts, 0 workers," in lines[0], lines


def test_another_binary_or_other_deps_get_a_service_of_their_own(runtime_dir, tmp_path):
    with front(runtime_dir) as f:
        f.run("1")
    # An upgrade is another executable: here a copy of this one.
    upgraded = tmp_path / "mcp-run-python"
    shutil.copy2(BINARY, upgraded)
    with front(runtime_dir, binary=str(upgraded)) as f:
        f.run("1")
    with front(runtime_dir, "--deps", "no-such-package-mcp-run-python-test") as f:
        f.run("1")
    code, lines = zygote_services(runtime_dir)
    assert code == 0 and len(lines) == 3, lines
    assert len({line.rsplit("digest ", 1)[1] for line in lines}) == 3, lines
    assert len(live_services(runtime_dir)) == 3


def test_a_stale_socket_file_is_replaced(runtime_dir):
    sock_dir = runtime_dir / "explicit"
    sock_dir.mkdir(mode=0o700)
    path = sock_dir / "zygote.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(str(path))
    stale.close()  # the file stays, with nothing listening: a service that was SIGKILLed
    assert stat.S_ISSOCK(path.stat().st_mode)
    with front(runtime_dir, "--zygote-socket", str(path)) as f:
        assert "<return_value>\n2\n</return_value>" in f.run("1 + 1")
    done = subprocess.run([BINARY, "zygote", "status", "--zygote-socket", str(path)],
                          env=server_env(runtime_dir), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "pid " in done.stdout, done
    done = subprocess.run([BINARY, "zygote", "stop", "--zygote-socket", str(path)],
                          env=server_env(runtime_dir), capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "stopped" in done.stdout, done
    assert not path.exists()


def test_two_fronts_racing_make_one_service(runtime_dir):
    # Both processes start before either is spoken to: each looks for the service as it starts.
    fronts = [Front(runtime_dir, initialize=False), Front(runtime_dir, initialize=False)]
    try:
        for f in fronts:
            f.initialize()
            f.run("1")
        # The process that lost the race for the lock ends at once.
        wait_until(lambda: len(live_services(runtime_dir)) == 1, 10, "one service")
        code, lines = zygote_services(runtime_dir)
        assert code == 0 and len(lines) == 1, lines
        assert ", 2 fronts," in lines[0], lines
    finally:
        for f in fronts:
            f.close()


def test_a_service_killed_mid_use_costs_no_call(runtime_dir):
    with front(runtime_dir) as f:
        f.run("1")
    wait_ready(runtime_dir)
    service = one_service(runtime_dir)
    with front(runtime_dir) as f:
        assert "<return_value>\n2\n</return_value>" in f.run("1 + 1")
        workers = service_workers(service)
        assert workers
        os.kill(service, signal.SIGKILL)
        wait_until(lambda: not live_services(runtime_dir), 10, "the service to end")
        # The forked worker dies with the service (its zygote and it die with their parents);
        # the front notices before the next call's code is sent, and the next calls get
        # interpreters of the front's own.
        wait_until(lambda: all(is_zombie(w) for w in workers), 10, "the forked worker to end")
        # The next call answers: in a new interpreter, or, when the front had not yet seen its
        # worker end, with the run-error that says so (as after any lost worker).
        text = f.run("2 + 2")
        assert "<status>success</status>" in text or "the sandbox worker stopped unexpectedly" in text, text
        assert "<return_value>\n6\n</return_value>" in f.run("3 + 3")
        assert "<return_value>\n8\n</return_value>" in f.run("4 + 4")


def test_zygote_stop_ends_the_service_and_idle_exit_happens(runtime_dir):
    with front(runtime_dir) as f:
        f.run("1")
    pids = live_services(runtime_dir)
    assert len(pids) == 1
    done = subprocess.run([BINARY, "zygote", "stop"], env=server_env(runtime_dir),
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and f"(pid {pids[0]})" in done.stdout, done
    assert live_services(runtime_dir) == []
    code, lines = zygote_services(runtime_dir)
    assert code == 1 and "no zygote service is running" in lines[-1], lines

    with front(runtime_dir, "--zygote-idle-exit", "2") as f:
        f.run("1")
        assert len(live_services(runtime_dir)) == 1
    # With no front, it ends after 2 s.
    wait_until(lambda: not live_services(runtime_dir), 15, "the idle service to end")


def test_no_shared_zygote_starts_no_service(runtime_dir):
    with front(runtime_dir, "--no-shared-zygote") as f:
        assert "<return_value>\n2\n</return_value>" in f.run("1 + 1")
    assert live_services(runtime_dir) == []
    assert not (runtime_dir / "mcp-run-python").exists()

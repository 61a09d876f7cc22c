"""Starting the real binary, shared by both Python client suites: tests/sdk_v1 (the 1.x client
line, in .venv) and tests/sdk_v2 (the current line, in .venv-current). Standard library only,
so that it imports in either venv; each suite's conftest.py puts this directory on `sys.path`
(the suites have different rootdirs, so neither can import the other's conftest) and re-exports
what its tests use."""

import asyncio
import contextlib
import fcntl
import os
import pathlib
import platform
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import termios
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ.get("MCP_RUN_PYTHON_BIN") or str(ROOT / "target" / "debug" / "mcp-run-python")
# One download cache (and Pyodide memory snapshot) for the whole run and both suites, so each
# PyPI file is fetched once.
SHARED_CACHE = os.environ.get("MCP_RUN_PYTHON_TEST_CACHE") or str(ROOT / "target" / "test-cache")
# Generous: the first worker boot of a debug build without a snapshot takes 10-15 s.
INIT_TIMEOUT = 60
CALL_TIMEOUT = 300
# Seconds a server has to stop after SIGTERM before the test fails.
STOP_TIMEOUT = 30
# Seconds one attempt to connect to a starting server may take.
CONNECT_TIMEOUT = 1
# Seconds between two attempts to connect to a server that is starting.
POLL_INTERVAL = 0.1
# The address the HTTP modes listen on and the tests connect to.
LOOPBACK = "127.0.0.1"


# This run's own `$XDG_RUNTIME_DIR` (0700, like a real one), where every front of the run finds or
# starts its zygote service: the run never uses, nor leaves behind, a service of the machine's
# user, and `stop_zygote_services` ends all of the run's at the end.
RUNTIME_PREFIX = "mcp-run-python-test-runtime-"
RUNTIME_DIR = tempfile.mkdtemp(prefix=RUNTIME_PREFIX)


def server_env(runtime_dir=RUNTIME_DIR):
    """The server's whole environment: `PATH`, this run's `XDG_RUNTIME_DIR` (the zygote
    services' home), and `RUST_LOG` when the run sets it."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "XDG_RUNTIME_DIR": str(runtime_dir)}
    if "RUST_LOG" in os.environ:
        env["RUST_LOG"] = os.environ["RUST_LOG"]
    return env


def zygote_services(runtime_dir=RUNTIME_DIR):
    """`mcp-run-python zygote status` for `runtime_dir`: (exit status, its lines)."""
    done = subprocess.run([BINARY, "zygote", "status", "--cache-dir", SHARED_CACHE], env=server_env(runtime_dir),
                          capture_output=True, text=True, timeout=STOP_TIMEOUT)
    return done.returncode, done.stdout.splitlines()


def wait_for_ready_zygote_service(timeout=240, runtime_dir=RUNTIME_DIR):
    """Waits until the zygote services of `runtime_dir` are ready (one a front started, and any
    an earlier test left): a front started afterwards forks its first interpreter from its own
    service instead of booting one, which is what a checkpoint needs (checkpoints,
    docs/architecture.md §3.4). Every service, not any one: a service of other options that an
    earlier test left ready says nothing of the one this test's front just started."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, lines = zygote_services(runtime_dir)
        if any(" ready" in line for line in lines) and not any(" warming up" in line for line in lines):
            return
        time.sleep(0.5)
    raise AssertionError(f"no zygote service became ready in {timeout} s: {zygote_services(runtime_dir)}")


def warm_zygote_service(*args):
    """Brings this run's zygote service for a server started with `args` up and waits until it
    is ready (a server it starts and stops does it), so that servers started afterwards fork
    every interpreter, their first included: a checkpoint needs a forked interpreter (checkpoints, docs/architecture.md §3.4)."""
    with http_server("streamable-http", *args):
        wait_for_ready_zygote_service()


def stop_zygote_services(runtime_dir=RUNTIME_DIR):
    """Stops every zygote service of `runtime_dir` (`mcp-run-python zygote stop`); fails the
    test run when one does not stop."""
    done = subprocess.run([BINARY, "zygote", "stop", "--cache-dir", SHARED_CACHE], env=server_env(runtime_dir),
                          capture_output=True, text=True, timeout=STOP_TIMEOUT)
    assert done.returncode == 0, done


def stop_new_zygote_services(before):
    """Ends every zygote service process that is not in `before` (pids taken when the run
    began) with SIGTERM, which a service takes as `zygote stop`: those started wherever their
    front looked, such as the ones the Python package's launchers start with the user's own
    environment. Fails the run when one is still there after STOP_TIMEOUT."""
    started = {pid for pid in set(zygote_service_pids()) - set(before) if not _another_runs(pid)}
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while (left := set(zygote_service_pids()) & started) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL)
    assert not left, f"zygote services did not stop: {left}"


class ServerURL(str):
    """A server's base URL that also knows the server's process id."""

    pid: int


@contextlib.contextmanager
def http_server(mode, *args, cache_dir=SHARED_CACHE, errlog=None, may_be_killed=False, env=None):
    """`mcp-run-python <mode>` on a free loopback port; yields its base URL (a `ServerURL`). On
    exit it is sent SIGTERM and must stop cleanly, unless `may_be_killed` and the test
    SIGKILLed it. Its stderr goes to `errlog` (a file) when given; `env` adds to its
    environment."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [BINARY, mode, "--host", LOOPBACK, "--port", str(port), "--cache-dir", cache_dir, *args],
        env={**server_env(), **(env or {})},
        stderr=errlog,
    )
    deadline = time.monotonic() + INIT_TIMEOUT
    while True:
        try:
            socket.create_connection((LOOPBACK, port), timeout=CONNECT_TIMEOUT).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{mode} server did not start")
            time.sleep(POLL_INTERVAL)
    try:
        url = ServerURL(f"http://{LOOPBACK}:{port}")
        url.pid = proc.pid
        yield url
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        killed = may_be_killed and code == -signal.SIGKILL
        assert code == 0 or killed, f"{mode} server exited with {code} after SIGTERM"


@contextlib.contextmanager
def zygote_services_stopped_after():
    """Wraps a whole test run: every zygote service the run's fronts started ends with it, even
    when a test failed (those in the run's runtime directory, and any other that was not there
    before), and the run's runtime directory is removed."""
    before = zygote_service_pids()
    try:
        yield
    finally:
        stop_zygote_services()
        stop_new_zygote_services(before)
        shutil.rmtree(RUNTIME_DIR, ignore_errors=True)


def _another_runs(service):
    """Whether the zygote service `service` belongs to another test run on this host (suites run
    side by side): its `--zygote-socket=` lies in another run's runtime directory, which that run
    stops itself."""
    try:
        with open(f"/proc/{service}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
    except OSError:
        return False
    ours = RUNTIME_DIR.encode() + b"/"
    prefix = (pathlib.Path(tempfile.gettempdir()) / RUNTIME_PREFIX).as_posix().encode()
    return any(arg.startswith(b"--zygote-socket=" + prefix) and not arg.startswith(b"--zygote-socket=" + ours)
               for arg in args)


def zygote_service_pids():
    """Every zygote service process on the host (`zygote-service` in its command line)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    # A zombie's command line is empty.
                    if b"zygote-service" in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
    return found


def forked_for(server_pid, state_filter=lambda state: state != "Z"):
    """The workers a zygote service forked for `server_pid`: children of a service's zygote (its
    child with `--control-fd=` in its command line) whose standard input is a pipe the server
    holds the other end of. Read as root: workers are not dumpable."""
    pipes = _pipes(server_pid)
    found = []
    for service in zygote_service_pids():
        for zygote, _ in children_of(service):
            if not is_zygote(zygote):
                continue
            found.extend(k for k, state in children_of(zygote)
                         if state_filter(state) and _stdin_pipe(k) in pipes)
    return found


def is_zygote(pid):
    """Whether `pid` is a zygote (the fork server's process, which never runs user code)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"--control-fd=" in f.read()
    except OSError:
        return False


def children_of(pid):
    """(pid, state) of every child process of `pid`, from /proc."""
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == str(pid):
                children.append((int(entry), fields[0]))
    return children


def _pipes(pid):
    """The pipes `pid` holds a descriptor of (`pipe:[inode]`)."""
    held = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("pipe:"):
                    held.add(target)
    return held


def _stdin_pipe(pid):
    try:
        return os.readlink(f"/proc/{pid}/fd/0")
    except OSError:
        return None


# The `read` system call's number, as /proc/<pid>/syscall names it (the first field).
READ_SYSCALL = {"x86_64": 0, "aarch64": 63}[platform.machine()]
# Seconds a worker may take to finish what the front asked of it, and between two looks.
SETTLE_TIMEOUT = 30
SETTLE_POLL = 0.005


def between_requests(pid):
    """Whether worker `pid` waits for the front's next request with nothing unread: its main
    thread blocked in `read` of its standard input (the requests' pipe), and that pipe empty.
    A stateful call's checkpoint, asked for before its answer and read after it (checkpoints,
    docs/architecture.md §3.4), is then taken and sent, so a worker killed now loses nothing.
    Read as root: workers are not dumpable."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            fields = f.read().split()
        if len(fields) < 2 or fields[0] != str(READ_SYSCALL) or int(fields[1], 16) != 0:
            return False
        # Another reader of the same pipe, which asks how much is unread and reads nothing.
        fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
        try:
            unread = fcntl.ioctl(fd, termios.FIONREAD, struct.pack("i", 0))
        finally:
            os.close(fd)
        return struct.unpack("i", unread)[0] == 0
    except OSError:
        return False


async def settled(*pids):
    """Waits until every worker in `pids` is between requests ([`between_requests`]): what a
    test does before it kills or stops a stateful sandbox's worker "between calls"."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_TIMEOUT
    while not all(between_requests(pid) for pid in pids):
        assert loop.time() < deadline, f"workers {pids} did not settle between requests"
        await asyncio.sleep(SETTLE_POLL)


"""An interpreter that fails as it boots does not lose the call that waits for it (issue 48):
the front boots another, once, and the result says so in a `<note>`.

The failure is made from outside: every new worker process is sent SIGABRT as soon as it
appears, before its interpreter is ready, standing in for the rare engine trap of a boot
("Out of bounds memory access" at `callMain`, or while installing `--deps`). SIGABRT, because
JavaScriptCore handles SIGSEGV itself once it is up. A cache directory of the test's own keeps
the run's shared memory snapshot out of it, so each boot here is a plain one."""

import os
import signal
import threading
import time

import pytest

from conftest import direct_child_pids, mcp_session, run

pytestmark = pytest.mark.anyio

# The spare the front boots as it starts, then the call's own first interpreter.
FAILED_BOOTS = 2
# Seconds the failures are looked for: a plain boot of a debug build takes ~5 s.
WATCH_SECONDS = 60
POLL_SECONDS = 0.005


def abort_new_workers(count, stop):
    """Sends SIGABRT to the first `count` worker processes that a server of this test process
    starts from now on (children of its children: other suites run beside this one); returns
    the pids, filled as it goes."""
    before = set(worker_pids())
    aborted = []

    def watch():
        deadline = time.monotonic() + WATCH_SECONDS
        while len(aborted) < count and time.monotonic() < deadline and not stop.is_set():
            for pid in worker_pids():
                if pid not in before and pid not in aborted and len(aborted) < count:
                    os.kill(pid, signal.SIGABRT)
                    aborted.append(pid)
            time.sleep(POLL_SECONDS)

    threading.Thread(target=watch, daemon=True).start()
    return aborted


def worker_pids():
    """The worker processes (`__worker` their command) whose parent is a child of this
    process: those a server this test started spawned itself (`--no-zygote`)."""
    return [kid for server in direct_child_pids(os.getpid()) for kid in direct_child_pids(server)
            if is_worker(kid)]


def is_worker(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[1:2] == [b"__worker"]
    except OSError:
        return False


async def test_a_call_whose_interpreter_fails_as_it_boots_runs_in_another(tmp_path):
    stop = threading.Event()
    aborted = abort_new_workers(FAILED_BOOTS, stop)
    try:
        async with mcp_session("--no-zygote", cache_dir=str(tmp_path)) as session:
            text = await run(session, "1 + 1")
            assert len(aborted) == FAILED_BOOTS, aborted
            assert text.startswith("<status>success</status>\n<note>the first interpreter for this call failed "
                                   "as it booted (the sandbox worker failed to boot its interpreter: the worker "
                                   "exited (signal: 6 (SIGABRT))"), text
            assert text.endswith("<return_value>\n2\n</return_value>"), text
            # The next call has nothing to say.
            assert await run(session, "1 + 2") == "<status>success</status>\n<return_value>\n3\n</return_value>"
    finally:
        stop.set()

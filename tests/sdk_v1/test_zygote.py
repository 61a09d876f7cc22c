"""The fork server (the zygote, docs/architecture.md §3): fresh interpreters forked from a zygote, through the real binary.

Each forked interpreter must be as fresh as a booted one (nothing of an earlier call or session,
its own random state), confined like one (read from /proc, not from the server's word), and
killed and reaped with its session; the zygote itself never runs user code, and losing it
costs only the interpreters it forked.
"""

import contextlib
import json
import os
import signal

import httpx
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from adversary import wait_until
from conftest import child_pids, http_server, mcp_session, run, zombie_pids, zygote_pids

pytestmark = pytest.mark.anyio

# What the server logs once its zygote forks interpreters, and for each forked interpreter.
ZYGOTE_READY = "the zygote is ready"
FORKED = "forked from the zygote"
# How long a zygote may take to become ready (seconds): boot, warm-up, then about 10 s until
# its engine's idle threads end (a debug build on a busy machine is the slow case).
ZYGOTE_WAIT = 180
# Most mappings a zygote may have when it forks: ~200 once merged, against 1,400-2,000 when the
# engine's allocator has split them.
MAX_ZYGOTE_MAPPINGS = 600
# The kernel's transparent huge page setting (absent when the kernel has none).
THP = "/sys/kernel/mm/transparent_hugepage/enabled"
# Fresh interpreters handed out by the stress test.
FRESH = 500
# Each call reports whether its interpreter saw an earlier call, a random draw, its index, and
# whether the `--deps` package was imported before the call began.
PROBE = """
import builtins, random, sys
seen = getattr(builtins, "_probe_mark", None)
builtins._probe_mark = {i}
[seen, random.getrandbits(52), {i} * 3, "httpx" in sys.modules]
"""
# The `--deps` of the stress test: installed and imported once in the zygote, so that no forked
# interpreter pays for it (about a second each when every one installed and imported it).
DEPS = "httpx"


def eventfd_ids(pid):
    """The kernel ids of the event descriptors `pid` holds (from /proc/PID/fdinfo)."""
    ids = set()
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                ids.update(line.split()[1] for line in f if line.startswith("eventfd-id:"))
        except OSError:
            pass
    return ids


def threads(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(next(line.split()[1] for line in f if line.startswith("Threads:")))


def status_kib(path, name):
    """A `Name:   N kB` field of a /proc file, in KiB."""
    with open(path) as f:
        return int(next(line.split()[1] for line in f if line.startswith(name + ":")))


def status_field(pid, name):
    with open(f"/proc/{pid}/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith(name + ":"))


async def zygote_ready(server_pid, log, wait=ZYGOTE_WAIT):
    """The server's zygote, once the server says it forks interpreters (in `log`), waiting at
    most `wait` seconds."""
    assert await wait_until(lambda: ZYGOTE_READY in log.read_text(), wait), log.read_text()
    (zygote,) = zygote_pids(server_pid)
    assert threads(zygote) == 1
    return zygote


async def test_500_fresh_interpreters_each_answer_right(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "w") as errlog:
        args = ("--isolation", "call", "--workers", "2", "--deps", DEPS, "--return-mode", "json")
        async with mcp_session(*args, errlog=errlog) as session:
            # Booted before the zygote is ready, the interpreter installed and imported --deps
            # as it booted.
            answer = json.loads(await run(session, PROBE.format(i=-1)))
            assert answer["return_value"][3] is True, answer
            assert await wait_until(lambda: ZYGOTE_READY in log.read_text(), ZYGOTE_WAIT), log.read_text()
            draws = set()
            for i in range(FRESH):
                answer = json.loads(await run(session, PROBE.format(i=i)))
                assert answer["status"] == "success", answer
                seen, draw, tripled, imported = answer["return_value"]
                assert seen is None, f"call {i} ran in an interpreter of call {seen}"
                assert tripled == 3 * i
                assert imported, f"call {i} found {DEPS} not imported"
                draws.add(draw)
            # A call that imports the package finds it installed (no install error).
            answer = json.loads(await run(session, "import httpx\nhttpx.__name__"))
            assert answer["status"] == "success" and answer["return_value"] == DEPS, answer
    # Every interpreter drew its own random number: none inherited the zygote's state.
    assert len(draws) == FRESH
    # A few calls may take spares restored before the zygote was ready; the rest are forked.
    assert log.read_text().count(FORKED) >= FRESH - 5, log.read_text()[-2000:]


async def sessions_on(stack, url, n):
    """`n` open streamable-HTTP MCP sessions on `url`, closed with `stack`."""
    sessions = []
    for _ in range(n):
        read, write, _ = await stack.enter_async_context(streamablehttp_client(f"{url}/mcp"))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        sessions.append(session)
    return sessions


# One interpreter booted at start (the first session's) and no spare kept: every later session's
# interpreter is forked when it is asked for, after the zygote is ready. The server keeps a zygote
# of its own (`--no-shared-zygote`), whose process these tests inspect and kill; the host's zygote
# service, which holds the same zygote, is tested in test_zygote_service.py.
FORK_ON_DEMAND = ("--workers", "1", "--spares", "0", "--no-shared-zygote")


async def test_forked_sessions_are_confined_apart_and_reaped_and_die_with_the_zygote(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "w") as errlog, http_server("streamable-http", *FORK_ON_DEMAND, errlog=errlog) as url:
        stack = contextlib.AsyncExitStack()
        # Alive at once; ready (new sandboxes are cheap) only once the zygote is (README "Running many replicas").
        assert httpx.get(f"{url}/healthz").status_code == 200
        not_ready = httpx.get(f"{url}/readyz")
        assert not_ready.status_code == 503 and "zygote" in not_ready.json()["reason"], not_ready.text
        # The zygote starts after the first interpreter booted: one session starts it.
        (first,) = await sessions_on(stack, url, 1)
        await run(first, "1")
        zygote = await zygote_ready(url.pid, log)
        assert await wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, 10)
        # The zygote was never sealed for calls: it runs none (its workers are).
        assert status_field(zygote, "Seccomp") == "0"
        # Its memory is laid out for cheap forks (src/interpreter/fork_memory.rs): the engine's
        # ~1,500 split mappings merged back (~200 remain), and mostly resident memory in huge
        # pages wherever the kernel offers them.
        with open(f"/proc/{zygote}/maps") as f:
            assert sum(1 for _ in f) < MAX_ZYGOTE_MAPPINGS
        if os.path.exists(THP) and "[never]" not in open(THP).read():
            assert status_kib(f"/proc/{zygote}/smaps_rollup", "AnonHugePages") > 0
        before = set(child_pids(url.pid))
        a, b = await sessions_on(stack, url, 2)
        await run(a, "secret = 'of session a'\nimport random\nrandom.random()")
        assert "of session a" not in await run(b, "import gc\n[o for o in gc.get_objects() if isinstance(o, str) and 'of session a' in o]")
        forked = [pid for pid in child_pids(url.pid) if pid not in before]
        assert len(forked) >= 2, (before, forked)
        for pid in forked:
            # Forked by the zygote, and confined like a booted worker (read from /proc).
            assert int(status_field(pid, "PPid")) == zygote
            assert status_field(pid, "Seccomp") == "2"
            assert status_field(pid, "NoNewPrivs") == "1"
            assert status_field(pid, "CapEff") == "0000000000000000"
            for ns in ("user", "net", "mnt", "ipc", "uts"):
                assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns
        # No kernel object is shared between the zygote and its children, or between siblings:
        # the engine's event descriptor is replaced in every child.
        owners = [zygote, *forked]
        ids = [eventfd_ids(pid) for pid in owners]
        assert all(ids), ids
        assert len(set().union(*ids)) == sum(len(i) for i in ids), ids
        # Each session's random state is its own.
        draws = {await run(s, "import random\nrandom.getrandbits(60)") for s in (a, b)}
        assert len(draws) == 2, draws
        # Ended sessions' interpreters are killed and reaped (by the zygote).
        await stack.aclose()
        assert await wait_until(lambda: not (set(forked) & set(child_pids(url.pid))), 15)
        assert await wait_until(lambda: zombie_pids(url.pid) == [], 15), zombie_pids(url.pid)

        # Losing the zygote costs only the interpreters it forked: they die with it, and a
        # session's next call starts in a clean interpreter, as after any lost interpreter. New sessions are served by booted interpreters until a new
        # zygote is ready.
        stack = contextlib.AsyncExitStack()
        (doomed,) = await sessions_on(stack, url, 1)
        await run(doomed, "x = 1")
        doomed_pid = next(pid for pid in child_pids(url.pid) if int(status_field(pid, "PPid")) == zygote)
        os.kill(zygote, signal.SIGKILL)
        assert await wait_until(lambda: not os.path.exists(f"/proc/{doomed_pid}"), 15)
        assert await wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 503, 15)
        # The interpreter that ended between calls is replaced before the next call's code is
        # sent: that call runs, in a clean interpreter (sandboxes, docs/architecture.md §3.1).
        text = await run(doomed, "x")
        assert text.startswith("<status>run-error</status>") and "NameError: name 'x' is not defined" in text, text
        assert await run(doomed, "2 + 2") == "<status>success</status>\n<return_value>\n4\n</return_value>"
        (fresh,) = await sessions_on(stack, url, 1)
        assert await run(fresh, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"
        await stack.aclose()


# What the server logs when a zygote could not start, and when a ready one ended.
ZYGOTE_NOT_STARTED = "the zygote did not start"
ZYGOTE_ENDED = "the zygote ended"
# Seconds until a new zygote is started after a first failure (src/worker/launcher.rs
# `ZYGOTE_RETRY`), plus a margin for a busy machine.
RETRY_WAIT = 5 + 20


async def test_a_lost_zygote_is_replaced_with_no_call_coming(tmp_path):
    # Behind a balancer, a replica whose /readyz says 503 gets no calls: a zygote that failed to
    # start, or ended once ready, must be replaced by the server itself, or it stays unready.
    log = tmp_path / "server.log"
    with open(log, "w") as errlog, http_server("streamable-http", *FORK_ON_DEMAND, errlog=errlog) as url:
        stack = contextlib.AsyncExitStack()
        (session,) = await sessions_on(stack, url, 1)
        await run(session, "1")
        await stack.aclose()
        # The zygote starts after that first boot; it is killed while it boots and warms up.
        assert await wait_until(lambda: zygote_pids(url.pid), 30), log.read_text()
        (starting,) = zygote_pids(url.pid)
        os.kill(starting, signal.SIGKILL)
        assert await wait_until(lambda: ZYGOTE_NOT_STARTED in log.read_text(), 30), log.read_text()
        assert ZYGOTE_READY not in log.read_text(), "the zygote was ready before it was killed"
        assert httpx.get(f"{url}/readyz").status_code == 503
        # No call comes; the server starts a new zygote and becomes ready by itself.
        zygote = await zygote_ready(url.pid, log, wait=RETRY_WAIT + ZYGOTE_WAIT)
        assert zygote != starting
        assert await wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, 10)
        # A ready zygote that ends is noticed and replaced, again with no call coming.
        os.kill(zygote, signal.SIGKILL)
        assert await wait_until(lambda: ZYGOTE_ENDED in log.read_text(), 15), log.read_text()
        assert await wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 503, 15)
        assert await wait_until(lambda: log.read_text().count(ZYGOTE_READY) == 2, RETRY_WAIT + ZYGOTE_WAIT)
        assert await wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, 10)
        (replaced,) = zygote_pids(url.pid)
        assert replaced not in (starting, zygote)
        # It forks: a new session's interpreter is its child.
        (fresh,) = await sessions_on(stack, url, 1)
        assert await run(fresh, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"
        assert any(int(status_field(pid, "PPid")) == replaced for pid in child_pids(url.pid))
        await stack.aclose()


async def test_shared_interpreters_give_way_to_forks_once_the_zygote_is_ready(tmp_path):
    # `--isolation shared` keeps its interpreters for the server's life; one restored before the
    # zygote was ready would compile its per-call code anew for thousands of calls (a third of
    # the throughput of forked ones), so at its next call it is replaced by a fork.
    log = tmp_path / "server.log"
    with open(log, "w") as errlog, http_server("streamable-http", "--isolation", "shared", "--workers", "1",
                                               "--no-shared-zygote", errlog=errlog) as url:
        stack = contextlib.AsyncExitStack()
        (session,) = await sessions_on(stack, url, 1)
        await run(session, "import sys")
        restored = child_pids(url.pid)
        assert len(restored) == 1, restored
        zygote = await zygote_ready(url.pid, log)
        assert await run(session, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"
        assert await wait_until(lambda: not set(restored) & set(child_pids(url.pid)), 15), child_pids(url.pid)
        (shared,) = child_pids(url.pid)
        assert int(status_field(shared, "PPid")) == zygote
        # From now on every call runs in that one forked interpreter.
        for _ in range(3):
            await run(session, "1")
        assert child_pids(url.pid) == [shared]
        await stack.aclose()

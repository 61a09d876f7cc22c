"""Sandboxes that never lose their state (checkpoints, docs/architecture.md §3.4) for today's clients: fastmcp 4's `Client`
against `streamable-http --stateful` (MCP 2026-07-28, sessionless, sandboxes by handle). A
worker SIGKILLed between calls comes back from its checkpoint; an idle sandbox hibernates (its
interpreter is freed, its state kept on disk) and resumes at its next call; at `--max-sandboxes`
the least recently used idle sandbox hibernates instead of ending. The state directory's part
is in test_state_dir.py; the 2025-11-25 era's in tests/sdk_v1/test_sandboxes.py."""

import asyncio
import os
import signal
import urllib.request

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from conftest import CALL_TIMEOUT, INIT_TIMEOUT, TOOL, forked_for, http_server, settled

pytestmark = pytest.mark.anyio


def client_for(base):
    return Client(StreamableHttpTransport(f"{base}/mcp"), init_timeout=INIT_TIMEOUT, timeout=CALL_TIMEOUT)


async def run(client, code, sandbox_id):
    result = await client.call_tool(TOOL, {"python_code": code, "sandbox_id": sandbox_id}, raise_on_error=False)
    assert not result.is_error, result
    return result.structured_content


async def create(client):
    made = await client.call_tool("create_sandbox", {})
    return made.structured_content["sandbox_id"]


def metric(base, sample):
    """The value of one sample of the server's /metrics (`name` or `name{label="value"}`)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=CALL_TIMEOUT) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[1])
    return 0.0


# Seconds a SIGSTOPped worker may take to stop every thread, and between looks at /proc.
STOP_TIMEOUT = 10
STOP_POLL = 0.01
# The sample of interpreters held by sandboxes between calls.
IDLE_INTERPRETERS = 'mcp_run_python_interpreters{state="idle"}'


async def wait_until(condition, what, timeout=20):
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.2)


async def test_a_worker_sigkilled_between_calls_comes_back_from_its_checkpoint(warm_zygote):
    with http_server("streamable-http", "--stateful", "--workers", "1") as base:
        async with client_for(base) as client:
            await client.list_tools()
            sandbox = await create(client)
            await run(client, "import decimal\nx = 41\ndef f(n):\n    return n * 2", sandbox)
            # The sandbox's worker is among them (the others are spares, replaced).
            workers = forked_for(base.pid)
            await settled(*workers)
            for worker in workers:
                os.kill(worker, signal.SIGKILL)
            await wait_until(lambda: not set(workers) & set(forked_for(base.pid)), what="the workers to end")
            back = await run(client, "[x + 1, f(21), str(decimal.Decimal('0.5') * 2)]", sandbox)
            assert back.get("return_value") == [42, 42, "1.0"], back
            assert back["state"].startswith("restored:") and "killed from outside" in back["state"], back


async def test_writes_into_old_pages_and_grown_memory_come_back_exactly(warm_zygote):
    """Each checkpoint holds only the pages the kernel saw written since the last one
    (src/interpreter/dirty_pages.rs): a byte flipped in a page written calls ago, and memory grown
    between checkpoints, must be in them. The digest of everything comes back after SIGKILL."""
    with http_server("streamable-http", "--stateful", "--workers", "1") as base:
        async with client_for(base) as client:
            await client.list_tools()
            sandbox = await create(client)
            await run(client, "import hashlib, random\nchunks = [bytearray(random.randbytes(1 << 20))]", sandbox)
            step = (
                "chunks[0][random.randrange(len(chunks[0]))] ^= 0xFF\n"
                "chunks.append(bytearray(random.randbytes(6 << 20)))\n"
                "chunks[-2][-1] ^= 0x01\n"
                "hashlib.sha256(b''.join(chunks)).hexdigest()"
            )
            for _ in range(4):
                digest = (await run(client, step, sandbox))["return_value"]
            workers = forked_for(base.pid)
            await settled(*workers)
            for worker in workers:
                os.kill(worker, signal.SIGKILL)
            await wait_until(lambda: not set(workers) & set(forked_for(base.pid)), what="the workers to end")
            back = await run(client, "[len(chunks), hashlib.sha256(b''.join(chunks)).hexdigest()]", sandbox)
            assert back.get("return_value") == [5, digest], back
            assert back["state"].startswith("restored:"), back


async def stopped(pid):
    """Waits until every thread of `pid` is stopped (state `T` in /proc), for at most
    STOP_TIMEOUT seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + STOP_TIMEOUT
    while True:
        states = set()
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    states.add(f.read().rpartition(")")[2].split()[0])
            except OSError:
                continue
        if states <= {"T", "t"}:
            return
        assert loop.time() < deadline, f"{pid} did not stop: {states}"
        await asyncio.sleep(STOP_POLL)


async def test_a_worker_killed_before_it_took_the_call_gets_the_call_in_its_restored_state(warm_zygote):
    """The OOM killer's victim may still be exiting when the next call comes: the call is
    written into its pipe and never read. The front tells that apart from a worker that died
    running the code (the request is still unread in the pipe) and runs the call once, in a new
    interpreter restored from the checkpoint, instead of failing a call that never began."""
    with http_server("streamable-http", "--stateful", "--workers", "1") as base:
        async with client_for(base) as client:
            await client.list_tools()
            sandbox = await create(client)
            await run(client, "x = 41", sandbox)
            workers = forked_for(base.pid)
            await settled(*workers)
            # Stopped, a worker keeps its pipes open and reads nothing: the call waits unread.
            for worker in workers:
                os.kill(worker, signal.SIGSTOP)
            # kill() returns before the stop: a reader woken by it that finds the call already
            # in its pipe still reads it (pipe_read looks for data before signals), which a
            # loaded machine shows. The call is sent once every thread has stopped.
            for worker in workers:
                await stopped(worker)
            call = asyncio.create_task(run(client, "x += 1\nx", sandbox))
            await asyncio.sleep(1)
            assert not call.done()
            for worker in workers:
                os.kill(worker, signal.SIGKILL)
            back = await call
            assert back.get("return_value") == 42, back
            assert back["state"].startswith("restored:"), back
            # The call's state was checkpointed in its new interpreter.
            again = await run(client, "x", sandbox)
            assert again.get("return_value") == 42, again


async def test_an_idle_sandbox_hibernates_and_resumes_as_it_was(warm_zygote):
    args = ["--stateful", "--workers", "1", "--hibernate-after", "1"]
    with http_server("streamable-http", *args) as base:
        async with client_for(base) as client:
            await client.list_tools()
            sandbox = await create(client)
            await run(client, "import json\ndata = bytes(100 * 1024)\nx = 41", sandbox)
            # Idle once its checkpoint, taken after the answer, is kept.
            await wait_until(lambda: metric(base, IDLE_INTERPRETERS) == 1, what="the checkpoint")
            await wait_until(lambda: metric(base, "mcp_run_python_sandboxes_hibernated") == 1,
                             what="the sandbox to hibernate")
            assert metric(base, IDLE_INTERPRETERS) == 0, "its interpreter was freed"
            assert metric(base, "mcp_run_python_hibernated_bytes") > 0
            back = await run(client, "import sys\n[x + 1, len(data), 'json' in sys.modules]", sandbox)
            assert back["return_value"] == [42, 102400, True], back
            assert "state" not in back, back
            assert metric(base, "mcp_run_python_sandboxes_hibernated") == 0
            assert metric(base, "mcp_run_python_hibernations_total") >= 1
            # Forked while hibernated: the copy has the state, and the source wakes as quietly.
            await wait_until(lambda: metric(base, "mcp_run_python_sandboxes_hibernated") == 1,
                             what="the sandbox to hibernate again")
            made = await client.call_tool("fork_sandbox", {"sandbox_id": sandbox})
            copy = made.structured_content["sandbox_id"]
            assert (await run(client, "x", copy))["return_value"] == 41
            back = await run(client, "x", sandbox)
            assert back["return_value"] == 41 and "state" not in back, back
            assert not (await client.call_tool("destroy_sandbox", {"sandbox_id": copy})).is_error
            # Reset while hibernated: the state on disk goes with it.
            await wait_until(lambda: metric(base, "mcp_run_python_sandboxes_hibernated") == 1,
                             what="the sandbox to hibernate again")
            done = await client.call_tool("reset_session", {"sandbox_id": sandbox})
            assert not done.is_error, done
            assert metric(base, "mcp_run_python_sandboxes_hibernated") == 0
            assert metric(base, "mcp_run_python_hibernated_bytes") == 0
            assert (await run(client, "'x' in globals()", sandbox))["return_value"] is False


async def test_at_the_cap_an_idle_sandbox_hibernates_instead_of_ending(warm_zygote):
    """--max-sandboxes bounds awake sandboxes: a new sandbox makes the least recently used idle
    one hibernate, and that one's next call wakes it (making another hibernate), as it was."""
    args = ["--stateful", "--workers", "1", "--max-sandboxes", "1", "--hibernate-after", "3600"]
    with http_server("streamable-http", *args) as base:
        async with client_for(base) as client:
            await client.list_tools()
            a = await create(client)
            await run(client, "x = 'a'", a)
            b = await create(client)
            await run(client, "x = 'b'", b)
            assert metric(base, "mcp_run_python_sandboxes_hibernated") == 1
            assert (await run(client, "x", a))["return_value"] == "a"
            assert (await run(client, "x", b))["return_value"] == "b"
            await wait_until(lambda: metric(base, IDLE_INTERPRETERS) == 1, what="the checkpoint")

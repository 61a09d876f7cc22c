"""The per-call timing line (issue 49): with `RUST_LOG=mcp_run_python::timing=debug`, every call
of `run_python_code` logs where its time went, in the front and in its worker, and the parts add
up: the worker's time lies within the run's round trip, and the code's within the worker's. A
stateful sandbox's checkpoint is read after the answer, so it is in no call's time."""

import re
import sys

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import BINARY, SHARED_CACHE, mcp_session, run, server_env, wait_for_ready_zygote_service

pytestmark = pytest.mark.anyio

LINE = re.compile(
    r"call timing \(µs\): total (\d+) = queue (\d+) \+ interpreter (\d+) \+ scan (\d+) \+ install (\d+) "
    r"\+ run (\d+) \(frames and pipes (\d+) \+ worker (\d+) \(runtime entry and exit (\d+) \+ code (\d+)\)\) "
    r"\+ checkpoint (\d+) \+ rest (\d+)"
)
# Microseconds the sums may be off by: each part is rounded on its own.
ROUNDING = 6
# Code that takes a while inside Python, so that its share is clearly above the rest's.
SLOW_CODE = "sum(i * i for i in range(300_000))"
# The debug line of a checkpoint kept (src/server/call/checkpoints.rs), and when it was read.
KEPT = re.compile(r"checkpoint of (\d+) changed page\(s\) read (before|after) the answer")


async def test_each_call_logs_where_its_time_went(tmp_path):
    log = tmp_path / "front.log"
    params = StdioServerParameters(
        command=BINARY, args=["stdio", "--cache-dir", SHARED_CACHE],
        env={**server_env(), "RUST_LOG": "warn,mcp_run_python::timing=debug"},
    )
    with open(log, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await run(session, "1 + 1")
                assert "<return_value>\n8999955000050000\n</return_value>" in await run(session, SLOW_CODE)
    lines = [LINE.search(line) for line in log.read_text().splitlines() if "call timing" in line]
    assert len(lines) == 2 and all(lines), log.read_text()
    for match in lines:
        total, queue, interpreter, scan, install, run_us, pipes, worker, entry, code, checkpoint, rest = map(
            int, match.groups())
        # Each part is rounded down to its microsecond on its own.
        assert abs(total - (queue + interpreter + scan + install + run_us + checkpoint + rest)) <= ROUNDING, match.group(0)
        assert abs(run_us - (pipes + worker)) <= ROUNDING and abs(worker - (entry + code)) <= ROUNDING, match.group(0)
        assert worker > 0 and code > 0
    slow = lines[1].groups()
    # The slow code's own time is most of its worker's, and of its call's.
    assert int(slow[9]) * 2 > int(slow[0]), slow
    print(lines[0].group(0), file=sys.stderr)


async def test_a_stateful_calls_checkpoint_is_read_after_its_answer(tmp_path):
    """--stateful in a forked interpreter (checkpoints, docs/architecture.md §3.4): each call's
    checkpoint is asked for before its answer and read after it, so the timing line of no call
    counts one; calls sent back to back each wait for the one before's checkpoint, and see its
    state."""
    async with mcp_session("--stateful") as warming:
        await run(warming, "1")
        await anyio.to_thread.run_sync(wait_for_ready_zygote_service)
    log = tmp_path / "front.log"
    params = StdioServerParameters(
        command=BINARY, args=["stdio", "--stateful", "--cache-dir", SHARED_CACHE],
        env={**server_env(),
             "RUST_LOG": "warn,mcp_run_python::timing=debug,mcp_run_python::server::call::checkpoints=debug"},
    )
    with open(log, "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await run(session, "x = 41")
                await run(session, "x += 1\nbig = bytes(range(256)) * 4096")
                assert "<return_value>\n[\n  42,\n  1048576\n]\n</return_value>" in await run(session, "[x, len(big)]")
    text = log.read_text()
    timings = [LINE.search(line) for line in text.splitlines() if "call timing" in line]
    assert len(timings) == 3 and all(timings), text
    assert all(int(t.group(11)) == 0 for t in timings), text
    kept = [KEPT.search(line) for line in text.splitlines() if KEPT.search(line)]
    # The last call's may not be kept: the session ended with its answer.
    assert len(kept) >= 2 and {k.group(2) for k in kept} == {"after"}, text
    assert all(int(k.group(1)) > 0 for k in kept), text


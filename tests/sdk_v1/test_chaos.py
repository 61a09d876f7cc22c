"""Chaos run (tenancy, docs/architecture.md §3): 200 calls from 8 concurrent streamable-HTTP sessions on 2 workers, mixing
good calls with timeouts, crashes, memory bombs, output floods and cancellations."""

import datetime
import re
import time

import anyio
import pytest
from mcp import ClientSession, types
from mcp.client.streamable_http import streamablehttp_client

from adversary import http_server, status_of, tagged_result, vm_hwm
from conftest import child_pids

pytestmark = pytest.mark.anyio

CLIENTS = 8
CALLS = 25
OUTPUT_CAP = 65536
FRONT_PEAK_LIMIT = 400 * 2**20
TAG = re.compile(r"ok-\d+-\d+")

DESTRUCTIVE = {
    "timeout": "while True:\n    pass",
    "crash": "import os\nos._exit(1)",
    "bomb_huge": "b = bytearray(10**10)",
    "bomb_list": "l = []\nwhile True:\n    l.append(' ' * 10**6)",
    "flood_print": "for i in range(10**6):\n    print(i)",
    "flood_oswrite": "import os\nfor i in range(10**6):\n    os.write(1, b'x' * 1000 + b'\\n')",
    "cancel": "while True:\n    pass",
}
KINDS = list(DESTRUCTIVE)


def schedule(client):
    """{call index: destructive kind} for one client: three of its 25 calls, spread out."""
    positions = [3 + client % 3, 11 + client % 4, 19 + client % 5]
    return {p: KINDS[(client * 3 + j) % len(KINDS)] for j, p in enumerate(positions)}


def good_code(client, tag):
    """Prints and returns its own tag, after checking that the interpreter holds no other
    session's state (a shared interpreter would show another client's marker)."""
    return (
        "import sys\n"
        "owner = getattr(sys, 'chaos_owner', None)\n"
        f"if owner not in (None, {client!r}):\n"
        "    raise RuntimeError('state of another session: ' + repr(owner))\n"
        f"sys.chaos_owner = {client!r}\n"
        f"print({tag!r})\n"
        f"{tag!r}"
    )


async def test_chaos_200_calls_8_sessions_2_workers(tmp_path):
    """Attack: many sessions at once, each mixing good calls with every destructive call we
    know (runaway loops, `os._exit`, memory bombs, output floods above and below `sys.stdout`,
    cancelled calls). Every call must be answered (or stay cancelled), answers must never carry
    another call's tag nor another session's state, and the front's memory must stay flat."""
    failures = []
    answered = []
    cancelled = []
    late = []

    with http_server(
        "streamable_http", "--workers", "2", "--timeout", "5", "--memory", "512",
        "--output-cap", str(OUTPUT_CAP), stderr_path=tmp_path / "server.log",
    ) as base:

        async def client(n):
            plan = schedule(n)

            async def on_message(message):
                # A response whose request is gone (e.g. a cancelled call answered later).
                if isinstance(message, Exception) and "unknown request ID" in str(message):
                    late.append((n, str(message)[:300]))

            async with streamablehttp_client(f"{base}/mcp", sse_read_timeout=600) as (read, write, _):
                async with ClientSession(read, write, message_handler=on_message) as session:
                    await session.initialize()
                    for i in range(CALLS):
                        tag = f"ok-{n}-{i}"
                        kind = plan.get(i, "good")
                        code = good_code(n, tag) if kind == "good" else DESTRUCTIVE[kind]
                        if kind == "cancel":
                            await cancel_after(session, code, 1.0)
                            cancelled.append((n, i))
                            continue
                        try:
                            with anyio.fail_after(90):
                                result = await session.call_tool(
                                    "run_python_code", {"python_code": code},
                                    read_timeout_seconds=datetime.timedelta(seconds=95),
                                )
                        except Exception as e:  # noqa: BLE001 - every failure is reported below
                            failures.append((n, i, kind, f"no answer: {e!r}"))
                            continue
                        text = result.content[0].text if result.content else repr(result)
                        answered.append((n, i, kind))
                        problem = check(kind, tag, text)
                        if problem:
                            failures.append((n, i, kind, problem))

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for n in range(CLIENTS):
                tg.start_soon(client, n)
        took = time.monotonic() - started
        peak = vm_hwm(base.pid)
        print(
            f"\nchaos: {len(answered)} answered, {len(cancelled)} cancelled, {len(failures)} failures "
            f"in {took:.1f} s; front peak RSS (VmHWM) {peak / 2**20:.1f} MiB; "
            f"{len(child_pids(base.pid))} workers at the end"
        )
        by_kind = {}
        for n, i, kind, problem in failures:
            by_kind[kind] = by_kind.get(kind, 0) + 1
        if failures:
            print(f"  failures by kind of call: {by_kind}")
        for f in failures[:10]:
            print("  failure:", str(f)[:400])

    assert not failures, failures[:10]
    assert len(answered) + len(cancelled) == CLIENTS * CALLS
    assert not late, late[:5]
    assert peak < FRONT_PEAK_LIMIT, peak


def check(kind, tag, text):
    """What is wrong with the answer `text` of a call of `kind` (None when it is right)."""
    foreign = set(TAG.findall(text)) - {tag}
    if foreign:
        return f"carries other calls' tags {sorted(foreign)[:5]}: {text[:300]!r}"
    if len(text) > OUTPUT_CAP + 64 * 1024:
        return f"answer of {len(text)} bytes"
    if kind == "good":
        return None if text == tagged_result(tag) else f"not its own tag: {text[:500]!r}"
    try:
        status = status_of(text)
    except AssertionError:
        return f"not a result: {text[:300]!r}"
    if kind == "timeout" and not (status == "run-error" and "timed out" in text):
        return f"not a timeout: {text[:300]!r}"
    if kind in ("crash", "bomb_huge", "bomb_list") and status != "run-error":
        return f"not a run-error: {text[:300]!r}"
    return None


async def cancel_after(session, code, seconds):
    """Starts a call, and after `seconds` sends `notifications/cancelled` for it and stops
    waiting (the mcp 1.x client sends no cancellation by itself when a request is abandoned)."""
    request_id = session._request_id  # the id the next request gets
    async with anyio.create_task_group() as tg:

        async def start():
            await session.call_tool("run_python_code", {"python_code": code})

        tg.start_soon(start)
        await anyio.sleep(seconds)
        await session.send_notification(
            types.ClientNotification(
                types.CancelledNotification(
                    params=types.CancelledNotificationParams(requestId=request_id, reason="chaos")
                )
            )
        )
        tg.cancel_scope.cancel()

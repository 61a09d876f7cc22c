"""`--stateful` (issue 14): a session's globals last from one call to the next, never cross
sessions, and a result says when they were lost. Real binary, real `mcp` client, stdio and
streamable HTTP."""

import re
import subprocess

import pytest

from adversary import http_server, http_session, return_value, status_of
from conftest import BINARY, SHARED_CACHE, mcp_session, run, server_env

pytestmark = pytest.mark.anyio


def state_of(text):
    """The one-line `<state>` section of a result, or None."""
    found = re.search(r"^<state>(.*)</state>$", text, re.MULTILINE)
    return found and found[1]


async def test_state_lasts_within_a_session_and_says_when_it_was_lost():
    async with mcp_session("--stateful", "--timeout", "5") as session:
        tools = await session.list_tools()
        assert "State persists between calls in this session" in tools.tools[0].description
        assert return_value(await run(session, "x = 42\nimport json\ndef double(v):\n    return v * 2")) is None
        assert return_value(await run(session, "double(x)")) == "84"
        assert return_value(await run(session, "json.dumps({'y': y, 'x': x})", y=1)) == '{"y": 1, "x": 42}'
        # A function of an earlier call is quoted from that call's source in a traceback.
        await run(session, "def boom():\n    raise ValueError('from call five')")
        text = await run(session, "boom()")
        assert status_of(text) == "run-error", text
        assert "raise ValueError('from call five')" in text, text
        assert "<state>" not in text, text

        # A timeout stops the interpreter: this result and the next one say the state is gone.
        text = await run(session, "while True:\n    pass")
        assert "timed out" in text, text
        assert state_of(text).startswith("lost:"), text
        text = await run(session, "x")
        assert "NameError" in text, text
        assert state_of(text).startswith("new:"), text
        text = await run(session, "x = 1\nx")
        assert return_value(text) == "1" and "<state>" not in text, text


async def test_without_the_flag_every_call_starts_from_fresh_globals():
    async with mcp_session() as session:
        tools = await session.list_tools()
        assert "State persists" not in tools.tools[0].description
        await run(session, "x = 42")
        text = await run(session, "x")
        assert "NameError" in text and "<state>" not in text, text


async def test_state_is_the_sessions_own(tmp_path):
    with http_server("streamable_http", "--stateful", stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as a, http_session(base) as b:
            await run(a, "secret = 'A'")
            await run(b, "secret = 'B'")
            assert return_value(await run(a, "secret")) == "A"
            assert return_value(await run(b, "secret")) == "B"
        async with http_session(base) as c:
            text = await run(c, "secret")
            assert "NameError" in text, text


@pytest.mark.parametrize("args", [
    ["stdio", "--stateful", "--isolation", "call"],
    ["stdio", "--stateful", "--isolation", "shared"],
    ["streamable-http-stateless", "--stateful", "--port", "1"],
])
def test_stateful_needs_sessions_with_interpreters_of_their_own(args):
    done = subprocess.run([BINARY, *args, "--cache-dir", SHARED_CACHE], env=server_env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "--stateful" in done.stderr, done.stderr

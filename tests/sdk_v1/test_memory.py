"""The memory limit counts what a worker took beyond a fresh interpreter (issue 48; README "Limits
the front enforces"): the same code gets the same verdict, and about the same figure, in a worker
forked from the zygote service and in a booted one.

The buffers are JavaScript's (`js.Uint8Array`), outside the WebAssembly memory whose own budget
makes Python raise `MemoryError` first: they grow the engine, which only the front's watch of
the worker bounds. Counted as resident memory, a forked worker carried the zygote's ~190 MiB
from its first instruction and was stopped under a limit a booted one passed."""

import re

import pytest

from conftest import forked_session, mcp_session, run

pytestmark = pytest.mark.anyio

LIMIT_MIB = 512
# Just under the limit: more than the limit less a fresh interpreter's resident memory, so a
# limit on resident memory stops it.
UNDER_MIB = 400
# Just over the limit: the watch sees it pass while the buffer fills.
OVER_MIB = 600
# A bytearray that fits the WebAssembly budget of the limit (the limit less 224 MiB).
BYTEARRAY_UNDER_MIB = 200
# The most a figure may read above the buffer: the watch reads every 25 ms while it fills, and
# the engine's own growth comes with it.
FIGURE_SLACK_MIB = 64


def js_buffer(mib):
    """Code that fills a JavaScript buffer of `mib` MiB and holds it for a second, longer than
    the front's watch takes to see it."""
    return f"import js, time\nb = js.Uint8Array.new({mib} << 20)\nb.fill(1)\ntime.sleep(1)\nb.length >> 20"


def interpreter_session(interpreter):
    """A stdio session under the limit whose interpreters are `forked` from a ready zygote
    service, or `booted` each (`--no-zygote`)."""
    if interpreter == "forked":
        return forked_session("--memory", str(LIMIT_MIB))
    return mcp_session("--memory", str(LIMIT_MIB), "--no-zygote")


@pytest.mark.parametrize("interpreter", ["forked", "booted"])
async def test_the_limit_counts_what_the_worker_took_forked_or_booted(interpreter):
    async with interpreter_session(interpreter) as session:
        under = await run(session, js_buffer(UNDER_MIB))
        assert under == f"<status>success</status>\n<return_value>\n{UNDER_MIB}\n</return_value>", under
        over = await run(session, js_buffer(OVER_MIB))
        assert over.startswith("<status>run-error</status>"), over
        figure = re.search(rf"memory limit of {LIMIT_MIB} MiB \(it took (\d+) MiB beyond a fresh interpreter\)", over)
        assert figure, over
        assert LIMIT_MIB < int(figure[1]) <= OVER_MIB + FIGURE_SLACK_MIB, over
        assert "<return_value>\n2\n" in await run(session, "1 + 1")
        # A bytearray lives in the WebAssembly memory, whose budget (the limit less the engine's
        # allowance) makes Python raise MemoryError before the watch would stop the worker.
        small = await run(session, f"len(bytearray(b'\\x01') * ({BYTEARRAY_UNDER_MIB} << 20)) >> 20")
        assert f"<return_value>\n{BYTEARRAY_UNDER_MIB}\n" in small, small
        big = await run(session, f"b = bytearray(b'\\x01') * ({OVER_MIB} << 20)")
        assert big.startswith("<status>run-error</status>") and "MemoryError" in big, big
        assert "exceeded its memory limit" not in big, big

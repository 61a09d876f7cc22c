"""Adversarial suite for tenancy, docs/architecture.md §3: the code (and the client) is the adversary (docs/architecture.md §3, §9).

Each test reproduces one attack on the isolation between sessions, the sealed runner, the
front's deadlines and caps, or its input parsing, and asserts the behaviour that defeats it:
one interpreter per MCP session (`--isolation session`, the default), no protocol capability
reachable from user code, every phase of a call under a deadline the front enforces, and every
byte a worker produces counted against caps in the front.
"""

import os
import queue
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import httpx
import pytest

from adversary import (
    ACCEPT,
    ALLOCATE,
    AUDIT_HOOK_TRAP,
    GC_FINALIZER_TRAP,
    POISONED_SCANNER,
    PROTOCOL,
    TRIGGER,
    TWO,
    RawStdio,
    Stopped,
    answered_within,
    call,
    call_message,
    forge_code,
    http_server,
    http_session,
    raw_initialize,
    reset_peak_rss,
    return_value,
    rpc_message,
    section,
    sse_session,
    status_of,
    stdio_server_pid,
    tagged_code,
    tagged_result,
    vm_hwm,
    wait_idle_children,
    wait_until,
)
from conftest import child_pids, mcp_session, rss_bytes, zombie_pids

pytestmark = pytest.mark.anyio

MiB = 2**20


def slow_tagged(tag):
    """A call that waits on the event loop (so a pending forged run could answer in its place)
    and then prints and returns its own tag."""
    return f"import asyncio\nawait asyncio.sleep(0.5)\n" + tagged_code(tag)


# ============================================================================================
# The sealed runner


async def test_runner_is_sealed_from_user_code():
    """Attack: reach the worker protocol from user code through `js.__mcp`, the host's
    `__mcpHost`/`__host*` globals, or the runner module `sys.modules['_mcp_runner']`."""
    code = (
        "import js, sys\n"
        "names = [str(n) for n in js.Object.getOwnPropertyNames(js.globalThis)]\n"
        "[[n for n in names if n.startswith(('__mcp', '__host'))], '_mcp_runner' in sys.modules]"
    )
    async with mcp_session("--workers", "1") as session:
        for _ in range(2):  # the first call and a later one
            text = await call(session, code)
            assert return_value(text) == "[\n  [],\n  false\n]", text


async def test_forged_answer_does_not_shift_later_answers_stdio():
    """Attack: `js.__mcp.run(...)` starts a second run whose answer the front takes for the
    current call, and the real run's answer then answers the NEXT call (answers shift by one)."""
    async with mcp_session("--workers", "1") as session:
        await call(session, forge_code("A"))  # whatever it answers
        for i in range(4):
            tag = f"own-stdio-{i}"
            assert await call(session, slow_tagged(tag)) == tagged_result(tag)


@pytest.mark.parametrize("isolation", [[], ["--isolation", "shared"]], ids=["default", "shared"])
async def test_forged_answer_never_reaches_another_session(tmp_path, isolation):
    """Attack: session A forges an answer with `js.__mcp.run`; with one worker the forged run's
    answer is delivered to session B's next call (B receives A's text)."""
    with http_server("streamable_http", "--workers", "1", *isolation, stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as a, http_session(base) as b:
            assert await call(a, tagged_code("a-warm")) == tagged_result("a-warm")
            assert await call(b, tagged_code("b-warm")) == tagged_result("b-warm")
            await call(a, forge_code("A"))
            for i in range(3):
                text = await call(b, slow_tagged(f"b-{i}"))
                assert "FORGED" not in text and "decoy" not in text, text
                assert text == tagged_result(f"b-{i}")
            for i in range(2):
                assert await call(a, slow_tagged(f"a-{i}")) == tagged_result(f"a-{i}")


# ============================================================================================
# Deadlines on every phase


async def _poisoned_then_answered(trap, next_code):
    """Plants `trap`, then checks that the next call is answered within ~20 s (a timeout
    run-error or success) and that the call after it succeeds."""
    async with mcp_session("--workers", "1", "--timeout", "5") as session:
        assert await call(session, "1 + 1") == TWO
        await call(session, trap, limit=30)  # whatever it answers
        text, took = await answered_within(session, next_code, 25)
        assert took < 20, took
        status = status_of(text)
        assert status == "success" or (status == "run-error" and "timed out" in text), text
        assert await call(session, tagged_code("after-the-trap"), limit=30) == tagged_result("after-the-trap")


async def test_poisoned_import_scanner_cannot_hang_calls():
    """Attack: replace the runner's `find_imports` (found via `sys.modules['_mcp_runner']` or by
    walking `gc.get_objects()`) with an endless loop: the next call's import scan, which today
    runs without a deadline, never returns."""
    await _poisoned_then_answered(POISONED_SCANNER, "import json\n'after-poison'")


async def test_audit_hook_cannot_hang_calls():
    """Attack: `sys.addaudithook` with a hook that loops forever on the `compile` event of the
    next call's source (fired by the import scan's `ast.parse`, outside the run deadline)."""
    await _poisoned_then_answered(AUDIT_HOOK_TRAP, f"# {TRIGGER}\nimport json\n'after-hook'")


async def test_gc_finalizer_cannot_hang_calls(tmp_path):
    """Attack: a `__del__` that loops forever on an object in a reference cycle, left behind in
    the interpreter: whichever later call makes the collector run (another session's on a
    shared worker, or the planting session's next) hangs in the finalizer. The other session
    must be unaffected; the planting session's next call must be answered by the deadline."""
    with http_server("streamable_http", "--workers", "1", "--timeout", "5", stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as a:
            assert return_value(await call(a, GC_FINALIZER_TRAP)) == "trap planted"
            await anyio.sleep(1)
            async with http_session(base) as b:
                text = await call(b, ALLOCATE, limit=30)
                assert text == "<status>success</status>\n<return_value>\n200000\n</return_value>", text
            text, took = await answered_within(a, ALLOCATE, 25)
            assert took < 20, took
            status = status_of(text)
            assert status == "success" or (status == "run-error" and "timed out" in text), text
            assert await call(a, tagged_code("after-the-trap"), limit=30) == tagged_result("after-the-trap")


async def test_sigstopped_worker_between_calls_is_answered():
    """Attack: the session's worker is frozen (SIGSTOP of every child of the server) between two
    calls; the next call must be answered by the front's deadline, the one after must work."""
    with Stopped() as stopped:
        async with mcp_session("--workers", "1", "--timeout", "5") as session:
            assert await call(session, "import sys\nsys.x = 1\n1 + 1") == TWO
            server = stdio_server_pid()
            kids = child_pids(server)
            assert kids
            stopped.stop(kids)
            text, took = await answered_within(session, "import json\n'frozen'", 30)
            assert status_of(text) == "run-error", text
            assert took < 5 + 15, took
            assert await call(session, tagged_code("thawed"), limit=60) == tagged_result("thawed")


async def test_sigstopped_idle_spare_is_replaced(tmp_path):
    """Attack: an idle spare worker is frozen (SIGSTOP) before a new session's first call; that
    call must still succeed on a replacement."""
    with Stopped() as stopped, http_server("streamable_http", "--workers", "1", "--timeout", "5", stderr_path=tmp_path / "server.log") as base:
        spares = wait_idle_children(base.pid, at_least=1, timeout=90)
        stopped.stop(spares)
        async with http_session(base) as session:
            text, took = await answered_within(session, tagged_code("first-call"), 45)
            assert text == tagged_result("first-call")


# ============================================================================================
# Cross-session state


SECRET_TAIL = "5f2c9e71"
PLANT_A = f"""
import sys, gc, asyncio, js
from pyodide.ffi import create_proxy
api_token = 'tok-A-{SECRET_TAIL}'
sys.modules['__main__'].api_token = api_token
sys.api_token_holder = {{'api_token': api_token}}
sys.big_a = bytearray(api_token.encode()) * 200_000
js.globalThis.aSecret = api_token

async def _meddle():
    while True:
        print('A WAS HERE')
        for o in gc.get_objects():
            # Skips CPython's table of interned strings (every name maps to itself there):
            # rewriting it corrupts A's own interpreter, which is not what this attack is for.
            if isinstance(o, dict) and o.get('b_value', 'b_value') != 'b_value':
                o['b_value'] = 'ALTERED-BY-A'
        await asyncio.sleep(0.05)

sys.a_task = asyncio.ensure_future(_meddle())
sys.a_interval = js.setInterval(create_proxy(lambda: print('A WAS HERE')), 10)
await asyncio.sleep(0.2)
'A planted'
"""

SEARCH_B = f"""
import sys, gc, types, asyncio, js

def _search():
    needle = 'tok-A-' + {SECRET_TAIL!r}
    raw = needle.encode()
    mine = globals()
    hits = []
    for o in gc.get_objects():
        if o is mine:
            continue
        if isinstance(o, dict):
            values = list(o.keys()) + list(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            values = list(o)
        elif isinstance(o, types.CodeType):
            values = list(o.co_consts)
        elif isinstance(o, types.ModuleType):
            values = list(vars(o).values())
        else:
            continue
        for v in values:
            if (isinstance(v, str) and needle in v) or (isinstance(v, (bytes, bytearray)) and raw in v):
                hits.append(type(o).__name__)
                break
    return hits

b_value = 'B-original'
await asyncio.sleep(0.5)
print('B ran')
[_search(), b_value, hasattr(sys, 'api_token_holder'), hasattr(sys.modules['__main__'], 'api_token'),
 str(getattr(js.globalThis, 'aSecret', None))]
"""
CLEAN_B = '[\n  [],\n  "B-original",\n  false,\n  false,\n  "None"\n]'


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
async def test_no_state_crosses_sessions(tmp_path, transport):
    """Attack: session A leaves secrets in module state, JS globals and a large object, plus a
    background asyncio task and a JS setInterval that print "A WAS HERE" and rewrite other
    sessions' variables; session B (one worker on the server, so today both share it) searches
    the heap for the secret and must find nothing, see none of A's output, keep its values."""
    open_session = http_session if transport == "streamable_http" else sse_session
    with http_server(transport, "--workers", "1", "--timeout", "20", stderr_path=tmp_path / "server.log") as base:
        async with open_session(base) as a:
            text = await call(a, PLANT_A)
            assert return_value(text) == "A planted", text
            async with open_session(base) as b:
                for _ in range(2):
                    text = await call(b, SEARCH_B)
                    assert "A WAS HERE" not in text, text[:2000]
                    assert section(text, "output") == "B ran", text[:2000]
                    assert return_value(text) == CLEAN_B, text[:2000]


async def test_a_sessions_memory_does_not_starve_another(tmp_path):
    """Attack: session A keeps ~499 MiB alive in module state; on a shared worker session B's
    allocation fails or B's runaway loop is blamed on memory instead of its own timeout."""
    with http_server("streamable_http", "--workers", "1", "--memory", "900", "--timeout", "5", stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as a, http_session(base) as b:
            text = await call(a, "import sys\nsys.hog = b'\\x01' * (499 * 2**20)\nlen(sys.hog)")
            assert status_of(text) == "success", text
            text = await call(b, "b = bytearray(200 * 2**20)\nb[::4096] = b'\\x02' * len(range(0, len(b), 4096))\nlen(b)")
            assert text == f"<status>success</status>\n<return_value>\n{200 * MiB}\n</return_value>", text
            text = await call(b, "while True:\n    pass", limit=30)
            assert status_of(text) == "run-error" and "timed out" in text and "MemoryError" not in text, text
            text = await call(a, "import sys\nlen(sys.hog)")
            assert return_value(text) == str(499 * MiB), text


# ============================================================================================
# Caps enforced by the front


FLOODS = {
    "os_write": "import os\nfor i in range(10**6):\n    os.write(1, b'x' * 1000 + b'\\n')",
    "dunder_stdout": "import sys\nfor i in range(10**6):\n    sys.__stdout__.write('x' * 1000 + '\\n')",
}


@pytest.mark.parametrize("flood", sorted(FLOODS))
async def test_output_below_sys_stdout_is_capped_by_the_front(tmp_path, flood):
    """Attack: write output below Python's `sys.stdout` (C-level `os.write(1)`,
    `sys.__stdout__`), which the runner's counting stream never sees: the front keeps all of it
    and returns it, growing without bound."""
    with http_server("streamable_http", "--workers", "1", "--timeout", "5", "--output-cap", "10000", stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as session:
            assert await call(session, "1 + 1") == TWO
            before = reset_peak_rss(base.pid)
            text, took = await answered_within(session, FLOODS[flood], 30)
            assert len(text) < 64 * 1024, (len(text), text[:300])
            growth = vm_hwm(base.pid) - before
            assert growth < 100 * MiB, growth
            assert await call(session, "1 + 1", limit=60) == TWO


async def test_console_output_never_reaches_the_server_log(tmp_path):
    """Attack: `js.console.error` writes forged lines into the operator's log (the server's
    stderr), and a console flood fills it."""
    log = tmp_path / "server.log"
    with http_server("streamable_http", "--workers", "1", "--timeout", "5", "--output-cap", "10000", stderr_path=log) as base:
        async with http_session(base) as session:
            text = await call(session, "import js\njs.console.error('FORGED LOG LINE 3b9a: admin logged in')\n'logged'")
            assert status_of(text) == "success", text
            before = reset_peak_rss(base.pid)
            flood = "import js\ns = 'y' * 10000\nfor i in range(2100):\n    js.console.log(s)\n'flooded'"
            text, took = await answered_within(session, flood, 30)
            assert len(text) < 64 * 1024, len(text)
            assert vm_hwm(base.pid) - before < 100 * MiB
            assert await call(session, "1 + 1", limit=60) == TWO
        assert "FORGED LOG LINE" not in base.stderr_text()
        assert os.path.getsize(log) < MiB, os.path.getsize(log)


class _Web:
    """A local HTTP server: `/endless` streams 1.5 GiB without a length; every request's Host
    header is recorded."""

    def __init__(self):
        self.hosts = []
        web = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_GET(self):
                web.hosts.append(self.headers.get("Host"))
                if self.path == "/endless":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.end_headers()
                    chunk = b"z" * MiB
                    try:
                        for _ in range(1536):
                            self.wfile.write(chunk)
                    except OSError:
                        pass
                    return
                body = b"hello"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


async def test_fetch_body_is_capped_while_it_streams(tmp_path):
    """Attack: an allowed host answers with an endless (1.5 GiB) body; the front buffers it
    whole before checking any size, so its memory follows the attacker's stream."""
    web = _Web()
    try:
        with http_server(
            "streamable_http", "--workers", "1", "--timeout", "30",
            "--allow-net", f"127.0.0.1:{web.port}", "--max-fetch-bytes", "1048576",
            stderr_path=tmp_path / "server.log",
        ) as base:
            async with http_session(base) as session:
                assert await call(session, "1 + 1") == TWO
                reset_peak_rss(base.pid)
                code = (
                    "from pyodide.http import pyfetch\n"
                    f"r = await pyfetch('http://127.0.0.1:{web.port}/endless')\n"
                    "len(await r.bytes())"
                )
                text, took = await answered_within(session, code, 40)
                assert status_of(text) == "run-error", text[:2000]
                assert re.search(r"1048576|1 ?MiB", text), text[:2000]
                assert took < 20, took
                assert vm_hwm(base.pid) < 300 * MiB, vm_hwm(base.pid)
                assert await call(session, "1 + 1", limit=60) == TWO
    finally:
        web.close()


async def test_user_code_cannot_set_the_host_header(tmp_path):
    """Attack: user code sets `Host: evil.example` on a fetch to an allowed address, to reach a
    virtual host the operator did not allow (host-header smuggling)."""
    web = _Web()
    try:
        with http_server(
            "streamable_http", "--workers", "1", "--timeout", "20",
            "--allow-net", f"127.0.0.1:{web.port}", stderr_path=tmp_path / "server.log",
        ) as base:
            async with http_session(base) as session:
                code = (
                    "from pyodide.http import pyfetch\n"
                    f"r = await pyfetch('http://127.0.0.1:{web.port}/hello', headers={{'Host': 'evil.example'}})\n"
                    "await r.text()"
                )
                text = await call(session, code)
                assert status_of(text) in ("success", "run-error"), text
                assert not any(h and "evil.example" in h for h in web.hosts), web.hosts
    finally:
        web.close()


# ============================================================================================
# Bounded parsing and bad protocol input


PEP723_BOMB = "# /// script\n# dependencies = ['a ; " + "(" * 3000 + 'python_version > "3"' + ")" * 3000 + "']\n# ///\n1"


async def test_deeply_nested_pep723_marker_over_stdio():
    """Attack: a PEP 723 dependency marker nesting 3,000 parentheses, handed to a recursive
    parser in the front (stack overflow kills the server)."""
    async with mcp_session("--workers", "1") as session:
        text = await call(session, PEP723_BOMB, limit=30)
        assert text.startswith("<status>install-error</status>"), text[:500]
        assert await call(session, "1 + 1") == TWO


async def test_deeply_nested_pep723_marker_over_http(tmp_path):
    """Attack: the same 3,000-deep PEP 723 marker over streamable HTTP, where one crash ends
    every client's sessions."""
    with http_server("streamable_http", "--workers", "1", stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as session:
            text = await call(session, PEP723_BOMB, limit=30)
            assert text.startswith("<status>install-error</status>"), text[:500]
            assert await call(session, "1 + 1") == TWO
        async with http_session(base) as session:
            assert await call(session, "1 + 1") == TWO


async def test_invalid_utf8_line_on_stdin(tmp_path):
    """Attack: a line of invalid UTF-8 on the stdio transport ends the server's reader, so the
    session stops answering."""
    with RawStdio("--workers", "1", stderr_path=tmp_path / "server.log") as server:
        server.initialize()
        server.send_bytes(b'\xff\xfe{"bad\n')
        reply = server.wait_for(lambda m: "error" in m, 20)
        assert reply["error"]["code"] == -32700, reply
        server.call(5, "1 + 1")
        reply = server.response(5, 60)
        assert reply["result"]["content"][0]["text"] == TWO, reply


async def test_cancelled_call_frees_the_session(tmp_path):
    """Attack: the client cancels (`notifications/cancelled`) a call running `while True: pass`;
    the front keeps running it until the 60 s timeout, so the session's next call waits."""
    with RawStdio("--workers", "1", "--timeout", "60", stderr_path=tmp_path / "server.log") as server:
        server.initialize()
        server.call(2, "1 + 1")
        assert server.response(2, 60)["result"]["content"][0]["text"] == TWO
        server.call(3, "while True:\n    pass")
        time.sleep(1)
        server.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 3, "reason": "test"}})
        server.call(4, "1 + 1")
        reply = server.response(4, 10)
        assert reply["result"]["content"][0]["text"] == TWO, reply
        time.sleep(1)
        while True:
            try:
                if server.next(0.1) is None:
                    break
            except queue.Empty:
                break
        assert not [m for m in server.seen if m.get("id") == 3], server.seen


async def test_calls_of_one_session_run_in_order_on_its_interpreter(tmp_path):
    """Attack: a client pipelines two calls in one session; the second must not overtake the
    first nor run in another interpreter (on a pool of two, today it runs at once on the
    other worker and sees none of the first call's state)."""
    with RawStdio("--workers", "2", stderr_path=tmp_path / "server.log") as server:
        server.initialize()
        server.call(1, "1 + 1")
        assert server.response(1, 60)["result"]["content"][0]["text"] == TWO
        server.call(2, "import sys, asyncio\nsys.order = ['first']\nawait asyncio.sleep(1)\nsys.order.append('first done')\n'one'")
        server.call(3, "import sys\nsys.order.append('second')\nsys.order")
        first = server.response(2, 60)["result"]["content"][0]["text"]
        second = server.response(3, 60)["result"]["content"][0]["text"]
        assert return_value(first) == "one", first
        assert return_value(second) == '[\n  "first",\n  "first done",\n  "second"\n]', second


async def test_lone_surrogates_are_escaped_not_lost():
    """Attack: a lone surrogate in the return value or the output, which strict UTF-8/JSON
    layers reject (the answer is lost or the line dropped)."""
    async with mcp_session("--workers", "1") as session:
        text = await call(session, "'\\udc80'")
        assert status_of(text) == "success", text
        assert "\\udc80" in return_value(text), text
        text = await call(session, "print('a\\udc80b')")
        assert status_of(text) == "success", text
        assert "a\\udc80b" in (section(text, "output") or ""), text
        assert await call(session, "1 + 1") == TWO


async def test_huge_timer_delay_does_not_crash_the_worker():
    """Attack: `js.setTimeout(fn, 1e23)`, a delay no clock can hold (the host panics converting
    it and the worker aborts)."""
    async with mcp_session("--workers", "1") as session:
        text = await call(session, "import js\nfrom pyodide.ffi import create_proxy\njs.setTimeout(create_proxy(lambda: None), 1e23)\n1")
        assert text == "<status>success</status>\n<return_value>\n1\n</return_value>", text
        assert await call(session, "1 + 1") == TWO


# ============================================================================================
# --isolation, --max-sessions and the end of a session


SET_X = "import sys\nsys.x = 'set'\nsys.x"
GET_X = "import sys\ngetattr(sys, 'x', 'unset')"


async def test_isolation_session_is_the_default(tmp_path):
    """Attack: module state (`sys.x`) written by one session is read by another that shares its
    worker (one worker, default isolation). Within one session it must persist."""
    async with mcp_session("--workers", "1") as session:
        assert return_value(await call(session, SET_X)) == "set"
        assert return_value(await call(session, GET_X)) == "set"
    with http_server("streamable_http", "--workers", "1", stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as a, http_session(base) as b:
            assert return_value(await call(a, SET_X)) == "set"
            assert return_value(await call(b, GET_X)) == "unset"
            assert return_value(await call(a, GET_X)) == "set"
            assert return_value(await call(b, GET_X)) == "unset"


async def test_isolation_session_over_sse(tmp_path):
    """Attack: the `sys.x` leak between two legacy-SSE sessions sharing the only worker."""
    with http_server("sse", "--workers", "1", stderr_path=tmp_path / "sse.log") as base:
        async with sse_session(base) as a, sse_session(base) as b:
            assert return_value(await call(a, SET_X)) == "set"
            assert return_value(await call(a, GET_X)) == "set"
            assert return_value(await call(b, GET_X)) == "unset"


async def test_isolation_stateless_posts_are_sessions_of_their_own(tmp_path):
    """Attack: the `sys.x` leak between two stateless POSTs (each is its own session) that
    share the only worker."""
    with http_server("streamable_http_stateless", "--workers", "1", stderr_path=tmp_path / "stateless.log") as base:
        async with httpx.AsyncClient(timeout=120) as client:
            texts = []
            for i, code in enumerate([SET_X, GET_X]):
                r = await client.post(f"{base}/mcp", json=call_message(i + 1, code), headers=ACCEPT)
                assert r.status_code == 200, r.text
                texts.append(rpc_message(r)["result"]["content"][0]["text"])
            assert return_value(texts[0]) == "set"
            assert return_value(texts[1]) == "unset", texts[1]


@pytest.mark.parametrize("flag", [["--isolation", "call"], ["--fresh-worker"]], ids=["isolation-call", "fresh-worker"])
async def test_isolation_call_gives_every_call_a_new_interpreter(flag):
    """Attack: a call leaves module state for the next call of the same session; with
    `--isolation call` (alias `--fresh-worker`) nothing may persist."""
    async with mcp_session("--workers", "1", *flag) as session:
        assert return_value(await call(session, SET_X)) == "set"
        assert return_value(await call(session, GET_X)) == "unset"


async def test_isolation_shared_reuses_interpreters_across_sessions(tmp_path):
    """`--isolation shared` (trusting every client) keeps the old behaviour: with one worker a
    second session sees the first one's module state."""
    with http_server("streamable_http", "--workers", "1", "--isolation", "shared", stderr_path=tmp_path / "server.log") as base:
        async with http_session(base) as a:
            assert return_value(await call(a, SET_X)) == "set"
        async with http_session(base) as b:
            assert return_value(await call(b, GET_X)) == "set"


def _worker_holding(pid, at_least):
    """The child of `pid` whose resident memory is above `at_least` bytes (the worker of the
    session that allocated it)."""
    for kid in child_pids(pid):
        try:
            if rss_bytes(kid) > at_least:
                return kid
        except OSError:
            pass
    return None


@pytest.mark.parametrize("transport", ["streamable_http", "sse"])
async def test_ending_a_session_kills_and_reaps_its_worker(tmp_path, transport):
    """Attack: a session's interpreter (with what it holds) outlives the session (HTTP DELETE or
    SSE disconnect) and serves the next client."""
    open_session = http_session if transport == "streamable_http" else sse_session
    with http_server(transport, "--workers", "1", stderr_path=tmp_path / "server.log") as base:
        async with open_session(base) as a:
            text = await call(a, "import sys\nsys.hog = b'\\x03' * (300 * 2**20)\nlen(sys.hog)")
            assert status_of(text) == "success", text
            worker = _worker_holding(base.pid, 420 * MiB)  # an idle worker is ~240 MiB
            assert worker is not None
        gone = await wait_until(lambda: worker not in child_pids(base.pid) and worker not in zombie_pids(base.pid), 15)
        assert gone, f"worker {worker} of the ended session is still a child of the server"
        async with open_session(base) as b:
            assert return_value(await call(b, "import sys\nhasattr(sys, 'hog')")) == "false"
        # B's worker too is killed and reaped once B ends.
        assert await wait_until(lambda: zombie_pids(base.pid) == [], 15), zombie_pids(base.pid)


async def test_max_sessions_rejects_new_sessions_until_one_ends(tmp_path):
    """Attack: a client opens sessions without end (each one holds an interpreter); beyond
    `--max-sessions` a new `initialize` gets 503 with a JSON-RPC error, and DELETE frees room."""
    with http_server("streamable_http", "--workers", "1", "--max-sessions", "2", stderr_path=tmp_path / "server.log") as base:
        async with httpx.AsyncClient(timeout=60) as client:
            sids = []
            for _ in range(2):
                r = await raw_initialize(client, base)
                assert r.status_code == 200, r.text
                sids.append(r.headers["mcp-session-id"])
            r = await raw_initialize(client, base)
            assert r.status_code == 503, (r.status_code, r.text)
            body = r.json()
            assert body["jsonrpc"] == "2.0" and "error" in body and isinstance(body["error"]["code"], int), body
            r = await client.delete(f"{base}/mcp", headers={**ACCEPT, "Mcp-Session-Id": sids[0], "Mcp-Protocol-Version": PROTOCOL})
            assert r.status_code in (200, 202, 204), r.text
            r = await raw_initialize(client, base)
            assert r.status_code == 200, r.text
            sid = r.headers["mcp-session-id"]
            r = await client.post(f"{base}/mcp", json=call_message(2, "1 + 1"),
                                  headers={**ACCEPT, "Mcp-Session-Id": sid, "Mcp-Protocol-Version": PROTOCOL})
            assert rpc_message(r)["result"]["content"][0]["text"] == TWO

"""Every call is answered and bounded (docs/architecture.md §9): memory, crashes and exits, output floods,
host isolation, the network policy, fresh workers, and a mixed stress run."""

import json
import os
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anyio
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamablehttp_client

from conftest import SHARED_CACHE, child_pids, http_server, mcp_session, rss_bytes, run, zombie_pids

pytestmark = pytest.mark.anyio

TWO = "<status>success</status>\n<return_value>\n2\n</return_value>"


async def test_memory_bombs_and_a_flat_front():
    with http_server("streamable_http", "--workers", "1", "--memory", "512") as base:
        async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                assert await run(session, "1 + 1") == TWO
                front_before = rss_bytes(base.pid)

                text = await run(session, "b = bytearray(10**10)")
                assert text.startswith("<status>run-error</status>"), text
                text = await run(session, "b = bytearray(600 * 2**20)")
                assert text.startswith("<status>run-error</status>") and "MemoryError" in text, text
                text = await run(session, "l = []\nwhile True:\n    l.append(' ' * 10**6)")
                assert text.startswith("<status>run-error</status>") and "MemoryError" in text, text
                assert await run(session, "1 + 1") == TWO

                # The server itself did not grow with the sandbox's allocations.
                assert rss_bytes(base.pid) < front_before + 64 * 2**20


async def test_exits_aborts_and_crashes_are_results():
    with http_server("streamable_http", "--workers", "1") as base:
        async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                for code, expected in [
                    ("import sys\nsys.exit(3)", "SystemExit: 3"),
                    ("import os\nos._exit(1)", "exit(1)"),
                    ("import os\nos.abort()", "aborted"),
                    ("import js\njs.eval('throw new Error(\"from the runtime\")')", "from the runtime"),
                ]:
                    text = await run(session, code)
                    assert text.startswith("<status>run-error</status>"), text
                    assert expected in text, text
                    assert await run(session, "1 + 1") == TWO

                # A worker killed from outside mid-call: the call is answered, the next works.
                async def killer():
                    await anyio.sleep(2)
                    for pid in child_pids(base.pid):
                        os.kill(pid, signal.SIGKILL)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(killer)
                    text = await run(session, "import time\ntime.sleep(30)")
                assert text.startswith("<status>run-error</status>") and "stopped unexpectedly" in text, text
                assert await run(session, "1 + 1") == TWO
        deadline = time.monotonic() + 120
        while len(child_pids(base.pid)) != 1 and time.monotonic() < deadline:
            await anyio.sleep(0.5)
        assert len(child_pids(base.pid)) == 1


async def test_output_flood_is_truncated():
    async with mcp_session("--workers", "1", "--timeout", "300") as session:
        text = await run(session, "for i in range(10**7):\n    print(i)\n'done'")
        assert text.startswith("<status>success</status>\n<output>\n0\n1\n2\n"), text[:200]
        assert "[output truncated: more than 1048576 bytes were written]\n</output>" in text
        assert text.endswith("<return_value>\ndone\n</return_value>")
        assert len(text) < 1100 * 1024


class _Hello(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the host"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


async def test_no_host_access_and_the_network_policy():
    web = ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{web.server_address[1]}/"
    fetch = f"from pyodide.http import pyfetch\nr = await pyfetch({url!r})\nawait r.text()"
    os.environ["MCP_RUN_PYTHON_TEST_SECRET"] = "host-secret"
    try:
        async with mcp_session("--workers", "1") as session:
            text = await run(session, "open('/etc/passwd').read()")
            assert "FileNotFoundError" in text, text
            text = await run(
                session,
                f"import os, json\njson.dumps([dict(os.environ), os.path.exists({SHARED_CACHE!r}), "
                f"os.path.exists('/root'), os.path.exists('/work')])",
            )
            environ, cache_visible, root_visible, work_visible = json.loads(text.split("<return_value>\n")[1].split("\n</return_value>")[0])
            assert not (cache_visible or root_visible or work_visible)
            # Only Pyodide's own defaults: nothing of the server's environment.
            assert "MCP_RUN_PYTHON_TEST_SECRET" not in environ
            assert environ.get("PATH") != os.environ.get("PATH")
            assert set(environ.values()).isdisjoint({os.environ.get("PATH"), os.environ.get("HOME"), "host-secret"})
            text = await run(session, fetch)
            assert text.startswith("<status>run-error</status>") and "not allowed" in text, text
            text = await run(session, "import urllib.request\nurllib.request.urlopen(" + repr(url) + ")")
            assert text.startswith("<status>run-error</status>"), text
        async with mcp_session("--workers", "1", "--allow-net", "127.0.0.1") as session:
            text = await run(session, fetch)
            assert text.endswith("<return_value>\nhello from the host\n</return_value>"), text
            text = await run(session, f"from pyodide.http import open_url\nopen_url({url!r}).read()")
            assert text.endswith("<return_value>\nhello from the host\n</return_value>"), text
            text = await run(session, "from pyodide.http import pyfetch\nawait pyfetch('http://localhost:9/')")
            assert "network access to localhost is not allowed" in text, text
    finally:
        del os.environ["MCP_RUN_PYTHON_TEST_SECRET"]
        web.shutdown()


async def test_fresh_worker_gives_a_new_interpreter():
    set_marker = "import builtins\nbuiltins.marker = 'set'\nbuiltins.marker"
    check = "import builtins\nhasattr(builtins, 'marker')"
    async with mcp_session("--workers", "1") as session:
        await run(session, set_marker)
        assert (await run(session, check)).endswith("<return_value>\ntrue\n</return_value>")
    async with mcp_session("--workers", "1", "--fresh-worker") as session:
        await run(session, set_marker)
        assert (await run(session, check)).endswith("<return_value>\nfalse\n</return_value>")


async def test_stress_mixed_calls_on_two_workers():
    bad = {
        (0, 5): ("while True:\n    pass", "timed out after 3 s"),
        (1, 12): ("import os\nos._exit(1)", "exit(1)"),
        (2, 8): ("l = []\nwhile True:\n    l.append(' ' * 10**6)", "MemoryError"),
        (3, 20): ("import os\nos.abort()", "aborted"),
        (4, 3): ("import sys\nsys.exit(2)", "SystemExit: 2"),
        (5, 17): ("while True:\n    pass", "timed out after 3 s"),
        (6, 9): ("b = bytearray(600 * 2**20)", "MemoryError"),
        (7, 14): ("1/0", "ZeroDivisionError"),
    }
    with http_server("streamable_http", "--workers", "2", "--timeout", "3", "--memory", "512") as base:
        async def client(n):
            async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    for i in range(25):
                        if (n, i) in bad:
                            code, expected = bad[(n, i)]
                            text = await run(session, code)
                            assert text.startswith("<status>run-error</status>") and expected in text, (n, i, text)
                        else:
                            text = await run(session, f"{n} * 1000 + {i}")
                            assert text == f"<status>success</status>\n<return_value>\n{n * 1000 + i}\n</return_value>", (n, i, text)

        async with anyio.create_task_group() as tg:
            for n in range(8):
                tg.start_soon(client, n)
        deadline = time.monotonic() + 120
        while (len(child_pids(base.pid)), zombie_pids(base.pid)) != (2, []) and time.monotonic() < deadline:
            await anyio.sleep(0.5)
        assert len(child_pids(base.pid)) == 2
        assert zombie_pids(base.pid) == []

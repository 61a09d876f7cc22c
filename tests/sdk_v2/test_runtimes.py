"""One server, both runtimes (docs/architecture.md §5.4): `create_sandbox(runtime=...)` gives a
sandbox of the runtime asked for, whatever the server's own (`--runtime`), over today's
sessionless streamable HTTP with fastmcp 4's `Client`. The other runtime is made ready when
the first sandbox asks for it; a sandbox keeps its runtime through its calls, a fork and a
replica that takes it over from the state directory."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from mcp.shared.exceptions import MCPError

from conftest import CALL_TIMEOUT, INIT_TIMEOUT, TOOL, http_server
from test_scientific_code_mode import SCIENTIFIC_CACHE, scientific_ready  # noqa: F401 (the fixture)

pytestmark = pytest.mark.anyio

# What a sandbox of each runtime says of itself: its Python, and a module only it has.
WHICH = """
import sys, importlib.util
[list(sys.version_info[:2]), importlib.util.find_spec("js") is not None, importlib.util.find_spec("numpy") is not None]
"""
PYODIDE = [[3, 14], True, False]
SCIENTIFIC = [[3, 15], False, True]


def client_for(base):
    return Client(StreamableHttpTransport(f"{base}/mcp"), init_timeout=INIT_TIMEOUT, timeout=CALL_TIMEOUT)


async def create(client, **arguments):
    """create_sandbox; the handle and the answer's text."""
    made = await client.call_tool("create_sandbox", arguments)
    assert not made.is_error, made
    return made.structured_content["sandbox_id"], made.content[0].text


async def run(client, sandbox_id, code):
    """run_python_code in the sandbox; its return value."""
    result = await client.call_tool(TOOL, {"python_code": code, "sandbox_id": sandbox_id})
    assert not result.is_error, result
    assert result.structured_content["status"] == "success", result.content[0].text
    return result.structured_content.get("return_value")


async def test_a_pyodide_server_makes_scientific_sandboxes(tmp_path):
    with http_server("streamable-http", "--stateful", cache_dir=SCIENTIFIC_CACHE) as base:
        async with client_for(base) as client:
            tools = {t.name: t for t in await client.list_tools()}
            offered = tools["create_sandbox"].input_schema["properties"]["runtime"]
            assert offered["enum"] == ["pyodide", "scientific"] and "numpy" in offered["description"], offered
            # The server's own runtime is Pyodide, as its tool says.
            assert "Pyodide" in tools[TOOL].description

            plain, text = await create(client)
            assert "runtime" not in text, text
            science, text = await create(client, runtime="scientific")
            assert "(scientific runtime)" in text, text
            assert await run(client, plain, WHICH) == PYODIDE
            assert await run(client, science, WHICH) == SCIENTIFIC

            # State lasts from call to call, and a fork copies it in the same runtime.
            await run(client, science, "import pandas as pd\ndf = pd.DataFrame({'a': range(5)})")
            assert await run(client, science, "int(df.a.sum())") == 10
            forked = await client.call_tool("fork_sandbox", {"sandbox_id": science})
            assert not forked.is_error, forked
            copy = forked.structured_content["sandbox_id"]
            assert await run(client, copy, "int(df.a.max())") == 4
            assert await run(client, copy, WHICH) == SCIENTIFIC

            # A sandbox's dependencies are checked against what the scientific runtime has.
            refused = await client.call_tool(
                "create_sandbox", {"runtime": "scientific", "dependencies": ["humanize"]}, raise_on_error=False)
            assert refused.is_error, refused
            assert "installs nothing, and has no humanize" in refused.content[0].text, refused
            satisfied, _ = await create(client, runtime="scientific", dependencies=["scipy"])
            assert await run(client, satisfied, "import scipy\nscipy.__name__") == "scipy"

            # An unknown runtime is an invalid argument.
            with pytest.raises(MCPError, match="unknown variant `jython`, expected `pyodide` or `scientific`"):
                await client.call_tool("create_sandbox", {"runtime": "jython"})


async def test_a_scientific_server_makes_pyodide_sandboxes():
    with http_server("streamable-http", "--stateful", "--runtime", "scientific", cache_dir=SCIENTIFIC_CACHE) as base:
        async with client_for(base) as client:
            own, _ = await create(client)
            pyodide, text = await create(client, runtime="pyodide", dependencies=["humanize"])
            assert "(pyodide runtime)" in text, text
            assert await run(client, own, WHICH) == SCIENTIFIC
            assert await run(client, pyodide, WHICH) == PYODIDE
            # Pyodide's sandbox installs from the index, as on a Pyodide server.
            assert await run(client, pyodide, "import humanize\nhumanize.intcomma(1234)") == "1,234"


async def test_a_runtime_the_server_cannot_give_makes_no_sandbox(tmp_path):
    """`--mount` is the Pyodide runtime's: a scientific sandbox is refused in words, and the
    server goes on making its own."""
    (tmp_path / "data").mkdir()
    mount = f"{tmp_path / 'data'}:/data"
    with http_server("streamable-http", "--stateful", "--mount", mount, cache_dir=SCIENTIFIC_CACHE) as base:
        async with client_for(base) as client:
            refused = await client.call_tool("create_sandbox", {"runtime": "scientific"}, raise_on_error=False)
            assert refused.is_error, refused
            assert refused.content[0].text == (
                "the sandbox was not made: the scientific runtime cannot be had on this server: the scientific "
                "runtime has its packages built in and boots plainly: --deps and --mount are the Pyodide runtime's"), refused
            plain, _ = await create(client)
            assert await run(client, plain, WHICH) == PYODIDE


class _Csv(BaseHTTPRequestHandler):
    """Any GET: a small CSV, with the `Authorization` it came with as its last row (kept in
    `seen` too)."""

    seen = []

    def do_GET(self):
        self.seen.append(self.headers.get("Authorization"))
        body = f"a,b\n1,2\n3,4\n{self.headers.get('Authorization')},0\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


async def test_a_scientific_sandbox_reaches_the_allowed_hosts_through_the_front():
    """The scientific runtime's HTTP goes through its door to the front, under the same policy as
    Pyodide's: `urllib.request` and `pandas.read_csv(url)` reach an allowed host, with a
    `--secret` put in on the way and masked on the way back; another host is refused in the
    front's words; a sandbox's own `allow_net` narrows it."""
    site = ThreadingHTTPServer(("127.0.0.1", 0), _Csv)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{site.server_address[1]}"
    code = f"""
import os, urllib.request, pandas as pd
url = "http://{host}/data.csv"
frame = pd.read_csv(url, storage_options={{"Authorization": os.environ["KEY"]}})
try:
    urllib.request.urlopen("http://example.org/")
except OSError as e:
    refused = str(e)
[int(frame["b"].sum()), frame["a"].iloc[-1], refused]
"""
    secret = "s3cret-value-for-scientific"
    try:
        with http_server("streamable-http", "--stateful", "--allow-net", host, "--secret", f"KEY=SCIENTIFIC_TEST_KEY@{host}",
                         cache_dir=SCIENTIFIC_CACHE, env={"SCIENTIFIC_TEST_KEY": secret}) as base:
            async with client_for(base) as client:
                described = next(t for t in await client.list_tools() if t.name == TOOL).description
                assert "urllib.request" in described and host in described, described
                science, _ = await create(client, runtime="scientific")
                total, key, refused = await run(client, science, code)
                # The host got the value; the sandbox saw its echo as the placeholder.
                assert total == 6 and key == "MCP_SECRET_KEY" and _Csv.seen == [secret], (key, _Csv.seen)
                assert "network access to example.org is not allowed in the sandbox" in refused, refused
                closed, _ = await create(client, runtime="scientific", allow_net=[])
                answer = await run(client, closed, f"import urllib.request\ntry:\n    urllib.request.urlopen('http://{host}/')\n"
                                                   "except OSError as e:\n    r = str(e)\nr")
                assert "not allowed in this sandbox (create_sandbox's allow_net narrowed it to no host)" in answer, answer
    finally:
        site.shutdown()


async def test_a_replica_takes_over_a_scientific_sandbox_in_its_runtime(tmp_path):
    """The state directory records the sandbox's runtime: a replica of the Pyodide runtime
    that takes it over gives it a scientific worker, with its files."""
    state = ["--state-dir", str(tmp_path / "state")]
    with http_server("streamable-http", "--stateful", *state, cache_dir=SCIENTIFIC_CACHE) as base:
        async with client_for(base) as client:
            science, _ = await create(client, runtime="scientific")
            await run(client, science, "open('kept.txt', 'w').write('42')")
    with http_server("streamable-http", "--stateful", *state, cache_dir=SCIENTIFIC_CACHE) as base:
        async with client_for(base) as client:
            # The tool list tells the client which argument travels as a header.
            await client.list_tools()
            assert await run(client, science, WHICH) == SCIENTIFIC
            assert await run(client, science, "open('kept.txt').read()") == "42"

"""One server, both runtimes (docs/architecture.md §5.4): `create_sandbox(runtime=...)` gives a
sandbox of the runtime asked for, whatever the server's own (`--runtime`), over today's
sessionless streamable HTTP with fastmcp 4's `Client`. The other runtime is made ready when
the first sandbox asks for it; a sandbox keeps its runtime through its calls, a fork and a
replica that takes it over from the state directory."""

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


async def test_a_runtime_the_server_cannot_give_makes_no_sandbox():
    """`--allow-net` is the Pyodide runtime's: a scientific sandbox is refused in words, and the
    server goes on making its own."""
    with http_server("streamable-http", "--stateful", "--allow-net", "127.0.0.1:9", cache_dir=SCIENTIFIC_CACHE) as base:
        async with client_for(base) as client:
            refused = await client.call_tool("create_sandbox", {"runtime": "scientific"}, raise_on_error=False)
            assert refused.is_error, refused
            assert refused.content[0].text == (
                "the sandbox was not made: the scientific runtime cannot be had on this server: "
                "the scientific runtime has no network yet: --allow-net is the Pyodide runtime's"), refused
            plain, _ = await create(client)
            assert await run(client, plain, WHICH) == PYODIDE


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

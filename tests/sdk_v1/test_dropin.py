"""Drop-in for the Deno original's users (README "Differences from the Deno original"): its command line, its exact texts, progress
for long calls. The reference is the original's release 0.0.22 and its own test suite; the
seed (`<dependencies>` in XML, dependencies inferred from imports) wins where they differ."""

import asyncio
import datetime
import json
import subprocess

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

from conftest import BINARY, SHARED_CACHE, CALL_TIMEOUT, http_server, mcp_session, run, server_env

pytestmark = pytest.mark.anyio

UNDEFINED_XML = """\
<status>run-error</status>
<error>
Traceback (most recent call last):
  File "main.py", line 1, in <module>
    print(unknown)
          ^^^^^^^
NameError: name 'unknown' is not defined

</error>"""


def help_text():
    return subprocess.run([BINARY, "--help"], capture_output=True, text=True, check=True).stdout


def test_the_originals_command_line_is_accepted():
    """`streamable-http`, `streamable-http-stateless` (hyphens), `--dependencies`,
    `--disable-networking`, `--verbose` and `--version` exist, and `--help` says what
    `--disable-networking` does here."""
    text = help_text()
    for word in ["streamable-http", "streamable-http-stateless", "--dependencies", "--disable-networking", "--verbose"]:
        assert word in text, word
    assert "no network unless" in text
    version = subprocess.run([BINARY, "--version"], capture_output=True, text=True, check=True).stdout
    assert version.startswith("mcp-run-python ")
    # Unknown options still fail; known ones parse (`warmup` would boot, so ask for help only).
    for args in (["streamable-http", "--help"], ["streamable-http-stateless", "--dependencies", "x", "--help"],
                 ["stdio", "--disable-networking", "--verbose", "--help"]):
        assert subprocess.run([BINARY, *args], capture_output=True).returncode == 0, args
    assert subprocess.run([BINARY, "stdio", "--no-such-option"], capture_output=True).returncode == 2


@pytest.mark.parametrize("mode", ["streamable-http", "streamable-http-stateless"])
async def test_hyphenated_http_modes_serve(mode):
    with http_server(mode, "--workers", "1", "--dependencies", "", "--disable-networking") as base:
        async with streamablehttp_client(f"{base}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                assert await run(session, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"


async def test_verbose_logs_one_line_per_installed_package(tmp_path):
    """`--verbose` turns on debug logs on stderr, with one line per package installed."""
    log = tmp_path / "stderr.log"
    with log.open("w") as errlog:
        async with mcp_session("--workers", "1", "--verbose", errlog=errlog) as session:
            text = await run(session, "import humanize\nhumanize.intcomma(1000)")
            assert text.endswith("<return_value>\n1,000\n</return_value>"), text
    lines = [l for l in log.read_text().splitlines() if "install: " in l]
    assert any('"humanize"' in l for l in lines), log.read_text()[-2000:]
    assert any("DEBUG" in l for l in log.read_text().splitlines())


async def test_tracebacks_name_main_py_and_keep_the_final_newline():
    async with mcp_session("--workers", "1") as session:
        assert await run(session, "print(unknown)") == UNDEFINED_XML
        # A SyntaxError as CPython prints it, without Pyodide frames or a traceback header.
        assert await run(session, "def broken(:\n    pass") == (
            "<status>run-error</status>\n<error>\n"
            '  File "main.py", line 1\n    def broken(:\n               ^\nSyntaxError: invalid syntax\n\n</error>'
        )


async def test_tool_listing_matches_the_original():
    async with mcp_session("--workers", "1") as session:
        tools = (await session.list_tools()).tools
        assert [t.name for t in tools] == ["run_python_code"]
        tool = tools[0]
        assert tool.title == "Run Python code"
        assert tool.description.startswith(
            "Tool to execute Python code and return stdout, stderr, and return value.\n\n"
            "The code may be async, and the value on the last line will be returned as the return value.\n\n"
            "The code will be executed with Python 3.14"
        )
        # Exactly the original's input schema (its own test's snapshot).
        assert tool.inputSchema == {
            "type": "object",
            "properties": {
                "python_code": {"type": "string", "description": "Python code to run"},
                "global_variables": {
                    "type": "object",
                    "additionalProperties": {},
                    "default": {},
                    "description": "Map of global variables in context when the code is executed",
                },
            },
            "required": ["python_code"],
            "additionalProperties": False,
            "$schema": "http://json-schema.org/draft-07/schema#",
        }


async def test_json_mode_has_exactly_the_originals_keys():
    async with mcp_session("--workers", "1", "--return-mode", "json") as session:
        assert await run(session, "print('hi')\n{'b': 1, 'a': [1, 2]}") == (
            '{"status":"success","output":["hi"],"return_value":{"b":1,"a":[1,2]}}'
        )
        assert await run(session, "None") == '{"status":"success","output":[],"return_value":null}'
        text = await run(session, "print(unknown)")
        assert json.loads(text) == {
            "status": "run-error",
            "output": [],
            "error": UNDEFINED_XML.split("<error>\n")[1].split("\n</error>")[0],
        }
        assert text.startswith('{"status":"run-error","output":[],"error":"Traceback')
        assert text.endswith('is not defined\\n"}')
        # Imports inferred: the XML shows <dependencies>, the JSON (as the original) does not.
        text = await run(session, "import humanize\n1")
        assert json.loads(text) == {"status": "success", "output": [], "return_value": 1}


async def test_progress_is_reported_for_long_calls():
    """A `tools/call` with a progress token gets `notifications/progress` while it runs, so that
    clients that reset their read timeout on progress keep waiting."""
    received = []

    async def on_progress(progress, total, message):
        received.append((progress, total, message))

    async with mcp_session("--workers", "1") as session:
        result = await session.call_tool(
            "run_python_code",
            {"python_code": "import time\ntime.sleep(5)\n'slept'"},
            read_timeout_seconds=datetime.timedelta(seconds=CALL_TIMEOUT),
            progress_callback=on_progress,
        )
        assert result.content[0].text == "<status>success</status>\n<return_value>\nslept\n</return_value>"
        assert len(received) >= 2, received
        progress = [p for p, _, _ in received]
        assert progress == sorted(progress) and len(set(progress)) == len(progress), received
        assert all(total is None for _, total, _ in received)
        assert "running for" in received[0][2]
        # Without a token, none is sent (the client would reject an unknown token).
        received.clear()
        text = await run(session, "import time\ntime.sleep(3)\n1")
        assert text.endswith("1\n</return_value>") and received == []

"""The seed's "Direct Usage" flow and the result format, over stdio with the real `mcp` client."""

import re

import pytest

from conftest import mcp_session, run

pytestmark = pytest.mark.anyio

EXPECTED_SCHEMA = {
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


async def test_direct_usage_and_result_format(tmp_path):
    errlog_path = tmp_path / "server.log"
    with open(errlog_path, "w") as errlog:
        async with mcp_session("--workers", "1", errlog=errlog) as session:
            tools = await session.list_tools()
            assert len(tools.tools) == 1
            assert tools.tools[0].name == "run_python_code"
            assert tools.tools[0].inputSchema == EXPECTED_SCHEMA
            assert "3.14" in tools.tools[0].description

            text = await run(session, "a = [1, 2, 3]\nprint(a)\na")
            assert text == (
                "<status>success</status>\n"
                "<output>\n[1, 2, 3]\n</output>\n"
                "<return_value>\n[\n  1,\n  2,\n  3\n]\n</return_value>"
            )

            # Interleaved stdout and stderr keep the order they were written in.
            text = await run(
                session,
                "import sys\nprint('one')\nprint('two', file=sys.stderr)\nprint('three')\n"
                "sys.stderr.write('four\\n')\nprint('five')",
            )
            assert text == "<status>success</status>\n<output>\none\ntwo\nthree\nfour\nfive\n</output>"

            # Return values: dict, None (no section), str as is, and an object JSON cannot hold.
            text = await run(session, "{'a': 1, 'b': [True, None]}")
            assert text.endswith('<return_value>\n{\n  "a": 1,\n  "b": [\n    true,\n    null\n  ]\n}\n</return_value>')
            assert await run(session, "x = 1") == "<status>success</status>"
            assert await run(session, "None") == "<status>success</status>"
            assert await run(session, "'hello\\nworld'") == (
                "<status>success</status>\n<return_value>\nhello\nworld\n</return_value>"
            )
            text = await run(session, "class Thing:\n    pass\nThing()")
            assert re.search(r"<return_value>\n<__main__\.Thing object at 0x[0-9a-f]+>\n</return_value>$", text), text

            # global_variables are bound in the code's globals.
            text = await run(session, "f'{name} is {age}'", name="Ada", age=36)
            assert text.endswith("<return_value>\nAda is 36\n</return_value>")

            # Top-level await and asyncio.
            text = await run(session, "import asyncio\nawait asyncio.sleep(0.01)\n'slept'")
            assert text.endswith("<return_value>\nslept\n</return_value>")

            # Closing tags in output are escaped.
            text = await run(session, "print('</output> and <return_value>')")
            assert "&lt;/output&gt; and <return_value>" in text

            # Errors: traceback without Pyodide-internal frames; the server keeps working.
            text = await run(session, "def f():\n    return 1 / 0\nf()")
            assert text.startswith("<status>run-error</status>\n<error>\nTraceback (most recent call last):")
            assert "ZeroDivisionError: division by zero" in text
            assert "return 1 / 0" in text
            assert "_pyodide" not in text and "/lib/python" not in text
            text = await run(session, "def broken(:\n    pass")
            assert text.startswith("<status>run-error</status>")
            assert "SyntaxError" in text and "_pyodide" not in text
            text = await run(session, "import sys\nsys.exit(3)")
            assert text.startswith("<status>run-error</status>") and "SystemExit: 3" in text

            # Fresh globals per call, but the same interpreter (no second boot).
            await run(session, "defined_before = 1\nimport builtins\nbuiltins._boot_marker = 'kept'")
            text = await run(session, "import builtins\n[('defined_before' in globals()), builtins._boot_marker, __name__]")
            assert text.endswith('<return_value>\n[\n  false,\n  "kept",\n  "__main__"\n]\n</return_value>')
            assert await run(session, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"
    boots = errlog_path.read_text().count("sandbox worker ready")
    assert boots == 1, errlog_path.read_text()


async def test_json_return_mode():
    async with mcp_session("--workers", "1", "--return-mode", "json") as session:
        import json

        data = json.loads(await run(session, "print('hi')\n{'x': [1, 2]}"))
        assert data == {"status": "success", "output": ["hi"], "return_value": {"x": [1, 2]}}
        data = json.loads(await run(session, "'text'"))
        assert data["return_value"] == "text"
        data = json.loads(await run(session, "1/0"))
        assert data["status"] == "run-error" and "ZeroDivisionError" in data["error"]
        assert "return_value" not in data


async def test_bad_arguments_get_mcp_errors():
    async with mcp_session("--workers", "1", "--max-code-size", "100") as session:
        for arguments, message in [
            ({"python_code": 5}, "expected a string"),
            ({}, "missing field `python_code`"),
            ({"python_code": "1", "other": 1}, "unknown field `other`"),
            ({"python_code": "1", "sandbox_id": "sbx_x"}, "unknown field `sandbox_id`"),
            ({"python_code": "1", "global_variables": [1]}, "expected a map"),
            ({"python_code": "x" * 101}, "more than the limit"),
        ]:
            with pytest.raises(Exception, match=message):
                await session.call_tool("run_python_code", arguments)
        with pytest.raises(Exception, match="unknown tool"):
            await session.call_tool("no_such_tool", {"python_code": "1"})
        assert await run(session, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"


# Python's randomness (`os.urandom`, and so `random.seed()`, `secrets`, `uuid4`) is read through
# `crypto.getRandomValues`, which runtime/js/bootstrap.js serves from the OS's getrandom in one
# call; build.rs takes Emscripten off its "shell" path, which read it through a base64 command
# line at ~0.5 µs a byte. The code counts the bytes the function gave.
RANDOM_SOURCE = """
import js, os
js.eval('''(() => {
  const give = crypto.getRandomValues;
  globalThis.__given = 0;
  crypto.getRandomValues = (view) => { globalThis.__given += view.byteLength; return give(view); };
})()''')
first, second = os.urandom(4096), os.urandom(4096)
[js.__given, len(first), first != second]
"""


async def test_python_reads_randomness_from_crypto_get_random_values():
    async with mcp_session() as session:
        text = await run(session, RANDOM_SOURCE)
    assert "<return_value>\n[\n  8192,\n  4096,\n  true\n]\n</return_value>" in text, text

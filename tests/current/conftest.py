"""Helpers for the current line of clients (mcp 2.x, PydanticAI 2.x, fastmcp): start the real
binary over stdio or on a free loopback port. Self-contained: nothing is imported from
tests/python, which runs in the other venv with the 1.x line."""

import contextlib
import os
import pathlib
import socket
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = os.environ.get("MCP_RUN_PYTHON_BIN") or str(ROOT / "target" / "debug" / "mcp-run-python")
# The same download cache (and Pyodide memory snapshot) as tests/python, so nothing is fetched twice.
SHARED_CACHE = os.environ.get("MCP_RUN_PYTHON_TEST_CACHE") or str(ROOT / "target" / "test-cache")
# Generous: the first worker boot of a debug build without a snapshot takes 10-15 s.
INIT_TIMEOUT = 60
CALL_TIMEOUT = 300

STDIO_ARGS = ["stdio", "--workers", "1", "--cache-dir", SHARED_CACHE]

TOOL = "run_python_code"
CODE = "print('hi')\n[1, 2]"
EXPECTED = "<status>success</status>\n<output>\nhi\n</output>\n<return_value>\n[\n  1,\n  2\n]\n</return_value>"
ERROR_CODE = "1/0"
ERROR_PREFIX = "<status>run-error</status>"


@pytest.fixture(scope="session")
def anyio_backend():
    return "asyncio"


def server_env():
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if "RUST_LOG" in os.environ:
        env["RUST_LOG"] = os.environ["RUST_LOG"]
    return env


def check_input_schema(schema):
    """What stays true of the tool's input schema: `python_code` required, `global_variables` offered."""
    assert schema["type"] == "object"
    assert set(schema["properties"]) == {"python_code", "global_variables"}, schema
    assert schema["required"] == ["python_code"], schema
    assert schema["properties"]["python_code"]["type"] == "string"
    assert schema["properties"]["global_variables"]["type"] == "object"


@contextlib.contextmanager
def http_server(mode, *args, cache_dir=SHARED_CACHE):
    """`mcp-run-python <mode>` on a free loopback port; yields its base URL. On exit it is sent
    SIGTERM and must stop cleanly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [BINARY, mode, "--host", "127.0.0.1", "--port", str(port), "--cache-dir", cache_dir, *args],
        env=server_env(),
    )
    deadline = time.monotonic() + INIT_TIMEOUT
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise RuntimeError(f"{mode} server did not start")
            time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        assert code == 0, f"{mode} server exited with {code} after SIGTERM"


# One server per HTTP mode for the whole run, shared by every module (each client still gets its
# own MCP session, hence its own interpreter).
@pytest.fixture(scope="session")
def streamable_http_url():
    with http_server("streamable-http", "--workers", "1") as base:
        yield f"{base}/mcp"


@pytest.fixture(scope="session")
def stateless_url():
    with http_server("streamable-http-stateless", "--workers", "1") as base:
        yield f"{base}/mcp"


@pytest.fixture(scope="session")
def sse_url():
    with http_server("sse", "--workers", "1") as base:
        yield f"{base}/sse"

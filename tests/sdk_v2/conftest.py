"""Helpers for the current line of clients (mcp 2.x, PydanticAI 2.x, fastmcp): start the real
binary over stdio or on a free loopback port. Nothing is imported from tests/sdk_v1, which runs
in the other venv with the 1.x line; starting the binary is shared with it through
tests/shared/real_binary.py (standard library only)."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "shared"))
from real_binary import (  # noqa: E402, F401 (re-exported to the tests)
    RUNTIME_DIR,
    BINARY, CALL_TIMEOUT, INIT_TIMEOUT, SHARED_CACHE, http_server, server_env,
    forked_for, stop_new_zygote_services, stop_zygote_services, zygote_service_pids,
    zygote_services_stopped_after, settled,
    zygote_services, warm_zygote_service,
)

STDIO_ARGS = ["stdio", "--workers", "1", "--cache-dir", SHARED_CACHE]

TOOL = "run_python_code"
CODE = "print('hi')\n[1, 2]"
EXPECTED = "<status>success</status>\n<output>\nhi\n</output>\n<return_value>\n[\n  1,\n  2\n]\n</return_value>"
ERROR_CODE = "1/0"
ERROR_PREFIX = "<status>run-error</status>"


@pytest.fixture(scope="session", autouse=True)
def zygote_services_stopped():
    """Every zygote service the run's fronts started ends with the run, even when a test
    failed: those in the run's runtime directory, and any other that was not there before."""
    with zygote_services_stopped_after():
        yield


@pytest.fixture
def warm_zygote():
    """A ready zygote service for servers with the default interpreter options: their
    interpreters are all forked, which checkpoints need (checkpoints, docs/architecture.md §3.4)."""
    warm_zygote_service()


@pytest.fixture(scope="session")
def anyio_backend():
    return "asyncio"


def check_input_schema(schema):
    """What stays true of the tool's input schema: `python_code` required, `global_variables` offered."""
    assert schema["type"] == "object"
    assert set(schema["properties"]) == {"python_code", "global_variables"}, schema
    assert schema["required"] == ["python_code"], schema
    assert schema["properties"]["python_code"]["type"] == "string"
    assert schema["properties"]["global_variables"]["type"] == "object"


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

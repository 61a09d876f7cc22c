"""The `mcp` 2.x `ClientSession` (protocol 2025-11-25, snake_case models) against the real binary
over stdio, streamable HTTP with and without sessions, and the legacy HTTP+SSE transport."""

import contextlib
import sys

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from conftest import (
    BINARY, CALL_TIMEOUT, CODE, ERROR_CODE, ERROR_PREFIX, EXPECTED, INIT_TIMEOUT, STDIO_ARGS, TOOL,
    check_input_schema, server_env,
)

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def streams(transport, request):
    """The (read, write) stream pair of one mcp 2.x client transport."""
    if transport == "stdio":
        params = StdioServerParameters(command=BINARY, args=STDIO_ARGS, env=server_env())
        async with stdio_client(params, errlog=sys.stderr) as pair:
            yield pair
    elif transport == "sse":
        url = request.getfixturevalue("sse_url")
        async with sse_client(url, timeout=INIT_TIMEOUT, sse_read_timeout=CALL_TIMEOUT) as pair:
            yield pair
    else:
        url = request.getfixturevalue({"streamable-http": "streamable_http_url",
                                       "streamable-http-stateless": "stateless_url"}[transport])
        async with streamable_http_client(url) as pair:
            yield pair


@pytest.mark.parametrize("transport", ["stdio", "streamable-http", "streamable-http-stateless", "sse"])
async def test_client_session(transport, request):
    async with streams(transport, request) as (read, write):
        async with ClientSession(read, write, read_timeout_seconds=CALL_TIMEOUT) as session:
            init = await session.initialize()
            assert init.protocol_version == "2025-11-25"
            assert init.server_info.name == "mcp-run-python"
            assert init.capabilities.tools is not None

            listing = await session.list_tools()
            assert [t.name for t in listing.tools] == [TOOL]
            check_input_schema(listing.tools[0].input_schema)

            result = await session.call_tool(TOOL, {"python_code": CODE}, read_timeout_seconds=CALL_TIMEOUT)
            assert not result.is_error
            assert [c.type for c in result.content] == ["text"]
            assert result.content[0].text == EXPECTED

            result = await session.call_tool(TOOL, {"python_code": ERROR_CODE}, read_timeout_seconds=CALL_TIMEOUT)
            assert [c.type for c in result.content] == ["text"]
            assert result.content[0].text.startswith(ERROR_PREFIX), result.content[0].text
            assert "ZeroDivisionError: division by zero" in result.content[0].text

"""fastmcp's own `Client` (the one under PydanticAI 2.x) over stdio and streamable HTTP, in its
default `auto` mode (probes `server/discover`, falls back to `initialize`) and pinned to the
`initialize` handshake (`legacy`)."""

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport

from conftest import (
    BINARY, CALL_TIMEOUT, CODE, ERROR_CODE, ERROR_PREFIX, EXPECTED, INIT_TIMEOUT, STDIO_ARGS, TOOL,
    check_input_schema, server_env,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("connect_mode", ["auto", "legacy"])
@pytest.mark.parametrize("transport", ["stdio", "streamable-http", "streamable-http-stateless"])
async def test_fastmcp_client(transport, connect_mode, request):
    if transport == "stdio":
        target = StdioTransport(BINARY, STDIO_ARGS, env=server_env(), keep_alive=False)
    else:
        fixture = {"streamable-http": "streamable_http_url", "streamable-http-stateless": "stateless_url"}[transport]
        target = StreamableHttpTransport(request.getfixturevalue(fixture))
    client = Client(target, mode=connect_mode, init_timeout=INIT_TIMEOUT, timeout=CALL_TIMEOUT)
    async with client:
        assert client.server_info.name == "mcp-run-python"
        if connect_mode == "legacy":
            assert client.protocol_version == "2025-11-25"
            assert client.initialize_result is not None

        tools = await client.list_tools()
        assert [t.name for t in tools] == [TOOL]
        check_input_schema(tools[0].input_schema)

        result = await client.call_tool(TOOL, {"python_code": CODE})
        assert not result.is_error
        assert [c.type for c in result.content] == ["text"]
        assert result.content[0].text == EXPECTED

        result = await client.call_tool(TOOL, {"python_code": ERROR_CODE}, raise_on_error=False)
        assert result.content[0].text.startswith(ERROR_PREFIX), result.content[0].text

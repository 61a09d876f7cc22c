"""PydanticAI's three MCP client classes (PydanticAI's MCP documentation) against the real binary: listing the tool,
`direct_call_tool`, an `Agent` driven by a `FunctionModel` (no LLM), and streamed logs."""

import time

import anyio
import pytest
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPServerSSE, MCPServerStdio, MCPServerStreamableHTTP
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from conftest import BINARY, CALL_TIMEOUT, SHARED_CACHE, http_server, server_env

pytestmark = pytest.mark.anyio

CODE = "import sys\nprint('hello from', sys.platform)\n{'sum': sum(range(10))}"
EXPECTED = (
    "<status>success</status>\n<output>\nhello from emscripten\n</output>\n"
    '<return_value>\n{\n  "sum": 45\n}\n</return_value>'
)


def stdio_server(**kwargs):
    return MCPServerStdio(
        BINARY, args=["stdio", "--workers", "1", "--cache-dir", SHARED_CACHE],
        env=server_env(), timeout=30, read_timeout=CALL_TIMEOUT, **kwargs,
    )


def model_that_runs(code):
    """A FunctionModel that calls run_python_code once, then answers with what it got back."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            assert [t.name for t in info.function_tools] == ["run_python_code"]
            return ModelResponse(parts=[ToolCallPart("run_python_code", {"python_code": code})])
        return ModelResponse(parts=[TextPart(f"tool said: {returns[-1].content}")])

    return FunctionModel(respond)


async def check(server):
    async with server:
        tools = await server.list_tools()
        assert [t.name for t in tools] == ["run_python_code"]
        assert await server.direct_call_tool("run_python_code", {"python_code": CODE}) == EXPECTED
    agent = Agent(model_that_runs(CODE), toolsets=[server])
    async with agent:
        result = await agent.run("What is the sum of the numbers below ten?")
    assert result.output == f"tool said: {EXPECTED}"


async def test_mcp_server_stdio():
    await check(stdio_server())


async def test_mcp_server_sse():
    with http_server("sse", "--workers", "1") as base:
        await check(MCPServerSSE(f"{base}/sse", timeout=30, read_timeout=CALL_TIMEOUT))


async def test_mcp_server_streamable_http():
    with http_server("streamable_http", "--workers", "1") as base:
        await check(MCPServerStreamableHTTP(f"{base}/mcp", timeout=30, read_timeout=CALL_TIMEOUT))


async def test_log_messages_stream_while_the_code_runs():
    received = []

    async def on_log(params):
        received.append((time.monotonic(), params.level, params.data))

    code = "import sys, time\nprint('one')\ntime.sleep(1)\nprint('two', file=sys.stderr)\ntime.sleep(1)\nprint('three')"
    server = stdio_server(log_level="info", log_handler=on_log)
    async with server:
        text = await server.direct_call_tool("run_python_code", {"python_code": code})
        returned = time.monotonic()
    assert text == "<status>success</status>\n<output>\none\ntwo\nthree\n</output>"
    assert [(level, data) for _, level, data in received] == [("info", "one"), ("warning", "two"), ("info", "three")]
    assert received[0][0] < returned, "the first line arrived only with the result"

    # Without log_level nothing is sent (the default level is `emergency`).
    received.clear()
    async with stdio_server(log_handler=on_log) as quiet:
        await quiet.direct_call_tool("run_python_code", {"python_code": "print('x')"})
    assert received == []


async def test_log_messages_over_streamable_http():
    received = []

    async def on_log(params):
        received.append(params.data)

    with http_server("streamable_http", "--workers", "1") as base:
        server = MCPServerStreamableHTTP(f"{base}/mcp", timeout=30, read_timeout=CALL_TIMEOUT,
                                         log_level="info", log_handler=on_log)
        async with server:
            await server.direct_call_tool("run_python_code", {"python_code": "print('a')\nprint('b')"})
            # The messages travel on the request's own stream, before its result: they are all
            # there once the call returns.
            assert received == ["a", "b"]


async def test_mcp_server_stdio_stateful():
    """`--stateful` (files, README "Sandboxes"): an agent's second call sees its first call's variable."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        codes = ["x = 21", "x * 2", "open('out.csv', 'w').write(f'x\\n{x * 2}\\n')"]
        if len(returns) < len(codes):
            return ModelResponse(parts=[ToolCallPart("run_python_code", {"python_code": codes[len(returns)]})])
        return ModelResponse(parts=[TextPart(f"tool said: {returns[-1].content}")])

    server = MCPServerStdio(
        BINARY, args=["stdio", "--workers", "1", "--stateful", "--cache-dir", SHARED_CACHE],
        env=server_env(), timeout=30, read_timeout=CALL_TIMEOUT,
    )
    agent = Agent(FunctionModel(respond), toolsets=[server])
    async with agent:
        result = await agent.run("Double a number in two steps, then save it.")
    returns = [p.content for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    # A text-only result reaches the model as its structured form, which names the sandbox.
    sandbox = returns[0]["sandbox_id"]
    assert returns[1] == {"status": "success", "sandbox_id": sandbox, "output": [], "return_value": 42}, returns
    # The written file is linked after the text; MCPServer reads the link for the model.
    assert returns[2] == [f"<status>success</status>\n<sandbox_id>{sandbox}</sandbox_id>\n<return_value>\n5\n</return_value>",
                          "x\n42\n"], returns

"""PydanticAI 2.x's `MCPToolset` (built on fastmcp's `Client`) over all four modes, each driving a
real `Agent` whose `FunctionModel` (no LLM) calls `run_python_code` once and answers with the
tool's text."""

import re

import pytest
from fastmcp.client.transports import SSETransport, StdioTransport, StreamableHttpTransport
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from conftest import (
    BINARY, CALL_TIMEOUT, CODE, EXPECTED, INIT_TIMEOUT, STDIO_ARGS, TOOL, check_input_schema, server_env,
)

pytestmark = pytest.mark.anyio


def transport_for(mode, request):
    if mode == "stdio":
        # keep_alive=False: the server process ends with the toolset's session.
        return StdioTransport(BINARY, STDIO_ARGS, env=server_env(), keep_alive=False)
    if mode == "sse":
        return SSETransport(request.getfixturevalue("sse_url"), sse_read_timeout=CALL_TIMEOUT)
    fixture = {"streamable-http": "streamable_http_url", "streamable-http-stateless": "stateless_url"}[mode]
    return StreamableHttpTransport(request.getfixturevalue(fixture))


def model_that_runs(code, seen_tools):
    """A FunctionModel that calls run_python_code once, then answers with what it got back."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            seen_tools.extend(info.function_tools)
            return ModelResponse(parts=[ToolCallPart(TOOL, {"python_code": code})])
        return ModelResponse(parts=[TextPart(f"tool said: {returns[-1].content}")])

    return FunctionModel(respond)


@pytest.mark.parametrize("mode", ["stdio", "streamable-http", "streamable-http-stateless", "sse"])
async def test_agent_with_mcp_toolset(mode, request):
    toolset = MCPToolset(transport_for(mode, request), init_timeout=INIT_TIMEOUT, read_timeout=CALL_TIMEOUT)
    seen_tools = []
    agent = Agent(model_that_runs(CODE, seen_tools), toolsets=[toolset])
    async with agent:
        assert toolset.server_info.name == "mcp-run-python"
        tools = await toolset.list_tools()
        assert [t.name for t in tools] == [TOOL]
        check_input_schema(tools[0].input_schema)
        result = await agent.run("Print hi and return a list.")
    assert [t.name for t in seen_tools] == [TOOL]
    check_input_schema(seen_tools[0].parameters_json_schema)
    assert result.output == f"tool said: {EXPECTED}"
    assert "<status>success</status>" in result.output


@pytest.mark.parametrize("mode", ["stdio", "streamable-http"])
async def test_output_reaches_the_log_handler(mode, request):
    """PydanticAI 2.x asks for log messages per request (`_meta`
    `io.modelcontextprotocol/logLevel`, SEP-2575) on sessionless protocol versions, where there
    is no `logging/setLevel`: the call's output lines still arrive as log messages."""
    received = []

    async def handler(message):
        received.append((message.level, message.data))

    toolset = MCPToolset(
        transport_for(mode, request), init_timeout=INIT_TIMEOUT, read_timeout=CALL_TIMEOUT,
        log_level="info", log_handler=handler,
    )
    agent = Agent(model_that_runs("print('line one')\nimport sys\nprint('line two', file=sys.stderr)\n1", []), toolsets=[toolset])
    async with agent:
        await agent.run("go")
    assert ("info", "line one") in received, received
    assert ("warning", "line two") in received, received


def model_that_runs_in_turn(codes):
    """A FunctionModel that calls run_python_code with each of `codes` in turn, then answers with
    the last result."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if len(returns) < len(codes):
            return ModelResponse(parts=[ToolCallPart(TOOL, {"python_code": codes[len(returns)]})])
        return ModelResponse(parts=[TextPart(f"tool said: {returns[-1].content}")])

    return FunctionModel(respond)


async def test_stateful_state_lasts_across_an_agents_calls():
    """`--stateful` (files, README "Sandboxes") over stdio: the second call sees the first one's variable, in the
    connection's own sandbox."""
    transport = StdioTransport(BINARY, [*STDIO_ARGS, "--stateful"], env=server_env(), keep_alive=False)
    toolset = MCPToolset(transport, init_timeout=INIT_TIMEOUT, read_timeout=CALL_TIMEOUT)
    codes = ["x = 21", "x * 2", "open('out.csv', 'w').write(f'x\\n{x * 2}\\n')"]
    agent = Agent(model_that_runs_in_turn(codes), toolsets=[toolset])
    async with agent:
        result = await agent.run("Double a number in two steps, then save it.")
    returns = [p.content for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    # A text-only result reaches the model as its structured form, which names the sandbox.
    assert returns[1]["return_value"] == 42 and returns[1]["sandbox_id"] == returns[0]["sandbox_id"], returns
    # The written file is linked after the text; MCPToolset hands the model its URI.
    text, link = returns[2]
    sandbox = returns[0]["sandbox_id"]
    assert text.startswith("<status>success</status>") and link == f"sandbox://{sandbox}/out.csv", returns

"""Sandboxes (sandboxes, docs/architecture.md §3.1) for today's clients: MCP 2026-07-28 has no protocol sessions (SEP-2567),
so state that spans calls travels in the `sandbox_id` handle the server mints. fastmcp 4's
`Client` and PydanticAI 2.x's `MCPToolset` against `streamable-http --stateful` (sessionless
requests), and fastmcp over stdio (one connection, several sandboxes)."""

import re

import pytest
from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from fastmcp.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from conftest import BINARY, CALL_TIMEOUT, INIT_TIMEOUT, STDIO_ARGS, TOOL, http_server, server_env

pytestmark = pytest.mark.anyio

HANDLE = re.compile(r"sbx_[A-Za-z0-9_-]{22}")
GONE = "does not exist or has expired"
SANDBOX_TOOLS = {"run_python_code", "create_sandbox", "fork_sandbox", "list_sandbox_files", "destroy_sandbox",
                 "upload_file", "delete_file", "reset_session"}


@pytest.fixture(scope="module")
def stateful_url():
    with http_server("streamable-http", "--stateful", "--workers", "1") as base:
        yield f"{base}/mcp"


def client_for(url):
    return Client(StreamableHttpTransport(url), init_timeout=INIT_TIMEOUT, timeout=CALL_TIMEOUT)


async def run(client, code, sandbox_id=None):
    """run_python_code; its structured result (which names the sandbox)."""
    arguments = {"python_code": code}
    if sandbox_id:
        arguments["sandbox_id"] = sandbox_id
    result = await client.call_tool(TOOL, arguments)
    assert not result.is_error, result
    text = result.content[0].text
    assert f"<sandbox_id>{result.structured_content['sandbox_id']}</sandbox_id>" in text, text
    return result.structured_content


async def test_a_sandbox_keeps_state_across_sessionless_calls(stateful_url):
    async with client_for(stateful_url) as client:
        assert client.protocol_version == "2026-07-28"
        tools = {t.name: t for t in await client.list_tools()}
        assert set(tools) == SANDBOX_TOOLS
        assert tools[TOOL].input_schema["properties"]["sandbox_id"]["x-mcp-header"] == "Sandbox-Id"
        assert tools[TOOL].output_schema["required"] == ["status", "sandbox_id", "output"]

        made = await client.call_tool("create_sandbox", {})
        sandbox = made.structured_content["sandbox_id"]
        assert HANDLE.fullmatch(sandbox) and sandbox in made.content[0].text, made

        assert (await run(client, "x = 41\nopen('a.txt', 'w').write('hi')\nx", sandbox))["return_value"] == 41
        second = await run(client, "import os\n[x + 1, sorted(os.listdir('.'))]", sandbox)
        assert second == {"status": "success", "sandbox_id": sandbox, "output": [], "return_value": [42, ["a.txt"]]}
        assert "state" not in second

        contents = await client.read_resource(f"sandbox://{sandbox}/a.txt")
        assert contents[0].text == "hi"
        listing = await client.call_tool("list_sandbox_files", {"sandbox_id": sandbox})
        assert listing.structured_content["files"] == [
            {"path": "a.txt", "size": 2, "uri": f"sandbox://{sandbox}/a.txt"}]
        templates = await client.list_resource_templates()
        assert [t.uri_template for t in templates] == ["sandbox://{sandbox_id}/{+path}"]
        # resources/list does not vary per caller (SEP-2567): it never lists sandboxes.
        assert await client.list_resources() == []


async def test_a_call_without_a_handle_gets_a_new_sandbox_it_can_continue_in(stateful_url):
    async with client_for(stateful_url) as client:
        await client.list_tools()
        first = await run(client, "y = 'kept'")
        sandbox = first["sandbox_id"]
        assert first["state"].startswith("new:") and sandbox in first["state"], first
        assert (await run(client, "y", sandbox))["return_value"] == "kept"
        # Another call without a handle is another sandbox.
        other = await run(client, "y = 'other'")
        assert other["sandbox_id"] != sandbox
        assert (await run(client, "y", sandbox))["return_value"] == "kept"


async def test_two_handles_see_nothing_of_each_other(stateful_url):
    async with client_for(stateful_url) as a, client_for(stateful_url) as b:
        await a.list_tools()
        await b.list_tools()
        one = (await a.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
        two = (await b.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
        await run(a, "secret = 'one'\nopen('mine.txt', 'w').write('one')", one)
        text = (await b.call_tool(TOOL, {"python_code": "import os\nos.listdir('.')\nsecret", "sandbox_id": two},
                                  raise_on_error=False)).content[0].text
        assert "NameError" in text, text
        assert (await run(b, "import os\nos.listdir('.')", two))["return_value"] == []
        # A handle is a capability: another client that holds it reaches the same sandbox.
        assert (await run(b, "secret", one))["return_value"] == "one"


async def test_a_destroyed_or_unknown_handle_gets_one_clear_error(stateful_url):
    async with client_for(stateful_url) as client:
        await client.list_tools()
        sandbox = (await client.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
        await run(client, "x = 1", sandbox)
        done = await client.call_tool("destroy_sandbox", {"sandbox_id": sandbox})
        assert "Destroyed" in done.content[0].text
        unknown = "sbx_" + "A" * 22
        answers = []
        for handle in (sandbox, unknown):
            result = await client.call_tool(TOOL, {"python_code": "x", "sandbox_id": handle}, raise_on_error=False)
            assert result.is_error
            assert handle not in result.content[0].text, "a whole handle is never echoed (errors are logged)"
            answers.append(result.content[0].text.replace(handle[:10], "<id>"))
        assert answers[0] == answers[1] and GONE in answers[0] and "create" in answers[0], answers
        with pytest.raises(ToolError, match=GONE):
            await client.call_tool("destroy_sandbox", {"sandbox_id": sandbox})
        with pytest.raises(MCPError, match=GONE):
            await client.read_resource(f"sandbox://{sandbox}/a.txt")


async def test_create_sandbox_installs_its_dependencies_first(stateful_url):
    async with client_for(stateful_url) as client:
        made = await client.call_tool("create_sandbox", {"dependencies": ["six"]})
        sandbox = made.structured_content["sandbox_id"]
        result = await run(client, "import six\nsix.__name__", sandbox)
        # Installed by create_sandbox: not a requirement of the call's own.
        assert result["return_value"] == "six" and "dependencies" not in result, result
        bad = await client.call_tool("create_sandbox", {"dependencies": ["no-such-package-anywhere-26"]},
                                     raise_on_error=False)
        assert bad.is_error and "no-such-package-anywhere-26" in bad.content[0].text, bad


async def test_two_sandboxes_in_one_stdio_connection():
    """Two agents share one sandbox and a third has its own, over one stdio connection."""
    transport = StdioTransport(BINARY, [*STDIO_ARGS, "--stateful"], env=server_env(), keep_alive=False)
    async with Client(transport, init_timeout=INIT_TIMEOUT, timeout=CALL_TIMEOUT) as client:
        await client.list_tools()
        shared = (await client.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
        own = (await client.call_tool("create_sandbox", {})).structured_content["sandbox_id"]
        await run(client, "n = 1", shared)
        await run(client, "n = 100", own)
        await run(client, "n += 1", shared)
        assert (await run(client, "n", shared))["return_value"] == 2
        assert (await run(client, "n", own))["return_value"] == 100
        # Without a handle: the connection's own sandbox, the same one each time.
        default = (await run(client, "n = 7"))["sandbox_id"]
        assert default not in (shared, own)
        assert (await run(client, "n"))["return_value"] == 7


def model_threading_the_handle(codes, seen):
    """A FunctionModel that calls run_python_code with each of `codes` in turn: the first call
    without a handle, the later ones with the handle the first result named."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        seen.extend(returns[len(seen):])
        if len(returns) == len(codes):
            return ModelResponse(parts=[TextPart(f"done: {returns[-1]}")])
        arguments = {"python_code": codes[len(returns)]}
        if returns:
            arguments["sandbox_id"] = returns[0]["sandbox_id"]
        return ModelResponse(parts=[ToolCallPart(TOOL, arguments)])

    return FunctionModel(respond)


async def test_an_agent_threads_the_handle_across_three_calls(stateful_url):
    toolset = MCPToolset(StreamableHttpTransport(stateful_url), init_timeout=INIT_TIMEOUT, read_timeout=CALL_TIMEOUT)
    seen = []
    agent = Agent(model_threading_the_handle(["x = 21", "x = x * 2", "x"], seen), toolsets=[toolset])
    async with agent:
        await agent.run("Double a number in steps.")
    # The model is handed the structured result, which names the sandbox.
    assert [r["status"] for r in seen] == ["success"] * 3, seen
    assert len({r["sandbox_id"] for r in seen}) == 1, seen
    assert seen[2]["return_value"] == 42

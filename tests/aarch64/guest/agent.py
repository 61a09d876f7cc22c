"""A PydanticAI agent (the seed's line, 1.x) that runs Python through `mcp-run-python stdio`,
started by name from the venv as the seed's `MCPServerStdio` does; a `FunctionModel` stands in
for the LLM. Run inside the emulated arm64 machine by smoke.py; prints the agent's answer."""

import asyncio

from pydantic_ai import Agent
from pydantic_ai.mcp import MCPServerStdio
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

CODE = "import sys\nprint('hello from', sys.platform)\n{'sum': sum(range(10))}"
# The server's log filter, which the zygote service it starts inherits: workers' own lines (the
# zygote's among them) reach the service's log at debug level, as `mcp_run_python::worker_log`.
LOG_FILTER = "warn,mcp_run_python=info,mcp_run_python::worker_log=debug"
# Seconds for the server's start and each call (a boot under emulation takes about 40 s).
SLOW = 900


def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """Calls run_python_code once, then answers with what it got back."""
    returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if not returns:
        assert [t.name for t in info.function_tools] == ["run_python_code"], info.function_tools
        return ModelResponse(parts=[ToolCallPart("run_python_code", {"python_code": CODE})])
    return ModelResponse(parts=[TextPart(f"tool said: {returns[-1].content}")])


async def main() -> None:
    server = MCPServerStdio("mcp-run-python", args=["stdio"], env={"RUST_LOG": LOG_FILTER}, timeout=SLOW,
                            read_timeout=SLOW)
    agent = Agent(FunctionModel(respond), toolsets=[server])
    async with agent:
        result = await agent.run("What is the sum of the numbers below ten?")
    print(result.output)


asyncio.run(main())

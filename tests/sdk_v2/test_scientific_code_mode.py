"""Code mode in the scientific runtime (docs/architecture.md §5.4 and §11): code that imports
numpy calls the tools of upstream MCP servers (`--tools-config`), and FastMCP's `CodeMode` runs
on `SandboxProvider(runtime="scientific")`, whose `call_tool` is a host function. Each call
crosses the guest's door to the worker, which asks the front, as a Pyodide worker's does."""

import json
import subprocess

import pytest
from fastmcp import Client, FastMCP

from conftest import BINARY, TOOL, http_server, server_env
from test_code_mode import EVERYTHING, ROOT, TOKEN, client, run, upstream_server

pytestmark = pytest.mark.anyio

# The cache the Rust suite's scientific tests fill (tests/scientific.rs), shared with
# tests/sdk_v1/test_scientific.py: the wheel, its artifacts and the compiled module.
SCIENTIFIC_CACHE = str(ROOT / "target" / "tmp" / "scientific-cache")

# The upstream calls' deadline (seconds).
TIMEOUT = 30


@pytest.fixture(scope="module", autouse=True)
def scientific_ready():
    """The runtime made ready in the cache (fetched and compiled when it is not yet)."""
    done = subprocess.run(
        [BINARY, "warmup", "--runtime", "scientific", "--cache-dir", SCIENTIFIC_CACHE],
        env=server_env(), capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr


async def test_numpy_code_calls_upstream_tools(tmp_path):
    assert EVERYTHING.exists(), f"{EVERYTHING} is missing: scripts/test.sh installs it (npm ci in tests/ts)"
    log = tmp_path / "upstream.jsonl"
    log.touch()
    with upstream_server(log) as upstream_url:
        config = tmp_path / "tools.json"
        config.write_text(json.dumps({"mcpServers": {
            "everything": {"command": str(EVERYTHING), "args": ["stdio"], "allowedTools": ["get-tiny-image"]},
            "upstream": {"url": upstream_url, "headers": {"Authorization": f"Bearer {TOKEN}"},
                         "allowedTools": ["add", "fail"]},
        }}))
        with http_server(
            "streamable-http", "--runtime", "scientific", "--timeout", str(TIMEOUT), "--tools-config", str(config),
            cache_dir=SCIENTIFIC_CACHE,
        ) as base:
            url = f"{base}/mcp"
            async with client(url) as c:
                description = next(t for t in await c.list_tools() if t.name == TOOL).description
            assert "numpy" in description and "- `mcp_tools.upstream.add(a: int, b: int)`" in description
            text = await run(url, """
import numpy as np
import mcp_tools
sums = [(await mcp_tools.upstream.add(a=int(x), b=1))["sum"] for x in np.arange(3)]
image = await mcp_tools.everything.get_tiny_image()
try:
    mcp_tools.upstream.fail.sync("the upstream says no")
except mcp_tools.ToolError as e:
    refused = str(e)
[int(np.sum(sums)), image[1][:8].hex(), refused]
""")
    assert "<status>success</status>" in text, text
    assert '6,\n  "89504e470d0a1a0a",\n  "the upstream says no"' in text, text


async def test_fastmcp_code_mode_runs_numpy_on_the_scientific_provider(monkeypatch):
    """`CodeMode(sandbox_provider=SandboxProvider(runtime="scientific"))`, the package from
    pysrc/ with this run's binary: the snippet imports numpy and awaits `call_tool`."""
    monkeypatch.syspath_prepend(str(ROOT / "pysrc"))
    monkeypatch.setenv("MCP_RUN_PYTHON_BIN", BINARY)
    from fastmcp.experimental.transforms.code_mode import CodeMode

    from mcp_run_python.fastmcp import SandboxProvider

    snippet = """
import numpy as np
total = 0
for side in np.array([2, 3]):
    total += (await call_tool("multiply", {"a": int(side) ** 2, "b": 1000}))["result"]
return {"total": total, "mean": float(np.mean([4, 9]))}
"""
    async with SandboxProvider(runtime="scientific", extra_args=["--cache-dir", SCIENTIFIC_CACHE]) as provider:
        mcp = FastMCP("shapes", transforms=[CodeMode(sandbox_provider=provider)])

        @mcp.tool
        def multiply(a: int, b: int) -> int:
            """Multiplies two integers."""
            return a * b

        async with Client(mcp) as c:
            ours = await c.call_tool("execute", {"code": snippet})
            assert ours.structured_content == {"total": 13000, "mean": 6.5}, ours
            failed = await c.call_tool("execute", {"code": "raise ValueError('no')"}, raise_on_error=False)
            assert failed.is_error and "ValueError: no" in failed.content[0].text, failed

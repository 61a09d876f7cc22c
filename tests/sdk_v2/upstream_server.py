"""A small FastMCP server (streamable HTTP) that the code-mode tests (code mode, docs/architecture.md §11) put behind
mcp-run-python's `--tools-config`: every request needs a bearer token, which only the front
holds (the configuration's `headers`). Its tools record what they saw in a JSON-lines log:
the `_meta` sandbox tag (and trace context) of each call, and a slow call's cancellation. `grow` and `sprout` add
tools while it runs (the tool-list change tests).

Usage: upstream_server.py PORT TOKEN LOG
"""

import asyncio
import json
import sys

from fastmcp import Context, FastMCP
from fastmcp.exceptions import ToolError
from fastmcp.tools import Tool
from fastmcp.server.auth.providers.jwt import StaticTokenVerifier

PORT, TOKEN, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3]
# The `_meta` key under which mcp-run-python names the sandbox of a call (src/code_mode/mod.rs).
SANDBOX_META_KEY = "io.github.mcp-run-python/sandbox"

mcp = FastMCP(
    "upstream",
    auth=StaticTokenVerifier(tokens={TOKEN: {"client_id": "mcp-run-python", "scopes": []}}),
)


def record(event, **fields):
    with open(LOG, "a") as f:
        f.write(json.dumps({"event": event, **fields}) + "\n")


def meta_of(ctx: Context, key):
    """The `_meta` entry `key` of the request `ctx` serves, if any."""
    meta = ctx.request_context.meta if ctx.request_context else None
    if meta is None:
        return None
    extra = meta.model_dump() if hasattr(meta, "model_dump") else dict(meta)
    return extra.get(key)


def sandbox_of(ctx: Context):
    return meta_of(ctx, SANDBOX_META_KEY)


@mcp.tool
def add(a: int, b: int, ctx: Context) -> dict:
    """Adds two integers."""
    # The W3C trace context the front passed on (SEP-414; the traces tests).
    record("add", sandbox=sandbox_of(ctx), traceparent=meta_of(ctx, "traceparent"))
    return {"sum": a + b}


@mcp.tool
def fail(message: str) -> str:
    """Always fails with `message`."""
    raise ToolError(message)


@mcp.tool
async def slow(seconds: float) -> str:
    """Sleeps `seconds`, then answers."""
    record("slow-started")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        record("slow-cancelled")
        raise
    return "done"


@mcp.tool
async def grow(ctx: Context) -> str:
    """Adds the tool `grown`, and says the tool list changed."""
    from mcp.types import ToolListChangedNotification

    def grown() -> str:
        """A tool added while the server runs."""
        return "grown"

    mcp.add_tool(grown)
    await ctx.send_notification(ToolListChangedNotification())
    return "grew"


@mcp.tool
async def sprout(name: str, ctx: Context) -> str:
    """Adds a tool called `name`, and says the tool list changed (once per name)."""
    from mcp.types import ToolListChangedNotification

    def sprouted() -> str:
        return name

    mcp.add_tool(Tool.from_function(sprouted, name=name, description=f"The tool {name}, added while the server runs."))
    await ctx.send_notification(ToolListChangedNotification())
    return f"sprouted {name}"


@mcp.tool
def hidden() -> str:
    """A tool the allowlist of the tests leaves out."""
    return "you should not see this"


if __name__ == "__main__":
    mcp.run(transport="http", host="127.0.0.1", port=PORT, show_banner=False, log_level="warning")

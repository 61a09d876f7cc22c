"""MCP tools of other servers, callable from the sandbox's code (mcp-run-python code mode).

``await mcp_tools.<server>.<tool>(...)`` calls a tool; ``mcp_tools.<server>.<tool>.sync(...)``
is the same call for synchronous code, and ``await mcp_tools.call(server, tool, arguments)``
the generic form. A tool returns its structured content as Python objects when it gives one,
else its content: text (decoded when it is JSON), images as ``bytes``, a list when there are
several blocks. A failure (the tool's own, an unreachable server, a limit of the call) raises
``mcp_tools.ToolError``. ``help(mcp_tools.<server>)`` lists a server's tools.

The front makes every call: this module holds no address and no credential of any server.
"""

# Executed by runtime/python/runner.py into a fresh module object named ``mcp_tools`` (docs:
# src/code_mode/catalog.rs, which makes every name, signature and docstring below), then
# ``_build`` is called with the catalog and the host call. Nothing here is trusted by the front.

import ast as _ast
import inspect as _inspect
import json as _json
from typing import Any, Literal

_host = None


class ToolError(Exception):
    """An upstream tool failed, or a limit of the call was reached; the message says which."""


def _decode(answer_json, body):
    """The Python value of a ToolAnswer (src/protocol/messages.rs) and its images' bytes."""
    answer = _json.loads(answer_json)
    kind = answer["kind"]
    if kind == "error":
        raise ToolError(answer["message"])
    if kind == "structured":
        return answer["value"]
    values = []
    offset = 0
    for item in answer["items"]:
        if item["type"] == "text":
            text = item["text"]
            try:
                values.append(_json.loads(text))
            except ValueError:
                values.append(text)
        elif item["type"] == "image":
            values.append(bytes(body[offset : offset + item["size"]]))
            offset += item["size"]
        else:
            values.append(item["value"])
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def call_sync(server, tool, arguments=None):
    """`call`, blocking: for synchronous code."""
    if not isinstance(server, str) or not isinstance(tool, str):
        raise TypeError("call_sync(server, tool, arguments): server and tool are names (str)")
    if arguments is not None and not isinstance(arguments, dict):
        raise TypeError("call_sync(server, tool, arguments): arguments is a dict")
    try:
        request = _json.dumps({"server": server, "tool": tool, "arguments": arguments or {}})
    except (TypeError, ValueError) as e:
        raise TypeError(f"the arguments of {server}.{tool} are not JSON: {e}") from None
    answer_json, body = _host("tool", request)
    return _decode(answer_json, body.to_bytes())


async def call(server: str, tool: str, arguments: dict[str, Any] | None = None) -> Any:
    """Calls `tool` of `server` (their names as configured and listed upstream)."""
    return call_sync(server, tool, arguments)


# What an annotation made by src/code_mode/catalog.rs may name.
_ANNOTATION_NAMES = {"Any": Any, "Literal": Literal, "int": int, "float": float, "str": str,
                     "bool": bool, "list": list, "dict": dict, "None": None}


def _annotation(text):
    """The annotation ``text`` as a type, so that signatures show it unquoted."""
    try:
        return eval(text, {"__builtins__": {}}, dict(_ANNOTATION_NAMES))
    except Exception:
        return text


def _function(server_name, spec):
    """The async function for one tool, with its signature, docstring and ``.sync``."""
    params = []
    names = {}
    optional = set()
    for p in spec["params"]:
        default = _inspect.Parameter.empty
        if p.get("default") is not None:
            default = _ast.literal_eval(p["default"])
            if default is None:
                optional.add(p["ident"])
        params.append(
            _inspect.Parameter(
                p["ident"],
                _inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=default,
                annotation=_annotation(p["annotation"]),
            )
        )
        names[p["ident"]] = p["name"]
    signature = _inspect.Signature(params, return_annotation=_annotation(spec["returns"]))
    tool = spec["name"]

    def arguments_of(args, kwargs):
        bound = signature.bind(*args, **kwargs)
        # Only what the code gave; an optional argument given as None is left out.
        return {
            names[k]: v for k, v in bound.arguments.items() if not (v is None and k in optional)
        }

    def sync(*args, **kwargs):
        return call_sync(server_name, tool, arguments_of(args, kwargs))

    async def function(*args, **kwargs):
        return call_sync(server_name, tool, arguments_of(args, kwargs))

    for f in (function, sync):
        f.__name__ = spec["ident"]
        f.__doc__ = spec["doc"] or None
        f.__signature__ = signature
        f.__module__ = "mcp_tools"
    function.__qualname__ = spec["ident"]
    sync.__qualname__ = spec["ident"] + ".sync"
    function.sync = sync
    return function


def _build(catalog, host):
    """Makes ``mcp_tools.<server>`` for every server of ``catalog`` (src/code_mode/catalog.rs's
    JSON) and keeps ``host``, the runner's call to the front (``host("tool", request)``)."""
    global _host
    _host = host
    for server in catalog["servers"]:
        members = {
            "__doc__": f"The tools of MCP server {server['name']!r}.",
            "__module__": "mcp_tools",
        }
        for spec in server["functions"]:
            members[spec["ident"]] = staticmethod(_function(server["name"], spec))
        globals()[server["ident"]] = type(server["ident"], (), members)

"""mcp-run-python: an MCP server that runs untrusted Python in Pyodide (CPython 3.14 in
WebAssembly), each interpreter in a confined worker process; a drop-in for the Deno original.

- `server_params`: an `mcp.StdioServerParameters` that starts the bundled binary in `stdio` mode.
- `code_sandbox(...)`: run code from Python and get the original's result dicts.
- `run_mcp_server(mode, ...)`: serve in the foreground.
- `binary_path()`: the binary itself (also `mcp-run-python` on PATH and `python -m mcp_run_python`).

Importing this package is cheap: the `mcp-run-python` command on PATH passes through it on
every start, so each name but `binary_path` is loaded on first use (PEP 562), and `mcp` only
when a client is made.
"""

from __future__ import annotations as _annotations

from typing import TYPE_CHECKING, Any

from ._binary import binary_path

if TYPE_CHECKING:
    from mcp import StdioServerParameters

    from ._sandbox import CodeSandbox, RunError, RunSuccess, code_sandbox
    from ._server import run_mcp_server

    server_params: StdioServerParameters
    __version__: str

__all__ = (
    '__version__',
    'server_params',
    'code_sandbox',
    'CodeSandbox',
    'RunSuccess',
    'RunError',
    'run_mcp_server',
    'binary_path',
)

_LAZY = {
    'code_sandbox': '_sandbox',
    'CodeSandbox': '_sandbox',
    'RunSuccess': '_sandbox',
    'RunError': '_sandbox',
    'run_mcp_server': '_server',
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f'.{_LAZY[name]}', __name__), name)
    elif name == 'server_params':
        from mcp import StdioServerParameters

        value = StdioServerParameters(command=binary_path(), args=['stdio'])
    elif name == '__version__':
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version('mcp-run-python')
        except PackageNotFoundError:  # a source tree, not installed
            value = '0+unknown'
    else:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

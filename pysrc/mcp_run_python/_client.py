"""A lean MCP client of the binary's stdio mode, for `code_sandbox` and the FastMCP provider.

They talk to a child of their own and need four messages of MCP (`initialize`, `tools/call`,
`logging/setLevel`, and the server's `notifications/message`): JSON-RPC lines over the child's
pipes do that without the `mcp` SDK's session, whose parsing and validation of every message
was about a third of a warm `eval` (issue 49). Everything else (`server_params`, PydanticAI,
users' own clients) keeps the SDK; this module imports none of it, but for the SDK's own error
type when the server refuses a request, so that callers catch what they caught before.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = 'StdioClient', 'stdio_client'

# The protocol revision this client speaks (MCP 2025-11-25: stdio keeps `initialize`).
PROTOCOL_VERSION = '2025-11-25'
CLIENT_NAME = 'mcp-run-python'
# What the `mcp` SDK's stdio client passes a server from the environment when given none (its
# `get_default_environment`), so that the binary sees the same environment as before.
INHERITED_VARIABLES = ('HOME', 'LOGNAME', 'PATH', 'SHELL', 'TERM', 'USER')
# Seconds the server has to end once its stdin is closed, then again after SIGTERM (the SDK's).
TERMINATION_TIMEOUT = 2.0
# The longest line read from the server (bytes): results are bounded by the server's own caps
# (`--max-result-bytes`, `--max-output-bytes`, images), far below this.
MAX_LINE_BYTES = 1 << 30
# JSON-RPC's "method not found", for requests of the server this client does not serve.
METHOD_NOT_FOUND = -32601
# The error of requests the server's closed output left unanswered, or made after it closed
# (the SDK's code for a closed connection).
CLOSED = {'code': -32000, 'message': 'the mcp-run-python server closed the connection'}

OnLog = Callable[[str, Any], None]
"""Called with each `notifications/message`'s level and data."""


def default_environment() -> dict[str, str]:
    """The variables of `INHERITED_VARIABLES` this process has (values that are shell
    functions, `()`-prefixed, left out, as the SDK does)."""
    return {
        name: value
        for name in INHERITED_VARIABLES
        if (value := os.environ.get(name)) is not None and not value.startswith('()')
    }


def _refusal(error: Mapping[str, Any]) -> Exception:
    """The installed `mcp` SDK's exception for a JSON-RPC error (1.x `McpError`, 2.x
    `MCPError`)."""
    code, message, data = int(error.get('code', 0)), str(error.get('message', '')), error.get('data')
    try:
        from mcp.shared.exceptions import MCPError  # type: ignore[attr-defined,unused-ignore]

        return MCPError(code, message, data)  # type: ignore[no-any-return,unused-ignore]
    except ImportError:
        from mcp.shared.exceptions import McpError  # type: ignore[attr-defined,unused-ignore]
        from mcp.types import ErrorData

        return McpError(ErrorData(code=code, message=message, data=data))  # type: ignore[no-any-return,unused-ignore]


class _Pending:
    """A request waiting for its answer."""

    def __init__(self) -> None:
        self.answered = anyio.Event()
        self.result: dict[str, Any] | None = None
        self.error: Mapping[str, Any] | None = None


class StdioClient:
    """One initialized MCP session with a child process in stdio mode."""

    def __init__(self, process: anyio.abc.Process, on_log: OnLog | None) -> None:
        assert process.stdin is not None and process.stdout is not None
        self._stdin = process.stdin
        self._stdout = BufferedByteReceiveStream(process.stdout)
        self._on_log = on_log
        self._next_id = 0
        self._pending: dict[int, _Pending] = {}
        self._send_lock = anyio.Lock()
        self._closed = False

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The `CallToolResult` of tool `name` as the server sent it (JSON, camel case).

        Raises:
            the `mcp` SDK's error: the server refused the request."""
        return await self.request('tools/call', {'name': name, 'arguments': dict(arguments)})

    async def set_logging_level(self, level: str) -> None:
        await self.request('logging/setLevel', {'level': level})

    async def request(self, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """Sends request `method` and waits for its answer. Cancelled while waiting, it tells
        the server (`notifications/cancelled`), which stops the work.

        Raises:
            the `mcp` SDK's error: the server refused, or closed its output first."""
        if self._closed:
            raise _refusal(CLOSED)
        self._next_id += 1
        request_id = self._next_id
        pending = self._pending[request_id] = _Pending()
        try:
            await self._send({'jsonrpc': '2.0', 'id': request_id, 'method': method, 'params': dict(params)})
            try:
                await pending.answered.wait()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await self.notify('notifications/cancelled', {'requestId': request_id})
                raise
        finally:
            self._pending.pop(request_id, None)
        if pending.error is not None:
            raise _refusal(pending.error)
        return pending.result or {}

    async def notify(self, method: str, params: Mapping[str, Any] | None = None) -> None:
        message: dict[str, Any] = {'jsonrpc': '2.0', 'method': method}
        if params is not None:
            message['params'] = dict(params)
        if not self._closed:
            await self._send(message)

    async def _send(self, message: Mapping[str, Any]) -> None:
        line = (json.dumps(message, separators=(',', ':')) + '\n').encode()
        async with self._send_lock:
            await self._stdin.send(line)

    async def _initialize(self) -> None:
        from . import __version__ as client_version

        await self.request(
            'initialize',
            {
                'protocolVersion': PROTOCOL_VERSION,
                'capabilities': {},
                'clientInfo': {'name': CLIENT_NAME, 'version': client_version},
            },
        )
        await self.notify('notifications/initialized')

    async def _read(self) -> None:
        """Reads the server's lines until its output ends, answering what waits for them."""
        try:
            while True:
                line = await self._stdout.receive_until(b'\n', MAX_LINE_BYTES)
                try:
                    message = json.loads(line)
                except ValueError:  # not JSON (a blank line): nothing to answer
                    continue
                if isinstance(message, dict):
                    await self._dispatch(message)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            self._closed = True
            for pending in self._pending.values():
                pending.error = CLOSED
                pending.answered.set()

    async def _dispatch(self, message: dict[str, Any]) -> None:
        method = message.get('method')
        if method is None:
            pending = self._pending.get(message.get('id'))  # type: ignore[arg-type]
            if pending is not None:
                pending.result, pending.error = message.get('result'), message.get('error')
                pending.answered.set()
        elif 'id' in message:
            # A request of the server's: only `ping` is served.
            reply: dict[str, Any] = {'jsonrpc': '2.0', 'id': message['id']}
            if method == 'ping':
                reply['result'] = {}
            else:
                reply['error'] = {'code': METHOD_NOT_FOUND, 'message': f'this client does not serve {method}'}
            await self._send(reply)
        elif method == 'notifications/message' and self._on_log is not None:
            params = message.get('params') or {}
            self._on_log(params.get('level', 'info'), params.get('data'))


@asynccontextmanager
async def stdio_client(
    command: str, args: Sequence[str], env: Mapping[str, str] | None = None, on_log: OnLog | None = None
) -> AsyncIterator[StdioClient]:
    """Starts `command args` (with `default_environment()` and `env`; stderr inherited) and
    yields an initialized session with it; on exit closes its stdin and waits for it to end
    (then SIGTERM, then SIGKILL, `TERMINATION_TIMEOUT` apart)."""
    environment = {**default_environment(), **(env or {})}
    process = await anyio.open_process([command, *args], env=environment, stderr=None)
    try:
        async with anyio.create_task_group() as tasks:
            client = StdioClient(process, on_log)
            tasks.start_soon(client._read)
            try:
                await client._initialize()
                yield client
            finally:
                tasks.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await _stop(process)


async def _stop(process: anyio.abc.Process) -> None:
    assert process.stdin is not None
    await process.stdin.aclose()
    with anyio.move_on_after(TERMINATION_TIMEOUT):
        await process.wait()
        return
    process.terminate()
    with anyio.move_on_after(TERMINATION_TIMEOUT):
        await process.wait()
        return
    process.kill()
    await process.wait()

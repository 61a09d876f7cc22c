"""Host functions: Python callables of this process that sandboxed code awaits by name.

The binary connects, once, to a UNIX socket this process listens on in a directory only its
user can enter (`--functions-socket`), never through the MCP connection. Messages are JSON
lines, declared with the binary's side in src/code_mode/functions.rs:

- to the binary, first: `{"kind": "hello", "functions": [{"name", "signature", "doc"}]}`;
- from the binary: `{"kind": "call", "id", "function", "args", "kwargs", "sandbox"}`, answered
  by `{"kind": "result", "id", "value"}` or `{"kind": "error", "id", "type", "message"}`;
- from the binary: `{"kind": "cancel", "id"}` when the run that made a call ended first.

A function's exception becomes `mcp_run_python.FunctionError` inside the sandbox, its return
value must be JSON.
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

__all__ = ('FunctionServer', 'Resolver', 'sandbox_tag')

Resolver = Callable[[str, str], 'Callable[..., Any] | None']
"""Finds the callable for `(sandbox tag, function name)`; `None` when that sandbox has none."""

# Largest line the binary sends (a call's arguments, bytes); the binary bounds the answers.
_MAX_LINE = 64 << 20
# The socket's name in its private directory.
_SOCKET_NAME = 'functions.sock'


def sandbox_tag(sandbox_id: str) -> str:
    """How the binary names sandbox `sandbox_id` in its calls: 16 hex characters of the
    handle's SHA-256 (src/code_mode/mod.rs, `sandbox_tag`)."""
    import hashlib

    return hashlib.sha256(sandbox_id.encode()).hexdigest()[:16]


def _spec(name: str, function: Callable[..., Any]) -> dict[str, str]:
    if not name.isidentifier():
        raise ValueError(f'host function name {name!r} is not a Python identifier')
    try:
        signature = str(inspect.signature(function))
    except (TypeError, ValueError):
        signature = '(*args, **kwargs)'
    return {'name': name, 'signature': signature, 'doc': inspect.getdoc(function) or ''}


class FunctionServer:
    """Serves host functions to one binary: `names` (with the signatures and docstrings of
    `examples`, a callable per name) are announced; each call runs what `resolve` finds for
    its sandbox."""

    def __init__(self, examples: Mapping[str, Callable[..., Any]], resolve: Resolver) -> None:
        self._specs = [_spec(name, f) for name, f in examples.items()]
        self._resolve = resolve
        self._write_lock = anyio.Lock()

    @asynccontextmanager
    async def listening(self) -> AsyncIterator[str]:
        """Listens in a fresh private directory; yields the socket's path for
        `--functions-socket`, and serves the first connection until the context ends."""
        with tempfile.TemporaryDirectory(prefix='mcp-run-python-') as folder:
            os.chmod(folder, 0o700)
            path = os.path.join(folder, _SOCKET_NAME)
            listener = await anyio.create_unix_listener(path)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._serve, listener)
                try:
                    yield path
                finally:
                    tasks.cancel_scope.cancel()

    async def _serve(self, listener: anyio.abc.SocketListener) -> None:
        async with listener:
            stream = await listener.accept()
        # The listener is closed: nobody else connects.
        async with stream, anyio.create_task_group() as tasks:
            await self._send(stream, {'kind': 'hello', 'functions': self._specs})
            lines = BufferedByteReceiveStream(stream)
            calls: dict[int, anyio.CancelScope] = {}
            while True:
                try:
                    line = await lines.receive_until(b'\n', _MAX_LINE)
                except (anyio.EndOfStream, anyio.IncompleteRead, anyio.DelimiterNotFound, OSError):
                    break
                message = json.loads(line)
                if message.get('kind') == 'call':
                    scope = anyio.CancelScope()
                    calls[message['id']] = scope
                    tasks.start_soon(self._call, stream, message, scope, calls)
                elif message.get('kind') == 'cancel' and message.get('id') in calls:
                    calls[message['id']].cancel()
            tasks.cancel_scope.cancel()

    async def _call(
        self,
        stream: anyio.abc.ByteStream,
        message: dict[str, Any],
        scope: anyio.CancelScope,
        calls: dict[int, anyio.CancelScope],
    ) -> None:
        call_id = message['id']
        answer: dict[str, Any] | None = None
        with scope:
            function = self._resolve(message.get('sandbox', ''), message['function'])
            try:
                if function is None:
                    raise LookupError(f'no host function {message["function"]!r} for this sandbox')
                value = function(*message.get('args', []), **message.get('kwargs', {}))
                if inspect.isawaitable(value):
                    value = await value
                json.dumps(value)
                answer = {'kind': 'result', 'id': call_id, 'value': value}
            except Exception as e:  # the function's failure is the sandbox's FunctionError
                answer = {'kind': 'error', 'id': call_id, 'type': type(e).__name__, 'message': str(e)}
        calls.pop(call_id, None)
        if answer is not None:
            try:
                await self._send(stream, answer)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass

    async def _send(self, stream: anyio.abc.ByteStream, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode() + b'\n'
        async with self._write_lock:
            await stream.send(data)

"""`run_mcp_server`: the server in the foreground, as the Deno original's Python API ran it."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Literal

from ._binary import binary_path, server_args

__all__ = 'Mode', 'run_mcp_server'

Mode = Literal[
    'stdio',
    'streamable_http',
    'streamable_http_stateless',
    'sse',
    'warmup',
    'example',
    'streamable-http',
    'streamable-http-stateless',
]
"""How the server is served; underscores and hyphens are the same (the original used both)."""


def run_mcp_server(
    mode: Mode,
    *,
    port: int | None = None,
    http_port: int | None = None,
    dependencies: Sequence[str] | None = None,
    return_mode: Literal['json', 'xml'] = 'xml',
    allow_networking: bool | Sequence[str] = False,
    verbose: bool = False,
    extra_args: Sequence[str] = (),
) -> int:
    """Runs the server until it stops and returns its exit status (0 after Ctrl-C).

    It shares this process's standard streams, so `stdio` mode serves whoever drives them.

    Args:
        mode: `stdio`, `streamable_http`, `streamable_http_stateless`, `sse`, `warmup` or
            `example`.
        port: TCP port of the HTTP modes (default 3001); `http_port` is the original's name
            for it.
        dependencies: Requirements (PEP 508) installed into every interpreter before its
            first call.
        return_mode: Tool results as XML sections (the default) or one JSON object.
        allow_networking: `False`, or the hosts the code may fetch from (`--allow-net`).
        verbose: Debug logs on stderr (`--verbose`).
        extra_args: More command-line options (`mcp-run-python --help`).

    Raises:
        ValueError: `allow_networking=True`, both `port` and `http_port`, or a port for a mode
            that does not listen.
        FileNotFoundError: the binary is not installed.
    """
    if port is not None and http_port is not None:
        raise ValueError('give port or http_port, not both')
    args = server_args(
        mode,
        port=port if port is not None else http_port,
        dependencies=dependencies,
        return_mode=return_mode,
        allow_networking=allow_networking,
        verbose=verbose,
        extra_args=extra_args,
    )
    try:
        return subprocess.run([binary_path(), *args]).returncode
    except KeyboardInterrupt:
        return 0

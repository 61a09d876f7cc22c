"""`python -m mcp_run_python …` and the `mcp-run-python` command on PATH: both replace this
process with the binary (`os.execv`), so arguments, standard streams, signals and the exit
status are the binary's own."""

from __future__ import annotations

import os
import sys

from ._binary import binary_path, scientific_env


def main() -> None:
    """Runs the binary with this process's arguments; does not return.

    Exits with status 127 and a message on stderr when the binary is missing.
    """
    try:
        exe = binary_path()
    except FileNotFoundError as e:
        print(f'mcp-run-python: {e}', file=sys.stderr)
        sys.exit(127)
    os.environ.update(scientific_env())
    os.execv(exe, [exe, *sys.argv[1:]])


if __name__ == '__main__':
    main()

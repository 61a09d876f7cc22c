"""The wheel as a user gets it (README "Install"): `scripts/build-wheel.sh --dev` builds it (test.sh
passes its path in MCP_RUN_PYTHON_WHEEL), and these tests install it where nothing else of
this project is: a fresh venv, uv's throw-away environments, a bare root file system.

Runs in the test command's .venv (the seed's client line: mcp 1.x, PydanticAI 1.x, uv)."""

import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

# tests/shared: helpers shared with tests/aarch64 (the test modules here import from it too).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "shared"))
from loaded_libraries import GLIBC, foreign_libraries  # noqa: E402,F401 (used by the tests)

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WHEEL = pathlib.Path(os.environ["MCP_RUN_PYTHON_WHEEL"]).resolve()
# The seed's client line, installed beside the wheel in the fresh venv (the wheel asks only for
# mcp>=1.13.1; the pin keeps runs repeatable).
SEED_LINE = ["mcp==1.30.0"]
# The current line, for uv's environments (tests/sdk_v2/requirements.txt has the same pins).
CURRENT_LINE = ["mcp==2.3.0", "pydantic-ai-slim[mcp]==2.68.0", "fastmcp-slim[client]==4.1.6"]
# FastMCP's server with its code mode (Monty, to compare), for `mcp_run_python.fastmcp`.
CODE_MODE_LINE = ["mcp==2.3.0", "fastmcp-slim[client,server,code-mode]==4.1.6"]
# Seconds for anything that installs or boots (a first boot without a snapshot takes 10-15 s,
# pip and uv fetch from the registry).
SLOW = 600


@dataclasses.dataclass
class Venv:
    """A fresh venv with the wheel installed by pip."""

    root: pathlib.Path
    home: pathlib.Path

    @property
    def bin(self) -> pathlib.Path:
        return self.root / "bin"

    @property
    def python(self) -> str:
        return str(self.bin / "python")

    @property
    def binary(self) -> pathlib.Path:
        """The real binary (the command on PATH is a launcher that execs it)."""
        (path,) = self.root.glob("lib/python*/site-packages/mcp_run_python/_bin/mcp-run-python")
        return path

    def env(self, **extra) -> dict:
        """An environment as a user's shell with the venv activated has: its bin first on PATH,
        a HOME of its own (the server's cache and snapshot start empty) and nothing of ours."""
        env = {"PATH": f"{self.bin}:{os.environ['PATH']}", "HOME": str(self.home)}
        env.update(extra)
        return env

    def run(self, *args, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("env", self.env())
        return subprocess.run(args, capture_output=True, text=True, timeout=SLOW, **kwargs)


def zygote_services() -> set[int]:
    """Pids of every zygote service process on the host (`zygote-service` in its command line)."""
    found = set()
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"zygote-service" in (entry / "cmdline").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="session", autouse=True)
def zygote_services_stopped():
    """The servers these tests start (pip's, uv's, the bare root's) start zygote services of their
    own, in homes and roots of their own; every one that was not there before the session is
    ended with SIGTERM (which the service takes as `zygote stop`) at the end, even after a
    failure, and must be gone within 10 s."""
    before = zygote_services()
    yield
    started = zygote_services() - before
    for pid in started:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while (left := zygote_services() & started) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"zygote services did not stop: {left}"


@pytest.fixture(scope="session")
def venv(tmp_path_factory) -> Venv:
    """`python3 -m venv` and `pip install <wheel>`, once for the session."""
    base = tmp_path_factory.mktemp("wheel-venv")
    root, home = base / "venv", base / "home"
    home.mkdir()
    subprocess.run(["python3", "-m", "venv", str(root)], check=True, timeout=SLOW)
    subprocess.run(
        [str(root / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(WHEEL), *SEED_LINE],
        check=True,
        timeout=SLOW,
    )
    return Venv(root, home)


class StdioSession:
    """A raw JSON-RPC exchange with `mcp-run-python stdio` (standard library only, so the same
    code can drive a server anywhere)."""

    def __init__(self, argv, env):
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )
        self.next_id = 1
        self.request("initialize", {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "wheel-test", "version": "0"},
        })
        self.notify("notifications/initialized")

    def notify(self, method, params=None):
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": method, "params": params or {}}) + "\n")
        self.proc.stdin.flush()

    def request(self, method, params):
        rid = self.next_id
        self.next_id += 1
        self.proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}) + "\n")
        self.proc.stdin.flush()
        while True:
            line = self.proc.stdout.readline()
            assert line, "the server closed stdout"
            message = json.loads(line)
            if message.get("id") == rid:
                assert "error" not in message, message
                return message["result"]

    def call(self, code: str) -> str:
        result = self.request("tools/call", {"name": "run_python_code", "arguments": {"python_code": code}})
        return result["content"][0]["text"]

    def close(self):
        self.proc.stdin.close()
        assert self.proc.wait(timeout=60) == 0


def run_script(python: str, source: str, env: dict, tmp_path: pathlib.Path) -> str:
    """Runs `source` as a script with `python`; returns its stdout, failing with its stderr."""
    script = tmp_path / "script.py"
    script.write_text(source)
    done = subprocess.run([python, str(script)], capture_output=True, text=True, env=env, timeout=SLOW, cwd=tmp_path)
    assert done.returncode == 0, f"exit {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    return done.stdout


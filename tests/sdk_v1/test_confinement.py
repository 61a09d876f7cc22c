"""The second wall (the second wall, docs/architecture.md §3.2), seen from outside: every worker of the real binary is confined by
the kernel (seccomp, Landlock, namespaces, no capabilities, limits), the server says which
layers are on, falls back loudly where the kernel refuses one, and `--confinement strict`
refuses to serve then. What native code inside a worker can still do is tried by
`tests/sandbox_escape.rs`."""

import os
import re
import subprocess
import time

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

from conftest import BINARY, SHARED_CACHE, child_pids, http_server, mcp_session, run, server_env

pytestmark = pytest.mark.anyio

LAYERS = ["seccomp", "landlock", "userns", "netns", "mntns", "ipcns", "utsns", "capabilities", "rlimits", "no_new_privs", "not_dumpable"]

# A setting without user namespaces, made without touching the host: a user namespace of our
# own in which no further one may be created (user.max_user_namespaces is per namespace).
NO_USERNS = ["unshare", "--user", "--map-root-user", "sh", "-c", 'echo 0 > /proc/sys/user/max_user_namespaces && exec "$@"', "sh"]


def warmup(*args, prefix=()):
    return subprocess.run(
        [*prefix, BINARY, "warmup", "--workers", "1", "--cache-dir", SHARED_CACHE, *args],
        capture_output=True, text=True, timeout=600, env=server_env(),
    )


def report_line(text, mode):
    lines = [line for line in text.splitlines() if f"confinement {mode}:" in line]
    assert lines, text
    return lines[0]


def proc_status(pid):
    with open(f"/proc/{pid}/status") as f:
        return dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)


def test_strict_warmup_reports_every_layer_on():
    proc = warmup("--confinement", "strict")
    assert proc.returncode == 0, proc.stderr
    line = report_line(proc.stdout, "strict")
    for layer in LAYERS:
        assert f"{layer}: on" in line, (layer, line)
    assert "landlock: on (abi " in line


async def test_stdio_logs_the_layers_and_the_worker_is_confined(tmp_path):
    errlog = open(tmp_path / "stderr", "w+")
    async with mcp_session("--workers", "1", errlog=errlog) as session:
        assert await run(session, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"
    errlog.seek(0)
    line = report_line(errlog.read(), "default")
    assert "WARN" not in line
    for layer in LAYERS:
        assert f"{layer}: on" in line, (layer, line)


async def test_http_workers_are_confined_as_the_kernel_sees_them():
    """Read from /proc by the test, not from the server's word: each worker of a streamable-HTTP
    server has a seccomp filter, no new privileges, no capabilities, and namespaces of its own."""
    with http_server("streamable-http", "--confinement", "strict", "--workers", "1") as url:
        async with streamablehttp_client(f"{url}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                assert (await run(session, "import sys; sys.platform")).endswith("emscripten\n</return_value>")
                workers = child_pids(url.pid)
                assert workers, "no worker process"
                # Spares may still be booting (a worker seals itself before it says it is
                # ready, never before it has booted): wait for them to be ready.
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and any(proc_status(p)["Seccomp"].strip() != "2" for p in workers):
                    await anyio.sleep(0.2)
                for pid in workers:
                    status = proc_status(pid)
                    assert status["Seccomp"].strip() == "2", status  # SECCOMP_MODE_FILTER
                    assert status["NoNewPrivs"].strip() == "1", status
                    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0, status
                    for ns in ["user", "net", "mnt", "ipc", "uts"]:
                        assert os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"), ns


async def test_without_user_namespaces_the_server_falls_back_and_says_so(tmp_path):
    proc = warmup(prefix=NO_USERNS)
    assert proc.returncode == 0, proc.stderr
    line = report_line(proc.stdout, "default")
    assert "userns: off (" in line and "user namespaces are not permitted here" in line, line
    # The rest still holds; as root of its namespace the server can still give workers the others.
    for layer in ["seccomp", "landlock", "netns", "capabilities", "rlimits"]:
        assert f"{layer}: on" in line, (layer, line)
    # Said loudly: a warning on stderr.
    assert any("WARN" in l and "userns: off" in l for l in proc.stderr.splitlines()), proc.stderr

    # And it serves real clients like that.
    params = StdioServerParameters(
        command=NO_USERNS[0],
        args=[*NO_USERNS[1:], BINARY, "stdio", "--workers", "1", "--cache-dir", SHARED_CACHE],
        env=server_env(),
    )
    errlog = open(tmp_path / "stderr", "w+")
    async with stdio_client(params, errlog=errlog) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            assert await run(session, "6 * 7") == "<status>success</status>\n<return_value>\n42\n</return_value>"


def test_strict_refuses_to_serve_without_a_layer():
    proc = warmup("--confinement", "strict", prefix=NO_USERNS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "refusing to serve under --confinement strict" in proc.stderr
    assert "userns" in proc.stderr

    # Over stdio too: the server exits before it answers anything.
    started = subprocess.run(
        [*NO_USERNS, BINARY, "stdio", "--confinement", "strict", "--cache-dir", SHARED_CACHE],
        input="", capture_output=True, text=True, timeout=120, env=server_env(),
    )
    assert started.returncode == 1, started.stderr
    assert "refusing to serve under --confinement strict" in started.stderr
    assert started.stdout == ""


def test_the_earlier_name_sandbox_is_a_hidden_alias_of_confinement():
    """`--confinement` was called `--sandbox` before sandboxes were what users hold by handle:
    scripts that pass the old name get the mode they ask for, and `--help` shows the new one
    only (the messages kept their words)."""
    proc = warmup("--sandbox", "strict", prefix=NO_USERNS)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    help_text = subprocess.run([BINARY, "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "--confinement <CONFINEMENT>" in help_text and not re.search(r"--sandbox\b(?!-)", help_text), help_text


async def test_sandbox_off_is_said_loudly(tmp_path):
    errlog = open(tmp_path / "stderr", "w+")
    async with mcp_session("--workers", "1", "--confinement", "off", errlog=errlog) as session:
        assert await run(session, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"
    errlog.seek(0)
    log = errlog.read()
    assert "--confinement off: workers are NOT confined" in log, log
    assert "the worker is NOT confined by the operating system" in log, log

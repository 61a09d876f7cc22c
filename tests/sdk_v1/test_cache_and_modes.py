"""The download cache, and the `warmup` and `example` modes."""

import os
import subprocess
import time

import pytest

from conftest import BINARY, direct_child_pids, mcp_session, run, server_env
from pypi_mirror import Mirror

pytestmark = pytest.mark.anyio


async def test_second_install_downloads_nothing(tmp_path):
    cache = str(tmp_path / "cache")
    code = "import humanize\nhumanize.naturalsize(2048)"
    with Mirror() as mirror:
        args = ["--workers", "1", "--index-url", f"{mirror.url}/pypi"]
        async with mcp_session(*args, cache_dir=cache) as session:
            text = await run(session, code)
            assert text.endswith("<return_value>\n2.0 kB\n</return_value>"), text
        first = len(mirror.requests)
        assert first >= 2, mirror.requests  # the JSON API answer and the wheel
        assert any(r.startswith("/file") for r in mirror.requests)

        # A new server process with the same cache installs it again without any download.
        async with mcp_session(*args, cache_dir=cache) as session:
            text = await run(session, code)
            assert text.endswith("<return_value>\n2.0 kB\n</return_value>"), text
        assert len(mirror.requests) == first, mirror.requests[first:]

    # Offline mode installs from the cache alone (the mirror is shut down by now).
    async with mcp_session(*args, "--offline", cache_dir=cache) as session:
        text = await run(session, code)
        assert text.endswith("<return_value>\n2.0 kB\n</return_value>"), text
        text = await run(session, "import tomli_w")
        assert text.startswith("<status>install-error</status>") and "offline" in text, text


def test_warmup_exits_zero(tmp_path):
    proc = subprocess.run(
        [BINARY, "warmup", "--workers", "1", "--cache-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=server_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "Pyodide booted: Python 3.14" in proc.stdout


def test_warmup_fails_with_the_reason(tmp_path):
    proc = subprocess.run(
        [BINARY, "warmup", "--workers", "1", "--cache-dir", str(tmp_path), "--deps", "no-such-package-mcp-run-python-test"],
        capture_output=True, text=True, timeout=600, env=server_env(),
    )
    assert proc.returncode != 0
    assert "no-such-package-mcp-run-python-test" in proc.stderr


def test_example_runs_a_pypi_package(tmp_path):
    proc = subprocess.run(
        [BINARY, "example", "--workers", "1", "--cache-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env=server_env(),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '<status>success</status>\n<dependencies>["humanize"]</dependencies>' in proc.stdout
    assert '"answer": 42' in proc.stdout


async def test_timeout_kills_the_worker_and_the_next_call_works():
    async with mcp_session("--workers", "1", "--timeout", "3") as session:
        text = await run(session, "print('spinning')\nwhile True:\n    pass")
        assert text.startswith("<status>run-error</status>\n<output>\nspinning\n</output>"), text
        assert "timed out after 3 s" in text
        assert await run(session, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"


# Most anonymous memory (KiB) the server itself may hold once it serves: ~3 MiB. Workers map the
# 30 MiB memory snapshot from its file; the server kept a copy of it while it piped the bytes.
MAX_SERVER_ANON_KIB = 16 << 10


def server_anon_kib():
    """Anonymous resident memory (KiB) of this test's stdio server process."""
    for pid in direct_child_pids(os.getpid()):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"stdio" in f.read().split(b"\0"):
                with open(f"/proc/{pid}/status") as f:
                    return int(next(line.split()[1] for line in f if line.startswith("RssAnon:")))
    raise AssertionError("no stdio server among this process's children")


async def test_memory_snapshot_is_made_once_and_restored(tmp_path):
    cache = str(tmp_path / "cache")
    log = tmp_path / "server.log"
    code = "import random\nrandom.random()"
    values = []
    # Snapshots of other binaries: one not restored for 30 days (an old version's, removed when
    # this one is stored), one restored yesterday (kept).
    snapshot_dir = tmp_path / "cache" / "snapshots"
    snapshot_dir.mkdir(parents=True)
    month_ago, day_ago = time.time() - 30 * 86400, time.time() - 86400
    stale, recent = snapshot_dir / "pyodide-0000stale.bin", snapshot_dir / "pyodide-0000recent.bin"
    for path, when in ((stale, month_ago), (recent, day_ago)):
        path.write_bytes(b"another binary's snapshot")
        os.utime(path, (when, when))
    with open(log, "w") as errlog:
        # A zygote of its own, not the host's service, which would fork these interpreters
        # instead of restoring them.
        async with mcp_session("--workers", "1", "--fresh-worker", "--no-shared-zygote", cache_dir=cache,
                               errlog=errlog) as session:
            for _ in range(3):
                text = await run(session, code)
                values.append(text)
    text = log.read_text()
    assert text.count("sandbox worker ready") >= 3
    assert text.count("booted from a memory snapshot") >= 2, text
    assert not stale.exists() and recent.exists()
    snapshots = [p for p in snapshot_dir.iterdir() if p != recent]
    assert len(snapshots) == 1
    # Workers restored from one snapshot still draw different random numbers.
    assert len(set(values)) == 3, values

    # Restoring a snapshot marks it as in use, so that no other binary prunes it.
    os.utime(snapshots[0], (month_ago, month_ago))
    async with mcp_session("--workers", "1", "--no-shared-zygote", cache_dir=cache) as session:
        assert (await run(session, "1 + 1")).endswith("<return_value>\n2\n</return_value>")
        # The worker mapped the snapshot file: the server holds no copy of it.
        assert server_anon_kib() < MAX_SERVER_ANON_KIB
    assert snapshots[0].stat().st_mtime > time.time() - 3600

    # A damaged snapshot is dropped and the worker boots plainly.
    snapshots[0].write_bytes(b"not a snapshot")
    with open(log, "w") as errlog:
        async with mcp_session("--workers", "1", "--no-shared-zygote", cache_dir=cache, errlog=errlog) as session:
            assert (await run(session, "1 + 1")).endswith("<return_value>\n2\n</return_value>")
    assert "booting from the memory snapshot failed" in log.read_text()

"""`--mount HOST_DIR:SANDBOX_DIR` (files, README "Sandboxes"): the operator's data in every sandbox, read-only, in
interpreters booted and forked alike; nothing written in a sandbox reaches the host. Real
binary, real `mcp` client, stdio and streamable HTTP."""

import json
import os
import subprocess

import pytest

from adversary import http_server, http_session, return_value, wait_until
from conftest import BINARY, SHARED_CACHE, mcp_session, run, server_env

pytestmark = pytest.mark.anyio

# Reads the mount, then tries every way of changing it; each attempt's outcome is listed.
PROBE = """
import os
seen = [sorted(os.listdir('/data')), open('/data/t.csv').read(), open('/data/sub/h.txt').read()]
attempts = [
    lambda: open('/data/t.csv', 'w').write('changed'),
    lambda: open('/data/new.txt', 'w').write('new'),
    lambda: os.chmod('/data/t.csv', 0o666),
    lambda: os.chmod('/data', 0o777),
    lambda: os.unlink('/data/t.csv'),
    lambda: os.truncate('/data/t.csv', 0),
    lambda: os.rename('/data/sub/h.txt', '/data/h.txt'),
]
for attempt in attempts:
    try:
        attempt()
        seen.append('done')
    except OSError as e:
        seen.append(type(e).__name__)
seen + [open('/data/t.csv').read()]
"""
EXPECTED = [["sub", "t.csv"], "a,b\n1,2\n", "hi\n", *["PermissionError"] * 7, "a,b\n1,2\n"]


@pytest.fixture
def data_dir(tmp_path):
    """A host directory to mount: a CSV, a folder with a text file, and a symbolic link to a
    file outside it (which is not mounted)."""
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "t.csv").write_text("a,b\n1,2\n")
    (root / "sub" / "h.txt").write_text("hi\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("not for the sandbox")
    os.symlink(outside, root / "link.txt")
    return root


def host_files(root):
    return sorted((str(p.relative_to(root)), p.read_bytes() if p.is_file() else None) for p in root.rglob("*"))


async def test_a_mount_is_there_read_only_over_stdio(data_dir):
    before = host_files(data_dir)
    async with mcp_session("--mount", f"{data_dir}:/data") as session:
        assert json.loads(return_value(await run(session, PROBE))) == EXPECTED
        # The working directory is untouched by the mount.
        assert return_value(await run(session, "import os\nos.listdir('.')")) == "[]"
    assert host_files(data_dir) == before


async def test_forked_interpreters_inherit_the_mount(data_dir, tmp_path):
    log = tmp_path / "server.log"
    before = host_files(data_dir)
    with http_server("streamable_http", "--mount", f"{data_dir}:/data", stderr_path=log) as base:
        async with http_session(base) as first:
            assert json.loads(return_value(await run(first, PROBE))) == EXPECTED
        assert await wait_until(lambda: "the zygote is ready" in log.read_text(), 120), log.read_text()
        for _ in range(2):
            async with http_session(base) as later:
                assert json.loads(return_value(await run(later, PROBE))) == EXPECTED
        assert "forked from the zygote" in log.read_text()
    assert host_files(data_dir) == before


@pytest.mark.parametrize("mount,extra,words", [
    ("{data}:/home/pyodide/data", [], "interpreter uses itself"),
    ("{data}:data", [], "absolute path"),
    ("{data}/missing:/data", [], "cannot read"),
    ("{data}/t.csv:/data", [], "not a directory"),
    ("{data}:/data", ["--max-mount-bytes", "5"], "more than 5 bytes"),
])
def test_a_bad_mount_stops_the_server_at_start(data_dir, mount, extra, words):
    args = ["stdio", "--mount", mount.format(data=data_dir), *extra, "--cache-dir", SHARED_CACHE]
    done = subprocess.run([BINARY, *args], env=server_env(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert words in done.stderr, done.stderr

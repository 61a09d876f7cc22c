"""The resolver (dependencies, docs/architecture.md §5) through the real binary over stdio, with real PyPI and the Pyodide
CDN unreachable (as in CI): backtracking from the lock file's versions to WebAssembly wheels
on the index, every wheel's own requirements, conflicts in words."""

import json
import pathlib
import shutil
import subprocess

import pytest

from conftest import BINARY, LOCK, SHARED_CACHE, mcp_session, run, server_env

pytestmark = pytest.mark.anyio

SEED_PYDANTIC = '''# /// script
# dependencies = ["pydantic", "email-validator"]
# ///
import pydantic

class Model(pydantic.BaseModel):
    email: pydantic.EmailStr

print(Model(email='hello@pydantic.dev'))
'''


async def test_seed_pydantic_example_backtracks_to_a_webassembly_pydantic_core():
    # The lock's pydantic pins its own build of pydantic-core, whose file is on the CDN only;
    # the resolver must fall back to a pydantic whose pydantic-core has a wheel on the index.
    assert not LOCK["packages"]["pydantic-core"]["file_name"].endswith("-any.whl")
    async with mcp_session("--workers", "1") as session:
        text = await run(session, SEED_PYDANTIC)
        assert text == (
            '<status>success</status>\n<dependencies>["pydantic","email-validator"]</dependencies>\n'
            "<output>\nemail='hello@pydantic.dev'\n</output>"
        ), text
        versions = await run(
            session,
            "import importlib.metadata as m\n[m.version('pydantic'), m.version('pydantic-core')]",
        )
        assert LOCK["packages"]["pydantic"]["version"] not in versions, versions


async def test_requirements_come_from_the_wheels_metadata():
    # The lock lists httpx with no dependencies; its wheel requires httpcore, anyio, idna, certifi.
    assert LOCK["packages"]["httpx"]["depends"] == []
    async with mcp_session("--workers", "1", "--deps", "httpx") as session:
        text = await run(session, "import httpx, idna, httpcore, anyio, certifi\nhttpx.__version__")
        # What --deps installed is no requirement of the call's own: no <dependencies> line, as
        # the Deno original (sandboxes, docs/architecture.md §3.1).
        assert text == (
            f"<status>success</status>\n<return_value>\n{LOCK['packages']['httpx']['version']}\n</return_value>"
        ), text
        # A package --deps did not bring is the call's own.
        text = await run(session, "import six\nsix.__name__")
        assert text.startswith('<status>success</status>\n<dependencies>["six"]</dependencies>\n'), text


async def test_conflicts_name_both_sides_and_installed_versions_are_pinned():
    async with mcp_session("--workers", "1") as session:
        text = await run(session, '# /// script\n# dependencies = ["rich<13", "textual>=1"]\n# ///\n1')
        assert text.startswith("<status>install-error</status>\n"), text
        assert "the call requires rich <13" in text and "the call requires textual >=1" in text, text
        assert "textual >=1.0.0, <6.3.0 depends on rich >=13.3.3" in text, text
        # Short: the ranges are simplified over the versions that exist.
        assert len(text) < 1000, text

        text = await run(session, "# /// script\n# dependencies = [\"rich<13\"]\n# ///\nimport rich\n1")
        assert text.startswith("<status>success</status>"), text
        # The interpreter has rich 12 now: a later call cannot get another rich in it.
        text = await run(session, '# /// script\n# dependencies = ["rich>=13"]\n# ///\n1')
        assert text.startswith("<status>install-error</status>"), text
        assert "`rich>=13` cannot be met: this sandbox's interpreter already has `rich==12." in text, text


async def test_a_downloaded_directory_serves_an_offline_server(tmp_path):
    mirror = tmp_path / "mirror"
    proc = subprocess.run(
        [BINARY, "packages", "download", "pydantic", "email-validator", "--dest", str(mirror),
         "--cache-dir", str(SHARED_CACHE)],
        capture_output=True, text=True, timeout=600, env=server_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert "pyodide-lock.json" in proc.stdout, proc.stdout
    lock = json.loads((mirror / "pyodide-lock.json").read_text())
    assert lock["info"] == LOCK["info"]
    for name in ("pydantic", "pydantic-core", "email-validator", "dnspython", "idna"):
        assert (mirror / lock["packages"][name]["file_name"]).is_file(), name

    # A second server with a new, empty download cache and no network use at all: the
    # directory alone must do. (The memory snapshot is copied only to boot faster.)
    cache = tmp_path / "cache"
    snapshots = pathlib.Path(SHARED_CACHE) / "snapshots"
    if snapshots.is_dir():
        shutil.copytree(snapshots, cache / "snapshots")
    args = ("--workers", "1", "--offline", "--packages-url", mirror.as_uri())
    async with mcp_session(*args, cache_dir=str(cache)) as session:
        assert await run(session, SEED_PYDANTIC) == (
            '<status>success</status>\n<dependencies>["pydantic","email-validator"]</dependencies>\n'
            "<output>\nemail='hello@pydantic.dev'\n</output>"
        )
        text = await run(session, "import humanize")
        assert text.startswith("<status>install-error</status>") and "offline" in text, text


def test_download_refuses_a_conflict(tmp_path):
    proc = subprocess.run(
        [BINARY, "packages", "download", "rich<13", "textual>=1", "--dest", str(tmp_path / "m"),
         "--cache-dir", str(SHARED_CACHE)],
        capture_output=True, text=True, timeout=600, env=server_env(),
    )
    assert proc.returncode == 1, proc.stdout
    assert "the requirements cannot all be met" in proc.stderr, proc.stderr

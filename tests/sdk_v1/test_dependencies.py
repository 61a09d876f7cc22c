"""Dependency rules (docs/architecture.md §5) with real PyPI downloads."""

import json

import pytest

from conftest import LOCK, mcp_session, run

pytestmark = pytest.mark.anyio


async def test_pep723_inferred_and_lock_fallback():
    async with mcp_session("--workers", "1") as session:
        # PEP 723 pins an older release than the lock file's rich, so it comes from PyPI.
        assert not LOCK["packages"]["rich"]["version"].startswith("12.")
        text = await run(
            session,
            '# /// script\n# dependencies = ["rich<13"]\n# ///\n'
            "import importlib.metadata\nimportlib.metadata.version('rich')",
        )
        assert text.startswith('<status>success</status>\n<dependencies>["rich<13"]</dependencies>\n'), text
        assert "<return_value>\n12." in text

        # An inferred import of a package only PyPI has.
        assert "humanize" not in LOCK["packages"]
        text = await run(session, "import humanize\nhumanize.intcomma(1234567)")
        assert text == (
            '<status>success</status>\n<dependencies>["humanize"]</dependencies>\n'
            "<return_value>\n1,234,567\n</return_value>"
        )

        # A pure-Python lock-file package: the packages URL (the Pyodide CDN) is unreachable
        # here, so its wheel comes from PyPI at the lock's version. The lock also lists `six`
        # for it, but attrs' own metadata requires nothing: the wheel's metadata is the truth.
        attrs = LOCK["packages"]["attrs"]
        assert attrs["depends"] == ["six"]
        text = await run(
            session,
            "import attrs, importlib.metadata\n"
            "@attrs.define\nclass P:\n    x: int\n"
            "[repr(P(1)), importlib.metadata.version('attrs')]",
        )
        assert text.startswith('<status>success</status>\n<dependencies>["attrs"]</dependencies>\n'), text
        values = json.loads(text.split("<return_value>\n")[1].split("\n</return_value>")[0])
        assert values == ["P(x=1)", attrs["version"]]

        # Import names map through the lock file (`yaml` is provided by `pyyaml`) and the
        # dependencies line is shown even when the package is already installed.
        text = await run(session, "import humanize\nhumanize.apnumber(4)")
        assert text.startswith('<status>success</status>\n<dependencies>["humanize"]</dependencies>')


async def test_install_errors_name_the_package():
    async with mcp_session("--workers", "1") as session:
        missing = "no-such-package-mcp-run-python-test"
        text = await run(session, f"# /// script\n# dependencies = [\"{missing}\"]\n# ///\nprint(1)")
        assert text.startswith("<status>install-error</status>\n"), text
        assert missing in text and "no such package" in text

        # psutil publishes only platform wheels (and an sdist): nothing runs on Pyodide.
        assert "psutil" not in LOCK["packages"]
        text = await run(session, "import psutil")
        assert text.startswith('<status>install-error</status>\n<dependencies>["psutil"]</dependencies>'), text
        assert "psutil: no release" in text and "wheel" in text

        # A lock-file package with native code cannot fall back to PyPI.
        text = await run(session, "import numpy")
        assert text.startswith("<status>install-error</status>"), text
        assert "numpy" in text and "not pure Python" in text

        bad = await run(session, '# /// script\n# dependencies = ["rich<<13"]\n# ///\n')
        assert bad.startswith("<status>install-error</status>") and "rich<<13" in bad

        assert await run(session, "1 + 1") == "<status>success</status>\n<return_value>\n2\n</return_value>"

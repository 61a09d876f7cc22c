"""The wheel on a machine that has Python and nothing else of ours: a minimal Debian made with
debootstrap (no JavaScriptCore, no GLib, no ICU, no Rust), entered as the root file system of a
mount namespace. pip installs the wheel there from files alone, and `mcp-run-python warmup` and
one `code_sandbox` call must succeed, loading no library from outside the wheel but glibc's.

The root is made once and kept in target/clean-root/ (about 1.5 minutes and 280 MB to make;
the test itself then takes about half a minute)."""

import os
import pathlib
import re
import shutil
import subprocess
import sys

from conftest import HERE, ROOT, SEED_LINE, SLOW, WHEEL, foreign_libraries

CACHE = ROOT / "target" / "clean-root"
# What the root has beyond debootstrap's `minbase` (apt, dpkg and the essentials): Python and
# its venv module, as on a user's bare machine.
PACKAGES = ["python3", "python3-venv"]
CLEAN_ROOT = HERE / "clean_root.sh"

CALL = '''
import asyncio
from mcp_run_python import code_sandbox

async def main():
    async with code_sandbox() as sandbox:
        result = await sandbox.eval('import sys\\nprint(sys.platform)\\nsum(range(10))')
    assert result == {'status': 'success', 'output': ['emscripten'], 'return_value': 45}, result
    print('call ok')

asyncio.run(main())
'''


def test_the_wheel_works_on_a_bare_root(tmp_path):
    assert os.geteuid() == 0, "this test needs root (debootstrap, mount namespaces)"
    root = bare_root()
    lib_dir = root / "usr" / "lib" / "x86_64-linux-gnu"
    assert not list(lib_dir.glob("libjavascriptcoregtk*")) and not list(lib_dir.glob("libicu*"))
    assert not list(lib_dir.glob("libglib-2.0*")) and shutil.which("cargo", path=str(root / "usr/bin")) is None

    work = tmp_path / "work"
    (work / "home").mkdir(parents=True)
    shutil.copy(WHEEL, work / WHEEL.name)
    python_version = root_python_version(root)
    wheelhouse(work / "wheelhouse", python_version)

    inside(root, work, "python3", "-m", "venv", "/mnt/venv")
    inside(root, work, "/mnt/venv/bin/pip", "install", "-q", "--no-index", "--find-links", "/mnt/wheelhouse",
           f"/mnt/{WHEEL.name}", *SEED_LINE)
    (binary,) = (work / "venv").glob("lib/python*/site-packages/mcp_run_python/_bin/mcp-run-python")
    inner = "/mnt/" + str(binary.relative_to(work))
    ldd = inside(root, work, "ldd", inner)
    assert foreign_libraries(ldd, str(pathlib.Path(inner).parent.parent / "_libs")) == {}, ldd

    warmup = inside(root, work, "/mnt/venv/bin/mcp-run-python", "warmup")
    assert "\nwarmup done in " in warmup, warmup
    # A bare root takes nothing from the sandbox: every layer is on, as on the host.
    assert "userns: on" in warmup and ": off" not in warmup, warmup
    (work / "call.py").write_text(CALL)
    assert inside(root, work, "/mnt/venv/bin/python", "/mnt/call.py").endswith("call ok\n")


def inside(root: pathlib.Path, work: pathlib.Path, *command: str) -> str:
    """Runs `command` in the bare root; returns its stdout, failing with its stderr."""
    done = subprocess.run([str(CLEAN_ROOT), str(root), str(work), *command],
                          capture_output=True, text=True, timeout=SLOW)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def bare_root() -> pathlib.Path:
    """A minbase root of the host's own release (same suite, same mirror), made once."""
    release = os_release()
    codename = release["VERSION_CODENAME"]
    mirror = apt_mirror(release["ID"], codename)
    recipe = f"{codename} {mirror} minbase {' '.join(PACKAGES)}\n"
    root = CACHE / codename
    stamp = CACHE / f"{codename}.made"
    if stamp.exists() and stamp.read_text() == recipe:
        return root
    shutil.rmtree(root, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", codename, str(root), mirror],
        check=True, timeout=SLOW, stdout=subprocess.DEVNULL,
    )
    stamp.write_text(recipe)
    return root


def os_release() -> dict[str, str]:
    fields = {}
    for line in pathlib.Path("/etc/os-release").read_text().splitlines():
        key, _, value = line.partition("=")
        fields[key] = value.strip('"')
    return fields


def apt_mirror(distro: str, codename: str) -> str:
    """The host's own package mirror for `codename`, from its apt sources (one-line or deb822)."""
    sources = pathlib.Path("/etc/apt")
    files = [sources / "sources.list", *sorted((sources / "sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text()
        for m in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+(\S+)", text, re.M):
            if m.group(2) == codename:
                return m.group(1)
        for stanza in text.split("\n\n"):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.M))
            if codename in fields.get("Suites", "").split() and "deb" in fields.get("Types", "").split():
                return fields["URIs"].split()[0]
    raise AssertionError(f"no apt source for {distro} {codename} in /etc/apt")


def root_python_version(root: pathlib.Path) -> str:
    (python,) = [p.name for p in (root / "usr" / "bin").glob("python3.*") if re.fullmatch(r"python3\.\d+", p.name)]
    return python.removeprefix("python")


def wheelhouse(dest: pathlib.Path, python_version: str) -> None:
    """The wheels `mcp` needs for the root's Python, downloaded on the host (the root has no
    network of its own in this test)."""
    platforms = [f"manylinux_2_{minor}_x86_64" for minor in (17, 28, 31, 34, 35, 36)] + ["manylinux2014_x86_64"]
    args = ["--python-version", python_version, "--only-binary=:all:"]
    for platform in platforms:
        args += ["--platform", platform]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
         "--dest", str(dest), *args, *SEED_LINE],
        check=True, timeout=SLOW,
    )

"""The wheel on a machine that has Python and nothing else of ours: a minimal Debian made with
debootstrap (no JavaScriptCore, no GLib, no ICU, no Rust), entered as the root file system of a
mount namespace. pip installs the wheel there from files alone, and `mcp-run-python warmup` and
one `code_sandbox` call must succeed, loading no library from outside the wheel but glibc's.

The root is made once and kept in target/clean-root/ (about 1.5 minutes and 280 MB to make;
the test itself then takes about half a minute)."""

import os
import pathlib
import shutil
import subprocess

from conftest import HERE, SEED_LINE, SLOW, WHEEL, foreign_libraries
from debian_root import bare_root, download_wheels, host_arch, root_python_version

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
    arch = host_arch()
    root = bare_root(arch, PACKAGES)
    lib_dir = root / "usr" / "lib" / f"{arch}-linux-gnu"
    assert not list(lib_dir.glob("libjavascriptcoregtk*")) and not list(lib_dir.glob("libicu*"))
    assert not list(lib_dir.glob("libglib-2.0*")) and shutil.which("cargo", path=str(root / "usr/bin")) is None

    work = tmp_path / "work"
    (work / "home").mkdir(parents=True)
    shutil.copy(WHEEL, work / WHEEL.name)
    python_version = root_python_version(root)
    # The root has no network of its own in this test.
    download_wheels(work / "wheelhouse", python_version, arch, SEED_LINE)

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

"""Bare Debian roots made with debootstrap, for the tests that install the wheel where nothing
of this project is: tests/wheel/test_clean_root.py (the host's architecture, entered with a mount
namespace) and tests/aarch64/ (arm64, booted in an emulated machine). Each root is made once
from the host's own release and mirror and kept in target/clean-root/, behind a stamp that
names what it was made of.

Also: the wheels of a requirement list for another Python and architecture, downloaded on the
host (the roots have no network of their own while they are set up)."""

import pathlib
import platform
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
CACHE = ROOT / "target" / "clean-root"
# Seconds for debootstrap (about 1.5 minutes natively, 2 under qemu-user for arm64) and pip.
SLOW = 900
# Debian's architecture names, by the wheel's (`uname -m`) name.
DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}
# The manylinux glibc minors pip is told to accept (the wheels `mcp` and PydanticAI need are
# tagged with one of them), plus the legacy manylinux2014 alias.
MANYLINUX_MINORS = (17, 28, 31, 34, 35, 36)


def bare_root(arch: str, packages: list[str]) -> pathlib.Path:
    """A minbase root of the host's own release (same suite, same mirror) for `arch` (a wheel
    architecture: x86_64 or aarch64) with `packages` added, made once. A foreign architecture's
    package scripts run through qemu-user (scripts/setup-emulation.sh registers it)."""
    release = os_release()
    codename = release["VERSION_CODENAME"]
    mirror = apt_mirror(release["ID"], codename)
    debian_arch = DEBIAN_ARCH[arch]
    native = arch == host_arch()
    # The host's root keeps its first name (and cache) from before arm64 roots existed.
    name = codename if native else f"{codename}-{debian_arch}"
    recipe = f"{codename} {mirror} minbase {' '.join(packages)}\n"
    if not native:
        recipe = f"{debian_arch} {recipe}"
    root = CACHE / name
    stamp = CACHE / f"{name}.made"
    if stamp.exists() and stamp.read_text() == recipe:
        return root
    shutil.rmtree(root, ignore_errors=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["debootstrap", f"--arch={debian_arch}", "--variant=minbase", f"--include={','.join(packages)}",
         codename, str(root), mirror],
        check=True, timeout=SLOW, stdout=subprocess.DEVNULL,
    )
    stamp.write_text(recipe)
    return root


def host_arch() -> str:
    """The host's architecture by the wheel's name for it (`uname -m`)."""
    return platform.machine()


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
    """The root's Python as `3.N`."""
    (python,) = [p.name for p in (root / "usr" / "bin").glob("python3.*") if re.fullmatch(r"python3\.\d+", p.name)]
    return python.removeprefix("python")


def download_wheels(dest: pathlib.Path, python_version: str, arch: str, requirements: list[str]) -> None:
    """The wheels `requirements` need for Python `python_version` on `arch`, downloaded by the
    host's pip into `dest`."""
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in MANYLINUX_MINORS] + [f"manylinux2014_{arch}"]
    args = ["--python-version", python_version, "--only-binary=:all:"]
    for platform in platforms:
        args += ["--platform", platform]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
         "--dest", str(dest), *args, *requirements],
        check=True, timeout=SLOW,
    )

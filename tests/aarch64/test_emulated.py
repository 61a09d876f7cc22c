"""The aarch64 wheel (aarch64, docs/platforms.md) as a user on an arm64 machine installs and runs it, on an
emulated arm64 machine: `qemu-system-aarch64` (TCG, 2 cores, `neoverse-n1`, as a Graviton 2)
boots Debian's arm64 kernel with an initramfs made of a bare arm64 Debian (debootstrap: Python
and nothing of ours), the wheel, a wheelhouse, an `escape-test` build and guest/. The guest's
/init runs guest/smoke.py, whose `SMOKE <json>` lines on the serial console are checked here:

- pip installs the wheel into a fresh venv, and its binary loads no library but glibc's from
  outside the wheel;
- `mcp-run-python warmup` reports seccomp, Landlock and every namespace on;
- `mcp-run-python example` prints its result (PyPI through qemu's user-mode network);
- a PydanticAI (1.x) agent runs Python through `MCPServerStdio('mcp-run-python')`, and the
  zygote service its server started gets ready with its helper threads' timeout shortened;
- the escape probes: sealed, the filter kills the worker at a file open and at `fork` (a
  `clone` on aarch64); without the filter, Landlock and the namespaces refuse the rest.

A whole machine rather than qemu-user: qemu-user implements neither seccomp(2) nor Landlock
(ENOSYS) and its own thread bars a user namespace, so no layer could be shown on.

Inputs, from scripts/test.sh: MCP_RUN_PYTHON_AARCH64_WHEEL (the dev-profile wheel of
`scripts/build-wheel.sh --dev --target aarch64`) and MCP_RUN_PYTHON_AARCH64_ESCAPE (the binary
built with `--features escape-test` for aarch64). Needs root (debootstrap) and
scripts/setup-emulation.sh's qemu; the arm64 root and kernel are kept in target/clean-root/
(about 2 minutes to make), and the test then takes about 4 minutes."""

import dataclasses
import errno
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "shared"))
from debian_root import CACHE, bare_root, download_wheels, root_python_version  # noqa: E402
from loaded_libraries import foreign_libraries  # noqa: E402

WHEEL = pathlib.Path(os.environ["MCP_RUN_PYTHON_AARCH64_WHEEL"]).resolve()
ESCAPE_BINARY = pathlib.Path(os.environ["MCP_RUN_PYTHON_AARCH64_ESCAPE"]).resolve()
GUEST = HERE / "guest"
# The root's packages beyond minbase: Python and its venv module, as on a user's bare machine,
# and the machine's own plumbing for /init (modprobe, ip).
PACKAGES = ["python3", "python3-venv", "kmod", "iproute2"]
# What guest/smoke.py installs beside the wheel (its REQUIREMENTS): the seed's client line.
REQUIREMENTS = ["mcp==1.30.0", "pydantic-ai-slim[mcp]==1.107.10"]
# Debian's metapackage that names the current arm64 kernel package.
KERNEL_METAPACKAGE = "linux-image-arm64:arm64"
# The kernel modules /init loads for qemu's network device (with what they depend on).
MODULES = ["virtio_pci", "virtio_net"]
# The emulated machine: a Neoverse N1 (Graviton 2's core) with 2 cores and 4 GiB, whose
# initramfs (~400 MB) is unpacked into its memory.
QEMU_MACHINE = ["-M", "virt", "-cpu", "neoverse-n1", "-smp", "2", "-m", "4096"]
# qemu's user-mode network (the host's own sockets, so the guest reaches what the host does),
# on a virtio card without a boot ROM (the kernel is loaded directly; no firmware runs).
QEMU_NETWORK = ["-netdev", "user,id=net", "-device", "virtio-net-pci,netdev=net,romfile="]
KERNEL_ARGS = "console=ttyAMA0 panic=-1 quiet loglevel=1"
# Seconds for the whole guest run (about 4 minutes on 2 free cores; more while other suites run).
GUEST_TIMEOUT = 1800
# Seconds for apt-get and dpkg-deb.
APT_TIMEOUT = 300
# Debian's bundle of every trusted CA (update-ca-certificates), on the host and in the guest.
HOST_CA_BUNDLE = pathlib.Path("/etc/ssl/certs/ca-certificates.crt")
EM_AARCH64 = 183
# The guest's numbers, which Linux gives the same on aarch64 as on this x86_64 host.
SIGSYS = signal.SIGSYS
EACCES = errno.EACCES
# The escape probes only the seccomp filter stops (tests/sandbox_escape.rs's SECCOMP_ONLY, which
# says why each is harmless under the other layers).
SECCOMP_ONLY = {"fork", "unshare_user_namespace", "io_uring_setup", "userfaultfd_with_kernel_faults",
                "ioctl_other_descriptor", "read_page_map"}
# What an older kernel's Landlock ABI leaves to the filter alone, by the words the confinement
# report says it with (Debian 12's 6.1 kernel has ABI 2; README "Security model"): a TCP bind,
# which succeeds only inside the worker's own network namespace (no interface is up), and a
# signal to the front, which only the filter's own-process rule on kill/tgkill refuses.
LANDLOCK_GAPS = {"tcp allowed: abi < 4": {"tcp_bind"}, "no scoping: abi < 6": {"kill_front", "tgkill_front"}}


@dataclasses.dataclass
class Kernel:
    image: pathlib.Path
    modules: pathlib.Path  # a tree to place at /usr/lib/modules in the guest


def test_the_aarch64_wheel_on_an_emulated_arm64_machine(tmp_path):
    assert os.geteuid() == 0, "this test needs root (debootstrap)"
    assert WHEEL.name.endswith("_aarch64.whl"), WHEEL
    root = bare_root("aarch64", PACKAGES)
    steps = boot(tmp_path, root, arm64_kernel())
    machine = step(steps, "machine")
    assert machine["arch"] == "aarch64" and machine["page_size"] == 4096, machine
    assert "landlock" in (machine["lsm"] or ""), machine

    installed = step(steps, "install")
    assert installed["pip"]["rc"] == 0, installed["pip"]
    assert installed["file_machine"] == EM_AARCH64, installed
    libs = str(pathlib.PurePath(installed["binary"]).parent.parent / "_libs")
    assert foreign_libraries(installed["ldd"], libs) == {}, installed["ldd"]

    warmup = step(steps, "warmup")
    report = warmup["stdout"]
    assert warmup["rc"] == 0 and "\nwarmup done in " in report, warmup
    for layer in ("seccomp", "landlock", "userns", "netns", "mntns", "capabilities", "rlimits"):
        assert f"{layer}: on" in report, f"{layer} is not on:\n{report}"
    assert ": off" not in report, report

    example = step(steps, "example")
    assert example["rc"] == 0, example
    assert '"answer": 42' in example["stdout"] and "1 hour, 2 minutes and 5 seconds" in example["stdout"], example

    agent = step(steps, "agent")
    assert agent["rc"] == 0, agent
    assert "tool said: <status>success</status>" in agent["stdout"], agent
    assert "hello from emscripten" in agent["stdout"] and '"sum": 45' in agent["stdout"], agent

    # The zygote service the agent's server started got ready, with its zygote's own lines in
    # its log (agent.py's filter); none says the engine's helper threads kept their 10 s idle
    # timeout, so the interposed `WTF::AutomaticThread` constructors (src/engine/helper_threads.rs,
    # the one ABI-sensitive spot) work on aarch64 too.
    zygote = "\n".join(step(steps, "zygote")["logs"].values())
    assert "zygote service ready" in zygote and "the zygote has one thread after" in zygote, zygote
    assert "keep their 10 s idle timeout" not in zygote, zygote

    check_escape(step(steps, "escape"))


def check_escape(escape: dict) -> None:
    """Sealed, the filter kills the worker at its first file open and at `fork`; without the
    filter, every probe fails but those only the filter stops (as in tests/sandbox_escape.rs)."""
    report = json.dumps(escape, indent=1)
    for run in ("sealed", "sealed_from_fork"):
        worker = escape[run]
        assert worker["ready"]["confined"] is True, f"{run}: the worker did not seal itself fully:\n{report}"
        assert worker["results"] == [] and worker["signal"] == SIGSYS, f"{run}:\n{report}"
    assert escape["sealed"]["killed_at"] == "open_etc_passwd", report
    assert escape["sealed_from_fork"]["killed_at"] == "fork", report

    unsealed = escape["without_seccomp"]
    line = unsealed["ready"]["sandbox"]
    assert "seccomp: off" in line, line
    for layer in ("landlock", "userns", "netns", "capabilities", "rlimits"):
        assert f"{layer}: on" in line, f"{layer} is off: {line}"
    assert unsealed["done"] and unsealed["signal"] is None, report
    outcomes = dict(unsealed["results"])
    assert outcomes["open_etc_passwd"] == f"blocked errno {EACCES}", report
    left_open = SECCOMP_ONLY.union(*(probes for gap, probes in LANDLOCK_GAPS.items() if gap in line))
    escapes = [name for name, outcome in outcomes.items()
               if not outcome.startswith("blocked") and name not in left_open]
    assert escapes == [], report
    assert not escape["connected"] and not escape["wrote"], report


def step(steps: dict[str, dict], name: str) -> dict:
    """What the guest reported for step `name`; fails with its traceback if it raised."""
    assert name in steps, f"the guest did not report {name}: {sorted(steps)}"
    assert "error" not in steps[name], f"{name} raised in the guest:\n{steps[name]['error']}"
    return steps[name]


def boot(tmp_path: pathlib.Path, root: pathlib.Path, kernel: Kernel) -> dict[str, dict]:
    """Boots the guest until it powers off; returns its steps by name."""
    initrd = tmp_path / "initrd.cpio"
    with open(initrd, "wb") as out:
        # The kernel unpacks concatenated archives in order: the guest's files over the root.
        with open(root_archive(root), "rb") as archive:
            shutil.copyfileobj(archive, out)
        write_cpio(guest_files(tmp_path / "guest", root, kernel), out, "--owner=0:0")
    console = tmp_path / "console.log"
    with open(console, "wb") as log:
        done = subprocess.run(
            ["qemu-system-aarch64", *QEMU_MACHINE, "-kernel", str(kernel.image), "-initrd", str(initrd),
             "-append", KERNEL_ARGS, "-display", "none", "-serial", "stdio", "-monitor", "none",
             "-no-reboot", *QEMU_NETWORK],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=GUEST_TIMEOUT,
        )
    text = console.read_text(errors="replace")
    shutil.copy(console, CACHE / "aarch64-console.log")
    assert done.returncode == 0, f"qemu exited {done.returncode}:\n{text[-4000:]}"
    assert re.search(r"^SMOKE-END 0\r?$", text, re.M), f"the guest did not finish:\n{text[-4000:]}"
    steps = {}
    for line in text.splitlines():
        if line.startswith("SMOKE {"):
            fields = json.loads(line.removeprefix("SMOKE "))
            steps[fields.pop("step")] = fields
    return steps


def guest_files(dest: pathlib.Path, root: pathlib.Path, kernel: Kernel) -> pathlib.Path:
    """The tree laid over the root: /init, /smoke (the steps, the wheel, its wheelhouse, the
    escape-test build), the kernel modules and the host's CA bundle."""
    smoke = dest / "smoke"
    (smoke / "escape").mkdir(parents=True)
    shutil.copy(GUEST / "init", dest / "init")
    for name in ("smoke.py", "agent.py"):
        shutil.copy(GUEST / name, smoke / name)
    shutil.copy(WHEEL, smoke / WHEEL.name)
    shutil.copy(ESCAPE_BINARY, smoke / "escape" / "mcp-run-python")
    download_wheels(smoke / "wheelhouse", root_python_version(root), "aarch64", REQUIREMENTS)
    shutil.copytree(kernel.modules, dest / "usr" / "lib" / "modules")
    # The host's trust anchors: the guest's network is the host's, and reaches PyPI only as the
    # host does (through whatever TLS gateway the host trusts).
    (dest / "etc" / "ssl" / "certs").mkdir(parents=True)
    shutil.copy(HOST_CA_BUNDLE, dest / "etc" / "ssl" / "certs" / HOST_CA_BUNDLE.name)
    return dest


def write_cpio(tree: pathlib.Path, out, *options: str) -> None:
    """`tree` as a newc cpio archive (the initramfs format) into the open file `out`, with
    cpio's `options` (`--owner=0:0`: every file owned by root)."""
    names = subprocess.run(["find", "."], cwd=tree, capture_output=True, check=True).stdout
    out.flush()
    subprocess.run(["cpio", "-o", "-H", "newc", "--quiet", *options], cwd=tree, input=names, stdout=out,
                   check=True)


def root_archive(root: pathlib.Path) -> pathlib.Path:
    """The arm64 root as a cpio archive, made once per root (its stamp is the root's)."""
    archive = root.with_suffix(".cpio")
    stamp = root.with_name(root.name + ".cpio.made")
    made = root.with_name(root.name + ".made").read_text()
    if not (archive.exists() and stamp.exists() and stamp.read_text() == made):
        with open(archive, "wb") as out:
            write_cpio(root, out)
        stamp.write_text(made)
    return archive


def arm64_kernel() -> Kernel:
    """Debian's current arm64 kernel package (apt's arm64 lists: scripts/setup-cross.sh adds the
    architecture), unpacked once: its image and the modules of MODULES with their dependencies."""
    package = apt_field(KERNEL_METAPACKAGE, "Depends").split(",")[0].split()[0].split(":")[0] + ":arm64"
    version = apt_field(package, "Version")
    dest = CACHE / "kernel-arm64"
    stamp = CACHE / "kernel-arm64.made"
    recipe = f"{package} {version} {' '.join(MODULES)}\n"
    if stamp.exists() and stamp.read_text() == recipe:
        return Kernel(dest / "vmlinuz", dest / "modules")
    shutil.rmtree(dest, ignore_errors=True)
    download = dest / "download"
    download.mkdir(parents=True)
    subprocess.run(["apt-get", "download", "-q", f"{package}={version}"], cwd=download, check=True,
                   capture_output=True, timeout=APT_TIMEOUT)
    (deb,) = download.glob("*.deb")
    unpacked = download / "unpacked"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True, timeout=APT_TIMEOUT)
    (image,) = unpacked.glob("boot/vmlinuz-*")
    shutil.copy(image, dest / "vmlinuz")
    (tree,) = [p for p in unpacked.glob("*lib/modules/*") if p.is_dir()]
    # The package leaves the modules' index to its postinst.
    subprocess.run(["depmod", "-b", str(unpacked), tree.name], check=True, timeout=APT_TIMEOUT)
    copy_modules(tree, dest / "modules" / tree.name)
    shutil.rmtree(download)
    stamp.write_text(recipe)
    return Kernel(dest / "vmlinuz", dest / "modules")


def copy_modules(tree: pathlib.Path, dest: pathlib.Path) -> None:
    """The MODULES of the kernel's module tree, with what modules.dep says they need and the
    index files modprobe reads."""
    dest.mkdir(parents=True)
    for index in tree.glob("modules.*"):
        shutil.copy(index, dest / index.name)
    needs = {}
    for line in (tree / "modules.dep").read_text().splitlines():
        module, _, deps = line.partition(":")
        needs[pathlib.PurePath(module).name.split(".ko")[0]] = [module, *deps.split()]
    for name in MODULES:
        assert name in needs, f"{name} is not a module of {tree}"
        for path in needs[name]:
            (dest / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(tree / path, dest / path)


def apt_field(package: str, field: str) -> str:
    shown = subprocess.run(["apt-cache", "show", "--no-all-versions", package], capture_output=True, text=True,
                           check=True, timeout=APT_TIMEOUT).stdout
    match = re.search(rf"^{field}: (.*)$", shown, re.M)
    assert match, f"apt-cache show {package} has no {field}:\n{shown}"
    return match.group(1)

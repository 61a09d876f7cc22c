"""The smoke steps inside the emulated arm64 machine (tests/aarch64/test_emulated.py), run by
the guest's /init with Debian's python3 (standard library only). Each step prints one line,
`SMOKE <json>`, with what the host test checks: the machine, the wheel installed by pip into a
fresh venv, `mcp-run-python warmup` (its confinement report), `mcp-run-python example`, a
PydanticAI agent over `MCPServerStdio` (agent.py), the log of the zygote service its server
started, and the escape probes of an `escape-test` build. A step that raises prints its
traceback instead; the next step still runs."""

import json
import os
import pathlib
import platform
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback

SMOKE = pathlib.Path("/smoke")
VENV = pathlib.Path("/venv")
# The seed's client line, pinned as in tests/wheel (the wheel asks only for mcp>=1.13.1).
REQUIREMENTS = ["mcp==1.30.0", "pydantic-ai-slim[mcp]==1.107.10"]
# Seconds for anything that boots Pyodide or installs: under emulation a first boot takes
# about 40 s, ten times the host's.
SLOW = 900
# Seconds the zygote step waits for the zygote service to say it is ready, and what it says.
ZYGOTE_WAIT = 300
ZYGOTE_READY = "zygote service ready"
ENV = {"PATH": f"{VENV}/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


def report(step: str, **fields) -> None:
    print("SMOKE " + json.dumps({"step": step, **fields}), flush=True)


def run(*argv: str, timeout: int = SLOW) -> dict:
    done = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=timeout)
    return {"rc": done.returncode, "stdout": done.stdout, "stderr": done.stderr}


def machine() -> dict:
    lsm = pathlib.Path("/sys/kernel/security/lsm")
    return {
        "arch": platform.machine(),
        "kernel": platform.release(),
        "page_size": os.sysconf("SC_PAGE_SIZE"),
        "lsm": lsm.read_text() if lsm.exists() else None,
        "python": platform.python_version(),
    }


def install() -> dict:
    (wheel,) = SMOKE.glob("mcp_run_python-*.whl")
    venv = run(sys.executable, "-m", "venv", str(VENV))
    if venv["rc"] != 0:
        return {"venv": venv}
    # --no-compile: byte-compiling every module under emulation would double the install.
    pip = run(str(VENV / "bin/pip"), "install", "-q", "--disable-pip-version-check", "--no-compile", "--no-index",
              "--find-links", str(SMOKE / "wheelhouse"), str(wheel), *REQUIREMENTS)
    result = {"wheel": wheel.name, "pip": pip}
    binaries = list(VENV.glob("lib/python*/site-packages/mcp_run_python/_bin/mcp-run-python"))
    if binaries:
        result["binary"] = str(binaries[0])
        result["ldd"] = run("ldd", str(binaries[0]))["stdout"]
        result["file_machine"] = elf_machine(binaries[0])
    return result


def elf_machine(path: pathlib.Path) -> int:
    """`e_machine` of an ELF file (183 is EM_AARCH64)."""
    with open(path, "rb") as f:
        header = f.read(20)
    return struct.unpack_from("<H", header, 18)[0]


def write_frame(out, header: dict) -> None:
    body = json.dumps(header).encode()
    out.write(struct.pack("<I", len(body)) + body + struct.pack("<I", 0))
    out.flush()


def read_frame(stream) -> tuple[dict, list[bytes]]:
    """One frame of the worker protocol: u32 header length, JSON header, u32 attachment count,
    then each attachment as u64 length and bytes (little-endian)."""

    def exactly(n: int) -> bytes:
        data = stream.read(n)
        if len(data) != n:
            raise EOFError(f"the worker closed its pipe after {len(data)} of {n} bytes")
        return data

    header = json.loads(exactly(struct.unpack("<I", exactly(4))[0]))
    attachments = [exactly(struct.unpack("<Q", exactly(8))[0]) for _ in range(struct.unpack("<I", exactly(4))[0])]
    return header, attachments


def escape_worker(port: int, first: str, snapshot: bytes | None, without_seccomp: bool = False) -> dict:
    """One worker of the escape-test build (as tests/sandbox_escape.rs's `run_worker`): boots
    (making a snapshot, or from `snapshot`), seals itself, and runs the probes from `first` (an
    index or a name) until one kills it or none is left."""
    (binary,) = SMOKE.glob("escape/mcp-run-python")
    (libs,) = VENV.glob("lib/python*/site-packages/mcp_run_python/_libs")
    hole = ",without-seccomp" if without_seccomp else ""
    args = [str(binary), "__worker", f"--escape-test={port},{first}{hole}"]
    pass_fds: tuple[int, ...] = ()
    held = None
    if snapshot is not None:
        held = tempfile.TemporaryFile()
        held.write(snapshot)
        held.flush()
        os.set_inheritable(held.fileno(), True)
        pass_fds = (held.fileno(),)
        args.append(f"--snapshot-fd={held.fileno()}")
    # The worker is started alone, so it finds the wheel's libraries by LD_LIBRARY_PATH (the
    # build has no RPATH of its own); the front starts its workers with an empty environment.
    worker = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={"LD_LIBRARY_PATH": str(libs)}, pass_fds=pass_fds)
    try:
        write_frame(worker.stdin, {"op": "boot", "snapshot": "load" if snapshot is not None else "make"})
        ready, made = read_frame(worker.stdout)
        worker.stdin.close()
        lines = worker.stderr.read().decode(errors="replace").splitlines()
        status = worker.wait(timeout=SLOW)
    finally:
        worker.kill()
        if held is not None:
            held.close()
    results, trying, done = [], None, False
    for line in lines:
        if not line.startswith("escape-probe "):
            continue
        index, name, outcome = (line.removeprefix("escape-probe ").split(" ", 2) + [""])[:3]
        if index == "done":
            done = True
        elif outcome == "trying":
            trying = name
        else:
            trying = None
            results.append([name, outcome])
    return {"ready": {k: ready.get(k) for k in ("kind", "confined", "sandbox")}, "results": results,
            "killed_at": trying, "done": done, "signal": -status if status < 0 else None,
            "snapshot": made[-1] if made else None, "log": "\n".join(lines[-40:])}


def escape() -> dict:
    """Three workers of the escape-test build: sealed, from the first probe (opening a file,
    which the filter kills on sight) and from `fork` (which aarch64 has no call for: glibc
    makes it a `clone` without CLONE_THREAD, which the filter kills); then without the filter,
    every probe, which the other layers must refuse."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    port = listener.getsockname()[1]
    written = pathlib.Path("/tmp/mcp-run-python-escape-test")
    first = escape_worker(port, "0", None)
    snapshot = first.pop("snapshot")
    fork = escape_worker(port, "fork", snapshot)
    without_seccomp = escape_worker(port, "0", snapshot, without_seccomp=True)
    for worker in (fork, without_seccomp):
        worker.pop("snapshot")
    try:
        listener.accept()
        connected = True
    except BlockingIOError:
        connected = False
    return {"sealed": first, "sealed_from_fork": fork, "without_seccomp": without_seccomp,
            "connected": connected, "wrote": written.exists()}


def zygote() -> dict:
    """The log of the zygote service the agent's server started (it outlives the server), once
    it says the service is ready, or after ZYGOTE_WAIT seconds."""
    directory = pathlib.Path(ENV["HOME"]) / ".cache" / "mcp-run-python" / "zygote"
    deadline = time.monotonic() + ZYGOTE_WAIT
    while True:
        logs = {p.name: p.read_text(errors="replace") for p in sorted(directory.glob("*.log"))}
        if any(ZYGOTE_READY in text for text in logs.values()) or time.monotonic() > deadline:
            return {"logs": {name: text[-6000:] for name, text in logs.items()}}
        time.sleep(1)


STEPS = {
    "machine": machine,
    "install": install,
    "warmup": lambda: run(str(VENV / "bin/mcp-run-python"), "warmup"),
    "example": lambda: run(str(VENV / "bin/mcp-run-python"), "example"),
    "agent": lambda: run(str(VENV / "bin/python"), str(SMOKE / "agent.py")),
    "zygote": zygote,
    "escape": escape,
}


def main() -> None:
    for step, action in STEPS.items():
        start = time.monotonic()
        try:
            fields = action()
        except Exception:  # reported to the host test, which fails on it
            fields = {"error": traceback.format_exc()}
        report(step, seconds=round(time.monotonic() - start, 1), **fields)


if __name__ == "__main__":
    main()

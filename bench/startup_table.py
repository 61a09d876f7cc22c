"""Benchmark: the startup table of pydantic's Monty (PyPI `pydantic-monty`), reproduced with
mcp-run-python through its Python API (`code_sandbox`), in one run. Every figure is the p50 of
several repetitions, and each is given as a ratio to Monty's figure for the same row, measured in
the same process:

1. cold, nothing -> the result of `1 + 1`: Monty, a new worker pool + a checkout + `feed_run`;
   ours, `async with code_sandbox() as s: await s.eval('1 + 1')` (until the result; the close
   is not timed);
2. an agent run from nothing: open, 10 REPL blocks that build on each other and end in a
   `print`, close: Monty, a new pool and one checked-out session; ours,
   `code_sandbox(stateful=True)`;
3. the same agent run in an open sandbox: Monty, a checkout from a warm pool (returned at the
   end); ours, the 10 blocks in a `stateful` sandbox already open (its globals are the previous
   run's, which the blocks rebind);
4. a pure-Python loop, `x = 0; for i in range(3 * 10**6): x += i`: Monty, a session of a warm
   pool; ours, a sandbox already open (both after one untimed run of the loop);
5. the first call with no service running (the first front of the day, or after
   `--zygote-idle-exit`), the memory snapshot cached: as row 1, but the service is stopped
   before each run, against `--no-shared-zygote` in turn (Monty has no service: its row 1);

against two baselines: CPython in a subprocess (`python3 -c`, start included) and in-process
`exec` (no start at all). Ours comes in two variants: the per-host zygote service warm (the
default of a binary that has it), and without it (`--no-shared-zygote`: each stdio front boots
its own interpreter, from the memory snapshot in its cache). With a binary whose `--help` has no
`--no-shared-zygote`, the service's column says "n/a (binary has no shared zygote)" and the other
runs with today's behaviour.

The service: the bench points XDG_RUNTIME_DIR (where the service's socket lives) and
XDG_CACHE_HOME (the download cache and memory snapshot) at a fresh temporary directory of its
own, so that it starts and owns its own service; it warms the service (one `code_sandbox`, then
`mcp-run-python zygote status` until a line says `ready`, up to 60 s) and always ends with
`mcp-run-python zygote stop`. The `mcp` client passes a server only HOME, LOGNAME, PATH, SHELL,
TERM and USER from the environment (as `code_sandbox`'s own client does), so the bench adds those
two variables to what it passes.

It runs in a venv of its own, `.venv-bench` (`mcp` and `pydantic-monty`, pinned below; made or
remade when the pins change, then the script runs again in it), with the package from `pysrc/`
and the binary given by `--binary`:

    cargo build --release
    python3 bench/startup_table.py [--binary target/release/mcp-run-python] [--runs 10] [--quick]

It prints a Markdown table (the README's) and one line of JSON; the servers' logs go to stderr.
It takes 40 s without the service on the 2-core machine, a minute or so with it (`--runs N`: N
loop runs, 2N of each start row, 20N of each warm agent run; `--quick`: a smoke test).
"""

import argparse
import asyncio
import contextlib
import io
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-bench"
# The bench's own venv. pydantic-monty 1.5.0 cannot be installed (its pydantic-monty-client 1.5.0
# is not published), hence 1.4.0; mcp as in tests/sdk_v1/requirements.txt.
REQUIREMENTS = ["mcp==1.30.0", "pydantic-monty==1.4.0"]

# Ten REPL blocks that build on each other, the last one printing; in the Python subset Monty
# runs (no imports, no classes).
BLOCKS = [
    "data = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]",
    "def mean(xs):\n    return sum(xs) / len(xs)",
    "avg = mean(data)",
    "squares = [x * x for x in data]",
    "counts = {}\nfor x in data:\n    counts[x] = counts.get(x, 0) + 1",
    "top = sorted(counts, key=lambda k: (-counts[k], k))[0]",
    "total = sum(squares) + top",
    "def describe(n):\n    return 'even' if n % 2 == 0 else 'odd'",
    "label = describe(total)",
    "print(f'{avg:.3f} {top} {total} {label}')",
]
LOOP = "x = 0\nfor i in range(3 * 10**6):\n    x += i\nx"
LOOP_RESULT = sum(range(3 * 10**6))
# How long the service may take to become ready after its first use (seconds).
SERVICE_WAIT = 60
SERVICE_NA = "n/a (binary has no shared zygote)"


def ensure_venv():
    """Runs this script again in `.venv-bench`, made (or remade when REQUIREMENTS change) first."""
    if pathlib.Path(sys.prefix).resolve() == VENV.resolve():
        return
    python, stamp = VENV / "bin" / "python", VENV / ".requirements"
    wanted = "\n".join(REQUIREMENTS) + "\n"
    if not python.exists() or not stamp.exists() or stamp.read_text() != wanted:
        print(f"startup_table: installing {' '.join(REQUIREMENTS)} into {VENV.name}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *REQUIREMENTS],
                       check=True)
        stamp.write_text(wanted)
    os.execv(str(python), [str(python), str(pathlib.Path(__file__).resolve()), *sys.argv[1:]])


def expected_output():
    """What the blocks print, run by this CPython (every implementation must print it)."""
    namespace, out = {}, io.StringIO()
    with contextlib.redirect_stdout(out):
        for block in BLOCKS:
            exec(block, namespace)
    return out.getvalue().strip()


def p50_ms(times):
    return statistics.median(times) * 1000


# --- Monty -----------------------------------------------------------------------------------

def monty_rows(runs):
    """Monty's p50 (ms) per row: cold, agent from nothing, agent in a warm pool, loop."""
    import pydantic_monty

    want = expected_output()

    def agent(session):
        out = pydantic_monty.CollectString()
        for block in BLOCKS:
            session.feed_run(block, print_callback=out)
        assert out.output.strip() == want, out.output

    cold, fresh = [], []
    for _ in range(runs.fast):
        t = time.perf_counter()
        with pydantic_monty.Monty() as pool:
            with pool.checkout() as session:
                assert session.feed_run("1 + 1") == 2
                cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        with pydantic_monty.Monty() as pool:
            with pool.checkout() as session:
                agent(session)
        fresh.append(time.perf_counter() - t)
    warm, loop = [], []
    with pydantic_monty.Monty() as pool:
        with pool.checkout() as session:
            agent(session)
        for _ in range(runs.warm):
            t = time.perf_counter()
            with pool.checkout() as session:
                agent(session)
            warm.append(time.perf_counter() - t)
        with pool.checkout() as session:
            assert session.feed_run(LOOP) == LOOP_RESULT
            for _ in range(runs.slow):
                t = time.perf_counter()
                assert session.feed_run(LOOP) == LOOP_RESULT
                loop.append(time.perf_counter() - t)
    return {"cold": p50_ms(cold), "agent_fresh": p50_ms(fresh), "agent_open": p50_ms(warm), "loop": p50_ms(loop)}


# --- the CPython baselines -------------------------------------------------------------------

def subprocess_rows(runs):
    """`python3 -c`: p50 (ms) of start -> `1 + 1` printed, of the 10 blocks, and of the loop."""
    python = shutil.which("python3") or sys.executable
    want = expected_output()

    def timed(code, expect, count):
        times = []
        for _ in range(count):
            t = time.perf_counter()
            out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout
            times.append(time.perf_counter() - t)
            assert out.strip() == expect, out
        return p50_ms(times)

    version = subprocess.run([python, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    rows = {"cold": timed("print(1 + 1)", "2", runs.fast),
            "agent_fresh": timed("\n".join(BLOCKS), want, runs.fast),
            "agent_open": None,
            "loop": timed(LOOP.rsplit("\n", 1)[0] + "\nprint(x)", str(LOOP_RESULT), runs.slow)}
    return rows, f"{python} ({version})"


def exec_rows(runs):
    """In-process `exec`/`eval` into fresh globals: p50 (ms) per row (no start to pay)."""
    want = expected_output()

    def agent():
        namespace, out = {}, io.StringIO()
        with contextlib.redirect_stdout(out):
            for block in BLOCKS:
                exec(block, namespace)
        assert out.getvalue().strip() == want

    def timed(fn, count):
        times = []
        for _ in range(count):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return p50_ms(times)

    def one_plus_one():
        assert eval("1 + 1", {}) == 2

    def loop():
        namespace = {}
        exec(LOOP, namespace)
        assert namespace["x"] == LOOP_RESULT

    agent_ms = timed(agent, runs.warm)
    return {"cold": timed(one_plus_one, runs.warm), "agent_fresh": agent_ms, "agent_open": agent_ms,
            "loop": timed(loop, runs.slow)}


# --- ours ------------------------------------------------------------------------------------

def pass_environment(names):
    """Makes `code_sandbox`'s client (`mcp_run_python._client`) pass `names` from this
    process's environment to the server too (it passes only HOME, LOGNAME, PATH, SHELL, TERM and
    USER, as the `mcp` SDK's stdio client does)."""
    import mcp_run_python._client as client

    default = client.default_environment

    def environment():
        env = default()
        env.update({name: os.environ[name] for name in names if name in os.environ})
        return env

    client.default_environment = environment


def check(result):
    assert result["status"] == "success", result
    return result


async def ours_rows(extra, runs):
    """Ours with binary options `extra`: p50 (ms) per row."""
    from mcp_run_python import code_sandbox

    want = expected_output()

    async def agent(sandbox):
        for block in BLOCKS:
            result = check(await sandbox.eval(block))
        assert "".join(result["output"]).strip() == want, result

    cold, fresh = [], []
    for _ in range(runs.fast):
        t = time.perf_counter()
        async with code_sandbox(extra_args=extra) as sandbox:
            assert check(await sandbox.eval("1 + 1"))["return_value"] == 2
            cold.append(time.perf_counter() - t)
        t = time.perf_counter()
        async with code_sandbox(stateful=True, extra_args=extra) as sandbox:
            await agent(sandbox)
        fresh.append(time.perf_counter() - t)
    warm = []
    async with code_sandbox(stateful=True, extra_args=extra) as sandbox:
        await agent(sandbox)
        for _ in range(runs.warm):
            t = time.perf_counter()
            await agent(sandbox)
            warm.append(time.perf_counter() - t)
    loop = []
    async with code_sandbox(extra_args=extra) as sandbox:
        assert check(await sandbox.eval(LOOP))["return_value"] == LOOP_RESULT
        for _ in range(runs.slow):
            t = time.perf_counter()
            assert check(await sandbox.eval(LOOP))["return_value"] == LOOP_RESULT
            loop.append(time.perf_counter() - t)
    return {"cold": p50_ms(cold), "agent_fresh": p50_ms(fresh), "agent_open": p50_ms(warm), "loop": p50_ms(loop)}


async def first_call_rows(binary, runs):
    """Row 5: p50 (ms) of row 1 with no service running (stopped before each run), and the same
    with `--no-shared-zygote`, interleaved."""
    from mcp_run_python import code_sandbox

    async def cold(extra):
        t = time.perf_counter()
        async with code_sandbox(extra_args=extra) as sandbox:
            assert check(await sandbox.eval("1 + 1"))["return_value"] == 2
            return time.perf_counter() - t

    first, own = [], []
    for _ in range(runs.fast):
        stopped = zygote(binary, "stop")
        if stopped.returncode != 0 or not service_gone(binary):
            raise SystemExit(f"`zygote stop` left a service running: {stopped.stdout}{stopped.stderr}")
        first.append(await cold([]))
        own.append(await cold(["--no-shared-zygote"]))
    return p50_ms(first), p50_ms(own)


def has_shared_zygote(binary):
    """Whether the binary knows `--no-shared-zygote` (and so runs the per-host service)."""
    out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    return "--no-shared-zygote" in out.stdout


def zygote(binary, action):
    """`mcp-run-python zygote ACTION` in this process's environment (its XDG_RUNTIME_DIR)."""
    return subprocess.run([binary, "zygote", action], capture_output=True, text=True, timeout=60)


async def warm_service(binary):
    """Starts the service with one sandbox, and waits until `zygote status` says it is ready."""
    from mcp_run_python import code_sandbox

    async with code_sandbox() as sandbox:
        check(await sandbox.eval("1 + 1"))
        deadline = time.monotonic() + SERVICE_WAIT
        while time.monotonic() < deadline:
            status = zygote(binary, "status")
            if status.returncode == 0 and "ready" in status.stdout:
                return
            await asyncio.sleep(0.25)
    raise SystemExit(f"the zygote service was not ready within {SERVICE_WAIT} s: {status.stdout}{status.stderr}")


def service_gone(binary, wait=10):
    """Whether `zygote status` says no service runs (exit 1) within `wait` seconds."""
    deadline = time.monotonic() + wait
    while zygote(binary, "status").returncode != 1:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


# --- the table -------------------------------------------------------------------------------

ROWS = [
    ("cold", "1. cold: nothing → result of `1 + 1`", "Monty: new pool + checkout"),
    ("agent_fresh", "2. agent run from nothing: open, 10 REPL blocks, close", "Monty: new pool"),
    ("agent_open", "3. agent run in an open sandbox: the same 10 blocks", "Monty: warm-pool checkout"),
    ("loop", "4. loop `for i in range(3*10**6): x += i`, open sandbox", "Monty: warm-pool session"),
    ("first_call", "5. first call, no service running: as 1, service stopped before each run",
     "Monty: as 1"),
]
COLUMNS = [
    ("monty", "Monty"),
    ("service", "ours, zygote service warm"),
    ("own", "ours, no shared zygote"),
    ("python3", "CPython `python3 -c`"),
    ("exec", "CPython in-process `exec`"),
]


def cell(value, base):
    if isinstance(value, str):
        return value
    if value is None:
        return "—"
    return f"{number(value)} ms ({number(value / base)}×)"


def number(x):
    """Three significant digits, with no exponent and no digits after the point past 100."""
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:#.3g}"


def value(column, key):
    """A column's figure for row `key` (ms), `None` for none, or the column's note (a string)."""
    return column.get(key) if isinstance(column, dict) else column


def table(results):
    lines = ["| p50 (× Monty, same row) | " + " | ".join(title for _, title in COLUMNS) + " |",
             "|---" * (len(COLUMNS) + 1) + "|"]
    for key, label, monty in ROWS:
        base = results["monty"][key]
        cells = [cell(value(results[column], key), base) for column, _ in COLUMNS]
        lines.append(f"| {label} ({monty}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


class Runs:
    """Repetitions: `fast` of the rows that start something, `warm` of the cheap ones, `slow` of
    the loop."""

    def __init__(self, slow, quick):
        self.slow = slow
        self.fast = 2 if quick else max(5, 2 * slow)
        self.warm = 5 if quick else 10 * max(5, 2 * slow)


async def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    parser.add_argument("--runs", type=int, default=10, help="repetitions of the loop; the start rows run twice as many")
    parser.add_argument("--quick", action="store_true", help="one or two repetitions of each row (a smoke test)")
    options = parser.parse_args()
    runs = Runs(1 if options.quick else options.runs, options.quick)
    binary = str(pathlib.Path(options.binary).resolve())
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"no binary at {binary}: build it with `cargo build --release`, or pass --binary")

    sys.path.insert(0, str(ROOT / "pysrc"))
    import pydantic_monty

    scratch = tempfile.mkdtemp(prefix="mrp-bench-")
    os.chmod(scratch, 0o700)
    for name in ("runtime", "cache"):
        os.mkdir(os.path.join(scratch, name), 0o700)
    os.environ["MCP_RUN_PYTHON_BIN"] = binary
    os.environ["XDG_RUNTIME_DIR"] = os.path.join(scratch, "runtime")
    os.environ["XDG_CACHE_HOME"] = os.path.join(scratch, "cache")
    pass_environment(["XDG_RUNTIME_DIR", "XDG_CACHE_HOME"])
    service = has_shared_zygote(binary)
    results = {}
    started = time.perf_counter()
    try:
        results["monty"] = monty_rows(runs)
        results["python3"], python3 = subprocess_rows(runs)
        results["exec"] = exec_rows(runs)
        # Without the service first (so that its idle processes are not there yet); the first,
        # untimed sandbox makes the memory snapshot in the fresh cache.
        own = ["--no-shared-zygote"] if service else []
        from mcp_run_python import code_sandbox

        async with code_sandbox(extra_args=own) as sandbox:
            check(await sandbox.eval("1 + 1"))
        results["own"] = await ours_rows(own, runs)
        # Row 5: what rows 1 of CPython and Monty measure is already their first call.
        for column in ("monty", "python3", "exec"):
            results[column]["first_call"] = results[column]["cold"]
        if service:
            results["service"] = {}
            results["service"]["first_call"], results["own"]["first_call"] = await first_call_rows(binary, runs)
            await warm_service(binary)
            results["service"].update(await ours_rows([], runs))
        else:
            results["service"] = SERVICE_NA
    finally:
        if service:
            stopped = zygote(binary, "stop")
            if stopped.returncode != 0 or not service_gone(binary):
                print(f"startup_table: `zygote stop` left a service running, or failed: {stopped.stdout}"
                      f"{stopped.stderr}", file=sys.stderr)
        shutil.rmtree(scratch, ignore_errors=True)
    elapsed = time.perf_counter() - started

    def figures(column, scale=lambda v, key: v):
        return {key: None if not isinstance(value(results[column], key), float)
                else round(scale(value(results[column], key), key), 4) for key, _, _ in ROWS}

    print(table(results))
    print()
    print(json.dumps({
        "p50_ms": {column: figures(column) for column, _ in COLUMNS},
        "ratio_to_monty": {column: figures(column, lambda v, key: v / results["monty"][key])
                           for column, _ in COLUMNS if column != "monty"},
        "runs": {"start_rows": runs.fast, "warm_rows": runs.warm, "loop": runs.slow},
        "shared_zygote": service, "monty": pydantic_monty.__version__, "python3": python3,
        "binary": binary, "seconds": round(elapsed, 1),
    }))


if __name__ == "__main__":
    ensure_venv()
    asyncio.run(main())

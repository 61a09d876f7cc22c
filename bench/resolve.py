"""Benchmark (dependencies, docs/architecture.md §5): resolve + fetch + install time of `sympy` and of the seed's pydantic +
email-validator example, with a cold download cache and with a warm one, over stdio. Each call
is measured against a trivial call on the same server in the same run (the ratio is what to
compare across machines), and warm against cold.

    python3 bench/resolve.py [--binary target/release/mcp-run-python] [--runs 3]
"""

import statistics
import subprocess
import tempfile
import time

from startup import Stdio, parse_args

WORKLOADS = {
    # name: (requirements, code)
    "sympy": (["sympy"], "import sympy\nsympy.__version__"),
    "pydantic + email-validator (seed)": (
        ["pydantic", "email-validator"],
        '# /// script\n# dependencies = ["pydantic", "email-validator"]\n# ///\n'
        "import pydantic\nclass M(pydantic.BaseModel):\n    email: pydantic.EmailStr\n"
        "print(M(email='hello@pydantic.dev'))",
    ),
}


def timed_call(server, code):
    started = time.perf_counter()
    text = server.call(code)
    elapsed = (time.perf_counter() - started) * 1000
    assert text.startswith("<status>success</status>"), text
    return elapsed


def one_run(binary, code, cache):
    """(trivial call ms, call with packages ms) on a fresh server using `cache`."""
    server = Stdio(binary, "--cache-dir", cache, "--workers", "1")
    try:
        server.initialize()
        timed_call(server, "1")  # the interpreter is booted and ready
        trivial = timed_call(server, "2")
        return trivial, timed_call(server, code)
    finally:
        server.close()


def resolve_and_fetch(binary, requirements, cache):
    """Milliseconds of `packages download` (resolve + fetch in the front, no interpreter)."""
    dest = tempfile.mkdtemp()
    started = time.perf_counter()
    subprocess.run([binary, "packages", "download", *requirements, "--dest", dest,
                    "--cache-dir", cache], check=True, capture_output=True)
    return (time.perf_counter() - started) * 1000


def main():
    args = parse_args()
    print("resolve + fetch in the front (packages download):")
    print(f"{'workload':<36}{'cold ms':>10}{'warm ms':>10}{'warm/cold':>11}")
    for name, (requirements, _) in WORKLOADS.items():
        cold, warm = [], []
        for _ in range(args.runs):
            cache = tempfile.mkdtemp()
            cold.append(resolve_and_fetch(args.binary, requirements, cache))
            warm.append(resolve_and_fetch(args.binary, requirements, cache))
        c, w = statistics.median(cold), statistics.median(warm)
        print(f"{name:<36}{c:>10.0f}{w:>10.0f}{w / c:>11.2f}")
    print("the whole call (resolve + fetch + install + run) on a ready interpreter:")
    print(f"{'workload':<36}{'cold ms':>10}{'warm ms':>10}{'warm/cold':>11}{'cold/trivial':>14}")
    for name, (_, code) in WORKLOADS.items():
        cold, warm, trivial = [], [], []
        for _ in range(args.runs):
            cache = tempfile.mkdtemp()
            # A new cache: nothing downloaded yet (the interpreter's boot is not measured).
            t, c = one_run(args.binary, code, cache)
            trivial.append(t)
            cold.append(c)
            warm.append(one_run(args.binary, code, cache)[1])
        c, w, t = statistics.median(cold), statistics.median(warm), statistics.median(trivial)
        print(f"{name:<36}{c:>10.0f}{w:>10.0f}{w / c:>11.2f}{c / t:>14.0f}")


if __name__ == "__main__":
    main()

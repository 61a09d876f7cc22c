"""Which libraries a binary of the wheel loads: parsed from `ldd`, and compared with glibc's
own sonames, the only libraries the wheel may take from the machine it is installed on (the rest
are bundled in its `_libs/` by scripts/repair_wheel.py). Shared by tests/wheel and tests/aarch64."""

import os

# The sonames glibc itself provides: the only libraries allowed to come from the host.
GLIBC = frozenset(
    {
        "linux-vdso.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1", "libc.so.6",
        "libm.so.6", "libmvec.so.1", "libpthread.so.0", "libdl.so.2", "librt.so.1",
        "libresolv.so.2", "libutil.so.1", "libanl.so.1", "libnsl.so.1",
    }
)


def libraries(ldd_output: str) -> dict[str, str]:
    """soname → resolved path, from `ldd`'s output; fails on a library it cannot find."""
    found = {}
    for line in ldd_output.splitlines():
        assert "not found" not in line, ldd_output
        name, _, rest = line.strip().partition(" => ")
        if rest:
            found[name] = rest.split(" (")[0]
    return found


def foreign_libraries(ldd_output: str, wheel_libs: str) -> dict[str, str]:
    """The libraries `ldd` resolves outside `wheel_libs` that are not glibc's."""
    return {
        name: path
        for name, path in libraries(ldd_output).items()
        if name not in GLIBC and not os.path.realpath(path).startswith(os.path.realpath(wheel_libs) + "/")
    }

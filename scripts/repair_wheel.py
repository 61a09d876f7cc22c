#!/usr/bin/env python3
"""Makes maturin's wheel self-contained (README "Install"): every library the binary loads, but glibc's
own, goes into the wheel, and the wheel is tagged with the oldest manylinux policy its files meet.

maturin's own repair (and auditwheel's) leaves out what the manylinux policies list as present
on every system, GLib and libstdc++ among them; a bare machine (a minimal Debian, a slim
container) has neither, and JavaScriptCore needs both. So this step bundles the whole closure:

1. the binary moves from `<dist>.data/scripts/` into the package, `mcp_run_python/_bin/`, and
   `mcp_run_python/_libs/` receives each library of its `DT_NEEDED` closure, glibc's excepted,
   counting as needed also what its dlopen metadata note names (JavaScriptCore, which only the
   workers open, src/engine/library.rs; https://systemd.io/ELF_DLOPEN_METADATA/),
   found in the Debian multiarch directories of the binary's architecture: read from the ELF
   files rather than asked of `ldd`, which cannot load a binary of another architecture (the
   aarch64 wheel is cross-built, aarch64, docs/platforms.md);
2. patchelf gives the binary the run-path `$ORIGIN/../_libs` and each library `$ORIGIN`, as
   DT_RPATH, which the loader also applies to the libraries' own dependencies and puts before
   `LD_LIBRARY_PATH`, so the bundled copies win on any host (the sandbox worker, the same
   binary re-executed with an empty environment, needs nothing else either);
3. the command on PATH becomes a launcher that execs the binary (`mcp_run_python.__main__`):
   scripts are installed to a directory whose distance from the package differs between
   installers (venv, `--user`, `--target`), so no run-path could reach `_libs` from there;
4. the tag is `manylinux_2_<N>_<arch>`, N being the newest glibc symbol version any file needs;
5. `wheel pack` writes the result with a fresh RECORD, entries in a fixed order and the
   timestamps of `SOURCE_DATE_EPOCH`, so the same input gives the same bytes.

Usage: repair_wheel.py WHEEL --dest-dir DIR   (needs patchelf on PATH, and pyelftools and wheel)
"""

from __future__ import annotations

import argparse
import email.parser
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

PACKAGE = 'mcp_run_python'
BINARY = 'mcp-run-python'

# The sonames glibc itself provides (the manylinux policies' "system" libraries that come with
# glibc); everything else is bundled.
GLIBC_SONAMES = frozenset(
    {
        'linux-vdso.so.1',
        'ld-linux-x86-64.so.2',
        'ld-linux-aarch64.so.1',
        'libc.so.6',
        'libm.so.6',
        'libmvec.so.1',
        'libpthread.so.0',
        'libdl.so.2',
        'librt.so.1',
        'libresolv.so.2',
        'libutil.so.1',
        'libanl.so.1',
        'libnsl.so.1',
        'libBrokenLocale.so.1',
        'libthread_db.so.1',
    }
)

LAUNCHER = """#!python
# The `mcp-run-python` command. The binary lives in mcp_run_python/_bin, beside the libraries
# it loads (mcp_run_python/_libs); this execs it with the same arguments.
import sys

from mcp_run_python.__main__ import main

sys.exit(main())
"""

# The wheel tag's name of each ELF machine, and its Debian multiarch triplet.
ARCHES = {'EM_X86_64': 'x86_64', 'EM_AARCH64': 'aarch64'}
TRIPLETS = {'EM_X86_64': 'x86_64-linux-gnu', 'EM_AARCH64': 'aarch64-linux-gnu'}
GLIBC_VERSION = re.compile(r'^GLIBC_2\.(\d+)$')
# Version names that stand for a glibc release without spelling it: packed relative
# relocations (`DT_RELR`, build.rs) came with glibc 2.36.
GLIBC_FEATURE_MINORS = {'GLIBC_ABI_DT_RELR': 36}
OLDEST_MANYLINUX_MINOR = 17


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('wheel', type=Path)
    parser.add_argument('--dest-dir', type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / 'unpacked'
        with zipfile.ZipFile(args.wheel) as zf:
            zf.extractall(root)
            # zipfile drops the permission bits: put back the executable ones.
            for info in zf.infolist():
                mode = info.external_attr >> 16
                if mode & 0o111:
                    (root / info.filename).chmod(0o755)
        repaired = repair(root)
        args.dest_dir.mkdir(parents=True, exist_ok=True)
        out = subprocess.run(
            [sys.executable, '-m', 'wheel', 'pack', '--dest-dir', str(args.dest_dir), str(repaired)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    print(out.strip())
    return 0


def repair(root: Path) -> Path:
    """Repairs the unpacked wheel at `root` in place and returns it."""
    (data_dir,) = root.glob('*.data')
    (dist_info,) = root.glob('*.dist-info')
    script = data_dir / 'scripts' / BINARY
    if not is_elf(script):
        raise SystemExit(f'{script} is not the native binary: is this wheel repaired already?')

    bin_dir = root / PACKAGE / '_bin'
    libs_dir = root / PACKAGE / '_libs'
    bin_dir.mkdir()
    libs_dir.mkdir()
    binary = bin_dir / BINARY
    shutil.move(script, binary)
    script.write_text(LAUNCHER)
    script.chmod(0o755)

    libs = bundled_libraries(binary)
    for soname, path in sorted(libs.items()):
        target = libs_dir / soname
        shutil.copyfile(path, target)
        target.chmod(0o755)
        patchelf('--force-rpath', '--set-rpath', '$ORIGIN', target)
    patchelf('--force-rpath', '--set-rpath', '$ORIGIN/../_libs', binary)

    tag = platform_tag([binary, *sorted(libs_dir.iterdir())])
    retag(dist_info / 'WHEEL', tag)
    print(f'bundled {len(libs)} libraries; tag {tag}', file=sys.stderr)
    return root


def bundled_libraries(binary: Path) -> dict[str, Path]:
    """soname → path of every library in `binary`'s `DT_NEEDED` closure, glibc's own excepted,
    each found as the loader finds it on Debian: in `/lib/<triplet>` or `/usr/lib/<triplet>` of
    the binary's architecture (the multiarch directories `ld.so.conf.d` names).

    Raises SystemExit when one is not found there."""
    dirs = library_dirs(binary)
    libs: dict[str, Path] = {}
    opened = dlopened(binary)
    if not opened:
        raise SystemExit(f'{binary} has no dlopen metadata naming its engine library')
    pending = needed(binary) + opened
    while pending:
        soname = pending.pop()
        if soname in libs or soname in GLIBC_SONAMES:
            continue
        found = next((d / soname for d in dirs if (d / soname).exists()), None)
        if found is None:
            where = ', '.join(map(str, dirs))
            raise SystemExit(f'{binary} needs {soname}, which is in none of {where}')
        libs[soname] = found.resolve()
        pending.extend(needed(found))
    return libs


def needed(path: Path) -> list[str]:
    """The sonames `path`'s dynamic section lists as `DT_NEEDED`."""
    with path.open('rb') as f:
        dynamic = ELFFile(f).get_section_by_name('.dynamic')
        if dynamic is None:
            return []
        return [tag.needed for tag in dynamic.iter_tags() if tag.entry.d_tag == 'DT_NEEDED']


# The dlopen metadata note (https://systemd.io/ELF_DLOPEN_METADATA/): its section, owner and type.
DLOPEN_SECTION = '.note.dlopen'
DLOPEN_OWNER = 'FDO'
NT_FDO_DLOPEN_METADATA = 0x407C0C0A


def dlopened(path: Path) -> list[str]:
    """The sonames `path`'s dlopen metadata names: the libraries it opens at run time."""
    with path.open('rb') as f:
        section = ELFFile(f).get_section_by_name(DLOPEN_SECTION)
        if section is None:
            return []
        sonames = []
        for note in section.iter_notes():
            if note['n_name'] != DLOPEN_OWNER or note['n_type'] != NT_FDO_DLOPEN_METADATA:
                continue
            desc = note['n_desc']
            text = desc.decode() if isinstance(desc, bytes) else desc
            for feature in json.loads(text.rstrip('\0')):
                sonames.extend(feature['soname'])
        return sonames


def library_dirs(binary: Path) -> list[Path]:
    """Where the loader looks for `binary`'s libraries on Debian, by its architecture."""
    with binary.open('rb') as f:
        machine = ELFFile(f)['e_machine']
    triplet = TRIPLETS[machine]
    return [Path('/lib') / triplet, Path('/usr/lib') / triplet]


def platform_tag(files: list[Path]) -> str:
    """`manylinux_2_<N>_<arch>` for the newest `GLIBC_2.N` symbol version any of `files` needs."""
    newest = OLDEST_MANYLINUX_MINOR
    arch = None
    for path in files:
        with path.open('rb') as f:
            elf = ELFFile(f)
            arch = arch or ARCHES[elf['e_machine']]
            for section in elf.iter_sections():
                if not isinstance(section, GNUVerNeedSection):
                    continue
                for _verneed, auxiliaries in section.iter_versions():
                    for aux in auxiliaries:
                        m = GLIBC_VERSION.match(aux.name)
                        if m:
                            newest = max(newest, int(m.group(1)))
                        newest = max(newest, GLIBC_FEATURE_MINORS.get(aux.name, 0))
    return f'manylinux_2_{newest}_{arch}'


def retag(wheel_file: Path, platform: str) -> None:
    """Sets the WHEEL file's tags to `py3-none-<platform>` (the binary serves any Python 3;
    the package is pure Python)."""
    message = email.parser.Parser().parsestr(wheel_file.read_text())
    del message['Tag']
    message['Tag'] = f'py3-none-{platform}'
    wheel_file.write_text(message.as_string())


def is_elf(path: Path) -> bool:
    with path.open('rb') as f:
        return f.read(4) == b'\x7fELF'


def patchelf(*args: object) -> None:
    subprocess.run(['patchelf', *map(str, args)], check=True)


if __name__ == '__main__':
    sys.exit(main())

"""Measures (docs/checkpoint-research.md §2): WebAssembly memory size of forked interpreters,
pages that differ from the zygote's memory, pages one call dirties, soft-dirty bits, and a
round trip of Python state through a memory copy into a sibling interpreter. Needs root (reads
and writes /proc/PID/mem of workers, which are not dumpable).

    sudo .venv/bin/python bench/checkpoint_probe/pages.py
"""
import struct
import subprocess
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import *  # noqa: E402,F403

INFO = ("import pyodide_js\n_m = b'MARKER-%s'\n"
        "print(pyodide_js._module.HEAPU8.length, id(_m))\n")
PM_SOFT_DIRTY = 1 << 55
PM_PRESENT = 1 << 63


def info(s, sb, tag):
    r, _ = s.run(sb, INFO % tag)
    size, addr = map(int, r["structuredContent"]["output"][-1].split())
    return size, addr


def find_worker(s, addr, tag, base):
    for p in descendants(s.proc.pid):
        try:
            if read_mem(p, base + addr + 16, 7 + len(tag)) == b"MARKER-" + tag.encode():
                return p
        except OSError:
            pass
    raise SystemExit("worker not found")


def wasm_base(s):
    """The base of the interpreters' linear memory (the same in every fork of the zygote)."""
    sb = s.create()
    size, addr = info(s, sb, "base")
    for p in descendants(s.proc.pid):
        for line in pathlib.Path(f"/proc/{p}/maps").read_text().splitlines():
            a, b = (int(x, 16) for x in line.split()[0].split("-"))
            if b - a < size:
                continue
            try:
                if read_mem(p, a + addr + 16, 11) == b"MARKER-base":
                    return a, sb, p
            except OSError:
                pass
    raise SystemExit("no base")


def zygote_of(s, worker):
    st = pathlib.Path(f"/proc/{worker}/stat").read_text()
    return int(st[st.rindex(")") + 2:].split()[1])


def soft_dirty_clear(pid):
    pathlib.Path(f"/proc/{pid}/clear_refs").write_text("4")


def soft_dirty_pages(pid, start, npages):
    with open(f"/proc/{pid}/pagemap", "rb", buffering=0) as f:
        f.seek(start // PAGE * 8)
        raw = f.read(npages * 8)
    ents = struct.unpack(f"{len(raw)//8}Q", raw)
    return sum(1 for e in ents if e & PM_SOFT_DIRTY), sum(1 for e in ents if e & PM_PRESENT)


def mib(n):
    return f"{n / (1 << 20):.1f} MiB"


def start():
    """A server whose zygote is ready, shared by every probe: (server, linear-memory base, the
    first sandbox, its worker, the zygote's pid, the zygote's linear memory)."""
    s = Server()
    s.wait_zygote()
    time.sleep(1)
    base, sb0, w0 = wasm_base(s)
    zyg = zygote_of(s, w0)
    size0, _ = info(s, sb0, "base")
    return s, base, sb0, w0, zyg, read_mem(zyg, base, size0)


def zstd(data, level=3):
    """(compressed size, seconds) of `data` through the `zstd` command at `level`."""
    t = time.perf_counter()
    out = subprocess.run(["zstd", f"-{level}", "-c", "-q"], input=data, capture_output=True).stdout
    return len(out), time.perf_counter() - t


def xor_delta(mem, zmem, pages):
    """The pages `pages` of `mem`, each XOR-ed with the zygote's page (`zmem`; zeros past its
    end): the checkpoint body before compression."""
    out = bytearray()
    for i in pages:
        page = mem[i*PAGE:(i+1)*PAGE]
        zpage = zmem[i*PAGE:(i+1)*PAGE].ljust(PAGE, b"\0")
        out += (int.from_bytes(page, "little") ^ int.from_bytes(zpage, "little")).to_bytes(PAGE, "little")
    return bytes(out)


def main():
    s, base, _, w0, zyg, zmem = start()
    print(f"wasm base {base:#x}, worker {w0}, zygote {zyg}")
    size0 = len(zmem)
    zh = page_hashes(zmem)
    print(f"zygote linear memory {mib(size0)} = {len(zh)} pages; zero pages {sum(1 for i in range(len(zh)) if zmem[i*PAGE:(i+1)*PAGE] == bytes(PAGE))}")
    w0mem = read_mem(w0, base, size0)
    d = diff_pages(zh, page_hashes(w0mem))
    print(f"fresh fork after 2 trivial calls: {len(d)} pages differ from the zygote ({mib(len(d)*PAGE)})")

    scenarios = {
        "json+100KiB": "import json, random\ndata = random.randbytes(100 * 1024)\n",
        "stdlib+10MiB bytes": ("import json, re, collections, datetime, decimal, statistics, csv, random\n"
                               "data = random.randbytes(10 * 1024 * 1024)\n"),
        "stdlib+10MiB objects": ("import json, re, collections, datetime, decimal, statistics, csv, random\n"
                                 "rows = [{'i': i, 's': str(i) * 3, 'f': i / 7} for i in range(40000)]\n"
                                 "import sys\nprint(sum(sys.getsizeof(r) for r in rows) >> 20)\n"),
    }
    for name, code in scenarios.items():
        sb = s.create()
        r, _ = s.run(sb, code)
        tag = name.replace(" ", "").replace("+", "")[:12]
        size, addr = info(s, sb, tag)
        w = find_worker(s, addr, tag, base)
        mem = read_mem(w, base, size)
        h = page_hashes(mem)
        d = diff_pages(zh, h)
        zero = sum(1 for i in d if mem[i*PAGE:(i+1)*PAGE] == bytes(PAGE))
        print(f"[{name}] memory {mib(size)} ({len(h)} pages; grew {len(h)-len(zh)}), differ from zygote {len(d)} pages = {mib(len(d)*PAGE)} (of which all-zero {zero}); out {r['structuredContent'].get('output')}")
        # per-call dirty pages, by content (hash diff) and by soft-dirty bits
        prev = h
        for code2 in ["x = 41", "x + 1", "l = []", "l.append(random.randbytes(100 * 1024))", "l.append(random.randbytes(100 * 1024))", "1"]:
            soft_dirty_clear(w)
            r, dt = s.run(sb, code2)
            mem2 = read_mem(w, base, size)
            sd, present = soft_dirty_pages(w, base, len(mem2) // PAGE)
            h2 = page_hashes(mem2)
            d2 = diff_pages(prev, h2)
            print(f"   call {code2!r:45} {dt*1000:6.1f} ms: content-changed {len(d2):5d} pages ({mib(len(d2)*PAGE)}), soft-dirty {sd:5d} of {present} present")
            prev = h2
        # whole-process soft-dirty for one call (all mappings with resident pages)
        soft_dirty_clear(w)
        s.run(sb, "x = 43")
        total_sd = 0
        maps = [l.split()[0] for l in pathlib.Path(f"/proc/{w}/maps").read_text().splitlines()]
        for m in maps:
            a, b = (int(x, 16) for x in m.split("-"))
            if b - a > (8 << 30):
                continue
            try:
                sd, _ = soft_dirty_pages(w, a, (b - a) // PAGE)
            except OSError:
                continue
            total_sd += sd
        print(f"   whole process, call 'x = 43': {total_sd} soft-dirty pages ({mib(total_sd*PAGE)}) (mappings > 8 GiB skipped)")

    s.close()


if __name__ == "__main__":
    main()

"""docs/checkpoint-research.md §4: weight of a checkpoint stored as the pages that differ from
the zygote, XOR-ed with the zygote's page and compressed (zstd), for the issue's two sandboxes.
Needs root.   sudo .venv/bin/python bench/checkpoint_probe/sizes.py"""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import *  # noqa: E402,F403
from pages import info, find_worker, mib, start, xor_delta, zstd  # noqa: E402

CASES = {
    "import json + 100 KiB random bytes": "import json, random\ndata = random.randbytes(100 * 1024)\n",
    "import json + 100 KiB of JSON-like objects": "import json\ndata = [{'id': i, 'name': 'user%d' % i} for i in range(1400)]\nprint(len(json.dumps(data)))\n",
    "7 stdlib modules + 10 MiB random bytes": ("import json, re, collections, datetime, decimal, statistics, csv, random\n"
                                             "data = random.randbytes(10 * 1024 * 1024)\n"),
}


def main():
    s, base, _, _, _, zmem = start()
    zh = page_hashes(zmem)
    for n, (name, code) in enumerate(CASES.items()):
        sb = s.create()
        out = s.run(sb, code)[0]["structuredContent"].get("output")
        tag = f"SZ{n}"
        size, addr = info(s, sb, tag)
        w = find_worker(s, addr, tag, base)
        mem = read_mem(w, base, size)
        d = diff_pages(zh, page_hashes(mem))
        raw = b"".join(mem[i*PAGE:(i+1)*PAGE] for i in d)
        xor = xor_delta(mem, zmem, d)
        z1, t1 = zstd(xor, 1)
        z3, t3 = zstd(xor, 3)
        r1, _ = zstd(raw, 1)
        print(f"[{name}] {out} memory {mib(size)}; {len(d)} pages differ = {mib(len(raw))}; zstd-1 raw {mib(r1)}; XOR-delta zstd-1 {mib(z1)} ({t1*1000:.0f} ms incl. process), zstd-3 {mib(z3)}")
    s.close()


if __name__ == "__main__":
    main()

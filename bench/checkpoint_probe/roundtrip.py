"""docs/checkpoint-research.md §3–§5: (a) restores Python state by overwriting a sibling
interpreter's WebAssembly memory with another's (same zygote), from the host through
/proc/PID/mem while the target is idle between calls; (b) what a checkpoint of the pages that
differ from the zygote weighs, raw and compressed; (c) PSS/RSS of an idle forked worker.
Needs root.

    sudo .venv/bin/python bench/checkpoint_probe/roundtrip.py
"""
import sys
import time
import zlib

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from harness import *  # noqa: E402,F403
from pages import info, find_worker, mib, start, xor_delta, zstd  # noqa: E402

STATE_A = ("import json, decimal, random, collections\n"
           "x = 41\n"
           "d = decimal.Decimal('1.25')\n"
           "c = collections.Counter('abracadabra')\n"
           "data = random.randbytes(100 * 1024)\n"
           "def f(n): return n * 2\n"
           "class K:\n    def __init__(self): self.v = [1, 2, 3]\n"
           "k = K()\n"
           "import hashlib\n"
           "digest = hashlib.sha256(data).hexdigest()\n")
CHECK = ("import hashlib\n"
         "print(x + 1, d * 2, c.most_common(2), len(data), hashlib.sha256(data).hexdigest() == digest, f(21), k.v,\n"
         "      json.dumps({'a': [1, 2]}), random.random() < 1, sorted(k for k in globals() if not k.startswith('_')))\n")


def rollup(pid):
    out = {}
    for line in pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        k, v = line.split(":")
        out[k] = int(v.split()[0])
    return out


def zstd_size(data, level=3):
    return zstd(data, level)[0]


def copy_into(src_pid, dst_pid, base, size):
    t = time.perf_counter()
    mem = read_mem(src_pid, base, size)
    t1 = time.perf_counter()
    write_mem(dst_pid, base, mem)
    return mem, t1 - t, time.perf_counter() - t1


def main():
    s, base, _, _, zyg, zmem = start()
    zh = page_hashes(zmem)

    # (c) idle worker memory after `import json` + 100 KiB
    a = s.create()
    print("A state:", s.run(a, STATE_A)[0]["structuredContent"]["status"])
    sizeA, addrA = info(s, a, "AAAA")
    wa = find_worker(s, addrA, "AAAA", base)
    time.sleep(0.5)
    r = rollup(wa)
    print(f"idle worker A (json, decimal, 100 KiB): Rss {r['Rss']} KiB, Pss {r['Pss']} KiB, Private_Dirty {r['Private_Dirty']} KiB, Shared_Clean {r['Shared_Clean']} KiB")
    rz = rollup(zyg)
    print(f"zygote: Rss {rz['Rss']} KiB, Pss {rz['Pss']} KiB, Private_Dirty {rz['Private_Dirty']} KiB")
    expect = s.run(a, CHECK)[0]["structuredContent"]["output"]
    print("A check:", expect)

    # (b) checkpoint size: pages differing from the zygote, raw / zstd / XOR-delta zstd
    memA = read_mem(wa, base, sizeA)
    d = diff_pages(zh, page_hashes(memA))
    raw = b"".join(memA[i*PAGE:(i+1)*PAGE] for i in d)
    xor = xor_delta(memA, zmem, d)
    print(f"checkpoint vs zygote: {len(d)} pages, raw {mib(len(raw))}, zlib-1 {mib(len(zlib.compress(raw, 1)))}, zstd-3 {mib(zstd_size(raw))}, XOR-delta zstd-3 {mib(zstd_size(xor))}, XOR-delta zstd-19 {mib(zstd_size(xor, 19))}")
    print(f"whole memory zstd-3 {mib(zstd_size(memA))}")

    # (a) round trip into sibling B: B takes a worker, grows to >= A's size, then gets A's memory
    b = s.create()
    print("B before:", s.run(b, "print(sorted(k for k in globals() if not k.startswith('_')))")[0]["structuredContent"]["output"])
    sizeB, addrB = info(s, b, "BBBB")
    if sizeB < sizeA:
        s.run(b, f"_g = bytearray({sizeA - sizeB + (1 << 20)}); del _g")
        sizeB, addrB = info(s, b, "BBBB")
    wb = find_worker(s, addrB, "BBBB", base)
    memA = read_mem(wa, base, sizeA)  # after A's info call, idle again
    _, tr, tw = copy_into(wa, wb, base, sizeA)
    print(f"copied {mib(sizeA)} A({wa}) -> B({wb}) (B's memory {mib(sizeB)}): read {tr*1000:.1f} ms, write {tw*1000:.1f} ms")
    res = s.run(b, CHECK)[0]
    print("B after copy:", res["structuredContent"].get("output"), res["structuredContent"].get("status"), res["structuredContent"].get("error", "")[:500] if isinstance(res["structuredContent"].get("error"), str) else res["structuredContent"])
    print("same as A:", res["structuredContent"].get("output") == expect)
    for code in ["x = 100\nprint(x)", "import statistics\nprint(statistics.mean([1, 2, 3]))", "open('f.txt', 'w').write('hi')\nprint(open('f.txt').read())", "print(x, d, len(data))"]:
        res = s.run(b, code)[0]["structuredContent"]
        print(f"   B {code!r}: {res.get('status')} {res.get('output')} {str(res.get('error'))[:300] if res.get('error') else ''}")
    print("A unaffected:", s.run(a, "print(x)")[0]["structuredContent"]["output"])

    # (a') a JS object held by Python in A: what breaks in the copy
    c = s.create()
    s.run(c, "import js\no = js.Object.new()\no.v = 7\nx = 5\n")
    sizeC, addrC = info(s, c, "CCCC")
    wc = find_worker(s, addrC, "CCCC", base)
    e = s.create()
    sizeE, addrE = info(s, e, "EEEE")
    if sizeE < sizeC:
        s.run(e, f"_g = bytearray({sizeC - sizeE + (1 << 20)}); del _g")
    we = find_worker(s, addrE, "EEEE", base)
    copy_into(wc, we, base, sizeC)
    for code in ["print(x)", "print(type(o))", "print(o.v)", "print(x + 1)"]:
        res = s.run(e, code)[0]["structuredContent"]
        print(f"   E (JsProxy copied) {code!r}: {res.get('status')} {res.get('output')} {str(res.get('error'))[:400] if res.get('error') else ''}")
    s.close()


if __name__ == "__main__":
    main()

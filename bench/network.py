"""Benchmark (docs/architecture.md §3.5): a small GET through the HTTP bridge against `pyfetch`,
in one run.

One stdio session with `--allow-net` to a local HTTP server that answers 64 bytes of JSON; inside
one call each, the code times N GETs with `requests` (through `runtime/python/http_bridge.py`),
with `urllib.request` (the same bridge through `http.client`), and with `pyodide.http.pyfetch`
(through `runtime/js/fetch.js`, the baseline), after a warm-up of each. Reported: the median
microseconds of one GET, and each library's as a ratio of pyfetch's.

Then requests at once: `AT_ONCE` GETs of a path the server answers `DELAY` seconds late, made
with `asyncio.gather` over `httpx.AsyncClient` and over `pyfetch`, against the same GETs one
after another (the baseline), in the same call. Reported: each way's median time, and its ratio
of the one-after-another time (1/AT_ONCE would be perfect overlap).

    .venv/bin/python bench/network.py [--binary target/release/mcp-run-python] [--requests 200]
"""

import argparse
import asyncio
import json
import pathlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

ROOT = pathlib.Path(__file__).resolve().parents[1]
BODY = json.dumps({"hello": "world", "padding": "x" * 32}).encode()

# The timed code: `N`, `URL` and the library are filled in; it returns the median seconds.
CODE = """# /// script
# dependencies = ["requests"]
# ///
import statistics, time, json, urllib.request, requests
from pyodide.http import pyfetch

async def pyfetch_get():
    return await (await pyfetch(URL)).json()

def sync(get):
    get()
    took = []
    for _ in range(N):
        t = time.perf_counter(); get(); took.append(time.perf_counter() - t)
    return statistics.median(took)

async def asynchronous(get):
    await get()
    took = []
    for _ in range(N):
        t = time.perf_counter(); await get(); took.append(time.perf_counter() - t)
    return statistics.median(took)

{"requests": sync(lambda: requests.get(URL).json()),
 "urllib": sync(lambda: json.loads(urllib.request.urlopen(URL).read())),
 "pyfetch": await asynchronous(pyfetch_get)}
"""


# Requests at once: how many, and how late the server answers each (seconds).
AT_ONCE = 8
DELAY = 0.05

# The timed code of requests at once: `N`, `URL` and `AT_ONCE` are filled in.
AT_ONCE_CODE = """# /// script
# dependencies = ["httpx"]
# ///
import asyncio, statistics, time, httpx
from pyodide.http import pyfetch

async def timed(make):
    await make()
    took = []
    for _ in range(N):
        t = time.perf_counter(); await make(); took.append(time.perf_counter() - t)
    return statistics.median(took)

async def one_after_another():
    for _ in range(AT_ONCE):
        await (await pyfetch(URL)).string()

async def gathered_pyfetch():
    await asyncio.gather(*[pyfetch(URL) for _ in range(AT_ONCE)])

async def gathered_httpx():
    async with httpx.AsyncClient() as client:
        await asyncio.gather(*[client.get(URL) for _ in range(AT_ONCE)])

{"one after another": await timed(one_after_another), "gather, pyfetch": await timed(gathered_pyfetch),
 "gather, httpx": await timed(gathered_httpx)}
"""


class Small(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # The head and body go out in two writes: without this, Nagle's algorithm and the client's
    # delayed ACK would add ~40 ms to every answer, whoever asks.
    disable_nagle_algorithm = True

    def do_GET(self):
        if self.path == "/late":
            time.sleep(DELAY)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, *args):
        pass


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default=str(ROOT / "target" / "release" / "mcp-run-python"))
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Small)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    params = StdioServerParameters(command=args.binary, args=["stdio", "--allow-net", host, "--max-fetches-per-call", str(4 * args.requests)])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            code = f"N = {args.requests}\nURL = 'http://{host}/'\n" + CODE
            result = await session.call_tool("run_python_code", {"python_code": code})
            medians = returned(result.content[0].text)
            rounds = max(3, args.requests // 20)
            code = f"N = {rounds}\nURL = 'http://{host}/late'\nAT_ONCE = {AT_ONCE}\n" + AT_ONCE_CODE
            result = await session.call_tool("run_python_code", {"python_code": code})
            at_once = returned(result.content[0].text)
    server.shutdown()
    base = medians["pyfetch"]
    print(f"small GET ({len(BODY)} bytes) through the front, median of {args.requests}:")
    for name, seconds in medians.items():
        print(f"  {name:9} {seconds * 1e6:8.0f} µs   ratio {seconds / base:.2f} of pyfetch")
    base = at_once["one after another"]
    print(f"{AT_ONCE} GETs answered {DELAY * 1000:.0f} ms late, median of {rounds}:")
    for name, seconds in at_once.items():
        print(f"  {name:18} {seconds * 1e3:7.1f} ms   ratio {seconds / base:.2f} of one after another")


def returned(text):
    """A successful result's return value."""
    assert "<status>success</status>" in text, text
    return json.loads(text.split("<return_value>\n")[1].split("\n</return_value>")[0])


if __name__ == "__main__":
    asyncio.run(main())

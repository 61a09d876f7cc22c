"""The sandbox's HTTP client libraries, bridged to the front (docs/architecture.md §9).

The interpreter has no network: every request of user code is made by the front, under
--allow-net, through one blocking host call (`fetch`: the request's JSON and body in, the
response's metadata and body out; `runtime/js/fetch.js` makes the same call for `pyfetch`). This
module makes the libraries agents write with use that call, unchanged:

- `http.client`, and so `urllib.request`: its `HTTPConnection` and `HTTPSConnection` send
  through the bridge (TLS is the front's, verified there);
- `urllib3`, and so `requests`: its Emscripten support's `send_request`, in place of a
  synchronous `XMLHttpRequest`, and its `send_streaming_request`, which would need a
  cross-origin isolated page and a Web Worker;
- `httpx`: its default transports, sync and async.

Requests made in asyncio tasks (httpx's async transport) go out together: each task queues its
request and waits; once the tasks that were ready have run, the queue goes to the front in one
host call (`fetch_many`), at most `concurrency` requests at a time (`--max-concurrent-fetches`),
which the front makes at once. So `asyncio.gather` over an `httpx.AsyncClient` overlaps its
requests' waits, while the interpreter keeps its one thread.

Each library is patched as it is first imported (`_Patcher`, a meta path finder, wraps the
loader of the module to patch), so an interpreter that never imports one pays nothing for it.
A request the front refuses or that fails raises the library's own connection error, with the
front's words (which name the refused host and `--allow-net`).

Loaded by the runner (`runtime/python/runner.py`, `setup`) as `_mcp_http`, outside
`sys.modules`: user code can reach the bridge only through the libraries.
"""

import asyncio
import importlib.abc
import importlib.machinery
import io
import json
import sys

# The host call: (request JSON, body bytes or None) -> (metadata JSON, body bytes); set by
# `install`.
_fetch = None
# The host call for requests made at once: (JSON `{"requests", "sizes"}`, the bodies one after
# another) -> (JSON `{"responses", "sizes"}`, the bodies one after another); set by `install`
# (`None` where there is none: requests from asyncio tasks then go one at a time, by `send`).
_fetch_many = None
# Most requests one `_fetch_many` may carry (`--max-concurrent-fetches`), set with each run.
concurrency = 1
# Requests asyncio tasks queued for the next `_fetch_many`: (request JSON, body, future).
_queued = []

# The response headers the bridge's answer no longer describes: the front has read the body
# whole, so it is neither chunked nor of the length the server announced once decoded.
_FRAMING_HEADERS = ("transfer-encoding", "content-length", "connection", "keep-alive")


class Answer:
    """A response the front received: `status`, `reason`, `headers` ([(name, value)] in order,
    names in lower case), the `url` that answered, and the whole `body`."""

    __slots__ = ("status", "reason", "headers", "url", "body")

    def __init__(self, status, reason, headers, url, body):
        self.status, self.reason, self.headers, self.url, self.body = status, reason, headers, url, body


def _as_bytes(body):
    """A request body as bytes (`None` for none): bytes-like, text (UTF-8), a file, or an
    iterable of those, as the libraries hand them over."""
    if body is None:
        return None
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if hasattr(body, "read"):
        return _as_bytes(body.read())
    return b"".join(_as_bytes(part) or b"" for part in body)


def send(method, url, headers, body=None):
    """One request through the front; its `Answer`.

    Raises `ConnectionError` with the front's words when it refused the request or got no
    response (a host not allowed, a body over `--max-fetch-bytes`, a connection that failed).
    """
    meta_json, data = _fetch(_request(method, url, headers), _as_bytes(body))
    return _answer(json.loads(meta_json), data)


async def send_async(method, url, headers, body=None):
    """`send` from an asyncio task: the request waits, with those of the other tasks that are
    ready, for the next `_fetch_many` (see the module's documentation); without one (the
    scientific runtime), `send` at once."""
    if _fetch_many is None:
        return send(method, url, headers, body)
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    _queued.append((_request(method, url, headers), _as_bytes(body) or b"", future))
    if len(_queued) == 1:
        loop.call_soon(_send_queued)
    meta, data = await future
    return _answer(meta, data)


def _send_queued():
    """Sends what the tasks queued, `concurrency` requests at a time, and hands each task its
    response (or the host call's failure)."""
    queued = _queued[:]
    _queued.clear()
    at_once = max(1, concurrency)
    for start in range(0, len(queued), at_once):
        part = queued[start : start + at_once]
        batch = '{"requests":[' + ",".join(r for r, _, _ in part) + '],"sizes":' + json.dumps([len(b) for _, b, _ in part]) + "}"
        try:
            answer_json, data = _fetch_many(batch, b"".join(b for _, b, _ in part))
            answer = json.loads(answer_json)
        except Exception as e:
            for _, _, future in part:
                if not future.done():
                    future.set_exception(ConnectionError(str(e)))
            continue
        offset = 0
        for (_, _, future), meta, size in zip(part, answer["responses"], answer["sizes"]):
            if not future.done():
                future.set_result((meta, data[offset : offset + size]))
            offset += size


def _request(method, url, headers):
    """A request's JSON, as the front reads it (src/protocol/fetch.rs `FetchRequest`)."""
    return json.dumps({
        "method": str(method),
        "url": str(url),
        "headers": [[_text(name), _text(value)] for name, value in headers],
    })


def _answer(meta, data):
    """The front's answer (`meta`, the body `data`) as an `Answer`; raises `ConnectionError`
    with the front's words for a refusal."""
    if "error" in meta:
        raise ConnectionError(meta["error"])
    headers = [(name, value) for name, value in meta["headers"]]
    return Answer(meta["status"], meta["statusText"], headers, meta["url"], bytes(data))


def _text(value):
    """A header name or value as text (the libraries give bytes or str)."""
    return value.decode("latin-1") if isinstance(value, (bytes, bytearray)) else str(value)


# --- http.client (urllib.request) ---------------------------------------------------------


class _Bytes:
    """A socket stand-in that `http.client.HTTPResponse` reads a whole response from."""

    def __init__(self, data):
        self._data = data

    def makefile(self, mode, *args, **kwargs):
        return io.BytesIO(self._data)

    def close(self):
        pass


def _http_response(client, answer, method):
    """`answer` as `client.HTTPResponse` (http.client's), parsed from its bytes as from a
    socket: status line, headers (with the body's own length, but for a `HEAD`, whose headers
    describe the body it did not send) and body."""
    lines = [f"HTTP/1.1 {answer.status} {answer.reason or 'Unknown'}"]
    if method == "HEAD":
        lines += [f"{name}: {value}" for name, value in answer.headers if name != "transfer-encoding"]
    else:
        lines += [f"{name}: {value}" for name, value in answer.headers if name not in _FRAMING_HEADERS]
        lines.append(f"content-length: {len(answer.body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace")
    response = client.HTTPResponse(_Bytes(head + answer.body), method=method, url=answer.url)
    response.begin()
    return response


def _announces_body(headers):
    """Whether `headers` announce a body (a length above 0, or a transfer coding)."""
    for name, value in headers:
        name = name.lower()
        if name == "transfer-encoding" or name == "content-length" and value.strip() not in ("", "0"):
            return True
    return False


def _patch_http_client(client):
    """Makes `client` (http.client) send through the bridge: its connections gather the request
    (`putrequest`, `putheader`, `endheaders`, `send`, as `request` calls them) and make it at
    `getresponse`; nothing connects."""
    base = client.HTTPConnection

    class HTTPConnection(base):
        _scheme = "http"

        def connect(self):
            """Nothing to connect: the front connects, request by request."""

        def putrequest(self, method, url, skip_host=False, skip_accept_encoding=False):
            self._mcp_request = [method, url, [], []]

        def putheader(self, header, *values):
            value = "\r\n\t".join(_text(v) for v in values)
            self._pending()[2].append((_text(header), value))

        def endheaders(self, message_body=None, *, encode_chunked=False):
            request = self._pending()
            if message_body is not None:
                request[3].append(_as_bytes(message_body))
            # Made now when the request is whole (as `request` gives it), so that a refusal is
            # raised where a failed connection would be, which urllib.request words as a
            # URLError; a body still to come through `send` waits for `getresponse`.
            if message_body is not None or not _announces_body(request[2]):
                self._made = self._make(request)

        def send(self, data):
            self._pending()[3].append(_as_bytes(data))

        def _pending(self):
            request = getattr(self, "_mcp_request", None)
            if request is None:
                raise client.CannotSendHeader()
            return request

        def getresponse(self):
            made = getattr(self, "_made", None) or self._make(self._pending())
            self._made = None
            return made

        def _make(self, request):
            """Sends `request` through the bridge; its response."""
            method, url, headers, parts = request
            self._mcp_request = None
            if not url.startswith(("http://", "https://")):
                host = self._tunnel_host or self.host
                port = self._tunnel_port if self._tunnel_host else self.port
                default = 443 if self._scheme == "https" else 80
                authority = host if port in (None, default) else f"{host}:{port}"
                url = f"{self._scheme}://{authority}{url}"
            body = b"".join(parts) if parts else None
            try:
                answer = send(method, url, headers, body)
            except ConnectionError as e:
                raise ConnectionRefusedError(str(e)) from None
            return _http_response(client, answer, method)

        def close(self):
            self._mcp_request = None
            self._made = None

    class HTTPSConnection(HTTPConnection):
        """TLS is the front's (verified against its roots): `context` and the like are taken
        and left unused."""

        default_port = 443
        _scheme = "https"

        def __init__(self, host, port=None, *args, context=None, **kwargs):
            super().__init__(host, port, *args, **kwargs)

    for cls in (HTTPConnection, HTTPSConnection):
        cls.__module__ = client.__name__
    client.HTTPConnection = HTTPConnection
    client.HTTPSConnection = HTTPSConnection
    # urllib.request makes a TLS context for its HTTPS handler; the front needs none (and the
    # interpreter may have no `ssl`).
    client._create_https_context = lambda http_version: None


# --- urllib3 (requests) -------------------------------------------------------------------


def _patch_urllib3(connection):
    """Makes urllib3's Emscripten connections (`connection`, urllib3.contrib.emscripten's)
    send through the bridge."""
    from urllib3.contrib.emscripten.fetch import _RequestError
    from urllib3.contrib.emscripten.response import EmscriptenResponse

    def send_request(request):
        try:
            answer = send(request.method, request.url, request.headers.items(), request.body)
        except ConnectionError as e:
            raise _RequestError(str(e), request=request) from None
        headers = {}
        for name, value in answer.headers:
            if name not in _FRAMING_HEADERS:
                headers[name] = f"{headers[name]}, {value}" if name in headers else value
        response = EmscriptenResponse(status_code=answer.status, headers=headers, body=answer.body, request=request)
        response.reason = answer.reason
        return response

    class Wrapper(connection.EmscriptenHttpResponseWrapper):
        """urllib3's response, with the reason phrase the server gave (urllib3's Emscripten
        support leaves it empty: `XMLHttpRequest` hides it)."""

        def __init__(self, internal_response, *args, **kwargs):
            super().__init__(internal_response, *args, **kwargs)
            self.reason = getattr(internal_response, "reason", "")

    connection.send_request = send_request
    # No streaming yet: urllib3 then reads the whole response through `send_request`.
    connection.send_streaming_request = lambda request: None
    connection.EmscriptenHttpResponseWrapper = Wrapper


# --- httpx --------------------------------------------------------------------------------


def _patch_httpx(transports):
    """Makes httpx's default transports (`transports`, httpx._transports.default) send
    through the bridge; the async one's requests go out together (`send_async`)."""
    import httpx

    def respond(request):
        try:
            answer = send(request.method, str(request.url), request.headers.multi_items(), request.content or None)
        except ConnectionError as e:
            raise httpx.ConnectError(str(e), request=request) from None
        return response(request, answer)

    async def respond_async(request):
        try:
            answer = await send_async(request.method, str(request.url), request.headers.multi_items(),
                                      request.content or None)
        except ConnectionError as e:
            raise httpx.ConnectError(str(e), request=request) from None
        return response(request, answer)

    def response(request, answer):
        # The body is whole: no longer chunked (its length and encoding stand as sent).
        headers = [(name, value) for name, value in answer.headers if name != "transfer-encoding"]
        extensions = {"http_version": b"HTTP/1.1", "reason_phrase": answer.reason.encode("ascii", "replace")}
        return httpx.Response(answer.status, headers=headers, content=answer.body, request=request, extensions=extensions)

    def handle_request(self, request):
        request.read()
        return respond(request)

    async def handle_async_request(self, request):
        await request.aread()
        return await respond_async(request)

    transports.HTTPTransport.handle_request = handle_request
    transports.AsyncHTTPTransport.handle_async_request = handle_async_request


# --- the patcher --------------------------------------------------------------------------

# Module name -> the patch applied once it has run.
_PATCHES = {
    "http.client": _patch_http_client,
    "urllib3.contrib.emscripten.connection": _patch_urllib3,
    "httpx._transports.default": _patch_httpx,
}


class _Patcher(importlib.abc.MetaPathFinder):
    """Finds the modules of `_PATCHES` as the other finders do, and patches each once it has
    run."""

    def find_spec(self, name, path=None, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    """`loader`, then `patch` on the module it made."""

    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)


def install(fetch, fetch_many):
    """Bridges the libraries to `fetch` and `fetch_many` (the host calls): those already
    imported now, the others as they are imported."""
    global _fetch, _fetch_many
    _fetch, _fetch_many = fetch, fetch_many
    for name, patch in _PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])
    sys.meta_path.insert(0, _Patcher())

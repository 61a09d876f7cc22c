"""A real local HTTP package mirror for tests: it forwards PyPI JSON API requests and file
downloads to the upstream index and counts every request it serves."""

import json
import threading
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

UPSTREAM = "https://pypi.org/pypi"


class Mirror:
    def __init__(self, upstream=UPSTREAM):
        self.upstream = upstream.rstrip("/")
        self.requests = []
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                mirror.requests.append(self.path)
                try:
                    body = mirror.answer(self.path)
                except urllib.error.HTTPError as e:
                    self.send_error(e.code)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, path):
        parsed = urllib.parse.urlparse(path)
        if parsed.path == "/file":
            url = urllib.parse.parse_qs(parsed.query)["u"][0]
            with urllib.request.urlopen(url, timeout=60) as r:
                return r.read()
        project = parsed.path.strip("/").split("/")[1]
        upstream_url = f"{self.upstream}/{project}/json"
        with urllib.request.urlopen(upstream_url, timeout=60) as r:
            data = json.load(r)
        for files in [data.get("urls", []), *data.get("releases", {}).values()]:
            for f in files:
                absolute = urllib.parse.urljoin(upstream_url, f["url"])
                f["url"] = f"{self.url}/file?u={urllib.parse.quote(absolute, safe='')}"
        return json.dumps(data).encode()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

"""Traces (issue 48; README "Traces"): the server exports OpenTelemetry spans over OTLP/HTTP when
`OTEL_EXPORTER_OTLP_ENDPOINT` is set. A receiver in the test takes the export and decodes it with
the official `opentelemetry-proto` messages; the client is fastmcp 4's, sending its trace
context in `params._meta` (SEP-414), and code mode's upstream server (upstream_server.py)
records the context it received.

Shown: one trace from the client's `traceparent` through the server's spans to the upstream
server, the spans' parent-child structure, and a failed call's span with the error status."""

import json
import re
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx2
import pytest
from fastmcp import Client
from fastmcp.client.transports import StreamableHttpTransport
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from conftest import CALL_TIMEOUT, INIT_TIMEOUT, TOOL, http_server
from test_code_mode import TOKEN, upstream_server

pytestmark = pytest.mark.anyio

SERVICE = "mcp-run-python-under-test"
# Milliseconds between two exports of the server's batch: the test reads the spans after the
# server stopped (its last export is at shutdown), so this only keeps exports small.
BATCH_DELAY_MS = "200"


class Receiver:
    """An OTLP/HTTP trace receiver on a free loopback port: every span it is sent, with its
    resource's attributes."""

    def __init__(self):
        self.spans = []
        self.resources = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                assert self.path == "/v1/traces", self.path
                assert self.headers["Content-Type"] == "application/x-protobuf", self.headers
                request = ExportTraceServiceRequest.FromString(body)
                for resource_spans in request.resource_spans:
                    receiver.resources.append(attributes(resource_spans.resource.attributes))
                    for scope_spans in resource_spans.scope_spans:
                        receiver.spans.extend(scope_spans.spans)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def attributes(key_values):
    """OTLP attributes as a dict of their string, integer or boolean values."""
    found = {}
    for kv in key_values:
        value = kv.value
        found[kv.key] = getattr(value, value.WhichOneof("value")) if value.WhichOneof("value") else None
    return found


def traceparent():
    """A new W3C traceparent (sampled): the client's span."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


async def test_a_trace_runs_from_the_client_through_the_server_to_the_upstream(tmp_path, receiver):
    log = tmp_path / "upstream.jsonl"
    log.touch()
    parent = traceparent()
    failing_parent = traceparent()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": SERVICE,
           "OTEL_BSP_SCHEDULE_DELAY": BATCH_DELAY_MS}
    with upstream_server(log) as upstream_url:
        config = tmp_path / "tools.json"
        config.write_text(json.dumps({"mcpServers": {"upstream": {
            "url": upstream_url, "headers": {"Authorization": f"Bearer {TOKEN}"}, "allowedTools": ["add"]}}}))
        with http_server("streamable-http", "--tools-config", str(config), env=env) as base:
            async with Client(StreamableHttpTransport(f"{base}/mcp"), init_timeout=INIT_TIMEOUT,
                              timeout=CALL_TIMEOUT) as client:
                ok = await client.call_tool(
                    TOOL, {"python_code": "import mcp_tools\n(await mcp_tools.upstream.add(2, 3))['sum']"},
                    meta={"traceparent": parent})
                assert "<return_value>\n5\n" in ok.content[0].text, ok
                failed = await client.call_tool(TOOL, {"python_code": "1 / 0"}, meta={"traceparent": failing_parent},
                                                raise_on_error=False)
                assert "ZeroDivisionError" in failed.content[0].text, failed
    # The server stopped: its last batch was exported at shutdown.
    assert receiver.resources and all(r.get("service.name") == SERVICE for r in receiver.resources), receiver.resources
    trace_id = parent.split("-")[1]
    trace = [s for s in receiver.spans if s.trace_id.hex() == trace_id]
    by_id = {s.span_id.hex(): s for s in trace}
    names = sorted(s.name for s in trace)

    # The request's span is the child of the client's span, a server span after the conventions.
    (call,) = [s for s in trace if s.name == f"tools/call {TOOL}" and s.kind == Span.SPAN_KIND_SERVER]
    assert call.parent_span_id.hex() == parent.split("-")[2], names
    call_attributes = attributes(call.attributes)
    assert call_attributes["mcp.method.name"] == "tools/call" and call_attributes["gen_ai.tool.name"] == TOOL
    assert call.status.code != Status.STATUS_CODE_ERROR

    # Its steps are its children, and the upstream call is the run's child.
    children = {s.name for s in trace if s.parent_span_id == call.span_id}
    assert {"queue", "interpreter", "run"} <= children, names
    (run,) = [s for s in trace if s.name == "run" and s.parent_span_id == call.span_id]
    (upstream,) = [s for s in trace if s.name == "tools/call add"]
    assert upstream.kind == Span.SPAN_KIND_CLIENT and upstream.parent_span_id == run.span_id, names
    assert all(s.parent_span_id.hex() in by_id for s in trace if s is not call), names

    # The upstream server received the same trace, its parent the upstream call's span.
    (added,) = [json.loads(line) for line in log.read_text().splitlines() if '"add"' in line]
    assert re.fullmatch(rf"00-{trace_id}-{upstream.span_id.hex()}-01", added["traceparent"] or ""), added

    # The failed call's span carries the error status and its kind.
    failing = [s for s in receiver.spans if s.trace_id.hex() == failing_parent.split("-")[1]
               and s.name == f"tools/call {TOOL}"]
    assert len(failing) == 1 and failing[0].status.code == Status.STATUS_CODE_ERROR, failing
    assert attributes(failing[0].attributes)["error.type"] == "run-error", failing


async def test_an_older_client_is_traced_from_its_http_header(receiver):
    """A 2025-11-25 client that sends no `_meta` context, behind an instrumented HTTP stack
    that sends the `traceparent` header: the call's span is that header's child."""
    parent = traceparent()
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}}
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": BATCH_DELAY_MS}
    with http_server("streamable-http", env=env) as base:
        async with httpx2.AsyncClient(timeout=CALL_TIMEOUT) as http:
            r = await http.post(f"{base}/mcp", json=initialize, headers=accept)
            session = {**accept, "Mcp-Session-Id": r.headers["mcp-session-id"], "Mcp-Protocol-Version": "2025-11-25"}
            await http.post(f"{base}/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=session)
            r = await http.post(f"{base}/mcp", headers={**session, "traceparent": parent}, json={
                "jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": TOOL, "arguments": {"python_code": "1"}}})
            assert "<return_value>\\n1\\n" in r.text, r.text  # in the JSON of an SSE event
    (call,) = [s for s in receiver.spans if s.name == f"tools/call {TOOL}"]
    assert call.trace_id.hex() == parent.split("-")[1] and call.parent_span_id.hex() == parent.split("-")[2]
    assert attributes(call.attributes)["mcp.session.id"] == session["Mcp-Session-Id"]


async def test_otel_sdk_disabled_turns_the_export_off(receiver):
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SDK_DISABLED": "true",
           "OTEL_BSP_SCHEDULE_DELAY": BATCH_DELAY_MS}
    with http_server("streamable-http", env=env) as base:
        async with Client(StreamableHttpTransport(f"{base}/mcp"), init_timeout=INIT_TIMEOUT,
                          timeout=CALL_TIMEOUT) as client:
            await client.call_tool(TOOL, {"python_code": "1"}, meta={"traceparent": traceparent()})
    assert receiver.spans == []

//! Streamable HTTP (MCP spec 2025-03-26 and later), stateful or stateless, at `/mcp`, using
//! rmcp's server; and the HTTP listener shared with the legacy SSE transport.
//!
//! Every answer given before its request's body was read says `Connection: close`
//! ([`unread_body`]). Every route sits behind three layers: the DNS-rebinding guard ([`Access`]: `Host` and
//! `Origin` checks, first of all), then CORS for the origins the guard let through ([`cors`]:
//! a browser page at an `--allow-origin` origin gets its preflight answered and may read the
//! answers), then [`json_errors`], which gives every refusal that has no JSON body
//! yet (rmcp's and axum's plain-text ones) the JSON-RPC error of [`crate::server::errors`], keeping
//! its status and `Allow` header. `/mcp` also has [`mcp_prechecks`] in front of rmcp.
//!
//! Status codes, from the MCP spec (2025-11-25 streamable HTTP, 2024-11-05 HTTP with SSE) and,
//! where the spec is silent, the MCP TypeScript SDK that the Deno original runs on:
//!
//! | endpoint | request | status | JSON-RPC error |
//! |---|---|---|---|
//! | every path | `Origin` present and not allowed (spec: MUST validate `Origin`) | 403 | -32000 |
//! | every path | `Host` missing or not allowed | 403 | -32000 |
//! | every path | OPTIONS preflight from an allowed `Origin` (Fetch standard, CORS) | 200, `Access-Control-Allow-*` | |
//! | `/healthz` | GET (outside the guard: probes) | 200 | |
//! | `/readyz` | GET (outside the guard): a new sandbox is cheap / not (zygote, spares, shutdown) | 200 / 503 | |
//! | other paths | any | 404 | -32000 |
//! | `/mcp` | POST `initialize` (stateful) | 200, event stream, `Mcp-Session-Id` | |
//! | `/mcp` | POST request | 200, event stream (stateless: JSON) | |
//! | `/mcp` | POST notification or response (spec: 202, no body) | 202, no body | |
//! | `/mcp` | POST without session id while `--max-sessions` are live | 503 | -32000 |
//! | `/mcp` | POST body over the limit | 413 | -32600 |
//! | `/mcp` | POST body not UTF-8 or not JSON | 400 | -32700 |
//! | `/mcp` | POST JSON that is no JSON-RPC message, or a batch | 400 | -32600 |
//! | `/mcp` | POST `Accept` without JSON and event stream; GET without event stream | 406 | -32000 |
//! | `/mcp` | POST `Content-Type` not `application/json` | 415 | -32000 |
//! | `/mcp` | unsupported `MCP-Protocol-Version` (spec: 400) | 400 | -32600 |
//! | `/mcp` | stateful, no `Mcp-Session-Id` but for `initialize` (spec: SHOULD 400) | 400 | -32600 |
//! | `/mcp` | stateful, unknown or ended session (spec: MUST 404) | 404 | -32001 |
//! | `/mcp` | GET with a session (stateful) | 200, event stream | |
//! | `/mcp` | DELETE with a session (stateful; the TypeScript SDK's answer) | 200, no body | |
//! | `/mcp` | other methods; stateless also GET and DELETE (spec: GET → stream or 405) | 405, `Allow` | -32000 |
//! | `/sse` | GET | 200, event stream, first event `endpoint` | |
//! | `/sse` | GET while `--max-sessions` are live | 503 | -32000 |
//! | `/sse` | other methods | 405, `Allow` | -32000 |
//! | `/messages` | POST to a live session | 202, no body | |
//! | `/messages` | no `session_id` | 400 | -32600 |
//! | `/messages` | unknown or ended session (as the Python SDK's SSE server) | 404 | -32001 |
//! | `/messages` | body over the limit / not JSON / no JSON-RPC message | 413 / 400 / 400 | -32600 / -32700 / -32600 |
//! | `/messages` | other methods | 405, `Allow` | -32000 |
//!
//! On `/mcp` the body checks (413, 400) come before rmcp's header checks (406, 415). Where
//! the Deno original differs, the spec wins: it answers an unknown session 400 (and `GET` or
//! `DELETE` without a known session 400 in plain text), an unknown path and a wrong method in
//! plain text, and has no body limit.

use super::task_routing;
use crate::sandbox::handle::SandboxId;
use crate::server::errors::{self, Refusal};
use crate::server::handler::{RunPythonServer, SESSION_HEADER};
use crate::server::ops::health;
use crate::server::ops::idle::StreamableSessions;
use crate::server::sessions::{Sessions, SessionsFull};
use crate::server::tools::{self, reach::MintedSandbox, Reach};
use crate::server::transport::request_streams::RequestStreams;
use crate::server::transport::sse;
use crate::server::transport::unread_body;
use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, ProtocolVersion};
use rmcp::transport::common::http_header::{
    BASE64_HEADER_PREFIX, BASE64_HEADER_SUFFIX, HEADER_MCP_PROTOCOL_VERSION,
};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{
    SessionId, SessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long a browser may reuse a CORS preflight answer (seconds).
const CORS_MAX_AGE: Duration = Duration::from_secs(3600);

/// Request headers an MCP client in a browser sends beyond the CORS-safelisted ones (MCP spec,
/// streamable HTTP: session, protocol version, resumption, SEP-2243's `Mcp-*` headers;
/// `Authorization` for clients that send one).
const CORS_REQUEST_HEADERS: [&str; 9] = [
    "content-type",
    "accept",
    "authorization",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
    // SEP-2243's routing headers (MCP 2026-07-28).
    "mcp-method",
    "mcp-name",
    SANDBOX_PARAM_HEADER,
];

/// Response headers a browser page may read: the session id it must send back, the protocol
/// version, and the sandbox a call works in.
const CORS_EXPOSED_HEADERS: [&str; 4] = [
    "mcp-session-id",
    "mcp-protocol-version",
    SANDBOX_RESPONSE_HEADER,
    "www-authenticate",
];

/// CORS (the Fetch standard) for requests the guard let through: their `Origin`, if any, is a
/// loopback one or an `--allow-origin` one, so it is mirrored back; a preflight (`OPTIONS` with
/// `Access-Control-Request-Method`) is answered here, without reaching the routes. A request
/// without `Origin` (not from a browser page) gets no CORS headers.
fn cors() -> tower_http::cors::CorsLayer {
    use axum::http::HeaderName;
    tower_http::cors::CorsLayer::new()
        .allow_origin(tower_http::cors::AllowOrigin::mirror_request())
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers(CORS_REQUEST_HEADERS.map(HeaderName::from_static))
        .expose_headers(CORS_EXPOSED_HEADERS.map(HeaderName::from_static))
        .max_age(CORS_MAX_AGE)
}

/// Room for the JSON-RPC envelope and `global_variables` around the code in a message (bytes).
const ENVELOPE_ROOM_BYTES: usize = 64 * 1024;

/// Largest HTTP request body (and stdio line) accepted, in bytes: twice the code cap (JSON
/// escapes make the code longer in the message than in the call) plus room for the JSON
/// around it.
pub fn max_body_bytes(max_code_bytes: usize) -> usize {
    max_code_bytes
        .saturating_mul(2)
        .saturating_add(ENVELOPE_ROOM_BYTES)
}

/// Most bytes of a plain-text refusal read to word its JSON-RPC error (rmcp's are one line).
const REFUSAL_TEXT_MAX_BYTES: usize = 64 * 1024;

/// rmcp's text for a request without the session id it needs (rmcp 3.9,
/// `session_id_required_response`), recognised so that it gets [`errors::session_required`]'s
/// wording like the SSE transport's missing `session_id`.
const RMCP_SESSION_REQUIRED: &str = "Bad Request: Session ID is required";

/// How long in-flight requests may run on after shutdown starts.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Interval of keep-alive comments on rmcp's event streams.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Which HTTP transport to serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpMode {
    /// Streamable HTTP with sessions (`Mcp-Session-Id`), `GET`/`DELETE /mcp`.
    Stateful,
    /// Streamable HTTP without sessions: every request is served on its own.
    Stateless,
    /// The 2024-11-05 HTTP+SSE transport: `GET /sse` and `POST /messages?session_id=…`.
    Sse,
}

/// An `--allow-origin` or `--allow-host` value that cannot be what it should be.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// Not `null` nor `scheme://host[:port]`.
    #[error("--allow-origin `{0}` is not an origin: expected scheme://host[:port] or null")]
    Origin(String),
    /// Not `host` nor `host:port`.
    #[error("--allow-host `{0}` is not a host: expected host or host:port")]
    Host(String),
}

/// Host names (and addresses) of this machine's loopback interface, accepted with any port in
/// `Host` and `Origin` headers.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// A `Host` value accepted: a host with a given port, or with any port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostRule {
    host: String,
    port: Option<u16>,
}

/// An origin accepted: the browser's opaque `null`, or a (scheme, host, port) tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
enum OriginRule {
    Null,
    Tuple {
        scheme: String,
        host: String,
        port: Option<u16>,
    },
}

/// DNS-rebinding protection for every route (MCP spec 2025-11-25, streamable HTTP, security
/// warning: servers MUST validate the `Origin` header of all incoming connections, and answer
/// an invalid one with 403): a web page the user visits could otherwise reach a server on
/// 127.0.0.1 under a name it controls and run code. The `Host` header is checked the same way,
/// as the official SDKs' transport-security settings do.
#[derive(Debug, Clone)]
pub struct Access {
    /// `None`: any `Host` (listening on every interface without `--allow-host`).
    hosts: Option<Vec<HostRule>>,
    /// Origins allowed besides the loopback ones.
    origins: Vec<OriginRule>,
}

/// Lower-case host without the brackets of an IPv6 literal.
fn normalize_host(host: &str) -> String {
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// Whether `host` (normalized) names the loopback interface.
fn is_loopback(host: &str) -> bool {
    LOOPBACK_HOSTS.contains(&host)
}

/// The host and port of a `host[:port]` value (an IPv6 literal may come bare or bracketed).
fn parse_authority(value: &str) -> Option<HostRule> {
    let value = value.trim();
    if let Ok(ip) = value.parse::<IpAddr>() {
        return Some(HostRule {
            host: ip.to_string(),
            port: None,
        });
    }
    if value.is_empty() || value.contains(['@', '/', '?', '#']) {
        return None;
    }
    let authority = value.parse::<axum::http::uri::Authority>().ok()?;
    Some(HostRule {
        host: normalize_host(authority.host()),
        port: authority.port_u16(),
    })
}

/// The port an origin means when it names none (RFC 6454 §4: the scheme's default port).
fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "http" | "ws" => Some(80),
        "https" | "wss" => Some(443),
        _ => None,
    }
}

/// An origin as browsers serialize it (RFC 6454 §6.2): `null` or `scheme://host[:port]`.
fn parse_origin(value: &str) -> Option<OriginRule> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("null") {
        return Some(OriginRule::Null);
    }
    let uri = value.parse::<Uri>().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?;
    let bare = uri.query().is_none() && matches!(uri.path(), "" | "/");
    if !bare || authority.as_str().contains('@') {
        return None;
    }
    let port = authority.port_u16().or_else(|| default_port(&scheme));
    Some(OriginRule::Tuple {
        scheme,
        host: normalize_host(authority.host()),
        port,
    })
}

impl Access {
    /// The rules for a server listening on `listen_host`: loopback names and `listen_host` as
    /// `Host` (any, when listening on every interface, unless `allow_hosts` is given), plus
    /// `allow_hosts`; loopback origins plus `allow_origins`.
    ///
    /// Errors: an `allow_origins` or `allow_hosts` value that is not an origin or a host.
    pub fn new(
        listen_host: &str,
        allow_origins: &[String],
        allow_hosts: &[String],
    ) -> Result<Access, AccessError> {
        let origins = allow_origins
            .iter()
            .filter(|o| !o.trim().is_empty())
            .map(|o| parse_origin(o).ok_or_else(|| AccessError::Origin(o.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        let extra = allow_hosts
            .iter()
            .filter(|h| !h.trim().is_empty())
            .map(|h| parse_authority(h).ok_or_else(|| AccessError::Host(h.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        let listen = normalize_host(listen_host);
        let everywhere = listen == "0.0.0.0" || listen == "::";
        if everywhere && extra.is_empty() {
            return Ok(Access {
                hosts: None,
                origins,
            });
        }
        let mut hosts: Vec<HostRule> = LOOPBACK_HOSTS
            .iter()
            .map(|h| HostRule {
                host: (*h).to_owned(),
                port: None,
            })
            .collect();
        if !everywhere && !is_loopback(&listen) {
            hosts.push(HostRule {
                host: listen,
                port: None,
            });
        }
        hosts.extend(extra);
        Ok(Access {
            hosts: Some(hosts),
            origins,
        })
    }

    /// Whether the request's `Host` (or, in HTTP/2, its `:authority`) is accepted.
    fn host_allowed(&self, uri: &Uri, headers: &HeaderMap) -> bool {
        let Some(rules) = &self.hosts else {
            return true;
        };
        let host = match headers.get(header::HOST) {
            Some(value) => value.to_str().ok().and_then(parse_authority),
            None => uri.authority().and_then(|a| parse_authority(a.as_str())),
        };
        host.is_some_and(|host| {
            rules.iter().any(|rule| {
                rule.host == host.host && rule.port.is_none_or(|port| host.port == Some(port))
            })
        })
    }

    /// Whether the request's `Origin`, if it has one, is accepted.
    fn origin_allowed(&self, headers: &HeaderMap) -> bool {
        // Requests that are not from a browser page carry no `Origin`: nothing to check.
        let Some(value) = headers.get(header::ORIGIN) else {
            return true;
        };
        let Some(origin) = value.to_str().ok().and_then(parse_origin) else {
            return false;
        };
        let loopback = matches!(&origin, OriginRule::Tuple { scheme, host, .. }
            if (scheme == "http" || scheme == "https") && is_loopback(host));
        loopback || self.origins.contains(&origin)
    }

    /// The refusal for a request this guard does not let through.
    fn check(&self, uri: &Uri, headers: &HeaderMap) -> Result<(), Refusal> {
        if !self.host_allowed(uri, headers) {
            tracing::warn!(host = ?headers.get(header::HOST), "refused a request for another Host (DNS-rebinding protection)");
            return Err(errors::forbidden_host());
        }
        if !self.origin_allowed(headers) {
            tracing::warn!(origin = ?headers.get(header::ORIGIN), "refused a request from another Origin (DNS-rebinding protection)");
            return Err(errors::forbidden_origin());
        }
        Ok(())
    }
}

/// The DNS-rebinding guard in front of every route.
async fn guard(req: Request, next: Next, access: Arc<Access>) -> Response {
    match access.check(req.uri(), req.headers()) {
        Ok(()) => next.run(req).await,
        // The refused request's body is never read: `unread_body` says `Connection: close`.
        Err(refusal) => refusal.into_response(),
    }
}

/// What a POST's answer names in its headers for a load balancer: the sandbox the call works
/// in (`Sandbox-Id`) and the task it would become (`Task-Id`).
#[derive(Default)]
struct Named {
    sandbox: Option<SandboxId>,
    task: Option<crate::server::tasks::TaskId>,
}

impl Named {
    /// Puts the names into `headers`.
    fn into_headers(self, headers: &mut HeaderMap) {
        let values = [
            (
                SANDBOX_RESPONSE_HEADER,
                self.sandbox.map(|s| s.as_str().to_owned()),
            ),
            (
                task_routing::TASK_RESPONSE_HEADER,
                self.task.map(|t| t.as_str().to_owned()),
            ),
        ];
        for (name, value) in values {
            if let Some(Ok(value)) = value.map(|v| axum::http::HeaderValue::from_str(&v)) {
                headers.insert(name, value);
            }
        }
    }
}

/// What [`mcp_prechecks`] needs.
struct McpChecks {
    max_body: usize,
    /// Whether the server is draining (new work is refused).
    drain: Arc<crate::server::ops::drain::Drain>,
    /// `--stateful`: calls work in sandboxes, named in the `Sandbox-Id` response header.
    sandboxes: bool,
    sessions: Arc<Sessions>,
    /// rmcp's sessions, in stateful mode.
    manager: Option<Arc<LocalSessionManager>>,
    /// The stateful sessions' activity, when idle sessions expire.
    idle: Option<Arc<StreamableSessions>>,
}

/// The checks in front of rmcp on `/mcp`: the body's size (413) and form (400, before rmcp,
/// which would call JSON that is no message a 415), room for a new session (503), and, in
/// stateful mode, that a `DELETE` names a live session (404: rmcp would accept any id). The
/// `DELETE` that ends a session is answered 200, not rmcp's 202: the MCP TypeScript SDK (and so
/// the Deno original) answers 200, and the Python `mcp` client logs "Session termination
/// failed: 202" for anything else. In stateful mode it also keeps each session's activity
/// ([`StreamableSessions`]): a request holds its session in flight until its answer is sent.
async fn mcp_prechecks(req: Request, next: Next, checks: Arc<McpChecks>) -> Response {
    let method = req.method().clone();
    let session = req
        .headers()
        .get(SESSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(SessionId::from);
    let (req, named) = match method {
        Method::POST => match checks.post(req, session.is_some()).await {
            Ok(checked) => checked,
            Err(refusal) => return refusal.into_response(),
        },
        Method::GET => match checks.drain.refuse_stream() {
            Some(refusal) => return refusal.into_response(),
            None => (req, Named::default()),
        },
        _ => (req, Named::default()),
    };
    if method == Method::DELETE && !checks.session_is_live(session.as_ref()).await {
        return errors::unknown_session().into_response();
    }
    // A POST of a session keeps it from expiring until its answer has been sent: a call's
    // event stream stays open while the call runs. A GET's stream (the client listening for
    // notifications) lasts as long as the client likes, so it counts only as a message.
    let in_flight = match (&checks.idle, &session) {
        (Some(idle), Some(id)) if method == Method::POST => idle.begin(id),
        (Some(idle), Some(id)) => {
            idle.touch(id);
            None
        }
        _ => None,
    };
    // The drain waits for a POST's answer to be sent, not only for its call to end: rmcp ends
    // its streams once the drain is over, and an answer still on its way (a slow machine
    // writes it some time after the call's end) would be cut.
    let answering = (method == Method::POST).then(|| checks.drain.begin_call());
    let mut response = next.run(req).await;
    named.into_headers(response.headers_mut());
    if method == Method::DELETE && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    checks.follow_sessions(&method, session.as_ref(), &response);
    let response = match answering {
        Some(answering) => StreamableSessions::hold(response, answering),
        None => response,
    };
    match in_flight {
        Some(in_flight) => StreamableSessions::hold(response, in_flight),
        None => response,
    }
}

impl McpChecks {
    /// The checks of a POST (`in_session`: it names a session): its body read within the cap
    /// and parsed as one message, room for the session it would start, the drain, the
    /// `Mcp-Param-Sandbox-Id` header; the request rebuilt around the bytes read, and the
    /// sandbox it works in, for the `Sandbox-Id` response header.
    ///
    /// Errors: the [`Refusal`] to answer instead of running the request.
    async fn post(&self, req: Request, in_session: bool) -> Result<(Request, Named), Refusal> {
        let (mut parts, body) = req.into_parts();
        let (bytes, message) = errors::read_message(body, self.max_body).await?;
        // A POST without a session id that starts a session (a stateful `initialize`, any
        // stateless POST) is refused while `--max-sessions` are live.
        let starts_session = self.manager.is_none()
            || matches!(&message, ClientJsonRpcMessage::Request(r)
                if matches!(r.request, ClientRequest::InitializeRequest(_)));
        if !in_session && starts_session && self.sessions.is_full() {
            let full = SessionsFull {
                max: self.sessions.max,
            };
            return Err(errors::sessions_full(&full));
        }
        if let Some(refusal) = self.drain.refusal_for(&message) {
            return Err(refusal);
        }
        if let Some(refusal) = sandbox_header_mismatch(&parts.headers, &message) {
            return Err(refusal);
        }
        let sandbox = if self.sandboxes {
            sandbox_of_call(&mut parts, &message, in_session)
        } else {
            None
        };
        let task = task_routing::task_of_call(&mut parts, &message);
        task_routing::name_task_request(&mut parts, &message);
        let named = Named { sandbox, task };
        Ok((Request::from_parts(parts, Body::from(bytes)), named))
    }

    /// Whether a `DELETE` may go on to rmcp: in stateful mode only for a live session (rmcp
    /// would accept any id); always otherwise.
    async fn session_is_live(&self, session: Option<&SessionId>) -> bool {
        match (&self.manager, session) {
            // The local session map cannot fail to answer; if it did, there is nothing to end.
            (Some(manager), Some(id)) => manager.has_session(id).await.unwrap_or(false),
            _ => true,
        }
    }

    /// Keeps the idle expiry's list of sessions as `response` changes it: a session ended by
    /// `DELETE` is forgotten, one started by `initialize` (its answer names it) watched.
    fn follow_sessions(&self, method: &Method, session: Option<&SessionId>, response: &Response) {
        let Some(idle) = &self.idle else {
            return;
        };
        if method == Method::DELETE && response.status() == StatusCode::OK {
            if let Some(id) = session {
                idle.forget(id);
            }
        }
        if session.is_none() && response.status().is_success() {
            let new = response.headers().get(SESSION_HEADER);
            if let Some(id) = new.and_then(|v| v.to_str().ok()) {
                idle.watch(SessionId::from(id));
            }
        }
    }
}

/// The header a client mirrors a tool's `sandbox_id` argument into (SEP-2243: rmcp's
/// `Mcp-Param-` prefix and the `x-mcp-header` name of [`crate::server::tools::schema::SANDBOX_HEADER`]), in
/// lower case for the CORS list.
const SANDBOX_PARAM_HEADER: &str = "mcp-param-sandbox-id";

/// The response header that names the sandbox a `tools/call` works in (`--stateful`), for a
/// load balancer's stick table to learn where the sandbox lives (deploy/haproxy.cfg): on every
/// answer to a call that names a sandbox, and on the answer to a call that makes one, whose
/// handle is minted before the call runs since the headers go out before the result.
pub const SANDBOX_RESPONSE_HEADER: &str = "sandbox-id";

/// The sandbox `message` works in, when it is a `tools/call` that names one or will make one
/// (`create_sandbox`; `fork_sandbox`, whose copy is named rather than its source;
/// `run_python_code` without `sandbox_id` and without a session, given by `in_session`): for
/// the latter a handle is minted now and left in `parts`' extensions for the handler
/// ([`MintedSandbox`]).
fn sandbox_of_call(
    parts: &mut axum::http::request::Parts,
    message: &ClientJsonRpcMessage,
    in_session: bool,
) -> Option<SandboxId> {
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    let ClientRequest::CallToolRequest(call) = &request.request else {
        return None;
    };
    let reach = tools::reach_of(&call.params.name);
    // A fork names its source and makes a copy: the copy's handle is the one to learn.
    if let Some(named) = tools::named_sandbox(&call.params).filter(|_| reach != Some(Reach::Forks))
    {
        return SandboxId::parse(named);
    }
    let makes_one = reach.is_some_and(|r| r.makes_one(in_session));
    if !makes_one {
        return None;
    }
    // Without a handle here the handler mints its own; the header is then left out.
    let id = SandboxId::mint().ok()?;
    parts.extensions.insert(MintedSandbox(id.clone()));
    Some(id)
}

/// The refusal for a `tools/call` whose `Mcp-Param-Sandbox-Id` header differs from its body's
/// `sandbox_id` (or that has the header and no such argument), for the requests rmcp does not
/// check itself: those of protocol revisions before 2026-07-28, where a client may still send
/// the header for a load balancer. `None` when the header is absent or agrees.
fn sandbox_header_mismatch(headers: &HeaderMap, message: &ClientJsonRpcMessage) -> Option<Refusal> {
    let checked_by_rmcp = headers
        .get(HEADER_MCP_PROTOCOL_VERSION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v >= ProtocolVersion::STANDARD_HEADERS.as_str());
    let mut values = headers.get_all(SANDBOX_PARAM_HEADER).iter();
    let first = values.next()?;
    let ClientJsonRpcMessage::Request(request) = message else {
        return None;
    };
    let ClientRequest::CallToolRequest(call) = &request.request else {
        return None;
    };
    if checked_by_rmcp {
        return None;
    }
    let id = serde_json::to_value(&request.id).ok();
    if values.next().is_some() {
        return Some(errors::header_mismatch(
            id,
            "duplicate Mcp-Param-Sandbox-Id header",
        ));
    }
    let header = first.to_str().ok().and_then(decode_header_value);
    let body = tools::named_sandbox(&call.params);
    match (header.as_deref(), body) {
        (Some(h), Some(b)) if h == b => None,
        (_, None) => Some(errors::header_mismatch(
            id,
            "unexpected Mcp-Param-Sandbox-Id header for absent `sandbox_id`",
        )),
        (_, Some(b)) => Some(errors::header_mismatch(
            id,
            format!("Mcp-Param-Sandbox-Id header does not match body value `{b}`"),
        )),
    }
}

/// A SEP-2243 header value as text: plain, or inside the base64 sentinel.
fn decode_header_value(raw: &str) -> Option<String> {
    use base64::Engine as _;
    match raw
        .strip_prefix(BASE64_HEADER_PREFIX)
        .and_then(|inner| inner.strip_suffix(BASE64_HEADER_SUFFIX))
    {
        Some(inner) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(inner)
                .ok()?;
            String::from_utf8(bytes).ok()
        }
        None => Some(raw.to_owned()),
    }
}

/// Whether `response` already has a JSON body.
fn is_json(response: &Response) -> bool {
    response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/json"))
}

/// The refusal that words a plain-text error response of rmcp or axum with `status`, `text`
/// and `allow` (its `Allow` header).
fn refusal_for(status: StatusCode, text: &str, allow: &str, max_body: usize) -> Refusal {
    match status {
        StatusCode::BAD_REQUEST if text == RMCP_SESSION_REQUIRED => errors::session_required(),
        // On `/mcp` only rmcp answers 404 (unknown paths get the fallback's JSON): for an
        // unknown or ended session.
        StatusCode::NOT_FOUND => errors::unknown_session(),
        StatusCode::METHOD_NOT_ALLOWED => errors::method_not_allowed(allow),
        StatusCode::NOT_ACCEPTABLE => errors::not_acceptable(text),
        StatusCode::PAYLOAD_TOO_LARGE => errors::too_large(max_body),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => errors::unsupported_media_type(text),
        _ => errors::rejected(status, text),
    }
}

/// Gives every error response without a JSON body (rmcp's and axum's plain-text refusals) the
/// JSON-RPC error body of [`errors`], with the same status and `Allow` header.
async fn json_errors(req: Request, next: Next, max_body: usize) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) || is_json(&response) {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let text = match axum::body::to_bytes(response.into_body(), REFUSAL_TEXT_MAX_BYTES).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_owned(),
        Err(_) => status.to_string(),
    };
    let allow_text = allow
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let mut reply = refusal_for(status, &text, allow_text, max_body).into_response();
    if let Some(allow) = allow {
        reply.headers_mut().insert(header::ALLOW, allow);
    }
    reply
}

/// Where the HTTP listener listens, and whom it lets in (`--host`, `--port`, `--allow-origin`,
/// `--allow-host`; see [`Access`]).
#[derive(Clone)]
pub struct Listen<'a> {
    pub host: &'a str,
    pub port: u16,
    pub allow_origins: &'a [String],
    pub allow_hosts: &'a [String],
    /// Bearer-token authentication of the MCP routes (`--auth-jwks`, `--auth-token-file`).
    pub auth: Option<Arc<crate::server::ops::auth::Auth>>,
}

/// Serves `mode` where `listen` says until `shutdown` is cancelled (after the drain, see
/// [`crate::server::ops::drain`]); responses still being written then get up to five seconds. `metrics`,
/// when given, is served at `/metrics` ([`crate::server::ops::scrape`]).
///
/// Errors: an `--allow-origin`/`--allow-host` value is malformed, the address cannot be bound,
/// or the server fails.
pub async fn serve(
    server: RunPythonServer,
    mode: HttpMode,
    listen: Listen<'_>,
    shutdown: CancellationToken,
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
) -> Result<()> {
    let Listen {
        host,
        port,
        allow_origins,
        allow_hosts,
        auth,
    } = listen;
    let access = Arc::new(Access::new(host, allow_origins, allow_hosts)?);
    let max_body = max_body_bytes(server.max_code_bytes);
    let (router, endpoints) = match mode {
        HttpMode::Stateful | HttpMode::Stateless => (
            streamable_router(&server, mode, max_body, &shutdown),
            "the MCP endpoint is /mcp",
        ),
        HttpMode::Sse => (
            sse::router(server.clone(), max_body, shutdown.child_token()),
            "the MCP endpoints are /sse and /messages",
        ),
    };
    let guarded = guarded_routes(router, endpoints, auth.clone(), access, max_body);
    // `/healthz` and `/readyz` answer probes outside the guard (see [`health`]).
    let router = health::router(
        server.executor.settings.runtimes.own_kit().spares.clone(),
        server.drain.clone(),
    )
    .merge(crate::server::ops::scrape::router(&server, metrics))
    .merge(match &auth {
        Some(auth) => crate::server::ops::auth::metadata_router(auth.authorization_servers.clone()),
        None => Router::new(),
    })
    .fallback_service(guarded)
    .layer(axum::middleware::from_fn(unread_body::close_if_body_unread));
    let listener = bind(host, port, mode).await?;
    serve_until(listener, router, shutdown).await
}

/// The `/mcp` route of streamable HTTP (`mode` is [`HttpMode::Stateful`] or
/// [`HttpMode::Stateless`]): rmcp's service for `server`'s sessions, behind
/// [`mcp_prechecks`]; bodies up to `max_body` bytes; its streams end with `shutdown`.
fn streamable_router(
    server: &RunPythonServer,
    mode: HttpMode,
    max_body: usize,
    shutdown: &CancellationToken,
) -> Router {
    let mut config = StreamableHttpServerConfig::default();
    config.legacy_session_mode = mode == HttpMode::Stateful;
    config.json_response = mode == HttpMode::Stateless;
    config.sse_keep_alive = Some(SSE_KEEP_ALIVE);
    config.cancellation_token = shutdown.child_token();
    config.max_request_body_bytes = max_body;
    // `guard` checks `Host` and `Origin` for every route, this one included; an empty
    // list turns rmcp's own `Host` check off.
    config.allowed_hosts = Vec::new();
    let factory = server.clone();
    // SSE responses are kept with event ids, so that a client whose connection dropped
    // mid-call gets its result with `Last-Event-ID` (crate::server::transport::event_store). The stateless
    // mode answers in JSON: nothing to resume, and `GET /mcp` stays 405.
    let mut manager = LocalSessionManager::default();
    if mode == HttpMode::Stateful {
        manager = manager.with_event_store(Arc::new(
            crate::server::transport::event_store::MemoryEventStore::default(),
        ));
    }
    // rmcp would end a session after `keep_alive` without a message (its default is
    // 300 s), even with a call in flight; `StreamableSessions` ends it once idle
    // instead, and the session's worker, and with `--stateful` its state, go
    // with it.
    manager.session_config.keep_alive = None;
    let manager = Arc::new(manager);
    let stateful = mode == HttpMode::Stateful;
    let service = StreamableHttpService::new(
        move || factory.for_new_session().map_err(std::io::Error::other),
        Arc::new(RequestStreams::new(manager.clone())),
        config,
    );
    let checks = Arc::new(McpChecks {
        max_body,
        drain: server.drain.clone(),
        sandboxes: server.executor.settings.stateful,
        sessions: server.sessions.clone(),
        idle: server
            .session_idle
            .filter(|_| stateful)
            .map(|idle| StreamableSessions::new(idle, manager.clone(), shutdown.child_token())),
        manager: stateful.then_some(manager),
    });
    Router::new()
        .route_service("/mcp", service)
        .layer(axum::middleware::from_fn(move |req, next| {
            mcp_prechecks(req, next, checks.clone())
        }))
}

/// `router`'s routes, an unknown path answered in JSON naming the `endpoints`, behind the
/// bearer-token check (with `auth`), then [`json_errors`], CORS and the DNS-rebinding guard
/// (`access`), in that order from the inside out.
fn guarded_routes(
    router: Router,
    endpoints: &'static str,
    auth: Option<Arc<crate::server::ops::auth::Auth>>,
    access: Arc<Access>,
    max_body: usize,
) -> Router {
    let mut routes = router.fallback(move || async move { errors::unknown_path(endpoints) });
    // Inside CORS, so that a browser's preflight is answered without a token.
    if let Some(auth) = auth {
        routes = routes.layer(axum::middleware::from_fn(move |req, next| {
            crate::server::ops::auth::require(req, next, auth.clone())
        }));
    }
    // The routes as one service inside an outer router, so that the two layers see the
    // responses whole: axum adds the `Allow` header of a 405 outside layers on the routes.
    Router::new()
        .fallback_service(routes)
        .layer(axum::middleware::from_fn(move |req, next| {
            json_errors(req, next, max_body)
        }))
        .layer(cors())
        .layer(axum::middleware::from_fn(move |req, next| {
            guard(req, next, access.clone())
        }))
}

/// Listens on `host:port` and logs where `mode`'s MCP endpoint is served.
///
/// Errors: the address cannot be bound.
async fn bind(host: &str, port: u16, mode: HttpMode) -> Result<tokio::net::TcpListener> {
    let addr = format!("{host}:{port}");
    // A tuple, not `addr`: an IPv6 `--host` (`::1`) has no brackets to parse.
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let path = if mode == HttpMode::Sse {
        "/sse"
    } else {
        "/mcp"
    };
    tracing::info!(
        "serving MCP on http://{}{path}",
        listener.local_addr().map(|a| a.to_string()).unwrap_or(addr)
    );
    Ok(listener)
}

/// Serves `router` on `listener` until `shutdown` is cancelled; responses still being written
/// then get up to [`SHUTDOWN_GRACE`].
///
/// Errors: the server failed.
async fn serve_until(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> Result<()> {
    let graceful = shutdown.clone();
    // Responses are event streams written in small pieces: without TCP_NODELAY, Nagle's
    // algorithm and delayed ACKs add ~40 ms to every call.
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let serving = axum::serve(listener, router)
        .with_graceful_shutdown(async move { graceful.cancelled().await });
    tokio::select! {
        r = serving => r.context("HTTP server failed"),
        _ = async { shutdown.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
            tracing::warn!("in-flight requests did not finish within {} s of shutdown; stopping anyway", SHUTDOWN_GRACE.as_secs());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(header::HeaderName, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                name.clone(),
                HeaderValue::from_str(value).expect("a header"),
            );
        }
        map
    }

    fn host(value: &str) -> HeaderMap {
        headers(&[(header::HOST, value)])
    }

    fn origin(value: &str) -> HeaderMap {
        headers(&[(header::HOST, "127.0.0.1:3001"), (header::ORIGIN, value)])
    }

    fn none() -> Vec<String> {
        Vec::new()
    }

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn loopback_hosts_and_the_listen_address_pass() {
        let uri = Uri::from_static("/mcp");
        let access = Access::new("127.0.0.1", &none(), &none()).expect("valid");
        for ok in ["127.0.0.1:3001", "localhost:1", "LOCALHOST", "[::1]:3001"] {
            assert!(access.host_allowed(&uri, &host(ok)), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:3001",
            "127.0.0.2",
            "localhost.evil",
        ] {
            assert!(!access.host_allowed(&uri, &host(bad)), "{bad}");
        }
        assert!(!access.host_allowed(&uri, &HeaderMap::new()));
        let access = Access::new("192.168.1.5", &none(), &none()).expect("valid");
        assert!(access.host_allowed(&uri, &host("192.168.1.5:3001")));
    }

    #[test]
    fn every_interface_accepts_any_host_unless_allow_host_is_given() {
        let uri = Uri::from_static("/mcp");
        let access = Access::new("0.0.0.0", &none(), &none()).expect("valid");
        assert!(access.host_allowed(&uri, &host("anything.example")));
        let access = Access::new(
            "::",
            &none(),
            &strings(&["mcp.example", "other.example:8080"]),
        )
        .expect("valid");
        assert!(access.host_allowed(&uri, &host("mcp.example:3001")));
        assert!(access.host_allowed(&uri, &host("other.example:8080")));
        assert!(!access.host_allowed(&uri, &host("other.example:8081")));
        assert!(access.host_allowed(&uri, &host("localhost:3001")));
        assert!(!access.host_allowed(&uri, &host("anything.example")));
    }

    #[test]
    fn only_loopback_and_listed_origins_pass() {
        let access = Access::new(
            "127.0.0.1",
            &strings(&["https://app.example", "http://tool.example:8080"]),
            &none(),
        )
        .expect("valid");
        assert!(access.origin_allowed(&host("127.0.0.1")), "no Origin");
        for ok in [
            "http://localhost:5173",
            "https://127.0.0.1",
            "http://[::1]:8000",
            "https://app.example",
            "https://app.example:443",
            "http://tool.example:8080",
        ] {
            assert!(access.origin_allowed(&origin(ok)), "{ok}");
        }
        for bad in [
            "http://evil.example",
            "https://app.example:8443",
            "http://app.example",
            "http://tool.example",
            "null",
            "file://localhost",
            "not an origin",
            "http://localhost.evil.example",
        ] {
            assert!(!access.origin_allowed(&origin(bad)), "{bad}");
        }
        let access = Access::new("127.0.0.1", &strings(&["null"]), &none()).expect("valid");
        assert!(access.origin_allowed(&origin("null")));
    }

    #[test]
    fn a_refused_request_gets_a_403_with_a_json_rpc_error() {
        let uri = Uri::from_static("/sse");
        let access = Access::new("127.0.0.1", &none(), &none()).expect("valid");
        assert_eq!(
            access.check(&uri, &host("evil.example")),
            Err(errors::forbidden_host())
        );
        assert_eq!(
            access.check(&uri, &origin("http://evil.example")),
            Err(errors::forbidden_origin())
        );
        assert_eq!(access.check(&uri, &origin("http://localhost:1")), Ok(()));
    }

    #[test]
    fn malformed_options_are_errors() {
        assert!(matches!(
            Access::new("127.0.0.1", &strings(&["app.example"]), &none()),
            Err(AccessError::Origin(_))
        ));
        assert!(matches!(
            Access::new(
                "127.0.0.1",
                &strings(&["https://app.example/path"]),
                &none()
            ),
            Err(AccessError::Origin(_))
        ));
        assert!(matches!(
            Access::new("127.0.0.1", &none(), &strings(&["user@host"])),
            Err(AccessError::Host(_))
        ));
        assert!(Access::new("127.0.0.1", &none(), &strings(&["fe80::1", "[fe80::1]:80"])).is_ok());
    }

    #[test]
    fn the_sandbox_header_is_the_tools_annotation_under_rmcps_prefix() {
        use rmcp::transport::common::http_header::HEADER_MCP_PARAM_PREFIX;
        let mirrored = format!(
            "{HEADER_MCP_PARAM_PREFIX}{}",
            crate::server::tools::schema::SANDBOX_HEADER
        );
        assert_eq!(SANDBOX_PARAM_HEADER, mirrored.to_ascii_lowercase());
    }

    #[test]
    fn rmcp_refusals_get_the_shared_wording() {
        let max = 100;
        assert_eq!(
            refusal_for(StatusCode::BAD_REQUEST, RMCP_SESSION_REQUIRED, "", max),
            errors::session_required()
        );
        assert_eq!(
            refusal_for(
                StatusCode::NOT_FOUND,
                "Not Found: Session not found",
                "",
                max
            ),
            errors::unknown_session()
        );
        assert_eq!(
            refusal_for(StatusCode::PAYLOAD_TOO_LARGE, "too big", "", max),
            errors::too_large(max)
        );
        assert_eq!(
            refusal_for(StatusCode::METHOD_NOT_ALLOWED, "", "GET, POST, DELETE", max),
            errors::method_not_allowed("GET, POST, DELETE")
        );
        let version = refusal_for(
            StatusCode::BAD_REQUEST,
            "Bad Request: Unsupported MCP-Protocol-Version: 1999-01-01",
            "",
            max,
        );
        assert_eq!(version.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            version.error.message,
            "Bad Request: Unsupported MCP-Protocol-Version: 1999-01-01"
        );
    }
}

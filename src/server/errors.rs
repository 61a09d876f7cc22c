//! Every JSON-RPC error reply that the transports build themselves, in one place.
//!
//! rmcp answers what reaches an MCP session; the transports refuse what never gets that far
//! (bytes that are not a message, a missing or unknown session, a foreign `Origin`, …). Each
//! such failure has one function here that gives its [`Refusal`]: the JSON-RPC error (made
//! with rmcp's [`ErrorData`] constructors and [`ErrorCode`] constants) and the HTTP status it
//! travels with. The wording of a failure is the same whatever the transport; stdio writes the
//! error as one line ([`Refusal::to_line`]), HTTP and SSE as a response body
//! ([`Refusal::into_response`]).
//!
//! Error replies carry `"id": null` when the request's id could not be read, as JSON-RPC 2.0
//! §5 requires; the MCP spec (2025-11-25, streamable HTTP) lets HTTP error bodies be such an
//! id-less JSON-RPC error.

use crate::server::sessions::SessionsFull;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use rmcp::model::{ClientJsonRpcMessage, ErrorCode, ErrorData};
use serde_json::{json, Value};
use std::fmt::Display;

/// Implementation-defined server error (JSON-RPC 2.0 §5.1 reserves -32000 to -32099): used,
/// as the MCP TypeScript SDK does, for refusals of the HTTP layer that are not about the
/// JSON-RPC message itself (a forbidden origin, a wrong method, no room for a session).
pub const SERVER_ERROR: ErrorCode = ErrorCode(-32000);

/// "Session not found", in the same reserved range: the code the MCP TypeScript SDK (and so
/// the Deno original) gives an unknown or ended session.
pub const SESSION_NOT_FOUND: ErrorCode = ErrorCode(-32001);

/// A message the transport refuses before it reaches an MCP session: the JSON-RPC error, the
/// id of the request it answers (`null` when unknown) and the HTTP status it is sent with
/// (unused on stdio).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", error.message)]
pub struct Refusal {
    /// The HTTP status of the response that carries the error.
    pub status: StatusCode,
    /// The id of the request refused: a string, a number or `null`.
    pub id: Value,
    /// The JSON-RPC error (boxed: a refusal travels in `Result`s, and `ErrorData` is large).
    pub error: Box<ErrorData>,
}

impl Refusal {
    fn new(status: StatusCode, error: ErrorData) -> Refusal {
        Refusal {
            status,
            id: Value::Null,
            error: Box::new(error),
        }
    }

    /// The same refusal answering the request with `id`. Only a string or a number is a
    /// request id (JSON-RPC 2.0 §4); anything else is answered with `null`.
    pub fn with_id(mut self, id: Value) -> Refusal {
        self.id = match id {
            Value::String(_) | Value::Number(_) => id,
            _ => Value::Null,
        };
        self
    }

    /// The error as one line of the stdio transport (without its newline).
    pub fn to_line(&self) -> String {
        stdio_line(&self.id, &self.error)
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        http_response(self.status, &self.id, &self.error)
    }
}

/// The JSON-RPC 2.0 error response object for `error` answering `id`.
fn envelope(id: &Value, error: &ErrorData) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

/// `error` as an HTTP response with `status` and a JSON body.
pub fn http_response(status: StatusCode, id: &Value, error: &ErrorData) -> Response {
    let body = envelope(id, error).to_string();
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// `error` as one line of the stdio transport (MCP spec, stdio: one JSON-RPC message per line,
/// no embedded newlines — `serde_json` never writes raw newlines).
pub fn stdio_line(id: &Value, error: &ErrorData) -> String {
    envelope(id, error).to_string()
}

/// The bytes are not JSON (JSON-RPC 2.0 §5.1: -32700, "Parse error").
pub fn parse_error(detail: impl Display) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        ErrorData::parse_error(format!("Parse error: {detail}"), None),
    )
}

/// The bytes are not UTF-8, so not JSON (JSON-RPC 2.0 §5.1: -32700); `valid_up_to` is the
/// offset of the first bad byte.
pub fn not_utf8(valid_up_to: usize) -> Refusal {
    parse_error(format!("invalid UTF-8 at byte {valid_up_to}"))
}

/// JSON that is not a JSON-RPC message the client may send (JSON-RPC 2.0 §5.1: -32600,
/// "Invalid Request"; an array is a batch, which MCP 2025-06-18 and later do not allow).
pub fn invalid_message(detail: impl Display) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        ErrorData::invalid_request(format!("Invalid Request: {detail}"), None),
    )
}

/// A message (HTTP body or stdio line) larger than `max_bytes`: HTTP 413.
pub fn too_large(max_bytes: usize) -> Refusal {
    Refusal::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorData::invalid_request(
            format!("Invalid Request: the message is larger than {max_bytes} bytes"),
            None,
        ),
    )
}

/// A request without a session id where one is needed: HTTP 400 (MCP spec 2025-11-25,
/// streamable HTTP, session management: "SHOULD respond … with HTTP 400 Bad Request"; the
/// `session_id` query parameter of the 2024-11-05 HTTP+SSE transport likewise).
pub fn session_required() -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        ErrorData::invalid_request("Bad Request: a session id is required", None),
    )
}

/// A session id that names no live session (never issued, ended with `DELETE`, expired, or its
/// SSE stream closed): HTTP 404, so that the client starts a new session (MCP spec 2025-11-25,
/// streamable HTTP, session management: "MUST respond … with HTTP 404 Not Found").
pub fn unknown_session() -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        ErrorData::new(
            SESSION_NOT_FOUND,
            "Session not found: it has ended (closed, or idle longer than the server's --session-idle-timeout; its interpreter and any state are gone) or never existed; start a new session",
            None,
        ),
    )
}

/// A request whose `Mcp-Param-*` header says otherwise than its body (SEP-2243: a load
/// balancer routes on the header, so a request that would be routed as one thing and run as
/// another is refused): HTTP 400 with rmcp's `HeaderMismatch` (-32020, MCP 2026-07-28), the
/// same error rmcp gives the requests it checks itself.
pub fn header_mismatch(id: Option<Value>, detail: impl Display) -> Refusal {
    Refusal::new(
        StatusCode::BAD_REQUEST,
        ErrorData::header_mismatch(detail.to_string(), None),
    )
    .with_id(id.unwrap_or_default())
}

/// A new session while `--max-sessions` are live: HTTP 503, as the server is full, not the
/// request wrong.
pub fn sessions_full(full: &SessionsFull) -> Refusal {
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorData::new(SERVER_ERROR, full.to_string(), None),
    )
}

/// New work on a draining replica (after SIGTERM, [`crate::server::ops::drain`]): HTTP 503 answering the
/// request's `id`. Nothing ran, so a load balancer may send the
/// request to another replica (deploy/haproxy.cfg retries on 503).
pub fn draining(id: Value) -> Refusal {
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorData::new(
            SERVER_ERROR,
            "this server is draining before it stops: the request was not run; send it again (a load balancer sends it to another replica, where sandboxes continue from the shared state directory)",
            None,
        ),
    )
    .with_id(id)
}

/// A request without a valid bearer token while the server authenticates (`--auth-jwks`,
/// `--auth-token-file`): HTTP 401 (MCP spec 2025-11-25, authorization; RFC 6750 §3); the
/// caller adds `WWW-Authenticate` naming the protected resource metadata (RFC 9728 §5.1).
pub fn unauthorized(invalid: bool) -> Refusal {
    let message = if invalid {
        "Unauthorized: the bearer token is not valid here (malformed, not signed by this server's keys, expired, or meant for another audience)"
    } else {
        "Unauthorized: this server needs an `Authorization: Bearer` token; see the WWW-Authenticate header's resource_metadata"
    };
    Refusal::new(
        StatusCode::UNAUTHORIZED,
        ErrorData::new(SERVER_ERROR, message, None),
    )
}

/// An `Origin` header that is present and not allowed: HTTP 403 (MCP spec 2025-11-25,
/// streamable HTTP, security warning: servers "MUST validate the Origin header" against DNS
/// rebinding and answer an invalid one with 403 Forbidden).
pub fn forbidden_origin() -> Refusal {
    Refusal::new(
        StatusCode::FORBIDDEN,
        ErrorData::new(
            SERVER_ERROR,
            "Forbidden: the Origin header is not allowed (DNS-rebinding protection; see --allow-origin)",
            None,
        ),
    )
}

/// A `Host` header that is missing or not allowed: HTTP 403, the same protection for the
/// `Host` header as the official MCP SDKs' transport-security settings give.
pub fn forbidden_host() -> Refusal {
    Refusal::new(
        StatusCode::FORBIDDEN,
        ErrorData::new(
            SERVER_ERROR,
            "Forbidden: the Host header is not allowed (DNS-rebinding protection; see --allow-host)",
            None,
        ),
    )
}

/// A method the endpoint does not serve: HTTP 405 (RFC 9110 §15.5.6; the caller keeps the
/// `Allow` header, whose methods `allow` lists).
pub fn method_not_allowed(allow: &str) -> Refusal {
    Refusal::new(
        StatusCode::METHOD_NOT_ALLOWED,
        ErrorData::new(
            SERVER_ERROR,
            format!("Method Not Allowed: this endpoint accepts {allow}"),
            None,
        ),
    )
}

/// An `Accept` header without the media types the transport answers with: HTTP 406 (MCP spec
/// 2025-11-25, streamable HTTP: the client "MUST include an Accept header" listing them).
pub fn not_acceptable(detail: impl Display) -> Refusal {
    Refusal::new(
        StatusCode::NOT_ACCEPTABLE,
        ErrorData::new(SERVER_ERROR, detail.to_string(), None),
    )
}

/// A POST whose `Content-Type` is not `application/json`: HTTP 415.
pub fn unsupported_media_type(detail: impl Display) -> Refusal {
    Refusal::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ErrorData::new(SERVER_ERROR, detail.to_string(), None),
    )
}

/// A path that is no MCP endpoint of this mode: HTTP 404; `endpoints` names the right ones.
pub fn unknown_path(endpoints: &str) -> Refusal {
    Refusal::new(
        StatusCode::NOT_FOUND,
        ErrorData::new(SERVER_ERROR, format!("Not Found: {endpoints}"), None),
    )
}

/// Any other refusal of the HTTP layer, with its status and text (e.g. rmcp's 400 for an
/// unsupported `MCP-Protocol-Version` header): a server error status is an internal error
/// (-32603), any other an invalid request (-32600).
pub fn rejected(status: StatusCode, detail: impl Display) -> Refusal {
    let error = if status.is_server_error() {
        ErrorData::internal_error(detail.to_string(), None)
    } else {
        ErrorData::invalid_request(detail.to_string(), None)
    };
    Refusal::new(status, error)
}

/// Reads one client message from its bytes (an HTTP body or a stdio line), or the refusal
/// that answers it: not UTF-8 or not JSON is a parse error, JSON that is not a client message
/// an invalid request (answering the message's `id` when it has one).
pub fn decode(bytes: &[u8]) -> Result<ClientJsonRpcMessage, Refusal> {
    let text = std::str::from_utf8(bytes).map_err(|e| not_utf8(e.valid_up_to()))?;
    // `serde_json` refuses nesting deeper than 128 levels, so this parse is bounded.
    let value: Value = serde_json::from_str(text).map_err(parse_error)?;
    let id = value.get("id").cloned().unwrap_or(Value::Null);
    serde_json::from_value(value).map_err(|e| invalid_message(e).with_id(id))
}

/// Most bytes read on and thrown away past the limit of an oversized body, so that a client
/// still sending receives the 413 answer instead of a reset connection (64 MiB).
const DISCARD_MAX_BYTES: usize = 64 << 20;

/// Reads an HTTP request body of at most `max_bytes` and the client message in it, or the
/// refusal that answers it: [`too_large`], or what [`decode`] says. The bytes are returned
/// too, for a caller that hands the request on.
pub async fn read_message(
    body: Body,
    max_bytes: usize,
) -> Result<(Bytes, ClientJsonRpcMessage), Refusal> {
    let bytes = read_limited(body, max_bytes)
        .await
        .map_err(|id| too_large(max_bytes).with_id(id.unwrap_or_default()))?;
    let message = decode(&bytes)?;
    Ok((bytes, message))
}

/// The body if it has at most `max` bytes and arrives whole. A larger body is read on (up to
/// [`DISCARD_MAX_BYTES`] more) and dropped: the error is its request id when its first or last
/// bytes show one ([`crate::server::transport::oversized`]).
async fn read_limited(body: Body, max: usize) -> Result<Bytes, Option<Value>> {
    use http_body_util::BodyExt;
    let mut body = body;
    let mut buf = Vec::new();
    let mut seen = 0usize;
    let mut scan = crate::server::transport::oversized::IdScan::default();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { return Err(None) };
        if let Ok(data) = frame.into_data() {
            seen = seen.saturating_add(data.len());
            scan.feed(&data);
            if seen <= max {
                buf.extend_from_slice(&data);
            } else if seen > max.saturating_add(DISCARD_MAX_BYTES) {
                return Err(scan.id());
            }
        }
    }
    if seen <= max {
        Ok(buf.into())
    } else {
        Err(scan.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::to_bytes;

    /// Largest body read back in these tests (bytes).
    const TEST_BODY_MAX: usize = 1 << 16;

    #[test]
    fn each_failure_has_its_code_and_status() {
        let cases = [
            (
                parse_error("x"),
                ErrorCode::PARSE_ERROR,
                StatusCode::BAD_REQUEST,
            ),
            (not_utf8(3), ErrorCode::PARSE_ERROR, StatusCode::BAD_REQUEST),
            (
                invalid_message("x"),
                ErrorCode::INVALID_REQUEST,
                StatusCode::BAD_REQUEST,
            ),
            (
                too_large(10),
                ErrorCode::INVALID_REQUEST,
                StatusCode::PAYLOAD_TOO_LARGE,
            ),
            (
                session_required(),
                ErrorCode::INVALID_REQUEST,
                StatusCode::BAD_REQUEST,
            ),
            (unknown_session(), SESSION_NOT_FOUND, StatusCode::NOT_FOUND),
            (
                sessions_full(&SessionsFull { max: 2 }),
                SERVER_ERROR,
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (forbidden_origin(), SERVER_ERROR, StatusCode::FORBIDDEN),
            (forbidden_host(), SERVER_ERROR, StatusCode::FORBIDDEN),
            (
                method_not_allowed("POST"),
                SERVER_ERROR,
                StatusCode::METHOD_NOT_ALLOWED,
            ),
            (
                not_acceptable("x"),
                SERVER_ERROR,
                StatusCode::NOT_ACCEPTABLE,
            ),
            (
                unsupported_media_type("x"),
                SERVER_ERROR,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ),
            (unknown_path("/mcp"), SERVER_ERROR, StatusCode::NOT_FOUND),
            (
                rejected(StatusCode::CONFLICT, "x"),
                ErrorCode::INVALID_REQUEST,
                StatusCode::CONFLICT,
            ),
            (
                rejected(StatusCode::INTERNAL_SERVER_ERROR, "x"),
                ErrorCode::INTERNAL_ERROR,
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (refusal, code, status) in cases {
            assert_eq!(refusal.error.code, code, "{refusal}");
            assert_eq!(refusal.status, status, "{refusal}");
            assert_eq!(refusal.id, Value::Null);
        }
        assert_eq!(SERVER_ERROR.0, -32000);
        assert_eq!(SESSION_NOT_FOUND.0, -32001);
    }

    #[test]
    fn a_line_is_a_json_rpc_error_with_a_null_id() {
        let line = too_large(10).to_line();
        assert!(!line.contains('\n'));
        let value: Value = serde_json::from_str(&line).expect("the line is JSON");
        assert_eq!(
            value,
            json!({"jsonrpc": "2.0", "id": null, "error": {
                "code": -32600, "message": "Invalid Request: the message is larger than 10 bytes"}})
        );
    }

    #[tokio::test]
    async fn a_response_carries_the_status_and_the_same_json() {
        let refusal = unknown_session();
        let expected = envelope(&refusal.id, &refusal.error);
        let response = refusal.into_response();
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            HeaderValue::from_static("application/json")
        );
        let body = to_bytes(response.into_body(), TEST_BODY_MAX)
            .await
            .expect("a small body");
        let value: Value = serde_json::from_slice(&body).expect("the body is JSON");
        assert_eq!(value, expected);
        assert_eq!(value["error"]["code"], -32001);
    }

    #[test]
    fn only_strings_and_numbers_are_ids() {
        assert_eq!(parse_error("x").with_id(json!(7)).id, json!(7));
        assert_eq!(parse_error("x").with_id(json!("a")).id, json!("a"));
        assert_eq!(parse_error("x").with_id(json!({"a": 1})).id, Value::Null);
        assert_eq!(parse_error("x").with_id(json!([1])).id, Value::Null);
    }

    #[test]
    fn decoding_tells_parse_errors_from_invalid_requests() {
        let parse = decode(b"{not json").unwrap_err();
        assert_eq!(parse.error.code, ErrorCode::PARSE_ERROR);
        assert_eq!(
            parse.error.message,
            "Parse error: key must be a string at line 1 column 2"
        );
        assert_eq!(parse.id, Value::Null);

        let bad_utf8 = decode(b"{\"a\":\"\xff\"}").unwrap_err();
        assert_eq!(bad_utf8.error.code, ErrorCode::PARSE_ERROR);
        assert_eq!(
            bad_utf8.error.message,
            "Parse error: invalid UTF-8 at byte 6"
        );

        let invalid = decode(br#"{"jsonrpc":"2.0","id":7,"method":5}"#).unwrap_err();
        assert_eq!(invalid.error.code, ErrorCode::INVALID_REQUEST);
        assert!(invalid.error.message.starts_with("Invalid Request: "));
        assert_eq!(invalid.id, json!(7));

        let batch = decode(br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#).unwrap_err();
        assert_eq!(batch.error.code, ErrorCode::INVALID_REQUEST);
        assert_eq!(batch.id, Value::Null);

        assert!(decode(br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#).is_ok());
    }

    #[tokio::test]
    async fn bodies_over_the_limit_are_too_large() {
        let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
        let (bytes, _) = read_message(Body::from(&ping[..]), ping.len())
            .await
            .expect("exactly the limit is accepted");
        assert_eq!(&bytes[..], &ping[..]);
        let refusal = read_message(Body::from(&ping[..]), ping.len() - 1)
            .await
            .unwrap_err();
        // Bound to the request's id, read from the body's first bytes.
        assert_eq!(refusal, too_large(ping.len() - 1).with_id(json!(1)));
        let refusal = read_message(Body::from("{"), 10).await.unwrap_err();
        assert_eq!(refusal.error.code, ErrorCode::PARSE_ERROR);
    }
}

//! Streamable HTTP (MCP spec 2025-03-26 and later), stateful or stateless, at `/mcp`, using
//! rmcp's server; and the HTTP listener shared with the legacy SSE transport.

use super::handler::{RunPythonServer, Sessions, SessionsFull};
use super::sse;
use anyhow::{Context, Result};
use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Largest HTTP request body accepted (bytes): the code cap plus room for the JSON around it.
pub fn max_body_bytes(max_code_bytes: usize) -> usize {
    max_code_bytes.saturating_mul(2).saturating_add(64 * 1024)
}

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

/// `Host` header values accepted (DNS-rebinding protection): loopback names plus the address
/// we listen on. Listening on every interface accepts any host (rmcp reads an empty list so).
fn allowed_hosts(host: &str) -> Vec<String> {
    if host == "0.0.0.0" || host == "::" {
        return Vec::new();
    }
    let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "::1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if !hosts.iter().any(|h| h == host) {
        hosts.push(host.to_owned());
    }
    hosts
}

async fn not_found() -> impl IntoResponse {
    (
        StatusCode::NOT_FOUND,
        "not found: the MCP endpoints are /mcp (streamable HTTP) or /sse and /messages (SSE)\n",
    )
}

/// A JSON-RPC error response with `id: null` (JSON-RPC 2.0 §5.1 codes).
pub fn jsonrpc_error(status: StatusCode, code: i64, message: &str) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": null, "error": {"code": code, "message": message}});
    (status, Json(body)).into_response()
}

/// Gives every rejection of `/mcp` a JSON-RPC error body: malformed JSON is a parse error
/// (-32700, HTTP 400) before it reaches rmcp, an oversized body is HTTP 413, and rmcp's
/// plain-text rejections (missing session id, unknown session, bad headers) keep their status
/// with a JSON-RPC body. An unknown session stays HTTP 404, as the MCP spec requires, so that
/// clients start a new session.
async fn jsonrpc_errors(
    req: Request,
    next: Next,
    max_body: usize,
    sessions: Arc<Sessions>,
) -> Response {
    // A POST without a session id starts a session (stateful `initialize`, or any stateless
    // request): refuse it while `--max-sessions` are live.
    if req.method() == Method::POST
        && !req.headers().contains_key("mcp-session-id")
        && sessions.is_full()
    {
        return jsonrpc_error(
            StatusCode::SERVICE_UNAVAILABLE,
            -32000,
            &SessionsFull { max: sessions.max }.to_string(),
        );
    }
    let req = if req.method() == Method::POST {
        let (parts, body) = req.into_parts();
        let bytes = match read_body(body, max_body).await {
            Some(b) => b,
            None => {
                return jsonrpc_error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    -32600,
                    &format!("request body is larger than {max_body} bytes"),
                )
            }
        };
        if let Err(e) = serde_json::from_slice::<serde_json::Value>(&bytes) {
            return jsonrpc_error(
                StatusCode::BAD_REQUEST,
                -32700,
                &format!("Parse error: {e}"),
            );
        }
        Request::from_parts(parts, Body::from(bytes))
    } else {
        req
    };
    let response = next.run(req).await;
    let status = response.status();
    let is_text = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_none_or(|ct| ct.starts_with("text/plain"));
    if !(status.is_client_error() && is_text) {
        return response;
    }
    let text = match axum::body::to_bytes(response.into_body(), 64 * 1024).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => status.to_string(),
    };
    let code = if status == StatusCode::NOT_FOUND {
        -32001
    } else {
        -32600
    };
    jsonrpc_error(status, code, text.trim())
}

/// The body if it has at most `max` bytes. A larger body is read on and discarded (up to
/// 64 MiB more) so that the client, still sending, receives the 413 answer instead of a reset.
async fn read_body(body: Body, max: usize) -> Option<axum::body::Bytes> {
    use http_body_util::BodyExt;
    const DISCARD_MAX: usize = 64 << 20;
    let mut body = body;
    let mut buf = Vec::new();
    let mut seen = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { return None };
        if let Ok(data) = frame.into_data() {
            seen += data.len();
            if seen <= max {
                buf.extend_from_slice(&data);
            } else if seen > max + DISCARD_MAX {
                return None;
            }
        }
    }
    (seen <= max).then(|| buf.into())
}

/// Serves `mode` on `host:port` until `shutdown` is cancelled; in-flight requests then get up
/// to five seconds to finish.
///
/// Errors: the address cannot be bound, or the server fails.
pub async fn serve(
    server: RunPythonServer,
    mode: HttpMode,
    host: &str,
    port: u16,
    shutdown: CancellationToken,
) -> Result<()> {
    let max_body = max_body_bytes(server.max_code_bytes);
    let router = match mode {
        HttpMode::Stateful | HttpMode::Stateless => {
            let mut config = StreamableHttpServerConfig::default();
            config.legacy_session_mode = mode == HttpMode::Stateful;
            config.json_response = mode == HttpMode::Stateless;
            config.sse_keep_alive = Some(Duration::from_secs(15));
            config.cancellation_token = shutdown.child_token();
            config.max_request_body_bytes = max_body;
            config.allowed_hosts = allowed_hosts(host);
            let factory = server.clone();
            let service = StreamableHttpService::new(
                move || factory.for_new_session().map_err(std::io::Error::other),
                Arc::new(LocalSessionManager::default()),
                config,
            );
            let sessions = server.sessions.clone();
            Router::new()
                .route_service("/mcp", service)
                .layer(axum::middleware::from_fn(move |req, next| {
                    jsonrpc_errors(req, next, max_body, sessions.clone())
                }))
        }
        HttpMode::Sse => sse::router(server.clone(), max_body, shutdown.child_token()),
    }
    .fallback(not_found);

    let addr = format!("{host}:{port}");
    let listener = tokio::net::TcpListener::bind(&addr)
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
        _ = async { shutdown.cancelled().await; tokio::time::sleep(Duration::from_secs(5)).await } => {
            tracing::warn!("in-flight requests did not finish within 5 s of shutdown; stopping anyway");
            Ok(())
        }
    }
}

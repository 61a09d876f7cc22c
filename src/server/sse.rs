//! The legacy HTTP+SSE transport (MCP spec 2024-11-05), which rmcp does not serve: `GET /sse`
//! opens an event stream whose first `endpoint` event names `/messages?session_id=…`; the client
//! POSTs JSON-RPC messages there and the replies arrive as `message` events. Each stream is one
//! rmcp session over a channel pair, so the protocol itself stays rmcp's.

use super::execute::Tenant;
use super::handler::{stamp_arrival, RunPythonServer};
use super::http::jsonrpc_error;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures::channel::mpsc;
use futures::{SinkExt, Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::ServiceExt;
use serde::Deserialize;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Each live stream's channel to its rmcp session, and its tenant (to stamp call arrivals).
type Sessions =
    Arc<Mutex<HashMap<String, (mpsc::Sender<ClientJsonRpcMessage>, Option<Arc<Tenant>>)>>>;

#[derive(Clone)]
struct AppState {
    server: RunPythonServer,
    sessions: Sessions,
    shutdown: CancellationToken,
}

/// The `/sse` and `/messages` routes.
pub fn router(server: RunPythonServer, max_body: usize, shutdown: CancellationToken) -> Router {
    let state = AppState {
        server,
        sessions: Arc::default(),
        shutdown,
    };
    Router::new()
        .route("/sse", get(open_stream))
        .route("/messages", post(post_message))
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .with_state(state)
}

/// Removes the session when its event stream is dropped (the client went away).
struct SessionGuard {
    id: String,
    sessions: Sessions,
    session_done: CancellationToken,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
        self.session_done.cancel();
    }
}

async fn open_stream(State(state): State<AppState>) -> Response {
    match state.server.for_new_session() {
        Ok(handler) => session_stream(state, handler).into_response(),
        Err(full) => jsonrpc_error(StatusCode::SERVICE_UNAVAILABLE, -32000, &full.to_string()),
    }
}

fn session_stream(
    state: AppState,
    handler: RunPythonServer,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (to_server, from_client) = mpsc::channel::<ClientJsonRpcMessage>(64);
    let (to_client, from_server) = mpsc::channel::<ServerJsonRpcMessage>(64);
    state
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), (to_server, handler.tenant()));
    let session_done = state.shutdown.child_token();
    let done = session_done.clone();
    tokio::spawn(async move {
        match handler.serve((to_client, from_client)).await {
            Ok(running) => {
                tokio::select! {
                    _ = running.waiting() => {}
                    _ = done.cancelled() => {}
                }
            }
            Err(e) => tracing::debug!("SSE session ended before initialization: {e}"),
        }
    });
    let guard = SessionGuard {
        id: id.clone(),
        sessions: state.sessions.clone(),
        session_done: session_done.clone(),
    };
    let endpoint = futures::stream::once(async move {
        Ok(Event::default()
            .event("endpoint")
            .data(format!("/messages?session_id={id}")))
    });
    let messages = from_server
        .map(move |msg| {
            let _keep = &guard;
            let data = serde_json::to_string(&msg).unwrap_or_default();
            Ok(Event::default().event("message").data(data))
        })
        .take_until(session_done.cancelled_owned());
    Sse::new(endpoint.chain(messages))
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

#[derive(Deserialize)]
struct SessionQuery {
    session_id: Option<String>,
}

async fn post_message(
    State(state): State<AppState>,
    Query(query): Query<SessionQuery>,
    body: Bytes,
) -> Response {
    let Some(id) = query.session_id else {
        return jsonrpc_error(
            StatusCode::BAD_REQUEST,
            -32600,
            "missing session_id query parameter",
        );
    };
    let sender = state
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .cloned();
    let Some((mut sender, tenant)) = sender else {
        return jsonrpc_error(
            StatusCode::BAD_REQUEST,
            -32600,
            "unknown session_id: open a new stream at GET /sse",
        );
    };
    let mut message: ClientJsonRpcMessage = match serde_json::from_slice::<serde_json::Value>(&body)
    {
        Err(e) => {
            return jsonrpc_error(
                StatusCode::BAD_REQUEST,
                -32700,
                &format!("parse error: {e}"),
            )
        }
        Ok(value) => match serde_json::from_value(value) {
            Ok(m) => m,
            Err(e) => {
                return jsonrpc_error(
                    StatusCode::BAD_REQUEST,
                    -32600,
                    &format!("invalid JSON-RPC message: {e}"),
                )
            }
        },
    };
    if let Some(tenant) = &tenant {
        stamp_arrival(&mut message, tenant);
    }
    if sender.send(message).await.is_err() {
        return jsonrpc_error(StatusCode::BAD_REQUEST, -32600, "the session has ended");
    }
    StatusCode::ACCEPTED.into_response()
}

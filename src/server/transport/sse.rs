//! The legacy HTTP+SSE transport (MCP spec 2024-11-05), which rmcp does not serve: `GET /sse`
//! opens an event stream whose first `endpoint` event names `/messages?session_id=…`; the client
//! POSTs JSON-RPC messages there and the replies arrive as `message` events. Each stream is one
//! rmcp session over a channel pair, so the protocol itself stays rmcp's.

use crate::sandbox::activity::{until_idle, Activity};
use crate::sandbox::live::Principal;
use crate::server::errors;
use crate::server::handler::RunPythonServer;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Extension;
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

/// One live stream: its channel to its rmcp session, its handler (to stamp call arrivals in
/// their sandboxes) and its activity (a message either way, a call in flight).
#[derive(Clone)]
struct Session {
    sender: mpsc::Sender<ClientJsonRpcMessage>,
    handler: RunPythonServer,
    activity: Arc<Activity>,
}

/// Each live stream's session, by the id in its endpoint URL.
type Sessions = Arc<Mutex<HashMap<String, Session>>>;

/// Ends the session (`done`) once it is idle for `idle` (`--session-idle-timeout`; see
/// [`idle`](crate::server::ops::idle)): its stream closes, its worker and state go, and later
/// POSTs get 404.
async fn expire_when_idle(activity: Arc<Activity>, idle: Duration, done: CancellationToken) {
    if until_idle(&activity, idle, &done).await {
        tracing::debug!("an SSE session was idle for {} s and ended", idle.as_secs());
        done.cancel();
    }
}

#[derive(Clone)]
struct AppState {
    server: RunPythonServer,
    sessions: Sessions,
    shutdown: CancellationToken,
    /// Largest body of a POSTed message (bytes).
    max_body: usize,
    /// How long a session may go without a message before it ends; `None`: never.
    idle: Option<Duration>,
}

/// The `/sse` and `/messages` routes. Other methods on them get axum's 405 with an `Allow`
/// header (given a JSON-RPC body by the HTTP listener).
pub fn router(server: RunPythonServer, max_body: usize, shutdown: CancellationToken) -> Router {
    let state = AppState {
        idle: server.session_idle,
        server,
        sessions: Arc::default(),
        shutdown,
        max_body,
    };
    Router::new()
        .route("/sse", get(open_stream))
        .route("/messages", post(post_message))
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

async fn open_stream(
    State(state): State<AppState>,
    principal: Option<Extension<Principal>>,
) -> Response {
    if let Some(refusal) = state.server.drain.refuse_stream() {
        return refusal.into_response();
    }
    match state.server.for_new_session() {
        Ok(handler) => {
            let handler = handler.with_principal(principal.map(|Extension(p)| p));
            session_stream(state, handler).into_response()
        }
        Err(full) => errors::sessions_full(&full).into_response(),
    }
}

fn session_stream(
    state: AppState,
    handler: RunPythonServer,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (to_server, from_client) = mpsc::channel::<ClientJsonRpcMessage>(64);
    let (to_client, from_server) = mpsc::channel::<ServerJsonRpcMessage>(64);
    let activity = Activity::new();
    // The handler holds a call in flight against the session's activity, so that a call
    // longer than the idle time does not end its own session.
    let handler = handler.with_activity(activity.clone());
    let session = Session {
        sender: to_server,
        handler: handler.clone(),
        activity: activity.clone(),
    };
    state
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), session);
    let session_done = state.shutdown.child_token();
    if let Some(idle) = state.idle {
        tokio::spawn(expire_when_idle(
            activity.clone(),
            idle,
            session_done.clone(),
        ));
    }
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
            activity.touch();
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

/// `POST /messages?session_id=…`: hands the message to the session and answers 202 Accepted
/// with no body; the reply, if any, goes out on the session's event stream (MCP spec
/// 2024-11-05, HTTP with SSE). The refusals are [`errors`]' (a missing session id 400, an
/// unknown or ended session 404, a body too large 413, bad JSON 400).
async fn post_message(
    State(state): State<AppState>,
    Query(query): Query<SessionQuery>,
    principal: Option<Extension<Principal>>,
    body: Body,
) -> Response {
    let Some(id) = query.session_id else {
        return errors::session_required().into_response();
    };
    let sender = state
        .sessions
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&id)
        .cloned();
    let Some(Session {
        mut sender,
        handler,
        activity,
    }) = sender
    else {
        return errors::unknown_session().into_response();
    };
    // A session belongs to the principal that opened its stream: to anyone else it is unknown.
    if !handler.opened_by(principal.as_ref().map(|Extension(p)| p)) {
        return errors::unknown_session().into_response();
    }
    activity.touch();
    let mut message = match errors::read_message(body, state.max_body).await {
        Ok((_, message)) => message,
        Err(refusal) => return refusal.into_response(),
    };
    if let Some(refusal) = handler.drain.refusal_for(&message) {
        return refusal.into_response();
    }
    handler.stamp_arrival(&mut message);
    if sender.send(message).await.is_err() {
        // The stream closed between the lookup and now: the session has ended.
        return errors::unknown_session().into_response();
    }
    StatusCode::ACCEPTED.into_response()
}

//! When a streamable-HTTP session counts as idle (`--session-idle-timeout`; the SSE transport
//! uses [`Activity`] directly).
//!
//! A session is idle once none of its requests is in flight and its last message went either
//! way at least the idle time ago ([`crate::sandbox::activity`]). A request in flight keeps
//! its session alive however long it runs (a call under `--timeout 0` or a slow install):
//! rmcp's own session expiry counts only messages, so a call longer than the idle time used
//! to lose its session, worker and result half-way (the client got an empty event stream).

use crate::sandbox::activity::{until_idle, Activity, InFlight};
use axum::body::Body;
use axum::response::Response;
use http_body_util::BodyExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{SessionId, SessionManager};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The stateful streamable-HTTP sessions' activity. rmcp's own expiry (its session manager's
/// `keep_alive`) is off; this one ends a session through the manager once it is idle.
pub struct StreamableSessions {
    idle: Duration,
    manager: Arc<LocalSessionManager>,
    watched: Mutex<HashMap<SessionId, Watched>>,
    shutdown: CancellationToken,
}

/// A watched session: its activity, and the token that stops its watch.
struct Watched {
    activity: Arc<Activity>,
    done: CancellationToken,
}

impl StreamableSessions {
    /// Ends `manager`'s sessions once idle for `idle`; every watch stops at `shutdown`.
    pub fn new(
        idle: Duration,
        manager: Arc<LocalSessionManager>,
        shutdown: CancellationToken,
    ) -> Arc<StreamableSessions> {
        Arc::new(StreamableSessions {
            idle,
            manager,
            watched: Mutex::default(),
            shutdown,
        })
    }

    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Watched>> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request of session `id` starts: `None` for a session not watched (unknown or ended;
    /// rmcp answers it 404).
    pub fn begin(&self, id: &SessionId) -> Option<InFlight> {
        self.watched().get(id).map(|w| w.activity.begin())
    }

    /// A message of session `id` other than a request in flight (a `GET` that opens its
    /// notification stream).
    pub fn touch(&self, id: &SessionId) {
        if let Some(w) = self.watched().get(id) {
            w.activity.touch();
        }
    }

    /// `response` with `in_flight` held until its body has been sent or dropped (a
    /// streamable-HTTP call's event stream ends with its result; a client that goes away drops
    /// it).
    pub fn hold(response: Response, in_flight: InFlight) -> Response {
        response.map(|body| {
            Body::new(body.map_frame(move |frame| {
                let _held = &in_flight;
                frame
            }))
        })
    }

    /// Watches the new session `id`, and ends it once idle.
    pub fn watch(self: &Arc<Self>, id: SessionId) {
        let activity = Activity::new();
        let done = self.shutdown.child_token();
        self.watched().insert(
            id.clone(),
            Watched {
                activity: activity.clone(),
                done: done.clone(),
            },
        );
        let this = self.clone();
        tokio::spawn(async move {
            while until_idle(&activity, this.idle, &done).await {
                // Checked again under the map's lock, and unwatched there: a request that
                // began since holds the session, and none can begin on it from now on.
                let ended = {
                    let mut watched = this.watched();
                    let idle = activity.is_idle(this.idle);
                    if idle {
                        watched.remove(&id);
                    }
                    idle
                };
                if ended {
                    tracing::debug!(
                        "a streamable-HTTP session was idle for {} s and ended",
                        this.idle.as_secs()
                    );
                    // A session that rmcp ended already has nothing left to close.
                    let _ = this.manager.close_session(&id).await;
                    return;
                }
            }
            this.watched().remove(&id);
        });
    }

    /// Session `id` ended (`DELETE`): its watch stops.
    pub fn forget(&self, id: &SessionId) {
        if let Some(w) = self.watched().remove(id) {
            w.done.cancel();
        }
    }
}

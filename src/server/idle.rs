//! When an HTTP session counts as idle (`--session-idle-timeout`), for both HTTP transports.
//!
//! A session is idle once none of its requests is in flight and its last message went either
//! way at least the idle time ago. A request in flight keeps its session alive however long it
//! runs (a call under `--timeout 0` or a slow install): rmcp's own session expiry counts only
//! messages, so a call longer than the idle time used to lose its session, interpreter and
//! result half-way (the client got an empty event stream).

use axum::body::Body;
use axum::response::Response;
use http_body_util::BodyExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{SessionId, SessionManager};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One session's activity: when a message last went either way and how many of its requests
/// are in flight.
#[derive(Debug)]
pub struct Activity(Mutex<State>);

#[derive(Debug)]
struct State {
    last: Instant,
    in_flight: usize,
}

impl Activity {
    /// A session active now, with nothing in flight.
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity(Mutex::new(State {
            last: Instant::now(),
            in_flight: 0,
        })))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A message went either way now.
    pub fn touch(&self) {
        self.state().last = Instant::now();
    }

    /// A request starts; the session is not idle until the returned guard is dropped (when the
    /// request ends, is answered or is cancelled), and its idle time counts from then.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        let mut state = self.state();
        state.in_flight += 1;
        state.last = Instant::now();
        InFlight(self.clone())
    }

    /// Whether the session has been idle for `idle` now.
    fn is_idle(&self, idle: Duration) -> bool {
        self.idle_at(idle).is_some_and(|at| at <= Instant::now())
    }

    /// When the session becomes idle if nothing happens meanwhile, or `None` while a request
    /// is in flight.
    fn idle_at(&self, idle: Duration) -> Option<Instant> {
        let state = self.state();
        (state.in_flight == 0).then(|| state.last + idle)
    }
}

/// A request of a session in flight (see [`Activity::begin`]).
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.in_flight = state.in_flight.saturating_sub(1);
        state.last = Instant::now();
    }
}

/// How often a session with a request in flight is looked at again: its request's end moves
/// the idle deadline, so this only bounds how late an expiry after a long request can be.
const IN_FLIGHT_RECHECK: Duration = Duration::from_secs(1);

/// Returns once `activity` has been idle for `idle` (true), or when `done` is cancelled first
/// (false).
pub async fn until_idle(activity: &Activity, idle: Duration, done: &CancellationToken) -> bool {
    loop {
        let wake = match activity.idle_at(idle) {
            Some(at) if at <= Instant::now() => return true,
            Some(at) => at,
            None => Instant::now() + IN_FLIGHT_RECHECK.min(idle),
        };
        tokio::select! {
            _ = tokio::time::sleep_until(wake) => {}
            _ = done.cancelled() => return false,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(10);

    #[tokio::test(start_paused = true)]
    async fn a_session_is_idle_after_the_idle_time() {
        let activity = Activity::new();
        let start = Instant::now();
        assert!(until_idle(&activity, IDLE, &CancellationToken::new()).await);
        assert_eq!(start.elapsed(), IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_its_session_and_the_idle_time_counts_from_its_end() {
        let activity = Activity::new();
        let start = Instant::now();
        let request = activity.begin();
        let long = IDLE * 5;
        tokio::spawn(async move {
            tokio::time::sleep(long).await;
            drop(request);
        });
        assert!(until_idle(&activity, IDLE, &CancellationToken::new()).await);
        let elapsed = start.elapsed();
        assert!(elapsed >= long + IDLE, "{elapsed:?}");
        assert!(elapsed <= long + IDLE + IN_FLIGHT_RECHECK, "{elapsed:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_moves_the_deadline() {
        let activity = Activity::new();
        let start = Instant::now();
        let toucher = activity.clone();
        tokio::spawn(async move {
            tokio::time::sleep(IDLE / 2).await;
            toucher.touch();
        });
        assert!(until_idle(&activity, IDLE, &CancellationToken::new()).await);
        assert_eq!(start.elapsed(), IDLE + IDLE / 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_ended_session_stops_waiting() {
        let activity = Activity::new();
        let done = CancellationToken::new();
        done.cancel();
        assert!(!until_idle(&activity, IDLE, &done).await);
    }
}

//! Activity of a session or a sandbox: when it was last used and how many of its requests are
//! in flight. A session or sandbox is idle once nothing of it is in flight and its last use is
//! at least the idle time ago; a request in flight keeps it alive however long it runs (a call
//! under `--timeout 0`, a slow install), and the idle time counts from that request's end.
//! Both the front's expiry of HTTP sessions (`--session-idle-timeout`,
//! `src/server/ops/idle.rs`) and the sandbox registry (`--sandbox-idle-timeout`, eviction at
//! `--max-sandboxes`) count this way.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// One session's or sandbox's activity: when it was last used (a message either way, a call)
/// and how many of its requests are in flight.
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
    pub fn is_idle(&self, idle: Duration) -> bool {
        self.idle_at(idle).is_some_and(|at| at <= Instant::now())
    }

    /// When the session becomes idle if nothing happens meanwhile, or `None` while a request
    /// is in flight.
    pub fn idle_at(&self, idle: Duration) -> Option<Instant> {
        self.idle_since().map(|since| since + idle)
    }

    /// Since when nothing has been in flight (the last use), or `None` while a request is.
    pub fn idle_since(&self) -> Option<Instant> {
        let state = self.state();
        (state.in_flight == 0).then_some(state.last)
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

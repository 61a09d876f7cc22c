//! Graceful drain (README "Running many replicas"): what a replica does between SIGTERM and its exit, so that a load
//! balancer can move its sandboxes without a wrong answer.
//!
//! What a client sees at each step:
//! 1. SIGTERM: `/readyz` answers 503 at once (the balancer's health check takes the replica
//!    out). New work is refused with HTTP 503 and a JSON-RPC error that says nothing ran
//!    ([`crate::server::errors::draining`]): a request (`initialize`, `tools/list`, `tools/call`…)
//!    on `/mcp` or `/messages`, a new `GET /mcp` or `/sse` stream. A balancer that retries on
//!    503 (deploy/haproxy.cfg) sends it to another replica, which restores the sandbox from
//!    `--state-dir`. Notifications (a cancellation) and responses still pass.
//! 2. Calls in flight run to their end, for up to `--drain-timeout` seconds (default: the
//!    call timeout), and are answered as usual: over streamable HTTP the drain waits until each
//!    POST's answer has been sent (`mcp_prechecks` holds a call with the response's body).
//!    Each saves its sandbox to the state directory before its answer, as every call does, so
//!    there is nothing left to flush after. The drain also waits until no new work was
//!    refused for [`DRAIN_QUIET`] (within the same timeout): a balancer still sends a
//!    sandbox's calls to this replica (stickiness outlasts the health check) until one is
//!    refused and replayed elsewhere, and a request that reached the listener as it closed
//!    would be cut without an answer that says nothing ran.
//! 3. Then the listener stops (responses being written get a few more seconds), every
//!    worker is killed and reaped, and the process exits 0. A call still running at the
//!    drain timeout is stopped: its client sees its stream end without an answer.
//!
//! A second SIGTERM or SIGINT during the drain skips to step 3. Over stdio there is one client
//! and no balancer: a signal stops the server at once.

use crate::sandbox::activity::{Activity, InFlight};
use crate::server::errors::Refusal;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a drain looks whether the calls in flight are done.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// How long no new work must have been refused before a drain ends (seconds): the balancer
/// has moved this replica's traffic elsewhere.
pub const DRAIN_QUIET: Duration = Duration::from_secs(1);

/// The server's drain state: whether it is draining, its calls in flight, and when it last
/// refused new work.
#[derive(Debug)]
pub struct Drain {
    draining: CancellationToken,
    calls: Arc<Activity>,
    last_refusal: std::sync::Mutex<Option<tokio::time::Instant>>,
}

impl Drain {
    /// A server serving, with no call in flight.
    pub fn new() -> Arc<Drain> {
        Arc::new(Drain {
            draining: CancellationToken::new(),
            calls: Activity::new(),
            last_refusal: std::sync::Mutex::new(None),
        })
    }

    /// Starts draining (SIGTERM).
    pub fn start(&self) {
        self.draining.cancel();
    }

    /// Whether the server is draining: it refuses new work.
    pub fn is_draining(&self) -> bool {
        self.draining.is_cancelled()
    }

    /// A token cancelled when the drain starts: what ends `subscriptions/listen` streams.
    pub fn draining_token(&self) -> CancellationToken {
        self.draining.clone()
    }

    /// The refusal for `message` while draining: a request (new work) is refused, a
    /// notification or a response passes, and so do `tasks/*` (SEP-2663): they ask after
    /// tasks the drain is waiting for, whose clients would otherwise lose sight of them until
    /// the replica is gone. `None` while serving.
    pub fn refusal_for(&self, message: &ClientJsonRpcMessage) -> Option<Refusal> {
        if !self.is_draining() {
            return None;
        }
        let ClientJsonRpcMessage::Request(request) = message else {
            return None;
        };
        if matches!(
            request.request,
            ClientRequest::GetTaskRequest(_)
                | ClientRequest::UpdateTaskRequest(_)
                | ClientRequest::CancelTaskRequest(_)
        ) {
            return None;
        }
        let id = serde_json::to_value(&request.id).unwrap_or(serde_json::Value::Null);
        self.refused();
        Some(crate::server::errors::draining(id))
    }

    /// The refusal of a new stream (`GET /mcp`, `GET /sse`) while draining.
    pub fn refuse_stream(&self) -> Option<Refusal> {
        if !self.is_draining() {
            return None;
        }
        self.refused();
        Some(crate::server::errors::draining(serde_json::Value::Null))
    }

    /// Notes that new work was refused now.
    fn refused(&self) {
        *self.last_refusal.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(tokio::time::Instant::now());
    }

    /// Whether no new work was refused for [`DRAIN_QUIET`].
    fn is_quiet(&self) -> bool {
        self.last_refusal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none_or(|at| at.elapsed() >= DRAIN_QUIET)
    }

    /// A call starts; the drain waits for it until the returned guard is dropped.
    pub fn begin_call(&self) -> InFlight {
        self.calls.begin()
    }

    /// Waits until no call is in flight and no new work was refused for [`DRAIN_QUIET`] (true),
    /// or `timeout` passed first (false); `None`: no limit.
    pub async fn until_calls_done(&self, timeout: Option<Duration>) -> bool {
        let done = async {
            while self.calls.idle_since().is_none() || !self.is_quiet() {
                tokio::time::sleep(DRAIN_POLL).await;
            }
        };
        match timeout {
            Some(timeout) => tokio::time::timeout(timeout, done).await.is_ok(),
            None => {
                done.await;
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_drain_waits_for_calls_in_flight_up_to_its_timeout() {
        let drain = Drain::new();
        assert!(!drain.is_draining());
        assert!(drain.until_calls_done(Some(Duration::from_secs(1))).await);
        let call = drain.begin_call();
        drain.start();
        assert!(drain.is_draining());
        assert!(!drain.until_calls_done(Some(Duration::from_secs(1))).await);
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop(call);
        });
        assert!(drain.until_calls_done(Some(Duration::from_secs(10))).await);
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_ends_only_once_new_work_stops_coming() {
        let drain = Drain::new();
        drain.start();
        assert!(drain.refuse_stream().is_some());
        let started = tokio::time::Instant::now();
        assert!(drain.until_calls_done(Some(Duration::from_secs(10))).await);
        assert!(started.elapsed() >= DRAIN_QUIET);
        // Refused work that keeps coming holds the drain until its timeout.
        drain.refuse_stream();
        let refusing = drain.clone();
        tokio::spawn(async move {
            loop {
                refusing.refuse_stream();
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        assert!(!drain.until_calls_done(Some(Duration::from_secs(5))).await);
    }
}

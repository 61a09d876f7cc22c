//! `GET /metrics` on the HTTP listener (README "Running many replicas"): the Prometheus text format of
//! [`crate::metrics`], with the gauges read from the server at each scrape.
//!
//! Like `/healthz` and `/readyz` it sits outside the DNS-rebinding guard, for a scraper that
//! reaches the pod by its address: it runs nothing and carries no user data (counts and
//! durations only, labels from fixed sets). Put the listener on a private network, or in front
//! of it a balancer that does not route `/metrics` (deploy/haproxy.cfg does not). It needs no
//! token with `--auth-jwks` either: a scraper holds no user token, and it shows counts only.

use crate::metrics::{set_gauges, Gauges};
use crate::server::handler::RunPythonServer;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

/// The metrics path.
pub const METRICS_PATH: &str = "/metrics";

/// The content type of the Prometheus text exposition format, version 0.0.4.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The `/metrics` route rendering `handle`, or no route without one.
pub fn router(server: &RunPythonServer, handle: Option<PrometheusHandle>) -> Router {
    let Some(handle) = handle else {
        return Router::new();
    };
    let server = server.clone();
    Router::new().route(
        METRICS_PATH,
        get(move || async move { render(&server, &handle) })
            .fallback(crate::server::ops::health::only_get),
    )
}

/// The gauges as of now, then everything in the text format.
fn render(server: &RunPythonServer, handle: &PrometheusHandle) -> Response {
    let spares = &server.executor.settings.runtimes.own_kit().spares;
    let counts = server.registry.counts();
    set_gauges(Gauges {
        booting: spares.booting_count(),
        spare: spares.ready_count(),
        idle: counts.idle,
        busy: server.executor.busy(),
        queue_depth: server.executor.queue_depth(),
        sandboxes: counts.sandboxes,
        hibernated: counts.hibernated,
        hibernated_bytes: counts.hibernated_bytes,
        sessions: server.sessions.live(),
    });
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(PROMETHEUS_TEXT),
        )],
        handle.render(),
    )
        .into_response()
}

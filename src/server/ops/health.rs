//! Health and readiness over HTTP, for load balancers and Kubernetes probes (README "Running many replicas"):
//! `GET /healthz` answers 200 while the process serves; `GET /readyz` answers 200 only when a
//! new sandbox is cheap (the zygote is ready where the server uses one, and a spare
//! worker is ready where spares are kept) and the server is not shutting down, else 503
//! with the reason. Both sit outside the DNS-rebinding guard: they reveal nothing and run
//! nothing, and a probe's `Host` is the pod's address.

use crate::server::ops::drain::Drain;
use crate::worker::spares::{NotReady, Spares};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;

/// The liveness path.
pub const HEALTH_PATH: &str = "/healthz";

/// The readiness path.
pub const READY_PATH: &str = "/readyz";

/// The two routes: readiness from `spares`, and 503 once the server drains.
pub fn router(spares: Arc<Spares>, drain: Arc<Drain>) -> Router {
    Router::new()
        .route(
            HEALTH_PATH,
            get(|| async { Json(json!({"status": "ok"})) }).fallback(only_get),
        )
        .route(
            READY_PATH,
            get(move || async move { readiness(&spares, &drain) }).fallback(only_get),
        )
}

/// Another method than GET: 405 with `Allow` and the JSON-RPC error every refusal has.
pub(crate) async fn only_get() -> Response {
    let mut response = crate::server::errors::method_not_allowed("GET").into_response();
    response
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET"));
    response
}

/// 200 `{"status": "ready"}`, or 503 `{"status": "not ready", "reason": …}`.
fn readiness(spares: &Spares, drain: &Drain) -> Response {
    let state = if drain.is_draining() {
        Err(NotReady::Closed)
    } else {
        spares.readiness()
    };
    match state {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "not ready", "reason": why.to_string()})),
        )
            .into_response(),
    }
}

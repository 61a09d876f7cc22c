//! Says `Connection: close` on every answer given before its request's body was read to the
//! end.
//!
//! Some refusals come before the body is read: an unknown `session_id` on `/messages`, a
//! missing one, an unknown path, a wrong method. hyper then closes the connection after the
//! answer unless the rest of the body happens to be buffered already (RFC 9112 section 9.6
//! lets a server close; it should say so). Without the header, a keep-alive client sends its
//! next request down a connection that is about to go away and sees "server disconnected
//! without sending a response" — a race that depends on whether the body arrived in the same
//! TCP segment as the headers.

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

use http_body::{Body as HttpBody, Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

/// A request body that records when it has been read to its end.
struct Tracked {
    inner: Body,
    /// Set once the inner body has no more frames.
    ended: Arc<AtomicBool>,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || self.inner.is_end_stream() {
            self.ended.store(true, Ordering::Release);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The middleware: passes the request on with its body tracked, and marks the answer
/// `Connection: close` when the body was left unread (a request without a body, such as a
/// `GET`, counts as read).
pub async fn close_if_body_unread(req: Request, next: Next) -> Response {
    let (parts, inner) = req.into_parts();
    let ended = Arc::new(AtomicBool::new(inner.is_end_stream()));
    let body = Body::new(Tracked {
        inner,
        ended: ended.clone(),
    });
    let mut response = next.run(Request::from_parts(parts, body)).await;
    if !ended.load(Ordering::Acquire) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::Router;
    use tower::ServiceExt;

    async fn answer(router: Router, body: Body) -> Response {
        let req = Request::post("/").body(body).expect("a request");
        router
            .layer(axum::middleware::from_fn(close_if_body_unread))
            .oneshot(req)
            .await
            .expect("an answer")
    }

    fn says_close(response: &Response) -> bool {
        response.headers().get(header::CONNECTION) == Some(&HeaderValue::from_static("close"))
    }

    #[tokio::test]
    async fn an_answer_before_the_body_was_read_says_close() {
        let router = Router::new().route("/", post(|| async { "refused" }));
        assert!(says_close(&answer(router, Body::from("{}")).await));
    }

    #[tokio::test]
    async fn an_answer_after_the_body_was_read_keeps_the_connection() {
        let router = Router::new().route("/", post(|body: String| async move { body }));
        assert!(!says_close(&answer(router, Body::from("{}")).await));
    }

    #[tokio::test]
    async fn a_request_without_a_body_keeps_the_connection() {
        let router = Router::new().route("/", post(|| async { "no body" }));
        assert!(!says_close(&answer(router, Body::empty()).await));
    }
}

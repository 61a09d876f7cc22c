//! A request's own stream for its notifications (MCP spec 2025-11-25, streamable HTTP, "Sending
//! Messages to the Server": the SSE stream of a POST may carry requests and notifications
//! before the response, and they should relate to that request). rmcp's session manager sends
//! a `notifications/progress` on the stream of the request whose token it carries, but every
//! other notification on the session's standalone `GET` stream. A call's output lines
//! (`notifications/message`) then raced its result, which comes on the request's stream: a
//! client could see the result first and drop the lines.
//!
//! [`RequestStreams`] wraps a session manager: every request it passes on carries a
//! [`RequestStream`] in its extensions, which the handler finds in the request's context and
//! sends notifications through; the POST's SSE response yields them before anything of rmcp's
//! that is ready at the same time. A handler sends its notifications before it returns its
//! result, so they come before the result. They carry no event id: rmcp's event store keeps
//! only its own events, so a client that resumes the stream gets the result without them.

use futures::{Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, GetExtensions, ServerJsonRpcMessage, ServerNotification};
use rmcp::transport::streamable_http_server::session::{
    EventStore, RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};
use std::sync::Arc;
use std::task::Poll;
use tokio::sync::mpsc;

/// Where a handler sends the notifications of the request it serves, so that they go on that
/// request's own SSE stream, before its response. Found in the request context's extensions
/// (streamable HTTP with sessions only; elsewhere the peer's notifications already keep order).
#[derive(Debug, Clone)]
pub struct RequestStream(mpsc::UnboundedSender<ServerJsonRpcMessage>);

impl RequestStream {
    /// Sends `notification` on the request's stream. `false` when the stream is gone (the
    /// client closed its response, or the response was sent).
    pub fn notify(&self, notification: ServerNotification) -> bool {
        self.0
            .send(ServerJsonRpcMessage::notification(notification))
            .is_ok()
    }
}

/// A session manager (`M`, rmcp's `LocalSessionManager` here) whose request streams also carry
/// what handlers send through a [`RequestStream`]; everything else is `M`'s.
pub struct RequestStreams<M> {
    inner: Arc<M>,
}

impl<M> RequestStreams<M> {
    /// Wraps `inner`, which the caller may keep using (sessions, idle sweeps).
    pub fn new(inner: Arc<M>) -> RequestStreams<M> {
        RequestStreams { inner }
    }
}

/// `inner`'s events with the request's notifications (`notes`) before them whenever both are
/// ready; it ends when `inner` ends (after its response), with what `notes` still held first.
fn notes_first<S>(
    notes: mpsc::UnboundedReceiver<ServerJsonRpcMessage>,
    inner: S,
) -> impl Stream<Item = ServerSseMessage> + Send + Sync + 'static
where
    S: Stream<Item = ServerSseMessage> + Send + Sync + 'static,
{
    let mut notes = notes;
    let mut inner = Box::pin(inner);
    // An event of `inner` taken while a note sent before it was still on its way: the note
    // goes first (a note sent before the response is seen once the response is).
    let mut held: Option<ServerSseMessage> = None;
    // Whether `inner` ended: it is not polled again, and the stream ends with the notes left.
    let mut ended = false;
    futures::stream::poll_fn(move |cx| {
        if ended {
            return Poll::Ready(notes.try_recv().ok().map(event_of));
        }
        if let Poll::Ready(Some(note)) = notes.poll_recv(cx) {
            return Poll::Ready(Some(event_of(note)));
        }
        if let Some(event) = held.take() {
            return Poll::Ready(Some(event));
        }
        match inner.poll_next_unpin(cx) {
            Poll::Ready(next) => {
                ended = next.is_none();
                match notes.try_recv() {
                    Ok(note) => {
                        held = next;
                        Poll::Ready(Some(event_of(note)))
                    }
                    Err(_) => Poll::Ready(next),
                }
            }
            Poll::Pending => Poll::Pending,
        }
    })
}

/// An SSE event of `message`, without an id (rmcp's event store does not keep it).
fn event_of(message: ServerJsonRpcMessage) -> ServerSseMessage {
    ServerSseMessage::from_message(message)
}

impl<M: SessionManager> SessionManager for RequestStreams<M> {
    type Error = M::Error;
    type Transport = M::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        self.inner.create_session().await
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.inner.close_session(id).await
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let mut message = message;
        let (sender, notes) = mpsc::unbounded_channel();
        if let ClientJsonRpcMessage::Request(request) = &mut message {
            request
                .request
                .extensions_mut()
                .insert(RequestStream(sender));
        }
        let inner = self.inner.create_stream(id, message).await?;
        Ok(notes_first(notes, inner))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.resume(id, last_event_id).await
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}

// MCP logging is deprecated (SEP-2577), but the drop-in still sends its lines as log messages.
#[allow(deprecated)]
#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::{
        EmptyResult, LoggingLevel, LoggingMessageNotification, LoggingMessageNotificationParam,
        RequestId, ServerResult,
    };

    fn line(text: &str) -> ServerNotification {
        ServerNotification::LoggingMessageNotification(LoggingMessageNotification::new(
            LoggingMessageNotificationParam::new(
                LoggingLevel::Info,
                serde_json::Value::String(text.to_owned()),
            ),
        ))
    }

    fn response() -> ServerSseMessage {
        ServerSseMessage::new(
            "stream-1",
            ServerJsonRpcMessage::response(
                ServerResult::EmptyResult(EmptyResult {}),
                RequestId::Number(7),
            ),
        )
    }

    /// Each event as the line it carries, or `response`.
    fn kinds(events: &[ServerSseMessage]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e.message.as_deref() {
                Some(ServerJsonRpcMessage::Notification(n)) => match &n.notification {
                    ServerNotification::LoggingMessageNotification(m) => {
                        m.params.data.as_str().unwrap_or_default().to_owned()
                    }
                    _ => "other".to_owned(),
                },
                Some(ServerJsonRpcMessage::Response(_)) => "response".to_owned(),
                _ => "none".to_owned(),
            })
            .collect()
    }

    #[tokio::test]
    async fn lines_sent_before_the_response_come_before_it_and_the_stream_ends_with_it() {
        let (sender, notes) = mpsc::unbounded_channel();
        let stream = RequestStream(sender);
        assert!(stream.notify(line("one")) && stream.notify(line("two")));
        let events: Vec<_> = notes_first(notes, futures::stream::iter(vec![response()]))
            .collect()
            .await;
        assert_eq!(kinds(&events), ["one", "two", "response"]);
        assert!(events[0].event_id.is_none() && events[2].event_id.is_some());
    }
}

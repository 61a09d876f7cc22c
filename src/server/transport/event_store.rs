//! Resumable streams (README "Running many replicas"; MCP spec 2025-11-25, streamable HTTP, "Resumability and
//! Redelivery"): the events of every SSE response are kept in memory with ids, so that a client
//! whose connection dropped mid-call reconnects with `GET /mcp` and `Last-Event-ID` and gets
//! what it missed, its result included. rmcp's streamable-HTTP server does the protocol
//! (priming event, ids on events, the replay on `GET`); this is the [`EventStore`] it asks,
//! bounded in bytes and streams: the oldest streams go first.
//!
//! An event id is `<128 random bits, URL-safe base64>-<index>`: unguessable, so that a
//! `Last-Event-ID` is a capability for its own stream only (a sessionless replay carries no
//! other credential), and it locates its stream without a search.

use async_trait::async_trait;
use base64::Engine as _;
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Most bytes of events kept, all streams together (their JSON's length): a call's result is
/// at most `--result-cap` plus its output, so this keeps the last several dozen results.
pub const MAX_EVENT_BYTES: usize = 256 << 20;

/// Most streams kept: one per SSE response.
pub const MAX_STREAMS: usize = 10_000;

/// Random bytes in a stream's token.
const TOKEN_BYTES: usize = 16;

/// One stream's events, in order.
#[derive(Default)]
struct Stream {
    token: String,
    events: Vec<ServerSseMessage>,
    bytes: usize,
}

#[derive(Default)]
struct Streams {
    /// rmcp's stream id → the stream.
    by_stream: HashMap<String, Stream>,
    /// Token → rmcp's stream id.
    by_token: HashMap<String, String>,
    /// Stream ids, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

impl Streams {
    /// Drops the oldest streams while over the bounds.
    fn evict(&mut self) {
        while self.bytes > MAX_EVENT_BYTES || self.by_stream.len() > MAX_STREAMS {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(stream) = self.by_stream.remove(&oldest) {
                self.bytes = self.bytes.saturating_sub(stream.bytes);
                self.by_token.remove(&stream.token);
            }
        }
    }
}

/// The in-memory event store (see the module's documentation).
#[derive(Default)]
pub struct MemoryEventStore {
    streams: Mutex<Streams>,
}

/// Why an event could not be stored or replayed.
#[derive(Debug, thiserror::Error)]
pub enum EventStoreFailure {
    #[error("could not draw a stream token from the operating system's random source")]
    Random(#[source] getrandom::Error),
    #[error(
        "no stream has the event id given in Last-Event-ID (unknown, or dropped to bound memory)"
    )]
    UnknownEvent,
}

/// The size of `event` as counted against [`MAX_EVENT_BYTES`].
fn size_of(event: &ServerSseMessage) -> usize {
    event
        .message
        .as_ref()
        .and_then(|m| serde_json::to_vec(m.as_ref()).ok())
        .map_or(0, |json| json.len())
        + std::mem::size_of::<ServerSseMessage>()
}

fn new_token() -> Result<String, EventStoreFailure> {
    let mut bytes = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes).map_err(EventStoreFailure::Random)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

#[async_trait]
impl EventStore for MemoryEventStore {
    async fn store_event(
        &self,
        stream_id: &str,
        event: &ServerSseMessage,
    ) -> Result<EventId, EventStoreError> {
        let size = size_of(event);
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if !streams.by_stream.contains_key(stream_id) {
            let token = new_token()?;
            streams.by_token.insert(token.clone(), stream_id.to_owned());
            streams.order.push_back(stream_id.to_owned());
            streams.by_stream.insert(
                stream_id.to_owned(),
                Stream {
                    token,
                    ..Stream::default()
                },
            );
        }
        let Some(stream) = streams.by_stream.get_mut(stream_id) else {
            return Err(EventStoreFailure::UnknownEvent.into());
        };
        let id = format!("{}-{}", stream.token, stream.events.len());
        let mut stored = event.clone();
        stored.event_id = Some(id.clone());
        stream.events.push(stored);
        stream.bytes += size;
        streams.bytes += size;
        streams.evict();
        Ok(id)
    }

    async fn replay_events_after(
        &self,
        last_event_id: &str,
    ) -> Result<EventStream, EventStoreError> {
        let (token, index) = last_event_id
            .rsplit_once('-')
            .and_then(|(t, i)| Some((t, i.parse::<usize>().ok()?)))
            .ok_or(EventStoreFailure::UnknownEvent)?;
        let streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        let events: Vec<ServerSseMessage> = streams
            .by_token
            .get(token)
            .and_then(|id| streams.by_stream.get(id))
            .ok_or(EventStoreFailure::UnknownEvent)?
            .events
            .iter()
            .skip(index + 1)
            .cloned()
            .collect();
        Ok(Box::pin(futures::stream::iter(events)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::time::Duration;

    #[tokio::test]
    async fn events_after_an_id_are_replayed_and_ids_are_unguessable() {
        let store = MemoryEventStore::default();
        let first = store
            .store_event("s", &ServerSseMessage::retry(Duration::from_secs(1)))
            .await
            .expect("stored");
        let second = store
            .store_event("s", &ServerSseMessage::retry(Duration::from_secs(2)))
            .await
            .expect("stored");
        let other = store
            .store_event("t", &ServerSseMessage::retry(Duration::from_secs(3)))
            .await
            .expect("stored");
        assert_ne!(first.split('-').next(), other.split('-').next());
        let replayed: Vec<_> = store
            .replay_events_after(&first)
            .await
            .expect("known")
            .collect()
            .await;
        assert_eq!(replayed.len(), 1);
        assert_eq!(replayed[0].event_id.as_deref(), Some(second.as_str()));
        assert!(store.replay_events_after("s-0").await.is_err());
        assert!(store.replay_events_after("garbage").await.is_err());
    }
}

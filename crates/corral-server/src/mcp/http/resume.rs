//! Resumable `/mcp` event streams: rmcp's [`EventStore`], in memory.
//!
//! rmcp 3.9 keeps each request's events for a `Last-Event-ID` resume, but
//! drops them the moment the call's answer is sent, also when the client's
//! stream had already broken: a client that lost its connection during a
//! `run_code` and resumed after the answer got an empty stream, and the
//! answer was lost (the Python SDK 1.x waits the server's `retry`, 3 s,
//! before it resumes, so any call ending in those 3 s lost its answer).
//! With a store, rmcp records every event here and answers a resume from
//! here: the events after the client's last one, then, while the call is
//! still running, the next ones as they come, until its answer.
//!
//! Bounded: at most [`MAX_BYTES`] of events (the least recently written
//! streams go first) and each stream for [`KEEP`] after its last event.
//! Event ids are `<128 random bits>.<n>`, so that only a client that was
//! sent an event of a stream can resume it (rmcp does not tie a resume to
//! the session it comes with).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::ServerJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::{
    EventId, EventStore, EventStoreError, EventStream, ServerSseMessage,
};
use tokio::sync::watch;

/// Most bytes of events kept, all sessions together.
const MAX_BYTES: usize = 64 << 20;
/// How long a stream is kept after its last event.
const KEEP: Duration = Duration::from_secs(60);
/// How long a resumed stream waits for a next event before it ends (the
/// client then resumes again).
const WAIT: Duration = Duration::from_secs(30);

/// The store (cheap to clone: one shared state).
#[derive(Default, Clone)]
pub(super) struct ResumeStore {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    /// rmcp's stream id → our token for it.
    tokens: HashMap<String, String>,
    /// Token → stream.
    streams: HashMap<String, Stream>,
    /// Bytes of all kept events.
    bytes: usize,
    /// When streams idle past [`KEEP`] were last looked for.
    swept: Option<Instant>,
}

/// One stream's events.
struct Stream {
    /// rmcp's id, to forget the token with the stream.
    stream_id: String,
    /// (number, event with its id, its size), oldest first.
    events: VecDeque<(u64, ServerSseMessage, usize)>,
    next: u64,
    last: Instant,
    /// The stream carried its call's answer: nothing follows.
    done: bool,
    /// The number of the newest event, for resumed streams waiting.
    newest: watch::Sender<u64>,
}

/// Why a resume cannot be answered.
#[derive(Debug, thiserror::Error)]
enum ResumeError {
    #[error("`Last-Event-ID` {0:?} is not an event id this server gave")]
    Malformed(String),
    #[error("the stream of `Last-Event-ID` {0:?} is no longer kept (kept {KEEP:?} after its last event); the call's answer, if any, is lost")]
    Unknown(String),
    #[error("no randomness for an event id: {0}")]
    Random(String),
}

impl Inner {
    fn drop_stream(&mut self, token: &str) {
        if let Some(s) = self.streams.remove(token) {
            self.bytes = self
                .bytes
                .saturating_sub(s.events.iter().map(|e| e.2).sum::<usize>());
            self.tokens.remove(&s.stream_id);
        }
    }

    /// Forgets streams idle past [`KEEP`] (looked for at most once a
    /// second), then the least recently written ones until `incoming` more
    /// bytes fit.
    fn evict(&mut self, incoming: usize) {
        if self
            .swept
            .is_some_and(|t| t.elapsed() < Duration::from_secs(1))
        {
            return self.fit(incoming);
        }
        self.swept = Some(Instant::now());
        let stale: Vec<String> = self
            .streams
            .iter()
            .filter(|(_, s)| s.last.elapsed() > KEEP)
            .map(|(t, _)| t.clone())
            .collect();
        for t in stale {
            self.drop_stream(&t);
        }
        self.fit(incoming);
    }

    fn fit(&mut self, incoming: usize) {
        while self.bytes + incoming > MAX_BYTES {
            let Some(oldest) = self
                .streams
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(t, _)| t.clone())
            else {
                break;
            };
            self.drop_stream(&oldest);
        }
    }

    /// Keeps `event` (`size` bytes, [`size_of`]) of rmcp's `stream_id`.
    fn store(
        &mut self,
        stream_id: &str,
        event: &ServerSseMessage,
        size: usize,
    ) -> Result<EventId, ResumeError> {
        self.evict(size);
        let token = match self.tokens.get(stream_id) {
            Some(t) => t.clone(),
            None => {
                let mut bytes = [0u8; 16];
                getrandom::fill(&mut bytes).map_err(|e| ResumeError::Random(e.to_string()))?;
                let t: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                self.tokens.insert(stream_id.to_string(), t.clone());
                t
            }
        };
        let s = self.streams.entry(token.clone()).or_insert_with(|| Stream {
            stream_id: stream_id.to_string(),
            events: VecDeque::new(),
            next: 0,
            last: Instant::now(),
            done: false,
            newest: watch::channel(0).0,
        });
        let n = s.next;
        s.next += 1;
        s.last = Instant::now();
        let id = format!("{token}.{n}");
        let mut kept = event.clone();
        kept.event_id = Some(id.clone());
        if matches!(
            kept.message.as_deref(),
            Some(ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_))
        ) {
            s.done = true;
        }
        s.events.push_back((n, kept, size));
        s.newest.send_replace(n);
        self.bytes += size;
        Ok(id)
    }
}

/// An event's size as it is sent (its message as JSON), plus a little for
/// its id and fields.
fn size_of(event: &ServerSseMessage) -> usize {
    64 + event
        .message
        .as_deref()
        .map_or(0, |m| serde_json::to_vec(m).map_or(0, |v| v.len()))
}

/// What a resumed stream yields next: the kept events after `after`, or
/// the end.
enum Next {
    Events(Vec<(u64, ServerSseMessage)>),
    Wait(watch::Receiver<u64>),
    End,
}

impl ResumeStore {
    fn next(&self, token: &str, after: u64) -> Next {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = inner.streams.get(token) else {
            return Next::End;
        };
        let events: Vec<(u64, ServerSseMessage)> = s
            .events
            .iter()
            .filter(|e| e.0 > after)
            .map(|e| (e.0, e.1.clone()))
            .collect();
        if !events.is_empty() {
            Next::Events(events)
        } else if s.done {
            Next::End
        } else {
            Next::Wait(s.newest.subscribe())
        }
    }

    fn replay(&self, last_event_id: &str) -> Result<EventStream, ResumeError> {
        let (token, n) = last_event_id
            .split_once('.')
            .and_then(|(t, n)| Some((t.to_string(), n.parse::<u64>().ok()?)))
            .ok_or_else(|| ResumeError::Malformed(last_event_id.to_string()))?;
        if !self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .streams
            .contains_key(&token)
        {
            return Err(ResumeError::Unknown(last_event_id.to_string()));
        }
        let store = self.clone();
        let state = (store, token, n, VecDeque::<ServerSseMessage>::new());
        let stream = futures_util::stream::unfold(
            state,
            |(store, token, mut after, mut queue)| async move {
                loop {
                    if let Some(e) = queue.pop_front() {
                        return Some((e, (store, token, after, queue)));
                    }
                    match store.next(&token, after) {
                        Next::Events(events) => {
                            for (n, e) in events {
                                after = n;
                                queue.push_back(e);
                            }
                        }
                        Next::End => return None,
                        Next::Wait(mut rx) => {
                            // A new event, or the stream forgotten (sender
                            // dropped), or a while without either.
                            match tokio::time::timeout(WAIT, rx.changed()).await {
                                Ok(Ok(())) => {}
                                Ok(Err(_)) | Err(_) => return None,
                            }
                        }
                    }
                }
            },
        );
        Ok(Box::pin(stream))
    }
}

impl EventStore for ResumeStore {
    fn store_event<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        stream_id: &'life1 str,
        event: &'life2 ServerSseMessage,
    ) -> Pin<Box<dyn Future<Output = Result<EventId, EventStoreError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        // Measured before the lock is taken: an answer may be 1 MiB.
        let size = size_of(event);
        let stored = self
            .inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .store(stream_id, event, size)
            .map_err(|e| Box::new(e) as EventStoreError);
        Box::pin(std::future::ready(stored))
    }

    fn replay_events_after<'life0, 'life1, 'async_trait>(
        &'life0 self,
        last_event_id: &'life1 str,
    ) -> Pin<Box<dyn Future<Output = Result<EventStream, EventStoreError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        let replayed = self
            .replay(last_event_id)
            .map_err(|e| Box::new(e) as EventStoreError);
        Box::pin(std::future::ready(replayed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    fn answer(text: &str) -> ServerSseMessage {
        let m: ServerJsonRpcMessage = serde_json::from_value(serde_json::json!({
            "jsonrpc": "2.0", "id": 1,
            "result": {"content": [{"type": "text", "text": text}]}
        }))
        .expect("a response");
        ServerSseMessage::from_message(m)
    }

    fn store(s: &ResumeStore, stream: &str, e: &ServerSseMessage) -> EventId {
        s.inner
            .lock()
            .unwrap()
            .store(stream, e, size_of(e))
            .expect("stored")
    }

    #[tokio::test]
    async fn a_resume_gets_the_events_after_its_id_then_waits_for_the_answer() {
        let s = ResumeStore::default();
        let first = store(&s, "a", &ServerSseMessage::retry(Duration::from_secs(3)));
        let mut replay = s.replay(&first).expect("replay");
        // Nothing yet: the stream waits; the answer arrives and ends it.
        let s2 = s.clone();
        let later = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            store(&s2, "a", &answer("done"))
        });
        let got = replay.next().await.expect("the answer");
        let id = later.await.expect("stored");
        assert_eq!(got.event_id.as_deref(), Some(id.as_str()));
        assert!(got.message.is_some());
        assert!(
            replay.next().await.is_none(),
            "the stream ends after the answer"
        );
        // From the first id again: the answer at once, then the end.
        let all: Vec<_> = s.replay(&first).expect("replay").collect().await;
        assert_eq!(all.len(), 1);
        // Ids of another stream, or none of ours, are refused.
        assert!(matches!(s.replay("nope"), Err(ResumeError::Malformed(_))));
        assert!(matches!(
            s.replay("00000000000000000000000000000000.0"),
            Err(ResumeError::Unknown(_))
        ));
        assert_ne!(
            first.split('.').next(),
            Some("00000000000000000000000000000000")
        );
    }

    #[test]
    fn the_store_stays_within_its_bytes_forgetting_the_oldest_streams() {
        let s = ResumeStore::default();
        let big = answer(&"x".repeat(1 << 20));
        let ids: Vec<EventId> = (0..80).map(|i| store(&s, &format!("s{i}"), &big)).collect();
        let inner = s.inner.lock().unwrap();
        assert!(inner.bytes <= MAX_BYTES, "{}", inner.bytes);
        assert!(inner.streams.len() < 80 && inner.tokens.len() == inner.streams.len());
        drop(inner);
        assert!(matches!(s.replay(&ids[0]), Err(ResumeError::Unknown(_))));
        assert!(s.replay(&ids[79]).is_ok());
    }
}

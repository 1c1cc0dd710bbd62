//! Per-tenant byte budget for answers in flight.
//!
//! An answer of `POST /v1/executions` can be megabytes (two output streams
//! and the output files). Once serialised it sits in the server's memory
//! until the client has read it (or the write-stall deadline closes the
//! connection): a tenant that sends requests and never reads the answers
//! could pin `requests × answer size`. So every answer takes its size from
//! its tenant's budget (`server.tenant_answer_bytes`) before the
//! execution's slots are given back, and returns it once the body has been
//! handed to the connection (written, or dropped with the connection).
//! When the budget is spent, the next answer waits, still holding its
//! execution slot: the tenant's own later requests get `busy`, others are
//! not affected, and nothing is dropped. One answer larger than the whole
//! budget takes all of it and goes alone.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Budget unit: one permit of a tenant's semaphore is this many bytes.
pub const UNIT: u64 = 1024;

/// A tenant's budget: a semaphore of `bytes / UNIT` permits.
pub fn budget(bytes: u64) -> Arc<Semaphore> {
    Arc::new(Semaphore::new(units(bytes, u64::MAX) as usize))
}

/// Largest frame handed to the connection at once: hyper asks for the
/// next one only when its write buffer has room, so the budget is held
/// until the answer is (nearly all) written, not merely handed over.
const FRAME: usize = 64 << 10;

/// The length of `value` serialised as JSON, counted without keeping the
/// text: the budget is taken before the answer exists in memory.
pub fn json_len(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    let _ = serde_json::to_writer(&mut n, value);
    n.0
}

/// Permits for `len` bytes, at least one, at most `cap`.
fn units(len: u64, cap: u64) -> u32 {
    let n = len.div_ceil(UNIT).clamp(1, cap.max(1));
    u32::try_from(n.min(u64::from(u32::MAX >> 3))).unwrap_or(u32::MAX >> 3)
}

/// Waits until `len` bytes of `budget` (of `total` bytes) are free (the
/// whole budget, for an answer larger than it) and takes them. `None`
/// only if the budget was closed, which corral never does.
pub async fn reserve(
    budget: &Arc<Semaphore>,
    total: u64,
    len: usize,
) -> Option<OwnedSemaphorePermit> {
    let n = units(len as u64, units(total, u64::MAX).into());
    budget.clone().acquire_many_owned(n).await.ok()
}

/// A JSON response whose body gives its permit back when it is dropped:
/// after hyper has written it, or with a connection that went away.
pub fn json(status: StatusCode, body: Vec<u8>, permit: Option<OwnedSemaphorePermit>) -> Response {
    let mut response = Response::new(Body::new(Budgeted {
        data: Some(Bytes::from(body)),
        _permit: permit,
    }));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// An answer's bytes holding a share of its tenant's budget, handed out in
/// frames of at most [`FRAME`] bytes.
struct Budgeted {
    data: Option<Bytes>,
    _permit: Option<OwnedSemaphorePermit>,
}

impl http_body::Body for Budgeted {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let frame = match self.data.as_mut() {
            Some(d) if d.len() > FRAME => Some(d.split_to(FRAME)),
            _ => self.data.take(),
        };
        Poll::Ready(frame.map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_holds_its_bytes_until_its_body_is_dropped() {
        let total = 4 * UNIT;
        let b = budget(total);
        let first = reserve(&b, total, 3000).await.unwrap(); // 3 units
        assert_eq!(b.available_permits(), 1);
        let response = json(StatusCode::OK, vec![b'x'; 3000], Some(first));
        // A second answer of 2 units waits for the first to go.
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { reserve(&b, total, 2000).await.unwrap() }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(bytes.len(), 3000);
        assert_eq!(json_len(&serde_json::json!({"a": [1, "é"]})), 14);
        let second = waiting.await.unwrap();
        assert_eq!(b.available_permits(), 2);
        drop(second);
        // Larger than the whole budget: takes all of it, and goes.
        let all = reserve(&b, total, 1 << 20).await.unwrap();
        assert_eq!(b.available_permits(), 0);
        drop(all);
        assert_eq!(b.available_permits(), 4);
    }
}

//! The output of a streamed execution on its way to the client: a queue
//! bounded in bytes between the sandbox's output drain (a thread) and the
//! event stream (async). Nothing is dropped: when the client reads slower
//! than the program writes, the drain waits for room, so the program's
//! pipe fills and its writes block (backpressure). Consecutive chunks of
//! one stream are merged into one event of at most [`EVENT_BYTES`], so a
//! program printing many tiny lines costs few events.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Bytes of output queued at most.
pub const QUEUE_BYTES: usize = 1 << 20;
/// Bytes of output in one event at most.
pub const EVENT_BYTES: usize = 64 << 10;

/// The queue.
#[derive(Default)]
pub struct ChunkQueue {
    state: Mutex<State>,
    room: Condvar,
    /// Wakes the consumer when chunks arrive.
    pub arrived: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    chunks: VecDeque<(u8, Vec<u8>)>,
    bytes: usize,
    /// The consumer is gone (the client left): nothing waits any more.
    closed: bool,
    /// Bytes offered after the consumer was gone.
    lost: u64,
}

impl ChunkQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a chunk of `stream` (1 stdout, 2 stderr), waiting while the
    /// queue is full and the consumer is there.
    pub fn push(&self, stream: u8, data: &[u8]) {
        let mut s = self.lock();
        while !s.closed && s.bytes > 0 && s.bytes + data.len() > QUEUE_BYTES {
            s = self
                .room
                .wait_timeout(s, Duration::from_millis(100))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
        if s.closed {
            s.lost += data.len() as u64;
            return;
        }
        s.bytes += data.len();
        match s.chunks.back_mut() {
            // Merged into the last chunk while it is small: fewer,
            // larger events.
            Some((last, buf)) if *last == stream && buf.len() + data.len() <= EVENT_BYTES => {
                buf.extend_from_slice(data);
            }
            _ => s.chunks.push_back((stream, data.to_vec())),
        }
        drop(s);
        self.arrived.notify_one();
    }

    /// The next event's worth of output: consecutive chunks of one stream,
    /// up to [`EVENT_BYTES`].
    pub fn pop(&self) -> Option<(u8, Vec<u8>)> {
        let mut s = self.lock();
        let (stream, mut data) = s.chunks.pop_front()?;
        while let Some((next, more)) = s.chunks.front() {
            if *next != stream || data.len() + more.len() > EVENT_BYTES {
                break;
            }
            data.extend_from_slice(more);
            s.chunks.pop_front();
        }
        s.bytes -= data.len();
        drop(s);
        self.room.notify_all();
        Some((stream, data))
    }

    /// The consumer is gone: writers stop waiting.
    pub fn close(&self) {
        self.lock().closed = true;
        self.room.notify_all();
    }

    /// Bytes offered after the consumer was gone.
    pub fn lost(&self) -> u64 {
        self.lock().lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn tiny_writes_are_merged_and_nothing_is_lost_under_a_slow_reader() {
        let q = Arc::new(ChunkQueue::default());
        let writer = {
            let q = q.clone();
            std::thread::spawn(move || {
                for i in 0..200_000u32 {
                    q.push(1, format!("{i}\n").as_bytes());
                }
                q.push(2, b"done");
            })
        };
        let mut out = Vec::new();
        let mut events = 0;
        let mut err = Vec::new();
        loop {
            match q.pop() {
                Some((1, d)) => {
                    assert!(d.len() <= EVENT_BYTES);
                    out.extend_from_slice(&d);
                    events += 1;
                    // A slow reader: what arrives meanwhile is merged.
                    std::thread::sleep(Duration::from_micros(200));
                }
                Some((_, d)) => {
                    err.extend_from_slice(&d);
                    break;
                }
                None => std::thread::sleep(Duration::from_millis(1)),
            }
            // The queue never holds more than its bound.
            assert!(q.lock().bytes <= QUEUE_BYTES);
        }
        writer.join().unwrap();
        let expected: String = (0..200_000u32).map(|i| format!("{i}\n")).collect();
        assert!(out == expected.as_bytes(), "{} bytes arrived", out.len());
        assert_eq!(err, b"done");
        assert!(events < 100_000, "{events} events for 200,000 writes");
    }

    #[test]
    fn a_full_queue_releases_its_writer_when_the_consumer_goes() {
        let q = Arc::new(ChunkQueue::default());
        q.push(1, &vec![b'x'; QUEUE_BYTES]);
        let writer = {
            let q = q.clone();
            std::thread::spawn(move || q.push(1, b"more"))
        };
        std::thread::sleep(Duration::from_millis(300));
        assert!(!writer.is_finished(), "the writer waits for room");
        q.close();
        writer.join().unwrap();
        assert_eq!(q.lost(), 4);
    }
}

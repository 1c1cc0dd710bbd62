//! Socket waits that always end: every read during a handshake has a
//! deadline and gives way to the stop signal, and refusals are written so
//! the client actually gets to read them.

use std::future::Future;
use std::io;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{timeout, timeout_at, Instant};

/// How long a refusal may take to write and drain.
const LINGER: Duration = Duration::from_secs(1);
/// Most unread client bytes drained after a refusal (so closing does not
/// reset the connection before the client reads the answer).
const LINGER_BYTES: usize = 256 * 1024;
/// Bytes read per call during handshakes.
const READ_CHUNK: usize = 4096;

/// The proxy-wide stop signal, as seen by one task.
#[derive(Debug, Clone)]
pub(crate) struct Stop(watch::Receiver<bool>);

impl Stop {
    /// Follows `rx`; `true` (or a dropped sender) means stop.
    pub fn new(rx: watch::Receiver<bool>) -> Stop {
        Stop(rx)
    }

    /// Completes once the proxy is stopping.
    pub async fn wait(&self) {
        let mut rx = self.0.clone();
        loop {
            if *rx.borrow_and_update() {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Runs `fut` unless the proxy stops first (`None`).
    pub async fn guard<F: Future>(&self, fut: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            () = self.wait() => None,
            out = fut => Some(out),
        }
    }
}

/// Why a handshake read produced nothing.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The client closed its side.
    Eof,
    /// The deadline passed.
    Timeout,
    /// The proxy is stopping.
    Stopped,
    /// The buffer is already at its cap.
    Full,
    /// A socket error.
    Io(io::Error),
}

impl ReadError {
    /// A clause for audit messages ("... before the request was complete").
    pub fn describe(&self) -> String {
        match self {
            ReadError::Eof => "the client closed the connection".to_string(),
            ReadError::Timeout => {
                "the client sent nothing more before the idle timeout".to_string()
            }
            ReadError::Stopped => "the proxy stopped".to_string(),
            ReadError::Full => "the client sent more than the proxy buffers".to_string(),
            ReadError::Io(e) => format!("read error: {e}"),
        }
    }
}

/// Appends at least one more byte from `stream` to `buf`, never growing it
/// past `cap`.
pub(crate) async fn read_more(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    cap: usize,
    deadline: Instant,
    stop: &Stop,
) -> Result<(), ReadError> {
    let want = cap.saturating_sub(buf.len()).min(READ_CHUNK);
    if want == 0 {
        return Err(ReadError::Full);
    }
    let mut chunk = [0u8; READ_CHUNK];
    match stop
        .guard(timeout_at(deadline, stream.read(&mut chunk[..want])))
        .await
    {
        None => Err(ReadError::Stopped),
        Some(Err(_elapsed)) => Err(ReadError::Timeout),
        Some(Ok(Err(e))) => Err(ReadError::Io(e)),
        Some(Ok(Ok(0))) => Err(ReadError::Eof),
        Some(Ok(Ok(n))) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
    }
}

/// Writes `bytes` within `limit` unless the proxy stops.
pub(crate) async fn write_guarded(
    stream: &mut TcpStream,
    bytes: &[u8],
    limit: Duration,
    stop: &Stop,
) -> Result<(), String> {
    match stop.guard(timeout(limit, stream.write_all(bytes))).await {
        None => Err("the proxy stopped".to_string()),
        Some(Err(_elapsed)) => Err("the client did not read the proxy's answer".to_string()),
        Some(Ok(Err(e))) => Err(format!("write error: {e}")),
        Some(Ok(Ok(()))) => Ok(()),
    }
}

/// Writes the proxy's answer, closes the sending side, and drains what the
/// client still sends for a moment, so the answer is not lost to a reset.
pub(crate) async fn answer_and_close(stream: &mut TcpStream, answer: &[u8], stop: &Stop) {
    let polite = async {
        stream.write_all(answer).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; READ_CHUNK];
        let mut drained = 0;
        while drained < LINGER_BYTES {
            match stream.read(&mut sink).await? {
                0 => break,
                n => drained += n,
            }
        }
        Ok::<(), io::Error>(())
    };
    // Errors and timeouts only mean the client is gone; nothing to report.
    let _ = stop.guard(timeout(LINGER, polite)).await;
}

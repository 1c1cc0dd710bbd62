//! Copying bytes both ways between the sandbox's connection and the
//! destination, counting them, until both sides are done, the connection
//! has been idle too long, or the proxy stops.
//!
//! One task per connection: both directions run as futures inside it, so
//! stopping the proxy or the idle timer ends the whole connection at once
//! and the byte counts survive for the audit event.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant};

use crate::io::Stop;

/// Bytes buffered per direction.
const BUFFER: usize = 64 * 1024;

/// How much the client may send to the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upload {
    /// A tunnel: everything until the client closes its side (passed on as
    /// a half-close); the connection ends when both sides are done.
    Tunnel,
    /// A forwarded request: this many more body bytes, then nothing; the
    /// connection ends when the destination's response ends.
    Exactly(u64),
    /// A forwarded request with a chunked body: everything until either
    /// side is done; the connection ends with the response.
    UntilResponseEnds,
}

/// Why the relay ended.
#[derive(Debug)]
pub(crate) enum RelayEnd {
    /// Both sides finished (or the response ended).
    Closed,
    /// No byte moved either way for the idle timeout.
    Idle,
    /// The proxy is stopping.
    Stopped,
    /// A socket error on either side.
    Failed(io::Error),
}

/// What flowed.
#[derive(Debug)]
pub(crate) struct Relayed {
    /// Bytes written to the destination (including the prefix).
    pub up: u64,
    /// Bytes written to the client.
    pub down: u64,
    /// Why it ended.
    pub end: RelayEnd,
}

impl Relayed {
    /// A clause for the audit message.
    pub fn describe(&self, idle: Duration) -> String {
        match &self.end {
            RelayEnd::Closed => "closed".to_string(),
            RelayEnd::Idle => format!("closed after {} s idle", idle.as_secs()),
            RelayEnd::Stopped => "closed: the proxy stopped".to_string(),
            RelayEnd::Failed(e) => format!("closed by a socket error: {e}"),
        }
    }
}

/// Milliseconds since the relay started at which a byte last moved.
struct Activity {
    started: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    /// Records that a byte moved now.
    fn touch(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// Completes once nothing has moved for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
            let deadline = self.started + last + idle;
            if Instant::now() >= deadline {
                return;
            }
            sleep_until(deadline).await;
        }
    }
}

/// Copies from `src` to `dst`, at most `limit` bytes; returns at the end of
/// `src` (`true`) or at the limit (`false`).
async fn pump<R, W>(
    src: &mut R,
    dst: &mut W,
    limit: Option<u64>,
    count: &AtomicU64,
    activity: &Activity,
) -> io::Result<bool>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUFFER];
    let mut left = limit;
    loop {
        let want = match left {
            Some(0) => return Ok(false),
            Some(n) => usize::try_from(n).unwrap_or(BUFFER).min(BUFFER),
            None => BUFFER,
        };
        let n = src.read(&mut buf[..want]).await?;
        if n == 0 {
            return Ok(true);
        }
        activity.touch();
        dst.write_all(&buf[..n]).await?;
        activity.touch();
        count.fetch_add(n as u64, Ordering::Relaxed);
        left = left.map(|l| l.saturating_sub(n as u64));
    }
}

/// Sends `prefix` to the destination, then relays both ways as `upload`
/// says.
pub(crate) async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    prefix: &[u8],
    upload: Upload,
    idle: Duration,
    stop: &Stop,
) -> Relayed {
    let (up, down) = (AtomicU64::new(0), AtomicU64::new(0));
    let activity = Activity {
        started: Instant::now(),
        last_ms: AtomicU64::new(0),
    };
    let (mut client_r, mut client_w) = client.split();
    let (mut up_r, mut up_w) = upstream.split();
    let end = {
        let upward = async {
            up_w.write_all(prefix).await?;
            up.fetch_add(prefix.len() as u64, Ordering::Relaxed);
            activity.touch();
            let limit = match upload {
                Upload::Exactly(n) => Some(n),
                Upload::Tunnel | Upload::UntilResponseEnds => None,
            };
            let at_eof = pump(&mut client_r, &mut up_w, limit, &up, &activity).await?;
            if at_eof {
                up_w.shutdown().await?;
            }
            Ok::<(), io::Error>(())
        };
        let downward = async {
            pump(&mut up_r, &mut client_w, None, &down, &activity).await?;
            client_w.shutdown().await?;
            Ok::<(), io::Error>(())
        };
        tokio::pin!(upward, downward);
        let idle_timer = activity.idle_for(idle);
        let stopped = stop.wait();
        tokio::pin!(idle_timer, stopped);
        let (mut up_done, mut down_done) = (false, false);
        loop {
            tokio::select! {
                r = &mut upward, if !up_done => {
                    up_done = true;
                    if let Err(e) = r {
                        break RelayEnd::Failed(e);
                    }
                }
                r = &mut downward, if !down_done => {
                    down_done = true;
                    match r {
                        Err(e) => break RelayEnd::Failed(e),
                        Ok(()) if upload != Upload::Tunnel => break RelayEnd::Closed,
                        Ok(()) => {}
                    }
                }
                () = &mut idle_timer => break RelayEnd::Idle,
                () = &mut stopped => break RelayEnd::Stopped,
            }
            if up_done && down_done {
                break RelayEnd::Closed;
            }
        }
    };
    Relayed {
        up: up.load(Ordering::Relaxed),
        down: down.load(Ordering::Relaxed),
        end,
    }
}

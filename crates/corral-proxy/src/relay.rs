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

use std::os::fd::AsFd;

use corral_sys::splice::SplicePipe;
use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::TcpStream;
use tokio::time::{sleep_until, Instant};

use crate::io::Stop;

/// Pipe buffer asked for per direction: 1 MiB is the default
/// `pipe-max-size`, so an unprivileged corral gets it too. Measured with
/// bench/proxy.sh: 64 KiB rounds give 0.43x direct, 256 KiB 0.52x, 1 MiB
/// 0.58-0.70x.
const PIPE_CAPACITY: usize = 1 << 20;

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

/// Moves bytes from `src` to `dst` through a pipe with splice(2), at most
/// `limit` bytes; returns at the end of `src` (`true`) or at the limit
/// (`false`). The payload never enters user space: on loopback this is
/// what lets the proxy keep up with a direct connection.
async fn pump(
    src: &TcpStream,
    dst: &TcpStream,
    limit: Option<u64>,
    count: &AtomicU64,
    activity: &Activity,
) -> io::Result<bool> {
    let pipe = SplicePipe::new(PIPE_CAPACITY)?;
    let mut left = limit;
    loop {
        let want = match left {
            Some(0) => return Ok(false),
            Some(n) => usize::try_from(n)
                .unwrap_or(PIPE_CAPACITY)
                .min(PIPE_CAPACITY),
            None => PIPE_CAPACITY,
        };
        // The pipe is empty here, so EAGAIN can only mean "src has nothing".
        let filled = loop {
            src.readable().await?;
            match src.try_io(
                Interest::READABLE,
                || Ok(pipe.fill_from(src.as_fd(), want)?),
            ) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        };
        if filled == 0 {
            return Ok(true);
        }
        activity.touch();
        let mut in_pipe = filled;
        while in_pipe > 0 {
            dst.writable().await?;
            match dst.try_io(Interest::WRITABLE, || {
                Ok(pipe.drain_into(dst.as_fd(), in_pipe)?)
            }) {
                Ok(n) => {
                    in_pipe -= n;
                    count.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        activity.touch();
        left = left.map(|l| l.saturating_sub(filled as u64));
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
    let (client_r, mut client_w) = client.split();
    let (up_r, mut up_w) = upstream.split();
    let end = {
        let upward = async {
            up_w.write_all(prefix).await?;
            up.fetch_add(prefix.len() as u64, Ordering::Relaxed);
            activity.touch();
            let limit = match upload {
                Upload::Exactly(n) => Some(n),
                Upload::Tunnel | Upload::UntilResponseEnds => None,
            };
            let at_eof = pump(client_r.as_ref(), up_w.as_ref(), limit, &up, &activity).await?;
            if at_eof {
                up_w.shutdown().await?;
            }
            Ok::<(), io::Error>(())
        };
        let downward = async {
            pump(up_r.as_ref(), client_w.as_ref(), None, &down, &activity).await?;
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

//! The accept loop: every connection phase has a deadline and the number
//! of connections a cap, so silent, half-sent, slowly dripped or unread
//! requests cannot exhaust corral's file descriptors and stop the service
//! for everyone (slowloris). axum's own `serve` sets no timeouts; this
//! serves the same router with hyper's connection builder:
//!
//! - request headers (and the idle time of a kept-alive connection before
//!   the next request) within `header_timeout_secs`;
//! - a request body whole within `body_timeout_secs`;
//! - a response write that makes no progress for `write_stall_secs` (a
//!   client that does not read) ends the connection;
//! - past `max_connections`, a new connection is answered 503 with
//!   `Retry-After` and closed at once.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::time::Sleep;
use tower::ServiceExt;

/// The deadlines of one connection (`[server]` `header_timeout_secs`,
/// `body_timeout_secs`, `write_stall_secs`).
#[derive(Debug, Clone, Copy)]
pub struct Deadlines {
    /// Request headers, and the idle time before the next request.
    pub header: Duration,
    /// A whole request body.
    pub body: Duration,
    /// A write without progress.
    pub write_stall: Duration,
}

impl Deadlines {
    /// The config's.
    pub fn of(s: &corral_policy::ServerConfig) -> Deadlines {
        Deadlines {
            header: Duration::from_secs(s.header_timeout_secs),
            body: Duration::from_secs(s.body_timeout_secs),
            write_stall: Duration::from_secs(s.write_stall_secs),
        }
    }
}
/// How long shutdown waits for open connections to finish.
const DRAIN: Duration = Duration::from_secs(10);
/// Descriptors kept for everything but connections (sandboxes, pipes,
/// the audit store, supervised servers).
pub const FD_RESERVE: u64 = 1024;

/// How many connections may be open: the configured cap, which the
/// open-file limit (raised to its hard value first) must leave room for,
/// or, unconfigured, what that limit leaves after [`FD_RESERVE`].
pub fn connection_cap(configured: Option<u32>) -> Result<usize, String> {
    let files = corral_sys::process::raise_open_files()
        .map_err(|e| format!("cannot read the open-file limit: {e}"))?;
    let room = files.saturating_sub(FD_RESERVE);
    match configured {
        Some(c) if u64::from(c) > room => Err(format!(
            "server.max_connections = {c} needs {} open files, and the limit is {files} (RLIMIT_NOFILE, \
             raised to its hard value): lower max_connections or raise the hard limit (ulimit -Hn, \
             LimitNOFILE= in a systemd unit)",
            u64::from(c) + FD_RESERVE
        )),
        Some(c) => Ok(c as usize),
        None if room < 16 => Err(format!(
            "the open-file limit is {files}: too low to serve (corral keeps {FD_RESERVE} for itself); raise it"
        )),
        None => Ok(usize::try_from(room).unwrap_or(usize::MAX)),
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets open
/// connections finish (at most [`DRAIN`]).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    max_connections: usize,
    deadlines: Deadlines,
    shutdown: impl Future<Output = ()> + Send,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: wait instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream, peer));
            continue;
        };
        let router = router.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _ = stream.set_nodelay(true);
            // hyper's header deadline starts once it knows the protocol;
            // its detection (HTTP/1 or 2) would wait for bytes forever.
            // The first request must begin within the header deadline.
            let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let seen = started.clone();
            let io = TokioIo::new(StallGuard::new(stream, deadlines.write_stall));
            let service = TowerToHyperService::new(router.map_request(
                move |mut req: axum::http::Request<Incoming>| {
                    seen.store(true, std::sync::atomic::Ordering::Relaxed);
                    req.extensions_mut()
                        .insert(axum::extract::ConnectInfo(peer));
                    req.map(|b| Body::new(Deadline::new(b, deadlines.body)))
                },
            ));
            let mut builder = Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(deadlines.header);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(Some(deadlines.header))
                .keep_alive_timeout(deadlines.header);
            let conn = builder.serve_connection_with_upgrades(io, service);
            tokio::pin!(conn);
            let first = tokio::time::sleep(deadlines.header);
            tokio::pin!(first);
            loop {
                let waiting = !started.load(std::sync::atomic::Ordering::Relaxed);
                tokio::select! {
                    result = conn.as_mut() => {
                        if let Err(e) = result {
                            tracing::debug!(%peer, error = %e, "connection ended");
                        }
                        break;
                    }
                    () = &mut first, if waiting => {
                        if !started.load(std::sync::atomic::Ordering::Relaxed) {
                            tracing::debug!(%peer, "no request within the header deadline");
                            break;
                        }
                    }
                    _ = stop.changed() => conn.as_mut().graceful_shutdown(),
                }
            }
        });
    }
    let _ = stop_tx.send(true);
    // Every permit back: every connection closed.
    let all = u32::try_from(max_connections).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(DRAIN, slots.acquire_many(all)).await;
    Ok(())
}

/// The answer past the connection cap.
async fn refuse(mut stream: TcpStream, peer: SocketAddr) {
    tracing::warn!(%peer, "connection refused: max_connections reached");
    let body = r#"{"error":{"code":"busy","message":"too many connections: retry shortly"}}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(2), stream.write_all(answer.as_bytes())).await;
}

/// A connection whose writes fail after `limit` without progress.
struct StallGuard {
    inner: TcpStream,
    limit: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl StallGuard {
    fn new(inner: TcpStream, limit: Duration) -> StallGuard {
        StallGuard {
            inner,
            limit,
            stalled: None,
        }
    }

    /// `Pending` from the socket: arm (or check) the stall deadline.
    fn pending<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client has not read for too long",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for StallGuard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallGuard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Pending => self.pending(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write_vectored(cx, bufs) {
            Poll::Pending => self.pending(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.pending(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A request body that must arrive whole within its time (a dripping
/// body is cut, whatever its pace).
struct Deadline {
    inner: Incoming,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl Deadline {
    fn new(inner: Incoming, limit: Duration) -> Deadline {
        Deadline {
            inner,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
        }
    }
}

impl http_body::Body for Deadline {
    type Data = hyper::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(()) = self.deadline.as_mut().poll(cx) {
            return Poll::Ready(Some(Err(format!(
                "the request body did not arrive within {} s (server.body_timeout_secs)",
                self.limit.as_secs()
            )
            .into())));
        }
        Pin::new(&mut self.inner)
            .poll_frame(cx)
            .map_err(|e| Box::new(e) as Self::Error)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

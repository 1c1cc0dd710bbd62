//! The accept loop: hands each connection to its front end (HTTP or
//! SOCKS5) under the connection limit, records each connection's event
//! when it ends, and on stop closes everything and waits for it.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::timeout;

use crate::decision::{Refusal, Rules};
use crate::event::{code, protocol, Draft, EventLog};
use crate::io::Stop;
use crate::{http_session, socks_session};

/// Connections over the limit that are still answered properly (503 or
/// the SOCKS5 refusal); past these they are closed at once.
const OVERFLOW_ANSWERS: usize = 16;
/// How long an over-the-limit client may take to send its request.
const OVERFLOW_HANDSHAKE: Duration = Duration::from_secs(2);
/// How long stopping waits for connections to record their events before
/// cancelling them.
const DRAIN: Duration = Duration::from_secs(5);
/// Pause after a failed accept (e.g. out of descriptors) so the loop does
/// not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Everything a connection needs, shared by all of them.
#[derive(Debug)]
pub(crate) struct Ctx {
    /// The policy.
    pub rules: Rules,
    /// The idle timeout (also the handshake deadline).
    pub idle: Duration,
    /// The stop signal.
    pub stop: Stop,
    /// Where events go.
    pub log: Arc<EventLog>,
}

impl Ctx {
    /// The refusal for a connection over `max_connections`.
    pub fn limit_refusal(&self) -> Refusal {
        Refusal::new(
            code::DENIED_LIMIT,
            format!(
                "the sandbox already has {} proxied connections open (max_connections)",
                self.rules.policy().max_connections
            ),
        )
    }
}

/// Whether a connection got one of the `max_connections` slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Served normally.
    Admitted,
    /// Read just far enough to refuse it properly.
    OverLimit,
}

impl Admission {
    /// How long the client may take to send its request.
    pub fn handshake_time(self, idle: Duration) -> Duration {
        match self {
            Admission::Admitted => idle,
            Admission::OverLimit => idle.min(OVERFLOW_HANDSHAKE),
        }
    }
}

/// Which listener a connection came from.
#[derive(Debug, Clone, Copy)]
enum Front {
    Http,
    Socks,
}

/// Serves both listeners until the stop signal, then closes every
/// connection and waits (bounded) for their events.
pub(crate) async fn serve(http: TcpListener, socks: TcpListener, ctx: Arc<Ctx>) {
    let max = usize::try_from(ctx.rules.policy().max_connections).unwrap_or(usize::MAX);
    let slots = Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS)));
    let overflow = Arc::new(Semaphore::new(OVERFLOW_ANSWERS));
    let mut tasks = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = ctx.stop.wait() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            r = http.accept() => r.map(|(s, _)| (s, Front::Http)),
            r = socks.accept() => r.map(|(s, _)| (s, Front::Socks)),
        };
        let (stream, front) = match accepted {
            Ok(accepted) => accepted,
            Err(_) => {
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let (admission, permit) = match Arc::clone(&slots).try_acquire_owned() {
            Ok(permit) => (Admission::Admitted, permit),
            Err(_) => match Arc::clone(&overflow).try_acquire_owned() {
                Ok(permit) => (Admission::OverLimit, permit),
                Err(_) => {
                    drop(stream);
                    record_dropped(&ctx, front);
                    continue;
                }
            },
        };
        let ctx = Arc::clone(&ctx);
        tasks.spawn(async move {
            let event = match front {
                Front::Http => http_session::serve(&ctx, stream, admission).await,
                Front::Socks => socks_session::serve(&ctx, stream, admission).await,
            };
            ctx.log.push(event);
            drop(permit);
        });
    }
    drop((http, socks)); // stop accepting: new connections are refused by the kernel
    let drained = timeout(DRAIN, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tasks.shutdown().await;
    }
}

/// Records a connection over the limit that was closed without an answer
/// because even the refusal answers were all busy.
fn record_dropped(ctx: &Ctx, front: Front) {
    let kind = match front {
        Front::Http => protocol::CONNECT,
        Front::Socks => protocol::SOCKS5,
    };
    let refusal = ctx.limit_refusal();
    let message = format!(
        "corral: refused: {}; closed without an answer",
        refusal.reason
    );
    ctx.log
        .push(Draft::new(kind).finish(code::DENIED_LIMIT, (0, 0), message));
}

//! From an allowed route to a connected socket: look the name up (static
//! entry or DNS, in the proxy), screen every address, and connect to
//! exactly an address that passed — never to a name, so there is no window
//! in which DNS could answer differently (rebinding).

use std::io::{self, ErrorKind};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::{lookup_host, TcpStream};
use tokio::time::timeout;

use crate::decision::{Candidate, Refusal, Route, Rules};
use crate::event::code;
use crate::io::Stop;

/// Longest wait for a name lookup.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for one TCP connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most screened addresses tried, in order, before giving up.
const MAX_ATTEMPTS: usize = 4;

/// A connection to a screened address.
#[derive(Debug)]
pub(crate) struct Dialed {
    /// The connected socket.
    pub stream: TcpStream,
    /// Exactly the address connected to.
    pub addr: SocketAddr,
    /// The allowed CIDR that permitted the address, when its class alone
    /// would have been refused.
    pub via_cidr: Option<String>,
}

/// Why dialling failed: a refusal to report, with the socket error kind
/// for connect failures (SOCKS replies differ by it).
#[derive(Debug)]
pub(crate) struct DialError {
    /// What to report.
    pub refusal: Refusal,
    /// The connect error's kind, if the failure was a connect.
    pub kind: Option<ErrorKind>,
}

impl From<Refusal> for DialError {
    fn from(refusal: Refusal) -> DialError {
        DialError {
            refusal,
            kind: None,
        }
    }
}

/// Resolves (if needed), screens and connects.
pub(crate) async fn dial(
    rules: &Rules,
    route: &Route,
    port: u16,
    stop: &Stop,
) -> Result<Dialed, DialError> {
    let candidates = match route {
        Route::Literal { addr, rule } => vec![Candidate {
            addr: *addr,
            via_cidr: Some(rule.clone()),
        }],
        Route::Name {
            name,
            fixed: Some(addr),
            ..
        } => rules.screen(name, &[*addr], port)?,
        Route::Name {
            name, fixed: None, ..
        } => {
            let addrs = resolve(name, port, stop).await?;
            rules.screen(name, &addrs, port)?
        }
    };
    let mut last: Option<(SocketAddr, io::Error)> = None;
    for candidate in candidates.into_iter().take(MAX_ATTEMPTS) {
        let addr = SocketAddr::new(candidate.addr, port);
        let attempt = stop
            .guard(timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)))
            .await;
        let error = match attempt {
            None => io::Error::new(ErrorKind::Interrupted, "the proxy stopped"),
            Some(Err(_elapsed)) => io::Error::new(ErrorKind::TimedOut, "connect timed out"),
            Some(Ok(Err(e))) => e,
            Some(Ok(Ok(stream))) => {
                // Latency matters more than packet count for proxied traffic.
                let _ = stream.set_nodelay(true);
                return Ok(Dialed {
                    stream,
                    addr,
                    via_cidr: candidate.via_cidr,
                });
            }
        };
        let stopped = error.kind() == ErrorKind::Interrupted;
        last = Some((addr, error));
        if stopped {
            break;
        }
    }
    let (addr, error) = match last {
        Some(last) => last,
        None => {
            return Err(Refusal::new(code::ERROR_CONNECT, "no address to connect to").into());
        }
    };
    Err(DialError {
        kind: Some(error.kind()),
        refusal: Refusal {
            address: Some(addr.ip()),
            ..Refusal::new(
                code::ERROR_CONNECT,
                format!("connecting to {addr} failed: {error}"),
            )
        },
    })
}

/// The addresses of `name`, in the resolver's order, without repeats.
async fn resolve(name: &str, port: u16, stop: &Stop) -> Result<Vec<IpAddr>, Refusal> {
    let failed = |why: String| {
        Refusal::new(
            code::ERROR_RESOLVE,
            format!("resolving {name} failed: {why}"),
        )
    };
    crate::host_sources::ensure_builtin_sources().map_err(failed)?;
    let found = match stop
        .guard(timeout(RESOLVE_TIMEOUT, lookup_host((name, port))))
        .await
    {
        None => return Err(failed("the proxy stopped".to_string())),
        Some(Err(_elapsed)) => {
            return Err(failed(format!(
                "no answer within {} s",
                RESOLVE_TIMEOUT.as_secs()
            )))
        }
        Some(Ok(Err(e))) => return Err(failed(e.to_string())),
        Some(Ok(Ok(found))) => found,
    };
    let mut addrs: Vec<IpAddr> = Vec::new();
    for addr in found {
        if !addrs.contains(&addr.ip()) {
            addrs.push(addr.ip());
        }
    }
    if addrs.is_empty() {
        return Err(failed("no addresses".to_string()));
    }
    Ok(addrs)
}

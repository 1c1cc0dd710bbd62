//! What happens once a destination is connected: the optional TLS server
//! name check, the relay, and the audit event that sums it up. Shared by
//! the HTTP and SOCKS5 front ends.

use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::decision::Refusal;
use crate::dial::Dialed;
use crate::event::{code, ConnectionEvent, Draft};
use crate::io::{read_more, ReadError};
use crate::relay::{relay, Upload};
use crate::server::Ctx;
use crate::sni::{sni_verdict, SniVerdict, MAX_CLIENT_HELLO};
use crate::target::Host;

/// The host whose name the ClientHello must carry, when the check applies:
/// `sni_check` is on, the port is 443 and the target is a name.
pub(crate) fn sni_host<'a>(ctx: &Ctx, host: &'a Host, port: u16) -> Option<&'a str> {
    match host {
        Host::Name(name) if port == 443 && ctx.rules.policy().sni_check => Some(name),
        _ => None,
    }
}

/// The first line of a refusal body and its audit message.
pub(crate) fn sentence(refusal: &Refusal, target: Option<&str>) -> String {
    let reason = &refusal.reason;
    match target {
        _ if refusal.code == code::ERROR_PROTOCOL => format!("corral: bad request: {reason}"),
        Some(t) if refusal.code.starts_with("net.error.") => {
            format!("corral: {t} unreachable: {reason}")
        }
        Some(t) => format!("corral: {t} refused: {reason}"),
        None => format!("corral: refused: {reason}"),
    }
}

/// How the first client bytes passed (or failed) the server name check.
enum Gate {
    /// Forward these bytes first.
    Pass(Vec<u8>),
    /// Close: the name is missing, wrong, or not TLS at all.
    Refuse(String),
    /// The proxy stopped while waiting.
    Stopped,
}

/// Reads the client's first bytes until the server name can be judged.
async fn sni_gate(ctx: &Ctx, client: &mut TcpStream, mut first: Vec<u8>, host: &str) -> Gate {
    let deadline = Instant::now() + ctx.idle;
    loop {
        match sni_verdict(host, &first) {
            SniVerdict::Match => return Gate::Pass(first),
            SniVerdict::Refuse(reason) => return Gate::Refuse(reason),
            SniVerdict::NeedMore => {}
        }
        match read_more(client, &mut first, MAX_CLIENT_HELLO, deadline, &ctx.stop).await {
            Ok(()) => {}
            Err(ReadError::Stopped) => return Gate::Stopped,
            Err(e) => {
                return Gate::Refuse(format!(
                    "no complete TLS ClientHello on port 443: {}",
                    e.describe()
                ))
            }
        }
    }
}

/// Serves a connected destination: checks the server name if `sni` says
/// so, relays, and returns the event. `draft` already names the target.
pub(crate) async fn serve_connected(
    ctx: &Ctx,
    client: &mut TcpStream,
    mut dialed: Dialed,
    first: Vec<u8>,
    upload: Upload,
    sni: Option<&str>,
    mut draft: Draft,
) -> ConnectionEvent {
    draft.address = Some(dialed.addr.ip().to_string());
    let target = match &draft.domain {
        Some(name) => format!("{name}:{}", draft.port),
        None => dialed.addr.to_string(),
    };
    let first = match sni {
        None => first,
        Some(host) => match sni_gate(ctx, client, first, host).await {
            Gate::Pass(first) => first,
            Gate::Stopped => {
                return draft.finish(
                    code::ALLOWED,
                    (0, 0),
                    format!("{target}: closed before the TLS ClientHello: the proxy stopped"),
                )
            }
            Gate::Refuse(reason) => {
                let message = format!("corral: {target} refused: {reason}");
                return draft.finish(code::DENIED_SNI_MISMATCH, (0, 0), message);
            }
        },
    };
    let relayed = relay(
        client,
        &mut dialed.stream,
        &first,
        upload,
        ctx.idle,
        &ctx.stop,
    )
    .await;
    let rule = draft.rule.clone().unwrap_or_default();
    let cidr = match &dialed.via_cidr {
        Some(cidr) if draft.domain.is_some() => format!(", address allowed by allow_cidrs {cidr}"),
        _ => String::new(),
    };
    let message = format!(
        "{target} via {} allowed by {rule}{cidr}: {}",
        dialed.addr,
        relayed.describe(ctx.idle)
    );
    draft.finish(code::ALLOWED, (relayed.up, relayed.down), message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentences() {
        let r = |code, reason: &str| Refusal::new(code, reason);
        assert_eq!(
            sentence(&r(code::DENIED_NOT_ALLOWED, "no rule"), Some("a.test:443")),
            "corral: a.test:443 refused: no rule"
        );
        assert_eq!(
            sentence(
                &r(code::ERROR_CONNECT, "connection refused"),
                Some("a.test:443")
            ),
            "corral: a.test:443 unreachable: connection refused"
        );
        assert_eq!(
            sentence(&r(code::ERROR_PROTOCOL, "bad line"), None),
            "corral: bad request: bad line"
        );
        assert_eq!(
            sentence(&r(code::DENIED_LIMIT, "busy"), None),
            "corral: refused: busy"
        );
    }
}

//! One connection on the HTTP proxy listener: read the head, decide, dial,
//! then tunnel (CONNECT) or forward one request (absolute form). Every
//! refusal is answered with a plain-text body naming the reason and an
//! `X-Corral-Reason` header carrying the code.

use std::io::ErrorKind;

use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::decision::Refusal;
use crate::dial::dial;
use crate::event::{code, protocol, ConnectionEvent, Draft};
use crate::http::{
    find_head_end, forward_head, interpret, parse_head, proxy_response, Body, HttpError,
    ProxyRequest, RequestHead, CONNECT_ESTABLISHED, MAX_HEAD_BYTES,
};
use crate::io::{answer_and_close, read_more, write_guarded, ReadError};
use crate::relay::Upload;
use crate::server::{Admission, Ctx};
use crate::target::{Host, TargetError};
use crate::tunnel::{sentence, serve_connected, sni_host};

/// The HTTP status answering a refusal.
fn status(code: &str, kind: Option<ErrorKind>) -> u16 {
    match code {
        c if c == code::DENIED_LIMIT => 503,
        c if c == code::ERROR_PROTOCOL => 400,
        c if c == code::ERROR_CONNECT && kind == Some(ErrorKind::TimedOut) => 504,
        c if c.starts_with("net.error.") => 502,
        _ => 403,
    }
}

/// Answers the refusal, closes, and returns its event.
async fn refuse(
    ctx: &Ctx,
    client: &mut TcpStream,
    mut draft: Draft,
    refusal: Refusal,
    kind: Option<ErrorKind>,
    target: Option<&str>,
) -> ConnectionEvent {
    let line = sentence(&refusal, target);
    let answer = proxy_response(
        status(refusal.code, kind),
        refusal.code,
        &format!("{line}\n"),
    );
    answer_and_close(client, &answer, &ctx.stop).await;
    if refusal.rule.is_some() {
        draft.rule = refusal.rule;
    }
    if let Some(addr) = refusal.address {
        draft.address = Some(addr.to_string());
    }
    draft.finish(refusal.code, (0, 0), line)
}

/// A parse error as a refusal: numeric host names are IP literals in
/// disguise (403), everything else is a bad request (400).
fn http_refusal(error: &HttpError) -> Refusal {
    match error {
        HttpError::Target(TargetError::NumericName(_)) => {
            Refusal::new(code::DENIED_IP_LITERAL, error.to_string())
        }
        _ => Refusal::new(code::ERROR_PROTOCOL, error.to_string()),
    }
}

/// Reads the request head; returns it with any bytes read past it.
async fn read_request(
    ctx: &Ctx,
    client: &mut TcpStream,
    admission: Admission,
) -> Result<(RequestHead, Vec<u8>), Refusal> {
    let deadline = Instant::now() + admission.handshake_time(ctx.idle);
    let mut buf = Vec::new();
    loop {
        match find_head_end(&buf) {
            Ok(Some(end)) => {
                let head = parse_head(&buf[..end]).map_err(|e| http_refusal(&e))?;
                return Ok((head, buf.split_off(end)));
            }
            Ok(None) => {}
            Err(e) => return Err(http_refusal(&e)),
        }
        if let Err(e) = read_more(client, &mut buf, MAX_HEAD_BYTES, deadline, &ctx.stop).await {
            let reason = match e {
                ReadError::Eof if buf.is_empty() => {
                    "the client closed without sending a request".to_string()
                }
                e => format!("incomplete request head: {}", e.describe()),
            };
            return Err(Refusal::new(code::ERROR_PROTOCOL, reason));
        }
    }
}

/// Serves one connection accepted on the HTTP listener.
pub(crate) async fn serve(
    ctx: &Ctx,
    mut client: TcpStream,
    admission: Admission,
) -> ConnectionEvent {
    let mut draft = Draft::new(protocol::CONNECT);
    let (head, rest) = match read_request(ctx, &mut client, admission).await {
        Ok(request) => request,
        Err(refusal) => return refuse(ctx, &mut client, draft, refusal, None, None).await,
    };
    if head.method != "CONNECT" {
        draft.protocol = protocol::HTTP;
    }
    let request = match interpret(&head) {
        Ok(request) => request,
        Err(e) => return refuse(ctx, &mut client, draft, http_refusal(&e), None, None).await,
    };
    let (host, port) = match &request {
        ProxyRequest::Connect { host, port } => (host.clone(), *port),
        ProxyRequest::Forward(fwd) => (fwd.host.clone(), fwd.port),
    };
    draft.port = port;
    match &host {
        Host::Name(name) => draft.domain = Some(name.clone()),
        Host::Ip(addr) => draft.address = Some(addr.to_string()),
    }
    let target = format!("{host}:{port}");
    if let Admission::OverLimit = admission {
        let refusal = ctx.limit_refusal();
        return refuse(ctx, &mut client, draft, refusal, None, Some(&target)).await;
    }
    let route = match ctx.rules.route(&host, port) {
        Ok(route) => route,
        Err(refusal) => return refuse(ctx, &mut client, draft, refusal, None, Some(&target)).await,
    };
    draft.rule = Some(route.rule().to_string());
    let dialed = match dial(&ctx.rules, &route, port, &ctx.stop).await {
        Ok(dialed) => dialed,
        Err(e) => return refuse(ctx, &mut client, draft, e.refusal, e.kind, Some(&target)).await,
    };
    match request {
        ProxyRequest::Connect { .. } => {
            if let Err(why) =
                write_guarded(&mut client, CONNECT_ESTABLISHED, ctx.idle, &ctx.stop).await
            {
                draft.address = Some(dialed.addr.ip().to_string());
                return draft.finish(
                    code::ALLOWED,
                    (0, 0),
                    format!("{target}: closed before the tunnel opened: {why}"),
                );
            }
            let sni = sni_host(ctx, &host, port);
            serve_connected(ctx, &mut client, dialed, rest, Upload::Tunnel, sni, draft).await
        }
        ProxyRequest::Forward(fwd) => {
            let mut first = forward_head(&head, &fwd);
            let upload = match fwd.body {
                Body::Length(n) => {
                    let already = rest.len().min(usize::try_from(n).unwrap_or(usize::MAX));
                    first.extend_from_slice(&rest[..already]);
                    Upload::Exactly(n - already as u64)
                }
                Body::UntilClose => {
                    first.extend_from_slice(&rest);
                    Upload::UntilResponseEnds
                }
            };
            serve_connected(ctx, &mut client, dialed, first, upload, None, draft).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        assert_eq!(status(code::DENIED_DOMAIN, None), 403);
        assert_eq!(status(code::DENIED_SNI_MISMATCH, None), 403);
        assert_eq!(status(code::DENIED_LIMIT, None), 503);
        assert_eq!(status(code::ERROR_PROTOCOL, None), 400);
        assert_eq!(status(code::ERROR_RESOLVE, None), 502);
        assert_eq!(
            status(code::ERROR_CONNECT, Some(ErrorKind::ConnectionRefused)),
            502
        );
        assert_eq!(status(code::ERROR_CONNECT, Some(ErrorKind::TimedOut)), 504);
    }
}

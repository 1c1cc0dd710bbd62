//! One connection on the SOCKS5 listener: greeting, request, decision,
//! dial, reply, tunnel. Refusals get the matching SOCKS5 reply code
//! ("connection not allowed by ruleset" for every policy refusal) and an
//! event; the reason text goes to the event, since SOCKS5 has no place for
//! it.

use std::io::ErrorKind;
use std::net::IpAddr;

use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::decision::Refusal;
use crate::dial::dial;
use crate::event::{code, protocol, ConnectionEvent, Draft};
use crate::io::{answer_and_close, read_more, write_guarded, ReadError};
use crate::relay::Upload;
use crate::server::{Admission, Ctx};
use crate::socks::{
    method_reply, parse_greeting, parse_request, reply, Parsed, SocksError, SocksRequest,
    SocksTarget, NO_ACCEPTABLE_METHOD, NO_AUTH,
};
use crate::target::{parse_host, Host, TargetError};
use crate::tunnel::{sentence, serve_connected, sni_host};

/// Greeting plus request never exceed this (2 + 255 and 7 + 255 bytes).
const MAX_HANDSHAKE: usize = 600;

/// The reply code reporting a refusal.
fn reply_code(refusal: &Refusal, kind: Option<ErrorKind>) -> u8 {
    match refusal.code {
        c if c == code::ERROR_PROTOCOL => reply::GENERAL_FAILURE,
        c if c == code::ERROR_CONNECT => match kind {
            Some(ErrorKind::ConnectionRefused) => reply::CONNECTION_REFUSED,
            Some(ErrorKind::TimedOut) => reply::TTL_EXPIRED,
            _ => reply::HOST_UNREACHABLE,
        },
        c if c == code::ERROR_RESOLVE => reply::HOST_UNREACHABLE,
        _ => reply::NOT_ALLOWED,
    }
}

/// A failed step: what to send (if anything) and the refusal.
struct Failure {
    answer: Option<Vec<u8>>,
    refusal: Refusal,
}

impl Failure {
    /// A protocol error, answered with `answer` if any.
    fn protocol(answer: Option<Vec<u8>>, reason: String) -> Failure {
        Failure {
            answer,
            refusal: Refusal::new(code::ERROR_PROTOCOL, reason),
        }
    }
}

/// Answers the failure (if it has an answer), closes, and returns its
/// event.
async fn finish_failure(
    ctx: &Ctx,
    client: &mut TcpStream,
    mut draft: Draft,
    failure: Failure,
    target: Option<&str>,
) -> ConnectionEvent {
    match &failure.answer {
        Some(answer) => answer_and_close(client, answer, &ctx.stop).await,
        None => answer_and_close(client, &[], &ctx.stop).await,
    }
    let refusal = failure.refusal;
    if refusal.rule.is_some() {
        draft.rule = refusal.rule.clone();
    }
    if let Some(addr) = refusal.address {
        draft.address = Some(addr.to_string());
    }
    let line = sentence(&refusal, target);
    draft.finish(refusal.code, (0, 0), line)
}

/// Why a handshake message was not read.
enum MessageError {
    /// The bytes are not a valid message.
    Socks(SocksError),
    /// The bytes never came.
    Read(ReadError),
}

/// Reads until `parse` yields a message, which it removes from `buf`.
async fn read_message<T>(
    ctx: &Ctx,
    client: &mut TcpStream,
    buf: &mut Vec<u8>,
    deadline: Instant,
    parse: fn(&[u8]) -> Parsed<T>,
) -> Result<T, MessageError> {
    loop {
        match parse(buf) {
            Ok(Some((message, used))) => {
                buf.drain(..used);
                return Ok(message);
            }
            Ok(None) => {}
            Err(e) => return Err(MessageError::Socks(e)),
        }
        read_more(client, buf, MAX_HANDSHAKE, deadline, &ctx.stop)
            .await
            .map_err(MessageError::Read)?;
    }
}

/// Greeting and request; the bytes the client sent past the request.
async fn handshake(
    ctx: &Ctx,
    client: &mut TcpStream,
    admission: Admission,
) -> Result<(SocksRequest, Vec<u8>), Failure> {
    let deadline = Instant::now() + admission.handshake_time(ctx.idle);
    let mut buf = Vec::new();
    let incomplete = |what: &str, e: ReadError| {
        Failure::protocol(None, format!("incomplete SOCKS5 {what}: {}", e.describe()))
    };
    let greeting = match read_message(ctx, client, &mut buf, deadline, parse_greeting).await {
        Ok(greeting) => greeting,
        Err(MessageError::Socks(e)) => return Err(Failure::protocol(None, e.to_string())),
        Err(MessageError::Read(e)) => return Err(incomplete("greeting", e)),
    };
    if !greeting.offers_no_auth() {
        return Err(Failure::protocol(
            Some(method_reply(NO_ACCEPTABLE_METHOD).to_vec()),
            "the client offers no acceptable SOCKS5 method (corral serves no-authentication only)"
                .to_string(),
        ));
    }
    if let Err(why) = write_guarded(client, &method_reply(NO_AUTH), ctx.idle, &ctx.stop).await {
        return Err(Failure::protocol(
            None,
            format!("SOCKS5 method reply not delivered: {why}"),
        ));
    }
    match read_message(ctx, client, &mut buf, deadline, parse_request).await {
        Ok(request) => Ok((request, buf)),
        Err(MessageError::Socks(e)) => Err(Failure::protocol(
            Some(reply(e.reply_code()).to_vec()),
            e.to_string(),
        )),
        Err(MessageError::Read(e)) => Err(incomplete("request", e)),
    }
}

/// The requested host; a domain that is really an address counts as one.
fn requested_host(target: &SocksTarget) -> Result<Host, Failure> {
    match target {
        SocksTarget::V4(v4) => Ok(Host::Ip(IpAddr::V4(*v4))),
        SocksTarget::V6(v6) => Ok(Host::Ip(IpAddr::V6(*v6))),
        SocksTarget::Domain(text) => parse_host(text).map_err(|e| {
            let refusal = match e {
                TargetError::NumericName(_) => Refusal::new(code::DENIED_IP_LITERAL, e.to_string()),
                _ => Refusal::new(code::ERROR_PROTOCOL, e.to_string()),
            };
            Failure {
                answer: Some(reply(reply_code(&refusal, None)).to_vec()),
                refusal,
            }
        }),
    }
}

/// Serves one connection accepted on the SOCKS5 listener.
pub(crate) async fn serve(
    ctx: &Ctx,
    mut client: TcpStream,
    admission: Admission,
) -> ConnectionEvent {
    let mut draft = Draft::new(protocol::SOCKS5);
    let (request, rest) = match handshake(ctx, &mut client, admission).await {
        Ok(done) => done,
        Err(failure) => return finish_failure(ctx, &mut client, draft, failure, None).await,
    };
    draft.port = request.port;
    let host = match requested_host(&request.target) {
        Ok(host) => host,
        Err(failure) => return finish_failure(ctx, &mut client, draft, failure, None).await,
    };
    match &host {
        Host::Name(name) => draft.domain = Some(name.clone()),
        Host::Ip(addr) => draft.address = Some(addr.to_string()),
    }
    let target = format!("{host}:{}", request.port);
    let refused = |refusal: Refusal, kind: Option<ErrorKind>| Failure {
        answer: Some(reply(reply_code(&refusal, kind)).to_vec()),
        refusal,
    };
    if let Admission::OverLimit = admission {
        let failure = refused(ctx.limit_refusal(), None);
        return finish_failure(ctx, &mut client, draft, failure, Some(&target)).await;
    }
    let route = match ctx.rules.route(&host, request.port) {
        Ok(route) => route,
        Err(refusal) => {
            return finish_failure(
                ctx,
                &mut client,
                draft,
                refused(refusal, None),
                Some(&target),
            )
            .await
        }
    };
    draft.rule = Some(route.rule().to_string());
    let dialed = match dial(&ctx.rules, &route, request.port, &ctx.stop).await {
        Ok(dialed) => dialed,
        Err(e) => {
            return finish_failure(
                ctx,
                &mut client,
                draft,
                refused(e.refusal, e.kind),
                Some(&target),
            )
            .await
        }
    };
    if let Err(why) =
        write_guarded(&mut client, &reply(reply::SUCCEEDED), ctx.idle, &ctx.stop).await
    {
        draft.address = Some(dialed.addr.ip().to_string());
        return draft.finish(
            code::ALLOWED,
            (0, 0),
            format!("{target}: closed before the tunnel opened: {why}"),
        );
    }
    let sni = sni_host(ctx, &host, request.port);
    serve_connected(ctx, &mut client, dialed, rest, Upload::Tunnel, sni, draft).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reply_codes() {
        let r = |c| Refusal::new(c, "");
        assert_eq!(
            reply_code(&r(code::DENIED_DOMAIN), None),
            reply::NOT_ALLOWED
        );
        assert_eq!(
            reply_code(&r(code::DENIED_ADDRESS), None),
            reply::NOT_ALLOWED
        );
        assert_eq!(reply_code(&r(code::DENIED_LIMIT), None), reply::NOT_ALLOWED);
        assert_eq!(
            reply_code(&r(code::ERROR_RESOLVE), None),
            reply::HOST_UNREACHABLE
        );
        assert_eq!(
            reply_code(&r(code::ERROR_CONNECT), Some(ErrorKind::ConnectionRefused)),
            reply::CONNECTION_REFUSED
        );
        assert_eq!(
            reply_code(&r(code::ERROR_PROTOCOL), None),
            reply::GENERAL_FAILURE
        );
    }

    #[test]
    fn numeric_domains_are_ip_literals() {
        let failure = requested_host(&SocksTarget::Domain("2130706433".into()))
            .err()
            .unwrap();
        assert_eq!(failure.refusal.code, code::DENIED_IP_LITERAL);
        assert_eq!(failure.answer, Some(reply(reply::NOT_ALLOWED).to_vec()));
        assert_eq!(
            requested_host(&SocksTarget::Domain("127.0.0.1".into())).ok(),
            Some(Host::Ip("127.0.0.1".parse().unwrap()))
        );
    }
}

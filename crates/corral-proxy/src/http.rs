//! HTTP/1.x proxy requests, parsed by hand and strictly: the request line,
//! header fields, the target (CONNECT's `host:port` or an absolute
//! `http://` URL), body framing, and the head forwarded upstream.
//!
//! Strict on purpose: the proxy sits on a security boundary, so anything
//! ambiguous (obsolete line folding, a bare LF, whitespace before a colon,
//! both Content-Length and Transfer-Encoding) is refused with 400 rather
//! than guessed at.

use thiserror::Error;

use crate::display::shown;
use crate::target::{parse_authority, split_host_port, Host, TargetError};

/// Largest request head (request line and header fields) accepted.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;
/// Longest request line accepted.
pub const MAX_REQUEST_LINE: usize = 8 * 1024;
/// Most header fields accepted.
pub const MAX_HEADERS: usize = 100;

/// Why a request was refused as malformed or unsupported (answered 400).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HttpError {
    /// No blank line within [`MAX_HEAD_BYTES`].
    #[error("request head larger than {limit} bytes")]
    HeadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// No line end within [`MAX_REQUEST_LINE`].
    #[error("request line longer than {limit} bytes")]
    RequestLineTooLong {
        /// The limit.
        limit: usize,
    },
    /// More than [`MAX_HEADERS`] fields.
    #[error("more than {limit} header fields")]
    TooManyHeaders {
        /// The limit.
        limit: usize,
    },
    /// Not `METHOD SP target SP HTTP/1.x`.
    #[error("malformed request line `{0}`")]
    BadRequestLine(String),
    /// Not HTTP/1.0 or HTTP/1.1.
    #[error("unsupported HTTP version `{0}`")]
    BadVersion(String),
    /// A header line that is not `name: value`.
    #[error("malformed header field `{0}`")]
    BadHeader(String),
    /// The target names no valid host or port.
    #[error(transparent)]
    Target(#[from] TargetError),
    /// A path without a host: a request meant for a server, not a proxy.
    #[error(
        "`{0}` is not an absolute URL: this is a proxy; send http://host/path or CONNECT host:port"
    )]
    OriginForm(String),
    /// A scheme other than `http://`.
    #[error("`{0}` is not an http:// URL; use CONNECT host:port for https and other protocols")]
    Scheme(String),
    /// `http://user@host/`.
    #[error("user information in `{0}` is not supported")]
    UserInfo(String),
    /// Body framing the proxy cannot forward safely.
    #[error("ambiguous request body: {0}")]
    Framing(&'static str),
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The method, e.g. `GET` or `CONNECT`.
    pub method: String,
    /// The request target as sent.
    pub target: String,
    /// `HTTP/1.0` or `HTTP/1.1`.
    pub version: String,
    /// Header fields in order: name as sent, raw value without
    /// surrounding whitespace.
    pub headers: Vec<(String, Vec<u8>)>,
}

/// How much request body follows the head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Exactly this many bytes (0 without Content-Length).
    Length(u64),
    /// Chunked: relayed as it comes until either side closes.
    UntilClose,
}

/// What the client asks the proxy to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyRequest {
    /// Open a tunnel to `host:port`.
    Connect {
        /// Destination host.
        host: Host,
        /// Destination port.
        port: u16,
    },
    /// Forward a plain-HTTP request.
    Forward(Forward),
}

/// A plain-HTTP request to forward.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forward {
    /// Destination host.
    pub host: Host,
    /// Destination port (80 unless the URL names one).
    pub port: u16,
    /// The origin-form target sent upstream (`/path?query`).
    pub path: String,
    /// The request body that follows the head.
    pub body: Body,
}

/// The end of the head (index just past the blank line) once `buf` holds
/// it; `Ok(None)` while more bytes are needed; an error once the limits
/// rule out a valid head.
pub fn find_head_end(buf: &[u8]) -> Result<Option<usize>, HttpError> {
    let line_end = buf.windows(2).position(|w| w == b"\r\n");
    match line_end {
        None if buf.len() > MAX_REQUEST_LINE => {
            return Err(HttpError::RequestLineTooLong {
                limit: MAX_REQUEST_LINE,
            })
        }
        Some(end) if end > MAX_REQUEST_LINE => {
            return Err(HttpError::RequestLineTooLong {
                limit: MAX_REQUEST_LINE,
            })
        }
        _ => {}
    }
    match buf.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(end) if end + 4 <= MAX_HEAD_BYTES => Ok(Some(end + 4)),
        Some(_) => Err(HttpError::HeadTooLarge {
            limit: MAX_HEAD_BYTES,
        }),
        None if buf.len() >= MAX_HEAD_BYTES => Err(HttpError::HeadTooLarge {
            limit: MAX_HEAD_BYTES,
        }),
        None => Ok(None),
    }
}

/// Whether `b` may appear in a method or field name (RFC 9110 token).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Parses a complete head (as delimited by [`find_head_end`]).
pub fn parse_head(head: &[u8]) -> Result<RequestHead, HttpError> {
    let head = head.strip_suffix(b"\r\n\r\n").unwrap_or(head);
    let mut lines = crlf_lines(head).into_iter();
    let first = lines.next().unwrap_or_default();
    let bad_line = || HttpError::BadRequestLine(shown(first));
    let mut parts = first.split(|&b| b == b' ');
    let (method, target, version) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(m), Some(t), Some(v), None) => (m, t, v),
        _ => return Err(bad_line()),
    };
    if method.is_empty() || !method.iter().all(|&b| is_tchar(b)) {
        return Err(bad_line());
    }
    if target.is_empty() || !target.iter().all(|&b| b.is_ascii_graphic()) {
        return Err(bad_line());
    }
    if version != b"HTTP/1.1" && version != b"HTTP/1.0" {
        return Err(HttpError::BadVersion(shown(version)));
    }
    let mut headers = Vec::new();
    for line in lines {
        // A stray CR or LF inside a line is refused by the byte checks.
        if headers.len() == MAX_HEADERS {
            return Err(HttpError::TooManyHeaders { limit: MAX_HEADERS });
        }
        headers.push(parse_field(line)?);
    }
    Ok(RequestHead {
        method: String::from_utf8_lossy(method).into_owned(),
        target: String::from_utf8_lossy(target).into_owned(),
        version: String::from_utf8_lossy(version).into_owned(),
        headers,
    })
}

/// `head` split at each CRLF.
fn crlf_lines(head: &[u8]) -> Vec<&[u8]> {
    let mut lines = Vec::new();
    let mut rest = head;
    while let Some(i) = rest.windows(2).position(|w| w == b"\r\n") {
        lines.push(&rest[..i]);
        rest = &rest[i + 2..];
    }
    lines.push(rest);
    lines
}

/// Parses one `name: value` line.
fn parse_field(line: &[u8]) -> Result<(String, Vec<u8>), HttpError> {
    let bad = || HttpError::BadHeader(shown(line));
    let colon = line.iter().position(|&b| b == b':').ok_or_else(bad)?;
    let (name, value) = (&line[..colon], &line[colon + 1..]);
    // Rejects obsolete folding (a leading space) and space before the colon.
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(bad());
    }
    if value
        .iter()
        .any(|&b| b == b'\r' || b == b'\0' || (b < 0x20 && b != b'\t') || b == 0x7f)
    {
        return Err(bad());
    }
    let value = value.trim_ascii();
    Ok((String::from_utf8_lossy(name).into_owned(), value.to_vec()))
}

impl RequestHead {
    /// Values of every field named `name` (case-insensitive).
    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// Comma-separated list elements of every field named `name`,
    /// lower-cased and trimmed.
    fn list(&self, name: &str) -> Vec<String> {
        self.values(name)
            .flat_map(|v| v.split(|&b| b == b','))
            .map(|e| String::from_utf8_lossy(e.trim_ascii()).to_ascii_lowercase())
            .filter(|e| !e.is_empty())
            .collect()
    }
}

/// What the head asks for.
pub fn interpret(head: &RequestHead) -> Result<ProxyRequest, HttpError> {
    if head.method == "CONNECT" {
        let (host, port) = parse_authority(&head.target)?;
        return Ok(ProxyRequest::Connect { host, port });
    }
    let target = &head.target;
    let rest = match target.get(..7) {
        Some(scheme) if scheme.eq_ignore_ascii_case("http://") => &target[7..],
        _ if target.starts_with('/') || target == "*" => {
            return Err(HttpError::OriginForm(shown(target.as_bytes())))
        }
        _ => return Err(HttpError::Scheme(shown(target.as_bytes()))),
    };
    let split = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(split);
    if authority.contains('@') {
        return Err(HttpError::UserInfo(shown(target.as_bytes())));
    }
    let (host, port) = split_host_port(authority)?;
    let path = path.split('#').next().unwrap_or_default();
    let path = match path.chars().next() {
        None => "/".to_string(),
        Some('?') => format!("/{path}"),
        Some(_) => path.to_string(),
    };
    Ok(ProxyRequest::Forward(Forward {
        host,
        port: port.unwrap_or(80),
        path,
        body: body_framing(head)?,
    }))
}

/// How the request body is delimited; ambiguous framing (the stuff of
/// request smuggling) is refused.
fn body_framing(head: &RequestHead) -> Result<Body, HttpError> {
    let codings = head.list("transfer-encoding");
    let lengths = head.list("content-length");
    if !codings.is_empty() {
        if !lengths.is_empty() {
            return Err(HttpError::Framing(
                "both Content-Length and Transfer-Encoding",
            ));
        }
        if codings.last().map(String::as_str) != Some("chunked") {
            return Err(HttpError::Framing(
                "Transfer-Encoding does not end in chunked",
            ));
        }
        return Ok(Body::UntilClose);
    }
    let mut length = None;
    for value in &lengths {
        if value.is_empty() || value.len() > 19 || !value.bytes().all(|b| b.is_ascii_digit()) {
            return Err(HttpError::Framing("Content-Length is not a number"));
        }
        let n: u64 = value
            .parse()
            .map_err(|_| HttpError::Framing("Content-Length is not a number"))?;
        if length.is_some_and(|l| l != n) {
            return Err(HttpError::Framing("conflicting Content-Length values"));
        }
        length = Some(n);
    }
    Ok(Body::Length(length.unwrap_or(0)))
}

/// Fields never forwarded: hop-by-hop fields, anything `Proxy-*`, and
/// `Host` (rewritten from the URL so the request reaches exactly the host
/// the policy checked).
fn dropped_field(name: &str, listed_in_connection: &[String]) -> bool {
    const HOP_BY_HOP: [&str; 7] = [
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "host",
        "proxy-connection",
    ];
    let lower = name.to_ascii_lowercase();
    HOP_BY_HOP.contains(&lower.as_str())
        || lower.starts_with("proxy-")
        || listed_in_connection.contains(&lower)
}

/// The head sent upstream: origin-form target, `Host` from the URL, the
/// client's end-to-end fields, `Connection: close`.
pub fn forward_head(head: &RequestHead, fwd: &Forward) -> Vec<u8> {
    let listed = head.list("connection");
    let host = if fwd.port == 80 {
        fwd.host.to_string()
    } else {
        format!("{}:{}", fwd.host, fwd.port)
    };
    let mut out = format!(
        "{} {} {}\r\nHost: {host}\r\n",
        head.method, fwd.path, head.version
    )
    .into_bytes();
    for (name, value) in &head.headers {
        if !dropped_field(name, &listed) {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out
}

/// The answer to a successful CONNECT.
pub const CONNECT_ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// A complete plain-text answer from the proxy itself, carrying the
/// reason code in `X-Corral-Reason`.
pub fn proxy_response(status: u16, code: &str, body: &str) -> Vec<u8> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nX-Corral-Reason: {code}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(text: &str) -> Result<RequestHead, HttpError> {
        let end = find_head_end(text.as_bytes())?.expect("complete head");
        parse_head(&text.as_bytes()[..end])
    }

    #[test]
    fn finds_the_end_of_the_head() {
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\nA: b\r\n"), Ok(None));
        assert_eq!(find_head_end(b"GET / HTTP/1.1\r\n\r\nbody"), Ok(Some(18)));
        let long_line = vec![b'a'; MAX_REQUEST_LINE + 1];
        assert_eq!(
            find_head_end(&long_line),
            Err(HttpError::RequestLineTooLong {
                limit: MAX_REQUEST_LINE
            })
        );
        let mut big = b"GET / HTTP/1.1\r\n".to_vec();
        while big.len() < MAX_HEAD_BYTES {
            big.extend_from_slice(b"X-Filler: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n");
        }
        assert_eq!(
            find_head_end(&big),
            Err(HttpError::HeadTooLarge {
                limit: MAX_HEAD_BYTES
            })
        );
    }

    #[test]
    fn parses_request_line_and_fields() {
        let h = head("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\nX-Empty:\r\nUser-Agent:  curl/8 \r\n\r\n").unwrap();
        assert_eq!(
            (h.method.as_str(), h.target.as_str(), h.version.as_str()),
            ("CONNECT", "a.test:443", "HTTP/1.1")
        );
        assert_eq!(h.headers[2], ("User-Agent".to_string(), b"curl/8".to_vec()));
        assert_eq!(h.headers[1].1, b"");
        assert_eq!(
            interpret(&h),
            Ok(ProxyRequest::Connect {
                host: Host::Name("a.test".into()),
                port: 443
            })
        );
    }

    #[test]
    fn refuses_malformed_heads() {
        let cases = [
            "GET  http://a.test/ HTTP/1.1\r\n\r\n",
            "GET http://a.test/\r\n\r\n",
            "GET http://a.test/ HTTP/1.1 extra\r\n\r\n",
            "G(T http://a.test/ HTTP/1.1\r\n\r\n",
            "\r\n\r\n",
            "GET http://a.test/ HTTP/2.0\r\n\r\n",
            "GET http://a.test/ http/1.1\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nNoColon\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nBad Name: x\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nName : x\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nA: b\nB: c\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nA: b\x00c\r\n\r\n",
            "GET http://a.test/\x01 HTTP/1.1\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\nHost: a\r\n\r\n",
            "GET http://a.test/ HTTP/1.1\r\nA: b\rc\r\n\r\n",
        ];
        for case in cases {
            assert!(head(case).is_err(), "{case:?} must be refused");
        }
        let many: String = (0..=MAX_HEADERS).map(|i| format!("X-{i}: v\r\n")).collect();
        assert_eq!(
            head(&format!("GET http://a.test/ HTTP/1.1\r\n{many}\r\n")),
            Err(HttpError::TooManyHeaders { limit: MAX_HEADERS })
        );
        // Garbage never panics, whatever its shape.
        for garbage in [
            &b"\xff\xfe\r\n\r\n"[..],
            b":\r\n\r\n",
            b" \r\n\r\n",
            b"\x16\x03\x01\x02\x00\x01",
        ] {
            let _ = find_head_end(garbage).map(|end| end.map(|e| parse_head(&garbage[..e])));
            let _ = parse_head(garbage);
        }
    }

    #[test]
    fn interprets_targets() {
        let fwd = |t: &str| match interpret(&head(&format!("GET {t} HTTP/1.1\r\n\r\n")).unwrap()) {
            Ok(ProxyRequest::Forward(f)) => Ok((f.host.to_string(), f.port, f.path)),
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        assert_eq!(
            fwd("http://A.Test/x?y=1#frag"),
            Ok(("a.test".into(), 80, "/x?y=1".into()))
        );
        assert_eq!(
            fwd("HTTP://a.test:8080"),
            Ok(("a.test".into(), 8080, "/".into()))
        );
        assert_eq!(
            fwd("http://a.test?q"),
            Ok(("a.test".into(), 80, "/?q".into()))
        );
        assert_eq!(
            fwd("http://[::1]:81/p"),
            Ok(("[::1]".into(), 81, "/p".into()))
        );
        assert!(matches!(fwd("/path"), Err(HttpError::OriginForm(_))));
        assert!(matches!(fwd("https://a.test/"), Err(HttpError::Scheme(_))));
        assert!(matches!(
            fwd("http://u:p@a.test/"),
            Err(HttpError::UserInfo(_))
        ));
        assert!(matches!(fwd("http://a.test:0/"), Err(HttpError::Target(_))));
        assert!(matches!(fwd("http:///x"), Err(HttpError::Target(_))));
        let connect = |t: &str| interpret(&head(&format!("CONNECT {t} HTTP/1.1\r\n\r\n")).unwrap());
        assert!(matches!(
            connect("a.test"),
            Err(HttpError::Target(TargetError::MissingPort(_)))
        ));
        assert!(matches!(
            connect("http://a.test:443/"),
            Err(HttpError::Target(_))
        ));
    }

    #[test]
    fn body_framing_is_unambiguous() {
        let body = |fields: &str| {
            let h = head(&format!("POST http://a.test/ HTTP/1.1\r\n{fields}\r\n")).unwrap();
            interpret(&h).map(|r| match r {
                ProxyRequest::Forward(f) => f.body,
                other => panic!("{other:?}"),
            })
        };
        assert_eq!(body(""), Ok(Body::Length(0)));
        assert_eq!(body("Content-Length: 12\r\n"), Ok(Body::Length(12)));
        assert_eq!(
            body("Content-Length: 12\r\ncontent-length: 12\r\n"),
            Ok(Body::Length(12))
        );
        assert_eq!(
            body("Transfer-Encoding: gzip, chunked\r\n"),
            Ok(Body::UntilClose)
        );
        for bad in [
            "Content-Length: 12\r\nContent-Length: 13\r\n",
            "Content-Length: -1\r\n",
            "Content-Length: 1e3\r\n",
            "Content-Length: 12\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding: chunked, gzip\r\n",
        ] {
            assert!(matches!(body(bad), Err(HttpError::Framing(_))), "{bad:?}");
        }
    }

    #[test]
    fn forwarded_head_drops_hop_by_hop_fields() {
        let h = head(concat!(
            "GET http://a.test:8080/p?q HTTP/1.1\r\n",
            "Host: evil.test\r\n",
            "Proxy-Authorization: Basic eA==\r\n",
            "Proxy-Connection: keep-alive\r\n",
            "Connection: keep-alive, X-Secret\r\n",
            "X-Secret: 1\r\n",
            "Keep-Alive: 5\r\n",
            "Accept: */*\r\n",
            "\r\n"
        ))
        .unwrap();
        let fwd = match interpret(&h).unwrap() {
            ProxyRequest::Forward(f) => f,
            other => panic!("{other:?}"),
        };
        let out = String::from_utf8(forward_head(&h, &fwd)).unwrap();
        assert_eq!(
            out,
            "GET /p?q HTTP/1.1\r\nHost: a.test:8080\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn proxy_responses_carry_the_code() {
        let r =
            String::from_utf8(proxy_response(403, "net.denied.domain", "corral: no\n")).unwrap();
        assert!(r.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        assert!(r.contains("\r\nX-Corral-Reason: net.denied.domain\r\n"));
        assert!(r.contains("\r\nContent-Length: 11\r\n"));
        assert!(r.ends_with("\r\n\r\ncorral: no\n"));
    }
}

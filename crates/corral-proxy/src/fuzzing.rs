//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz): thin
//! wrappers over the proxy's private parsers that take the raw bytes a
//! client sends. **Not a stable API**: hidden from the documentation,
//! for `fuzz/` only, and free to change with the parsers.
//!
//! Each wrapper runs the parser exactly as the proxy does and returns
//! whether the input was accepted, so a fuzz target needs nothing else.
//! Nothing here changes behaviour.

use crate::{http, sni, socks, target};

/// The HTTP request-head path: [`http::find_head_end`] on `buf`, then,
/// when a complete head is found, [`http::parse_head`],
/// [`http::interpret`] and, for a forwarded request,
/// [`http::forward_head`]. `true` when a request came out of it.
pub fn http_request(buf: &[u8]) -> bool {
    let end = match http::find_head_end(buf) {
        Ok(Some(end)) => end,
        Ok(None) | Err(_) => return false,
    };
    let Some(head_bytes) = buf.get(..end) else {
        return false;
    };
    let Ok(head) = http::parse_head(head_bytes) else {
        return false;
    };
    match http::interpret(&head) {
        Ok(http::ProxyRequest::Forward(fwd)) => {
            let out = http::forward_head(&head, &fwd);
            assert!(
                out.ends_with(b"\r\n\r\n"),
                "forwarded head is not terminated"
            );
            true
        }
        Ok(_) => true,
        Err(_) => false,
    }
}

/// The CONNECT / absolute-form target parser ([`target::parse_authority`])
/// on `buf` as UTF-8 (the proxy has checked that by then). An accepted
/// authority, displayed as `host:port`, must parse again to the same
/// host and port. `true` when it parsed.
pub fn connect_target(buf: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(buf) else {
        return false;
    };
    let _ = target::parse_host(text);
    let _ = target::split_host_port(text);
    let Ok((host, port)) = target::parse_authority(text) else {
        return false;
    };
    let again = target::parse_authority(&format!("{host}:{port}"));
    assert_eq!(again, Ok((host, port)), "authority does not round-trip");
    true
}

/// The SOCKS5 parsers on `buf`: [`socks::parse_greeting`], then
/// [`socks::parse_request`] on the bytes after the greeting (or on all of
/// `buf` when it is not a greeting). A parser that reports having consumed
/// `n` bytes must have had them. `true` when a request parsed.
pub fn socks5(buf: &[u8]) -> bool {
    let rest = match socks::parse_greeting(buf) {
        Ok(Some((greeting, used))) => {
            assert!(used <= buf.len(), "greeting consumed more than it had");
            let _ = greeting.offers_no_auth();
            buf.get(used..).unwrap_or_default()
        }
        Ok(None) | Err(_) => buf,
    };
    match socks::parse_request(rest) {
        Ok(Some((_, used))) => {
            assert!(used <= rest.len(), "request consumed more than it had");
            true
        }
        Ok(None) => false,
        Err(e) => {
            let _ = e.reply_code();
            false
        }
    }
}

/// The TLS ClientHello parser ([`sni::parse_client_hello`]) on `buf`, as
/// the proxy calls it on the first bytes of a tunnel. `true` when a
/// complete ClientHello parsed; its server name, if any, is lower case
/// with no trailing dot.
pub fn client_hello(buf: &[u8]) -> bool {
    match sni::parse_client_hello(buf) {
        Ok(sni::Hello::Complete(name)) => {
            if let Some(name) = name {
                assert!(!name.ends_with('.'), "server name keeps its trailing dot");
                assert!(
                    !name.bytes().any(|b| b.is_ascii_uppercase()),
                    "server name is not lower case"
                );
            }
            true
        }
        Ok(sni::Hello::Incomplete) | Err(_) => false,
    }
}

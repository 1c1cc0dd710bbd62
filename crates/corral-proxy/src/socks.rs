//! SOCKS5 (RFC 1928) as corral serves it: the no-authentication method
//! and the CONNECT command only; targets by domain name (resolved by the
//! proxy, never in the sandbox), IPv4 or IPv6.

use std::net::{Ipv4Addr, Ipv6Addr};

use thiserror::Error;

/// Protocol version byte.
const VERSION: u8 = 5;
/// Method: no authentication.
pub const NO_AUTH: u8 = 0;
/// Method reply: no acceptable method.
pub const NO_ACCEPTABLE_METHOD: u8 = 0xff;
/// Command: CONNECT.
const CONNECT: u8 = 1;

/// Reply codes (RFC 1928 section 6).
pub mod reply {
    /// Succeeded.
    pub const SUCCEEDED: u8 = 0;
    /// General SOCKS server failure.
    pub const GENERAL_FAILURE: u8 = 1;
    /// Connection not allowed by ruleset.
    pub const NOT_ALLOWED: u8 = 2;
    /// Host unreachable.
    pub const HOST_UNREACHABLE: u8 = 4;
    /// Connection refused.
    pub const CONNECTION_REFUSED: u8 = 5;
    /// TTL expired (used for timeouts).
    pub const TTL_EXPIRED: u8 = 6;
    /// Command not supported.
    pub const COMMAND_NOT_SUPPORTED: u8 = 7;
    /// Address type not supported.
    pub const ADDRESS_TYPE_NOT_SUPPORTED: u8 = 8;
}

/// Why a SOCKS5 message was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SocksError {
    /// Not SOCKS version 5.
    #[error("not a SOCKS5 client (version byte {0})")]
    BadVersion(u8),
    /// The greeting offers no method.
    #[error("SOCKS5 greeting offers no authentication method")]
    NoMethods,
    /// The reserved byte is not zero.
    #[error("SOCKS5 request with reserved byte {0}")]
    BadReserved(u8),
    /// BIND, UDP ASSOCIATE or an unknown command.
    #[error("SOCKS5 command {0} is not supported (CONNECT only)")]
    UnsupportedCommand(u8),
    /// An unknown address type.
    #[error("SOCKS5 address type {0} is not supported")]
    UnsupportedAddressType(u8),
    /// A domain that is empty or not printable ASCII.
    #[error("SOCKS5 domain is empty or not printable text")]
    BadDomain,
    /// Port 0.
    #[error("SOCKS5 request for port 0")]
    ZeroPort,
}

impl SocksError {
    /// The reply code that reports this error to the client.
    pub fn reply_code(&self) -> u8 {
        match self {
            SocksError::UnsupportedCommand(_) => reply::COMMAND_NOT_SUPPORTED,
            SocksError::UnsupportedAddressType(_) => reply::ADDRESS_TYPE_NOT_SUPPORTED,
            _ => reply::GENERAL_FAILURE,
        }
    }
}

/// A parse result: `Ok(None)` while more bytes are needed, else the
/// message and how many bytes it took.
pub type Parsed<T> = Result<Option<(T, usize)>, SocksError>;

/// The client's first message: the authentication methods it offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    /// Offered method numbers.
    pub methods: Vec<u8>,
}

impl Greeting {
    /// Whether the client accepts no authentication, the only method
    /// corral serves (the listener is reachable only from the sandbox).
    pub fn offers_no_auth(&self) -> bool {
        self.methods.contains(&NO_AUTH)
    }
}

/// A requested destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocksTarget {
    /// A name for the proxy to resolve, as sent.
    Domain(String),
    /// An IPv4 literal.
    V4(Ipv4Addr),
    /// An IPv6 literal.
    V6(Ipv6Addr),
}

/// A CONNECT request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocksRequest {
    /// Destination.
    pub target: SocksTarget,
    /// Destination port.
    pub port: u16,
}

/// Parses the greeting at the start of `buf`: `Ok(None)` while
/// incomplete, else the greeting and its length.
pub fn parse_greeting(buf: &[u8]) -> Parsed<Greeting> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(SocksError::BadVersion(version));
    }
    let Some(&count) = buf.get(1) else {
        return Ok(None);
    };
    if count == 0 {
        return Err(SocksError::NoMethods);
    }
    let end = 2 + usize::from(count);
    Ok(buf.get(2..end).map(|methods| {
        (
            Greeting {
                methods: methods.to_vec(),
            },
            end,
        )
    }))
}

/// Parses the request at the start of `buf`: `Ok(None)` while
/// incomplete, else the request and its length.
pub fn parse_request(buf: &[u8]) -> Parsed<SocksRequest> {
    let Some(&version) = buf.first() else {
        return Ok(None);
    };
    if version != VERSION {
        return Err(SocksError::BadVersion(version));
    }
    let Some(&command) = buf.get(1) else {
        return Ok(None);
    };
    if command != CONNECT {
        return Err(SocksError::UnsupportedCommand(command));
    }
    let Some(&reserved) = buf.get(2) else {
        return Ok(None);
    };
    if reserved != 0 {
        return Err(SocksError::BadReserved(reserved));
    }
    let Some(&kind) = buf.get(3) else {
        return Ok(None);
    };
    let (target, addr_end) = match kind {
        1 => match buf.get(4..8) {
            Some(b) => (SocksTarget::V4(Ipv4Addr::new(b[0], b[1], b[2], b[3])), 8),
            None => return Ok(None),
        },
        4 => match buf.get(4..20).and_then(|b| <[u8; 16]>::try_from(b).ok()) {
            Some(b) => (SocksTarget::V6(Ipv6Addr::from(b)), 20),
            None => return Ok(None),
        },
        3 => {
            let Some(&len) = buf.get(4) else {
                return Ok(None);
            };
            let end = 5 + usize::from(len);
            let Some(name) = buf.get(5..end) else {
                return Ok(None);
            };
            if name.is_empty() || !name.iter().all(|b| b.is_ascii_graphic()) {
                return Err(SocksError::BadDomain);
            }
            (
                SocksTarget::Domain(String::from_utf8_lossy(name).into_owned()),
                end,
            )
        }
        other => return Err(SocksError::UnsupportedAddressType(other)),
    };
    let Some(port) = buf.get(addr_end..addr_end + 2) else {
        return Ok(None);
    };
    let port = u16::from_be_bytes([port[0], port[1]]);
    if port == 0 {
        return Err(SocksError::ZeroPort);
    }
    Ok(Some((SocksRequest { target, port }, addr_end + 2)))
}

/// The reply to a request; the bound address is always reported as
/// 0.0.0.0:0 so nothing about the host side leaks into the sandbox.
pub fn reply(code: u8) -> [u8; 10] {
    [VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0]
}

/// The answer to the greeting.
pub fn method_reply(method: u8) -> [u8; 2] {
    [VERSION, method]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings() {
        assert_eq!(parse_greeting(b""), Ok(None));
        assert_eq!(parse_greeting(b"\x05"), Ok(None));
        assert_eq!(parse_greeting(b"\x05\x02\x00"), Ok(None));
        let (g, len) = parse_greeting(b"\x05\x02\x02\x00rest").unwrap().unwrap();
        assert_eq!(len, 4);
        assert!(g.offers_no_auth());
        let (g, _) = parse_greeting(b"\x05\x01\x02").unwrap().unwrap();
        assert!(!g.offers_no_auth(), "username/password only");
        assert_eq!(parse_greeting(b"\x04\x01"), Err(SocksError::BadVersion(4)));
        assert_eq!(
            parse_greeting(b"GET / HTTP/1.1"),
            Err(SocksError::BadVersion(b'G'))
        );
        assert_eq!(parse_greeting(b"\x05\x00"), Err(SocksError::NoMethods));
    }

    #[test]
    fn requests() {
        let domain = b"\x05\x01\x00\x03\x0callowed.test\x1f\x90";
        let (r, len) = parse_request(domain).unwrap().unwrap();
        assert_eq!(len, domain.len());
        assert_eq!(
            r,
            SocksRequest {
                target: SocksTarget::Domain("allowed.test".into()),
                port: 8080
            }
        );
        for cut in 0..domain.len() {
            assert_eq!(parse_request(&domain[..cut]), Ok(None), "cut at {cut}");
        }
        let (r, _) = parse_request(b"\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x50")
            .unwrap()
            .unwrap();
        assert_eq!(
            r,
            SocksRequest {
                target: SocksTarget::V4(Ipv4Addr::LOCALHOST),
                port: 80
            }
        );
        let mut v6 = b"\x05\x01\x00\x04".to_vec();
        v6.extend_from_slice(&Ipv6Addr::LOCALHOST.octets());
        v6.extend_from_slice(&443u16.to_be_bytes());
        let (r, _) = parse_request(&v6).unwrap().unwrap();
        assert_eq!(r.target, SocksTarget::V6(Ipv6Addr::LOCALHOST));
    }

    #[test]
    fn refused_requests_map_to_reply_codes() {
        let bind = parse_request(b"\x05\x02\x00\x01").unwrap_err();
        assert_eq!(bind.reply_code(), reply::COMMAND_NOT_SUPPORTED);
        let udp = parse_request(b"\x05\x03").unwrap_err();
        assert_eq!(udp, SocksError::UnsupportedCommand(3));
        let kind = parse_request(b"\x05\x01\x00\x09").unwrap_err();
        assert_eq!(kind.reply_code(), reply::ADDRESS_TYPE_NOT_SUPPORTED);
        assert_eq!(
            parse_request(b"\x05\x01\x01\x01"),
            Err(SocksError::BadReserved(1))
        );
        assert_eq!(
            parse_request(b"\x05\x01\x00\x03\x00\x00\x50"),
            Err(SocksError::BadDomain)
        );
        assert_eq!(
            parse_request(b"\x05\x01\x00\x03\x03a\x00b\x00\x50"),
            Err(SocksError::BadDomain)
        );
        assert_eq!(
            parse_request(b"\x05\x01\x00\x01\x7f\x00\x00\x01\x00\x00"),
            Err(SocksError::ZeroPort)
        );
        assert_eq!(SocksError::ZeroPort.reply_code(), reply::GENERAL_FAILURE);
        assert_eq!(reply(reply::NOT_ALLOWED), [5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
    }
}

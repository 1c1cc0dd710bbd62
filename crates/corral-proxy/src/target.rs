//! Destinations as clients name them: a host (name or IP literal) and a
//! port, parsed strictly.
//!
//! Names that only a permissive resolver would read as addresses
//! (`2130706433`, `127.1`, `0x7f.1`) are refused as IP literals rather than
//! handed to the resolver, so the IP-literal rule cannot be sidestepped.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

use corral_policy::network::normalize_host;
use thiserror::Error;

use crate::display::shown;

/// A destination host as the client named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A host name, normalised (lower case, no trailing dot).
    Name(String),
    /// An IP literal.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Ip(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Why a destination could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TargetError {
    /// Neither a host name nor an IP literal.
    #[error("`{0}` is not a host name or IP address")]
    InvalidHost(String),
    /// A name a resolver would read as a numeric IPv4 address.
    #[error("`{0}` is a numeric IPv4 form; IP targets need an allow_cidrs entry")]
    NumericName(String),
    /// `host:port` was expected.
    #[error("`{0}` has no port; write host:port")]
    MissingPort(String),
    /// The port is not 1-65535.
    #[error("`{0}` is not a port (1-65535)")]
    InvalidPort(String),
}

/// Parses a host: `[v6]`, a bare IP literal, or a DNS name.
pub fn parse_host(text: &str) -> Result<Host, TargetError> {
    if let Some(inner) = text.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| TargetError::InvalidHost(shown(text.as_bytes())))?;
        return inner
            .parse::<Ipv6Addr>()
            .map(|v6| Host::Ip(IpAddr::V6(v6)))
            .map_err(|_| TargetError::InvalidHost(shown(text.as_bytes())));
    }
    if let Ok(ip) = text.parse::<IpAddr>() {
        return Ok(Host::Ip(ip));
    }
    let name =
        normalize_host(text).ok_or_else(|| TargetError::InvalidHost(shown(text.as_bytes())))?;
    if looks_numeric(&name) {
        return Err(TargetError::NumericName(name));
    }
    Ok(Host::Name(name))
}

/// Whether the last label is a number (decimal, or hex with `0x`): no real
/// top-level domain is, but `inet_aton` reads such names as addresses.
fn looks_numeric(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    let hex = last
        .strip_prefix("0x")
        .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    hex || last.bytes().all(|b| b.is_ascii_digit())
}

/// Parses a port, 1-65535, digits only.
pub fn parse_port(text: &str) -> Result<u16, TargetError> {
    let invalid = || TargetError::InvalidPort(shown(text.as_bytes()));
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(invalid()),
        Ok(port) => Ok(port),
    }
}

/// Splits `host[:port]` (host may be `[v6]`); the port is `None` when
/// absent.
pub fn split_host_port(text: &str) -> Result<(Host, Option<u16>), TargetError> {
    let (host, port) = if text.starts_with('[') {
        match text.find(']') {
            Some(end) => {
                let (host, rest) = text.split_at(end + 1);
                match rest.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None if rest.is_empty() => (host, None),
                    None => return Err(TargetError::InvalidHost(shown(text.as_bytes()))),
                }
            }
            None => return Err(TargetError::InvalidHost(shown(text.as_bytes()))),
        }
    } else {
        match text.rsplit_once(':') {
            Some((host, _)) if host.contains(':') => {
                return Err(TargetError::InvalidHost(shown(text.as_bytes())));
            }
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = port.map(parse_port).transpose()?;
    Ok((parse_host(host)?, port))
}

/// Parses `host:port` (CONNECT's authority form); the port is required.
pub fn parse_authority(text: &str) -> Result<(Host, u16), TargetError> {
    match split_host_port(text)? {
        (host, Some(port)) => Ok((host, port)),
        (_, None) => Err(TargetError::MissingPort(shown(text.as_bytes()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        assert_eq!(
            parse_host("Allowed.Test."),
            Ok(Host::Name("allowed.test".into()))
        );
        assert_eq!(
            parse_host("10.0.0.1"),
            Ok(Host::Ip("10.0.0.1".parse().unwrap()))
        );
        assert_eq!(parse_host("[::1]"), Ok(Host::Ip("::1".parse().unwrap())));
        assert_eq!(parse_host("::1"), Ok(Host::Ip("::1".parse().unwrap())));
        for numeric in ["2130706433", "127.1", "0x7f.1", "a.0x7F", "10.0.1"] {
            assert!(
                matches!(parse_host(numeric), Err(TargetError::NumericName(_))),
                "{numeric}"
            );
        }
        for bad in [
            "",
            "[::1",
            "[fe80::1%25eth0]",
            "a b",
            "exa_mple.com",
            "a..b",
            "[10.0.0.1]",
        ] {
            assert!(
                matches!(parse_host(bad), Err(TargetError::InvalidHost(_))),
                "{bad}"
            );
        }
        assert_eq!(Host::Ip("::1".parse().unwrap()).to_string(), "[::1]");
    }

    #[test]
    fn authorities() {
        assert_eq!(
            parse_authority("example.org:443"),
            Ok((Host::Name("example.org".into()), 443))
        );
        assert_eq!(
            parse_authority("[::ffff:127.0.0.1]:80"),
            Ok((Host::Ip("::ffff:127.0.0.1".parse().unwrap()), 80))
        );
        assert!(matches!(
            parse_authority("example.org"),
            Err(TargetError::MissingPort(_))
        ));
        for bad in [
            "example.org:",
            "example.org:0",
            "example.org:65536",
            "example.org:+80",
            "example.org:8 0",
            "[::1]x:80",
        ] {
            assert!(parse_authority(bad).is_err(), "{bad}");
        }
        assert_eq!(
            split_host_port("a.test"),
            Ok((Host::Name("a.test".into()), None))
        );
        assert!(
            split_host_port("::1").is_err(),
            "bare v6 needs brackets in a URL authority"
        );
    }
}

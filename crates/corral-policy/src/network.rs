//! Network policy: which destinations the egress proxy may reach.
//!
//! Pure rules and matching; the proxy (crate `corral-proxy`) resolves names,
//! checks addresses and connects.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::Serialize;

/// How the sandbox reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Its own network namespace with loopback only.
    None,
    /// Its own network namespace whose only way out is corral's proxy.
    Allow,
    /// The host's network, unfiltered. Explicit and reported loudly.
    Host,
}

/// Why a network mode, domain rule or CIDR was refused. Each message
/// quotes the text as written and says what is expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    /// A mode other than `none`, `allow` or `host`.
    #[error("unknown network mode `{0}`: use none, allow or host")]
    UnknownMode(String),
    /// A port of a domain rule that is not 1-65535.
    #[error("`{port}` in `{rule}` is not a port (1-65535)")]
    BadPort {
        /// The port as written.
        port: String,
        /// The whole rule.
        rule: String,
    },
    /// A domain pattern that is not a name or `*.` and a name (an IP
    /// address included: those go in `allow_cidrs`).
    #[error("`{0}` is not a domain pattern: write `example.com` or `*.example.com` (IP addresses go in allow_cidrs)")]
    BadDomain(String),
    /// A CIDR whose address does not parse.
    #[error("`{0}` is not a CIDR such as 10.0.0.0/8, fd00::/8 or 127.0.0.1/32:8080,8081")]
    BadCidr(String),
    /// A CIDR prefix length beyond the address's width.
    #[error("`{text}`: prefix length must be 0-{max}")]
    BadPrefix {
        /// The CIDR as written.
        text: String,
        /// The address family's width (32 or 128).
        max: u8,
    },
    /// A CIDR with host bits set (`10.0.0.1/8`): probably a typo, so
    /// refused rather than silently widened.
    #[error("`{0}` has host bits set; write the network address")]
    HostBits(String),
}

impl NetworkError {
    /// A stable code for JSON error objects.
    pub fn code(&self) -> &'static str {
        "network.invalid"
    }
}

impl FromStr for NetworkMode {
    type Err = NetworkError;
    fn from_str(s: &str) -> Result<Self, NetworkError> {
        match s {
            "none" => Ok(NetworkMode::None),
            "allow" => Ok(NetworkMode::Allow),
            "host" => Ok(NetworkMode::Host),
            other => Err(NetworkError::UnknownMode(other.to_string())),
        }
    }
}

/// An allowed domain pattern with its ports: `example.com` (exactly that
/// name) or `*.example.com` (any name below it, not the name itself),
/// optionally `:443,8443` (default 80 and 443).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DomainRule {
    /// Lower-case pattern.
    pub pattern: String,
    /// Allowed ports.
    pub ports: Vec<u16>,
}

/// Default ports of a domain rule.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Lower-cases and checks a host name (no trailing dot, no IP literal
/// check here).
pub fn normalize_host(name: &str) -> Option<String> {
    let lower = name.trim_end_matches('.').to_ascii_lowercase();
    valid_name(&lower).then_some(lower)
}

impl DomainRule {
    /// Parses `PATTERN[:PORT,...]`.
    pub fn parse(text: &str) -> Result<DomainRule, NetworkError> {
        let (pattern, ports) = match text.split_once(':') {
            Some((p, ports)) => {
                let ports = ports
                    .split(',')
                    .map(|p| match p.parse::<u16>() {
                        Ok(0) | Err(_) => Err(NetworkError::BadPort {
                            port: p.to_string(),
                            rule: text.to_string(),
                        }),
                        Ok(n) => Ok(n),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                (p, ports)
            }
            None => (text, DEFAULT_PORTS.to_vec()),
        };
        let lower = pattern.to_ascii_lowercase();
        let bare = lower.strip_prefix("*.").unwrap_or(&lower);
        if !valid_name(bare) || bare.parse::<IpAddr>().is_ok() {
            return Err(NetworkError::BadDomain(pattern.to_string()));
        }
        Ok(DomainRule {
            pattern: lower,
            ports,
        })
    }

    /// Whether the (normalized) `host` matches the pattern.
    pub fn matches_host(&self, host: &str) -> bool {
        match self.pattern.strip_prefix("*.") {
            Some(suffix) => {
                host.len() > suffix.len() + 1
                    && host.ends_with(suffix)
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
            None => host == self.pattern,
        }
    }
}

impl fmt::Display for DomainRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ports: Vec<String> = self.ports.iter().map(|p| p.to_string()).collect();
        write!(f, "{}:{}", self.pattern, ports.join(","))
    }
}

/// An IP network, `10.0.0.0/8` or `fd00::/8`, optionally limited to some
/// ports: `127.0.0.1/32:8765,8766`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cidr {
    /// Network address (host bits zero).
    pub addr: IpAddr,
    /// Prefix length.
    pub prefix: u8,
    /// The ports it allows; empty: every port.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<u16>,
}

/// `PORT[,PORT...]` of a rule, each 1-65535.
fn parse_ports(list: &str, rule: &str) -> Result<Vec<u16>, NetworkError> {
    list.split(',')
        .map(|p| match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(NetworkError::BadPort {
                port: p.to_string(),
                rule: rule.to_string(),
            }),
            Ok(n) => Ok(n),
        })
        .collect()
}

impl Cidr {
    /// Parses `ADDR/LEN[:PORT,...]`, or a bare address (a single host):
    /// `ADDR` or, for IPv4, `ADDR:PORT,...`. An IPv6 network with ports
    /// needs its prefix length (`::1/128:8080`): a bare IPv6 address is
    /// all colons.
    pub fn parse(text: &str) -> Result<Cidr, NetworkError> {
        let (addr, prefix, ports) = match text.split_once('/') {
            Some((a, rest)) => match rest.split_once(':') {
                Some((p, ports)) => (a, Some(p), Some(ports)),
                None => (a, Some(rest), None),
            },
            None => match text.rsplit_once(':') {
                Some((a, ports)) if a.parse::<std::net::Ipv4Addr>().is_ok() => {
                    (a, None, Some(ports))
                }
                _ => (text, None, None),
            },
        };
        let ports = match ports {
            Some(list) => parse_ports(list, text)?,
            None => Vec::new(),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| NetworkError::BadCidr(text.to_string()))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|&p| p <= max).ok_or_else(|| {
                NetworkError::BadPrefix {
                    text: text.to_string(),
                    max,
                }
            })?,
            None => max,
        };
        let cidr = Cidr {
            addr,
            prefix,
            ports,
        };
        if cidr.network_bits(addr) != addr_bits(addr) {
            return Err(NetworkError::HostBits(text.to_string()));
        }
        Ok(cidr)
    }

    fn network_bits(&self, addr: IpAddr) -> u128 {
        let (bits, width) = (addr_bits(addr), if addr.is_ipv4() { 32 } else { 128 });
        if self.prefix == 0 {
            0
        } else {
            bits & (u128::MAX << (width - u32::from(self.prefix)))
        }
    }

    /// Whether `addr` lies in this network (same family only), whatever
    /// the port.
    pub fn contains(&self, addr: IpAddr) -> bool {
        addr.is_ipv4() == self.addr.is_ipv4() && self.network_bits(addr) == addr_bits(self.addr)
    }

    /// Whether `addr` lies in this network and `port` is one of its ports
    /// (any port when it lists none).
    pub fn allows(&self, addr: IpAddr, port: u16) -> bool {
        self.contains(addr) && (self.ports.is_empty() || self.ports.contains(&port))
    }
}

fn addr_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)?;
        if !self.ports.is_empty() {
            let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
            write!(f, ":{}", ports.join(","))?;
        }
        Ok(())
    }
}

/// The network part of a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NetworkPolicy {
    /// none, allow or host.
    pub mode: NetworkMode,
    /// Domains the proxy may reach (mode `allow`).
    pub allow_domains: Vec<DomainRule>,
    /// Domains always refused; deny wins over allow.
    pub deny_domains: Vec<DomainRule>,
    /// Networks the proxy may reach even though they are private,
    /// loopback or link-local, and the only way to allow IP literals.
    pub allow_cidrs: Vec<Cidr>,
    /// Static name → address entries, checked like resolved addresses.
    pub hosts: BTreeMap<String, IpAddr>,
    /// For CONNECT to port 443: the TLS ClientHello's SNI must match the
    /// CONNECT host.
    pub sni_check: bool,
    /// Concurrent proxied connections per sandbox.
    pub max_connections: u32,
    /// Seconds a proxied connection may stay idle.
    pub idle_timeout_secs: u64,
}

impl Default for NetworkPolicy {
    fn default() -> Self {
        NetworkPolicy {
            mode: NetworkMode::None,
            allow_domains: Vec::new(),
            deny_domains: Vec::new(),
            allow_cidrs: Vec::new(),
            hosts: BTreeMap::new(),
            sni_check: true,
            max_connections: 64,
            idle_timeout_secs: 60,
        }
    }
}

/// Why the policy refuses a destination by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameDecision {
    /// Allowed by this rule.
    Allowed(String),
    /// Refused by a deny rule.
    Denied(String),
    /// No allow rule matches the name.
    NotAllowed,
    /// A rule matches the name but not the port.
    PortNotAllowed(Vec<u16>),
}

impl NetworkPolicy {
    /// Decides on a normalized host name and a port (deny wins).
    pub fn decide_name(&self, host: &str, port: u16) -> NameDecision {
        if let Some(d) = self.deny_domains.iter().find(|d| d.matches_host(host)) {
            return NameDecision::Denied(d.pattern.clone());
        }
        let matching: Vec<&DomainRule> = self
            .allow_domains
            .iter()
            .filter(|r| r.matches_host(host))
            .collect();
        match matching.iter().find(|r| r.ports.contains(&port)) {
            Some(r) => NameDecision::Allowed(r.to_string()),
            None if matching.is_empty() => NameDecision::NotAllowed,
            None => NameDecision::PortNotAllowed(
                matching.iter().flat_map(|r| r.ports.clone()).collect(),
            ),
        }
    }

    /// The allowed CIDR covering `addr` on `port`, if any.
    pub fn cidr_allowing(&self, addr: IpAddr, port: u16) -> Option<&Cidr> {
        self.allow_cidrs.iter().find(|c| c.allows(addr, port))
    }

    /// The ports of the allowed CIDRs covering `addr` on other ports (for
    /// a refusal that says which ports would do); empty when none does.
    pub fn cidr_ports(&self, addr: IpAddr) -> Vec<u16> {
        self.allow_cidrs
            .iter()
            .filter(|c| c.contains(addr))
            .flat_map(|c| c.ports.iter().copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domain_rules() {
        let r = DomainRule::parse("*.Example.com:443,8443").unwrap();
        assert_eq!(r.pattern, "*.example.com");
        assert_eq!(r.ports, [443, 8443]);
        assert!(r.matches_host("api.example.com"));
        assert!(r.matches_host("a.b.example.com"));
        assert!(!r.matches_host("example.com"));
        assert!(!r.matches_host("badexample.com"));
        let exact = DomainRule::parse("pypi.org").unwrap();
        assert_eq!(exact.ports, DEFAULT_PORTS);
        assert!(exact.matches_host("pypi.org") && !exact.matches_host("x.pypi.org"));
        for bad in [
            "",
            "*",
            "*.",
            "a..b",
            "-a.com",
            "1.2.3.4",
            "ex ample.com",
            "a.com:0",
            "a.com:x",
            "**.a.com",
            "a.*.com",
        ] {
            assert!(DomainRule::parse(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn cidrs() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains("10.1.2.3".parse().unwrap()));
        assert!(!c.contains("11.0.0.1".parse().unwrap()));
        assert!(
            !c.contains("::ffff:10.0.0.1".parse().unwrap()),
            "families never mix"
        );
        assert!(Cidr::parse("10.0.0.1/8").is_err());
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        let one = Cidr::parse("127.0.0.1").unwrap();
        assert_eq!(one.prefix, 32);
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains("fd12::1".parse().unwrap()));
        assert!(Cidr::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn cidrs_with_ports() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let c = Cidr::parse("127.0.0.1/32:8765").unwrap();
        assert_eq!(c.ports, [8765]);
        assert!(c.allows(lo, 8765) && !c.allows(lo, 8766));
        assert_eq!(c.to_string(), "127.0.0.1/32:8765");
        let several = Cidr::parse("127.0.0.0/8:80,8080").unwrap();
        assert!(several.allows("127.1.2.3".parse().unwrap(), 8080));
        assert!(!several.allows(lo, 443));
        assert_eq!(
            Cidr::parse("127.0.0.1:9000").unwrap().to_string(),
            "127.0.0.1/32:9000"
        );
        let v6 = Cidr::parse("::1/128:8080").unwrap();
        assert!(v6.allows("::1".parse().unwrap(), 8080));
        // A bare IPv6 address takes no port list: `::1:8080` is an address.
        assert!(Cidr::parse("::1:8080").unwrap().ports.is_empty());
        assert!(Cidr::parse("10.0.0.0/8")
            .unwrap()
            .allows("10.0.0.1".parse().unwrap(), 1));
        for bad in [
            "127.0.0.1/32:0",
            "127.0.0.1/32:",
            "127.0.0.1/32:x",
            "127.0.0.1:70000",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad} must be refused");
        }
        let policy = NetworkPolicy {
            allow_cidrs: vec![c, several],
            ..NetworkPolicy::default()
        };
        assert_eq!(policy.cidr_allowing(lo, 80).map(|c| c.prefix), Some(8));
        assert!(policy.cidr_allowing(lo, 443).is_none());
        assert_eq!(policy.cidr_ports(lo), [8765, 80, 8080]);
    }

    #[test]
    fn refusals_are_typed_and_say_what_is_expected() {
        assert_eq!(
            "open".parse::<NetworkMode>(),
            Err(NetworkError::UnknownMode("open".into()))
        );
        assert_eq!("allow".parse::<NetworkMode>(), Ok(NetworkMode::Allow));
        let e = DomainRule::parse("a.com:x").unwrap_err();
        assert_eq!(
            e,
            NetworkError::BadPort {
                port: "x".into(),
                rule: "a.com:x".into()
            }
        );
        assert_eq!(e.to_string(), "`x` in `a.com:x` is not a port (1-65535)");
        assert_eq!(e.code(), "network.invalid");
        assert_eq!(
            DomainRule::parse("1.2.3.4"),
            Err(NetworkError::BadDomain("1.2.3.4".into()))
        );
        assert_eq!(
            Cidr::parse("nope"),
            Err(NetworkError::BadCidr("nope".into()))
        );
        assert_eq!(
            Cidr::parse("fd00::/129"),
            Err(NetworkError::BadPrefix {
                text: "fd00::/129".into(),
                max: 128
            })
        );
        let e = Cidr::parse("10.0.0.1/8").unwrap_err();
        assert_eq!(e, NetworkError::HostBits("10.0.0.1/8".into()));
        assert!(e.to_string().contains("host bits"), "{e}");
    }

    #[test]
    fn deny_wins_and_ports_matter() {
        let p = NetworkPolicy {
            mode: NetworkMode::Allow,
            allow_domains: vec![DomainRule::parse("*.example.com").unwrap()],
            deny_domains: vec![DomainRule::parse("evil.example.com").unwrap()],
            ..Default::default()
        };
        assert!(matches!(
            p.decide_name("api.example.com", 443),
            NameDecision::Allowed(_)
        ));
        assert_eq!(
            p.decide_name("evil.example.com", 443),
            NameDecision::Denied("evil.example.com".into())
        );
        assert_eq!(
            p.decide_name("api.example.com", 22),
            NameDecision::PortNotAllowed(vec![80, 443])
        );
        assert_eq!(p.decide_name("other.org", 443), NameDecision::NotAllowed);
    }
}

//! The policy decisions, pure: may this host and port be reached, and which
//! of its addresses may be dialled.
//!
//! Order: IP literals need an `allow_cidrs` entry; names are checked
//! against `deny_domains` (deny wins), then `allow_domains` and their
//! ports; only then is an address looked up (a static `hosts` entry or
//! DNS), and every address is screened with [`denied_class`] unless an
//! allowed CIDR covers it. Nothing is resolved for a refused name, so the
//! proxy cannot be used to leak data through DNS queries either.

use std::collections::BTreeMap;
use std::net::IpAddr;

use corral_policy::network::{normalize_host, NameDecision};
use corral_policy::NetworkPolicy;

use crate::address::{denied_class, embedded_ipv4};
use crate::event::code;
use crate::target::Host;

/// A refused request: the stable code, a sentence saying why, and what
/// decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// One of [`crate::code`].
    pub code: &'static str,
    /// Why, naming the rule (completes "corral: HOST:PORT refused: ...").
    pub reason: String,
    /// The deciding rule, if one did.
    pub rule: Option<String>,
    /// The refused address, if an address was refused.
    pub address: Option<IpAddr>,
}

impl Refusal {
    /// A refusal without rule or address.
    pub fn new(code: &'static str, reason: impl Into<String>) -> Refusal {
        Refusal {
            code,
            reason: reason.into(),
            rule: None,
            address: None,
        }
    }
}

/// Where a request may go, once the name rules said yes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Route {
    /// An IP literal covered by the allowed CIDR `rule`.
    Literal { addr: IpAddr, rule: String },
    /// A name allowed by `rule`; `fixed` is its static `hosts` entry, if
    /// any (otherwise it is resolved).
    Name {
        name: String,
        rule: String,
        fixed: Option<IpAddr>,
    },
}

impl Route {
    /// The rule that allowed the route: an allow pattern or a CIDR.
    pub fn rule(&self) -> &str {
        match self {
            Route::Literal { rule, .. } | Route::Name { rule, .. } => rule,
        }
    }
}

/// An address that passed screening, with the CIDR that permitted it when
/// its class alone would have been refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub addr: IpAddr,
    pub via_cidr: Option<String>,
}

/// The network policy as the proxy applies it.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    policy: NetworkPolicy,
    hosts: BTreeMap<String, IpAddr>,
}

/// How many allow rules a "not allowed" refusal lists.
const LISTED_RULES: usize = 8;

impl Rules {
    /// Wraps `policy`, keying its static host entries by normalised name.
    pub fn new(policy: NetworkPolicy) -> Rules {
        let mut hosts = BTreeMap::new();
        for (name, addr) in &policy.hosts {
            if let Some(name) = normalize_host(name) {
                hosts.entry(name).or_insert(*addr);
            }
        }
        Rules { policy, hosts }
    }

    /// The policy.
    pub fn policy(&self) -> &NetworkPolicy {
        &self.policy
    }

    /// Decides on a requested host and port.
    pub fn route(&self, host: &Host, port: u16) -> Result<Route, Refusal> {
        let name = match host {
            Host::Ip(addr) => return self.route_literal(*addr, port),
            Host::Name(name) => name,
        };
        match self.policy.decide_name(name, port) {
            NameDecision::Allowed(rule) => Ok(Route::Name {
                name: name.clone(),
                rule,
                fixed: self.hosts.get(name).copied(),
            }),
            NameDecision::Denied(pattern) => Err(Refusal {
                reason: format!("deny_domains rule {pattern} matches {name}"),
                rule: Some(pattern),
                ..Refusal::new(code::DENIED_DOMAIN, "")
            }),
            NameDecision::NotAllowed => Err(Refusal::new(
                code::DENIED_NOT_ALLOWED,
                format!(
                    "no allow_domains rule matches {name} ({})",
                    self.allowed_list()
                ),
            )),
            NameDecision::PortNotAllowed(ports) => {
                let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
                Err(Refusal::new(
                    code::DENIED_PORT,
                    format!(
                        "port {port} is not allowed for {name} (allowed ports: {})",
                        ports.join(",")
                    ),
                ))
            }
        }
    }

    /// An IP literal: allowed only through a CIDR covering it and the
    /// port.
    fn route_literal(&self, addr: IpAddr, port: u16) -> Result<Route, Refusal> {
        let other_ports = self.policy.cidr_ports(addr);
        match self.policy.cidr_allowing(addr, port) {
            Some(cidr) => Ok(Route::Literal {
                addr,
                rule: cidr.to_string(),
            }),
            None if !other_ports.is_empty() => {
                let ports: Vec<String> = other_ports.iter().map(u16::to_string).collect();
                Err(Refusal {
                    address: Some(addr),
                    ..Refusal::new(
                        code::DENIED_PORT,
                        format!(
                            "port {port} is not allowed for {addr} (allow_cidrs ports: {})",
                            ports.join(",")
                        ),
                    )
                })
            }
            None => Err(Refusal {
                address: Some(addr),
                ..Refusal::new(
                    code::DENIED_IP_LITERAL,
                    format!(
                        "{} is an IP address ({}); IP targets need an allow_cidrs entry covering it",
                        addr,
                        describe(addr)
                    ),
                )
            }),
        }
    }

    /// The addresses of `name` that may be dialled on `port`, in the
    /// order given; refused with [`code::DENIED_ADDRESS`] when there is
    /// none. An allowed CIDR with a port list admits an address of a
    /// refused class only on those ports.
    pub fn screen(
        &self,
        name: &str,
        addrs: &[IpAddr],
        port: u16,
    ) -> Result<Vec<Candidate>, Refusal> {
        let mut ok = Vec::new();
        for &addr in addrs {
            if let Some(cidr) = self.policy.cidr_allowing(addr, port) {
                ok.push(Candidate {
                    addr,
                    via_cidr: Some(cidr.to_string()),
                });
            } else if denied_class(addr).is_none() {
                ok.push(Candidate {
                    addr,
                    via_cidr: None,
                });
            }
        }
        if !ok.is_empty() {
            return Ok(ok);
        }
        let listed: Vec<String> = addrs
            .iter()
            .take(4)
            .map(|a| format!("{a} ({})", describe(*a)))
            .collect();
        let more = addrs.len().saturating_sub(listed.len());
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        let ports = addrs
            .first()
            .map(|a| self.policy.cidr_ports(*a))
            .unwrap_or_default();
        let hint = if ports.is_empty() {
            "an allow_cidrs entry covering the address would permit it".to_string()
        } else {
            let ports: Vec<String> = ports.iter().map(u16::to_string).collect();
            format!(
                "allow_cidrs covers it on port {} only, not {port}",
                ports.join(",")
            )
        };
        Err(Refusal {
            address: addrs.first().copied(),
            ..Refusal::new(
                code::DENIED_ADDRESS,
                format!(
                    "{name} resolves only to refused addresses: {}{more}; {hint}",
                    listed.join(", ")
                ),
            )
        })
    }

    /// The allow rules, for the "not allowed" message (so an agent sees
    /// what it may reach).
    fn allowed_list(&self) -> String {
        let rules = &self.policy.allow_domains;
        if rules.is_empty() {
            return "no domain is allowed".to_string();
        }
        let listed: Vec<String> = rules
            .iter()
            .take(LISTED_RULES)
            .map(|r| r.to_string())
            .collect();
        let more = rules.len().saturating_sub(LISTED_RULES);
        if more > 0 {
            format!("allowed: {} and {more} more", listed.join(", "))
        } else {
            format!("allowed: {}", listed.join(", "))
        }
    }
}

/// `loopback`, `nat64, carries 10.0.0.1: private`, or `public`.
fn describe(addr: IpAddr) -> String {
    let class = match denied_class(addr) {
        Some(class) => class,
        None => return "public".to_string(),
    };
    let inner = match addr {
        IpAddr::V6(v6) => embedded_ipv4(v6),
        IpAddr::V4(_) => None,
    };
    match inner {
        Some(v4) => {
            let inner_class = denied_class(IpAddr::V4(v4)).unwrap_or("public");
            format!("{class}, carries {v4}: {inner_class}")
        }
        None => class.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use corral_policy::{Cidr, DomainRule, NetworkMode};

    fn rules(allow: &[&str], deny: &[&str], cidrs: &[&str]) -> Rules {
        let mut policy = NetworkPolicy {
            mode: NetworkMode::Allow,
            allow_domains: allow
                .iter()
                .map(|r| DomainRule::parse(r).unwrap())
                .collect(),
            deny_domains: deny.iter().map(|r| DomainRule::parse(r).unwrap()).collect(),
            allow_cidrs: cidrs.iter().map(|c| Cidr::parse(c).unwrap()).collect(),
            ..NetworkPolicy::default()
        };
        policy
            .hosts
            .insert("Static.Test".into(), "127.0.0.1".parse().unwrap());
        Rules::new(policy)
    }

    fn name(n: &str) -> Host {
        Host::Name(n.into())
    }

    fn ip(a: &str) -> IpAddr {
        a.parse().unwrap()
    }

    #[test]
    fn cidr_port_lists_bound_literals_and_refused_classes() {
        let r = rules(&["svc.test:8765,8766"], &[], &["127.0.0.1/32:8765"]);
        assert!(matches!(
            r.route(&Host::Ip(ip("127.0.0.1")), 8765),
            Ok(Route::Literal { .. })
        ));
        let e = r.route(&Host::Ip(ip("127.0.0.1")), 8766).unwrap_err();
        assert_eq!(e.code, code::DENIED_PORT);
        assert!(e.reason.contains("allow_cidrs ports: 8765"), "{}", e.reason);
        // A name allowed on both ports reaches loopback only on the
        // CIDR's port.
        assert_eq!(
            r.screen("svc.test", &[ip("127.0.0.1")], 8765)
                .unwrap()
                .len(),
            1
        );
        let e = r.screen("svc.test", &[ip("127.0.0.1")], 8766).unwrap_err();
        assert_eq!(e.code, code::DENIED_ADDRESS);
        assert!(
            e.reason.contains("on port 8765 only, not 8766"),
            "{}",
            e.reason
        );
    }

    #[test]
    fn names() {
        let r = rules(&["pypi.org", "*.static.test:8080"], &["evil.pypi.org"], &[]);
        assert_eq!(
            r.route(&name("pypi.org"), 443),
            Ok(Route::Name {
                name: "pypi.org".into(),
                rule: "pypi.org:80,443".into(),
                fixed: None
            })
        );
        let refused = r.route(&name("example.org"), 443).unwrap_err();
        assert_eq!(refused.code, code::DENIED_NOT_ALLOWED);
        assert_eq!(
            refused.reason,
            "no allow_domains rule matches example.org (allowed: pypi.org:80,443, *.static.test:8080)"
        );
        let port = r.route(&name("pypi.org"), 22).unwrap_err();
        assert_eq!(port.code, code::DENIED_PORT);
        assert!(
            port.reason.contains("allowed ports: 80,443"),
            "{}",
            port.reason
        );
        let r = rules(&["*.pypi.org", "static.test"], &["evil.pypi.org"], &[]);
        let denied = r.route(&name("evil.pypi.org"), 443).unwrap_err();
        assert_eq!(denied.code, code::DENIED_DOMAIN);
        assert_eq!(denied.rule.as_deref(), Some("evil.pypi.org"));
        match r.route(&name("static.test"), 80) {
            Ok(Route::Name { fixed, .. }) => assert_eq!(fixed, Some(ip("127.0.0.1"))),
            other => panic!("{other:?}"),
        }
        assert!(rules(&[], &[], &[])
            .route(&name("a.test"), 80)
            .unwrap_err()
            .reason
            .contains("no domain is allowed"));
    }

    #[test]
    fn literals_need_a_cidr() {
        let r = rules(&[], &[], &["127.0.0.1/32", "fd00::/8"]);
        assert_eq!(
            r.route(&Host::Ip(ip("127.0.0.1")), 9),
            Ok(Route::Literal {
                addr: ip("127.0.0.1"),
                rule: "127.0.0.1/32".into()
            })
        );
        assert!(r.route(&Host::Ip(ip("fd00::5")), 9).is_ok());
        for refused in ["127.0.0.2", "::ffff:127.0.0.1", "::1", "93.184.216.34"] {
            let e = r.route(&Host::Ip(ip(refused)), 9).unwrap_err();
            assert_eq!(e.code, code::DENIED_IP_LITERAL, "{refused}");
            assert_eq!(e.address, Some(ip(refused)));
        }
        let mapped = r.route(&Host::Ip(ip("::ffff:127.0.0.1")), 9).unwrap_err();
        assert!(
            mapped
                .reason
                .contains("ipv4_mapped, carries 127.0.0.1: loopback"),
            "{}",
            mapped.reason
        );
    }

    #[test]
    fn screening() {
        let r = rules(&[], &[], &[]);
        let e = r
            .screen("a.test", &[ip("127.0.0.1"), ip("169.254.169.254")], 80)
            .unwrap_err();
        assert_eq!(e.code, code::DENIED_ADDRESS);
        assert_eq!(e.address, Some(ip("127.0.0.1")));
        assert!(
            e.reason
                .contains("127.0.0.1 (loopback), 169.254.169.254 (link_local)"),
            "{}",
            e.reason
        );
        let e = r.screen("a.test", &[ip("64:ff9b::a00:1")], 80).unwrap_err();
        assert!(
            e.reason.contains("nat64, carries 10.0.0.1: private"),
            "{}",
            e.reason
        );
        // The public address survives; the private one is skipped.
        let ok = r
            .screen("a.test", &[ip("10.0.0.1"), ip("93.184.216.34")], 80)
            .unwrap();
        assert_eq!(
            ok,
            [Candidate {
                addr: ip("93.184.216.34"),
                via_cidr: None
            }]
        );
        let r = rules(&[], &[], &["10.0.0.0/8"]);
        let ok = r
            .screen("a.test", &[ip("10.0.0.1"), ip("::ffff:10.0.0.1")], 80)
            .unwrap();
        assert_eq!(
            ok,
            [Candidate {
                addr: ip("10.0.0.1"),
                via_cidr: Some("10.0.0.0/8".into())
            }]
        );
        assert_eq!(
            r.screen("a.test", &[], 80).unwrap_err().code,
            code::DENIED_ADDRESS
        );
    }
}

//! Which IP addresses the proxy refuses to dial unless an `allow_cidrs`
//! entry covers them.
//!
//! A sandbox that may reach `pypi.org` must not reach the host's own
//! services, the cloud metadata endpoint or the LAN through a name that
//! resolves (or is made to resolve) to them. Every address the proxy would
//! dial, whether it came from DNS, a static host entry or an IP literal, is
//! classified here. The function is pure so every range is unit-tested.
//!
//! IPv6 forms that carry an IPv4 address are judged by that address too:
//! IPv4-mapped and IPv4-compatible addresses are always refused (the kernel
//! would dial the embedded IPv4 address directly), NAT64 and 6to4 are
//! refused when the IPv4 address they carry is refused, and Teredo is
//! always refused (its client address is obfuscated and its server is an
//! arbitrary relay).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The class of an address the proxy refuses to dial (for example
/// `"loopback"`, `"private"`, `"link_local"` — which includes the cloud
/// metadata endpoint 169.254.169.254 — or `"ipv4_mapped"`), or `None` for a
/// public unicast address.
///
/// Why: the class is what the audit event and the 403 body name, so an
/// operator can tell which `allow_cidrs` entry would permit the address.
pub fn denied_class(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(v4) => denied_v4(v4),
        IpAddr::V6(v6) => denied_v6(v6),
    }
}

/// The IPv4 address carried inside an IPv6 address (mapped, compatible,
/// NAT64 well-known prefix or 6to4), if any.
///
/// Why: refusal messages name it ("64:ff9b::a00:1 carries 10.0.0.1"), so
/// the reader sees what the kernel or a translator would really dial.
pub fn embedded_ipv4(addr: Ipv6Addr) -> Option<Ipv4Addr> {
    let bits = u128::from(addr);
    let low32 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    if bits >> 32 == 0xffff {
        return Some(low32); // ::ffff:a.b.c.d
    }
    if bits >> 32 == 0 && bits > 1 {
        return Some(low32); // ::a.b.c.d (deprecated IPv4-compatible)
    }
    if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
        return Some(low32); // 64:ff9b::/96
    }
    if bits >> 112 == 0x2002 {
        return Some(Ipv4Addr::from(((bits >> 80) & 0xffff_ffff) as u32)); // 2002:AABB:CCDD::/48
    }
    None
}

/// Whether `addr` lies in `net`/`prefix`.
fn in_v4(addr: Ipv4Addr, net: [u8; 4], prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    u32::from(addr) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

/// The refused class of an IPv4 address, first matching range wins.
fn denied_v4(a: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 32, "unspecified"),
        ([0, 0, 0, 0], 8, "this_network"),
        ([10, 0, 0, 0], 8, "private"),
        ([100, 64, 0, 0], 10, "cgnat"),
        ([127, 0, 0, 0], 8, "loopback"),
        ([169, 254, 0, 0], 16, "link_local"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 0, 0, 0], 24, "reserved"),
        ([192, 0, 2, 0], 24, "documentation"),
        ([192, 88, 99, 0], 24, "reserved"),
        ([192, 168, 0, 0], 16, "private"),
        ([198, 18, 0, 0], 15, "benchmarking"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([255, 255, 255, 255], 32, "broadcast"),
        ([240, 0, 0, 0], 4, "reserved"),
    ];
    RANGES
        .iter()
        .find(|(net, prefix, _)| in_v4(a, *net, *prefix))
        .map(|(_, _, class)| *class)
}

/// Whether `addr` lies in `net`/`prefix`.
fn in_v6(addr: Ipv6Addr, net: u128, prefix: u32) -> bool {
    let mask = if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - prefix)
    };
    u128::from(addr) & mask == net & mask
}

/// The refused class of an IPv6 address, embedded IPv4 included.
fn denied_v6(a: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(a);
    if bits == 0 {
        return Some("unspecified");
    }
    if bits == 1 {
        return Some("loopback");
    }
    if bits >> 32 == 0xffff {
        return Some("ipv4_mapped");
    }
    if bits >> 32 == 0 {
        return Some("ipv4_compatible");
    }
    if in_v6(a, 0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96) {
        // NAT64 well-known prefix: as good as the IPv4 address it carries.
        return embedded_ipv4(a).and_then(denied_v4).map(|_| "nat64");
    }
    if in_v6(a, 0x0064_ff9b_0001_0000_0000_0000_0000_0000, 48) {
        return Some("nat64"); // local-use NAT64 (RFC 8215): site-specific
    }
    if in_v6(a, 0x0100_0000_0000_0000_0000_0000_0000_0000, 64) {
        return Some("discard");
    }
    if !in_v6(a, 0x2000_0000_0000_0000_0000_0000_0000_0000, 3) {
        // Outside global unicast: everything here is local or unassigned.
        const LOCAL: &[(u128, u32, &str)] = &[
            (0xff00 << 112, 8, "multicast"),
            (0xfe80 << 112, 10, "link_local"),
            (0xfec0 << 112, 10, "site_local"),
            (0xfc00 << 112, 7, "ula"),
        ];
        let class = LOCAL
            .iter()
            .find(|(net, prefix, _)| in_v6(a, *net, *prefix))
            .map_or("reserved", |(_, _, class)| *class);
        return Some(class);
    }
    const GLOBAL: &[(u128, u32, &str)] = &[
        (0x2001_0000 << 96, 32, "teredo"),
        (0x2001_0002 << 96, 48, "benchmarking"),
        (0x2001_0000 << 96, 23, "reserved"),
        (0x2001_0db8 << 96, 32, "documentation"),
        (0x3fff << 112, 20, "documentation"),
        (0x5f00 << 112, 16, "reserved"),
    ];
    if let Some((_, _, class)) = GLOBAL
        .iter()
        .find(|(net, prefix, _)| in_v6(a, *net, *prefix))
    {
        return Some(class);
    }
    if in_v6(a, 0x2002 << 112, 16) {
        // 6to4: as good as the IPv4 address it carries.
        return embedded_ipv4(a).and_then(denied_v4).map(|_| "6to4");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(text: &str) -> Option<&'static str> {
        denied_class(text.parse().unwrap())
    }

    #[test]
    fn ipv4_ranges() {
        let cases = [
            ("0.0.0.0", Some("unspecified")),
            ("0.1.2.3", Some("this_network")),
            ("10.0.0.1", Some("private")),
            ("10.255.255.255", Some("private")),
            ("172.16.0.1", Some("private")),
            ("172.31.255.254", Some("private")),
            ("172.32.0.1", None),
            ("192.168.1.1", Some("private")),
            ("100.64.0.1", Some("cgnat")),
            ("100.127.255.254", Some("cgnat")),
            ("100.128.0.1", None),
            ("127.0.0.1", Some("loopback")),
            ("127.255.0.9", Some("loopback")),
            ("169.254.169.254", Some("link_local")),
            ("169.254.0.1", Some("link_local")),
            ("192.0.0.8", Some("reserved")),
            ("192.0.2.1", Some("documentation")),
            ("198.51.100.7", Some("documentation")),
            ("203.0.113.9", Some("documentation")),
            ("192.88.99.1", Some("reserved")),
            ("198.18.0.1", Some("benchmarking")),
            ("198.19.255.255", Some("benchmarking")),
            ("224.0.0.1", Some("multicast")),
            ("239.255.255.250", Some("multicast")),
            ("240.0.0.1", Some("reserved")),
            ("255.255.255.254", Some("reserved")),
            ("255.255.255.255", Some("broadcast")),
            // Public-looking; only parsed here, never contacted.
            ("93.184.216.34", None),
            ("1.1.1.1", None),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), want, "{addr}");
        }
    }

    #[test]
    fn ipv6_ranges() {
        let cases = [
            ("::", Some("unspecified")),
            ("::1", Some("loopback")),
            ("::ffff:10.0.0.1", Some("ipv4_mapped")),
            ("::ffff:127.0.0.1", Some("ipv4_mapped")),
            ("::ffff:93.184.216.34", Some("ipv4_mapped")),
            ("::10.0.0.1", Some("ipv4_compatible")),
            ("::93.184.216.34", Some("ipv4_compatible")),
            ("64:ff9b::a00:1", Some("nat64")),
            ("64:ff9b::a9fe:a9fe", Some("nat64")),
            ("64:ff9b::7f00:1", Some("nat64")),
            ("64:ff9b::5db8:d822", None),
            ("64:ff9b:1::1", Some("nat64")),
            ("2002:a00:1::", Some("6to4")),
            ("2002:7f00:1::1", Some("6to4")),
            ("2002:a9fe:a9fe::", Some("6to4")),
            ("2002:5db8:d822::1", None),
            ("2001::1", Some("teredo")),
            ("2001:0:4136:e378::1", Some("teredo")),
            ("2001:2::1", Some("benchmarking")),
            ("2001:10::1", Some("reserved")),
            ("2001:db8::1", Some("documentation")),
            ("3fff::1", Some("documentation")),
            ("5f00::1", Some("reserved")),
            ("100::1", Some("discard")),
            ("fe80::1", Some("link_local")),
            ("febf::1", Some("link_local")),
            ("fec0::1", Some("site_local")),
            ("fc00::1", Some("ula")),
            ("fd12:3456::1", Some("ula")),
            ("ff02::1", Some("multicast")),
            ("ff05::2", Some("multicast")),
            ("::2:0:0:1", Some("reserved")),
            ("4000::1", Some("reserved")),
            ("2606:2800:220:1:248:1893:25c8:1946", None),
            ("2a00:1450::1", None),
        ];
        for (addr, want) in cases {
            assert_eq!(class(addr), want, "{addr}");
        }
    }

    #[test]
    fn embedded_addresses() {
        let v6 = |t: &str| t.parse::<Ipv6Addr>().unwrap();
        let v4 = |t: &str| Some(t.parse::<Ipv4Addr>().unwrap());
        assert_eq!(embedded_ipv4(v6("::ffff:10.0.0.1")), v4("10.0.0.1"));
        assert_eq!(embedded_ipv4(v6("::10.0.0.1")), v4("10.0.0.1"));
        assert_eq!(embedded_ipv4(v6("64:ff9b::a00:1")), v4("10.0.0.1"));
        assert_eq!(embedded_ipv4(v6("2002:a00:1::")), v4("10.0.0.1"));
        assert_eq!(embedded_ipv4(v6("::1")), None);
        assert_eq!(embedded_ipv4(v6("fe80::1")), None);
    }
}

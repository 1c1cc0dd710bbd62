#![no_main]
//! The policy's value parsers: byte sizes, CIDRs, domain rules, host names
//! and the limit range checks, each with a round trip where one exists.

use corral_policy::network::normalize_host;
use corral_policy::{ByteSize, Cidr, DomainRule, RunLimit};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Limit checks: the first byte picks the limit, the next eight are the
    // value.
    if let (Some(&pick), Some(value)) = (data.first(), data.get(1..9)) {
        let limit = RunLimit::ALL[usize::from(pick) % RunLimit::ALL.len()];
        let value = u64::from_le_bytes(value.try_into().expect("eight bytes"));
        match limit.check(value) {
            Ok(v) => assert!(v == value && v >= limit.minimum() && v <= limit.maximum()),
            Err(e) => {
                assert!(value < limit.minimum() || value > limit.maximum());
                let _ = e.to_string();
            }
        }
    }
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(size) = ByteSize::parse(text) {
        let shown = size.to_string();
        assert_eq!(
            ByteSize::parse(&shown),
            Ok(size),
            "size {shown} does not round-trip"
        );
    }
    if let Ok(cidr) = Cidr::parse(text) {
        let shown = cidr.to_string();
        assert_eq!(
            Cidr::parse(&shown),
            Ok(cidr.clone()),
            "cidr {shown} does not round-trip"
        );
        assert!(cidr.contains(cidr.addr));
        for &port in &cidr.ports {
            assert!(cidr.allows(cidr.addr, port));
        }
    }
    if let Ok(rule) = DomainRule::parse(text) {
        let shown = rule.to_string();
        assert_eq!(
            DomainRule::parse(&shown),
            Ok(rule.clone()),
            "rule {shown} does not round-trip"
        );
        let host = rule.pattern.strip_prefix("*.").unwrap_or(&rule.pattern);
        let _ = rule.matches_host(host);
    }
    if let Some(host) = normalize_host(text) {
        assert_eq!(normalize_host(&host).as_deref(), Some(host.as_str()));
    }
});

//! Which sources the C library consults when the proxy looks a name up:
//! the `files` and `dns` of the host's `/etc/nsswitch.conf`, in its order,
//! and nothing else.
//!
//! corral is a static glibc program (`.cargo/config.toml`). glibc has
//! `files` (`/etc/hosts`) and `dns` (`/etc/resolv.conf`) built in, and
//! loads any other source of the `hosts:` line (`mdns4_minimal`,
//! `resolve`, `myhostname`, `mymachines`, LDAP, …) with `dlopen`: in a
//! static program that maps a second, shared C library into corral (the
//! linker's warning for `getaddrinfo` in static programs says as much).
//! So the proxy fixes the line to its
//! built-in sources before its first lookup. What the other sources
//! would answer is, for an egress proxy, almost always refused anyway:
//! mDNS names, the machine's own names and container names are local or
//! private addresses, which the proxy's screening denies.

use std::ffi::CString;
use std::sync::OnceLock;

/// The host's name-service configuration.
const NSSWITCH: &str = "/etc/nsswitch.conf";

/// What glibc uses when nsswitch.conf has no `hosts:` line, and what the
/// proxy uses when the line names neither built-in source.
const DEFAULT_SOURCES: &str = "files dns";

/// The `hosts:` sources of nsswitch.conf(5) text that glibc has built in,
/// in their order, as one line (`files dns`, `dns files`, …). Everything
/// else on the line (other sources, `[NOTFOUND=return]` actions) is
/// dropped: an action belongs to the source before it, which may be gone.
pub(crate) fn builtin_sources(nsswitch: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    for line in nsswitch.lines() {
        let line = line.split('#').next().unwrap_or_default();
        let Some(rest) = line.trim_start().strip_prefix("hosts:") else {
            continue;
        };
        for word in rest.split_whitespace() {
            if (word == "files" || word == "dns") && !kept.contains(&word) {
                kept.push(word);
            }
        }
        // The first `hosts:` line is the one glibc's lookups find.
        break;
    }
    if kept.is_empty() {
        DEFAULT_SOURCES.to_string()
    } else {
        kept.join(" ")
    }
}

/// Fixes the C library's host lookups to the built-in sources, once per
/// process, before the first lookup. Every lookup of the proxy calls it
/// first; the error (the same for every later call) refuses the lookup,
/// so a corral that could not fix its sources never loads another.
pub(crate) fn ensure_builtin_sources() -> Result<(), String> {
    static FIXED: OnceLock<Result<(), String>> = OnceLock::new();
    FIXED
        .get_or_init(|| {
            let text = std::fs::read_to_string(NSSWITCH).unwrap_or_default();
            let line = builtin_sources(&text);
            let sources = CString::new(line.clone()).map_err(|e| e.to_string())?;
            corral_sys::net::use_host_sources(&sources).map_err(|e| {
                format!("the C library refused to limit host lookups to `{line}`: {e}")
            })
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_built_in_sources_in_the_hosts_order() {
        let debian = "passwd: files\nhosts:          files mdns4_minimal [NOTFOUND=return] dns myhostname\nnetworks: files\n";
        assert_eq!(builtin_sources(debian), "files dns");
        let resolved = "hosts: mymachines resolve [!UNAVAIL=return] files myhostname dns";
        assert_eq!(builtin_sources(resolved), "files dns");
        assert_eq!(
            builtin_sources("hosts: dns [!UNAVAIL=return] files"),
            "dns files"
        );
        assert_eq!(builtin_sources("hosts: dns"), "dns");
    }

    #[test]
    fn falls_back_to_files_then_dns() {
        assert_eq!(builtin_sources(""), "files dns");
        assert_eq!(builtin_sources("passwd: files\n"), "files dns");
        assert_eq!(builtin_sources("hosts: ldap myhostname"), "files dns");
        // A commented line is not a line; the first real one counts.
        assert_eq!(builtin_sources("#hosts: dns\n"), "files dns");
        assert_eq!(builtin_sources("hosts: files # dns\nhosts: dns\n"), "files");
        // `hostsfoo:` is another database.
        assert_eq!(builtin_sources("hostsfoo: dns"), "files dns");
    }

    #[test]
    fn fixing_the_sources_succeeds_and_sticks() {
        assert_eq!(ensure_builtin_sources(), Ok(()));
        assert_eq!(ensure_builtin_sources(), Ok(()));
    }
}

//! Which sources the C library consults when the proxy looks a name up:
//! the `files` and `dns` of the host's `/etc/nsswitch.conf`, in its order
//! and with their actions, and nothing else.
//!
//! corral is a static glibc program (`.cargo/config.toml`). glibc has
//! `files` (`/etc/hosts`) and `dns` (`/etc/resolv.conf`) built in, and
//! loads any other source of the `hosts:` line (`mdns4_minimal`,
//! `resolve`, `myhostname`, `mymachines`, LDAP, …) with `dlopen`: in a
//! static program that maps a second, shared C library into corral (the
//! linker's warning for `getaddrinfo` in static programs says as much).
//! So the proxy fixes the line to its built-in sources before its first
//! lookup. systemd's `resolve` becomes `dns`, without its actions (where
//! it is used, resolv.conf normally names its stub, 127.0.0.53); what the other
//! sources would answer is, for an egress proxy, almost always refused
//! anyway: mDNS names, the machine's own names and container names are
//! local or private addresses, which the proxy's screening denies.
//!
//! The proxy is the only user of the C library's name service in corral
//! (no `getpw*`, `getgr*` or other `getaddrinfo`): a new one would have to
//! come after [`ensure_builtin_sources`], which glibc documents no locking
//! for.

use std::ffi::CString;
use std::sync::OnceLock;

/// The host's name-service configuration.
const NSSWITCH: &str = "/etc/nsswitch.conf";

/// glibc's own `hosts` line when nsswitch.conf (or its `hosts:` line) is
/// missing, and what the proxy uses when the line names no source it can
/// keep.
const DEFAULT_SOURCES: &str = "dns [!UNAVAIL=return] files";

/// The words of an nsswitch.conf(5) service line: sources, and actions in
/// brackets (which may hold spaces: `[NOTFOUND=return TRYAGAIN=continue]`).
fn words(line: &str) -> Vec<&str> {
    let mut words = Vec::new();
    let mut rest = line.trim_start();
    while !rest.is_empty() {
        let end = if rest.starts_with('[') {
            rest.find(']').map_or(rest.len(), |i| i + 1)
        } else {
            rest.find(|c: char| c.is_whitespace() || c == '[')
                .unwrap_or(rest.len())
        };
        words.push(&rest[..end]);
        rest = rest[end..].trim_start();
    }
    words
}

/// The `hosts:` line of nsswitch.conf(5) text cut down to the sources
/// glibc has built in: `files` and `dns`, in their order, each with the
/// actions that follow it; other sources and their actions are dropped.
/// `resolve` counts as `dns` but without its actions: its usual
/// `[!UNAVAIL=return]` relies on systemd-resolved answering from
/// /etc/hosts itself, and would keep a later `files` from ever being
/// asked. glibc reads the last `hosts:` line; without one, or when
/// nothing is left of it, its default.
pub(crate) fn builtin_sources(nsswitch: &str) -> String {
    let mut line = None;
    for text in nsswitch.lines() {
        let text = text.split('#').next().unwrap_or_default();
        if let Some(rest) = text.trim_start().strip_prefix("hosts:") {
            line = Some(rest);
        }
    }
    let Some(line) = line else {
        return DEFAULT_SOURCES.to_string();
    };
    let mut kept: Vec<&str> = Vec::new();
    let mut keeping = false;
    for word in words(line) {
        if word.starts_with('[') {
            if keeping {
                kept.push(word);
            }
            continue;
        }
        let source = if word == "resolve" { "dns" } else { word };
        let keep = matches!(source, "files" | "dns") && !kept.contains(&source);
        if keep {
            kept.push(source);
        }
        keeping = keep && word != "resolve";
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
    fn keeps_the_built_in_sources_in_the_hosts_order_with_their_actions() {
        let debian = "passwd: files\nhosts:          files mdns4_minimal [NOTFOUND=return] dns myhostname\nnetworks: files\n";
        assert_eq!(builtin_sources(debian), "files dns");
        // Fedora and Arch: systemd-resolved's module stands for DNS.
        let resolved = "hosts: mymachines resolve [!UNAVAIL=return] files myhostname dns";
        assert_eq!(builtin_sources(resolved), "dns files");
        assert_eq!(
            builtin_sources("hosts: files [NOTFOUND=return] dns"),
            "files [NOTFOUND=return] dns"
        );
        assert_eq!(
            builtin_sources("hosts: dns[NOTFOUND=return TRYAGAIN=continue] files"),
            "dns [NOTFOUND=return TRYAGAIN=continue] files"
        );
        assert_eq!(builtin_sources("hosts: dns"), "dns");
        assert_eq!(builtin_sources("hosts: files resolve"), "files dns");
    }

    #[test]
    fn falls_back_to_glibcs_default() {
        assert_eq!(builtin_sources(""), DEFAULT_SOURCES);
        assert_eq!(builtin_sources("passwd: files\n"), DEFAULT_SOURCES);
        assert_eq!(builtin_sources("hosts: ldap myhostname"), DEFAULT_SOURCES);
        // A commented line is not a line; the last real one counts.
        assert_eq!(builtin_sources("#hosts: dns\n"), DEFAULT_SOURCES);
        assert_eq!(builtin_sources("hosts: dns\nhosts: files # dns\n"), "files");
        // `hostsfoo:` is another database.
        assert_eq!(builtin_sources("hostsfoo: dns"), DEFAULT_SOURCES);
    }

    #[test]
    fn a_line_of_kept_sources_comes_back_unchanged() {
        for line in [
            "files dns",
            DEFAULT_SOURCES,
            "files [NOTFOUND=return] dns",
            "dns [NOTFOUND=return TRYAGAIN=continue] files",
        ] {
            assert_eq!(builtin_sources(&format!("hosts: {line}")), line);
        }
    }

    #[test]
    fn fixing_the_sources_succeeds_and_sticks() {
        assert_eq!(ensure_builtin_sources(), Ok(()));
        assert_eq!(ensure_builtin_sources(), Ok(()));
    }
}

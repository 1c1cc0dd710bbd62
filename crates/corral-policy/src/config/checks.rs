//! Rules that look past one field: mount destinations against each other
//! and the reserved ones, env names against the blocklist, and the checks
//! of a profile merged with what it inherits (fine alone, a rule can
//! conflict with an inherited one).

use std::ops::Range;

use toml::Spanned;

use super::{ConfigError, Source};
use crate::env::{validate_name, Blocklist};
use crate::path::{MountSpec, SandboxPath};
use crate::profile::Profile;

/// Checks the profile as merged with what it inherits: rules that are
/// fine alone can conflict with inherited ones.
pub(super) fn check_merged(
    src: &Source,
    key: &str,
    span: Range<usize>,
    p: &Profile,
) -> Result<(), ConfigError> {
    let err = |field: &str, message: String| {
        Err(src.err(Some(span.clone()), format!("{key}.{field}"), message))
    };
    for path in &p.filesystem.system {
        if let Some(why) = reserved_destination(path) {
            return err("filesystem.system", format!("cannot bind `{path}`: {why}"));
        }
    }
    let explicit: Vec<&MountSpec> = p
        .filesystem
        .read_only
        .iter()
        .chain(&p.filesystem.read_write)
        .collect();
    for (i, m) in explicit.iter().enumerate() {
        if explicit[..i].iter().any(|o| o.dest == m.dest) {
            return err("filesystem", format!("`{}` is mounted twice (read_only/read_write, inherited or not); mount each destination once", m.dest));
        }
        if p.filesystem.deny.contains(&m.dest) {
            return err(
                "filesystem",
                format!(
                    "`{}` is both mounted and denied; remove one of the two rules",
                    m.dest
                ),
            );
        }
    }
    let l = &p.limits;
    if let Some(kill) = l.output_kill_bytes.filter(|k| *k < l.output_bytes) {
        return err(
            "limits.output_kill",
            format!(
                "{kill} (possibly inherited) is below limits.output ({}); the kill ceiling must be at least what is kept",
                l.output_bytes
            ),
        );
    }
    let n = &p.network;
    if n.mode != crate::network::NetworkMode::Allow
        && (!n.allow_domains.is_empty() || !n.allow_cidrs.is_empty())
    {
        return err(
            "network.mode",
            "allow_domains and allow_cidrs only apply with mode = \"allow\"; set it, or remove the rules".into(),
        );
    }
    if n.mode != crate::network::NetworkMode::None
        && p.security.seccomp == crate::profile::SeccompProfile::Strict
    {
        return err(
            "security.seccomp",
            "the strict seccomp profile allows only AF_UNIX sockets: it cannot be combined with a network mode other than none".into(),
        );
    }
    // Every value given in a file was checked where it was given; this
    // also holds inherited and built-in values to the same ranges.
    if let Err(e) = l.check() {
        return err(
            &format!("limits.{}", e.limit().key()),
            format!("{e} (possibly inherited)"),
        );
    }
    let blocklist = Blocklist::new(&p.env.block).map_err(|e| {
        src.err(
            Some(span.clone()),
            format!("{key}.env.block"),
            e.to_string(),
        )
    })?;
    for name in p.env.pass.iter().chain(p.env.set.keys()) {
        if let Some((rule, _)) = blocklist.matching(name) {
            return err("env", format!("`{name}` (passed or set, possibly inherited) is blocked by rule `{rule}`; remove one of the two"));
        }
    }
    Ok(())
}

/// Checks one env name of a `pass` or `set` list: well formed and not
/// blocked.
pub(super) fn check_env_name(
    src: &Source,
    key: &str,
    name: &Spanned<String>,
    blocklist: &Blocklist,
) -> Result<(), ConfigError> {
    validate_name(name.get_ref()).map_err(|e| src.err(Some(name.span()), key, e.to_string()))?;
    if let Some((rule, why)) = blocklist.matching(name.get_ref()) {
        return Err(src.err(
            Some(name.span()),
            key,
            format!(
                "`{}` is always blocked (rule `{rule}`: {why}); remove it",
                name.get_ref()
            ),
        ));
    }
    Ok(())
}

/// Checks the mount destinations one filesystem table gives (`dests`:
/// destination, span, field): none reserved, none mounted twice, none also
/// in the table's `deny`. `k` is the table's dotted key.
pub(super) fn check_mounts(
    src: &Source,
    k: &str,
    dests: &[(SandboxPath, Range<usize>, &str)],
    denied: &[SandboxPath],
) -> Result<(), ConfigError> {
    for (i, (dest, span, field)) in dests.iter().enumerate() {
        let key = format!("{k}.{field}");
        if let Some(why) = reserved_destination(dest) {
            return Err(src.err(
                Some(span.clone()),
                key,
                format!("cannot mount at `{dest}`: {why}"),
            ));
        }
        if let Some((_, _, other)) = dests[..i].iter().find(|(d, _, _)| d == dest) {
            return Err(src.err(
                Some(span.clone()),
                key,
                format!(
                    "`{dest}` is also mounted by filesystem.{other}; mount each destination once"
                ),
            ));
        }
        if let Some(deny) = denied.iter().find(|d| *d == dest) {
            return Err(src.err(
                Some(span.clone()),
                key,
                format!("`{deny}` is both mounted and denied; remove one of the two rules"),
            ));
        }
    }
    Ok(())
}

/// Why a mount destination is not allowed, if it is not.
pub fn reserved_destination(dest: &SandboxPath) -> Option<&'static str> {
    const RESERVED: [&str; 3] = ["/proc", "/dev", "/tmp"];
    if dest.is_root() {
        return Some("the root is corral's own read-only tmpfs");
    }
    // `SandboxPath::starts_with` on the normalised constants, without
    // building a path for each (this runs for every mount of every run).
    let d = dest.as_str();
    for r in RESERVED {
        if d == r || (d.starts_with(r) && d.as_bytes().get(r.len()) == Some(&b'/')) {
            return Some("/proc, /dev and /tmp are set up by corral");
        }
    }
    if dest.as_str() == "/workspace" {
        return Some("/workspace is the workdir; use --workdir");
    }
    None
}

/// A hostname [`validate_hostname`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hostname `{hostname}` is invalid: use 1 to 63 letters, digits, `-` or `.`")]
pub struct HostnameError {
    /// The hostname as written.
    pub hostname: String,
}

/// Checks a hostname: 1 to 63 characters of letters, digits, `-` and `.`,
/// not starting with `-` (what `sethostname(2)` and resolvers accept
/// without surprises).
pub fn validate_hostname(h: &str) -> Result<(), HostnameError> {
    let ok = !h.is_empty()
        && h.len() <= 63
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !h.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(HostnameError {
            hostname: h.to_string(),
        })
    }
}

//! Lays a raw profile over the profile it extends, one section at a time.
//! Each section's function validates the fields the section gives and
//! leaves the others as inherited; rules spanning sections, or needing
//! what is inherited, are in [`super::checks`].

use std::collections::BTreeMap;
use std::ops::Range;

use toml::Spanned;

use super::checks::{check_env_name, check_mounts, validate_hostname};
use super::raw::{
    RawCommands, RawCount, RawEnv, RawFilesystem, RawIdentity, RawLimits, RawNetwork, RawProfile,
    RawSecurity, RawSize,
};
use super::{ConfigError, Source};
use crate::env::Blocklist;
use crate::limits::{RunLimit, MAX_BYTES, NO_LIMIT};
use crate::network::{NetworkError, NetworkPolicy};
use crate::path::{MountSpec, SandboxPath};
use crate::profile::{
    CommandPolicy, EnvPolicy, Filesystem, Identity, LandlockMode, Limits, Profile, SeccompProfile,
    Security,
};
use crate::protect::ProtectEntry;
use crate::size::ByteSize;

/// Applies a raw profile on top of `p`, validating every field. `key` is
/// the profile's dotted key (`profile.NAME`).
pub(super) fn apply(
    src: &Source,
    key: &str,
    mut p: Profile,
    raw: RawProfile,
) -> Result<Profile, ConfigError> {
    if let Some(d) = raw.description {
        p.description = d;
    }
    if let Some(h) = raw.hostname {
        let span = h.span();
        let h = h.into_inner();
        validate_hostname(&h)
            .map_err(|e| src.err(Some(span), format!("{key}.hostname"), e.to_string()))?;
        p.hostname = h;
    }
    let mut runtime = None;
    if let Some(mut fs) = raw.filesystem {
        runtime = fs.runtime.take();
        apply_filesystem(src, &format!("{key}.filesystem"), &mut p.filesystem, fs)?;
    }
    if let Some(env) = raw.env {
        apply_env(src, &format!("{key}.env"), &mut p.env, env)?;
    }
    if let Some(c) = raw.commands {
        apply_commands(src, &format!("{key}.commands"), &mut p.commands, c)?;
    }
    if let Some(l) = raw.limits {
        apply_limits(src, &format!("{key}.limits"), &mut p.limits, l)?;
    }
    if let Some(sec) = raw.security {
        apply_security(src, &format!("{key}.security"), &mut p.security, sec)?;
    }
    if let Some(net) = raw.network {
        apply_network(src, &format!("{key}.network"), &mut p.network, net)?;
    }
    if let Some(id) = raw.identity {
        apply_identity(src, &format!("{key}.identity"), &mut p.identity, id)?;
    }
    // Last: it adds to the binds, the search path and PATH set above.
    if let Some(tree) = runtime {
        let k = format!("{key}.filesystem.runtime");
        let span = tree.span();
        SandboxPath::new(tree.get_ref())
            .and_then(|t| p.set_runtime(t))
            .map_err(|e| src.err(Some(span), k, e.to_string()))?;
    }
    Ok(p)
}

/// `[profile.NAME.filesystem]`; `k` is the section's dotted key. Mount
/// destinations given here must not be reserved, mounted twice or denied
/// in this same table ([`check_mounts`]).
fn apply_filesystem(
    src: &Source,
    k: &str,
    f: &mut Filesystem,
    raw: RawFilesystem,
) -> Result<(), ConfigError> {
    // Spans of mount destinations, for conflict messages.
    let mut dests: Vec<(SandboxPath, Range<usize>, &str)> = Vec::new();
    let mut denied = Vec::new();
    if let Some(list) = raw.system {
        f.system = path_list(src, &format!("{k}.system"), list)?
            .into_iter()
            .map(|(p, _)| p)
            .collect();
    }
    if let Some(list) = raw.read_only {
        let parsed = mount_list(src, &format!("{k}.read_only"), list)?;
        dests.extend(
            parsed
                .iter()
                .map(|(m, s)| (m.dest.clone(), s.clone(), "read_only")),
        );
        f.read_only = parsed.into_iter().map(|(m, _)| m).collect();
    }
    if let Some(list) = raw.read_write {
        let parsed = mount_list(src, &format!("{k}.read_write"), list)?;
        dests.extend(
            parsed
                .iter()
                .map(|(m, s)| (m.dest.clone(), s.clone(), "read_write")),
        );
        f.read_write = parsed.into_iter().map(|(m, _)| m).collect();
    }
    if let Some(list) = raw.deny {
        let parsed = path_list(src, &format!("{k}.deny"), list)?;
        denied = parsed.iter().map(|(p, _)| p.clone()).collect();
        f.deny = parsed.into_iter().map(|(p, _)| p).collect();
    }
    if let Some(s) = raw.tmp_size {
        f.tmp_size = size(src, &format!("{k}.tmp_size"), s)?;
    }
    if let Some(s) = raw.workspace_size {
        f.workspace_size = size(src, &format!("{k}.workspace_size"), s)?;
    }
    if let Some(b) = raw.dev_pts {
        f.dev_pts = b;
    }
    if let Some(list) = raw.protect {
        let key = format!("{k}.protect");
        f.protect = list
            .into_iter()
            .map(|s| {
                ProtectEntry::parse(s.get_ref())
                    .map_err(|e| src.err(Some(s.span()), &key, e.to_string()))
            })
            .collect::<Result<_, _>>()?;
    }
    check_mounts(src, k, &dests, &denied)
}

/// `[profile.NAME.env]`: names are checked against the built-in blocklist
/// plus the effective `block` (this table's, else the inherited one).
fn apply_env(src: &Source, k: &str, e: &mut EnvPolicy, raw: RawEnv) -> Result<(), ConfigError> {
    let mut block = e.block.clone();
    if let Some(list) = raw.block {
        for pat in &list {
            if let Err(err) = Blocklist::new(std::slice::from_ref(pat.get_ref())) {
                return Err(src.err(Some(pat.span()), format!("{k}.block"), err.to_string()));
            }
        }
        block = strings(list);
    }
    let blocklist = Blocklist::new(&block)
        .map_err(|err| src.err(None, format!("{k}.block"), err.to_string()))?;
    if let Some(list) = raw.pass {
        for name in &list {
            check_env_name(src, &format!("{k}.pass"), name, &blocklist)?;
        }
        e.pass = strings(list);
    }
    if let Some(set) = raw.set {
        let mut out = BTreeMap::new();
        for (name, value) in set {
            let spanned = Spanned::new(value.span(), name.clone());
            check_env_name(src, &format!("{k}.set"), &spanned, &blocklist)?;
            if value.get_ref().contains('\0') {
                return Err(src.err(
                    Some(value.span()),
                    format!("{k}.set.{name}"),
                    "value contains a NUL byte",
                ));
            }
            out.insert(name, value.into_inner());
        }
        e.set = out;
    }
    e.block = block;
    Ok(())
}

/// `[profile.NAME.commands]`: `allow` holds bare names only, `deny_args`
/// valid globs, `search_path` absolute paths.
fn apply_commands(
    src: &Source,
    k: &str,
    c: &mut CommandPolicy,
    raw: RawCommands,
) -> Result<(), ConfigError> {
    if let Some(list) = raw.allow {
        for name in &list {
            let n = name.get_ref();
            if n.is_empty()
                || n.contains('/')
                || n.chars().any(char::is_control)
                || n == "."
                || n == ".."
            {
                return Err(src.err(Some(name.span()), format!("{k}.allow"), format!("`{n}` is not a bare command name; list names such as `python3`, and use allow_paths for paths")));
            }
        }
        c.allow = strings(list);
    }
    if let Some(b) = raw.allow_paths {
        c.allow_paths = b;
    }
    if let Some(list) = raw.deny_args {
        for rule in &list {
            if let Err(e) = crate::commands::compile_deny_args(std::slice::from_ref(rule.get_ref()))
            {
                return Err(src.err(Some(rule.span()), format!("{k}.deny_args"), e.to_string()));
            }
        }
        c.deny_args = strings(list);
    }
    if let Some(list) = raw.search_path {
        c.search_path = path_list(src, &format!("{k}.search_path"), list)?
            .into_iter()
            .map(|(p, _)| p)
            .collect();
    }
    if let Some(b) = raw.restrict_exec {
        c.restrict_exec = b;
    }
    Ok(())
}

/// `[profile.NAME.limits]`: each value given must lie in its
/// [`RunLimit`] range, the one `corral run` and `corral serve` check too.
fn apply_limits(src: &Source, k: &str, lim: &mut Limits, l: RawLimits) -> Result<(), ConfigError> {
    let check = |limit: RunLimit, value: u64, span: Range<usize>| {
        limit
            .check(value)
            .map_err(|e| src.err(Some(span), format!("{k}.{}", limit.key()), e.to_string()))
    };
    let count = |limit: RunLimit, v: Option<Spanned<u64>>| {
        v.map(|v| check(limit, *v.get_ref(), v.span())).transpose()
    };
    let bytes = |limit: RunLimit, v: Option<Spanned<RawSize>>| {
        v.map(|v| {
            let span = v.span();
            let size = parse_size(src, &format!("{k}.{}", limit.key()), v)?;
            check(limit, size.bytes(), span).map(ByteSize)
        })
        .transpose()
    };
    // `timeout_secs` and `output_kill` can be switched off with "none",
    // which also removes an inherited value.
    let off = |limit: RunLimit, span: Range<usize>, text: &str| {
        if text == NO_LIMIT {
            Ok(())
        } else {
            Err(src.err(
                Some(span),
                format!("{k}.{}", limit.key()),
                format!(
                    "`{text}` is not a value: {}, or \"{NO_LIMIT}\" for no limit",
                    limit.range_hint()
                ),
            ))
        }
    };
    if let Some(v) = l.timeout_secs {
        let span = v.span();
        lim.timeout_secs = match v.into_inner() {
            RawCount::Number(n) => Some(check(RunLimit::Timeout, n, span)?),
            RawCount::Text(t) => off(RunLimit::Timeout, span, &t).map(|()| None)?,
        };
    }
    if let Some(v) = count(RunLimit::Pids, l.pids)? {
        lim.pids = Some(v);
    }
    if let Some(v) = count(RunLimit::CpuMillicores, l.cpu_millicores)? {
        lim.cpu_millicores = Some(v);
    }
    if let Some(v) = count(RunLimit::CpuTime, l.cpu_time_secs)? {
        lim.cpu_time_secs = Some(v);
    }
    if let Some(v) = count(RunLimit::OpenFiles, l.open_files)? {
        lim.open_files = v;
    }
    if let Some(v) = count(RunLimit::Processes, l.processes)? {
        lim.processes = Some(v);
    }
    if let Some(v) = bytes(RunLimit::Memory, l.memory)? {
        lim.memory_bytes = Some(v);
    }
    if let Some(v) = bytes(RunLimit::AddressSpace, l.address_space)? {
        lim.address_space_bytes = Some(v);
    }
    if let Some(v) = bytes(RunLimit::FileSize, l.file_size)? {
        lim.file_size_bytes = Some(v);
    }
    if let Some(v) = bytes(RunLimit::Output, l.output)? {
        lim.output_bytes = v;
    }
    let kill_span = l.output_kill.as_ref().map(Spanned::span);
    let kill = match l.output_kill {
        Some(v) if matches!(v.get_ref(), RawSize::Text(t) if t == NO_LIMIT) => Some(None),
        v => bytes(RunLimit::OutputKill, v)?.map(Some),
    };
    if let Some(v) = kill {
        lim.output_kill_bytes = v;
        if let Some(kill) = v.filter(|v| *v < lim.output_bytes) {
            return Err(src.err(
                kill_span,
                format!("{k}.output_kill"),
                format!("{kill} is below limits.output ({}); the kill ceiling must be at least what is kept", lim.output_bytes),
            ));
        }
    }
    if let Some(b) = l.allow_unenforced {
        lim.allow_unenforced = b;
    }
    Ok(())
}

/// `[profile.NAME.security]`.
fn apply_security(
    src: &Source,
    k: &str,
    s: &mut Security,
    raw: RawSecurity,
) -> Result<(), ConfigError> {
    if let Some(v) = raw.seccomp {
        s.seccomp = match v.get_ref().as_str() {
            "default" => SeccompProfile::Default,
            "strict" => SeccompProfile::Strict,
            other => {
                return Err(src.err(
                    Some(v.span()),
                    format!("{k}.seccomp"),
                    format!("unknown seccomp profile `{other}`: use \"default\" or \"strict\""),
                ))
            }
        };
    }
    if let Some(v) = raw.landlock {
        s.landlock = match v.get_ref().as_str() {
            "required" => LandlockMode::Required,
            "best-effort" => LandlockMode::BestEffort,
            other => {
                return Err(src.err(
                    Some(v.span()),
                    format!("{k}.landlock"),
                    format!("unknown landlock mode `{other}`: use \"required\" or \"best-effort\""),
                ))
            }
        };
    }
    if let Some(allow) = raw.unix_sockets {
        s.unix_sockets = allow;
    }
    for (field, list, target) in [
        ("tcp_bind", raw.tcp_bind, &mut s.tcp_bind),
        ("tcp_connect", raw.tcp_connect, &mut s.tcp_connect),
    ] {
        if let Some(list) = list {
            if let Some(zero) = list.iter().find(|v| *v.get_ref() == 0) {
                return Err(src.err(
                    Some(zero.span()),
                    format!("{k}.{field}"),
                    "port 0 is not a port",
                ));
            }
            *target = list.into_iter().map(Spanned::into_inner).collect();
        }
    }
    Ok(())
}

/// `[profile.NAME.network]`.
fn apply_network(
    src: &Source,
    k: &str,
    n: &mut NetworkPolicy,
    raw: RawNetwork,
) -> Result<(), ConfigError> {
    use crate::network::{normalize_host, Cidr, DomainRule};
    if let Some(m) = raw.mode {
        n.mode = m.get_ref().parse().map_err(|e: NetworkError| {
            src.err(Some(m.span()), format!("{k}.mode"), e.to_string())
        })?;
    }
    let rules = |list: Vec<Spanned<String>>, field: &str| -> Result<Vec<DomainRule>, ConfigError> {
        list.into_iter()
            .map(|s| {
                DomainRule::parse(s.get_ref())
                    .map_err(|e| src.err(Some(s.span()), format!("{k}.{field}"), e.to_string()))
            })
            .collect()
    };
    if let Some(list) = raw.allow_domains {
        n.allow_domains = rules(list, "allow_domains")?;
    }
    if let Some(list) = raw.deny_domains {
        // A port list would read as "deny only these ports" while a deny
        // rule refuses its names on every port: refuse the ambiguity.
        if let Some(s) = list.iter().find(|s| s.get_ref().contains(':')) {
            return Err(src.err(
                Some(s.span()),
                format!("{k}.deny_domains"),
                format!(
                    "`{}`: a deny rule refuses its names on every port, so it takes no port list; write just the name pattern",
                    s.get_ref()
                ),
            ));
        }
        n.deny_domains = rules(list, "deny_domains")?;
    }
    if let Some(list) = raw.allow_cidrs {
        n.allow_cidrs = list
            .into_iter()
            .map(|s| {
                Cidr::parse(s.get_ref())
                    .map_err(|e| src.err(Some(s.span()), format!("{k}.allow_cidrs"), e.to_string()))
            })
            .collect::<Result<_, _>>()?;
    }
    if let Some(hosts) = raw.hosts {
        let mut out = BTreeMap::new();
        for (name, addr) in hosts {
            let host = normalize_host(&name).ok_or_else(|| {
                src.err(
                    Some(addr.span()),
                    format!("{k}.hosts"),
                    format!("`{name}` is not a host name"),
                )
            })?;
            let ip = addr.get_ref().parse().map_err(|_| {
                src.err(
                    Some(addr.span()),
                    format!("{k}.hosts.{name}"),
                    format!("`{}` is not an IP address", addr.get_ref()),
                )
            })?;
            out.insert(host, ip);
        }
        n.hosts = out;
    }
    if let Some(b) = raw.sni_check {
        n.sni_check = b;
    }
    if let Some(m) = raw.max_connections {
        if *m.get_ref() == 0 {
            return Err(src.err(
                Some(m.span()),
                format!("{k}.max_connections"),
                "must be at least 1",
            ));
        }
        n.max_connections = m.into_inner();
    }
    if let Some(t) = raw.idle_timeout_secs {
        if *t.get_ref() == 0 {
            return Err(src.err(
                Some(t.span()),
                format!("{k}.idle_timeout_secs"),
                "must be at least 1",
            ));
        }
        n.idle_timeout_secs = t.into_inner();
    }
    Ok(())
}

/// `[profile.NAME.identity]`: never uid or gid 0.
fn apply_identity(
    src: &Source,
    k: &str,
    id: &mut Identity,
    raw: RawIdentity,
) -> Result<(), ConfigError> {
    for (field, value, target) in [("uid", raw.uid, &mut id.uid), ("gid", raw.gid, &mut id.gid)] {
        if let Some(v) = value {
            if *v.get_ref() == 0 {
                return Err(src.err(
                    Some(v.span()),
                    format!("{k}.{field}"),
                    "the sandbox never runs as host root; pick an unprivileged id",
                ));
            }
            *target = v.into_inner();
        }
    }
    Ok(())
}

/// Parses a list of sandbox paths, each with its span.
fn path_list(
    src: &Source,
    key: &str,
    list: Vec<Spanned<String>>,
) -> Result<Vec<(SandboxPath, Range<usize>)>, ConfigError> {
    list.into_iter()
        .map(|s| {
            let span = s.span();
            SandboxPath::new(s.get_ref())
                .map(|p| (p, span.clone()))
                .map_err(|e| src.err(Some(span), key, e.to_string()))
        })
        .collect()
}

/// Parses a list of mount specs (`PATH` or `PATH:DEST`), each with its span.
fn mount_list(
    src: &Source,
    key: &str,
    list: Vec<Spanned<String>>,
) -> Result<Vec<(MountSpec, Range<usize>)>, ConfigError> {
    list.into_iter()
        .map(|s| {
            let span = s.span();
            MountSpec::parse(s.get_ref(), None)
                .map(|m| (m, span.clone()))
                .map_err(|e| src.err(Some(span), key, e.to_string()))
        })
        .collect()
}

/// Parses a size as written (an integer of bytes or a string with a
/// unit), without bounds.
pub(super) fn parse_size(
    src: &Source,
    key: &str,
    raw: Spanned<RawSize>,
) -> Result<ByteSize, ConfigError> {
    let span = raw.span();
    match raw.into_inner() {
        RawSize::Bytes(n) => Ok(ByteSize(n)),
        RawSize::Text(t) => {
            ByteSize::parse(&t).map_err(|e| src.err(Some(span), key, e.to_string()))
        }
    }
}

/// Parses a size that is not a limit (a tmpfs, the request body): at least
/// 4 KiB, at most [`MAX_BYTES`] like every size.
pub(super) fn size(
    src: &Source,
    key: &str,
    raw: Spanned<RawSize>,
) -> Result<ByteSize, ConfigError> {
    let span = raw.span();
    let value = parse_size(src, key, raw)?;
    if value.bytes() < 4096 {
        return Err(src.err(
            Some(span),
            key,
            format!("{value} is too small: at least 4KiB"),
        ));
    }
    if value.bytes() > MAX_BYTES {
        return Err(src.err(
            Some(span),
            key,
            format!("{value} is too large: at most {MAX_BYTES} bytes (2^63 - 1)"),
        ));
    }
    Ok(value)
}

/// The strings of a spanned list.
fn strings(list: Vec<Spanned<String>>) -> Vec<String> {
    list.into_iter().map(Spanned::into_inner).collect()
}

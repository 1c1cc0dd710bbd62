//! Config files: TOML profiles on top of the built-in ones.
//!
//! ```toml
//! [profile.analysis]
//! extends = "code"
//! hostname = "analysis"
//! [profile.analysis.commands]
//! deny_args = ["* -m pip *"]
//! ```
//!
//! Unknown keys, bad sizes, relative or `..` paths and conflicting rules are
//! errors naming the key and the line. A field given in a profile replaces
//! the inherited one whole (lists are not appended), so what a profile says
//! is what it gets.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use crate::builtin;
use crate::env::{validate_name, Blocklist};
use crate::path::{MountSpec, SandboxPath};
use crate::profile::{LandlockMode, Profile, SeccompProfile};
use crate::size::ByteSize;

/// A config error, with the file, line and key it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", location(.file, .line, .key))]
pub struct ConfigError {
    /// The config file, when the error came from one.
    pub file: Option<PathBuf>,
    /// 1-based line in that file.
    pub line: Option<usize>,
    /// Dotted key, e.g. `profile.web.filesystem.read_only`.
    pub key: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// `FILE:line N: KEY: ` with the parts that are known.
fn location(file: &Option<PathBuf>, line: &Option<usize>, key: &str) -> String {
    let mut parts = Vec::new();
    if let Some(f) = file {
        parts.push(f.display().to_string());
    }
    if let Some(l) = line {
        parts.push(format!("line {l}"));
    }
    if !key.is_empty() {
        parts.push(key.to_string());
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{}: ", parts.join(": "))
    }
}

/// All profiles known to a run: the built-ins plus a config file's.
#[derive(Debug, Clone)]
pub struct Config {
    /// Profiles by name.
    pub profiles: BTreeMap<String, Profile>,
    /// `corral serve` settings (defaults when the file has no `[server]`).
    pub server: crate::server::ServerConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            profiles: builtin::all(),
            server: crate::server::ServerConfig::default(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    profile: BTreeMap<String, Spanned<RawProfile>>,
    server: Option<Spanned<RawServer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<Spanned<String>>,
    max_concurrent: Option<Spanned<u32>>,
    code_mode: Option<bool>,
    audit_db: Option<Spanned<String>>,
    audit_jsonl: Option<Spanned<String>>,
    retention_days: Option<Spanned<u32>>,
    store_code: Option<bool>,
    work_dir: Option<Spanned<String>>,
    max_request_bytes: Option<Spanned<RawSize>>,
    #[serde(default)]
    tenant: Vec<Spanned<RawTenant>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    name: Spanned<String>,
    token_sha256: Spanned<String>,
    profiles: Spanned<Vec<String>>,
    max_concurrent: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    extends: Option<Spanned<String>>,
    description: Option<String>,
    hostname: Option<Spanned<String>>,
    filesystem: Option<RawFilesystem>,
    env: Option<RawEnv>,
    commands: Option<RawCommands>,
    limits: Option<RawLimits>,
    identity: Option<RawIdentity>,
    security: Option<RawSecurity>,
    network: Option<RawNetwork>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNetwork {
    mode: Option<Spanned<String>>,
    allow_domains: Option<Vec<Spanned<String>>>,
    deny_domains: Option<Vec<Spanned<String>>>,
    allow_cidrs: Option<Vec<Spanned<String>>>,
    hosts: Option<BTreeMap<String, Spanned<String>>>,
    sni_check: Option<bool>,
    max_connections: Option<Spanned<u32>>,
    idle_timeout_secs: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecurity {
    seccomp: Option<Spanned<String>>,
    landlock: Option<Spanned<String>>,
    tcp_bind: Option<Vec<Spanned<u16>>>,
    tcp_connect: Option<Vec<Spanned<u16>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFilesystem {
    system: Option<Vec<Spanned<String>>>,
    read_only: Option<Vec<Spanned<String>>>,
    read_write: Option<Vec<Spanned<String>>>,
    deny: Option<Vec<Spanned<String>>>,
    tmp_size: Option<Spanned<RawSize>>,
    workspace_size: Option<Spanned<RawSize>>,
    dev_pts: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawSize {
    Bytes(u64),
    Text(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnv {
    pass: Option<Vec<Spanned<String>>>,
    set: Option<BTreeMap<String, Spanned<String>>>,
    block: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommands {
    allow: Option<Vec<Spanned<String>>>,
    allow_paths: Option<bool>,
    deny_args: Option<Vec<Spanned<String>>>,
    search_path: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    timeout_secs: Option<Spanned<u64>>,
    memory: Option<Spanned<RawSize>>,
    pids: Option<Spanned<u64>>,
    cpu_millicores: Option<Spanned<u64>>,
    cpu_time_secs: Option<Spanned<u64>>,
    address_space: Option<Spanned<RawSize>>,
    file_size: Option<Spanned<RawSize>>,
    open_files: Option<Spanned<u64>>,
    processes: Option<Spanned<u64>>,
    output: Option<Spanned<RawSize>>,
    output_kill: Option<Spanned<RawSize>>,
    allow_unenforced: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIdentity {
    uid: Option<Spanned<u32>>,
    gid: Option<Spanned<u32>>,
}

/// Turns byte offsets into line numbers and builds errors.
struct Source<'a> {
    text: &'a str,
    file: Option<&'a Path>,
}

impl Source<'_> {
    fn line_of(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())]
            .bytes()
            .filter(|&b| b == b'\n')
            .count()
            + 1
    }

    fn err(
        &self,
        span: Option<std::ops::Range<usize>>,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> ConfigError {
        ConfigError {
            file: self.file.map(Path::to_path_buf),
            line: span.map(|s| self.line_of(s.start)),
            key: key.into(),
            message: message.into(),
        }
    }
}

impl Config {
    /// Loads a config file on top of the built-in profiles.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: Some(path.to_path_buf()),
            line: None,
            key: String::new(),
            message: format!("cannot read config file: {e}"),
        })?;
        Config::parse(&text, Some(path))
    }

    /// Parses config text on top of the built-in profiles. `file` is only
    /// used in error messages.
    pub fn parse(text: &str, file: Option<&Path>) -> Result<Config, ConfigError> {
        let src = Source { text, file };
        let raw: RawConfig = toml::from_str(text)
            .map_err(|e| src.err(e.span(), "", e.message().trim().to_string()))?;
        let mut config = Config::default();
        let raw_server = raw.server;
        // Resolve `extends` in dependency order; a round that resolves
        // nothing means the rest extend each other in a cycle.
        let mut pending: Vec<(String, Spanned<RawProfile>)> = raw.profile.into_iter().collect();
        while !pending.is_empty() {
            let unresolved: Vec<String> = pending.iter().map(|(n, _)| n.clone()).collect();
            let mut next = Vec::new();
            for (name, raw) in pending {
                let key = format!("profile.{name}");
                if name.is_empty()
                    || !name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
                {
                    return Err(src.err(
                        Some(raw.span()),
                        "profile",
                        format!("profile name {name:?} is invalid: use letters, digits, `_`, `-` and `.`"),
                    ));
                }
                let base_name = raw.get_ref().extends.as_ref().map(|s| s.get_ref().clone());
                // Wait while the base is a file profile not yet built.
                if base_name
                    .as_ref()
                    .is_some_and(|b| b != &name && unresolved.contains(b))
                {
                    next.push((name, raw));
                    continue;
                }
                let base = match &base_name {
                    Some(b) if b == &name => builtin::all().remove(b),
                    Some(b) => config.profiles.get(b).cloned(),
                    None => builtin::all().remove(&name),
                };
                let base = match (base, &base_name) {
                    (Some(mut p), _) => {
                        p.name = name.clone();
                        p
                    }
                    (None, None) => builtin::base(&name),
                    (None, Some(b)) => {
                        let span = raw.get_ref().extends.as_ref().map(|s| s.span());
                        return Err(src.err(
                            span,
                            format!("{key}.extends"),
                            format!("unknown profile `{b}` (known: {})", known(&config)),
                        ));
                    }
                };
                let span = raw.span();
                let profile = apply(&src, &key, base, raw.into_inner())?;
                check_merged(&src, &key, span, &profile)?;
                config.profiles.insert(name, profile);
            }
            if next.len() == unresolved.len() {
                let (name, raw) = &next[0];
                let span = raw.get_ref().extends.as_ref().map(|s| s.span());
                return Err(src.err(
                    span,
                    format!("profile.{name}.extends"),
                    "profiles extend each other in a cycle",
                ));
            }
            pending = next;
        }
        if let Some(server) = raw_server {
            config.server = apply_server(&src, server, &config)?;
        }
        Ok(config)
    }

    /// The named profile, or an error listing the known ones.
    pub fn profile(&self, name: &str) -> Result<&Profile, ConfigError> {
        self.profiles.get(name).ok_or_else(|| ConfigError {
            file: None,
            line: None,
            key: String::from("profile"),
            message: format!("unknown profile `{name}` (known: {})", known(self)),
        })
    }
}

fn known(config: &Config) -> String {
    config
        .profiles
        .keys()
        .cloned()
        .collect::<Vec<_>>()
        .join(", ")
}

fn path_list(
    src: &Source,
    key: &str,
    list: Vec<Spanned<String>>,
) -> Result<Vec<(SandboxPath, std::ops::Range<usize>)>, ConfigError> {
    list.into_iter()
        .map(|s| {
            let span = s.span();
            SandboxPath::new(s.get_ref())
                .map(|p| (p, span.clone()))
                .map_err(|e| src.err(Some(span), key, e.to_string()))
        })
        .collect()
}

fn mount_list(
    src: &Source,
    key: &str,
    list: Vec<Spanned<String>>,
) -> Result<Vec<(MountSpec, std::ops::Range<usize>)>, ConfigError> {
    list.into_iter()
        .map(|s| {
            let span = s.span();
            MountSpec::parse(s.get_ref(), None)
                .map(|m| (m, span.clone()))
                .map_err(|e| src.err(Some(span), key, e.to_string()))
        })
        .collect()
}

fn size(src: &Source, key: &str, raw: Spanned<RawSize>) -> Result<ByteSize, ConfigError> {
    let span = raw.span();
    let value = match raw.into_inner() {
        RawSize::Bytes(n) => ByteSize(n),
        RawSize::Text(t) => {
            ByteSize::parse(&t).map_err(|e| src.err(Some(span.clone()), key, e.to_string()))?
        }
    };
    if value.bytes() < 4096 {
        return Err(src.err(
            Some(span),
            key,
            format!("{value} is too small: at least 4KiB"),
        ));
    }
    Ok(value)
}

fn strings(list: Vec<Spanned<String>>) -> Vec<String> {
    list.into_iter().map(Spanned::into_inner).collect()
}

/// Applies a raw profile on top of `p`, validating every field.
fn apply(src: &Source, key: &str, mut p: Profile, raw: RawProfile) -> Result<Profile, ConfigError> {
    if let Some(d) = raw.description {
        p.description = d;
    }
    if let Some(h) = raw.hostname {
        let span = h.span();
        let h = h.into_inner();
        validate_hostname(&h).map_err(|m| src.err(Some(span), format!("{key}.hostname"), m))?;
        p.hostname = h;
    }
    // Spans of mount destinations, for conflict messages.
    let mut dests: Vec<(SandboxPath, Option<std::ops::Range<usize>>, &str)> = Vec::new();
    let mut deny_spans = Vec::new();
    if let Some(fs) = raw.filesystem {
        let k = format!("{key}.filesystem");
        if let Some(list) = fs.system {
            p.filesystem.system = path_list(src, &format!("{k}.system"), list)?
                .into_iter()
                .map(|(p, _)| p)
                .collect();
        }
        if let Some(list) = fs.read_only {
            let parsed = mount_list(src, &format!("{k}.read_only"), list)?;
            dests.extend(
                parsed
                    .iter()
                    .map(|(m, s)| (m.dest.clone(), Some(s.clone()), "read_only")),
            );
            p.filesystem.read_only = parsed.into_iter().map(|(m, _)| m).collect();
        }
        if let Some(list) = fs.read_write {
            let parsed = mount_list(src, &format!("{k}.read_write"), list)?;
            dests.extend(
                parsed
                    .iter()
                    .map(|(m, s)| (m.dest.clone(), Some(s.clone()), "read_write")),
            );
            p.filesystem.read_write = parsed.into_iter().map(|(m, _)| m).collect();
        }
        if let Some(list) = fs.deny {
            let parsed = path_list(src, &format!("{k}.deny"), list)?;
            deny_spans = parsed.iter().map(|(p, s)| (p.clone(), s.clone())).collect();
            p.filesystem.deny = parsed.into_iter().map(|(p, _)| p).collect();
        }
        if let Some(s) = fs.tmp_size {
            p.filesystem.tmp_size = size(src, &format!("{k}.tmp_size"), s)?;
        }
        if let Some(s) = fs.workspace_size {
            p.filesystem.workspace_size = size(src, &format!("{k}.workspace_size"), s)?;
        }
        if let Some(b) = fs.dev_pts {
            p.filesystem.dev_pts = b;
        }
    }
    // Conflicts: a destination that is reserved, mounted twice, or denied.
    for (i, (dest, span, field)) in dests.iter().enumerate() {
        let k = format!("{key}.filesystem.{field}");
        if let Some(why) = reserved_destination(dest) {
            return Err(src.err(span.clone(), k, format!("cannot mount at `{dest}`: {why}")));
        }
        if let Some((_, _, other)) = dests[..i].iter().find(|(d, _, _)| d == dest) {
            return Err(src.err(
                span.clone(),
                k,
                format!(
                    "`{dest}` is also mounted by filesystem.{other}; mount each destination once"
                ),
            ));
        }
        if let Some((deny, _)) = deny_spans.iter().find(|(d, _)| d == dest) {
            return Err(src.err(
                span.clone(),
                k,
                format!("`{deny}` is both mounted and denied; remove one of the two rules"),
            ));
        }
    }
    if let Some(env) = raw.env {
        let k = format!("{key}.env");
        let mut block = p.env.block.clone();
        if let Some(list) = env.block {
            for pat in &list {
                if let Err(e) = Blocklist::new(std::slice::from_ref(pat.get_ref())) {
                    return Err(src.err(Some(pat.span()), format!("{k}.block"), e.to_string()));
                }
            }
            block = strings(list);
        }
        let blocklist = Blocklist::new(&block)
            .map_err(|e| src.err(None, format!("{k}.block"), e.to_string()))?;
        if let Some(list) = env.pass {
            for name in &list {
                check_env_name(src, &format!("{k}.pass"), name, &blocklist)?;
            }
            p.env.pass = strings(list);
        }
        if let Some(set) = env.set {
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
            p.env.set = out;
        }
        p.env.block = block;
    }
    if let Some(c) = raw.commands {
        let k = format!("{key}.commands");
        if let Some(list) = c.allow {
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
            p.commands.allow = strings(list);
        }
        if let Some(b) = c.allow_paths {
            p.commands.allow_paths = b;
        }
        if let Some(list) = c.deny_args {
            for rule in &list {
                if let Err(e) =
                    crate::commands::compile_deny_args(std::slice::from_ref(rule.get_ref()))
                {
                    return Err(src.err(
                        Some(rule.span()),
                        format!("{k}.deny_args"),
                        e.to_string(),
                    ));
                }
            }
            p.commands.deny_args = strings(list);
        }
        if let Some(list) = c.search_path {
            p.commands.search_path = path_list(src, &format!("{k}.search_path"), list)?
                .into_iter()
                .map(|(p, _)| p)
                .collect();
        }
    }
    if let Some(l) = raw.limits {
        let k = format!("{key}.limits");
        let positive = |v: Option<Spanned<u64>>, field: &str| -> Result<Option<u64>, ConfigError> {
            match v {
                Some(v) if *v.get_ref() == 0 => {
                    Err(src.err(Some(v.span()), format!("{k}.{field}"), "must be at least 1"))
                }
                Some(v) => Ok(Some(v.into_inner())),
                None => Ok(None),
            }
        };
        let lim = &mut p.limits;
        if let Some(v) = positive(l.timeout_secs, "timeout_secs")? {
            lim.timeout_secs = Some(v);
        }
        if let Some(v) = positive(l.pids, "pids")? {
            lim.pids = Some(v);
        }
        if let Some(v) = positive(l.cpu_millicores, "cpu_millicores")? {
            lim.cpu_millicores = Some(v);
        }
        if let Some(v) = positive(l.cpu_time_secs, "cpu_time_secs")? {
            lim.cpu_time_secs = Some(v);
        }
        if let Some(v) = positive(l.open_files, "open_files")? {
            lim.open_files = v;
        }
        if let Some(v) = positive(l.processes, "processes")? {
            lim.processes = Some(v);
        }
        if let Some(s) = l.memory {
            lim.memory_bytes = Some(size(src, &format!("{k}.memory"), s)?);
        }
        if let Some(s) = l.address_space {
            lim.address_space_bytes = Some(size(src, &format!("{k}.address_space"), s)?);
        }
        if let Some(s) = l.file_size {
            lim.file_size_bytes = Some(size(src, &format!("{k}.file_size"), s)?);
        }
        if let Some(s) = l.output {
            lim.output_bytes = size(src, &format!("{k}.output"), s)?;
        }
        if let Some(s) = l.output_kill {
            let span = s.span();
            lim.output_kill_bytes = size(src, &format!("{k}.output_kill"), s)?;
            if lim.output_kill_bytes < lim.output_bytes {
                return Err(src.err(
                    Some(span),
                    format!("{k}.output_kill"),
                    format!("{} is below limits.output ({}); the kill ceiling must be at least what is kept", lim.output_kill_bytes, lim.output_bytes),
                ));
            }
        }
        if let Some(b) = l.allow_unenforced {
            lim.allow_unenforced = b;
        }
    }
    if let Some(sec) = raw.security {
        let k = format!("{key}.security");
        if let Some(v) = sec.seccomp {
            p.security.seccomp = match v.get_ref().as_str() {
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
        if let Some(v) = sec.landlock {
            p.security.landlock = match v.get_ref().as_str() {
                "required" => LandlockMode::Required,
                "best-effort" => LandlockMode::BestEffort,
                other => {
                    return Err(src.err(
                        Some(v.span()),
                        format!("{k}.landlock"),
                        format!(
                            "unknown landlock mode `{other}`: use \"required\" or \"best-effort\""
                        ),
                    ))
                }
            };
        }
        for (field, list, target) in [
            ("tcp_bind", sec.tcp_bind, &mut p.security.tcp_bind),
            ("tcp_connect", sec.tcp_connect, &mut p.security.tcp_connect),
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
    }
    if let Some(net) = raw.network {
        apply_network(src, &format!("{key}.network"), &mut p.network, net)?;
    }
    if let Some(id) = raw.identity {
        for (field, value, target) in [
            ("uid", id.uid, &mut p.identity.uid),
            ("gid", id.gid, &mut p.identity.gid),
        ] {
            if let Some(v) = value {
                if *v.get_ref() == 0 {
                    return Err(src.err(
                        Some(v.span()),
                        format!("{key}.identity.{field}"),
                        "the sandbox never runs as host root; pick an unprivileged id",
                    ));
                }
                *target = v.into_inner();
            }
        }
    }
    Ok(p)
}

fn apply_network(
    src: &Source,
    k: &str,
    n: &mut crate::network::NetworkPolicy,
    raw: RawNetwork,
) -> Result<(), ConfigError> {
    use crate::network::{normalize_host, Cidr, DomainRule};
    if let Some(m) = raw.mode {
        n.mode = m
            .get_ref()
            .parse()
            .map_err(|e: String| src.err(Some(m.span()), format!("{k}.mode"), e))?;
    }
    let rules = |list: Vec<Spanned<String>>, field: &str| -> Result<Vec<DomainRule>, ConfigError> {
        list.into_iter()
            .map(|s| {
                DomainRule::parse(s.get_ref())
                    .map_err(|e| src.err(Some(s.span()), format!("{k}.{field}"), e))
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
                    .map_err(|e| src.err(Some(s.span()), format!("{k}.allow_cidrs"), e))
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

fn apply_server(
    src: &Source,
    raw: Spanned<RawServer>,
    config: &Config,
) -> Result<crate::server::ServerConfig, ConfigError> {
    use crate::server::{valid_token_hash, ServerConfig, Tenant};
    let mut s = ServerConfig::default();
    let raw = raw.into_inner();
    let k = "server";
    if let Some(l) = raw.listen {
        s.listen = l.get_ref().parse().map_err(|_| {
            src.err(
                Some(l.span()),
                format!("{k}.listen"),
                format!("`{}` is not ADDR:PORT", l.get_ref()),
            )
        })?;
    }
    if let Some(m) = raw.max_concurrent {
        if *m.get_ref() == 0 {
            return Err(src.err(
                Some(m.span()),
                format!("{k}.max_concurrent"),
                "must be at least 1",
            ));
        }
        s.max_concurrent = m.into_inner();
    }
    if let Some(b) = raw.code_mode {
        s.code_mode = b;
    }
    if let Some(b) = raw.store_code {
        s.store_code = b;
    }
    // The server's files: a relative path would depend on the directory
    // the server happens to be started from.
    let abs = |v: Spanned<String>, field: &str| -> Result<PathBuf, ConfigError> {
        let p = PathBuf::from(v.get_ref());
        if p.is_absolute() {
            Ok(p)
        } else {
            Err(src.err(
                Some(v.span()),
                format!("{k}.{field}"),
                format!(
                    "{:?} is not an absolute path: write the full path (a relative one would depend on where the server is started)",
                    v.get_ref()
                ),
            ))
        }
    };
    if let Some(p) = raw.audit_db {
        s.audit_db = abs(p, "audit_db")?;
    }
    if let Some(p) = raw.audit_jsonl {
        s.audit_jsonl = Some(abs(p, "audit_jsonl")?);
    }
    if let Some(p) = raw.work_dir {
        s.work_dir = abs(p, "work_dir")?;
    }
    if let Some(r) = raw.retention_days {
        if *r.get_ref() == 0 {
            return Err(src.err(
                Some(r.span()),
                format!("{k}.retention_days"),
                "must be at least 1",
            ));
        }
        s.retention_days = r.into_inner();
    }
    if let Some(m) = raw.max_request_bytes {
        s.max_request_bytes = size(src, &format!("{k}.max_request_bytes"), m)?.bytes();
    }
    for t in raw.tenant {
        let span = t.span();
        let t = t.into_inner();
        let name = t.name.get_ref().clone();
        if name.is_empty()
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(src.err(
                Some(t.name.span()),
                format!("{k}.tenant.name"),
                format!("tenant name {name:?} is invalid: use letters, digits, `_`, `-` and `.`"),
            ));
        }
        if s.tenants.iter().any(|x: &Tenant| x.name == name) {
            return Err(src.err(
                Some(span),
                format!("{k}.tenant.name"),
                format!("tenant `{name}` is defined twice"),
            ));
        }
        let hash = t.token_sha256.get_ref().to_ascii_lowercase();
        if !valid_token_hash(&hash) {
            return Err(src.err(
                Some(t.token_sha256.span()),
                format!("{k}.tenant.token_sha256"),
                "must be the SHA-256 of the token as 64 hex digits (e.g. `printf %s TOKEN | sha256sum`); the token itself is never stored",
            ));
        }
        if s.tenants.iter().any(|x| x.token_sha256 == hash) {
            return Err(src.err(
                Some(t.token_sha256.span()),
                format!("{k}.tenant.token_sha256"),
                "two tenants share a token",
            ));
        }
        if t.profiles.get_ref().is_empty() {
            return Err(src.err(
                Some(t.profiles.span()),
                format!("{k}.tenant.profiles"),
                "list at least one profile",
            ));
        }
        for p in t.profiles.get_ref() {
            if !config.profiles.contains_key(p) {
                return Err(src.err(
                    Some(t.profiles.span()),
                    format!("{k}.tenant.profiles"),
                    format!("unknown profile `{p}`"),
                ));
            }
        }
        let max_concurrent = match t.max_concurrent {
            Some(m) if *m.get_ref() == 0 => {
                return Err(src.err(
                    Some(m.span()),
                    format!("{k}.tenant.max_concurrent"),
                    "must be at least 1",
                ));
            }
            Some(m) => m.into_inner(),
            None => s.max_concurrent,
        };
        s.tenants.push(Tenant {
            name,
            token_sha256: hash,
            profiles: t.profiles.into_inner(),
            max_concurrent,
        });
    }
    Ok(s)
}

/// Checks the profile as merged with what it inherits: rules that are
/// fine alone can conflict with inherited ones.
fn check_merged(
    src: &Source,
    key: &str,
    span: std::ops::Range<usize>,
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
    if l.output_kill_bytes < l.output_bytes {
        return err(
            "limits.output_kill",
            format!(
                "{} (possibly inherited) is below limits.output ({}); the kill ceiling must be at least what is kept",
                l.output_kill_bytes, l.output_bytes
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
    if l.cpu_millicores.is_some_and(|m| m < 10) {
        return err(
            "limits.cpu_millicores",
            "must be at least 10 (one hundredth of a core)".into(),
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

fn check_env_name(
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

/// Why a mount destination is not allowed, if it is not.
pub fn reserved_destination(dest: &SandboxPath) -> Option<&'static str> {
    const RESERVED: [&str; 3] = ["/proc", "/dev", "/tmp"];
    if dest.is_root() {
        return Some("the root is corral's own read-only tmpfs");
    }
    for r in RESERVED {
        if let Ok(r) = SandboxPath::new(r) {
            if dest.starts_with(&r) {
                return Some("/proc, /dev and /tmp are set up by corral");
            }
        }
    }
    if dest.as_str() == "/workspace" {
        return Some("/workspace is the workdir; use --workdir");
    }
    None
}

/// Checks a hostname: 1 to 63 characters of letters, digits, `-` and `.`.
pub fn validate_hostname(h: &str) -> Result<(), String> {
    let ok = !h.is_empty()
        && h.len() <= 63
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !h.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "hostname `{h}` is invalid: use 1 to 63 letters, digits, `-` or `.`"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        Config::parse(text, Some(Path::new("corral.toml"))).unwrap_err()
    }

    #[test]
    fn builtins_are_there() {
        let c = Config::default();
        let code = c.profile("code").unwrap();
        assert_eq!(code.commands.allow, ["python3", "node", "sh", "bash"]);
        assert!(c
            .profile("nope")
            .unwrap_err()
            .to_string()
            .contains("known: code"));
    }

    #[test]
    fn extends_and_overrides() {
        let c = Config::parse(
            r#"
[profile.a]
extends = "code"
hostname = "alpha"
[profile.a.commands]
allow = ["python3"]
deny_args = ["*pip*"]
[profile.b]
extends = "a"
[profile.b.limits]
memory = "256MiB"
pids = 64
output = "64KiB"
[profile.b.filesystem]
tmp_size = "16MiB"
read_only = ["/opt/data:/data"]
"#,
            None,
        )
        .unwrap();
        let b = c.profile("b").unwrap();
        assert_eq!(b.hostname, "alpha");
        assert_eq!(b.commands.allow, ["python3"]);
        assert_eq!(b.filesystem.tmp_size, ByteSize(16 << 20));
        assert_eq!(b.filesystem.read_only[0].dest.as_str(), "/data");
        assert_eq!(b.name, "b");
        assert_eq!(b.limits.memory_bytes, Some(ByteSize(256 << 20)));
        assert_eq!(b.limits.pids, Some(64));
        assert_eq!(b.limits.output_bytes, ByteSize(64 << 10));
        assert_eq!(b.limits.open_files, 1024, "inherited default");
        let e = err("[profile.a.limits]\noutput = \"1MiB\"\noutput_kill = \"64KiB\"\n");
        assert_eq!(
            (e.line, e.key.as_str()),
            (Some(3), "profile.a.limits.output_kill")
        );
        let e = err("[profile.a.limits]\npids = 0\n");
        assert_eq!(e.key, "profile.a.limits.pids");
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let e = err("[profile.a]\nextends = \"code\"\n\n[profile.a.filesystem]\nread_olny = []\n");
        let msg = e.to_string();
        assert_eq!(e.line, Some(5), "{msg}");
        assert!(msg.contains("read_olny"), "{msg}");
        assert!(msg.starts_with("corral.toml: line 5: "), "{msg}");
    }

    #[test]
    fn bad_values_name_key_and_line() {
        let e = err("[profile.a]\n[profile.a.filesystem]\ntmp_size = \"12 parsecs\"\n");
        assert_eq!(
            (e.line, e.key.as_str()),
            (Some(3), "profile.a.filesystem.tmp_size")
        );
        let e = err("[profile.a.filesystem]\nread_write = [\n  \"/ok\",\n  \"rel/path\",\n]\n");
        assert_eq!(
            (e.line, e.key.as_str()),
            (Some(4), "profile.a.filesystem.read_write")
        );
        assert!(e.message.contains("relative"));
        let e = err("[profile.a.filesystem]\ndeny = [\"/usr/../etc\"]\n");
        assert!(e.message.contains(".."));
        let e = err("[profile.a]\nextends = \"missing\"\n");
        assert_eq!(e.key, "profile.a.extends");
        let e = err("[profile.a]\nhostname = \"bad host\"\n");
        assert_eq!(e.line, Some(2));
        let e = err("[profile.a.commands]\nallow = [\"/bin/sh\"]\n");
        assert_eq!(e.key, "profile.a.commands.allow");
        let e = err("[profile.a.identity]\nuid = 0\n");
        assert_eq!(e.key, "profile.a.identity.uid");
    }

    #[test]
    fn conflicts_are_errors() {
        let e = err("[profile.a.filesystem]\nread_only = [\"/a:/x\"]\nread_write = [\"/b:/x\"]\n");
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("also mounted"));
        let e = err("[profile.a.filesystem]\nread_only = [\"/a\"]\ndeny = [\"/a\"]\n");
        assert!(e.message.contains("both mounted and denied"));
        let e = err("[profile.a.filesystem]\nread_only = [\"/host/proc:/proc/x\"]\n");
        assert!(e.message.contains("/proc"));
        let e = err("[profile.a.env]\nset = { LD_PRELOAD = \"/x.so\" }\n");
        assert!(e.message.contains("always blocked"), "{e}");
        assert_eq!(e.line, Some(2));
        let e = err("[profile.a.env]\npass = [\"OK\", \"NODE_OPTIONS\"]\n");
        assert!(e.message.contains("always blocked"));
    }

    #[test]
    fn conflicts_with_inherited_rules_are_errors() {
        let e = err("[profile.a.filesystem]\nread_only = [\"/a:/x\"]\n[profile.b]\nextends = \"a\"\n[profile.b.filesystem]\nread_write = [\"/b:/x\"]\n");
        assert!(e.message.contains("mounted twice"), "{e}");
        let e = err("[profile.a.env]\nset = { TOKEN = \"x\" }\n[profile.b]\nextends = \"a\"\n[profile.b.env]\nblock = [\"TOK*\"]\n");
        assert!(e.message.contains("TOKEN"), "{e}");
        let e = err("[profile.a.filesystem]\nsystem = [\"/usr\", \"/tmp\"]\n");
        assert_eq!(e.key, "profile.a.filesystem.system");
    }

    #[test]
    fn merged_limits_are_checked() {
        let e = err("[profile.a.limits]\noutput = \"128MiB\"\n");
        assert_eq!(e.key, "profile.a.limits.output_kill", "{e}");
        let e = err("[profile.a.limits]\ncpu_millicores = 5\n");
        assert_eq!(e.key, "profile.a.limits.cpu_millicores");
    }

    #[test]
    fn network_section() {
        let c = Config::parse(
            "[profile.n]\nextends = \"code\"\n[profile.n.network]\nmode = \"allow\"\nallow_domains = [\"pypi.org\", \"*.pythonhosted.org:443\"]\nallow_cidrs = [\"127.0.0.1/32\"]\nhosts = { \"pypi.test\" = \"127.0.0.1\" }\n",
            None,
        )
        .unwrap();
        let n = &c.profile("n").unwrap().network;
        assert_eq!(n.mode, crate::network::NetworkMode::Allow);
        assert_eq!(n.allow_domains[1].ports, [443]);
        assert_eq!(n.hosts["pypi.test"].to_string(), "127.0.0.1");
        let e = err("[profile.n.network]\nmode = \"open\"\n");
        assert_eq!(
            (e.line, e.key.as_str()),
            (Some(2), "profile.n.network.mode")
        );
        let e = err("[profile.n.network]\nallow_domains = [\"ok.org\",\n  \"1.2.3.4\"]\n");
        assert_eq!(e.line, Some(3));
        let e = err("[profile.n.network]\nallow_cidrs = [\"10.0.0.1/8\"]\n");
        assert!(e.message.contains("host bits"));
        let e = err("[profile.n.network]\nhosts = { \"a.test\" = \"nope\" }\n");
        assert_eq!(e.key, "profile.n.network.hosts.a.test");
        let e = err("[profile.n.network]\ndeny_domains = [\"bad.test:8080\"]\n");
        assert_eq!(
            (e.line, e.key.as_str()),
            (Some(2), "profile.n.network.deny_domains")
        );
        assert!(e.message.contains("every port"), "{}", e.message);
    }

    #[test]
    fn server_section() {
        let hash = "a".repeat(64);
        let c = Config::parse(
            &format!("[server]\nlisten = \"127.0.0.1:9000\"\nmax_concurrent = 2\ncode_mode = true\n[[server.tenant]]\nname = \"acme\"\ntoken_sha256 = \"{hash}\"\nprofiles = [\"code\"]\n"),
            None,
        )
        .unwrap();
        assert_eq!(c.server.listen.port(), 9000);
        assert_eq!(
            c.server.tenants[0].max_concurrent, 2,
            "inherits the global cap"
        );
        assert!(c.server.code_mode);
        let e = err("[server]\nlisten = \"nowhere\"\n");
        assert_eq!((e.line, e.key.as_str()), (Some(2), "server.listen"));
        let e = err("[[server.tenant]]\nname = \"a\"\ntoken_sha256 = \"plaintext-token\"\nprofiles = [\"code\"]\n");
        assert_eq!(e.key, "server.tenant.token_sha256");
        let e = err(&format!(
            "[[server.tenant]]\nname = \"a\"\ntoken_sha256 = \"{hash}\"\nprofiles = [\"nope\"]\n"
        ));
        assert!(e.message.contains("unknown profile"), "{e}");
        let e = err("[server]\nbogus = 1\n");
        assert!(e.message.contains("bogus"), "{e}");
    }

    #[test]
    fn server_paths_must_be_absolute() {
        for field in ["audit_db", "audit_jsonl", "work_dir"] {
            for bad in ["relative/x", "x", ""] {
                let e = err(&format!(
                    "[server]\nlisten = \"127.0.0.1:1\"\n{field} = \"{bad}\"\n"
                ));
                assert_eq!(
                    (e.line, e.key.as_str()),
                    (Some(3), format!("server.{field}").as_str()),
                    "{e}"
                );
                assert!(e.message.contains("absolute"), "{e}");
            }
            let c = Config::parse(&format!("[server]\n{field} = \"/srv/x\"\n"), None).unwrap();
            let s = &c.server;
            let got = match field {
                "audit_db" => s.audit_db.clone(),
                "audit_jsonl" => s.audit_jsonl.clone().unwrap(),
                _ => s.work_dir.clone(),
            };
            assert_eq!(got, Path::new("/srv/x"));
        }
    }

    #[test]
    fn security_section() {
        let c = Config::parse("[profile.s]\nextends = \"code\"\n[profile.s.security]\nseccomp = \"strict\"\nlandlock = \"best-effort\"\ntcp_connect = [443]\n", None).unwrap();
        let s = &c.profile("s").unwrap().security;
        assert_eq!(s.seccomp, SeccompProfile::Strict);
        assert_eq!(s.landlock, LandlockMode::BestEffort);
        assert_eq!(s.tcp_connect, [443]);
        let e = err("[profile.s.security]\nseccomp = \"off\"\n");
        assert_eq!(
            (e.line, e.key.as_str()),
            (Some(2), "profile.s.security.seccomp")
        );
        let e = err("[profile.s.security]\ntcp_bind = [80, 70000]\n");
        assert_eq!(e.line, Some(2));
    }

    #[test]
    fn extends_cycle_is_an_error() {
        let e = err("[profile.a]\nextends = \"b\"\n[profile.b]\nextends = \"a\"\n");
        assert!(e.message.contains("cycle"), "{e}");
    }
}

//! `[[server.mcp_server]]`: the supervised MCP servers of `corral serve`,
//! checked once the tenants and profiles are known.
//!
//! Every rule here guards what the supervisor will start: which program
//! (`runtime` and `entry`, inside `dir`, never an absolute path), with
//! which arguments (the argument deny patterns) and environment (declared
//! keys only, never an injection variable or one the runtime sets), for
//! which tenants and under which profile.

use std::ops::Range;
use std::path::{Component, Path, PathBuf};

use toml::Spanned;

use super::apply::parse_size;
use super::raw::{RawLog, RawMcpServer, RawRestart, RawSize, RawTools};
use super::{known, Config, ConfigError, Source};
use crate::env::{validate_name, Blocklist};
use crate::mcp_server::{
    denied_argument, McpRuntime, McpServer, ProcessMode, StartPolicy, ToolFilter,
};
use crate::server::Tenant;
use crate::size::ByteSize;

/// The dotted key of every entry.
const K: &str = "server.mcp_server";

/// Environment keys the runtime sets itself for every server: declaring
/// one would let the config (or corral's own environment) replace them.
const RUNTIME_SET_ENV: &[&str] = &["PATH", "HOME", "TMPDIR", "SHELL", "ZDOTDIR", "PWD", "USER"];

/// The largest value of a `*_secs` key: one year. Larger values serve no
/// purpose and would overflow the supervisor's clock arithmetic.
const MAX_SECS: u64 = 365 * 24 * 3600;

/// Bounds of `max_message_bytes`.
const MESSAGE_BYTES: (u64, u64) = (1 << 10, 1 << 30);

/// Bounds of `log.line_max_bytes`.
const LINE_BYTES: (u64, u64) = (64, 1 << 20);

/// Builds every `[[server.mcp_server]]` entry in config order: names
/// unique, tenants among `tenants`, profiles among `config`'s.
pub(super) fn apply_mcp_servers(
    src: &Source,
    raw: Vec<Spanned<RawMcpServer>>,
    tenants: &[Tenant],
    config: &Config,
) -> Result<Vec<McpServer>, ConfigError> {
    let mut out: Vec<McpServer> = Vec::new();
    for entry in raw {
        let name_span = entry.get_ref().name.span();
        let server = apply_one(src, entry, tenants, config)?;
        if out.iter().any(|s| s.name == server.name) {
            return Err(err(
                src,
                name_span,
                "name",
                format!(
                    "server `{}` is defined twice: names are unique (each is the path /mcp/servers/NAME); rename one",
                    server.name
                ),
            ));
        }
        out.push(server);
    }
    Ok(out)
}

/// An error about `server.mcp_server.{field}` at `span`.
fn err(src: &Source, span: Range<usize>, field: &str, message: impl Into<String>) -> ConfigError {
    src.err(Some(span), format!("{K}.{field}"), message)
}

/// One entry.
fn apply_one(
    src: &Source,
    entry: Spanned<RawMcpServer>,
    tenants: &[Tenant],
    config: &Config,
) -> Result<McpServer, ConfigError> {
    let entry_span = entry.span();
    let r = entry.into_inner();
    let name = check_name(src, &r.name)?;
    let runtime = runtime(src, &r.runtime)?;
    let dir = check_dir(src, &r.dir)?;
    let entry_name = match (&r.entry, runtime) {
        (None, McpRuntime::Deployed) => String::new(),
        (Some(e), McpRuntime::Deployed) => {
            return Err(err(
                src,
                e.span(),
                "entry",
                "a deployed tree's manifest names its entry: remove `entry`".to_string(),
            ))
        }
        (Some(e), _) => check_entry(src, runtime, e)?,
        (None, _) => {
            return Err(err(
                src,
                entry_span.clone(),
                "entry",
                format!(
                    "runtime {} needs an `entry` (what runs inside dir)",
                    runtime.as_str()
                ),
            ))
        }
    };
    let mut s = McpServer::new(&name, runtime, dir, &entry_name);
    if let Some(source) = &r.source {
        if runtime != McpRuntime::Deployed {
            return Err(err(
                src,
                source.span(),
                "source",
                "`source` is for runtime \"deployed\" (corral deploy --config F --server NAME installs it into dir)".to_string(),
            ));
        }
        let p = PathBuf::from(source.get_ref());
        if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
            return Err(err(
                src,
                source.span(),
                "source",
                format!("{:?} is not an absolute path without `..`: write the source directory's full path", source.get_ref()),
            ));
        }
        s.source = Some(p);
    }
    if let Some(package) = &r.package {
        let refuse = |m: String| Err(err(src, package.span(), "package", m));
        if runtime != McpRuntime::Deployed {
            return refuse("`package` is for runtime \"deployed\" (corral deploy --config F --server NAME installs it into dir; nothing is fetched at serve time)".to_string());
        }
        if s.source.is_some() {
            return refuse(
                "give `source` (a directory) or `package` (npm:NAME@X.Y.Z, pypi:NAME==X.Y), not both"
                    .to_string(),
            );
        }
        match crate::package::PackageSpec::parse(package.get_ref()) {
            Ok(p) => s.package = Some(p),
            Err(e) => return refuse(e.to_string()),
        }
    }
    s.tenants = check_tenants(src, r.tenants, entry_span, tenants)?;
    for arg in r.args.unwrap_or_default() {
        if let Some(why) = denied_argument(arg.get_ref()) {
            return Err(err(
                src,
                arg.span(),
                "args",
                format!(
                    "argument {:?} is refused (command.args_denied): it {why}; \
                     arguments reach the program as they are, never through a shell: write plain values",
                    arg.get_ref()
                ),
            ));
        }
        s.args.push(arg.into_inner());
    }
    s.env = check_env(src, r.env.unwrap_or_default())?;
    for (key, value) in r.env_values.unwrap_or_default() {
        if !s.env.contains(&key) {
            return Err(err(
                src,
                value.span(),
                "env_values",
                format!(
                    "`{key}` has a value but is not declared: declare it in env \
                     (only declared keys reach the server)"
                ),
            ));
        }
        if value.get_ref().contains('\0') {
            return Err(err(
                src,
                value.span(),
                "env_values",
                format!("the value of `{key}` contains a NUL byte, which no environment can hold"),
            ));
        }
        s.env_values.insert(key, value.into_inner());
    }
    if let Some(p) = r.profile {
        if !config.has_profile(p.get_ref()) {
            return Err(err(
                src,
                p.span(),
                "profile",
                format!(
                    "unknown profile `{}` (known: {}); name a built-in profile or one of this file",
                    p.get_ref(),
                    known(config)
                ),
            ));
        }
        s.profile = p.into_inner();
    }
    if let Some(m) = r.mode {
        s.mode = match m.get_ref().as_str() {
            "shared" => ProcessMode::Shared,
            "per-tenant" => ProcessMode::PerTenant,
            "per-session" => ProcessMode::PerSession,
            other => {
                return Err(err(
                    src,
                    m.span(),
                    "mode",
                    format!(
                        "unknown process mode `{other}`: use \"shared\", \"per-tenant\" or \"per-session\""
                    ),
                ))
            }
        };
    }
    if let Some(v) = r.start {
        s.start = match v.get_ref().as_str() {
            "on-demand" => StartPolicy::OnDemand,
            "boot" => StartPolicy::Boot,
            other => {
                return Err(err(
                    src,
                    v.span(),
                    "start",
                    format!("unknown start policy `{other}`: use \"on-demand\" or \"boot\""),
                ))
            }
        };
    }
    if let Some(v) = r.idle_stop_secs {
        let secs = bounded(src, "idle_stop_secs", &v, 0, MAX_SECS)?;
        s.idle_stop_secs = (secs > 0).then_some(secs);
    }
    if let Some(v) = r.startup_timeout_secs {
        s.startup_timeout_secs = bounded(src, "startup_timeout_secs", &v, 1, MAX_SECS)?;
    }
    if let Some(v) = r.request_timeout_secs {
        s.request_timeout_secs = bounded(src, "request_timeout_secs", &v, 1, MAX_SECS)?;
    }
    for (field, value, target) in [
        ("max_processes", r.max_processes, &mut s.max_processes),
        (
            "max_processes_per_tenant",
            r.max_processes_per_tenant,
            &mut s.max_processes_per_tenant,
        ),
        ("max_sessions", r.max_sessions, &mut s.max_sessions),
        (
            "max_sessions_per_tenant",
            r.max_sessions_per_tenant,
            &mut s.max_sessions_per_tenant,
        ),
    ] {
        if let Some(v) = value {
            if *v.get_ref() == 0 {
                return Err(err(
                    src,
                    v.span(),
                    field,
                    "must be at least 1 (0 would refuse every request)",
                ));
            }
            *target = v.into_inner();
        }
    }
    if let Some(v) = r.max_message_bytes {
        s.max_message_bytes = size_in(src, "max_message_bytes", v, MESSAGE_BYTES)?;
    }
    if let Some(b) = r.audit_arguments {
        s.audit_arguments = b;
    }
    if let Some(t) = r.tools {
        s.tools = tools(src, t)?;
    }
    if let Some(rs) = r.restart {
        restart(src, &mut s, rs)?;
    }
    if let Some(l) = r.log {
        log(src, &mut s, l)?;
    }
    Ok(s)
}

/// `name`: `[a-z0-9][a-z0-9_-]{0,62}`, a URL path segment as it is.
fn check_name(src: &Source, name: &Spanned<String>) -> Result<String, ConfigError> {
    let n = name.get_ref();
    let ok = (1..=63).contains(&n.len())
        && n.bytes().enumerate().all(|(i, b)| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || (i > 0 && matches!(b, b'_' | b'-'))
        });
    if !ok {
        return Err(err(
            src,
            name.span(),
            "name",
            format!(
                "server name {n:?} is invalid: use 1 to 63 lower-case letters, digits, `_` and `-`, \
                 starting with a letter or digit (it is the URL path segment of /mcp/servers/NAME)"
            ),
        ));
    }
    Ok(n.clone())
}

/// `runtime`: `python3`, `node`, `npx` or `uvx`.
fn runtime(src: &Source, v: &Spanned<String>) -> Result<McpRuntime, ConfigError> {
    Ok(match v.get_ref().as_str() {
        "python3" => McpRuntime::Python3,
        "node" => McpRuntime::Node,
        "npx" => McpRuntime::Npx,
        "uvx" => McpRuntime::Uvx,
        "deployed" => McpRuntime::Deployed,
        other => {
            return Err(err(
                src,
                v.span(),
                "runtime",
                format!(
                    "unknown runtime `{other}`: use \"python3\", \"node\", \"npx\", \"uvx\" or \"deployed\" \
                     (an arbitrary command is never started)"
                ),
            ))
        }
    })
}

/// `dir`: absolute, without `..`, not the root; returned without `.`
/// components, doubled or trailing slashes.
fn check_dir(src: &Source, v: &Spanned<String>) -> Result<PathBuf, ConfigError> {
    let text = v.get_ref();
    let fail = |why: &str| Err(err(src, v.span(), "dir", format!("{text:?} {why}")));
    let p = Path::new(text);
    if !p.is_absolute() {
        return fail("is not an absolute path: write the full path of the installed tree");
    }
    if text.chars().any(char::is_control) {
        return fail("contains a control character: write a plain path");
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return fail(
            "has a `..` component: write the tree's path without `..` (it is mounted at that same path)",
        );
    }
    let clean: PathBuf = p.components().collect();
    if clean == Path::new("/") {
        return fail(
            "is the root: the tree is mounted read-only into the sandbox, so name the directory holding the server alone",
        );
    }
    Ok(clean)
}

/// `entry`, by runtime: a relative path inside `dir` (python3, node), an
/// npm package name (npx) or a console script name (uvx).
fn check_entry(
    src: &Source,
    runtime: McpRuntime,
    v: &Spanned<String>,
) -> Result<String, ConfigError> {
    let e = v.get_ref();
    let fail = |why: String| Err(err(src, v.span(), "entry", format!("{e:?} {why}")));
    match runtime {
        McpRuntime::Python3 | McpRuntime::Node => {
            let p = Path::new(e);
            if p.is_absolute() {
                return fail(format!(
                    "is an absolute path: write the program's path relative to dir (an absolute entry \
                     could name any program of the host, such as /bin/bash); for runtime {} it is a file \
                     inside dir",
                    runtime.as_str()
                ));
            }
            if e.chars().any(char::is_control) {
                return fail("contains a control character: write a plain relative path".into());
            }
            if p.components().any(|c| c == Component::ParentDir) {
                return fail(
                    "has a `..` component: the entry must stay inside dir; write its path below dir"
                        .into(),
                );
            }
            if !p.components().any(|c| matches!(c, Component::Normal(_))) || e.ends_with('/') {
                return fail(
                    "names no file: write the path of the program below dir, such as \"server.py\""
                        .into(),
                );
            }
        }
        McpRuntime::Npx => {
            if let Some(why) = npm_name_problem(e) {
                return fail(format!(
                    "is not an npm package name: {why}; write `pkg` or `@scope/pkg` as installed in \
                     DIR/node_modules"
                ));
            }
        }
        McpRuntime::Uvx => {
            let ok = !e.is_empty()
                && e.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
                && !e.starts_with('.');
            if !ok {
                return fail(
                    "is not a console script name: use letters, digits, `.`, `_` and `-`, not starting \
                     with `.` (the name of a script in DIR/.venv/bin)"
                        .into(),
                );
            }
        }
        // Its manifest names the entry (checked by the caller).
        McpRuntime::Deployed => {}
    }
    Ok(e.clone())
}

/// Why `name` is not a valid name of a new npm package (npm's
/// validate-npm-package-name rules), if it is not.
fn npm_name_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("it is empty");
    }
    if name.len() > 214 {
        return Some("it is longer than 214 characters");
    }
    if name.trim() != name {
        return Some("it has leading or trailing spaces");
    }
    let (scope, package) = match name.strip_prefix('@') {
        Some(rest) => match rest.split_once('/') {
            Some((scope, package)) => (Some(scope), package),
            None => return Some("a scoped name is `@scope/pkg`"),
        },
        None => (None, name),
    };
    for part in scope.into_iter().chain([package]) {
        if part.is_empty() {
            return Some("a scope or package part is empty");
        }
        if part.starts_with('.') || part.starts_with('_') {
            return Some("a name cannot start with `.` or `_`");
        }
        if part.bytes().any(|b| b.is_ascii_uppercase()) {
            return Some("new package names are lower-case");
        }
        if !part.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_')
        }) {
            return Some("use lower-case letters, digits, `-`, `.` and `_` only");
        }
    }
    if scope.is_none() && matches!(package, "node_modules" | "favicon.ico") {
        return Some("that name is reserved by npm");
    }
    None
}

/// `tenants`: required and non-empty when the server has tenants, absent
/// or empty when it has none; each a `[[server.tenant]]` name, once.
fn check_tenants(
    src: &Source,
    v: Option<Spanned<Vec<Spanned<String>>>>,
    entry_span: Range<usize>,
    tenants: &[Tenant],
) -> Result<Vec<String>, ConfigError> {
    let (span, list) = match v {
        Some(v) => (v.span(), v.into_inner()),
        None => (entry_span, Vec::new()),
    };
    if tenants.is_empty() {
        if let Some(first) = list.first() {
            return Err(err(
                src,
                first.span(),
                "tenants",
                format!(
                    "tenant `{}` is listed but the server has no [[server.tenant]]: an anonymous \
                     loopback server has no tenants to name; remove tenants, or define the tenant",
                    first.get_ref()
                ),
            ));
        }
        return Ok(Vec::new());
    }
    if list.is_empty() {
        return Err(err(
            src,
            span,
            "tenants",
            format!(
                "list the tenants that may reach this server (known: {}): the server has tenants, \
                 and a server no tenant may reach would never run",
                tenants
                    .iter()
                    .map(|t| t.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for t in list {
        if !tenants.iter().any(|x| &x.name == t.get_ref()) {
            return Err(err(
                src,
                t.span(),
                "tenants",
                format!(
                    "unknown tenant `{}`: list names of [[server.tenant]] entries",
                    t.get_ref()
                ),
            ));
        }
        if out.contains(t.get_ref()) {
            return Err(err(
                src,
                t.span(),
                "tenants",
                format!("tenant `{}` is listed twice; list it once", t.get_ref()),
            ));
        }
        out.push(t.into_inner());
    }
    Ok(out)
}

/// `env`: well-formed names, once each, none always blocked (a
/// declaration does not lift the blocklist) and none the runtime sets.
fn check_env(src: &Source, list: Vec<Spanned<String>>) -> Result<Vec<String>, ConfigError> {
    let blocklist = Blocklist::new(&[]).expect("the built-in blocklist is valid");
    let mut out: Vec<String> = Vec::new();
    for name in list {
        let n = name.get_ref();
        validate_name(n).map_err(|e| err(src, name.span(), "env", e.to_string()))?;
        if let Some((rule, why)) = blocklist.matching(n) {
            return Err(err(
                src,
                name.span(),
                "env",
                format!(
                    "`{n}` is always blocked (env.blocked: rule `{rule}`: {why}), even when declared; \
                     remove it, and configure the server some other way (arguments, a file in dir)"
                ),
            ));
        }
        if RUNTIME_SET_ENV.contains(&n.as_str()) {
            return Err(err(
                src,
                name.span(),
                "env",
                format!(
                    "`{n}` cannot be declared (env.blocked): the runtime sets it for every server \
                     ({}); remove it",
                    RUNTIME_SET_ENV.join(", ")
                ),
            ));
        }
        if out.contains(n) {
            return Err(err(
                src,
                name.span(),
                "env",
                format!("`{n}` is declared twice; declare it once"),
            ));
        }
        out.push(name.into_inner());
    }
    Ok(out)
}

/// An integer between `min` and `max`, both included.
fn bounded(
    src: &Source,
    field: &str,
    v: &Spanned<u64>,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    let n = *v.get_ref();
    if n < min {
        return Err(err(
            src,
            v.span(),
            field,
            format!("{n} is too small: use {min} to {max}"),
        ));
    }
    if n > max {
        return Err(err(
            src,
            v.span(),
            field,
            format!("{n} is too large: use {min} to {max}"),
        ));
    }
    Ok(n)
}

/// A size between `bounds.0` and `bounds.1`, both included.
fn size_in(
    src: &Source,
    field: &str,
    v: Spanned<RawSize>,
    bounds: (u64, u64),
) -> Result<ByteSize, ConfigError> {
    let span = v.span();
    let value = parse_size(src, &format!("{K}.{field}"), v)?;
    let (min, max) = (ByteSize(bounds.0), ByteSize(bounds.1));
    if value < min || value > max {
        let end = if value < min { "small" } else { "large" };
        return Err(err(
            src,
            span,
            field,
            format!("{value} is too {end}: use {min} to {max}"),
        ));
    }
    Ok(value)
}

/// `[server.mcp_server.tools]`: `pick` or `omit`, non-empty distinct names.
fn tools(src: &Source, t: RawTools) -> Result<ToolFilter, ConfigError> {
    let names = |field: &str, list: Spanned<Vec<Spanned<String>>>| {
        let mut out: Vec<String> = Vec::new();
        for n in list.into_inner() {
            if n.get_ref().trim().is_empty() {
                return Err(err(
                    src,
                    n.span(),
                    &format!("tools.{field}"),
                    "a tool name is empty: list the tool names the server offers",
                ));
            }
            if out.contains(n.get_ref()) {
                return Err(err(
                    src,
                    n.span(),
                    &format!("tools.{field}"),
                    format!("tool `{}` is listed twice; list it once", n.get_ref()),
                ));
            }
            out.push(n.into_inner());
        }
        Ok(out)
    };
    match (t.pick, t.omit) {
        (Some(_), Some(omit)) => Err(err(
            src,
            omit.span(),
            "tools",
            "give pick or omit, not both: pick lists the only tools clients see, omit the ones they do not",
        )),
        (Some(pick), None) => {
            let pick_span = pick.span();
            let list = names("pick", pick)?;
            if list.is_empty() {
                return Err(err(
                    src,
                    pick_span,
                    "tools.pick",
                    "pick lists no tool, so clients would see none: list at least one, or remove tools",
                ));
            }
            Ok(ToolFilter::Pick(list))
        }
        (None, Some(omit)) => {
            let list = names("omit", omit)?;
            Ok(if list.is_empty() {
                ToolFilter::All
            } else {
                ToolFilter::Omit(list)
            })
        }
        (None, None) => Ok(ToolFilter::All),
    }
}

/// `[server.mcp_server.restart]`, on top of the defaults.
fn restart(src: &Source, s: &mut McpServer, r: RawRestart) -> Result<(), ConfigError> {
    let p = &mut s.restart;
    if let Some(v) = r.max_restarts {
        p.max_restarts = v.into_inner();
    }
    if let Some(v) = r.window_secs {
        p.window_secs = bounded(src, "restart.window_secs", &v, 1, MAX_SECS)?;
    }
    let initial_span = r.backoff_initial_ms.as_ref().map(Spanned::span);
    if let Some(v) = r.backoff_initial_ms {
        p.backoff_initial_ms = bounded(src, "restart.backoff_initial_ms", &v, 1, MAX_SECS * 1000)?;
    }
    let max_span = r.backoff_max_ms.as_ref().map(Spanned::span);
    let max_given = max_span.is_some();
    if let Some(v) = r.backoff_max_ms {
        p.backoff_max_ms = bounded(src, "restart.backoff_max_ms", &v, 1, MAX_SECS * 1000)?;
    }
    if p.backoff_max_ms < p.backoff_initial_ms {
        let (span, field) = match max_span {
            Some(s) => (Some(s), "backoff_max_ms"),
            None => (initial_span, "backoff_initial_ms"),
        };
        return Err(src.err(
            span,
            format!("{K}.restart.{field}"),
            format!(
                "backoff_max_ms ({}{}) is below backoff_initial_ms ({}): the largest delay must be at \
                 least the first; raise backoff_max_ms or lower backoff_initial_ms",
                p.backoff_max_ms,
                if max_given { "" } else { ", the default" },
                p.backoff_initial_ms
            ),
        ));
    }
    if let Some(v) = r.stable_after_secs {
        p.stable_after_secs = bounded(src, "restart.stable_after_secs", &v, 1, MAX_SECS)?;
    }
    Ok(())
}

/// `[server.mcp_server.log]`, on top of the defaults.
fn log(src: &Source, s: &mut McpServer, l: RawLog) -> Result<(), ConfigError> {
    if let Some(v) = l.lines_per_second {
        if *v.get_ref() == 0 {
            return Err(err(
                src,
                v.span(),
                "log.lines_per_second",
                "must be at least 1 (0 would drop every line of stderr)",
            ));
        }
        s.log.lines_per_second = v.into_inner();
    }
    if let Some(v) = l.line_max_bytes {
        s.log.line_max_bytes = size_in(src, "log.line_max_bytes", v, LINE_BYTES)?.bytes();
    }
    if let Some(v) = l.summary_secs {
        s.log.summary_secs = bounded(src, "log.summary_secs", &v, 1, MAX_SECS)?;
    }
    Ok(())
}

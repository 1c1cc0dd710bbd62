//! The `[server]` section: how `corral serve` listens, its files, and
//! its tenants.

use std::path::PathBuf;

use toml::Spanned;

use super::apply::size;
use super::raw::{RawServer, RawTenant};
use super::{Config, ConfigError, Source};
use crate::server::{valid_token_hash, AuditOutputs, ServerConfig, Tenant, MAX_MCP_SESSION_QUEUE};

/// Builds the `corral serve` settings from the `[server]` section; tenant
/// profiles must exist in `config`.
pub(super) fn apply_server(
    src: &Source,
    raw: Spanned<RawServer>,
    config: &Config,
) -> Result<ServerConfig, ConfigError> {
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
    if let Some(b) = raw.unbounded_workspaces {
        s.unbounded_workspaces = b;
    }
    if let Some(m) = raw.tenant_workspace_bytes {
        s.tenant_workspace_bytes = size(src, &format!("{k}.tenant_workspace_bytes"), m)?.bytes();
    }
    if let Some(m) = raw.tenant_answer_bytes {
        s.tenant_answer_bytes = size(src, &format!("{k}.tenant_answer_bytes"), m)?.bytes();
    }
    if let Some(o) = raw.audit_outputs {
        s.audit_outputs = match o.get_ref().as_str() {
            "digest" => AuditOutputs::Digest,
            "full" => AuditOutputs::Full,
            other => {
                return Err(src.err(
                    Some(o.span()),
                    format!("{k}.audit_outputs"),
                    format!("`{other}` is not one of `digest` (SHA-256 and sizes only) or `full` (also the text, cut at audit_output_max_bytes)"),
                ))
            }
        };
    }
    if let Some(m) = raw.audit_output_max_bytes {
        s.audit_output_max_bytes = size(src, &format!("{k}.audit_output_max_bytes"), m)?.bytes();
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
    if let Some(m) = raw.max_connections {
        if *m.get_ref() < 16 {
            return Err(src.err(
                Some(m.span()),
                format!("{k}.max_connections"),
                "must be at least 16 (leave it out to follow the open-file limit)",
            ));
        }
        s.max_connections = Some(m.into_inner());
    }
    for (value, field, slot) in [
        (
            raw.header_timeout_secs,
            "header_timeout_secs",
            &mut s.header_timeout_secs,
        ),
        (
            raw.body_timeout_secs,
            "body_timeout_secs",
            &mut s.body_timeout_secs,
        ),
        (
            raw.write_stall_secs,
            "write_stall_secs",
            &mut s.write_stall_secs,
        ),
        (
            raw.mcp_pressure_idle_secs,
            "mcp_pressure_idle_secs",
            &mut s.mcp_pressure_idle_secs,
        ),
    ] {
        if let Some(v) = value {
            if !(1..=3600).contains(v.get_ref()) {
                return Err(src.err(
                    Some(v.span()),
                    format!("{k}.{field}"),
                    "must be 1 to 3600 seconds",
                ));
            }
            *slot = v.into_inner();
        }
    }
    if let Some(q) = raw.mcp_session_queue {
        if *q.get_ref() > MAX_MCP_SESSION_QUEUE {
            return Err(src.err(
                Some(q.span()),
                format!("{k}.mcp_session_queue"),
                format!("must be 0 to {MAX_MCP_SESSION_QUEUE} (calls waiting behind a session's running one)"),
            ));
        }
        s.mcp_session_queue = q.into_inner();
    }
    if let Some(m) = raw.max_request_bytes {
        s.max_request_bytes = size(src, &format!("{k}.max_request_bytes"), m)?.bytes();
    }
    for o in raw.allowed_origins.unwrap_or_default() {
        let origin = o.get_ref().trim_end_matches('/').to_ascii_lowercase();
        if !valid_origin(&origin) {
            return Err(src.err(
                Some(o.span()),
                format!("{k}.allowed_origins"),
                format!(
                    "`{}` is not an origin: write scheme://host or scheme://host:port (http or https, no path), \
                     exactly as browsers send it in the Origin header",
                    o.get_ref()
                ),
            ));
        }
        s.allowed_origins.push(origin);
    }
    for h in raw.allowed_hosts.unwrap_or_default() {
        let host = h.get_ref().to_ascii_lowercase();
        if !valid_host(&host) {
            return Err(src.err(
                Some(h.span()),
                format!("{k}.allowed_hosts"),
                format!(
                    "`{}` is not a host name: write a name or address, optionally with :PORT (no scheme, no path)",
                    h.get_ref()
                ),
            ));
        }
        s.allowed_hosts.push(host);
    }
    for t in raw.tenant {
        let tenant = apply_tenant(src, t, &s, config)?;
        s.tenants.push(tenant);
    }
    // After the tenants: a server names the tenants that may reach it.
    s.mcp_servers = super::mcp_server::apply_mcp_servers(src, raw.mcp_server, &s.tenants, config)?;
    Ok(s)
}

/// `http(s)://host[:port]`, lowercase, without a path.
fn valid_origin(o: &str) -> bool {
    let Some(rest) = o
        .strip_prefix("https://")
        .or_else(|| o.strip_prefix("http://"))
    else {
        return false;
    };
    valid_host(rest)
}

/// A host name or IP literal (`[v6]` included), optionally `:PORT`.
fn valid_host(h: &str) -> bool {
    let (name, port) = match h.rsplit_once(':') {
        Some((n, p)) if !n.ends_with(':') && (!n.starts_with('[') || n.ends_with(']')) => {
            (n, Some(p))
        }
        _ => (h, None),
    };
    let name_ok = if let Some(v6) = name.strip_prefix('[').and_then(|n| n.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !name.is_empty()
            && name.len() <= 253
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    };
    name_ok && port.is_none_or(|p| p.parse::<u16>().is_ok_and(|p| p > 0))
}

/// One `[[server.tenant]]` entry, checked against the tenants before it
/// (`s.tenants`: no name or token twice) and the known profiles; without
/// its own `max_concurrent` it gets the server's.
fn apply_tenant(
    src: &Source,
    t: Spanned<RawTenant>,
    s: &ServerConfig,
    config: &Config,
) -> Result<Tenant, ConfigError> {
    let k = "server.tenant";
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
            format!("{k}.name"),
            format!("tenant name {name:?} is invalid: use letters, digits, `_`, `-` and `.`"),
        ));
    }
    if s.tenants.iter().any(|x: &Tenant| x.name == name) {
        return Err(src.err(
            Some(span),
            format!("{k}.name"),
            format!("tenant `{name}` is defined twice"),
        ));
    }
    let hash = t.token_sha256.get_ref().to_ascii_lowercase();
    if !valid_token_hash(&hash) {
        return Err(src.err(
            Some(t.token_sha256.span()),
            format!("{k}.token_sha256"),
            "must be the SHA-256 of the token as 64 hex digits (e.g. `printf %s TOKEN | sha256sum`); the token itself is never stored",
        ));
    }
    if s.tenants.iter().any(|x| x.token_sha256 == hash) {
        return Err(src.err(
            Some(t.token_sha256.span()),
            format!("{k}.token_sha256"),
            "two tenants share a token",
        ));
    }
    if t.profiles.get_ref().is_empty() {
        return Err(src.err(
            Some(t.profiles.span()),
            format!("{k}.profiles"),
            "list at least one profile",
        ));
    }
    for p in t.profiles.get_ref() {
        if !config.has_profile(p) {
            return Err(src.err(
                Some(t.profiles.span()),
                format!("{k}.profiles"),
                format!("unknown profile `{p}`"),
            ));
        }
    }
    let max_concurrent = match t.max_concurrent {
        Some(m) if *m.get_ref() == 0 => {
            return Err(src.err(
                Some(m.span()),
                format!("{k}.max_concurrent"),
                "must be at least 1",
            ));
        }
        Some(m) => m.into_inner(),
        None => s.max_concurrent,
    };
    Ok(Tenant {
        name,
        token_sha256: hash,
        profiles: t.profiles.into_inner(),
        max_concurrent,
    })
}

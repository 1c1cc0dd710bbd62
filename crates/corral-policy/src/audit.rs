//! Structured audit events with stable reason codes.
//!
//! Every security decision corral takes (a command refused, an environment
//! variable stripped, ...) becomes one [`AuditEvent`]. The `code` strings are
//! a public contract: monitoring matches on them, so they never change
//! meaning once released.

use std::collections::BTreeMap;

use serde::Serialize;

/// How serious an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// A normal decision worth recording.
    Info,
    /// Something was removed or weakened; the run went on.
    Warn,
    /// The request was refused.
    Error,
}

/// Stable reason codes, serialised as dotted strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ReasonCode {
    /// An environment variable matched the blocklist and was stripped.
    #[serde(rename = "env.blocked")]
    EnvBlocked,
    /// The command is not in the profile's allowlist.
    #[serde(rename = "command.not_allowed")]
    CommandNotAllowed,
    /// The request named a path, and the profile allows only names.
    #[serde(rename = "command.path_rejected")]
    CommandPathRejected,
    /// The command line matched an argument deny pattern.
    #[serde(rename = "command.args_denied")]
    CommandArgsDenied,
    /// The allowed command is not installed where the sandbox can see it.
    #[serde(rename = "command.not_found")]
    CommandNotFound,
    /// The request was malformed (empty command, NUL byte).
    #[serde(rename = "command.invalid")]
    CommandInvalid,
    /// The run was explicitly started without namespaces (reduced mode).
    #[serde(rename = "sandbox.reduced")]
    SandboxReduced,
    /// Entries of writable binds were made read-only (the profile's
    /// `protect` list); `fields` name them and the placeholders made.
    #[serde(rename = "fs.protected")]
    FsProtected,
    /// The sandbox shares the host's network (mode `host`).
    #[serde(rename = "net.host")]
    NetHost,
    /// The proxy let a connection through.
    #[serde(rename = "net.allowed")]
    NetAllowed,
    /// The proxy refused a connection (`fields.reason` says why).
    #[serde(rename = "net.denied")]
    NetDenied,
    /// A permitted connection failed (resolution, connect, protocol).
    #[serde(rename = "net.error")]
    NetError,
    /// Cgroup limits the profile sets are not enforced on this run
    /// (`allow_unenforced`); `fields.limits` names them.
    #[serde(rename = "limits.unenforced")]
    LimitsUnenforced,
    /// The sandbox is about to start (a lifecycle event, `event: "run"`).
    #[serde(rename = "run.start")]
    RunStart,
    /// The run ended: outcome, exit code, signal (lifecycle).
    #[serde(rename = "run.exit")]
    RunExit,
    /// The wall-clock timeout killed the sandbox (lifecycle).
    #[serde(rename = "run.timeout")]
    RunTimeout,
    /// The kernel's OOM killer killed a process of the sandbox (lifecycle).
    #[serde(rename = "run.oom")]
    RunOom,
    /// A supervised MCP server was refused before (or instead of) starting:
    /// its command, an argument, a declared variable, a missing value.
    #[serde(rename = "mcp.server_refused")]
    McpServerRefused,
    /// A supervised MCP server's process started (`fields`: server,
    /// tenant, pid, attempt).
    #[serde(rename = "mcp.server_start")]
    McpServerStart,
    /// A supervised MCP server's process ended (`fields.requested` tells
    /// our own stop from a failure).
    #[serde(rename = "mcp.server_exit")]
    McpServerExit,
    /// A server failed too often in its window and is stopped.
    #[serde(rename = "mcp.crash_loop")]
    McpCrashLoop,
    /// A process logged faster than its limit: `fields.dropped` lines were
    /// dropped since the last summary.
    #[serde(rename = "mcp.log_rate_limit_exceeded")]
    McpLogRateLimited,
    /// One tool call through the bridge: tenant, server, tool, duration,
    /// outcome.
    #[serde(rename = "mcp.call")]
    McpCall,
    /// A message was refused: too large, not JSON-RPC, a tool the filter
    /// hides, a cap reached.
    #[serde(rename = "mcp.refused")]
    McpRefused,
    /// The service refused a request without a valid token (`fields`:
    /// error code, peer, method, path); rate-limited per peer address.
    #[serde(rename = "auth.refused")]
    AuthRefused,
    /// The service refused an authenticated request (a forbidden profile,
    /// limits above the ceilings, a path outside the workspace, another
    /// tenant's record, a foreign origin ...): `fields.error` is the API's
    /// stable error code.
    #[serde(rename = "api.refused")]
    ApiRefused,
}

impl ReasonCode {
    /// The stable string form, e.g. `env.blocked`.
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonCode::EnvBlocked => "env.blocked",
            ReasonCode::CommandNotAllowed => "command.not_allowed",
            ReasonCode::CommandPathRejected => "command.path_rejected",
            ReasonCode::CommandArgsDenied => "command.args_denied",
            ReasonCode::CommandNotFound => "command.not_found",
            ReasonCode::CommandInvalid => "command.invalid",
            ReasonCode::SandboxReduced => "sandbox.reduced",
            ReasonCode::FsProtected => "fs.protected",
            ReasonCode::NetHost => "net.host",
            ReasonCode::NetAllowed => "net.allowed",
            ReasonCode::NetDenied => "net.denied",
            ReasonCode::NetError => "net.error",
            ReasonCode::LimitsUnenforced => "limits.unenforced",
            ReasonCode::RunStart => "run.start",
            ReasonCode::RunExit => "run.exit",
            ReasonCode::RunTimeout => "run.timeout",
            ReasonCode::RunOom => "run.oom",
            ReasonCode::McpServerRefused => "mcp.server_refused",
            ReasonCode::McpServerStart => "mcp.server_start",
            ReasonCode::McpServerExit => "mcp.server_exit",
            ReasonCode::McpCrashLoop => "mcp.crash_loop",
            ReasonCode::McpLogRateLimited => "mcp.log_rate_limit_exceeded",
            ReasonCode::McpCall => "mcp.call",
            ReasonCode::McpRefused => "mcp.refused",
            ReasonCode::AuthRefused => "auth.refused",
            ReasonCode::ApiRefused => "api.refused",
        }
    }

    /// Whether this code is a lifecycle event of a run (`run.*`) rather
    /// than a security decision.
    pub fn is_lifecycle(self) -> bool {
        matches!(
            self,
            ReasonCode::RunStart
                | ReasonCode::RunExit
                | ReasonCode::RunTimeout
                | ReasonCode::RunOom
        )
    }
}

/// One security decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEvent {
    /// `"security"` for a security decision, `"run"` for a lifecycle event
    /// (`run.*` codes), `"mcp"` for the supervisor's (`mcp.*`), so JSON-lines consumers can tell our events from
    /// anything else on the same stream.
    pub event: &'static str,
    /// Severity.
    pub level: Level,
    /// Stable reason code.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub code: ReasonCode,
    /// A human-readable sentence.
    pub message: String,
    /// Structured details (the variable name, the rule, the command).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, serde_json::Value>,
}

impl AuditEvent {
    /// A new event with no fields.
    pub fn new(level: Level, code: ReasonCode, message: impl Into<String>) -> Self {
        AuditEvent {
            event: if code.is_lifecycle() {
                "run"
            } else if code.as_str().starts_with("mcp.") {
                "mcp"
            } else {
                "security"
            },
            level,
            code,
            message: message.into(),
            fields: BTreeMap::new(),
        }
    }

    /// Adds a structured field.
    pub fn with(mut self, key: &str, value: impl Into<serde_json::Value>) -> Self {
        self.fields.insert(key.to_string(), value.into());
        self
    }

    /// The event as one JSON line (no trailing newline).
    pub fn to_json_line(&self) -> String {
        // Serialising a struct of strings and JSON values cannot fail.
        serde_json::to_string(self).unwrap_or_else(|_| String::from("{}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serialises_stable_codes() {
        let e = AuditEvent::new(Level::Warn, ReasonCode::EnvBlocked, "stripped")
            .with("name", "LD_PRELOAD");
        let v: serde_json::Value = serde_json::from_str(&e.to_json_line()).unwrap();
        assert_eq!(v["code"], "env.blocked");
        assert_eq!(v["level"], "warn");
        assert_eq!(v["event"], "security");
        assert_eq!(v["fields"]["name"], "LD_PRELOAD");
        assert_eq!(
            ReasonCode::CommandArgsDenied.as_str(),
            "command.args_denied"
        );
        let exit = AuditEvent::new(Level::Info, ReasonCode::RunExit, "ended");
        let v: serde_json::Value = serde_json::from_str(&exit.to_json_line()).unwrap();
        assert_eq!(
            (v["event"].as_str(), v["code"].as_str()),
            (Some("run"), Some("run.exit"))
        );
        for code in [
            ReasonCode::LimitsUnenforced,
            ReasonCode::RunStart,
            ReasonCode::RunTimeout,
            ReasonCode::RunOom,
        ] {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str());
        }
    }
}

//! `[[server.mcp_server]]`: long-running MCP servers that `corral serve`
//! supervises, each in its own sandbox, bridged to clients over MCP
//! streamable HTTP at `/mcp/servers/{name}`.
//!
//! Everything here is the trusted configuration's view: which runtime runs
//! which pre-installed tree, with which arguments and declared environment,
//! for which tenants, under which lifecycle rules. Values from the data
//! plane (clients) never reach these types: a client can call a server,
//! never describe one (the MCP security best practices' "a proxy that can
//! spawn commands turns token theft into RCE").

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::size::ByteSize;

/// How a server's program is started inside its sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum McpRuntime {
    /// `python3 DIR/ENTRY` (the tree's `.venv` interpreter when it has one).
    Python3,
    /// `node DIR/ENTRY`.
    Node,
    /// A package installed in `DIR/node_modules`: `entry` names the package,
    /// its `bin` (else `main`) runs with `node`. Never the network at serve
    /// time.
    Npx,
    /// A console script installed in `DIR/.venv/bin` (or `DIR/bin`): `entry`
    /// names it; it runs with the venv's interpreter.
    Uvx,
    /// A tree `corral deploy` made: its `corral-manifest.json` names the
    /// runtime, the interpreter's venv and the entry (no `entry` here).
    Deployed,
}

impl McpRuntime {
    /// The config spelling: `python3`, `node`, `npx`, `uvx`.
    pub fn as_str(self) -> &'static str {
        match self {
            McpRuntime::Python3 => "python3",
            McpRuntime::Node => "node",
            McpRuntime::Npx => "npx",
            McpRuntime::Uvx => "uvx",
            McpRuntime::Deployed => "deployed",
        }
    }

    /// The built-in profile a server of this runtime gets by default
    /// (empty for a deployed tree: its manifest's runtime decides, at
    /// start-up).
    pub fn default_profile(self) -> &'static str {
        match self {
            McpRuntime::Python3 | McpRuntime::Uvx => "mcp-python",
            McpRuntime::Node | McpRuntime::Npx => "mcp-node",
            McpRuntime::Deployed => "",
        }
    }
}

/// Which clients share one sandboxed process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessMode {
    /// One process for every tenant: request ids rewritten, one
    /// `initialize`, server-initiated messages that cannot be attributed
    /// dropped. For stateless servers.
    Shared,
    /// One process per tenant (the default): a tenant never shares state,
    /// files or processes with another.
    PerTenant,
    /// One process per MCP session.
    PerSession,
}

/// When a server's process starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StartPolicy {
    /// On the first request that needs it (the default).
    OnDemand,
    /// When `corral serve` starts (shared: one; per-tenant: one per tenant;
    /// per-session: none, they have no session yet).
    Boot,
}

/// Which of a server's tools clients see and may call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase", tag = "kind", content = "names")]
pub enum ToolFilter {
    /// Every tool the server lists.
    #[default]
    All,
    /// Only these.
    Pick(Vec<String>),
    /// All but these.
    Omit(Vec<String>),
}

impl ToolFilter {
    /// Whether clients may see and call `tool`.
    pub fn allows(&self, tool: &str) -> bool {
        match self {
            ToolFilter::All => true,
            ToolFilter::Pick(names) => names.iter().any(|n| n == tool),
            ToolFilter::Omit(names) => !names.iter().any(|n| n == tool),
        }
    }
}

/// Restarts after exits the supervisor did not ask for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestartPolicy {
    /// Restarts allowed within `window_secs`; one more failure stops the
    /// server (state `failed`) until corral restarts or a caller's request
    /// after `window_secs` has passed.
    pub max_restarts: u32,
    /// The crash-loop window, seconds.
    pub window_secs: u64,
    /// First back-off delay, milliseconds; doubled per failure.
    pub backoff_initial_ms: u64,
    /// Largest back-off delay, milliseconds.
    pub backoff_max_ms: u64,
    /// A process that ran this long before failing resets the count.
    pub stable_after_secs: u64,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            max_restarts: 3,
            window_secs: 300,
            backoff_initial_ms: 1000,
            backoff_max_ms: 30_000,
            stable_after_secs: 60,
        }
    }
}

/// The per-process rate limit on stderr (and on non-JSON stdout lines),
/// seed 000's log limiter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LogLimits {
    /// Lines passed per second (a sliding one-second window); the rest are
    /// dropped and counted.
    pub lines_per_second: u32,
    /// Longer lines are cut to this many bytes.
    pub line_max_bytes: u64,
    /// At most one `log_rate_limit_exceeded` summary per this many seconds,
    /// with the dropped count since the last one.
    pub summary_secs: u64,
}

impl Default for LogLimits {
    fn default() -> Self {
        LogLimits {
            lines_per_second: 20,
            line_max_bytes: 1024,
            summary_secs: 60,
        }
    }
}

/// One supervised MCP server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct McpServer {
    /// Unique; the URL path segment of `/mcp/servers/{name}`.
    pub name: String,
    /// Tenants (`[[server.tenant]]` names) that may reach it. Empty on a
    /// server without tenants: the anonymous caller.
    pub tenants: Vec<String>,
    /// How the program starts.
    pub runtime: McpRuntime,
    /// The pre-installed tree, absolute, mounted read-only at its own path.
    pub dir: PathBuf,
    /// What runs, relative to `dir` (python3, node), or the package
    /// (npx) or console script (uvx) name; empty for a deployed tree.
    pub entry: String,
    /// For a deployed tree: the source `corral deploy --config F --server
    /// NAME` installs into `dir`.
    pub source: Option<PathBuf>,
    /// For a deployed tree: the pinned package (`npm:NAME@X.Y.Z`,
    /// `pypi:NAME==X.Y`) `corral deploy --config F --server NAME`
    /// installs into `dir` instead of a source directory.
    pub package: Option<crate::package::PackageSpec>,
    /// Arguments after the entry; checked against the argument deny
    /// patterns.
    pub args: Vec<String>,
    /// Declared environment keys: only these pass (never an injection
    /// variable, even declared).
    pub env: Vec<String>,
    /// Values for declared keys; a key without one takes corral's own
    /// environment's value at spawn. Never serialised.
    #[serde(skip_serializing)]
    pub env_values: BTreeMap<String, String>,
    /// The profile it runs under (default: the runtime's `mcp-*`).
    pub profile: String,
    /// Which tools clients see and call.
    pub tools: ToolFilter,
    /// Process sharing.
    pub mode: ProcessMode,
    /// When the process starts.
    pub start: StartPolicy,
    /// Stop a process with no request for this long (None: never).
    pub idle_stop_secs: Option<u64>,
    /// Seconds for the process to answer `initialize`.
    pub startup_timeout_secs: u64,
    /// Seconds a request may wait for its answer.
    pub request_timeout_secs: u64,
    /// Restart rules.
    pub restart: RestartPolicy,
    /// Processes of this server at once.
    pub max_processes: u32,
    /// Processes of this server per tenant at once (per-session mode).
    pub max_processes_per_tenant: u32,
    /// MCP sessions of this server at once.
    pub max_sessions: u32,
    /// MCP sessions of this server per tenant at once.
    pub max_sessions_per_tenant: u32,
    /// Largest JSON-RPC message either way; a larger one fails its request,
    /// never the session.
    pub max_message_bytes: ByteSize,
    /// stderr limiter.
    pub log: LogLimits,
    /// Store tool-call arguments in the audit trail (off: never).
    pub audit_arguments: bool,
}

impl McpServer {
    /// A server with every setting at its default.
    pub fn new(name: &str, runtime: McpRuntime, dir: PathBuf, entry: &str) -> McpServer {
        McpServer {
            name: name.to_string(),
            tenants: Vec::new(),
            runtime,
            dir,
            entry: entry.to_string(),
            source: None,
            package: None,
            args: Vec::new(),
            env: Vec::new(),
            env_values: BTreeMap::new(),
            profile: runtime.default_profile().to_string(),
            tools: ToolFilter::All,
            mode: ProcessMode::PerTenant,
            start: StartPolicy::OnDemand,
            idle_stop_secs: Some(600),
            startup_timeout_secs: 30,
            request_timeout_secs: 60,
            restart: RestartPolicy::default(),
            max_processes: 16,
            max_processes_per_tenant: 4,
            max_sessions: 256,
            max_sessions_per_tenant: 64,
            max_message_bytes: ByteSize(16 << 20),
            log: LogLimits::default(),
            audit_arguments: false,
        }
    }
}

/// Why an argument is refused (seed 000's argument deny patterns, as
/// defence in depth: corral passes argv directly, never through a shell).
pub fn denied_argument(arg: &str) -> Option<&'static str> {
    if arg.chars().any(|c| c.is_control()) {
        return Some("contains a control character (NUL, newline, escape, ...)");
    }
    if arg.split(['/', '=']).any(|part| part == "..") {
        return Some("climbs out with `..`");
    }
    if arg.contains("$(") || arg.contains('`') || arg.contains("${") {
        return Some("looks like shell command substitution");
    }
    if ["&&", "||", ";", "|", ">", "<"]
        .iter()
        .any(|m| arg.contains(m))
    {
        return Some("contains a shell operator (`;`, `|`, `&&`, `>`, `<`)");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_filters_pick_and_omit() {
        assert!(ToolFilter::All.allows("x"));
        let pick = ToolFilter::Pick(vec!["a".into()]);
        assert!(pick.allows("a") && !pick.allows("b"));
        let omit = ToolFilter::Omit(vec!["a".into()]);
        assert!(!omit.allows("a") && omit.allows("b"));
    }

    #[test]
    fn argument_deny_patterns() {
        for ok in [
            "--units",
            "metric",
            "--url=https://x.example/a?b=c,d",
            "a b",
            "@scope/pkg",
            "-v",
        ] {
            assert_eq!(denied_argument(ok), None, "{ok}");
        }
        for bad in [
            "../etc/passwd",
            "--root=../x",
            "a\nb",
            "x\0",
            "$(id)",
            "`id`",
            "${HOME}",
            "a;b",
            "a|b",
            "a&&b",
            ">f",
        ] {
            assert!(denied_argument(bad).is_some(), "{bad:?}");
        }
    }
}

//! What a config file deserialises into, before any validation: every
//! field optional (a profile says only what it changes) and spanned where
//! an error must point at its line.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

/// A whole config file: profiles by name and the optional `[server]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub(super) profile: BTreeMap<String, Spanned<RawProfile>>,
    pub(super) server: Option<Spanned<RawServer>>,
    pub(super) deploy: Option<Spanned<RawDeploy>>,
}

/// The `[deploy]` section.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDeploy {
    pub(super) max_tree_bytes: Option<Spanned<RawSize>>,
    pub(super) ca_bundle: Option<Spanned<String>>,
    pub(super) registry_auth: Option<Vec<Spanned<RawRegistryAuth>>>,
}

/// One `[[deploy.registry_auth]]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRegistryAuth {
    pub(super) registry: Spanned<String>,
    pub(super) token_env: Spanned<String>,
    pub(super) username: Option<Spanned<String>>,
}

/// The `[server]` section.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    pub(super) listen: Option<Spanned<String>>,
    pub(super) max_concurrent: Option<Spanned<u32>>,
    pub(super) code_mode: Option<bool>,
    pub(super) audit_db: Option<Spanned<String>>,
    pub(super) audit_jsonl: Option<Spanned<String>>,
    pub(super) retention_days: Option<Spanned<u32>>,
    pub(super) store_code: Option<bool>,
    pub(super) audit_outputs: Option<Spanned<String>>,
    pub(super) audit_output_max_bytes: Option<Spanned<RawSize>>,
    pub(super) work_dir: Option<Spanned<String>>,
    pub(super) unbounded_workspaces: Option<bool>,
    pub(super) tenant_workspace_bytes: Option<Spanned<RawSize>>,
    pub(super) tenant_answer_bytes: Option<Spanned<RawSize>>,
    pub(super) mcp_pressure_idle_secs: Option<Spanned<u64>>,
    pub(super) max_request_bytes: Option<Spanned<RawSize>>,
    pub(super) max_connections: Option<Spanned<u32>>,
    pub(super) header_timeout_secs: Option<Spanned<u64>>,
    pub(super) body_timeout_secs: Option<Spanned<u64>>,
    pub(super) write_stall_secs: Option<Spanned<u64>>,
    pub(super) mcp_session_queue: Option<Spanned<u32>>,
    pub(super) allowed_origins: Option<Vec<Spanned<String>>>,
    pub(super) allowed_hosts: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub(super) tenant: Vec<Spanned<RawTenant>>,
    #[serde(default)]
    pub(super) mcp_server: Vec<Spanned<RawMcpServer>>,
}

/// One `[[server.tenant]]` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTenant {
    pub(super) name: Spanned<String>,
    pub(super) token_sha256: Spanned<String>,
    pub(super) profiles: Spanned<Vec<String>>,
    pub(super) max_concurrent: Option<Spanned<u32>>,
}

/// One `[[server.mcp_server]]` entry: the required keys are not
/// optional here, so a missing one is serde's error naming it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcpServer {
    pub(super) name: Spanned<String>,
    pub(super) tenants: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) runtime: Spanned<String>,
    pub(super) dir: Spanned<String>,
    pub(super) entry: Option<Spanned<String>>,
    pub(super) source: Option<Spanned<String>>,
    pub(super) package: Option<Spanned<String>>,
    pub(super) args: Option<Vec<Spanned<String>>>,
    pub(super) env: Option<Vec<Spanned<String>>>,
    pub(super) env_values: Option<BTreeMap<String, Spanned<String>>>,
    pub(super) profile: Option<Spanned<String>>,
    pub(super) mode: Option<Spanned<String>>,
    pub(super) start: Option<Spanned<String>>,
    pub(super) idle_stop_secs: Option<Spanned<u64>>,
    pub(super) startup_timeout_secs: Option<Spanned<u64>>,
    pub(super) request_timeout_secs: Option<Spanned<u64>>,
    pub(super) max_processes: Option<Spanned<u32>>,
    pub(super) max_processes_per_tenant: Option<Spanned<u32>>,
    pub(super) max_sessions: Option<Spanned<u32>>,
    pub(super) max_sessions_per_tenant: Option<Spanned<u32>>,
    pub(super) max_message_bytes: Option<Spanned<RawSize>>,
    pub(super) audit_arguments: Option<bool>,
    pub(super) tools: Option<RawTools>,
    pub(super) restart: Option<RawRestart>,
    pub(super) log: Option<RawLog>,
}

/// `[server.mcp_server.tools]`: `pick` or `omit`, not both.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTools {
    pub(super) pick: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) omit: Option<Spanned<Vec<Spanned<String>>>>,
}

/// `[server.mcp_server.restart]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRestart {
    pub(super) max_restarts: Option<Spanned<u32>>,
    pub(super) window_secs: Option<Spanned<u64>>,
    pub(super) backoff_initial_ms: Option<Spanned<u64>>,
    pub(super) backoff_max_ms: Option<Spanned<u64>>,
    pub(super) stable_after_secs: Option<Spanned<u64>>,
}

/// `[server.mcp_server.log]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    pub(super) lines_per_second: Option<Spanned<u32>>,
    pub(super) line_max_bytes: Option<Spanned<RawSize>>,
    pub(super) summary_secs: Option<Spanned<u64>>,
}

/// One `[profile.NAME]` table and its sub-tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProfile {
    pub(super) extends: Option<Spanned<String>>,
    pub(super) description: Option<String>,
    pub(super) hostname: Option<Spanned<String>>,
    pub(super) filesystem: Option<RawFilesystem>,
    pub(super) env: Option<RawEnv>,
    pub(super) commands: Option<RawCommands>,
    pub(super) limits: Option<RawLimits>,
    pub(super) identity: Option<RawIdentity>,
    pub(super) security: Option<RawSecurity>,
    pub(super) network: Option<RawNetwork>,
}

/// `[profile.NAME.network]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNetwork {
    pub(super) mode: Option<Spanned<String>>,
    pub(super) allow_domains: Option<Vec<Spanned<String>>>,
    pub(super) deny_domains: Option<Vec<Spanned<String>>>,
    pub(super) allow_cidrs: Option<Vec<Spanned<String>>>,
    pub(super) hosts: Option<BTreeMap<String, Spanned<String>>>,
    pub(super) sni_check: Option<bool>,
    pub(super) max_connections: Option<Spanned<u32>>,
    pub(super) idle_timeout_secs: Option<Spanned<u64>>,
}

/// `[profile.NAME.security]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSecurity {
    pub(super) seccomp: Option<Spanned<String>>,
    pub(super) landlock: Option<Spanned<String>>,
    pub(super) tcp_bind: Option<Vec<Spanned<u16>>>,
    pub(super) tcp_connect: Option<Vec<Spanned<u16>>>,
    pub(super) unix_sockets: Option<bool>,
}

/// `[profile.NAME.filesystem]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFilesystem {
    pub(super) system: Option<Vec<Spanned<String>>>,
    pub(super) read_only: Option<Vec<Spanned<String>>>,
    pub(super) read_write: Option<Vec<Spanned<String>>>,
    pub(super) deny: Option<Vec<Spanned<String>>>,
    pub(super) tmp_size: Option<Spanned<RawSize>>,
    pub(super) workspace_size: Option<Spanned<RawSize>>,
    pub(super) dev_pts: Option<bool>,
    pub(super) protect: Option<Vec<Spanned<String>>>,
    pub(super) runtime: Option<Spanned<String>>,
}

/// A size as written: an integer of bytes or a string such as `"64MiB"`.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawSize {
    Bytes(u64),
    Text(String),
}

/// A count as written for a limit that can be switched off: an integer, or
/// a string (`"none"` is the only one accepted).
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum RawCount {
    Number(u64),
    Text(String),
}

/// `[profile.NAME.env]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEnv {
    pub(super) pass: Option<Vec<Spanned<String>>>,
    pub(super) set: Option<BTreeMap<String, Spanned<String>>>,
    pub(super) block: Option<Vec<Spanned<String>>>,
}

/// `[profile.NAME.commands]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCommands {
    pub(super) allow: Option<Vec<Spanned<String>>>,
    pub(super) allow_paths: Option<bool>,
    pub(super) deny_args: Option<Vec<Spanned<String>>>,
    pub(super) search_path: Option<Vec<Spanned<String>>>,
    pub(super) restrict_exec: Option<bool>,
}

/// `[profile.NAME.limits]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub(super) timeout_secs: Option<Spanned<RawCount>>,
    pub(super) memory: Option<Spanned<RawSize>>,
    pub(super) pids: Option<Spanned<u64>>,
    pub(super) cpu_millicores: Option<Spanned<u64>>,
    pub(super) cpu_time_secs: Option<Spanned<u64>>,
    pub(super) address_space: Option<Spanned<RawSize>>,
    pub(super) file_size: Option<Spanned<RawSize>>,
    pub(super) open_files: Option<Spanned<u64>>,
    pub(super) processes: Option<Spanned<u64>>,
    pub(super) output: Option<Spanned<RawSize>>,
    pub(super) output_kill: Option<Spanned<RawSize>>,
    pub(super) allow_unenforced: Option<bool>,
}

/// `[profile.NAME.identity]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIdentity {
    pub(super) uid: Option<Spanned<u32>>,
    pub(super) gid: Option<Spanned<u32>>,
}

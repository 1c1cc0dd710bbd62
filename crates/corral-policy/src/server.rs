//! The `[server]` section: how `corral serve` listens, who may call it,
//! how much runs at once, and where the audit trail goes.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Serialize;

/// One caller of the service, identified by a bearer token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Tenant {
    /// Name, used in audit records and execution listings.
    pub name: String,
    /// SHA-256 of the bearer token, lower-case hex. The token itself is
    /// never stored.
    #[serde(skip_serializing)]
    pub token_sha256: String,
    /// Profiles this tenant may use; the first is its default.
    pub profiles: Vec<String>,
    /// Executions of this tenant running at once.
    pub max_concurrent: u32,
}

/// What audit records keep of a program's output. A record is written for
/// every execution and kept for `retention_days`: storing whole outputs
/// would let one small request store megabytes (escaped control bytes grow
/// sixfold), so by default only their digests and sizes are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditOutputs {
    /// SHA-256 and byte counts only.
    Digest,
    /// Digests plus the text, each cut at `audit_output_max_bytes`.
    Full,
}

/// `corral serve` settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServerConfig {
    /// Listening address (default 127.0.0.1:8080).
    pub listen: SocketAddr,
    /// Executions running at once, all tenants together.
    pub max_concurrent: u32,
    /// Whether `{"language", "code"}` requests and the MCP `run_code` tool
    /// exist. Off by default.
    pub code_mode: bool,
    /// SQLite audit database.
    pub audit_db: PathBuf,
    /// Optional JSON-lines copy of every audit record.
    pub audit_jsonl: Option<PathBuf>,
    /// Days audit records are kept.
    pub retention_days: u32,
    /// Store the full code in audit records (its SHA-256 is always stored).
    pub store_code: bool,
    /// What an audit record keeps of a program's output (stdout, stderr
    /// and the collected output files): their SHA-256 and sizes only (the
    /// default), or also the text, cut at `audit_output_max_bytes`.
    pub audit_outputs: AuditOutputs,
    /// With `audit_outputs = "full"`: bytes kept of each stream and of each
    /// output file in a record.
    pub audit_output_max_bytes: u64,
    /// Directory for per-execution workdirs.
    pub work_dir: PathBuf,
    /// Accept workspaces on `work_dir`'s disk, without the size limit of
    /// a tmpfs of `workspace_size` each, when the server cannot get a
    /// mount namespace of its own. Off: the server then refuses to start.
    pub unbounded_workspaces: bool,
    /// Bytes one tenant's MCP session workspaces may reserve together
    /// (each reserves its profile's `workspace_size`); a session that
    /// would pass it gets `busy`.
    pub tenant_workspace_bytes: u64,
    /// Bytes of one tenant's answers waiting to be read by their clients
    /// (`POST /v1/executions`); past it, the next answer waits, holding
    /// its execution slot.
    pub tenant_answer_bytes: u64,
    /// Seconds without a request after which an MCP session at `/mcp` may
    /// be ended to make room when a new one would pass a session cap.
    pub mcp_pressure_idle_secs: u64,
    /// Callers. With none, the service is anonymous and may only listen on
    /// loopback.
    pub tenants: Vec<Tenant>,
    /// Largest request body accepted, in bytes.
    pub max_request_bytes: u64,
    /// Browser origins (`scheme://host[:port]`) whose pages may call the
    /// service; a request with any other `Origin` header is refused. None
    /// by default: no web page may drive the service.
    pub allowed_origins: Vec<String>,
    /// `Host` header values accepted besides the listen address and
    /// `localhost` (a DNS-rebinding guard): names such as
    /// `corral.internal` or `corral.internal:8080`, a name without a port
    /// matching any port. On a wildcard listen address (`0.0.0.0`, `::`)
    /// with this list empty, `Host` is not checked.
    pub allowed_hosts: Vec<String>,
    /// Client connections open at once; `None`: as many as the open-file
    /// limit allows (checked and reported at start-up). One more is
    /// answered 503 and closed.
    pub max_connections: Option<u32>,
    /// Seconds for a request's headers (and for the next request on an
    /// idle kept-alive connection).
    pub header_timeout_secs: u64,
    /// Seconds for a whole request body.
    pub body_timeout_secs: u64,
    /// Seconds a response write may make no progress (a client that does
    /// not read) before the connection is closed.
    pub write_stall_secs: u64,
    /// Supervised MCP servers (`[[server.mcp_server]]`), in config order.
    pub mcp_servers: Vec<crate::mcp_server::McpServer>,
    /// `run_code` calls of one MCP session that may wait, in order, behind
    /// the one it is running (0: a second call is answered `busy`).
    pub mcp_session_queue: u32,
}

/// The largest `mcp_session_queue`.
pub const MAX_MCP_SESSION_QUEUE: u32 = 64;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            max_concurrent: 4,
            code_mode: false,
            audit_db: PathBuf::from("corral-audit.db"),
            audit_jsonl: None,
            retention_days: 30,
            store_code: false,
            audit_outputs: AuditOutputs::Digest,
            audit_output_max_bytes: 64 << 10,
            work_dir: std::env::temp_dir(),
            unbounded_workspaces: false,
            tenant_workspace_bytes: 4 << 30,
            tenant_answer_bytes: 64 << 20,
            mcp_pressure_idle_secs: 30,
            tenants: Vec::new(),
            max_request_bytes: 8 << 20,
            allowed_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            max_connections: None,
            header_timeout_secs: 10,
            body_timeout_secs: 60,
            write_stall_secs: 30,
            mcp_session_queue: 4,
            mcp_servers: Vec::new(),
        }
    }
}

/// Whether `token` (hex SHA-256) is well formed.
pub fn valid_token_hash(token: &str) -> bool {
    token.len() == 64
        && token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}
